"""What every report says, independent of format: headline, warnings, tables, environment."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from cascade_repro.errors import UsageError
from cascade_repro.report.load import Example, RunData
from cascade_repro.report.text import (
    MISSING,
    as_int,
    fmt_ci,
    fmt_float,
    fmt_int,
    fmt_p,
    fmt_ratio,
    is_missing,
    one_line,
    plural,
    text_of,
    truncate,
)

VERDICTS = ("regression", "error", "not exercised", "within noise", "identical")
AXES = ("seed", "dtype", "fa_version", "backend")
FAIL_ON = ("regression", "error", "never")
# vLLM only takes the cascade path when the common prefix spans at least this many tokens.
CASCADE_MIN_PREFIX = 256
ENV_VALUE_MAX = 200


class Strong(str):
    """A table cell that renders emphasised."""

    __slots__ = ()


@dataclass
class Table:
    """A format-neutral table of plain-text cells."""

    headers: list[str]
    rows: list[list[str]]


def section(run: dict, key: str) -> dict:
    """Return run[key] when it is a dict, else {} (old or hand-edited run.json files)."""
    v = run.get(key)
    return v if isinstance(v, dict) else {}


def _records(df) -> list[dict]:
    return df.to_dict("records")


def _axis(v) -> tuple:
    i = as_int(v)
    return (0, i, "") if i is not None else (1, 0, text_of(v))


def _sort_key(r: dict) -> tuple:
    # Numbers sort numerically (batch 8 before 16); missing values go last.
    return (_axis(r.get("tp")), _axis(r.get("batch")), *(_axis(r.get(a)) for a in AXES))


def cascade_pairs(data: RunData) -> list[dict]:
    """Return cascade pair rows ordered by tp, batch and the other axes."""
    rows = (r for r in _records(data.pairs) if r.get("kind") == "cascade")
    return sorted(rows, key=lambda r: (*_sort_key(r), str(r.get("pair_id"))))


def control_pairs(data: RunData) -> list[dict]:
    """Return noise-control pair rows in the same order."""
    rows = (r for r in _records(data.pairs) if r.get("kind") != "cascade")
    return sorted(rows, key=lambda r: (*_sort_key(r), str(r.get("pair_id"))))


def cells(data: RunData) -> list[dict]:
    """Return cell rows ordered by tp, batch, the other axes, arm and id."""
    return sorted(
        _records(data.cells), key=lambda r: (*_sort_key(r), text_of(r.get("arm")), str(r.get("cell_id")))
    )


def verdict_counts(data: RunData) -> dict[str, int]:
    """Count cascade pairs per verdict; known verdicts always appear, unknown ones are added."""
    counts = dict.fromkeys(VERDICTS, 0)
    for r in cascade_pairs(data):
        v = text_of(r.get("verdict"))
        counts[v] = counts.get(v, 0) + 1
    return counts


def headline(data: RunData) -> str:
    """Summarise the verdicts in one line, e.g. `cascade-repro: 1 regression in 6 pairs`."""
    counts = verdict_counts(data)
    total = sum(counts.values())
    if total == 0:
        return "cascade-repro: no cascade pairs"
    parts = [
        plural(counts["regression"], "regression"),
        plural(counts["error"], "error"),
        f"{counts['not exercised']} not exercised",
    ]
    shown = [p for p, k in zip(parts, ("regression", "error", "not exercised"), strict=True) if counts[k]]
    return f"cascade-repro: {', '.join(shown) or 'no regression'} in {plural(total, 'pair')}"


def has_errors(data: RunData) -> bool:
    """Return True when any cell, engine or cascade pair failed."""
    if any(r.get("verdict") == "error" for r in cascade_pairs(data)):
        return True
    if any(r.get("status") == "error" for r in _records(data.cells)):
        return True
    return any(
        isinstance(e, dict) and e.get("status") == "error" for e in section(data.run, "engines").values()
    )


def exit_status(data: RunData, fail_on: str) -> tuple[int, str]:
    """Return the exit code for fail_on and a one-line reason."""
    fail_on = str(getattr(fail_on, "value", fail_on))
    if fail_on not in FAIL_ON:
        raise UsageError(f"unknown fail_on {fail_on!r}: expected one of {', '.join(FAIL_ON)}")
    counts = verdict_counts(data)
    n_reg, total = counts["regression"], sum(counts.values())
    if fail_on != "never" and n_reg:
        return 1, f"{plural(n_reg, 'regression')} (fail_on={fail_on})"
    if fail_on == "error" and has_errors(data):
        return 1, f"errors in the run (fail_on={fail_on})"
    if fail_on != "never" and total and counts.get("error", 0) == total:
        # A guard that passes when nothing ran would hide a broken CI runner.
        return 1, f"every cascade pair errored: nothing was measured (fail_on={fail_on})"
    if fail_on == "never":
        return 0, "fail_on=never: the run never fails"
    return 0, "no regression" + (" or error" if fail_on == "error" else "") + f" (fail_on={fail_on})"


def intro(data: RunData, code: Callable[[str], str]) -> str:
    """Explain the report in one paragraph; code() formats run-supplied names."""
    spec, ps = section(data.run, "spec"), section(data.run, "prompt_set")
    model = code(str(spec["model"])) if spec.get("model") else "the model"
    engine = f" on {code(str(spec['engine']))}" if spec.get("engine") else ""
    prompts = ""
    if ps.get("name"):
        prompts = f" The prompts come from {code(str(ps['name']))}"
        if not is_missing(ps.get("n")):
            prompts += f" ({fmt_int(ps['n'])} prompts"
            if not is_missing(ps.get("shared_prefix_tokens")):
                prompts += f", shared prefix {fmt_int(ps['shared_prefix_tokens'])} tokens"
            prompts += ")"
        prompts += "."
    return (
        f"This run generates the same prompts with {model}{engine} twice per configuration: with cascade "
        "attention enabled (test) and disabled (the flat twin, reference), greedy decoding otherwise equal. "
        "Each cascade pair is compared prompt by prompt and judged against a noise floor measured by control "
        "pairs (flat vs flat across batch sizes or reruns), so divergence counts as a regression only when it "
        f"exceeds what batching noise alone produces.{prompts}"
    )


def warnings(data: RunData) -> list[str]:
    """Return the caveats a reader must see before trusting the verdicts."""
    out = []
    spec, ps = section(data.run, "spec"), section(data.run, "prompt_set")
    if spec.get("inject"):
        out.append(f"fault injection active ({spec['inject']}): this is a positive control, not a real bug")
    prefix = as_int(ps.get("shared_prefix_tokens"))
    if prefix is not None and prefix < CASCADE_MIN_PREFIX:
        out.append(f"shared prefix is {prefix} tokens (< {CASCADE_MIN_PREFIX}): cascade cannot fire")
    for key, e in sorted(section(data.run, "engines").items()):
        if isinstance(e, dict) and e.get("status") == "error":
            out.append(f"engine {key} failed: {text_of(e.get('error'))}")
    for r in cells(data):
        if r.get("status") == "error":
            out.append(f"cell {r['cell_id']} failed: {text_of(r.get('error'))}")
        elif r.get("arm") == "cascade" and r.get("status") == "done" and as_int(r.get("cascade_steps")) == 0:
            out.append(f"cell {r['cell_id']} ran 0 cascade steps: not exercised: proves nothing")
    return [one_line(w) for w in out]


def varying_axes(pairs: list[dict]) -> list[str]:
    """Return the axes besides tp and batch that take more than one value."""
    return [a for a in AXES if len({text_of(r.get(a)) for r in pairs} - {MISSING}) > 1]


def predictions(data: RunData) -> dict[str, dict]:
    """Return run.json's cascade predictions per cell id (``{"cells": {...}}`` or a bare map), or {}."""
    p = data.run.get("predictions")
    if not isinstance(p, dict):
        return {}
    cells = p.get("cells") if isinstance(p.get("cells"), dict) else p
    return {str(k): v for k, v in cells.items() if isinstance(v, dict)}


