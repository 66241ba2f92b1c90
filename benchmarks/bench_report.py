"""Benchmark 4: ``cascade-repro report RUN_DIR`` on a 100,000-sample run (target < 10 s, peak RSS < 2 GB).

The run directory comes from ``tests/support/make_synthetic_run.py`` (made first when ``RUN_DIR`` is missing).
Each timed run is ``cascade-repro report RUN_DIR --fail-on never`` in a subprocess under
``/usr/bin/time -v`` (peak RSS = its "Maximum resident set size"); without GNU time, the wall time
is taken here and the peak RSS from ``getrusage(RUSAGE_CHILDREN)``. The samples files are read
from the page cache (they were just written, or read by the previous run): a cold cache adds the
disk read of the JSONL files (see RESULTS.md).

``--profile`` also runs ``write_reports`` + ``load_run`` in this process under cProfile and prints
the top functions by cumulative time.

    python benchmarks/bench_report.py /tmp/synth-100k --runs 3 --out report.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

MAKE_RUN = Path(__file__).resolve().parents[1] / "tests" / "support" / "make_synthetic_run.py"
TARGET_S = 10.0
TARGET_RSS_MIB = 2048


def report_cmd(run_dir: Path) -> list[str]:
    exe = Path(sys.executable).with_name("cascade-repro")
    base = [str(exe)] if exe.exists() else [sys.executable, "-m", "cascade_repro.cli"]
    return [*base, "report", str(run_dir), "--fail-on", "never"]


def timed(cmd: list[str]) -> dict:
    gnu_time = Path("/usr/bin/time")
    if gnu_time.exists():
        t0 = time.perf_counter()
        p = subprocess.run([str(gnu_time), "-v", *cmd], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
        rss = int(m.group(1)) / 1024 if m else float("nan")
        u = re.search(r"User time \(seconds\): ([\d.]+)", p.stderr)
        s = re.search(r"System time \(seconds\): ([\d.]+)", p.stderr)
        cpu = float(u.group(1)) + float(s.group(1)) if u and s else float("nan")
        how = "/usr/bin/time -v"
    else:
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        rss = r1.ru_maxrss / 1024  # max over all children so far: an upper bound for this one
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        how = "getrusage(RUSAGE_CHILDREN)"
    if p.returncode not in (0, 1):
        raise SystemExit(f"report failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mib": rss, "how": how}


def describe(run_dir: Path) -> dict:
    import pyarrow.parquet as pq

    samples = list((run_dir / "samples").glob("*.jsonl"))
    size = sum(p.stat().st_size for p in samples)
    lines = 0
    for p in samples:
        with open(p, "rb") as f:
            lines += sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 24), b""))
    rows = {n: pq.ParquetFile(run_dir / f"{n}.parquet").metadata.num_rows for n in ("cells", "pairs", "comparisons")}
    n_samples = json.loads((run_dir / "run.json").read_text())["prompt_set"]["n"] * rows["cells"]
    return {"samples_files": len(samples), "samples_bytes": size, "jsonl_lines": lines, "samples": n_samples, **rows}


def profile(run_dir: Path, top: int) -> None:
    import cProfile
    import pstats

    from cascade_repro.report import write_reports

    prof = cProfile.Profile()
    prof.enable()
    write_reports(run_dir)
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(top)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path, nargs="?", default=Path("/tmp/cascade-repro-synth-100k"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    if not (args.run_dir / "comparisons.parquet").exists():
        print(f"making {args.run_dir} (tests/support/make_synthetic_run.py; minutes)...", flush=True)
        subprocess.run([sys.executable, str(MAKE_RUN), str(args.run_dir)], check=True)
    info = describe(args.run_dir)
    print(f"{args.run_dir}: {info['samples']:,} samples in {info['samples_files']} JSONL files "
          f"({info['samples_bytes'] / 2**30:.2f} GiB, {info['jsonl_lines']:,} lines), {info['cells']} cells, "
          f"{info['pairs']} pairs, {info['comparisons']:,} comparison rows")  # fmt: skip
    cmd = report_cmd(args.run_dir)
    load0 = os.getloadavg()[0]
    runs = [timed(cmd) for _ in range(args.runs)]
    load1 = os.getloadavg()[0]
    wall = statistics.median(r["wall_s"] for r in runs)
    cpu = statistics.median(r["cpu_s"] for r in runs)
    rss = max(r["peak_rss_mib"] for r in runs)
    print(f"command: {' '.join(cmd)}   ({runs[0]['how']}; 1-min load average {load0:.1f} -> {load1:.1f})")
    print(f"{'measure':<30} {'value':>10} {'target':>8} {'ratio':>6}   runs")
    print(f"{'wall s (median)':<30} {wall:>10.2f} {TARGET_S:>8.0f} {wall / TARGET_S:>6.2f}   "
          + ", ".join(f"{r['wall_s']:.2f}" for r in runs))  # fmt: skip
    print(f"{'CPU s, user+sys (median)':<30} {cpu:>10.2f} {TARGET_S:>8.0f} {cpu / TARGET_S:>6.2f}   "
          + ", ".join(f"{r['cpu_s']:.2f}" for r in runs))  # fmt: skip
    print(f"{'peak RSS MiB (max)':<30} {rss:>10.0f} {TARGET_RSS_MIB:>8} {rss / TARGET_RSS_MIB:>6.2f}   "
          + ", ".join(f"{r['peak_rss_mib']:.0f}" for r in runs))  # fmt: skip
    if args.profile:
        profile(args.run_dir, 25)
    if args.out:
        args.out.write_text(json.dumps({"run_dir": str(args.run_dir), "info": info, "runs": runs,
                                        "median_wall_s": wall, "median_cpu_s": cpu, "peak_rss_mib": rss,
                                        "loadavg": [load0, load1], "gnu_time": shutil.which("time")}, indent=2))  # fmt: skip
    return 0 if wall < TARGET_S and rss < TARGET_RSS_MIB else 1


if __name__ == "__main__":
    sys.exit(main())
