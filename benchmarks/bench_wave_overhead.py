"""CPU side of one vLLM wave: the harness's own per-wave work that does not need vLLM or a GPU.

``benchmarks/bench_vllm_overhead.py`` measured the harness at ~40 ms per wave above a raw
``LLM.generate`` loop on an H200. Per wave the harness does, beyond the raw loop, (1) three
``probe.write_control`` calls and two ``collective_rpc`` round trips (``VLLMEngine.run_wave``),
(2) the conversion of every completion's per-step logprob dicts (``engines.vllm.completion_of`` ->
``topk_entries``), (3) one sample record per request plus a wave record, JSON-encoded by
``runstore.JsonlWriter.write``, then ``flush()`` (an fsync per wave until 2026-11-30; now only at
``cell_done``). This script times all of that except the RPCs, per wave, for each batch size:

- **conversion**: ``engines.vllm.completion_of`` (the engine's real function, with vLLM's text)
  over synthetic vLLM-like outputs: ``out.outputs[0]`` with ``token_ids``,
  ``text``, ``finish_reason`` and ``logprobs``, a list of per-step dicts ``{token_id: Logprob}``
  (a local copy of vLLM's ``Logprob`` dataclass: ``logprob``, ``rank``, ``decoded_token``) holding
  the sampled token first and the top-k with ranks 1..k; at ``--extra-rate`` of the steps the
  sampled token is outside the top-k (rank > k), so the dict holds k + 1 entries. Logprobs are
  float32 values, as vLLM returns them.
- **JSON+write+flush**: the worker's record building (a copy of the dicts in ``worker.run_engine``)
  and ``JsonlWriter.write`` for every sample record and the wave record, then ``flush()``.
- **sync**: the same with ``sync()`` (flush + fsync) instead of ``flush()``; the table's fsync
  column is the ``sync()`` call minus the ``flush()`` call (each timed alone, median and p90), what
  the per-wave fsync cost before it was dropped (a negative difference, noise, shows as 0);
  "total with fsync" adds it to the flush total. The files go to ``--dir`` (default: a temporary
  folder under ``results/``, i.e. the disk a run writes to).
- **3 x write_control**: three ``probe.write_control`` calls (temp file + rename each).

Every part is repeated ``--reps`` times per batch (capped at ``--budget-s`` seconds per part and
batch, at least ``--min-reps``); the table gives the median and p90 in ms. The box is shared: the
load averages before and after are printed and recorded. Needs neither vLLM nor a GPU.

    python benchmarks/bench_wave_overhead.py --out results/wave_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cascade_repro.engines.base import WaveStats, completion_text  # noqa: E402
from cascade_repro.engines.vllm import completion_of  # noqa: E402 - importing it does not import vLLM
from cascade_repro.prompts.chat import prompt_hash  # noqa: E402
from cascade_repro.run import runstore  # noqa: E402
from cascade_repro.run.worker import freeze_heap, wave_records  # noqa: E402
from cascade_repro.vllm_surface import probe  # noqa: E402

VOCAB = 49152  # SmolLM2 (the model of the H200 measurement)
PROMPT_TOKENS = 420  # about the rendered length of the ko-ifeval-style prompts with the system prompt
COLUMNS = ("conversion", "conversion_flat_loop", "conversion_flat", "json_write_flush", "fsync", "write_control_x3", "total_no_fsync",
           "total_fsync")  # fmt: skip
HEADERS = (
    "conversion",
    "conversion (flat, by position)",
    "conversion (flat)",
    "JSON+write+flush",
    "fsync (sync-flush)",
    "3 x write_control",
    "total w/o fsync",
    "total with fsync",
)


@dataclass
class Logprob:
    """Same fields as ``vllm.logprobs.Logprob``."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class FlatLogprobs:
    """The fields of ``vllm.logprobs.FlatLogprobs`` (``SamplingParams(flat_logprobs=True)``, vLLM
    0.11.1 on): per position the sampled token first, then the top-k in rank order."""

    start_indices: list[int]
    end_indices: list[int]
    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int | None]
    decoded_tokens: list[str | None]

    def __getitem__(self, i: int) -> dict[int, Logprob]:
        return {
            self.token_ids[j]: Logprob(self.logprobs[j], self.ranks[j], self.decoded_tokens[j])
            for j in range(self.start_indices[i], self.end_indices[i])
        }


