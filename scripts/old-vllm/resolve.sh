#!/usr/bin/env bash
# Resolve vLLM 0.10.2's stack for the GPU machine (CPython 3.12, manylinux x86_64) into lock.txt.
# The resolver sees only releases published before vLLM 0.10.2 (2025-09-13), so every dependency is
# one that release was used with. Needs uv (pip install uv) and the package index; run anywhere.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
uv pip compile "$here/requirements.in" --python-version 3.12 --python-platform x86_64-manylinux_2_28 \
  --exclude-newer 2025-09-14 --no-header --no-annotate -q -o "$here/lock.txt"
echo "resolved $(grep -c '==' "$here/lock.txt") packages into $here/lock.txt"
