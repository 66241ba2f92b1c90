"""Benchmark 2: engine starts = engine keys, not cells.

Part 1 (planner): the 2 x 5 x 2 matrix (tp 1,2 x batch 1,8,16,32,64 x cascade on/off) through
``matrix.plan`` for hf, vLLM with ``--arm-switch toggle`` and vLLM with ``--arm-switch restart``:
cells, engine keys (= planned worker processes = engine starts). The hf engine runs on one device,
so ``MatrixSpec.validate`` rejects tp 2 for it; the planner is shown anyway, and next to it the
valid hf 2 x 5 x 2 matrix (seed 0,1 x batch x cascade).

Part 2 (a real run): ``cascade-repro matrix --engine hf`` on the embedded model, seed 0,1 x batch
1,2,4,8,16 x cascade on/off (20 cells), ``--limit 2 --max-tokens 2``, in a subprocess. Counted
afterwards from the run directory: ``engine`` records in ``samples/*.jsonl`` (each worker writes one
when its engine is up), ``worker-*.log`` files (one per worker process started) and finished cells.

    python benchmarks/bench_engine_starts.py [--no-run] [--out starts.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cascade_repro.plan.matrix import MatrixSpec, plan
from cascade_repro.run import runstore

BATCHES = [1, 8, 16, 32, 64]


def planner_rows() -> list[dict]:
    rows = []
    cases = [
        ("hf (tp 1,2: planner only, validate rejects tp 2)", dict(engine="hf", tp=[1, 2])),
        ("hf (seed 0,1: the valid 2x5x2)", dict(engine="hf", tp=[1], seeds=[0, 1])),
        ("vllm --arm-switch toggle", dict(engine="vllm", tp=[1, 2], arm_switch="toggle")),
        ("vllm --arm-switch restart", dict(engine="vllm", tp=[1, 2], arm_switch="restart")),
    ]
    for label, kw in cases:
        spec = MatrixSpec(batch=list(BATCHES), cascade=[True, False], **kw)
        engines = plan(spec)
        cells = sum(len(ep.cells) for ep in engines.values())
        expected = len(spec.tp) * len(spec.seeds) * (2 if spec.engine == "vllm" and spec.arm_switch == "restart" else 1)
        rows.append({"case": label, "cells": cells, "engine_keys": len(engines), "expected": expected,
                     "keys": sorted(engines)})  # fmt: skip
    return rows


def real_run(results_dir: Path) -> dict:
    cmd = [sys.executable, "-c", "import sys; from cascade_repro.cli import main; sys.argv[0]='cascade-repro'; main()",
           "matrix", "--engine", "hf", "--seed", "0,1", "--batch", "1,2,4,8,16", "--cascade", "on,off",
           "--limit", "2", "--max-tokens", "2", "--results-dir", str(results_dir), "--run-id", "starts",
           "--fail-on", "never", "--quiet"]  # fmt: skip
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    run_dir = results_dir / "starts"
    engine_recs, done, starts_s = 0, 0, []
    for p in sorted((run_dir / "samples").glob("*.jsonl")):
        for line in p.read_text(encoding="utf-8").splitlines():
            if line.startswith('{"type":"sample"'):
                continue
            rec = json.loads(line)
            if rec.get("type") == "engine":
                engine_recs += 1
                starts_s.append(rec.get("start_s"))
            elif rec.get("type") == "cell_done":
                done += 1
    run = runstore.read_manifest(run_dir)
    return {
        "command": "cascade-repro " + " ".join(cmd[3:]),
        "rc": proc.returncode,
        "stderr_tail": proc.stderr[-2000:] if proc.returncode not in (0, 1) else "",
        "cells": len(run.plan.cells),
        "cells_done": done,
        "engine_keys": len(run.plan.engines),
        "engine_records": engine_recs,
        "worker_logs": len(list(run_dir.glob("worker-*.log"))),
        "engine_start_s": starts_s,
        "wall_s": round(wall, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-run", action="store_true", help="planner only (no model run)")
    ap.add_argument("--results-dir", type=Path, help="where the real run goes (default: a temp dir)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    rows = planner_rows()
    print("Planner: tp x batch 1,8,16,32,64 x cascade on,off")
    print(f"{'case':<50} {'cells':>5} {'engine starts':>13} {'expected':>8}")
    for r in rows:
        print(f"{r['case']:<50} {r['cells']:>5} {r['engine_keys']:>13} {r['expected']:>8}")
    result: dict = {"planner": rows}
    ok = all(r["engine_keys"] == r["expected"] for r in rows)
    if not args.no_run:
        with tempfile.TemporaryDirectory(prefix="bench-starts-") as tmp:
            rr = real_run(args.results_dir or Path(tmp))
        result["run"] = rr
        print(f"\nReal run: {rr['command']}")
        print(f"{'cells':>5} {'done':>5} {'engine keys':>11} {'engine records':>14} {'worker logs':>11} {'wall s':>7}")
        print(f"{rr['cells']:>5} {rr['cells_done']:>5} {rr['engine_keys']:>11} {rr['engine_records']:>14} "
              f"{rr['worker_logs']:>11} {rr['wall_s']:>7}")  # fmt: skip
        print(f"engine start times (s): {rr['engine_start_s']}")
        if rr["stderr_tail"]:
            print(rr["stderr_tail"], file=sys.stderr)
        ok = ok and rr["engine_records"] == rr["engine_keys"] == rr["worker_logs"] and rr["cells_done"] == rr["cells"]
    print(f"\nengine starts == engine keys: {'yes' if ok else 'NO'}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
