"""The fabric handshake, sans-IO: mutual HMAC-SHA256 challenge–response over the link's key, run
before a link carries anything else. Frames in (`receive_frame(frame, now)`), frames to send out;
time is an input, so the handshake deadline is tested without sleeping.

Identity. Every pair of nodes {a, b} has its own link key,

    K_ab = HMAC-SHA256(pod key, "ualinkd pair" ‖ min(a, b) ‖ max(a, b))   (parts length-prefixed)

or the key that both nodes' config gives it (`link_keys`). A node's own config may carry only
its link keys (`node_config`), not the pod key: holding node c's keys K_ca, K_cb then proves
"c" and nothing else, since K_ab cannot be computed from them. Whoever holds the pod key can
be any node (it is the operator's master key). With mutual TLS the peer's certificate must
name the node it claims to be, too (its DNS subjectAltNames or common name).

    client → AUTH_HELLO {pod uuid, client name, client nonce, channel}
    server → AUTH_CHALLENGE {server name, server nonce, mac("server", ...)}
    client → AUTH_PROOF {mac("client", ...)}
    server → AUTH_OK

Each mac covers the role label, both nonces, the pod uuid, both node names and the channel,
so a proof is bound to one connection, one direction and one use; the server refuses a client
nonce it has seen. The channel (wire.Channel) says what the connection is for: the link, or a
data channel (its second connection, for the data plane alone: FabricLink); a proof made for
one is no proof for the other.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Final

from ..config import ConfigError, PodConfig
from .wire import (
    NONCE_SIZE,
    AuthChallenge,
    AuthHello,
    AuthOk,
    AuthProof,
    Channel,
    Frame,
    LocalProtocolError,
    RemoteProtocolError,
)

# 2: pairwise link keys (auth), the link clock in PING and deadlines in LOAD/STORE (wire).
# 3: the channel byte in AUTH_HELLO, bound into both macs (data channels).
# 4: INCARNATION frames, what the newest kernel's restart probe reads (spec §13 N2).
PROTOCOL_VERSION: Final = 4
HANDSHAKE_TIMEOUT: Final = 5.0
NONCE_CACHE_SIZE: Final = 65536
_SERVER_LABEL: Final = b"ualinkd-fabric-v1 server"
_CLIENT_LABEL: Final = b"ualinkd-fabric-v1 client"
_PAIR_LABEL: Final = b"ualinkd pair"


class AuthError(RemoteProtocolError):
    """The peer failed the handshake (wrong pod, key or name, replay, timeout, bad frame)."""


def pod_key(config: PodConfig) -> bytes:
    """The pod key (a hex string in the config) as bytes."""
    try:
        key = bytes.fromhex(config.key)
    except ValueError:
        raise ConfigError(f"{config.source}: [pod] key must be hexadecimal") from None
    if len(key) < 16:
        raise ConfigError(f"{config.source}: [pod] key must be at least 16 bytes (32 hex digits)")
    return key


def pair_key(pod_key: bytes, a: str, b: str) -> bytes:
    """K_ab, the key of the link between nodes `a` and `b` derived from the pod key."""
    # One-shot (the C fast path): a node of 256 derives 255 of these at its start.
    return hmac.digest(pod_key, b"".join(
        len(part).to_bytes(2, "little") + part
        for part in (_PAIR_LABEL, *(n.encode() for n in sorted((a, b))))), "sha256")


def node_keys(config: PodConfig, name: str) -> dict[str, bytes]:
    """The key of each link of node `name`, by peer: the one a node's `link_keys` gives, else
    derived from the pod key. ConfigError names a link that has neither."""
    given: dict[str, str] = {}
    for n in config.nodes:
        for peer, hexkey in n.link_keys:
            if n.name == name:
                given[peer] = hexkey
            elif peer == name:
                given.setdefault(n.name, hexkey)
    config.node(name)  # a ConfigError if there is no such node
    missing = [n.name for n in config.nodes if n.name != name and n.name not in given]
    master = pod_key(config) if config.key or (missing and not given) else None
    if missing and master is None:
        raise ConfigError(f"{config.source}: no key for the link between {name!r} and "
                          f"{', '.join(map(repr, missing))}: set [pod] key, or link_keys in "
                          f"the [[nodes]] entry of {name!r}")
    keys = {}
    for n in config.nodes:
        if n.name in given:
            keys[n.name] = bytes.fromhex(given[n.name])
        elif n.name != name:
            assert master is not None
            keys[n.name] = pair_key(master, name, n.name)
    return keys


def node_config(config: PodConfig, name: str) -> PodConfig:
    """The pod config for node `name` alone: no pod key, and `name`'s link keys in its own
    [[nodes]] entry (every other entry without keys). Holding it proves `name`, no other node."""
    keys = node_keys(config, name)
    nodes = tuple(replace(n, link_keys=tuple(sorted((p, k.hex()) for p, k in keys.items()))
                          if n.name == name else ()) for n in config.nodes)
    cfg = replace(config, key="", nodes=nodes)
    cfg.validate()
    return cfg


def _mac(key: bytes, label: bytes, client_nonce: bytes, server_nonce: bytes, config: PodConfig,
         client: str, server: str, channel: Channel) -> bytes:
    h = hmac.new(key, digestmod=hashlib.sha256)
    for part in (label, client_nonce, server_nonce, config.uuid.bytes,
                 client.encode(), server.encode(), bytes([channel])):
        h.update(len(part).to_bytes(2, "little") + part)
    return h.digest()


class NonceCache:
    """Client nonces this daemon has seen, the newest `size` of them (a replay guard)."""

    def __init__(self, size: int = NONCE_CACHE_SIZE) -> None:
        self._size = size
        self._seen: OrderedDict[bytes, None] = OrderedDict()

    def add(self, nonce: bytes) -> bool:
        """Record `nonce`; False if it was already there."""
        if nonce in self._seen:
            return False
        self._seen[nonce] = None
        if len(self._seen) > self._size:
            self._seen.popitem(last=False)
        return True


# A data channel is bound to the live link it serves, not only to the link's key (issue 29
# item 6): its client nonce is a random half and a tag of it under the link's channel key,
# which comes from both nonces of that link's handshake — seen only by the link's two ends,
# so a party holding a stolen or superseded link key cannot dial the channel of a link it
# is not an end of (nor park one that takes over the moment the link's own channel breaks).
_CHANNEL_LABEL = b"ualink data channel"
_TAG_SIZE = NONCE_SIZE // 2


def _channel_tag(channel_key: bytes, random: bytes) -> bytes:
    return hmac.new(channel_key, random, hashlib.sha256).digest()[:_TAG_SIZE]


def bound_nonce(channel_key: bytes) -> bytes:
    """The client nonce of a data channel for the link whose channel key is `channel_key`."""
    random = secrets.token_bytes(NONCE_SIZE - _TAG_SIZE)
    return random + _channel_tag(channel_key, random)


def bound_to(nonce: bytes, channel_key: bytes) -> bool:
    """Whether a data channel's client nonce names the link whose key is `channel_key`."""
    random, tag = nonce[:-_TAG_SIZE], nonce[-_TAG_SIZE:]
    return (len(nonce) == NONCE_SIZE and bool(channel_key)
            and hmac.compare_digest(tag, _channel_tag(channel_key, random)))


