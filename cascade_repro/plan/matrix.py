"""The planner: a :class:`MatrixSpec` -> a :class:`Plan` of engine plans and cells (:func:`plan`,
:func:`plan_twin` for one twin), the noise controls and calibration cells it adds, the cell ids and
engine keys, and :func:`plan_warnings`: what it changed, in words. The spec itself is
``plan/spec.py``'s and a ``--config`` file ``plan/config_file.py``'s; their names are importable
from here too, as they were when this module held them."""

from __future__ import annotations

import itertools

from cascade_repro import twin as twins
from cascade_repro.engines import get as engine_info
from cascade_repro.plan.config_file import config_values, load_toml, read_config_text, run_settings
from cascade_repro.plan.spec import (
    ARM_SWITCHES,
    CONFIG_KEYS,
    ENGINES,
    FAIL_ON,
    FAIL_ON_DEFAULT,
    FIELDS,
    HASHED_TOPK,
    RUN_KEYS,
    TOML_ALIASES,
    TOML_KEYS,
    MatrixSpec,
    check_fail_on,
    flag_name,
    spec_hash,
    spec_of,
    toml_key,
)
from cascade_repro.plan.values import (
    parse_fa_list,
    parse_hf_overrides,
    parse_int_list,
    parse_onoff_list,
    split_list,
)

# Names callers import from here, held now by the spec's, the config file's and the values' modules.
__all__ = [
    "ARM_SWITCHES", "CONFIG_KEYS", "ENGINES", "FAIL_ON", "FAIL_ON_DEFAULT", "FIELDS", "HASHED_TOPK", "RUN_KEYS",
    "TOML_ALIASES", "TOML_KEYS", "MatrixSpec", "calibration_fault", "check_fail_on", "config_values", "flag_name",
    "load_toml", "parse_fa_list", "parse_hf_overrides", "parse_int_list", "parse_onoff_list", "plan", "plan_twin",
    "plan_warnings", "read_config_text", "run_settings", "spec_hash", "spec_of", "split_list", "toml_key",
]  # fmt: skip
from cascade_repro.plan.waves import control_batch, noise_control_batch, repeated_batches
from cascade_repro.rundir.cells import Cell, EnginePlan, Plan
from cascade_repro.vllm_surface import inject as inj


def _engine_key(
    engine: str, tp: int, seed: int, dtype: str, fa: int | None, backend: str, arm: str | None
) -> str:
    parts = [engine, f"tp{tp}", dtype]
    if engine_info(engine).attention_axes:  # the hf engine has no FlashAttention version or backend
        parts += [f"fa{fa or 'default'}", backend.lower().replace("_", "")]
    parts.append(f"s{seed}")
    if arm:
        parts.append(arm)
    return "-".join(parts)


def plan_warnings(spec: MatrixSpec, n_prompts: int) -> list[str]:
    """What the planner changed or could not do for this prompt count, in one line each: the batch
    sizes dropped as repeats of another's one wave, a noise control moved off its pair's wave, or no
    control at all. ``plan(spec, n_prompts)`` acts on the same rules; a run of several twins: each
    twin's, each line once."""
    if len(spec.twin_axes) > 1:
        lines = [w for t in spec.twin_axes for w in plan_warnings(spec.for_twin(t.name), n_prompts)]
        return list(dict.fromkeys(lines))
    tw = spec.twin_axis
    if tw.axis == "batch":  # the twin's own batches are its arms, not the matrix's axis
        return []
    out = []
    dropped = repeated_batches(spec.batch, n_prompts)
    if dropped:
        keep = min(b for b in spec.batch if b >= n_prompts)
        sizes = ", ".join(map(str, dropped))
        out.append(
            f"--batch {sizes}: at or above the {n_prompts} prompts, {'it runs' if len(dropped) == 1 else 'each runs'} "
            f"every prompt in one wave, as batch {keep} does (the rest of the wave repeats prompts), so "
            f"{'its cells' if len(dropped) == 1 else 'their cells'} would repeat batch {keep}'s wave: dropped from "
            "the plan; more prompts (--limit) test larger batches"
        )
    batches = [b for b in dict.fromkeys(spec.batch) if b not in dropped]
    rerun_control = (
        engine_info(spec.engine).attention_axes and spec.arm_switch == "restart"
    ) or not tw.toggle
    arms = [tw.arm(c) for c in spec.cascade]
    if spec.auto_controls and tw.test in arms and tw.ref in arms and not rerun_control and len(batches) == 1:
        b = batches[0]
        c = noise_control_batch(b, n_prompts)
        if c is None:
            out.append(
                f"no noise control: with {n_prompts} prompt every batch size runs the same one wave, so a "
                "flat-vs-flat control would measure nothing; the minimum effect has no control (the tests alone decide)"
            )
        elif c != control_batch(b):
            out.append(
                f"noise control at batch {c}, not {control_batch(b)}: batch {control_batch(b)} and batch {b} both run "
                f"all {n_prompts} prompts in one wave (the larger only adds repeats), so that control would compare "
                "a wave with the same wave and measure nothing"
            )
    return out


