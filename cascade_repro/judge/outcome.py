"""What a scored run's verdicts mean: the verdict names, the pair kinds and the exit policy.

Each is declared here once. The scorer writes these names into pairs.parquet (``verdict``,
``kind``); the reports read them back; :func:`exit_status` is the one place a scored run's exit
code is decided (``matrix``, ``merge`` and ``report`` all exit with it), and :func:`refusal_status`
that of a matrix refused before it planned, from the codes in :mod:`cascade_repro.exit_codes`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from cascade_repro import exit_codes, vllm_surface
from cascade_repro import twin as twins
from cascade_repro.errors import UsageError
from cascade_repro.plan.matrix import FAIL_ON, spec_of
from cascade_repro.rundir.manifest import Manifest
from cascade_repro.twin import CASCADE as TWIN

if TYPE_CHECKING:
    from cascade_repro.plan.flags import VllmCheck

# A pair's verdict (pairs.parquet's ``verdict``).
REGRESSION = "regression"
ERROR = "error"
NOT_EXERCISED = "not exercised"
INCONCLUSIVE = "inconclusive"
WITHIN_NOISE = "within noise"
IDENTICAL = "identical"
# Worst first: the order the reports count them in (summary.json's ``counts``).
VERDICTS = (REGRESSION, ERROR, NOT_EXERCISED, INCONCLUSIVE, WITHIN_NOISE, IDENTICAL)
# Verdicts of a pair in which cascade ran and both cells were compared: something was measured.
EXERCISED = (IDENTICAL, WITHIN_NOISE, REGRESSION, INCONCLUSIVE)

# A pair's depth (pairs.parquet's ``depth``): cascade ran on prefill steps and on no decode step. The
# field bug lived in decode, so a run whose every exercised pair has it did not test what it claims.
PREFILL_ONLY = "prefill only"

# A pair's kind (pairs.parquet's ``kind``): the twin pair, a positive control with an injected
# fault (never in the verdict counts or the exit code), and the flat-vs-flat noise controls.
TWIN_KIND = TWIN.pair_kind
# Every twin's kind (twin/'s registry: cascade, prefix-caching, ...): a test cell against its twin.
TWIN_KINDS = twins.PAIR_KINDS
CALIBRATION = "calibration"  # also the origin (cells.parquet) of the cells of such a pair
NOISE_BATCH, NOISE_RESTART, NOISE_RERUN = "noise-batch", "noise-restart", "noise-rerun"
PAIR_KINDS = (*twins.FAMILIES, CALIBRATION, NOISE_BATCH, NOISE_RESTART, NOISE_RERUN)
# Controls that measure noise. A rerun inside one engine is bitwise identical (the prefix cache is
# reset per wave), so it is shown but never taken as a noise floor.
FLOOR_KINDS = (NOISE_BATCH, NOISE_RESTART)


class ScoredRun(Protocol):
    """What the exit policy reads of a scored run (``report.load.RunData`` is one)."""

    manifest: Manifest

    def rows(self, table: str) -> list[dict]: ...


def verdict_counts(verdicts: Iterable[str]) -> dict[str, int]:
    """Count cascade pairs per verdict; known verdicts always appear (in :data:`VERDICTS` order),
    unknown ones are added in the order met."""
    counts = dict.fromkeys(VERDICTS, 0)
    for v in verdicts:
        counts[v] = counts.get(v, 0) + 1
    return counts


def n_exercised(counts: dict[str, int]) -> int:
    """Count the cascade pairs in which something was measured."""
    return sum(counts.get(v, 0) for v in EXERCISED)


def twin_pairs(run: ScoredRun) -> list[dict]:
    """The twin pair rows, in table order (calibration and control pairs left out)."""
    return [r for r in run.rows("pairs") if r.get("kind") in TWIN_KINDS]


def unfinished_cells(run: ScoredRun) -> tuple[int, int]:
    """(pending cells, all cells) of the run's cell table: a run cut before its last cell finished."""
    recs = [r for r in run.rows("cells") if r.get("origin") != CALIBRATION]
    return sum(1 for r in recs if r.get("status") == "pending"), len(recs)


def finish_hint(run: ScoredRun) -> str | None:
    """A merged run's way to finish its pending cells (None: rerun the command that made the run)."""
    from cascade_repro.rundir.sample_scan import finish_hint as hint

    keys = {str(r.get("engine_key")) for r in run.rows("cells") if r.get("status") == "pending"}
    return hint(run.manifest, keys)


