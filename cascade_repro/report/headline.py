"""The headline: what a run found, in one line, and its colour."""

from __future__ import annotations

from cascade_repro import exit_codes
from cascade_repro import twin as twins
from cascade_repro.judge.outcome import (
    ERROR,
    EXERCISED,
    IDENTICAL,
    INCONCLUSIVE,
    NOT_EXERCISED,
    REGRESSION,
    VERDICTS,
    WITHIN_NOISE,
    exit_status,
    finish_hint,
    n_exercised,
    prefill_only_pairs,
    unfinished_cells,
)
from cascade_repro.judge.verdicts import PREFILL_ONLY
from cascade_repro.report.load import RunData
from cascade_repro.report.text import plural, text_of
from cascade_repro.report.view import cascade_pairs, cascade_results, verdict_counts

HEADLINE_IDS = 3


def headline(data: RunData) -> str:
    """Say in plain words what the run found, e.g. `cascade-repro: regression in 2 of 6 pairs: a, b`."""
    text = _several(data) if data.manifest.several else _named(data, _headline(data))
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
        finish = finish_hint(data) or "rerun the same command to finish"
        text = (
            f"cascade-repro: not finished ({total - pending} of {total} cells done: {finish}); "
            f"so far: {text.removeprefix('cascade-repro: ')}"
        )
    mixed = data.manifest.mixed_stack
    if mixed:
        # A resume under another stack (--allow-mixed): the comparison spans two of them.
        text += f" [mixed stacks: {', '.join(map(str, mixed))} changed between invocations]"
    return text


def _headline(data: RunData) -> str:
    pairs = cascade_pairs(data)
    counts = verdict_counts(data)
    total = len(pairs)
    if total == 0:
        return "cascade-repro: nothing exercised: no cascade pairs"
    results = cascade_results(data)
    regressions = [res.row for res in results if res.verdict == REGRESSION]
    if regressions:
        return f"cascade-repro: regression in {len(regressions)} of {plural(total, 'pair')}: {pair_ids(regressions)}"
    if n_exercised(counts) == 0:
        if counts[ERROR] == total:
            return f"cascade-repro: {plural(total, 'error')} in {plural(total, 'pair')}"
        fired = f"cascade never fired in {plural(counts[NOT_EXERCISED], 'pair')}"
        return f"cascade-repro: nothing exercised: {fired}" + _extras(counts, skip=(NOT_EXERCISED,))
    if prefill := prefill_only_pairs(data):
        # Exit 4 (judge/outcome.py): cascade never ran a decode step, where the field bug lived.
        where = ", ".join(f"{counts[k]} {k}" for k in (IDENTICAL, WITHIN_NOISE, INCONCLUSIVE) if counts[k])
        return (
            f"cascade-repro: not tested in decode: cascade ran on prefill steps only in "
            f"{plural(len(prefill), 'exercised pair')} ({where} on prefill)"
        ) + _extras(counts, skip=(INCONCLUSIVE,))
    clean = counts[IDENTICAL] + counts[WITHIN_NOISE]
    if clean == 0:
        head = f"cascade-repro: inconclusive in {plural(counts[INCONCLUSIVE], 'pair')}: no noise control measured"
        return head + _extras(counts, skip=(INCONCLUSIVE,))
    detail = ", ".join(f"{counts[k]} {k}" for k in (IDENTICAL, WITHIN_NOISE) if counts[k])
    # The field bug lived in decode: a clean pair that never ran cascade on a decode step proves less.
    prefill = sum(1 for res in results if res.verdict in EXERCISED and res.depth == PREFILL_ONLY)
    if prefill:
        detail += f"; {prefill} on prefill only"
    return f"cascade-repro: no cascade effect beyond noise in {plural(clean, 'pair')} ({detail})" + _extras(
        counts
    )


