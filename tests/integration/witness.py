#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""witness.py — "no slot granted twice", seen from the commands' side (SPEC §3.4).

Every witnessed command is a `slotctl run` of a small shell script. When it starts it takes one lock file
per slot it was given (SLOT_MEMBER, or SLOT_INDEX in a pool of anonymous slots, each in SLOT_POOL) with
O_EXCL (the shell's noclobber), holding its name and process id: a lock file that already exists, of a
process that still runs, is a slot held twice at once, written to a violations file. One whose process is
gone or a zombie (killed by SIGKILL before its SIGTERM trap gave the file back: a fence's end on a loaded
machine), in any pool the command takes slots of (its set's too), held nothing any more: it is removed, and
noted in a "stale" file. It then counts the pool's lock files (every slot held at that instant, its own
included) into a holders file, logs "start NAME POOL TOKEN SLOT..." and, when its body ends or it is sent
SIGTERM, gives its lock files back and logs "end …". Each start and end also goes to a "times" file with
its realtime stamp, and each violation says when: what a failure is read against brokerds' logs with.

check() asserts that there were no violations and that each pool's fencing tokens, in the order the
commands started, never repeat and never go back: right for one brokerd, whose commands start in grant
order. Commands of several brokerds sharing a pool (SPEC §11) start in no such order (two grants a
microsecond apart on two hosts), so check_shared() asserts what does hold there: no violations, tokens
unique per pool, increasing along each slot's successive holders (check_fencing()), and at most the
pool's limit of slots held at every instant (check_limits(), from the holders file: the number of lock
files only grows when a command takes its own, which then counts them).

    w = Witness(tmpdir)
    subprocess.Popen([SLOTCTL, "run", …, "--", *w.command("sleep 60")])      # or w.command_until_stopped(name)
    wait_for(lambda: w.started(), …); w.started()[-1].token
    w.check(self)                                                              # in a unittest.TestCase
    w.check_shared(self, {"grid": 4})                                          # several brokerds, one pool

