-- set.lua — an all-or-nothing set over several pools of one backend (SPEC §3.5, also=; issue 22 item 5):
-- one call decides over the whole set. Library only (it begins each pool in turn, which an EVAL script,
-- whose KEYS is Redis's, cannot).
--
-- KEYS  [1..n] the pools' prefixes "{sb:POOL}" (2 ≤ n ≤ 17): the chosen pool first, then the lane's also=
-- ARGV  [1..5] the head (README), the same for every pool   [6] mode "submit" | "grant"   [7] rid (the
--       request's in every pool)
--       submit: [8] lane [9] may_wait [10] n, then n times: k, lane_budget_set, lane_budget (µs|-1),
--               client_cap (µs|-1), arrival (pool µs, or "-": now), selector canon ("" any)
--       grant:  [8] n
-- Decides, each pool begun (its checks, its instant settled) before anything of the set is written:
--   submit: room in every pool → granted in every pool (a lease and a token each); else, when it may
--       wait, a waiter in every pool, each a set's part (gated: never granted by its pool alone; first in
--       queue order with room it is said "ready" to its node and holds back those behind it); else
--       refused busy, naming the first pool without room ("cooldown" and its end when that pool lacks only
--       slots that rest, as submit says). Drained, max-queue ("full"), recovery: refused,
--       naming that pool. A rid the first pool knows already, or any other pool of the set (a call sent
--       again after the first pool's part was withdrawn): each pool's state, nothing changed.
--   grant: every part ready now (SETS.ready(): first among those it must not pass, room, lane limits) →
--       granted in every pool; else nothing granted ("not-ready", naming the first pool that is not; the
--       parts not ready are said ready again when they are).
-- Returns: { status, pool (1-based: the pool that stopped, refused or is not ready; 0: none), verdict
--       ("granted" | "queued" | "refused" | "not-ready" | "known" | "gone" | ""), { reply… } } with one
--       reply per pool begun, each as its pool's own call would answer (README, "Replies"), its body the
--       pool's Decision ({} when it decided nothing). A status other than "ok" ("settling", "unregistered",
--       "rules", "invalid", …) is that pool's (its reply the last): nothing of the set was done.
-- Worst case: n × SETTLE_MAX steps.

local SET_POOLS_MAX = 17
local SET_TRY_ARGS = 6

local function set()
        local keys, argv = KEYS, ARGV
        local n, mode, rid = #keys, argv[6], argv[7]
        local lane, may_wait = argv[8], argv[9] == '1'
        if n < 2 or n > SET_POOLS_MAX then
                return redis.error_reply('ERR slotbroker set: 2..' .. SET_POOLS_MAX .. ' pools')
        end
        if mode == 'submit' then
                if tonumber(argv[10]) ~= n or #argv ~= 10 + n * SET_TRY_ARGS then
                        return redis.error_reply('ERR slotbroker set: submit takes ' .. SET_TRY_ARGS .. ' arguments a pool')
                end
        elseif mode == 'grant' then
                if tonumber(argv[8]) ~= n or #argv ~= 8 then
                        return redis.error_reply('ERR slotbroker set: grant takes the count of pools')
                end
        else
                return redis.error_reply('ERR slotbroker set: mode submit or grant')
        end
        if not string.match(rid or '', '^%x+$') then return redis.error_reply('ERR slotbroker set: a rid') end
        -- A pool twice would be begun twice and written from a stale state: refused before anything.
        local seen = {}
        for i = 1, n do
                if seen[keys[i]] then return redis.error_reply('ERR slotbroker set: a pool twice') end
                seen[keys[i]] = true
        end
        local head = { argv[1], argv[2], argv[3], argv[4], argv[5] }
        local ctx, replies, room, takes, waiters = {}, {}, {}, {}, {}

        local function try_arg(i, j) return argv[10 + (i - 1) * SET_TRY_ARGS + j] end
        -- The pools begun before i answer what their settling did; i's reply r is the last.
        local function finish(i, status, verdict, r)
                for j = 1, i - 1 do
                        SETS.load(ctx[j])
                        replies[j] = reply('ok', {})
                end
                replies[i] = r
                return { status, i, verdict, replies }
        end
        -- Each pool's state of a rid it knows (a resent call whose reply was lost): nothing changed.
        local function known()
                for j = 1, n do
                        if j > 1 then
                                KEYS, ARGV = { keys[j] }, head
                                call_begin()
                                local early_reply = prelude_begin(false)
                                if early_reply then return { early_reply[1], j, '', replies } end
                        end
                        local d = { 'gone' }
                        -- (a reference to another's record is dropped, not followed: ref_follow())
                        local kind, rec = ref_follow(NODE, rid, redis.call('HGET', K.rid, NODE .. ':' .. rid))
                        if kind == 'w' then
                                local w = rec
                                if w then
                                        d = decision('queued', rid, now, {
                                                state = w.state, idle = w.idle, budget = w.budget,
                                                position = waiter_position(w), queued = M.waiting,
                                        })
                                        -- Said ready already (the node restarted, or lost the reply that
                                        -- queued it): said again, or it would not be said until a grant
                                        -- finds it not ready, which the node waits for the word to send.
                                        if w.gated and w.ready then
                                                events[#events + 1] = decision('ready', rid, now, {
                                                        state = w.state, idle = w.idle, budget = w.budget,
                                                })
                                        end
                                end
                        elseif kind == 'l' then
                                if rec then d = lease_decision(rec) end -- (nil: garbage or another's, dropped: "gone")
                        else
                                d = outcome_get(NODE, rid) or d
                        end
                        replies[j] = reply('ok', d)
                end
                return { 'ok', 0, 'known', replies }
        end

        -- Begin every pool: its checks, its instant settled, the set's verdict there; nothing of the set yet.
        local first_short, verdict, by = nil, nil, 0
        for i = 1, n do
                KEYS, ARGV = { keys[i] }, head
                call_begin()
                local early_reply = prelude_begin(false)
                if early_reply then return finish(i, early_reply[1], '', early_reply) end
                local refused = node_admitted()
                if refused then return finish(i, refused, '', reply(refused)) end
                if i == 1 then
                        local ref = redis.call('HGET', K.rid, NODE .. ':' .. rid)
                        if mode == 'submit' and (ref or outcome_get(NODE, rid)) then return known() end
                        if mode == 'grant' and string.match(ref or '', '^l:') then return known() end
                        -- A submit sent again whose part in the first pool is gone while another pool still has
                        -- its own (the node gave the set up while this call's answer was lost, and the first
                        -- pool's withdraw went before the call did): each pool's state too. Decided afresh, that
                        -- pool would hold two records under one rid, which its counts find wrong at its next call
                        -- (the pool made anew, a recovery window for every node). One HGET a pool.
                        for j = 2, mode == 'submit' and n or 1 do
                                if redis.call('HGET', keys_of(keys[j]).rid, NODE .. ':' .. rid) then return known() end
                        end
                end
                if not settle_until(now) then return finish(i, 'settling', '', reply('settling')) end
                rests.wake(now)
                local in_recovery = M.recovery_until > 0 and now < M.recovery_until
                if mode == 'submit' then
                        local k, sel = tonumber(try_arg(i, 1)), try_arg(i, 6)
                        local rule = R.lanes[lane]
                        if not rule or rule.health or not k or k < 1 or k > R.limit then
                                return finish(i, 'invalid', '', reply('invalid'))
                        end
                        if sel ~= '' then
                                local _, m = selector_members(sel)
                                if not m or m < k then return finish(i, 'invalid', '', reply('invalid')) end
                        end
                        local why = nil
                        if M.drained == 1 then
                                why = { 'unavailable', 'drained' }
                        elseif in_recovery and not may_wait then
                                why = { 'unavailable', 'recovery' }
                        end
                        if not in_recovery then room[i], takes[i] = room_for(lane, k, sel) end
                        if not why and not room[i] and may_wait and R.max_queue >= 0 and M.waiting >= R.max_queue then
                                why = { 'full', '' }
                        end
                        if why then
                                local d = decision('refused', rid, now, { refusal = why[1], reason = why[2] })
                                return finish(i, 'ok', 'refused', reply('ok', d))
                        end
                        if not room[i] and not first_short then first_short = i end
                else
                        local kind, w = ref_follow(NODE, rid, redis.call('HGET', K.rid, NODE .. ':' .. rid))
                        if kind ~= 'w' or not w or not w.gated then return finish(i, 'ok', 'gone', reply('ok', { 'gone' })) end
                        waiters[i] = w
                        room[i], takes[i] = SETS.ready(w)
                        if not room[i] then
                                SETS.unready(w) -- said again when it is ready
                                if not first_short then first_short = i end
                        end
                end
                ctx[i] = SETS.save()
        end

        if not first_short then
                verdict = 'granted'
        elseif mode == 'grant' then
                verdict, by = 'not-ready', first_short
        elseif may_wait then
                verdict = 'queued'
        else
                verdict, by = 'refused', first_short
        end
        for i = 1, n do
                SETS.load(ctx[i])
                local d = {}
                if verdict == 'granted' then
                        local w = waiters[i]
                        local l
                        if w then
                                waiter_unlink(w, true)
                                l = grant(w.node, w.rid, w.lane, w.k, w.arrival, now, w, takes[i])
                                d = lease_decision(l)
                                notify(w.node, d)
                        else
                                local k = tonumber(try_arg(i, 1))
                                l = grant(NODE, rid, lane, k, tonumber(try_arg(i, 5)) or now, now, nil, takes[i])
                                d = lease_decision(l)
                                outcome_store(NODE, rid, d)
                        end
                        finish_instant()
                elseif verdict == 'queued' then
                        local k, arrival = tonumber(try_arg(i, 1)), tonumber(try_arg(i, 5)) or now
                        local budget_set, cap = try_arg(i, 2) == '1', unwire(try_arg(i, 4))
                        meta_incr('seq', 1)
                        local w = {
                                wid = string.format('%016x', M.seq), node = NODE, rid = rid, lane = lane, k = k,
                                arrival = arrival, state = 'none', idle = 0, budget = INF, shed = false,
                                prio = R.lanes[lane].priority, sel = try_arg(i, 6), gated = true,
                        }
                        BUDGET.fix(w, now, budget_set, budget_set and unwire(try_arg(i, 3)), cap)
                        waiter_link(w)
                        d = decision('queued', rid, now, {
                                state = w.state, idle = w.idle, budget = w.budget, position = waiter_position(w),
                                queued = M.waiting,
                        })
                        finish_instant() -- with room here, it is said ready at once
                elseif i == by and verdict == 'refused' then
                        -- Busy; "cooldown" when this pool lacks only slots that rest, as submit says it
                        local wake = rests.busy_at(lane, tonumber(try_arg(i, 1)), try_arg(i, 6))
                        d = decision('refused', rid, now, { refusal = 'busy', reason = wake and 'cooldown' or '' })
                        d[15] = wake
                end
                replies[i] = reply('ok', d)
        end
        return { 'ok', by, verdict, replies }
end

return set()
