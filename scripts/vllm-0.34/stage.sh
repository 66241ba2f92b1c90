#!/usr/bin/env bash
# Build the vLLM 0.34.0 payload for the GPU machine: scripts/old-vllm/stage.sh with this folder's lock,
# drop list and stand-in libraries. Run from the project root; result: .vllm-0.34-stage/ (see README.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# xz -1: the 5.0 GB tree packs in minutes rather than the hour or more -6 takes (old-vllm/stage.sh).
XZ_LEVEL=${XZ_LEVEL:-1} STACK=$here exec bash "$here/../old-vllm/stage.sh" "$@"
