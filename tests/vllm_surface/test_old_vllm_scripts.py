"""scripts/old-vllm: the lock, the drop list and the image's stand-in libraries agree with each other.

The wheels themselves never reach CI; these checks read the committed text files only.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[2] / "scripts" / "old-vllm"


def _pins() -> dict[str, str]:
    out = {}
    for line in (HERE / "lock.txt").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line)
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def _rows(name: str) -> list[list[str]]:
    return [ln.split() for ln in (HERE / name).read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def test_lock_pins_the_old_stack():
    pins = _pins()
    assert pins["vllm"] == "0.10.2"
    assert pins["torch"] == "2.8.0"  # vLLM 0.10.2's own pin; its kernels are bound to torch 2.8's ABI
    assert pins["transformers"].startswith("4.56")
    assert all(not v.endswith((".dev", "rc")) for v in pins.values())


def test_every_dropped_package_is_in_the_lock_and_says_why():
    pins = _pins()
    for row in _rows("drop.txt"):
        assert row[0] in pins, f"drop.txt names {row[0]}, which lock.txt does not hold"
        assert len(row) > 1, f"drop.txt: {row[0]} without a reason"
    dropped = {r[0] for r in _rows("drop.txt")}
    # What the harness runs on must never be dropped.
    assert not dropped & {"vllm", "torch", "triton", "transformers", "nvidia-cublas-cu12", "nvidia-cuda-runtime-cu12"}


def test_every_dropped_cuda_library_has_a_stand_in_or_a_lazy_loader():
    stand_ins = {r[3] for r in _rows("image-sonames.txt")}
    dropped = {r[0]: " ".join(r[1:]) for r in _rows("drop.txt")}
    for name, why in dropped.items():
        if not name.startswith("nvidia-"):
            continue
        soname = why.split()[0]
        linked = [r for r in _rows("image-sonames.txt") if r[0].endswith(soname) or r[0].endswith(soname.replace(".so.9", "*.so.9"))]
        assert linked or "lazily" in why, f"{name}: no image library stands in for {soname}"
        if linked:
            assert linked[0][3] in stand_ins
            # torch's RPATH looks in $ORIGIN/../../nvidia/<dir>/lib: the link must land there.
            assert re.fullmatch(r"nvidia/[a-z_]+/lib", linked[0][1]), linked[0]


@pytest.mark.parametrize("script", ["resolve.sh", "stage.sh", "device.sh"])
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(HERE / script)], check=True)


def test_readme_documents_the_steps():
    text = (HERE / "README.md").read_text()
    for step in ("resolve.sh", "stage.sh", "device.sh", "check_links.py", "record_surface.py"):
        assert step in text