def _yes_no(v) -> str:
    # None: the prediction depends on something not recorded (the decode cost model needs the SM count).
    if isinstance(v, bool):
        return "yes" if v else "no"
    return "?" if v is None else MISSING


def fmt_prediction(p: dict | None) -> str:
    """Format one cell's prediction as `prefill/decode`, e.g. `yes/no (decode from 45)`; `?` = unknown."""
    if not p:
        return MISSING
    s = f"{_yes_no(p.get('prefill'))}/{_yes_no(p.get('decode'))}"
    frm = as_int(p.get("decode_from_batch"))
    if p.get("decode") is not True and frm is not None:
        s += f" (decode from {frm})"
    return s


def has_if(rows: list[dict], key: str = "if_n") -> bool:
    """Return True when any row carries instruction-following scores."""
    return any((as_int(r.get(key)) or 0) > 0 for r in rows)


def fmt_if_pair(r: dict) -> str:
    """Format IF strict accuracy of a pair: `test vs ref (Δ, McNemar p)`."""
    if (as_int(r.get("if_n")) or 0) <= 0:
        return MISSING
    return (
        f"{fmt_float(r.get('if_strict_test'))} vs {fmt_float(r.get('if_strict_ref'))} "
        f"({fmt_float(r.get('if_strict_delta'), '+.3f')}, p={fmt_p(r.get('p_if'))}, n={fmt_int(r.get('if_n'))})"
    )


