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
``rundir/reference.py``; the model that scores them in ``run/reference_model.py``. Each record also
keeps the reference's logprob of every token id the arms returning its sequence listed in their
top-k (the judge's top-k distribution error): a stored record lacking one that a sample needs is
scored again.

It never runs inside the engine under test: the runner starts it as its own process
(``python -m cascade_repro.run.reference RUN_DIR PRECISION DEVICE``) after every worker has exited,
so the GPU is free.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cascade_repro.errors import UsageError
from cascade_repro.plan.matrix import spec_of
from cascade_repro.run.penalties import Penalties
from cascade_repro.run.reference_model import TORCH_DTYPES, ReferenceModel, tokens_per_batch
from cascade_repro.rundir import jsonl, layout, manifest, sample_scan
from cascade_repro.rundir.reference import RECORD, START, RefRow, fingerprint, read_reference

__all__ = ["ReferenceModel", "ReferenceOptions", "needed", "run_pass"]

CHOICES = ("auto", "fp32", "fp64", "off")
DEVICES = ("auto", "cpu", "cuda", "balanced")  # balanced: layers spread over GPUs and CPU (accelerate)


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
    """One sequence the reference has not scored yet (or scored without every id an arm listed)."""

    fp: str
    prompt_index: int
    prompt_hash: str
    token_ids: list[int]
    # Per generated step, the token ids the arms returning this sequence listed in their top-k: the
    # reference's logprob of each is stored with the record (the top-k distribution statistic).
    want: list[set[int]] = field(default_factory=list)


def _topk_ids(topk: object, n: int) -> list[set[int]]:
    """The token ids of a sample's top-k lists, per step (empty sets where a step's list is unusable)."""
    out: list[set[int]] = [set() for _ in range(n)]
    if not isinstance(topk, list):
        return out
    for i, step in enumerate(topk[:n]):
        if isinstance(step, list):
            out[i] = {
                e[0]
                for e in step
                if isinstance(e, list | tuple)
                and e
                and isinstance(e[0], int)
                and not isinstance(e[0], bool)
                and e[0] >= 0
            }
    return out


def needed(run_dir: Path, engine_keys: list[str], have: dict[str, RefRow]) -> dict[str, list[Todo]]:
    """Per engine key, the finished cells' sequences the reference must score: each content once,
    wanting the union of the top-k ids of every sample with that content; a stored record that covers
    them all is not scored again, one that lacks some (an older record, or one written before another
    arm listed other ids) is."""
    by_fp: dict[str, Todo] = {}
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
            ids = _topk_ids(rec.get("topk"), len(toks))
            if (t := by_fp.get(fp)) is None:
                by_fp[fp] = t = Todo(fp, idx, ph, toks, ids)
                todo.append(t)
            else:
                for mine, theirs in zip(t.want, ids, strict=True):
                    mine |= theirs
    for key, todo in out.items():
        out[key] = [t for t in todo if not (t.fp in have and have[t.fp].covers(t.want))]
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
            yield (
                group,
                model.score_prompt(
                    prefix, rendered[i][shared:], [t.token_ids for t in group], [t.want for t in group]
                ),
            )
        return
    # A GPU is bound by launches: rows of many prompts in one wide batch.
    for batch in _batches(todo, lambda t: len(rendered[t.prompt_index]) - shared, budget):
        rows = [(rendered[t.prompt_index][shared:], t.token_ids) for t in batch]
        yield batch, model.score(prefix, rows, [t.want for t in batch])


def run_pass(run_dir: Path, precision: str, device: str, log: Callable[[str], None] = print) -> int:
    """Score every finished cell's samples not yet scored; return how many sequences were scored."""
    from cascade_repro.plan.models import load_tokenizer
    from cascade_repro.prompts.chat import measure_prefix

    run = manifest.read_manifest(run_dir)
    keys = list(run.plan.engines)
    have, _ = read_reference(run_dir)
    todo = needed(run_dir, keys, have)
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
                        "arm_ids": row.arm_ids or [[] for _ in row.lp],
                        "arm_lp": row.arm_lp or [[] for _ in row.lp],
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
