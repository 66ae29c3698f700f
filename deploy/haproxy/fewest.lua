-- fewest.lua - tells HAProxy which runcell node has the fewest sessions.
--
-- Loaded by the configuration deploy/haproxy/gen writes (lua-load). A task asks every
-- server of the "nodes" backend for GET /healthz every POLL_MS and keeps the "sessions"
-- each one reports. The fetch lua.runcell_fewest names the healthy node (UP in HAProxy's
-- own checks) with the fewest, round robin among equals, and counts a POST it placed
-- there as one more session until the next answer from that node; it is empty while no
-- healthy node has answered, and the backend's leastconn decides. GET /router/nodes (the
-- service lua.runcell_nodes) shows what the router knows, as JSON.
--
-- The routing itself stays HAProxy's (health checks, retries, the session pinning); this
-- only picks among healthy nodes. HAProxy's agent check could report a weight, but a
-- weight is a percentage of at most 256, too coarse to tell 400 sessions from 402.

local BACKEND = "nodes"
local POLL_MS = 500
local TIMEOUT_S = 1

local known = {} -- name -> {sessions = N, at = seconds (core.now) of the answer}
local turn = 0

local function now_s()
    local t = core.now()
    return t.sec + t.usec / 1e6
end

-- "sessions" from one node's /healthz, or nil and why.
local function poll(addr)
    local host, port = addr:match("^%[?([^%]]+)%]?:(%d+)$")
    if not host then
        return nil, "no address"
    end
    local s = core.tcp()
    s:settimeout(TIMEOUT_S)
    if not s:connect(host, tonumber(port)) then
        s:close()
        return nil, "connection refused or timed out"
    end
    s:send("GET /healthz HTTP/1.0\r\nHost: runcell\r\n\r\n")
    local reply = s:receive("*a")
    s:close()
    if not reply then
        return nil, "no answer"
    end
    local status = reply:match("^HTTP/1%.%d (%d+)")
    local n = reply:match('"sessions"%s*:%s*(%d+)')
    if status ~= "200" or not n then
        return nil, "answered " .. (status or "no HTTP")
    end
    return tonumber(n)
end

core.register_task(function()
    while true do
        local be = core.backends[BACKEND]
        if be then
            for name, srv in pairs(be.servers) do
                local n = poll(srv:get_addr())
                known[name] = n and {sessions = n, at = now_s()} or nil
            end
        end
        core.msleep(POLL_MS)
    end
end)

local function healthy(srv)
    return srv:get_stats().status:sub(1, 2) == "UP"
end

core.register_fetches("runcell_fewest", function(txn)
    local be = core.backends[BACKEND]
    if not be then
        return ""
    end
    local names = {}
    for name in pairs(be.servers) do
        names[#names + 1] = name
    end
    table.sort(names)
    local best, least = {}, nil
    for _, name in ipairs(names) do
        local k = known[name]
        if k and healthy(be.servers[name]) then
            if not least or k.sessions < least then
                best, least = {name}, k.sessions
            elseif k.sessions == least then
                best[#best + 1] = name
            end
        end
    end
    if not least then
        return ""
    end
    turn = turn + 1
    local pick = best[(turn % #best) + 1]
    if txn.f:method() == "POST" then
        known[pick].sessions = known[pick].sessions + 1
    end
    return pick
end)

core.register_service("runcell_nodes", "http", function(applet)
    local be = core.backends[BACKEND]
    local parts, t = {}, now_s()
    for name, srv in pairs(be and be.servers or {}) do
        local k = known[name]
        parts[#parts + 1] = string.format('"%s":{"status":"%s","sessions":%s,"age_ms":%s}', name,
            srv:get_stats().status, k and k.sessions or "null",
            k and string.format("%d", math.floor((t - k.at) * 1000)) or "null")
    end
    table.sort(parts)
    local body = '{"nodes":{' .. table.concat(parts, ",") .. '}}\n'
    applet:set_status(200)
    applet:add_header("Content-Type", "application/json")
    applet:add_header("Content-Length", tostring(#body))
    applet:start_response()
    applet:send(body)
end)
