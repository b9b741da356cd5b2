"""Test harness: real `ualinkd node` processes on real FUSE mounts, and libualink via cffi.

Every daemon started here is stopped, and its mount cleared, even when the test fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import cffi
import pytest

from ualinkd import sysfs
from ualinkd.config import PodConfig
from ualinkd.fuse.lowlevel import clear_stale_mount, fuse_mounts_at
from ualinkd.netns.agent import libualink_cdef
from ualinkd.readiness import notify_socket, wait_ready

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "libualink_c" / "build"
SHIM = BUILD / "libualink_shim.so"  # the LD_PRELOAD shim the unmodified clients run through
# The libhsakmt programs are built only where Debian's libhsakmt-dev is (libualink_c/Makefile).
NEEDS_HSAKMT = pytest.mark.skipif(not Path("/usr/include/hsakmt.h").exists(),
                                  reason="libhsakmt-dev is not installed (make apt installs it)")


def c_program(name: str) -> str:
    path = BUILD / name
    if not path.exists():
        subprocess.run(["make", "-s", "-C", str(REPO / "libualink_c")], check=True)
    return str(path)


_MNT_FORCE = 1


def force_unmount(mount: Path) -> None:
    """umount -f: for FUSE this aborts the connection (fuse_umount_begin), failing every
    request in flight, which frees whatever waits on the server, the server itself included;
    then the mount is detached (fusermount -u -z)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2(os.fsencode(str(mount)), _MNT_FORCE)
    if fuse_mounts_at(str(mount)):
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=10)


class Node:
    def __init__(self, proc: subprocess.Popen[str], mount: Path, log: Path, out: Path) -> None:
        self.proc = proc
        self.mount = mount
        self.log = log
        self.out = out

    def render(self, index: int = 0) -> str:
        return str(self.mount / "dri" / f"renderD{sysfs.RENDER_MINOR_BASE + index}")

    def debug(self, minor: int, name: str) -> str:
        return (self.mount / sysfs.debugfs_file(minor, name)).read_text()

    def sysfs(self, minor: int, name: str) -> str:
        return (self.mount / sysfs.ualink_file(minor, name)).read_text()

    def log_text(self) -> str:
        return self.log.read_text()

    def close(self) -> None:
        """Stop the daemon and clear its mount if it left one (a test's cleanup)."""
        self.stop()
        if fuse_mounts_at(str(self.mount)):
            clear_stale_mount(self.mount)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                # A daemon stuck in the kernel (waiting on a FUSE request, maybe its own)
                # ignores even SIGKILL until its connection is aborted.
                force_unmount(self.mount)
                self.proc.kill()
                self.proc.wait(timeout)
        return self.proc.returncode


def start_node(
    tmp: Path, config: PodConfig, name: str, trace: str | None = None, timeout: float = 20,
    prefix: list[str] | None = None,
) -> Node:
    """One `ualinkd node`, ready (READY=1); `prefix` wraps its command (e.g. setpriv)."""
    tmp.mkdir(parents=True, exist_ok=True)
    conf = tmp / f"{name}.toml"
    conf.write_text(config.to_toml())
    mount = tmp / f"mnt-{name}"
    notify = tmp / f"notify-{name}"
    sock = notify_socket(notify)
    log, out = tmp / f"{name}.log", tmp / f"{name}.out"
    cmd = [*(prefix or []), sys.executable, "-m", "ualinkd", "node", "--config", str(conf),
           "--node", name, "--mount", str(mount)]
    if trace:
        cmd.append(f"--trace={trace}")
    with open(log, "w") as logf, open(out, "w") as outf:
        proc = subprocess.Popen(cmd, stdout=outf, stderr=logf, text=True,
                                env=dict(os.environ, NOTIFY_SOCKET=str(notify)))
    node = Node(proc, mount, log, out)
    try:
        if not wait_ready(sock, proc, timeout):
            node.stop()
            raise RuntimeError(f"node {name} did not start:\n{log.read_text()}")
        return node
    finally:
        sock.close()


