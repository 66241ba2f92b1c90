"""vLLM engine: one ``vllm.LLM`` per worker process, greedy waves, per-step top-k logprobs.

Written against vLLM 0.26.0 (``vllm/entrypoints/llm.py``, ``vllm/engine/arg_utils.py``,
``vllm/config/model.py``, ``vllm/config/attention.py``, ``vllm/config/vllm.py``,
``vllm/v1/worker/gpu_model_runner.py``), with fallbacks for older releases that have no
``attention_config`` (backend and FlashAttention version then go through ``VLLM_ATTENTION_BACKEND``
and ``VLLM_FLASH_ATTN_VERSION``).

Cascade attention in vLLM 0.26 needs all of: the V1 model runner (the V2 runner in
``vllm/v1/worker/gpu/`` has no cascade path), ``disable_cascade_attn=False`` (the default is True,
``vllm/config/model.py``), prefix caching, the FLASH_ATTN backend, a shared prefix of at least 256
tokens already in the prefix cache, and at least 8 requests in the step. Each wave therefore resets
the prefix cache and re-warms the shared prefix with one request before the wave is submitted.

Arms: with ``arm_switch="toggle"`` one engine (cascade enabled) serves both arms, and the probe
plugin (``cascade_repro/vllm_surface/probe.py``) forces ``use_cascade_attention`` to False during flat waves;
with ``"restart"`` each engine serves one arm and the flat one is started with
``disable_cascade_attn=True``.

Here: the engine (environment, arguments, probe control, wave loop). Elsewhere, re-exported: ``vllm_args.py``
(arguments not the arms', memory), ``vllm_effect.py`` (proofs of effect), ``vllm_logprobs.py`` (outputs).
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from pathlib import Path
from typing import Any

from cascade_repro import vllm_surface
from cascade_repro.engines.base import Completion, ModelLoader, WaveStats, completion_text
from cascade_repro.engines.vllm_args import (
    MIN_DEFAULT_MAX_NUM_SEQS,
    apply_gpu_share,
    auto_max_model_len,
    engine_arg_names,
)
from cascade_repro.engines.vllm_effect import RPC_TIMEOUT_S, jsonable, read_back, wave_effect
from cascade_repro.engines.vllm_logprobs import (
    completion_of,
    flat_topk,
    topk_by_position,
    topk_entries,
    uniform_topk,
    vllm_text,
)
from cascade_repro.errors import UsageError
from cascade_repro.rundir import layout
from cascade_repro.rundir.cells import EnginePlan
from cascade_repro.rundir.manifest import Manifest
from cascade_repro.twin import CASCADE as TWIN
from cascade_repro.vllm_surface import probe, sampling

# The moved names stay importable from here (engines/vllm_args.py, vllm_effect.py, vllm_logprobs.py).
__all__ = [
    "MIN_DEFAULT_MAX_NUM_SEQS",
    "RPC_TIMEOUT_S",
    "VLLMEngine",
    "build",
    "completion_of",
    "flat_topk",
    "topk_by_position",
    "topk_entries",
    "uniform_topk",
    "vllm_text",
    "wave_effect",
]


def _prepare_probe_dir(path: Path) -> None:
    """Create the probe directory for this engine and remove files left by an earlier start."""
    if path.exists():
        for p in path.iterdir():
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
    path.mkdir(parents=True, exist_ok=True)


def build(
    run: Manifest, eplan: EnginePlan, run_dir: Path | None, spec: Any, models: ModelLoader
) -> VLLMEngine:
    """The registry's builder (engines.ENGINES): the engine of one engine plan of a run, ``spec`` its
    ``plan.matrix.MatrixSpec``."""
    return VLLMEngine(run.model_path, spec, eplan, run_dir=run_dir, models=models)


class VLLMEngine:
    """One ``vllm.LLM``; arms toggled per wave through the probe, or fixed at start."""

    name = "vllm"

    def __init__(
        self,
        model_path: str,
        spec: Any,
        eplan: EnginePlan | dict[str, Any],
        run_dir: Path | str,
        *,
        models: ModelLoader,
    ) -> None:
        # ``spec`` is the run's plan.matrix.MatrixSpec and ``models`` plan/models (the worker hands
        # both over: engines/ never imports the planner); run.json's form of the engine plan is
        # converted here (tests, benchmarks).
        eplan = eplan if isinstance(eplan, EnginePlan) else EnginePlan.from_json(eplan)
        self.model_path = model_path
        self.spec = spec
        self.models = models
        self.eplan = eplan
        self.run_dir = Path(run_dir).resolve()  # spawned vLLM processes share the cwd, but be safe
        self.key = str(eplan.key or "engine")
        self.engine_arm: str | None = eplan.arm
        self.twin = spec.twin_axis
        self.topk = int(spec.topk)
        self.seed = int(eplan.seed)
        self.inject = spec.inject
        self._wave_seq = 0
        self._ctl_seq = 0
        self._rpc_ok: bool | None = None
        self._env_notes: dict[str, Any] = {}
        # Variables that configure what older vLLMs take no engine argument for (minimize's repro.py
        # sets the same ones).
        self.requested_env: dict[str, str] = {}

        # --- environment, before vLLM is imported (spawned engine/worker processes inherit it) ---
        self.probe_dir = layout.probe_dir(self.run_dir, self.key)
        _prepare_probe_dir(self.probe_dir)
        self._set_model_runner_env(vllm_surface.installed_version())
        os.environ[probe.ENV_VAR] = str(self.probe_dir)
        if self.engine_arm is not None:
            os.environ.update(self.twin.env(self.engine_arm))
        # flashinfer may be absent from slim installs; the PyTorch sampler is exact for greedy.
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        # VLLM_ENABLE_V1_MULTIPROCESSING keeps vLLM's default (on): the model runs in the engine-core
        # process (TP=1) or in worker processes (TP>1); the probe reaches them through
        # collective_rpc and its counts files.
        probe.write_control(self.probe_dir, None, False, None, self._next_ctl())

        try:
            import vllm
            from vllm import LLM
        except ImportError as e:
            raise UsageError(
                f'the vllm engine needs vLLM: pip install "{vllm_surface.VLLM_REQUIREMENT}" ({e})'
            ) from None
        self.vllm_version = getattr(vllm, "__version__", "unknown")

        backend = str(eplan.backend or "FLASH_ATTN")
        fa = eplan.fa_version
        names = engine_arg_names()
        max_batch = max([int(b) for b in spec.batch] or [1])
        kwargs: dict[str, Any] = {
            "model": model_path,
            "tensor_parallel_size": int(eplan.tp),
            "dtype": eplan.dtype or "auto",
            "seed": self.seed,
            "enable_prefix_caching": True,
            "enforce_eager": bool(spec.enforce_eager),
            "load_format": spec.load_format or "auto",
            "hf_overrides": dict(spec.hf_overrides or {}) or None,
            "gpu_memory_utilization": float(spec.gpu_memory_utilization),
            "trust_remote_code": bool(spec.trust_remote_code),
        }
        # Every wave must run as one batch: max_num_seqs >= the largest batch. vLLM's own default
        # for the LLM class is 256 (1024 on >= 70 GiB GPUs; EngineArgs.get_batch_defaults); keep it
        # unless a wave is bigger, so the engine stays configured as users run it.
        if max_batch > MIN_DEFAULT_MAX_NUM_SEQS:
            kwargs["max_num_seqs"] = max_batch
        max_model_len = spec.max_model_len or self._auto_max_model_len()
        if max_model_len:
            kwargs["max_model_len"] = int(max_model_len)
        if vllm_surface.cascade_status(self.vllm_version) == "removed" and "disable_cascade_attn" in names:
            # Kept without effect from 0.32.0 on, and passing it draws a deprecation warning: not passed.
            names = names - {"disable_cascade_attn"}
            self._env_notes["disable_cascade_attn"] = "not passed: this vLLM has no cascade attention"
        elif "disable_cascade_attn" in names:
            # On in the cascade twin's test arm and in its engine that switches it off per wave; any
            # other twin's arms set it themselves below (off), its one engine for both arms included.
            kwargs["disable_cascade_attn"] = self.engine_arm == TWIN.ref
        else:
            self._env_notes["disable_cascade_attn"] = "not an EngineArgs field in this vLLM"
        if self.twin is not TWIN:
            # The twin's own arguments for this arm, or those both arms share where one engine serves
            # both (matrix refused a user's -E that sets one).
            own = self.twin.engine_args(self.engine_arm)
            if "max_num_batched_tokens" in own:
                # vLLM wants the step budget >= max_num_seqs: the waves' size for both arms.
                kwargs["max_num_seqs"] = max(max_batch, 1)
            missing = sorted(k for k in own if k not in names and k != "disable_cascade_attn")
            if missing:
                self._env_notes["twin_args_missing"] = missing
            kwargs.update({k: v for k, v in own.items() if k in names})
        self.legacy_attention_env = "attention_config" not in names
        if not self.legacy_attention_env:
            attn: dict[str, Any] = {"backend": backend}
            if fa:
                attn["flash_attn_version"] = int(fa)
            kwargs["attention_config"] = attn
        else:
            self._set_legacy_attention_env(backend, fa)
        if spec.graphs_for_batches and not kwargs["enforce_eager"] and "compilation_config" in names:
            # Capturing graphs for the matrix's batch sizes only cuts a cold start by minutes; decode
            # steps with fewer running requests are padded up to the next captured size.
            sizes = sorted({1, *(int(b) for b in spec.batch)})
            kwargs["compilation_config"] = {"cudagraph_capture_sizes": sizes}
        if kwargs["hf_overrides"] is None:
            kwargs.pop("hf_overrides")
        self._apply_gpu_share(kwargs, names)
        if sampling.active(spec.sampling):
            # A penalty moves the logits the token is chosen from: ask for those logprobs, which the
            # reference pass computes with the same penalty (vllm_surface/sampling.py). A user's -E wins.
            key, mode = sampling.LOGPROBS_MODE
            if key in names:
                kwargs[key] = mode
            else:
                self._env_notes[key] = "not an EngineArgs field in this vLLM: logprobs are before penalties"
        # The user's engine arguments, the same for both arms (matrix validated them: none of them
        # is one the harness sets per arm or per axis); a kv_cache_memory_bytes among them wins
        # over the runner's budget.
        kwargs.update(dict(spec.engine_args or {}))
        self.requested = dict(kwargs)

        try:
            self.llm = LLM(**kwargs)
        except TypeError as e:
            if "attention_config" not in str(e) or "attention_config" not in kwargs:
                raise
            # An older vLLM without attention_config that still listed it somewhere: use the env.
            kwargs.pop("attention_config")
            self._set_legacy_attention_env(backend, fa)
            self.legacy_attention_env = True
            self.llm = LLM(**kwargs)

        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self._SamplingParams = SamplingParams
        self._TokensPrompt = TokensPrompt
        asks = vllm_surface.output_asks(vllm_surface.sampling_fields(SamplingParams))
        self.flat_logprobs = vllm_surface.FLAT_LOGPROBS in asks
        # The text decoded here, once per completion, instead of by vLLM at every step (DETOKENIZE;
        # 0.11.1 on, see output_asks: 0.10.2 keeps vLLM's text).
        self.decode_here = vllm_surface.DETOKENIZE in asks
        self._text_tokenizer: Any = None
        self.start_facts = self._check_probe()
        self.readback = self._read_back()

    # --------------------------------------------------------------------------------------
    def _apply_gpu_share(self, kwargs: dict[str, Any], names: Any) -> None:
        """Engines side by side on one GPU (``vllm_args.apply_gpu_share``)."""
        apply_gpu_share(kwargs, names, self._env_notes)

    def _set_model_runner_env(self, version: str | None) -> None:
        """Pin the V1 model runner where VLLM_USE_V2_MODEL_RUNNER picks one (the V2 runner has no
        cascade path; the twins' 0.26.0 evidence ran V1), and leave it unset where vLLM has a single
        runner: 0.34.0 removed V1 and refuses the variable at engine start unless it is 1."""
        name = "VLLM_USE_V2_MODEL_RUNNER"
        prev = os.environ.get(name)
        pin = vllm_surface.release_for(version)[0].runner_env
        if pin is not None:
            if prev not in (None, pin):
                self._env_notes[f"{name}_was"] = prev
            os.environ[name] = pin
        elif prev is not None and prev != "1":
            self._env_notes[f"{name}_was"] = prev
            del os.environ[name]

    def _set_legacy_attention_env(self, backend: str, fa: Any) -> None:
        self.requested_env = {"VLLM_ATTENTION_BACKEND": backend}
        if fa:
            self.requested_env["VLLM_FLASH_ATTN_VERSION"] = str(int(fa))
        os.environ.update(self.requested_env)

    def _next_ctl(self) -> int:
        self._ctl_seq += 1
        return self._ctl_seq

    def _auto_max_model_len(self) -> int | None:
        """Longest rendered prompt + max_tokens + 1, rounded up to 256 (``vllm_args.auto_max_model_len``)."""
        return auto_max_model_len(self.run_dir, self.spec, self.models, self.model_path)

    def _rpc(self, wave: str | None, control: dict[str, Any] | None = None) -> list[dict[str, Any]] | None:
        """Read every worker's probe counters through collective_rpc, handing ``control`` over.

        None if the RPC is unavailable (then the counts files are read).
        """
        if self._rpc_ok is False:
            return None
        try:
            res = self.llm.collective_rpc(probe.RPC_METHOD, timeout=RPC_TIMEOUT_S, args=(wave, control))
        except Exception as e:  # noqa: BLE001 - fall back to the counts files
            self._rpc_ok = False
            self._env_notes["probe_rpc_error"] = (
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
            )
            return None
        snaps = [r for r in (res or []) if isinstance(r, dict)]
        if not snaps:
            self._rpc_ok = False
            return None
        self._rpc_ok = True
        return snaps

    def _snapshots(
        self, wave: str | None, control: dict[str, Any] | None = None
    ) -> tuple[list[dict[str, Any]], str]:
        snaps = self._rpc(wave, control)
        if snaps is not None:
            return snaps, "rpc"
        if control is not None:  # the counts files are written when the workers see this control
            probe.write_control(
                self.probe_dir, **{k: control[k] for k in ("wave", "force_off", "inject", "seq", "force_on")}
            )
        time.sleep(0.05)
        # This process's own file is kept: with VLLM_ENABLE_V1_MULTIPROCESSING=0 the model runs here.
        return probe.read_count_files(self.probe_dir), "files"

    def _check_probe(self) -> dict[str, Any]:
        """Make sure the probe runs where the model runs; the toggled flat arm depends on it."""
        snaps, source = self._snapshots(None)
        facts = probe.process_facts(snaps)
        facts["source"] = source
        # Over RPC every answer comes from a model worker. From files, the probe counts as running
        # where the model runs if a FlashAttention layer was built under it, or another process
        # (the engine core or a worker) announced itself.
        me = os.getpid()
        active = (
            bool(snaps) if source == "rpc" else any(s.get("attn_impls") or s.get("pid") != me for s in snaps)
        )
        facts["active"] = active
        if not active and self.engine_arm is None:
            self.close()
            raise RuntimeError(
                "the cascade_repro vLLM plugin did not load in vLLM's engine processes, so the flat arm "
                "cannot be toggled: install this project into the same environment as vLLM (its "
                "'vllm.general_plugins' entry point registers the probe; check VLLM_PLUGINS does not "
                "exclude 'cascade_repro_probe'), or use --arm-switch restart"
            )
        return facts

    def _read_back(self) -> dict[str, Any]:
        """What the engine says it runs with (``vllm_effect.read_back``)."""
        return read_back(self.llm, self.start_facts)

    def effect(
        self, arm: str, outs: list[Any], comps: list[Completion], agg: dict[str, Any]
    ) -> dict[str, Any]:
        """A wave's proof that the twin's setting took effect (twin.effect_record)."""
        return wave_effect(self.twin, arm, self.readback, outs, comps, agg)

    # --- Engine interface ------------------------------------------------------------------
    def tokenizer(self) -> Any:
        try:
            return self.llm.get_tokenizer()
        except Exception:  # noqa: BLE001 - e.g. skip_tokenizer_init; render with transformers instead
            return self.models.load_tokenizer(self.model_path, bool(self.spec.trust_remote_code))

    def effective(self) -> dict[str, Any]:
        cfg = self.llm.llm_engine.vllm_config
        mc, pc, cc = cfg.model_config, cfg.parallel_config, cfg.cache_config
        ac = getattr(cfg, "attention_config", None)
        sc = getattr(cfg, "scheduler_config", None)
        comp = getattr(cfg, "compilation_config", None)
        # The runner class each worker reports (observed); else the config's property (0.26.0 to
        # 0.33.0), the variable, or the release's only runner (0.34.0: V2; 0.10.2: V1).
        ran = self.readback.get("model_runner") or []
        v2 = getattr(cfg, "use_v2_model_runner", None)
        if ran:
            v2 = all(".worker.gpu." in r for r in ran)
        elif not isinstance(v2, bool):
            env = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
            v2 = (
                (env.lower() in ("1", "true"))
                if env is not None
                else (vllm_surface.release_for(self.vllm_version)[0].model_runners == "v2")
            )
        if ac is not None:
            backend = getattr(ac, "backend", None)
            fa_req = getattr(ac, "flash_attn_version", None)
        else:
            backend = os.environ.get("VLLM_ATTENTION_BACKEND")
            fa_req = os.environ.get("VLLM_FLASH_ATTN_VERSION")
        facts = self.start_facts
        fa_used = facts.get("fa_versions") or []
        out = {
            "engine": "vllm",
            "vllm": self.vllm_version,
            "model_runner": "V2" if v2 else "V1",
            "model_runner_class": ran[0] if len(ran) == 1 else (ran or None),
            "dtype": jsonable(getattr(mc, "dtype", None)),
            "tp": getattr(pc, "tensor_parallel_size", None),
            "enable_prefix_caching": getattr(cc, "enable_prefix_caching", None),
            "block_size": getattr(cc, "block_size", None),
            "disable_cascade_attn": getattr(mc, "disable_cascade_attn", None),
            "attention_backend": jsonable(backend),
            "attention_config_via": "env (legacy vLLM)" if self.legacy_attention_env else "attention_config",
            "flash_attn_version_requested": jsonable(fa_req),
            "flash_attn_version": fa_used[0] if len(fa_used) == 1 else (fa_used or None),
            "attention_impls": facts.get("attn_impls", []),
            "enforce_eager": getattr(mc, "enforce_eager", None),
            "cudagraph_mode": jsonable(getattr(comp, "cudagraph_mode", None)),
            "async_scheduling": getattr(sc, "async_scheduling", None),
            "max_num_seqs": getattr(sc, "max_num_seqs", None),
            "max_model_len": getattr(mc, "max_model_len", None),
            "seed": getattr(mc, "seed", None),
            "gpu_memory_utilization": getattr(cc, "gpu_memory_utilization", None),
            # A fixed KV budget (engines side by side, or the user's -E): shown only where one was set.
            **({"kv_cache_memory_bytes": kv} if (kv := getattr(cc, "kv_cache_memory_bytes", None)) else {}),
            "arm_switch": "toggle" if self.engine_arm is None else "restart",
            "engine_arm": self.engine_arm or "both",
            "inject": self.inject or "none",
            "force_cascade": bool(self.spec.force_cascade),
            "probe": facts.get("source") if facts.get("active") else "inactive",
            "probe_procs": facts.get("procs", 0),
            "probe_patched": facts.get("patched", []),
            "probe_dir": str(self.probe_dir),
            "multiprocessing": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1"),
            "env": {
                k: os.environ[k]
                for k in (
                    "VLLM_USE_V2_MODEL_RUNNER",
                    "VLLM_USE_FLASHINFER_SAMPLER",
                    "VLLM_BATCH_INVARIANT",
                    "VLLM_ATTENTION_BACKEND",
                    "VLLM_FLASH_ATTN_VERSION",
                    "VLLM_PLUGINS",
                )
                if k in os.environ
            },
            **({"notes": self._env_notes} if self._env_notes else {}),
        }
        if facts.get("errors"):
            out["probe_errors"] = facts["errors"]
        if self.twin is not TWIN:
            # What the proof of effect reads (wave_effect), once per engine start.
            out["twin"] = self.twin.name
            out["twin_readback"] = self.readback
        return jsonable(out)

    def run_wave(
        self,
        prompts: list[list[int]],
        arm: str,
        max_tokens: int,
        prefix_len: int | None = None,
    ) -> tuple[list[Completion], WaveStats]:
        """Reset the prefix cache, re-warm the shared prefix, then submit all prompts at once."""
        from cascade_repro.prompts.chat import common_prefix_len

        tw = self.twin
        if arm not in tw.arms:
            raise ValueError(f"arm must be {tw.test!r} or {tw.ref!r}, not {arm!r}")
        if self.engine_arm is not None and arm != self.engine_arm:
            raise RuntimeError(
                f"engine {self.key} was started for the {self.engine_arm} arm, asked for {arm}"
            )
        self._wave_seq += 1
        wave_id = f"{self.key}/w{self._wave_seq:05d}-{arm}"
        # The plugin forces cascade off in the cascade twin's reference arm; another twin's engine has
        # it off already (its arms' arguments), the batch twin's one engine for both arms included.
        force_off = arm == TWIN.ref
        inject = self.inject if arm == tw.test else None
        p = common_prefix_len(prompts) if prefix_len is None else prefix_len
        p = max(0, min(p, min(len(x) for x in prompts) - 1))
        extra: dict[str, Any] = {}

        clock = time.perf_counter
        phases: dict[str, float] = {}
        t = clock()

        # 1. No counting during the reset and the warm-up (the previous wave's sync RPC already
        #    switched the workers off; the file says so too, for the counts-file fallback).
        probe.write_control(self.probe_dir, None, force_off, None, self._next_ctl())
        said = self.llm.reset_prefix_cache()
        # None: this vLLM does not say (0.10.2's V1 engine drops the scheduler's answer); the reset
        # was requested with no request running, which is when it succeeds.
        reset_ok: bool | None = None if said is None else bool(said)
        if reset_ok is False:  # requests still being freed: try again briefly
            for _ in range(20):
                time.sleep(0.05)
                if self.llm.reset_prefix_cache():
                    reset_ok = True
                    break
        extra["prefix_cache_reset"] = reset_ok
        phases["reset_s"], t = clock() - t, clock()
        greedy = dict(temperature=0.0, seed=self.seed, ignore_eos=bool(self.spec.ignore_eos))
        # Every arm's requests carry the run's penalties (the warm-up's single token too).
        greedy.update(sampling.active(self.spec.sampling))
        if p > 0:
            self.llm.generate(
                [self._TokensPrompt(prompt_token_ids=list(prompts[0][: p + 1]))],
                self._SamplingParams(max_tokens=1, **greedy),
                use_tqdm=False,
            )
        phases["warmup_s"], t = clock() - t, clock()

        # 2. The wave itself, counted under its own id. The control file's size changes with every
        #    write (probe.control_text), so the wave's first decision sees it without a round trip.
        force_on = arm == TWIN.test and bool(self.spec.force_cascade)
        probe.write_control(self.probe_dir, wave_id, force_off, inject, self._next_ctl(), force_on)
        params = self._SamplingParams(max_tokens=max_tokens, **self.output_kwargs(), **greedy)
        phases["control_s"], t = clock() - t, clock()
        outs = self.llm.generate(
            [self._TokensPrompt(prompt_token_ids=list(x)) for x in prompts], params, use_tqdm=False
        )
        phases["generate_s"], t = clock() - t, clock()

        # 3. Counters of this wave from every process that runs the model; the same round trip
        #    stops the counting (the control file follows, for processes the RPC does not reach).
        idle = probe.control_data(None, False, None, self._next_ctl())
        snaps, source = self._snapshots(wave_id, idle)
        if source == "rpc":
            probe.write_control(self.probe_dir, None, False, None, idle["seq"])
        agg = probe.aggregate(snaps, wave_id)
        phases["sync_s"], t = clock() - t, clock()
        extra.update(
            probe=source,
            probe_procs=agg["procs"],
            forced_off=agg["forced_off"],
            seen_prefix_len_max=agg["seen_prefix_len_max"],
            max_reqs=agg["max_reqs"],
            decode_cascade_calls=agg["decode_cascade_calls"],
            max_decode_suffix=agg["max_decode_suffix"],
        )
        if force_on:
            extra["forced_on"] = agg["forced_on"]
        extra["steps"] = {k: round(agg[k], 6) if k.endswith("_s") else agg[k] for k in probe.TIMING_KEYS}
        if agg.get("preempted_reqs"):  # KV cache pressure evicted running requests (recomputed later)
            extra["preempted_reqs"] = agg["preempted_reqs"]
        if agg["fa2_split_calls"]:  # FA2's split-KV branch ran under cascade (the field bug's)
            extra["fa2_split_calls"] = agg["fa2_split_calls"]
        if agg["fa_versions"]:
            extra["fa_versions"] = agg["fa_versions"]
        if inject:
            extra["inject_calls"] = agg["inject_calls"]
        if agg["procs"] > 1:
            extra["cascade_calls_sum"] = agg["cascade_calls_sum"]
        stats = WaveStats(
            cascade_steps=agg["decisions_true"],
            total_steps=agg["decisions_true"] + agg["decisions_false"],
            cascade_calls=agg["cascade_calls"],
            common_prefix_len=agg["max_common_prefix_len"],
            extra=extra,
            cascade_decode_steps=agg["decisions_true_decode"],
        )
        text = self._decoded if self.decode_here else vllm_text
        comps = [completion_of(o, self.topk, text) for o in outs]
        if tw is not TWIN:
            extra["effect"] = self.effect(arm, outs, comps, agg)
            if inject:  # 0 says the fault never ran (a step replayed from a full CUDA graph skips it)
                extra["scaled_calls"] = int(agg.get("scaled_calls", 0) or 0)
        phases["convert_s"] = clock() - t
        extra["phases"] = {k: round(v, 6) for k, v in phases.items()}
        return comps, stats

    def logprob_kwargs(self) -> dict[str, Any]:
        """The SamplingParams keywords that ask for the top-k logprobs (flat where vLLM can)."""
        kw: dict[str, Any] = {"logprobs": self.topk}
        if self.flat_logprobs:
            kw[vllm_surface.FLAT_LOGPROBS] = True
        return kw

    def output_kwargs(self) -> dict[str, Any]:
        """Every SamplingParams keyword a wave's outputs depend on: the logprobs, and no
        detokenization by vLLM where the engine decodes the text itself (``decode_here``)."""
        kw = self.logprob_kwargs()
        if self.decode_here:
            kw[vllm_surface.DETOKENIZE] = False
        return kw

    def _decoded(self, c: Any, token_ids: list[int], finish: str) -> str:
        """The text decoded here, whatever vLLM was asked (the tokenizer is asked for once)."""
        if self._text_tokenizer is None:
            self._text_tokenizer = self.tokenizer()
        return completion_text(self._text_tokenizer, token_ids, finish)

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        try:
            core = getattr(llm.llm_engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
        except Exception:  # noqa: BLE001 - best effort
            pass
        del llm
        gc.collect()
        try:
            from vllm.distributed.parallel_state import (
                destroy_distributed_environment,
                destroy_model_parallel,
            )

            destroy_model_parallel()
            destroy_distributed_environment()
        except Exception:  # noqa: BLE001 - best effort
            pass
