"""The CPU-mapping socket (trio): where the shim fetches a granted BO's memfd (README, "CPU
mappings"; the grants and the kernel's checks are amdgpu/cpu_map.py's).

A SOCK_SEQPACKET unix socket in the abstract namespace of the daemon's network namespace,
named with a random id that only the grant ioctl's answer tells (abi/cpumap.py), so nobody
can bind it first and pose as the daemon. One grant per connection: u64 grant in; s32
result, u32 map type, u64 backing offset out, with the memfd in SCM_RIGHTS on success. The
peer must be the process and uid the grant was made for (SO_PEERCRED). A read-only grant
gets a read-only file (reopened from /proc/self/fd), so mprotect cannot make it writable.
"""

from __future__ import annotations

import array
import contextlib
import errno
import logging
import os
import secrets
import socket
import struct

import trio

from .abi.cpumap import GRANT_REPLY_SIZE, GRANT_REQUEST_SIZE, socket_name
from .amdgpu.cpu_map import CpuMapGrants, Grant
from .drm.errors import DrmError
from .drm.process import ProcessId
from .fuse.procfd import process_id, process_of_pidfd

log = logging.getLogger(__name__)

_REPLY = struct.Struct("<iIQ")
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
SO_PEERPIDFD = 77  # asm-generic/socket.h (Python's socket module has no name for it)
_FETCH_TIMEOUT = 5.0  # a peer that connects and sends nothing holds a task this long at most
assert _REPLY.size == GRANT_REPLY_SIZE


MAX_FETCHES = 64  # connections being served at once


def _open_for(grant: Grant) -> tuple[int, bool]:
    """The fd to send (always ours to close after sending): a fresh open of the memfd, never
    the daemon's own descriptor. A shared open file description would let the client change
    the daemon's file status flags (O_APPEND makes every daemon pwrite an append, which the
    grow seal refuses)."""
    mode = os.O_RDWR if grant.writable else os.O_RDONLY
    return os.open(f"/proc/self/fd/{grant.memfd}", mode | os.O_CLOEXEC), True


def _peer_process(conn: trio.socket.SocketType, pid: int) -> ProcessId | None:
    """The connecting process itself: SO_PEERPIDFD (Linux 6.5) is a pidfd of the process
    that connected, whatever its pid names now; without it, its pid looked up now (None
    when it is gone)."""
    try:
        pidfd = conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
    except OSError:
        return process_id(pid)
    try:
        return process_of_pidfd(pid, pidfd)
    finally:
        os.close(pidfd)


async def _serve_one(conn: trio.socket.SocketType, grants: CpuMapGrants) -> None:
    with conn, trio.move_on_after(_FETCH_TIMEOUT):
        data = await conn.recv(GRANT_REQUEST_SIZE + 1)
        if len(data) != GRANT_REQUEST_SIZE:
            return
        pid, uid, _gid = _PEERCRED.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
        try:
            grant = grants.take(int.from_bytes(data, "little"), _peer_process(conn, pid), uid)
        except DrmError as e:
            await conn.send(_REPLY.pack(-e.errno, 0, 0))
            return
        try:
            fd, ours = _open_for(grant)
            try:
                reply = _REPLY.pack(0, grant.map_type, grant.backing_offset)
                await conn.sendmsg([reply],
                                   [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
            finally:
                if ours:
                    os.close(fd)
        except OSError as e:
            log.debug("CPU-map fetch by pid %d: %s", pid, e)
            with contextlib.suppress(OSError):
                await conn.send(_REPLY.pack(-(e.errno or errno.EIO), 0, 0))
        finally:
            grants.done(grant)


async def serve_cpu_maps(
    grants: CpuMapGrants, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
) -> None:
    """Listen until cancelled; `grants.socket` names the socket while it listens."""
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    with sock:
        while True:
            socket_id = secrets.randbits(64)
            if not socket_id:
                continue
            try:
                await sock.bind(socket_name(socket_id))
                break
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    raise
        sock.listen(128)
        grants.socket = socket_id
        task_status.started(socket_id)
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    conn, _ = await sock.accept()
                    if len(nursery.child_tasks) >= MAX_FETCHES:
                        # Bounded: each connection is an fd for up to _FETCH_TIMEOUT; a
                        # flood of them must not take the daemon's fds. The shim's mmap
                        # then fails (ENODEV) and can be retried.
                        conn.close()
                        continue
                    nursery.start_soon(_serve_one, conn, grants)
        finally:
            grants.socket = 0
            grants.clear()
