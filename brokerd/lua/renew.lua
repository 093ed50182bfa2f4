-- renew.lua — a node's liveness on a backend, for every pool it names, in one call every TTL/4 or so
-- (issue 21 item 3; README, "Liveness per node"). It writes the node's live key and its deadline in
-- sb:lives, reads per pool whether the pool registered this incarnation and whether that
-- registration is live without a break (one read a pool while the previous key covered it), and claims
-- the nodes whose deadline passed there: their pools that the caller names are to be ticked by the caller
-- (whose tick reaps them). It reaps, settles and grants nothing itself.
--
-- KEYS  [1] "sb:live:NODE" (NODE as in ARGV[2]: anything else is refused "invalid")
-- ARGV  [1..5] the head (README; ARGV[2] must carry an incarnation; ARGV[3] must be "-": the redis clock;
--       the run id and the settle flag are not used)   [6] "TTL/PERIOD" µs (or "TTL": PERIOD 1 s): TTL the
--       longest backend-node-ttl of the pools named (how long the key keeps this node id for this
--       incarnation: "identity"), PERIOD how often the node renews (the backend clock's gap: prelude.lua)
--       [7…] the pools' prefixes "{sb:POOL}", at most RENEW_POOLS_MAX
-- Decides: another incarnation's live key (not one the caller succeeds, written less than its TTL ago on
--       the backend clock) → "identity", nothing written or claimed. Else a pool is covered when its node
--       hash's inc is the caller's incarnation and its registration is live without a break: the previous
--       live key covered it (same incarnation, same backend clock, named it, `at` + the shortest TTL of
--       its pools ahead: then its score still +inf is all that is read), or its score is ahead of the pool
--       clock (its registering tick; the clock's pending gap could only make it later). A pool whose
--       registration lapsed is never covered again by a renewal: its tick (which reaps it first)
--       registers it anew. Every FULL_PERIOD the pools are read in full (their TTLs, the node hashes).
--       A covered pool with a recovery window open (meta.recovery_until > 0) is to be ticked (below).
-- Writes: sb:live:NODE { inc, at (backend clock), cid (backend clock id), ttl, mttl (the shortest TTL of
--       the covered pools), full (`at` of the last full read), pools ",P1,P2,…," (the covered ones) } with
--       PX = TTL + LIVE_KEEP (its expiry only collects garbage: coverage is judged on `at`);
--       sb:lives NODE at + mttl; the backend clock (sb:clock) when a second passed since its last
--       write (and its gap when PERIOD asks for a longer one).
-- Claims: up to DEAD_PAGE members of sb:lives whose score is behind the backend clock (not the
--       caller):
--       re-scored from their live key when it renewed since, else their pools that the caller names are
--       to be ticked (reply [4]), and the member re-scored to at + its key's ttl when that is still ahead
--       (pools of a longer TTL), else removed. A member whose key is gone or garbage is removed, and every
--       pool the caller names is to be ticked (whose it was is unknown). One renewal claims each lapse
--       (ZREM / ZADD by the one script that runs at a time).
-- Returns: { status ("ok" | "identity" | "invalid" | "version" | "manual-clock"), backend clock now, body,
--       ticks, fingerprints, {} } with body { covered (1/0) per pool named, in order }, ticks { the 1-based
--       places among the pools named of those to tick now (a dead node's registration there lapsed, or a
--       recovery window is open there) } and fingerprints { place, fp_n, fp_x, fp_s, … }: the node hash's,
--       for each covered pool that was read in full (none between full reads: nothing more to make or send
--       then), place 1-based as in ticks, for "ok": the node compares them with its own record of its records
--       there, as a tick's would be (README, "Fingerprint"), so that an idle pool need not tick for it.
-- Worst case: O(pools) commands, 2 a pool covered a renewal ago (~6 for another, and at the full read),
--       DEAD_PAGE × 2 for the claims, and O(bytes of the pool lists) of string search.

local RENEW_POOLS_MAX = 1024
local LIVES_KEY = 'sb:lives'
local DEAD_PAGE = 16
local FULL_PERIOD = 60 * USEC_PER_SEC

-- Pool p's clock now, or later: its last call's skew without the backend's gap since (which could only make
-- it earlier), and after its last now.
local function pool_now_bound(p)
        local c = redis.call('HMGET', p .. ':clock', 'last_now', 'skew')
        local last_now, skew = tonumber(c[1] or ''), tonumber(c[2] or '')
        if not last_now or not skew then return INF end
        return math.max(raw_time - skew, last_now + 1)
