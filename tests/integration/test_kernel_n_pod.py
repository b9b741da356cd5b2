"""The newest kernel (spec §13, tag N) in real pods: daemons over TCP, libualink clients, a
peer SIGKILLed and started again. Each N item's default, and its quirk (the older build U)
where the daemons show the difference: N2 the restart probe, N3 the reset after a failed
NPA_REQ send, N4 sends that cannot be posted failing at once, N6 a GPU without UALink."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import pytest
from nodes import Client, running_pod, start_node, wait_links_up, wait_until
from test_pod_fabric import pod_config

from ualinkd import sysfs
from ualinkd.config import AccelConfig, PodConfig
from ualinkd.fabric.waiting import completed

pytestmark = pytest.mark.integration

OLD = {"no-restart-probe", "npa-req-fail-no-reset", "send-fail-slow"}


def _imports(node) -> str:
    return node.debug(128, "ualink_imports")


def _link_down(node) -> bool:
    return not all(sysfs.parse_fabric((node.mount / sysfs.FABRIC_STATUS).read_text()).values())


def _shared_then_nothing(ca: Client, cb: Client, b) -> None:
    """B imports A's BO, A closes it: B releases (§5.7), the connection stays ESTABLISHED
    with nothing shared."""
    bo = ca.bo_create()
    handle = ca.export(bo)
    os.close(cb.import_(handle))
    ca.bo_close(bo)
    assert wait_until(lambda: f"{handle[0]:#018x}" not in _imports(b)), _imports(b)
    assert "state=ESTABLISHED" in b.debug(128, "ualink_peers")


def _restart_with_nothing_shared(tmp_path, quirks: frozenset[str]):
    """A pod of two; B connected to A with nothing shared; A SIGKILLed and started again.
    Yields (new A, B, a client of B)."""
    cfg = pod_config(2, response_ms=1000, quirks=quirks)
    with running_pod(tmp_path, config=cfg) as (a, b):
        with Client(b.render()) as cb:
            with Client(a.render()) as ca:
                _shared_then_nothing(ca, cb, b)
            a.stop(signal.SIGKILL)
            a2 = start_node(tmp_path / "restart", cfg, "node0")
            try:
                wait_links_up(a2)
                wait_links_up(b)
                yield a2, b, cb
            finally:
                a2.close()


def test_n2_first_import_after_a_peer_restart_with_nothing_shared_succeeds(tmp_path):
    """§13 N2: B is ESTABLISHED with A, nothing shared; A is killed and started again (a
    new incarnation, announced on its new link). B's first import of the new A's handle
    probes A, finds it resynced, says HELLO again and succeeds at once (U: ETIMEDOUT)."""
    for a2, _b, cb in _restart_with_nothing_shared(tmp_path, frozenset()):
        with Client(a2.render()) as ca2:
            h2 = ca2.export(ca2.bo_create())
            start = time.monotonic()
            fd = cb.import_(h2)
            assert time.monotonic() - start < 1.0  # no 1 s response timeout on the way
            assert os.lseek(fd, 0, os.SEEK_END) == 1 << 20
            os.close(fd)


def test_n2_quirk_no_restart_probe_first_import_times_out_then_the_retry_works(tmp_path):
    """§13 N2's quirk "no-restart-probe" (U): B's NPA_REQ goes to the restarted A, which
    drops it (not connected) and says HELLO: the first import is ETIMEDOUT after the
    response timeout, the retry works."""
    for a2, _b, cb in _restart_with_nothing_shared(tmp_path, frozenset({"no-restart-probe"})):
        with Client(a2.render()) as ca2:
            h2 = ca2.export(ca2.bo_create())
            with pytest.raises(OSError) as e:
                cb.import_(h2)
            assert e.value.errno == errno.ETIMEDOUT
            os.close(cb.import_(h2))


def _exporter_killed_while_shared(tmp_path, quirks: frozenset[str], ack_ms: int = 1500):
    """B holds an import from A (and a second BO is exported); A is SIGKILLed and B has seen
    its link go down. Yields (B, B's client, the held handle, an unimported handle)."""
    cfg = pod_config(2, response_ms=ack_ms, quirks=quirks)
    with running_pod(tmp_path, config=cfg) as (a, b):
        with Client(b.render()) as cb:
            with Client(a.render()) as ca:
                held = ca.export(ca.bo_create())
                other = ca.export(ca.bo_create())
                os.close(cb.import_(held))
                a.stop(signal.SIGKILL)
            assert wait_until(lambda: _link_down(b))
            yield b, cb, held, other


def test_n3_n4_a_send_that_cannot_be_posted_fails_at_once_and_resets(tmp_path):
    """§13 N4: with A's link down the NPA_REQ cannot be posted: the import fails at once
    with the copy's error (ETIME), not after the 1.5 s ACK timeout. §13 N3: that
    failed send first resets the connection to A, which takes B's other import from A with
    it (torn down, no NPA_RELEASE) and leaves it NOT_READY."""
    for b, cb, held, other in _exporter_killed_while_shared(tmp_path, frozenset()):
        assert f"{held[0]:#018x}" in _imports(b)
        start = time.monotonic()
        with pytest.raises(OSError) as e:
            cb.import_(other)
        assert e.value.errno == errno.ETIME
        assert time.monotonic() - start < 1.0
        assert f"{held[0]:#018x}" not in _imports(b)
        assert "state=NOT_READY" in b.debug(128, "ualink_peers")


def test_n3_quirk_npa_req_fail_no_reset_keeps_the_other_imports(tmp_path):
    """§13 N3's quirk "npa-req-fail-no-reset" (U): the failed NPA_REQ send is returned
    (ETIME at once, N4 still on) and the connection left alone: B's import from A stays."""
    for b, cb, held, other in _exporter_killed_while_shared(
            tmp_path, frozenset({"npa-req-fail-no-reset"})):
        with pytest.raises(OSError) as e:
            cb.import_(other)
        assert e.value.errno == errno.ETIME
        assert f"{held[0]:#018x}" in _imports(b)
        assert "state=ESTABLISHED" in b.debug(128, "ualink_peers")


def test_n4_quirk_send_fail_slow_polls_the_ack_timeout(tmp_path):
    """§13 N4's quirk "send-fail-slow" (U): the send that cannot be posted waits out the
    ACK timeout (1.5 s) and fails with ETIME; N3 still resets the connection."""
    for b, cb, held, other in _exporter_killed_while_shared(
            tmp_path, frozenset({"send-fail-slow"})):
        start = time.monotonic()
        with pytest.raises(OSError) as e:
            cb.import_(other)
        assert e.value.errno == errno.ETIME
        assert time.monotonic() - start >= 1.4
        assert f"{held[0]:#018x}" not in _imports(b)


def test_n2_n3_after_the_reset_the_restarted_exporter_is_imported_from_at_once(tmp_path):
    """§13 N2 + N3 (what test_pod_fabric's test_killed_exporter_and_restart shows for U):
    the failed NPA_REQ left B NOT_READY, so after A's restart B probes, says HELLO and its
    first import succeeds."""
    cfg = pod_config(2, response_ms=1000)
    with running_pod(tmp_path, config=cfg) as (a, b):
        with Client(b.render()) as cb:
            with Client(a.render()) as ca:
                held = ca.export(ca.bo_create())
                os.close(cb.import_(held))
                a.stop(signal.SIGKILL)
            assert wait_until(lambda: _link_down(b))
            with pytest.raises(OSError) as e:
                cb.import_((held[0] ^ 0x400, held[1]))
            assert e.value.errno == errno.ETIME
            a2 = start_node(tmp_path / "restart", cfg, "node0")
            try:
                wait_links_up(a2)
                wait_links_up(b)
                with Client(a2.render()) as ca2:
                    h2 = ca2.export(ca2.bo_create())
                    os.close(cb.import_(h2))
                assert "state=ESTABLISHED" in b.debug(128, "ualink_peers")
            finally:
                a2.close()


# -- N6: a GPU without the UALink IP block --------------------------------------------------

_UALINK_IOCTL = """
import fcntl, struct, sys
fd = open(sys.argv[1], "rb+", buffering=0)
# DRM_IOCTL_AMDGPU_UALINK_HANDLE, op 0 (export) of GEM handle 1 (none: the op is never read)
try:
    fcntl.ioctl(fd, 0xC018645B, bytearray(struct.pack("<III", 0, 0, 1) + bytes(12)))
except OSError as e:
    print(e.errno)
"""


def _no_ualink_pod(quirks: frozenset[str]) -> PodConfig:
    cfg = pod_config(1, quirks=quirks)
    (node,) = cfg.nodes
    accel = AccelConfig(node.accels[0].accel_id, ualink=False)
    from dataclasses import replace
    return replace(cfg, nodes=(replace(node, accels=(accel,)),))


def test_n6_a_gpu_without_ualink_answers_eopnotsupp(tmp_path):
    """§13 N6: `ualink = false` (no UALink IP block): the ioctl is EOPNOTSUPP."""
    with running_pod(tmp_path, config=_no_ualink_pod(frozenset())) as (a,):
        out = subprocess.run([sys.executable, "-c", _UALINK_IOCTL, a.render()],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and out.stdout.strip() == str(errno.EOPNOTSUPP), out


def test_n6_quirk_no_ualink_oops_kills_the_caller(tmp_path):
    """§13 N6's quirk "no-ualink-oops" (U's NULL dereference): the calling process dies
    (SIGKILL) and the daemon logs the oops; the daemon serves on."""
    with running_pod(tmp_path, config=_no_ualink_pod(frozenset({"no-ualink-oops"}))) as (a,):
        out = subprocess.run([sys.executable, "-c", _UALINK_IOCTL, a.render()],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == -signal.SIGKILL, out
        assert wait_until(lambda: "NULL pointer dereference" in a.log_text())
        with Client(a.render()) as ca:
            ca.bo_close(ca.bo_create())


# -- N7: concurrent first exports of one BO, through libdrm ---------------------------------

def _export_race(tmp_path, quirks: frozenset[str]) -> dict[str, dict[str, str]]:
    from nodes import c_program
    from test_libdrm import parse, run_shimmed
    c_program("libualink_shim.so")
    with running_pod(tmp_path, config=pod_config(1, quirks=quirks)) as (a,):
        r = run_shimmed("libdrm_export_race", a.mount, "16", "20")
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}{r.stderr}"
    return parse(r.stdout)


def test_n7_many_threads_exporting_one_fresh_bo_through_libdrm_get_one_handle(tmp_path):
    """§13 N7 (§3.4, §1.7): 16 threads released together export the same fresh BO through
    drmCommandWriteRead, 20 rounds: every thread (and an export after them) gets the same
    handle, never two for one BO; a refused VM_ALWAYS_VALID export (EPERM) leaks nothing:
    VRAM usage is back once the BO is freed."""
    s = _export_race(tmp_path, frozenset())
    assert s["export_race"]["mismatched"] == "0", s
    assert s["export_always_valid"]["err"] == str(errno.EPERM), s
    used = s["vram_after_refused"]
    assert used["after"] == used["before"], s


def test_n7_quirk_export_eperm_leak_keeps_the_refused_bos_vram(tmp_path):
    """§13 N7's quirk "export-eperm-leak" (U): the refused export keeps a BO reference, so
    the freed BO's VRAM stays used."""
    s = _export_race(tmp_path, frozenset({"export-eperm-leak"}))
    assert s["export_always_valid"]["err"] == str(errno.EPERM), s
    used = s["vram_after_refused"]
    assert int(used["after"]) >= int(used["before"]) + (1 << 20), s


# -- the link itself: N4's unposted sends, N2's incarnations ----------------------------------

async def test_n4_a_send_to_a_link_that_is_down_fails_at_once():
    """§13 N4 at the link: b was never started, so nothing can be posted to it: send and
    send_batch fail at once with ETIME (the quirk's waiting in line for the ACK timeout is
    test_fabric_link's test_a_batch_waits_for_its_link_like_single_sends)."""
    import trio
    from test_fabric_link import Pod, make_pod

    async with trio.open_nursery() as nursery:
        pod = Pod(make_pod(ack_ms=2000, quirks=frozenset()), nursery)
        a = await pod.start("a")
        start = trio.current_time()
        outcomes = await completed(a.send_batch(0, 2, [(3, 0, 0, 0), (3, 1, 0, 0)]))
        assert [e.errno for e, _ in outcomes if e is not None] == [errno.ETIME] * 2
        with pytest.raises(Exception) as e:
            await completed(a.send(0, 2, (3, 0, 0, 0)))
        assert getattr(e.value, "errno", None) == errno.ETIME
        assert trio.current_time() - start < 1.0
        nursery.cancel_scope.cancel()


async def test_n2_the_link_carries_each_accels_incarnation():
    """§13 N2: each side announces its accels' incarnations as the link comes up and again
    at a manager start (`announce`); the probe (`incarnation`) reads the peer's, and a link
    that is down cannot be read (ETIME at once), an accel no node owns is EINVAL."""
    import trio
    from test_fabric_link import make_pod

    from ualinkd.drm.errors import DrmError
    from ualinkd.fabric.link import FabricLink

    cfg = make_pod(quirks=frozenset())
    async with trio.open_nursery() as nursery:
        links: dict[str, FabricLink] = {}
        ports: dict[str, int] = {}

        async def start(name: str, base: int) -> FabricLink:
            link = FabricLink(cfg, name, lambda s, d, w: None, connect_backoff=(0.01, 0.05),
                              handshake_timeout=0.5,
                              local_incarnation=lambda accel: base + accel)
            ports[name] = await nursery.start(link.run)
            links[name] = link
            for other, olink in links.items():
                if other != name:
                    olink.set_peer_address(name, f"127.0.0.1:{ports[name]}")
                    link.set_peer_address(other, f"127.0.0.1:{ports[other]}")
            return link

        a = await start("a", 100)
        with pytest.raises(DrmError) as e:
            a.incarnation(0, 2)  # b is not running: nothing to read
        assert e.value.errno == errno.ETIME
        b = await start("b", 200)
        with trio.fail_after(5):
            while not (a.is_up("b") and b.is_up("a")):
                await trio.sleep(0.01)
        with trio.fail_after(5):  # (announced ahead of anything else on the link)
            while (a.incarnation(0, 3), b.incarnation(2, 1)) != (203, 101):
                await trio.sleep(0.01)
        b.announce(2, 999)
        with trio.fail_after(5):
            while a.incarnation(1, 2) != 999:
                await trio.sleep(0.01)
        with pytest.raises(DrmError) as e:
            a.incarnation(0, 77)
        assert e.value.errno == errno.EINVAL
        nursery.cancel_scope.cancel()


def test_n4_n5_a_revoke_to_a_killed_importer_ends_at_once(tmp_path):
    """§13 N4 + N5 (§5.7): B is SIGKILLed holding an import and A has seen its link go
    down; A's revoke cannot post the NPA_REVOKE (ETIME at once), so B leaves the expected
    set and its connection is reset: the NPA is freed and the BO gone well before the 1.5 s
    timeouts (U: test_pod_fabric's test_importer_killed_while_exporter_revokes)."""
    with running_pod(tmp_path, config=pod_config(2, response_ms=1500)) as (a, b):
        with Client(a.render()) as ca:
            bo = ca.bo_create()
            with Client(b.render()) as cb:
                fd = cb.import_(ca.export(bo))
                b.stop(signal.SIGKILL)
                try:
                    os.close(fd)
                except OSError:
                    pass  # (B's mount died with it)
            assert wait_until(lambda: _link_down(a))
            start = time.monotonic()
            ca.bo_close(bo)
            assert wait_until(lambda: "state=NOT_READY" in a.debug(128, "ualink_peers"))
            assert a.debug(128, "ualink_npa").startswith("used_pages=0 ")
            assert time.monotonic() - start < 1.0
            assert wait_until(lambda: a.debug(128, "gem_objects") == "")
