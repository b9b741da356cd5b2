"""The newest kernel's behaviours (spec §13, tag N) by default, and each older one (U) under
its named quirk (Emulator policy 2): N2 the restart probe, N3 the reset after a failed
NPA_REQ send, N5 the revoke's re-check before each NPA_REVOKE, N6 a GPU without UALink, N7 the
refused export's leak. Sans-IO: the probe is a function standing for the link's read of the
peer's incarnation; no sleeping, each test says what time it is. (N4 is the link's: see
tests/integration/test_kernel_n_pod.py.)"""

from __future__ import annotations

import errno
import struct

import pytest
import ualink_testkit as kit
from ualink_testkit import make_node, open_file, pod_config

from ualinkd.abi import constants as c
from ualinkd.config import ConfigError, PodConfig
from ualinkd.drm.device import Caller
from ualinkd.drm.errors import DrmError
from ualinkd.drm.gem import DmaBuf
from ualinkd.node import NodeCore, NodeServices
from ualinkd.ualink import protocol as p
from ualinkd.ualink.manager import (
    KNOWN_QUIRKS,
    HelloAckSent,
    ImportFlow,
    NpaReqSent,
    RevokeSent,
    Send,
    UalinkManager,
)
from ualinkd.ualink.peers import ConnEvent, ConnState, NodeState

THREE = {"nodes": [[{"id": 0}], [{"id": 1}], [{"id": 2}]]}
LO, HI = 0x1234_5678_9ABC_0000, 0x42  # exported by accel 0
ETIME = DrmError(errno.ETIME, "no ACK within 2 s")
N_QUIRKS = ("no-restart-probe", "npa-req-fail-no-reset", "send-fail-slow",
            "revoke-no-recheck", "no-ualink-oops", "export-eperm-leak")


class Peers:
    """The link's view of the peers' incarnations; `unreadable` makes every probe fail."""

    def __init__(self) -> None:
        self.incarnation = {0: 1, 1: 1, 2: 1}
        self.unreadable: DrmError | None = None
        self.calls: list[int] = []

    def __call__(self, src: int, dst: int) -> int:
        self.calls.append(dst)
        if self.unreadable is not None:
            raise self.unreadable
        return self.incarnation[dst]


def importer(quirks: tuple[str, ...] = ()) -> tuple[object, UalinkManager, list[ImportFlow],
                                                    Peers]:
    """Accel 1 (node1) importing from accel 0, probing through a Peers."""
    core = make_node(pod_config(**THREE, quirks=quirks), node="node1")
    mgr = core.managers[128]
    flows: list[ImportFlow] = []

    def waiter(m: UalinkManager, flow: ImportFlow) -> ImportFlow:
        flows.append(flow)
        return flow

    mgr.attach(waiter)  # type: ignore[arg-type]  # a recorder, not an awaitable
    peers = Peers()
    mgr.probe = peers
    return core, mgr, flows, peers


def sends(mgr: UalinkManager) -> list[Send]:
    return [e for e in mgr.take_effects() if isinstance(e, Send)]


def errno_of(flow: ImportFlow) -> int:
    with pytest.raises(DrmError) as e:
        flow.outcome()
    return e.value.errno


def import_ready(core, mgr, flows, lo: int = LO, now: float = 0.0) -> ImportFlow:
    """One import from accel 0 through to READY, connecting first if it has to."""
    mgr.import_handle(open_file(core), lo, HI)
    (send,) = sends(mgr)
    if isinstance(send.msg, p.Hello):
        mgr.on_sent(send, None, now)
        mgr.receive(0, p.HelloAck())
        (send,) = sends(mgr)
    assert send.tag == NpaReqSent(lo)
    mgr.on_sent(send, None, now)
    mgr.receive(0, p.NpaRsp(p.handle_lo_bits(lo), 256, 0x802))
    flow = flows[-1]
    assert isinstance(flow.outcome(), DmaBuf)
    assert mgr.imports[lo].state == NodeState.READY
    mgr.take_effects()
    return flow


# -- N2: the restart probe ----------------------------------------------------------------------

