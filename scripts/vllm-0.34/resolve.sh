#!/usr/bin/env bash
# Resolve vLLM 0.34.0's stack for the GPU machine (CPython 3.12, manylinux x86_64) into lock.txt,
# with overrides.txt's stand-in for the one pin PyPI cannot satisfy. Needs uv (pip install uv) and
# the package index; run anywhere.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
uv pip compile "$here/requirements.in" --override "$here/overrides.txt" --python-version 3.12 \
  --python-platform x86_64-manylinux_2_28 --exclude-newer 2026-12-04 --no-header --no-annotate -q -o "$here/lock.txt"
echo "resolved $(grep -c '==' "$here/lock.txt") packages into $here/lock.txt"
