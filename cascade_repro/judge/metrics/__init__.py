"""Pure metric functions over the token ids of generated completions (no torch, no tokenizer)."""

from cascade_repro.judge.metrics.divergence import (
    common_prefix_ratio,
    divergence_metrics,
    dlogprob_stats,
    edit_distance_norm,
    first_divergence,
    logprob_margin,
    topk_contains,
)
from cascade_repro.judge.metrics.repetition import (
    compression_ratio,
    distinct_n,
    longest_repeated_span,
    repetition_metrics,
    seq_rep_n,
    tail_loop,
)

__all__ = [
    "common_prefix_ratio",
    "compression_ratio",
    "distinct_n",
    "divergence_metrics",
    "dlogprob_stats",
    "edit_distance_norm",
    "first_divergence",
    "logprob_margin",
    "longest_repeated_span",
    "repetition_metrics",
    "seq_rep_n",
    "tail_loop",
    "topk_contains",
]
