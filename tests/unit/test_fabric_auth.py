"""The fabric handshake (sans-IO): mutual HMAC proof of the pod key, names, replay, deadline."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ualinkd.config import ConfigError, PodConfig
from ualinkd.fabric.auth import (
    AuthError,
    ClientHandshake,
    NonceCache,
    ServerHandshake,
    pod_key,
)
from ualinkd.fabric.wire import (
    Ack,
    AuthChallenge,
    AuthHello,
    AuthOk,
    AuthProof,
    Frame,
    RemoteProtocolError,
)

POD = PodConfig.local(nodes=3)


def _server(cfg: PodConfig = POD, name: str = "node2", now: float = 0.0,
            nonces: NonceCache | None = None, **kw: object) -> ServerHandshake:
    return ServerHandshake(cfg, name, now=now, nonces=nonces or NonceCache(), **kw)


def _run(client: ClientHandshake, server: ServerHandshake, now: float = 0.0) -> None:
    pending: list[Frame] = client.initial_frames()
    to_server = True
    while pending:
        side = server if to_server else client
        out: list[Frame] = []
        for f in pending:
            out += side.receive_frame(f, now)
        pending, to_server = out, not to_server


def test_handshake_succeeds_both_ways() -> None:
    c = ClientHandshake(POD, "node0", "node2", now=0.0)
    s = _server()
    _run(c, s, now=1.0)
    assert c.established and s.established
    assert (c.peer_name, s.peer_name) == ("node2", "node0")


def test_wrong_key_fails_on_both_sides() -> None:
    other = dataclasses.replace(POD, key="ab" * 32)
    c = ClientHandshake(other, "node0", "node2", now=0.0)
    s = _server()
    [challenge] = s.receive_frame(c.initial_frames()[0], 0.0)
    with pytest.raises(AuthError, match="prove the key of our link"):
        c.receive_frame(challenge, 0.0)
    # A client that does not check the server and sends a proof made with its own key:
    c2 = ClientHandshake(other, "node0", "node2", now=0.0)
    s2 = _server()
    s2.receive_frame(c2.initial_frames()[0], 0.0)
    with pytest.raises(AuthError, match="prove the key of our link"):
        s2.receive_frame(AuthProof(b"\0" * 32), 0.0)


@pytest.mark.parametrize(("hello", "why"), [
    (AuthHello(uuid.uuid4(), "node0", b"\1" * 32), "is not this pod"),
    (AuthHello(POD.uuid, "stranger", b"\1" * 32), "unknown node"),
    (AuthHello(POD.uuid, "node2", b"\1" * 32), "this node"),
    (AuthHello(POD.uuid, "node0", b"\1" * 32, version=9), "protocol version"),
])
def test_server_refuses_bad_hello(hello: AuthHello, why: str) -> None:
    with pytest.raises(AuthError, match=why):
        _server().receive_frame(hello, 0.0)


def test_server_admits_only_the_nodes_that_dial_it() -> None:
    s = _server(name="node1", accept_from=["node0"])
    with pytest.raises(AuthError, match="does not dial"):
        s.receive_frame(AuthHello(POD.uuid, "node2", b"\1" * 32), 0.0)


def test_replayed_nonce_is_refused() -> None:
    nonces = NonceCache()
    c = ClientHandshake(POD, "node0", "node2", now=0.0, nonce=b"\7" * 32)
    _run(c, _server(nonces=nonces))
    replay = ClientHandshake(POD, "node0", "node2", now=0.0, nonce=b"\7" * 32)
    with pytest.raises(AuthError, match="replayed nonce"):
        _run(replay, _server(nonces=nonces))


def test_nonce_cache_is_bounded() -> None:
    cache = NonceCache(size=2)
    assert cache.add(b"a") and cache.add(b"b") and not cache.add(b"a")
    assert cache.add(b"c") and cache.add(b"a")  # "a" fell out


def test_client_checks_who_answers() -> None:
    c = ClientHandshake(POD, "node0", "node1", now=0.0)
    [challenge] = _server(name="node2").receive_frame(c.initial_frames()[0], 0.0)
    with pytest.raises(AuthError, match="dialed node 'node1'"):
        c.receive_frame(challenge, 0.0)


@pytest.mark.parametrize("frame", [Ack(1, 0), AuthOk(), AuthProof(b"\0" * 32)])
def test_anything_but_the_next_handshake_frame_is_refused(frame: Frame) -> None:
    with pytest.raises(AuthError, match="expected AUTH_HELLO"):
        _server().receive_frame(frame, 0.0)
    c = ClientHandshake(POD, "node0", "node2", now=0.0)
    with pytest.raises(AuthError, match="expected AUTH_CHALLENGE"):
        c.receive_frame(frame, 0.0)


def test_deadline_is_an_input() -> None:
    s = _server(now=100.0, timeout=5.0)
    assert s.deadline == 105.0
    s.check_deadline(104.9)
    with pytest.raises(AuthError, match="within 5 s"):
        s.receive_frame(AuthHello(POD.uuid, "node0", b"\1" * 32), 105.0)
    c = ClientHandshake(POD, "node0", "node2", now=0.0, timeout=0.5)
    with pytest.raises(AuthError):
        c.check_deadline(0.5)


def test_auth_error_is_a_remote_protocol_error() -> None:
    assert issubclass(AuthError, RemoteProtocolError)


@pytest.mark.parametrize("key", ["", "zz" * 16, "ab" * 8])
def test_pod_key_must_be_long_hex(key: str) -> None:
    with pytest.raises(ConfigError, match="key"):
        pod_key(dataclasses.replace(POD, key=key))


@given(st.binary(min_size=32, max_size=32), st.binary(min_size=32, max_size=32))
def test_forged_challenge_macs_never_verify(nonce: bytes, mac: bytes) -> None:
    c = ClientHandshake(POD, "node0", "node2", now=0.0)
    with pytest.raises(AuthError):
        c.receive_frame(AuthChallenge("node2", nonce, mac), 0.0)
