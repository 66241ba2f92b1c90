#!/usr/bin/env bash
# GPU-machine side of the vLLM 0.11.0 overlay: keeps each part it carries (checked against manifest.txt);
# once all are there and the 0.10.2 stack is installed (scripts/old-vllm/device.sh), unpacks them into
# /tmp/vllm-0.11/site and writes /tmp/vllm-0.11/env.sh: the 0.10.2 environment with the overlay first on
# PYTHONPATH, so vllm and xgrammar are 0.11.0's pins and torch 2.8.0 and everything else the shared stack's.
# The call that brings the last part loads vLLM's compiled extensions and FA2 there, as a check.
set -euo pipefail
src=.vllm-0.11-stage; dst=/tmp/vllm-0.11; base=/tmp/old-vllm
mkdir -p "$dst/parts"
[ -f "$src/manifest.txt" ] && cp -f "$src/manifest.txt" "$dst/manifest.txt"
[ -f "$dst/manifest.txt" ] || { echo "no manifest.txt: carry $src/manifest.txt" >&2; exit 2; }
for p in "$src"/part-*; do
  [ -f "$p" ] || continue
  n=$(basename "$p")
  want=$(awk -v n="$n" '$2 == n {print $1}' "$dst/manifest.txt")
  [ -n "$want" ] && [ "$want" = "$(sha256sum "$p" | cut -d' ' -f1)" ] \
    || { echo "$n: checksum does not match manifest.txt" >&2; exit 3; }
  cp "$p" "$dst/parts/.$n.tmp" && mv "$dst/parts/.$n.tmp" "$dst/parts/$n"
done
need=$(wc -l < "$dst/manifest.txt"); have=$(ls "$dst/parts" | grep -c '^part-' || true)
if [ "$have" -lt "$need" ]; then echo "vllm-0.11: $have/$need parts"; exit 0; fi
[ -f "$base/env.sh" ] || { echo "vllm-0.11: install the 0.10.2 stack first (scripts/old-vllm/device.sh)" >&2; exit 3; }
if [ ! -f "$dst/unpacked" ]; then
  rm -rf "$dst/site"; mkdir -p "$dst/site"
  awk '{print $2}' "$dst/manifest.txt" | while read -r n; do cat "$dst/parts/$n"; done | xz -dc -T0 | tar -x -C "$dst/site"
  touch "$dst/unpacked"
fi
# The harness itself stays the 0.10.2 venv's install of this working tree (old-vllm/device.sh put it there).
{ cat "$base/env.sh"; echo "export PYTHONPATH=\"$dst/site\${PYTHONPATH:+:\$PYTHONPATH}\""
  echo "export CUDA_CACHE_PATH=\"$base/cuda-cache\"   # FA2's JIT for the H200, shared with 0.10.2 (same fork commit)"; } \
  > "$dst/env.sh"
. "$dst/env.sh"
python3 -c "
import sys, importlib.metadata as md, torch, vllm, vllm._C  # noqa: F401 - the extensions load on torch 2.8
from vllm.vllm_flash_attn import flash_attn_varlen_func  # noqa: F401 - FA2/FA3 as 0.11.0 ships them
assert vllm.__version__.startswith('0.11.0') and md.version('vllm').startswith('0.11.0'), vllm.__version__
print('vllm-0.11 ready:', 'python', sys.version.split()[0], 'torch', torch.__version__, 'vllm', vllm.__version__,
      'xgrammar', md.version('xgrammar'))"
