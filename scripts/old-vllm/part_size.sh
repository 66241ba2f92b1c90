#!/usr/bin/env bash
# Prints the part size a stage script splits into (for split -b): a call to the GPU machine carries
# 64 MiB in all, the working tree included, so a part is at most 56 MiB and leaves room for the
# tracked files (and 2 MiB for the manifest and untracked files). Run from the project root.
set -euo pipefail
tree_mib=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print int(s / 1048576) + 1}')
room=$((62 - tree_mib)); [ "$room" -gt 56 ] && room=56
echo "${room}M"
