"""transformers engine: greedy, padded batches, per-step top-k logprobs, cascade as a reference.

Layout of every wave's KV cache, row by row::

    [ shared prefix (P tokens, identical) | pads | request suffix | generated tokens ... ]

The shared prefix is prefilled once per engine with batch 1 (what vLLM's prefix cache gives a
wave after its warm-up request) and copied into every row; padding sits between the prefix and
the suffix so the prefix occupies the same columns in every row, which is what lets the cascade
arm attend to one copy of it. Both arms see the same cache, positions and mask.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch

from cascade_repro.engines import cascade_attention as ca
from cascade_repro.engines.base import Completion, WaveStats
from cascade_repro.errors import UsageError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class HFEngine:
    """One transformers model serving both arms (the attention function is toggled per wave)."""

    name = "hf"

    def __init__(
        self,
        model_path: str,
        dtype: str = "auto",
        device: str = "auto",
        topk: int = 5,
        inject: str | None = None,
        trust_remote_code: bool = False,
        seed: int = 0,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if dtype == "auto":
            dtype = "float32" if device == "cpu" else "bfloat16"
        self.device = torch.device(device)
        self.dtype_name = dtype
        self.topk = topk
        self.inject = inject
        torch.manual_seed(seed)
        attn = ca.register()
        try:
            self._tok = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
            self.model = AutoModelForCausalLM.from_pretrained(
                model_path, dtype=DTYPES[dtype], attn_implementation=attn, trust_remote_code=trust_remote_code
            )
        except OSError as e:
            raise UsageError(f"could not load model {model_path!r}: {str(e).splitlines()[0]}") from None
        self.model.to(self.device).eval()
        cfg = self.model.config
        if getattr(cfg, "sliding_window", None) or getattr(cfg, "alibi", False):
            # vLLM never runs cascade with sliding windows or ALiBi; neither do we.
            self._cascade_supported = False
        else:
            self._cascade_supported = True
        eos = getattr(self.model.generation_config, "eos_token_id", None) or self._tok.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, list) else [eos])
        pad = self._tok.pad_token_id
        self.pad_id = pad if pad is not None else next(iter(self.eos_ids))
        self._prefix_key: tuple[int, ...] | None = None
        self._prefix_cache: Any = None

    def tokenizer(self) -> Any:
        return self._tok

    def effective(self) -> dict[str, Any]:
        cfg = self.model.config
        return {
            "engine": "hf",
            "device": str(self.device),
            "dtype": str(next(self.model.parameters()).dtype).replace("torch.", ""),
            "attention": "reference cascade (prefix pass + suffix pass + LSE merge) / SDPA flat",
            "cascade_rule": f"prefix >= {ca.MIN_COMMON_PREFIX} tokens (block-aligned) and >= {ca.MIN_REQUESTS} requests",
            "cascade_supported": self._cascade_supported,
            "num_attention_heads": getattr(cfg, "num_attention_heads", None),
            "num_key_value_heads": getattr(cfg, "num_key_value_heads", None),
            "inject": self.inject or "none",
            "torch_threads": torch.get_num_threads(),
        }

    def close(self) -> None:
        self._prefix_cache = None

    @torch.inference_mode()
    def _prefix(self, prefix: list[int]) -> Any:
        """Prefill the shared prefix once (batch 1, flat) and keep its KV cache."""
        key = tuple(prefix)
        if self._prefix_key != key:
            from transformers import DynamicCache

            cache = DynamicCache()
            if prefix:
                ids = torch.tensor([prefix], device=self.device)
                n = len(prefix)
                mask = torch.ones(1, 1, n, n, dtype=torch.bool, device=self.device).tril()
                ca.STATE.use_now = False
                self.model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
            self._prefix_key, self._prefix_cache = key, cache
        return self._prefix_cache

    @torch.inference_mode()
    def run_wave(
        self, prompts: list[list[int]], arm: str, max_tokens: int, prefix_len: int | None = None
    ) -> tuple[list[Completion], WaveStats]:
        """Generate greedily for all prompts at once; ``prefix_len`` defaults to their common prefix."""
        from cascade_repro.chat import common_prefix_len

        b = len(prompts)
        p = common_prefix_len(prompts) if prefix_len is None else prefix_len
        p = min(p, min(len(x) for x in prompts) - 1)
        state = ca.STATE
        state.arm = arm if self._cascade_supported else "flat"
        state.prefix_len, state.inject = p, self.inject
        state.reset_counters()

        cache = copy.deepcopy(self._prefix(prompts[0][:p]))
        if p:
            cache.batch_repeat_interleave(b)
        suffixes = [x[p:] for x in prompts]
        s = max(len(x) for x in suffixes)
        dev = self.device
        ids = torch.full((b, s), self.pad_id, dtype=torch.long)
        valid = torch.zeros((b, p + s), dtype=torch.bool)
        valid[:, :p] = True
        pos = torch.full((b, s), p, dtype=torch.long)
        for i, suf in enumerate(suffixes):
            n = len(suf)
            ids[i, s - n :] = torch.tensor(suf)
            valid[i, p + s - n :] = True
            pos[i, s - n :] = torch.arange(p, p + n)
        ids, valid, pos = ids.to(dev), valid.to(dev), pos.to(dev)

        finished = torch.zeros(b, dtype=torch.bool, device=dev)
        out_tokens: list[list[int]] = [[] for _ in range(b)]
        out_lps: list[list[float]] = [[] for _ in range(b)]
        out_topk: list[list[list[list[float]]]] = [[] for _ in range(b)]
        reasons = ["length"] * b
        q_ids, q_pos = ids, pos
        for _step in range(max_tokens):
            q = q_ids.shape[1]
            total = valid.shape[1]
            cols = torch.arange(total, device=dev)
            qcol = torch.arange(total - q, total, device=dev)
            causal = cols[None, :] <= qcol[:, None]  # [Q, L]
            own = cols[None, :] == qcol[:, None]  # a pad query sees itself, so no row is empty
            mask = ((causal[None] & valid[:, None, :]) | own[None])[:, None]  # [B, 1, Q, L]
            state.begin_step(int((~finished).sum()))
            logits = self.model(
                input_ids=q_ids, position_ids=q_pos, attention_mask=mask, past_key_values=cache, use_cache=True
            ).logits[:, -1, :]
            lps = torch.log_softmax(logits.float(), dim=-1)
            nxt = lps.argmax(dim=-1)
            top_v, top_i = lps.topk(self.topk, dim=-1)
            chosen = lps.gather(1, nxt[:, None])[:, 0]
            nxt_l, chosen_l = nxt.tolist(), chosen.tolist()
            top_v_l, top_i_l = top_v.tolist(), top_i.tolist()
            for i in range(b):
                if finished[i]:
                    continue
                out_tokens[i].append(nxt_l[i])
                out_lps[i].append(chosen_l[i])
                out_topk[i].append([[t, v] for t, v in zip(top_i_l[i], top_v_l[i], strict=True)])
                if nxt_l[i] in self.eos_ids:
                    reasons[i] = "stop"
                    finished[i] = True
            if bool(finished.all()):
                break
            valid = torch.cat([valid, torch.ones((b, 1), dtype=torch.bool, device=dev)], dim=1)
            q_pos = q_pos[:, -1:] + 1
            q_ids = nxt[:, None]

        tok = self._tok
        completions = []
        for i in range(b):
            toks = out_tokens[i]
            text_toks = toks[:-1] if reasons[i] == "stop" else toks
            completions.append(
                Completion(toks, tok.decode(text_toks, skip_special_tokens=True), reasons[i], out_lps[i], out_topk[i])
            )
        stats = WaveStats(state.steps_cascade, state.steps_total, state.calls, p if state.steps_cascade else 0)
        return completions, stats


def default_threads() -> None:
    """Use every core for intra-op work unless the user pinned OMP_NUM_THREADS."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(os.cpu_count() or 1)
