#!/usr/bin/env bash
# GPU-machine side of scripts/old-vllm (README.md there). Run from the project root in every call
# that carries a part: the part is checked against manifest.txt and kept under /tmp/old-vllm; the
# first call also creates the venv and starts an unpacker (its own session, so it outlives the
# call) that streams the parts through xz into the venv as they arrive. The call that brings the
# last part waits for the unpacker, links the image's CUDA 13 libraries that stand in for dropped
# wheels (image-sonames.txt), installs this working tree, and prints what it built.
# Then: . /tmp/old-vllm/env.sh && cascade-repro ...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# STACK: the folder holding image-sonames.txt (and, optionally, env.sh: lines added to the environment),
# as for stage.sh; its name names the stage folder here and the install folder there.
stack=$(cd "${STACK:-$here}" && pwd); stack_name=$(basename "$stack")
src=${OLD_VLLM_STAGE:-.$stack_name-stage}
dst=${OLD_VLLM_DIR:-/tmp/$stack_name}
venv=$dst/venv
mkdir -p "$dst/parts"
# The image's interpreter (Python 3.12), remembered from the first call: once env.sh is sourced,
# python3 is the venv's own, whose site-packages must not be taken for the image's.
if [ -n "${BASE_PYTHON:-}" ]; then base_py=$BASE_PYTHON
elif [ -f "$dst/base_python" ]; then base_py=$(cat "$dst/base_python")
else base_py=$(command -v python3); fi
case "$(cd "$(dirname "$base_py")" && pwd)" in
  "$venv"/*) echo "$stack_name: $base_py is the venv's python; set BASE_PYTHON to the image's" >&2; exit 2 ;;
esac
[ -f "$dst/base_python" ] || echo "$base_py" > "$dst/base_python"
[ -f "$src/manifest.txt" ] && cp -f "$src/manifest.txt" "$dst/manifest.txt"
[ -f "$dst/manifest.txt" ] || { echo "no manifest.txt: carry $src/manifest.txt" >&2; exit 2; }

# 1. Keep the part(s) this call carried, checked.
for p in "$src"/part-*; do
  [ -f "$p" ] || continue
  n=$(basename "$p")
  [ -f "$dst/parts/$n" ] && continue
  want=$(awk -v n="$n" '$2 == n {print $1}' "$dst/manifest.txt")
  got=$(sha256sum "$p" | cut -d' ' -f1)
  [ -n "$want" ] && [ "$want" = "$got" ] || { echo "$n: checksum does not match manifest.txt" >&2; exit 3; }
  cp "$p" "$dst/parts/.$n.tmp" && mv "$dst/parts/.$n.tmp" "$dst/parts/$n"
done

# 2. The venv (no packages of the image visible) and the unpacker, once.
if [ ! -x "$venv/bin/python" ]; then
  "$base_py" -m venv --without-pip "$venv"
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
unpack() {
  awk '{print $2}' "$dst/manifest.txt" | while read -r n; do
    while [ ! -f "$dst/parts/$n" ]; do sleep 0.2; done
    cat "$dst/parts/$n"
  done | xz -dc -T0 | tar -x -C "$site"
}
if [ ! -f "$dst/unpacker.pid" ]; then
  export -f unpack; export dst site
  # The result file appears only once unpacking ended (written aside, then renamed).
  setsid bash -c 'echo $$ > "$dst/unpacker.pid"; if unpack; then rc=0; else rc=1; fi
                  echo $rc > "$dst/.unpacked" && mv "$dst/.unpacked" "$dst/unpacked"' \
    > "$dst/unpacker.log" 2>&1 < /dev/null &
  for _ in $(seq 50); do [ -f "$dst/unpacker.pid" ] && break; sleep 0.1; done
fi
need=$(wc -l < "$dst/manifest.txt"); have=$(ls "$dst/parts" | grep -c '^part-' || true)
if [ "$have" -lt "$need" ]; then echo "$stack_name: $have/$need parts"; exit 0; fi

# 3. Every part is here: wait for the unpacker (or unpack here if it died).
t0=$(date +%s)
while [ ! -f "$dst/unpacked" ]; do
  if ! kill -0 "$(cat "$dst/unpacker.pid" 2>/dev/null || echo 0)" 2>/dev/null; then
    echo "$stack_name: unpacker gone ($(tail -1 "$dst/unpacker.log" 2>/dev/null)); unpacking here" >&2
    if unpack; then echo 0 > "$dst/unpacked"; else echo 1 > "$dst/unpacked"; fi
    break
  fi
  sleep 0.5
done
[ "$(cat "$dst/unpacked")" = 0 ] || { echo "$stack_name: unpacking failed: $(tail -3 "$dst/unpacker.log")" >&2; exit 3; }
echo "$stack_name: unpacked ($(( $(date +%s) - t0 )) s waited)"

# 4. The image's libraries that stand in for dropped wheels, where torch's RPATH looks.
image_site=${IMAGE_SITE:-$("$base_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')}
grep -v '^#' "$stack/image-sonames.txt" | while read -r glob into _rest; do
  [ -n "$glob" ] || continue
  mkdir -p "$site/$into"
  found=0
  for f in "$image_site"/$glob; do
    [ -e "$f" ] || continue
    ln -sf "$f" "$site/$into/$(basename "$f")"; found=1
  done
  [ "$found" = 1 ] || { echo "$stack_name: the image has no $glob (under $image_site)" >&2; exit 3; }
done

# 5. This working tree, and the environment to use it.
if ! log=$("$base_py" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --upgrade \
      --target "$site" . 2>&1); then
  echo "$stack_name: installing this working tree failed:" >&2; echo "$log" | grep -vi warning | tail -20 >&2; exit 3
fi
cat > "$venv/bin/cascade-repro" <<SH
#!/usr/bin/env bash
exec "$venv/bin/python" -m cascade_repro "\$@"
SH
chmod +x "$venv/bin/cascade-repro"
mkdir -p "$dst/cuda-cache"
cat > "$dst/env.sh" <<ENV
export PATH="$venv/bin:\$PATH"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
# FA2 ships sm_80 code and PTX: the driver compiles it for the H200 once; keep what it compiled.
export CUDA_CACHE_PATH="$dst/cuda-cache" CUDA_CACHE_MAXSIZE=4294967296
ENV
[ -f "$stack/env.sh" ] && grep -v '^#' "$stack/env.sh" >> "$dst/env.sh"
"$venv/bin/python" -c "import sys, torch, vllm; print('$stack_name ready:', 'python', sys.version.split()[0], 'torch', torch.__version__, 'vllm', vllm.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
