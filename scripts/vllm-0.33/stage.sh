#!/usr/bin/env bash
# Build the vLLM 0.33.0 overlay for the GPU machine: the packages whose pins differ between this lock and
# scripts/vllm-0.34/lock.txt (vllm, flashinfer-python, transformers), installed into one tree, packed and
# split like the full stacks. On the GPU machine it sits in front of the 0.34 stack (device.sh here).
# Run from the project root; needs CPython 3.12 (PY312) and xz. Result: .vllm-0.33-stage/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
git rev-parse --git-dir >/dev/null 2>&1 || { echo "run this from the project root" >&2; exit 2; }
py=${PY312:-python3.12}
work=.vllm-0.33-build; out=.vllm-0.33-stage
exclude="$(git rev-parse --git-dir)/info/exclude"
for d in "$work" "$out"; do grep -qx "/$d/" "$exclude" 2>/dev/null || echo "/$d/" >> "$exclude"; done
rm -rf "$work" "$out"; mkdir -p "$work/wheels" "$out"
grep -E '^[A-Za-z0-9].*==' "$here/lock.txt" | sort > "$work/mine"
grep -E '^[A-Za-z0-9].*==' "$here/../vllm-0.34/lock.txt" | sort > "$work/base"
comm -23 "$work/mine" "$work/base" > "$work/pins.txt"
echo "overlay: $(tr '\n' ' ' < "$work/pins.txt")"
platforms=""
for n in $(seq 39 -1 5); do platforms+=" --platform manylinux_2_${n}_x86_64"; done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  $platforms -d "$work/wheels" -r "$work/pins.txt" 2>&1 | grep -v '^WARNING' || true
"$py" -m pip install -q --no-deps --no-index --no-compile --target "$work/tree" "$work"/wheels/*.whl 2>&1 \
  | grep -v '^WARNING' || true
rm -rf "$work/tree/bin"
tar -C "$work/tree" -cf - . | xz "-${XZ_LEVEL:-1}" -T0 > "$work/payload.tar.xz"
split -b "${PART_SIZE:-$(bash "$here/../old-vllm/part_size.sh")}" -d -a 2 "$work/payload.tar.xz" "$out/part-"
(cd "$out" && sha256sum part-* > manifest.txt)
echo "staged $(ls "$out"/part-* | wc -l) parts in $out ($(du -sh "$out" | cut -f1)); after the 0.34 stack is installed,"
echo "one call per part: carry [\"$out/part-NN\", \"$out/manifest.txt\"], command: bash scripts/vllm-0.33/device.sh"
