"""GPU smoke test of the vLLM engine and its probe: ``python -m cascade_repro.engines.vllm_smoke OUT.json``.

Kept apart from ``engines/vllm.py`` because it builds a matrix spec (``matrix``), and the planner
imports the engine registry: the engine module itself stays free of that cycle.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from cascade_repro.engines.base import Completion
from cascade_repro.engines.vllm import VLLMEngine, _jsonable
from cascade_repro.rundir import layout


def smoke(
    out_path: str, tp: int = 1, batch: int = 64, max_tokens: int = 48, eager: bool = False
) -> dict[str, Any]:
    """GPU smoke test of the engine and the probe; writes a JSON of findings to ``out_path``.

    One engine serving both arms: flat, cascade, cascade with ``lse-layout`` injection, flat again.
    Expected: flat waves report 0 cascade decisions (all forced off) and are identical to each
    other; the cascade wave reports cascade steps > 0 at batch 64 and ``cascade_calls`` = steps x
    layers; the injected wave diverges from the clean cascade wave.
    """
    import json
    import tempfile
    import traceback

    from cascade_repro.plan.matrix import MatrixSpec
    from cascade_repro.plan.models import resolve_model
    from cascade_repro.prompts.chat import measure_prefix
    from cascade_repro.prompts.promptsets import load_prompt_set, load_system_prompt
    from cascade_repro.rundir.cells import EnginePlan
    from cascade_repro.rundir.manifest import Manifest, PromptSetFacts

    found: dict[str, Any] = {"ok": False, "tp": tp, "batch": batch, "max_tokens": max_tokens, "eager": eager}
    t0 = time.time()

    def save() -> None:
        found["wall_s"] = round(time.time() - t0, 1)
        Path(out_path).write_text(json.dumps(found, indent=2, default=str))

    engine = None
    try:
        run_dir = Path(tempfile.mkdtemp(prefix="cascade-smoke-"))
        system = load_system_prompt("ko")
        records = load_prompt_set("ko-ifeval-style", batch).records
        # Only what the engine reads back from run.json: the system prompt.
        manifest = Manifest.of(prompt_set=PromptSetFacts.of(system_prompt_text=system))
        manifest.write_manifest(run_dir, manifest)
        layout.write_prompts(run_dir, [{"prompt": r.prompt} for r in records])
        spec = MatrixSpec(engine="vllm", batch=[batch], max_tokens=max_tokens, topk=5, enforce_eager=eager)
        eplan = EnginePlan(
            key=f"smoke-tp{tp}",
            tp=tp,
            seed=0,
            dtype="auto",
            fa_version=None,
            backend="FLASH_ATTN",
            arm=None,
            cells=[],
        )
        model_path, _ = resolve_model("embedded")
        t1 = time.time()
        engine = VLLMEngine(model_path, spec, eplan, run_dir=run_dir)
        found["start_s"] = round(time.time() - t1, 1)
        found["requested"] = _jsonable({k: v for k, v in engine.requested.items() if k != "model"})
        found["effective"] = engine.effective()
        save()
        measured = measure_prefix(engine.tokenizer(), system, records)
        rendered, shared = measured.rendered, measured.tokens
        found["shared_prefix_tokens"] = shared
        found["prompts"] = len(rendered)
        outs: dict[str, list[Completion]] = {}
        waves: dict[str, Any] = {}
        for label, arm, inject in (
            ("flat", "flat", None),
            ("cascade", "cascade", None),
            ("cascade_inject", "cascade", "lse-layout"),
            ("flat_again", "flat", None),
        ):
            engine.inject = inject
            w0 = time.time()
            comps, st = engine.run_wave(rendered, arm, max_tokens, prefix_len=shared)
            outs[label] = comps
            waves[label] = {
                "cascade_steps": st.cascade_steps,
                "total_steps": st.total_steps,
                "cascade_calls": st.cascade_calls,
                "common_prefix_len": st.common_prefix_len,
                "extra": st.extra,
                "wall_s": round(time.time() - w0, 2),
                "tokens": sum(len(c.token_ids) for c in comps),
                "topk_len_ok": all(len(s) == 5 for c in comps for s in c.topk),
            }
            found["waves"] = waves
            save()

        def same(a: str, b: str) -> int:
            return sum(x.token_ids == y.token_ids for x, y in zip(outs[a], outs[b], strict=True))

        found["identical"] = {
            "flat_vs_flat_again": same("flat", "flat_again"),
            "cascade_vs_flat": same("cascade", "flat"),
            "inject_vs_cascade": same("cascade_inject", "cascade"),
        }
        found["probe_files"] = sorted(p.name for p in engine.probe_dir.iterdir())
        w = waves
        found["checks"] = {
            "flat_forced_off": w["flat"]["cascade_steps"] == 0
            and w["flat"]["extra"].get("forced_off", 0) > 0,
            "cascade_fired": w["cascade"]["cascade_steps"] > 0,
            "calls_multiple_of_steps": w["cascade"]["cascade_steps"] > 0
            and w["cascade"]["cascade_calls"] % w["cascade"]["cascade_steps"] == 0,
            "inject_applied": w["cascade_inject"]["extra"].get("inject_calls", 0) > 0,
            "inject_diverges": found["identical"]["inject_vs_cascade"] < len(rendered),
            "flat_deterministic": found["identical"]["flat_vs_flat_again"] == len(rendered),
            "probe_via_rpc": all(v["extra"].get("probe") == "rpc" for v in w.values()),
        }
        found["ok"] = all(found["checks"].values())
    except Exception as e:  # noqa: BLE001 - the findings file must say what broke
        found["error"] = f"{type(e).__name__}: {e}"
        found["traceback"] = traceback.format_exc()[-4000:]
    finally:
        save()
        if engine is not None:
            engine.close()
    return found


if __name__ == "__main__":
    import argparse
    import sys

    ap = argparse.ArgumentParser(description="GPU smoke test of the vLLM engine and the cascade probe")
    ap.add_argument("out", help="JSON file to write the findings to")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--eager", action="store_true")
    a = ap.parse_args()
    res = smoke(a.out, tp=a.tp, batch=a.batch, max_tokens=a.max_tokens, eager=a.eager)
    import json

    print(json.dumps({k: res.get(k) for k in ("ok", "checks", "identical", "error", "wall_s")}, indent=2))
    sys.exit(0 if res.get("ok") else 1)
