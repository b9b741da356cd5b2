"""Shared builders for the unit tier: pods, nodes and ioctl wrappers (no I/O, no sleeping).

A test node resolves a caller's "fd" to the dma-buf key of the same number, so an opened
token's key doubles as the fd passed to PRIME_FD_TO_HANDLE.
"""

from __future__ import annotations

import errno
import functools
import json
import struct
import uuid
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import trio

from ualinkd.abi import constants as c
from ualinkd.abi import structs as st
from ualinkd.abi.ioc import ioc, iow, iowr
from ualinkd.config import PodConfig
from ualinkd.drm.completion import Completion
from ualinkd.drm.device import Caller, DrmDevice, IoctlResult
from ualinkd.drm.errors import DrmError
from ualinkd.drm.file import DrmFile
from ualinkd.node import NodeCore, NodeServices

MIB = 1 << 20
POD_UUID = uuid.UUID("0123ABCD-4567-89AB-CDEF-0123456789AB")
CALLER = Caller(pid=4242, uid=1000)
OTHER_UID = Caller(pid=4343, uid=1001)

GEM_CLOSE = iow(0x09, 8)
GET_CAP = iowr(0x0C, 16)
PRIME_HANDLE_TO_FD = iowr(0x2D, 12)
PRIME_FD_TO_HANDLE = iowr(0x2E, 12)
GEM_CREATE = iowr(0x40, 32)
GEM_MMAP = iowr(0x41, 8)
GEM_VA = iow(0x48, 64)
GEM_OP = iowr(0x50, 24)
UALINK = ioc(3, 0x64, 0x5B, 24)
assert UALINK == 0xC018645B

PRIME_FLAGS = c.DRM_CLOEXEC | c.DRM_RDWR


def pod_doc(
    nodes: Iterable[Iterable[dict]] = (({"id": 0},), ({"id": 5},)),
    vpods: Iterable[dict] | None = None,
    quirks: Iterable[str] = (),
    **pod: object,
) -> dict:
    """A pod description for PodConfig.from_dict; by default every accel is in vPod 1."""
    node_list = [
        {"name": f"node{i}", "address": f"127.0.0.1:{7000 + i}", "accels": list(accels)}
        for i, accels in enumerate(nodes)
    ]
    if vpods is None:
        vpods = [{"id": 1, "members": sorted(a["id"] for n in node_list for a in n["accels"])}]
    return {
        "pod": {"uuid": str(POD_UUID), "key": "ab" * 32, "kernel_quirks": list(quirks), **pod},
        "nodes": node_list,
        "vpods": list(vpods),
    }


def pod_config(**kw: object) -> PodConfig:
    return PodConfig.from_dict(pod_doc(**kw), "<test>")  # type: ignore[arg-type]


class CopyToUserFake:
    """Records copy_to_user writes; `fault` makes every write EFAULT."""

    def __init__(self) -> None:
        self.writes: list[tuple[int, int, bytes]] = []
        self.fault = False

    async def __call__(self, pid: int, address: int, data: bytes) -> None:
        from ualinkd.drm.errors import DrmError

        if self.fault:
            raise DrmError(errno.EFAULT)
        self.writes.append((pid, address, data))


def make_node(
    config: PodConfig | None = None,
    node: str = "node0",
    randbits: Callable[[int], int] | None = None,
    copy_to_user: CopyToUserFake | None = None,
) -> NodeCore:
    return NodeCore(config or pod_config(), node, NodeServices(
        resolve_fd=lambda pid, fd: fd,
        copy_to_user=copy_to_user,
        randbits=randbits,
    ))


def attach_remote_access(core: NodeCore, remote_access: Any) -> None:
    """Attach a fabric, as an agent does (NodeCore.attach_fabric), whose only service is
    the GPU loads/stores of imported NPA BOs, answered at once: `remote_access(accel,
    piece, write, data)` returns the loaded bytes or the count stored, or raises DrmError,
    and the agent's Completion is done when it returns. These tests import nothing, so an
    import that waits on it fails the test."""

    def no_imports(mgr: Any, flow: Any) -> Any:
        raise AssertionError("this test's fabric carries no imports")

    def access(accel: int, piece: Any, write: bool, data: bytes | None = None
               ) -> Completion[Any]:
        c: Completion[Any] = Completion()
        try:
            c.set_result(remote_access(accel, piece, write, data))
        except DrmError as e:
            c.set_error(e)
        return c

    core.attach_fabric(core.after_request, no_imports, access)


