"""transformers engine: greedy, padded batches, per-step top-k logprobs, cascade as a reference.

Layout of every wave's KV cache, row by row::

    [ shared prefix (P tokens, identical) | pads | request suffix | generated tokens ... ]

The shared prefix is prefilled once per engine with batch 1 (what vLLM's prefix cache gives a
wave after its warm-up request) and copied into every row; padding sits between the prefix and
the suffix so the prefix occupies the same columns in every row, which is what lets the cascade
arm attend to one copy of it. Both arms see the same cache, positions and mask.

Speed (CPU): a wave's cache is allocated once for every column the wave can reach and written in
place (``DynamicCache`` would ``torch.cat`` all of every layer's KV on every step), the decode mask is
a view of the wave's valid columns, and lm_head runs on the last position only (``logits_to_keep``).
"""

from __future__ import annotations

import copy
import functools
import inspect
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from cascade_repro.engines import cascade_attention as ca
from cascade_repro.engines.base import DEFAULT_TOPK, Completion, ModelLoader, WaveStats, completion_text
from cascade_repro.errors import UsageError
from cascade_repro.twin import CASCADE as TWIN

if TYPE_CHECKING:
    from cascade_repro.rundir.cells import EnginePlan
    from cascade_repro.rundir.manifest import Manifest

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class HFEngine:
    """One transformers model serving both arms (the attention function is toggled per wave)."""

    name = "hf"

    def __init__(
        self,
        model_path: str,
        dtype: str = "auto",
        device: str = "auto",
        topk: int = DEFAULT_TOPK,
        inject: str | None = None,
        trust_remote_code: bool = False,
        seed: int = 0,
        ignore_eos: bool = False,
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
        self.ignore_eos = ignore_eos
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
        # transformers 5.x renames forward's ``past_key_values`` to ``cache`` (the old name warns, then
        # goes); ``logits_to_keep`` (lm_head on the last position only) is absent from some models.
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "past_key_values" if "past_key_values" in params else "cache"
        self._last_logits = {"logits_to_keep": 1} if "logits_to_keep" in params else {}

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
                # Only the KV cache is kept: no logits are needed (lm_head on one position, not n).
                self.model(
                    input_ids=ids,
                    attention_mask=mask,
                    use_cache=True,
                    **{self._cache_kw: cache},
                    **self._last_logits,
                )
            ca.release_step_masks()
            self._prefix_key, self._prefix_cache = key, cache
        return self._prefix_cache

    @torch.inference_mode()
    def run_wave(
        self,
        prompts: list[list[int]],
        arm: str,
        max_tokens: int,
        prefix_len: int | None = None,
    ) -> tuple[list[Completion], WaveStats]:
        """Generate greedily for all prompts at once; ``prefix_len`` defaults to their common prefix."""
        from cascade_repro.prompts.chat import common_prefix_len

        b = len(prompts)
        p = common_prefix_len(prompts) if prefix_len is None else prefix_len
        p = min(p, min(len(x) for x in prompts) - 1)
        state = ca.STATE
        state.arm = arm if self._cascade_supported else TWIN.ref
        state.prefix_len, state.inject = p, self.inject
        state.reset_counters()

        suffixes = [x[p:] for x in prompts]
        s = max(len(x) for x in suffixes)
        cache = _wave_cache(self._prefix(prompts[0][:p]), b, p + s + max_tokens)
        dev = self.device
        ids = torch.full((b, s), self.pad_id, dtype=torch.long)
        # Every column the wave can reach, allocated once: the generated columns are valid from the start.
        valid = torch.ones((b, p + s + max_tokens), dtype=torch.bool)
        valid[:, p : p + s] = False
        pos = torch.full((b, s), p, dtype=torch.long)
        for i, suf in enumerate(suffixes):
            n = len(suf)
            ids[i, s - n :] = torch.tensor(suf)
            valid[i, p + s - n : p + s] = True
            pos[i, s - n :] = torch.arange(p, p + n)
        ids, valid, pos = ids.to(dev), valid.to(dev), pos.to(dev)

        finished = [False] * b
        out_tokens: list[list[int]] = [[] for _ in range(b)]
        out_lps: list[list[float]] = [[] for _ in range(b)]
        out_topk: list[list[list[list[float]]]] = [[] for _ in range(b)]
        reasons = ["length"] * b
        q_ids, q_pos = ids, pos
        total = p + s
        for step in range(max_tokens):
            if step == 0:
                # The padded suffix block: causal within it, pads masked out, and a pad query sees itself.
                cols = torch.arange(total, device=dev)
                qcol = torch.arange(total - s, total, device=dev)
                causal = cols[None, :] <= qcol[:, None]  # [Q, L]
                own = cols[None, :] == qcol[:, None]  # a pad query sees itself, so no row is empty
                mask = ((causal[None] & valid[:, None, :total]) | own[None])[:, None]  # [B, 1, Q, L]
            else:
                # One query per row at the last column: causal is all True and the query's own column
                # is a generated (valid) one, so the mask is the valid row itself.
                mask = valid[:, None, None, :total]  # [B, 1, 1, L]
            state.begin_step(b - sum(finished), decode=step > 0)
            logits = self.model(
                input_ids=q_ids,
                position_ids=q_pos,
                attention_mask=mask,
                use_cache=True,
                **{self._cache_kw: cache},
                **self._last_logits,
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
                if nxt_l[i] in self.eos_ids and not self.ignore_eos:
                    reasons[i] = "stop"
                    finished[i] = True
            if all(finished):
                break
            total += 1
            q_pos = q_pos[:, -1:] + 1
            q_ids = nxt[:, None]
        del cache, mask
        ca.release_step_masks()

        completions = [
            Completion(
                toks, completion_text(self._tok, toks, reasons[i]), reasons[i], out_lps[i], out_topk[i]
            )
            for i, toks in enumerate(out_tokens[:b])
        ]
        stats = WaveStats(
            state.steps_cascade,
            state.steps_total,
            state.calls,
            p if state.steps_cascade else 0,
            cascade_decode_steps=state.steps_cascade_decode,
        )
        return completions, stats


@functools.cache
def _inplace_layer_class() -> type:
    """A transformers ``DynamicLayer`` that grows in place inside a buffer allocated once per wave.

    ``DynamicLayer.update`` concatenates the new columns onto the whole cache (``torch.cat``), so every
    step copies all of every layer's KV once more. This layer writes the new columns into room set
    aside for them instead; ``keys``/``values`` are views of the filled columns, so attention reads the
    same numbers, in the same shape, as from a ``DynamicLayer``.
    """
    from transformers.cache_utils import DynamicLayer

    class InPlaceLayer(DynamicLayer):
        def __init__(
            self,
            capacity: int,
            batch: int | None = None,
            keys: torch.Tensor | None = None,
            values: torch.Tensor | None = None,
        ) -> None:
            super().__init__()
            self.capacity = capacity
            self._kbuf: torch.Tensor | None = None
            self._vbuf: torch.Tensor | None = None
            self._len = 0
            if batch is not None and keys is not None and values is not None:
                self._allocate(keys, values, batch)
                self._write(keys, values)  # a batch-1 prefix broadcasts into every row

        def _allocate(self, k: torch.Tensor, v: torch.Tensor, batch: int) -> None:
            self._kbuf = k.new_empty((batch, *k.shape[1:-2], self.capacity, k.shape[-1]))
            self._vbuf = v.new_empty((batch, *v.shape[1:-2], self.capacity, v.shape[-1]))
            self.device, self.dtype, self.is_initialized = k.device, k.dtype, True

        def _write(self, k: torch.Tensor, v: torch.Tensor) -> None:
            n, end = self._len, self._len + k.shape[-2]
            if end > self.capacity:  # more columns than planned for: move to a larger buffer
                old_k, old_v = self._kbuf[..., :n, :], self._vbuf[..., :n, :]
                self.capacity = max(end, 2 * self.capacity)
                self._allocate(old_k, old_v, old_k.shape[0])
                self._kbuf[..., :n, :].copy_(old_k)
                self._vbuf[..., :n, :].copy_(old_v)
            self._kbuf[..., n:end, :].copy_(k)
            self._vbuf[..., n:end, :].copy_(v)
            self._len = end
            self.keys, self.values = self._kbuf[..., :end, :], self._vbuf[..., :end, :]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
            if self._kbuf is None:
                self._allocate(key_states, value_states, key_states.shape[0])
            self._write(key_states, value_states)
            return self.keys, self.values

    return InPlaceLayer


def _wave_cache(prefix_cache: Any, batch: int, capacity: int) -> Any:
    """A wave's KV cache: the batch-1 prefix cache in every row, with room for ``capacity`` columns.

    The same contents as ``deepcopy(prefix_cache)`` then ``batch_repeat_interleave(batch)``, laid out so
    the wave's new columns are written in place instead of concatenated.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    layers = list(getattr(prefix_cache, "layers", None) or [])
    if any(type(layer) is not DynamicLayer or getattr(layer, "keys", None) is None for layer in layers):
        cache = copy.deepcopy(prefix_cache)  # not the cache _prefix builds: grow it the usual way
        cache.batch_repeat_interleave(batch)
        return cache
    layer_cls = _inplace_layer_class()
    cache = DynamicCache()
    cache.layers = [layer_cls(capacity, batch, layer.keys, layer.values) for layer in layers]
    cache.layer_class_to_replicate = functools.partial(layer_cls, capacity)
    return cache


def default_threads() -> None:
    """Use every core for intra-op work unless the user pinned OMP_NUM_THREADS."""
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(os.cpu_count() or 1)


def build(run: Manifest, eplan: EnginePlan, run_dir: Path | None, spec: Any, models: ModelLoader) -> HFEngine:
    """The registry's builder (engines.ENGINES): the engine of one engine plan of a run, ``spec`` its
    ``plan.matrix.MatrixSpec``."""
    default_threads()
    return HFEngine(
        run.model_path,
        dtype=eplan.dtype,
        device=spec.device,
        topk=spec.topk,
        inject=spec.inject,
        trust_remote_code=spec.trust_remote_code,
        seed=eplan.seed,
        ignore_eos=bool(spec.ignore_eos),
    )
