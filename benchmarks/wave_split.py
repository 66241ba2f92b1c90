"""Where a vLLM wave's time went: the engine core's steps, or the rest of ``LLM.generate``.

Every vLLM wave record holds the engine's ``phases`` (``generate_s``: the one ``llm.generate`` call of
the wave, timed in the worker) and the probe's ``steps`` (the engine core's scheduled steps, each timed
from its cascade decision to the next one's: ``decode_cascade_s``, ``decode_flat_s``, ``prefill_s``;
the last step of a wave has no successor and is not timed). What ``generate`` took beyond the steps
was spent outside the engine core's step loop: submitting the requests, and vLLM's output processing
in the LLM process (detokenizing the text step by step and, with logprobs, decoding every logprob
token to a string). This script reads recorded runs and prints, per cell, the median of each.

    python benchmarks/wave_split.py RUN [RUN ...]

A RUN is a run directory (its ``samples/*.jsonl``), a JSONL file of records, or a ``.tgz`` holding
either (the evidence under ``docs/evidence/``). Needs neither vLLM nor a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cascade_repro.run import runstore  # noqa: E402 - light: no torch, no vLLM

STEP_KEYS = ("decode_cascade_s", "decode_flat_s", "prefill_s")


def _lines(path: Path) -> Iterator[bytes]:
    if path.is_dir():
        for f in runstore.samples_files(path):
            yield from f.read_bytes().splitlines()
    elif path.name.endswith((".tgz", ".tar.gz")):
        with tarfile.open(path) as tf:
            for m in tf.getmembers():
                if m.isfile() and m.name.endswith(".jsonl") and (fh := tf.extractfile(m)) is not None:
                    yield from fh.read().splitlines()
    else:
        yield from path.read_bytes().splitlines()


def wave_records(path: Path) -> list[dict[str, Any]]:
    """The vLLM wave records of a run that carry both the phases and the probe's step times."""
    out = []
    for line in _lines(path):
        if b'"type":"wave"' not in line:
            continue
        rec = json.loads(line)
        extra = rec.get("extra") or {}
        if "generate_s" in (extra.get("phases") or {}) and "steps" in extra:
            out.append(rec)
    return out


def split(records: list[dict[str, Any]], skip_first: bool = True) -> list[dict[str, Any]]:
    """Per cell (in the order first seen): waves counted, and the medians of generate_s, the
    engine core's timed steps and the rest; the first wave of a cell is left out where the cell has
    more (it can hold first-call compiles)."""
    cells: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        cells.setdefault(r["cell_id"], []).append(r)
    rows = []
    for cid, recs in cells.items():
        recs = sorted(recs, key=lambda r: r["wave"])
        if skip_first and len(recs) > 1:
            recs = recs[1:]
        gen = [r["extra"]["phases"]["generate_s"] for r in recs]
        steps = [sum(r["extra"]["steps"].get(k, 0.0) for k in STEP_KEYS) for r in recs]
        rest = [g - s for g, s in zip(gen, steps, strict=True)]
        casc = [r["extra"]["steps"].get("decode_cascade_n", 0) for r in recs]
        rows.append({
            "cell": cid, "batch": recs[0].get("batch"), "waves": len(recs),
            "generate_s": statistics.median(gen), "steps_s": statistics.median(steps),
            "rest_s": statistics.median(rest), "rest_share": statistics.median(x / g for x, g in zip(rest, gen, strict=True) if g),
            "cascade_decode_steps": statistics.median(casc),
        })  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| cell | waves | generate s | engine-core steps s | rest s | rest / generate | cascade decode steps |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['cell']} | {r['waves']} | {r['generate_s']:.3f} | {r['steps_s']:.3f} | {r['rest_s']:.3f} | "
            f"{r['rest_share'] * 100:.0f} % | {r['cascade_decode_steps']:g} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    a = ap.parse_args(argv)
    for path in a.runs:
        if not path.exists():
            print(f"error: {path} does not exist", file=sys.stderr)
            return 2
        recs = wave_records(path)
        print(f"{path}: {len(recs)} vLLM waves with phases and step times")
        if recs:
            print(table(split(recs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
