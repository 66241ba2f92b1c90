"""CPU side of one vLLM wave: converting vLLM's outputs into the harness's completions, no vLLM or GPU.

Per wave ``VLLMEngine.run_wave`` turns every request's logprobs into top-k lists
(``engines.vllm.completion_of``). This script times that conversion on synthetic vLLM-like outputs
for each batch size, in the three forms the engine meets:

- **conversion**: nested logprobs, a list of per-step dicts ``{token_id: Logprob}`` (what vLLM
  releases without flat logprobs return; a local copy of vLLM's ``Logprob``: ``logprob``, ``rank``,
  ``decoded_token``), the sampled token first and the top-k with ranks 1..k; at ``--extra-rate`` of
  the steps the sampled token is outside the top-k (rank > k), so the dict holds k + 1 entries.
  Logprobs are float32 values, as vLLM returns them.
- **conversion (flat, by position)**: the same outputs laid out as vLLM's ``FlatLogprobs``
  (``SamplingParams(flat_logprobs=True)``), converted position by position (``topk_by_position``,
  the fallback for a request laid out otherwise);
- **conversion (flat)**: the same flat outputs through the whole-list path (``uniform_topk``), what
  the engine does on every release that has flat logprobs.

All three must give the same top-k lists (checked before timing). Where the embedded model's folder
is converted, the text decode the engine does itself (``engines/base.completion_text``) is timed too.
``--gc-freeze`` freezes the heap first, as the worker does after its engine start.

Every part is repeated ``--reps`` times per batch (capped at ``--budget-s`` seconds per part and
batch, at least ``--min-reps``); the table gives the median and p90 in ms. The load averages before
and after are printed and recorded. Target: none; the figures feed benchmarks/RESULTS.md's "CPU side
of a wave".

    python benchmarks/bench_wave_overhead.py --gc-freeze --out results/wave_overhead.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cascade_repro.engines.base import completion_text  # noqa: E402
from cascade_repro.engines.vllm import completion_of  # noqa: E402 - importing it does not import vLLM
from cascade_repro.run.worker import freeze_heap  # noqa: E402

VOCAB = 49152  # SmolLM2 (the model of the H200 measurement)
COLUMNS = ("conversion", "conversion_flat_loop", "conversion_flat")
HEADERS = ("conversion", "conversion (flat, by position)", "conversion (flat)")


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


def measure_batch(batch: int, a: argparse.Namespace, tok: Any = None) -> dict[str, Any]:
    outs = make_outputs(batch, a.max_tokens, a.topk, a.extra_rate, seed=a.seed + batch)
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
    # The same with the whole-list path switched off: every position through the loop.
    with mock.patch("cascade_repro.engines.vllm_logprobs.uniform_topk", return_value=None):
        assert [c.topk for c in convert(a.topk, flat)] == [c.topk for c in comps]
        conv_flat_loop = _timed(lambda r: convert(a.topk, flat), a.reps, a.min_reps, budget)

    res: dict[str, Any] = {
        "batch": batch,
        "conversion": _summ(conv),
        "conversion_flat_loop": _summ(conv_flat_loop),
        "conversion_flat": _summ(conv_flat),
    }
    if tok is not None:
        ids = [(c.token_ids, c.finish_reason) for c in comps]
        res["text_decode"] = _summ(
            _timed(lambda r: [completion_text(tok, t, f) for t, f in ids], a.reps, a.min_reps, budget)
        )
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
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    batches = [int(b) for b in a.batch.split(",") if b.strip()]
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    tok = text_tokenizer()
    rows = [measure_batch(b, a, tok) for b in batches]
    load_after = os.getloadavg()
    res = {
        "config": {
            k: getattr(a, k)
            for k in ("max_tokens", "topk", "extra_rate", "reps", "min_reps", "budget_s", "seed", "gc_freeze")
        }
        | {"batch": batches},
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "processor": platform.processor() or platform.machine(),
        },
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
        "units": "ms per wave; median and p90 over the repetitions",
        "rows": rows,
        "wall_s": round(time.perf_counter() - t0, 2),
    }
    print(f"per wave, {a.max_tokens} tokens x top-{a.topk}, ms as median / p90")
    print(table(rows))
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
