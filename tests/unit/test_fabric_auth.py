"""The fabric handshake (sans-IO): mutual HMAC proof of the pod key, names, replay, deadline."""

from __future__ import annotations

import dataclasses
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ualinkd.config import ConfigError, PodConfig
from ualinkd.fabric import auth, wire

POD = PodConfig.local(nodes=3)


def _server(cfg: PodConfig = POD, name: str = "node2", now: float = 0.0,
            nonces: auth.NonceCache | None = None, **kw: object) -> auth.ServerHandshake:
    return auth.ServerHandshake(cfg, name, now=now, nonces=nonces or auth.NonceCache(), **kw)


def _run(client: auth.ClientHandshake, server: auth.ServerHandshake, now: float = 0.0) -> None:
    pending: list[wire.Frame] = client.initial_frames()
    to_server = True
    while pending:
        side = server if to_server else client
        out: list[wire.Frame] = []
        for f in pending:
            out += side.receive_frame(f, now)
        pending, to_server = out, not to_server


def test_handshake_succeeds_both_ways() -> None:
    c = auth.ClientHandshake(POD, "node0", "node2", now=0.0)
    s = _server()
    _run(c, s, now=1.0)
    assert c.established and s.established
    assert (c.peer_name, s.peer_name) == ("node2", "node0")


def test_wrong_key_fails_on_both_sides() -> None:
    other = dataclasses.replace(POD, key="ab" * 32)
    c = auth.ClientHandshake(other, "node0", "node2", now=0.0)
    s = _server()
    [challenge] = s.receive_frame(c.initial_frames()[0], 0.0)
    with pytest.raises(auth.AuthError, match="prove the key of our link"):
        c.receive_frame(challenge, 0.0)
    # A client that does not check the server and sends a proof made with its own key:
    c2 = auth.ClientHandshake(other, "node0", "node2", now=0.0)
    s2 = _server()
    s2.receive_frame(c2.initial_frames()[0], 0.0)
    with pytest.raises(auth.AuthError, match="prove the key of our link"):
        s2.receive_frame(wire.AuthProof(b"\0" * 32), 0.0)


@pytest.mark.parametrize(("hello", "why"), [
    (wire.AuthHello(uuid.uuid4(), "node0", b"\1" * 32), "is not this pod"),
    (wire.AuthHello(POD.uuid, "stranger", b"\1" * 32), "unknown node"),
    (wire.AuthHello(POD.uuid, "node2", b"\1" * 32), "this node"),
    (wire.AuthHello(POD.uuid, "node0", b"\1" * 32, version=9), "protocol version"),
    (wire.AuthHello(POD.uuid, "node0", b"\1" * 32, version=2), "protocol version 2, this "
     "daemon speaks 4"),
    (wire.AuthHello(POD.uuid, "node0", b"\1" * 32, channel=2), "unknown channel 2"),
    (wire.AuthHello(POD.uuid, "node0", b"\1" * 32, channel=255), "unknown channel 255"),
])
def test_server_refuses_bad_hello(hello: wire.AuthHello, why: str) -> None:
    with pytest.raises(auth.AuthError, match=why):
        _server().receive_frame(hello, 0.0)


@pytest.mark.parametrize("channel", list(wire.Channel))
def test_the_server_learns_the_channel_the_client_asked_for(channel: wire.Channel) -> None:
    c = auth.ClientHandshake(POD, "node0", "node2", now=0.0, channel=channel)
    s = _server()
    _run(c, s)
    assert c.established and s.established
    assert s.channel is channel and c.channel is channel
    assert c.initial_frames()[0].channel == channel


def test_a_proof_for_one_channel_is_no_proof_for_the_other() -> None:
    """Both macs cover the channel: a HELLO whose channel byte was changed on the way (a
    data channel's HELLO presented as a link's, or the reverse) fails on both sides, with
    the same nonces, names and key."""
    for asked, seen in [(wire.Channel.DATA, wire.Channel.LINK),
                        (wire.Channel.LINK, wire.Channel.DATA)]:
        c = auth.ClientHandshake(POD, "node0", "node2", now=0.0, nonce=b"\5" * 32,
                                 channel=asked)
        [hello] = c.initial_frames()
        assert isinstance(hello, wire.AuthHello)
        honest = _server(nonce=b"\6" * 32)
        [ok_challenge] = honest.receive_frame(hello, 0.0)
        tampered = _server(nonce=b"\6" * 32)
        [challenge] = tampered.receive_frame(dataclasses.replace(hello, channel=seen), 0.0)
        assert tampered.channel is seen
        with pytest.raises(auth.AuthError, match="prove the key of our link"):
            c.receive_frame(challenge, 0.0)  # the server's mac is for the other channel
        c2 = auth.ClientHandshake(POD, "node0", "node2", now=0.0, nonce=b"\5" * 32,
                                  channel=asked)
        [proof] = c2.receive_frame(ok_challenge, 0.0)  # a proof for `asked`...
        with pytest.raises(auth.AuthError, match="'node0' failed to prove"):
            tampered.receive_frame(proof, 0.0)  # ...does not verify for `seen`
        assert honest.receive_frame(proof, 0.0) == [wire.AuthOk()]


