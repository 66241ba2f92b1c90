"""The statistics registry: every statistic a pair's verdict weighs, declared once.

An entry (``Statistic``) carries everything about its statistic that is not its measure: its
evidence piece's name and rule, its pairs.parquet columns (and the column they follow:
``judge/tables.PAIR_COLUMNS`` is built from these), how they are filled from what the judge
measured of a pair (``fill``), how its piece is read back from a row of any run (``read``), the
columns summary.json carries (``summary``), and its words in the report (``text``: its numbers
against its bar). A statistic of the reference rule also carries ``measure``, its per-sample error
against the reference pass's record: the judge computes it for every sample, tests it pair by pair
(``reference_verdict.paired_errors``), takes its minimum effect from the run's own flat-vs-flat
controls and lets it flag the pair under a Bonferroni correction shared with the chosen-token error.

Adding a statistic of the reference rule touches two files: its measure in ``judge/metrics/`` and
its entry here. An arm-vs-arm statistic also needs its test in ``judge/verdicts.py`` (``decide``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cascade_repro.judge.metrics.topk import topk_error
from cascade_repro.judge.reference_verdict import RefStats, family, level
from cascade_repro.judge.verdicts import (
    ARM_VS_ARM,
    REFERENCE,
    BiasStats,
    DriftStats,
    EvidencePiece,
    bias_piece,
    divergence_piece,
    drift_piece,
    number,
    reference_piece,
    repetition_piece,
    topk_piece,
)
from cascade_repro.rundir.reference import RefRow

NAN = math.nan


class Formats(Protocol):
    """How the report writes numbers (``report/summary.py`` hands one in: the judge imports no report)."""

    def int(self, v: Any) -> str: ...
    def x(self, v: Any) -> str: ...  # a ratio, `1.35`
    def ratio(self, k: Any, n: Any) -> str: ...  # `3/64`
    def float(self, v: Any, spec: str) -> str: ...
    def p_vs(self, p: Any, bar: float) -> str: ...  # `p=0.0012 < 0.005`
    def over(self, value: Any, bar: Any) -> str: ...  # ` > 1.14x`
    def missing(self, v: Any) -> bool: ...


class Shown(Protocol):
    """What a statistic's words read of a pair: its row and its counts (``judge/result.PairResult``)."""

    @property
    def row(self) -> Mapping[str, Any]: ...
    @property
    def counts(self) -> Any: ...


@dataclass(frozen=True)
class Judged:
    """A reference statistic of one pair as judged: its paired statistics, and, where the reference
    rule decided the pair, its minimum effect (and the control that set it) and its level."""

    stats: RefStats
    min_effect: float = NAN
    min_effect_pair: str = ""
    level: float = NAN


@dataclass
class Measured:
    """What the judge measured of one pair, handed to every statistic's ``fill`` (a control pair
    weighs no arm-vs-arm evidence: its drift, bias and p-values are absent)."""

    drift: DriftStats | None = None
    bias: BiasStats | None = None
    p_divergence: float = NAN
    p_topk: float = NAN
    repetition: tuple[float, float, float] = (NAN, NAN, NAN)  # Δseq-rep-4 mean and its CI
    reference: dict[str, Judged] = field(default_factory=dict)


ReadPiece = Callable[[Mapping[str, Any], float, float, float], EvidencePiece]


@dataclass(frozen=True)
class Statistic:
    """One statistic a pair's verdict weighs (the module docstring says what each field is for)."""

    name: str
    columns: tuple[str, ...]
    after: str
    read: ReadPiece  # its piece from a row, given (alpha, rep_delta, min_topk)
    fill: Callable[[Measured], dict[str, Any]]
    text: Callable[[Shown, EvidencePiece, Formats], str]
    summary: tuple[str, ...] = ()
    rule: str = ARM_VS_ARM
    # The reference rule's: the per-sample error against the reference (arm logprobs, arm top-k, the
    # reference's record), NaN where unmeasurable; the column holding the pair's p-value; its words.
    measure: Callable[[list[float], Any, RefRow], float] | None = None
    p_column: str = ""
    n_column: str = ""  # its prompt count: what p it could reach (``reference_verdict.attainable``)
    label: str = ""
    short: Callable[[Shown, EvidencePiece, Formats], str] | None = None  # its words where room is short