def calibration_fault(tw: twins.TwinAxis) -> str:
    """The fault a twin's calibration ladder injects: an LSE shift inside cascade's merge, or, for a
    twin whose test arm runs no cascade merge, the attention output scaled on the test arm whatever
    its setting."""
    return inj.LSE_SHIFT if tw.family == twins.CASCADE.family else inj.OUT_SCALE


def plan(spec: MatrixSpec, n_prompts: int | None = None) -> Plan:
    """Return the plan: engine plans keyed by engine key, each with its cells in run order.

    A run of one twin is :func:`plan_twin`'s plan. A run of several (``--twin a,b``) plans each
    twin as a run of its own would and merges the plans (:func:`merge_twins`): a cell whose engine
    configuration, batch, rerun and fault another twin's cell already has is not run twice but
    serves both (its ``twins`` map says under which arm name each twin reads it).
    """
    axes = spec.twin_axes
    if len(axes) == 1:
        return plan_twin(spec, axes[0], n_prompts)
    from cascade_repro.plan.twin_set import merge_twins

    return merge_twins([(tw, plan_twin(spec, tw, n_prompts, several=True)) for tw in axes])


def plan_twin(
    spec: MatrixSpec, tw: twins.TwinAxis, n_prompts: int | None = None, several: bool = False
) -> Plan:
    """The plan of one twin (:func:`plan`); ``several``: one of a run's several twins, whose engine
    toggling the arms is keyed by the twin too (another toggled twin's engine is another engine).

    The hf engine always toggles arms inside one model; vLLM does so unless ``arm_switch`` is
    ``restart``, in which case each arm gets its own engine (the real ``disable_cascade_attn`` flag)
    and a flat rerun is its own engine start too.

    Every cascade pair needs a noise control, so with ``auto_controls`` the planner adds what the
    matrix lacks: under ``toggle`` a flat cell at ``control_batch(B)`` when the matrix has one batch
    size only; under ``restart`` (twins from two engine starts) a flat rerun in a third engine start,
    so the control spans engine starts as the pair does. ``calibrate`` adds, beside every clean
    cascade cell, one cascade cell per shift of the ladder (``lse-shift=X``).

    With ``n_prompts`` (the run's prompt count), a batch that would repeat another's one wave is
    dropped (``repeated_batches``) and the added control kept off its pair's wave
    (``noise_control_batch``); ``plan_warnings`` says so in words. Without it, every batch is planned.
    """
    varying = {
        "seed": len(spec.seeds) > 1,
        "dtype": len(spec.dtypes) > 1,
        "fa": len(spec.fa_versions) > 1,
        "backend": len(spec.backends) > 1,
    }
    # An arm with engine arguments of its own is an engine start of its own; so is every arm under
    # restart (the real disable_cascade_attn flag) and a twin's rerun control.
    restart = (engine_info(spec.engine).attention_axes and spec.arm_switch == "restart") or not tw.toggle
    arms = [tw.arm(c) for c in spec.cascade]
    engines: dict[str, EnginePlan] = {}
    cells: dict[str, Cell] = {}

    def add(axes: tuple, batch: int, arm: str, r: int, inject: str | None, origin: str) -> None:
        tp, seed, dtype, fa, backend = axes
        # Under restart a flat rerun is an engine start of its own: a rerun inside one engine is
        # bitwise identical, so only a second start measures what two starts differ by.
        # A batch twin's reference arm has no other batch to be controlled by: its rerun is one too.
        key_arm = (arm + ("-r1" if r else "")) if restart or (r and tw.axis == "batch") else None
        key = _engine_key(spec.engine, tp, seed, dtype, fa, backend, key_arm)
        if several and key_arm is None:
            key += f"-{tw.test}+{tw.ref}"
        ep = engines.get(key) or engines.setdefault(
            key,
            # Built with ``of``: run.json writes every field, ``arm: null`` too.
            EnginePlan.of(key=key, tp=tp, seed=seed, dtype=dtype, fa_version=fa, backend=backend,
                          arm=arm if key_arm else None, cells=[]),
        )  # fmt: skip
        parts = [f"tp{tp}", f"b{batch}", arm]
        if varying["seed"]:
            parts.append(f"s{seed}")
        if varying["dtype"]:
            parts.append(dtype)
        if varying["fa"]:
            parts.append(f"fa{fa or 'default'}")
        if varying["backend"]:
            parts.append(backend.lower())
        if r:
            parts.append(f"r{r}")
        if origin == "calibration" and inject:
            parts.append(
                ("shift" if inject.startswith(inj.LSE_SHIFT) else "scale") + inject.partition("=")[2]
            )
        cell_id = "-".join(parts)
        ep.cells.append(cell_id)
        cells[cell_id] = Cell.of(cell_id=cell_id, engine_key=key, tp=tp, batch=batch, arm=arm, rerun=r, seed=seed,
                                 dtype=dtype, fa_version=fa, backend=backend, inject=inject, origin=origin)  # fmt: skip

    def on_arm(axes: tuple, batch: int, arm: str) -> tuple[tuple, int]:
        """The axes and batch of ``arm``'s cell: a twin that differs in tp, backend or batch sets it."""
        tp, seed, dtype, fa, backend = axes
        v = tw.axis_value(arm)
        if tw.axis == "tp":
            tp = int(v)  # type: ignore[arg-type]
        elif tw.axis == "backend":
            backend = str(v)
        elif tw.axis == "batch":
            batch = int(v)  # type: ignore[arg-type]
        return (tp, seed, dtype, fa, backend), batch

    def add_arm(axes: tuple, batch: int, arm: str, r: int, inject: str | None, origin: str) -> None:
        add(*on_arm(axes, batch, arm), arm, r, inject, origin)

    tps = [tw.ref_value] if tw.axis == "tp" else spec.tp
    backends = [tw.ref_value] if tw.axis == "backend" else spec.backends
    dropped = repeated_batches(spec.batch, n_prompts)
    batches = [tw.test_value] if tw.axis == "batch" else [b for b in spec.batch if b not in dropped]
    # A twin whose reference arm is a batch size of its own gets its control from a second engine
    # start at that batch: another batch size is what its test arm already is.
    rerun_control = restart or tw.axis == "batch"
    rung = calibration_fault(tw)
    for axes in itertools.product(tps, spec.seeds, spec.dtypes, spec.fa_versions, backends):
        for batch in batches:
            for arm in arms:
                for r in [0, 1] if (spec.rerun and arm == tw.ref) else [0]:
                    add_arm(axes, batch, arm, r, spec.inject if arm == tw.test else None, "matrix")
                if arm == tw.test:
                    for x in spec.calibrate:
                        add_arm(axes, batch, arm, 0, inj.Injection(rung, x).label, "calibration")
        if not (spec.auto_controls and tw.test in arms and tw.ref in arms):
            continue
        if rerun_control and not spec.rerun:
            for batch in batches:
                add_arm(axes, batch, tw.ref, 1, None, "control")
        elif not rerun_control and len(batches) == 1:
            if (c := noise_control_batch(batches[0], n_prompts)) is not None:
                add_arm(axes, c, tw.ref, 0, None, "control")
    return Plan(engines=engines, cells=[cells[i] for ep in engines.values() for i in ep.cells])
