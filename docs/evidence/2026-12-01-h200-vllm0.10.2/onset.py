"""Where the first divergences of each cascade pair fall against the predicted split-KV onset.

Run from this folder: python onset.py   (needs cascade-repro and the embedded model; CPU is fine)

For every wave of a cell, FA2 starts splitting the suffix call when the wave's longest own part
(question tokens after the block-aligned shared prefix, plus generated tokens) passes the
threshold that cascade_repro.splitkv gives for that batch (513 tokens at 48 and 56 requests, 769
at 64 on 132 SMs). The onset step of a prompt is that threshold minus its wave's longest question.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from cascade_repro import explain, splitkv
from cascade_repro.chat import render_all
from cascade_repro.matrix import waves
from cascade_repro.models import load_tokenizer, resolve_model

band = Path(__file__).parent / "band"
run = json.loads((band / "run.json").read_text())
prompts = [json.loads(line)["prompt"] for line in (band / "prompts.jsonl").open()]
tok = load_tokenizer(resolve_model("embedded")[0], False)
rendered, shared = render_all(tok, run["prompt_set"]["system_prompt_text"], prompts)
own = [len(r) - shared // 16 * 16 for r in rendered]
cmp = pd.read_parquet(band / "comparisons.parquet")
print(f"shared prefix {shared} tokens; questions {min(own)}-{max(own)} tokens after the aligned prefix")
for b in (32, 48, 56, 64, 96):
    thr = splitkv.split_from_suffix(b, 9, 3, 64, 132)
    decode_cascade = explain.decide(shared // 16 * 16, [1] * b, 9, 3, num_sms=132).fires
    onset = {}
    for w in waves(len(prompts), b):
        longest = max(own[i] for i, _ in w)
        for i, real in w:
            if real:
                onset[i] = None if thr is None else thr - longest
    for fa in (2, 3):
        d = cmp[cmp.pair_id == f"tp1-b{b}-cascade-fa{fa}~flat"]
        div = d[~d.exact]
        viol = div[~div.topk_ok]
        line = f"b{b} FA{fa}: diverged {len(div)}/{len(d)}, outside top-k {len(viol)}"
        if not decode_cascade:
            print(line + f" (decode steps of {b} requests do not choose cascade: no split path under cascade)")
            continue
        if thr is None:
            print(line + f" (no split onset: {b} requests never split)")
            continue
        alive = [(r.first_div, onset[r.prompt_index], r.exact) for r in d.itertuples()
                 if r.exact or r.first_div >= onset[r.prompt_index]]
        lags = [fd - on for fd, on, ex in alive if not ex]
        steps = sorted(int(x) for x in viol.first_div)
        print(line + f"; split onset at step {min(onset.values())}-{max(onset.values())} (own part > {thr - 1});"
              f" {len(alive)} prompts still identical there, {len(lags)} of them diverged after it"
              + (f" (within {max(lags)} tokens, median {np.median(lags):g})" if lags else "")
              + (f"; outside-top-k divergences at steps {steps}" if steps else ""))
