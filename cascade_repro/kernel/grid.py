"""The case grid of `cascade-repro kernel`: what serving does and vLLM's own kernel test misses.

vLLM's ``tests/kernels/attention/test_cascade_flash_attn.py`` checks two shapes (a general batch of 5
and a decode batch of 400) with ``max_num_splits=0``, compares cascade with a flat call that always
runs FA2 (it passes no ``fa_version``), and uses separate, contiguous K and V caches. Serving differs:
decode-only steps of GQA models (where flash-decoding splits the KV), mixed prefill+decode steps,
FA3 with the AOT scheduler and, under full CUDA graphs, ``max_num_splits=32``, and K and V packed in
one cache tensor. The grid covers those:

- ``decode``: every query length 1, GQA or MQA heads, shared prefix 256..8192, 8..256 requests,
  per-request suffixes of up to 64 or 1024 tokens;
- ``mixed``: a quarter of the requests are prefill chunks (16..256 new tokens), the rest decode;
- head dims 64 and 128, bf16 and fp16, FA2 and FA3; FA3 with ``max_num_splits`` 0 (FA's heuristic,
  the eager default) and 32 (``flash_attn_max_num_splits_for_cuda_graph``, what vLLM 0.26 passes
  under full CUDA graphs: ``vllm/v1/attention/backends/flash_attn.py`` lines 400-420 and 489-499,
  ``vllm/config/attention.py`` line 42). The builder passes 32 only to steps of at most
  ``max_cudagraph_capture_size`` tokens (default ``min(2 * max_num_seqs, 512)``,
  ``vllm/config/compilation.py``), and 0 to larger steps, so the grid runs splits 32 only on steps of
  at most :data:`CUDAGRAPH_MAX_TOKENS` tokens. FA2 only with 0: vLLM never gives FA2 another value
  and its interface refuses ``num_splits > 1`` (``vllm/vllm_flash_attn/flash_attn_interface.py``
  lines 309-310); with 0, FA2's own heuristic still splits long decode KV.

Lengths are drawn from each case's seed with :mod:`random`, so a case is the same on every machine;
the seed depends on the shape alone, so FA2/FA3, the split settings and both dtypes see the same
lengths and the same float32 random draws.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import asdict, dataclass, field
from functools import cached_property

from cascade_repro.errors import UsageError

BLOCK_SIZE = 16
FA_VERSIONS = (2, 3)
DTYPES = ("bf16", "fp16")
DTYPE_ALIASES = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
}
# max_num_splits values per FA version (see the module docstring).
SPLITS = {2: (0,), 3: (0, 32)}
# vLLM's default max_cudagraph_capture_size: the builder passes max_num_splits > 0 only to steps of
# at most this many tokens (FlashAttentionMetadataBuilder.build, flash_attn.py lines 489-499).
CUDAGRAPH_MAX_TOKENS = 512

# (num_q_heads, num_kv_heads, head_dim): Llama-3-8B, SmolLM2-135M, Qwen2.5-7B, an MQA shard.
DECODE_HEADS = ((32, 8, 128), (9, 3, 64), (28, 4, 128), (16, 1, 64))
DECODE_PREFIXES = (256, 1024, 4096, 8192)
DECODE_BATCHES = (8, 32, 128, 256)
DECODE_SUFFIX_MAX = (64, 1024)
# Mixed steps include one plain multi-head model.
MIXED_HEADS = ((32, 8, 128), (9, 3, 64), (16, 16, 128))
MIXED_PREFIXES = (256, 2048, 8192)
MIXED_BATCHES = (8, 64, 256)
MIXED_SUFFIX_MAX = 512  # the decode requests of a mixed step
PREFILL_FRAC = 0.25
PREFILL_MIN = 16
PREFILL_MAX = 256

# The quick grid: (kind, prefix, batch) -> preferred dtype. Each runs with every FA setting.
QUICK = {
    ("decode", 8192, 256): "bf16",  # 28/4 heads, d128: the big flash-decoding case
    ("decode", 1024, 8): "fp16",  # 9/3 heads, d64, long suffixes
    ("mixed", 2048, 8): "fp16",  # 9/3 heads, d64, 325 tokens: also runs with FA3 splits 32
    ("mixed", 2048, 256): "bf16",  # 32/8 heads, d128
}

# Rough cost model for estimate_seconds(): float64 matmuls on an H200 run at tens of TFLOP/s; take
# a pessimistic effective rate, a per-case overhead (input generation, the reference's loop over
# requests, launches) and the start (vLLM import, CUDA context).
REF_TFLOPS = 5.0
PER_CASE_S = 0.4
STARTUP_S = 45.0


@dataclass(frozen=True)
class KernelCase:
    """One kernel check: a batch of requests behind a shared prefix, and how to run it."""

    case_id: str
    kind: str  # "decode" (all query lengths 1) or "mixed" (prefill chunks + decodes)
    num_seqs: int
    prefix_len: int  # common prefix tokens, a multiple of block_size
    suffix_max: int  # longest own KV suffix of a decode request
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # "bf16" | "fp16"
    fa_version: int
    max_num_splits: int
    seed: int
    block_size: int = BLOCK_SIZE
    prefill_frac: float = 0.0  # mixed: share of requests that are prefill chunks
    prefill_max: int = PREFILL_MAX
    shape_id: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.prefix_len <= 0 or self.prefix_len % self.block_size:
            raise ValueError(
                f"{self.case_id}: prefix {self.prefix_len} is not a positive multiple of the block size"
            )
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(
                f"{self.case_id}: {self.num_q_heads} query heads over {self.num_kv_heads} KV heads"
            )
        if self.kind not in ("decode", "mixed"):
            raise ValueError(f"{self.case_id}: unknown kind {self.kind!r}")
        if self.kind == "mixed" and (self.num_seqs < 2 or self.prefill_max < 2):
            raise ValueError(
                f"{self.case_id}: a mixed step needs 2+ requests and prefill chunks of 2+ tokens"
            )

    @property
    def gqa(self) -> bool:
        return self.num_kv_heads < self.num_q_heads

    @property
    def heads(self) -> str:
        return f"{self.num_q_heads}/{self.num_kv_heads}"

    @cached_property
    def lengths(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(query_lens, suffix_lens) per request; suffix_len counts the request's own KV after the prefix.

        Query tokens are the last tokens of each request, so suffix_len >= query_len (vLLM caps the
        common prefix at the fewest computed tokens, so no query token falls inside it).
        """
        rng = random.Random(self.seed)
        n = self.num_seqs
        if self.kind == "decode":
            return (1,) * n, tuple(rng.randint(1, self.suffix_max) for _ in range(n))
        n_pre = min(n - 1, max(1, round(n * self.prefill_frac)))
        prefill = set(rng.sample(range(n), n_pre))
        q, s = [], []
        for i in range(n):
            if i in prefill:
                ql = rng.randint(min(PREFILL_MIN, self.prefill_max), self.prefill_max)
                q.append(ql)
                s.append(ql + rng.randint(0, self.prefill_max))  # part of the request's own prompt cached
            else:
                q.append(1)
                s.append(rng.randint(1, self.suffix_max))
        return tuple(q), tuple(s)

    @property
    def query_lens(self) -> tuple[int, ...]:
        return self.lengths[0]

    @property
    def suffix_lens(self) -> tuple[int, ...]:
        return self.lengths[1]

    @property
    def seq_lens(self) -> tuple[int, ...]:
        return tuple(self.prefix_len + s for s in self.suffix_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)

    def ref_flops(self) -> float:
        """Floating-point operations of the float64 reference (QK^T and PV, no causal saving)."""
        per = 4 * self.num_q_heads * self.head_dim
        return float(sum(per * q * (self.prefix_len + s) for q, s in zip(*self.lengths, strict=True)))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["gqa"] = self.gqa
        d["num_tokens"] = self.num_tokens
        d["max_query_len"] = max(self.query_lens)
        d["max_seq_len"] = max(self.seq_lens)
        return d