end

-- sb:lives of another type (by hand) is made anew; an ACL that refuses it (brokerd.conf(5)'s example before
-- it) leaves no claims: a dead node is then reaped by the next call of its pool, which settles first.
local function lives_call(...)
        local ok, r = pcall(redis.call, ...)
        if ok then return r end
        if not string.find(tostring(r.err or r), 'WRONGTYPE', 1, true) then return nil end
        if not pcall(redis.call, 'DEL', LIVES_KEY) then return nil end
        ok, r = pcall(redis.call, ...)
        return ok and r or nil
end

-- The nodes whose deadline passed: flags[i] is set for each pool ARGV[i] of theirs to tick.
local function claim(flags)
        local dead = lives_call('ZRANGEBYSCORE', LIVES_KEY, '-inf', bnow, 'LIMIT', 0, DEAD_PAGE)
        for _, d in ipairs(dead or {}) do
                if d ~= NODE then
                        local ok, v = false, nil
                        if #d <= 64 then ok, v = pcall(redis.call, 'HMGET', LIVE_PREFIX .. d, 'at', 'cid', 'ttl', 'mttl', 'pools') end
                        local at, ttl, mttl, pools = ok and int_of(v[1]), ok and int_of(v[3]), ok and int_of(v[4]), ok and v[5]
                        if at and (v[2] ~= bclock_id or at > bnow) then at = bnow end
                        if not (at and ttl and ttl > 0 and type(pools) == 'string' and #pools <= LIVE_POOLS_MAX) then
                                redis.call('ZREM', LIVES_KEY, d)
                                for i = 7, #ARGV do flags[i] = true end
                        else
                                if not mttl or mttl <= 0 or mttl > ttl then mttl = ttl end
                                if at + mttl > bnow then
                                        redis.call('ZADD', LIVES_KEY, at + mttl, d)
                                else
                                        for i = 7, #ARGV do
                                                if string.find(pools, ',' .. ARGV[i] .. ',', 1, true) then flags[i] = true end
                                        end
                                        if at + ttl > bnow then
                                                redis.call('ZADD', LIVES_KEY, at + ttl, d)
                                        else
                                                redis.call('ZREM', LIVES_KEY, d)
                                        end
                                end
                        end
                end
        end
end

-- A node hash's fingerprint field as Redis has it: absent is 0 (no record of the node's counted yet), anything
-- else not an integer -1, which no node's count is (untrusted: the node compares it with its own).
local function fp_field(v)
        if not v then return 0 end
        return int_of(v) or -1
end

