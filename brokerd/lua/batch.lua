-- batch.lua — several operations of this node on one pool, in order, in one call (issue 21 item 2): what
-- the node's outbox held for the pool when its loop sent. Library only (it calls the other operations'
-- functions, which an EVAL script does not have); the last file tools/embed-lua-library.py takes.
--
-- KEYS  [1] "{sb:POOL}"
-- ARGV  [1..5] the head (README), the same for every operation in the batch
--       [6] n (1 ≤ n ≤ BATCH_OPS_MAX)   then n times: OP ("submit" | "release" | "withdraw" | "tick" |
--       "reclaim"), m, then m arguments: the operation's ARGV[6…] as it takes them alone
-- Decides: each operation exactly as its own call would, one after the other (each its own step budget and
--       reply; the ones after the first skip the integrity check: nothing but the batch ran since the
--       first's; the clock is read once, by the first: one instant a batch), until one answers other than "ok" or "invalid" ("settling",
--       "unregistered", "rules", "identity", …): the ones after it are not run and the node sends them
--       again, as it sends again a call answered so. Submit, release and withdraw carry what they read and
--       wrote of the pool to the next operation instead of it reading it again (call_begin(true): meta, the
--       rules, the lane counters, the instant, the identity and admission checks, the queue's heads), and
--       their writes of meta, lane counters and fingerprints wait for the batch's end
--       (batch_flush(); before a tick or a reclaim, which read them back and begin afresh): README,
--       "Batches".
-- Returns: { reply… } — one reply per operation run, in order (each as its operation's own: README,
--       "Replies"); fewer than n when one stopped the batch (its reply is the last). A malformed batch
--       (brokerd never sends one) is an error reply, before anything is run.
-- Worst case: the sum of its operations' (SETTLE_MAX steps each); brokerd bounds a batch to
--       BATCH_OPS_MAX operations and 32 KiB of arguments (libbroker/engine/pool-shared.c).

local BATCH_OPS_MAX = 16

-- The operations that carry their state to the next (call_begin(true), README "Batches"): they leave M,
-- the rules, the lane counters and the clock as Redis holds them once written, and change nothing that the
-- carried state describes but through it.
local CARRIES = { [op_submit] = true, [op_release] = true, [op_withdraw] = true }

local function batch()
        local ops = { submit = op_submit, release = op_release, withdraw = op_withdraw, tick = op_tick,
                      reclaim = op_reclaim }
        local argv, n = ARGV, tonumber(ARGV[6])
        if not n or n < 1 or n > BATCH_OPS_MAX or n ~= math.floor(n) then
                return redis.error_reply('ERR slotbroker batch: a count of 1..' .. BATCH_OPS_MAX .. ' operations')
        end
        -- Every operation checked before any runs: nothing half done by a malformed batch.
        local list, i = {}, 7
        for j = 1, n do
                local op, m = ops[argv[i] or ''], tonumber(argv[i + 1] or '')
                if not op or not m or m < 0 or m ~= math.floor(m) or i + 1 + m > #argv then
                        return redis.error_reply('ERR slotbroker batch: operation ' .. j .. ' is malformed')
                end
                list[j] = { op, i + 2, m }
                i = i + 2 + m
        end
        if i ~= #argv + 1 then return redis.error_reply('ERR slotbroker batch: arguments after the last operation') end

        local replies, keep = {}, false
        for j = 1, n do
                local op, first, m = list[j][1], list[j][2], list[j][3]
                -- Sized at once for a submit's 14 (the nils): filled from 5, the table grew twice an operation.
                local a = { argv[1], argv[2], argv[3], argv[4], argv[5], nil, nil, nil, nil, nil, nil, nil, nil, nil }
                for x = 0, m - 1 do a[6 + x] = argv[first + x] end
                local carries = CARRIES[op]
                -- An operation that reads what the ones before deferred (tick reads fingerprints and meta
                -- back) gets it written first, and begins afresh.
                keep = keep and carries
                if not keep then batch_flush() end
                ARGV = a
                call_begin(keep)
                carry.defer = carries
                BATCH_NEXT = j > 1
                CACHE_LATER = carries and j < n and CARRIES[list[j + 1][1]]
                local r = op()
                replies[j] = r
                if r[1] ~= 'ok' and r[1] ~= 'invalid' then break end
                keep = carries -- "ok" and "invalid" come after the state was read
        end
        batch_flush()
        return replies
end

return batch()
