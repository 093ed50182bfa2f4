#!/bin/bash
# One pool shared by two runners (README, "Sharing pools between runners"): a private redis-server on a
# Unix socket, two brokerds ("runner-a", "runner-b") on private sockets that both name pool "grid"
# (limit 2) on it, six contending `slotctl run` jobs spread over both, then each node's status.
#
# Each job's command checks the limit from its own side: it takes a lock directory for its slot (a slot
# handed out twice fails to take it) and counts the locks held by every job on both nodes; the summary
# prints the most ever held at once, which must be 2.
#
# SLOTBROKER_BUILD_DIR=DIR runs the programs of that build instead of running tools/setup.sh (the test
# tests/integration/test-shared-demo.py does so).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${SLOTBROKER_BUILD_DIR:-}" ]; then
        B=$SLOTBROKER_BUILD_DIR
else
        bash tools/setup.sh
        B=$PWD/build
fi
slotctl=$B/cli/slotctl
redis_server=$(command -v redis-server) || {
        echo "redis-server is not installed (Debian: apt-get install redis-server; tools/setup.sh does it)" >&2
        exit 1
}

run=$(mktemp -d /tmp/slotbroker-shared-demo.XXXXXX)
servers=()   # Redis, then the brokerds
jobs=()      # slotctl run, while they run
cleanup() {
        # Only what this script started, by pid: the jobs still running, the brokerds, then Redis.
        local p i
        for p in "${jobs[@]}"; do kill "$p" 2>/dev/null || true; done
        for p in "${jobs[@]}"; do wait "$p" 2>/dev/null || true; done
        for ((i = ${#servers[@]} - 1; i >= 0; i--)); do
                kill "${servers[i]}" 2>/dev/null || true
                wait "${servers[i]}" 2>/dev/null || true
        done
        rm -rf "$run"
}
trap cleanup EXIT

# A Redis of our own: its Unix socket only (no TCP port), nothing saved, and the eviction policy brokerd
# requires (noeviction is Redis's default; said here because a shared pool is refused without it).
"$redis_server" --port 0 --unixsocket "$run/redis.sock" --unixsocketperm 700 --dir "$run" \
        --save "" --appendonly no --maxmemory-policy noeviction --logfile "$run/redis.log" &
servers+=($!)
for _ in $(seq 200); do [ -S "$run/redis.sock" ] && break; sleep 0.05; done

# The same pool on both nodes: limit, budgets, max-queue and the lanes' priority, max-in-use and
# reserve are its rules, which every node must agree on (brokerd.conf(5), SHARED POOLS). A short
# backend-node-ttl: the first use of a pool waits one TTL (no node can tell a new pool from one Redis
# lost), and it must stay at least revoke-grace + 5s.
for node in a b; do
        mkdir -p "$run/$node"
        cat >"$run/$node/brokerd.conf" <<EOF
[broker]
node-name = runner-$node
revoke-grace = 1s

[pool grid]
limit = 2
backend = unix://$run/redis.sock
backend-node-ttl = 6s

[lane ci]
pools = grid
policy = wait
EOF
        "$B/brokerd/brokerd" --config "$run/$node/brokerd.conf" --socket "$run/$node/io.slotbroker" \
                --state-directory "$run/$node/state" 2>"$run/$node/brokerd.log" &
        servers+=($!)
done
for node in a b; do
        for _ in $(seq 200); do [ -S "$run/$node/io.slotbroker" ] && break; sleep 0.05; done
done

echo "== two brokerds, runner-a and runner-b, share pool grid (limit 2) through $run/redis.sock =="
for node in a b; do
        for _ in $(seq 300); do
                "$slotctl" status --socket "$run/$node/io.slotbroker" | grep -q "shared: backend up" && break
                sleep 0.1
        done
        "$slotctl" status --socket "$run/$node/io.slotbroker" | grep "shared:" | sed "s/^ */  runner-$node: /"
done

echo
echo "== 6 jobs, 3 through each node, contend for 2 slots (the first grant waits the pool's recovery window, 6 s) =="
locks=$run/locks
mkdir "$locks"
: >"$run/held-counts"
job() { # job NUMBER NODE, in a subshell that becomes slotctl
        SLOTBROKER_SOCKET=$run/$2/io.slotbroker exec "$slotctl" run --lane ci --job "job-$1" --quiet -- sh -c '
                locks=$1 name=$2 node=$3
                mkdir "$locks/slot-$SLOT_INDEX" 2>/dev/null || echo "  !! slot $SLOT_INDEX is held by another job"
                held=$(ls "$locks" | wc -l)
                echo "$held" >>"$locks/../held-counts"
                echo "  $name via runner-$node: slot $SLOT_INDEX, fencing token $SLOT_TOKEN ($held of 2 slots held)"
                sleep 3
                rmdir "$locks/slot-$SLOT_INDEX"' sh "$locks" "job-$1" "$2"
}
for i in $(seq 6); do
        node=$([ $((i % 2)) = 1 ] && echo a || echo b)
        job "$i" "$node" &
        jobs+=($!)
done

# While jobs hold the slots: each node's view, its own leases and waiters, then the other node's. A node
# lists the other's from the last snapshot it fetched (Status never waits for Redis, and asking makes it
# fetch one): ask until it lists a lease held there.
for _ in $(seq 300); do [ "$(ls "$locks" | wc -l)" -ge 2 ] && break; sleep 0.1; done
for node in a b; do
        for _ in $(seq 100); do
                "$slotctl" status --socket "$run/$node/io.slotbroker" | grep -q "HELD ON NODE" && break
                sleep 0.1
        done
        echo
        echo "== slotctl status on runner-$node =="
        "$slotctl" status --socket "$run/$node/io.slotbroker"
done
echo

failed=0
for p in "${jobs[@]}"; do wait "$p" || failed=$((failed + 1)); done
jobs=()
most=$(sort -n "$run/held-counts" | tail -n 1)
echo
echo "== $(wc -l <"$run/held-counts") jobs ran, $failed failed; most slots held at once, across both nodes: $most (limit 2) =="
[ "$failed" = 0 ] && [ "$most" -le 2 ]
