"""scripts/old-vllm and scripts/vllm-0.34: each stack's lock, drop list and the image's stand-in
libraries agree with each other.

The wheels themselves never reach CI; these checks read the committed text files only.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
HERE = SCRIPTS / "old-vllm"
STACKS = ["old-vllm", "vllm-0.34"]


def _pins(stack: str = "old-vllm") -> dict[str, str]:
    out = {}
    for line in (SCRIPTS / stack / "lock.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line)
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def _rows(name: str, stack: str = "old-vllm") -> list[list[str]]:
    text = (SCRIPTS / stack / name).read_text()
    return [ln.split() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def test_lock_pins_the_old_stack():
    pins = _pins()
    assert pins["vllm"] == "0.10.2"
    assert pins["torch"] == "2.8.0"  # vLLM 0.10.2's own pin; its kernels are bound to torch 2.8's ABI
    assert pins["transformers"].startswith("4.56")
    assert all(not v.endswith((".dev", "rc")) for v in pins.values())


def test_the_new_stack_pins_vllm_0_34_on_torch_2_14():
    pins = _pins("vllm-0.34")
    assert pins["vllm"] == "0.34.0"
    assert pins["torch"] == "2.14.0"  # vLLM 0.34.0's own pin
    # 0.34.0 pins flashinfer-python 0.7.3, which PyPI does not have: overrides.txt names the stand-in.
    overrides = dict(r[0].split("==") for r in _rows("overrides.txt", "vllm-0.34"))
    assert pins["flashinfer-python"] == overrides["flashinfer-python"] == "0.7.4"
    assert all(not v.endswith((".dev", "rc")) for v in pins.values())


@pytest.mark.parametrize("stack", STACKS)
def test_every_dropped_package_is_in_the_lock_and_says_why(stack):
    pins = _pins(stack)
    for row in _rows("drop.txt", stack):
        assert row[0] in pins, f"drop.txt names {row[0]}, which lock.txt does not hold"
        assert len(row) > 1, f"drop.txt: {row[0]} without a reason"
    dropped = {r[0] for r in _rows("drop.txt", stack)}
    # What the harness runs on must never be dropped.
    assert not dropped & {
        "vllm",
        "torch",
        "triton",
        "transformers",
        "nvidia-cublas-cu12",
        "nvidia-cuda-runtime-cu12",
    }


@pytest.mark.parametrize("stack", STACKS)
def test_every_dropped_cuda_library_has_a_stand_in_or_a_lazy_loader(stack):
    rows = _rows("image-sonames.txt", stack)
    dropped = {r[0]: " ".join(r[1:]) for r in _rows("drop.txt", stack)}
    for name, why in dropped.items():
        soname = why.split()[0]
        if not (name.startswith("nvidia-") and soname.startswith("lib") and ".so" in soname):
            continue
        linked = [r for r in rows if fnmatch.fnmatch(soname, r[0].rsplit("/", 1)[-1])]
        assert linked or "lazily" in why, f"{name}: no image library stands in for {soname}"
        if linked:
            # torch's RPATH looks in $ORIGIN/../../nvidia/<dir>/lib: the link must land there, in the
            # folder the image keeps it in.
            assert re.fullmatch(r"nvidia/[a-z0-9_]+/lib", linked[0][1]), linked[0]
            assert linked[0][0].startswith(linked[0][1] + "/") or stack == "old-vllm", linked[0]


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("script", ["resolve.sh", "stage.sh", "device.sh"])
def test_scripts_parse(stack, script):
    subprocess.run(["bash", "-n", str(SCRIPTS / stack / script)], check=True)


@pytest.mark.parametrize("stack", STACKS)
def test_readme_documents_the_steps(stack):
    text = (SCRIPTS / stack / "README.md").read_text()
    for step in ("resolve.sh", "stage.sh", "device.sh", "check_links.py", "record_surface.py"):
        assert step in text


# A vLLM-shaped source tree (the layout record_surface.py reads): aliases in vllm/config/*.py,
# @config and @dataclass configs, an IntEnum and an Enum, names imported only under TYPE_CHECKING,
# relative imports, a forward reference in quotes, and names that lead nowhere.
TREE = {
    "vllm/__init__.py": "",
    "vllm/config/__init__.py": "from vllm.config.cache import CacheConfig\nfrom .compilation import CompilationConfig\n",
    "vllm/config/utils.py": "def config(cls):\n    return cls\n",
    "vllm/config/cache.py": (
        "from typing import Literal\nfrom vllm.config.utils import config\n"
        "BlockSize = Literal[16, 32]\nCacheDType = Literal['auto', 'fp8']\n"
        "@config\nclass CacheConfig:\n    block_size: BlockSize = 16\n"
    ),
    "vllm/config/compilation.py": (
        "from dataclasses import dataclass\n@dataclass\nclass CompilationConfig:\n    level: int = 0\n"
    ),
    "vllm/config/model.py": (
        "from collections.abc import Callable\nfrom typing import Any, Literal, TypeAlias\n"
        "from transformers import PretrainedConfig\n"
        "HfOverrides: TypeAlias = dict[str, Any] | Callable[[PretrainedConfig], PretrainedConfig]\n"
        "TokenizerMode = Literal['auto', 'hf']\n"
    ),
    "vllm/config/vllm.py": (
        "import enum\nfrom enum import IntEnum\n"
        "class OptimizationLevel(IntEnum):\n    O0 = 0\n"
        "class Backend(enum.Enum):\n    FLASH = 'flash'\n"
    ),
    "vllm/config/quantization.py": "from .utils import config\n@config\nclass QuantizationConfigArgs:\n    pass\n",
    "vllm/engine/arg_utils.py": """