@contextlib.contextmanager
def recording(mounts: list[Path], out: Path) -> Iterator[None]:
    """`ualinkd record --mount … -o out` attached to running nodes for the block: it has
    said "recording" when the block starts; after it, the last lines get time to arrive and
    SIGINT stops it (it must exit 0). Killed if the block fails."""
    cmd = [sys.executable, "-m", "ualinkd", "record"]
    for m in mounts:
        cmd += ["--mount", str(m)]
    rec = subprocess.Popen([*cmd, "-o", str(out)], stderr=subprocess.PIPE, text=True)
    try:
        assert rec.stderr is not None
        assert rec.stderr.readline().strip() == "recording"
        yield
        time.sleep(0.5)  # the last lines on their way through the sockets
        rec.send_signal(signal.SIGINT)
        assert rec.wait(30) == 0
    finally:
        if rec.poll() is None:
            rec.kill()
            rec.wait()


@contextlib.contextmanager
def running_node(
    tmp: Path, config: PodConfig | None = None, name: str = "node0", trace: str | None = None
) -> Iterator[Node]:
    config = config or PodConfig.local(1, 1)
    node = start_node(tmp, config, name, trace)
    try:
        yield node
    finally:
        node.close()
        assert not fuse_mounts_at(str(node.mount)), "mount left behind"


def stop_process(pid: int) -> None:
    """SIGSTOP `pid` and return once every thread of it is stopped: the signal takes effect
    when the kernel gets to each thread, and a daemon's thread still running meanwhile (the
    data plane's C thread answers a GPU access in microseconds) would serve what a test
    sends it next as if it had not been stopped."""
    os.kill(pid, signal.SIGSTOP)

    def state(tid: str) -> str:
        try:
            return open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:  # (a thread that ended meanwhile)
            return "T"
    assert wait_until(lambda: all(state(t) == "T" for t in os.listdir(f"/proc/{pid}/task")),
                      10), f"process {pid} did not stop"


def wait_until(pred: Callable[[], object], timeout: float = 5.0) -> bool:
    """Poll `pred` until it is true (True) or `timeout` seconds passed (its last answer)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return bool(pred())


def tls_pod_config(tmp: Path, base: PodConfig) -> PodConfig:
    """`base` with mutual TLS: a CA (trustme) in `tmp` and a certificate for each node."""
    import trustme

    ca = trustme.CA()
    ca_path = tmp / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    nodes = []
    for n in base.nodes:
        cert = ca.issue_cert("127.0.0.1", n.name)
        cert_path, key_path = tmp / f"{n.name}.pem", tmp / f"{n.name}.key"
        cert.cert_chain_pems[0].write_to_path(str(cert_path))
        cert.private_key_pem.write_to_path(str(key_path))
        nodes.append(replace(n, tls_cert=str(cert_path), tls_key=str(key_path)))
    return replace(base, nodes=tuple(nodes), tls_ca=str(ca_path))


@contextlib.contextmanager
def render_fd(node: Node, index: int = 0) -> Iterator[int]:
    """An open (O_RDWR) of the node's render node, closed afterwards."""
    fd = os.open(node.render(index), os.O_RDWR)
    try:
        yield fd
    finally:
        os.close(fd)


def wait_links_up(node: Node, timeout: float = 10) -> None:
    """Until the node's fabric links to every peer are up (sys/kernel/debug/ualink_fabric)."""
    status = node.mount / sysfs.FABRIC_STATUS
    deadline = time.monotonic() + timeout
    while not all(sysfs.parse_fabric(text := status.read_text()).values()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"fabric links still down:\n{text}")
        time.sleep(0.02)


@contextlib.contextmanager
def running_pod(
    tmp: Path, nodes: int = 2, config: PodConfig | None = None, trace: str | None = None
) -> Iterator[list[Node]]:
    """Every node of a pod as its own daemon process, talking TCP on 127.0.0.1."""
    from ualinkd.cli.main import free_tcp_ports

    config = config or PodConfig.local(nodes, 1, free_tcp_ports(nodes))
    started: list[Node] = []
    try:
        for n in config.nodes:
            started.append(start_node(tmp, config, n.name, trace))
        for node in started:
            wait_links_up(node)
        yield started
    finally:
        for node in started:
            node.close()


