-- SPDX-License-Identifier: MIT
-- prelude.lua — the admission rules of a shared pool, ported line by line from
-- libbroker/engine/pool-local.c (which stays the reference: where this file and it disagree, this file
-- is wrong). The build puts it in front of every operation (submit, release, withdraw, tick, reclaim,
-- drain, positions), so that no rule is written twice: in the Redis Functions library brokerd loads (the
-- operations as its functions, this file defined once), and in one EVAL script per operation (tests).
-- The data model, the argument and reply layouts are in brokerd/lua/README; read it before changing a
-- key or a reply position.
--
-- KEYS[1] is the pool's prefix "{sb:POOL}"; every other key is derived from it and shares its hash tag.
-- ARGV[1..5] is the head every script takes: data model version, node id, manual now ("-": the pool
-- clock is Redis's), the run id the node's link saw, settle flag (1: the call is its own instant).
--
-- Bounded work: a call makes at most SETTLE_MAX steps (an instant settled, a grant, a refusal, a
-- congestion flip, a page of a dead node's records). An instant that cannot finish within the budget is
-- left unsettled (meta.unsettled_at, meta.phase, meta.running) and the next call finishes it first, at
-- its own instant; an operation that finds earlier instants (or one under way) still unsettled after
-- the budget is not applied: the reply is "settling" and the node sends the same call again (request
-- ids make that safe).

-- KEYS and ARGV: an EVAL's globals (prelude.lua + eval.lua + OP.lua), or the library's locals that each
-- of its functions sets (tools/embed-lua-library.py). Every variable below that a call changes is set
-- again by call_begin(), at the start of each call: a library's locals outlive its calls.
local P, K
-- A prefix's key names, kept by a library (KEYS_OF_MAX prefixes at most). (This block's own locals, as the
-- other do-blocks below: Lua allows the main chunk 200 locals, and the library's functions add to this
-- file's; what only the functions of one block use is local to it, README "Building and loading".)
local keys_of
do
        local KEYS_OF, KEYS_OF_N, KEYS_OF_MAX = {}, 0, 1024
        keys_of = function(p)
                local k = KEYS_OF[p]
                if k then return k end
                k = {
                        meta = p .. ':meta', clock = p .. ':clock', rules = p .. ':rules', occ = p .. ':occ',
                        busy = p .. ':busy', sid = p .. ':sid', h = p .. ':h', dm = p .. ':dm', w = p .. ':w',
                        dl = p .. ':dl', rid = p .. ':rid', nodes = p .. ':nodes', prios = p .. ':prios',
                        reaping = p .. ':reaping', rekey = p .. ':rekey', recovering = p .. ':recovering',
                        orph = p .. ':orph', lv = p .. ':lv',
                        rest = p .. ':rest',
                }
                if KEYS_OF_N >= KEYS_OF_MAX then KEYS_OF, KEYS_OF_N = {}, 0 end
                KEYS_OF[p], KEYS_OF_N = k, KEYS_OF_N + 1
                return k
        end
end
local function k_lane(l) return P .. ':lane:' .. l end
local function k_lk(l) return P .. ':lk:' .. l end
local function k_bucket(l, k) return P .. ':b:' .. l .. ':' .. k end
-- A lane's selector buckets (SPEC §3.5): members "K:CANON", each a bucket k_bucket(l, "K:CANON").
local function k_ls(l) return P .. ':ls:' .. l end
local function k_queue(prio) return P .. ':q:' .. prio end
local function k_node(n) return P .. ':node:' .. n end
local function k_records(n) return P .. ':nr:' .. n end
local function k_stream(n) return P .. ':s:' .. n end
-- A node's final decisions, kept for its retries (README, "Outcome records"): one hash rid -> cmsgpack,
-- and an index of their expiries (pool clock µs) from which every call of the node trims a page.
local function k_outcomes(n) return P .. ':oh:' .. n end
local function k_outcome_exp(n) return P .. ':ox:' .. n end
-- Members' lives (quarantine): functions as fields of one table, one local of the library's (Lua 5.1 allows
-- 200 in a chunk); defined below, "members' lives".
local LIFE = {}
-- Drains with who, why and until: the same (DRAINS below, "drains with who, why, until").
local DRAINS = {}
-- Health lanes: the same (HEALTH below, "health lanes").
local HEALTH = {}
-- Rests (cooldown=): the same (rests below, "cooldown").
local rests = {}
-- All-or-nothing sets over several pools (set.lua; SPEC §3.5): the same (SETS below, "sets").
local SETS = {}

local VERSION = 1
local POSITIONS_MAX = 256
local RECONCILE_PAGE = 512
-- An immediate refusal's outcome key (issue 19 i): it changed nothing, so it is kept only for the retry of
-- a lost reply (the command deadline, 2 s, plus a reconnect, up to 5 s, plus margin), not a node TTL.
local REFUSED_OUTCOME_MS = 10000
local USEC_PER_SEC = 1000000
local CLOCK_GAP = 2 * USEC_PER_SEC
-- Liveness per node (README, "Liveness per node"): keys outside the pool's hash tag, one per backend and one
-- per node (Redis Cluster is out of scope: a script may read and write an undeclared key outside it).
local BCLOCK_KEY = 'sb:clock'
local LIVE_PREFIX = 'sb:live:'
local LIVE_KEEP = 3600 * USEC_PER_SEC -- a live key outlives its coverage by this much (PX: garbage only)
local LIVE_TTL_MAX = 86400 * USEC_PER_SEC
local LIVE_POOLS_MAX = 65536   -- bytes of a live key's pool list that a reader looks through
local EXTEND_PAGE = 64         -- registrations re-scored from their live keys per call
-- The backend clock's gap: a node renews every TTL/4 or so, at most every 10 s (pool-shared.h,
-- SHARED_RENEW_PERIOD_MAX), and every TTL/2, at most 15 s, while it holds nothing (SHARED_IDLE_RENEW_PERIOD_MAX),
-- so a fleet of one node leaves gaps that long; a gap that stands still must be
-- longer than any renewal period (plus the second its writes may lag), or the clock of a small fleet would
-- run slow (its dead found late). A renewal says its period; sb:clock keeps the longest one's gap
-- (CLOCK_GAP, 2 s, as before while every node renews every second; at most BCLOCK_GAP_MAX).
local BCLOCK_GAP_MAX = 17 * USEC_PER_SEC
local INF = 1 / 0              -- math.huge (a library may read no global at load): an unbounded budget; -1 on the wire

local NODE, INCARNATION, PREVIOUS   -- call_begin()
local MANUAL_NOW, RUN_ID, SETTLE

-- Per call: what the script has read and changed, the reply's events and notices, the step budget.
local M                         -- meta, numbers where numeric (meta_load)
local R                         -- the stored rules, parsed (rules_load)
local lane_cache                -- lane -> {used, waiting}
local events                    -- this node's decisions and the congestion flips, in order
local notices                   -- nodes reaped in this call
local CACHE_LATER               -- batch.lua: the next operation carries this one's state on, and its reply the cache
local cache_owed                -- a reply of this batch left its cache to a later one
local steps
local reaped_a_page
local stream_last               -- the last id appended to the caller's stream by this call
local now
local raw_time                  -- Redis TIME in µs: tokens (never the pool clock)
local clock_missing             -- the clock hash was not there (a new pool, or keys lost)
local bnow, bclock_id, bskew    -- the backend clock of this call (backend_clock()); nil in the manual mode

-- What one operation of a batch leaves to the next (batch.lua; README, "Batches"): nothing but the batch
-- runs in between, so what the first read or wrote is what Redis holds for the next. call_begin(true) keeps
-- it, call_begin() starts afresh. Fields (all nil when unset):
--   on         this operation was begun with call_begin(true): M, R, lane_cache, meta_dirty, fp_delta
--              and the instant (now, raw_time, the backend clock) come from the operation before
--   defer      flush() waits for batch_flush() (the batch's end, or an operation that reads meta, lane
--              counters or fingerprints from Redis: tick, reclaim)
--   inc_ok     the node hash's inc is the caller's incarnation (only a tick changes it)
--   rekey_empty  no rekey job (only a tick makes one)
--   admitted   the caller's registration deadline, its wanted rules the stored ones (node_admitted())
--   heads_on   this operation caches heads (submit, release, withdraw: they write dl, nodes, lv, orph only
--              through the functions that drop heads)
--   heads      the first entries of dl, nodes (2), lv (2), orph with their scores: next_due() and the
--              instant's scans read them; dropped by every write to those keys
local carry = {}

-- Lua 5.1 prints numbers with 14 digits ("1.7e+15"): every number that goes into a string (a key, a
-- reference, a comparison with a stored value) goes through istr(). redis.call() arguments are exact.
local function istr(n) return string.format('%d', n) end

-- A slot's position as a string, and its identity "#INDEX", made once per library for the first
-- 1,024 positions: redis.call() prints a number with "%.17g" (~2,400 instructions; a grant
-- and its release pass four positions and two identities), a lookup costs a few dozen. Anything else
-- (a later position, or garbage from a record) is passed on as it is.
local slot_pos, slot_identity
do -- (the tables local to this block: Lua allows the main chunk 200 locals)
        local MAX, POS, ID = 1024, {}, {}
        slot_pos = function(pos)
                local s = POS[pos]
                if s then return s end
                if type(pos) ~= 'number' or pos < 0 or pos >= MAX or pos % 1 ~= 0 then return pos end
                s = istr(pos)
                POS[pos], ID[pos] = s, '#' .. s
                return s
        end
        slot_identity = function(pos)
                local id = ID[pos]
                if id then return id end
                slot_pos(pos)
                return ID[pos] or ('#' .. istr(pos))
        end
end

local function wire(v) if v == INF then return -1 end return v end
local function unwire(s)
        local v = tonumber(s)
        if v == nil or v < 0 then return INF end
        return v
end
local function usec_add(a, b) if a == INF or b == INF then return INF end return a + b end

local step
do -- (SETTLE_MAX local to this block: Lua allows the main chunk 200 locals)
        local SETTLE_MAX = 64
        -- One unit of work; false when the call's budget is spent.
        step = function()
                if steps >= SETTLE_MAX then return false end
                steps = steps + 1
                return true
        end
end

---------------------------------------------------------------------------------------------- meta

-- Changes to meta, lane counters and fingerprints are kept here and written once, by flush() (every
-- reply does it): a grant touches each of them, and a command costs more than the Lua around it.
-- meta_dirty: field -> what Redis holds for it, taken when the field is first set since meta_load() or
-- flush() (M's value then: meta_load()'s, a number for META_NUMBERS' fields, or what flush() wrote); a
-- field set back to what it holds is not written again (an idle tick's instant sets and clears the same
-- fields). NOT_HELD: nothing there; GARBAGE: meta_load() read garbage there, written whatever the value.
-- (A copy of meta's ~30 fields a call was ~4 µs of Redis's time, a twentieth of a call's fixed part.)
local meta_dirty
local NOT_HELD, GARBAGE = {}, {}

local meta_load
do -- (its helpers local to this block: Lua allows the main chunk 200 locals)
        local META_NUMBERS = {
                'version', 'recovery_until', 'last_fast', 'congested', 'counter', 'seq', 'in_use', 'waiting',
                'drained', 'drained_free', 'phase', 'running', 'recovery_set', 'recovery_from', 'leases', 'nodes',
                'integrity', 'selective',
                'resting_free', 'rest_max',
        }

        meta_load = function()
                local a = redis.call('HGETALL', K.meta)
                for i = 1, #a, 2 do M[a[i]] = a[i + 1] end
                for i = 1, #META_NUMBERS do -- (not ipairs(): a call an iteration, once a call)
                        local f = META_NUMBERS[i]
                        local s, v = M[f], 0
                        -- (Most are "0" or none: a tonumber() parses its string twice, ~75 ns even for "0".)
                        if s ~= nil and s ~= '0' then
                                v = tonumber(s)
                                -- Not a finite number (anyone may write meta): 0 for now, and the pool is lost
                                -- (integrity_lost()), made anew under a recovery window, this 0 written over
                                -- it. A version is refused instead ("version").
                                if not (v and v == v and v > -INF and v < INF) and f ~= 'version' then
                                        v, M.garbage, meta_dirty[f] = 0, f, GARBAGE
                                end
                        end
                        M[f] = v
                end
                M.unsettled_at = tonumber(M.unsettled_at or '')   -- nil: settled
        end
end

local function meta_set(field, value)
        if meta_dirty[field] == nil then
                local held = M[field]
                meta_dirty[field] = held == nil and NOT_HELD or held
        end
        M[field] = value
end

local function meta_incr(field, by)
        meta_set(field, M[field] + by)
end

---------------------------------------------------------------------------------------------- rules

-- The canon is "key=value" lines sorted by key (brokerd/lua/README, "Rules canon").
local function canon_parse(canon)
        local t = {}
        for line in string.gmatch(canon, '[^\n]+') do
                local k, v = string.match(line, '^([^=]+)=(.*)$')
                if k then t[k] = v end
        end
        return t
end

-- Reservations (SPEC §3.6; engine.h, ENGINE_RESERVE_LANE): every pool has the lane "@reserve", ahead of
-- every lane (priority INT_MAX, as pool-local.c has it), no cap, no reserve; not in the canon (README,
-- "Reservations"). A canon that names it keeps its own (garbage: no node sends one).
local RESERVE_LANE = '@reserve'
local rules_from
do -- (its helpers local to this block: Lua allows the main chunk 200 locals)
        local function rules_reserve_lane(r)
                if r.lanes[RESERVE_LANE] then return end
                r.lanes[RESERVE_LANE] = { priority = 2147483647, max_in_use = -1, reserve = 0 }
                r.lane_names[#r.lane_names + 1] = RESERVE_LANE
        end

        -- label.NAME=MEMBER,… (SPEC §3.5): r.labels[NAME][MEMBER] = true; r.sel: selector_members()'s cache.
        local function rules_labels(r, t)
                r.labels, r.sel, r.n_sel = {}, {}, 0
                for k, v in pairs(t) do
                        local name = string.match(k, '^label%.(.+)$')
                        if name then
                                r.labels[name] = {}
                                for m in string.gmatch(v, '[^,]+') do r.labels[name][m] = true end
                        end
                end
        end

        -- The rules of a canon (README, "Rules canon"), or nil when it is not rules: every number must be an integer
        -- in decimal ("-" first for a negative) within what shared-rules.c can write from its C types (libbroker/conf.c
        -- allows less; test rigs write more, a TTL of 1000 days): a limit or reserve below 2^32, a priority a C int,
        -- spans (TTL from 1 µs) below 2^63, exit codes 1..255. Anyone may write the stored canon: "limit=x" made
        -- R.limit nil, a Lua error on every call once something was due, for good. A canon that is not rules is taken
        -- as none (rules_load(): integrity_lost() says "rules", and the next tick stores its own); a tick whose wanted
        -- canon is not rules is answered "canon" (tick.lua).
        rules_from = function(t)
                local valid = true
                local function num(s, lo, below, dflt) -- an integer lo <= n < below; absent: dflt
                        if s == nil then return dflt end
                        local n = #s <= 20 and string.find(s, '^%-?%d+$') and tonumber(s)
                        if not n or n < lo or n >= below then valid = false return dflt end
                        return n + 0 -- ("-0": 0, as every key name prints it)
                end
                local SPAN, U32 = 2 ^ 63, 2 ^ 32
                local r = {
                        limit = num(t['limit'], 0, U32, 0),
                        members = nil,
                        q = num(t['queue-timeout'], 0, SPAN, nil),        -- nil: unset
                        congestion = num(t['queue-congestion-timeout'], 0, SPAN, nil),
                        max_queue = num(t['max-queue'], -1, SPAN, -1),
                        ttl = num(t['backend-node-ttl'], 1, SPAN, 30000000),
                        lanes = {},                                        -- name -> {priority, max_in_use, reserve}
                        lane_names = {},
                        -- µs; 0: none (SPEC §3.6); at most conf.c's 1 day, whatever a canon says
                        cooldown = math.min(num(t['cooldown'], 0, SPAN, 0), 86400 * USEC_PER_SEC),
                }
                if t['members'] and t['members'] ~= '' then
                        r.members = {}
                        for m in string.gmatch(t['members'], '[^,]+') do r.members[#r.members + 1] = m end
                end
                for k, v in pairs(t) do
                        local lane, attr = string.match(k, '^lane%.(.+)%.([%a-]+)$')
                        if lane then
                                if not r.lanes[lane] then
                                        r.lanes[lane] = { priority = 0, max_in_use = -1, reserve = 0 }
                                        r.lane_names[#r.lane_names + 1] = lane
                                end
                                if attr == 'priority' then r.lanes[lane].priority = num(v, -2 ^ 31, 2 ^ 31, 0)
                                elseif attr == 'max-in-use' then r.lanes[lane].max_in_use = num(v, -1, SPAN, -1)
                                elseif attr == 'reserve' then r.lanes[lane].reserve = num(v, 0, U32, 0)
                                elseif attr == 'queue-timeout' then num(v, -1, SPAN, -1) -- (agreed on, not used here)
                                elseif attr == 'health' then
                                        -- "also": quarantined members first, else an ordinary request (HEALTH.first())
                                        r.lanes[lane].health, r.lanes[lane].health_also = v == '1', v == 'also'
                                end
                        end
                end
                num(t['quarantine-after'], 1, U32, 1) -- (LIFE.rules() reads both)
                for c in string.gmatch(t['quarantine-exit-codes'] or '', '[^,]+') do num(c, 1, 256, 1) end
                if not valid then return nil end
                rules_reserve_lane(r)
                rules_labels(r, t)
                table.sort(r.lane_names)
                LIFE.rules(r, t)
                return r
        end
end

-- The rules parsed, by their canon (the canon is their identity, and Lua compares interned strings by
-- address: no digest to compute). A library keeps them between calls; an EVAL starts empty. Never changed
-- once made. At most RULES_CACHE_MAX canons (pools, and a rolling change's two versions): then emptied.
-- nil for a canon that is not rules (rules_from(); kept as false, so that it is not parsed again each call).
local rules_parsed
do
        local RULES_CACHE, RULES_CACHE_N, RULES_CACHE_MAX = {}, 0, 64
        rules_parsed = function(canon, fields)
                local r = RULES_CACHE[canon]
                if r ~= nil then return r or nil end
                r = rules_from(fields or canon_parse(canon))
                if r then r.canon = canon end
                if RULES_CACHE_N >= RULES_CACHE_MAX then RULES_CACHE, RULES_CACHE_N = {}, 0 end
                RULES_CACHE[canon], RULES_CACHE_N = r or false, RULES_CACHE_N + 1
                return r
        end
end

-- The stored rules into R; false (R left empty: no R.canon) when there are none, or the canon is not rules.
local function rules_load()
        local canon = redis.call('HGET', K.rules, 'canon')
        local r = canon and rules_parsed(canon)
        if not r then return false end
        R = r
        return true
end

---------------------------------------------------------------------------------------------- clock

-- A decimal integer of Redis's (a key anyone may write): nil unless it is one, exactly (no "inf", "nan",
-- "0x…", exponents or fractions, ≤ 16 digits: exact in a double).
local function int_of(s)
        if type(s) ~= 'string' or #s > 17 or not string.find(s, '^%-?%d+$') then return nil end
        return s + 0 -- (digits: one strtod(), where tonumber() makes two)
end

-- The backend clock (sb:clock): Redis's TIME minus a skew that absorbs the gaps in which no call of any
-- node reached this Redis (longer than its `gap`: time stood still but for one second) and backward steps,
-- as a pool clock does; a renewal passes want_gap (its period + 2 s) and the longest one is kept;
-- never goes back. Written when a second or more passed since its last write (so at most about once a
-- second, whatever the number of nodes and pools), or when Redis's clock went back. A key that is not one
-- (missing, deleted by hand, of another type, garbage) is made anew under a new id: no pool takes a skew
-- of another id for its own, and no live key's `at` of another id counts for more than "renewed now".
local function backend_clock(want_gap)
        bnow, bclock_id, bskew = nil, nil, nil
        local ok, c = pcall(redis.call, 'HMGET', BCLOCK_KEY, 'last_time', 'last_now', 'skew', 'id', 'gap')
        -- An error other than another type (an ACL that lets brokerd's user at {sb:* only): no backend
        -- clock, the pool's own rule, and no live key counts.
        if not ok and not string.find(tostring(c.err or c), 'WRONGTYPE', 1, true) then return end
        local last_time, last_now, skew, id, gap
        if ok then last_time, last_now, skew, id, gap = int_of(c[1]), int_of(c[2]), int_of(c[3]), c[4], int_of(c[5]) end
        if not gap or gap < CLOCK_GAP or gap > BCLOCK_GAP_MAX then gap = CLOCK_GAP end
        local new_gap = want_gap and want_gap > gap and math.min(want_gap, BCLOCK_GAP_MAX)
        if not (last_time and last_now and skew and type(id) == 'string' and #id <= 32) then
                if not ok and not pcall(redis.call, 'DEL', BCLOCK_KEY) then return end
                if not pcall(redis.call, 'HSET', BCLOCK_KEY, 'last_time', raw_time, 'last_now', raw_time,
                             'skew', 0, 'id', istr(raw_time), 'gap', new_gap or gap) then
                        return
                end
                bclock_id, bskew, bnow = istr(raw_time), 0, raw_time
                return
        end
        local b = raw_time - skew
        if raw_time < last_time or raw_time - last_time >= USEC_PER_SEC then
                if raw_time - last_time > gap then skew = skew + (raw_time - last_time) - USEC_PER_SEC end
                b = raw_time - skew
                if b <= last_now then
                        b = last_now + 1
                        skew = raw_time - b
                end
                if not pcall(redis.call, 'HSET', BCLOCK_KEY, 'last_time', raw_time, 'last_now', b, 'skew', skew,
                             'gap', new_gap or gap) then
                        return
                end
        else
                if b < last_now then b = last_now end
                if new_gap and not pcall(redis.call, 'HSET', BCLOCK_KEY, 'gap', new_gap) then return end
        end
        bclock_id, bskew, bnow = id, skew, b
end

-- The pool clock (memo §4.6): Redis's TIME minus a skew that absorbs gaps (no node reached Redis: time
-- stood still but for one second) and backward steps (the clock goes on from where it was); strictly
-- increasing per call. The gaps are the backend clock's (above): the pool's skew grows by what the
-- backend's grew since the pool's last call (bid, bskew), so an idle pool called once a minute runs at
-- Redis's rate while its nodes' renewals reach Redis. Without a backend clock of the same id (a pool made
-- before, sb:clock deleted or garbage) it takes its own gap since its last call as a gap: time standing
-- still, the safe way. A manual pool takes the caller's now instead (tests only), which may repeat but
-- never go back. Returns false when a manual now goes backwards.
local function clock(manual)
        local tm = redis.call('TIME')
        raw_time = tm[1] * USEC_PER_SEC + tm[2] -- (Redis's own digits: one strtod() each, where tonumber() makes two)
        local c = redis.call('HMGET', K.clock, 'last_time', 'last_now', 'skew', 'bid', 'bskew')
        local last_time, last_now, skew_stored = tonumber(c[1]), tonumber(c[2]), tonumber(c[3])
        -- Garbage where an integer must be (a key anyone may write; x % 1 is NaN for NaN and ±inf) is a
        -- clock lost, as a missing one is: integrity_lost() makes the pool anew under a recovery window
        -- (this call's now: Redis's TIME).
        if last_time and last_time % 1 ~= 0 then last_time = nil end
        if last_now and last_now % 1 ~= 0 then last_now = nil end
        if skew_stored and skew_stored % 1 ~= 0 then skew_stored = nil end
        clock_missing = not last_now or (c[3] ~= nil and not skew_stored)
        last_now = last_now or 0
        local skew = skew_stored or 0
        if manual then
                now = tonumber(MANUAL_NOW)
                if now == nil or now < last_now then return false end
                redis.call('HSET', K.clock, 'last_time', raw_time, 'last_now', now, 'skew', skew)
                return true
        end
        backend_clock()
        local pbskew = int_of(c[5])
        if last_time and bnow and c[4] == bclock_id and pbskew and bskew >= pbskew then
                skew = skew + (bskew - pbskew)
        elseif last_time and raw_time - last_time > CLOCK_GAP then
                skew = skew + (raw_time - last_time) - USEC_PER_SEC
        end
        now = raw_time - skew
        if last_time and now <= last_now then
                now = last_now + 1
                skew = raw_time - now
        end
        -- Integers as "%d": redis.call() would print numbers with "%.17g", a digit at a time. What did not
        -- change (the skews and the backend clock's id, most calls) is not written again.
        if bnow and not (c[4] == bclock_id and pbskew == bskew) then
                redis.call('HSET', K.clock, 'last_time', istr(raw_time), 'last_now', istr(now), 'skew', istr(skew),
                           'bid', bclock_id, 'bskew', istr(bskew))
        elseif skew ~= skew_stored then
                redis.call('HSET', K.clock, 'last_time', istr(raw_time), 'last_now', istr(now), 'skew', istr(skew))
        else
                redis.call('HSET', K.clock, 'last_time', istr(raw_time), 'last_now', istr(now))
        end
        return true
end

---------------------------------------------------------------------------------------------- fingerprints

-- FNV-1a 32 of RID .. kind ('w' waiter, 'l' lease). The node keeps the same triple (count, xor, sum mod
-- 2^32) of its records. h runs as BitOp's signed 32-bit value: h × 16777619 is h × 403 + (h << 24), whose
-- sum (below 2^41) a double holds exactly and bit.tobit() wraps. Two a pair (a grant's record, its
-- release's): the bytes read 64 a call (a rid is 16; a longer string from Redis must not overflow Lua's
-- stack), and no % per step, halve the old loop's time (issue 21).
local function fnv1a32(s)
        local bxor, lshift, tobit, byte = bit.bxor, bit.lshift, bit.tobit, string.byte
        local h = -2128831035 -- the offset basis 2166136261, as a signed 32-bit value
        for at = 1, #s, 64 do
                local b = { byte(s, at, at + 63) }
                for i = 1, #b do
                        h = bxor(h, b[i])
                        h = tobit(h * 403 + lshift(h, 24))
                end
        end
        return h % 4294967296
end

-- A 32-bit hash from outside (a lease record's [15], a submit's ARGV[16]), or nil: anything else is hashed again.
-- (Any number that is a 32-bit value will do: a hash is no count, so not int_of()'s strictness.)
local function hash_of(v)
        v = tonumber(v)
        if not v or v < 0 or v >= 4294967296 or v % 1 ~= 0 then return nil end
        return v
end

local fp_delta                  -- node -> { n, x, s } not yet written

local record_add, record_remove, record_turn_into_lease
do -- (its helpers local to this block: Lua allows the main chunk 200 locals)
        -- h: fnv1a32(rid .. kind) when the caller has it (a lease record keeps its own: lease_get()), else nil.
        local function fingerprint_change(node, rid, kind, sign, h)
                local d = fp_delta[node]
                if not d then
                        d = { 0, 0, 0 }
                        fp_delta[node] = d
                end
                h = h or fnv1a32(rid .. kind)
                d[1] = d[1] + sign
                d[2] = bit.bxor(d[2], h) % 4294967296
                d[3] = (d[3] + sign * h) % 4294967296
        end

        record_add = function(node, rid, kind, ref, h)
                redis.call('HSET', K.rid, node .. ':' .. rid, ref)
                redis.call('ZADD', k_records(node), '0', rid)
                fingerprint_change(node, rid, kind, 1, h)
        end

        record_remove = function(node, rid, kind, h)
                redis.call('HDEL', K.rid, node .. ':' .. rid)
                redis.call('ZREM', k_records(node), rid)
                fingerprint_change(node, rid, kind, -1, h)
        end

        -- A waiter granted: its record stays (same rid, same place in nr:N), only its reference and kind change.
        -- h: the lease's hash (fnv1a32(rid .. 'l')).
        record_turn_into_lease = function(node, rid, ref, h)
                redis.call('HSET', K.rid, node .. ':' .. rid, ref)
                fingerprint_change(node, rid, 'w', -1)
                fingerprint_change(node, rid, 'l', 1, h)
        end
end

---------------------------------------------------------------------------------------------- lanes and slots

local lane_get, lane_incr, lanes_audit
do -- (its helpers local to this block: Lua allows the main chunk 200 locals)
        -- The counts of the named lanes as the records say (anyone may write a lane's key; the records are what
        -- the counts count): used from the leases (HVALS h; a lease's k when it is a finite count), waiting from
        -- the waiters (HVALS w), each only when asked. O(leases), O(waiters). Returns lane -> { used, waiting }.
        local function lanes_recount(names, used, waiting)
                local count = {}
                for _, l in ipairs(names) do count[l] = { used = 0, waiting = 0 } end
                if used then
                        for _, v in ipairs(redis.call('HVALS', K.h)) do
                                local ok, r = pcall(cmsgpack.unpack, v)
                                local c = ok and type(r) == 'table' and count[r[3]]
                                local k = c and r[4]
                                if type(k) == 'number' and k >= 0 and k < INF then c.used = c.used + k end -- (NaN: not)
                        end
                end
                if waiting then
                        for _, v in ipairs(redis.call('HVALS', K.w)) do
                                local ok, r = pcall(cmsgpack.unpack, v)
                                local c = ok and type(r) == 'table' and count[r[3]]
                                if c then c.waiting = c.waiting + 1 end
                        end
                end
                return count
        end

        -- A lane's counts, read once a call. Garbage there (anyone may write them; integrity_lost() does not compare
        -- them, lanes_audit() does every 10 s) is counted again from the records, O(leases + waiters) once, written
        -- back and told ("bad-key" "lane"): a lane's first read in a call comes before the call changes a record of
        -- it (grant() and lease_free() count before lease_put() and HDEL; waiter_link() and waiter_unlink() read it
        -- first).
        lane_get = function(l)
                local c = lane_cache[l]
                if not c then
                        local a = redis.call('HMGET', k_lane(l), 'used', 'waiting')
                        local used, waiting = tonumber(a[1] or '0'), tonumber(a[2] or '0')
                        -- (A negative count is not garbage: a lane's key lost and its holders' ends counted from 0.)
                        local bad = not (used and used > -INF and used < INF and waiting and waiting > -INF and waiting < INF)
                        if bad then
                                local n = lanes_recount({ l }, true, true)[l]
                                used, waiting = n.used, n.waiting
                                LIFE.bad('lane', l)
                        end
                        c = { used = used, waiting = waiting, dirty = bad }
                        lane_cache[l] = c
                end
                return c
        end

        lane_incr = function(l, field, by)
                local c = lane_get(l)
                c[field] = c[field] + by
                c.dirty = true
        end

        -- meta.selective counts the waiters in selector buckets (k_ls): while it is above 0, dispatch and submit walk
        -- every bucket (walk_heads()). Too low (a number written by hand), those waiters were passed over for good:
        -- it is compared with the buckets it governs, O(lanes + selector buckets), in lanes_audit()'s period, and
        -- set to what they hold when it differs, told ("bad-key" "sel").
        local function selective_audit()
                local n = 0
                for _, lane in ipairs(R.lane_names) do
                        for _, s in ipairs(redis.call('SMEMBERS', k_ls(lane))) do
                                n = n + redis.call('ZCARD', k_bucket(lane, s))
                        end
                end
                if n == M.selective then return end
                meta_set('selective', n)
                LIFE.bad('sel', 'selective')
        end

        -- Lane counts that are numbers but wrong (a lane's key lost, evicted, or written by hand): a cap passed, or
        -- a lane's waiters passed over by queue_next(), until the pool is made anew. Every 10 s of pool time
        -- (meta.lanes_at) a call sums the stored lanes' counts (O(lanes), with lane_get()'s reads that the call
        -- would mostly make anyway) against meta's in_use and waiting + hwaiting, which integrity_lost() and
        -- HEALTH.check() hold to the keys; on a difference it counts them again from the records (HVALS h and w,
        -- O(leases + waiters)) and writes back and tells ("bad-key" "lane") each lane that differs. Leases of a lane
        -- the rules removed count in no stored lane: such a pool counts again each period until they end. The same
        -- period runs selective_audit().
        lanes_audit = function()
                local at = int_of(M.lanes_at)
                if at and at <= now and now < at + 10 * USEC_PER_SEC then return end
                meta_set('lanes_at', istr(now))
                selective_audit()
                local used, waiting = 0, 0
                for _, l in ipairs(R.lane_names) do
                        local c = lane_get(l)
                        used, waiting = used + c.used, waiting + c.waiting
                end
                local used_ok, waiting_ok = used == M.in_use, waiting == M.waiting + HEALTH.waiting()
                if used_ok and waiting_ok then return end
                local count = lanes_recount(R.lane_names, not used_ok, not waiting_ok)
                for _, l in ipairs(R.lane_names) do
                        local c, n = lane_get(l), count[l]
                        local wrong = (not used_ok and c.used ~= n.used) or (not waiting_ok and c.waiting ~= n.waiting)
                        if not used_ok then c.used = n.used end
                        if not waiting_ok then c.waiting = n.waiting end
                        if wrong then
                                c.dirty = true
                                LIFE.bad('lane', l) -- (garbage that lane_get() counted again was told there)
                        end
                end
        end
end

-- Writes what meta_set(), lane_incr() and fingerprint_change() kept. Idempotent. In a batch, at its end
-- (carry.defer: batch_flush()).
local function flush()
        if carry.defer then return end
        local set, del = {}, {}
        for f, held in pairs(meta_dirty) do
                local v = M[f]
                if held == NOT_HELD then held = nil end
                if v == nil then
                        if held ~= nil then del[#del + 1] = f end
                elseif held == nil or held == GARBAGE or (held ~= v and tonumber(held) ~= v) then
                        set[#set + 1] = f
                        set[#set + 1] = v
                end
        end
        meta_dirty = {} -- (Redis holds M's values now: the next meta_set() of a field takes them)
        if #set > 0 then redis.call('HSET', K.meta, unpack(set)) end
        if #del > 0 then redis.call('HDEL', K.meta, unpack(del)) end
        for l, c in pairs(lane_cache) do
                if c.dirty then
                        redis.call('HSET', k_lane(l), 'used', c.used, 'waiting', c.waiting)
                        c.dirty = false
                end
        end
        for node, d in pairs(fp_delta) do
                local key = k_node(node)
                local f = redis.call('HMGET', key, 'fp_n', 'fp_x', 'fp_s')
                local n, x, sum = tonumber(f[1] or '0'), tonumber(f[2] or '0'), tonumber(f[3] or '0')
                if n and x and sum and n % 1 == 0 and x % 1 == 0 and sum % 1 == 0 then -- (NaN, ±inf: not)
                        n, x, sum = n + d[1], bit.bxor(x, d[2]), sum + d[3]
                else
                        -- Garbage (anyone may write the node hash): the fingerprint counted again from the
                        -- node's records, as they are now (this call's changes made), O(its records) once.
                        n, x, sum = 0, 0, 0
                        for _, rid in ipairs(redis.call('ZRANGE', k_records(node), '0', '-1')) do
                                local kind = string.sub(redis.call('HGET', K.rid, node .. ':' .. rid) or '', 1, 1)
                                if kind == 'l' or kind == 'w' then
                                        local h = fnv1a32(rid .. kind)
                                        n, x, sum = n + 1, bit.bxor(x, h), sum + h
                                end
                        end
                        LIFE.bad('fp', node)
                end
                redis.call('HSET', key, 'fp_n', n, 'fp_x', x % 4294967296, 'fp_s', sum % 4294967296)
        end
        fp_delta = {}
end

-- The end of a batch (batch.lua), or of its run of operations that carry their state: what flush() kept is
-- written, and the next operation begins afresh.
local function batch_flush()
        carry.defer = false
        flush()
end

-- pool-local.c:free_slots(): counted against every slot held, also those above a shrunk limit.
local function free_slots()
        if M.drained == 1 or M.in_use + M.drained_free + M.resting_free >= R.limit then return 0 end
        return R.limit - M.in_use - M.drained_free - M.resting_free
end

local GRANTABLE, HOLD, PASS = 0, 1, 2

-- pool-local.c:reserved_for_others()
local function reserved_for_others(lane)
        local r = 0
        for _, m in ipairs(R.lane_names) do
                local rule = R.lanes[m]
                if m ~= lane and rule.reserve > 0 then
                        local used = lane_get(m).used
                        if rule.reserve > used then r = r + rule.reserve - used end
                end
        end
        return r
end

-- pool-local.c:lane_verdict()
local function lane_verdict(lane, k, free)
        local rule = R.lanes[lane]
        if rule.max_in_use >= 0 and lane_get(lane).used + k > rule.max_in_use then return PASS end
        if k > free then return HOLD end
        if free - k < reserved_for_others(lane) then return PASS end
        return GRANTABLE
end

-- pool-local.c:queue_next()/lane_next(): the heads of the (lane, k) buckets only, O(lanes × distinct k).
-- Wids are the arrival sequence in fixed-width hex: string order is arrival order. carry.best: the head's
-- bucket, { lane, k (its number), ks (the string of lk:L: its key's name) }.
-- Untrusted (anyone may write lk:L): a member that is not the decimal of a slot count 1..2^31 as waiter_link()
-- writes it ("x": a Lua error on every call; "01": a head taken for k = 1 and dropped from b:L:1, not its
-- bucket, for ever) leaves lk:L with its bucket, told ("bad-key" "lk"; drain.lua does the same).
local function queue_next()
        local free = free_slots()
        local best, best_prio, best_verdict = nil, nil, PASS
        for _, lane in ipairs(R.lane_names) do
                if lane_get(lane).waiting > 0 then
                        local prio = R.lanes[lane].priority
                        for _, k in ipairs(redis.call('SMEMBERS', k_lk(lane))) do
                                local n = tonumber(k)
                                local head = nil
                                if not (n and n >= 1 and n <= 2147483648 and istr(n) == k) then
                                        redis.call('SREM', k_lk(lane), k)
                                        -- (not a selector's bucket, "K:CANON": ls:L's, its waiters' own)
                                        if not string.find(k, ':', 1, true) then redis.call('DEL', k_bucket(lane, k)) end
                                        LIFE.bad('lk', k)
                                else
                                        head = redis.call('ZRANGE', k_bucket(lane, k), '0', '0')[1]
                                        -- emptied: see waiter_unlink()
                                        if not head then redis.call('SREM', k_lk(lane), k) end
                                end
                                if head then
                                        local v = lane_verdict(lane, n, free)
                                        if v ~= PASS and (not best or prio > best_prio or
                                                          (prio == best_prio and head < best)) then
                                                best, best_prio, best_verdict = head, prio, v
                                                carry.best = { lane = lane, k = n, ks = k }
                                        end
                                end
                        end
                end
        end
        return best, best_verdict
end

-- A held slot's identity: its member's name, or "#INDEX" for an anonymous slot (sid's keys).
local function lease_slot_identity(l, i)
        return l.members[i] or slot_identity(l.slots[i])
end

---------------------------------------------------------------------------------------------- members' lives (SPEC §3.6)

-- Quarantine on a shared pool (README, "Members' lives"): pool-local.c's life_*() over two hashes,
--   {sb:P}:qm  member -> cmsgpack { since (pool µs), job, exit status (-1: by hand), node name, reason }:
--              the quarantined members (a field there is a quarantine, whatever its value holds)
--   {sb:P}:qf  member -> the leases in a row that ended with a quarantine exit status (decimal)
-- A quarantined member leaves `busy` while free, as a drained one does (drained_free counts it once), so
-- that no grant of any node takes it. Everything in them is untrusted: garbage reads as a quarantine of
-- nobody known, never as none. The functions are LIFE's fields (declared at the top).
function LIFE.key() return P .. ':qm' end
function LIFE.failures_key() return P .. ':qf' end
-- A command on a key of the members' lives (qf, hq, dr, du, rekey); one of another type (by hand) is dropped
-- first, as garbage: what it held is lost (a failure count from 0, a health waiter left to its budget, a drain
-- record or until, a rekey job), never a reason for every later call to fail (README, "Members' lives").
function LIFE.keyed(cmd, key, ...)
        local ok, v = pcall(redis.call, cmd, key, ...)
        if ok then return v end
        redis.call('DEL', key)
        LIFE.bad(string.match(key, ':([^:]+)$'), '?')
        return redis.call(cmd, key, ...)
end

-- Garbage this call repaired in a key of the members' lives (key: "qm", "qf", "hq", "dr", "du", "rekey", or
-- "meta" for the health waiters' counts; what: the field, wid or member, "?" for the whole key), or elsewhere
-- ("lane", "sel", "fp", "h", "w": README, "Integrity"): reported
-- (notice "bad-key"), as a garbage rest is, so that the node counts it as bad input and the journal says
-- someone wrote into the pool's keys (README, "Members' lives"). Each repair is told once: it leaves no garbage.
function LIFE.bad(key, what)
        notices[#notices + 1] = { 'bad-key', key or '?', type(what) == 'string' and string.sub(what, 1, 64) or '?' }
end

-- A command on qf (a key of another type counts nothing).
function LIFE.failures(cmd, ...)
        return LIFE.keyed(cmd, LIFE.failures_key(), ...)
end

-- The member's place among the configured members (0-based), or nil.
function LIFE.pos(name)
        return R.member_pos and R.member_pos[name]
end

-- A key of another type (written by hand) quarantines every member: errors go the safe way (no grant of a
-- member that may be quarantined); `slotctl restore` of any member deletes it (LIFE.restore()).
function LIFE.quarantined(name)
        local ok, v = pcall(redis.call, 'HEXISTS', LIFE.key(), name)
        return not ok or v == 1
end

-- The rules' part (rules_from()): quarantine-exit-codes=3,4 (a set) and quarantine-after=N (≥ 1).
function LIFE.rules(r, t)
        if r.members then
                r.member_pos = {}
                for i, m in ipairs(r.members) do r.member_pos[m] = i - 1 end
        end
        local codes = t['quarantine-exit-codes']
        if not codes or codes == '' then return end
        r.qcodes = {}
        for c in string.gmatch(codes, '[^,]+') do
                local n = tonumber(c)
                if n and n >= 1 and n <= 255 then r.qcodes[n] = true end
        end
        r.qafter = math.max(1, tonumber(t['quarantine-after'] or '1') or 1)
end

-- The member's free place leaves `busy` (out) or rejoins it, unless a drain by hand keeps it out or a
-- lease holds it (lease_free() then leaves it out: member_drained_at()).
function LIFE.busy(name, out)
        local pos = LIFE.pos(name)
        if not pos or pos >= R.limit or redis.call('SISMEMBER', K.dm, name) == 1 then return end
        if redis.call('GETBIT', K.occ, pos) == 1 or rests.drain(name, out) then return end
        redis.call('SETBIT', K.busy, pos, out and 1 or 0)
        meta_incr('drained_free', out and 1 or -1)
end

-- A member neither drained (dm) nor quarantined (qm) whose free place is still out of `busy`, counted in
-- drained_free: its dm entry or qm field was lost (the key evicted or deleted by hand) while it was out, and
-- its undrain or restore found nothing to undo. Its place goes back, as the undrain or restore would have put
-- it, and it is told ("bad-key" key, name); else the slot stayed parked until a reload laid the pool out
-- again. A place held (occ) or resting is left as it is (the lease's end, the rest's end put it back). Run
-- only by an undrain or a restore that found nothing to undo: a command or four, then.
function LIFE.unpark(name, key)
        local pos = LIFE.pos(name)
        if not pos or pos >= R.limit or M.drained_free <= 0 then return end
        if redis.call('GETBIT', K.busy, pos) == 0 or redis.call('GETBIT', K.occ, pos) == 1 or
           redis.call('SISMEMBER', K.dm, name) == 1 or LIFE.quarantined(name) then
                return
        end
        local ok, resting = pcall(redis.call, 'ZSCORE', K.rest, name)
        if not ok or resting then return end
        redis.call('SETBIT', K.busy, pos, 0)
        meta_incr('drained_free', -1)
        LIFE.bad(key, name)
end

function LIFE.node_name()
        return redis.call('HGET', k_node(NODE), 'name') or NODE
end

-- Quarantines a configured member (false: it is not one, or is quarantined already: the first quarantine's
-- who and why stay, as pool-local.c:local_quarantine()). The caller's reply tells it ([6] notices): the node
-- whose call did it journals it, once fleet-wide.
function LIFE.quarantine(name, job, status, reason)
        if not LIFE.pos(name) or LIFE.quarantined(name) then return false end
        job, reason = job or '', reason or ''
        local by = LIFE.node_name()
        redis.call('HSET', LIFE.key(), name, cmsgpack.pack({ now, job, status, by, reason }))
        if tonumber(M.life) ~= 1 then meta_set('life', 1) end -- LIFE.list() looks from now on
        LIFE.failures('HDEL', name)
        LIFE.busy(name, true)
        notices[#notices + 1] = { 'quarantined', name, now, job, status, by, reason }
        return true
end

-- status: the health job's exit status that restored it (0), -1 by hand (pool-local.c's life_set()).
function LIFE.restore(name, job, status)
        local ok, gone = pcall(redis.call, 'HDEL', LIFE.key(), name)
        if not ok then
                redis.call('DEL', LIFE.key()) -- another type: nobody's quarantine can be read from it
                LIFE.bad('qm', '?')
                gone = 1
        end
        if gone == 0 then
                LIFE.unpark(name, 'qm') -- (its qm field lost while it was out: its place back)
                return false
        end
        LIFE.failures('HDEL', name)
        LIFE.busy(name, false)
        notices[#notices + 1] = { 'restored', name, now, job or '', status or -1, LIFE.node_name(), '' }
        return true
end

-- pool-local.c:local_report_exit() for a lease this call released: a quarantine exit status counts one
-- more failure in a row for each of its members (quarantined at quarantine-after), any other resets it.
-- status: 0–255 (a client that reports none sends nothing: nothing changes).
function LIFE.released(l, status, job)
        if not R.members then return end
        -- A health job as its grant said (health = also: only where it got quarantined members); a lease of
        -- scripts from before [14], by its lane.
        local health = l.hjob or (R.lanes[l.lane] and R.lanes[l.lane].health)
        for _, m in ipairs(l.members or {}) do
                if type(m) == 'string' and LIFE.pos(m) then
                        if health then
                                -- A health job's exit 0 restores; anything else leaves the member as it is.
                                if status == 0 then LIFE.restore(m, job, 0) end
                        elseif not R.qcodes then
                                -- no quarantine rules: nothing counts
                        elseif not R.qcodes[status] then
                                LIFE.failures('HDEL', m)
                        else
                                local n = (int_of(LIFE.failures('HGET', m)) or 0) + 1
                                if n < 0 then n = 1 end
                                if n >= R.qafter and LIFE.quarantine(m, job, status, '') then
                                        -- quarantined: its count starts again (LIFE.quarantine() dropped it)
                                elseif n < 1000000 then
                                        LIFE.failures('HSET', m, n)
                                end
                        end
                end
        end
end

-- The reply's cache [14]: { { member, since, job, exit status, node name, reason }… } of the configured
-- members quarantined. A record that is not one (garbage) is shown as a quarantine of unknown origin.
function LIFE.list()
        -- A pool that never had a quarantine (meta.life unset) costs no command a reply.
        if tonumber(M.life) ~= 1 then return {} end
        local ok, n = pcall(redis.call, 'HLEN', LIFE.key())
        if not ok or n == 0 or not R.members then return {} end
        local found = {}                -- place -> record
        if n <= 256 then
                local a = redis.call('HGETALL', LIFE.key())
                for i = 1, #a, 2 do
                        local pos = LIFE.pos(a[i])
                        if pos then found[pos] = a[i + 1] end
                end
        else
                for i = 1, #R.members, 1000 do
                        local v = redis.call('HMGET', LIFE.key(), unpack(R.members, i, math.min(i + 999, #R.members)))
                        for j = 1, #v do if v[j] then found[i + j - 2] = v[j] end end
                end
        end
        local function str(x) return type(x) == 'string' and string.sub(x, 1, 1024) or '' end
        local function num(x, d)
                if type(x) ~= 'number' or x ~= x or math.abs(x) >= 2 ^ 53 then return d end
                return math.floor(x)
        end
        local out = {}
        for pos, m in ipairs(R.members) do
                local v = found[pos - 1]
                if v then
                        local ok, a = pcall(cmsgpack.unpack, v)
                        if not ok or type(a) ~= 'table' then a = {} end
                        out[#out + 1] = { m, num(a[1], 0), str(a[2]), num(a[3], -1), str(a[4]), str(a[5]) }
                end
        end
        return out
end

---------------------------------------------------------------------------------------------- drains with who, why, until (SPEC §3.6)

-- A drain's record on a shared pool (README, "Drains with a reason"): who, why, since and until live in Redis,
-- and its until is the pool's own instant (next_due()), not a timer of one node:
--   {sb:P}:dr  field "" (the pool) or a member -> cmsgpack { since, who, reason, until (-1: none), node name }
--   {sb:P}:du  ZSET field -> until (pool µs), the drains that end by themselves
-- meta.drain_next is du's first score (no command a call to know it is not due). Untrusted like the rest:
-- a record of garbage is shown as a drain of nobody known; an until of garbage ends nothing.
function DRAINS.key() return P .. ':dr' end
function DRAINS.until_key() return P .. ':du' end

-- A field of dr or du that is no drain's: neither "" (the pool) nor a name (SPEC §4: [A-Za-z0-9._-]{1,64}).
-- A name of no configured member may be a drain's of a member a reload took away: kept.
function DRAINS.field_ok(f)
        return f == '' or (#f <= 64 and string.match(f, '^[%w._%-]+$') ~= nil)
end

-- du's first score into meta.drain_next. Untrusted: scores of 2^53 µs or more (1e308, +inf: a hand's ZADD)
-- are no instant, and a drain without an until is one without a du entry: they leave du (told, "bad-key").
function DRAINS.next_store()
        local first = LIFE.keyed('ZRANGE', DRAINS.until_key(), '0', '0', 'WITHSCORES')
        if first[2] and not (tonumber(first[2]) and tonumber(first[2]) < 2 ^ 53) then
                for _, f in ipairs(redis.call('ZRANGEBYSCORE', DRAINS.until_key(), '9007199254740992', '+inf',
                                              'LIMIT', 0, 16)) do
                        redis.call('ZREM', DRAINS.until_key(), f)
                        LIFE.bad('du', f)
                end
                first = redis.call('ZRANGE', DRAINS.until_key(), '0', '0', 'WITHSCORES')
        end
        meta_set('drain_next', first[2] and tonumber(first[2]) or nil)
end

-- Untrusted like the rest (a hand's ZADD): an until below zero is due now (its instant ends it); one beyond
-- 2^53 µs, or not a number, is no instant (the drain lasts until undrained by hand).
function DRAINS.next()
        local v = tonumber(M.drain_next)
        if not v or v ~= v or v >= 2 ^ 53 then return nil end
        if v < 0 then return now end
        return v
end

-- The record of a drain made now (field: "" or a member), or dropped (undrain).
function DRAINS.record(field, on, who, reason, until_)
        if on then
                LIFE.keyed('HSET', DRAINS.key(), field, cmsgpack.pack({ now, who, reason, until_ or -1, LIFE.node_name() }))
                if until_ then
                        LIFE.keyed('ZADD', DRAINS.until_key(), until_, field)
                else
                        LIFE.keyed('ZREM', DRAINS.until_key(), field)
                end
        else
                LIFE.keyed('HDEL', DRAINS.key(), field)
                LIFE.keyed('ZREM', DRAINS.until_key(), field)
        end
        DRAINS.next_store()
        if tonumber(M.drain_records) ~= 1 then meta_set('drain_records', 1) end -- DRAINS.list() looks from now on
        notices[#notices + 1] = { on and 'drained' or 'undrained', field, now, who or '', reason or '', until_ or -1,
                                  0 }
end

-- A member's drain by hand: in or out of dm, its free place out of or back into `busy` (a quarantined one stays
-- out). false: not a configured member.
function DRAINS.member(name, on)
        local pos = LIFE.pos(name)
        if not pos then return false end
        local was = redis.call('SISMEMBER', K.dm, name) == 1
        if was == on then
                if not on then LIFE.unpark(name, 'dm') end -- (its dm entry lost while it was out: its place back)
                return true
        end
        if on then redis.call('SADD', K.dm, name) else redis.call('SREM', K.dm, name) end
        -- A quarantined member stays out of `busy` either way (LIFE.busy()); a resting one stays in it and
        -- moves between the counts (rests.drain()).
        if pos < R.limit and redis.call('GETBIT', K.occ, pos) == 0 and not LIFE.quarantined(name) and
           not rests.drain(name, on) then
                redis.call('SETBIT', K.busy, pos, on and 1 or 0)
                meta_incr('drained_free', on and 1 or -1)
        end
        return true
end

-- Drains whose until is at or before t end then (instant()), each told once ([6] notices, "expired" 1).
function DRAINS.expire(t)
        local due = LIFE.keyed('ZRANGEBYSCORE', DRAINS.until_key(), '-inf', t, 'WITHSCORES', 'LIMIT', '0', '16')
        for i = 1, #due, 2 do
                local field, at = due[i], tonumber(due[i + 1])
                if not at or at < 0 or at > t or not DRAINS.field_ok(field) then
                        at = math.min(math.max(at or t, 0), t)
                        LIFE.bad('du', field) -- garbage (below zero, or no drain's field): ended now, told
                end
                -- The reason of the drain that ends goes with its end (pool-local.c tells it: engine.c,
                -- drains_expire()); a record of garbage has none.
                local okg, raw = pcall(redis.call, 'HGET', DRAINS.key(), field)
                local okr, rec = pcall(cmsgpack.unpack, okg and raw or '')
                local why = okg and okr and type(rec) == 'table' and type(rec[3]) == 'string' and string.sub(rec[3], 1, 1024) or ''
                if field == '' then
                        meta_set('drained', 0)
                else
                        DRAINS.member(field, false)
                end
                LIFE.keyed('HDEL', DRAINS.key(), field)
                LIFE.keyed('ZREM', DRAINS.until_key(), field)
                notices[#notices + 1] = { 'undrained', field, at, '', why, at, 1 }
        end
        DRAINS.next_store()
end

-- The reply's cache [15]: { { field ("" the pool), since, who, reason, until (-1), node name }… }.
function DRAINS.list()
        if tonumber(M.drain_records) ~= 1 then return {} end -- no drain was ever recorded: no command
        local ok, n = pcall(redis.call, 'HLEN', DRAINS.key())
        if not ok or n == 0 then return {} end
        local a = n <= 257 and LIFE.keyed('HGETALL', DRAINS.key()) or {}
        local out = {}
        local function str(x) return type(x) == 'string' and string.sub(x, 1, 1024) or '' end
        local function num(x, d)
                if type(x) ~= 'number' or x ~= x or math.abs(x) >= 2 ^ 53 then return d end
                return math.floor(x)
        end
        for i = 1, #a, 2 do
                if not DRAINS.field_ok(a[i]) then
                        -- No drain's field (a hand's HSET): dropped and told, not skipped on every reply.
                        redis.call('HDEL', DRAINS.key(), a[i])
                        LIFE.bad('dr', a[i])
                elseif a[i] == '' or LIFE.pos(a[i]) then
                        local okd, r = pcall(cmsgpack.unpack, a[i + 1])
                        if not okd or type(r) ~= 'table' then
                                -- Garbage: written back as what it is shown as (a drain of nobody known), told once.
                                r = {}
                                redis.call('HSET', DRAINS.key(), a[i], cmsgpack.pack({ 0, '', '', -1, '' }))
                                LIFE.bad('dr', a[i])
                        end
                        out[#out + 1] = { a[i], num(r[1], 0), str(r[2]), str(r[3]), num(r[4], -1), str(r[5]) }
                end
        end
        return out
end

---------------------------------------------------------------------------------------------- health lanes (SPEC §3.6)

-- pool-local.c's health lanes on a shared pool (README, "Health lanes"): a lane with lane.L.health=1 in the
-- rules is granted quarantined members only, beside the queue: its waiters are in {sb:P}:hq (ZSET, wid; the
-- wids' order is arrival order) and in w, dl and the records as any waiter, counted in meta.hwaiting, not in
-- meta.waiting (pool-local.c counts them apart: they never hold back the ordinary queue, nor it them).
function HEALTH.key() return P .. ':hq' end
function HEALTH.count(by) meta_set('hwaiting', (tonumber(M.hwaiting) or 0) + by) end
function HEALTH.waiting() return tonumber(M.hwaiting) or 0 end

-- What every waiter is linked into, beside its queue: its deadline, its node's records, its lane's count
-- (waiter_link() too: a field of HEALTH's, not a local of its own, for Lua's 200 locals a chunk).
function HEALTH.enlist(w)
        if w.deadline ~= INF then
                redis.call('ZADD', K.dl, w.deadline, w.wid)
                carry.heads = nil
        end
        record_add(w.node, w.rid, 'w', 'w:' .. w.wid)
        lane_incr(w.lane, 'waiting', 1)
end

-- What HEALTH.enlist() linked, unlinked (waiter_unlink() too). keep_record: the caller turns the waiter's
-- record into its lease's.
function HEALTH.delist(w, keep_record)
        if w.deadline ~= INF then
                redis.call('ZREM', K.dl, w.wid)
                carry.heads = nil
        end
        if not keep_record then record_remove(w.node, w.rid, 'w') end
        lane_incr(w.lane, 'waiting', -1)
end

function HEALTH.link(w)
        LIFE.keyed('ZADD', HEALTH.key(), 0, w.wid)
        HEALTH.enlist(w)
        HEALTH.count(1)
end

function HEALTH.unlink(w, keep_record)
        redis.call('HDEL', K.w, w.wid)
        LIFE.keyed('ZREM', HEALTH.key(), w.wid)
        HEALTH.delist(w, keep_record)
        HEALTH.count(-1)
end


-- pool-local.c:health_avail(): the free quarantined members not drained by hand and not resting (cooldown=),
-- in member order (places).
function HEALTH.avail()
        local out = {}
        local cooling = (R.cooldown or 0) > 0
        for i, m in ipairs(R.members or {}) do
                if i > R.limit then break end
                if LIFE.quarantined(m) and redis.call('SISMEMBER', K.dm, m) == 0 and
                   redis.call('GETBIT', K.occ, i - 1) == 0 and not (cooling and redis.call('ZSCORE', K.rest, m)) then
                        out[#out + 1] = i - 1
                end
        end
        return out
end

-- pool-local.c:health_capacity_of(): how many members the request could ever get now (drained ones too: how
-- many it could were they undrained).
function HEALTH.capacity(w, drained_too)
        local n = 0
        for i, m in ipairs(R.members or {}) do
                if i > R.limit then break end
                if LIFE.quarantined(m) and (drained_too or redis.call('SISMEMBER', K.dm, m) == 0) and
                   HEALTH.admits(w, i - 1) then
                        n = n + 1
                end
        end
        return n
end

-- pool-local.c:health_refusal(): why a request too few members can satisfy now is refused: its quarantined
-- members are drained by hand ("member-drained"), or there are not enough of them ("not-quarantined").
function HEALTH.refusal(w, k)
        return HEALTH.capacity(w, true) >= k and 'member-drained' or 'not-quarantined'
end

function HEALTH.blocked(lane, k)
        local rule = R.lanes[lane]
        return rule.max_in_use >= 0 and lane_get(lane).used + k > rule.max_in_use
end

-- pool-local.c:health_fits(): the places of avail the request admits, and whether k of them and its lane allow it.
function HEALTH.fits(w, lane, k, avail)
        local usable = {}
        for _, pos in ipairs(avail) do
                if HEALTH.admits(w, pos) then usable[#usable + 1] = pos end
        end
        return not HEALTH.blocked(lane, k) and #usable >= k, usable
end

-- pool-local.c:health_set_aside(): what a waiting health request could use is kept from those behind it.
function HEALTH.set_aside(w, avail)
        if HEALTH.blocked(w.lane, w.k) then return avail end
        local left = {}
        for _, pos in ipairs(avail) do
                if not HEALTH.admits(w, pos) then left[#left + 1] = pos end
        end
        return left
end

local function member_drained_at(pos)
        return R.members ~= nil and pos < R.limit and (redis.call('SISMEMBER', K.dm, R.members[pos + 1]) == 1 or
               LIFE.quarantined(R.members[pos + 1]))
end

---------------------------------------------------------------------------------------------- budgets (SPEC §3.1)

local function fast_threshold(q) return math.max(math.floor(q / 20), math.min(USEC_PER_SEC, q)) end

-- pool-local.c's saturated_budget() and a new waiter's budget: functions as fields of one table, one local of
-- the library's (Lua's 200 locals a chunk), as LIFE's.
local BUDGET = {}

function BUDGET.saturated()
        if R.congestion then return R.congestion end
        return math.max(math.floor(R.q / 10), math.min(USEC_PER_SEC, R.q))
end

local function idle_at(t) return math.max(0, t - M.last_fast) end

-- pool-local.c:local_submit(): a new waiter's budget is fixed now, from the idle time now (SPEC §3.1): the
-- lane's (budget_set: lane_budget) or the adaptive one, at most the client's cap; shed when the saturated
-- budget is the one that runs out. Sets w.idle, w.state (with a queue-timeout), w.budget, w.shed, w.deadline.
function BUDGET.fix(w, now, budget_set, lane_budget, cap)
        local adaptive = INF
        if R.q then
                w.idle = idle_at(now)
                w.state = w.idle > R.q and 'saturated' or 'keeping-up'
                adaptive = w.state == 'saturated' and BUDGET.saturated() or R.q
        end
        w.budget = math.min(budget_set and lane_budget or adaptive, cap)
        w.shed = not budget_set and w.state == 'saturated' and adaptive <= cap
        w.deadline = usec_add(now, w.budget)
end

---------------------------------------------------------------------------------------------- decisions

-- A decision, as the reply's events, the submit body, the stream and the outcome keys carry it
-- (README, "Decision"): verdict, rid, at, wait, refusal, reason, state, idle, budget, position, queued,
-- token, slots, members.
local function decision(verdict, rid, at, o)
        return {
                verdict, rid, at, o.wait or 0, o.refusal or '', o.reason or '', o.state or 'none',
                o.idle or 0, wire(o.budget or INF), o.position or 0, o.queued or 0, o.token or 0,
                o.slots or {}, o.members or {},
        }
end

-- packed: cmsgpack of d when the caller has it already (it costs more than a command); px: how long it is
-- kept (ms), node TTL + 10 s unless given. Two writes to two keys per node, no key with a TTL: Redis's
-- expiry cycle walked one key per decided request (stalls of up to 42 ms at full rate: issue 21).
local function outcome_store(node, rid, d, packed, px)
        redis.call('HSET', k_outcomes(node), rid, packed or cmsgpack.pack(d))
        redis.call('ZADD', k_outcome_exp(node), now + (px or math.floor((R.ttl or 30000000) / 1000) + 10000) * 1000,
                   rid)
end

-- node's outcome record of rid, its Decision unpacked; nil when there is none, it expired (a page not trimmed
-- yet) or it is garbage.
local function outcome_get(node, rid)
        local packed = redis.call('HGET', k_outcomes(node), rid)
        if not packed or tonumber(redis.call('ZSCORE', k_outcome_exp(node), rid) or '0') <= now then return nil end
        local ok, d = pcall(cmsgpack.unpack, packed)
        if ok and type(d) == 'table' then return d end
        return nil -- garbage (anyone may write it): none, the rid decided anew
end

local function outcome_drop(node, rid)
        if redis.call('HDEL', k_outcomes(node), rid) > 0 then redis.call('ZREM', k_outcome_exp(node), rid) end
end

local outcomes_trim, notify
do -- (its helpers local to this block: Lua allows the main chunk 200 locals)
        local OUTCOME_TRIM_PAGE = 128   -- expired outcome records a call drops at most (the caller's own)
        local STREAM_MAXLEN = 4096
        -- The caller's expired outcome records, a page per call (every reply): a node makes a call per request it
        -- decides, so its records go as fast as they come. A dead node's go with it (reap()).
        outcomes_trim = function()
                if carry.on then return end -- a page per call: the batch's first operation trimmed it
                local old = redis.call('ZRANGEBYSCORE', k_outcome_exp(NODE), '-inf', now, 'LIMIT', '0', OUTCOME_TRIM_PAGE)
                if #old == 0 then return end
                redis.call('HDEL', k_outcomes(NODE), unpack(old))
                redis.call('ZREM', k_outcome_exp(NODE), unpack(old))
        end

        -- A final decision for a node's request: into its stream, its outcome key, and the reply if it is the
        -- caller's.
        --
        -- Stream entries are plain field/value strings (README, "Stream entries"), so that the node reads them
        -- as it reads replies, without a msgpack decoder.
        local STREAM_FIELDS = {
                'verdict', 'rid', 'at', 'wait', 'refusal', 'reason', 'state', 'idle', 'budget', 'position', 'queued',
                'token',
        }

        -- transient: a notice that decides nothing (a set's "ready"): no outcome record.
        notify = function(node, d, transient)
                local args = { 'XADD', k_stream(node), 'MAXLEN', '~', STREAM_MAXLEN, '*' }
                for i, name in ipairs(STREAM_FIELDS) do
                        args[#args + 1] = name
                        args[#args + 1] = type(d[i]) == 'number' and istr(d[i]) or d[i]
                end
                local slots = {}
                for i, v in ipairs(d[13]) do slots[i] = istr(v) end
                args[#args + 1] = 'slots'
                args[#args + 1] = table.concat(slots, ',')
                args[#args + 1] = 'members'
                args[#args + 1] = table.concat(d[14], ',')
                local id = redis.call(unpack(args))
                if node == NODE then
                        stream_last = id
                        events[#events + 1] = d
                end
                if not transient then outcome_store(node, d[2], d, cmsgpack.pack(d)) end
        end
end

---------------------------------------------------------------------------------------------- waiters

local function waiter_get(wid)
        local packed = redis.call('HGET', K.w, wid)
        if not packed then return nil end
        local ok, a = pcall(cmsgpack.unpack, packed)
        if not (ok and type(a) == 'table' and type(a[1]) == 'string' and type(a[2]) == 'string' and
                type(a[3]) == 'string' and type(a[4]) == 'number' and type(a[5]) == 'number' and
                type(a[11]) == 'number' and (a[7] == nil or type(a[7]) == 'string') and
                (a[8] == nil or type(a[8]) == 'number')) then
                -- Garbage (anyone may write w): dropped and told; HLEN w then differs from meta's count and
                -- the next call makes the pool anew ("Integrity"). Here: a waiter that is gone.
                redis.call('HDEL', K.w, wid)
                LIFE.bad('w', wid)
                return nil
        end
        return {
                wid = wid, node = a[1], rid = a[2], lane = a[3], k = a[4], arrival = a[5],
                deadline = unwire(a[6]), state = a[7], idle = a[8], budget = unwire(a[9]), shed = a[10] == 1,
                prio = a[11], sel = type(a[12]) == 'string' and a[12] or '', health = a[13] == 1,
                gated = a[14] == 1, ready = a[15] == 1,
        }
end

local waiter_put, waiter_position, waiter_link, waiter_unlink
do -- (its helpers local to this block: Lua allows the main chunk 200 locals)
        -- A waiter record's [12]: its selector canon; nil (none) unless [13] follows it.
        local function waiter_sel_field(w)
                if (w.sel or '') ~= '' then return w.sel end
                return (w.health or w.gated) and '' or nil
        end

        -- [13] health, [14] a set's part (gated: SETS), [15] said ready (SETS.mark_ready()); absent at the end.
        waiter_put = function(w)
                local health = w.health and 1 or nil
                if w.gated and not health then health = 0 end
                redis.call('HSET', K.w, w.wid, cmsgpack.pack({
                        w.node, w.rid, w.lane, w.k, w.arrival, wire(w.deadline), w.state, w.idle, wire(w.budget),
                        w.shed and 1 or 0, w.prio, waiter_sel_field(w), health, w.gated and 1 or nil,
                        w.gated and w.ready and 1 or nil,
                }))
        end

        -- 0-based place in the queue: the waiters of higher priorities, then the rank within its own; and how many
        -- wait in that queue. A health waiter's: its place among hq's, of meta.hwaiting (pool-local.c's
        -- local_position(): its place in the health list, of n_health).
        waiter_position = function(w)
                if w.health then return LIFE.keyed('ZRANK', HEALTH.key(), w.wid) or 0, HEALTH.waiting() end
                local pos = 0
                for _, p in ipairs(redis.call('ZRANGEBYSCORE', K.prios, '(' .. istr(w.prio), '+inf')) do
                        local n = redis.call('ZCARD', k_queue(p))
                        if n == 0 then redis.call('ZREM', K.prios, p) end -- emptied: see waiter_unlink()
                        pos = pos + n
                end
                return pos + (redis.call('ZRANK', k_queue(w.prio), w.wid) or 0), M.waiting
        end

        -- A waiter's bucket: per (lane, k) (k_lk), or per (lane, k, selector canon) (k_ls: SPEC §3.5).
        local function waiter_bucket(w)
                if (w.sel or '') == '' then return k_bucket(w.lane, w.k) end
                return k_bucket(w.lane, istr(w.k) .. ':' .. w.sel)
        end

        local function selector_bucket_link(w)
                redis.call('ZADD', waiter_bucket(w), 0, w.wid)
                redis.call('SADD', k_ls(w.lane), istr(w.k) .. ':' .. w.sel)
                meta_incr('selective', 1)
        end

        waiter_link = function(w)
                lane_get(w.lane) -- (before its record: lane_get())
                waiter_put(w)
                if w.health then return HEALTH.link(w) end
                if (w.sel or '') ~= '' then
                        selector_bucket_link(w)
                else
                        redis.call('ZADD', k_bucket(w.lane, w.k), 0, w.wid)
                        redis.call('SADD', k_lk(w.lane), w.k)
                end
                redis.call('ZADD', k_queue(w.prio), 0, w.wid)
                redis.call('ZADD', K.prios, w.prio, w.prio)
                HEALTH.enlist(w)
                meta_incr('waiting', 1)
        end

        -- Emptied buckets and priority queues stay listed in lk:L and prios until a reader finds them empty
        -- (queue_next(), waiter_position()): two ZCARDs less per grant. keep_record: the caller turns the
        -- waiter's record into its lease's.
        waiter_unlink = function(w, keep_record)
                lane_get(w.lane) -- (before its record goes: lane_get())
                if w.health then return HEALTH.unlink(w, keep_record) end
                redis.call('HDEL', K.w, w.wid)
                redis.call('ZREM', waiter_bucket(w), w.wid)
                if (w.sel or '') ~= '' then meta_incr('selective', -1) end
                redis.call('ZREM', k_queue(w.prio), w.wid)
                HEALTH.delist(w, keep_record)
                meta_incr('waiting', -1)
        end
end

-- pool-local.c:waiter_refuse()
local function waiter_refuse(w, refusal, reason, at)
        waiter_unlink(w)
        notify(w.node, decision('refused', w.rid, at, {
                wait = at - w.arrival, refusal = refusal, reason = reason, state = w.state, idle = w.idle,
                budget = w.budget,
        }))
end

-- A set's part (set.lua) that could be granted here now: its node is told "ready" (a stream entry, and an
-- event when it is the caller), once until a grant of the set finds it not ready again (SETS.unready()).
function SETS.mark_ready(w, t)
        if w.ready then return end
        w.ready = true
        waiter_put(w)
        notify(w.node, decision('ready', w.rid, t, { state = w.state, idle = w.idle, budget = w.budget }), true)
end

function SETS.unready(w)
        if not w.ready then return end
        w.ready = false
        waiter_put(w)
end

---------------------------------------------------------------------------------------------- cooldown (SPEC §3.6)

-- pool-local.c's rests (cooldown=): a slot released in a pool with cooldown= rests until its release plus
-- the cooldown, on the pool clock, before any node may grant it. Its position stays in `busy` (neither free
-- nor held, as a drained member's), {sb:P}:rest (ZSET) scores its identity (lease_slot_identity(): the
-- member's name, or "#INDEX") by its end, and meta.resting_free counts the rests of members not drained
-- (free_slots() leaves them out; a drained one is in drained_free, as pool-local.c counts them). A rest
-- begins at every lease's end (a release, a dead node's reap, an orphan's lapse: lease_free()), ends at its
-- time (rests.wake(): at the start of an instant, a submit and a release, as pool-local.c's), when a lease
-- is restored over it (reclaim.lua), follows its identity across an adopted reload (tick.lua, relayout():
-- all end when cooldown= goes) and is dropped with the pool's state (pool_wipe()). meta.rest_max is the
-- latest end any rest was given.
-- Redis's content is untrusted: an entry whose end lies beyond both now + cooldown and rest_max (a hand's
-- ZADD, a clock gone wrong), whose identity names no slot below the limit, or whose slot is held or free,
-- is ended at once and reported (notice "bad-rest": the node counts it as bad input); a key of another
-- type is deleted. Such a rest never parks a slot for good, and never frees a slot that is not resting.
-- One table of functions (one local of the library's: Lua 5.1 allows 200 a chunk and 60 upvalues a function).
rests.PAGE = 256              -- rests woken per call, and listed in the cache, at most

-- The position of a slot identity under the stored rules, or nil (no such member, or above the limit).
function rests.position(id)
        local pos
        if R.members then
                for i, m in ipairs(R.members) do
                        if m == id then pos = i - 1; break end
                end
        else
                pos = int_of(string.match(id, '^#(%d+)$'))
        end
        if pos and pos < R.limit then return pos end
        return nil
end

function rests.bad(id)
        notices[#notices + 1] = { 'bad-rest', type(id) == 'string' and string.sub(id, 1, 64) or '?' }
end

-- pool-local.c:rest_begin() for the slots of lease l, after lease_free() put them back: each one below
-- the limit rests until now + cooldown (back into `busy`, unless a drained member's: it is there already).
function rests.begin(l)
        if not R.cooldown or R.cooldown <= 0 then return end
        local until_ = now + R.cooldown
        local kind = redis.call('TYPE', K.rest)
        kind = type(kind) == 'table' and kind.ok or kind
        if kind ~= 'zset' and kind ~= 'none' then -- a key of another type: garbage, gone
                redis.call('DEL', K.rest)
                rests.bad('?')
        end
        for i = 1, l.k do
                local pos = l.pos[i]
                if pos < R.limit and redis.call('ZADD', K.rest, until_, lease_slot_identity(l, i)) == 1 and
                   not member_drained_at(pos) then
                        redis.call('SETBIT', K.busy, pos, 1)
                        meta_incr('resting_free', 1)
                end
        end
        if until_ > M.rest_max then meta_set('rest_max', until_) end
end

-- pool-local.c:rest_end(): the rest of id is over; its slot is free unless drained (or held: a lease was
-- restored over it, taken: the caller keeps it in `busy`). False: the entry was garbage (no such slot,
-- held, or not in `busy`), dropped without touching a count.
function rests.finish(id, taken)
        redis.call('ZREM', K.rest, id)
        local pos = rests.position(id)
        if not pos or redis.call('GETBIT', K.busy, pos) == 0 then return false end
        if not taken and redis.call('GETBIT', K.occ, pos) == 1 then return false end
        if member_drained_at(pos) then return true end
        if not taken then redis.call('SETBIT', K.busy, pos, 0) end
        meta_set('resting_free', math.max(0, M.resting_free - 1))
        return true
end

-- reclaim.lua: a lease restored over a resting slot takes it (pool-local.c:slot_take()).
function rests.take(id)
        if M.resting_free > 0 or (R.cooldown or 0) > 0 then
                if redis.call('ZSCORE', K.rest, id) then rests.finish(id, true) end
        end
end

-- drain.lua: a resting member drained or undrained stays in `busy`; it moves between the two counts.
-- True when it rests (the caller leaves `busy` alone).
function rests.drain(member, on)
        if (R.cooldown or 0) <= 0 or not redis.call('ZSCORE', K.rest, member) then return false end
        meta_incr('drained_free', on and 1 or -1)
        meta_incr('resting_free', on and -1 or 1)
        return true
end

-- pool-local.c:rests_wake(): every rest that ends at or before t ends; garbage ones (above) too.
function rests.wake(t)
        if (R.cooldown or 0) <= 0 and M.resting_free == 0 then return end
        local ok, due = pcall(redis.call, 'ZRANGEBYSCORE', K.rest, '-inf', t, 'LIMIT', '0', rests.PAGE)
        if not ok then
                redis.call('DEL', K.rest)
                rests.bad('?')
                return
        end
        for _, id in ipairs(due) do
                if not rests.finish(id) then rests.bad(id) end
        end
        local bound = math.max(now + (R.cooldown or 0), M.rest_max)
        for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.rest, '(' .. istr(bound), '+inf', 'LIMIT', '0', rests.PAGE)) do
                rests.finish(id)
                rests.bad(id)
        end
end

-- The first rest's end (next_due()), or nil. Garbage — below zero, or beyond the bound of rests.wake()
-- (1e300 must not reach the cache as an integer) — is due now: the wake ends it.
function rests.next_end()
        if (R.cooldown or 0) <= 0 and M.resting_free == 0 then return nil end
        local ok, first = pcall(redis.call, 'ZRANGE', K.rest, '0', '0', 'WITHSCORES')
        local v = ok and tonumber(first[2])
        if not v then return nil end
        if v < 0 or v > math.max(now + (R.cooldown or 0), M.rest_max) then return now end
        return v
end

-- pool-local.c:rests_enough_at(): when `need` more slots than are free now will have woken (rests of
-- members not drained, among those of mask unless it is nil, in order of their ends); nil if they never will.
function rests.enough_at(need, mask)
        if need <= 0 or need > M.resting_free then return nil end
        local ok, a = pcall(redis.call, 'ZRANGE', K.rest, '0', rests.PAGE - 1, 'WITHSCORES')
        if not ok then return nil end
        local n = 0
        for i = 1, #a, 2 do
                local pos = rests.position(a[i])
                if pos and not member_drained_at(pos) and (not mask or mask[pos]) then
                        n = n + 1
                        if n == need then return tonumber(a[i + 1]) end
                end
        end
        return nil
end

-- tick.lua, relayout(): under the adopted rules every rest follows its identity to its new place; one
-- whose slot is gone, above the limit or held ends; all end when cooldown= is gone. taken: the held
-- positions. `busy` was made anew from occ and the drained members: the resting ones go back into it.
function rests.relayout(taken)
        if (R.cooldown or 0) <= 0 then
                redis.call('DEL', K.rest)
                meta_set('resting_free', 0)
                return
        end
        local ok, a = pcall(redis.call, 'ZRANGE', K.rest, '0', '-1')
        if not ok then
                redis.call('DEL', K.rest)
                rests.bad('?')
                a = {}
        end
        local resting = 0
        for _, id in ipairs(a) do
                local pos = rests.position(id)
                if not pos or taken[pos] then
                        redis.call('ZREM', K.rest, id)
                else
                        if not member_drained_at(pos) then resting = resting + 1 end
                        redis.call('SETBIT', K.busy, pos, 1)
                end
        end
        meta_set('resting_free', resting)
end

-- The cache's rests ([13]: { identity, end, … }, at most rests.PAGE), for every node's Status: a command a
-- reply on a pool with cooldown= only (an empty list on the others).
function rests.list()
        if (R.cooldown or 0) <= 0 then return {} end
        local ok, a = pcall(redis.call, 'ZRANGE', K.rest, '0', rests.PAGE - 1, 'WITHSCORES')
        return ok and a or {}
end

---------------------------------------------------------------------------------------------- selectors (SPEC §3.5)

-- pool-local.c's member walk, for requests that name labels or a member: a request's selector is its
-- canon (selector.c:selector_canon(): its terms sorted, space-separated, then "@MEMBER"), resolved here
-- against the stored rules' members and labels. Its waiters wait in a bucket per (lane, k, canon) (k_ls);
-- while any waits (meta.selective), dispatch walks the heads of every bucket in queue order and hands
-- free members to the first that can use them, as pool-local.c:queue_walk()/member_verdict() do, and
-- takes the same members (the lowest of those it may use). Everything read back from Redis is untrusted:
-- a canon that is not one admits no member (its waiter is never granted and runs out its budget).
local selector_members
do -- (its helpers local to this block: Lua allows the main chunk 200 locals)
        local SELECTOR_CANON_MAX = 8192
        local SELECTOR_CACHE_MAX = 512

        -- The 0-based member indices the selector admits under R ({ [i] = true }, and their count), or nil when the
        -- canon is not one.
        selector_members = function(canon)
                local hit = R.sel and R.sel[canon]
                if hit then return hit.set, hit.n end
                if type(canon) ~= 'string' or #canon > SELECTOR_CANON_MAX then return nil end
                local terms, member = {}, nil
                for tok in string.gmatch(canon, '%S+') do
                        if string.sub(tok, 1, 1) == '@' then
                                if member or not string.match(tok, '^@[%w._%-]+$') then return nil end
                                member = string.sub(tok, 2)
                        else
                                local neg = string.sub(tok, 1, 1) == '!'
                                local name = neg and string.sub(tok, 2) or tok
                                if #name > 64 or not string.match(name, '^[a-z0-9_.%-]+$') then return nil end
                                terms[#terms + 1] = { name, neg }
                        end
                end
                if #terms == 0 and not member then return nil end
                local set, n = {}, 0
                for i, m in ipairs(R.members or {}) do
                        local ok = not member or member == m
                        for _, t in ipairs(terms) do
                                if not ok then break end
                                local carriers = R.labels and R.labels[t[1]]
                                ok = (carriers and carriers[m] or false) ~= t[2]
                        end
                        if ok then
                                set[i - 1] = true
                                n = n + 1
                        end
                end
                if R.sel then
                        if R.n_sel >= SELECTOR_CACHE_MAX then R.sel, R.n_sel = {}, 0 end
                        R.sel[canon], R.n_sel = { set = set, n = n }, R.n_sel + 1
                end
                return set, n
        end
end

-- A bucket of k_ls(lane), "K:CANON": whether the stored rules can never give it K members (a reload took
-- its labels or members away: its waiters are refused, as pool-local.c:local_configure() refuses them).
local function selector_bucket_unsatisfiable(suffix)
        local k, canon = string.match(suffix, '^(%d+):(.*)$')
        if not k then return false end
        local _, n = selector_members(canon)
        return not n or n < tonumber(k)
end

-- The free members now: below the limit (and the member count), neither held nor drained (`busy`). In a
-- pool of anonymous slots (a selector's waiter left from before a reload), the free slots.
local function free_member_set()
        local bits = redis.call('GET', K.busy) or ''
        local n_members = R.members and #R.members or R.limit
        local set, n = {}, 0
        for i = 0, math.min(R.limit, n_members) - 1 do
                local byte = string.byte(bits, math.floor(i / 8) + 1) or 0
                if math.floor(byte / 2 ^ (7 - i % 8)) % 2 == 0 then
                        set[i] = true
                        n = n + 1
                end
        end
        return { set = set, n = n }
end

local heads_insert, head_of, walk_heads, room_for
do -- (its helpers local to this block: Lua allows the main chunk 200 locals)
        -- pool-local.c:member_verdict(): how one request fares with what the queue ahead left in avail. usable: the
        -- members it may take (mask nil: any). A request that cannot be granted sets aside what it could use.
        local function walk_verdict(lane, k, mask, avail)
                local rule = R.lanes[lane]
                k = tonumber(k)
                if not rule or not k or k < 1 then return PASS end -- a record that is not one is never granted
                if rule.max_in_use >= 0 and lane_get(lane).used + k > rule.max_in_use then return PASS end
                local usable, n = {}, 0
                for i in pairs(avail.set) do
                        if not mask or mask[i] then
                                usable[#usable + 1] = i
                                n = n + 1
                        end
                end
                local free = free_slots()
                if n < k or free < k then
                        for _, i in ipairs(usable) do avail.set[i] = nil end
                        avail.n = avail.n - n
                        return HOLD
                end
                if free - k < reserved_for_others(lane) then return PASS end
                table.sort(usable)
                return GRANTABLE, { unpack(usable, 1, k) }
        end

        -- The first valid waiter of a bucket (stale wids, whose records are gone, are dropped), or nil.
        local function bucket_head(key)
                while true do
                        local wid = redis.call('ZRANGE', key, '0', '0')[1]
                        if not wid then return nil end
                        local w = waiter_get(wid)
                        if w then return w end
                        redis.call('ZREM', key, wid)
                end
        end

        local function head_before(a, b)
                return a.prio > b.prio or (a.prio == b.prio and a.w.wid < b.w.wid)
        end

        heads_insert = function(heads, h)
                local i = #heads + 1
                while i > 1 and head_before(h, heads[i - 1]) do i = i - 1 end
                table.insert(heads, i, h)
        end

        -- A head entry for bucket key of lane, or nil when the bucket is empty. mask: the selector's members (an
        -- empty set for a canon that is not one); nil for a plain bucket.
        head_of = function(lane, key, canon)
                local w = bucket_head(key)
                if not w then return nil end
                w.sel = canon or '' -- the bucket it is in says what it asks (its record is untrusted)
                local mask = nil
                if canon then mask = selector_members(canon) or {} end
                return { w = w, key = key, canon = canon, mask = mask, prio = R.lanes[lane].priority }
        end

        -- The heads of every bucket with waiters, of the lanes in the stored rules, in queue order (priority from
        -- the rules, as queue_next(); then arrival). O(buckets): once per dispatch or submit, not per grant.
        walk_heads = function()
                local heads = {}
                for _, lane in ipairs(R.lane_names) do
                        if lane_get(lane).waiting > 0 then
                                for _, k in ipairs(redis.call('SMEMBERS', k_lk(lane))) do
                                        local h = head_of(lane, k_bucket(lane, k), nil)
                                        if h then heads_insert(heads, h) else redis.call('SREM', k_lk(lane), k) end
                                end
                                for _, s in ipairs(redis.call('SMEMBERS', k_ls(lane))) do
                                        local h = head_of(lane, k_bucket(lane, s), string.match(s, '^%d+:(.*)$') or '')
                                        if h then heads_insert(heads, h) else redis.call('SREM', k_ls(lane), s) end
                                end
                        end
                end
                return heads
        end

        -- pool-local.c:queue_walk(): the index in heads of the first waiter that can be granted, and the members
        -- it takes; nil when none (avail then holds what the queue leaves a newcomer). A set's part (gated) that
        -- could be granted is not granted here: it sets aside the free members it could use, as one short of them,
        -- and is said ready at t (nil: not said); target: stop at that wid, ready or not (SETS.ready()).
        function SETS.walk(heads, avail, t, target)
                for i, h in ipairs(heads) do
                        if avail.n <= 0 then return nil end
                        local v, take = walk_verdict(h.w.lane, h.w.k, h.mask, avail)
                        if h.w.wid == target then return v == GRANTABLE and i or nil, take end
                        if v == GRANTABLE then
                                if not h.w.gated then return i, take end
                                if t then SETS.mark_ready(h.w, t) end
                                for m in pairs(avail.set) do
                                        if not h.mask or h.mask[m] then
                                                avail.set[m] = nil
                                                avail.n = avail.n - 1
                                        end
                                end
                        end
                end
                return nil
        end

        -- Whether a health request (a waiter, or submit's { sel = SELECTOR }) admits the member at place pos: its
        -- selector's mask, as pool-local.c's health_fits() ANDs it (a canon that is not one admits none).
        function HEALTH.admits(w, pos)
                if (w.sel or '') == '' then return true end
                local mask = selector_members(w.sel)
                return mask ~= nil and mask[pos] == true
        end

        -- submit's room (SPEC §3, §3.5): true and the members to take, or false. Without selectors anywhere, the
        -- (lane, k) rule as before.
        room_for = function(lane, k, canon)
                if canon == '' and M.selective <= 0 then
                        return lane_verdict(lane, k, free_slots()) == GRANTABLE and not queue_next(), nil
                end
                local avail = free_member_set()
                -- No free member: nobody ahead can be granted and neither can it (queue_walk() stops at once).
                if avail.n <= 0 then return false end
                if SETS.walk(walk_heads(), avail) then return false end
                local mask = nil
                if canon ~= '' then mask = selector_members(canon) or {} end
                local v, take = walk_verdict(lane, k, mask, avail)
                return v == GRANTABLE, take
        end
end

-- A try without room that may not wait is busy; "cooldown" when it lacks only slots that rest: the pool clock
-- at which enough of them end (pool-local.c, local_submit(): nobody waits, and the lane's limits allow it with
-- the resting slots counted free), else nil. With a selector, what it may use: the free members it admits.
-- submit's and set's busy refusal (a field of rests', not a local of its own: Lua's 200 locals a chunk).
function rests.busy_at(lane, k, canon)
        local free = free_slots()
        local mask, have = nil, free
        if canon ~= '' then
                mask = selector_members(canon) or {}
                local n = 0
                for i in pairs(free_member_set().set) do if mask[i] then n = n + 1 end end
                have = math.min(free, n)
        end
        return M.waiting == 0 and have < k and lane_verdict(lane, k, free + M.resting_free) == GRANTABLE and
               rests.enough_at(k - have, mask) or nil
end

-- Whether the set's part w could be granted now (as dispatch would, were it not gated), and the members it
-- would take: first among those it must not pass, its room, its lane's limits (set.lua's grant).
function SETS.ready(w)
        if M.recovery_until > 0 and now < M.recovery_until then return false end
        if M.selective <= 0 then
                local wid, v = queue_next()
                return wid == w.wid and v == GRANTABLE, nil
        end
        local avail = free_member_set()
        if avail.n <= 0 then return false end
        local i, take = SETS.walk(walk_heads(), avail, nil, w.wid)
        return i ~= nil, take
end

---------------------------------------------------------------------------------------------- leases

local function lease_get(token)
        local token_s = type(token) == 'number' and istr(token) or token -- (a string: h's field as it is)
        local packed = redis.call('HGET', K.h, token_s)
        if not packed then return nil end
        local ok, a = pcall(cmsgpack.unpack, packed)
        local token_n = tonumber(token_s)
        if not (ok and type(a) == 'table' and token_n and type(a[1]) == 'string' and
                type(a[2]) == 'string' and type(a[4]) == 'number' and type(a[5]) == 'table' and
                type(a[6]) == 'table' and type(a[7]) == 'table') then
                -- Garbage (anyone may write h): dropped and told; HLEN h then differs from meta's count and
                -- the next call makes the pool anew ("Integrity"), the holders reclaiming their leases; its
                -- slots stay taken until then. Here: a lease that is gone.
                redis.call('HDEL', K.h, token_s)
                LIFE.bad('h', token_s)
                return nil
        end
        -- [15]: the record's fingerprint hash, kept so that its end need not hash again (absent in a record
        -- of a brokerd before; untrusted: anything but a 32-bit value is hashed again).
        local fp = type(a[15]) == 'number' and hash_of(a[15]) or nil -- (a string there is garbage)
        return {
                token = token_n, token_s = token_s, node = a[1], rid = a[2], lane = a[3], k = a[4],
                slots = a[5], pos = a[6], members = a[7], at = a[8], wait = a[9], state = a[10], idle = a[11],
                budget = unwire(a[12]), orphan = a[13] == 1, hjob = a[14] == 1 or nil, fp = fp,
        }
end

-- token_s: istr(l.token) when the caller made it already (string.format() is ~200 ns).
local function lease_put(l, token_s)
        redis.call('HSET', K.h, token_s or istr(l.token), cmsgpack.pack({
                l.node, l.rid, l.lane, l.k, l.slots, l.pos, l.members, l.at, l.wait, l.state, l.idle,
                wire(l.budget), l.orphan and 1 or 0, l.hjob and 1 or 0, l.fp,
        }))
end

-- The record a reference in {sb:P}:rid leads to ("w:WID" | "l:TOKEN", filed under node:rid), if it is that
-- request's: anyone may write rid, and a reference made to name another node's (or request's) lease or waiter
-- must not let this one answer, withdraw, orphan or free it. One that does is dropped (its rid field and nr
-- entry, as record_remove() does) and told ("bad-key" "rid"; README, "Integrity"). Returns the reference's
-- kind ("l" | "w" | nil: none, or not a reference) and the record (nil: none, garbage, or another's).
local function ref_follow(node, rid, ref)
        local kind, id = string.match(ref or '', '^([lw]):(.+)$')
        if not kind then return nil, nil end
        local rec
        if kind == 'l' then rec = lease_get(id) else rec = waiter_get(id) end
        if rec and (rec.node ~= node or rec.rid ~= rid) then
                record_remove(node, rid, kind)
                LIFE.bad('rid', node .. ':' .. rid)
                return kind, nil
        end
        return kind, rec
end

-- decision('granted', …) of lease l, made without an options' table: every grant makes one (a grant at
-- once its reply, a waiter's its event and stream entry), and that table and decision()'s fourteen lookups
-- in it were a fiftieth of a pair's instructions (issue 21).
local function lease_decision(l)
        return {
                'granted', l.rid, l.at, l.wait or 0, '', '', l.state or 'none', l.idle or 0, wire(l.budget or INF),
                0, 0, l.token or 0, l.slots or {}, l.members or {},
        }
end

-- pool-local.c:grant(). w: the waiter it was (its state, idle, budget), or nil for a grant at once.
-- places: the members to take (SETS.walk(), HEALTH.fits()), or nil: the lowest free places;
-- quarantined: they are a health lane's quarantined members, out of `busy` and counted in drained_free; the
-- lease is a health job then (its record's [14]: fixed at the grant, as pool-local.c's PoolGrant.health).
-- fp: fnv1a32(rid .. 'l') when the caller has it (a submit's node sends it: ~1.8 µs of Redis's a pair), or nil.
local function grant(node, rid, lane, k, arrival, t, w, places, quarantined, fp)
        local l = {
                node = node, rid = rid, lane = lane, k = k, slots = {}, pos = {}, members = {}, at = t,
                wait = t - arrival, state = w and w.state or 'none', idle = w and w.idle or 0,
                budget = w and w.budget or INF, hjob = quarantined or nil,
        }
        for i = 1, k do
                -- Numbers as strings where it is free: redis.call() formats a number with "%.17g".
                local pos = places and places[i] or redis.call('BITPOS', K.busy, '0')
                assert(pos >= 0 and pos < R.limit, 'no free slot below the limit')
                if quarantined then meta_incr('drained_free', -1) end -- counted out until now
                local pos_s = slot_pos(pos)
                redis.call('SETBIT', K.occ, pos_s, '1')
                redis.call('SETBIT', K.busy, pos_s, '1')
                l.slots[i], l.pos[i] = pos, pos
                if R.members then l.members[i] = R.members[pos + 1] end
        end
        local token
        if M.clock_mode == 'manual' then
                token = M.counter + 1
        else
                token = math.max(M.counter + 1, raw_time)
        end
        meta_set('counter', token)
        l.token = token
        local token_s = istr(token)
        for i = 1, k do redis.call('HSET', K.sid, lease_slot_identity(l, i), token_s) end
        l.fp = fp or fnv1a32(rid .. 'l') -- hashed once: kept in the record for its end (lease_get())
        meta_incr('in_use', k)
        meta_incr('leases', 1)
        lane_incr(lane, 'used', k)
        lease_put(l, token_s)
        if w then
                record_turn_into_lease(node, rid, 'l:' .. token_s, l.fp)
        else
                record_add(node, rid, 'l', 'l:' .. token_s, l.fp)
        end
        -- A fast admission restarts the idle clock; a slow one does not (SPEC §3.1).
        if R.q and t - arrival <= fast_threshold(R.q) then meta_set('last_fast', t) end
        return l
end

-- pool-local.c:local_release(): the slots go back; the drained members' ones stay out of `busy`.
-- The record is untrusted (lease_get() checks its fields' types only): a position goes back only if it is
-- the lease's own, sid naming the token at its identity, the identity being the position's below the limit
-- (a slot laid out above it by an adopted reload keeps its old one). A record naming a place that is not its
-- own (slots or pos written by hand: another lease's) frees nothing: it is dropped as garbage and told
-- ("bad-key" "h"), its slots stay taken, and the next call finds HLEN h below meta's count and makes the pool
-- anew ("Integrity"). False then; true when the lease was freed.
local function lease_free(l)
        local token_s = l.token_s or istr(l.token)
        local k = l.k
        local own = k >= 1 and k % 1 == 0 and #l.pos == k and #l.slots == k
        for i = 1, own and k or 0 do
                local pos = l.pos[i]
                if type(pos) ~= 'number' or pos < 0 or pos % 1 ~= 0 or type(l.slots[i]) ~= 'number' then
                        own = false
                        break
                end
                local id = lease_slot_identity(l, i)
                if (pos < R.limit and id ~= (R.members and R.members[pos + 1] or slot_identity(pos))) or
                   redis.call('HGET', K.sid, id) ~= token_s then -- (the HGET its HDEL below made before)
                        own = false
                        break
                end
        end
        if not own then
                redis.call('HDEL', K.h, token_s)
                LIFE.bad('h', token_s)
                return false
        end
        for i = 1, k do
                local pos = l.pos[i]
                local pos_s = slot_pos(pos)
                redis.call('SETBIT', K.occ, pos_s, '0')
                if member_drained_at(pos) then
                        meta_incr('drained_free', 1)
                else
                        redis.call('SETBIT', K.busy, pos_s, '0')
                end
                redis.call('HDEL', K.sid, lease_slot_identity(l, i))
        end
        rests.begin(l)
        meta_incr('in_use', -l.k)
        meta_incr('leases', -1)
        lane_incr(l.lane, 'used', -l.k)
        redis.call('HDEL', K.h, token_s)
        if l.orphan then
                redis.call('ZREM', K.orph, token_s) -- its record went when it became one
                carry.heads = nil
        else
                record_remove(l.node, l.rid, 'l', l.fp)
        end
        return true
end

-- A lease Redis holds for a node that the node does not list (tick.lua, reconcile()): an older state
-- directory, a lost line of its lease log, a successor that cannot account for its predecessor's lease.
-- Its holder may still run (SPEC §11, "a restart reconciles conservatively"), so it is neither freed nor
-- handed on now: it leaves the node's records (the node's fingerprint no longer counts it) and lapses
-- one node TTL later, when any holder it had has fenced itself. A release by its node still frees it at
-- once.
local function lease_orphan(l)
        record_remove(l.node, l.rid, 'l', l.fp)
        l.orphan = true
        lease_put(l)
        redis.call('ZADD', K.orph, now + R.ttl, istr(l.token))
        carry.heads = nil
end

-- Orphans whose node TTL has run out at t: freed, one step each.
local function orphans_lapse(t)
        while true do
                local due = redis.call('ZRANGEBYSCORE', K.orph, '-inf', t, 'LIMIT', '0', '1')[1]
                if not due then return true end
                if not step() then return false end
                local l = lease_get(due)
                if l then lease_free(l) else redis.call('ZREM', K.orph, due) end
        end
end

---------------------------------------------------------------------------------------------- rules adopted

-- The lane's selector buckets (SPEC §3.5), "K:CANON", k ascending, then by canon: the order in which a drain
-- (drain.lua) and a removed lane's rekey job refuse them, as pool-local.c:bucket_before() has it.
local function selector_buckets_sorted(lane)
        local ss = redis.call('SMEMBERS', k_ls(lane))
        table.sort(ss, function(a, b)
                local ka, kb = tonumber(string.match(a, '^%d+') or '0'), tonumber(string.match(b, '^%d+') or '0')
                return ka < kb or (ka == kb and a < b)
        end)
        return ss
end

local rekey_step
do -- (its helpers local to this block: Lua allows the main chunk 200 locals)
        -- What an adopted rules change leaves to do (tick.lua, agree()), in {sb:P}:rekey: "at" (the adoption's
        -- instant), "drop:L" (a lane removed: its waiters are refused unavailable at "at", as
        -- pool-local.c:local_configure() does) and "move:L" = the new priority (its waiters move from their old
        -- per-priority queue to the new one; queue_next() reads priorities from the rules, so dispatch is right
        -- at once and only positions wait for the move). One step per waiter; the job runs at the start of
        -- instants until done. Returns false when the budget ran out.
        -- The buckets a job walks: a lane's (lane, k) and selector buckets ("drop", "move"), its selector buckets
        -- alone ("sdrop": those the adopted rules can never satisfy are refused, SPEC §3.5), none ("hdrop": its
        -- health waiters alone, HEALTH.drop(); "drop" refuses those too).
        -- A drop's and a move's in drain.lua's order, as pool-local.c:lane_refuse_queued() refuses them: the
        -- (lane, k) buckets by k, then the selector buckets by k and canon (SMEMBERS gives Redis's hash order).
        local function rekey_buckets(kind, lane)
                if kind == 'hdrop' then return {} end
                if kind == 'sdrop' then return redis.call('SMEMBERS', k_ls(lane)) end
                local ks = redis.call('SMEMBERS', k_lk(lane))
                table.sort(ks, function(a, b) return (tonumber(a) or 0) < (tonumber(b) or 0) end)
                for _, s in ipairs(selector_buckets_sorted(lane)) do ks[#ks + 1] = s end
                return ks
        end

        rekey_step = function()
                local job = LIFE.keyed('HGETALL', K.rekey)
                if #job == 0 then return true end
                -- Untrusted (README, "Where this differs from the memo"): an `at` that is not an instant up to now is
                -- now; a move's priority is the rules' (a lane they lack: nothing to move).
                -- What tick.lua's agree() never writes is told ("bad-key") and repaired in the job, so it is told once:
                -- an `at` not an instant up to now (written as now); a field other than at, cur:L:K and KIND:L of a known
                -- kind; a drop of a lane the (adopted) rules have, an hdrop, sdrop or move of one they lack; a move
                -- whose priority is not a number (the rules' is taken all the same). Those fields leave the job.
                local at
                for i = 1, #job, 2 do if job[i] == 'at' then at = int_of(job[i + 1]) end end
                if not at or at < 0 or at > now then
                        LIFE.bad('rekey', 'at')
                        at = now
                        redis.call('HSET', K.rekey, 'at', at)
                end
                for i = #job - 1, 1, -2 do
                        local f, v = job[i], job[i + 1]
                        local kind, lane = string.match(f, '^(%a+):(.+)$')
                        local known = R.lanes[lane or ''] ~= nil
                        local ok = f == 'at' or string.match(f, '^cur:') or
                                   (kind == 'drop' and not known) or
                                   ((kind == 'hdrop' or kind == 'sdrop') and known) or
                                   (kind == 'move' and known and int_of(v) ~= nil)
                        if not ok then
                                LIFE.bad('rekey', f)
                                redis.call('HDEL', K.rekey, f)
                                table.remove(job, i + 1)
                                table.remove(job, i)
                        end
                end
                for i = 1, #job, 2 do
                        local kind, lane = string.match(job[i], '^(%a+):(.+)$')
                        if (kind == 'drop' or kind == 'hdrop') and not HEALTH.drop(lane, at) then return false end
                        if kind then
                                for _, k in ipairs(rekey_buckets(kind, lane)) do
                                        local b = k_bucket(lane, k)
                                        while kind ~= 'sdrop' or selector_bucket_unsatisfiable(k) do
                                                local wids
                                                if kind == 'drop' or kind == 'sdrop' then
                                                        wids = redis.call('ZRANGE', b, '0', '0')
                                                else
                                                        local cur = redis.call('HGET', K.rekey, 'cur:' .. lane .. ':' .. k)
                                                        wids = redis.call('ZRANGEBYLEX', b, cur and ('(' .. cur) or '-', '+', 'LIMIT', '0', '1')
                                                end
                                                local wid = wids[1]
                                                if not wid then break end
                                                if not step() then return false end
                                                local w = waiter_get(wid)
                                                if not w then
                                                        redis.call('ZREM', b, wid) -- a stale wid: its record is gone
                                                elseif kind == 'drop' or kind == 'sdrop' then
                                                        waiter_refuse(w, 'unavailable', '', at)
                                                elseif not (R.lanes[lane] and w.lane == lane and not w.health) then
                                                        redis.call('ZREM', b, wid) -- not this bucket's waiter: a wid out of place
                                                else
                                                        local prio = R.lanes[lane].priority
                                                        redis.call('ZREM', k_queue(w.prio), wid)
                                                        w.prio = prio
                                                        waiter_put(w)
                                                        redis.call('ZADD', k_queue(prio), 0, wid)
                                                        redis.call('ZADD', K.prios, prio, prio)
                                                        redis.call('HSET', K.rekey, 'cur:' .. lane .. ':' .. k, wid)
                                                end
                                        end
                                end
                        end
                end
                redis.call('DEL', K.rekey)
                return true
        end
end

-------------------------------------------------------------------------------------- recovery windows

local recovery_open, recovery_close, recovery_vouch
do -- (its helpers local to this block: Lua allows the main chunk 200 locals)
        -- A recovery window (no grant until it ends) follows anything that may have lost recent grants: a
        -- restart, a failover to a replica that had not received them. Its worst case is one node TTL: by then a
        -- node that held such a grant has reclaimed it or fenced itself. It ends sooner when it knows whom to wait
        -- for: the nodes registered when it opened (K.recovering, meta.recovery_set = 1), each saying, by a tick
        -- with the reclaimed flag, that Redis has every lease it holds again. A node that never says so (dead,
        -- cut off) keeps the window to its full length; one that registers during it with leases still to
        -- reclaim (Redis lost its registration too) joins the wait. A pool Redis made anew knows nobody: the
        -- full length. why: what opened it, for the nodes' journal (README, "Recovery windows").
        -- The set holds RECOVERY_OPEN besides the nodes, a member no SREM of a node removes: a set emptied by its
        -- last node's vouch keeps it, one deleted or evicted meanwhile (anyone may write it) has lost it, and the
        -- window then runs to its full length (recovery_vouch()). A brokerd of the scripts before (no such member)
        -- that SREMs the last node finds the set not empty, and ends nothing either.
        local RECOVERY_OPEN = '#open' -- (never a node id: 32 hex)
        local RECOVERY_MIN = USEC_PER_SEC -- a recovery window that waits for its nodes lasts at least this
        recovery_open = function(until_, nodes, why)
                meta_set('recovery_until', math.max(M.recovery_until, until_))
                meta_set('recovery_from', now)
                meta_set('recovery_why', why)
                redis.call('DEL', K.recovering)
                if #nodes > 0 then redis.call('SADD', K.recovering, RECOVERY_OPEN) end
                for i = 1, #nodes, 1000 do
                        redis.call('SADD', K.recovering, unpack(nodes, i, math.min(i + 999, #nodes)))
                end
                meta_set('recovery_set', #nodes > 0 and 1 or 0)
        end

        recovery_close = function()
                meta_set('recovery_until', 0)
                meta_set('recovery_from', 0)
                meta_set('recovery_set', 0)
                meta_set('recovery_why', nil)
                redis.call('DEL', K.recovering)
        end

        -- A tick's reclaimed flag, inside a window that waits for its nodes: the last node to say so ends it, but
        -- not before RECOVERY_MIN after it opened. The nodes learn of a failover or a restart at about the same
        -- moment (+switch-master, a reconnect); one that Redis does not know (its registration was lost with its
        -- grants) cannot be waited for, and this second is its time to arrive and join the wait.
        -- The last node is gone when RECOVERY_OPEN is all the set holds: a set without it (deleted or evicted while
        -- the window was open, or opened by the scripts before, which knew no such member) cannot tell who is
        -- left, and the window runs to its full length (README, "Recovery windows").
        recovery_vouch = function(reclaimed)
                if not (M.recovery_until > 0 and now < M.recovery_until and M.recovery_set == 1) then return end
                if not reclaimed then
                        redis.call('SADD', K.recovering, NODE)
                        return
                end
                redis.call('SREM', K.recovering, NODE)
                if redis.call('SCARD', K.recovering) == 1 and redis.call('SISMEMBER', K.recovering, RECOVERY_OPEN) == 1 then
                        meta_set('recovery_until', math.min(M.recovery_until, math.max(now, M.recovery_from + RECOVERY_MIN)))
                end
        end
end

---------------------------------------------------------------------------------------------- the instant

local function has_room_for_one() return M.waiting == 0 and free_slots() > 0 end

local update_congestion
do -- (its helpers local to this block: Lua allows the main chunk 200 locals)
        -- pool-local.c:congested_at()
        local function congested_at(t)
                if not R.q or M.drained == 1 then return false end
                return not has_room_for_one() and idle_at(t) > R.q
        end

        update_congestion = function(t)
                local c = congested_at(t) and 1 or 0
                if c == M.congested then return true end
                if not step() then return false end
                meta_set('congested', c)
                events[#events + 1] = { 'congestion', t, idle_at(t), c }
                return true
        end
end

-- pool-local.c:health_dispatch(): the health waiters in arrival order, each granted the quarantined members
-- it can use as they free; one no quarantined member can satisfy any more is refused unavailable
-- ("not-quarantined"; "member-drained" when a drain keeps them out). No grant inside a recovery window (as dispatch()). False: the budget ran out; else
-- true and whether it granted anything (dispatch_settle()).
function HEALTH.dispatch(t)
        if HEALTH.waiting() == 0 or not R.members then return true, false end
        if M.recovery_until > 0 and t < M.recovery_until then return true, false end
        local granted = false
        local avail = HEALTH.avail()
        for _, wid in ipairs(LIFE.keyed('ZRANGE', HEALTH.key(), '0', '-1')) do
                local w = waiter_get(wid)
                if not w or not w.health then
                        -- gone, or an ordinary waiter's wid written there (untrusted): not a health waiter
                        LIFE.keyed('ZREM', HEALTH.key(), wid)
                        LIFE.bad('hq', wid)
                elseif not R.lanes[w.lane] or not (R.lanes[w.lane].health or R.lanes[w.lane].health_also) then
                        -- (a record of no health lane's flagged health by hand, healed into hq: never given a
                        -- quarantined member)
                        if not step() then return false end
                        waiter_refuse(w, 'unavailable', 'not-quarantined', t)
                elseif HEALTH.capacity(w) < w.k then
                        if not step() then return false end
                        waiter_refuse(w, 'unavailable', HEALTH.refusal(w, w.k), t)
                else
                        local fits, usable = HEALTH.fits(w, w.lane, w.k, avail)
                        if fits then
                                if not step() then return false end
                                waiter_unlink(w, true)
                                local l = grant(w.node, w.rid, w.lane, w.k, w.arrival, t, w, usable, true)
                                notify(w.node, lease_decision(l))
                                granted = true
                                local taken = {}
                                for _, pos in ipairs(l.pos) do taken[pos] = true end
                                local left = {}
                                for _, pos in ipairs(avail) do if not taken[pos] then left[#left + 1] = pos end end
                                avail = left
                        else
                                avail = HEALTH.set_aside(w, avail)
                        end
                end
        end
        return true, granted
end

-- What a new health request may take now (pool-local.c:health_avail_for_new()): the free quarantined members,
-- less what the health requests waiting keep.
function HEALTH.for_new()
        local avail = HEALTH.avail()
        for _, wid in ipairs(LIFE.keyed('ZRANGE', HEALTH.key(), '0', '-1')) do
                local hw = waiter_get(wid)
                if hw and hw.health then
                        avail = HEALTH.set_aside(hw, avail)
                else
                        LIFE.keyed('ZREM', HEALTH.key(), wid) -- not a health waiter (untrusted): out, told
                        LIFE.bad('hq', wid)
                end
        end
        return avail
end

-- health = also (pool-local.c, local_submit()): quarantined members first, when enough that the request may
-- use are free now (the health requests waiting keep theirs): true and the places; else false, and it is an
-- ordinary request in every way. A pool that never had a quarantine (meta.life unset) reads nothing.
function HEALTH.first(sel, lane, k)
        if tonumber(M.life) ~= 1 or not R.members then return false end
        local self = { sel = sel }
        if HEALTH.capacity(self) < k then return false end
        return HEALTH.fits(self, lane, k, HEALTH.for_new())
end

-- A reload's rekey job ("drop:L": lane L removed; "hdrop:L": no health lane any more, or the pool of anonymous
-- slots now): L's health waiters refused unavailable at `at`, as pool-local.c:local_configure() does. It reads
-- hq whole a call while it runs (health waiters are few); one step a refusal. False: the budget ran out.
function HEALTH.drop(lane, at)
        if HEALTH.waiting() == 0 then return true end
        for _, wid in ipairs(LIFE.keyed('ZRANGE', HEALTH.key(), '0', '-1')) do
                local w = waiter_get(wid)
                if not w or not w.health then
                        LIFE.keyed('ZREM', HEALTH.key(), wid)
                        LIFE.bad('hq', wid)
                elseif w.lane == lane then
                        if not step() then return false end
                        waiter_refuse(w, 'unavailable', '', at)
                end
        end
        return true
end

-- A pool drain, or the health lanes' waiters refused (drain.lua): unavailable "drained", one step each.
function HEALTH.refuse_all(reason, at)
        for _, wid in ipairs(LIFE.keyed('ZRANGE', HEALTH.key(), '0', '-1')) do
                if not step() then return false end
                local w = waiter_get(wid)
                if w and w.health then
                        waiter_refuse(w, 'unavailable', reason, at)
                else
                        LIFE.bad('hq', wid) -- gone, or not a health waiter (untrusted): out, told
                end
                LIFE.keyed('ZREM', HEALTH.key(), wid)
        end
        return true
end

-- The health waiters' count apart from the queue's (integrity, README "Integrity"): HLEN w = waiting + hwaiting
-- holds the sum, and ZCARD hq = hwaiting the split. A hostile write to hq, or a waiter record whose health flag
-- was flipped (its unlink then takes the other count: waiting and hwaiting one off each, their sum right), is
-- found here, in a pool that ever had a quarantine (meta.life; health waiters need one) or counts any: one ZCARD
-- a call. Healed from the records, the waiters themselves: hq holds exactly the records that say health
-- (others leave it, missing ones join it, in wid order = arrival order), hwaiting is their number, waiting
-- the rest; told ("bad-key"). O(waiters) once (HGETALL w): only after someone wrote into the pool's keys.
function HEALTH.check()
        if tonumber(M.life) ~= 1 and HEALTH.waiting() == 0 then return end
        local ok, n = pcall(redis.call, 'ZCARD', HEALTH.key())
        if ok and n == HEALTH.waiting() and M.waiting >= 0 then return end
        local in_hq = {}
        for _, wid in ipairs(LIFE.keyed('ZRANGE', HEALTH.key(), '0', '-1')) do in_hq[wid] = true end
        local a, health = redis.call('HGETALL', K.w), 0
        for i = 1, #a, 2 do
                local okw, r = pcall(cmsgpack.unpack, a[i + 1])
                if okw and type(r) == 'table' and r[13] == 1 then
                        health = health + 1
                        if in_hq[a[i]] then
                                in_hq[a[i]] = nil
                        else
                                redis.call('ZADD', HEALTH.key(), 0, a[i])
                                LIFE.bad('hq', a[i])
                        end
                end
        end
        for wid in pairs(in_hq) do
                redis.call('ZREM', HEALTH.key(), wid)
                LIFE.bad('hq', wid)
        end
        if health ~= HEALTH.waiting() then LIFE.bad('meta', 'hwaiting') end
        meta_set('hwaiting', health)
        meta_set('waiting', #a / 2 - health)
end

local dispatch_settle
do -- (its helpers local to this block: Lua allows the main chunk 200 locals)
        -- pool-local.c:dispatch() while selectors wait (meta.selective): the walk, its heads read once (only when a
        -- member is free) and the granted one's bucket's next put in its place. One step a grant, as dispatch().
        local function dispatch_walk(t)
                local heads
                while M.waiting > 0 and free_slots() > 0 do
                        local avail = free_member_set()
                        if avail.n <= 0 then return true end -- read no heads for nothing (a full pool's instant)
                        heads = heads or walk_heads()
                        local i, take = SETS.walk(heads, avail, t)
                        if not i then return true end
                        if not step() then return false end
                        local h = table.remove(heads, i)
                        local w = h.w
                        waiter_unlink(w, true)
                        local l = grant(w.node, w.rid, w.lane, w.k, w.arrival, t, w, take)
                        notify(w.node, lease_decision(l))
                        local next = head_of(w.lane, h.key, h.canon)
                        if next then heads_insert(heads, next) end
                end
                return true
        end

        -- pool-local.c:dispatch(): free slots to waiters in queue order until the first that cannot go. No grant
        -- at all inside a recovery window: its end is a due instant, so dispatch resumes exactly then.
        -- The head's record is read whatever its verdict: a stale wid held back (HOLD: its bucket's k above the free
        -- slots) would otherwise hold the queue back for good. A step each grant or wid dropped (not a head that holds).
        local function dispatch(t)
                if M.recovery_until > 0 and t < M.recovery_until then return true end
                if M.selective > 0 then return dispatch_walk(t) end
                while M.waiting > 0 and free_slots() > 0 do
                        local wid, v = queue_next()
                        if not wid then return true end
                        local hold = v ~= GRANTABLE
                        if not hold and not step() then return false end
                        local w = waiter_get(wid)
                        local from = carry.best
                        if not w or w.health or (w.sel or '') ~= '' or w.lane ~= from.lane or w.k ~= from.k then
                                -- Untrusted: a wid whose record is gone, or says it waits elsewhere (a health waiter, a
                                -- selector's bucket, another lane or k: the room was judged for this bucket's k), leaves
                                -- this bucket (by the name lk:L gave it) and its queue; never granted from here.
                                if hold and not step() then return false end
                                redis.call('ZREM', k_bucket(from.lane, from.ks), wid)
                                if w then redis.call('ZREM', k_queue(w.prio), wid) end
                        elseif hold then
                                return true
                        elseif w.gated then
                                -- A set's part first in the queue with room: said ready, granted with the set only
                                -- (set.lua); it holds back those behind it.
                                SETS.mark_ready(w, t)
                                return true
                        else
                                waiter_unlink(w, true)
                                local l = grant(w.node, w.rid, w.lane, w.k, w.arrival, t, w)
                                notify(w.node, lease_decision(l))
                        end
                end
                return true
        end

        -- Step 3 of the instant (SPEC §3.3; pool-local.c:dispatch_settle()): the queue, then the health waiters beside
        -- it, again while a health grant was made. A health lane's grant counts for its lane's reserve= (SPEC §3, lane
        -- limits), so a waiter of the queue that those unused reserved slots passed over may have room after it, at
        -- this instant (its budget may end at it: step 3 comes before 4); and the queue's grants move lanes'
        -- max-in-use, which decides what a health waiter sets aside. Each round but the last grants: it ends. False:
        -- the budget ran out (the phase is run again; every round decides from the keys afresh).
        dispatch_settle = function(t)
                repeat
                        if not dispatch(t) then return false end
                        local ok, granted = HEALTH.dispatch(t)
                        if not ok then return false end
                until not granted
                return true
        end
end

-- Step 4 of the instant: budgets that end at or before t, each refused at its own deadline.
local function expire(t)
        while true do
                local due = redis.call('ZRANGEBYSCORE', K.dl, '-inf', t, 'WITHSCORES', 'LIMIT', '0', '1')
                if #due == 0 then return true end
                if not step() then return false end
                local w = waiter_get(due[1])
                if w then
                        waiter_refuse(w, w.shed and 'shed' or 'timeout', '', tonumber(due[2]))
                else
                        redis.call('ZREM', K.dl, due[1]) -- its record gone (untrusted): no deadline left
                end
        end
end

-- Liveness per node (README, "Liveness per node"): the deadline in pool clock that node n's live key gives
-- its registration here, or nil. It counts only when it was written by the incarnation registered here,
-- names this pool, and the backend clock is the pool's (redis clock mode): `at` is on the backend clock,
-- and a live key's `at` of another clock id, or ahead of the clock, counts as "renewed now" (the safe way:
-- a registration kept, never cut short; the key's own expiry ends it). Everything in it is untrusted.
local function pool_ttl() return R.ttl or 30 * USEC_PER_SEC end
local function live_deadline(n)
        if not bnow then return nil end
        local inc = redis.call('HGET', k_node(n), 'inc')
        if not inc then return nil end
        local ok, v = pcall(redis.call, 'HMGET', LIVE_PREFIX .. n, 'inc', 'at', 'cid', 'pools')
        if not ok or v[1] ~= inc then return nil end
        local at, pools = int_of(v[2]), v[4]
        if not at or type(pools) ~= 'string' or #pools > LIVE_POOLS_MAX or
           not string.find(pools, ',' .. P .. ',', 1, true) then
                return nil
        end
        if v[3] ~= bclock_id or at > bnow then at = bnow end
        return now + (at + pool_ttl() - bnow)
end

-- A registration's deadline (nil: none). A finite score is its own. A score of +inf marks one that a live
-- key covers (the renewal set it: a reader of a version before it never reaps it, so a fleet upgraded node
-- by node stays safe), whose deadline is the later of its score in {sb:P}:lv and its live key's.
local function node_deadline(n)
        local s = redis.call('ZSCORE', K.nodes, n)
        if not s then return nil end
        if s ~= 'inf' then return tonumber(s) end
        local d = tonumber(redis.call('ZSCORE', K.lv, n) or '') or 0
        local l = live_deadline(n)
        if l and l > d then return l end
        return d
end

-- Covered registrations whose lv score falls within half a TTL are re-scored from their live keys, a page
-- a call, all of them at once (not lazily one by one as each lapses): every node's next_wakeup is then at
-- least half a TTL ahead while the pool's nodes renew, rather than every node ticking at each lapse. One
-- whose live key covers it no more keeps its score: it is reaped at it (reap()).
local function registrations_extend()
        if not bnow then return end
        local horizon = now + math.floor(pool_ttl() / 2)
        local due = redis.call('ZRANGEBYSCORE', K.lv, '-inf', horizon, 'WITHSCORES', 'LIMIT', '0', EXTEND_PAGE)
        local reaping = #due > 0 and redis.call('HGET', K.reaping, 'node')
        for i = 1, #due, 2 do
                local l = due[i] ~= reaping and live_deadline(due[i])
                if l and l > tonumber(due[i + 1]) then redis.call('ZADD', K.lv, 'XX', l, due[i]) end
        end
end

-- lv lost (by hand; it is not counted by the integrity checks): a covered registration without its lv score
-- gets one TTL from now (late, the safe way: its live key decides from then on). O(1) unless one is missing.
local function registrations_repair()
        local covered = redis.call('ZCOUNT', K.nodes, '+inf', '+inf')
        if covered == 0 or covered == redis.call('ZCARD', K.lv) then return end
        for _, n in ipairs(redis.call('ZRANGEBYSCORE', K.nodes, '+inf', '+inf')) do
                redis.call('ZADD', K.lv, 'NX', now + pool_ttl(), n)
        end
end

local reap, next_due, settle_until, finish_instant
do -- (its helpers local to this block: Lua allows the main chunk 200 locals)
        local REAP_PAGE = 128 -- a dead node's records reaped a call at most
        -- One page of dead's records; false: the budget is spent or records are left (the next call goes on).
        local function reap_page(dead)
                if reaped_a_page or not step() then return false end
                reaped_a_page = true
                local cursor = redis.call('HMGET', K.reaping, 'node', 'leases', 'waiters')
                local n_leases, n_waiters = 0, 0
                if cursor[1] == dead then
                        -- (the notice's counts only: garbage there, anyone's to write, counts from 0)
                        n_leases, n_waiters = int_of(cursor[2]) or 0, int_of(cursor[3]) or 0
                end
                local rids = redis.call('ZRANGE', k_records(dead), '0', REAP_PAGE - 1)
                for _, rid in ipairs(rids) do
                        -- (a reference to another's record is dropped, not followed: ref_follow())
                        local kind, rec = ref_follow(dead, rid, redis.call('HGET', K.rid, dead .. ':' .. rid))
                        if kind == 'w' then
                                if rec then waiter_unlink(rec) end
                                n_waiters = n_waiters + 1
                        elseif kind == 'l' then
                                if rec then lease_free(rec) end
                                n_leases = n_leases + 1
                        end
                        redis.call('ZREM', k_records(dead), rid)
                        redis.call('HDEL', K.rid, dead .. ':' .. rid)
                end
                if #rids == REAP_PAGE and redis.call('ZCARD', k_records(dead)) > 0 then
                        redis.call('HSET', K.reaping, 'node', dead, 'leases', n_leases, 'waiters', n_waiters)
                        return false
                end
                local name = redis.call('HGET', k_node(dead), 'name') or dead
                redis.call('DEL', k_node(dead), k_records(dead), k_stream(dead), k_outcomes(dead), k_outcome_exp(dead),
                           K.reaping)
                fp_delta[dead] = nil
                meta_incr('nodes', -redis.call('ZREM', K.nodes, dead))
                redis.call('ZREM', K.lv, dead)
                notices[#notices + 1] = { 'node-expired', dead, name, n_leases, n_waiters }
                return true
        end

        -- A dead node's records, one page per call (memo §3.8): its leases end, its waiters go silently (their
        -- clients were that node's). Returns true when no dead node is left at t.
        reap = function(t)
                local looked = 0
                while true do
                        local dead = redis.call('ZRANGEBYSCORE', K.nodes, '-inf', t, 'LIMIT', '0', '1')[1]
                        if not dead then
                                -- A covered registration (score +inf) whose lv score lapsed: re-scored while its live
                                -- key covers it, reaped once not; an lv entry of a registration not covered any more
                                -- (or gone) is dropped (its own score decides).
                                local c = redis.call('ZRANGEBYSCORE', K.lv, '-inf', t, 'LIMIT', '0', '1')[1]
                                if not c then return true end
                                if looked >= EXTEND_PAGE then return false end
                                looked = looked + 1
                                local l = redis.call('HGET', K.reaping, 'node') ~= c and live_deadline(c)
                                if redis.call('ZSCORE', K.nodes, c) ~= 'inf' then
                                        redis.call('ZREM', K.lv, c)
                                elseif l and l > t then
                                        redis.call('ZADD', K.lv, 'XX', l, c)
                                else
                                        dead = c
                                end
                        end
                        if dead and not reap_page(dead) then return false end
                end
        end

        -- The first entries of the keys whose scores make instants due (next_due(), instant()): read once, and
        -- kept (carry.heads) while the operation caches them (carry.heads_on) until something writes one of those
        -- keys (every such write drops them). Key -> ZRANGE … WITHSCORES: ~2 µs of Redis's time each, its
        -- scores printed with "%.17g" (bench-lua-units.py). Without a waiter dl holds no deadline (garbage in it
        -- is dropped by the instant after the next waiter's: expire()), and is not read.
        local function heads()
                local h = carry.heads
                if h and carry.heads_on then return h end
                local no_waiter = M.waiting == 0 and HEALTH.waiting() == 0
                h = {
                        [K.dl] = no_waiter and {} or redis.call('ZRANGE', K.dl, '0', '0', 'WITHSCORES'),
                        [K.nodes] = redis.call('ZRANGE', K.nodes, '0', '1', 'WITHSCORES'),
                        [K.lv] = redis.call('ZRANGE', K.lv, '0', '1', 'WITHSCORES'),
                        [K.orph] = redis.call('ZRANGE', K.orph, '0', '0', 'WITHSCORES'),
                }
                -- The scores as numbers, once (tonumber() of a 16-digit string is a strtod()); first: the earliest
                -- of the four (nil: all empty), what instant_is_idle() asks.
                local first
                for _, a in pairs(h) do
                        a[2], a[4] = tonumber(a[2]), tonumber(a[4])
                        if a[2] and (not first or a[2] < first) then first = a[2] end
                end
                h.first = first
                if carry.heads_on then carry.heads = h end
                return h
        end

        -- Whether key's first score is ≤ t (something of it due), by heads(); true when heads are not cached.
        local function head_due(key, t)
                if not carry.heads_on then return true end
                local v = tonumber(heads()[key][2])
                return v ~= nil and v <= t
        end

        -- Whether instant(t) has nothing to do but the congestion gauge: nobody waits (the queue's and the health
        -- waiters' dispatch grant nothing), heads() say nothing is due at t (reap, orphans, budgets), no rekey job,
        -- recovery window end, rest or drain's until, and no instant is under way (its marks would be set and
        -- cleared: the same meta). A batch's grants and releases with no waiter are that case: the full instant's
        -- two dozen calls were a tenth of a pair's instructions (issue 21).
        local function instant_is_idle(t)
                if not (carry.heads_on and carry.rekey_empty and M.waiting == 0 and M.unsettled_at == nil and
                        M.phase == 0 and M.running ~= 1 and M.resting_free == 0 and (R.cooldown or 0) <= 0 and
                        not (M.recovery_until > 0 and t >= M.recovery_until) and HEALTH.waiting() == 0) then
                        return false
                end
                local first, drain = heads().first, DRAINS.next() -- (head_due() of each of the four keys)
                return not (first and first <= t) and not (drain and drain <= t)
        end

        -- pool-local.c:local_run() at t, after the lease ends of t (dead nodes). meta.phase remembers how far an
        -- instant cut short by the budget got: 0 first dispatch_settle(), 1 expiries, 2 second dispatch_settle() and
        -- the gauge.
        -- Returns false when the budget ran out (the instant stays unsettled).
        local function instant(t)
                if instant_is_idle(t) then return update_congestion(t) end
                if M.unsettled_at ~= t then
                        meta_set('unsettled_at', t)
                        meta_set('phase', 0)
                end
                meta_set('running', 1)
                -- The scans of what is due at t only when heads() says something is (none of them writes otherwise);
                -- each may write the keys heads() reads.
                if head_due(K.nodes, t) or head_due(K.lv, t) then
                        local done = reap(t)
                        carry.heads = nil
                        if not done then return false end
                end
                if head_due(K.orph, t) then
                        local done = orphans_lapse(t)
                        carry.heads = nil
                        if not done then return false end
                end
                if not carry.rekey_empty then
                        if not rekey_step() then return false end
                        carry.rekey_empty = carry.heads_on -- only a tick makes a job (it begins its batch's state afresh)
                end
                if M.recovery_until > 0 and t >= M.recovery_until then recovery_close() end
                rests.wake(t)
                if DRAINS.next() and DRAINS.next() <= t then DRAINS.expire(t) end
                if M.phase == 0 then
                        -- Health waiters too before budgets end (pool-local.c:local_run(); SPEC §3.3 step 3 before 4).
                        if not dispatch_settle(t) then return false end
                        meta_set('phase', 1)
                end
                if M.phase == 1 then
                        if head_due(K.dl, t) then
                                local done = expire(t)
                                carry.heads = nil
                                if not done then return false end
                        end
                        meta_set('phase', 2)
                end
                if not dispatch_settle(t) then return false end
                if not update_congestion(t) then return false end
                meta_set('unsettled_at', nil)
                meta_set('phase', 0)
                meta_set('running', nil)
                return true
        end

        -- pool-local.c:local_next_wakeup(), plus what only a shared pool has: an unsettled instant, dead nodes,
        -- the end of a recovery window. nil: nothing due.
        --
        -- While an instant u is unsettled, operations of u have changed the state after every earlier instant
        -- was settled: nothing they make due can be earlier than u (the gauge, which pool-local.c looks at only
        -- when it runs, flips at u, not at last_fast + Q + 1 in the past).
        --
        -- for_caller: the caller's own liveness deadline is not an instant it has to be woken for (its heartbeats
        -- move it; if they stop, another node's call reaps it). Nor are the covered registrations that the
        -- extension carried beyond its horizon (registrations_extend(): their live keys renew them): a node's
        -- death is found by the renewals (renew.lua, sb:lives), whose claimer ticks its pools; one left within the
        -- horizon (its key renews it no more, or the page ran out) is due at its lv score. Settling counts every
        -- node.
        -- The earlier of t and v (nil: none), v taken no earlier than u (unsettled work comes first). A
        -- function of the block, not a closure made per call: next_due() runs two or three times a call.
        local function earliest(t, u, v)
                if v and u and v < u then v = u end
                if v and (not t or v < t) then return v end
                return t
        end

        next_due = function(for_caller)
                local u = M.unsettled_at
                local t = u
                local h = heads() -- (its scores are numbers already)
                t = earliest(t, u, h[K.dl][2])
                -- Registrations: finite scores in nodes, covered ones (+inf there) by their lv scores.
                local first = h[K.nodes]
                local v = first[2]
                if for_caller and first[1] == NODE then v = first[4] end
                if v ~= INF then t = earliest(t, u, v) end
                first = h[K.lv]
                v = first[2]
                if for_caller and first[1] == NODE then v = first[4] end
                if for_caller and bnow and v and v > now + math.floor(pool_ttl() / 2) then v = nil end
                if v ~= INF then t = earliest(t, u, v) end
                if M.recovery_until > 0 then t = earliest(t, u, M.recovery_until) end
                t = earliest(t, u, DRAINS.next())
                t = earliest(t, u, h[K.orph][2])
                t = earliest(t, u, rests.next_end())
                if M.congested == 0 and R.q and M.drained == 0 and not has_room_for_one() then
                        t = earliest(t, u, M.last_fast + R.q + 1)
                end
                return t
        end

        -- engine.c:engine_advance(): every instant before t, each at its own time, and t itself if it is under
        -- way (an instant cut short by the budget: pool-local would have finished it before anything later at
        -- t; one that operations of t merely marked waits for the tick). False: budget spent.
        settle_until = function(t)
                -- A batch's operation after one that settled this very instant (finish_instant()): nothing is due
                -- before t, nor at t unsettled, until an operation changes the pool again (next_due() would say so,
                -- at the cost of reading every source of an instant: a quarter of a release's time, issue 21).
                if carry.on and carry.settled_at == t then return true end
                -- A reload's job first (a removed lane's refusals, at the adoption's instant): pool-local.c's
                -- configure_commit() refuses them all before any later operation of the instant, an arrival that
                -- would find them waiting ahead of it (SPEC §3.3, §4). SETTLE_MAX at a time: "settling" till done.
                if not carry.rekey_empty then
                        if not rekey_step() then return false end
                        carry.rekey_empty = carry.heads_on
                end
                while true do
                        local due = next_due()
                        if not due or due > t then return true end
                        if due == t and not (M.running == 1 and M.unsettled_at == t) then return true end
                        if not step() then return false end
                        if not instant(due) then return false end
                end
        end

        -- The end of an operation (settle flag): its own instant in the redis clock mode; in the manual one the
        -- instant is completed by the tick that follows (the engine's run()).
        finish_instant = function()
                if SETTLE then
                        if instant(now) then carry.settled_at = now end
                elseif M.unsettled_at ~= now then
                        meta_set('unsettled_at', now)
                        meta_set('phase', 0)
                end
        end
end

---------------------------------------------------------------------------------------------- replies

local reply, early
do -- (its helpers local to this block: Lua allows the main chunk 200 locals)
        -- An empty list of a reply's events or notices, or of its cache's rests, quarantines and drains, goes as
        -- nil (false), as a cache left to the next reply does (README, "Replies"): Redis converts every table of a
        -- reply through a placeholder of its own, about 2,000 instructions an empty one, where a nil costs
        -- nothing (a batched pair's replies held six, issue 21; a cache three more).
        local function listed(t)
                if t[1] == nil then return false end
                return t
        end

        local function cache()
                local nd = next_due(true)
                local c = {
                        M.in_use, M.waiting, M.congested, idle_at(now), M.drained, nd and nd or -1, M.counter,
                        M.epoch or '', M.recovery_until, stream_last, R.limit or 0,
                        M.recovery_until > 0 and M.recovery_why or '', listed(rests.list()), listed(LIFE.list()),
                        listed(DRAINS.list()),
                }
                return c
        end

        -- A batch's operation whose next one carries its state on (and is run: "ok" or "invalid") leaves the cache
        -- to the last reply of that run: brokerd applies replies in order, and only that one's cache counts (README,
        -- "Batches"). Each costs a next_due() and four lists' tables to make and to convert.
        reply = function(status, body)
                -- (both return at once within a batch's carried run: not called then, a pair's hundredth)
                if not carry.on then outcomes_trim() end
                if not carry.defer then flush() end
                local c
                if CACHE_LATER and (status == 'ok' or status == 'invalid') then
                        c, cache_owed = false, true
                else
                        c, cache_owed = cache(), false
                end
                return { status, now, body or {}, listed(events), c, listed(notices) }
        end

        -- A reply before the pool's state was looked at: no events, no cache — but the cache an operation before it
        -- in the batch left to it (a carried state is the pool's as it left it), and the notices of what the call
        -- repaired before it answered (tick's "canon" after prelude_begin()'s audits).
        early = function(status, body)
                flush()
                local c = false
                if cache_owed and carry.on then c, cache_owed = cache(), false end
                return { status, now, body or {}, false, c, listed(notices) }
        end
end

-- What is checked at connect is watched (SPEC §11): keys deleted by hand, evicted (a policy changed at
-- run time), a FLUSHDB between two calls. meta keeps the counts of what must exist; every call compares
-- them with the keys, in O(lanes) commands, before it decides anything. Returns what is missing, or nil.
-- Not covered: the queue's own indexes (a bucket, a priority queue, the deadlines: a waiter is then
-- passed over or never expires, never granted twice), streams and outcome keys; lane counters are compared
-- every 10 s (lanes_audit()).
local function integrity_lost()
        if M.garbage then return 'meta' end -- (first: garbage in `integrity` itself must not pass as an old pool)
        if M.integrity ~= 1 then
                -- A pool made before the counts were kept: taken as they are, once.
                meta_set('leases', redis.call('HLEN', K.h))
                meta_set('nodes', redis.call('ZCARD', K.nodes))
                meta_set('integrity', 1)
                return nil
        end
        if not R.canon then return 'rules' end
        if clock_missing then return 'clock' end
        if redis.call('HLEN', K.h) ~= M.leases then return 'leases' end
        if redis.call('HLEN', K.w) ~= M.waiting + HEALTH.waiting() then return 'waiters' end
        if redis.call('BITCOUNT', K.occ) ~= M.in_use then return 'slots' end
        -- busy is occ, the drained and quarantined members' free places and the resting ones (below the limit):
        -- exactly. Counts that say more free slots than busy has (a number in meta written by hand) sent
        -- grant() past the last free slot, a Lua error on every submit; fewer held slots free for good.
        if redis.call('BITCOUNT', K.busy) ~= M.in_use + M.drained_free + M.resting_free then return 'free slots' end
        if redis.call('HLEN', K.rid) ~= M.leases - redis.call('ZCARD', K.orph) + M.waiting + HEALTH.waiting() then
                return 'records'
        end
        if redis.call('ZCARD', K.nodes) ~= M.nodes then return 'nodes' end
        if M.resting_free > 0 then
                local ok, n = pcall(redis.call, 'ZCARD', K.rest)
                if not ok or n < M.resting_free then return 'rests' end
        end
        if redis.call('ZSCORE', K.nodes, NODE) and
           redis.call('ZCARD', k_records(NODE)) ~= tonumber(redis.call('HGET', k_node(NODE), 'fp_n') or '0') then
                return 'node records'
        end
        return nil
end

-- The pool's state keys, dropped: what a lost pool is. Kept: the clock, the rules, the drained members,
-- the nodes' registrations (their names, rules and incarnations; their records go), the streams and the
-- outcome keys. O(nodes + lanes + priorities), once.
-- rules: the ones whose lanes' keys go too (the stored ones, or the caller's when they are gone).
local function pool_wipe(rules)
        local keys = { K.occ, K.busy, K.sid, K.h, K.w, K.dl, K.rid, K.prios, K.reaping, K.rekey, K.recovering,
                       K.orph, K.rest, HEALTH.key() }
        for _, p in ipairs(redis.call('ZRANGE', K.prios, '0', '-1')) do keys[#keys + 1] = k_queue(p) end
        for _, lane in ipairs(rules.lane_names or {}) do
                keys[#keys + 1] = k_lane(lane)
                keys[#keys + 1] = k_lk(lane)
                keys[#keys + 1] = k_queue(istr(rules.lanes[lane].priority))
                for _, k in ipairs(redis.call('SMEMBERS', k_lk(lane))) do keys[#keys + 1] = k_bucket(lane, k) end
                for _, k in ipairs(redis.call('SMEMBERS', k_ls(lane))) do keys[#keys + 1] = k_bucket(lane, k) end
                keys[#keys + 1] = k_ls(lane)
        end
        for _, n in ipairs(redis.call('ZRANGE', K.nodes, '0', '-1')) do
                keys[#keys + 1] = k_records(n)
                redis.call('HSET', k_node(n), 'fp_n', 0, 'fp_x', 0, 'fp_s', 0)
        end
        keys[#keys + 1] = k_records(NODE)
        redis.call('HSET', k_node(NODE), 'fp_n', 0, 'fp_x', 0, 'fp_s', 0)
        for i = 1, #keys, 1000 do redis.call('DEL', unpack(keys, i, math.min(i + 999, #keys))) end
        lane_cache, fp_delta = {}, {}
        carry.heads, carry.rekey_empty = nil, nil
end

-- Part of the pool's state is gone: it is made anew, as a pool Redis lost (a new epoch, tokens going on
-- from the counter, a recovery window of one node TTL that waits for nobody — the nodes' next ticks cannot
-- yet say whether they reclaimed), and every node reclaims its leases in it (slots and tokens as before).
local function pool_renew(what)
        local rules = R
        if not R.canon then
                -- The lanes' keys are found by the rules the caller wants, when the stored ones are gone.
                local wanted = redis.call('HGET', k_node(NODE), 'rules')
                rules = wanted and wanted ~= '*' and rules_from(canon_parse(wanted)) or {}
        end
        pool_wipe(rules)
        for _, f in ipairs({ 'in_use', 'waiting', 'leases', 'drained_free', 'congested', 'phase', 'running',
                             'selective', 'hwaiting' }) do
                meta_set(f, 0)
        end
        meta_set('unsettled_at', nil)
        meta_set('resting_free', 0)
        meta_set('nodes', redis.call('ZCARD', K.nodes))
        meta_set('integrity', 1)
        meta_set('epoch', (M.epoch or '') .. '+' .. istr(raw_time))
        meta_set('last_fast', now)
        meta_set('lost', what)
        -- Drained members stay out of `busy` (their slots are not free), as tick.lua's relayout() keeps them.
        local drained_free = 0
        for i, m in ipairs(R.members or {}) do
                if member_drained_at(i - 1) then
                        redis.call('SETBIT', K.busy, i - 1, 1)
                        drained_free = drained_free + 1
                end
        end
        meta_set('drained_free', drained_free)
        if M.clock_mode ~= 'manual' then recovery_open(now + (rules.ttl or R.ttl or 30000000), {}, 'lost:' .. what) end
end

-- One node, one identity (SPEC §11): a call whose incarnation is neither the one registered under its
-- node id nor a successor of it (the registered one among the caller's previous incarnations) is refused
-- while that registration is live, before anything of the pool is looked at, reconciled or granted: two
-- live processes under one node id (hosts cloned from one image) never act as one node. A lapsed
-- registration is anyone's: its leases lapse with it (its holders fenced themselves by then).
local IDENTITY_TAKEOVER         -- a lapsed registration of another incarnation: its records go first
-- An operation after the first of a batch (batch.lua): nothing outside the call changed the keys since the
-- first compared them with meta's counts (integrity_lost()), and every reply wrote its counts (flush()).
local BATCH_NEXT
local function identity_refused()
        if not INCARNATION then return false end
        local stored = redis.call('HGET', k_node(NODE), 'inc')
        carry.inc_ok = stored == INCARNATION -- only a tick changes it (batch.lua begins it afresh)
        if not stored or stored == INCARNATION or PREVIOUS[stored] then return false end
        local deadline = node_deadline(NODE)
        if deadline ~= nil and deadline > now then return true end
        IDENTITY_TAKEOVER = deadline ~= nil
        return false
end

-- A call's start: its keys and arguments read, every per-call variable above set anew (a library's
-- locals keep the last call's values otherwise). keep (batch.lua only): the state the batch's operation
-- before left (carry.on: M, R, the lane counters, the unwritten changes, the clock) is this one's.
-- SETS: what a set's call keeps of each pool while it goes to the next (set.lua): every per-call local that
-- call_begin() sets. A set's call begins each pool once, then comes back to it.
function SETS.save()
        return {
                P = P, K = K, NODE = NODE, INCARNATION = INCARNATION, PREVIOUS = PREVIOUS, MANUAL_NOW = MANUAL_NOW,
                RUN_ID = RUN_ID, SETTLE = SETTLE, M = M, R = R, lane_cache = lane_cache, events = events,
                notices = notices, steps = steps, reaped_a_page = reaped_a_page, stream_last = stream_last,
                now = now, raw_time = raw_time, clock_missing = clock_missing, bnow = bnow, bclock_id = bclock_id,
                bskew = bskew, meta_dirty = meta_dirty, fp_delta = fp_delta,
                carry = carry, IDENTITY_TAKEOVER = IDENTITY_TAKEOVER, BATCH_NEXT = BATCH_NEXT,
        }
end

function SETS.load(c)
        P, K, NODE, INCARNATION, PREVIOUS, MANUAL_NOW = c.P, c.K, c.NODE, c.INCARNATION, c.PREVIOUS, c.MANUAL_NOW
        RUN_ID, SETTLE, M, R, lane_cache, events = c.RUN_ID, c.SETTLE, c.M, c.R, c.lane_cache, c.events
        notices, steps, reaped_a_page, stream_last = c.notices, c.steps, c.reaped_a_page, c.stream_last
        now, raw_time, clock_missing, bnow, bclock_id = c.now, c.raw_time, c.clock_missing, c.bnow, c.bclock_id
        bskew, meta_dirty, fp_delta, carry = c.bskew, c.meta_dirty, c.fp_delta, c.carry
        IDENTITY_TAKEOVER, BATCH_NEXT = c.IDENTITY_TAKEOVER, c.BATCH_NEXT
end

local function call_begin(keep)
        events, notices = {}, {}
        steps, reaped_a_page = 0, false
        -- The cache's stream_last says what the call appended to the caller's stream: an operation that left
        -- its cache to the next one's reply leaves it its id too (brokerd counts the pool settled only once it
        -- has read its stream that far: pool_shared_is_settled()).
        if not (keep and cache_owed) then stream_last = '' end
        IDENTITY_TAKEOVER, BATCH_NEXT, CACHE_LATER = false, false, false
        if keep then
                -- KEYS[1] and the head (ARGV[1..5]) are the batch's: P, K, NODE… as the operation before, and
                -- so is its instant (now, raw_time, the backend clock: one clock read a call).
                carry.on, carry.heads_on = true, false
                return
        end
        now, raw_time, clock_missing = 0, 0, false
        bnow, bclock_id, bskew = nil, nil, nil
        P = KEYS[1]
        -- A renewal's key (sb:live:NODE) is no pool's: no key names for it. At 10,000 nodes each renewal's
        -- would be a new entry of KEYS_OF, 19 strings made for nothing, emptying the cache every 1,024
        -- renewals (a renewal of one pool 42–48 us warm with them, 29–35 without; README).
        K = P:sub(1, #LIVE_PREFIX) ~= LIVE_PREFIX and keys_of(P) or nil
        -- ARGV[2] is "NODE/INCARNATION/PREVIOUS,…" from brokerd (README, "One node, one identity"); a bare
        -- node id (tests of the rules alone) carries no incarnation and is never checked.
        NODE, INCARNATION, PREVIOUS = ARGV[2], nil, {}
        local id, inc, prev = string.match(ARGV[2], '^([^/]*)/([^/]*)/(.*)$')
        if id then
                NODE, INCARNATION = id, inc
                for p in string.gmatch(prev, '[^,]+') do PREVIOUS[p] = true end
        end
        MANUAL_NOW, RUN_ID, SETTLE = ARGV[3], ARGV[4], ARGV[5] == '1'
        M, R, lane_cache, meta_dirty, fp_delta = {}, {}, {}, {}, {}
        carry, cache_owed = {}, false
end

-- A key of a pool that holds another type than the scripts make it (a hostile write, another program's key):
-- Redis answers WRONGTYPE to every command on it, which stopped the script, and so every call of the pool,
-- for good. call_guarded() runs an operation (the entry of every function: tools/embed-lua-library.py); on
-- WRONGTYPE it drops the keys of the call's pools (and of their nodes there) that hold another type,
-- then runs the operation once more from its start: the pool is then one whose keys were deleted by hand
-- ("Integrity": made anew, or unregistered, its recovery window saying what was lost); every operation is
-- idempotent by its rid, so what the first run did is found, not done twice. O(the pools' keys) commands,
-- only then; a pcall() a call otherwise.
local call_guarded
do -- (its helpers local to this block: Lua allows the main chunk 200 locals)
        local TYPES = {
                meta = 'hash', clock = 'hash', rules = 'hash', occ = 'string', busy = 'string', sid = 'hash',
                h = 'hash', dm = 'set', w = 'hash', dl = 'zset', rid = 'hash', nodes = 'zset', prios = 'zset',
                reaping = 'hash', recovering = 'set', orph = 'zset', lv = 'zset',
        }
        local NODE_TYPES = { node = 'hash', nr = 'zset', oh = 'hash', ox = 'zset', s = 'stream' }
        local function drop_if_not(key, want)
                local t = redis.call('TYPE', key)
                t = type(t) == 'table' and t.ok or t
                if t == 'none' or t == want then return 0 end
                redis.call('DEL', key)
                return 1
        end
        local function repair(p)
                local k, n = keys_of(p), 0
                for name, want in pairs(TYPES) do n = n + drop_if_not(k[name], want) end
                -- The nodes' keys: the caller's, and every registered node's (a reap reads a dead one's).
                local okn, nodes = pcall(redis.call, 'ZRANGE', k.nodes, '0', '-1')
                nodes = okn and nodes or {}
                nodes[#nodes + 1] = NODE
                for _, node in ipairs(nodes) do
                        for infix, want in pairs(NODE_TYPES) do
                                n = n + drop_if_not(p .. ':' .. infix .. ':' .. node, want)
                        end
                end
                -- The lanes' keys, by the stored rules' lanes, and the queues', by what prios and lk:L list.
                local ok, canon = pcall(redis.call, 'HGET', k.rules, 'canon')
                local seen = {}
                for lane in string.gmatch(ok and type(canon) == 'string' and canon or '', 'lane%.([^.\n]+)%.') do
                        if not seen[lane] then
                                seen[lane] = true
                                n = n + drop_if_not(p .. ':lane:' .. lane, 'hash')
                                for _, index in ipairs({ ':lk:', ':ls:' }) do -- its buckets: by k, by k and selector
                                        n = n + drop_if_not(p .. index .. lane, 'set')
                                        local okk, ks = pcall(redis.call, 'SMEMBERS', p .. index .. lane)
                                        for _, x in ipairs(okk and ks or {}) do
                                                n = n + drop_if_not(p .. ':b:' .. lane .. ':' .. x, 'zset')
                                        end
                                end
                        end
                end
                local okp, prios = pcall(redis.call, 'ZRANGE', k.prios, '0', '-1')
                for _, prio in ipairs(okp and prios or {}) do n = n + drop_if_not(p .. ':q:' .. prio, 'zset') end
                return n
        end
        call_guarded = function(op)
                local keys, argv = KEYS, ARGV -- (batch.lua and set.lua set them per operation and pool)
                local ok, r = pcall(op)
                if ok then return r end
                local why = type(r) == 'table' and r.err or r
                if type(why) ~= 'string' or not string.find(why, 'WRONGTYPE', 1, true) then error(r, 0) end
                -- The pools: the keys {sb:P} (a set's several), or a renewal's (KEYS[1] sb:live:NODE) named after it.
                local dropped = 0
                for _, key in ipairs(keys) do
                        if string.find(key, '^{sb:[^}]*}$') then dropped = dropped + repair(key) end
                end
                if string.find(keys[1] or '', '^sb:live:') then
                        for i = 7, #argv do
                                if string.find(argv[i], '^{sb:[^}]*}$') then dropped = dropped + repair(argv[i]) end
                        end
                end
                if dropped == 0 then error(r, 0) end
                KEYS, ARGV = keys, argv
                call_begin()
                return op()
        end
end

-- The checks every script makes first: data model version, clock mode, the server's run id (a restart:
-- an AOF everysec restart may have lost the last second of grants, so a recovery window starts).
-- create: the tick may make the pool's keys. Returns nil, or a reply to return at once.
local function prelude_begin(create)
        if carry.on then
                -- The batch's operation before made every check below but the identity's with this head, read
                -- the clock (this operation's instant is the same) and left M and R as Redis holds them
                -- (README, "Batches").
                if not carry.inc_ok and identity_refused() then return early('identity') end
                return nil
        end
        if ARGV[1] ~= tostring(VERSION) then return early('version', { VERSION }) end
        meta_load()
        if M.version ~= 0 and M.version ~= VERSION then return early('version', { M.version }) end
        local manual = MANUAL_NOW ~= '-'
        if M.epoch then
                if (M.clock_mode == 'manual') ~= manual then return early('manual-clock', { M.clock_mode }) end
        elseif not create then
                return early('unregistered')
        end
        if not clock(manual) then return early('clock') end
        rules_load()
        if identity_refused() then return early('identity') end
        if M.epoch and M.run_id ~= RUN_ID then
                -- "RUN_ID/MASTER_REPLID" from brokerd (its link reads both); a bare run id (a brokerd from
                -- before) is compared by its run id alone, and never replaces the longer form.
                local plain = not string.find(RUN_ID, '/', 1, true)
                local stored_plain = not M.run_id or not string.find(M.run_id, '/', 1, true)
                local same = M.run_id and (plain or stored_plain) and
                             string.match(RUN_ID, '^[^/]*') == string.match(M.run_id, '^[^/]*')
                if M.clock_mode ~= 'manual' and M.run_id and not same then
                        recovery_open(now + pool_ttl(), redis.call('ZRANGE', K.nodes, '0', '-1'), 'restart')
                end
                if not (same and plain) then meta_set('run_id', RUN_ID) end
        end
        if M.epoch and not BATCH_NEXT then
                local lost = integrity_lost()
                if lost then
                        pool_renew(lost)
                        if not R.canon and not create then return reply('unregistered') end -- a tick stores them
                elseif R.canon then
                        HEALTH.check()
                        lanes_audit()
                end
        end
        if M.epoch and R.canon and bnow then
                registrations_repair()
                registrations_extend()
        end
        return nil
end

-- A node may submit while it heartbeats and wants the stored rules. nil, and the deadline when admitted.
local function node_admitted()
        local deadline = node_deadline(NODE)
        if not deadline or deadline <= now then return 'unregistered' end
        if redis.call('HGET', k_node(NODE), 'rules') ~= R.canon then return 'rules' end
        return nil, deadline
end

-- node_admitted(), once per batch while its deadline is ahead: only a tick changes the node's wanted rules
-- or the stored ones, or lowers its deadline (renewals and reap() raise it or leave it; a reap of the
-- caller's own registration comes at or after that deadline, when this asks again).
local function node_admitted_carried()
        if carry.admitted and carry.admitted > now then return nil end
        local refused, deadline = node_admitted()
        carry.admitted = deadline
        return refused
end
