-- renew.lua — a node's liveness on a backend, for every pool it names, in one call a second (issue 21 item
-- 3; README, "Liveness per node"). It writes the node's live key and reads, per pool, only whether the
-- pool registered this incarnation and whether that registration is live without a break: it reaps,
-- settles and grants nothing (a pool's own calls do, at the deadlines the live key gives: prelude.lua,
-- live_deadline()).
--
-- KEYS  [1] "sb:live:NODE" (NODE as in ARGV[2]: anything else is refused "invalid")
-- ARGV  [1..5] the head (README; ARGV[2] must carry an incarnation; ARGV[3] must be "-": the redis clock;
--       the run id and the settle flag are not used)   [6] TTL µs: the longest backend-node-ttl of the
--       pools named (how long the key keeps this node id for this incarnation: "identity")
--       [7…] the pools' prefixes "{sb:POOL}", at most RENEW_POOLS_MAX
-- Decides: another incarnation's live key (not one the caller succeeds, written less than its TTL ago on
--       the backend clock) → "identity", nothing written. Else a pool is covered when its node hash's
--       inc is the caller's incarnation and its registration is live without a break: the previous live
--       key covered it (same incarnation, same backend clock, named it, `at` + the pool's TTL ahead), or
--       its score is ahead of the pool clock (its registering tick; the clock's pending gap could only
--       make it later). A pool whose registration lapsed is never covered again by a renewal: its tick
--       (which reaps it first) registers it anew.
-- Writes: sb:live:NODE { inc, at (backend clock), cid (backend clock id), ttl, pools ",P1,P2,…," (the
--       covered ones) } with PX = TTL + LIVE_KEEP (its expiry only collects garbage: coverage is judged
--       on `at`), and the backend clock (sb:clock) when a second passed since its last write.
-- Returns: { status ("ok" | "identity" | "invalid" | "version" | "manual-clock"), backend clock now, body,
--       {}, {}, {} } with body { covered (1/0) per pool named, in order } for "ok".
-- Worst case: O(pools) commands, ~2 a pool (~5 for a pool not covered a second ago), and O(bytes of the
--       pool list) of string search.

local RENEW_POOLS_MAX = 1024

-- Pool p's clock now, or later: its last call's skew without the backend's gap since (which could only make
-- it earlier), and after its last now.
local function pool_now_bound(p)
        local c = redis.call('HMGET', p .. ':clock', 'last_now', 'skew')
        local last_now, skew = tonumber(c[1] or ''), tonumber(c[2] or '')
        if not last_now or not skew then return INF end
        return math.max(raw_time - skew, last_now + 1)
end

local function renew()
        local function refuse(status, body) return { status, bnow or 0, body or {}, {}, {}, {} } end
        if ARGV[1] ~= tostring(VERSION) then return refuse('version', { VERSION }) end
        if MANUAL_NOW ~= '-' then return refuse('manual-clock') end
        local key = KEYS[1]
        local ttl = int_of(ARGV[6])
        if not INCARNATION or key ~= LIVE_PREFIX .. NODE or not ttl or ttl <= 0 or ttl > LIVE_TTL_MAX or
           #ARGV - 6 > RENEW_POOLS_MAX then
                return refuse('invalid')
        end
        local tm = redis.call('TIME')
        raw_time = tonumber(tm[1]) * USEC_PER_SEC + tonumber(tm[2])
        backend_clock()
        if not bnow then return refuse('invalid') end -- sb:clock out of reach (an ACL): no renewal

        -- The key as it is: anyone may have written it (another type, garbage, a clone's).
        local ok, old = pcall(redis.call, 'HMGET', key, 'inc', 'at', 'cid', 'ttl', 'pools')
        local mine, o_at, o_pools = false, nil, ''
        if ok and old[1] then
                local at, o_ttl = int_of(old[2]), int_of(old[4])
                if at and (old[3] ~= bclock_id or at > bnow) then at = bnow end
                if old[1] == INCARNATION then
                        mine = old[3] == bclock_id
                        o_at = at
                        if type(old[5]) == 'string' and #old[5] <= LIVE_POOLS_MAX then o_pools = old[5] end
                elseif not PREVIOUS[old[1]] and at and o_ttl and o_ttl <= LIVE_TTL_MAX and at + o_ttl > bnow then
                        return refuse('identity')
                end
        end

        local covered, body = {}, {}
        for i = 7, #ARGV do
                local p = ARGV[i]
                local yes = false
                if #p <= 300 and string.match(p, '^{sb:[^{}]+}$') and
                   redis.call('HGET', p .. ':node:' .. NODE, 'inc') == INCARNATION then
                        local pttl = int_of(redis.call('HGET', p .. ':rules', 'backend-node-ttl')) or 30 * USEC_PER_SEC
                        local score = redis.call('ZSCORE', p .. ':nodes', NODE)
                        if score == 'inf' then
                                -- Covered already: live without a break by the previous key, or by its lv score.
                                yes = mine and o_at and o_at + pttl > bnow and
                                      string.find(o_pools, ',' .. p .. ',', 1, true) ~= nil
                                if not yes then
                                        local lv = tonumber(redis.call('ZSCORE', p .. ':lv', NODE) or '')
                                        yes = lv ~= nil and lv > pool_now_bound(p)
                                end
                        elseif score and redis.call('HGET', p .. ':meta', 'clock_mode') == 'redis' and
                               tonumber(score) > pool_now_bound(p) then
                                -- Registered by its tick: covered from now on. Its score becomes +inf, which a
                                -- reader of a version before the live keys never reaps; its deadline moves to lv.
                                redis.call('ZADD', p .. ':lv', tonumber(score), NODE)
                                redis.call('ZADD', p .. ':nodes', 'XX', '+inf', NODE)
                                yes = true
                        end
                        if yes and pttl > ttl then ttl = math.min(pttl, LIVE_TTL_MAX) end
                end
                if yes then covered[#covered + 1] = p end
                body[#body + 1] = yes and 1 or 0
        end

        if not ok then redis.call('DEL', key) end
        local pools = ',' .. table.concat(covered, ',') .. ','
        local set = { 'at', bnow }
        if not ok or old[1] ~= INCARNATION then set[#set + 1] = 'inc'; set[#set + 1] = INCARNATION end
        if not ok or old[3] ~= bclock_id then set[#set + 1] = 'cid'; set[#set + 1] = bclock_id end
        if not ok or int_of(old[4]) ~= ttl then set[#set + 1] = 'ttl'; set[#set + 1] = istr(ttl) end
        if not ok or old[5] ~= pools then set[#set + 1] = 'pools'; set[#set + 1] = pools end
        redis.call('HSET', key, unpack(set))
        redis.call('PEXPIRE', key, math.floor((ttl + LIVE_KEEP) / 1000))
        return { 'ok', bnow, body, {}, {}, {} }
end

return renew()
