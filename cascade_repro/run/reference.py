"""The reference pass: every recorded sample read again, teacher-forced, by the same weights at more precision.

Two noisy arms disagreeing is weak evidence: a small bf16 model drifts between batch sizes and
engine starts on its own. What separates a wrong result from a reordered sum is how far each arm's
own tokens are from a computation more precise than either: the same weights in float32 (TF32
off) where the arms ran bf16/fp16, float64 where they ran float32; plain attention (no cascade,
no fused kernel), each sequence in a row of its own (the rows share nothing but the read-only
prefix KV). The judge (``judge/metrics/reference.py``, ``judge/verdicts.py``) compares each arm's
logprobs with these.

The shared system prompt is prefilled once and its KV copied into every row, so the cost is the
per-request part. A record is keyed by the sample's content (the prompt's hash and the generated
token ids), so a sequence two cells share is scored once, a cut pass resumes where it stopped, and a
finished one is never recomputed. Files: ``reference/<engine key>.jsonl``, their records and reader in
``rundir/reference.py``.

It never runs inside the engine under test: the runner starts it as its own process
(``python -m cascade_repro.run.reference RUN_DIR PRECISION DEVICE``) after every worker has exited,
so the GPU is free.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cascade_repro.atomic import write_atomic
from cascade_repro.errors import UsageError
from cascade_repro.plan.matrix import spec_of
from cascade_repro.run.penalties import Penalties
from cascade_repro.rundir import jsonl, layout, manifest, sample_scan
from cascade_repro.rundir.reference import RECORD, START, RefRow, fingerprint, read_reference

CHOICES = ("auto", "fp32", "fp64", "off")
DEVICES = ("auto", "cpu", "cuda", "balanced")  # balanced: layers spread over GPUs and CPU (accelerate)
TORCH_DTYPES = {"fp32": "float32", "fp64": "float64"}
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


# Tokens per second scored (each row's own prompt part and its generated tokens, behind a ~1,600-token
# prefix), for the time estimate; the pass reports its real speed as it goes. Measured on 2 CPU cores
# (the embedded model: fp64 ~40, fp32 ~110) and an H200 (fp32, ~30 samples of ~250 tokens a second).
SPEED = {("cuda", "fp32"): 7500.0, ("cuda", "fp64"): 700.0, ("cpu", "fp64"): 40.0, ("cpu", "fp32"): 110.0}
OWN_TOKENS = 100  # a prompt's own part after the shared system prompt, typically


@dataclass(frozen=True)
class ReferenceOptions:
    """``--reference`` and ``--reference-device``: what the judge's reference is computed in, and where."""

    precision: str = "auto"
    device: str = "auto"

    def __post_init__(self) -> None:
        if self.precision not in CHOICES:
            raise UsageError(f"--reference must be one of {', '.join(CHOICES)}, not {self.precision!r}")
        if self.device not in DEVICES and not _is_cuda_index(self.device):
            raise UsageError(
                f"--reference-device must be one of {', '.join(DEVICES)} or cuda:N, not {self.device!r}"
            )

    @property
    def enabled(self) -> bool:
        return self.precision != "off"

    def resolve(self, arm_dtypes: list[str]) -> str | None:
        """The precision to run: ``fp64`` over float32 arms, ``fp32`` over bf16/fp16 ones; None when off.

        A reference no more precise than an arm it judges would call that arm's rounding an error.
        """
        if not self.enabled:
            return None
        fp32_arms = [d for d in arm_dtypes if d in ("float32", "fp32")]
        if self.precision == "auto":
            return "fp64" if fp32_arms else "fp32"
        if self.precision == "fp32" and fp32_arms:
            raise UsageError(
                "--reference fp32 is no more precise than the float32 arms it would judge: "
                "use --reference fp64 (or auto)"
            )
        return self.precision

    def to_dict(self) -> dict[str, str]:
        return {"precision": self.precision, "device": self.device}


def _is_cuda_index(device: str) -> bool:
    head, _, idx = device.partition(":")
    return head == "cuda" and idx.isdigit()


@dataclass
class Todo:
    """One sequence the reference has not scored yet."""

    fp: str
    prompt_index: int
    prompt_hash: str
    token_ids: list[int]


def needed(run_dir: Path, engine_keys: list[str], have: set[str]) -> dict[str, list[Todo]]:
    """Per engine key, the finished cells' sequences not yet in ``have`` (each content once)."""
    seen = set(have)
    out: dict[str, list[Todo]] = {}
    for key in engine_keys:
        todo = out.setdefault(key, [])
        for rec in sample_scan.iter_samples(layout.samples_path(run_dir, key)):
            toks, idx, ph = rec.get("token_ids"), rec.get("prompt_index"), rec.get("prompt_hash")
            if not (isinstance(toks, list) and toks and isinstance(idx, int) and isinstance(ph, str)):
                continue
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
                continue
            fp = fingerprint(ph, toks)
            if fp not in seen:
                seen.add(fp)
                todo.append(Todo(fp, idx, ph, toks))
    return out


