#!/usr/bin/env bash
# Prints the part size a stage script splits into (for split -b): a call to the GPU machine carries
# 64 MiB in all, the working tree included, so a part is at most 56 MiB and leaves room for the
# tracked files (and 2 MiB for the manifest and untracked files), plus 4 MiB for what the tree gains
# (evidence committed) between staging and the session that carries the parts: a part staged at the
# tree's size of that day left 0.5 MiB a few commits later. Run from the project root.
set -euo pipefail
tree_mib=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print int(s / 1048576) + 1}')
room=$((58 - tree_mib)); [ "$room" -gt 56 ] && room=56
echo "${room}M"
