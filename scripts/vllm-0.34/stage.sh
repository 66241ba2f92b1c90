#!/usr/bin/env bash
# Build the vLLM 0.34.0 payload for the GPU machine: scripts/old-vllm/stage.sh with this folder's lock,
# drop list and stand-in libraries. Run from the project root; result: .vllm-0.34-stage/ (see README.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# A call to the GPU machine carries 64 MiB in all, the working tree included: a part is at most 56 MiB
# and leaves room for the tracked files (and 2 MiB for the manifest and untracked files).
tree_mib=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print int(s / 1048576) + 1}')
room=$((62 - tree_mib)); [ "$room" -gt 56 ] && room=56
# xz -1: the 5.0 GB tree packs in minutes rather than the hour or more -6 takes (old-vllm/stage.sh).
XZ_LEVEL=${XZ_LEVEL:-1} PART_SIZE=${PART_SIZE:-${room}M} STACK=$here exec bash "$here/../old-vllm/stage.sh" "$@"
