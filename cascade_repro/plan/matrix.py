"""Matrix specification → cells, grouped by engine key so one engine serves all its batch sizes."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import itertools
import json
import re
import tomllib
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from cascade_repro import twin as twins
from cascade_repro import vllm_surface
from cascade_repro.engines import ENGINES as ENGINE_REGISTRY
from cascade_repro.engines import get as engine_info
from cascade_repro.engines.base import DEFAULT_TOPK, MAX_TOPK
from cascade_repro.errors import UsageError
from cascade_repro.plan.waves import control_batch, noise_control_batch, repeated_batches
from cascade_repro.rundir.cells import Cell, EnginePlan, Plan
from cascade_repro.twin import CASCADE as TWIN
from cascade_repro.vllm_surface import inject as inj

ENGINES = tuple(ENGINE_REGISTRY)
INJECTIONS = ("lse-layout", "lse-shift=X", "out-scale=E")  # as --help and error messages spell them
ARM_SWITCHES = ("toggle", "restart")
DTYPES = ("auto", "float32", "float16", "bfloat16")
# ``expected``: a regression fails the run even where the twin changes results by design (an FP8
# KV cache), which ``regression`` reports without failing on.
FAIL_ON = ("regression", "error", "never", "expected")
FAIL_ON_DEFAULT = "regression"  # matrix, report and merge

# The fields that hold a list (a TOML file may give one value for them).
LIST_FIELDS = ("tp", "batch", TWIN.spec_field, "seeds", "dtypes", "fa_versions", "backends")

# Bounds that catch a typo before the estimate prints it as hours in twenty digits, or a value
# reaches torch, numpy or parquet as an integer they cannot hold. The check against the model's
# context is the run's own, once the tokenizer is loaded.
MAX_TOKENS = 1 << 20  # tokens generated per prompt: above any model's context the engines serve
MAX_MODEL_LEN = 1 << 24
MAX_AXIS = 1 << 16  # a batch size or a TP size
MAX_SEED = (1 << 32) - 1  # numpy's and vLLM's seeds are 32-bit


def check_fail_on(fail_on: str) -> None:
    """A one-line UsageError for a ``--fail-on`` value matrix, report and merge do not know."""
    if fail_on not in FAIL_ON:
        raise UsageError(f"--fail-on must be one of {', '.join(FAIL_ON)}, not {fail_on!r}")


@dataclass
class MatrixSpec:
    """Everything that defines a matrix run. Lists are axes; scalars apply to every cell."""

    engine: str = "hf"
    model: str = "embedded"
    prompts: str = "ko-ifeval-style"
    system_prompt: str = "ko"
    limit: int | None = None
    # Columns of a local or Hub prompt set holding the prompt and the key (None: "prompt"; "key",
    # else "id"); see promptsets.Columns.
    prompt_field: str | None = None
    key_field: str | None = None
    # The setting the test arm differs in from its twin (twin.py's registry, as --twin spells it).
    twin: str = TWIN.name
    tp: list[int] = field(default_factory=lambda: [1])
    batch: list[int] = field(default_factory=lambda: [1, 8, 16])
    cascade: list[bool] = field(default_factory=lambda: [True, False])
    seeds: list[int] = field(default_factory=lambda: [0])
    dtypes: list[str] = field(default_factory=lambda: ["auto"])
    fa_versions: list[int | None] = field(default_factory=lambda: [None])
    backends: list[str] = field(default_factory=lambda: ["FLASH_ATTN"])
    rerun: bool = False
    max_tokens: int = 64
    # Generate max_tokens for every request even past an end-of-sequence token: every wave then
    # keeps its batch size for all its decode steps (what FA2's split-KV band needs, see splitkv.py).
    ignore_eos: bool = False
    # vLLM: the cascade arm takes cascade on every step where vLLM's hard conditions allow it (shared
    # prefix >= 256 tokens, >= 8 requests, no ALiBi/sliding window), overriding the decode cost
    # model, to measure what cascade costs where the heuristic would decline it (explain --measure).
    force_cascade: bool = False
    topk: int = DEFAULT_TOPK
    inject: str | None = None
    calibrate: list[float] = field(default_factory=list)
    auto_controls: bool = True
    arm_switch: str = "toggle"
    enforce_eager: bool = False
    graphs_for_batches: bool = False
    load_format: str = "auto"
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    # Any other vLLM engine argument (block_size, kv_cache_dtype, quantization, ...), the same for
    # both arms; checked by engine_args.py.
    engine_args: dict[str, Any] = field(default_factory=dict)
    # Sampling penalties every arm's requests carry (repetition_penalty, frequency_penalty,
    # presence_penalty; plan/sampling.py), applied by vLLM's sampler and by the reference pass alike.
    sampling: dict[str, float] = field(default_factory=dict)
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.5
    trust_remote_code: bool = False
    engine_timeout: float = 1800.0
    device: str = "auto"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def twin_axes(self) -> tuple[twins.TwinAxis, ...]:
        """The registry's entries ``twin`` names (``a,b,c``: several), resolved once (``twin`` stays
        the text run.json keeps; a spec from before --twin: cascade). A ValueError for a name the
        registry does not know."""
        text = self.twin or TWIN.name
        hit = self.__dict__.get("_twin_axes")
        if hit is None or hit[0] != text:
            hit = self.__dict__["_twin_axes"] = (text, twins.resolve_list(text))
        return hit[1]

    @property
    def twin_axis(self) -> twins.TwinAxis:
        """The run's one twin; of a run of several, the first (each engine's worker reads its own
        from the spec narrowed to it: :meth:`for_twin`)."""
        return self.twin_axes[0]

    def for_twin(self, name: str) -> MatrixSpec:
        """This spec narrowed to one of its twins: what an engine of that twin is built from."""
        return dataclasses.replace(self, twin=name)

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], source: str = "config", flags: Collection[str] | None = None
    ) -> MatrixSpec:
        """Build and validate a spec from field values (a TOML file's, with flags over them).

        ``source`` and ``flags`` name the values in errors as ``validate`` does.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            hints = [m for k in unknown for m in difflib.get_close_matches(k, CONFIG_KEYS, n=1, cutoff=0.75)]
            hint = f" (did you mean {', '.join(dict.fromkeys(hints))}?)" if hints else ""
            raise UsageError(
                f"{source}: unknown key(s) {', '.join(unknown)}{hint}; known: {', '.join(CONFIG_KEYS)}"
            )
        spec = cls(**data)
        spec.validate(source, flags)
        return spec

    def validate(self, source: str = "options", flags: Collection[str] | None = None) -> None:
        """Raise UsageError on the first invalid value, naming it the way the user gave it.

        ``source`` is ``"options"`` (every value came from command-line flags) or the TOML file the
        values came from, with ``flags`` the fields given as flags over it. A flag's value is named
        by the flag (``--max-tokens must be a positive integer, got 0``), a file's by the file and
        its key (``m.toml: max_tokens must be a positive integer, got 0``).
        """
        given = set(FIELDS) if source == "options" else set(flags or ())

        def n(field_: str) -> str:
            return flag_name(field_) if field_ in given else toml_key(field_)

        def setting(field_: str, value: str, toml: str | None = None) -> str:
            """How to set a field: ``--engine vllm``, or ``engine = "vllm"`` in the file."""
            return (
                f"{flag_name(field_)} {value}" if field_ in given else f"{toml_key(field_)} = {toml or value}"
            )

        use_vllm = setting("engine", "vllm", '"vllm"')
        both_arms = setting(TWIN.spec_field, "on,off", '["on", "off"]')

        def bad(msg: str, *fields: str) -> NoReturn:
            in_file = source != "options" and (not fields or any(f not in given for f in fields))
            raise UsageError(f"{source}: {msg}" if in_file else msg)

        if self.engine not in ENGINES:
            bad(f"{n('engine')} must be one of {', '.join(ENGINES)}, not {show(self.engine)}", "engine")
        if not isinstance(self.twin, str):
            bad(f"{n('twin')} must be a name such as prefix-caching, got {show(self.twin)}", "twin")
        try:
            # ``all`` that the command line did not expand with this machine's GPUs (tp left out).
            from cascade_repro.plan.twin_set import expand

            batches = self.batch if isinstance(self.batch, list) else []
            version = vllm_surface.installed_version() if engine_info(self.engine).is_vllm else None
            self.twin = expand(self.twin, self.engine, batches, version)[0]
            axes = self.twin_axes
        except ValueError as e:
            bad(str(e).replace("--twin", n("twin"), 1), "twin")
        self.twin = twins.LIST_SEP.join(t.name for t in axes)
        for tw in axes:
            self._check_twin(tw, n, use_vllm, bad)
        tw = axes[0]
        self._check_fields(tw, n, setting, use_vllm, both_arms, bad)

    def _check_twin(self, tw: twins.TwinAxis, n: Any, use_vllm: str, bad: Any) -> None:
        """What one twin asks of the rest of the spec (part of :meth:`validate`)."""
        if self.engine not in tw.engines:
            bad(f"{n('twin')} {tw.name} needs the vllm engine (the {self.engine} engine serves "
                f"{', '.join(t.name for t in twins.all_examples() if self.engine in t.engines)}; "
                f"use {use_vllm})", "twin", "engine")  # fmt: skip
        given_args = self.engine_args if isinstance(self.engine_args, dict) else {}
        if clash := sorted(set(given_args) & {k for a in tw.arms for k in tw.engine_args(a)}):
            bad(
                f"{n('engine_args')} {', '.join(clash)}: {n('twin')} {tw.name} sets it per arm",
                "engine_args",
                "twin",
            )
        if tw.axis is not None and len(self.twin_axes) == 1:
            # The twin sets this axis itself: a list given beside it would be ignored without a word.
            # Beside other twins the list is theirs (``--twin all --batch 8,64``: batch=1:64 and the
            # others at 8 and 64).
            own = {"tp": "tp", "batch": "batch", "backend": "backends"}[tw.axis]
            default = getattr(MatrixSpec(), own)
            if getattr(self, own) not in (default, [tw.test_value]):
                bad(f"{n('twin')} {tw.name} sets the {tw.axis} of each arm ({tw.ref_value} and "
                    f"{tw.test_value}): drop {n(own)}", "twin", own)  # fmt: skip
        batches = self.batch if isinstance(self.batch, list) and self.batch else [0]
        if tw.family == twins.CHUNKED_PREFILL.family and all(isinstance(b, int) for b in batches):
            # vLLM refuses a step budget below max_num_seqs, which the twin sets to the largest batch.
            if max(batches) > twins.CHUNK_TOKENS:
                bad(f"{n('twin')} {tw.name} prefills in {twins.CHUNK_TOKENS}-token steps, which vLLM allows up "
                    f"to batch {twins.CHUNK_TOKENS}: {n('batch')} {show(self.batch)}", "twin", "batch")  # fmt: skip

    def _check_fields(self, tw: twins.TwinAxis, n: Any, setting: Any, use_vllm: str, both_arms: str,
                      bad: Any) -> None:  # fmt: skip
        """Every field's own check (part of :meth:`validate`; ``tw``: the run's first twin)."""
        # A config file can hold any TOML type: a number where a name belongs would surface as a
        # traceback, and a string "false" is truthy (trust_remote_code = "false" would trust).
        for name in ("model", "prompts", "system_prompt", "load_format", "device"):
            if not isinstance(getattr(self, name), str):
                bad(f"{n(name)} must be a string, got {show(getattr(self, name))}", name)
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            bad(f"{n('device')} must be auto, cpu, cuda or cuda:N, not {show(self.device)}", "device")
        for name in ("prompt_field", "key_field"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                bad(f"{n(name)} must name a column, got {show(v)}", name)
        for name in ("rerun", "enforce_eager", "graphs_for_batches", "trust_remote_code", "auto_controls",
                     "ignore_eos", "force_cascade"):  # fmt: skip
            if not isinstance(getattr(self, name), bool):
                bad(f"{n(name)} must be true or false, got {show(getattr(self, name))}", name)
        if not isinstance(self.hf_overrides, dict):
            bad(f"{n('hf_overrides')} must be a table of config overrides, got {show(self.hf_overrides)}",
                "hf_overrides")  # fmt: skip
        for key in (*vllm_surface.KV_HEAD_KEYS, "num_attention_heads"):
            v = self.hf_overrides.get(key)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                bad(f"{n('hf_overrides')} {key} must be a positive integer, got {show(v)}", "hf_overrides")
        if not isinstance(self.engine_args, dict):
            bad(f"{n('engine_args')} must be a table of vLLM engine arguments, got {show(self.engine_args)}",
                "engine_args")  # fmt: skip
        if self.engine_args and not engine_info(self.engine).is_vllm:
            bad(f"{n('engine_args')} are vLLM engine arguments; the {self.engine} engine takes none "
                f"(use {use_vllm})", "engine_args", "engine")  # fmt: skip
        if self.sampling:
            from cascade_repro.vllm_surface import sampling as samp

            why = samp.problem(self.sampling)
            if why is not None:
                bad(f"{n('sampling')} {why}", "sampling")
            if not engine_info(self.engine).is_vllm:
                bad(f"{n('sampling')} penalties are applied by vLLM's sampler; the {self.engine} engine has "
                    f"none to apply them (use {use_vllm})", "sampling", "engine")  # fmt: skip
        for name in LIST_FIELDS:
            val = getattr(self, name)
            if not isinstance(val, list) or not val:
                bad(f"{n(name)} must be a non-empty list", name)
            norm = [v.upper() if isinstance(v, str) else repr(v) for v in val]
            if len(set(norm)) != len(val):
                bad(f"{n(name)} has duplicate values: {show(val)}", name)
        if not all(isinstance(b, str) for b in self.backends):
            bad(f"{n('backends')} must be names such as FLASH_ATTN, got {show(self.backends)}", "backends")
        self.backends = [b.upper() for b in self.backends]
        for name in ("tp", "batch"):
            for v in getattr(self, name):
                if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                    bad(f"{n(name)} values must be positive integers, got {show(v)}", name)
                if v > MAX_AXIS:
                    bad(f"{n(name)} values must be at most {MAX_AXIS:,}, got {show(v)}", name)
        if self.engine_args:
            from cascade_repro.plan import engine_args as eargs

            try:
                eargs.check(self.engine_args, max(self.batch))
            except UsageError as e:
                bad(str(e).removeprefix("options: "), "engine_args")
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SEED for v in self.seeds):
            # vLLM's SamplingParams reads a seed of -1 as no seed at all; torch seeds with it.
            bad(f"{n('seeds')} values must be integers from 0 to {MAX_SEED}, got {show(self.seeds)}", "seeds")
        if not all(isinstance(c, bool) for c in self.cascade):
            bad(f"{n(TWIN.spec_field)} values must be on/off, got {show(self.cascade)}", TWIN.spec_field)
        for d in self.dtypes:
            if d not in DTYPES:
                bad(f"{n('dtypes')} must be one of {', '.join(DTYPES)}, not {show(d)}", "dtypes")
        for fa in self.fa_versions:
            if fa not in (None, 2, 3, 4):
                bad(f"{n('fa_versions')} must be 2, 3, 4 or default, not {show(fa)}", "fa_versions")
        if self.limit is not None and (
            not isinstance(self.limit, int) or isinstance(self.limit, bool) or self.limit <= 0
        ):
            bad(f"{n('limit')} must be a positive integer, got {show(self.limit)}", "limit")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens <= 0:
            bad(f"{n('max_tokens')} must be a positive integer, got {show(self.max_tokens)}", "max_tokens")
        if self.max_tokens > MAX_TOKENS:
            bad(
                f"{n('max_tokens')} must be at most {MAX_TOKENS:,}, got {show(self.max_tokens)}", "max_tokens"
            )
        if self.force_cascade and not engine_info(self.engine).cost_model:
            bad(f"{n('force_cascade')} overrides vLLM's cost model; the {self.engine} engine has none "
                f"(use {use_vllm})", "force_cascade", "engine")  # fmt: skip
        mml = self.max_model_len
        if mml is not None and (not isinstance(mml, int) or isinstance(mml, bool) or mml <= 0):
            bad(f"{n('max_model_len')} must be a positive integer, got {show(mml)}", "max_model_len")
        if mml is not None and mml > MAX_MODEL_LEN:
            bad(f"{n('max_model_len')} must be at most {MAX_MODEL_LEN:,}, got {show(mml)}", "max_model_len")
        if not isinstance(self.topk, int) or isinstance(self.topk, bool) or not 1 <= self.topk <= MAX_TOPK:
            bad(f"{n('topk')} must be between 1 and {MAX_TOPK}, got {show(self.topk)}", "topk")
        if self.inject is not None:
            if not isinstance(self.inject, str):
                bad(
                    f"{n('inject')} must be one of {', '.join(INJECTIONS)}, not {show(self.inject)}", "inject"
                )
            try:
                parsed = inj.parse(self.inject)
            except ValueError as e:
                bad(f"{n('inject')}: {e}", "inject")
            self.inject = parsed.label if parsed else None
        if not isinstance(self.calibrate, list) or not all(
            isinstance(x, int | float) and not isinstance(x, bool) and 0 < x <= 100 for x in self.calibrate
        ):
            bad(f"{n('calibrate')} must be a list of shifts in (0, 100] nats, got {show(self.calibrate)}",
                "calibrate")  # fmt: skip
        if len(set(self.calibrate)) != len(self.calibrate):
            bad(f"{n('calibrate')} has duplicate shifts: {show(self.calibrate)}", "calibrate")
        self.calibrate = sorted(float(x) for x in self.calibrate)
        if self.calibrate and self.inject:
            bad(f"{n('calibrate')} runs its own ladder of lse-shift injections beside the clean cells: "
                f"drop {n('inject')}", "calibrate", "inject")  # fmt: skip
        if self.calibrate and True not in self.cascade:
            bad(
                f"{n('calibrate')} needs the {tw.test} arm ({both_arms})",
                "calibrate",
                TWIN.spec_field,
            )
        if self.arm_switch not in ARM_SWITCHES:
            bad(f"{n('arm_switch')} must be one of {', '.join(ARM_SWITCHES)}, not {show(self.arm_switch)}",
                "arm_switch")  # fmt: skip
        if not engine_info(self.engine).tensor_parallel and any(t != 1 for t in self.tp):
            bad(f"the {self.engine} engine runs on one device: use {setting('tp', '1')} (tensor parallelism "
                f"needs {use_vllm})", "tp", "engine")  # fmt: skip
        for name in ("engine_timeout", "gpu_memory_utilization"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or isinstance(v, bool):
                bad(f"{n(name)} must be a number, got {show(v)}", name)
        if not self.engine_timeout > 0:  # NaN too: it would never time out
            bad(f"{n('engine_timeout')} must be positive, got {show(self.engine_timeout)}", "engine_timeout")
        if not 0 < self.gpu_memory_utilization <= 1:
            bad(f"{n('gpu_memory_utilization')} must be in (0, 1], got {show(self.gpu_memory_utilization)}",
                "gpu_memory_utilization")  # fmt: skip


FIELDS = tuple(f.name for f in dataclasses.fields(MatrixSpec))
# A --config TOML file's keys for the fields whose flag is singular (load_toml also takes the field
# names themselves, and dashes for underscores).
TOML_ALIASES = {"seed": "seeds", "dtype": "dtypes", "fa_version": "fa_versions", "backend": "backends"}
_KEY_OF = {field_: key for key, field_ in TOML_ALIASES.items()}


def toml_key(field_: str) -> str:
    """The key a --config TOML file sets a MatrixSpec field by, as the README spells it: ``fa_version``."""
    return _KEY_OF.get(field_, field_)


def flag_name(field_: str) -> str:
    """The command-line flag of a MatrixSpec field: ``--fa-version`` for ``fa_versions``."""
    return "--" + toml_key(field_).replace("_", "-")


TOML_KEYS = tuple(sorted(toml_key(f) for f in FIELDS))
# The matrix command's options that are not the matrix's (its verdicts, where it goes, how it is
# told), which a --config file sets too, with the type each must have. Its one-off actions are not
# settings: a file that held `fresh = true` would discard the run on every invocation.
RUN_KEYS: dict[str, type] = {
    "fail_on": str, "alpha": float, "rep_delta": float, "min_topk_violations": int, "drift_min": float,
    "reference": str, "reference_device": str, "results_dir": str, "run_id": str, "shard": str,
    "allow_mixed": bool, "quiet": bool, "executor": str, "ray_address": str, "retries": int,
    "max_engines_per_gpu": int,
}  # fmt: skip
ONE_OFF_KEYS = ("config", "dry_run", "fresh")
CONFIG_KEYS = tuple(sorted((*TOML_KEYS, *RUN_KEYS)))


def run_settings(values: dict[str, Any], source: str) -> dict[str, Any]:
    """Take the :data:`RUN_KEYS` out of a config file's values (what :func:`load_toml` read), each
    checked for its type; a one-off action (``fresh``) there is a one-line UsageError."""
    out: dict[str, Any] = {}
    for key in ONE_OFF_KEYS:
        if key in values:
            raise UsageError(f"{source}: {key} is a one-off action, not a setting: give --{key.replace('_', '-')} "
                             "on the command line")  # fmt: skip
    for key, kind in RUN_KEYS.items():
        if key not in values:
            continue
        v = values.pop(key)
        if kind is float:
            ok = isinstance(v, int | float) and not isinstance(v, bool)
        elif kind is int:
            ok = isinstance(v, int) and not isinstance(v, bool)
        else:
            ok = isinstance(v, kind)
        if not ok:
            want = {str: "a string", float: "a number", int: "an integer", bool: "true or false"}[kind]
            raise UsageError(f"{source}: {key} must be {want}, got {show(v)}")
        out[key] = v
    return out


def show(value: Any) -> str:
    """A value as an error message shows it: text quoted, lists comma-separated, tables as JSON,
    true/false as TOML spells them; never a Python repr of a list or dict."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "nothing"
    if isinstance(value, list | tuple):
        return ", ".join(show(v) for v in value) if value else "an empty list"
    if isinstance(value, dict):
        text = json.dumps(value, ensure_ascii=False, default=str)
        # JSON leaves U+0085, U+2028 and the like raw, and they break a one-line error: escape them.
        return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    if isinstance(value, str):
        return repr(value)
    return str(value)


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


def read_config_text(path: Path) -> str:
    """A ``--config`` file's text (TOML or YAML): the one place a config file is read."""
    raw = read_config_bytes(path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 at byte {e.start}") from None


def read_config_bytes(path: Path) -> bytes:
    """A ``--config`` file's bytes. A device (/dev/zero, read until memory runs out) or a FIFO
    (which blocks until a writer comes) is refused before it is opened, as ``--prompts`` refuses it."""
    import stat

    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise UsageError(f"config file not found: {path}") from None
    except OSError as e:
        raise UsageError(f"cannot read config file {path}: {e.strerror}") from None
    if stat.S_ISDIR(mode):
        raise UsageError(f"config file {path} is a folder, not a file")
    if not stat.S_ISREG(mode):
        raise UsageError(f"config file {path} is not a regular file (a device, a pipe or a socket)")
    try:
        return path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read config file {path}: {e.strerror}") from None


def load_toml(path: Path) -> dict[str, Any]:
    """Read a matrix TOML file (top-level keys or a [matrix] table) into MatrixSpec field values."""
    text = read_config_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise UsageError(f"{path}: invalid TOML: arrays or tables nested too deeply") from None
    if "matrix" in data:
        if not isinstance(data["matrix"], dict):
            raise UsageError(f"{path}: [matrix] must be a table")
        if outside := sorted(k for k in data if k != "matrix"):
            # Read as the [matrix] table alone, they would be dropped without a word.
            raise UsageError(
                f"{path}: {', '.join(outside)} outside [matrix]: put every setting in [matrix] or none there"
            )
        data = data["matrix"]
    return config_values(data, path)


def config_values(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """A config file's keys (TOML's, or a vLLM YAML file's once translated) as MatrixSpec field values."""
    out: dict[str, Any] = {}
    given: dict[str, str] = {}  # each setting's key as the file spelt it
    for key, v in data.items():
        k = key.replace("-", "_")
        k = TOML_ALIASES.get(k, k)
        if (first := given.setdefault(k, key)) != key:
            raise UsageError(f"{path}: {first} and {key} set the same setting: give one")
        if k in LIST_FIELDS and not isinstance(v, list):
            v = [v]
        if k == "twin" and isinstance(v, list) and all(isinstance(x, str) for x in v):
            v = twins.LIST_SEP.join(v)  # several twins, as --twin a,b spells them
        if k == TWIN.spec_field:
            v = [_parse_onoff(x, f"{path}: {TWIN.spec_field}") for x in v]
        if k == "fa_versions":
            try:
                v = parse_fa_list(",".join(str(x) for x in v), toml_key(k))
            except UsageError as e:
                raise UsageError(f"{path}: {e}") from None
        out[k] = v
    return out


def _parse_onoff(x: Any, where: str) -> bool:
    if isinstance(x, bool):
        return x
    s = str(x).strip().lower()
    # An arm's name says which value it is.
    if s in ("on", "true", "1", "yes", TWIN.test):
        return True
    if s in ("off", "false", "0", "no", TWIN.ref):
        return False
    raise UsageError(f"{where}: expected on/off, got {x!r}")


def split_list(text: str, name: str) -> list[str]:
    """The items of a comma-separated flag value, stripped; an empty item (``8,,16``, a trailing
    comma) is a one-line error, not skipped: it is a value the user meant to type and did not."""
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise UsageError(f"{name}: give at least one value")
    if not all(parts):
        raise UsageError(f"{name}: empty item in {text!r}")
    return parts


def parse_int_list(text: str, name: str) -> list[int]:
    """Parse ``"1,8,16"``; reject empty items, non-integers and values <= 0 with a one-line error."""
    out = []
    for part in split_list(text, f"--{name}"):
        try:
            v = int(part)
        except ValueError:
            raise UsageError(f"--{name}: {part!r} is not an integer") from None
        if v <= 0:
            raise UsageError(f"--{name}: values must be positive, got {v}")
        out.append(v)
    if not out:
        raise UsageError(f"--{name}: give at least one value")
    return out


def parse_onoff_list(text: str, name: str) -> list[bool]:
    return [_parse_onoff(p, f"--{name}") for p in split_list(text, f"--{name}")]


def parse_fa_list(text: str, name: str = "--fa-version") -> list[int | None]:
    """Parse ``"default,2,3"``; ``name`` is how the error names the value (a flag or a TOML key)."""
    out: list[int | None] = []
    for p in split_list(text, name):
        p = p.lower()
        if p in ("default", "auto", "none", "0"):
            out.append(None)
        elif p in ("2", "3", "4", "fa2", "fa3", "fa4"):
            out.append(int(p[-1]))
        else:
            raise UsageError(f"{name}: expected 2, 3, 4 or default, got {p!r}")
    return out


def parse_hf_overrides(text: str) -> dict[str, Any]:
    """Parse ``--hf-overrides`` JSON into a dict; any malformed input is a one-line UsageError."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--hf-overrides is not valid JSON: {e.msg} at column {e.colno}") from None
    except RecursionError:
        raise UsageError("--hf-overrides is nested too deeply") from None
    if not isinstance(value, dict):
        raise UsageError("--hf-overrides must be a JSON object")
    return value


HASHED_TOPK = 5  # the --topk default of every run id made before DEFAULT_TOPK could change


def spec_hash(spec: MatrixSpec) -> str:
    """Return a short stable hash of the spec: a resumed run must have the same one.

    Fields at their default value are left out, so a release that adds a field (with a default
    that keeps the old behaviour) does not change the hash, and with it the run id, of the
    matrices users already run: the same command still resumes.
    """
    # topk against the default every hash so far was made under, not the current one: a new default
    # (DEFAULT_TOPK) must give a new run id, never resume a run whose samples hold another top-k.
    defaults = {**MatrixSpec().to_dict(), "topk": HASHED_TOPK}
    blob = json.dumps({k: v for k, v in spec.to_dict().items() if v != defaults.get(k, object())},
                      sort_keys=True, default=str)  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def spec_of(data: Any) -> MatrixSpec:
    """A MatrixSpec from a stored spec dict, tolerant: unknown keys dropped, missing ones defaulted."""
    data = data if isinstance(data, dict) else {}
    names = {f.name for f in dataclasses.fields(MatrixSpec)}
    return MatrixSpec(**{k: v for k, v in data.items() if k in names})