def case_seed(base_seed: int, shape_id: str) -> int:
    """A stable 31-bit seed for one shape (independent of FA version, splits and dtype)."""
    return zlib.crc32(f"{base_seed}:{shape_id}".encode()) & 0x7FFFFFFF


def _shapes() -> list[dict]:
    """The grid's shapes (everything but dtype, FA version and splits), in a fixed order."""
    out = []
    for i, p in enumerate(DECODE_PREFIXES):
        for j, b in enumerate(DECODE_BATCHES):
            # A Latin assignment: every prefix and batch meets every head layout and both suffix lengths.
            h, kvh, d = DECODE_HEADS[(i + j) % len(DECODE_HEADS)]
            smax = DECODE_SUFFIX_MAX[(i + j // 2) % len(DECODE_SUFFIX_MAX)]
            out.append(dict(kind="decode", prefix_len=p, num_seqs=b, num_q_heads=h, num_kv_heads=kvh,
                            head_dim=d, suffix_max=smax))  # fmt: skip
    for i, p in enumerate(MIXED_PREFIXES):
        for j, b in enumerate(MIXED_BATCHES):
            h, kvh, d = MIXED_HEADS[(i + j) % len(MIXED_HEADS)]
            out.append(dict(kind="mixed", prefix_len=p, num_seqs=b, num_q_heads=h, num_kv_heads=kvh,
                            head_dim=d, suffix_max=MIXED_SUFFIX_MAX, prefill_frac=PREFILL_FRAC))  # fmt: skip
    return out


def shape_id(s: dict) -> str:
    return (
        f"{s['kind']}-p{s['prefix_len']}-b{s['num_seqs']}-h{s['num_q_heads']}x{s['num_kv_heads']}"
        f"-d{s['head_dim']}-s{s['suffix_max']}"
    )


def build_grid(
    quick: bool = False,
    fa_versions: tuple[int, ...] | list[int] = FA_VERSIONS,
    dtypes: tuple[str, ...] | list[str] = DTYPES,
    seed: int = 0,
) -> list[KernelCase]:
    """Every case of the full grid, or of the quick subset (each quick case is also a full case)."""
    fa_versions = tuple(dict.fromkeys(int(v) for v in fa_versions))
    dtypes = tuple(dict.fromkeys(normalize_dtype(d) for d in dtypes))
    for v in fa_versions:
        if v not in SPLITS:
            raise UsageError(f"FA version {v} is not covered: expected one of {', '.join(map(str, SPLITS))}")
    if not fa_versions or not dtypes:
        raise UsageError("the grid needs at least one FA version and one dtype")
    cases = []
    for s in _shapes():
        sid = shape_id(s)
        if quick:
            pref = QUICK.get((s["kind"], s["prefix_len"], s["num_seqs"]))
            if pref is None:
                continue
            use_dtypes: tuple[str, ...] = (pref if pref in dtypes else dtypes[0],)
        else:
            use_dtypes = dtypes
        for dt in use_dtypes:
            for v in fa_versions:
                for sp in SPLITS[v]:
                    case = KernelCase(
                        case_id=f"{sid}-{dt}-fa{v}-sp{sp}",
                        dtype=dt,
                        fa_version=v,
                        max_num_splits=sp,
                        seed=case_seed(seed, sid),
                        shape_id=sid,
                        **s,
                    )
                    if sp > 0 and case.num_tokens > CUDAGRAPH_MAX_TOKENS:
                        continue  # vLLM passes max_num_splits=0 to a step this large
                    cases.append(case)
    return cases


def normalize_dtype(name: str) -> str:
    key = str(name).strip().lower()
    if key not in DTYPE_ALIASES:
        raise UsageError(f"unknown dtype {name!r}: expected bf16 or fp16")
    return DTYPE_ALIASES[key]


def parse_list(text: str | None, default: tuple, what: str) -> list[str]:
    if text is None:
        return [str(x) for x in default]
    items = [t.strip() for t in str(text).split(",")]
    if not any(items):
        raise UsageError(f"--{what} is empty")
    if not all(items):  # "2,,3": a value the user meant to type, not one to skip
        raise UsageError(f"--{what}: empty item in {text!r}")
    return items


def parse_fa_versions(text: str | None) -> tuple[int, ...]:
    out = []
    for t in parse_list(text, FA_VERSIONS, "fa-version"):
        try:
            v = int(t)
        except ValueError:
            raise UsageError(f"--fa-version: {t!r} is not a number (expected 2, 3 or 2,3)") from None
        if v not in SPLITS:
            raise UsageError(f"--fa-version: {v} is not supported here (expected 2, 3 or 2,3)")
        out.append(v)
    return tuple(dict.fromkeys(out))


def parse_dtypes(text: str | None) -> tuple[str, ...]:
    return tuple(dict.fromkeys(normalize_dtype(t) for t in parse_list(text, DTYPES, "dtype")))


def estimate_seconds(cases: list[KernelCase]) -> float:
    """A pessimistic wall-time estimate for one process running these cases on an H200."""
    flops = sum(c.ref_flops() for c in cases)
    return STARTUP_S + PER_CASE_S * len(cases) + flops / (REF_TFLOPS * 1e12)