def test_a_client_refuses_to_ask_for_an_unknown_channel() -> None:
    with pytest.raises(wire.LocalProtocolError, match="no channel 2"):
        auth.ClientHandshake(POD, "node0", "node2", now=0.0, channel=2)


def test_server_admits_only_the_nodes_that_dial_it() -> None:
    s = _server(name="node1", accept_from=["node0"])
    with pytest.raises(auth.AuthError, match="does not dial"):
        s.receive_frame(wire.AuthHello(POD.uuid, "node2", b"\1" * 32), 0.0)


def test_replayed_nonce_is_refused() -> None:
    nonces = auth.NonceCache()
    c = auth.ClientHandshake(POD, "node0", "node2", now=0.0, nonce=b"\7" * 32)
    _run(c, _server(nonces=nonces))
    replay = auth.ClientHandshake(POD, "node0", "node2", now=0.0, nonce=b"\7" * 32)
    with pytest.raises(auth.AuthError, match="replayed nonce"):
        _run(replay, _server(nonces=nonces))


def test_nonce_cache_is_bounded() -> None:
    cache = auth.NonceCache(size=2)
    assert cache.add(b"a") and cache.add(b"b") and not cache.add(b"a")
    assert cache.add(b"c") and cache.add(b"a")  # "a" fell out


def test_client_checks_who_answers() -> None:
    c = auth.ClientHandshake(POD, "node0", "node1", now=0.0)
    [challenge] = _server(name="node2").receive_frame(c.initial_frames()[0], 0.0)
    with pytest.raises(auth.AuthError, match="dialed node 'node1'"):
        c.receive_frame(challenge, 0.0)


@pytest.mark.parametrize("frame", [wire.Ack(1, 0), wire.AuthOk(), wire.AuthProof(b"\0" * 32)])
def test_anything_but_the_next_handshake_frame_is_refused(frame: wire.Frame) -> None:
    with pytest.raises(auth.AuthError, match="expected AUTH_HELLO"):
        _server().receive_frame(frame, 0.0)
    c = auth.ClientHandshake(POD, "node0", "node2", now=0.0)
    with pytest.raises(auth.AuthError, match="expected AUTH_CHALLENGE"):
        c.receive_frame(frame, 0.0)


def test_deadline_is_an_input() -> None:
    s = _server(now=100.0, timeout=5.0)
    assert s.deadline == 105.0
    s.check_deadline(104.9)
    with pytest.raises(auth.AuthError, match="within 5 s"):
        s.receive_frame(wire.AuthHello(POD.uuid, "node0", b"\1" * 32), 105.0)
    c = auth.ClientHandshake(POD, "node0", "node2", now=0.0, timeout=0.5)
    with pytest.raises(auth.AuthError):
        c.check_deadline(0.5)


def test_auth_error_is_a_remote_protocol_error() -> None:
    assert issubclass(auth.AuthError, wire.RemoteProtocolError)


@pytest.mark.parametrize("key", ["", "zz" * 16, "ab" * 8])
def test_pod_key_must_be_long_hex(key: str) -> None:
    with pytest.raises(ConfigError, match="key"):
        auth.pod_key(dataclasses.replace(POD, key=key))


@given(st.binary(min_size=32, max_size=32), st.binary(min_size=32, max_size=32))
def test_forged_challenge_macs_never_verify(nonce: bytes, mac: bytes) -> None:
    c = auth.ClientHandshake(POD, "node0", "node2", now=0.0)
    with pytest.raises(auth.AuthError):
        c.receive_frame(wire.AuthChallenge("node2", nonce, mac), 0.0)


# ---- identity: per-link keys, a node's own config, TLS names (issue 10 item 8) -------------

def test_each_link_has_its_own_key() -> None:
    """K_ab = HMAC(pod key, "ualinkd pair" ‖ sorted names): symmetric, distinct per pair."""
    k = auth.pod_key(POD)
    assert auth.pair_key(k, "node0", "node2") == auth.pair_key(k, "node2", "node0")
    keys = {auth.pair_key(k, a, b) for a, b in [("node0", "node1"), ("node0", "node2"),
                                           ("node1", "node2")]}
    assert len(keys) == 3
    assert auth.node_keys(POD, "node2") == {"node0": auth.pair_key(k, "node0", "node2"),
                                       "node1": auth.pair_key(k, "node1", "node2")}