class _Handshake:
    # (client nonce, server nonce) of an established handshake (`channel_key`)
    link_nonces: tuple[bytes, bytes] = (b"", b"")
    key: bytes

    def channel_key(self) -> bytes:
        """The key the data channels of this (established) link are bound with
        (`bound_nonce`): the link key and both nonces of this handshake."""
        h = hmac.new(self.key, digestmod=hashlib.sha256)
        for part in (_CHANNEL_LABEL, *self.link_nonces):
            h.update(len(part).to_bytes(2, "little") + part)
        return h.digest()

    def __init__(self, config: PodConfig, local_name: str, now: float, timeout: float,
                 cert_names: Collection[str] | None) -> None:
        self.config = config
        self.local_name = local_name
        # TLS: the names in the peer's verified certificate; the peer must be one of them.
        self.cert_names = None if cert_names is None else frozenset(cert_names)
        self.timeout = timeout
        self.deadline = now + timeout
        self.established = False
        self.peer_name: str | None = None

    def check_deadline(self, now: float) -> None:
        """Raise AuthError once the handshake has run out of time."""
        if not self.established and now >= self.deadline:
            raise AuthError(f"handshake not finished within {self.timeout:g} s")

    def _unexpected(self, frame: Frame, wanted: str) -> AuthError:
        return AuthError(f"expected {wanted}, got {frame.frame_type.name}")

    def _check_cert(self, name: str) -> None:
        if self.cert_names is not None and name not in self.cert_names:
            names = ", ".join(sorted(self.cert_names)) or "no name"
            raise AuthError(f"claims to be {name!r} but its TLS certificate is for {names}")