def reference_family(row: Mapping[str, Any], alpha: float) -> tuple[tuple[str, ...], float]:
    """The reference statistics a row was judged on (the chosen token's, and each further one the
    row measured where the family could reach its level: ``reference_verdict.family``) and their level."""
    stats = [s for s in STATISTICS if s.rule == REFERENCE]
    measured = [s for s in stats[1:] if math.isfinite(number(row.get(s.p_column)))]
    ns = [int(v) if math.isfinite(v := number(row.get(s.n_column))) else 0 for s in (stats[0], *measured)]
    names = (stats[0].name, *(s.name for s in measured)) if family(alpha, ns) > 1 else (stats[0].name,)
    return names, level(alpha, len(names))


def reference_level(row: Mapping[str, Any], alpha: float) -> float:
    """The level each reference statistic of a row was tested at."""
    return reference_family(row, alpha)[1]


def _ref_read(s_ratio: str, s_min: str, s_p: str, name: str) -> ReadPiece:
    return lambda row, alpha, rep_delta, min_topk: reference_piece(
        row.get(s_ratio), row.get(s_min), row.get(s_p), reference_level(row, alpha), name=name
    )


def _ref_text(what: str, p_column: str, *, full: bool) -> Callable[[Shown, EvidencePiece, Formats], str]:
    def text(res: Shown, e: EvidencePiece, f: Formats) -> str:
        ratio = f"{what} vs reference {f.x(e.value)}x{f.over(e.value, e.threshold)}"
        return f"{ratio}, {f.p_vs(res.row.get(p_column), e.level)}" if full else ratio

    return text


def _stats_columns(prefix: str, p: str, s: RefStats) -> dict[str, Any]:
    return {
        f"{prefix}_n": s.n, f"{prefix}_test": s.test, f"{prefix}_twin": s.twin, f"{prefix}_ratio": s.ratio,
        f"{prefix}_ratio_lo": s.lo, f"{prefix}_ratio_hi": s.hi, f"{prefix}_up": s.up, f"{prefix}_down": s.down,
        f"{p}_sign": s.p_sign, f"{p}_wilcoxon": s.p_wilcoxon, p: s.p,
    }  # fmt: skip


def _topk_measure(logprobs: list[float], topk: Any, ref: RefRow) -> float:
    # A record written before the arms' ids were stored cannot say: the chosen token judges alone.
    return NAN if ref.arm_ids is None else topk_error(topk, ref.arm_logprobs())


def _topk_fill(m: Measured) -> dict[str, Any]:
    j = m.reference.get(TOPK_REFERENCE, Judged(RefStats()))
    return {
        **_stats_columns("ref_topk", "p_ref_topk", j.stats),
        "ref_topk_min_effect": j.min_effect,
        "ref_topk_min_effect_pair": j.min_effect_pair,
    }


def _chosen_fill(m: Measured) -> dict[str, Any]:
    # Its statistics' columns (ref_n .. ref_by_step_*) stand in the pairs table's base with the
    # reference's other facts (compare fills them with the error curves); the minimum effect is judged.
    j = m.reference.get(REFERENCE, Judged(RefStats()))
    return {"ref_min_effect": j.min_effect, "ref_min_effect_pair": j.min_effect_pair}


