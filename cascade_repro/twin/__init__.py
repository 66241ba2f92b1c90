"""The twin axes: every engine setting that must leave greedy outputs alone, named in one place.

Each cell of a setting's test arm is judged against its twin of the reference arm: the same engine
configuration and prompts with only that setting changed. ``--twin NAME`` picks the setting
(:func:`resolve`); ``cascade``, the default, is the first and best-proven one. The arm names are
data on disk (cells.parquet's ``arm`` column, run.json's cells, the samples' records, pair ids such
as ``tp1-b8-cascade~flat`` or ``tp1-b8-prefix-on~prefix-off``), so an entry's names must never
change; the planner, the pairing, the engines and the reports read them from here instead of
spelling them.

An entry says how its arms differ (the vLLM engine arguments or environment of each arm, or a
toggle one engine serves through the plugin, or the cell axis ``tp``/``batch``), what proves the
setting took effect (:attr:`TwinAxis.effect`, counted per wave by the engine: the entry's own reader
of a wave's facts, :meth:`TwinAxis.wave_effect`), whether it will take effect in a planned cell (its
own prediction, :meth:`TwinAxis.predict_effect`, for ``explain``), which vLLM releases lack it
(``vllm_surface.TWIN_RELEASES``), its labels, its pair kind, and whether a difference is expected (a
lossy setting such as an FP8 KV cache: its error ratio is reported, and it fails the run only under
``--fail-on expected``). A new twin is one entry: :func:`register` adds it (from a module named in
``CASCADE_REPRO_TWINS`` as ``module:NAME``, it is registered in every process of a run, workers
included), and the planner, the engines and the reports ask the entry, never its name.

Standard library only, and nothing from this package but its own parts: every layer imports it. The
entry's type and the facts it reads are ``twin/axis.py``'s, the entries ``twin/entries.py``'s, the
parsing of a name ``twin/names.py``'s; every public name is importable from here.
"""

from __future__ import annotations

from cascade_repro.twin.axis import (
    DEFAULT_MAX_CAPTURE,
    EFFECT_LABELS,
    EFFECTS,
    CellFacts,
    EffectPredictor,
    EffectReader,
    TwinAxis,
    WaveFacts,
    effect_record,
)
from cascade_repro.twin.entries import (
    ASYNC_SCHEDULING,
    BACKEND,
    CASCADE,
    CHUNK_TOKENS,
    CHUNKED_PREFILL,
    CUDA_GRAPHS,
    FAMILIES,
    FIXED,
    KV_CACHE_FP8,
    MAX_AXIS,
    PAIR_KINDS,
    PARAMETERISED,
    PREFIX_CACHING,
    SPELLINGS,
    backend_matches,
)
from cascade_repro.twin.names import (
    ALL,
    LIST_SEP,
    PLUGINS_ENV,
    all_examples,
    help_text,
    load_plugins,
    of,
    pair_prefix,
    register,
    resolve,
    resolve_list,
    unregister,
)

__all__ = [
    "ALL",
    "ASYNC_SCHEDULING",
    "BACKEND",
    "CASCADE",
    "CHUNKED_PREFILL",
    "CHUNK_TOKENS",
    "CUDA_GRAPHS",
    "CellFacts",
    "DEFAULT_MAX_CAPTURE",
    "EFFECTS",
    "EFFECT_LABELS",
    "EffectPredictor",
    "EffectReader",
    "FAMILIES",
    "FIXED",
    "KV_CACHE_FP8",
    "LIST_SEP",
    "MAX_AXIS",
    "PAIR_KINDS",
    "PARAMETERISED",
    "PLUGINS_ENV",
    "PREFIX_CACHING",
    "SPELLINGS",
    "TwinAxis",
    "WaveFacts",
    "all_examples",
    "backend_matches",
    "effect_record",
    "help_text",
    "load_plugins",
    "of",
    "pair_prefix",
    "register",
    "resolve",
    "resolve_list",
    "unregister",
]

load_plugins()
