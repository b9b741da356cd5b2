"""Who may connect (trio edge helpers, little state): the limits on inbound connections in
their handshake, the refusals' log (one line per cause and interval), and the words a
refusal or a failed dial is logged with.

Before a connection has authenticated it costs little and cannot make us hold much: its
decoder takes only handshake frames of handshake size (FrameDecoder.for_handshake), at most
MAX_PENDING_HANDSHAKES are in progress at a time and MAX_PENDING_PER_ADDRESS per source
address (more are closed at once: PendingHandshakes), and each has HANDSHAKE_TIMEOUT to
finish. Refusals are logged one line per cause: the first at once, the rest as a count every
REFUSAL_LOG_INTERVAL (Refusals).
"""

from __future__ import annotations

import logging
import re
import ssl
from typing import Any

import trio

from .wire import RemoteProtocolError

log = logging.getLogger("ualinkd.fabric.link")

# Unauthenticated connections in progress: in all, and from one source address (a local pod
# of up to 250 nodes dials from 127.0.0.1; its handshakes take milliseconds).
MAX_PENDING_HANDSHAKES = 512
MAX_PENDING_PER_ADDRESS = 64
REFUSAL_LOG_INTERVAL = 5.0


def cause(reason: str) -> str:
    """What kind of refusal `reason` is: the reason without its names and numbers. A name
    is quoted as its repr: in single quotes, or in double quotes when it holds a single
    quote (a peer's made-up names are not as many causes)."""
    return re.sub(r"""'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\S*\d\S*""", "_", reason)


def rejected_by_peer(e: BaseException) -> bool:
    """Whether a failed dial met something that answered and failed the handshake (a bad
    proof or frame: RemoteProtocolError, AuthError; a TLS certificate that does not verify),
    rather than a refused, reset or timed-out connection."""
    if isinstance(e, RemoteProtocolError):
        return True
    return isinstance(e.__cause__, ssl.SSLCertVerificationError)


def reason(e: BaseException) -> str:
    """Why `e` ended a connection. trio keeps the error underneath as __cause__: the
    ssl.SSLError of a failed TLS handshake (its BrokenResourceError says nothing), the
    ConnectionRefusedError of a failed dial."""
    text = str(e)
    under = e.__cause__
    if isinstance(under, BaseExceptionGroup):  # open_tcp_stream: one error per address tried
        under = under.exceptions[-1]
    if isinstance(under, OSError):  # ssl.SSLError is one
        detail = str(under) or repr(under)
        return f"{text}: {detail}" if text else detail
    return text or repr(e)


class Refusals:
    """Refused inbound connections, logged one line per cause and interval: the first of a
    cause at once, in full; those that follow within `interval` as one line with their count
    (a flood of a thousand connections is two lines, not a thousand)."""

    def __init__(self, node_name: str, interval: float) -> None:
        self._node = node_name
        self.interval = interval
        # cause -> [window start, count since the first, source hosts, the last reason]
        self._open: dict[str, list[Any]] = {}

    def note(self, who: str, host: str, reason: str, now: float) -> None:
        kind = cause(reason)
        w = self._open.get(kind)
        if w is None:
            log.warning("fabric %s: refused connection from %s: %s", self._node, who, reason)
            self._open[kind] = [now, 0, set(), reason]
        else:
            w[1] += 1
            w[2].add(host)
            w[3] = f"{who}: {reason}"

    def flush(self, now: float, everything: bool = False) -> None:
        for cause, w in list(self._open.items()):
            if not everything and now - w[0] < self.interval:
                continue
            if not w[1]:
                del self._open[cause]
                continue
            log.warning("fabric %s: refused %d more connection%s like that within %.0f s, "
                        "from %d address%s (the last from %s)", self._node, w[1],
                        "s" if w[1] > 1 else "", self.interval, len(w[2]),
                        "es" if len(w[2]) > 1 else "", w[3])
            self._open[cause] = [now, 0, set(), w[3]]

    async def run(self) -> None:
        try:
            while True:
                await trio.sleep(self.interval)
                self.flush(trio.current_time())
        finally:
            self.flush(trio.current_time(), everything=True)


def cert_names(stream: trio.abc.Stream) -> frozenset[str] | None:
    """The names a TLS peer's verified certificate gives (DNS subjectAltNames and common
    names), or None on plain TCP."""
    if not isinstance(stream, trio.SSLStream):
        return None
    cert = stream.getpeercert() or {}
    names = {v for k, v in cert.get("subjectAltName", ()) if k == "DNS"}
    names |= {v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"}
    return frozenset(names)


class PendingHandshakes:
    """The inbound connections in their handshake: at most `total` at a time, and
    `per_address` from one source host; past either, a newcomer is refused (closed at
    once, the refusal logged by Refusals)."""

    def __init__(self, total: int = MAX_PENDING_HANDSHAKES,
                 per_address: int = MAX_PENDING_PER_ADDRESS) -> None:
        self.total_max, self.per_address_max = total, per_address
        self.total = 0
        self._by_host: dict[str, int] = {}  # source host -> handshakes in progress

    def refusal(self, host: str) -> str | None:
        """Why a new connection from `host` is refused now, or None (then `start(host)`)."""
        if self.total >= self.total_max:
            return f"{self.total} handshakes in progress (the limit)"
        if self._by_host.get(host, 0) >= self.per_address_max:
            return (f"{self._by_host[host]} handshakes in progress from {host} (the limit "
                    "per address)")
        return None

    def start(self, host: str) -> None:
        self.total += 1
        self._by_host[host] = self._by_host.get(host, 0) + 1

    def end(self, host: str) -> None:
        self.total -= 1
        self._by_host[host] -= 1
        if not self._by_host[host]:
            del self._by_host[host]