def test_n2_setup_on_not_ready_fails_at_once_with_the_probes_error():
    """§13 N2: setup_connection on NOT_READY probes first; a peer that cannot be read fails
    the import at once with the probe's error, no HELLO sent, still NOT_READY."""
    core, mgr, flows, peers = importer()
    peers.unreadable = DrmError(errno.ETIME, "node0 is not reachable")
    with pytest.raises(DrmError) as e:
        mgr.import_handle(open_file(core), LO, HI)
    assert e.value.errno == errno.ETIME
    assert mgr.take_effects() == [] and mgr.get_timer() is None
    assert mgr.conn(0).state == ConnState.NOT_READY and not mgr.imports


def test_n2_quirk_no_restart_probe_sends_hello_without_probing():
    """§13 N2's quirk "no-restart-probe" (U): no probe; HELLO goes out as before."""
    core, mgr, flows, peers = importer(("no-restart-probe",))
    peers.unreadable = DrmError(errno.ETIME, "node0 is not reachable")
    mgr.import_handle(open_file(core), LO, HI)
    (hello,) = sends(mgr)
    assert isinstance(hello.msg, p.Hello) and peers.calls == []
    assert mgr.conn(0).state == ConnState.IN_PROGRESS


def _established_then_nothing_shared(quirks: tuple[str, ...] = ()):
    """Connected to accel 0 through an import that the exporter then revoked: ESTABLISHED,
    nothing shared."""
    core, mgr, flows, peers = importer(quirks)
    import_ready(core, mgr, flows)
    mgr.receive(0, p.NpaRevoke(p.handle_lo_bits(LO), HI))
    (release,) = sends(mgr)
    assert isinstance(release.msg, p.NpaRelease)
    assert mgr.conn(0).state == ConnState.ESTABLISHED and not mgr.shares_with(0)
    return core, mgr, flows, peers


def test_n2_established_with_nothing_shared_is_set_up_again_after_a_peer_restart():
    """§13 N2: ESTABLISHED with nothing shared probes; the peer's incarnation changed
    (resynced) → IN_PROGRESS, HELLO, and after its HELLO_ACK the NPA_REQ: the first import
    after the restart reaches the new exporter instead of being dropped (U: ETIMEDOUT)."""
    core, mgr, flows, peers = _established_then_nothing_shared()
    gen = mgr.conn(0).generation
    peers.incarnation[0] = 2  # accel 0's manager started again
    lo2 = LO + 0x400
    mgr.import_handle(open_file(core), lo2, HI)
    (hello,) = sends(mgr)
    assert isinstance(hello.msg, p.Hello) and mgr.conn(0).state == ConnState.IN_PROGRESS
    mgr.on_sent(hello, None, 10.0)
    mgr.receive(0, p.HelloAck())
    (req,) = sends(mgr)
    assert req.tag == NpaReqSent(lo2) and mgr.conn(0).generation == gen + 1
    mgr.on_sent(req, None, 10.0)
    mgr.receive(0, p.NpaRsp(p.handle_lo_bits(lo2), 256, 0x802))
    assert isinstance(flows[-1].outcome(), DmaBuf)
    assert mgr.shares_with(0)
    mgr.check_invariants()


def test_n2_established_in_sync_or_sharing_goes_straight_to_npa_req():
    """§13 N2: in sync → 0 (NPA_REQ at once); with something shared no probe at all (a
    probe that would fail is not made)."""
    core, mgr, flows, peers = _established_then_nothing_shared()
    import_ready(core, mgr, flows, LO + 0x400)  # in sync: no HELLO (import_ready checks)
    peers.unreadable = DrmError(errno.ETIME, "unreadable")
    calls = len(peers.calls)
    mgr.import_handle(open_file(core), LO + 0x800, HI)
    (req,) = sends(mgr)
    assert isinstance(req.msg, p.NpaReq) and len(peers.calls) == calls