def flat_outputs(outs: list[Any], topk: int) -> list[Any]:
    """The same outputs with their logprobs as vLLM lays them out with ``flat_logprobs=True``."""
    flat_outs = []
    for o in outs:
        c = o.outputs[0]
        fl = FlatLogprobs([], [], [], [], [], [])
        for tid, d in zip(c.token_ids, c.logprobs, strict=True):
            top = sorted(((t, lp) for t, lp in d.items() if lp.rank is not None and lp.rank <= topk),
                         key=lambda x: x[1].rank)  # fmt: skip
            fl.start_indices.append(len(fl.logprobs))
            for t, lp in [(tid, d[tid]), *top]:
                fl.token_ids.append(t)
                fl.logprobs.append(lp.logprob)
                fl.ranks.append(lp.rank)
                fl.decoded_tokens.append(lp.decoded_token)
            fl.end_indices.append(len(fl.logprobs))
        flat_outs.append(SimpleNamespace(outputs=[SimpleNamespace(**{**vars(c), "logprobs": fl})]))
    return flat_outs


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _word(rng: random.Random) -> str:
    return "".join(chr(rng.randint(0xAC00, 0xD7A3)) for _ in range(rng.randint(1, 3)))


def make_outputs(batch: int, max_tokens: int, topk: int, extra_rate: float, seed: int) -> list[Any]:
    """``batch`` vLLM-like ``RequestOutput`` stand-ins of ``max_tokens`` greedy steps each."""
    rng = random.Random(seed)
    outs = []
    for _ in range(batch):
        token_ids: list[int] = []
        steps: list[dict[int, Logprob]] = []
        pieces: list[str] = []
        for _ in range(max_tokens):
            ids = rng.sample(range(VOCAB), topk + 1)
            vals = sorted((_f32(-abs(rng.gauss(0, 3)) - 1e-4 * i) for i in range(topk + 1)), reverse=True)
            top = [(ids[r], vals[r], r + 1) for r in range(topk)]
            if rng.random() < extra_rate:  # sampled token outside the top-k
                sampled = (ids[topk], _f32(vals[topk] - 0.5), topk + 1 + rng.randint(0, 50))
            else:
                sampled = top[0]
            d: dict[int, Logprob] = {}
            for tid, lp, rank in (sampled, *top):
                d.setdefault(tid, Logprob(lp, rank, " " + _word(rng)))
            token_ids.append(sampled[0])
            steps.append(d)
            pieces.append(_word(rng))
        c = SimpleNamespace(
            token_ids=token_ids, text=" ".join(pieces), finish_reason="length", logprobs=steps
        )
        outs.append(SimpleNamespace(outputs=[c]))
    return outs


def convert(k: int, outs: list[Any]) -> list[Any]:
    """What ``VLLMEngine.run_wave`` returns, with vLLM's own text: ``engines.vllm.completion_of``."""
    return [completion_of(o, k) for o in outs]


def write_wave(
    writer: runstore.JsonlWriter, ctx: dict[str, Any], comps: list[Any], stats: WaveStats, w: int, sync: bool
) -> float:
    """The worker's per-wave records (``worker.run_engine``), then ``flush()`` or ``sync()``.

    Returns the milliseconds of that last call alone.
    """
    prompts, hashes, rendered, wave, cid = (
        ctx["prompts"],
        ctx["hashes"],
        ctx["rendered"],
        ctx["wave"],
        ctx["cid"],
    )
    w0 = time.time()
    samples, wave_rec = wave_records(cid, w, wave, comps, stats, prompts, hashes, rendered)
    for rec in samples:
        writer.write(rec)
    wave_rec["wall_s"] = round(time.time() - w0, 4)
    writer.write(wave_rec)
    t0 = time.perf_counter()
    if sync:
        writer.sync()
    else:
        writer.flush()
    return (time.perf_counter() - t0) * 1e3


def _stats(batch: int, max_tokens: int) -> WaveStats:
    extra = {
        "prefix_cache_reset": True,
        "probe": "rpc",
        "probe_procs": 1,
        "forced_off": 0,
        "seen_prefix_len_max": 256,
        "max_reqs": batch,
        "fa_versions": [3],
    }
    return WaveStats(
        cascade_steps=max_tokens - 1,
        total_steps=max_tokens,
        cascade_calls=30 * (max_tokens - 1),
        common_prefix_len=256,
        extra=extra,
    )


