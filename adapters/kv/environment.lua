-- walkit's Lua environment for KV scripts: adapters/kv/lua.py runs it once in each interpreter.
-- Every function a script calls is a Lua builtin or a Python function made a C function
-- (python.as_function), as redis' own are, so a script's frames and its errors' positions are as
-- in Redis (a Lua wrapper called as `return f()` would replace the script's frame). A Python
-- function raises a Lua error by raising ScriptError; Lua sees the exception as a userdata,
-- which pcall, xpcall, coroutine.resume and the error handler turn back into the error value
-- (`unwrap`).
local call, protected_call, error_reply, status_reply, sha1hex, log, setresp, set_repl, acl_check_cmd,
      random, randomseed, unwrap, version, version_num, hook_every, collect_above = ...
local G = _G
local as_function = python.as_function
local getinfo, sethook = debug.getinfo, debug.sethook
local type, tostring, error, select, next, rawget, rawset = type, tostring, error, select, next, rawget, rawset
local pcall, xpcall, setmetatable, getmetatable, loadstring = pcall, xpcall, setmetatable, getmetatable, loadstring
local byte, sub, gsub, concat = string.byte, string.sub, string.gsub, table.concat
local create, resume, wrap = coroutine.create, coroutine.resume, coroutine.wrap
local collectgarbage = collectgarbage
local INTERNAL, READONLY = '=walkit', 'Attempt to modify a readonly table'

for _, name in next, {'debug', 'dofile', 'getfenv', 'io', 'loadfile', 'module', 'newproxy', 'os', 'package',
                      'print', 'python', 'require', 'setfenv'} do
  rawset(G, name, nil)
end

local redis = {
  call = as_function(call), pcall = as_function(protected_call),
  error_reply = as_function(error_reply), status_reply = as_function(status_reply),
  sha1hex = as_function(sha1hex), log = as_function(log), setresp = as_function(setresp),
  set_repl = as_function(set_repl), acl_check_cmd = as_function(acl_check_cmd),
  replicate_commands = function() return true end,
  breakpoint = function() return false end,
  debug = function() end,
  LOG_DEBUG = 0, LOG_VERBOSE = 1, LOG_NOTICE = 2, LOG_WARNING = 3,
  REPL_NONE = 0, REPL_AOF = 1, REPL_SLAVE = 2, REPL_REPLICA = 2, REPL_ALL = 3,
  REDIS_VERSION = version, REDIS_VERSION_NUM = version_num,
}
rawset(G, 'redis', redis)
math.random, math.randomseed = as_function(random), as_function(randomseed)

local function argtype(n, i, v)
  if i > n then return 'no value' end
  return type(v)
end

-- Errors raised by the bridge come back as values.
local function translate(e)
  if type(e) == 'userdata' then return unwrap(e) end
  return e
end
local function resumed(ok, ...)
  if ok then return true, ... end
  return false, translate((...))
end
-- redis' pcall (luaRedisPcall) gives the message of an error table, not the table.
local function caught(ok, ...)
  if ok then return true, ... end
  local e = translate((...))
  if type(e) == 'table' then
    local message = e.err
    if type(message) == 'string' or type(message) == 'number' then return false, message end
  end
  return false, e
end
G.pcall = function(...)
  if select('#', ...) == 0 then return false, 'attempt to call a boolean value' end    -- redis' pcall() says so
  return caught(pcall(...))
end
G.xpcall = function(...)
  local f, handler = ...
  if select('#', ...) < 2 then error("bad argument #2 to 'xpcall' (value expected)", 2) end
  return xpcall(f, function(e) return handler(translate(e)) end)
end
coroutine.resume = function(...)
  if type((...)) ~= 'thread' then error("bad argument #1 to 'resume' (coroutine expected)", 2) end
  return resumed(resume(...))
end

-- The instruction budget: a count hook on the script's thread and on every coroutine it makes.
-- Once spent, every instruction of the script fails, so no pcall can go on; walkit's own functions
-- are let finish (lupa runs Lua outside any pcall, where an error would abort the process).
local spent, limit, exhausted = 0, 0, false
local budget
budget = function()
  if not exhausted then
    spent = spent + 1
    if spent <= limit then return end
    exhausted = true
  end
  sethook(budget, '', 1)
  local info = getinfo(2, 'S')
  if info and info.source ~= INTERNAL then error('the script ran out of instructions', 0) end
end
local function hooked(name, f)
  if type(f) ~= 'function' or getinfo(f, 'S').what == 'C' then
    error("bad argument #1 to '" .. name .. "' (Lua function expected)", 3)
  end
  return function(...) sethook(budget, '', hook_every) return f(...) end
end
coroutine.create = function(f) return create(hooked('create', f)) end
coroutine.wrap = function(f) return wrap(hooked('wrap', f)) end

-- Redis' Lua does not load precompiled chunks: it parses them as text and fails on the first byte.
local function load_text(text, chunkname)
  if byte(text, 1) == 27 then
    local _, message = loadstring('\1' .. sub(text, 2), chunkname or text)
    return nil, (gsub(message, 'char%(1%)', 'char(27)', 1))
  end
  return loadstring(text, chunkname)
end
G.loadstring = function(...)
  local text, chunkname = ...
  if type(text) ~= 'string' and type(text) ~= 'number' then
    error("bad argument #1 to 'loadstring' (string expected, got " .. argtype(select('#', ...), 1, text) .. ')', 2)
  end
  return load_text(tostring(text), chunkname)
end
G.load = function(...)
  local reader, chunkname = ...
  if type(reader) ~= 'function' then
    error("bad argument #1 to 'load' (function expected, got " .. argtype(select('#', ...), 1, reader) .. ')', 2)
  end
  local parts, n = {}, 0
  while true do
    local piece = reader()
    if piece == nil or piece == '' then break end
    if type(piece) ~= 'string' and type(piece) ~= 'number' then return nil, 'reader function must return a string' end
    n = n + 1
    parts[n] = tostring(piece)
  end
  return load_text(concat(parts), chunkname or '=(load)')
end

-- Read-only tables: no new globals, and no rawset or setmetatable on the shared tables.
local readonly = {}
G.rawset = function(...)
  local t, k = ...
  if type(t) ~= 'table' then
    error("bad argument #1 to 'rawset' (table expected, got " .. argtype(select('#', ...), 1, t) .. ')', 2)
  end
  if readonly[t] then error(READONLY, 0) end
  return rawset(...)
end
G.setmetatable = function(...)
  local t, mt = ...
  if type(t) ~= 'table' then
    error("bad argument #1 to 'setmetatable' (table expected, got " .. argtype(select('#', ...), 1, t) .. ')', 2)
  end
  if mt ~= nil and type(mt) ~= 'table' then error("bad argument #2 to 'setmetatable' (nil or table expected)", 2) end
  if readonly[t] then error(READONLY, 0) end
  return setmetatable(t, mt)
end

-- redis' error handler: the error as a table, with the position of the script's frame.
local function handler(err)
  local level = 2
  local info = getinfo(level, 'Sl')
  while info and (info.what == 'C' or info.source == INTERNAL) do
    level = level + 1
    info = getinfo(level, 'Sl')
  end
  err = translate(err)
  if type(err) ~= 'table' then err = {err = 'ERR ' .. tostring(err)} end
  if info then
    err.source = info.source
    err.line = info.currentline
  end
  return err
end
rawset(G, '__redis__err__handler', handler)
rawset(G, 'KEYS', {})
rawset(G, 'ARGV', {})

setmetatable(G, {
  __index = function(t, name)
    local info = getinfo(2, 'S')
    if info and info.what ~= 'C' then
      error("Script attempted to access nonexistent global variable '" .. tostring(name) .. "'", 2)
    end
  end,
  __newindex = function() error(READONLY, 2) end,
})

-- What a script changed in the shared tables is undone after it (see the module doc).
local pristine = {}
for _, t in next, {G, getmetatable(G), string, table, math, coroutine, redis, getmetatable('')} do
  local copy = {}
  for k, v in next, t do copy[k] = v end
  pristine[t] = copy
  readonly[t] = true
end

-- One run of a script: its KEYS and ARGV, the budget, the script under redis' error handler; then
-- the shared tables as they were, the collector running with Lua's defaults (a script may stop or
-- tune it), and the garbage of a script that used much memory collected (so the next script finds
-- about as much free as on a node that just started). Returns whether the budget ran out, and
-- xpcall's first two results.
local function execute(f, keys, argv, instructions)
  rawset(G, 'KEYS', keys)
  rawset(G, 'ARGV', argv)
  spent, limit, exhausted = 0, instructions, false
  sethook(budget, '', hook_every)
  local ok, value = xpcall(f, handler)
  sethook()
  for t, copy in next, pristine do
    for k in next, t do
      if copy[k] == nil then rawset(t, k, nil) end
    end
    for k, v in next, copy do
      if rawget(t, k) ~= v then rawset(t, k, v) end
    end
  end
  collectgarbage('restart')
  collectgarbage('setpause', 200)
  collectgarbage('setstepmul', 200)
  if collectgarbage('count') > collect_above then collectgarbage('collect') end
  return exhausted, ok, value