def device(core: NodeCore, index: int = 0) -> DrmDevice:
    return list(core.devices.values())[index]


def open_file(core: NodeCore, index: int = 0, caller: Caller = CALLER) -> DrmFile:
    return core.open_render(core.render_minors()[index], caller)


def ioctl(f: DrmFile, cmd: int, data: bytes, caller: Caller = CALLER) -> IoctlResult:
    return f.device.ioctl(f, cmd, data, caller)  # type: ignore[return-value]  # see run()


def run(aw: Any) -> Any:
    """The value of an answer that is in already: a Completion's (its coroutine ran at once,
    with no edge: completion.run_now, the fakes of caller memory answering at once), or an
    awaitable driven whose awaits never suspend, without trio; a plain value as it is."""
    if isinstance(aw, Completion):
        while not aw.done and _unstarted:  # (its own coroutine, or those it waits for)
            c = next(iter(_unstarted))  # (the oldest first)
            _ended(c, functools.partial(run, _unstarted.pop(c)))
        return aw.result()
    if not isinstance(aw, Awaitable):
        return aw
    coro = aw.__await__()
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise AssertionError("the coroutine suspended")


# The coroutines lazy_spawn adapted, not started yet, by the Completion that answers them.
_unstarted: dict[Completion[Any], Awaitable[Any]] = {}


def lazy_spawn(aw: Awaitable[Any]) -> Completion[Any]:
    """A Spawn for tests whose waits suspend (the daemon's is its FUSE session's): the
    coroutine runs when the test asks for the answer, in the test's own task, as it did when
    the core handed coroutines up: `run` drives it without trio (the fakes answer at once),
    `answer` awaits it under trio (cancelled, the wait is given up)."""
    c: Completion[Any] = Completion()
    _unstarted[c] = aw
    return c


def _ended(c: Completion[Any], step: Callable[[], Any]) -> None:
    try:
        got = step()
    except Exception as e:
        c.set_error(e)
    else:
        c.set_result(got)


async def answer(got: Any) -> Any:
    """Await an answer under trio: a Completion's value (a lazy_spawn one's coroutine run
    here); a value as it is."""
    if not isinstance(got, Completion):
        return got
    while not got.done and _unstarted:  # (its own coroutine, or those it waits for)
        c = next(iter(_unstarted))  # (the oldest first)
        aw = _unstarted.pop(c)
        try:
            value = await aw
        except Exception as e:
            c.set_error(e)
        else:
            c.set_result(value)
    if not got.done:
        ended = trio.Event()
        got.when_done(lambda _: ended.set())
        await ended.wait()
    return got.result()


def u32(data: bytes, off: int = 0) -> int:
    return int.from_bytes(data[off : off + 4], "little")


# ---- one wrapper per ioctl: the raw result, or the value on success --------------------------


def gem_create_raw(
    f: DrmFile, size: int = 4096, domains: int = c.DOMAIN_VRAM, flags: int = 0,
    alignment: int = 0,
) -> IoctlResult:
    return ioctl(f, GEM_CREATE, st.GEM_CREATE_IN.encode(
        st.GemCreateIn(size, alignment, domains, flags)))


def gem_create(f: DrmFile, size: int = 4096, domains: int = c.DOMAIN_VRAM, flags: int = 0) -> int:
    r = gem_create_raw(f, size, domains, flags)
    assert r.result == 0, r
    return u32(r.out)


def gem_close_raw(f: DrmFile, handle: int) -> IoctlResult:
    return ioctl(f, GEM_CLOSE, struct.pack("<II", handle, 0))


