"""Check that the shared libraries torch and vLLM load find what they link against.

Usage: python3 check_links.py TREE IMAGE_SONAMES [--image-site DIR]

Starting from the extension modules the harness imports (ROOTS), every DT_NEEDED name in their
closure must be: a file in the tree, a library of the image listed in IMAGE_SONAMES, or one the
GPU machine's system provides (glibc, libstdc++, the driver's libcuda). Libraries outside the
closure are loaded on demand or never (torch's libtorch_cuda_linalg.so is dlopened on the first
linalg call, numba's TBB/OpenMP pools and cuFile's RDMA plugin are optional), so their gaps do not
count. With --image-site (a directory holding the image's packages' files, e.g. the CUDA 13 wheels
unpacked), every undefined symbol in the closure with an image library's prefix (the longest
prefix wins: cusparseLt before cusparse) must be exported there, with the same symbol version.
Needs readelf (binutils). Exit 1 on a gap.
"""

from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
from pathlib import Path

# Provided by the GPU machine's OS image and driver, not by any wheel.
SYSTEM = {
    "libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0", "libutil.so.1",
    "ld-linux-x86-64.so.2", "libstdc++.so.6", "libgcc_s.so.1", "libz.so.1", "libcuda.so.1",
    "libnvidia-ml.so.1", "libgomp.so.1", "libexpat.so.1", "libbz2.so.1.0", "liblzma.so.5", "libmvec.so.1",
}  # fmt: skip

# What the harness loads: torch's extension, vLLM's kernels, FlashAttention 2 and 3.
ROOTS = ("torch/_C.cpython-312-x86_64-linux-gnu.so", "vllm/*.abi3.so", "vllm/vllm_flash_attn/*.abi3.so")


def readelf(args: list[str], path: Path) -> str:
    return subprocess.run(["readelf", *args, "-W", str(path)], capture_output=True, text=True).stdout


def is_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def shared_objects(root: Path) -> list[Path]:
    return [p for p in root.rglob("*.so*") if p.is_file() and not p.is_symlink() and is_elf(p)]


def image_entries(path: Path) -> list[tuple[str, str, str]]:
    rows = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            glob, into, prefix = line.split()[:3]
            rows.append((glob, into, prefix))
    return rows


def exported(path: Path) -> set[str]:
    out = set()
    for line in readelf(["--dyn-syms"], path).splitlines():
        f = line.split()
        if len(f) >= 8 and f[6] != "UND" and f[4] in ("GLOBAL", "WEAK"):
            out.add(f[7].replace("@@", "@"))
    return out


def main(argv: list[str]) -> int:
    tree, sonames = Path(argv[0]), Path(argv[1])
    image_site = Path(argv[argv.index("--image-site") + 1]) if "--image-site" in argv else None
    entries = image_entries(sonames)
    image_names = {os.path.basename(g) for g, _, _ in entries}
    by_name: dict[str, Path] = {}
    for p in shared_objects(tree):
        by_name.setdefault(p.name, p)
    for p in tree.rglob("*.so*"):  # a soname symlink names the file it points to
        if p.is_symlink() and p.resolve().is_file():
            by_name.setdefault(p.name, p.resolve())
    todo = [p for pattern in ROOTS for p in sorted(tree.glob(pattern))]
    if not todo:
        print(f"check_links: none of {ROOTS} under {tree}")
        return 1
    libs: list[Path] = []
    seen: set[Path] = set()
    gaps = []
    while todo:
        lib = todo.pop()
        if lib in seen:
            continue
        seen.add(lib)
        libs.append(lib)
        for name in re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", readelf(["-d"], lib)):
            if name in by_name:
                todo.append(by_name[name])
            elif name in SYSTEM or any(fnmatch.fnmatch(name, g) for g in image_names):
                continue
            else:
                gaps.append(f"{lib.relative_to(tree)} needs {name}: not in the tree, the image or the system")
    checked = 0
    prefixes = sorted((e[2] for e in entries), key=len, reverse=True)
    if image_site is not None:
        for glob, _, prefix in entries:
            files = list(image_site.glob(glob))
            if not files:
                gaps.append(f"{glob}: not under {image_site}")
                continue
            have: set[str] = set()
            for f in files:
                have |= exported(f)
            bare = {s.split("@")[0] for s in have}
            for lib in libs:
                for line in readelf(["--dyn-syms"], lib).splitlines():
                    f = line.split()
                    # A weak reference left unresolved is bound to 0, not refused (torch's
                    # libtorch_nvshmem.so takes nvshmem_init that way).
                    if len(f) < 8 or f[6] != "UND" or f[4] == "WEAK":
                        continue
                    owner = next((x for x in prefixes if f[7].startswith(x)), None)
                    if owner != prefix:
                        continue
                    sym = f[7].split(" ")[0]
                    name = sym.split("@")[0]
                    ok = sym in have if "@" in sym else name in bare
                    checked += 1
                    if not ok:
                        gaps.append(f"{lib.relative_to(tree)} needs {sym}: not exported by the image's {glob}")
    for g in sorted(set(gaps)):
        print(g)
    print(f"check_links: {len(libs)} libraries loaded with torch and vLLM, {checked} image symbols checked, "
          f"{len(set(gaps))} gaps")
    return 1 if gaps else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
