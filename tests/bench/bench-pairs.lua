-- bench-pairs.lua — the reference of SPEC §12's pairs benchmark: a counting semaphore in one Lua script, as
-- redis-benchmark drives it (EVALSHA SHA 1 KEY acquire LIMIT, EVALSHA SHA 1 KEY release). One call does what
-- one Acquire or one Release of brokerd does, minus everything brokerd does besides counting (FIFO, lanes,
-- leases that die with their connection, persistence): the lightest semaphore there is, so the strictest
-- reference.
local key, op = KEYS[1], ARGV[1]
if op == 'acquire' then
        local n = redis.call('INCR', key)
        if n > tonumber(ARGV[2]) then
                redis.call('DECR', key)
                return 0
        end
        return n
elseif op == 'release' then
        local n = redis.call('DECR', key)
        if n < 0 then
                redis.call('SET', key, 0)
                return 0
        end
        return 1
end
return redis.error_reply('usage: KEY acquire LIMIT | KEY release')