end

-- What a value is as a reply, in the order redis looks (luaReplyToRedisReply).
local function shape(v)
  local f = rawget(v, 'err')
  if type(f) == 'string' then return 'err', f end
  f = rawget(v, 'ok')
  if type(f) == 'string' then return 'ok', f end
  f = rawget(v, 'double')
  if type(f) == 'number' then return 'double', f end
  f = rawget(v, 'big_number')
  if type(f) == 'string' then return 'text', f end
  f = rawget(v, 'verbatim_string')
  if type(f) == 'table' and type(rawget(f, 'format')) == 'string' and type(rawget(f, 'string')) == 'string' then
    return 'text', rawget(f, 'string')
  end
  f = rawget(v, 'map')
  if type(f) == 'table' then
    local items, n = {}, 0
    for key, value in next, f do
      items[n + 1], items[n + 2] = key, value
      n = n + 2
    end
    return 'map', items, n
  end
  f = rawget(v, 'set')
  if type(f) == 'table' then
    local items, n = {}, 0
    for key in next, f do
      n = n + 1
      items[n] = key
    end
    return 'set', items, n
  end
  local n = 0
  while rawget(v, n + 1) ~= nil do n = n + 1 end
  return 'array', v, n
end

-- The parts of a raised error table (luaExtractErrorInformation).
local function error_parts(e)
  local function text(v)
    if type(v) == 'string' or type(v) == 'number' then return tostring(v) end
  end
  return text(rawget(e, 'err')), text(rawget(e, 'source')), text(rawget(e, 'line'))
end

return execute, shape, error_parts
