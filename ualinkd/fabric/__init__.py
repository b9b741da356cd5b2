"""The TCP fabric between node daemons: the only socket code of ualinkd (DESIGN layer 5).

`wire` (frame and message codec), `auth` (the HMAC handshake) and `session` (an established
link) are sans-IO; `link.FabricLink` runs them over trio streams, one connection per peer node.
"""