local function renew()
        local function refuse(status, body) return { status, bnow or 0, body or {}, {}, {}, {} } end
        if ARGV[1] ~= tostring(VERSION) then return refuse('version', { VERSION }) end
        if MANUAL_NOW ~= '-' then return refuse('manual-clock') end
        local key = KEYS[1]
        local ttl_s, period_s = string.match(ARGV[6], '^(%d+)/(%d+)$')
        local ttl, period = int_of(ttl_s or ARGV[6]), period_s and int_of(period_s) or USEC_PER_SEC
        if not INCARNATION or key ~= LIVE_PREFIX .. NODE or not ttl or ttl <= 0 or ttl > LIVE_TTL_MAX or
           not period or period <= 0 or period > LIVE_TTL_MAX or #ARGV - 6 > RENEW_POOLS_MAX then
                return refuse('invalid')
        end
        local tm = redis.call('TIME')
        raw_time = tonumber(tm[1]) * USEC_PER_SEC + tonumber(tm[2])
        -- Renewals further apart than a second: the backend clock's gap grows to match (prelude.lua).
        backend_clock(period > USEC_PER_SEC and period + CLOCK_GAP or nil)
        if not bnow then return refuse('invalid') end -- sb:clock out of reach (an ACL): no renewal

        -- The key as it is: anyone may have written it (another type, garbage, a clone's).
        local ok, old = pcall(redis.call, 'HMGET', key, 'inc', 'at', 'cid', 'ttl', 'pools', 'mttl', 'full')
        local mine, o_at, o_pools, o_mttl, o_full = false, nil, '', nil, nil
        if ok and old[1] then
                local at, o_ttl = int_of(old[2]), int_of(old[4])
                if at and (old[3] ~= bclock_id or at > bnow) then at = bnow end
                if old[1] == INCARNATION then
                        mine = old[3] == bclock_id
                        o_at = at
                        if type(old[5]) == 'string' and #old[5] <= LIVE_POOLS_MAX then o_pools = old[5] end
                        o_mttl, o_full = int_of(old[6]), int_of(old[7])
                elseif not PREVIOUS[old[1]] and at and o_ttl and o_ttl <= LIVE_TTL_MAX and at + o_ttl > bnow then
                        return refuse('identity')
                end
        end
        -- Every pool the previous key named is live without a break while its shortest TTL has not passed:
        -- then a pool's score still +inf (not reaped, not made finite by its tick, not a pool made anew) is
        -- all there is to read. The full read, every FULL_PERIOD, brings the TTLs (a reload) up to date.
        local full = not (mine and o_at and o_mttl and o_mttl > 0 and o_at + o_mttl > bnow and o_full and
                          o_full <= bnow and bnow - o_full < FULL_PERIOD)
        local o_ttl = ok and int_of(old[4])
        if not full and o_ttl and o_ttl > ttl and o_ttl <= LIVE_TTL_MAX then ttl = o_ttl end
        local mttl = not full and o_mttl or nil

        local covered, body, fps = {}, {}, {}
        for i = 7, #ARGV do
                local p = ARGV[i]
                local yes = false
                if #p <= 300 and string.match(p, '^{sb:[^{}]+}$') then
                        local nh
                        if not full and string.find(o_pools, ',' .. p .. ',', 1, true) and
                           redis.call('ZSCORE', p .. ':nodes', NODE) == 'inf' then
                                yes = true
                        else
                                nh = redis.call('HMGET', p .. ':node:' .. NODE, 'inc', 'fp_n', 'fp_x', 'fp_s')
                        end
                        if nh and nh[1] == INCARNATION then
                                local pttl = int_of(redis.call('HGET', p .. ':rules', 'backend-node-ttl'))
                                if not pttl or pttl <= 0 or pttl > LIVE_TTL_MAX then pttl = 30 * USEC_PER_SEC end
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
                                if yes then
                                        if pttl > ttl then ttl = pttl end
                                        if not mttl or pttl < mttl then mttl = pttl end
                                        fps[#fps + 1] = i - 6
                                        fps[#fps + 1] = fp_field(nh[2])
                                        fps[#fps + 1] = fp_field(nh[3])
                                        fps[#fps + 1] = fp_field(nh[4])
                                end
                        end
                end
                if yes then covered[#covered + 1] = p end
                body[#body + 1] = yes and 1 or 0
        end
        if not mttl then mttl = ttl end
        local flags, ticks = {}, {}
        -- A recovery window open on a covered pool (keys lost, a pool made anew: an epoch this node has not
        -- seen): its tick must come within the window, to reclaim or vouch, though the pool is idle.
        for i = 7, #ARGV do
                if body[i - 6] == 1 and (tonumber(redis.call('HGET', ARGV[i] .. ':meta', 'recovery_until') or '') or 0) > 0 then
                        flags[i] = true
                end
        end
        claim(flags)
        for i = 7, #ARGV do if flags[i] then ticks[#ticks + 1] = i - 6 end end

        if not ok then redis.call('DEL', key) end
        local pools = ',' .. table.concat(covered, ',') .. ','
        local set = { 'at', bnow }
        if not ok or old[1] ~= INCARNATION then set[#set + 1] = 'inc'; set[#set + 1] = INCARNATION end
        if not ok or old[3] ~= bclock_id then set[#set + 1] = 'cid'; set[#set + 1] = bclock_id end
        if not ok or int_of(old[4]) ~= ttl then set[#set + 1] = 'ttl'; set[#set + 1] = istr(ttl) end
        if not ok or int_of(old[6]) ~= mttl then set[#set + 1] = 'mttl'; set[#set + 1] = istr(mttl) end
        if full then set[#set + 1] = 'full'; set[#set + 1] = bnow end
        if not ok or old[5] ~= pools then set[#set + 1] = 'pools'; set[#set + 1] = pools end
        redis.call('HSET', key, unpack(set))
        redis.call('PEXPIRE', key, math.floor((ttl + LIVE_KEEP) / 1000))
        lives_call('ZADD', LIVES_KEY, bnow + mttl, NODE)

        return { 'ok', bnow, body, ticks, fps, {} }
end

return renew()
