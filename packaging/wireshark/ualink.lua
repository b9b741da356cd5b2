-- Wireshark / tshark dissector for ualinkd's fabric protocol (version 4, which added the
-- INCARNATION frame of spec §13 N2's restart probe; versions 2 and 3 HELLOs too): the TCP links between node daemons, and their data channels (the handshake only: what
-- follows it is the data plane's own bytes). Layouts: ualinkd/fabric/wire.py (frames) and
-- ualinkd/ualink/protocol.py (the seven UALink messages, spec §5.2-§5.3).
--
--   tshark -X lua_script:$(ualinkd config --wireshark) -r capture.pcap -V
--   wireshark -X lua_script:$(ualinkd config --wireshark) capture.pcap
--   (or copy the file to ~/.local/lib/wireshark/plugins/)
--
-- Links are found by a heuristic on every TCP stream (a well-formed first frame), so no port
-- needs to be configured; "Decode As... UALINK" or the port preference forces it.
--
-- Links of a pod with mutual TLS (tls_ca in the pod config) are opaque: the frames are
-- inside TLS and this dissector sees nothing. Capture a key-authenticated pod to read them.
--
-- Frame: [u32 length][u8 type][payload], little endian, length = bytes after itself.

local p = Proto("ualink", "ualinkd UALink fabric")

local FRAME = {
    [0x01] = "AUTH_HELLO", [0x02] = "AUTH_CHALLENGE", [0x03] = "AUTH_PROOF",
    [0x04] = "AUTH_OK", [0x10] = "MSG", [0x11] = "ACK", [0x12] = "PING", [0x13] = "PONG",
    [0x14] = "INCARNATION", [0x20] = "LOAD", [0x21] = "STORE", [0x22] = "DATA",
}
local MSG = {
    [1] = "HELLO", [2] = "HELLO_ACK", [3] = "NPA_REQ", [4] = "NPA_RSP", [5] = "NPA_FAIL",
    [6] = "NPA_REVOKE", [7] = "NPA_RELEASE",
}
local CHANNEL = { [0] = "link", [1] = "data channel" }
local FAIL = { [1] = "NOSPACE", [2] = "INVALID_HANDLE", [3] = "DUPLICATE", [4] = "ERROR" }
-- Linux errnos the fabric answers with (negative in ACK / DATA status).
local ERRNO = {
    [1] = "EPERM", [2] = "ENOENT", [5] = "EIO", [9] = "EBADF", [11] = "EAGAIN",
    [12] = "ENOMEM", [13] = "EACCES", [14] = "EFAULT", [16] = "EBUSY", [17] = "EEXIST",
    [19] = "ENODEV", [22] = "EINVAL", [28] = "ENOSPC", [62] = "ETIME", [71] = "EPROTO",
    [95] = "EOPNOTSUPP", [103] = "ECONNABORTED", [104] = "ECONNRESET", [110] = "ETIMEDOUT",
    [125] = "ECANCELED",
}
-- Fixed payload+type lengths (the `length` field) of the frames that have one.
local FIXED = {
    [0x03] = 33, [0x04] = 1, [0x10] = 25, [0x11] = 9, [0x12] = 13, [0x13] = 9, [0x14] = 11,
    [0x20] = 25,
}
local MIN = { [0x01] = 52, [0x02] = 66, [0x21] = 21, [0x22] = 9 }
local MAX_FRAME = 1048576 + 64  -- wire.py MAX_FRAME (Lua 5.2: no << operator)

