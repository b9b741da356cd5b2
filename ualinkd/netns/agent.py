"""A libualink client living inside a pod node, driven one request at a time from a test.

`python -m ualinkd.netns.agent LIBUALINK.so` reads one JSON request per line on stdin
(`{"op": "bo_create", "args": [...]}`) and answers one JSON line (`{"ok": value}` or
`{"errno": n}`); it opens the plain `/dev/dri/renderD<n>` paths of the node it runs in.
`Agent` (host side) is the proxy: its methods mirror libualink's calls and raise `OSError`
with the C library's errno, so a test reads like a C client.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from .. import native

RW = 0x6  # AMDGPU_VM_PAGE_READABLE | AMDGPU_VM_PAGE_WRITEABLE


def libualink_cdef() -> str:
    """The C API cffi needs (ABI mode over libualink.so), read from ualink/ualink.h itself
    (the installed package's or the checkout's): the declarations inside its extern "C"
    block, comments dropped. tests/integration uses the same declarations."""
    header = (native.layout().include_dir / "ualink" / "ualink.h").read_text()
    body = header.split('extern "C" {\n#endif\n', 1)[1].split("#ifdef __cplusplus", 1)[0]
    return re.sub(r"/\*.*?\*/", "", body, flags=re.S)


def libualink_path() -> Path:
    """libualink.so: the installed package's, or this checkout's (built on first use);
    UALINK_LIBRARY overrides (ualinkd/native.py)."""
    lay = native.layout()
    if not lay.installed and not lay.library.exists() and not os.environ.get("UALINK_LIBRARY"):
        subprocess.run(["make", "-s", "-C", str(lay.lib_dir.parent)], check=True)
    return native.library_path()


# -- inside the node ------------------------------------------------------------------------------
def serve(lib_path: str) -> int:
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(libualink_cdef())
    lib: Any = ffi.dlopen(lib_path)  # its functions are the cdef's, unknown to the stubs
    devs: dict[str, object] = {}

    def dev(path: str) -> object:
        if path not in devs:
            out = ffi.new("ualink_dev **")
            check(lib.ualink_open(path.encode(), out))
            devs[path] = out[0]
        return devs[path]

    def check(rc: int) -> int:
        if rc < 0:
            raise OSError(-rc, os.strerror(-rc))
        return rc

    def bo_create(path: str, size: int, domains: int = 4) -> int:
        h = ffi.new("uint32_t *")
        check(lib.ualink_bo_create(dev(path), size, 0, domains, 0, h))
        return h[0]

    def export(path: str, gem: int) -> list[int]:
        h = ffi.new("uint64_t[2]")
        check(lib.ualink_export(dev(path), gem, h))
        return [h[0], h[1]]

    def import_(path: str, handle: list[int]) -> int:
        """Import, turn the dma-buf into a GEM handle, close the fd: the GEM handle."""
        h = ffi.new("uint64_t[2]", handle)
        fd = ffi.new("int *")
        check(lib.ualink_import(dev(path), h, fd))
        try:
            g = ffi.new("uint32_t *")
            check(lib.ualink_prime_fd_to_handle(dev(path), fd[0], g))
            return g[0]
        finally:
            os.close(fd[0])

    def import_size(path: str, handle: list[int]) -> int:
        """Import and close again: the dma-buf's size (lseek SEEK_END)."""
        h = ffi.new("uint64_t[2]", handle)
        fd = ffi.new("int *")
        check(lib.ualink_import(dev(path), h, fd))
        try:
            return os.lseek(fd[0], 0, os.SEEK_END)
        finally:
            os.close(fd[0])

    def close(path: str) -> None:
        d = devs.pop(path, None)
        if d is not None:
            lib.ualink_close(d)

    ops: dict[str, Callable[..., object]] = {
        "bo_create": bo_create,
        "bo_close": lambda p, g: check(lib.ualink_bo_close(dev(p), g)),
        "export": export,
        "import": import_,
        "import_size": import_size,
        "va_map": lambda p, g, va, size, flags=RW: check(
            lib.ualink_va_map(dev(p), g, va, 0, size, flags)),
        "va_unmap": lambda p, g, va, size: check(lib.ualink_va_unmap(dev(p), g, va, 0, size)),
        "gpu_read": lambda p, va, size: os.pread(lib.ualink_fd(dev(p)), size, va).hex(),
        "gpu_write": lambda p, va, data: os.pwrite(lib.ualink_fd(dev(p)), bytes.fromhex(data),
                                                   va),
        "close": close,
    }
    for line in sys.stdin:
        req = json.loads(line)
        try:
            reply = {"ok": ops[req["op"]](*req["args"])}
        except OSError as e:
            reply = {"errno": e.errno, "msg": str(e)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    for path in list(devs):
        close(path)
    return 0


# -- the test's side -----------------------------------------------------------------------------
class AgentHost(Protocol):
    """Where an Agent runs: what it needs of a pod node (ualinkd.netns.pod.PodNode)."""

    name: str

    def render(self, accel: int | None) -> str: ...

    def popen(self, argv: Sequence[str], **kw: Any) -> subprocess.Popen[str]: ...


class Agent:
    """A client process inside `node`; every call is one request to it. Close it (or use
    `with`) to close its render nodes: the daemon then drops that client's handles."""

    def __init__(self, node: AgentHost) -> None:
        self.node = node
        self.proc = node.popen([sys.executable, "-m", "ualinkd.netns.agent",
                                str(libualink_path())],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=1)

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self, timeout: float = 10) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def call(self, op: str, *args: object) -> Any:  # a JSON value, shaped by the op
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, "args": list(args)}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"agent on {self.node.name} exited ({self.proc.poll()})")
        reply = json.loads(line)
        if "errno" in reply:
            raise OSError(reply["errno"], reply["msg"])
        return reply["ok"]

    def render(self, accel: int | None) -> str:
        return self.node.render(accel)

    def bo_create(self, size: int, accel: int | None = None, domains: int = 4) -> int:
        return self.call("bo_create", self.render(accel), size, domains)

    def bo_close(self, gem: int, accel: int | None = None) -> None:
        self.call("bo_close", self.render(accel), gem)

    def export(self, gem: int, accel: int | None = None) -> tuple[int, int]:
        lo, hi = self.call("export", self.render(accel), gem)
        return lo, hi

    def import_(self, handle: tuple[int, int], accel: int | None = None) -> int:
        """Import + PRIME_FD_TO_HANDLE (+ close the dma-buf fd): the NPA BO's GEM handle."""
        return self.call("import", self.render(accel), list(handle))

    def import_size(self, handle: tuple[int, int], accel: int | None = None) -> int:
        return self.call("import_size", self.render(accel), list(handle))

    def va_map(self, gem: int, va: int, size: int, accel: int | None = None,
               flags: int = RW) -> None:
        self.call("va_map", self.render(accel), gem, va, size, flags)

    def va_unmap(self, gem: int, va: int, size: int, accel: int | None = None) -> None:
        self.call("va_unmap", self.render(accel), gem, va, size)

    def gpu_read(self, va: int, size: int, accel: int | None = None) -> bytes:
        return bytes.fromhex(self.call("gpu_read", self.render(accel), va, size))

    def gpu_write(self, va: int, data: bytes, accel: int | None = None) -> int:
        return self.call("gpu_write", self.render(accel), va, data.hex())

    def close_render(self, accel: int | None = None) -> None:
        self.call("close", self.render(accel))


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