def gem_close(f: DrmFile, handle: int) -> None:
    r = gem_close_raw(f, handle)
    assert r.result == 0, r


def prime_to_fd_raw(f: DrmFile, handle: int, flags: int = PRIME_FLAGS,
                    caller: Caller = CALLER) -> IoctlResult:
    return ioctl(f, PRIME_HANDLE_TO_FD, struct.pack("<IIi", handle, flags, -1), caller)


def prime_to_token(f: DrmFile, handle: int, caller: Caller = CALLER) -> int:
    r = prime_to_fd_raw(f, handle, caller=caller)
    assert r.result == 0, r
    return struct.unpack("<IIi", r.out)[2] & 0xFFFFFFFF


def open_token(core: NodeCore, token: int, caller: Caller = CALLER) -> int:
    """What opening <mount>/dmabuf/<token> does: lookup then open; returns the key."""
    key, _size = core.dmabuf_lookup(str(token), caller)
    return core.tokens.open(key, caller.uid)


def prime_from_fd_raw(f: DrmFile, fd: int, caller: Caller = CALLER) -> IoctlResult:
    return ioctl(f, PRIME_FD_TO_HANDLE, struct.pack("<IIi", 0, 0, fd), caller)


def prime_from_fd(f: DrmFile, fd: int, caller: Caller = CALLER) -> int:
    r = prime_from_fd_raw(f, fd, caller)
    assert r.result == 0, r
    return u32(r.out)


def ualink_export_raw(f: DrmFile, gem_handle: int, flags: int = 0,
                      tail: bytes = bytes(12)) -> IoctlResult:
    return ioctl(f, UALINK, struct.pack("<III", 0, flags, gem_handle) + tail)


def ualink_export(f: DrmFile, gem_handle: int) -> tuple[int, int]:
    r = ualink_export_raw(f, gem_handle)
    assert r.result == 0, r
    return struct.unpack("<QQ", r.out[:16])


def ualink_import_raw(f: DrmFile, lo: int, hi: int, flags: int = 0,
                      caller: Caller = CALLER) -> IoctlResult:
    return ioctl(f, UALINK, struct.pack("<IIQQ", 1, flags, lo, hi), caller)


def ualink_import(f: DrmFile, lo: int, hi: int, caller: Caller = CALLER) -> int:
    r = ualink_import_raw(f, lo, hi, caller=caller)
    assert r.result == 0, r
    return u32(r.out)


class ScriptedBits:
    """An injectable randbits: returns scripted values first, then a counter."""

    def __init__(self, *values: int) -> None:
        self.values = list(values)
        self.calls: list[int] = []
        self._n = 0x1000

    def __call__(self, k: int) -> int:
        self.calls.append(k)
        if self.values:
            return self.values.pop(0) & ((1 << k) - 1)
        self._n += 0x10001
        return self._n & ((1 << k) - 1)


def connected_export(config: PodConfig, remotes: Iterable[int] = (1, 2),
                     size: int = 1 << 20) -> tuple[NodeCore, Any, DrmFile, int, int]:
    """Accel 0's manager of a node of `config` with its connections to `remotes` up
    (SETUP, HELLO_ACK: §5.4) and a BO of `size` exported (§6.1): core, manager, the file
    and the UALink handle's two halves."""
    from ualinkd.ualink.peers import ConnEvent

    core = make_node(config)
    mgr = core.managers[128]
    for remote in remotes:
        mgr.conn(remote).apply(ConnEvent.SETUP)
        mgr.conn(remote).apply(ConnEvent.HELLO_ACK)
    f = open_file(core)
    lo, hi = ualink_export(f, gem_create(f, size=size))
    return core, mgr, f, lo, hi


def write_recording(directory: Path, *recs: dict[str, Any]) -> Path:
    """`recs` as a recording (directory/rec.jsonl, one JSON object a line), with
    directory/dri/renderD128 an empty file: `directory` stands in for a node's mount in the
    replay's unit tests (a replay's opens find that file)."""
    (directory / "dri").mkdir()
    (directory / "dri/renderD128").write_bytes(b"")
    path = directory / "rec.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path