local f = {
    length = ProtoField.uint32("ualink.length", "Length", base.DEC),
    type = ProtoField.uint8("ualink.type", "Frame type", base.HEX, FRAME),
    version = ProtoField.uint16("ualink.version", "Protocol version", base.DEC),
    pod_uuid = ProtoField.guid("ualink.pod_uuid", "Pod UUID"),
    node_name = ProtoField.string("ualink.node_name", "Node name"),
    nonce = ProtoField.bytes("ualink.nonce", "Nonce"),
    channel = ProtoField.uint8("ualink.channel", "Channel", base.DEC, CHANNEL),
    mac = ProtoField.bytes("ualink.mac", "MAC"),
    seq = ProtoField.uint32("ualink.seq", "Sequence", base.DEC),
    src_accel = ProtoField.uint16("ualink.src_accel", "Source accel", base.DEC),
    dst_accel = ProtoField.uint16("ualink.dst_accel", "Destination accel", base.DEC),
    dword = ProtoField.uint32("ualink.dword", "Dword", base.HEX),
    msg_type = ProtoField.uint32("ualink.msg.type", "Message type", base.DEC, MSG, 0x3FF),
    receiver_id = ProtoField.uint32("ualink.msg.receiver_id", "Receiver accel id", base.DEC,
                                    nil, 0xFFC00),
    sender_id = ProtoField.uint32("ualink.msg.sender_id", "Sender accel id", base.DEC, nil,
                                  0x3FF00000),
    handle = ProtoField.string("ualink.msg.handle", "UALink handle"),
    handle_lo = ProtoField.uint64("ualink.msg.handle_lo", "handle_lo as sent (bits 9..0: the type)",
                                  base.HEX),
    handle_hi = ProtoField.uint64("ualink.msg.handle_hi", "handle_hi", base.HEX),
    size_pages = ProtoField.uint32("ualink.msg.size_pages", "Size (pages)", base.DEC),
    npa_offset = ProtoField.uint32("ualink.msg.npa_offset", "NPA offset (pages)", base.HEX),
    reason = ProtoField.uint8("ualink.msg.reason", "Reason", base.DEC, FAIL),
    status = ProtoField.int32("ualink.status", "Status", base.DEC),
    token = ProtoField.uint64("ualink.token", "Token", base.HEX),
    clock = ProtoField.uint32("ualink.clock", "Link clock (ms)", base.DEC),
    npa_byte_addr = ProtoField.uint64("ualink.npa_byte_addr", "NPA byte address", base.HEX),
    data_length = ProtoField.uint32("ualink.data_length", "Length", base.DEC),
    deadline = ProtoField.uint32("ualink.deadline", "Deadline (receiver's link clock, ms)",
                                 base.DEC),
    data = ProtoField.bytes("ualink.data", "Data"),
    accel = ProtoField.uint16("ualink.accel", "Accel", base.DEC),
    incarnation = ProtoField.uint64("ualink.incarnation", "Manager incarnation", base.HEX),
}
p.fields = f

p.prefs.port = Pref.uint("TCP port", 0, "Also decode this TCP port as UALink (0: heuristic only)")

local function status_text(v)
    if v == 0 then return "0" end
    return string.format("%d %s", v, ERRNO[-v] or "")
end

local function accels(tvb, t, o)
    t:add_le(f.seq, tvb(o, 4))
    t:add_le(f.src_accel, tvb(o + 4, 2))
    t:add_le(f.dst_accel, tvb(o + 6, 2))
    return string.format("seq=%u %u->%u", tvb(o, 4):le_uint(), tvb(o + 4, 2):le_uint(),
                         tvb(o + 6, 2):le_uint())
end

local function name_field(tvb, t, o)
    local n = tvb(o, 1):uint()
    t:add(f.node_name, tvb(o + 1, n))
    return o + 1 + n, tvb(o + 1, n):string()
end

