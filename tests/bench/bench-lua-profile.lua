-- SPDX-License-Identifier: MIT
-- bench-lua-profile.lua — where the shared pools' library spends its Lua instructions: the library runs in
-- lua5.1 (Redis's Lua is 5.1 without its debug library, so it cannot be sampled inside Redis), each
-- redis.call() is sent to a real redis-server and its reply converted as Redis converts it, and a count hook
-- samples the running line and the functions on the stack every ~INTERVAL VM instructions (a random gap:
-- a fixed one aliases with the loops). Run by bench-lua-profile.py, which says what the figures miss.
--
-- Usage: lua5.1 bench-lua-profile.lua PORT LIBRARY.lua PAIRS B [INTERVAL]
local socket = require 'socket'
bit = require 'bit'
local MP = require 'MessagePack'
local port, lib_path, pairs_n, B = tonumber(arg[1]), arg[2], tonumber(arg[3]), tonumber(arg[4])
local interval = tonumber(arg[5] or 97)
local conn = assert(socket.connect('127.0.0.1', port))
conn:setoption('tcp-nodelay', true)

local function send(args)
        local parts = { '*' .. #args .. '\r\n' }
        for i, a in ipairs(args) do
                if type(a) == 'number' then a = string.format('%.17g', a) end
                assert(type(a) == 'string', 'argument ' .. i .. ' of ' .. tostring(args[1]) .. ' is ' .. type(a))
                parts[#parts + 1] = '$' .. #a .. '\r\n' .. a .. '\r\n'
        end
        assert(conn:send(table.concat(parts)))
end
local function read()
        local line = assert(conn:receive('*l'))
        local t, rest = line:sub(1, 1), line:sub(2)
        if t == '+' then return { ok = rest } end
        if t == '-' then return { err = rest }, true end
        if t == ':' then return tonumber(rest) end
        if t == '$' then
                local n = tonumber(rest)
                if n < 0 then return false end
                local s = assert(conn:receive(n + 2))
                return s:sub(1, n)
        end
        if t == '*' then
                local n = tonumber(rest)
                if n < 0 then return false end
                local a = {}
                for i = 1, n do a[i] = read() end
                return a
        end
        error('bad reply ' .. line)
end

local ncalls, call_sites = 0, {}
local profiling = false
redis = {}
function redis.call(...)
        local args = { ... }
        if profiling then
                ncalls = ncalls + 1
                local info = debug.getinfo(2, 'l')
                local k = info and info.currentline or -1
                call_sites[k] = (call_sites[k] or 0) + 1
        end
        send(args)
        local r, is_err = read()
        if is_err then error(r, 0) end
        return r
end
function redis.pcall(...)
        local ok, r = pcall(redis.call, ...)
        return r
end
function redis.error_reply(m) return { err = m } end
function redis.status_reply(m) return { ok = m } end
function redis.log() end
redis.LOG_WARNING = 3
cmsgpack = {
        pack = function(...)
                local n, out = select('#', ...), {}
                for i = 1, n do out[i] = MP.pack((select(i, ...))) end
                return table.concat(out)
        end,
        unpack = function(s)
                local vals = {}
                for _, v in MP.unpacker(s) do vals[#vals + 1] = v end
                return unpack(vals)
        end,
}
local funcs = {}
function redis.register_function(name, f) funcs[name:match('_([a-z]+)$')] = f end

local src = assert(io.open(lib_path)):read('*a')
local chunk = assert(loadstring(src, '=lib'))
chunk()

local function sarr(t) local o = {} for i, v in ipairs(t) do o[i] = tostring(v) end return o end
local HEAD = { '1', 'n1', '-', 'run1', '1' }
local CANON = "backend-node-ttl=30000000\nlane.ci.max-in-use=-1\nlane.ci.priority=0\nlane.ci.reserve=0\nlimit=64\n"
local KEY = '{sb:profile}'
local function fcall(op, args)
        local argv = {}
        for _, v in ipairs(HEAD) do argv[#argv + 1] = v end
        for _, v in ipairs(args) do argv[#argv + 1] = type(v) == "number" and string.format("%.17g", v) or tostring(v) end
        return funcs[op]({ KEY }, argv)
end
local function ok_of(r) return r == 'ok' or (type(r) == 'table' and r.ok == 'ok') end
local function register()
        local r = fcall('tick', { 'n1', CANON, 0, 0, 0, '-', 'e1', '1', '', '' })
        assert(ok_of(r[1]), 'tick: ' .. tostring(r[1]) .. ' ' .. tostring(type(r[1]) == 'table' and (r[1].err or r[1].ok)))
end
local function batch(ops)
        local flat = { #ops }
        for _, o in ipairs(ops) do
                flat[#flat + 1] = o[1]
                flat[#flat + 1] = #o[2]
                for _, a in ipairs(o[2]) do flat[#flat + 1] = a end
        end
        return fcall('batch', flat)
end
-- A submit's ARGV[16] as brokerd sends it: FNV-1a 32 of rid then "l" (brokerd/lua/README, "Fingerprint").
local function lease_hash(rid)
        local h = 2166136261
        for _, c in ipairs({ string.byte(rid .. 'l', 1, -1) }) do
                h = bit.bxor(h, c) % 4294967296
                h = (h * 403 + bit.lshift(h, 24)) % 4294967296 -- × 16777619 mod 2^32, exact in doubles
        end
        return string.format('%d', h)
end
local seq = 0
local function run_pairs(n)
        for _ = 1, n / B do
                local rids, ops = {}, {}
                for i = 1, B do
                        seq = seq + 1
                        rids[i] = string.format('%016x', seq)
                        ops[i] = { 'submit', { rids[i], 'ci', 1, 1, 0, -1, -1, '-', '', '1', lease_hash(rids[i]) } }
                end
                local replies = batch(ops)
                local rel = {}
                for i = 1, B do
                        local r = replies[i]
                        if not (ok_of(r[1]) and type(r[3]) == "table" and r[3][1] == "granted") then
                                error("submit " .. rids[i] .. " not granted: " .. tostring(type(r[3]) == "table" and r[3][1] or r[1]))
                        end
                        rel[i] = { 'release', { r[3][12], rids[i] } }
                end
                replies = batch(rel)
                for i = 1, B do assert(ok_of(replies[i][1]), 'release') end
        end
end

send({ 'FLUSHALL' }); read()
register()
send({ 'HSET', KEY .. ':meta', 'recovery_until', '0' }); read()
run_pairs(B * 20) -- warm-up

-- Samples: every `interval` VM instructions, the line (self) and every function on the stack (inclusive).
local self_lines, incl, total, mock = {}, {}, 0, 0
local hook
local function rearm() debug.sethook(hook, '', math.random(1, 2 * interval - 1)) end
hook = function()
        rearm()
        local info = debug.getinfo(2, 'Sl')
        if not info or info.source ~= '=lib' then mock = mock + 1 return end
        total = total + 1
        self_lines[info.currentline] = (self_lines[info.currentline] or 0) + 1
        local seen, level = {}, 2
        while true do
                local f = debug.getinfo(level, 'S')
                if not f then break end
                if f.source == '=lib' and not seen[f.linedefined] then
                        seen[f.linedefined] = true
                        incl[f.linedefined] = (incl[f.linedefined] or 0) + 1
                end
                level = level + 1
        end
end
register()
profiling = true
math.randomseed(1)
rearm()
run_pairs(pairs_n)
debug.sethook()
profiling = false

local lines = {}
for l in (src .. '\n'):gmatch('(.-)\n') do lines[#lines + 1] = l end
local function top(t, n, title)
        local a = {}
        for k, v in pairs(t) do a[#a + 1] = { k, v } end
        table.sort(a, function(x, y) return x[2] > y[2] end)
        print(title)
        for i = 1, math.min(n, #a) do
                local k, v = a[i][1], a[i][2]
                print(string.format('%6.2f%% %6d  %5d  %s', 100 * v / total, v, k, (lines[k] or '?'):gsub('^%s+', ''):sub(1, 110)))
        end
end
print(string.format('%d pairs, batches of %d: %d samples (every ~%d VM instructions of the library), ~%.0f instructions a pair; '
        .. '%d samples outside it (this driver, MessagePack); redis.call() %.1f a pair',
        pairs_n, B, total, interval, total * interval / pairs_n, mock, ncalls / pairs_n))
top(incl, 70, '-- inclusive, by function (line defined)')
top(self_lines, 60, '-- self, by line')
-- (redis.call() counts: the percentage column is of the samples, meaningless here)
top(call_sites, 40, '-- redis.call() by line: calls over the run')
