"""The matrix request: :class:`MatrixSpec` (every field that defines a run), its validation and
vocabulary (engines, dtypes, ``--fail-on``, the bounds, each field's TOML key and flag), how an
error shows a value (:func:`show`), the spec's hash (the run id's part) and a stored spec read
back (:func:`spec_of`). The planner (``plan/matrix.py``) turns a spec into cells; ``plan/config_file.py``
reads a ``--config`` file into its field values."""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, NoReturn

from cascade_repro import twin as twins
from cascade_repro import vllm_surface
from cascade_repro.engines import ENGINES as ENGINE_REGISTRY
from cascade_repro.engines import get as engine_info
from cascade_repro.engines.base import DEFAULT_TOPK, MAX_TOPK
from cascade_repro.errors import UsageError
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
    # The setting the test arm differs in from its twin (twin/'s registry, as --twin spells it).
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