class ClientHandshake(_Handshake):
    """The dialing side: proves itself to node `peer_name` and checks that it is talking to it,
    for `channel` (a wire.Channel; one it does not know is a LocalProtocolError)."""

    def __init__(self, config: PodConfig, local_name: str, peer_name: str, *, now: float,
                 timeout: float = HANDSHAKE_TIMEOUT, key: bytes | None = None,
                 nonce: bytes | None = None, cert_names: Collection[str] | None = None,
                 channel: int = Channel.LINK) -> None:
        super().__init__(config, local_name, now, timeout, cert_names)
        try:
            self.channel = Channel(channel)
        except ValueError:
            raise LocalProtocolError(f"no channel {channel}") from None
        self.key = node_keys(config, local_name)[peer_name] if key is None else key
        self.expected_peer = peer_name
        self.nonce = nonce if nonce is not None else secrets.token_bytes(NONCE_SIZE)
        self._state = "challenge"

    def initial_frames(self) -> list[Frame]:
        return [AuthHello(self.config.uuid, self.local_name, self.nonce, PROTOCOL_VERSION,
                          self.channel)]

    def receive_frame(self, frame: Frame, now: float) -> list[Frame]:
        self.check_deadline(now)
        if self._state == "challenge":
            if not isinstance(frame, AuthChallenge):
                raise self._unexpected(frame, "AUTH_CHALLENGE")
            if frame.node_name != self.expected_peer:
                raise AuthError(f"dialed node {self.expected_peer!r} but "
                                f"{frame.node_name!r} answered")
            self._check_cert(frame.node_name)
            args = (self.nonce, frame.nonce, self.config, self.local_name, frame.node_name,
                    self.channel)
            if not hmac.compare_digest(frame.mac, _mac(self.key, _SERVER_LABEL, *args)):
                raise AuthError(f"{frame.node_name!r} failed to prove the key of our link "
                                "(a different key, or not that node)")
            self.peer_name = frame.node_name
            self.link_nonces = (self.nonce, frame.nonce)
            self._state = "ok"
            return [AuthProof(_mac(self.key, _CLIENT_LABEL, *args))]
        if self._state == "ok":
            if not isinstance(frame, AuthOk):
                raise self._unexpected(frame, "AUTH_OK")
            self._state = "done"
            self.established = True
            return []
        raise AuthError(f"{frame.frame_type.name} after the handshake finished")


class ServerHandshake(_Handshake):
    """The accepting side: admits a node of this pod, other than itself, that knows the key of
    its link with us (`keys`, by peer name; default `node_keys`).

    `accept_from` narrows the admitted node names (the link admits only the nodes that dial
    it); `nonces` is the daemon-wide replay guard. `channel` is what the client asked for in
    its AUTH_HELLO (both macs cover it): final once `established`.
    """

    def __init__(self, config: PodConfig, local_name: str, *, now: float, nonces: NonceCache,
                 accept_from: Collection[str] | None = None,
                 timeout: float = HANDSHAKE_TIMEOUT, keys: Mapping[str, bytes] | None = None,
                 nonce: bytes | None = None, cert_names: Collection[str] | None = None) -> None:
        super().__init__(config, local_name, now, timeout, cert_names)
        self.keys = node_keys(config, local_name) if keys is None else keys
        self.key = b""  # the claimed peer's link key, once its AUTH_HELLO names it
        self.nonces = nonces
        others = {n.name for n in config.nodes} - {local_name}
        self.accept_from = others if accept_from is None else set(accept_from) & others
        self.nonce = nonce if nonce is not None else secrets.token_bytes(NONCE_SIZE)
        self._client_nonce = b""
        self.channel = Channel.LINK
        self._state = "hello"

    def receive_frame(self, frame: Frame, now: float) -> list[Frame]:
        self.check_deadline(now)
        if self._state == "hello":
            if not isinstance(frame, AuthHello):
                raise self._unexpected(frame, "AUTH_HELLO")
            return [self._hello(frame)]
        if self._state == "proof":
            if not isinstance(frame, AuthProof):
                raise self._unexpected(frame, "AUTH_PROOF")
            assert self.peer_name is not None
            want = _mac(self.key, _CLIENT_LABEL, self._client_nonce, self.nonce, self.config,
                        self.peer_name, self.local_name, self.channel)
            if not hmac.compare_digest(frame.mac, want):
                raise AuthError(f"{self.peer_name!r} failed to prove the key of our link "
                                "(a different key, or not that node)")
            self.link_nonces = (self._client_nonce, self.nonce)
            self._state = "done"
            self.established = True
            return [AuthOk()]
        raise AuthError(f"{frame.frame_type.name} after the handshake finished")

    def _hello(self, hello: AuthHello) -> AuthChallenge:
        if hello.version != PROTOCOL_VERSION:
            raise AuthError(f"protocol version {hello.version}, this daemon speaks "
                            f"{PROTOCOL_VERSION}")
        if hello.pod_uuid != self.config.uuid:
            raise AuthError(f"pod {hello.pod_uuid} is not this pod ({self.config.uuid})")
        try:
            channel = Channel(hello.channel)
        except ValueError:
            raise AuthError(f"unknown channel {hello.channel}") from None
        name = hello.node_name
        if name == self.local_name:
            raise AuthError(f"peer claims to be this node ({name!r})")
        if name not in {n.name for n in self.config.nodes}:
            raise AuthError(f"unknown node {name!r}")
        if name not in self.accept_from:
            raise AuthError(f"node {name!r} does not dial {self.local_name!r} "
                            "(the node whose name sorts first dials)")
        self._check_cert(name)
        key = self.keys.get(name)
        if key is None:
            raise AuthError(f"no key for the link with {name!r} in this node's config")
        if not self.nonces.add(hello.nonce):
            raise AuthError(f"replayed nonce from {name!r}")
        self.peer_name = name
        self.key = key
        self._client_nonce = hello.nonce
        self.channel = channel
        self._state = "proof"
        mac = _mac(self.key, _SERVER_LABEL, hello.nonce, self.nonce, self.config, name,
                   self.local_name, channel)
        return AuthChallenge(self.local_name, self.nonce, mac)