-- The four dwords of a UALink message (protocol.py decode_message), sent from accel `src`
-- to accel `dst` (the frame's header, the fabric's stamp).
local function message(tvb, t, o, src, dst)
    local dw0 = tvb(o, 4):le_uint()
    local mt = bit32.band(dw0, 0x3FF)
    local name = MSG[mt] or string.format("unknown type %d", mt)
    local m = t:add(p, tvb(o, 16), "UALink message: " .. name)
    m:add_le(f.msg_type, tvb(o, 4))
    local info = name
    if mt == 1 then
        m:add_le(f.receiver_id, tvb(o, 4))
        m:add_le(f.sender_id, tvb(o, 4))
        info = string.format("%s receiver=%d sender=%d", name, bit32.band(bit32.rshift(dw0, 10), 0x3FF),
                             bit32.band(bit32.rshift(dw0, 20), 0x3FF))
    elseif mt >= 3 and mt <= 7 then
        local lo = tvb(o, 8):le_uint64()
        -- bits 9..0 of handle_lo carry the type on the wire; they are the exporter's accel id,
        -- which the receiver puts back (§5.3): its own for NPA_REQ and NPA_RELEASE (sent to
        -- the exporter), the sender's for the others (sent by it). So the handle shown is the
        -- one UALINK_HANDLE gave.
        local exporter = (mt == 3 or mt == 7) and dst or src
        local bits = lo:band(UInt64.new(0xFFFFFC00, 0xFFFFFFFF)):bor(
            UInt64.new(bit32.band(exporter, 0x3FF), 0))
        m:add_le(f.handle_lo, tvb(o, 8))
        if mt == 3 or mt == 6 or mt == 7 then
            local hi = tvb(o + 8, 8):le_uint64()
            m:add_le(f.handle_hi, tvb(o + 8, 8))
            -- As a 128-bit hex (hi:lo), lo with its bits 9..0 rebuilt as the receiver does.
            local h = "0x" .. hi:tohex() .. bits:tohex()
            m:add(f.handle, tvb(o, 16), h)
            info = string.format("%s handle=%s", name, h)
        elseif mt == 4 then
            m:add_le(f.size_pages, tvb(o + 8, 4))
            m:add_le(f.npa_offset, tvb(o + 12, 4))
            info = string.format("%s handle_lo=0x%s size_pages=%u npa_offset=0x%x", name,
                                 bits:tohex(), tvb(o + 8, 4):le_uint(), tvb(o + 12, 4):le_uint())
        else
            m:add_le(f.reason, tvb(o + 8, 1))
            local r = tvb(o + 8, 1):uint()
            info = string.format("%s handle_lo=0x%s reason=%s", name, bits:tohex(),
                                 FAIL[r] or tostring(r))
        end
    end
    local raw = m:add(p, tvb(o, 16), "Dwords")
    for i = 0, 3 do raw:add_le(f.dword, tvb(o + 4 * i, 4)) end
    return info
end

local function dissect_frame(tvb, pinfo, tree)
    local length = tvb(0, 4):le_uint()
    local ft = tvb(4, 1):uint()
    local name = FRAME[ft] or string.format("type 0x%02x", ft)
    local t = tree:add(p, tvb(0, 4 + length), "UALink fabric frame: " .. name)
    t:add_le(f.length, tvb(0, 4))
    t:add(f.type, tvb(4, 1))
    local o = 5
    local info = name
    if (FIXED[ft] ~= nil and length ~= FIXED[ft]) or (MIN[ft] ~= nil and length < MIN[ft]) then
        -- wire.py refuses it and drops the connection; show it, do not read past it
        t:add_expert_info(PI_MALFORMED, PI_ERROR,
                          string.format("%s frame of length %d: malformed", name, length))
        return name .. " [malformed]"
    end
    if ft == 0x01 then
        t:add_le(f.version, tvb(o, 2))
        t:add(f.pod_uuid, tvb(o + 2, 16))
        local n, node = name_field(tvb, t, o + 18)
        t:add(f.nonce, tvb(n, 32))
        info = string.format("%s v%d node=%s", name, tvb(o, 2):le_uint(), node)
        if tvb(o, 2):le_uint() >= 3 and length >= n + 33 - 4 then  -- wire.CHANNEL_VERSION
            t:add(f.channel, tvb(n + 32, 1))
            info = string.format("%s channel=%s", info,
                                 CHANNEL[tvb(n + 32, 1):uint()] or tvb(n + 32, 1):uint())
        end
    elseif ft == 0x02 then
        local n, node = name_field(tvb, t, o)
        t:add(f.nonce, tvb(n, 32))
        t:add(f.mac, tvb(n + 32, 32))
        info = string.format("%s node=%s", name, node)
    elseif ft == 0x03 then
        t:add(f.mac, tvb(o, 32))
    elseif ft == 0x10 then
        local a = accels(tvb, t, o)
        info = string.format("MSG %s %s", a, message(tvb, t, o + 8, tvb(o + 4, 2):le_uint(),
                                                      tvb(o + 6, 2):le_uint()))
    elseif ft == 0x11 or ft == 0x22 then
        t:add_le(f.seq, tvb(o, 4))
        t:add_le(f.status, tvb(o + 4, 4))
        local st = tvb(o + 4, 4):le_int()
        info = string.format("%s seq=%u status=%s", name, tvb(o, 4):le_uint(), status_text(st))
        if ft == 0x22 then
            local n = length - 9
            if n > 0 then t:add(f.data, tvb(o + 8, n)) end
            info = info .. string.format(" len=%d", n)
        end
    elseif ft == 0x12 then
        t:add_le(f.token, tvb(o, 8))
        t:add_le(f.clock, tvb(o + 8, 4))
        info = string.format("%s token=0x%s clock=%u", name, tvb(o, 8):le_uint64():tohex(),
                             tvb(o + 8, 4):le_uint())
    elseif ft == 0x13 then
        t:add_le(f.token, tvb(o, 8))
        info = string.format("%s token=0x%s", name, tvb(o, 8):le_uint64():tohex())
    elseif ft == 0x14 then
        -- the sender's accel runs this manager incarnation (what a peer's restart probe
        -- compares, spec §13 N2): sent as a link comes up and at each manager start
        t:add_le(f.accel, tvb(o, 2))
        t:add_le(f.incarnation, tvb(o + 2, 8))
        info = string.format("%s accel=%u incarnation=0x%s", name, tvb(o, 2):le_uint(),
                             tvb(o + 2, 8):le_uint64():tohex())
    elseif ft == 0x20 or ft == 0x21 then
        local a = accels(tvb, t, o)
        t:add_le(f.npa_byte_addr, tvb(o + 8, 8))
        local addr = tvb(o + 8, 8):le_uint64():tohex()
        local n
        if ft == 0x20 then
            t:add_le(f.data_length, tvb(o + 16, 4))
            t:add_le(f.deadline, tvb(o + 20, 4))
            n = tvb(o + 16, 4):le_uint()
        else
            t:add_le(f.deadline, tvb(o + 16, 4))
            n = length - 21
            if n > 0 then t:add(f.data, tvb(o + 20, n)) end
        end
        info = string.format("%s %s npa=0x%s len=%d", name, a, addr, n)
    end
    return info
