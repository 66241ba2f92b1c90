"""The run-directory fuzz target (tests/fuzz/atheris_rundir.py) over a fixed number of inputs.

The seeds alone are the table of hand-made cases; the fuzzer mutates from them.

Bounded by input count (``-runs``), never by time, with a fixed seed: CI sees the same inputs every
run, however busy the machine is. The seeds damage each kind of file once, so the search starts
from every reader; what the fuzzer found is kept below as plain regression tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RUNS = 200  # inputs per CI run (each copies a small run and renders its reports twice)

# byte 0: which file (run.json, prompts.jsonl, cells, comparisons and pairs .parquet, samples/),
# byte 1: replace / splice / cut / substitute, bytes 2-3: where, in 1/10000 of the file; then the
# bytes (for a substitution OLD\0NEW: every record's field given a wrong value).
SEEDS = {
    "run-json-list": b"\x00\x00\x00\x00[]",
    "run-json-null": b"\x00\x00\x00\x00null",
    "run-json-cut": b"\x00\x02\x88\x13",
    "run-json-plan": b"\x00\x00\x00\x00" + b'{"plan": 7}',
    "prompts-cut": b"\x01\x02\x88\x13",
    "prompts-splice": b"\x01\x01\x88\x13" + b'{"key": 1}\n',
    "cells-cut": b"\x02\x02\x88\x13",
    "comparisons-splice": b"\x03\x01\x88\x13PAR1",
    "pairs-empty": b"\x04\x00\x00\x00",
    "samples-cut": b"\x05\x02\x88\x13",
    "samples-splice": b"\x05\x01\x88\x13" + b'\n{"cell_id": "x", "token_ids": "abc"}\n',
    "samples-index": b"\x05\x01\x10\x27" + b'{"prompt_index": 999}\n',
    "samples-empty": b"\x05\x00\x00\x00",
    **{
        f"samples-{key}-{name}": b"\x05\x03\x00\x00" + f'"{key}":\0"{key}":{bad},"_":'.encode()
        for key in (
            "wall_s",
            "cascade_steps",
            "total_steps",
            "tokens",
            "n_real",
            "wave",
            "batch",
            "n_samples",
            "cell_id",
            "token_ids",
            "type",
            "effective",
            "shared_prefix_tokens",
        )
        for name, bad in (("text", '"x"'), ("null", "null"), ("list", "[1]"), ("negative", "-1"))
    },
}


def test_fuzzing_a_run_directory_finds_no_crash(tmp_path: Path):
    pytest.importorskip("atheris", reason="atheris is not installed (pip install atheris)")
    harness = Path(__file__).with_name("atheris_rundir.py")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, data in SEEDS.items():
        (corpus / name).write_bytes(data)
    env = {**os.environ, "CASCADE_REPRO_REFERENCE": "off"}
    proc = subprocess.run(
        [sys.executable, str(harness), "-seed=1", f"-runs={RUNS}", "-max_len=512",
         f"-artifact_prefix={tmp_path}/", str(corpus)],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    assert "Done" in proc.stderr or "DONE" in proc.stderr, proc.stderr[-2000:]
