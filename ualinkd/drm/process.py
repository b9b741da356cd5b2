"""A process as the daemon names it, across pid reuse (sans-IO).

The kernel binds per-process state (a kfd_process, a CPU mapping) to the task or its mm, and
compares those, never pid numbers: a pid is handed to the next process as soon as the last
one is reaped. The daemon only sees numbers (FUSE reports the calling thread's id), so the
edge names each process by its thread group id *and* what tells it from any later process
given that id (its pidfd's inode: pidfs numbers every struct pid uniquely) *and* its program
image (an execve gives the process a new mm, which ends what the kernel bound to the old one),
and reports its exit. A context bound to a `ProcessId` never passes to another process, nor
to the program a process exec'd.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .completion import Completion


@dataclass(frozen=True, slots=True)
class ProcessId:
    pid: int  # the thread group id, in the daemon's pid namespace
    incarnation: int  # unique among the processes that ever had this pid while we run
    # What its last execve set up (its auxiliary vector: addresses ASLR placed at random):
    # a program the process exec'd has another. b"" when not known (a sans-IO identity, or
    # no access to it).
    image: bytes = b""


# A calling thread's id -> its process, None when it is gone (the edge reads /proc, pidfds).
Identify = Callable[[int], "ProcessId | None"]
# A process -> a Completion that gets its result (None) once the process has exited; cancel()
# stops watching (it then ends with an error). Already gone: done at once.
WatchExit = Callable[[ProcessId], Completion[None]]


def same_thread_group(tid: int) -> ProcessId:
    """The identity a sans-IO test uses when it has no /proc: every thread is its own
    process, which never exits."""
    return ProcessId(tid, 0)
