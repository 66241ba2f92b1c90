#!/usr/bin/env bash
# GPU-machine side of the vLLM 0.33.0 overlay: keeps each part it carries (checked against manifest.txt);
# once all are there and the 0.34 stack is installed (scripts/vllm-0.34/device.sh), unpacks them into
# /tmp/vllm-0.33/site and writes /tmp/vllm-0.33/env.sh: the 0.34 environment with the overlay first on
# the path, so vllm, flashinfer and transformers are 0.33.0's pins and everything else the shared stack's.
set -euo pipefail
src=.vllm-0.33-stage; dst=/tmp/vllm-0.33; base=/tmp/vllm-0.34
mkdir -p "$dst/parts"
[ -f "$src/manifest.txt" ] && cp -f "$src/manifest.txt" "$dst/manifest.txt"
for p in "$src"/part-*; do
  [ -f "$p" ] || continue
  n=$(basename "$p")
  want=$(awk -v n="$n" '$2 == n {print $1}' "$dst/manifest.txt")
  [ "$want" = "$(sha256sum "$p" | cut -d' ' -f1)" ] || { echo "$n: checksum does not match manifest.txt" >&2; exit 3; }
  cp "$p" "$dst/parts/$n"
done
need=$(wc -l < "$dst/manifest.txt"); have=$(ls "$dst/parts" | grep -c '^part-' || true)
if [ "$have" -lt "$need" ]; then echo "vllm-0.33: $have/$need parts"; exit 0; fi
[ -f "$base/env.sh" ] || { echo "vllm-0.33: install the 0.34 stack first (scripts/vllm-0.34/device.sh)" >&2; exit 3; }
if [ ! -f "$dst/unpacked" ]; then
  mkdir -p "$dst/site"
  awk '{print $2}' "$dst/manifest.txt" | while read -r n; do cat "$dst/parts/$n"; done | xz -dc -T0 | tar -x -C "$dst/site"
  touch "$dst/unpacked"
fi
{ cat "$base/env.sh"; echo "export PYTHONPATH=\"$dst/site\${PYTHONPATH:+:\$PYTHONPATH}\""; } > "$dst/env.sh"
. "$dst/env.sh"
python3 -c "import sys, torch, vllm; print('vllm-0.33 ready:', 'python', sys.version.split()[0], 'torch', torch.__version__, 'vllm', vllm.__version__)"
