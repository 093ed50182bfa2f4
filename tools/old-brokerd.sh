#!/bin/bash
# Builds the brokerd of an earlier version, for the tests of a fleet that mixes it with this build:
# test-shared-upgrade (a node of the version before the Redis Functions library, 72a2b49) and
# test-shared-liveness's node of the version before the live keys (9cdf3c0). bdc6526 is the last commit
# before both. The sources come out of this clone's history (git archive: nothing in the work tree is
# touched), the build goes to DIR (about 12 s on 2 cores, once: kept for the next run).
# Prints the binary's path; exits 77 (nothing printed) where the clone lacks that commit (a shallow clone)
# or the build fails, so that those tests skip as without it.
# Usage: tools/old-brokerd.sh DIR     (then: SLOTBROKER_OLD_BROKERD=$(tools/old-brokerd.sh DIR) meson test …)
set -euo pipefail
cd "$(dirname "$0")/.."
old=bdc6526
dir=$(realpath -m "$1")
if ! git cat-file -e "$old^{commit}" 2>/dev/null; then
        echo "old-brokerd: no commit $old in this clone (a shallow one?)" >&2
        exit 77
fi
if [ ! -x "$dir/build/brokerd/brokerd" ]; then
        rm -rf "$dir"
        mkdir -p "$dir/src"
        git archive "$old" | tar -x -C "$dir/src"
        if ! { meson setup "$dir/build" "$dir/src" -Dredis=enabled -Dtests=disabled -Dman=disabled &&
               ninja -C "$dir/build" brokerd/brokerd; } >"$dir/build.log" 2>&1; then
                echo "old-brokerd: the build of $old failed (see $dir/build.log)" >&2
                exit 77
        fi
fi
echo "$dir/build/brokerd/brokerd"
