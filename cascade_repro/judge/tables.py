"""The scored tables of a run directory: one schema, written by compare and read by report/load.

``PAIR_COLUMNS`` is the whole pairs table, in order: compare builds it with exactly these columns;
a statistic's own columns come from its entry in ``judge/statistics.STATISTICS``.
``CELL_COLUMNS`` and ``COMPARISON_COLUMNS`` are what every reader may rely on in the other two;
compare's rows carry them (plus a few kept for the record, e.g. ``dtype_effective``), and
``tests/judge/test_tables.py`` checks that. Older run directories lack some columns; report/load adds
them as empty.
"""

from __future__ import annotations

from cascade_repro.judge.statistics import STATISTICS, Statistic

CELL_COLUMNS = (
    "cell_id engine_key engine model tp batch arm rerun seed dtype fa_version backend status error "
    "n_prompts cascade_steps total_steps cascade_calls wall_s tokens tokens_per_s len_mean "
    "seq_rep_1 seq_rep_2 seq_rep_3 seq_rep_4 distinct_1 distinct_2 distinct_3 distinct_4 zlib_ratio "
    "tail_loop_rate longest_repeat_mean finish_length_rate inject origin cascade_decode_steps "
    "decode_step_ms cascade_step_ms flat_step_ms decode_tok_s"
).split()

# The pairs table's columns that no statistic owns; each statistic's (``statistics.STATISTICS``) go in
# after the column it names.
_PAIR_BASE = [
    "pair_id", "kind", "inject", "test_cell", "ref_cell", "tp", "batch", "ref_batch", "seed", "dtype", "fa_version",
    "backend", "n", "n_identical", "n_diverged", "first_div_median", "common_prefix_ratio_mean",
    "edit_distance_mean", "topk_violations", "dlogprob_mean", "dlogprob_max", "noise_pair_id", "noise_n",
    "noise_n_diverged", "noise_topk_violations", "control_pair_id", "topk_drift_ratio", "topk_drift_ratio_lo",
    "topk_drift_ratio_hi", "cascade_steps", "cascade_decode_steps", "total_steps", "depth", "verdict", "decided_by",
    "reasons", "if_n", "if_strict_test", "if_strict_ref", "if_strict_delta", "if_loose_delta", "if_gained",
    "if_lost", "p_if", "speed_ratio", "speed_ratio_lo", "speed_ratio_hi", "speed_waves", "wall_ratio",
    "predicted_speedup", "speed_flag",
    # Against the reference (judge/reference_verdict.py); empty where no reference ran.
    "rule", "reference", "ref_n", "ref_err_test", "ref_err_twin", "ref_ratio",
    "ref_ratio_lo", "ref_ratio_hi", "ref_up", "ref_down", "p_ref_sign", "p_ref_wilcoxon", "p_ref", "ref_min_effect",
    "ref_min_effect_pair", "ref_regret_test", "ref_regret_twin", "ref_signed_test", "ref_signed_twin",
    "ref_by_step_test", "ref_by_step_twin",
]  # fmt: skip


def pair_columns(base: list[str], statistics: tuple[Statistic, ...]) -> list[str]:
    """``base`` with each statistic's columns spliced in right after the column it names (which may
    be another statistic's)."""
    out, todo = list(base), list(statistics)
    while todo:
        ready = [s for s in todo if s.after in out]
        if not ready:
            raise ValueError(f"statistic {todo[0].name!r} follows {todo[0].after!r}, not a pairs column")
        for s in ready:
            i = out.index(s.after) + 1
            out[i:i] = s.columns
            todo.remove(s)
    return out


PAIR_COLUMNS = pair_columns(_PAIR_BASE, STATISTICS)

COMPARISON_COLUMNS = (
    "pair_id prompt_index prompt_key exact first_div common_prefix_ratio edit_distance topk_ok "
    "margin_test margin_ref dlogprob_mean dlogprob_max seq_rep_4_test seq_rep_4_ref len_test len_ref "
    "drift_positions drift_test drift_control bias_test bias_control topk_drift_test topk_drift_control "
    "ref_err_test ref_err_ref ref_regret_test ref_regret_ref"
).split()
