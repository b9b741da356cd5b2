"""Fixtures every unit test file may use: a node core of the default pod (ualink_testkit)
and one open render file of it. A file that needs another shape defines its own."""

from __future__ import annotations

import pytest
import ualink_testkit as kit


@pytest.fixture
def core():
    return kit.make_node()


@pytest.fixture
def f(core):
    return kit.open_file(core)


@pytest.fixture
def plain_dirs_as_mounts(monkeypatch):
    """`ualinkd replay --mount DIR` refuses a DIR that is not a node's FUSE mount; the unit
    tier's replays go to plain directories standing in for one (a device file, a symlink
    planted in it), so for the test files that use this the CLI's check accepts them. The
    check itself: test_replay_mount.py; real mounts: tests/integration/test_replay_*."""
    from ualinkd.replay import cli

    monkeypatch.setattr(cli, "not_a_node_mount", lambda path: None)