IF_NOTE = (
    "IF strict cascade vs flat: prompt-level instruction-following accuracy (Google IFEval strict rules, "
    "Korean words = space-separated units) of the cascade cell vs its flat twin on the same prompts, "
    "with McNemar's exact test on the prompts only one side passes. It is informational: it does not "
    "change the verdict."
)


def if_note(data: RunData) -> str | None:
    """Return the note under the verdict table when IF accuracy is shown, else None."""
    return IF_NOTE if has_if(cascade_pairs(data)) else None


def verdict_table(data: RunData) -> Table:
    """Build one row per cascade pair."""
    pairs = cascade_pairs(data)
    axes = varying_axes(pairs)
    preds = predictions(data)
    show_if = has_if(pairs)
    headers = [
        "pair",
        "tp",
        "batch",
        *axes,
        "cascade steps",
        *(["predicted (prefill/decode)"] if preds else []),
        "diverged",
        "noise diverged",
        "top-k viol. vs noise",
        "Δseq-rep-4 [95% CI]",
        "p(div)",
        "p(top-k)",
        *(["IF strict cascade vs flat"] if show_if else []),
        "verdict",
        "reasons",
    ]
    rows = []
    for r in pairs:
        topk = MISSING
        if not is_missing(r.get("topk_violations")):
            topk = f"{fmt_int(r['topk_violations'])} vs {fmt_int(r.get('noise_topk_violations'))}"
        verdict = text_of(r.get("verdict"))
        rows.append(
            [
                text_of(r.get("pair_id")),
                fmt_int(r.get("tp")),
                fmt_int(r.get("batch")),
                *(text_of(r.get(a)) for a in axes),
                fmt_ratio(r.get("cascade_steps"), r.get("total_steps")),
                *([fmt_prediction(preds.get(text_of(r.get("test_cell"))))] if preds else []),
                fmt_ratio(r.get("n_diverged"), r.get("n")),
                fmt_ratio(r.get("noise_n_diverged"), r.get("noise_n")),
                topk,
                fmt_ci(r.get("d_seq_rep_4_mean"), r.get("d_seq_rep_4_lo"), r.get("d_seq_rep_4_hi")),
                fmt_p(r.get("p_divergence")),
                fmt_p(r.get("p_topk")),
                *([fmt_if_pair(r)] if show_if else []),
                Strong(verdict) if verdict == "regression" else verdict,
                text_of(r.get("reasons")),
            ]
        )
    return Table(headers, rows)


def noise_table(data: RunData) -> Table:
    """Build one row per noise-control pair."""
    headers = [
        "pair",
        "kind",
        "tp",
        "batch",
        "test cell",
        "ref cell",
        "diverged",
        "first div. median",
        "top-k viol.",
        "max Δlogprob",
    ]
    rows = [
        [
            text_of(r.get("pair_id")),
            text_of(r.get("kind")),
            fmt_int(r.get("tp")),
            fmt_int(r.get("batch")),
            text_of(r.get("test_cell")),
            text_of(r.get("ref_cell")),
            fmt_ratio(r.get("n_diverged"), r.get("n")),
            fmt_float(r.get("first_div_median"), ".1f"),
            fmt_int(r.get("topk_violations")),
            fmt_float(r.get("dlogprob_max"), ".3g"),
        ]
        for r in control_pairs(data)
    ]
    return Table(headers, rows)


def cell_table(data: RunData) -> Table:
    """Build one row per cell with throughput and repetition metrics."""
    headers = [
        "cell",
        "tp",
        "batch",
        "arm",
        "status",
        "cascade steps",
        "tokens/s",
        "seq-rep-1",
        "seq-rep-2",
        "seq-rep-3",
        "seq-rep-4",
        "distinct-2",
        "zlib ratio",
        "tail-loop rate",
    ]
    rows_in = cells(data)
    show_if = has_if(rows_in)
    if show_if:
        headers += ["IF strict", "IF loose"]
    rows = []
    for r in rows_in:
        status = text_of(r.get("status"))
        rows.append(
            [
                text_of(r.get("cell_id")),
                fmt_int(r.get("tp")),
                fmt_int(r.get("batch")),
                text_of(r.get("arm")),
                Strong(status) if status == "error" else status,
                fmt_ratio(r.get("cascade_steps"), r.get("total_steps")),
                fmt_float(r.get("tokens_per_s"), ".1f"),
                *(fmt_float(r.get(f"seq_rep_{i}")) for i in range(1, 5)),
                fmt_float(r.get("distinct_2")),
                fmt_float(r.get("zlib_ratio")),
                fmt_float(r.get("tail_loop_rate")),
                *([fmt_float(r.get("if_strict")), fmt_float(r.get("if_loose"))] if show_if else []),
            ]
        )
    return Table(headers, rows)


