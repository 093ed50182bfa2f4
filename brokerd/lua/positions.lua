-- positions.lua — where requests stand, and who holds and waits, for the node's cache and Status
-- (memo §3.9). Reads the pool's state as it is: it neither settles nor decides.
--
-- KEYS  [1] "{sb:POOL}"
-- ARGV  [1..5] the head (README; the settle flag is ignored)   [6] mode "pos" | "status"
--       [7…] pos: this node's rids, at most POSITIONS_MAX
-- Decides: nothing. pos: per rid, its waiter's place (the waiters of higher priorities, then its rank in
--       its own; a health waiter: its place among hq's, of meta.hwaiting), its lease, its recorded outcome,
--       or gone. status: every holder (≤ limit + slots held above a shrunk limit) with its node's name, the
--       first 100 waiters in queue order (the heads of the per-priority queues, highest priority first; the
--       first health waiters after them, up to 20 of the 100, each at its place among hq's), and the count
--       of the queue's.
-- Appends: nothing (the clock hash and, on a run id change, the recovery window, as every script).
-- Returns: { status, now, body, {}, cache, {} }; body as README, "positions".
-- Worst case: pos O(POSITIONS_MAX × (priorities + log n)); status O(holders + 100 × log n).

local MODE = ARGV[6]
local STATUS_WAITERS = 100
local STATUS_HEALTH = 20      -- of them kept for health waiters while any wait
local STATUS_VALUES = 131072  -- half of brokerd's cap on a reply (REDIS_REPLY_VALUES_MAX)

local function positions()
        local early_reply = prelude_begin(false)
        if early_reply then return early_reply end
        local out = {}
        if MODE == 'pos' then
                if #ARGV - 6 > POSITIONS_MAX then return reply('invalid') end
                for i = 7, #ARGV do
                        local rid = ARGV[i]
                        local kind, rec = ref_follow(NODE, rid, redis.call('HGET', K.rid, NODE .. ':' .. rid))
                        local w = kind == 'w' and rec
                        local l = kind == 'l' and rec
                        local done = not w and not l and outcome_get(NODE, rid)
                        if w then out[#out + 1] = { 'queued', waiter_position(w) } -- place, of how many
                        elseif l then out[#out + 1] = lease_decision(l)
                        elseif done then out[#out + 1] = done
                        else out[#out + 1] = { 'gone' } end
                end
                return reply('ok', out)
        end
        if MODE ~= 'status' then return reply('invalid') end

        local names = {}
        local function name_of(node)
                if not names[node] then names[node] = redis.call('HGET', k_node(node), 'name') or node end
                return names[node]
        end
        -- The reply must stay under brokerd's cap on a reply (262144 values): holders are listed while they
        -- fit in STATUS_VALUES (8 values each, and one per slot and member).
        local holders = {}
        local budget = STATUS_VALUES
        local h = redis.call('HGETALL', K.h)
        for i = 1, #h, 2 do
                local l = lease_get(h[i])
                if l then -- (nil: garbage, dropped)
                        budget = budget - 8 - #l.slots - #(l.members or {})
                        if budget < 0 then break end
                        holders[#holders + 1] = { l.node, name_of(l.node), l.rid, l.lane, l.token, l.at, l.slots,
                                                  l.members }
                end
        end
        local waiters = {}
        -- Health waiters (hq, README "Health lanes") after the queue's, each at its place among them, as
        -- pool-local.c places them: up to STATUS_HEALTH of the 100 are kept for them.
        local ordinary = STATUS_WAITERS - math.min(HEALTH.waiting(), STATUS_HEALTH)
        for _, prio in ipairs(redis.call('ZREVRANGE', K.prios, '0', '-1')) do
                if #waiters >= ordinary then break end
                for _, wid in ipairs(redis.call('ZRANGE', k_queue(prio), '0', ordinary - #waiters - 1)) do
                        local w = waiter_get(wid)
                        if w then -- (nil: a stale wid, or garbage dropped)
                                waiters[#waiters + 1] = { w.node, name_of(w.node), w.rid, w.lane, w.k, w.arrival, #waiters }
                        end
                end
        end
        if #waiters < STATUS_WAITERS and HEALTH.waiting() > 0 then
                for place, wid in ipairs(LIFE.keyed('ZRANGE', HEALTH.key(), '0', STATUS_WAITERS - #waiters - 1)) do
                        local w = waiter_get(wid)
                        if w then waiters[#waiters + 1] = { w.node, name_of(w.node), w.rid, w.lane, w.k, w.arrival, place - 1 } end
                end
        end
        return reply('ok', { holders, waiters, M.waiting })
end

return positions()