def test_n2_established_probe_error_is_returned_and_the_state_kept():
    """§13 N2: ESTABLISHED, nothing shared, the probe fails → its error, still
    ESTABLISHED, nothing sent."""
    core, mgr, flows, peers = _established_then_nothing_shared()
    peers.unreadable = DrmError(errno.ETIME, "no answer")
    with pytest.raises(DrmError) as e:
        mgr.import_handle(open_file(core), LO + 0x400, HI)
    assert e.value.errno == errno.ETIME
    assert mgr.conn(0).state == ConnState.ESTABLISHED and not sends(mgr)


def test_n2_quirk_no_restart_probe_sends_npa_req_to_a_restarted_peer():
    """§13 N2's quirk (U): ESTABLISHED returns at once, so the NPA_REQ goes to the
    restarted peer (which drops it: the import's ETIMEDOUT, tests/integration)."""
    core, mgr, flows, peers = _established_then_nothing_shared(("no-restart-probe",))
    peers.incarnation[0] = 2
    mgr.import_handle(open_file(core), LO + 0x400, HI)
    (req,) = sends(mgr)
    assert isinstance(req.msg, p.NpaReq) and mgr.conn(0).state == ConnState.ESTABLISHED


def test_n2_hello_from_a_sender_that_cannot_be_probed_gets_no_hello_ack():
    """§13 N2: on HELLO receipt the sender is probed; unreadable → no HELLO_ACK, NOT_READY
    (the sender times out)."""
    core, mgr, flows, peers = importer()
    peers.unreadable = DrmError(errno.ETIME, "unreadable")
    mgr.receive(0, p.Hello(receiver_id=1, sender_id=0))
    assert sends(mgr) == [] and mgr.conn(0).state == ConnState.NOT_READY


def test_n2_quirk_no_restart_probe_answers_every_hello():
    """§13 N2's quirk (U): a HELLO is answered without a probe."""
    core, mgr, flows, peers = importer(("no-restart-probe",))
    peers.unreadable = DrmError(errno.ETIME, "unreadable")
    mgr.receive(0, p.Hello(receiver_id=1, sender_id=0))
    (ack,) = sends(mgr)
    assert ack.tag == HelloAckSent(0) and mgr.conn(0).state == ConnState.PENDING


def test_n2_probe_refuses_with_eshutdown_when_the_local_accel_is_not_active():
    """§13 N2: the probe refuses with ESHUTDOWN when the local accel is not ACTIVE."""
    core, mgr, flows, peers = importer()
    mgr.deactivate()
    with pytest.raises(DrmError) as e:
        mgr.import_handle(open_file(core), LO, HI)
    assert e.value.errno == errno.ESHUTDOWN and peers.calls == []


def test_n2_each_manager_start_is_a_new_incarnation():
    """§13 N2: a per-accel incarnation, new at each manager start (random, not a count)."""
    core, mgr, flows, peers = importer()
    first = mgr.incarnation
    mgr.deactivate()
    mgr.activate()
    assert mgr.incarnation not in (0, first)


# -- N3: a failed NPA_REQ send resets the connection --------------------------------------------

def test_n3_a_failed_npa_req_send_takes_the_other_imports_from_that_exporter():
    """§13 N3: the NPA_REQ send fails (the 2 s rule: ETIME): the import returns it, but first
    the connection to the exporter is reset (§5.8): the READY import from it is torn down,
    no NPA_RELEASE, NOT_READY."""
    core, mgr, flows, peers = importer()
    import_ready(core, mgr, flows)
    bo = mgr.imports[LO].bo
    lo2 = LO + 0x400
    mgr.import_handle(open_file(core), lo2, HI)
    (req,) = sends(mgr)
    mgr.on_sent(req, ETIME, 2.0)
    assert errno_of(flows[-1]) == errno.ETIME
    assert mgr.conn(0).state == ConnState.NOT_READY
    assert not mgr.imports and bo is not None and bo.npa_revoked
    assert sends(mgr) == [] and not mgr.shares_with(0)
    mgr.check_invariants()


# -- N5: revoke re-checks each importer before its NPA_REVOKE -----------------------------------