def has_errors(run: ScoredRun) -> bool:
    """Return True when any cell, engine or cascade pair failed (calibration cells aside)."""
    if any(r.get("verdict") == ERROR for r in twin_pairs(run)):
        return True
    if any(r.get("status") == "error" and r.get("origin") != CALIBRATION for r in run.rows("cells")):
        return True
    return any(e.status == "error" for e in run.manifest.engines.values())


def prefill_only_pairs(run: ScoredRun) -> list[dict]:
    """The exercised twin pairs when every one of them ran its twin on prefill steps only (cascade's
    depth ``prefill only``: no decode step tested), else []: a run that tested no decode step."""
    exercised = [r for r in twin_pairs(run) if r.get("verdict") in EXERCISED]
    if exercised and all(r.get("depth") == PREFILL_ONLY for r in exercised):
        return exercised
    return []


def never_fired_because(run: ScoredRun) -> str:
    """Why cascade never fired, from what the run recorded; the generic answer when nothing explains it."""
    why = []
    tw = run.manifest.twin
    if tw is not TWIN:
        return f"{tw.effect_doc} stayed 0: see the pairs' reasons"
    batches = [_whole(r.get("batch")) for r in run.rows("cells") if r.get("arm") == TWIN.test]
    batches = [b for b in batches if b is not None] or [
        b for b in (_whole(r.get("batch")) for r in twin_pairs(run)) if b is not None
    ]
    if batches and max(batches) < vllm_surface.MIN_REQUESTS:
        why.append(f"every batch size is below {vllm_surface.MIN_REQUESTS} requests")
    m = run.manifest
    prefix = _whole(m.prompt_set.stored("shared_prefix_tokens")) if m.has("prompt_set") else None
    if prefix is not None and prefix < vllm_surface.MIN_COMMON_PREFIX:
        why.append(f"shared prefix {prefix} tokens < {vllm_surface.MIN_COMMON_PREFIX}")
    if any(_flag_true(e.effective.get("disable_cascade_attn")) for e in m.engines.values()):
        why.append("vLLM ran with disable_cascade_attn=True")
    return "; ".join(why) or "cascade's decision never came out true (see `cascade-repro explain`)"


def run_fail_on(manifest: Manifest) -> str:
    """The run's own ``--fail-on`` as run.json holds it; ``regression`` where it holds none or an
    unknown one (what summary.json's exit code has always been computed with)."""
    fail_on = manifest.fail_on or REGRESSION
    return fail_on if fail_on in FAIL_ON else REGRESSION


def exit_status(run: ScoredRun, fail_on: str) -> tuple[int, str]:
    """Return the exit code for fail_on and a one-line reason; the one place exit codes are decided.

    0 clean; 1 a cascade regression, errors under fail_on=error, or every cascade pair errored;
    4 no cascade pair exercised (a guard that passes when nothing was tested hides a broken setup),
    or every exercised one ran cascade on prefill steps only (not tested in decode);
    5 the run is not finished (a regression among its finished pairs still gives 1), or some pair
    is inconclusive (no noise control to judge it against). Calibration pairs never count.
    """
    fail_on = str(getattr(fail_on, "value", fail_on))
    if fail_on not in FAIL_ON:
        raise UsageError(f"unknown fail_on {fail_on!r}: expected one of {', '.join(FAIL_ON)}")
    if fail_on == "never":
        return exit_codes.OK, "fail_on=never: the run never fails"
    if run.manifest.several and hasattr(run, "for_twin"):
        return _worst_twin(run, fail_on)
    counts = verdict_counts(_verdict(r.get("verdict")) for r in twin_pairs(run))
    n_reg, total = counts[REGRESSION], sum(counts.values())
    tw = run.manifest.twin
    if n_reg and tw.expected_change and fail_on != "expected":
        # A lossy setting changes results by design: reported with its error ratio, not failed on.
        n_reg = 0
        expected = counts[REGRESSION]
    else:
        expected = 0
    if n_reg:
        return exit_codes.REGRESSION, f"{n_reg} regression{'' if n_reg == 1 else 's'} (fail_on={fail_on})"
    pending, cells = unfinished_cells(run)
    if pending and not run.manifest.shards_missing:  # a partial merge was asked for (--allow-partial)
        # A half-run matrix must not pass a guard: what it has not run it has not cleared. Said
        # before the error checks: a pair whose twin never ran is an error too, and a run cut after
        # its first cell would otherwise read "every cascade pair errored" when rerunning finishes it.
        return (
            exit_codes.INCONCLUSIVE,
            f"not finished: {pending} of {cells} cells never ran; {finish_hint(run) or 'rerun the same command'}",
        )
    if fail_on == "error" and has_errors(run):
        return exit_codes.REGRESSION, f"errors in the run (fail_on={fail_on})"
    if total and counts[ERROR] == total:
        # A guard that passes when nothing ran would hide a broken CI runner.
        return exit_codes.REGRESSION, f"every cascade pair errored: nothing was measured (fail_on={fail_on})"
    if n_exercised(counts) == 0:
        return exit_codes.NOTHING_EXERCISED, _nothing_exercised_reason(run, counts)
    if prefill := prefill_only_pairs(run):
        # Cascade fired, but on no decode step, where the field bug lived: a pass would claim a test
        # that never ran. Said as "nothing exercised" in decode, the same code.
        return exit_codes.NOTHING_EXERCISED, (
            f"not tested in decode: cascade ran on prefill steps only in {'its only exercised pair' if len(prefill) == 1 else f'all {len(prefill)} exercised pairs'} "
            "(decode steps run cascade from a batch size vLLM's rule picks: see `cascade-repro explain`)"
        )
    if counts[INCONCLUSIVE]:
        return exit_codes.INCONCLUSIVE, _inconclusive_reason(run, counts[INCONCLUSIVE])
    if expected:
        return exit_codes.OK, (
            f"{expected} expected difference{'' if expected == 1 else 's'}: {tw.name} changes results by design "
            f"(not failed on; --fail-on expected fails on it) (fail_on={fail_on})"
        )
    return exit_codes.OK, "no regression" + (
        " or error" if fail_on == "error" else ""
    ) + f" (fail_on={fail_on})"


