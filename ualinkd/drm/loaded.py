"""Loaded bytes that need not pass through Python's memory on their way to the caller.

A remote GPU load of a large range is answered by one DATA frame. On a plain TCP link the
fabric splices that payload from its socket into a pipe, and the FUSE reply splices it on
into the caller's buffer, so the kernel copies the bytes once on the importer (into the
caller) instead of twice (into the daemon, then into the caller) and the daemon never
allocates or zeroes a megabyte for them. Between the two, the bytes are `PipedBytes`: the
layers in between (agent, amdgpu access, FUSE tree) see their length only.

The contract, kept by the fabric's reader that makes one: a `PipedBytes` holds a pipe only
during the reader's call that completed its DATA (the Completion chain runs inside it). When
that call ends, what nobody spliced is read into memory and the pipe is let go, so a later
consumer (a task woken by the DATA) gets `memory()`, and no pipe outlives the call.
"""

from __future__ import annotations

from typing import Protocol, TypeAlias


class PipedBytes(Protocol):
    def __len__(self) -> int: ...

    def splice_parts(self) -> tuple[bytes, int, int] | None:
        """Hand the bytes over to a splicing consumer: (the first bytes, already in memory;
        a pipe fd holding the rest; how many bytes it holds). The consumer reads all of them
        from the pipe. None when they are in memory only (then use `memory()`), or were
        handed over already."""
        ...

    def memory(self) -> bytes | bytearray:
        """The bytes in memory (read from the pipe first if need be)."""
        ...

    def read_into(self, dest: memoryview) -> None:
        """Copy the bytes into `dest` (at least len(self) long), straight from the pipe
        while it holds them: one copy, no buffer of their own (a large load that gathers
        its chunks in one buffer). Like `splice_parts`, it takes the pipe's bytes: later,
        `memory()` has nothing. OSError if the pipe gave less than it holds."""
        ...


# What a GPU load returns: bytes, or a payload the fabric holds in a pipe.
Loaded: TypeAlias = bytes | bytearray | PipedBytes


def in_memory(data: Loaded) -> bytes | bytearray:
    """`data` as bytes, for any consumer other than a splicing reply."""
    if isinstance(data, bytes | bytearray):
        return data
    return data.memory()


def copy_into(data: Loaded, dest: memoryview) -> int:
    """Put `data` at the start of `dest` (at least len(data) long), from the fabric's pipe
    when it is still there (PipedBytes.read_into): how many bytes."""
    n = len(data)
    if isinstance(data, bytes | bytearray):
        dest[:n] = data
    else:
        data.read_into(dest)
    return n