def twin_line(view: RunData) -> str:
    """One twin's own line in a run of several (its view, ``RunData.for_twin``): what a run of it
    alone would headline, without the tool's name."""
    return _named(view, _headline(view)).split(": ", 1)[1]


def _several(data: RunData) -> str:
    """The headline of a run of several twins: the twins that changed outputs first (a regression
    in any of their pairs), then those that could not say (never took effect, no control, errors)."""
    changed, expected, quiet, unsure = [], [], [], []
    for tw in data.twins:
        view = data.for_twin(tw)
        if not view.rows("cells"):
            continue  # a shard without this twin's cells
        counts = verdict_counts(view)
        total = sum(counts.values())
        if counts[REGRESSION]:
            part = f"{tw.name} ({counts[REGRESSION]} of {plural(total, 'pair')})"
            (expected if tw.expected_change else changed).append(part)
        elif total and n_exercised(counts) and counts[INCONCLUSIVE] == 0 and counts[ERROR] == 0:
            quiet.append(tw.name)
        else:
            why = (
                "never took effect" if total and n_exercised(counts) == 0 and counts[ERROR] < total
                else "errors" if counts[ERROR] else "no control" if counts[INCONCLUSIVE] else "no pairs"
            )  # fmt: skip
            unsure.append(f"{tw.name} ({why})")
    head = f"cascade-repro --twin {','.join(t.name for t in data.twins)}: "
    parts = []
    if changed:
        parts.append(f"outputs changed under {', '.join(changed)}")
    if expected:
        parts.append(f"expected differences under {', '.join(expected)}")
    if quiet:
        parts.append(f"no effect beyond noise under {', '.join(quiet)}")
    if unsure:
        parts.append(f"nothing measured under {', '.join(unsure)}")
    if not changed:
        parts.insert(0, "no twin changed outputs")
    return head + "; ".join(parts)


def _named(data: RunData, text: str) -> str:
    """The headline of a twin other than cascade: the twin named where cascade would be, and a
    regression of a setting that changes results by design called expected."""
    tw = data.twin
    if tw is twins.CASCADE:
        return text
    for old, new in (("no cascade pairs", f"no {tw.name} pairs"), ("cascade never fired", f"{tw.name} never took effect"),
                     ("no cascade effect", f"no {tw.name} effect")):  # fmt: skip
        text = text.replace(old, new)
    if tw.expected_change and text.startswith("cascade-repro: regression"):
        text += f" (expected: {tw.name} changes results by design)"
    return text.replace("cascade-repro: ", f"cascade-repro --twin {tw.name}: ", 1)


def pair_ids(rows: list[dict], limit: int = HEADLINE_IDS) -> str:
    """`a, b, c and 2 more`: the first pair ids of rows, for a line that names them."""
    ids = [text_of(r.get("pair_id")) for r in rows]
    more = f" and {len(ids) - limit} more" if len(ids) > limit else ""
    return ", ".join(ids[:limit]) + more


def _extras(counts: dict[str, int], skip: tuple[str, ...] = ()) -> str:
    """The `; 1 not exercised; 1 error` tail of a headline: pairs outside its main clause."""
    parts = [f"{counts[k]} {k}" for k in (NOT_EXERCISED, INCONCLUSIVE) if counts[k] and k not in skip]
    if counts[ERROR] and ERROR not in skip:
        parts.append(plural(counts[ERROR], "error"))
    # Verdicts this version does not know (a newer scorer, a hand-edited file) are still counted.
    unknown = sum(n for k, n in counts.items() if k not in VERDICTS)
    if unknown:
        parts.append(f"{unknown} without a known verdict")
    return "".join(f"; {p}" for p in parts)


def headline_tone(data: RunData) -> str:
    """Colour of the headline: `bad` (regression, nothing measured), `warn` (exit 4 or 5) or `ok`."""
    code = exit_status(data, REGRESSION)[0]
    return "bad" if code == exit_codes.REGRESSION else "ok" if code == exit_codes.OK else "warn"
