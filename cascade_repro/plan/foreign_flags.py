"""The flags of vLLM's and lm-eval's spelling on `matrix`'s command line: lm-eval's that mean one of
ours (``--model_args``, ``--output_path``/``-o``, ``--log_samples``, ``--gen_kwargs``: :func:`read_foreign`
-> :class:`Foreign`), those refused with the knob they point at (``LM_EVAL_POINTERS``) or noted, vLLM's
engine flags (through ``plan/engine_args.parse_flags``), and an unknown flag refused with suggestions
from the family it resembles."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from cascade_repro.errors import UsageError

# lm-eval's spellings (lm_eval/__main__.py) that mean one of ours.
LM_EVAL_RESULTS = ("--output_path", "--output-path", "-o")
LM_EVAL_SAMPLES = ("--log_samples", "--log-samples")
LM_EVAL_MODEL_ARGS = ("--model_args", "--model-args")
LM_EVAL_GEN_KWARGS = ("--gen_kwargs", "--gen-kwargs")
LM_EVAL_FLAGS = (*LM_EVAL_RESULTS, *LM_EVAL_SAMPLES, *LM_EVAL_MODEL_ARGS, *LM_EVAL_GEN_KWARGS)
# lm-eval's spellings that mean an option of ours under another name, or nothing here: each is
# refused with the knob it points at (a look-alike suggestion sent --batch_size to vLLM's
# --ubatch-size, a micro-batch), or, where it changes nothing, noted. tests/plan/test_foreign_flags.py
# walks both tables.
_BATCH = (
    "lm-eval's batch size is the requests per step: here it is --batch SIZES, the concurrent requests "
    "per wave, comma-separated (vLLM's --ubatch-size is a micro-batch, not this)"
)
_TASKS = (
    "lm-eval's tasks are benchmarks: here the prompts are a prompt set, --prompts SET "
    "(ko-ifeval-style is IFEval-style; `cascade-repro prompts list` shows the sets)"
)
LM_EVAL_POINTERS = {
    "--batch_size": _BATCH,
    "--batch-size": _BATCH,
    "--tasks": _TASKS,
    "-t": _TASKS,
    "--num_fewshot": "no few-shot examples here: every prompt is one chat turn behind the shared system prompt",
    "--num-fewshot": "no few-shot examples here: every prompt is one chat turn behind the shared system prompt",
}
_CHAT = "every prompt is already rendered with the model's chat template (the shared system prompt its system turn)"
LM_EVAL_NOTES = {
    "--apply_chat_template": _CHAT,
    "--apply-chat-template": _CHAT,
    **{f: "" for f in LM_EVAL_SAMPLES},
}
# lm-eval's --model takes a model type; here --engine does, and --model names the weights.
LM_EVAL_MODEL_TYPES = {
    "vllm": "vllm", "vllm-vlm": "vllm", "hf": "hf", "hf-auto": "hf", "huggingface": "hf", "dummy": "fake",
}  # fmt: skip
# Engine arguments that are options of the matrix too: given both ways with different values is a
# refusal; given as an engine argument alone, the option takes its value (so run.json and the report
# say what the engine got).
ENGINE_ARG_OPTIONS = {
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_model_len": "--max-model-len",
}
# lm-eval's vLLM model_args that are not engine arguments, and the option that says the same here.
MODEL_ARGS_OWNED = {
    "pretrained": "--model",
    "batch_size": "--batch",
    "max_gen_toks": "--max-tokens",
    "max_length": "--max-model-len",
}


@dataclass(frozen=True)
class Foreign:
    """What the flags of vLLM's and lm-eval's spelling ask for: engine arguments (``--block-size 32``,
    ``--model_args k=v,...``), lm-eval's output folder, ``--max-tokens`` from ``--gen_kwargs``, and
    the notes to print (a flag that changes nothing here)."""

    engine_args: dict[str, Any] = field(default_factory=dict)
    results_dir: str | None = None
    max_tokens: int | None = None
    notes: tuple[str, ...] = ()


def read_foreign(tokens: Sequence[str], ours: Collection[str] = ()) -> Foreign:
    """The tokens the command's own parser left (``ctx.args``): lm-eval's spellings first, then
    vLLM's engine flags (``engine_args.parse_flags``); anything else is a one-line UsageError whose
    suggestion comes from the family the flag is closest to (``ours``: the command's own flags,
    vLLM's, lm-eval's), never across them."""
    from cascade_repro.plan import engine_args as eargs

    engine: dict[str, Any] = {}
    results: str | None = None
    max_tokens: int | None = None
    notes: list[str] = []
    left: list[str] = []
    toks = list(tokens)
    i = 0
    while i < len(toks):
        flag, eq, inline = toks[i].partition("=")
        i += 1
        if flag in LM_EVAL_POINTERS:
            raise UsageError(f"no such option: {flag}; {LM_EVAL_POINTERS[flag]}")
        if flag in LM_EVAL_NOTES:
            notes.append(
                f"{flag}: {LM_EVAL_NOTES[flag] or 'every sample is kept anyway (samples/ in the run directory)'}"
            )
            continue
        if flag not in LM_EVAL_FLAGS:
            left.append(toks[i - 1])
            continue
        if eq:
            value = inline
        elif i < len(toks):
            value, i = toks[i], i + 1
        else:
            raise UsageError(f"{flag} needs a value")
        if flag in LM_EVAL_RESULTS:
            results = value
        elif flag in LM_EVAL_MODEL_ARGS:
            pairs = eargs.parse_pairs(eargs.split_pairs(value), source=flag)
            for key in pairs:
                if key in MODEL_ARGS_OWNED:
                    raise UsageError(f"{flag} {key}=...: use {MODEL_ARGS_OWNED[key]}")
            engine.update(pairs)
        else:
            max_tokens = _gen_kwargs(flag, value)
    vllm, left = eargs.parse_flags(left)
    if left:
        raise UsageError(_unknown(left[0], ours, eargs.known_fields().names))
    return Foreign({**vllm, **engine}, results, max_tokens, tuple(notes))


def _gen_kwargs(flag: str, value: str) -> int | None:
    """lm-eval's ``--gen_kwargs``: ``max_gen_toks`` is --max-tokens; greedy settings are what the
    matrix does anyway; any other is refused (both arms decode greedily, the experiment's point)."""
    from cascade_repro.plan import engine_args as eargs

    max_tokens = None
    for pair in eargs.split_pairs(value):
        key, _, text = pair.partition("=")
        key, text = key.strip(), text.strip()
        if key in ("max_gen_toks", "max_tokens") and text.isdigit():
            max_tokens = int(text)
        elif (key == "temperature" and text in ("0", "0.0")) or (
            key == "do_sample" and text.lower() == "false"
        ):
            continue
        else:
            raise UsageError(
                f"{flag} {pair}: the matrix decodes greedily, both arms alike; "
                "only max_gen_toks (--max-tokens) is taken"
            )
    return max_tokens


def _unknown(token: str, ours: Collection[str], vllm_names: Collection[str]) -> str:
    """The refusal of a flag nobody here reads, with the closest flags of the family it resembles."""
    import difflib

    from cascade_repro.plan import engine_args as eargs

    if not token.startswith("-"):
        return f"unexpected argument {token!r} (see `--help`)"
    flag = token.partition("=")[0]
    name = flag[2:].replace("-", "_") if flag.startswith("--") else ""
    fields = eargs.known_fields()
    had = [r for r, kinds in eargs.FIELDS.items() if name in kinds and name not in fields.kinds]
    if had:  # a flag of another vLLM release: said as -E key=value would say it
        return f"{flag}: {name!r} is not an engine argument of {fields.where} (vLLM {', '.join(had)} had it)"
    families = {
        "this tool's": sorted(ours),
        "vLLM's": sorted(eargs.flag_of(n) for n in vllm_names),
        "lm-eval's": sorted(LM_EVAL_FLAGS),
    }
    best: tuple[float, str, list[str]] = (0.0, "", [])
    for family, names in families.items():
        close = difflib.get_close_matches(flag, names, n=3, cutoff=0.75)
        score = difflib.SequenceMatcher(None, flag, close[0]).ratio() if close else 0.0
        if score > best[0]:
            best = (score, family, close)
    hint = f"; did you mean {', '.join(best[2])} ({best[1]})?" if best[2] else ""
    return f"no such option: {flag}{hint}"
