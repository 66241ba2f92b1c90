"""CUDA's compute cache for the processes that run kernels: one per machine, large enough for FA2.

vllm-flash-attn's FA2 wheel carries sm_80 code and PTX only, so on a Hopper GPU the driver compiles
every FA2 kernel from PTX the first time a process loads it, which makes a fresh machine's first FA2
start minutes longer than the next. The driver keeps the results in its
compute cache (``CUDA_CACHE_PATH``, default ``~/.nv/ComputeCache``), whose default size limit is
too small to hold every configuration a matrix and the kernel check load. Workers therefore get a
cache under this tool's user cache dir with 4 GiB, unless the user set either variable.

Standard library only: the runner imports this before any GPU work.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from pathlib import Path

MAXSIZE = 4 << 30  # bytes; CUDA_CACHE_MAXSIZE's own cap is 4 GiB
SUBDIR = "cuda-compute-cache"
# A marker per GPU model, written once an FA2 engine started there: the next start reuses the cache.
FA2_MARK = ".fa2-compiled-{gpu}"


def default_path() -> Path:
    from cascade_repro.plan.models import cache_root

    return cache_root() / SUBDIR


def apply(env: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Point ``env`` at the tool's compute cache unless the user chose one; return ``env``."""
    if "CUDA_CACHE_PATH" not in env:
        path = default_path()
        try:
            path.mkdir(parents=True, exist_ok=True)
            env["CUDA_CACHE_PATH"] = str(path)
        except OSError:
            pass  # an unwritable cache dir: CUDA's default place, still with the larger limit
    env.setdefault("CUDA_CACHE_MAXSIZE", str(MAXSIZE))
    return env


def _gpu_slug(gpu_name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in gpu_name.strip().lower()) or "gpu"


def fa2_compiled(env: Mapping[str, str], gpu_name: str) -> bool:
    """Whether an FA2 engine already started on this GPU model with this cache (so no long JIT)."""
    path = env.get("CUDA_CACHE_PATH")
    return bool(path) and (Path(path) / FA2_MARK.format(gpu=_gpu_slug(gpu_name))).exists()


def mark_fa2_compiled(env: Mapping[str, str], gpu_name: str) -> None:
    path = env.get("CUDA_CACHE_PATH")
    if not path:
        return
    try:
        (Path(path) / FA2_MARK.format(gpu=_gpu_slug(gpu_name))).touch()
    except OSError:
        pass  # only a hint for the progress line


def needs_fa2_jit(fa_version: object, gpu_name: str) -> bool:
    """FA2 on a GPU its wheel has no native code for (compute capability 9 and up: Hopper, Blackwell)."""
    if str(fa_version) != "2":
        return False
    name = gpu_name.upper()
    return any(tag in name for tag in ("H100", "H200", "H800", "H20", "GH200", "B100", "B200", "GB200"))