# ---- libualink through cffi (ABI mode over the built shared library) ------------------------

ffi = cffi.FFI()
ffi.cdef(libualink_cdef())
_lib = None


def lib() -> object:
    global _lib
    if _lib is None:
        c_program("libualink.so")
        _lib = ffi.dlopen(str(BUILD / "libualink.so"))
    return _lib


def _check(rc: int) -> int:
    if rc < 0:
        raise OSError(-rc, os.strerror(-rc))
    return rc


class Client:
    """One open render node (a DrmFile in the daemon) driven through libualink."""

    def __init__(self, path: str) -> None:
        self.lib = lib()
        out = ffi.new("ualink_dev **")
        _check(self.lib.ualink_open(path.encode(), out))
        self.dev = out[0]

    def close(self) -> None:
        if self.dev is not None:
            self.lib.ualink_close(self.dev)
            self.dev = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def fd(self) -> int:
        return self.lib.ualink_fd(self.dev)

    def bo_create(self, size: int = 1 << 20, domains: int = 4, flags: int = 0) -> int:
        h = ffi.new("uint32_t *")
        _check(self.lib.ualink_bo_create(self.dev, size, 0, domains, flags, h))
        return h[0]

    def bo_close(self, handle: int) -> None:
        _check(self.lib.ualink_bo_close(self.dev, handle))

    def export(self, gem_handle: int) -> tuple[int, int]:
        h = ffi.new("uint64_t[2]")
        _check(self.lib.ualink_export(self.dev, gem_handle, h))
        return h[0], h[1]

    def import_(self, handle: tuple[int, int]) -> int:
        h = ffi.new("uint64_t[2]", list(handle))
        fd = ffi.new("int *")
        _check(self.lib.ualink_import(self.dev, h, fd))
        return fd[0]

    def handle_to_fd(self, gem_handle: int, flags: int = os.O_CLOEXEC | os.O_RDWR) -> int:
        fd = ffi.new("int *")
        _check(self.lib.ualink_prime_handle_to_fd(self.dev, gem_handle, flags, fd))
        return fd[0]

    def fd_to_handle(self, fd: int) -> int:
        h = ffi.new("uint32_t *")
        _check(self.lib.ualink_prime_fd_to_handle(self.dev, fd, h))
        return h[0]

    def va_map(self, gem_handle: int, va: int, size: int, offset: int = 0,
               flags: int = 0x6) -> None:
        """GEM_VA MAP (flags default READABLE | WRITEABLE)."""
        _check(self.lib.ualink_va_map(self.dev, gem_handle, va, offset, size, flags))

    def va_unmap(self, gem_handle: int, va: int, size: int, offset: int = 0) -> None:
        _check(self.lib.ualink_va_unmap(self.dev, gem_handle, va, offset, size))

    def gpu_read(self, va: int, size: int) -> bytes:
        """One pread at offset = GPU VA (a GPU load; may come back short, policy 10)."""
        return os.pread(self.fd, size, va)

    def gpu_write(self, va: int, data: bytes) -> int:
        """One pwrite at offset = GPU VA (a GPU store); the count written."""
        return os.pwrite(self.fd, data, va)


def call(fd: int, cmd: int, data: bytes) -> bytes:
    """A raw ioctl(2) on `fd` with `data` as the argument: the bytes copied back."""
    buf = bytearray(data)
    fcntl.ioctl(fd, cmd, buf)
    return bytes(buf)


def call_errno(fd: int, cmd: int, data: bytes) -> tuple[int, bytes]:
    """A raw ioctl(2) that may fail: (0 or its errno, the buffer after the call)."""
    buf = bytearray(data)
    try:
        fcntl.ioctl(fd, cmd, buf)
    except OSError as e:
        return e.errno, bytes(buf)
    return 0, bytes(buf)


def errno_of(fd: int, cmd: int, data: bytes) -> int:
    """The errno of a raw ioctl(2) that must fail."""
    with pytest.raises(OSError) as ei:
        call(fd, cmd, data)
    return ei.value.errno
