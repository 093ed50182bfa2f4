-- release.lua — a lease of this node ends: its slots go back, and to waiters in queue order
-- (pool-local.c:local_release(); SPEC §3.3 step 1).
--
-- KEYS  [1] "{sb:POOL}"
-- ARGV  [1..5] the head (README)   [6] token   [7] rid   [8] the exit status its command told (0–255;
--       absent or "": none told)   [9] its job ("" none)
-- Decides: the lease under token, if it is this node's with that rid, is freed (positions out of occ and,
--       unless a drained member, busy; its identities out of sid; lane and pool counters; the node's
--       records and fingerprint). Any other token is "gone": nothing changes — a retry, or a lease freed
--       by a reap or lost to a Redis restart, whose token is nobody else's (tokens are unique); and a record
--       naming places that are not its own (prelude.lua, lease_free(): dropped, "bad-key" "h"). In a pool
--       with cooldown= the slots rest first (README, "Cooldown"). Neither
--       registration nor agreed rules are required: leases granted under the agreed rules end as usual.
--       A lease released with an exit status counts for its members' quarantine (prelude.lua,
--       LIFE.released(): quarantine-exit-codes= in the rules; a retry that finds it "gone" counts nothing).
--       Then the instant (settle flag 1: the freed slots are granted at once), or the tick does it.
-- Appends: the grants and refusals of the instant, to their owners' streams and outcome keys.
-- Returns: { status, now, { "released" | "gone" }, events, cache, notices (a quarantine: "quarantined") };
--       "settling" before anything
--       changed when earlier instants need more than the budget.
-- Worst case: SETTLE_MAX steps + O(k) for the lease.

local TOKEN, RID = ARGV[6], ARGV[7]
local EXIT_STATUS, JOB = int_of(ARGV[8]), ARGV[9]

local function release()
        local early_reply = prelude_begin(false)
        if early_reply then return early_reply end
        carry.heads_on = true -- it writes dl, nodes, lv, orph only through functions that drop the heads
        if not settle_until(now) then return reply('settling') end
        rests.wake(now)

        local result = 'gone'
        local l = tonumber(TOKEN) and lease_get(TOKEN)
        if l and l.node == NODE and l.rid == RID and lease_free(l) then
                result = 'released'
                if EXIT_STATUS and EXIT_STATUS >= 0 and EXIT_STATUS <= 255 then
                        LIFE.released(l, EXIT_STATUS, JOB ~= '' and JOB or nil)
                end
        end
        finish_instant()
        return reply('ok', { result })
end

return release()
