-- drain.lua — a drain or undrain of the pool or of one member (pool-local.c:local_drain(); SPEC §3.3
-- "pool drained … while waiting: refused unavailable").
--
-- KEYS  [1] "{sb:POOL}"
-- ARGV  [1..5] the head (README)   [6] member name, or "" for the whole pool   [7] on (0/1)
--       [8] who ("uid N")   [9] reason   [10] until (pool µs; "": none) — [8…] absent (a plain drain, tests):
--       the record is left as it is; present: the drain's record (prelude.lua, DRAINS.record()) is made
--       (on: replacing any) or dropped (off), and the caller's reply tells it ([6] notices)
-- Decides: the pool: meta.drained = on; on → every waiter is refused unavailable "drained", the
--       reservations' lane ("@reserve") first, then lane by lane (by name), bucket by bucket (k ascending),
--       in arrival order (a member of lk:L that is no slot count leaves with its bucket, told "bad-key" "lk",
--       as queue_next() drops it). At most SETTLE_MAX refusals per call:
--       "settling" until none is left; the pool is drained from the first call on, so nothing is granted
--       meanwhile (unlike other operations, a "settling" drain has done part of its work: sending it again
--       finishes it). A member: added to or removed from {sb:P}:dm; its position (its index among the
--       members) leaves or rejoins `busy` when nobody holds it, and drained_free follows; a held one stays
--       held, and stays out of `busy` when released while drained. An unknown member: "unknown-member".
--       Then the instant (settle flag 1), or the tick does it.
-- Appends: the refusals, to their owners' streams and outcome keys.
-- Returns: { status, now, { "drained" | "undrained" | "unknown-member" }, events, cache, notices }.
-- Worst case: SETTLE_MAX steps + O(lanes × distinct k) per refusal.

local MEMBER, ON = ARGV[6], ARGV[7] == '1'
local WHO, WHY, UNTIL = ARGV[8], ARGV[9] or '', int_of(ARGV[10])

-- The lane's selector buckets (SPEC §3.5) after its (lane, k) ones, k ascending, then by canon.
local function drain_selector_buckets(lane)
        for _, s in ipairs(selector_buckets_sorted(lane)) do
                while true do
                        local wid = redis.call('ZRANGE', k_bucket(lane, s), '0', '0')[1]
                        if not wid then break end
                        if not step() then return false end
                        local w = waiter_get(wid)
                        if w then waiter_refuse(w, 'unavailable', 'drained', now) end
                        redis.call('ZREM', k_bucket(lane, s), wid) -- gone already, or a record of another bucket
                end
        end
        return true
end

local function drain_pool()
        meta_set('drained', ON and 1 or 0)
        if not ON then return true end
        -- The reservations' lane first, as it is first in the queue (SPEC §3.6: ahead of every waiting job),
        -- whatever the other lanes are named ("0ci" sorts before "@reserve"), as pool-local.c refuses them.
        local lanes = { RESERVE_LANE }
        for _, lane in ipairs(R.lane_names) do
                if lane ~= RESERVE_LANE then lanes[#lanes + 1] = lane end
        end
        for _, lane in ipairs(lanes) do
                -- Untrusted (anyone may write lk:L): a member that is not a slot count as waiter_link() writes it
                -- (its sort failed on "x") leaves lk:L with its bucket, told, as queue_next() drops it.
                local ks = {}
                for _, k in ipairs(redis.call('SMEMBERS', k_lk(lane))) do
                        local n = tonumber(k)
                        if n and n >= 1 and n <= 2147483648 and istr(n) == k then
                                ks[#ks + 1] = k
                        else
                                redis.call('SREM', k_lk(lane), k)
                                -- (not a selector's bucket, "K:CANON": ls:L's, its waiters' own)
                                if not string.find(k, ':', 1, true) then redis.call('DEL', k_bucket(lane, k)) end
                                LIFE.bad('lk', k)
                        end
                end
                table.sort(ks, function(a, b) return tonumber(a) < tonumber(b) end)
                for _, k in ipairs(ks) do
                        while true do
                                local wid = redis.call('ZRANGE', k_bucket(lane, k), '0', '0')[1]
                                if not wid then break end
                                if not step() then return false end
                                local w = waiter_get(wid)
                                if w then waiter_refuse(w, 'unavailable', 'drained', now) end
                                -- Whatever its record says (Redis's content is untrusted), the wid leaves
                                -- this bucket: a record naming another bucket would not take it out.
                                redis.call('ZREM', k_bucket(lane, k), wid)
                        end
                end
                if not drain_selector_buckets(lane) then return false end
        end
        return HEALTH.refuse_all('drained', now) -- health lanes' waiters too (pool-local.c, lane_refuse_all())
end

local function drain()
        local early_reply = prelude_begin(false)
        if early_reply then return early_reply end
        if not settle_until(now) then return reply('settling') end
        if MEMBER == '' then
                if not drain_pool() then return reply('settling') end
        elseif not DRAINS.member(MEMBER, ON) then
                return reply('ok', { 'unknown-member' })
        end
        if WHO then
                DRAINS.record(MEMBER, ON, WHO ~= '' and WHO or nil, WHY ~= '' and WHY or nil, ON and UNTIL or nil)
        end
        finish_instant()
        return reply('ok', { ON and 'drained' or 'undrained' })
end

return drain()
