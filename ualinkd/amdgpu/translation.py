"""A translation changed: who caches GPU VM or NPA translations outside these layers hears it.

The C data plane (fuse/dataplane.c) answers GPU loads of imported memory from routes,
caches of what these layers decided when they served a load themselves: a render file's VA
range → an exporter's NPA range (importer), an importer's NPA range → a BO chunk's bytes
(exporter). Every change that could make a route wrong calls `changed()` before it can
matter: a GPU VM mapping added or removed (vm.py), an NPA mapping invalidated or unmapped,
an importer dropped, an export ended, an NPA BO revoked, an accel's state changed
(ualink/manager.py), a BO's memory moved or freed (memory.py). A listener drops every
route; the next load of each range goes through these layers again.
"""

from __future__ import annotations

from collections.abc import Callable

_listeners: list[Callable[[], None]] = []


def listen(fn: Callable[[], None]) -> None:
    _listeners.append(fn)


def unlisten(fn: Callable[[], None]) -> None:
    if fn in _listeners:
        _listeners.remove(fn)


def changed() -> None:
    for fn in _listeners:
        fn()