def exporter(quirks: tuple[str, ...] = ()):
    core, mgr, f, lo, hi = kit.connected_export(pod_config(**THREE, quirks=quirks))
    for remote in (1, 2):
        mgr.receive(remote, p.NpaReq(p.handle_lo_bits(lo), hi))
        for eff in mgr.take_effects():
            mgr.on_sent(eff, None, 0.0)
    mgr.revoke(mgr.exports[lo].bo)
    r1, r2 = sorted(sends(mgr), key=lambda e: e.dst)
    assert r1.tag == r2.tag == RevokeSent(lo)
    return mgr, lo, hi, r1, r2


def test_n5_an_importer_down_before_its_revoke_is_skipped_not_waited_for():
    """§13 N5: accel 2's connection is reset after the revoke began, before its NPA_REVOKE
    is posted: it gets none and is not waited for; accel 1's RELEASE ends the revoke."""
    mgr, lo, hi, r1, r2 = exporter()
    mgr.connection_reset(2, ConnState.NOT_READY, mgr.conn(2).generation)
    assert mgr.send_due(r1, 1.0) and not mgr.send_due(r2, 1.0)
    mgr.on_sent(r1, None, 1.0)
    assert mgr.get_timer() == 6.0
    mgr.receive(1, p.NpaRelease(p.handle_lo_bits(lo), hi))
    assert lo not in mgr.invalid and mgr.get_timer() is None
    assert mgr.npa_import_pages == 0
    mgr.check_invariants()


def test_n5_quirk_revoke_no_recheck_sends_to_the_down_importer_and_waits():
    """§13 N5's quirk "revoke-no-recheck" (U): the set built first is sent to and waited
    for: accel 2 stays expected until the 5 s wait ends."""
    mgr, lo, hi, r1, r2 = exporter(("revoke-no-recheck",))
    mgr.connection_reset(2, ConnState.NOT_READY, mgr.conn(2).generation)
    assert mgr.send_due(r1, 1.0) and mgr.send_due(r2, 1.0)
    mgr.on_sent(r1, None, 1.0)
    mgr.on_sent(r2, None, 1.0)
    mgr.receive(1, p.NpaRelease(p.handle_lo_bits(lo), hi))
    assert lo in mgr.invalid and mgr.get_timer() == 6.0
    mgr.handle_timer(6.0)
    assert lo not in mgr.invalid


def test_n5_a_failed_revoke_send_resets_that_connection():
    """§13 N5 (as U′): a REVOKE that could not be sent drops the importer and resets its
    connection."""
    mgr, lo, hi, r1, r2 = exporter()
    mgr.on_sent(r2, ETIME, 2.0)
    assert mgr.conn(2).state == ConnState.NOT_READY


def test_n5_quirk_revoke_no_recheck_a_failed_send_resets_nothing():
    """§13 N5's quirk (U): a failed REVOKE send only leaves the expected set."""
    mgr, lo, hi, r1, r2 = exporter(("revoke-no-recheck",))
    mgr.on_sent(r2, ETIME, 2.0)
    assert mgr.conn(2).state == ConnState.ESTABLISHED
    mgr.on_sent(r1, None, 2.0)
    mgr.receive(1, p.NpaRelease(p.handle_lo_bits(lo), hi))
    assert lo not in mgr.invalid


# -- N6: a GPU without the UALink IP block -------------------------------------------------------

NO_UALINK = {"nodes": [[{"id": 0, "ualink": False}], [{"id": 1}]]}


def test_n6_a_gpu_without_ualink_answers_eopnotsupp_before_the_op():
    """§13 N6 (§1.6 prologue step 1): EOPNOTSUPP for export, import and an unknown op."""
    core = make_node(pod_config(**NO_UALINK))
    f = open_file(core)
    h = kit.gem_create(f)
    assert kit.ualink_export_raw(f, h).result == -errno.EOPNOTSUPP
    assert kit.ualink_import_raw(f, LO | 1, HI).result == -errno.EOPNOTSUPP
    bad_op = kit.ioctl(f, kit.UALINK, struct.pack("<III", 7, 0, h) + bytes(12))
    assert bad_op.result == -errno.EOPNOTSUPP