def test_a_node_config_holds_only_its_own_link_keys(tmp_path) -> None:
    """node_config: no pod key, the node's link keys in its own entry, nothing for the other
    links; it loads back, and runs a handshake with a node given the pod key."""
    own = auth.node_config(POD, "node0")
    assert own.key == ""
    assert [n.link_keys != () for n in own.nodes] == [True, False, False]
    path = tmp_path / "node0.toml"
    path.write_text(own.to_toml())
    loaded = PodConfig.load(path)
    assert auth.node_keys(loaded, "node0") == auth.node_keys(POD, "node0")
    with pytest.raises(ConfigError, match="no key for the link between 'node1' and 'node2'"):
        auth.node_keys(loaded, "node1")
    c = auth.ClientHandshake(loaded, "node0", "node2", now=0.0)
    s = _server()
    _run(c, s)
    assert c.established and s.established


def test_holding_one_nodes_keys_does_not_make_you_another() -> None:
    """An impostor with node0's config (its link keys, no pod key) claims to be node1 to
    node2 with each key it has: every attempt fails at the proof."""
    stolen = auth.node_config(POD, "node0")
    with pytest.raises(ConfigError):
        auth.ClientHandshake(stolen, "node1", "node2", now=0.0)  # it has no key for node1–node2
    for key in auth.node_keys(stolen, "node0").values():
        c = auth.ClientHandshake(stolen, "node1", "node2", now=0.0, key=key)
        s = _server()
        [challenge] = s.receive_frame(c.initial_frames()[0], 0.0)
        with pytest.raises(auth.AuthError, match="prove the key of our link"):
            c.receive_frame(challenge, 0.0)  # node2's challenge is not under this key
        with pytest.raises(auth.AuthError, match="'node1' failed to prove the key of our link"):
            s.receive_frame(wire.AuthProof(b"\0" * 32), 0.0)


@pytest.mark.parametrize(("edit", "why"), [
    ({"node0": {"node9": "ab" * 16}}, "link key for 'node9', which is no node of the pod"),
    ({"node0": {"node0": "ab" * 16}}, "which is itself"),
    ({"node0": {"node1": "ab" * 8}}, "link_keys.node1 must be at least 16 bytes"),
    ({"node0": {"node1": "ab" * 16}, "node1": {"node0": "cd" * 16}},
     "give their link different keys"),
])
def test_link_keys_are_checked(edit: dict, why: str) -> None:
    nodes = tuple(dataclasses.replace(n, link_keys=tuple(edit.get(n.name, {}).items()))
                  for n in POD.nodes)
    with pytest.raises(ConfigError, match=why):
        dataclasses.replace(POD, nodes=nodes).validate()


def test_tls_certificate_must_name_the_claimed_node() -> None:
    """With TLS, node0's valid certificate does not admit a peer that claims to be node1, on
    either side of the handshake."""
    s = _server(cert_names={"node0", "127.0.0.1"})
    with pytest.raises(auth.AuthError, match=r"claims to be 'node1' but its TLS certificate is for "
                                        r"127\.0\.0\.1, node0"):
        s.receive_frame(wire.AuthHello(POD.uuid, "node1", b"\1" * 32), 0.0)
    c = auth.ClientHandshake(POD, "node0", "node2", now=0.0, cert_names={"node1"})
    [challenge] = _server().receive_frame(c.initial_frames()[0], 0.0)
    with pytest.raises(auth.AuthError, match="claims to be 'node2'"):
        c.receive_frame(challenge, 0.0)
    ok = _server(cert_names={"node0"})
    ok.receive_frame(wire.AuthHello(POD.uuid, "node0", b"\2" * 32), 0.0)


def test_a_data_channel_nonce_is_bound_to_one_link_handshake() -> None:
    """Issue 29 item 6: both ends of an established link derive the same channel key from
    the link key and the handshake's two nonces; a nonce bound with it names that link and
    no other one (another handshake with the same key: a party holding the key that is not
    the link's end), nor an unbound random nonce."""
    c = auth.ClientHandshake(POD, "node0", "node2", now=0.0)
    s = _server()
    _run(c, s)
    key = c.channel_key()
    assert key == s.channel_key() and len(key) == 32
    nonce = auth.bound_nonce(key)
    assert len(nonce) == wire.NONCE_SIZE and auth.bound_to(nonce, s.channel_key())
    other = auth.ClientHandshake(POD, "node0", "node2", now=0.0)
    _run(other, _server())
    assert other.channel_key() != key
    assert not auth.bound_to(auth.bound_nonce(other.channel_key()), key)
    assert not auth.bound_to(bytes(wire.NONCE_SIZE), key)
    assert not auth.bound_to(nonce, b"")  # a link whose key is not known binds nothing
