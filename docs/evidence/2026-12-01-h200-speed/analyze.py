"""Re-read this directory's H200 runs with the current code: the sweep table (explain --measure) and
the cold matrix's per-cell phase and step times, from the wave records the tarballs carry.

    python docs/evidence/2026-12-01-h200-speed/analyze.py > docs/evidence/2026-12-01-h200-speed/analysis.txt
"""

from __future__ import annotations

import collections
import io
import json
import statistics
import sys
import tarfile
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from cascade_repro import speed, sweep  # noqa: E402


def members(tgz: str) -> dict[str, bytes]:
    with tarfile.open(HERE / tgz) as t:
        return {m.name.split("/", 1)[1]: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}


def records(files: dict[str, bytes]) -> list[dict]:
    return [json.loads(line) for line in files["records.jsonl"].decode().splitlines() if line.strip()]


def waves_by_cell(recs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = collections.defaultdict(list)
    for r in recs:
        if r["type"] == "wave":
            out[r["cell_id"]].append(r)
    return out


def sweep_table() -> None:
    files = members("sweep.tgz")
    run = json.loads(files["run.json"])
    pairs = pd.read_parquet(io.BytesIO(files["pairs.parquet"])).to_dict("records")
    by_cell = waves_by_cell(records(files))
    for p in pairs:  # the speed columns as the current code computes them from the same waves
        if p["kind"] == "cascade":
            p.update(speed.paired_speed(by_cell[p["test_cell"]], by_cell[p["ref_cell"]]))
    preds = run.get("predictions", {}).get("cells", {})
    rows = sweep.sweep_rows(pairs, preds)
    print("## explain --measure (sweep run)\n")
    print(sweep.markdown(rows, sweep.facts(run)))
    print("engine decode step ms (cascade cell / flat twin), forced cascade steps:")
    for p in pairs:
        if p["kind"] == "cascade":
            t, f = by_cell[p["test_cell"]], by_cell[p["ref_cell"]]
            forced = sum(w["extra"].get("forced_on", 0) for w in t)
            print(f"  {p['test_cell']:24s} {speed.cell_speed(t)['decode_step_ms']:6.2f} / "
                  f"{speed.cell_speed(f)['decode_step_ms']:6.2f} ms, forced {forced}, "
                  f"cascade decode steps {sum(w['cascade_decode_steps'] for w in t)}")


def cold_cells() -> None:
    files = members("cold.tgz")
    recs = records(files)
    print("\n## cold matrix: engine starts, cells, per-wave phases (median ms) and engine step time\n")
    for r in recs:
        if r["type"] == "engine":
            print(f"engine {r['engine_key']}: start {r['start_s']:.1f} s (started {r['started_at']})")
    done = {r["cell_id"]: r["wall_s"] for r in recs if r["type"] == "cell_done"}
    print(f"{'cell':24s} {'waves':>5} {'cell s':>7} {'reset':>6} {'warm':>6} {'gen':>7} {'sync':>5} {'conv':>6} "
          f"{'step ms':>7} {'cascade/total steps':>20}")
    for cid, ws in waves_by_cell(recs).items():
        ph = [w["extra"]["phases"] for w in ws]

        def med(k: str, ph: list[dict] = ph) -> float:
            return 1000 * statistics.median(p[k] for p in ph)

        cs = speed.cell_speed(ws)
        casc = f"{sum(w['cascade_decode_steps'] for w in ws)}/{sum(w['total_steps'] for w in ws)}"
        print(f"{cid:24s} {len(ws):5d} {done.get(cid, float('nan')):7.2f} {med('reset_s'):6.1f} {med('warmup_s'):6.1f} "
              f"{med('generate_s'):7.1f} {med('sync_s'):5.1f} {med('convert_s'):6.1f} {cs['decode_step_ms']:7.2f} "
              f"{casc:>20}")


if __name__ == "__main__":
    sweep_table()
    cold_cells()
