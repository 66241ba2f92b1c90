"""vLLM's ``EngineArgs`` fields per recorded release, each with the kind of value it takes: the lookup.

One data module per release (``v0_26_0.py`` holds 0.26.0's); this module names them by release in
:data:`FIELDS` and declares the kinds. The names are the wheels' own
(``scripts/old-vllm/record_surface.py`` recorded them into ``tests/data/vllm-surface-<release>.json``;
``tests/plan/test_foreign_flags.py`` and ``tests/vllm_surface/test_targets.py`` keep the two equal).
The kinds follow vLLM's own mapping from a field's annotation to its command-line type
(``vllm/engine/arg_utils.py``, ``_compute_kwargs``): ``int``, ``float``, ``bool``, ``str``,
``list``, ``object`` (a JSON object: a config dataclass or a dict). From 0.26.0 on they are the
recorded ``engine_args_kinds``, derived from the source by the same script (aliases such as
``CacheDType`` resolved; an IntEnum takes its int); 0.10.2's were read by hand from that release's
annotations. ``any`` is a field checked by name only, its value passed as typed: a union vLLM itself
reads as one of two kinds (``hf_token``: ``bool | str | None``, a bare flag or a string;
``hf_overrides``, ``pt_load_map_location``: JSON when it looks like an object), and in 0.10.2 the
string-or-list unions left undecided by hand. Defaults are not recorded: vLLM's come from its config
classes, and the harness passes only what a user set.

A new recorded release is one module here (its ``FIELDS``, as ``record_surface.py`` printed them)
and one line in :data:`FIELDS`.
"""

from __future__ import annotations

from cascade_repro.vllm_surface.fields import v0_10_2, v0_11_0, v0_26_0, v0_31_0, v0_33_0, v0_34_0

KINDS = ("int", "float", "bool", "str", "list", "object", "any")

FIELDS: dict[str, dict[str, str]] = {
    "0.10.2": v0_10_2.FIELDS,
    "0.11.0": v0_11_0.FIELDS,
    "0.26.0": v0_26_0.FIELDS,
    "0.31.0": v0_31_0.FIELDS,
    "0.33.0": v0_33_0.FIELDS,
    "0.34.0": v0_34_0.FIELDS,
}
"""Release -> {field name: kind}, for every release vLLM's wheels were recorded from."""
