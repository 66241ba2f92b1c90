#!/usr/bin/env bash
# Build the vLLM 0.11.0 overlay for the GPU machine: the packages whose pins differ between this lock and
# scripts/old-vllm/lock.txt (vllm 0.11.0 and xgrammar 0.1.25: both stacks share torch 2.8.0 and every
# other pin), installed into one tree, packed with xz and split like the full stacks. On the GPU machine
# it sits in front of the 0.10.2 stack's venv (device.sh here). Run from the project root; needs CPython
# 3.12 (PY312), xz and the package index. Result: .vllm-0.11-stage/ (part-NN, manifest.txt).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
git rev-parse --git-dir >/dev/null 2>&1 || { echo "run this from the project root" >&2; exit 2; }
py=${PY312:-python3.12}
"$py" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' \
  || { echo "need CPython 3.12 for the GPU machine's wheels (set PY312)" >&2; exit 2; }
work=.vllm-0.11-build; out=.vllm-0.11-stage
exclude="$(git rev-parse --git-dir)/info/exclude"
for d in "$work" "$out"; do grep -qx "/$d/" "$exclude" 2>/dev/null || echo "/$d/" >> "$exclude"; done
rm -rf "$work" "$out"; mkdir -p "$work/wheels" "$out"
grep -E '^[A-Za-z0-9].*==' "$here/lock.txt" | sort > "$work/mine"
grep -E '^[A-Za-z0-9].*==' "$here/../old-vllm/lock.txt" | sort > "$work/base"
comm -23 "$work/mine" "$work/base" > "$work/pins.txt"
echo "overlay: $(tr '\n' ' ' < "$work/pins.txt")"
platforms=""
for n in $(seq 39 -1 5); do platforms+=" --platform manylinux_2_${n}_x86_64"; done
for p in manylinux2014 manylinux2010 manylinux1; do platforms+=" --platform ${p}_x86_64"; done
quiet() { grep -v -e '^WARNING: Location' -e "^WARNING: Running pip as the 'root' user" || true; }
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  $platforms -d "$work/wheels" -r "$work/pins.txt" 2>&1 | quiet
"$py" -m pip install -q --no-deps --no-index --no-compile --disable-pip-version-check --target "$work/tree" \
  "$work"/wheels/*.whl 2>&1 | quiet
rm -rf "$work/tree/bin"   # console scripts whose shebang names this machine's interpreter
# Its libraries link against torch 2.8 and its CUDA 12 wheels, which live in the 0.10.2 stack, not here:
# device.sh loads vLLM's extensions there, in front of that stack (check_links.py checks the base stack).
tar -C "$work/tree" -cf - . | xz "-${XZ_LEVEL:-1}" -T0 > "$work/payload.tar.xz"
split -b "${PART_SIZE:-$(bash "$here/../old-vllm/part_size.sh")}" -d -a 2 "$work/payload.tar.xz" "$out/part-"
(cd "$out" && sha256sum part-* > manifest.txt)
rm -f "$work/payload.tar.xz"
echo "staged $(ls "$out"/part-* | wc -l) parts in $out ($(du -sh "$out" | cut -f1)); after the 0.10.2 stack is installed"
echo "(scripts/old-vllm/device.sh), one call per part: carry [\"$out/part-NN\", \"$out/manifest.txt\"],"
echo "command: bash scripts/vllm-0.11/device.sh"
