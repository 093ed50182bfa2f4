#!/bin/bash
# SPDX-License-Identifier: MIT
# bench-run-vs-flock.sh — SPEC §12: `slotctl run --lane L -- true` costs no more than `flock FILE true`
# (ratio ≤ 1.0; the floor is about 0.9, as one process start dominates both).
#
# Usage: bench-run-vs-flock.sh BROKERD SLOTCTL [RUNS [ROUNDS]]      (defaults: 300 runs of each, 6 rounds)
#
# Starts brokerd on a private socket with a pool of 64 slots and a fail-fast lane L (room for every run, so
# nothing waits), then times both commands with hyperfine -N (no shell between it and the command): ROUNDS
# rounds of RUNS/ROUNDS runs each, after a warm-up, the order of the two flipped every round, so that the load
# of a shared machine falls on both alike. Prints the mean and median of each over all runs and their ratios,
# per round too, and the load average. The hyperfine JSON of each round is kept where $BENCH_JSON_DIR says.
# Without hyperfine (or with $BENCH_NO_HYPERFINE set), a loop of its own alternates the two run by run (timed
# from bash, whose fork counts on both sides). With $BENCH_FLOOR_BROKER (tests/bench/bench-floor-broker, which
# meson passes) and hyperfine, a third command goes in every round: slotctl run against that server, which
# only answers; what brokerd adds is the difference, and the floor's own ratio to flock is what this machine
# allows slotctl's protocol. A benchmark, not a test: it fails only when brokerd, slotctl or flock fails.
set -eu