end

local function frame_len(tvb, pinfo, offset)
    return tvb(offset, 4):le_uint() + 4
end

local function dissect_pdu(tvb, pinfo, tree)
    pinfo.cols.protocol = "UALink"
    local info = dissect_frame(tvb, pinfo, tree)
    -- Several frames in one segment: their summaries one after the other.
    local prev = tostring(pinfo.cols.info)
    if pinfo.private.ualink_seen == tostring(pinfo.number) then
        pinfo.cols.info = prev .. " | " .. info
    else
        pinfo.cols.info = info
        pinfo.private.ualink_seen = tostring(pinfo.number)
    end
    return tvb:len()
end

function p.dissector(tvb, pinfo, tree)
    dissect_tcp_pdus(tvb, tree, 5, frame_len, dissect_pdu)
    return tvb:len()
end

-- A TCP stream is a UALink link if it starts with a well-formed frame.
local function looks_like_frame(tvb)
    if tvb:len() < 5 then return false end
    local length, ft = tvb(0, 4):le_uint(), tvb(4, 1):uint()
    if FRAME[ft] == nil or length < 1 or length > MAX_FRAME then return false end
    if FIXED[ft] ~= nil then return length == FIXED[ft] end
    if ft == 0x01 then
        if tvb:len() < 7 then return false end
        local v = tvb(5, 2):le_uint()
        if v < 2 or v > 4 then return false end
        -- version 3 (wire.CHANNEL_VERSION) adds the channel byte after the nonce
        local channel = v >= 3 and 1 or 0
        if tvb:len() >= 24 then return length == 52 + channel + tvb(23, 1):uint() end
    end
    return length >= MIN[ft]
end

local function heuristic(tvb, pinfo, tree)
    if not looks_like_frame(tvb) then return false end
    pinfo.conversation = p
    p.dissector(tvb, pinfo, tree)
    return true
end

p:register_heuristic("tcp", heuristic)
DissectorTable.get("tcp.port"):add_for_decode_as(p)

local registered = 0
function p.prefs_changed()
    local tcp = DissectorTable.get("tcp.port")
    if registered ~= 0 then tcp:remove(registered, p) end
    registered = p.prefs.port
    if registered ~= 0 then tcp:add(registered, p) end
end
