"""Every name the probe, the engine and doctor reach into vLLM for, against the source recorded from
every release the tool claims (``tests/data/vllm-surface-<version>.json``, read with ``ast`` from
the wheels by ``scripts/old-vllm/record_surface.py``): no vLLM needed."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from cascade_repro import twin as twins
from cascade_repro import vllm_surface
from cascade_repro.vllm_surface import probe, targets
from cascade_repro.vllm_surface.fields import FIELDS

DATA = Path(__file__).parents[1] / "data"


@cache
def recorded(version: str) -> dict:
    return json.loads((DATA / f"vllm-surface-{version}.json").read_text(encoding="utf-8"))


def claimed() -> list[vllm_surface.Release]:
    """The releases the tool claims it can drive (KNOWN_REQUIREMENT): all of RELEASES."""
    low, high = vllm_surface.KNOWN_REQUIREMENT.removeprefix("vllm>=").split(",<")
    lo, hi = vllm_surface.version_tuple(low), vllm_surface.version_tuple(high)
    return [r for r in vllm_surface.RELEASES if lo <= vllm_surface.version_tuple(r.version) < hi]


def test_every_release_the_tool_claims_is_known_and_recorded():
    assert [r.version for r in claimed()] == [r.version for r in vllm_surface.RELEASES]
    for r in claimed():
        assert recorded(r.version)["version"] == r.version


@pytest.mark.parametrize("release", vllm_surface.RELEASES, ids=lambda r: r.version)
def test_every_target_exists_in_every_claimed_release(release):
    assert targets.missing(recorded(release.version)["modules"], release) == []


@pytest.mark.parametrize(
    ("version", "absent"),
    [
        # Cascade went in 0.32.0: its targets apply only where the release has it.
        ("0.33.0", "vllm.v1.attention.backends.flash_attn.use_cascade_attention"),
        ("0.34.0", "vllm.v1.attention.backends.flash_attn.cascade_attention"),
        (
            "0.34.0",
            "vllm.v1.attention.backends.flash_attn.FlashAttentionMetadataBuilder.use_cascade_attention",
        ),
        # 0.34.0 has no V1 model runner; 0.10.2 no V2 one and no single graph decision point.
        ("0.34.0", "vllm.v1.worker.gpu_model_runner.GPUModelRunner._determine_batch_execution_and_padding"),
        ("0.34.0", "vllm.v1.worker.gpu_model_runner.GPUModelRunner.get_model"),
        ("0.10.2", "vllm.v1.worker.gpu.cudagraph_utils.CudaGraphManager.run_fullgraph"),
        ("0.10.2", "vllm.v1.worker.gpu_model_runner.GPUModelRunner._determine_batch_execution_and_padding"),
        ("0.10.2", "vllm.config.vllm.VllmConfig.attention_config"),
    ],
)
def test_a_target_that_does_not_apply_is_really_absent(version, absent):
    """`applies` is needed: each of these would be reported missing if it applied."""
    release = vllm_surface.release_for(version)[0]
    target = next(t for t in targets.TARGETS if t.label == absent)
    assert not target.applies_to(release)
    assert targets.find(recorded(version)["modules"], target) is None


def test_a_missing_target_or_parameter_is_reported():
    release = vllm_surface.release_for("0.34.0")[0]
    surface = json.loads(json.dumps(recorded("0.34.0")["modules"]))
    del surface[vllm_surface.V2_GRAPHS_MODULE]["classes"]["CudaGraphManager"]["methods"]["run_pw_graph"]
    surface["vllm.entrypoints.llm"]["classes"]["LLM"]["methods"]["collective_rpc"] = ["self", "method"]
    assert targets.missing(surface, release) == [
        "vllm.v1.worker.gpu.cudagraph_utils.CudaGraphManager.run_pw_graph",
        "vllm.entrypoints.llm.LLM.collective_rpc",
    ]


def test_the_probe_hooks_the_modules_the_targets_name():
    labels = {t.label for t in targets.TARGETS}
    assert f"{probe.FLASH_ATTN_MODULE}.use_cascade_attention" in labels
    assert f"{probe.SCHEDULER_MODULE}.Scheduler.schedule" in labels
    for name in vllm_surface.V2_GRAPH_RUNS:
        assert f"{vllm_surface.V2_GRAPHS_MODULE}.CudaGraphManager.{name}" in labels
    assert f"{vllm_surface.V1_RUNNER_MODULE}.GPUModelRunner.{vllm_surface.V1_GRAPH_DECISION}" in labels
    worker = next(t for t in targets.TARGETS if t.name == "WorkerWrapperBase")
    assert worker.modules == probe.WORKER_BASE_MODULES
    # The out-scale fault finds `output` where the backends take it.
    for t in targets.TARGETS:
        if t.name.endswith("Impl.forward"):
            cls = t.name.partition(".")[0]
            for r in vllm_surface.RELEASES:
                params = recorded(r.version)["modules"][t.modules[0]]["classes"][cls]["methods"]["forward"]
                assert params.index("output") == probe.IMPL_OUTPUT_POS + 1, (r.version, cls)  # after self


@pytest.mark.parametrize("release", vllm_surface.RELEASES, ids=lambda r: r.version)
def test_every_engine_argument_a_testable_twin_sets_exists(release):
    fields = set(recorded(release.version)["engine_args"])
    assert set(FIELDS[release.version]) == {f for f in fields if not f.startswith("_")}
    for tw in twins.all_examples():
        if vllm_surface.twin_problem(tw.family, release.version):
            continue
        for arm in tw.arms:
            assert set(tw.engine_args(arm)) <= fields, (tw.name, arm)
    # What the engine itself passes besides a twin's arguments.
    engine = {"model", "tensor_parallel_size", "dtype", "seed", "enable_prefix_caching", "enforce_eager",
              "load_format", "gpu_memory_utilization", "trust_remote_code", "max_num_seqs", "max_model_len",
              "hf_overrides", "compilation_config", "disable_cascade_attn", "kv_cache_memory_bytes"}  # fmt: skip
    assert engine <= fields
    assert ("attention_config" in fields) == (release.attention_via == "attention_config")


@pytest.mark.parametrize("release", vllm_surface.RELEASES, ids=lambda r: r.version)
def test_the_variables_the_engine_sets_exist_where_it_sets_them(release):
    f = recorded(release.version)
    assert "VLLM_USE_FLASHINFER_SAMPLER" in f["env_vars"]
    if release.runner_env is not None:
        assert "VLLM_USE_V2_MODEL_RUNNER" in f["env_vars"]
    if release.attention_via == "env":
        assert {"VLLM_ATTENTION_BACKEND", "VLLM_FLASH_ATTN_VERSION"} <= set(f["env_vars"])
    # Nothing the engine sets is one vLLM has removed (0.34.0 refuses those at engine start).
    assert not {"VLLM_USE_FLASHINFER_SAMPLER", "VLLM_USE_V2_MODEL_RUNNER"} & set(f["removed_env_vars"])


@pytest.mark.parametrize("version", ["0.26.0", "0.31.0", "0.33.0", "0.34.0"])
def test_engine_field_kinds_are_the_ones_recorded_from_the_source(version):
    kinds = recorded(version)["engine_args_kinds"]
    assert FIELDS[version] == {n: k for n, k in kinds.items() if not n.startswith("_")}


def test_doctor_checks_the_importable_targets_only():
    for release in vllm_surface.RELEASES:
        checked = targets.importable(release)
        surface = recorded(release.version)["modules"]
        for t in checked:  # each importable member is a method of its class
            if t.kind == "member":
                cls, _, member = t.name.partition(".")
                module = targets.find(surface, t)
                assert member in surface[module]["classes"][cls]["methods"], (release.version, t.label)
