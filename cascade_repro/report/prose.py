"""The report's paragraphs: the introduction, the warnings a reader must see first, and the notes
under the tables."""

from __future__ import annotations

from collections.abc import Callable

from cascade_repro import engines
from cascade_repro import twin as twins
from cascade_repro.judge.outcome import EXERCISED
from cascade_repro.judge.verdicts import PREFILL_ONLY
from cascade_repro.plan.matrix import spec_of
from cascade_repro.prompts.chat import short_prefix_warning
from cascade_repro.report.headline import pair_ids
from cascade_repro.report.load import RunData
from cascade_repro.report.power import detection_power
from cascade_repro.report.reference import has_reference
from cascade_repro.report.text import as_int, fmt_int, is_missing, one_line, text_of
from cascade_repro.report.view import (
    calibration_pairs,
    cascade_pairs,
    cascade_results,
    cells,
    has_if,
    if_column,
    prompt_set,
    ran_vllm,
    shows_depth,
    spec_field,
)
from cascade_repro.twin import CASCADE as TWIN


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
    tw = data.twin
    pair = "pair" if tw is not twins.CASCADE else "cascade pair"
    judged = f"Each {pair} is {_judging(data)}"
    if tw is not twins.CASCADE:
        # Another twin (--twin): its two arms in its own words; the judging is cascade's.
        return (
            f"This run generates the same prompts with {model}{engine} twice per configuration, --twin "
            f"{code(tw.name)}: {tw.summary}; arms {code(tw.test)} (test) and {code(tw.ref)} (reference), greedy "
            f"decoding otherwise equal. {judged} The column {tw.effect_label} counts the proof that {tw.name} "
            f"took effect: {tw.effect_doc}.{prompts}"
        )
    return (
        f"This run generates the same prompts with {model}{engine} twice per configuration: with cascade "
        "attention enabled (test) and disabled (the flat twin, reference), greedy decoding otherwise equal. "
        f"{judged}{prompts}"
    )


def _judging(data: RunData) -> str:
    """How a pair was judged, by the rule that decided this run's verdicts (``reference.rule_note``)."""
    if has_reference(data):
        return (
            "judged against a reference: every token both arms generated is read again, teacher-forced, by the "
            "same weights at more precision, and the test arm's mean error per token must not exceed its twin's "
            "beyond chance and beyond the largest ratio this run's own flat-vs-flat controls show."
        )
    return (
        "compared prompt by prompt and judged against control pairs (flat vs flat across batch sizes or engine "
        "starts): on the tokens both arms and the control generated alike, the logprobs must not move in a "
        "consistent direction or by much more than the control's, and divergence, top-k violations and "
        "repetition must not exceed what the controls show."
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
    spec = spec_of(data.manifest.spec_json)
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
    for key, e in sorted(data.manifest.engines.items()):
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
    exercised = [res for res in cascade_results(data) if res.verdict in EXERCISED]
    prefill = [res.row for res in exercised if res.depth == PREFILL_ONLY]
    if not prefill:
        return []
    return [
        f"{len(prefill)} of {len(exercised)} exercised cascade pairs ran cascade on prefill only "
        f"({pair_ids(prefill)}): the field bug lived in decode, so they do not test it"
    ]


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
    return "drift_min" in data.manifest.thresholds or any(not is_missing(r.get("drift_ratio")) for r in rows)


def drift_note(data: RunData) -> str | None:
    """Explain the drift columns in one paragraph with the run's own thresholds; None for older runs."""
    if not has_drift(data):
        return None
    th = data.manifest.thresholds
    alpha, drift_min, n_perm = (_thresholds_text(th, k) for k in ("alpha", "drift_min", "bootstrap"))
    test, ref = data.twin.arms
    return (
        f"Both drift measures use the positions where the {test} cell, its {ref} twin and the control (column "
        f"control: of the {ref}-vs-{ref} controls that contain the twin, the one that drifted most) all agree so far. "
        f"bias: per prompt, the signed mean of logprob({test}) - logprob(twin) of the chosen token; rounding has no "
        "preferred direction, so under the null each prompt is a coin flip, whatever the rounding's size; flagged "
        f"by an exact two-sided sign test at p < alpha/2 (alpha = {alpha}); a prompt that moved by less than the "
        f"dtype's resolution is a tie. drift ratio: mean |Δ logprob|, {test} vs twin, over the same for the "
        "control, with a bootstrap 95% CI over prompts; means below the dtype's resolution are raised to it, so "
        f"tiny differences never look infinitely above noise. Flagged above drift_min = {drift_min} (cascade may "
        "round more than a batch change without any fault: clean FA2 drifted 1.2-1.5x its flat control on an "
        f"H200) and above the {_percentile(float(th.get('alpha', 0.01)) / 2 if isinstance(th.get('alpha'), int | float) else th.get('alpha'))} "
        f"percentile of the ratio with {test} and control labels swapped at random within prompts ({n_perm} "
        "permutations); drift threshold is the larger of the two."
        + (
            " depth: where cascade ran (decode, prefill only, none; ? when decode steps were not recorded); "
            "the field bug lived in decode."
            if shows_depth(data.twin)
            else ""
        )
    )


IF_NOTE = (
    "{column}: prompt-level instruction-following accuracy (Google IFEval strict rules, "
    "Korean words = space-separated units) of the {test} cell vs its {ref} twin on the same prompts, "
    "with McNemar's exact test on the prompts only one side passes. It is informational: it does not "
    "change the verdict."
)


def if_note(data: RunData) -> str | None:
    """Return the note under the verdict table when IF accuracy is shown, else None."""
    if not has_if(cascade_pairs(data)):
        return None
    return IF_NOTE.format(column=if_column(data), test=data.twin.test, ref=data.twin.ref)


def unscored_note(data: RunData) -> str | None:
    """Name the instruction ids (and kwargs) no verifier could score and the prompts they left unscored; None if none."""
    return data.unscorable.note()
