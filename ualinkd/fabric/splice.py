"""A large DATA payload spliced from a link's socket into a pipe, not read into memory.

`drm/loaded.py` says why and states the contract: the link's reader makes one when a large
DATA frame's header arrives (FrameDecoder.divert), fills it with splice(2) as the bytes
come, and settles it once the frame was dispatched: a consumer that spliced the bytes on
(the FUSE reply of a GPU load) has emptied the pipe, which goes back to the reader's pool;
otherwise the bytes are read into memory and the pipe goes back all the same.
"""

from __future__ import annotations

import array
import fcntl
import logging
import os
import select
import termios

log = logging.getLogger(__name__)

# 128 slots. splice(2) from TCP puts one skb fragment (up to 32 KiB on loopback) in a slot,
# so a 1 MiB payload takes a few dozen; a peer that trickles its bytes in tiny segments (or
# a veth that hands over MSS-sized fragments) fills every slot first, and then the payload
# moves to memory (PipedPayload.to_memory). Half the FUSE side's 256-slot reply pipe, so
# that a reply's header and first bytes always fit there beside every slot of this one.
PIPE_SIZE = 512 << 10
_SPLICE_FLAGS = os.SPLICE_F_NONBLOCK | os.SPLICE_F_MOVE


class PipePool:
    """A reader's empty pipes (one payload is collected at a time, so one is kept)."""

    _refused_logged = False

    def __init__(self) -> None:
        self._free: list[tuple[int, int]] = []
        self.usable = True

    def take(self) -> tuple[int, int] | None:
        if self._free:
            return self._free.pop()
        if not self.usable:
            return None
        try:
            r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # no fd free now (EMFILE, ENFILE): this payload goes to memory
            return None
        try:
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError as e:
            # Over the user's pipe quota (pipe-user-pages-soft) or pipe-max-size: payloads
            # are read into memory, as on a TLS link.
            os.close(r)
            os.close(w)
            self.usable = False
            if not PipePool._refused_logged:
                PipePool._refused_logged = True
                log.info("fabric: a %d KiB pipe was refused (%s); large DATA payloads are "
                         "read into memory", PIPE_SIZE >> 10, e.strerror)
            return None
        return r, w

    def give(self, pipe: tuple[int, int]) -> None:
        """An empty pipe back."""
        if self._free:
            _close(pipe)
        else:
            self._free.append(pipe)

    def close(self) -> None:
        for pipe in self._free:
            _close(pipe)
        self._free.clear()


class PipedPayload:
    """One DATA payload of `size` bytes: its first bytes in memory (they came with the
    frame's header), the rest in a pipe or, after `to_memory()`, all of it in memory.
    Implements drm.loaded.PipedBytes and wire.Sink."""

    __slots__ = ("_filled", "_in_pipe", "_mem", "_pipe", "_pool", "_prefix", "_size", "_taken")

    def __init__(self, size: int, pool: PipePool, pipe: tuple[int, int]) -> None:
        self._size = size
        self._pool = pool
        self._pipe: tuple[int, int] | None = pipe
        self._prefix = b""
        self._filled = 0  # bytes received: the prefix, then what was spliced or read
        self._in_pipe = 0
        self._mem: bytearray | None = None
        self._taken = False

    def __len__(self) -> int:
        return self._size

    def start(self, prefix: bytes) -> None:
        self._prefix = prefix
        self._filled = len(prefix)

    @property
    def left(self) -> int:
        return self._size - self._filled

    @property
    def piping(self) -> bool:
        """The bytes still to come go into the pipe (else into `rest()`)."""
        return self._mem is None

    def splice_from(self, fd: int) -> int:
        """Splice what `fd` has of the payload into the pipe: bytes moved (0 at EOF).
        BlockingIOError when the socket has nothing, or the pipe no free slot
        (`pipe_full()` tells which). One call takes all there is, up to the payload's end:
        a splice stops at the pipe's byte size or the data queued, and each return to the
        reader's loop costs a trio turn (a 1 MiB payload took three)."""
        assert self._pipe is not None
        moved = 0
        while True:
            try:
                n = os.splice(fd, self._pipe[1], self.left, flags=_SPLICE_FLAGS)
            except BlockingIOError:
                if moved:
                    return moved
                raise
            self._in_pipe += n
            self._filled += n
            moved += n
            if not n or self._filled == self._size:
                return moved

    def pipe_full(self) -> bool:
        if self._pipe is None:
            return False
        p = select.poll()
        p.register(self._pipe[1], select.POLLOUT)
        return not p.poll(0)

    def rest(self) -> memoryview:
        """In memory: where the bytes still to come go (then `received(n)`)."""
        assert self._mem is not None
        return memoryview(self._mem)[self._filled:]

    def received(self, n: int) -> None:
        self._filled += n

    def to_memory(self) -> None:
        """Move what is in the pipe into memory; later bytes are read there too."""
        if self._mem is not None:
            return
        assert self._pipe is not None and not self._taken
        mem = bytearray(self._size)  # (ours once every byte of the pipe is in it)
        k = len(self._prefix)
        mem[:k] = self._prefix
        _read_pipe(self._pipe[0], memoryview(mem), k, k + self._in_pipe)
        self._mem = mem
        self._prefix = b""
        self._in_pipe = 0
        pipe, self._pipe = self._pipe, None
        self._pool.give(pipe)

    # -- drm.loaded.PipedBytes ---------------------------------------------------------------
    def splice_parts(self) -> tuple[bytes, int, int] | None:
        if self._pipe is None or self._taken:
            return None
        self._taken = True
        return self._prefix, self._pipe[0], self._in_pipe

    def read_into(self, dest: memoryview) -> None:
        if self._mem is not None:  # (the reader's call that completed it has ended)
            dest[:self._size] = self._mem
            return
        if self._taken:
            raise RuntimeError("payload bytes were spliced away")
        assert self._pipe is not None
        self._taken = True  # (settle: an emptied pipe goes back to the pool, else closed)
        k = len(self._prefix)
        dest[:k] = self._prefix
        _read_pipe(self._pipe[0], dest, k, k + self._in_pipe)

    def memory(self) -> bytearray:
        if self._mem is None:
            if self._taken:
                raise RuntimeError("payload bytes were spliced away")
            self.to_memory()
        assert self._mem is not None
        return self._mem

    # -- the reader's end ---------------------------------------------------------------------
    def settle(self) -> None:
        """The frame was dispatched: give the pipe back (emptied by whoever spliced it, or
        after reading what is in it into memory)."""
        pipe = self._pipe
        if pipe is None:
            return
        if not self._taken:
            self.to_memory()
            return
        self._pipe = None
        self._prefix = b""
        if unread(pipe[0]):  # the consumer failed part-way: nobody wants the rest
            _close(pipe)
        else:
            self._pool.give(pipe)

    def close(self) -> None:
        """The link went down with the payload incomplete."""
        pipe, self._pipe = self._pipe, None
        if pipe is not None:
            _close(pipe)


def _read_pipe(fd: int, view: memoryview, k: int, end: int) -> None:
    """Read a pipe that holds exactly end - k bytes into view[k:end]."""
    while k < end:
        n = os.readv(fd, [view[k:end]])
        if n <= 0:
            raise OSError(f"pipe gave {n} of {end - k} payload bytes")
        k += n


def unread(fd: int) -> int:
    """Bytes in a pipe or a socket not read yet (FIONREAD, SIOCINQ)."""
    n = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, n)
    return n[0]


def _close(pipe: tuple[int, int]) -> None:
    os.close(pipe[0])
    os.close(pipe[1])
