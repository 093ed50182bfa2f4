-- reclaim.lua — a lease this node held before it (or Redis) restarted: kept, taken back, or lost
-- (memo §3.7, §4.7 RECLAIMING; SPEC §11 "refusals during recovery are fine; over-admission is not").
--
-- KEYS  [1] "{sb:POOL}"
-- ARGV  [1..5] the head (README)   [6] rid   [7] lane   [8] k   [9] token   [10] granted_at (pool µs)
--       [11 … 10+k] slot indices   [11+k … 10+2k] member names (absent in a pool of anonymous slots)
-- Decides: the rid known as this node's lease with that token → "confirmed" (nothing moved: a restart
--       within the TTL). Unknown inside a recovery window (Redis lost it) → every slot must be free by
--       identity (sid) and at its place (the member's index among the members, or the index; below the
--       limit): then exactly those slots are occupied again under the same token, the counter raised to
--       it, "confirmed"; a slot taken → "conflict" (the node revokes the lease). Unknown outside a
--       recovery window → "lost" (it was away longer than the TTL, or reaped). The node must be
--       registered (tick first); rules need not agree (leases granted under agreed rules are kept).
--       A reclaim never queues or dispatches: the window is what keeps others off the slots meanwhile.
-- Appends: nothing.
-- Returns: { status, now, { "confirmed" | "conflict" | "lost" }, events, cache, notices }.
-- Worst case: settling (SETTLE_MAX steps) + O(k).

local RID, LANE, K_SLOTS, TOKEN, GRANTED_AT = ARGV[6], ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9]),
        tonumber(ARGV[10])

local function reclaim()
        local early_reply = prelude_begin(false)
        if early_reply then return early_reply end
        local deadline = node_deadline(NODE)
        if not deadline or deadline <= now then return reply('unregistered') end
        if not K_SLOTS or K_SLOTS < 1 or not TOKEN or #ARGV < 10 + K_SLOTS then return reply('invalid') end
        if not settle_until(now) then return reply('settling') end

        local ref = redis.call('HGET', K.rid, NODE .. ':' .. RID)
        if ref then
                -- (a reference to another's record is dropped, not followed: ref_follow(); "conflict")
                local kind, l = ref_follow(NODE, RID, ref)
                return reply('ok', { (kind == 'l' and l and l.token == TOKEN) and 'confirmed' or 'conflict' })
        end
        if not (M.recovery_until > 0 and now < M.recovery_until) then return reply('ok', { 'lost' }) end

        local l = {
                node = NODE, rid = RID, lane = LANE, k = K_SLOTS, slots = {}, pos = {}, members = {},
                at = GRANTED_AT or now, wait = 0, state = 'none', idle = 0, budget = INF, token = TOKEN,
        }
        for i = 1, K_SLOTS do
                local index = tonumber(ARGV[10 + i])
                local member = ARGV[10 + K_SLOTS + i]
                local pos
                if R.members then
                        for j, m in ipairs(R.members) do if m == member then pos = j - 1; break end end
                else
                        pos = index
                end
                local identity = R.members and member or ('#' .. istr(index or -1))
                if not index or not pos or pos >= R.limit or redis.call('GETBIT', K.occ, pos) == 1 or
                   redis.call('HEXISTS', K.sid, identity) == 1 then
                        return reply('ok', { 'conflict' })
                end
                for j = 1, i - 1 do if l.pos[j] == pos then return reply('ok', { 'conflict' }) end end
                l.slots[i], l.pos[i] = index, pos
                if R.members then l.members[i] = member end
        end
        for i = 1, K_SLOTS do
                rests.take(lease_slot_identity(l, i)) -- a lease restored over a rest ends it
                redis.call('SETBIT', K.occ, l.pos[i], 1)
                if member_drained_at(l.pos[i]) then
                        meta_incr('drained_free', -1) -- only a restored lease takes a drained member
                end
                redis.call('SETBIT', K.busy, l.pos[i], 1)
                redis.call('HSET', K.sid, lease_slot_identity(l, i), TOKEN)
        end
        meta_incr('in_use', K_SLOTS)
        meta_incr('leases', 1)
        lane_incr(LANE, 'used', K_SLOTS)
        if TOKEN > M.counter then meta_set('counter', TOKEN) end
        l.fp = fnv1a32(RID .. 'l')
        lease_put(l)
        record_add(NODE, RID, 'l', 'l:' .. istr(TOKEN), l.fp)
        return reply('ok', { 'confirmed' })
end

return reclaim()
