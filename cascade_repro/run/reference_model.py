"""The reference model: the same weights at more precision, reading recorded samples teacher-forced.

Plain attention (softmax(QKᵀ)V in the model's dtype: no fused kernel, no cascade, no split), each
sequence in a row of its own behind a shared prefix whose KV is computed once (and, on a CPU, kept in
the user cache). Each scored row gives the reference's logprob of every generated token, its own
top-k, and its exact logprob of the token ids asked for (the arms' top-k lists, ``Want``), all read
from one full log-softmax. The pass that drives it is ``run/reference.py``.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from pathlib import Path
from typing import Any

from cascade_repro.atomic import write_atomic
from cascade_repro.errors import UsageError
from cascade_repro.run.penalties import Penalties
from cascade_repro.rundir.reference import RefRow

TORCH_DTYPES = {"fp32": "float32", "fp64": "float64"}
# Per row, per generated step: the token ids whose reference logprob the record keeps (``arm_ids``).
Want = list[list[set[int]]]
ATTN_NAME = "cascade_repro_reference"
PREFIX_CACHE, PREFIX_CACHE_KEEP = "reference-prefix", 4  # KV files kept in the user cache
# Logprobs are stored to 1e-9 nats: far below what separates any two arms (fp32 arms differ from
# float64 by ~1e-6), and a third of the bytes of a full repr.
DIGITS = 9
# Rows of one forward: bounded by tokens. A GPU batch is large; on a CPU one row at a time: a batch's
# float64 attention scores (~22 MB a row and layer at a 1,800-token context) above glibc's 32 MB mmap
# threshold are mapped and faulted in afresh for every layer.
TOKENS_PER_BATCH = {"cuda": 8192, "cpu": 256}


def tokens_per_batch(device_type: str) -> int:
    """TOKENS_PER_BATCH for a device type: a CPU's, or a GPU's for any other."""
    return TOKENS_PER_BATCH["cpu" if device_type == "cpu" else "cuda"]


def plain_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """softmax(QKᵀ·scale + mask)·V in the model's own dtype: no fused kernel, no cascade, no split.

    The query heads that share a KV head are stacked along the query axis, so each KV head is read
    once per group instead of being copied per query head (the same dot products).
    """
    import torch

    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    b, h, q, d = query.shape
    hk = key.shape[1]
    g = h // hk
    qg = query.reshape(b, hk, g * q, d)
    scores = torch.matmul(qg, key.transpose(-1, -2)) * scale  # [B, Hk, G*Q, L]
    if attention_mask is not None:
        m = attention_mask[:, :, None].expand(-1, -1, g, -1, -1).reshape(b, 1, g * q, -1)
        scores.masked_fill_(~m, float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), value)  # [B, Hk, G*Q, D]
    return out.reshape(b, h, q, d).transpose(1, 2).contiguous(), None


class ReferenceModel:
    """The model at the reference's precision, with the shared prefix's KV computed once."""

    def __init__(self, model_path: str, precision: str, device: str, topk: int, trust_remote_code: bool):
        import torch
        from transformers import AttentionInterface, AutoModelForCausalLM
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        # TF32 would round float32 matmuls to a 10-bit mantissa: less precise than the bf16 arms' sums.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        AttentionInterface.register(ATTN_NAME, plain_attention)
        AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)  # the 4-D mask is passed ready
        self.dtype = getattr(torch, TORCH_DTYPES[precision])
        kwargs: dict[str, Any] = {"dtype": self.dtype, "attn_implementation": ATTN_NAME}
        if device == "balanced":
            kwargs["device_map"] = "auto"
        try:
            self.model = AutoModelForCausalLM.from_pretrained(
                model_path, trust_remote_code=trust_remote_code, **kwargs
            )
        except OSError as e:
            raise UsageError(f"could not load model {model_path!r}: {str(e).splitlines()[0]}") from None
        if device != "balanced":
            self.model.to(device)
        self.model.eval()
        self.device = next(self.model.parameters()).device
        self.model_path = model_path
        self.topk = topk
        self._prefix: tuple[tuple[int, ...], Any] | None = None
        import inspect

        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "past_key_values" if "past_key_values" in params else "cache"
        cfg = self.model.config
        plain_head = not any(
            getattr(cfg, a, None) for a in ("final_logit_softcapping", "logit_scale", "logits_scaling")
        )
        self._head = self.model.get_output_embeddings() if plain_head else None
        # The run's sampling penalties (run/penalties.py), applied to the logits before log_softmax.
        self.penalties: Penalties | None = None

    def _prefix_cache(self, prefix: list[int]) -> Any:
        from transformers import DynamicCache

        key = tuple(prefix)
        if self._prefix is None or self._prefix[0] != key:
            cache = DynamicCache()
            stored = self._stored_prefix(prefix)
            if stored is not None:
                for i, (k, v) in enumerate(stored):
                    cache.update(k.to(self.device), v.to(self.device), i)
            elif prefix:
                self._extend(cache, 0, prefix)
                self._store_prefix(prefix, cache)
            self._prefix = (key, cache)
        return self._prefix[1]

    # On a CPU the shared system prompt's float64 prefill is most of a small run's reference pass
    # (~24 s for 1,600 tokens on 2 cores): its KV is kept in the user cache, keyed by the weights, the
    # precision and the prefix tokens, so only the first run on a machine pays it. A GPU recomputes it
    # in well under a second.
    def _prefix_file(self, prefix: list[int]) -> Path | None:
        if self.device.type != "cpu" or not prefix:
            return None
        from cascade_repro.plan.models import cache_root

        ident = [str(self.dtype), ",".join(map(str, prefix))]
        for f in sorted(Path(self.model_path).glob("*")) if Path(self.model_path).is_dir() else []:
            if f.suffix in (".safetensors", ".json", ".bin"):
                st = f.stat()
                ident.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
        digest = hashlib.sha256("|".join(ident).encode()).hexdigest()[:24]
        return cache_root() / PREFIX_CACHE / f"{digest}.pt"

    def _stored_prefix(self, prefix: list[int]) -> list[tuple[Any, Any]] | None:
        import torch

        path = self._prefix_file(prefix)
        if path is None or not path.is_file():
            return None
        try:
            layers = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # noqa: BLE001 - a damaged cache entry is recomputed, never trusted
            return None
        if not isinstance(layers, list) or not all(
            isinstance(kv, (list, tuple)) and len(kv) == 2 and kv[0].shape[-2] == len(prefix) for kv in layers
        ):
            return None
        os.utime(path)  # most recently used
        return [(k, v) for k, v in layers]

    def _store_prefix(self, prefix: list[int], cache: Any) -> None:
        import torch

        path = self._prefix_file(prefix)
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            layers = [(layer.keys.contiguous(), layer.values.contiguous()) for layer in cache.layers]
            write_atomic(path, lambda tmp: torch.save(layers, tmp))
            old = sorted(path.parent.glob("*.pt"), key=lambda p: p.stat().st_mtime, reverse=True)
            for stale in old[PREFIX_CACHE_KEEP:]:
                stale.unlink(missing_ok=True)
            for stale in path.parent.glob("*.tmp*"):  # a pass killed mid-write
                if stale.stat().st_mtime < time.time() - 3600:
                    stale.unlink(missing_ok=True)
        except (OSError, AttributeError):
            pass  # no cache is a slower run, not a failed one

    def score(
        self, prefix: list[int], rows: list[tuple[list[int], list[int]]], want: Want | None = None
    ) -> list[RefRow]:
        """Score each row's generated tokens given its own prompt tokens after ``prefix``.

        Rows are right-padded; a row's queries see the prefix and its own earlier tokens only.
        ``want[r][t]``: the token ids whose logprob row ``r`` stores at step ``t`` (``arm_ids``).
        """
        return self._score(self._prefix_cache(prefix), len(prefix), rows, want)

    def score_prompt(
        self, prefix: list[int], own: list[int], gens: list[list[int]], want: Want | None = None
    ) -> list[RefRow]:
        """Score several generations of one prompt (its arms, reruns, calibration rungs), reading the
        prompt's own tokens once instead of once per generation.

        The prompt's own tokens but the last extend a copy of the prefix's KV; each row is then that
        last token and its generated ones, so the logits that predict a generated token are the same
        positions :meth:`score` reads.
        """
        import copy

        if not own:  # the prefix's last token predicts the first generated one
            return self.score_prompt(prefix[:-1], prefix[-1:], gens, want)
        if self.penalties is not None:  # the penalty needs each row's whole prompt: read it per row
            return self.score(prefix, [(own, g) for g in gens], want)
        base, head = self._prefix_cache(prefix), own[:-1]
        if not head:
            return self._score(base, len(prefix), [(own, g) for g in gens], want)
        cache = copy.deepcopy(base)
        self._extend(cache, len(prefix), head)
        return self._score(cache, len(prefix) + len(head), [(own[-1:], g) for g in gens], want)

    def _extend(self, cache: Any, start: int, tokens: list[int]) -> None:
        """Append ``tokens``' KV to a batch-1 ``cache`` that holds ``start`` positions: each token sees
        the cache and the tokens before it. Only the KV is wanted, so the decoder runs without the head.

        In chunks of TOKENS_PER_BATCH tokens: each query row's attention is its own, so the KV is the
        same, and on a CPU a 1,600-token system prompt's float64 scores in one forward (~180 MB a layer)
        are mapped and faulted in afresh for every layer; in chunks of 256 the prefill takes half as long
        (RESULTS.md 6b)."""
        import torch

        step = tokens_per_batch(self.device.type)
        for at in range(0, len(tokens), step):
            chunk = tokens[at : at + step]
            n, past = len(chunk), start + at
            mask = torch.ones((1, 1, n, past + n), dtype=torch.bool, device=self.device)
            mask[..., past:] = torch.ones((n, n), dtype=torch.bool, device=self.device).tril()
            with torch.inference_mode():
                self.model.base_model(
                    input_ids=torch.tensor([chunk], device=self.device),
                    position_ids=(past + torch.arange(n, device=self.device))[None],
                    attention_mask=mask,
                    use_cache=True,
                    **{self._cache_kw: cache},
                )

    def _score(
        self, base: Any, p: int, rows: list[tuple[list[int], list[int]]], want: Want | None = None
    ) -> list[RefRow]:
        """Score rows after ``p`` positions whose KV is ``base`` (a batch-1 cache)."""
        import torch

        from cascade_repro.engines.hf import _wave_cache

        b = len(rows)
        seqs = [own + gen for own, gen in rows]
        width = max(len(s) for s in seqs)
        lengths = torch.tensor([len(s) for s in seqs], device=self.device)
        ids = torch.zeros((b, width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
        ids = ids.to(self.device)
        q = torch.arange(width, device=self.device)
        causal = (q[None, :] <= q[:, None])[None] & (q[None, None, :] < lengths[:, None, None])  # [B,Q,Q]
        mask = torch.cat([torch.ones((b, width, p), dtype=torch.bool, device=self.device), causal], dim=-1)
        # Padding queries see at least the row's first token, so no softmax row is empty.
        mask[:, :, p] = True
        with torch.inference_mode():
            cache = _wave_cache(base, b, p + width)
            # Only the positions that predict a generated token go through lm_head: each row's own
            # prompt part is read for its KV alone (at ~50k vocabulary entries, the head is a fifth
            # of a small model's work per position).
            where = [(i, len(own) - 1 + t) for i, (own, gen) in enumerate(rows) for t in range(len(gen))]
            rows_i = torch.tensor([i for i, _ in where], device=self.device)
            cols_i = torch.tensor([j for _, j in where], device=self.device)
            kw = {"input_ids": ids, "position_ids": (p + q)[None].expand(b, -1), "attention_mask": mask[:, None],
                  "use_cache": True, self._cache_kw: cache}  # fmt: skip
            if self._head is not None:
                hidden = self.model.base_model(**kw).last_hidden_state
                logits = self._head(hidden[rows_i, cols_i])
            else:  # a model whose logits are more than its head's matmul (softcapping, scaling)
                logits = self.model(**kw).logits[rows_i, cols_i]
            if self.penalties is not None and self._prefix is not None:
                prompts = [[*self._prefix[0], *own] for own, _ in rows]
                logits = self.penalties.apply_rows(logits.to(self.dtype), prompts, [g for _, g in rows])
            lps = torch.log_softmax(logits.to(self.dtype), dim=-1)
            chosen = lps.gather(
                1, torch.tensor([g for _, gen in rows for g in gen], device=self.device)[:, None]
            )
            tv, ti = lps.topk(self.topk, dim=-1)
            chosen_l, tv_l, ti_l = chosen[:, 0].tolist(), tv.tolist(), ti.tolist()
            arm_ids, arm_lp = _gather(lps, rows, want)
            out, k = [], 0
            for j, (_, gen) in enumerate(rows):
                n = len(gen)
                out.append(
                    RefRow(
                        [round(v, DIGITS) for v in chosen_l[k : k + n]],
                        ti_l[k : k + n],
                        [[round(v, DIGITS) for v in r] for r in tv_l[k : k + n]],
                        None if want is None else arm_ids[j],
                        None if want is None else arm_lp[j],
                    )
                )
                k += n
        del cache, logits, lps
        return out


def _gather(
    lps: Any, rows: list[tuple[list[int], list[int]]], want: Want | None
) -> tuple[list[list[list[int]]], list[list[list[float]]]]:
    """Per row and step, the wanted ids (sorted) and the reference's logprob of each, read from the
    full log-softmax ``lps`` (one row per generated token, rows in order): one gather for the batch.
    An id outside the vocabulary (a damaged samples file) is left out rather than failing the pass."""
    if want is None:
        return [], []
    import torch

    vocab = lps.shape[-1]
    ids = [
        [sorted(i for i in step if i < vocab) for step in (want[r] + [set()] * len(gen))[: len(gen)]]
        for r, (_, gen) in enumerate(rows)
    ]
    flat_pos, flat_id, k = [], [], 0
    for r, (_, gen) in enumerate(rows):
        for t in range(len(gen)):
            flat_pos += [k + t] * len(ids[r][t])
            flat_id += ids[r][t]
        k += len(gen)
    got = (
        lps[torch.tensor(flat_pos, device=lps.device), torch.tensor(flat_id, device=lps.device)].tolist()
        if flat_pos
        else []
    )
    vals, at = [], 0
    for r in range(len(rows)):
        row = []
        for step in ids[r]:
            row.append([round(v, DIGITS) for v in got[at : at + len(step)]])
            at += len(step)
        vals.append(row)
    return ids, vals
