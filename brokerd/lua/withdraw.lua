-- withdraw.lua — this node forgets a request: its client went away ("cancelled", SPEC §3.3), or the node
-- refused it itself while Redis was unreachable (memo §4.7), or it answered a try the engine cancelled.
--
-- KEYS  [1] "{sb:POOL}"
-- ARGV  [1..5] the head (README)   [6] rid
-- Decides: a waiter under NODE:RID is unlinked, nothing answered (pool-local.c:local_withdraw()); a lease
--       under it (granted while the withdraw was on its way) is released as release.lua does; neither is
--       "gone". Its outcome key is dropped either way, so that nothing answers the rid again. A reference
--       in rid to a record that is not NODE's request RID (written by hand) is dropped, told ("bad-key"
--       "rid"), and nothing of that record changes: "gone".
--       Then the instant (settle flag 1), or the tick does it.
-- Appends: the grants and refusals of the instant, to their owners' streams and outcome keys.
-- Returns: { status, now, { "withdrawn" | "released" | "gone" }, events, cache, notices }; "settling"
--       before anything changed when earlier instants need more than the budget.
-- Worst case: SETTLE_MAX steps + O(log n).

local RID = ARGV[6]

local function withdraw()
        local early_reply = prelude_begin(false)
        if early_reply then return early_reply end
        carry.heads_on = true -- it writes dl, nodes, lv, orph only through functions that drop the heads
        if not settle_until(now) then return reply('settling') end

        local result = 'gone'
        -- (a reference to another's record is dropped there, not followed: ref_follow())
        local kind, rec = ref_follow(NODE, RID, redis.call('HGET', K.rid, NODE .. ':' .. RID))
        if kind == 'w' and rec then
                waiter_unlink(rec)
                result = 'withdrawn'
        elseif kind == 'l' and rec and lease_free(rec) then
                result = 'released'
        end
        outcome_drop(NODE, RID)
        finish_instant()
        return reply('ok', { result })
end

return withdraw()
