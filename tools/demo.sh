#!/bin/bash
# The main job, on the embedded default configuration (pool "default" with one slot per CPU, lane
# "merge" fail-fast, lane "nightly" waiting): brokerd on a private socket, contending `slotctl run`
# jobs, then status, history and metrics.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
B=$PWD/build
slotctl=$B/cli/slotctl

run=$(mktemp -d /tmp/slotbroker-demo.XXXXXX)
export SLOTBROKER_SOCKET=$run/io.slotbroker
"$B/brokerd/brokerd" --socket "$SLOTBROKER_SOCKET" --state-directory "$run/state" 2>"$run/brokerd.log" &
brokerd=$!
trap 'kill $brokerd 2>/dev/null || true; wait $brokerd 2>/dev/null || true; rm -rf "$run"' EXIT
for _ in $(seq 200); do [ -S "$SLOTBROKER_SOCKET" ] && break; sleep 0.05; done

slots=$(nproc)
jobs=$((slots + 2))
echo "== $jobs nightly jobs contend for $slots slots: $slots run, 2 wait their turn =="
pids=()
for i in $(seq "$jobs"); do
        "$slotctl" run --lane nightly --job "nightly-$i" --quiet -- \
                sh -c 'echo "  $1 runs on slot $SLOT_INDEX of pool $SLOT_POOL (fencing token $SLOT_TOKEN)"; sleep 2' \
                sh "nightly-$i" &
        pids+=($!)
done
sleep 1

echo
echo "== slotctl status =="
"$slotctl" status

echo
echo "== a merge job fails fast while the pool is full =="
rc=0
"$slotctl" run --lane merge --job merge-1 -- true || rc=$?
echo "  slotctl exited $rc (75: refused, try again later)"

for p in "${pids[@]}"; do wait "$p"; done

echo
echo "== slotctl history =="
"$slotctl" history --limit 30

echo
echo "== slotctl metrics (decisions) =="
"$slotctl" metrics | grep -E '^slotbroker_(granted|rejected)_total' || true