def _topk(alts: list[tuple[int, float]], k: int = 5) -> str:
    return ", ".join(f"{tid} ({lp:.3g})" for tid, lp in alts[:k]) or MISSING


def example_title(ex: Example) -> str:
    """Name an example in one line."""
    key = f" ({ex.prompt_key})" if ex.prompt_key else ""
    at = f"first divergence at token {ex.first_div}" if ex.first_div is not None else "divergence not located"
    return one_line(f"{ex.pair_id} · prompt {ex.prompt_index}{key} · {at}")


def example_table(ex: Example) -> Table:
    """Show both sides' token, log-probability and top-k at the first divergence."""
    return Table(
        [f"at token {fmt_int(ex.first_div)}", f"cascade ({ex.test_cell})", f"flat ({ex.ref_cell})"],
        [
            ["token id", fmt_int(ex.test_token), fmt_int(ex.ref_token)],
            ["logprob", fmt_float(ex.test_logprob, ".4g"), fmt_float(ex.ref_logprob, ".4g")],
            ["top-k", _topk(ex.test_topk), _topk(ex.ref_topk)],
        ],
    )


def env_pairs(env: dict) -> list[tuple[str, str]]:
    """A run's captured environment as sorted key/value pairs, one level of nesting as ``a.b``."""
    out: list[tuple[str, str]] = []
    for k in sorted(env):
        if isinstance(env[k], dict):
            out.extend((f"{k}.{kk}", _flat(vv)) for kk, vv in sorted(env[k].items()))
        else:
            out.append((k, _flat(env[k])))
    return out


def env_lines(data: RunData) -> list[tuple[str, str]]:
    """Flatten run identity, spec, environment, engines and thresholds into key/value lines."""
    run = data.run
    spec, ps, env = section(run, "spec"), section(run, "prompt_set"), section(run, "env")
    out: list[tuple[str, str]] = []
    for k in ("run_id", "created_at", "tool_version", "model_name", "arm_switch", "fail_on"):
        if k in run:
            out.append((k, _flat(run[k])))
    skip = _VLLM_ONLY if spec.get("engine") == "hf" else ()
    for k in sorted(spec):
        if k not in skip:
            out.append((f"spec.{k}", _flat(spec[k])))
    for k in sorted(ps):
        if k != "system_prompt_text":  # kilobytes of text; the prompt set name identifies it
            out.append((f"prompt_set.{k}", _flat(ps[k])))
    out.extend(env_pairs(env))
    for key, e in sorted(section(run, "engines").items()):
        if not isinstance(e, dict):
            continue
        for k in ("status", "error"):
            if e.get(k):
                out.append((f"engine[{key}].{k}", _flat(e[k])))
        out.extend((f"engine[{key}].{k}", _flat(v)) for k, v in sorted(section(e, "effective").items()))
    out.extend((f"thresholds.{k}", _flat(v)) for k, v in sorted(section(run, "thresholds").items()))
    out.extend((f"timings.{k}", _flat(v)) for k, v in sorted(section(run, "timings").items()))
    # A system prompt or a long error can be kilobytes; the environment block is for versions and flags.
    return [(one_line(k), truncate(one_line(v), ENV_VALUE_MAX)) for k, v in out]


# Spec keys that mean nothing to the hf engine; left out of its reports to keep them readable.
_VLLM_ONLY = (
    "arm_switch", "backends", "enforce_eager", "fa_versions", "gpu_memory_utilization", "graphs_for_batches", "hf_overrides",
    "load_format", "max_model_len",
)  # fmt: skip


def _flat(v) -> str:
    if isinstance(v, list | tuple):
        return ", ".join(_flat(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={_flat(x)}" for k, x in sorted(v.items()))
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    return str(v)


def command(data: RunData) -> str | None:
    """Return the recorded command line, if any."""
    cmd = data.run.get("command")
    if isinstance(cmd, list):
        cmd = shlex.join(str(c) for c in cmd)
    return one_line(str(cmd)) if cmd else None
