#!/usr/bin/env bash
# Re-split a staged payload (.device-stage/part-NN, as the image release's staging leaves it in parts
# of 56 MiB) into parts of part_size.sh's size: a call carries 64 MiB in all, the working tree included,
# and a 56 MiB part no longer fits beside the tracked files. The payload and its checksum are unchanged,
# so the device side joins the parts as before. Run from the project root.
set -euo pipefail
out=${1:-.device-stage}
here=$(cd "$(dirname "$0")" && pwd)
size=$(bash "$here/part_size.sh")
ls "$out"/part-* > /dev/null
cat "$out"/part-* > "$out/payload.tar"
rm -f "$out"/part-*
split -b "$size" -d -a 2 "$out/payload.tar" "$out/part-"
rm -f "$out/payload.tar"
ls "$out"/part-* | wc -l | tr -d ' ' > "$out/nparts"
echo "$(cat "$out/nparts") parts of $size in $out"
