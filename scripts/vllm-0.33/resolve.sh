#!/usr/bin/env bash
# Resolve vLLM 0.33.0's stack (CPython 3.12, manylinux x86_64) into lock.txt. It differs from
# scripts/vllm-0.34/lock.txt in three packages only (stage.sh carries those). Needs uv and the index.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
uv pip compile "$here/requirements.in" --python-version 3.12 --python-platform x86_64-manylinux_2_28 \
  --exclude-newer 2026-12-04 --no-header --no-annotate -q -o "$here/lock.txt"
echo "resolved $(grep -c '==' "$here/lock.txt") packages into $here/lock.txt"
