#!/usr/bin/env bash
# GPU-machine side of the vLLM 0.34.0 stack: scripts/old-vllm/device.sh with this folder's stand-in
# libraries and environment; it installs into /tmp/vllm-0.34. Then: . /tmp/vllm-0.34/env.sh && cascade-repro ...
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
STACK=$here exec bash "$here/../old-vllm/device.sh" "$@"