if [ $# -lt 2 ]; then
        echo "usage: bench-run-vs-flock.sh BROKERD SLOTCTL [RUNS [ROUNDS]]" >&2
        exit 2
fi
brokerd=$(realpath "$1")
slotctl=$(realpath "$2")
runs=${3:-300}
rounds=${4:-6}
per_round=$(((runs + rounds - 1) / rounds))

dir=$(mktemp -d /tmp/bench-run-vs-flock.XXXXXX)
pid=
floor_pid=
cleanup() {
        for p in $pid $floor_pid; do
                kill "$p" 2>/dev/null || true
                wait "$p" 2>/dev/null || true
        done
        rm -rf "$dir"
}
trap cleanup EXIT

cat >"$dir/brokerd.conf" <<EOF
[pool p]
limit = 64

[lane L]
pools = p
policy = fail-fast
EOF
"$brokerd" --config "$dir/brokerd.conf" --socket "$dir/sock" --state-directory "$dir/state" 2>"$dir/brokerd.log" &
pid=$!

# The command line is the one SPEC §12 names: the socket comes from the environment.
export SLOTBROKER_SOCKET="$dir/sock"
unset SLOTBROKER_LANE CI_JOB_URL GITHUB_RUN_ID BUILD_URL 2>/dev/null || true
lockfile="$dir/lock"
: >"$lockfile"
run_cmd="$slotctl run --lane L -- true"
flock_cmd="flock $lockfile true"

for _ in $(seq 100); do
        "$slotctl" run --lane L -- true 2>/dev/null && break
        kill -0 "$pid" 2>/dev/null || { echo "bench-run-vs-flock: brokerd did not start:" >&2; cat "$dir/brokerd.log" >&2; exit 1; }
        sleep 0.05
done
$run_cmd # once more, loudly: a failure here is the benchmark's failure

floor_cmd=
if [ -n "${BENCH_FLOOR_BROKER:-}" ] && [ -z "${BENCH_NO_HYPERFINE:-}" ] && command -v hyperfine >/dev/null; then
        "$BENCH_FLOOR_BROKER" "$dir/floor.sock" &
        floor_pid=$!
        floor_cmd="$slotctl run --socket $dir/floor.sock --lane L -- true"
        for _ in $(seq 100); do
                [ -S "$dir/floor.sock" ] && break
                sleep 0.05
        done
        $floor_cmd
fi

echo "run-vs-flock: $runs runs of each in $rounds rounds; load average at start: $(cat /proc/loadavg)"

json_dir=${BENCH_JSON_DIR:-$dir}
mkdir -p "$json_dir"
if [ -z "${BENCH_NO_HYPERFINE:-}" ] && command -v hyperfine >/dev/null; then
        for r in $(seq "$rounds"); do
                if [ $((r % 2)) -eq 1 ]; then
                        set -- "$flock_cmd" "$run_cmd" ${floor_cmd:+"$floor_cmd"}
                else
                        set -- ${floor_cmd:+"$floor_cmd"} "$run_cmd" "$flock_cmd"
                fi
                # Its warnings about outliers are expected on a shared machine; its errors are not.
                if ! hyperfine -N --style none --warmup 10 --runs "$per_round" --export-json "$json_dir/round-$r.json" \
                        "$@" >/dev/null 2>"$dir/hyperfine.err"; then
                        cat "$dir/hyperfine.err" >&2
                        exit 1
                fi
        done
else
        echo "run-vs-flock: timing an alternating loop from bash (no hyperfine, or \$BENCH_NO_HYPERFINE)"
        for r in $(seq "$rounds"); do
                : >"$dir/times"
                for i in $(seq $((per_round + 10))); do
                        order="flock run"
                        [ $((i % 2)) -eq 0 ] && order="run flock" # which goes first alternates, run by run
                        for which in $order; do
                                cmd=$flock_cmd
                                [ "$which" = run ] && cmd=$run_cmd
                                t0=$EPOCHREALTIME
                                $cmd
                                t1=$EPOCHREALTIME
                                [ "$i" -gt 10 ] && echo "$which ${t0/./} ${t1/./}" >>"$dir/times"
                        done
                done
                python3 - "$dir/times" "$json_dir/round-$r.json" "$flock_cmd" "$run_cmd" <<'EOF'
import json, sys
times = {"flock": [], "run": []}
for line in open(sys.argv[1]):
    which, t0, t1 = line.split()
    times[which].append((int(t1) - int(t0)) / 1e6)
json.dump({"results": [{"command": sys.argv[3], "times": times["flock"]},
                       {"command": sys.argv[4], "times": times["run"]}]}, open(sys.argv[2], "w"))
EOF
        done
fi

python3 - "$json_dir" "$rounds" "$flock_cmd" "$run_cmd" "$floor_cmd" <<'EOF'
import json, statistics, sys
json_dir, rounds, flock_cmd, run_cmd, floor_cmd = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
all_times = {flock_cmd: [], run_cmd: []}
if floor_cmd:
    all_times[floor_cmd] = []
per_round = []
for r in range(1, rounds + 1):
    res = {x["command"]: x["times"] for x in json.load(open(f"{json_dir}/round-{r}.json"))["results"]}
    for c in all_times:
        all_times[c] += res[c]
    per_round.append((statistics.mean(res[run_cmd]) / statistics.mean(res[flock_cmd]),
                      statistics.median(res[run_cmd]) / statistics.median(res[flock_cmd])))
ms = lambda t: t * 1e3
f, s = all_times[flock_cmd], all_times[run_cmd]
for name, t in (("flock FILE true", f), ("slotctl run --lane L -- true", s)):
    print(f"run-vs-flock: {name:30} mean {ms(statistics.mean(t)):.2f} ms ± {ms(statistics.stdev(t)):.2f}, "
          f"median {ms(statistics.median(t)):.2f} ms, min {ms(min(t)):.2f} ms ({len(t)} runs)")
mean_ratio = statistics.mean(s) / statistics.mean(f)
median_ratio = statistics.median(s) / statistics.median(f)
print("run-vs-flock: per-round ratios (mean/median): " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in per_round))
print(f"run-vs-flock: ratio slotctl run / flock: mean {mean_ratio:.3f}, median {median_ratio:.3f}, "
      f"min {min(s) / min(f):.3f} (target <= 1.0: {'meets it' if median_ratio <= 1.0 else 'MISSES it'})")
if floor_cmd:
    fl = all_times[floor_cmd]
    print(f"run-vs-flock: {'slotctl run, floor server':30} mean {ms(statistics.mean(fl)):.2f} ms ± "
          f"{ms(statistics.stdev(fl)):.2f}, median {ms(statistics.median(fl)):.2f} ms ({len(fl)} runs)")
    print(f"run-vs-flock: the floor (a server that only answers) / flock: mean "
          f"{statistics.mean(fl) / statistics.mean(f):.3f}, median {statistics.median(fl) / statistics.median(f):.3f}; "
          f"brokerd adds {1e6 * (statistics.mean(s) - statistics.mean(fl)):.0f} us (mean), "
          f"{1e6 * (statistics.median(s) - statistics.median(fl)):.0f} us (median)")
EOF
echo "run-vs-flock: load average at end: $(cat /proc/loadavg)"
