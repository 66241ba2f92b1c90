#!/usr/bin/env bash
# Resolve vLLM 0.11.0's stack (CPython 3.12, manylinux x86_64) into lock.txt, held to the 0.10.2 stack's
# pins (scripts/old-vllm/lock.txt, as constraints) but for vllm and xgrammar, the two pins 0.11.0
# changes, and to releases published before 0.11.0 (2025-10-04). The two locks then differ only in what
# 0.11.0 needs, which stage.sh carries as an overlay. Needs uv and the package index.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
pins=$(mktemp); trap 'rm -f "$pins"' EXIT
grep -E '^[A-Za-z0-9].*==' "$here/../old-vllm/lock.txt" | grep -viE '^(vllm|xgrammar)==' > "$pins"
uv pip compile "$here/requirements.in" -c "$pins" --python-version 3.12 \
  --python-platform x86_64-manylinux_2_28 --exclude-newer 2025-10-05 --no-header --no-annotate -q \
  -o "$here/lock.txt"
echo "resolved $(grep -c '==' "$here/lock.txt") packages into $here/lock.txt"