def test_n6_quirk_no_ualink_oops_ends_the_caller():
    """§13 N6's quirk "no-ualink-oops" (U dereferences NULL): the oops ends the calling
    task (the node kills it; here a recorder stands for that)."""
    killed: list[Caller] = []
    core = NodeCore(pod_config(**NO_UALINK, quirks=("no-ualink-oops",)), "node0",
                    NodeServices(kill_caller=killed.append))
    f = open_file(core)
    assert kit.ualink_export_raw(f, kit.gem_create(f)).result == -errno.EFAULT
    assert killed == [kit.CALLER]


def test_n6_ualink_false_round_trips_through_the_toml():
    cfg = pod_config(**NO_UALINK)
    assert not cfg.nodes[0].accels[0].ualink and cfg.nodes[1].accels[0].ualink
    import tomllib
    again = PodConfig.from_dict(tomllib.loads(cfg.to_toml()), "<again>")
    assert not again.nodes[0].accels[0].ualink
    with pytest.raises(ConfigError, match="ualink"):
        pod_config(nodes=[[{"id": 0, "ualink": "no"}]])


# -- N7: exports ------------------------------------------------------------------------------

def test_n7_a_refused_export_leaks_nothing():
    """§13 N7: the EPERM (VM_ALWAYS_VALID) path drops what it took: closing the BO frees
    its VRAM."""
    core = make_node(pod_config())
    f = open_file(core)
    vram = core.managers[128].driver.vram
    h = kit.gem_create(f, size=1 << 20, flags=c.CREATE_VM_ALWAYS_VALID)
    assert kit.ualink_export_raw(f, h).result == -errno.EPERM
    kit.gem_close(f, h)
    assert vram.used == 0


def test_n7_quirk_export_eperm_leak_keeps_the_bo():
    """§13 N7's quirk "export-eperm-leak" (U): the refused export's BO reference leaks, so
    its VRAM stays used after its last handle is closed."""
    core = make_node(pod_config(quirks=("export-eperm-leak",)))
    f = open_file(core)
    vram = core.managers[128].driver.vram
    h = kit.gem_create(f, size=1 << 20, flags=c.CREATE_VM_ALWAYS_VALID)
    assert kit.ualink_export_raw(f, h).result == -errno.EPERM
    kit.gem_close(f, h)
    assert vram.used >= 1 << 20


def test_n7_repeated_first_exports_give_one_handle():
    """§13 N7, §3.4: one BO never has two handles (each export sees the first's)."""
    core = make_node(pod_config())
    f, g = open_file(core), open_file(core)
    h = kit.gem_create(f)
    token = kit.prime_to_token(f, h)
    h2 = kit.prime_from_fd(g, kit.open_token(core, token))
    got = {kit.ualink_export(f, h), kit.ualink_export(g, h2), kit.ualink_export(f, h)}
    assert len(got) == 1 and len(core.managers[128].exports) == 1


def test_every_n_quirk_is_known_and_accepted_by_the_pod_config():
    """§13's changes each have a named quirk that a pod TOML may switch on."""
    assert set(N_QUIRKS) <= KNOWN_QUIRKS
    cfg = pod_config(quirks=N_QUIRKS)
    assert cfg.kernel_quirks == frozenset(N_QUIRKS)


def test_conn_resync_is_a_row_of_the_table():
    """§13 N2: ESTABLISHED --RESYNCED--> IN_PROGRESS; a HELLO probe failure → NOT_READY."""
    from ualinkd.ualink.peers import PeerConn
    conn = PeerConn(0, ConnState.ESTABLISHED, 3)
    conn.apply(ConnEvent.RESYNCED)
    assert conn.state == ConnState.IN_PROGRESS
    conn.apply(ConnEvent.HELLO_PROBE_FAILED)
    assert conn.state == ConnState.NOT_READY


