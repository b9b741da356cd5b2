"""Pods of real daemon processes talking TCP on 127.0.0.1, real mounts, C clients
(libualink via cffi). Spec sections in each docstring; timeouts are shortened through the
pod config (Emulator policy 7)."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from nodes import Client, running_pod, start_node, tls_pod_config, wait_links_up, wait_until

from ualinkd.cli.main import free_tcp_ports
from ualinkd.config import AccelConfig, NodeConfig, PodConfig, VpodConfig
from ualinkd.ualink.protocol import MsgType
from ualinkd.ualink.state import AddrMode

pytestmark = pytest.mark.integration


def pod_config(nodes: int = 2, mode: AddrMode = AddrMode.SOURCE_ALIASING,
               response_ms: int = 1000, vpod_members: list[int] | None = None,
               npa_pages: int | None = None, quirks: frozenset[str] = frozenset()) -> PodConfig:
    base = PodConfig.local(nodes, 1, free_tcp_ports(nodes))
    members = frozenset(vpod_members if vpod_members is not None else range(nodes))
    node_cfgs = tuple(
        NodeConfig(n.name, n.address, tuple(AccelConfig(a.accel_id, npa_pages=npa_pages)
                                            for a in n.accels))
        for n in base.nodes
    )
    return replace(base, nodes=node_cfgs, vpods=(VpodConfig(1, members, mode),),
                   response_timeout_ms=response_ms, send_ack_timeout_ms=response_ms,
                   kernel_quirks=quirks)


def test_export_on_a_import_on_b_and_c(tmp_path):
    """§1.6 I20 and I5, §4.6: B and C import A's handle over the fabric; each gets a real
    dma-buf fd of the BO's size; PRIME_FD_TO_HANDLE gives the NPA BO, which cannot be
    exported (EOPNOTSUPP); a second import on B dedupes (same BO)."""
    with running_pod(tmp_path, config=pod_config(3)) as (a, b, c):
        with Client(a.render()) as ca, Client(b.render()) as cb, Client(c.render()) as cc:
            bo = ca.bo_create(4 << 20)
            handle = ca.export(bo)
            for client in (cb, cc):
                fd = client.import_(handle)
                assert os.lseek(fd, 0, os.SEEK_END) == 4 << 20
                h = client.fd_to_handle(fd)
                with pytest.raises(OSError) as e:
                    client.export(h)
                assert e.value.errno == errno.EOPNOTSUPP
                fd2 = client.import_(handle)
                assert client.fd_to_handle(fd2) == h  # same dma-buf, same handle
                os.close(fd)
                os.close(fd2)
            exports = a.debug(128, "ualink_exports")
            assert "pins=2 importers=1,2" in exports, exports
            assert "state=READY" in b.debug(128, "ualink_imports")


def test_revoke_on_close_reaches_every_importer(tmp_path):
    """§5.7: A closes its handle: B and C get NPA_REVOKE, tear down and release; A frees
    its NPA; a re-import then fails with EINVAL (§6.3)."""
    with running_pod(tmp_path, config=pod_config(3)) as (a, b, c):
        with Client(a.render()) as ca, Client(b.render()) as cb, Client(c.render()) as cc:
            bo = ca.bo_create()
            handle = ca.export(bo)
            for client in (cb, cc):
                os.close(client.import_(handle))
            ca.bo_close(bo)
            assert wait_until(lambda: b.debug(128, "ualink_imports") == ""
                              and c.debug(128, "ualink_imports") == "")
            assert wait_until(lambda: a.debug(128, "ualink_npa").startswith("used_pages=0 "))
            assert a.debug(128, "gem_objects") == ""
            with pytest.raises(OSError) as e:
                cb.import_(handle)
            assert e.value.errno == errno.EINVAL


def test_import_errnos_over_the_fabric(tmp_path):
    """§1.6 I16 (wrong handle_hi → EINVAL after NPA_FAIL), I1 (id ≥ 256 → EINVAL),
    policy 4 (an accel outside the vPod → EACCES)."""
    with running_pod(tmp_path, config=pod_config(3, vpod_members=[0, 1])) as (a, b, c):
        with Client(a.render()) as ca, Client(b.render()) as cb, Client(c.render()) as cc:
            lo, hi = ca.export(ca.bo_create())
            for handle, err in (((lo, hi ^ 1), errno.EINVAL), ((lo | 0x3FF, hi), errno.EINVAL)):
                with pytest.raises(OSError) as e:
                    cb.import_(handle)
                assert e.value.errno == err
            with pytest.raises(OSError) as e:
                cc.import_((lo, hi))  # accel 2 is not in vPod 1
            assert e.value.errno == errno.EOPNOTSUPP  # ... and so it is not ACTIVE
            with pytest.raises(OSError) as e:
                cb.import_(((lo & ~0x3FF) | 2, hi))  # exporter accel 2 outside the vPod
            assert e.value.errno == errno.EACCES


def test_enospc_from_a_tiny_npa_space(tmp_path):
    """§4.3, §1.6 I15: the exporter's NPA space is too small → ENOSPC; nothing stays
    pinned."""
    with running_pod(tmp_path, config=pod_config(2, npa_pages=64)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            small, big = ca.bo_create(64 * 4096), ca.bo_create(1 << 20)
            os.close(cb.import_(ca.export(small)))
            with pytest.raises(OSError) as e:
                cb.import_(ca.export(big))
            assert e.value.errno == errno.ENOSPC
            assert "pins=0" in a.debug(128, "ualink_exports").splitlines()[1]


@pytest.mark.parametrize("mode", [AddrMode.SOURCE_ALIASING, AddrMode.SOURCE_IDENTIFICATION])
def test_both_addressing_modes(tmp_path, mode):
    """§4.2: aliasing shares one NPA range among importers, identification gives each
    importer its own; revoke frees all of them."""
    with running_pod(tmp_path, config=pod_config(3, mode)) as (a, b, c):
        with Client(a.render()) as ca, Client(b.render()) as cb, Client(c.render()) as cc:
            bo = ca.bo_create(1 << 20)
            handle = ca.export(bo)
            os.close(cb.import_(handle))
            os.close(cc.import_(handle))
            npa = a.debug(128, "ualink_npa")
            expect = "used_pages=256 mappings=1" if mode == AddrMode.SOURCE_ALIASING else \
                "used_pages=512 mappings=2"
            assert npa.startswith(expect), npa
            assert a.sysfs(128, "addr_mode") == f"{mode.sysfs}\n"
            ca.bo_close(bo)
            assert wait_until(lambda: a.debug(128, "ualink_npa").startswith("used_pages=0 "))


def test_killed_exporter_and_restart(tmp_path):
    """§5.8a with policy 1, as U behaves (§13: quirks no-restart-probe, npa-req-fail-no-reset
    and send-fail-slow; tests/integration/test_kernel_n_pod.py has N's default): A is
    SIGKILLed while B holds an import: B's import stays until
    a timeout or a HELLO; a new import fails (ETIME: the link is down). A restarts with
    no state: B's first NPA_REQ reaches an A that is not connected, which drops it and
    says HELLO (§5.6 step 1) — that import times out; B answers the HELLO, cleans up what
    it had from the old A and counts a new generation; the next import works."""
    cfg = pod_config(2, quirks=frozenset({"no-restart-probe", "npa-req-fail-no-reset",
                                          "send-fail-slow"}))
    with running_pod(tmp_path, config=cfg) as (a, b):
        with Client(b.render()) as cb:
            with Client(a.render()) as ca:
                handle = ca.export(ca.bo_create())
                os.close(cb.import_(handle))
                a.stop(signal.SIGKILL)
            with pytest.raises(OSError) as e:
                cb.import_((handle[0] ^ 0x400, handle[1]))
            assert e.value.errno in (errno.ETIME, errno.ETIMEDOUT)
            gen_before = b.debug(128, "ualink_peers")
            a2 = start_node(tmp_path / "restart", cfg, "node0")
            try:
                wait_links_up(a2)
                wait_links_up(b)
                with Client(a2.render()) as ca2:
                    h2 = ca2.export(ca2.bo_create())
                    with pytest.raises(OSError) as e:
                        cb.import_(h2)
                    assert e.value.errno == errno.ETIMEDOUT
                    fd = cb.import_(h2)
                    assert os.lseek(fd, 0, os.SEEK_END) == 1 << 20
                    os.close(fd)
                peers = b.debug(128, "ualink_peers")
                assert peers != gen_before and "state=ESTABLISHED" in peers, peers
                # The old import from before the restart was cleaned up by the HELLO.
                assert f"{handle[0]:#018x}" not in b.debug(128, "ualink_imports")
            finally:
                a2.stop()


def test_drop_bitmap_forces_a_reset_and_recovery(tmp_path):
    """§5.12, policy 9: dropping one NPA_RSP makes that import time out (ETIMEDOUT) and
    reset the connection; the next import works."""
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        drop = b.mount / "sys/kernel/debug/dri/128/ualink_drop_msg"
        with Client(a.render()) as ca, Client(b.render()) as cb:
            handle = ca.export(ca.bo_create())
            drop.write_text("0x10")
            assert drop.read_text() == "0x10\n"
            with pytest.raises(OSError) as e:
                cb.import_(handle)
            assert e.value.errno == errno.ETIMEDOUT
            assert drop.read_text() == "0x0\n"
            os.close(cb.import_(handle))


def test_vpod_change_through_sysfs_bounces_the_accel(tmp_path):
    """§5.9, §7.1, policy 8: leaving the vPod (config/vpod_id 0 + commit) deactivates the
    accel (PPOD_CONFIGURED, EOPNOTSUPP), which tears its imports down; joining again
    makes it ACTIVE."""
    with running_pod(tmp_path, config=pod_config(2)) as (a, b):
        cfg = b.mount / "sys/class/drm/renderD128/device/ualink/config"
        with Client(a.render()) as ca, Client(b.render()) as cb:
            handle = ca.export(ca.bo_create())
            os.close(cb.import_(handle))
            (cfg / "vpod_id").write_text("0")
            (cfg / "commit").write_text("true")
            assert b.sysfs(128, "accel_state") == "ppod_configured\n"
            assert b.debug(128, "ualink_imports") == ""
            with pytest.raises(OSError) as e:
                cb.import_(handle)
            assert e.value.errno == errno.EOPNOTSUPP
            (cfg / "vpod_id").write_text("1")
            (cfg / "commit").write_text("true\n")
            assert b.sysfs(128, "accel_state") == "active\n"
            with pytest.raises(OSError) as e:
                (cfg / "addr_mode").write_text("bogus")
            assert e.value.errno == errno.EINVAL


def test_importer_killed_while_exporter_revokes(tmp_path):
    """§6.5, §5.7 steps 6–8: B is SIGKILLed holding an import; A's revoke gets no
    RELEASE: after the response timeout A frees the NPA, unpins, and resets its connection
    to B. (No liveness probing, §5.8a: right after the kill the connection still looks
    ESTABLISHED; 1.5 s timeouts keep that true on a loaded machine.) As U behaves (§13 N4's
    quirk send-fail-slow: the REVOKE waits for the link that is down); N's failing at once
    is test_kernel_n_pod.py's test_n4_n5_a_revoke_to_a_killed_importer_ends_at_once."""
    cfg = pod_config(2, response_ms=1500, quirks=frozenset({"send-fail-slow"}))
    with running_pod(tmp_path, config=cfg) as (a, b):
        with Client(a.render()) as ca:
            bo = ca.bo_create()
            handle = ca.export(bo)
            with Client(b.render()) as cb:
                # The import's dma-buf stays open until B is gone: closed first, B's release
                # of it could reach A before the kill, and A would have nothing to time out.
                fd = cb.import_(handle)
                # B's ACK of the NPA_RSP must reach A before B dies: without it A counts B as
                # no importer (§5.6 step 7) and again has nothing to time out. B's next
                # message to A (a second import's NPA_REQ) goes behind that ACK on the same
                # connection, so once the second import returns, A has the ACK.
                bo2 = ca.bo_create()
                fd2 = cb.import_(ca.export(bo2))
                b.stop(signal.SIGKILL)
                for f in (fd, fd2):
                    with contextlib.suppress(OSError):  # ENOTCONN: B's mount died with it
                        os.close(f)
            ca.bo_close(bo)
            ca.bo_close(bo2)
            assert "state=ESTABLISHED" in a.debug(128, "ualink_peers")
            assert wait_until(lambda: a.debug(128, "ualink_npa").startswith("used_pages=0 "))
            # (the reset follows the NPA's release in a later step of A's: wait for it too)
            assert wait_until(lambda: "state=NOT_READY" in a.debug(128, "ualink_peers"))
            assert a.debug(128, "gem_objects") == ""


def _waiting_import(ca: Client, b, dropped: str
                    ) -> tuple[subprocess.Popen[str], tuple[int, int]]:
    """A client process importing a new export of `ca`'s on `b`, whose `dropped` message
    `b` drops (debugfs ualink_drop_msg), once it waits for it; and the handle."""
    handle = ca.export(ca.bo_create())
    rel = b.mount / "sys/kernel/debug/dri/128/ualink_drop_msg"
    rel.write_text(f"{1 << int(MsgType[dropped]):#x}\n")
    proc = subprocess.Popen([sys.executable, "-c", _IMPORT_CLIENT, b.render(),
                             str(handle[0]), str(handle[1])],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "waiting\n"
        assert wait_until(lambda: "state=" in b.debug(128, "ualink_imports")
                          and int(rel.read_text(), 16) == 0)  # the drop happened
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, handle


def test_importer_stops_while_an_import_waits(tmp_path):
    """§1.6 I13, §6.9: the importing daemon is stopped (SIGTERM) while a client waits for an
    NPA_RSP that never comes: the wait ends at once (the stop answers it, as a signal to
    the caller would), the daemon exits cleanly well before the 5 s response timeout, and
    nothing in its log is a traceback."""
    with running_pod(tmp_path, config=pod_config(2, response_ms=5000)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            os.close(cb.import_(ca.export(ca.bo_create())))  # the connection is up
            proc, _ = _waiting_import(ca, b, "NPA_RSP")
            try:
                start = time.monotonic()
                assert b.stop(timeout=3) == 0
                assert proc.wait(3) == 0
                assert time.monotonic() - start < 3  # (not the 5 s response timeout)
                ret, err = proc.stdout.read().split()
                assert ret == "-1" and int(err) in (errno.EINTR, errno.ENOTCONN), (ret, err)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            log = b.log_text()
            assert "Traceback" not in log and "unexpected exception" not in log, log


def test_tls_fabric(tmp_path):
    """Mutual TLS between daemons when the pod config names a CA; imports work over it."""
    cfg = tls_pod_config(tmp_path, pod_config(2))
    with running_pod(tmp_path, config=cfg) as (a, b):
        with Client(a.render()) as ca_, Client(b.render()) as cb:
            fd = cb.import_(ca_.export(ca_.bo_create()))
            assert os.lseek(fd, 0, os.SEEK_END) == 1 << 20
            os.close(fd)


_IMPORT_CLIENT = """
import ctypes, os, signal, struct, sys
signal.signal(signal.SIGUSR1, lambda *a: None)  # a handler without SA_RESTART: EINTR
libc = ctypes.CDLL(None, use_errno=True)
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
fd = os.open(sys.argv[1], os.O_RDWR)
cmd = (3 << 30) | (24 << 16) | (ord("d") << 8) | 0x5B  # DRM_IOCTL_AMDGPU_UALINK_HANDLE
buf = ctypes.create_string_buffer(struct.pack("<IIQQ", 1, 0, int(sys.argv[2]), int(sys.argv[3])))
print("waiting", flush=True)
ret = libc.ioctl(fd, cmd, buf)
print(ret, ctypes.get_errno(), flush=True)
"""


@pytest.mark.parametrize(("dropped", "after"), [("HELLO_ACK", "NOT_READY"),
                                                ("NPA_RSP", "ESTABLISHED")])
def test_signal_during_an_import_wait(tmp_path, dropped, after):
    """§1.6 I10 / I13: the importer's wait for HELLO_ACK (I10) or NPA_RSP (I13) is interrupted
    by a signal: the caller sees EINTR (the kernel's -ERESTARTSYS without SA_RESTART) at
    once, not after the 5 s timeout; the connection goes to NOT_READY after an interrupted
    HELLO wait and is unchanged after an interrupted NPA wait; the import node is gone, and
    the next import works."""
    with running_pod(tmp_path, config=pod_config(2, response_ms=5000)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            if dropped == "NPA_RSP":  # the connection is up before the import under test
                os.close(cb.import_(ca.export(ca.bo_create())))
            proc, handle = _waiting_import(ca, b, dropped)
            try:
                proc.send_signal(signal.SIGUSR1)
                assert proc.wait(3) == 0  # well before the 5 s response timeout
                assert proc.stdout.read().split() == ["-1", str(errno.EINTR)]
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            assert b.debug(128, "ualink_imports").count("state=") == (dropped == "NPA_RSP")
            assert f"state={after}" in b.debug(128, "ualink_peers")
            os.close(cb.import_(handle))  # a retry (what libdrm does on EINTR) works
