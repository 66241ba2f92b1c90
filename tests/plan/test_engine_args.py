"""engine_args.py: vLLM users' engine arguments, parsed, refused where they break the experiment, checked by name."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from cascade_repro.errors import UsageError
from cascade_repro.plan import engine_args as ea
from cascade_repro.plan.matrix import MatrixSpec

DATA = Path(__file__).parents[1] / "data"
no_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="checks the recorded list")


def test_the_recorded_fields_are_vllm_0_26_0s():
    recorded = json.loads((DATA / "vllm-surface-0.26.0.json").read_text())["engine_args"]
    assert ea.RECORDED_FIELDS == {n for n in recorded if not n.startswith("_")}
    assert {"block_size", "kv_cache_dtype", "max_num_batched_tokens", "enable_chunked_prefill"} <= ea.RECORDED_FIELDS


def test_key_value_pairs_read_values_as_json_when_they_can():
    got = ea.parse_pairs(["block_size=32", "enable-chunked-prefill=false", "kv_cache_dtype=fp8",
                          'compilation_config={"level": 0}', "swap_space=1.5"])  # fmt: skip
    assert got == {"block_size": 32, "enable_chunked_prefill": False, "kv_cache_dtype": "fp8",
                   "compilation_config": {"level": 0}, "swap_space": 1.5}  # fmt: skip
    with pytest.raises(UsageError, match="expected key=value"):
        ea.parse_pairs(["block_size"])
    assert ea.parse_json('{"block-size": 16}') == {"block_size": 16}
    with pytest.raises(UsageError, match="not valid JSON"):
        ea.parse_json("{block_size: 16}")
    with pytest.raises(UsageError, match="must be a JSON object"):
        ea.parse_json("[1]")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"tensor_parallel_size": 2}, "use --tp"),
        ({"seed": 1}, "use --seed"),
        ({"dtype": "half"}, "use --dtype"),
        ({"attention_config": {"backend": "FLASHINFER"}}, "use --backend and --fa-version"),
        ({"disable_cascade_attn": True}, "the harness sets it per arm"),
        ({"enable_prefix_caching": False}, "needs prefix caching"),
        ({"max_num_seqs": 16}, "max_num_seqs=16: must be an integer >= the largest --batch \\(64\\)"),
    ],
)
def test_arguments_that_break_the_experiment_are_refused_with_the_option_to_use(args, message):
    with pytest.raises(UsageError, match=message):
        ea.check(args, max_batch=64)


@no_vllm
def test_unknown_names_get_close_matches():
    with pytest.raises(UsageError, match=r"'block_sise' is not an engine argument of vLLM 0.26.0's .*did you mean block_size"):
        ea.check({"block_sise": 32}, max_batch=8)
    ea.check({"block_size": 32, "max_num_seqs": 64, "enable_prefix_caching": True}, max_batch=64)


def test_the_spec_carries_them_for_vllm_only():
    spec = MatrixSpec(engine="vllm", engine_args={"block_size": 32})
    spec.validate()
    assert spec.to_dict()["engine_args"] == {"block_size": 32}
    with pytest.raises(UsageError, match="the hf engine takes none"):
        MatrixSpec(engine="hf", engine_args={"block_size": 32}).validate()
    with pytest.raises(UsageError, match="--engine-args must be a table"):
        MatrixSpec(engine="vllm", engine_args=["block_size=32"]).validate()


def test_toml_engine_args_table(tmp_path):
    from cascade_repro.plan.matrix import load_toml

    p = tmp_path / "m.toml"
    p.write_text('engine = "vllm"\nbatch = [8, 64]\n[engine_args]\nblock_size = 32\nmax_num_seqs = 64\n')
    spec = MatrixSpec.from_dict(load_toml(p))
    assert spec.engine_args == {"block_size": 32, "max_num_seqs": 64}


# An EngineArgs-like class whose annotations are strings (``from __future__ import annotations``),
# one per rule of vLLM's ``_compute_kwargs``. ``HIDDEN`` adds fields naming a class imported only
# for type checkers, as 0.26.0's ``quantization_config`` does, which makes resolving the whole class
# fail: each field must then resolve on its own.
PROBE = '''
from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

if TYPE_CHECKING:
    from elsewhere import Hidden

BlockSize = Literal[16, 32]


@dataclasses.dataclass
class CompilationConfig:
    level: int = 0


class Level(enum.IntEnum):
    O0 = 0


class Backend(enum.Enum):
    FLASH = "flash"


@dataclasses.dataclass
class EngineArgs:
    max_num_seqs: int = 1
    enforce_eager: bool = False
    max_num_batched_tokens: Optional[int] = None
    block_size: BlockSize = 16
    kv_cache_dtype: Literal["auto", "fp8"] | None = "auto"
    compilation_config: CompilationConfig = dataclasses.field(default_factory=CompilationConfig)
    additional_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    cudagraph_capture_sizes: list[int] | None = None
    gpu_memory_utilization: float = 0.9
    seed: Union[int, None] = None
    hf_token: bool | str | None = None
    pt_load_map_location: str | dict[str, str] = "cpu"
    served_model_name: str | list[str] | None = None
    optimization_level: Level = Level.O0
    attention_backend: Backend | None = None
    _api_process_count: int = 1
'''
HIDDEN = '''
    quantization_config: dict[str, Any] | Hidden | None = None
    novel_field: Optional[Hidden] = None
'''
PROBE_KINDS = {
    "max_num_seqs": "int", "enforce_eager": "bool", "max_num_batched_tokens": "int", "block_size": "int",
    "kv_cache_dtype": "str", "compilation_config": "object", "additional_config": "object",
    "cudagraph_capture_sizes": "list", "gpu_memory_utilization": "float", "seed": "int",
    "hf_token": "any", "pt_load_map_location": "any", "served_model_name": "list",
    "optimization_level": "int", "attention_backend": "str",
}  # fmt: skip


@pytest.mark.parametrize("hidden", [False, True], ids=["resolvable", "type-checking-only-name"])
def test_installed_kinds_resolve_string_annotations_as_vllm_maps_them(tmp_path, monkeypatch, hidden):
    import importlib
    import sys

    name = f"engine_args_probe_{'hidden' if hidden else 'plain'}"
    (tmp_path / f"{name}.py").write_text(PROBE + (HIDDEN if hidden else ""))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module(name)
    try:
        assert isinstance(module.EngineArgs.__dataclass_fields__["max_num_seqs"].type, str)
        got = ea._installed_kinds(module.EngineArgs)
    finally:
        sys.modules.pop(name, None)
    # A field that does not resolve takes its recorded kind (0.26.0's quantization_config: an
    # object), or `any` when the recorded release has no such field.
    want = PROBE_KINDS | ({"quantization_config": "object", "novel_field": "any"} if hidden else {})
    assert got == want