def test_every_n_quirk_is_accepted_by_kernel_quirks_on_the_command_line():
    """`--kernel-quirks` takes each of §13's quirk names (added to the pod's), and refuses
    a name it does not know."""
    from ualinkd.cli.common import with_quirks

    cfg = with_quirks(pod_config(quirks=("hello-no-reset",)), ",".join(N_QUIRKS))
    assert cfg.kernel_quirks == frozenset(N_QUIRKS) | {"hello-no-reset"}
    with pytest.raises(ConfigError, match="unknown kernel quirk no-restart-probes"):
        with_quirks(pod_config(), "no-restart-probes")


def test_n2_incarnation_frames_on_the_wire_and_in_a_session():
    """§13 N2 (fabric protocol 4): INCARNATION is [u32 length 11][u8 0x14][u16 accel]
    [u64 incarnation]; a session takes one for a peer accel (IncarnationReceived), drops the
    link for one naming an accel that is not the peer's, and refuses to announce one that is
    not ours."""
    from ualinkd.fabric import wire
    from ualinkd.fabric.session import IncarnationReceived, Session
    from ualinkd.fabric.wire import Incarnation, decode_payload, encode_frame

    raw = encode_frame(Incarnation(3, 0x0102_0304_0506_0708))
    assert raw == struct.pack("<IBHQ", 11, 0x14, 3, 0x0102_0304_0506_0708)
    assert decode_payload(0x14, raw[5:]) == Incarnation(3, 0x0102_0304_0506_0708)
    with pytest.raises(wire.RemoteProtocolError):
        decode_payload(0x14, raw[5:] + b"\0")
    ours, theirs = Session("b", {2, 3}, {0, 1}), Session("a", {0, 1}, {2, 3})
    ours.send_incarnation(1, 77)
    theirs.receive_data(ours.data_to_send())
    assert theirs.next_event() == IncarnationReceived(1, 77)
    with pytest.raises(wire.LocalProtocolError):
        ours.send_incarnation(2, 1)
    theirs.receive_data(encode_frame(Incarnation(2, 5)))  # accel 2 is theirs, not a's
    with pytest.raises(wire.RemoteProtocolError, match="announced accel 2"):
        theirs.next_event()


def test_n3_the_reset_takes_the_connection_as_it_is_when_the_send_fails():
    """§13 N3 as N's code does it (the generation read when the send failed, not the one
    the NPA_REQ went out with): a HELLO from the exporter re-established the connection
    while the NPA_REQ waited for its ACK; the failed send still resets the new one."""
    core, mgr, flows, peers = importer()
    import_ready(core, mgr, flows)
    lo2 = LO + 0x400
    mgr.import_handle(open_file(core), lo2, HI)
    (req,) = sends(mgr)
    gen = mgr.conn(0).generation
    mgr.receive(0, p.Hello(receiver_id=1, sender_id=0))  # N1: reset, then HELLO_ACK
    (ack,) = sends(mgr)
    mgr.on_sent(ack, None, 1.0)
    assert mgr.conn(0).state == ConnState.ESTABLISHED and mgr.conn(0).generation == gen + 1
    mgr.on_sent(req, ETIME, 2.0)
    assert errno_of(flows[-1]) == errno.ETIME
    assert mgr.conn(0).state == ConnState.NOT_READY
    mgr.check_invariants()


def test_n2_a_probe_with_nothing_to_read_yet_is_read_again_once_established():
    """§13 N2 with links on first use (fabric/dialing.py): the probe before the HELLO finds
    no incarnation yet (0: the link comes up for this HELLO), which is neither a restart nor
    a reading; the connection's ESTABLISHED reads it, so a later restart is told apart."""
    core, mgr, flows, peers = importer()
    peers.incarnation[0] = 0
    mgr.import_handle(open_file(core), LO, HI)
    (send,) = sends(mgr)
    assert isinstance(send.msg, p.Hello)
    assert mgr.conn(0).peer_incarnation is None
    mgr.on_sent(send, None, 0.0)
    peers.incarnation[0] = 7  # announced on the link, ahead of the HELLO_ACK
    mgr.receive(0, p.HelloAck())
    assert mgr.conn(0).peer_incarnation == 7
    (send,) = sends(mgr)
    assert send.tag == NpaReqSent(LO)