# --- cost and memory, said before anything runs ---------------------------------------------------


def param_count(model_path: str) -> int | None:
    """Parameters of a local model, from its safetensors headers (no tensor is read)."""
    total = 0
    files = sorted(Path(model_path).glob("*.safetensors")) if Path(model_path).is_dir() else []
    for f in files:
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error):
            return None
        for name, meta in header.items():
            if name != "__metadata__" and isinstance(meta, dict):
                total += math.prod(meta.get("shape") or [1])
    return total or None


def _cpu_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _gpu_total(index: int) -> int | None:
    """A GPU's memory, from nvidia-smi (CUDA stays uninitialised in the runner's process)."""
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", f"--id={index}"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        return int(float(out.strip().splitlines()[0])) * 1024 * 1024
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def pick_device(device: str) -> str:
    """``auto``: the first GPU if the machine has one (nvidia-smi or CUDA_VISIBLE_DEVICES), else the CPU."""
    if device != "auto":
        return device
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return "cpu"
    return "cuda" if _gpu_total(0) is not None else "cpu"


@dataclass
class Cost:
    """What the reference pass will take: said by ``--dry-run`` and checked before a run starts."""

    precision: str
    device: str
    params: int | None
    need_bytes: int | None
    have_bytes: int | None
    samples: int
    est_s: float

    @property
    def fits(self) -> bool:
        return self.need_bytes is None or self.have_bytes is None or self.need_bytes <= self.have_bytes

    def line(self) -> str:
        gb = f"{self.need_bytes / 2**30:.1f} GB" if self.need_bytes else "? GB"
        where = "GPU + CPU (accelerate)" if self.device == "balanced" else self.device
        return (
            f"reference: {TORCH_DTYPES[self.precision]} on {where}, weights and work ~{gb}; "
            f"{self.samples} samples at most, about {_duration(self.est_s)}"
        )

    def refusal(self, model: str) -> str:
        have = f"{self.have_bytes / 2**30:.1f} GB" if self.have_bytes else "?"
        need = f"{(self.need_bytes or 0) / 2**30:.1f} GB"
        return (
            f"--reference {self.precision}: the {TORCH_DTYPES[self.precision]} weights of {model} need ~{need}, "
            f"the {self.device} has {have}: pass --reference-device balanced (layers spread over GPUs "
            "and CPU), --reference-device cpu, or --reference off"
        )


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"


def cost(model_path: str, precision: str, device: str, samples: int, tokens_per_sample: float) -> Cost:
    """Memory and time of a pass: weights at the reference's width plus a margin for activations.

    ``tokens_per_sample``: generated tokens (--max-tokens); ``samples``: at most every cell's."""
    device = pick_device(device)
    params = param_count(model_path)
    width = 8 if precision == "fp64" else 4
    need = int(params * width * 1.2 + 2**30) if params else None
    if device == "cpu":
        have = _cpu_available()
    elif device == "balanced":
        have = None  # accelerate spreads what does not fit
    else:
        have = _gpu_total(int(device.partition(":")[2] or 0))
    kind = "cpu" if device == "cpu" else "cuda"
    est = samples * (OWN_TOKENS + tokens_per_sample) / SPEED.get((kind, precision), 40.0)
    return Cost(precision, device, params, need, have, samples, est)


# --- the computation -------------------------------------------------------------------------------


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

    def score(self, prefix: list[int], rows: list[tuple[list[int], list[int]]]) -> list[RefRow]:
        """Score each row's generated tokens given its own prompt tokens after ``prefix``.

        Rows are right-padded; a row's queries see the prefix and its own earlier tokens only.
        """
        return self._score(self._prefix_cache(prefix), len(prefix), rows)

    def score_prompt(self, prefix: list[int], own: list[int], gens: list[list[int]]) -> list[RefRow]:
        """Score several generations of one prompt (its arms, reruns, calibration rungs), reading the
        prompt's own tokens once instead of once per generation.

        The prompt's own tokens but the last extend a copy of the prefix's KV; each row is then that
        last token and its generated ones, so the logits that predict a generated token are the same
        positions :meth:`score` reads.
        """
        import copy

        if not own:  # the prefix's last token predicts the first generated one
            return self.score_prompt(prefix[:-1], prefix[-1:], gens)
        if self.penalties is not None:  # the penalty needs each row's whole prompt: read it per row
            return self.score(prefix, [(own, g) for g in gens])
        base, head = self._prefix_cache(prefix), own[:-1]
        if not head:
            return self._score(base, len(prefix), [(own, g) for g in gens])
        cache = copy.deepcopy(base)
        self._extend(cache, len(prefix), head)
        return self._score(cache, len(prefix) + len(head), [(own[-1:], g) for g in gens])

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

    def _score(self, base: Any, p: int, rows: list[tuple[list[int], list[int]]]) -> list[RefRow]:
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
            out, k = [], 0
            for _, gen in rows:
                n = len(gen)
                out.append(
                    RefRow(
                        [round(v, DIGITS) for v in chosen_l[k : k + n]],
                        ti_l[k : k + n],
                        [[round(v, DIGITS) for v in r] for r in tv_l[k : k + n]],
                    )
                )
                k += n
        del cache, logits, lps
        return out


