"""A real `ualinkd node` on a real FUSE mount, driven by C clients (libualink via cffi, and
compiled programs). Spec sections in each docstring."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap

import pytest
from nodes import Client, c_program, running_node

from ualinkd.config import AccelConfig, NodeConfig, PodConfig
from ualinkd.fuse.lowlevel import fuse_mounts_at
from ualinkd.ualink.state import ConfigStage

UALINK = 0xC018645B
DOMAIN_GTT, DOMAIN_VRAM = 0x2, 0x4
VM_ALWAYS_VALID = 1 << 6

pytestmark = pytest.mark.integration


@pytest.fixture
def node(tmp_path):
    with running_node(tmp_path) as n:
        yield n


def test_export_idempotent_and_handle_format(node):
    """§1.6 E3/E7, §3.2: accel id in the low 10 bits, handle_lo != 0, same handle again."""
    with Client(node.render()) as c:
        bo = c.bo_create(2 << 20)
        lo, hi = c.export(bo)
        assert lo & 0x3FF == 0 and lo != 0
        assert c.export(bo) == (lo, hi)
        assert f"{lo:#018x} {hi:#018x}" in node.debug(128, "ualink_exports")


def test_export_errnos(node):
    """§1.6 E1 (ENOENT), E2 (EOPNOTSUPP for GTT-only), E5 (EPERM for VM_ALWAYS_VALID)."""
    with Client(node.render()) as c:
        with pytest.raises(OSError) as e:
            c.export(77)
        assert e.value.errno == errno.ENOENT
        gtt = c.bo_create(4096, DOMAIN_GTT)
        with pytest.raises(OSError) as e:
            c.export(gtt)
        assert e.value.errno == errno.EOPNOTSUPP
        always_valid = c.bo_create(4096, DOMAIN_VRAM, VM_ALWAYS_VALID)
        with pytest.raises(OSError) as e:
            c.export(always_valid)
        assert e.value.errno == errno.EPERM


def test_idempotent_across_two_processes(node, tmp_path):
    """§3.4: another process holding the same BO (via a dma-buf fd passed to it) exports
    the identical 128-bit handle."""
    with Client(node.render()) as c:
        bo = c.bo_create()
        handle = c.export(bo)
        fd = c.handle_to_fd(bo)
        script = textwrap.dedent(f"""
            import sys; sys.path.insert(0, {os.path.dirname(__file__)!r})
            from nodes import Client
            with Client({node.render()!r}) as c:
                h = c.fd_to_handle({fd})
                print(*c.export(h))
        """)
        out = subprocess.run([sys.executable, "-c", script], pass_fds=[fd], check=True,
                             capture_output=True, text=True).stdout
        os.close(fd)
        assert tuple(int(x) for x in out.split()) == handle


def test_local_import_token_fd_and_same_bo(node):
    """§1.6 I2/I2c, policy 5: a local import gives a token the library turns into a real
    fd; lseek(SEEK_END) is the BO size; PRIME_FD_TO_HANDLE gives a handle to the same BO
    (exporting it again yields the same UALink handle)."""
    with Client(node.render()) as a, Client(node.render()) as b:
        bo = a.bo_create(3 << 20)
        handle = a.export(bo)
        fd = b.import_(handle)
        try:
            assert os.lseek(fd, 0, os.SEEK_END) == 3 << 20
            h = b.fd_to_handle(fd)
            assert b.fd_to_handle(fd) == h  # same file, same dma-buf: same handle (§2.5)
            assert b.export(h) == handle
            fd2 = b.import_(handle)  # a second import: a new fd of the same dma-buf
            assert b.fd_to_handle(fd2) == h
            os.close(fd2)
        finally:
            os.close(fd)


def test_handle_free_on_close_revokes(node):
    """§6.4, §5.7 step 2: GEM_CLOSE of the last handle revokes; a local import of the
    handle then fails with EINVAL (§1.6 I2b) and the BO is freed."""
    with Client(node.render()) as a, Client(node.render()) as b:
        bo = a.bo_create()
        handle = a.export(bo)
        a.bo_close(bo)
        assert node.debug(128, "ualink_exports") == ""
        assert node.debug(128, "gem_objects") == ""
        with pytest.raises(OSError) as e:
            b.import_(handle)
        assert e.value.errno == errno.EINVAL


def test_dmabuf_keeps_bo_alive_after_revoke(node):
    """§6.8: a dma-buf fd handed out by a local import keeps the BO alive after the
    exporter's handle count reaches 0; the export itself is gone."""
    with Client(node.render()) as a, Client(node.render()) as b:
        bo = a.bo_create()
        handle = a.export(bo)
        fd = b.import_(handle)
        a.bo_close(bo)
        assert node.debug(128, "ualink_exports") == ""
        assert "size=1048576" in node.debug(128, "gem_objects")
        os.close(fd)
        assert node.debug(128, "gem_objects") == ""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_client_leaves_nothing(node, sig):
    """§6.6: process exit closes its DRM files; handle_free runs; exports are revoked;
    its dma-buf fds are released."""
    script = textwrap.dedent(f"""
        import sys, os; sys.path.insert(0, {os.path.dirname(__file__)!r})
        from nodes import Client
        c = Client({node.render()!r})
        bos = [c.bo_create(1 << 16) for _ in range(5)]
        h = c.export(bos[0])
        fds = [c.handle_to_fd(b) for b in bos[:3]]
        fd = c.import_(h)
        print(hex(h[0]), hex(h[1]), flush=True)
        sys.stdin.read()
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    lo, hi = (int(x, 16) for x in p.stdout.readline().split())
    assert node.debug(128, "ualink_exports").startswith(f"{lo:#018x}")
    p.send_signal(sig)
    p.wait(10)
    assert node.debug(128, "ualink_exports") == ""
    assert node.debug(128, "gem_objects") == ""
    assert node.debug(128, "clients") == ""
    with Client(node.render()) as c, pytest.raises(OSError) as e:
        c.import_((lo, hi))
    assert e.value.errno == errno.EINVAL


def _raw(fd: int, cmd: int, data: bytes) -> tuple[int, bytes]:
    buf = bytearray(data)
    try:
        fcntl.ioctl(fd, cmd, buf)
    except OSError as e:
        return -e.errno, bytes(buf)
    return 0, bytes(buf)


def test_copy_back_bytes_exact(node):
    """§1.4: export success writes bytes 0–15 only; failure echoes all 24 bytes; unknown
    op → EINVAL with the input echoed; a short (16-byte) struct is zero-extended and
    truncated; a long (32-byte) one has its tail echoed; flags are ignored (§1.5)."""
    with Client(node.render()) as c:
        bo = c.bo_create()
        lo, hi = c.export(bo)
        tail = bytes(range(0xA0, 0xA8))
        rc, out = _raw(c.fd, UALINK, struct.pack("<III", 0, 0xFFFF, bo) + b"\x11" * 4 + tail)
        assert rc == 0 and out == struct.pack("<QQ", lo, hi) + tail
        bad = struct.pack("<II", 7, 3) + bytes(range(16))
        assert _raw(c.fd, UALINK, bad) == (-errno.EINVAL, bad)
        enoent = struct.pack("<III", 0, 0, 999) + bytes(12)
        assert _raw(c.fd, UALINK, enoent) == (-errno.ENOENT, enoent)
        short_cmd = (3 << 30) | (16 << 16) | (0x64 << 8) | 0x5B
        rc, out = _raw(c.fd, short_cmd, struct.pack("<III", 0, 0, bo) + bytes(4))
        assert rc == 0 and out == struct.pack("<QQ", lo, hi)
        long_cmd = (3 << 30) | (32 << 16) | (0x64 << 8) | 0x5B
        extra = b"\xa5" * 8
        rc, out = _raw(c.fd, long_cmd, struct.pack("<III", 0, 0, bo) + bytes(12) + extra)
        assert rc == 0 and out == struct.pack("<QQ", lo, hi) + bytes(8) + extra


def test_abi_probe_program(node):
    """§1.4 through a compiled C program calling ioctl(2) directly."""
    out = subprocess.run([c_program("ualink_abi_probe"), node.render()], check=True,
                         capture_output=True, text=True).stdout
    cases = dict(line.split(" ", 1) for line in out.splitlines() if line.startswith("case="))
    assert cases, out
    for name, rest in cases.items():
        assert "ret=" in rest, (name, rest)
    assert "ret=-22" in cases["case=unknown_op"] or "ret=-EINVAL" in cases["case=unknown_op"]


def test_eopnotsupp_before_active(tmp_path):
    """§1.6 step 1, §11.1: an accel that is not ACTIVE answers EOPNOTSUPP, even for an
    unknown op, and echoes the buffer."""
    cfg = PodConfig.local(1, 1)
    cfg = PodConfig(cfg.uuid, cfg.key, (NodeConfig("node0", "127.0.0.1:0",
                    (AccelConfig(0, stage=ConfigStage.PPOD),)),), cfg.vpods, cfg.ppod_size)
    with running_node(tmp_path, cfg) as n:
        assert n.sysfs(128, "accel_state") == "ppod_configured\n"
        with Client(n.render()) as c:
            bo = c.bo_create()
            for op in (0, 1, 7):
                data = struct.pack("<III", op, 0, bo) + bytes(12)
                assert _raw(c.fd, UALINK, data) == (-errno.EOPNOTSUPP, data)


def test_sysfs_files(node):
    """§7.1: the 12 read-only files with their exact formats."""
    expect = {
        "link_type": "UALoE\n", "accel_id": "0\n", "accel_state": "active\n",
        "vpod_id": "1\n", "vpod_size": "1\n", "vpod_active_accels": "0\n",
        "addr_mode": "source-aliasing\n", "local_accels": "0\n", "ppod_size": "1\n",
        "bandwidth": "100\n", "latency": "1\n",
    }
    for name, value in expect.items():
        assert node.sysfs(128, name) == value, name
    ppod = node.sysfs(128, "ppod_id")
    assert len(ppod) == 37 and ppod == ppod.lower()
    with pytest.raises(PermissionError):
        (node.mount / "sys/class/drm/renderD128/device/ualink/accel_state").write_text("x")


def test_hammer_random_ioctls_then_still_serves(node):
    """Bad input loses nothing: 10,000 random ioctls, then exports still work, no GEM
    object is leaked once the hammer's file is closed, and no traceback was logged."""
    out = subprocess.run([c_program("ioctl_hammer"), node.render(), "10000", "1234"],
                         check=True, capture_output=True, text=True, timeout=300).stdout
    assert "hammer: 10000 ioctls" in out
    assert node.debug(128, "gem_objects") == ""
    assert node.debug(128, "clients") == ""
    with Client(node.render()) as c:
        bo = c.bo_create()
        assert c.export(bo)[0] & 0x3FF == 0
    log = node.log_text()
    assert "Traceback" not in log and " BUG " not in log


def test_trace_json(tmp_path):
    """--trace=json: one JSON object per ioctl with the decoded fields."""
    with running_node(tmp_path, trace="json") as n, Client(n.render()) as c:
        bo = c.bo_create(8192)
        c.export(bo)
        with pytest.raises(OSError):
            c.export(bo + 5)
    lines = [json.loads(line) for line in n.out.read_text().splitlines()]
    assert lines[0]["type"] == "open" and lines[0]["path"] == "dri/renderD128"
    records = [r for r in lines if r["type"] == "ioctl"]
    assert {r["file"] for r in records} == {lines[0]["file"]}
    names = [r["ioctl"] for r in records]
    assert names[:3] == ["AMDGPU_GEM_CREATE", "AMDGPU_UALINK_HANDLE", "AMDGPU_UALINK_HANDLE"]
    assert records[0]["in"]["bo_size"] == 8192 and records[0]["result"] == 0
    assert records[1]["in"] == {"op": {"value": 0, "name": "EXPORT"},
                                "flags": {"value": 0, "names": []}, "gem_handle": bo}
    assert records[2]["errno"] == "ENOENT"


def test_sigterm_unmounts_and_stale_mount_is_cleared(tmp_path):
    """A SIGTERM'd node unmounts; a SIGKILL'd node leaves a dead mount that the next
    start on the same directory clears."""
    with running_node(tmp_path) as n:
        assert n.stop(signal.SIGTERM) == 0
        assert not fuse_mounts_at(str(n.mount))
    with running_node(tmp_path) as n:
        n.stop(signal.SIGKILL)
        assert fuse_mounts_at(str(n.mount))  # dead mount left behind
        with running_node(tmp_path) as n2, Client(n2.render()) as c:
            assert c.export(c.bo_create())[0] != 0


def test_pod_command_starts_and_stops_cleanly(tmp_path):
    """`ualinkd pod` (DESIGN Interfaces): one process per node, a ready line per node
    once the fabric links are up, a cross-node import works, SIGINT unmounts everything
    and exits 0."""
    root = tmp_path / "pod"
    proc = subprocess.Popen([sys.executable, "-m", "ualinkd", "pod", "--nodes", "2",
                             "--root", str(root)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        ready = [proc.stdout.readline() for _ in range(2)]
        assert [line.split()[0] for line in ready] == ["node0", "node1"], ready
        assert "mount=" in ready[0] and "accels=0" in ready[0]
        with Client(str(root / "node0/dri/renderD128")) as a, \
                Client(str(root / "node1/dri/renderD128")) as b:
            os.close(b.import_(a.export(a.bo_create())))
        assert (root / "pod.toml").stat().st_mode & 0o777 == 0o600  # it holds the pod key
        # A second node0 of the same pod: its fabric port is taken, and it says so in one line.
        r = subprocess.run([sys.executable, "-m", "ualinkd", "node", "--config",
                            str(root / "pod.toml"), "--node", "node0", "--mount",
                            str(tmp_path / "second")], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 1, r.stderr
        address = PodConfig.load(root / "pod.toml").node("node0").address
        assert f"ualinkd: node0: fabric address {address} is in use" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
        assert not fuse_mounts_at(str(root / "node0"))
        assert not fuse_mounts_at(str(root / "node1"))
        assert sorted(p.name for p in root.iterdir()) == [".nodes.json", "node0", "node1",
                                                          "pod.toml"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_ualinkctl_state(node):
    """`ualinkctl` reads a running node through its mount."""
    from ualinkd.cli import ctl

    out = subprocess.run([sys.executable, "-c", "from ualinkd.cli.ctl import entry; entry()",
                          "--mount", str(node.mount), "--json", "state"],
                         check=True, capture_output=True, text=True).stdout
    accels = json.loads(out)["accels"]
    assert accels[0]["render"] == "renderD128" and accels[0]["accel_state"] == "active"
    assert ctl.main(["--mount", str(node.mount), "state"]) == 0


def test_node_without_subcommand_is_node(tmp_path):
    """DESIGN "Pod configuration": `ualinkd --config pod.toml --node NAME --mount DIR`."""
    from ualinkd.cli.main import build_parser, main

    assert main(["--config", str(tmp_path / "missing.toml"), "--node", "n", "--mount",
                 str(tmp_path / "m")]) == 2  # parsed as `node`: the config is missing
    for argv in (["-v", "--node", "n", "--config", str(tmp_path / "missing.toml")],
                 ["--mount", str(tmp_path / "m"), f"--config={tmp_path / 'missing.toml'}",
                  "--node", "n"],
                 ["-v", "--config", str(tmp_path / "missing.toml"), "--node", "node"]):
        # any order, -v in front, values that spell a subcommand ("node", "pod")
        assert main([*argv, "--mount", str(tmp_path / "pod")] if "--mount" not in argv
                    else argv) == 2
    assert build_parser().parse_args(["node", "--config", "c", "--node", "n", "--mount",
                                      "m"]).command == "node"
