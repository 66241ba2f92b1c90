"""What the reference pass adds to a matrix: the same command with and without it, in turn.

Runs ``cascade-repro matrix ARGS --fresh`` with ``--reference auto`` (A) and ``--reference off`` (B)
alternately (A B A B ...), each a whole process, after one warm-up of each that is not counted
(the warm-up fills the user cache: the converted model and, on a CPU, the reference's prefix KV).
Prints wall, user and system seconds per arm (min / median / max), the paired A/B wall ratio, and
for each A run the reference pass's own seconds from its run.json (``reference.wall_s``) beside the
run's total: the share measured inside one run.

    python benchmarks/bench_reference.py --runs 3 -- --limit 16 --batch 8,16 --cascade on,off --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(args: list[str], results: Path, reference: str) -> dict[str, float]:
    cmd = [sys.executable, "-m", "cascade_repro", "matrix", *args, "--fresh", "--run-id", "bench",
           "--results-dir", str(results), "--reference", reference, "--quiet"]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False).returncode
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = {
        "wall": wall,
        "user": after.ru_utime - before.ru_utime,
        "sys": after.ru_stime - before.ru_stime,
        "rc": rc,
    }
    run = json.loads((results / "bench" / "run.json").read_text())
    ref = run.get("reference") or {}
    out["ref_s"] = float(ref.get("wall_s") or 0.0)
    out["run_s"] = float((run.get("timings") or {}).get("total_s") or 0.0)
    return out


def spread(values: list[float]) -> str:
    return f"{min(values):8.3g} {statistics.median(values):8.3g} {max(values):8.3g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("matrix_args", nargs=argparse.REMAINDER, help="after --: the matrix's own flags")
    ns = parser.parse_args(argv)
    args = [a for a in ns.matrix_args if a != "--"]
    with tempfile.TemporaryDirectory() as tmp:
        a_dir, b_dir = Path(tmp, "a"), Path(tmp, "b")
        one(args, a_dir, "auto"), one(args, b_dir, "off")  # warm-up: caches filled, not counted
        runs = [(one(args, a_dir, "auto"), one(args, b_dir, "off")) for _ in range(ns.runs)]
    a, b = [r[0] for r in runs], [r[1] for r in runs]
    print(f"matrix {' '.join(args)}; {ns.runs} runs each, in turn; load {os.getloadavg()[0]:.2f}")
    print(f"{'':28} {'min':>8} {'median':>8} {'max':>8}")
    for name, rows in (("A (--reference auto)", a), ("B (--reference off)", b)):
        for key in ("wall", "user", "sys"):
            print(f"{name + ' ' + key + ' s':28} {spread([r[key] for r in rows])}")
    print(f"{'A/B wall (paired)':28} {spread([x['wall'] / y['wall'] for x, y in runs])}")
    print(f"{'reference pass s (in A)':28} {spread([r['ref_s'] for r in a])}")
    print(f"{'its share of the run':28} {spread([100 * r['ref_s'] / r['run_s'] for r in a if r['run_s']])} %")
    print("exit codes:", [r["rc"] for r in a], [r["rc"] for r in b])
    return 0


if __name__ == "__main__":
    sys.exit(main())