def _batches(todo: list[Todo], own_len: Callable[[Todo], int], budget: int) -> Iterator[list[Todo]]:
    """Rows in order of length (little padding), as many per batch as the token budget allows."""
    order = sorted(todo, key=lambda t: own_len(t) + len(t.token_ids))
    batch: list[Todo] = []
    for t in order:
        width = own_len(t) + len(t.token_ids)
        if batch and width * (len(batch) + 1) > budget:
            yield batch
            batch = []
        batch.append(t)
    if batch:
        yield batch


def _scored(
    model: ReferenceModel, device: str, todo: list[Todo], rendered: list[list[int]], shared: int, budget: int
) -> Iterator[tuple[list[Todo], list[RefRow]]]:
    """The rows of ``todo`` scored, in groups that each end one forward's work."""
    prefix = rendered[0][:shared]
    if device == "cpu":
        # Bound by arithmetic: a prompt's own tokens (~100) outweigh its 16-128 generated ones, so each
        # prompt's are read once for all its rows (arms, reruns, calibration rungs).
        by_prompt: dict[int, list[Todo]] = {}
        for t in todo:
            by_prompt.setdefault(t.prompt_index, []).append(t)
        for i, group in sorted(by_prompt.items()):
            yield group, model.score_prompt(prefix, rendered[i][shared:], [t.token_ids for t in group])
        return
    # A GPU is bound by launches: rows of many prompts in one wide batch.
    for batch in _batches(todo, lambda t: len(rendered[t.prompt_index]) - shared, budget):
        yield batch, model.score(prefix, [(rendered[t.prompt_index][shared:], t.token_ids) for t in batch])


def run_pass(run_dir: Path, precision: str, device: str, log: Callable[[str], None] = print) -> int:
    """Score every finished cell's samples not yet scored; return how many sequences were scored."""
    from cascade_repro.plan.models import load_tokenizer
    from cascade_repro.prompts.chat import measure_prefix

    run = manifest.read_manifest(run_dir)
    keys = list(run.plan.engines)
    have, _ = read_reference(run_dir)
    todo = needed(run_dir, keys, set(have))
    total = sum(len(v) for v in todo.values())
    if not total:
        return 0
    device = pick_device(device)
    spec = spec_of(run.spec_json)
    prompts = layout.read_prompts(run_dir)
    tok = load_tokenizer(run.model_path, spec.trust_remote_code)
    measured = measure_prefix(tok, run.prompt_set.system_prompt_text, prompts)
    rendered, shared, hashes = measured.rendered, measured.tokens, measured.hashes()
    t0 = time.time()
    model = ReferenceModel(run.model_path, precision, device, int(spec.topk), spec.trust_remote_code)
    model.penalties = Penalties.of(spec.sampling)
    log(f"reference: {TORCH_DTYPES[precision]} on {device}, {total} sequences to score")
    import torch
    import transformers

    budget = tokens_per_batch(device)
    done, last = 0, time.time()
    for key, items in todo.items():
        if not items:
            continue
        writer = jsonl.JsonlWriter(layout.reference_path(run_dir, key))
        writer.write(
            {
                "type": START,
                "precision": precision,
                "device": device,
                "dtype": TORCH_DTYPES[precision],
                "model": run.model_name if run.has("model_name") else spec.model,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "tf32": False,
                "attention": "plain (softmax(QK^T)V), one row per sequence",
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
        )
        bad = [
            t
            for t in items
            if not (0 <= t.prompt_index < len(hashes)) or hashes[t.prompt_index] != t.prompt_hash
        ]
        for t in bad:
            log(
                f"reference: {key}: sample of prompt {t.prompt_index} does not match prompts.jsonl; not scored"
            )
        good = [t for t in items if t not in bad]
        for batch, scored in _scored(model, device, good, rendered, shared, budget):
            for t, row in zip(batch, scored, strict=True):
                writer.write(
                    {
                        "type": RECORD,
                        "fp": t.fp,
                        "n": len(row.lp),
                        "lp": row.lp,
                        "top_ids": row.top_ids,
                        "top_lp": row.top_lp,
                    }  # fmt: skip
                )
            writer.flush()  # a cut pass keeps every batch it finished
            done += len(batch)
            if time.time() - last >= 30:
                last = time.time()
                log(f"reference: {done}/{total} sequences, {done / (last - t0):.1f}/s")
        writer.close()
    log(f"reference: {done} sequences scored in {time.time() - t0:.0f} s")
    return done


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[1] not in TORCH_DTYPES:
        print("usage: python -m cascade_repro.run.reference RUN_DIR fp32|fp64 DEVICE", file=sys.stderr)
        return 2
    run_pass(Path(args[0]), args[1], args[2], log=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
