"""Dialing a peer (trio): one connection opened, tuned, wrapped in TLS if configured, and
authenticated (auth.py's handshake run on it), at most DIAL_CONCURRENCY at a time
(dialing.py's policy: a 256-node pod's dials must not all be in their handshake at once).
Which peers are dialed, when and how often is the link's (`FabricLink._dial_loop`, its
knock loop, dialing.py); this is the mechanics of one dial and of one handshake.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable

import trio

from ..config import ConfigError, PodConfig
from . import admission, dialing
from .auth import ClientHandshake, ServerHandshake
from .conn import LinkDown, tune
from .wire import Channel, Frame, FrameDecoder, _NeedData, encode_frame

HANDSHAKE_RECEIVE_SIZE = 4096  # handshake frames are at most HANDSHAKE_MAX_FRAME bytes
DIAL_WARN_AFTER = 10.0  # s a peer may stay unreachable before it is worth a WARNING


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"fabric address {address!r} is not host:port")
    return host.strip("[]") or "0.0.0.0", int(port)


class ProofTaken(LinkDown):
    """The peer proved itself and took our proof, then closed without AUTH_OK: what a knock
    gets once heard (dialing.py), unlike a refusal before the handshake (a limit)."""


async def handshake(stream: trio.abc.Stream, hs: ClientHandshake | ServerHandshake,
                    decoder: FrameDecoder, first: list[Frame],
                    before_ok: Callable[[], Awaitable[None]] | None = None) -> None:
    """Run `hs` to its end on `stream`; the server's `before_ok()` runs once the peer
    has proved itself, before it is sent AUTH_OK (a refusal then raises from it)."""
    if first:
        await stream.send_all(b"".join(encode_frame(f) for f in first))
    while not hs.established:
        frame = decoder.next_frame()
        if isinstance(frame, _NeedData):
            data = await stream.receive_some(HANDSHAKE_RECEIVE_SIZE)
            if not data:
                if isinstance(hs, ClientHandshake) and hs.peer_name is not None:
                    raise ProofTaken("connection closed during the handshake (after "
                                     "our proof)")
                raise LinkDown("connection closed during the handshake")
            decoder.receive_data(data)
            continue
        replies = hs.receive_frame(frame, trio.current_time())
        if hs.established and before_ok is not None:
            await before_ok()
        if replies:
            await stream.send_all(b"".join(encode_frame(f) for f in replies))


class Dialer:
    """Node `node_name`'s dials: `dial(peer, host, port)` is an authenticated connection."""

    def __init__(self, config: PodConfig, node_name: str, keys: dict[str, bytes],
                 handshake_timeout: float, ssl_client: ssl.SSLContext | None) -> None:
        self.config = config
        self.node_name = node_name
        self._keys = keys
        self._handshake_timeout = handshake_timeout
        self._ssl_client = ssl_client
        self._slots = trio.CapacityLimiter(dialing.DIAL_CONCURRENCY)

    async def dial(self, peer: str, host: str, port: int, channel: Channel = Channel.LINK,
                   nonce: bytes | None = None
                   ) -> tuple[trio.abc.Stream, FrameDecoder, bytes]:
        """A connection to `peer` authenticated (with `nonce`: a data channel's bound one):
        its stream, decoder and, for a link, its data channels' key. It waits for one of the
        DIAL_CONCURRENCY slots first: the handshake's time starts then, not while its turn
        waits."""
        async with self._slots:
            return await self._dial(peer, host, port, channel, nonce)

    async def _dial(self, peer: str, host: str, port: int, channel: Channel,
                    nonce: bytes | None) -> tuple[trio.abc.Stream, FrameDecoder, bytes]:
        hs = ClientHandshake(self.config, self.node_name, peer, now=trio.current_time(),
                             key=self._keys[peer], timeout=self._handshake_timeout,
                             channel=channel, nonce=nonce)
        decoder = FrameDecoder.for_handshake()
        stream: trio.abc.Stream | None = None
        try:
            with trio.move_on_at(hs.deadline) as within:
                stream = await trio.open_tcp_stream(host, port)
                tune(stream, self.config.tcp_congestion)
                if self._ssl_client is not None:
                    stream = trio.SSLStream(stream, self._ssl_client, server_hostname=host)
                    await stream.do_handshake()
                    hs.cert_names = admission.cert_names(stream)
                await handshake(stream, hs, decoder, hs.initial_frames())
            if within.cancelled_caught and not hs.established:
                # Timed out (a peer busy or starting, a network that drops): not a failed
                # proof, so it keeps the dial's grace (FabricLink._dial_loop).
                raise LinkDown(f"handshake not finished within {hs.timeout:g} s")
            hs.check_deadline(trio.current_time())
        except BaseException:
            if stream is not None:
                await trio.aclose_forcefully(stream)
            raise
        assert stream is not None
        decoder.open_data_plane()
        return stream, decoder, hs.channel_key()
