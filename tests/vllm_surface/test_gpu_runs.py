"""The table of GPU runs (vllm_surface/gpu_runs.py) against the committed evidence, and the README's
"vLLM release x twin" table against the table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cascade_repro import twin as twins
from cascade_repro import vllm_surface
from cascade_repro.vllm_surface import gpu_runs

ROOT = Path(__file__).resolve().parents[2]
EVIDENCE = ROOT / "docs" / "evidence"


def runs_facts(run_json: Path) -> tuple[str, tuple[str, ...], str]:
    """(vLLM release, every twin it ran, day) of one committed run: a run of several twins ran each."""
    d = json.loads(run_json.read_text(encoding="utf-8"))
    names = tuple(
        tw.name for tw in twins.resolve_list(d["spec"].get("twin") or None)
    )  # before --twin: cascade
    return d["env"]["vllm"], names, d["created_at"][:10]


@pytest.mark.parametrize("row", gpu_runs.GPU_RUNS, ids=lambda r: f"{r.release}-{r.twin}")
def test_every_row_is_a_committed_run_of_that_twin_on_that_release(row):
    folder = ROOT / row.folder
    assert folder.is_dir() and row.folder.startswith("docs/evidence/")
    release, names, day = runs_facts(folder / "run.json")
    assert (release, day) == (row.release, row.date) and row.twin in names
    assert vllm_surface.release_for(row.release) == (vllm_surface.release_for(row.release)[0], True)
    # The run holds the twin's cells, not only its plan.
    assert (folder / "cells.parquet").is_file() or (folder / "pairs.parquet").is_file()


def test_every_committed_gpu_run_is_in_the_table_at_its_newest_day():
    newest: dict[tuple[str, str], str] = {}
    for run_json in EVIDENCE.rglob("run.json"):
        release, names, day = runs_facts(run_json)
        for twin in names:
            newest[(release, twin)] = max(day, newest.get((release, twin), ""))
    assert {(r.release, r.twin): r.date for r in gpu_runs.GPU_RUNS} == newest
    assert len(gpu_runs.GPU_RUNS) == len(newest)  # one row per release and twin


def test_the_readme_table_is_the_package_table():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(
        r"<!-- vllm-release-x-twin: [^>]*-->\n(.*?)\n<!-- /vllm-release-x-twin -->", readme, re.S
    )
    assert block is not None and block.group(1) == gpu_runs.readme_table()


def test_the_table_renders_blank_cells_where_a_twin_never_ran():
    table = gpu_runs.readme_table().splitlines()
    assert table[0] == "| twin | vLLM 0.10.2 | vLLM 0.11.0 | vLLM 0.26.0 | vLLM 0.34.0 |"
    chunked = next(line for line in table if line.startswith("| `chunked-prefill` |"))
    assert chunked.startswith(
        "| `chunked-prefill` |  |  | 2026-12-04 [2026-12-03-h200-topk-packing/twins-side-4]"
    )
    assert not any("tp=" in line for line in table)  # never ran on a GPU: no row
    cascade = next(line for line in table if line.startswith("| `cascade` |"))
    assert cascade.endswith(
        "[2026-12-03-h200-topk-packing/twins-side-4](docs/evidence/2026-12-03-h200-topk-packing/twins-side-4) |  |"
    )
    flashinfer = next(
        line for line in table if line.startswith("| `attention-backend=FLASH_ATTN:FLASHINFER` |")
    )
    assert "| 2026-12-03 [2026-12-03-h200-twins/flashinfer]" in flashinfer  # not among --twin all's


def test_ran_on_lists_the_releases_newest_first():
    assert gpu_runs.ran_on("cascade") == "0.26.0 (2026-12-04), 0.10.2 (2026-12-04)"
    assert gpu_runs.ran_on("tp") == "never on a GPU"
    assert gpu_runs.ran_on("chunked-prefill") == "0.34.0 (2026-12-03), 0.26.0 (2026-12-04)"
    assert gpu_runs.fully_ran("0.26.0", ["prefix-caching", "batch"]) and not gpu_runs.fully_ran(
        "0.10.2", ["batch"]
    )
