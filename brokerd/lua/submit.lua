-- submit.lua — a request for k slots of a lane: granted at once, refused at once, or queued
-- (pool-local.c:local_submit(); SPEC §3, §3.1, §3.3).
--
-- KEYS  [1] "{sb:POOL}"
-- ARGV  [1..5] the head (README): version, node id, manual now or "-", run id, settle flag
--       [6] rid (16 hex: the node's request id)   [7] lane   [8] k   [9] may_wait (0/1)
--       [10] lane_budget_set (0/1)   [11] lane_budget (µs, -1 unbounded)   [12] client_cap (µs, -1 none)
--       [13] arrival (pool clock µs: what the wait and the fast-admission test count from; "-": now)
--       [14] selector: the canon of its labels and member (selector.c:selector_canon(), SPEC §3.5); "" or
--       absent: any slot
--       [15] fresh: "1" when the node never sent this rid before (its 64 random bits: no record nor outcome
--       can be this request's, so the idempotency lookups below are skipped); else, or absent: looked up
--       [16] the rid's lease hash, fnv1a32(rid .. "l") in decimal (README, "Fingerprint"): what a grant
--       keeps, as the node counts it; absent or not a 32-bit value: hashed here
-- Decides: in this order — a known rid (not fresh) answers what it got before and changes nothing; version, clock
--       mode, the node's registration and rules, a drained pool (unavailable "drained"), the lane and k,
--       a selector that is not a canon or that fewer than k members of the stored rules satisfy (invalid);
--       every earlier instant is settled (or "settling"); inside a recovery window a waiting
--       request queues and an impatient one is refused (unavailable "recovery"); room (the lane's
--       verdict is GRANTABLE and nobody who is not passed over waits; with a selector, or while one waits,
--       per member: prelude.lua, room_for()) → granted; else may not wait → refused busy (reason
--       "cooldown" and Decision [15] when resting slots would do: README, "Cooldown"); the queue at
--       max-queue → refused full (never lane "@reserve"); else queued with its budget fixed now.
--       Then the instant itself (settle flag 1), or it is left for the tick (manual clock).
-- Appends: decisions of waiters granted or refused in the instant, to their nodes' streams
--       ({sb:P}:s:NODE); a refusal at once to this rid's outcome record (README, "Outcome records":
--       {sb:P}:oh:NODE field RID, kept 10 s: it changed nothing, so a retry after that is decided afresh);
--       a grant at once none (its lease answers a retry); a queued request's own decision is the reply only.
-- Returns: { status, now, decision, events, cache, notices } (README, "Replies"); status "ok" carries
--       the decision (granted / queued / refused), "invalid" none.
-- Worst case: SETTLE_MAX steps + O(lanes × distinct k × log n) for the room check + O(log n) to queue.

local RID, LANE, K_SLOTS = ARGV[6], ARGV[7], tonumber(ARGV[8])
local MAY_WAIT, LANE_BUDGET_SET = ARGV[9] == '1', ARGV[10] == '1'
local LANE_BUDGET, CLIENT_CAP = unwire(ARGV[11]), unwire(ARGV[12])
local SELECTOR = ARGV[14] or ''
local FRESH, LEASE_HASH = ARGV[15] == '1', hash_of(ARGV[16])

local function submit()
        local early_reply = prelude_begin(false)
        if early_reply then return early_reply end
        carry.heads_on = true -- it writes dl, nodes, lv, orph only through functions that drop the heads

        -- Idempotency: the same rid again (a retry after a lost reply) gets what it got, nothing more.
        -- (A reference to a record that is gone or garbage (dropped by waiter_get(), lease_get()), or that is
        -- not this request's (dropped by ref_follow(), told), answers nothing: the pool is made anew by the
        -- next call, and this one is decided as a new request.) A fresh rid has nothing to find: two HGETs
        -- and a key name fewer a submit. (Garbage someone filed under it in rid made the counts differ
        -- before this call: "Integrity"; in oh, it is never read, and a refusal's record replaces it.)
        if not FRESH then
                local ref = redis.call('HGET', K.rid, NODE .. ':' .. RID)
                if ref then
                        local kind, rec = ref_follow(NODE, RID, ref)
                        if kind == 'w' and rec then
                                local place, of = waiter_position(rec)
                                return reply('ok', decision('queued', RID, now, {
                                        state = rec.state, idle = rec.idle, budget = rec.budget, position = place,
                                        queued = of,
                                }))
                        end
                        if kind == 'l' and rec then return reply('ok', lease_decision(rec)) end
                end
                local done = outcome_get(NODE, RID)
                if done then return reply('ok', done) end
        end

        local refused = node_admitted_carried()
        if refused then return reply(refused) end
        local arrival = tonumber(ARGV[13]) or now
        local function refuse_now(refusal, reason, retry_at)
                local d = decision('refused', RID, now, { refusal = refusal, reason = reason })
                d[15] = retry_at -- busy "cooldown": when enough rests end (README, "Decision")
                outcome_store(NODE, RID, d, nil, REFUSED_OUTCOME_MS)
                return reply('ok', d)
        end
        if M.drained == 1 then return refuse_now('unavailable', 'drained') end
        local rule = R.lanes[LANE]
        if not rule or not K_SLOTS or K_SLOTS < 1 or K_SLOTS > R.limit then return reply('invalid') end
        if SELECTOR ~= '' then
                local _, n = selector_members(SELECTOR)
                if not n or n < K_SLOTS then return reply('invalid') end
        end

        if not settle_until(now) then return reply('settling') end
        rests.wake(now)

        local in_recovery = M.recovery_until > 0 and now < M.recovery_until
        local d
        if in_recovery and not MAY_WAIT then
                return refuse_now('unavailable', 'recovery')
        end
        -- A health lane (SPEC §3.6; prelude.lua, HEALTH): quarantined members only, beside the queue; a request
        -- that no quarantined member can satisfy has nothing to wait for (pool-local.c, local_submit()).
        local room, take, hjob = false, nil, rule.health
        if rule.health_also and not in_recovery then
                -- health = also: quarantined members first when enough are free now, else ordinary (HEALTH.first())
                room, take = HEALTH.first(SELECTOR, LANE, K_SLOTS)
                hjob = room
        end
        if room then
                -- (health = also, granted its quarantined members below)
        elseif rule.health then
                if not R.members then return reply('invalid') end
                local self = { sel = SELECTOR }
                if HEALTH.capacity(self) < K_SLOTS then return refuse_now('unavailable', HEALTH.refusal(self, K_SLOTS)) end
                local fits, usable = HEALTH.fits(self, LANE, K_SLOTS, HEALTH.for_new())
                if fits and not in_recovery then room, take = true, usable end
        elseif not in_recovery then
                -- Room (SPEC §3): a waiter that a lane limit passes over does not count as waiting here
                -- (pool-local.c, local_submit()).
                room, take = room_for(LANE, K_SLOTS, SELECTOR)
        end
        if room then
                -- No outcome record: while the lease lasts, a retry finds it by its rid (above); it ends by
                -- this node's release (which holds the reply's token), a withdrawal, a reap (the node's
                -- records go with it) or an orphan's lapse (a rid the node forgot). README, "Outcome records".
                d = lease_decision(grant(NODE, RID, LANE, K_SLOTS, arrival, now, nil, take, hjob, LEASE_HASH))
        elseif not MAY_WAIT then
                -- Busy for want of slots that rest (pool-local.c): says so, and when enough of them wake.
                local wake = rests.busy_at(LANE, K_SLOTS, SELECTOR)
                if wake then return refuse_now('busy', 'cooldown', wake) end
                return refuse_now('busy', '')
        elseif R.max_queue >= 0 and M.waiting >= R.max_queue and LANE ~= RESERVE_LANE then
                -- (a reservation is a person's, one at a time: never refused full, as in pool-local.c)
                return refuse_now('full', '')
        else
                meta_incr('seq', 1)
                local w = {
                        wid = string.format('%016x', M.seq), node = NODE, rid = RID, lane = LANE, k = K_SLOTS,
                        arrival = arrival, state = 'none', idle = 0, budget = INF, shed = false,
                        prio = rule.priority, sel = SELECTOR, health = rule.health or nil,
                }
                -- The budget is fixed now, from the idle time now (SPEC §3.1).
                BUDGET.fix(w, now, LANE_BUDGET_SET, LANE_BUDGET, CLIENT_CAP)
                waiter_link(w)
                local place, of = waiter_position(w)
                d = decision('queued', RID, now, {
                        state = w.state, idle = w.idle, budget = w.budget, position = place, queued = of,
                })
        end
        finish_instant()
        return reply('ok', d)
end

return submit()