import typing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Optional, Union

import torch

from vllm.config import CacheConfig, CompilationConfig
from vllm.config.cache import BlockSize, CacheDType
from vllm.config.model import HfOverrides, TokenizerMode
from vllm.config.nowhere import Missing
from vllm.config.vllm import Backend, OptimizationLevel

if TYPE_CHECKING:
    from vllm.config.quantization import QuantizationConfigArgs
else:
    QuantizationConfigArgs = Any


@dataclass
class EngineArgs:
    max_num_seqs: int | None = None
    enforce_eager: bool = False
    enable_prefix_caching: Optional[bool] = None
    block_size: BlockSize = 16
    kv_cache_dtype: CacheDType = "auto"
    tokenizer_mode: TokenizerMode | str = "auto"
    max_lora_rank: Literal[8, 16] = 8
    gpu_memory_utilization: float = 0.9
    seed: Union[int, None] = None
    ratio: Annotated[float, "a note"] = 1.0
    cache_config: CacheConfig | None = None
    compilation_config: CompilationConfig = None
    quantization_config: "dict[str, Any] | QuantizationConfigArgs | None" = None
    additional_config: dict = None
    override_generation_config: typing.Dict[str, Any] = None
    cudagraph_capture_sizes: list[int] | None = None
    served_model_name: str | list[str] | None = None
    offload_params: set[str] = None
    hf_token: bool | str | None = None
    pt_load_map_location: str | dict[str, str] = "cpu"
    hf_overrides: HfOverrides = None
    optimization_level: OptimizationLevel = OptimizationLevel.O0
    attention_backend: Backend | None = None
    lora_dtype: str | torch.dtype | None = None
    model: str = ""
    mystery: Missing | None = None
    undefined: NotDefinedAnywhere = None
    _api_process_count: int = 1
""",
}
TREE_KINDS = {
    "max_num_seqs": "int", "enforce_eager": "bool", "enable_prefix_caching": "bool", "block_size": "int",
    "kv_cache_dtype": "str", "tokenizer_mode": "str", "max_lora_rank": "int", "gpu_memory_utilization": "float",
    "seed": "int", "ratio": "float", "cache_config": "object", "compilation_config": "object",
    "quantization_config": "object", "additional_config": "object", "override_generation_config": "object",
    "cudagraph_capture_sizes": "list", "served_model_name": "list", "offload_params": "list",
    "hf_token": "any", "pt_load_map_location": "any", "hf_overrides": "any", "optimization_level": "int",
    "attention_backend": "str", "lora_dtype": "str", "model": "str", "mystery": "any", "undefined": "any",
    "_api_process_count": "int",
}  # fmt: skip


def _record_surface():
    import importlib.util

    spec = importlib.util.spec_from_file_location("record_surface", HERE / "record_surface.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_record_surface_maps_engine_args_annotations_as_vllm_does(tmp_path):
    for rel, text in TREE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert _record_surface().engine_args_kinds(tmp_path / "vllm") == TREE_KINDS


def test_the_0_33_overlay_differs_from_the_0_34_stack_in_three_pins():
    mine, base = _pins("vllm-0.33"), _pins("vllm-0.34")
    assert mine.keys() == base.keys()
    changed = {name: (base[name], v) for name, v in mine.items() if base[name] != v}
    assert changed == {
        "vllm": ("0.34.0", "0.33.0"),
        "flashinfer-python": ("0.7.4", "0.7.2.post1"),
        "transformers": ("5.22.2", "5.20.2"),
    }


@pytest.mark.parametrize("script", ["resolve.sh", "stage.sh", "device.sh"])
def test_the_overlay_scripts_parse(script):
    subprocess.run(["bash", "-n", str(SCRIPTS / "vllm-0.33" / script)], check=True)


def test_the_0_11_overlay_differs_from_the_0_10_2_stack_in_vllm_and_xgrammar_only():
    old, new = _pins(), _pins("vllm-0.11")
    changed = {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)}
    assert changed == {"vllm", "xgrammar"}
    assert (new["vllm"], new["xgrammar"], new["torch"]) == ("0.11.0", "0.1.25", old["torch"])
    for script in ("stage.sh", "device.sh", "resolve.sh"):
        subprocess.run(["bash", "-n", str(SCRIPTS / "vllm-0.11" / script)], check=True)
    # The overlay splits into the parts the stacks' own calls carry.
    assert "old-vllm/part_size.sh" in (SCRIPTS / "vllm-0.11" / "stage.sh").read_text()