Python 3 standard library only; imported beside harness.py.
"""
import collections
import itertools
import os
import shlex

# witness.sh DIR NAME BODY: BODY is shell text (eval'd) run between the start and the end; it sees $d and $n.
SCRIPT = r"""
d=$1 n=$2 body=$3
slots=$(printf '%s' "${SLOT_MEMBER:-$SLOT_INDEX}" | tr , ' ')
record() {
        printf '%s %s %s %s %s\n' "$1" "$n" "$SLOT_POOL" "$SLOT_TOKEN" "$slots" >>"$d/log"
        printf '%s %s %s\n' "$(date +%s.%N)" "$1" "$n" >>"$d/times"  # realtime, to read a failure against logs
}
held=$d/held/$SLOT_POOL
# An all-or-nothing set (a lane with also=, SPEC §3.5): $WITNESS_ALSO names its further pools; each one's
# SLOT_<POOL>_TOKEN, _INDEX, _MEMBER must be there (else the set was held in part) and is witnessed the same.
also_var() {
        v=SLOT_$(printf '%s' "$1" | tr 'a-z' 'A-Z' | tr -c 'A-Z0-9' '_')_$2
        eval "printf '%s' \"\${$v:-}\""
}
also_slots() {
        m=$(also_var "$1" MEMBER)
        printf '%s' "${m:-$(also_var "$1" INDEX)}" | tr , ' '
}
finish() {
        for s in $slots; do
                [ "$(cut -d' ' -f1 "$held/$s" 2>/dev/null)" = "$n" ] && rm -f "$held/$s"
        done
        for p in ${WITNESS_ALSO:-}; do
                for s in $(also_slots "$p"); do
                        [ "$(cut -d' ' -f1 "$d/held/$p/$s" 2>/dev/null)" = "$n" ] && rm -f "$d/held/$p/$s"
                done
        done
        record end
        for p in ${WITNESS_ALSO:-}; do
                printf '%s %s %s %s %s\n' end "$n" "$p" "$(also_var "$p" TOKEN)" "$(also_slots "$p")" >>"$d/log"
        done
}
# A holder killed before its trap ran (SIGKILL at the end of a fence's revoke grace, on a loaded machine)
# leaves its file behind: it holds nothing once its process is gone, which is what fencing is for. A file
# whose process lives is a slot held twice.
# A zombie (killed, not yet reaped by its slotctl or the test, a subreaper) is gone too: kill -0 finds it.
stale() {
        pid=$(cut -d' ' -f2 "$1" 2>/dev/null)
        [ -n "$pid" ] || return 1
        ! kill -0 "$pid" 2>/dev/null || grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2>/dev/null
}
# Every pool this command takes slots of: its own and its set's others (a killed set holder leaves files in each).
sweep() {
        mkdir -p "$1"
        for f in "$1"/*; do
                if [ -e "$f" ] && stale "$f"; then
                        printf '%s found %s of a process gone: %s\n' "$n" "$f" "$(cat "$f" 2>/dev/null)" >>"$d/stale"
                        rm -f "$f"
                fi
        done
}
trap 'finish; exit 143' TERM
sweep "$held"
for p in ${WITNESS_ALSO:-}; do
        sweep "$d/held/$p"
done
set -C
for s in $slots; do
        if ! printf '%s %s\n' "$n" "$$" 2>/dev/null >"$held/$s"; then
                printf '%s got %s %s while %s holds it (at %s)\n' "$n" "$SLOT_POOL" "$s" "$(cat "$held/$s")" \
                        "$(date +%s.%N)" >>"$d/violations"
        fi
done
for p in ${WITNESS_ALSO:-}; do
        if [ -z "$(also_var "$p" TOKEN)" ] || [ -z "$(also_slots "$p")" ]; then
                printf '%s got %s without %s: a set held in part (at %s)\n' "$n" "$SLOT_POOL" "$p" \
                        "$(date +%s.%N)" >>"$d/violations"
                continue
        fi
        mkdir -p "$d/held/$p"
        for s in $(also_slots "$p"); do
                if ! printf '%s %s\n' "$n" "$$" 2>/dev/null >"$d/held/$p/$s"; then
                        printf '%s got %s %s while %s holds it (at %s)\n' "$n" "$p" "$s" "$(cat "$d/held/$p/$s")" \
                                "$(date +%s.%N)" >>"$d/violations"
                fi
        done
done
set +C
set -- "$held"/*
printf '%s %s %s\n' "$SLOT_POOL" "$#" "$n" >>"$d/holders"
for p in ${WITNESS_ALSO:-}; do
        set -- "$d/held/$p"/*
        printf '%s %s %s\n' "$p" "$#" "$n" >>"$d/holders"
done
record start
for p in ${WITNESS_ALSO:-}; do
        printf '%s %s %s %s %s\n' start "$n" "$p" "$(also_var "$p" TOKEN)" "$(also_slots "$p")" >>"$d/log"
done
eval "$body"
finish
"""

Event = collections.namedtuple("Event", "what name pool token slots")


class Witness:
    """The witness's files in `directory` (the test's own temporary directory)."""

    def __init__(self, directory):
        self.dir = directory
        self.script = os.path.join(directory, "witness.sh")
        with open(self.script, "w") as f:
            f.write(SCRIPT)
        open(os.path.join(directory, "log"), "w").close()
        self._names = itertools.count(1)

    def command(self, body="sleep 60", name=None, also=()):
        """argv of a witnessed command that runs `body` (shell text); named `name` or a fresh name. `also`: the
        further pools of its lane's all-or-nothing set, witnessed too (their start and end lines follow its own)."""
        argv = ["sh", self.script, self.dir, name or f"cmd-{next(self._names)}", body]
        return ["env", "WITNESS_ALSO=" + " ".join(also), *argv] if also else argv

    def command_until_stopped(self, name, also=()):
        """argv of a witnessed command that runs until stop(name)."""
        return self.command('while [ ! -e "$d/stop-$n" ]; do sleep 0.02; done', name, also)

    def stop(self, name):
        open(os.path.join(self.dir, f"stop-{name}"), "w").close()

    def group_command(self, release_leader):
        """argv of a process group whose leader exits once the file release_leader exists, while a witnessed
        member of its group runs on (the issue's `sh -c 'sleep 30 & …; exit 0'`). The member ends on SIGTERM."""
        member = shlex.join(self.command("sleep 60 & wait"))
        return ["sh", "-c", f"{member} & while [ ! -e {release_leader} ]; do sleep 0.05; done; exit 0"]

    def events(self):
        """Every whole line of the log, in order, as Events (token an int, slots a list of str)."""
        with open(os.path.join(self.dir, "log")) as f:
            lines = f.read().split("\n")[:-1]  # the last one is "" or being written
        out = []
        for line in lines:
            what, name, pool, token, *slots = line.split()
            out.append(Event(what, name, pool, int(token), slots))
        return out

    def started(self, name=None):
        """The commands that started (all, or the one named), in order."""
        return [e for e in self.events() if e.what == "start" and name in (None, e.name)]

    def start_time(self, name):
        """The realtime (s) the command named `name` logged its start at, from the "times" file, or None."""
        with open(os.path.join(self.dir, "times")) as f:
            for line in f.read().split("\n")[:-1]:
                at, what, who = line.split()
                if what == "start" and who == name:
                    return float(at)
        return None

    def ended(self, name=None):
        return [e for e in self.events() if e.what == "end" and name in (None, e.name)]

    def check_violations(self, test):
        """Fails `test` if a slot was held twice at once."""
        try:
            with open(os.path.join(self.dir, "violations")) as f:
                test.fail("a slot was held twice at once:\n" + f.read())
        except FileNotFoundError:
            pass

    def check(self, test):
        """Fails `test` if a slot was held twice at once or a pool's fencing tokens repeated or went back."""
        self.check_violations(test)
        tokens = collections.defaultdict(list)
        for e in self.started():
            tokens[e.pool].append(e.token)
        for pool, seen in tokens.items():
            test.assertEqual(seen, sorted(set(seen)), f"fencing tokens of pool {pool} repeat or go back: {seen}")

    # several brokerds sharing a pool (SPEC §11)

    def holders(self):
        """Every count taken at a start, in order: (pool, slots held then, command name)."""
        try:
            with open(os.path.join(self.dir, "holders")) as f:
                lines = f.read().split("\n")[:-1]
        except FileNotFoundError:
            return []
        return [(pool, int(count), name) for pool, count, name in (line.split() for line in lines)]

    def max_concurrent(self):
        """{pool: the most slots held at once}: the maximum over time is reached when some command takes its
        lock files, and that command counts them right after (a release in between can only lower it)."""
        out = {}
        for pool, count, _ in self.holders():
            out[pool] = max(out.get(pool, 0), count)
        return out

    def check_fencing(self, test):
        """Fails `test` if a slot was held twice at once, two commands got the same fencing token of a pool,
        or a slot's successive holders (in the order they took it: each takes the lock file after the one
        before gave it back) got tokens that do not increase."""
        self.check_violations(test)
        owner = {}
        per_slot = collections.defaultdict(list)
        for e in self.started():
            other = owner.setdefault((e.pool, e.token), e.name)
            test.assertEqual(other, e.name, f"{e.name} and {other} both got token {e.token} of pool {e.pool}")
            for s in e.slots:
                per_slot[e.pool, s].append((e.token, e.name))
        for (pool, slot), seen in per_slot.items():
            tokens = [t for t, _ in seen]
            test.assertEqual(tokens, sorted(set(tokens)),
                             f"fencing tokens of slot {slot} of pool {pool} do not increase from holder to holder: "
                             f"{seen}")

    def check_limits(self, test, limits):
        """Fails `test` if a pool of `limits` ({pool: limit}) ever had more slots held at once."""
        seen = self.max_concurrent()
        for pool, limit in limits.items():
            test.assertLessEqual(seen.get(pool, 0), limit, f"pool {pool}: {seen.get(pool)} slots held at once, "
                                 f"limit {limit}")

    def check_shared(self, test, limits):
        """check_fencing() and check_limits(): the invariant of a pool shared by several brokerds."""
        self.check_fencing(test)
        self.check_limits(test, limits)
