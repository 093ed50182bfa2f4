-- tick.lua — a node's heartbeat: registration and liveness, the pool's creation and epoch, agreement on
-- the rules, the token floor, a page of reconcile, and the instant (memo §3.6). In the manual clock mode
-- a tick with the settle flag 1 is the engine's run(now): it completes the instant that the operations of
-- `now` left unsettled; with 0 (a configure or a heartbeat between them) it leaves the instant open, as
-- every other operation does.
--
-- KEYS  [1] "{sb:POOL}"
-- ARGV  [1..5] the head (README)   [6] node name   [7] the rules canon the node wants ("=": as in its
--       last tick; "*": whatever is stored, from a node that no longer configures the pool but holds a
--       lease there)   [8] fp_n   [9] fp_x   [10] fp_s (the node's fingerprint of its records)
--       (not used here: the node compares them with the reply's; they make a MONITOR trace show both)
--       [11] token floor ("-": none; else tokens continue above floor − 1: the node sends it with every
--       tick, one above the highest token it passed on)   [12] a new epoch (random
--       hex, used only if the pool's keys must be made)   [13] reclaimed: "1" Redis has every lease the
--       node holds (no reclaim pending), "0" not yet; either followed by "k" while the node cannot account
--       for its leases (its state directory unread, or damaged: SPEC §3.4)   [14] page_lo   [15] page_hi
--       ("": no reconcile; "-"/"+": open ends)   [16…] the node's rids in [page_lo, page_hi], at most
--       RECONCILE_PAGE
-- Decides: a wanted canon that is not rules (prelude.lua, rules_from(); "=": the node hash's; "*": the
--       stored one, else as "=") → "canon",
--       nothing else done. No meta.epoch → the pool is new or Redis lost it: whatever else of it Redis still
--       has is dropped (prelude.lua, pool_wipe()), and its keys are made with the caller's epoch,
--       clock mode (manual iff ARGV[3] is a number) and, in the redis clock mode, a recovery window of one
--       node TTL (no node can tell a new pool from a lost one); no stored rules → the caller's canon is
--       stored. Then every earlier instant is settled (dead nodes reaped in pages: "settling" before the
--       heartbeat counts if the budget runs out). Agreement: the wanted canon equal to the stored one →
--       ok; else adopted when every other live node wants it too, or wants "*" (held slots laid out again at once, a
--       removed lane's waiters refused and a re-prioritised lane's waiters moved by a job that runs at
--       the start of instants, SETTLE_MAX per call: no other adoption while it runs); else "rules" with
--       the differing keys. The node's deadline becomes now + TTL either way
--       (leases granted under agreed rules keep heartbeating). The token floor raises the counter (before
--       this call's grants). The reconcile page drops this node's records in [page_lo, page_hi] that the
--       page does not list: a waiter at once; a lease becomes an orphan that lapses one node TTL later
--       (prelude.lua, lease_orphan(): the node cannot account for it, its holder may still run), or, with
--       "k", stays the node's as it is (its holder may run past any lapse: nobody could fence it). The
--       caller's incarnation (ARGV[2]) becomes the registered one. Inside a recovery window that waits for its nodes
--       (prelude.lua, "recovery windows"): reclaimed "1" takes the node off the wait, and the last one
--       ends the window now (1 s after it opened at the earliest); "0" adds it. Then the instant at
--       now (settle flag 1), or it stays open for a later call (0).
-- Appends: the instant's grants and refusals, to their owners' streams and outcome keys.
-- Returns: { status ("ok" | "rules" | "settling" | …), now, body, events, cache, notices } with body
--       { deadline, epoch, recovery_until, rules status, { differing keys… }, { fp_n, fp_x, fp_s },
--       stream last id, live nodes, reconciled_to ("": the whole page range; else the last rid looked at,
--       continue after it), kept ({ n, x, s } of the leases a "k" page kept; absent: none) } (README, "tick").
-- Worst case: SETTLE_MAX steps + RECONCILE_PAGE × O(log n) + O(nodes) for adoption + O(rules size);
--       an adoption that lays held slots out again: O(slots held) once.

local NAME, CANON_ARG = ARGV[6], ARGV[7]
local FLOOR, NEW_EPOCH, RECLAIMED = ARGV[11], ARGV[12], string.sub(ARGV[13] or '', 1, 1) == '1'
local PAGE_LO, PAGE_HI = ARGV[14] or '', ARGV[15] or ''
local TOKEN_MAX = 2 ^ 53 -- tokens are exact integers below it (README, "Conventions")

local function differing_keys(a, b)
        local keys, seen = {}, {}
        for k, v in pairs(a) do
                seen[k] = true
                if b[k] ~= v then keys[#keys + 1] = k end
        end
        for k in pairs(b) do if not seen[k] then keys[#keys + 1] = k end end
        table.sort(keys)
        return keys
end

local function rules_store(canon)
        local fields = canon_parse(canon)
        redis.call('DEL', K.rules)
        local args = { 'canon', canon }
        for k, v in pairs(fields) do args[#args + 1] = k; args[#args + 1] = v end
        redis.call('HSET', K.rules, unpack(args))
        local had_q = R.q ~= nil
        R = rules_parsed(canon, fields)
        -- A pool that starts measuring idle time starts from now (SPEC §3.1).
        if R.q and not had_q then meta_set('last_fast', now) end
end

-- pool-local.c:layout_plan()/layout_apply() under the stored (just adopted) rules: every held slot at
-- its place (its member's index among the members, or its index in a pool of anonymous slots) when
-- that place is free, the others above the limit, where they count as held until released; then `busy`
-- is `occ` plus the drained members' free places. O(slots held), in one call: held ≤ the old limit plus
-- what was above it already.
local function relayout()
        local home_of = {}
        for i, m in ipairs(R.members or {}) do home_of[m] = i - 1 end
        local leases = {}
        local h = redis.call('HGETALL', K.h)
        for i = 1, #h, 2 do leases[#leases + 1] = lease_get(h[i]) end
        table.sort(leases, function(a, b) return a.token < b.token end) -- grant order, as pool-local's list
        local taken = {}
        for _, l in ipairs(leases) do
                for i = 1, l.k do
                        local m, home = l.members[i], nil
                        if R.members then home = m and home_of[m] elseif not m then home = l.slots[i] end
                        if home and not taken[home] then
                                taken[home] = true
                                l.pos[i] = home
                        else
                                l.pos[i] = false
                        end
                end
        end
        local next = R.limit
        for _, l in ipairs(leases) do
                for i = 1, l.k do
                        if not l.pos[i] then
                                while taken[next] do next = next + 1 end
                                taken[next] = true
                                l.pos[i] = next
                        end
                end
                lease_put(l)
        end
        redis.call('DEL', K.occ, K.busy)
        for pos in pairs(taken) do
                redis.call('SETBIT', K.occ, pos, 1)
                redis.call('SETBIT', K.busy, pos, 1)
        end
        local drained_free = 0
        for i, m in ipairs(R.members or {}) do
                if not taken[i - 1] and member_drained_at(i - 1) then -- drained or quarantined
                        redis.call('SETBIT', K.busy, i - 1, 1)
                        drained_free = drained_free + 1
                end
        end
        meta_set('drained_free', drained_free)
        rests.relayout(taken)
end

-- The wanted canon becomes the pool's when every other live node wants it too (memo §4.8). What it
-- changes is applied as pool-local.c:local_configure() does: held slots laid out again, a removed
-- lane's waiters refused, a re-prioritised lane's waiters moved (those two as a job: prelude.lua,
-- rekey_step(), at this instant). While such a job runs no other change is adopted. A node that wants "*"
-- (it removed the pool from its configuration and still holds a lease there) holds no change back: its
-- lease lives under whatever rules the others agree on, as any lease does across an adoption.
local function agree(canon)
        if canon == R.canon then return 'ok', {} end
        local wanted = canon_parse(canon)
        local diff = differing_keys(canon_parse(R.canon), wanted)
        for _, other in ipairs(redis.call('ZRANGEBYSCORE', K.nodes, '(' .. istr(now), '+inf')) do
                if other ~= NODE then
                        local theirs = redis.call('HGET', k_node(other), 'rules')
                        if theirs ~= canon and theirs ~= '*' then return 'rules', diff end
                end
        end
        if redis.call('EXISTS', K.rekey) == 1 then return 'rules', diff end

        local old, new = R, rules_from(wanted)
        local job = {}
        for _, lane in ipairs(old.lane_names) do
                if lane_get(lane).waiting > 0 then
                        if not new.lanes[lane] then
                                job[#job + 1] = 'drop:' .. lane
                                job[#job + 1] = 1
                        else
                                if new.lanes[lane].priority ~= old.lanes[lane].priority then
                                        job[#job + 1] = 'move:' .. lane
                                        job[#job + 1] = new.lanes[lane].priority
                                end
                                -- Its health waiters (in hq) when it is no health lane any more (health = also
                                -- keeps them, as pool-local.c), or the pool has no members now.
                                local nl = new.lanes[lane]
                                if old.lanes[lane].health and (not (nl.health or nl.health_also) or not new.members) then
                                        job[#job + 1] = 'hdrop:' .. lane
                                        job[#job + 1] = 1
                                end
                        end
                end
        end
        -- Selector buckets (SPEC §3.5) whose labels or members the new rules take away: refused by the job.
        for _, lane in ipairs(new.lane_names) do
                if redis.call('SCARD', k_ls(lane)) > 0 then
                        job[#job + 1] = 'sdrop:' .. lane
                        job[#job + 1] = 1
                end
        end
        local layout_changed = new.limit ~= old.limit or
                table.concat(new.members or {}, ',') ~= table.concat(old.members or {}, ',') or
                (new.members == nil) ~= (old.members == nil) or
                ((old.cooldown or 0) > 0 and new.cooldown <= 0) -- rests end with cooldown= (rests.relayout())
        rules_store(canon)
        if layout_changed then relayout() end
        if #job > 0 then
                redis.call('HSET', K.rekey, 'at', now, unpack(job))
                if M.unsettled_at ~= now then
                        meta_set('unsettled_at', now)
                        meta_set('phase', 0)
                end
        end
        return 'ok', {}
end

-- Returns where the page got to ("": its whole range), and the fingerprint { n, x, s } of the leases it kept
-- ("k"; nil: none kept): the node adds them to its own to compare with Redis's (README, "Orphans").
local function reconcile()
        if PAGE_LO == '' then return '' end
        local listed, keep_leases, kept = {}, string.sub(ARGV[13] or '', 2) == 'k', nil
        for i = 16, #ARGV do listed[ARGV[i]] = true end
        local lo = PAGE_LO == '-' and '-' or '[' .. PAGE_LO
        local hi = PAGE_HI == '+' and '+' or '[' .. PAGE_HI
        local rids = redis.call('ZRANGEBYLEX', k_records(NODE), lo, hi, 'LIMIT', '0', RECONCILE_PAGE)
        for _, rid in ipairs(rids) do
                if not listed[rid] then
                        local kind, rec = ref_follow(NODE, rid, redis.call('HGET', K.rid, NODE .. ':' .. rid))
                        if kind == 'w' and rec then waiter_unlink(rec)
                        elseif kind == 'l' and rec then
                                if keep_leases then
                                        local h = rec.fp or fnv1a32(rid .. 'l')
                                        kept = kept or { 0, 0, 0 }
                                        kept[1] = kept[1] + 1
                                        kept[2] = bit.bxor(kept[2], h) % 4294967296
                                        kept[3] = (kept[3] + h) % 4294967296
                                else lease_orphan(rec) end
                        else redis.call('ZREM', k_records(NODE), rid) end -- no record behind it: no fingerprint
                end
        end
        return #rids == RECONCILE_PAGE and rids[#rids] or '', kept
end

local function tick()
        local early_reply = prelude_begin(true)
        if early_reply then return early_reply end

        local canon = CANON_ARG
        local any = canon == '*'
        if any then canon = R.canon end
        if canon == '=' or not canon then
                canon = redis.call('HGET', k_node(NODE), 'rules')
                if not canon or canon == '*' then return early('canon') end
        end
        -- A canon that is not rules (prelude.lua, rules_from(): the node hash's, written by hand) is none of the
        -- node's: it is never stored, adopted or parsed below.
        if not rules_parsed(canon) then return early('canon') end
        if not M.epoch then
                local ttl = rules_from(canon_parse(canon)).ttl
                -- Redis lost the pool's meta, maybe not the rest: nothing of it is trusted.
                pool_wipe(R.canon and R or rules_from(canon_parse(canon)))
                meta_set('leases', 0)
                meta_set('nodes', redis.call('ZCARD', K.nodes))
                meta_set('integrity', 1)
                meta_set('version', VERSION)
                meta_set('epoch', NEW_EPOCH)
                meta_set('clock_mode', MANUAL_NOW ~= '-' and 'manual' or 'redis')
                meta_set('run_id', RUN_ID)
                if M.clock_mode ~= 'manual' then recovery_open(now + ttl, {}, 'new') end
        end
        if not R.canon then rules_store(canon) end
        -- The node's floor (above every token it passed on) before any grant of this call: a pool made
        -- anew opens a window of one node TTL in which every live node ticks, so the first grant after a
        -- loss is above all their tokens, whatever Redis's clock says (README, "Recovery windows").
        local floor = string.match(FLOOR, '^%d+$') and tonumber(FLOOR)
        if floor and floor <= TOKEN_MAX and floor - 1 > M.counter then meta_set('counter', floor - 1) end

        -- Another incarnation's lapsed registration is reaped before this one registers: its leases lapse
        -- with it (tick.lua's own registration would otherwise renew them at the instant they lapse).
        if IDENTITY_TAKEOVER and not reap(now) then return reply('settling') end
        if not settle_until(now) then return reply('settling') end

        local status, diff = agree(canon)
        local deadline = now + R.ttl
        if redis.call('ZSCORE', K.nodes, NODE) == 'inf' and live_deadline(NODE) then
                -- Covered by its live key (README, "Liveness per node"): it stays so, the tick counting as a
                -- renewal of this pool.
                redis.call('ZADD', K.lv, 'GT', deadline, NODE)
        else
                meta_incr('nodes', redis.call('ZADD', K.nodes, deadline, NODE))
                redis.call('ZREM', K.lv, NODE)
        end
        -- Written when they change: a heartbeat rewrote the canon (and replicated it) every second.
        local held, set = redis.call('HMGET', k_node(NODE), 'name', 'rules', 'inc', 'since'), {}
        if held[1] ~= NAME then set[#set + 1] = 'name'; set[#set + 1] = NAME end
        local wants = any and '*' or canon -- what the other nodes' agree() reads
        if held[2] ~= wants then set[#set + 1] = 'rules'; set[#set + 1] = wants end
        if INCARNATION and held[3] ~= INCARNATION then set[#set + 1] = 'inc'; set[#set + 1] = INCARNATION end
        if not held[4] then set[#set + 1] = 'since'; set[#set + 1] = now end
        if #set > 0 then redis.call('HSET', k_node(NODE), unpack(set)) end
        local reconciled_to, kept = reconcile()
        recovery_vouch(RECLAIMED)
        -- An adoption's refusals belong to this call (pool-local refuses them in configure(), before any
        -- later arrival of the instant); what the budget leaves runs before the next operation
        -- (settle_until()) or instant.
        rekey_step()
        finish_instant()

        flush()
        local fp = redis.call('HMGET', k_node(NODE), 'fp_n', 'fp_x', 'fp_s')
        local last = redis.call('XREVRANGE', k_stream(NODE), '+', '-', 'COUNT', 1)[1]
        return reply(status, {
                deadline, M.epoch, M.recovery_until, status, diff,
                { tonumber(fp[1] or '0'), tonumber(fp[2] or '0'), tonumber(fp[3] or '0') },
                last and last[1] or '0-0', redis.call('ZCOUNT', K.nodes, '(' .. istr(now), '+inf'), reconciled_to,
                kept,
        })
end

return tick()
