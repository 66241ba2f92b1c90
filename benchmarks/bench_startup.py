"""Benchmark 5: start-up of ``cascade-repro --help`` (target < 0.5 s; no torch / vLLM import).

Runs the installed console script ``--runs`` times in a Python loop (wall time per run, and the
user + system CPU seconds of the child from ``RUSAGE_CHILDREN``, which a busy machine does not
inflate), with hyperfine as well when it is on PATH; then ``python -X importtime`` of the same
command for the top offenders, and a check that no heavy module (torch, vllm, transformers,
pandas, numpy, pyarrow) was imported.

    python benchmarks/bench_startup.py --runs 10 --out startup.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 0.5
HEAVY = ("torch", "vllm", "transformers", "pandas", "numpy", "pyarrow", "datasets")
HELP_CODE = "import sys; from cascade_repro.cli import main; sys.argv = ['cascade-repro', '--help']; main()"


def script() -> list[str]:
    exe = Path(sys.executable).with_name("cascade-repro")
    if exe.exists():
        return [str(exe), "--help"]
    found = shutil.which("cascade-repro")
    if found:
        return [found, "--help"]
    return [sys.executable, "-c", HELP_CODE]


def loop(cmd: list[str], runs: int, warmup: int = 2) -> tuple[list[float], list[float]]:
    walls, cpus = [], []
    for i in range(warmup + runs):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if i >= warmup:
            walls.append(wall)
            cpus.append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
    return walls, cpus


def hyperfine(cmd: list[str], runs: int) -> dict | None:
    hf = shutil.which("hyperfine")
    if not hf:
        return None
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    try:
        subprocess.run([hf, "-N", "--warmup", "2", "--runs", str(runs), "--export-json", out, " ".join(cmd)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        r = json.loads(Path(out).read_text())["results"][0]
        return {"median_s": r["median"], "mean_s": r["mean"], "stddev_s": r["stddev"], "min_s": r["min"],
                "user_s": r["user"], "system_s": r["system"]}  # fmt: skip
    finally:
        os.unlink(out)


def importtime(top: int) -> tuple[list[dict], list[str], float]:
    """Top modules by cumulative and by self import time; heavy modules imported; total import µs."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", HELP_CODE], capture_output=True, text=True)
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, name = line[len("import time:") :].split("|", 2)
        rows.append({"self_us": int(self_us), "cum_us": int(cum_us), "module": name.rstrip(),
                     "top_level": not name[1:].startswith(" ")})  # fmt: skip
    heavy = sorted({r["module"].strip() for r in rows if r["module"].strip().split(".")[0] in HEAVY})
    total = sum(r["cum_us"] for r in rows if r["top_level"])
    by_cum = sorted(rows, key=lambda r: -r["cum_us"])[:top]
    return by_cum, heavy, total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    cmd = script()
    load0 = os.getloadavg()[0]
    walls, cpus = loop(cmd, args.runs)
    hf = hyperfine(cmd, args.runs)
    load1 = os.getloadavg()[0]
    by_cum, heavy, total_us = importtime(args.top)
    baseline_walls, baseline_cpus = loop([sys.executable, "-c", "pass"], args.runs)

    med, cpu_med = statistics.median(walls), statistics.median(cpus)
    print(f"command: {' '.join(cmd)}   (1-min load average {load0:.1f} -> {load1:.1f})")
    print(f"{'measure':<44} {'median s':>9} {'min s':>7} {'target':>7} {'ratio':>6}")
    print(f"{'wall, Python loop (' + str(args.runs) + ' runs)':<44} {med:>9.3f} {min(walls):>7.3f} {TARGET_S:>7} "
          f"{med / TARGET_S:>6.2f}")  # fmt: skip
    if hf:
        print(f"{'wall, hyperfine -N (' + str(args.runs) + ' runs)':<44} {hf['median_s']:>9.3f} {hf['min_s']:>7.3f} "
              f"{TARGET_S:>7} {hf['median_s'] / TARGET_S:>6.2f}")  # fmt: skip
    print(f"{'CPU (user+sys) of the child':<44} {cpu_med:>9.3f} {min(cpus):>7.3f} {TARGET_S:>7} {cpu_med / TARGET_S:>6.2f}")
    print(f"{'baseline: python -c pass, wall':<44} {statistics.median(baseline_walls):>9.3f} "
          f"{min(baseline_walls):>7.3f}")  # fmt: skip
    print(f"{'baseline: python -c pass, CPU':<44} {statistics.median(baseline_cpus):>9.3f} {min(baseline_cpus):>7.3f}")
    print(f"\npython -X importtime (one run, sum of top-level imports {total_us / 1e3:.0f} ms); top by cumulative:")
    for r in by_cum:
        print(f"  {r['cum_us'] / 1e3:>7.1f} ms  (self {r['self_us'] / 1e3:>5.1f})  {r['module'].rstrip()}")
    print(f"heavy modules imported: {', '.join(heavy) if heavy else 'none'}")
    if args.out:
        args.out.write_text(json.dumps({
            "command": cmd, "wall_s": walls, "cpu_s": cpus, "median_wall_s": med, "median_cpu_s": cpu_med,
            "hyperfine": hf, "baseline_wall_s": baseline_walls, "baseline_cpu_s": baseline_cpus,
            "importtime_top": by_cum, "heavy": heavy, "loadavg": [load0, load1], "target_s": TARGET_S,
        }, indent=2))  # fmt: skip
    return 0 if med < TARGET_S and not heavy else 1


if __name__ == "__main__":
    sys.exit(main())