def _timed(fn: Any, reps: int, min_reps: int, budget_s: float) -> list[float]:
    out: list[float] = []
    t_end = time.perf_counter() + budget_s
    for r in range(reps):
        t0 = time.perf_counter()
        fn(r)
        out.append((time.perf_counter() - t0) * 1e3)
        if r + 1 >= min_reps and time.perf_counter() > t_end:
            break
    return out


def _summ(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)
    return {"median": statistics.median(s), "p90": s[min(len(s) - 1, int(0.9 * len(s)))], "n": len(s)}


def text_tokenizer() -> Any:
    """The embedded model's tokenizer where its folder is converted already (None otherwise: a
    benchmark does not convert the model)."""
    from cascade_repro.plan.models import embedded_converted, embedded_model_dir, load_tokenizer

    return load_tokenizer(str(embedded_model_dir())) if embedded_converted() else None


def measure_batch(batch: int, a: argparse.Namespace, workdir: Path, tok: Any = None) -> dict[str, Any]:
    outs = make_outputs(batch, a.max_tokens, a.topk, a.extra_rate, seed=a.seed + batch)
    # The conversion columns time vLLM's text as it comes (detokenize=True); the text decode the
    # engine does instead where vLLM has detokenize (completion_text) is timed on its own below.
    rng = random.Random(a.seed)
    rendered = [[rng.randrange(VOCAB) for _ in range(PROMPT_TOKENS)] for _ in range(batch)]
    ctx = {
        "prompts": [{"key": f"ko-ifeval-style/{i:04d}"} for i in range(batch)],
        "hashes": [prompt_hash(r) for r in rendered],
        "rendered": rendered,
        "wave": [(i, True) for i in range(batch)],
        "cid": f"tp1-b{batch}-cascade",
    }
    stats = _stats(batch, a.max_tokens)
    if a.gc_freeze:  # as the worker does after its engine start: these outputs stand in for its heap
        freeze_heap()
    comps = convert(a.topk, outs)
    assert all(len(s) == a.topk for c in comps for s in c.topk)
    budget = a.budget_s

    conv = _timed(lambda r: convert(a.topk, outs), a.reps, a.min_reps, budget)
    flat = flat_outputs(outs, a.topk)
    flat_comps = convert(a.topk, flat)
    assert [c.topk for c in flat_comps] == [c.topk for c in comps]  # the same conversion, cheaper
    conv_flat = _timed(lambda r: convert(a.topk, flat), a.reps, a.min_reps, budget)
    # The same with the whole-list path switched off: every position through the loop, as before it.
    with mock.patch("cascade_repro.engines.vllm.uniform_topk", return_value=None):
        assert [c.topk for c in convert(a.topk, flat)] == [c.topk for c in comps]
        conv_flat_loop = _timed(lambda r: convert(a.topk, flat), a.reps, a.min_reps, budget)

    res: dict[str, Any] = {"batch": batch}
    last: dict[str, list[float]] = {}
    for label, sync in (("json_write_flush", False), ("json_write_sync", True)):
        path = workdir / f"b{batch}-{label}.jsonl"
        writer = runstore.JsonlWriter(path)
        writer.sync()
        calls = last[label] = []
        res[label] = _summ(
            _timed(
                lambda r: calls.append(write_wave(writer, ctx, comps, stats, r, sync)),  # noqa: B023
                a.reps,
                a.min_reps,
                budget,
            )
        )
        writer.close()
        res[f"{label}_bytes_per_wave"] = path.stat().st_size // max(1, res[label]["n"])
        path.unlink()

    pdir = workdir / f"probe-b{batch}"
    pdir.mkdir()

    def ctl(r: int) -> None:
        probe.write_control(pdir, None, False, None, 3 * r + 1)
        probe.write_control(pdir, f"k/w{r:05d}-cascade", False, None, 3 * r + 2)
        probe.write_control(pdir, None, False, None, 3 * r + 3)

    wc = _timed(ctl, a.reps, a.min_reps, budget)
    res["conversion"] = _summ(conv)
    res["conversion_flat"] = _summ(conv_flat)
    res["conversion_flat_loop"] = _summ(conv_flat_loop)
    if tok is not None:
        ids = [(c.token_ids, c.finish_reason) for c in comps]
        res["text_decode"] = _summ(
            _timed(lambda r: [completion_text(tok, t, f) for t, f in ids], a.reps, a.min_reps, budget)
        )
    res["write_control_x3"] = _summ(wc)
    res["bytes_per_wave"] = res.pop("json_write_flush_bytes_per_wave")
    res.pop("json_write_sync_bytes_per_wave")
    # fsync = the sync() call minus the flush() call, each timed alone (the whole passes differ by
    # the same amount, but their difference drowns in the JSON's noise on a loaded box).
    res["flush_call"], res["sync_call"] = _summ(last["json_write_flush"]), _summ(last["json_write_sync"])
    f = res["json_write_flush"]
    raw = {q: res["sync_call"][q] - res["flush_call"][q] for q in ("median", "p90")}
    res["fsync_raw"] = raw  # a negative difference is noise (fsync next to free): shown as 0
    res["fsync"] = {q: max(0.0, v) for q, v in raw.items()}
    for q in ("median", "p90"):  # p90 of a sum is not the sum of p90s; the sum is an upper figure
        base = res["conversion"][q] + f[q] + res["write_control_x3"][q]
        res.setdefault("total_no_fsync", {})[q] = base
        res.setdefault("total_fsync", {})[q] = base + res["fsync"][q]
    return res


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| batch | " + " | ".join(HEADERS) + " |", "|---|" + "---|" * len(HEADERS)]
    for r in rows:
        cells = [f"{r[c]['median']:.2f} / {r[c]['p90']:.2f}" for c in COLUMNS]
        lines.append(f"| {r['batch']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", default="1,8,32,64", help="comma-separated batch sizes")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--topk", type=int, default=5)
    ap.add_argument(
        "--extra-rate",
        type=float,
        default=0.02,
        help="share of steps whose sampled token is outside the top-k",
    )
    ap.add_argument("--reps", type=int, default=200, help="repetitions per part and batch (at most)")
    ap.add_argument("--min-reps", type=int, default=15, help="repetitions per part and batch (at least)")
    ap.add_argument(
        "--budget-s", type=float, default=2.5, help="seconds per part and batch, after --min-reps"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--gc-freeze",
        action="store_true",
        help="freeze the heap before timing each batch, as the worker does after its engine start",
    )
    ap.add_argument(
        "--dir", default=None, help="where the samples and control files go (default: under results/)"
    )
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    batches = [int(b) for b in a.batch.split(",") if b.strip()]
    base = Path(a.dir) if a.dir else REPO / "results"
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="wave-overhead-", dir=base))
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    tok = text_tokenizer()
    try:
        rows = [measure_batch(b, a, workdir, tok) for b in batches]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    load_after = os.getloadavg()
    res = {
        "config": {
            k: getattr(a, k)
            for k in ("max_tokens", "topk", "extra_rate", "reps", "min_reps", "budget_s", "seed", "gc_freeze")
        }
        | {"batch": batches, "dir": str(base)},
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
        },
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "units": "ms per wave; median and p90 over the repetitions; fsync = sync() call - flush() call",
        "rows": rows,
        "wall_s": round(time.perf_counter() - t0, 2),
    }
    print(f"per wave, {a.max_tokens} tokens x top-{a.topk}, ms as median / p90; files under {base}")
    print(table(rows))
    print("bytes of JSONL per wave: " + ", ".join(f"b{r['batch']} {r['bytes_per_wave']:,}" for r in rows))
    if tok is None:
        print("text decode: not timed (the embedded model's folder is not converted yet)")
    else:
        print("text decode (engines/base.completion_text, the embedded model's tokenizer), ms per wave: " + ", ".join(
            f"b{r['batch']} {r['text_decode']['median']:.2f} / {r['text_decode']['p90']:.2f}" for r in rows))  # fmt: skip
    print(
        f"load average (1/5/15 min) before {res['loadavg_before']}, after {res['loadavg_after']} "
        f"on {os.cpu_count()} CPUs; {res['wall_s']} s"
    )
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    return res


if __name__ == "__main__":
    main()
