"""Matrix specification → cells, grouped by engine key so one engine serves all its batch sizes."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade_repro import inject as inj
from cascade_repro.engines import ENGINES as ENGINE_REGISTRY
from cascade_repro.engines import get as engine_info
from cascade_repro.errors import UsageError

ENGINES = tuple(ENGINE_REGISTRY)
INJECTIONS = ("lse-layout", "lse-shift=X")  # as --help and error messages spell them
ARM_SWITCHES = ("toggle", "restart")
DTYPES = ("auto", "float32", "float16", "bfloat16")
FAIL_ON = ("regression", "error", "never")


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
    topk: int = 5
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
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.5
    trust_remote_code: bool = False
    engine_timeout: float = 1800.0
    device: str = "auto"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> MatrixSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise UsageError(
                f"{source}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}"
            )
        spec = cls(**data)
        spec.validate(source)
        return spec

    def validate(self, source: str = "options") -> None:
        """Raise UsageError on the first invalid value, naming it."""

        def bad(msg: str) -> None:
            raise UsageError(f"{source}: {msg}")

        if self.engine not in ENGINES:
            bad(f"engine must be one of {', '.join(ENGINES)}, not {self.engine!r}")
        # A config file can hold any TOML type: a number where a name belongs would surface as a
        # traceback, and a string "false" is truthy (trust_remote_code = "false" would trust).
        for name in ("model", "prompts", "system_prompt", "load_format", "device"):
            if not isinstance(getattr(self, name), str):
                bad(f"{name} must be a string, got {getattr(self, name)!r}")
        for name in ("prompt_field", "key_field"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                bad(f"{name} must name a column, got {v!r}")
        for name in ("rerun", "enforce_eager", "trust_remote_code", "auto_controls"):
            if not isinstance(getattr(self, name), bool):
                bad(f"{name} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.hf_overrides, dict):
            bad(f"hf_overrides must be a table of config overrides, got {self.hf_overrides!r}")
        if not isinstance(self.engine_args, dict):
            bad(f"engine_args must be a table of vLLM engine arguments, got {self.engine_args!r}")
        if self.engine_args and not engine_info(self.engine).is_vllm:
            bad(f"engine_args are vLLM engine arguments; the {self.engine} engine takes none")
        for name in ("tp", "batch", "cascade", "seeds", "dtypes", "fa_versions", "backends"):
            val = getattr(self, name)
            if not isinstance(val, list) or not val:
                bad(f"{name} must be a non-empty list")
            norm = [v.upper() if isinstance(v, str) else repr(v) for v in val]
            if len(set(norm)) != len(val):
                bad(f"{name} has duplicate values: {val}")
        if not all(isinstance(b, str) for b in self.backends):
            bad("backends must be names such as FLASH_ATTN")
        self.backends = [b.upper() for b in self.backends]
        for name in ("tp", "batch"):
            for v in getattr(self, name):
                if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                    bad(f"{name} values must be positive integers, got {v!r}")
        if self.engine_args:
            from cascade_repro import engine_args as eargs

            try:
                eargs.check(self.engine_args, max(self.batch))
            except UsageError as e:
                bad(str(e).removeprefix("options: "))
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in self.seeds):
            bad(f"seeds must be integers, got {self.seeds!r}")
        if not all(isinstance(c, bool) for c in self.cascade):
            bad("cascade values must be on/off")
        for d in self.dtypes:
            if d not in DTYPES:
                bad(f"dtype must be one of {', '.join(DTYPES)}, not {d!r}")
        for fa in self.fa_versions:
            if fa not in (None, 2, 3, 4):
                bad(f"fa version must be 2, 3, 4 or default, not {fa!r}")
        if self.limit is not None and (
            not isinstance(self.limit, int) or isinstance(self.limit, bool) or self.limit <= 0
        ):
            bad(f"limit must be a positive integer, got {self.limit!r}")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens <= 0:
            bad(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not isinstance(self.ignore_eos, bool):
            bad(f"ignore_eos must be true or false, got {self.ignore_eos!r}")
        if not isinstance(self.force_cascade, bool):
            bad(f"force_cascade must be true or false, got {self.force_cascade!r}")
        if self.force_cascade and not engine_info(self.engine).cost_model:
            bad(f"force_cascade overrides vLLM's cost model; the {self.engine} engine has none")
        mml = self.max_model_len
        if mml is not None and (not isinstance(mml, int) or isinstance(mml, bool) or mml <= 0):
            bad(f"max_model_len must be a positive integer, got {mml!r}")
        if not isinstance(self.topk, int) or isinstance(self.topk, bool) or not 1 <= self.topk <= 20:
            bad(f"topk must be between 1 and 20, got {self.topk!r}")
        if self.inject is not None:
            if not isinstance(self.inject, str):
                bad(f"inject must be one of {', '.join(INJECTIONS)}, not {self.inject!r}")
            try:
                parsed = inj.parse(self.inject)
            except ValueError as e:
                bad(f"inject: {e}")
            self.inject = parsed.label if parsed else None
        if not isinstance(self.calibrate, list) or not all(
            isinstance(x, int | float) and not isinstance(x, bool) and 0 < x <= 100 for x in self.calibrate
        ):
            bad(f"calibrate must be a list of shifts in (0, 100] nats, got {self.calibrate!r}")
        if len(set(self.calibrate)) != len(self.calibrate):
            bad(f"calibrate has duplicate shifts: {self.calibrate}")
        self.calibrate = sorted(float(x) for x in self.calibrate)
        if self.calibrate and self.inject:
            bad("calibrate runs its own ladder of lse-shift injections beside the clean cells: drop inject")
        if self.calibrate and True not in self.cascade:
            bad("calibrate needs the cascade arm (--cascade on,off)")
        if not isinstance(self.auto_controls, bool):
            bad(f"auto_controls must be true or false, got {self.auto_controls!r}")
        if self.arm_switch not in ARM_SWITCHES:
            bad(f"arm_switch must be one of {', '.join(ARM_SWITCHES)}, not {self.arm_switch!r}")
        if not engine_info(self.engine).tensor_parallel and any(t != 1 for t in self.tp):
            bad(
                f"the {self.engine} engine runs on one device: use --tp 1 (tensor parallelism needs --engine vllm)"
            )
        for name in ("engine_timeout", "gpu_memory_utilization"):
            v = getattr(self, name)
            if not isinstance(v, int | float) or isinstance(v, bool):
                bad(f"{name} must be a number, got {v!r}")
        if not self.engine_timeout > 0:  # NaN too: it would never time out
            bad("engine_timeout must be positive")
        if not 0 < self.gpu_memory_utilization <= 1:
            bad("gpu_memory_utilization must be in (0, 1]")


ORIGINS = ("matrix", "control", "calibration")


@dataclass(frozen=True)
class Cell:
    """One (engine key, batch size, arm, rerun) combination: a set of samples over all prompts.

    ``inject`` is the fault the cascade arm runs with (None: clean). ``origin`` says why the cell
    exists: the user's matrix, a noise control the planner added, or a calibration step.
    """

    cell_id: str
    engine_key: str
    tp: int
    batch: int
    arm: str  # "cascade" | "flat"
    rerun: int
    seed: int
    dtype: str
    fa_version: int | None
    backend: str
    inject: str | None = None
    origin: str = "matrix"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class EnginePlan:
    """Everything one worker process needs: the engine to build and the cells it serves, in order."""

    key: str
    tp: int
    seed: int
    dtype: str
    fa_version: int | None
    backend: str
    arm: str | None  # None: the engine serves both arms (toggled per cell)
    cells: list[Cell] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["cells"] = [c.cell_id for c in self.cells]
        return d


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


def control_batch(batch: int) -> int:
    """The batch size of a flat noise control the planner adds: a factor 8 away (B/8, or 8B below 8).

    Another batch shape is a different-but-equivalent computation (other split-KV and tile
    choices), which is what a control must be; a rerun inside one engine is not: it is bitwise
    identical (the prefix cache is reset per wave), so it would measure no noise at all. Similar
    shapes make quiet controls (H200, FA3: flat b64 vs b32 drifted 0.8x, vs b128 0.4x as much as
    b64 vs b8), so the planner's control is far from the batch it serves.
    """
    return batch // 8 if batch >= 8 else batch * 8


def plan(spec: MatrixSpec) -> dict[str, EnginePlan]:
    """Return engine plans keyed by engine key, each with its cells in run order.

    The hf engine always toggles arms inside one model; vLLM does so unless ``arm_switch`` is
    ``restart``, in which case each arm gets its own engine (the real ``disable_cascade_attn`` flag)
    and a flat rerun is its own engine start too.

    Every cascade pair needs a noise control, so with ``auto_controls`` the planner adds what the
    matrix lacks: under ``toggle`` a flat cell at ``control_batch(B)`` when the matrix has one batch
    size only; under ``restart`` (twins from two engine starts) a flat rerun in a third engine start,
    so the control spans engine starts as the pair does. ``calibrate`` adds, beside every clean
    cascade cell, one cascade cell per shift of the ladder (``lse-shift=X``).
    """
    varying = {
        "seed": len(spec.seeds) > 1,
        "dtype": len(spec.dtypes) > 1,
        "fa": len(spec.fa_versions) > 1,
        "backend": len(spec.backends) > 1,
    }
    restart = engine_info(spec.engine).attention_axes and spec.arm_switch == "restart"
    arms = ["cascade" if c else "flat" for c in spec.cascade]
    engines: dict[str, EnginePlan] = {}

    def add(axes: tuple, batch: int, arm: str, r: int, inject: str | None, origin: str) -> None:
        tp, seed, dtype, fa, backend = axes
        # Under restart a flat rerun is an engine start of its own: a rerun inside one engine is
        # bitwise identical, so only a second start measures what two starts differ by.
        key_arm = (arm + ("-r1" if r else "")) if restart else None
        key = _engine_key(spec.engine, tp, seed, dtype, fa, backend, key_arm)
        ep = engines.get(key) or engines.setdefault(
            key, EnginePlan(key, tp, seed, dtype, fa, backend, arm if restart else None)
        )
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
            parts.append("shift" + inject.partition("=")[2])
        cell_id = "-".join(parts)
        ep.cells.append(Cell(cell_id, key, tp, batch, arm, r, seed, dtype, fa, backend, inject, origin))

    for axes in itertools.product(spec.tp, spec.seeds, spec.dtypes, spec.fa_versions, spec.backends):
        for batch in spec.batch:
            for arm in arms:
                for r in [0, 1] if (spec.rerun and arm == "flat") else [0]:
                    add(axes, batch, arm, r, spec.inject if arm == "cascade" else None, "matrix")
                if arm == "cascade":
                    for x in spec.calibrate:
                        add(axes, batch, arm, 0, inj.Injection(inj.LSE_SHIFT, x).label, "calibration")
        if not (spec.auto_controls and "cascade" in arms and "flat" in arms):
            continue
        if restart and not spec.rerun:
            for batch in spec.batch:
                add(axes, batch, "flat", 1, None, "control")
        elif not restart and len(spec.batch) == 1:
            add(axes, control_batch(spec.batch[0]), "flat", 0, None, "control")
    return engines


def all_cells(engines: dict[str, EnginePlan]) -> list[Cell]:
    return [c for ep in engines.values() for c in ep.cells]


def waves(n_prompts: int, batch: int) -> list[list[tuple[int, bool]]]:
    """Split prompt indices into waves of exactly ``batch`` requests.

    Each entry is ``(prompt_index, real)``. The last wave is topped up with filler requests taken
    cyclically from the start, so every wave runs at the batch size it is labelled with; fillers are
    generated but not recorded.
    """
    if n_prompts <= 0 or batch <= 0:
        return []
    out = []
    for start in range(0, n_prompts, batch):
        wave = [(i, True) for i in range(start, min(start + batch, n_prompts))]
        j = 0
        while len(wave) < batch:
            wave.append((j % n_prompts, False))
            j += 1
        out.append(wave)
    return out


def load_toml(path: Path) -> dict[str, Any]:
    """Read a matrix TOML file (top-level keys or a [matrix] table) into MatrixSpec field values."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"config file not found: {path}") from None
    except OSError as e:
        raise UsageError(f"cannot read config file {path}: {e.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 at byte {e.start}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: invalid TOML: {e}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise UsageError(f"{path}: invalid TOML: arrays or tables nested too deeply") from None
    if "matrix" in data:
        if not isinstance(data["matrix"], dict):
            raise UsageError(f"{path}: [matrix] must be a table")
        data = data["matrix"]
    # Friendly aliases matching the CLI flags.
    aliases = {"seed": "seeds", "dtype": "dtypes", "fa_version": "fa_versions", "backend": "backends"}
    out: dict[str, Any] = {}
    for k, v in data.items():
        k = k.replace("-", "_")
        k = aliases.get(k, k)
        if k in ("tp", "batch", "seeds", "dtypes", "fa_versions", "backends", "cascade") and not isinstance(
            v, list
        ):
            v = [v]
        if k == "cascade":
            v = [_parse_onoff(x, f"{path}: cascade") for x in v]
        if k == "fa_versions":
            try:
                v = parse_fa_list(",".join(str(x) for x in v))
            except UsageError as e:
                raise UsageError(f"{path}: {e}") from None
        out[k] = v
    return out


def _parse_onoff(x: Any, where: str) -> bool:
    if isinstance(x, bool):
        return x
    s = str(x).strip().lower()
    if s in ("on", "true", "1", "yes", "cascade"):
        return True
    if s in ("off", "false", "0", "no", "flat"):
        return False
    raise UsageError(f"{where}: expected on/off, got {x!r}")


def parse_int_list(text: str, name: str) -> list[int]:
    """Parse ``"1,8,16"``; reject non-integers and values <= 0 with a one-line error."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
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
    return [_parse_onoff(p, f"--{name}") for p in text.split(",") if p.strip()]


def parse_fa_list(text: str) -> list[int | None]:
    out: list[int | None] = []
    for p in text.split(","):
        p = p.strip().lower()
        if p in ("default", "auto", "", "none", "0"):
            out.append(None)
        elif p in ("2", "3", "4", "fa2", "fa3", "fa4"):
            out.append(int(p[-1]))
        else:
            raise UsageError(f"--fa-version: expected 2, 3, 4 or default, got {p!r}")
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


def spec_hash(spec: MatrixSpec) -> str:
    """Return a short stable hash of the spec: a resumed run must have the same one.

    Fields at their default value are left out, so a release that adds a field (with a default
    that keeps the old behaviour) does not change the hash, and with it the run id, of the
    matrices users already run: the same command still resumes.
    """
    defaults = MatrixSpec().to_dict()
    blob = json.dumps({k: v for k, v in spec.to_dict().items() if v != defaults.get(k, object())},
                      sort_keys=True, default=str)  # fmt: skip
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
