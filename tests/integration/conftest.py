"""The fixtures integration test files share: the node (one `ualinkd node`, one accel, the
default pod, per test module, stopped and its mount cleared when the module is done; a file
that needs another shape defines its own `node`), and a started C data plane
(fuse/dataplane.c) with the data channels a test opens on it to a peer the test drives by
hand, each closed, and the data plane stopped and freed, after the test."""

from __future__ import annotations

import socket
from collections.abc import Callable, Collection, Iterator

import pytest
from nodes import running_node

from ualinkd.fuse.dataplane import DataPlane


@pytest.fixture(scope="module")
def node(request, tmp_path_factory):
    with running_node(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])) as n:
        yield n


@pytest.fixture
def plane() -> Iterator[DataPlane]:
    """A started data plane (its thread running, no channel yet)."""
    dp = DataPlane()
    try:
        assert dp.start()
        yield dp
    finally:
        dp.stop()
        dp.free()


@pytest.fixture
def open_channel(plane: DataPlane) -> Iterator[Callable[..., socket.socket]]:
    """open_channel(peer_accels, pair=None): our end of a socketpair (or of `pair`, (ours,
    theirs): loopback TCP, as the link's channels are) taken by `plane` as a data channel to
    a peer whose accels are `peer_accels`; the peer's end returned, with a 5 s watchdog (an
    answer that never comes fails the test). Each is closed after the test, before the data
    plane stops."""
    opened: list[tuple[int, socket.socket]] = []

    def open_(peer_accels: Collection[int],
              pair: tuple[socket.socket, socket.socket] | None = None) -> socket.socket:
        ours, theirs = pair or socket.socketpair()
        handle = plane.open("peer", ours.detach(), peer_accels)
        assert handle is not None
        theirs.settimeout(5)
        opened.append((handle, theirs))
        return theirs

    try:
        yield open_
    finally:
        for handle, theirs in opened:
            plane.close(handle)
            theirs.close()