TOPK_REFERENCE = "reference-topk"
TOPK_COLUMNS = (
    "ref_topk_n", "ref_topk_test", "ref_topk_twin", "ref_topk_ratio", "ref_topk_ratio_lo", "ref_topk_ratio_hi",
    "ref_topk_up", "ref_topk_down", "p_ref_topk_sign", "p_ref_topk_wilcoxon", "p_ref_topk", "ref_topk_min_effect",
    "ref_topk_min_effect_pair",
)  # fmt: skip
DRIFT_COLUMNS = (
    "drift_n", "drift_tokens", "drift_test", "drift_control", "drift_floor", "drift_ratio", "drift_ratio_lo",
    "drift_ratio_hi", "drift_threshold", "drift_null_q", "p_drift", "drift_up",
)  # fmt: skip


def _drift_fill(m: Measured) -> dict[str, Any]:
    d = m.drift or DriftStats()
    return {
        "drift_n": d.n, "drift_test": d.test, "drift_control": d.control, "drift_floor": d.floor,
        "drift_ratio": d.ratio, "drift_ratio_lo": d.lo, "drift_ratio_hi": d.hi, "drift_threshold": d.threshold,
        "drift_null_q": d.null_q, "p_drift": d.p, "drift_up": d.up,
    }  # fmt: skip  # drift_tokens: the agreeing positions, counted where the pair is scored


def _bias_fill(m: Measured) -> dict[str, Any]:
    b = m.bias or BiasStats()
    return {"bias_n": b.n, "bias_up": b.up, "bias_down": b.down, "bias_mean": b.mean, "p_bias": b.p,
            "p_bias_control": b.p_control}  # fmt: skip


