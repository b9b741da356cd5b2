"""The TCP fabric between node daemons: the only socket code of ualinkd (DESIGN layer 5).

Sans-IO: `wire` (frame and message codec), `auth` (the HMAC handshake), `session` (an
established link: its events, its requests' waits and timers), `liveness` (heartbeats,
probes, death, time as an input), `parking` (uses waiting for a link that is down),
`dialing` (which pairs link, when, how often). trio: `link.FabricLink` (the facade: one
connection per peer node), `conn` (a connection's byte pump and flow control), `dialer` and
`admission` (connections out and in), `channels` (data channels to the C data plane),
`agent` (the managers' side: rings, timers, sends), `waiting` (a Completion awaited).
"""
