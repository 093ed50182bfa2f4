-- quarantine.lua — a member quarantined or restored by hand (`slotctl quarantine`/`restore`; SPEC §3.6;
-- pool-local.c:local_quarantine()). brokerd checks who may (admin-users=, admin-groups=) before it calls.
--
-- KEYS  [1] "{sb:POOL}"
-- ARGV  [1..5] the head (README)   [6] member   [7] on (1 quarantine, 0 restore)   [8] who ("uid N", ""
--       none)   [9] reason ("" none)
-- Decides: on → the member is quarantined (prelude.lua, LIFE.quarantine(): its record in {sb:P}:qm with
--       now, who, exit status -1, the caller's node name and the reason; its free place out of `busy`),
--       unless it is already (the first quarantine's record stays); off → its record goes and its free
--       place rejoins `busy` unless drained by hand. A member that is not configured: "unknown-member".
--       Then the instant (settle flag 1: a restored member is granted at once), or the tick does it.
-- Appends: the instant's grants and refusals, to their owners' streams and outcome keys.
-- Returns: { status, now, { "quarantined" | "restored" | "unchanged" | "unknown-member" }, events, cache,
--       notices (the change: "quarantined" / "restored", for the caller's journal) }.
-- Worst case: SETTLE_MAX steps + O(1).

local MEMBER, ON, WHO, WHY = ARGV[6], ARGV[7] == '1', ARGV[8] or '', ARGV[9] or ''

local function quarantine()
        local early_reply = prelude_begin(false)
        if early_reply then return early_reply end
        if not settle_until(now) then return reply('settling') end
        if not LIFE.pos(MEMBER) then return reply('ok', { 'unknown-member' }) end
        local changed
        if ON then
                changed = LIFE.quarantine(MEMBER, WHO, -1, WHY)
        else
                changed = LIFE.restore(MEMBER, WHO)
        end
        finish_instant()
        return reply('ok', { changed and (ON and 'quarantined' or 'restored') or 'unchanged' })
end

return quarantine()