# A run of several twins exits with its worst twin's code, in this order: a regression, a run not
# finished or a pair without a control, a twin never exercised, clean.
SEVERITY = (exit_codes.REGRESSION, exit_codes.INCONCLUSIVE, exit_codes.NOTHING_EXERCISED, exit_codes.OK)


def _worst_twin(run: Any, fail_on: str) -> tuple[int, str]:
    """The exit code of a run of several twins: each twin's view judged as a run of its own, the
    worst code wins; the reason names each twin behind it."""
    # A shard may hold no cell of a twin: that twin is another shard's to judge.
    views = [(tw, v) for tw in run.manifest.twins if (v := run.for_twin(tw)).rows("cells")]
    codes = [(tw, *exit_status(v, fail_on)) for tw, v in views]
    rank = {c: i for i, c in enumerate(SEVERITY)}
    worst = min((c for _, c, _ in codes), key=lambda c: rank.get(c, -1))
    if worst == exit_codes.OK:
        return worst, f"no regression in {len(codes)} twins (fail_on={fail_on})"
    behind = [f"{tw.name}: {why}" for tw, c, why in codes if c == worst]
    return worst, "; ".join(behind)


def refusal_status(check: VllmCheck) -> int:
    """Return the exit code of a matrix refused before it planned: 4 when this vLLM lacks the twin's
    setting (no pair could be exercised, as in a run where it never fired); 2 when the box lacks what
    the command asked for (vLLM, a GPU, enough GPUs): the command's to change."""
    return exit_codes.NOTHING_EXERCISED if check.setting_missing else exit_codes.USAGE


def _nothing_exercised_reason(run: ScoredRun, counts: dict[str, int]) -> str:
    total, fired = sum(counts.values()), counts[NOT_EXERCISED]
    if total == 0:
        has_arm = any(r.get("arm") == run.manifest.twin.test for r in run.rows("cells"))
        why = "no cascade cell has a finished flat twin" if has_arm else "the matrix has no cascade arm"
        return f"nothing exercised: the run has no cascade pairs ({why})"
    tw = run.manifest.twin
    never = "cascade never fired" if tw is TWIN else f"{tw.name} never took effect"
    if fired == total:
        where = "its only pair" if total == 1 else f"any of {total} pairs"
        return f"nothing exercised: {never} in {where} ({never_fired_because(run)})"
    return (
        f"nothing exercised: {never} in {fired} of {total} pairs, the other {total - fired} "
        f"measured nothing ({never_fired_because(run)})"
    )


def _inconclusive_reason(run: ScoredRun, n: int) -> str:
    off = spec_of(run.manifest.spec_json).auto_controls is False
    why = "planner controls turned off" if off else "no usable control pair"
    return f"{n} inconclusive: no noise control measured ({why})"


def _verdict(v: Any) -> str:
    # A missing verdict (None, NaN) counts under no known name; only the known names decide a code.
    return v if isinstance(v, str) else ""


def _whole(v: Any) -> int | None:
    """A whole number as a table row holds it (an int, a whole float; NaN or None for none), else None."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if math.isfinite(f) and f.is_integer() else None


def _flag_true(v: Any) -> bool:
    return v is True or (isinstance(v, str) and v.strip().lower() == "true")
