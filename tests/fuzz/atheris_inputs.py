"""Coverage-guided fuzzing (atheris) of the prompt loaders and the matrix TOML loader.

Not a pytest module (no ``test_`` prefix): ``tests/fuzz/test_fuzz_inputs.py`` runs it in a subprocess,
because libFuzzer ends the process when it is done. By hand::

    python tests/fuzz/atheris_inputs.py -runs=100000            # or -max_total_time=600

The first input byte picks the format (.jsonl, .csv, .parquet, .toml); the rest is the file.
Every input must load, or raise ``UsageError`` with one line that names the file. Any other
exception is a crash: libFuzzer prints it, saves the input as ``crash-*`` and exits non-zero.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from cascade_repro.errors import UsageError
    from cascade_repro.plan import matrix
    from cascade_repro.prompts import promptsets

TMP = Path(tempfile.mkdtemp(prefix="cascade-repro-atheris-"))
SUFFIXES = (".jsonl", ".csv", ".parquet", ".toml")


def one_input(data: bytes) -> None:
    if not data:
        return
    path = TMP / ("input" + SUFFIXES[data[0] % len(SUFFIXES)])
    path.write_bytes(data[1:])
    try:
        if path.suffix == ".toml":
            matrix.MatrixSpec.from_dict(matrix.load_toml(path), source=str(path))
        else:
            for record in promptsets.load_prompt_set(str(path)).records:
                json.dumps(list(record.kwargs))  # what the run directory will have to store
    except UsageError as e:
        msg = str(e)
        if "\n" in msg or "\r" in msg:
            raise AssertionError(f"error message spans lines: {msg!r}") from None
        if str(path) not in msg:
            raise AssertionError(f"error message does not name the file: {msg!r}") from None


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    try:
        atheris.Fuzz()
    finally:
        for p in TMP.iterdir():
            p.unlink()
        os.rmdir(TMP)


if __name__ == "__main__":
    main()