# The evidence a verdict can rest on: the arm-vs-arm statistics in the order ``verdicts.decide``
# weighs them, then the reference rule's (``reference_verdict.decide``), the chosen token's first.
STATISTICS = (
    Statistic(
        "bias",
        ("bias_n", "bias_up", "bias_down", "bias_mean", "p_bias", "p_bias_control"),
        "drift_up",
        lambda row, alpha, rep_delta, min_topk: bias_piece(row.get("p_bias"), alpha),
        _bias_fill,
        lambda res, e, f: (
            f"bias {f.int(res.row.get('bias_up'))}↑ {f.int(res.row.get('bias_down'))}↓: {f.p_vs(e.value, e.threshold)}"
        ),
        summary=("bias_up", "bias_down", "bias_mean", "p_bias", "p_bias_control"),
    ),
    Statistic(
        "drift",
        DRIFT_COLUMNS,
        "control_pair_id",
        lambda row, alpha, rep_delta, min_topk: drift_piece(
            row.get("drift_ratio"), row.get("drift_threshold")
        ),
        _drift_fill,
        lambda res, e, f: f"drift {f.x(e.value)}x{f.over(e.value, e.threshold)}",
        summary=(
            "drift_ratio",
            "drift_ratio_lo",
            "drift_ratio_hi",
            "drift_threshold",
            "p_drift",
            "drift_test",
            "drift_control",
            "drift_n",
        ),  # fmt: skip
    ),
    Statistic(
        "divergence",
        ("p_divergence",),
        "noise_topk_violations",
        lambda row, alpha, rep_delta, min_topk: divergence_piece(row.get("p_divergence"), alpha),
        lambda m: {"p_divergence": m.p_divergence},
        lambda res, e, f: (
            f"diverged {f.ratio(res.counts.n_diverged, res.counts.n)} vs "
            f"{f.ratio(res.counts.noise_n_diverged, res.counts.noise_n)}: {f.p_vs(e.value, e.threshold)}"
        ),
        summary=("p_divergence",),
    ),
    Statistic(
        "top-k",
        ("p_topk",),
        "p_divergence",
        lambda row, alpha, rep_delta, min_topk: topk_piece(
            row.get("p_topk"), row.get("topk_violations"), alpha, min_topk
        ),
        lambda m: {"p_topk": m.p_topk},
        lambda res, e, f: (
            f"outside top-k {f.int(res.counts.topk_violations)} vs "
            f"{f.int(res.counts.noise_topk_violations)}: {f.p_vs(e.value, e.threshold)}"
        ),
        summary=("p_topk",),
    ),
    Statistic(
        "repetition",
        ("d_seq_rep_4_mean", "d_seq_rep_4_lo", "d_seq_rep_4_hi"),
        "dlogprob_max",
        lambda row, alpha, rep_delta, min_topk: repetition_piece(row.get("d_seq_rep_4_lo"), rep_delta),
        lambda m: dict(
            zip(("d_seq_rep_4_mean", "d_seq_rep_4_lo", "d_seq_rep_4_hi"), m.repetition, strict=True)
        ),
        lambda res, e, f: (
            f"Δseq-rep-4 CI low {f.float(e.value, '+.3f')}"
            + ("" if f.missing(e.value) else f" > {e.threshold:g}")
        ),
        summary=("d_seq_rep_4_mean", "d_seq_rep_4_lo", "d_seq_rep_4_hi"),
    ),
    # The chosen token's error against the reference (``metrics/reference.py``): its columns are the
    # pairs table's base ``ref_*`` (the error curves and regret beside it), its words the reference
    # section's; here its piece, its level and its minimum effect.
    Statistic(
        REFERENCE,
        (),
        "ref_by_step_twin",
        _ref_read("ref_ratio", "ref_min_effect", "p_ref", REFERENCE),
        _chosen_fill,
        _ref_text("error", "p_ref", full=True),
        rule=REFERENCE,
        p_column="p_ref",
        n_column="ref_n",
        label="error",
        short=_ref_text("error", "p_ref", full=False),
    ),
    # The arm's whole top-k list against the reference's exact logprobs of those ids
    # (``metrics/topk.py``): on faults the chosen token's error missed it gave 10x-1,000x smaller
    # p-values with no clean pair flagged; it does not replace the chosen token's (a small uniform
    # LSE shift reads no better), so both are tested, each at alpha/2.
    Statistic(
        TOPK_REFERENCE,
        TOPK_COLUMNS,
        "ref_by_step_twin",
        _ref_read("ref_topk_ratio", "ref_topk_min_effect", "p_ref_topk", TOPK_REFERENCE),
        _topk_fill,
        _ref_text("top-k error", "p_ref_topk", full=True),
        summary=TOPK_COLUMNS,
        rule=REFERENCE,
        measure=_topk_measure,
        p_column="p_ref_topk",
        n_column="ref_topk_n",
        label="top-k error",
        short=_ref_text("top-k error", "p_ref_topk", full=False),
    ),
)
EVIDENCE_NAMES = tuple(s.name for s in STATISTICS)
ARM_NAMES = tuple(s.name for s in STATISTICS if s.rule == ARM_VS_ARM)
# The reference rule's statistics beyond the chosen token's: measured per sample, judged per pair.
MEASURED = tuple(s for s in STATISTICS if s.measure is not None)


def statistic(name: str) -> Statistic:
    """The entry called ``name``."""
    return next(s for s in STATISTICS if s.name == name)


def evidence_of(
    row: Mapping[str, Any], alpha: float, rep_delta: float, min_topk: float
) -> tuple[EvidencePiece, ...]:
    """A pair's evidence pieces from its pairs.parquet columns: the arm-vs-arm ones in ``decide``'s
    order, then, where the reference decided, the chosen token's piece and each other reference
    statistic the row measured (an older run's row has none)."""
    judged = reference_family(row, alpha)[0] if row.get("rule") == REFERENCE else ()
    return tuple(
        s.read(row, alpha, rep_delta, min_topk)
        for s in STATISTICS
        if s.rule == ARM_VS_ARM or s.name in judged
    )


def fill(m: Measured) -> dict[str, Any]:
    """Every statistic's columns of one pair, from what was measured of it."""
    out: dict[str, Any] = {}
    for s in STATISTICS:
        out.update(s.fill(m))
    return out
