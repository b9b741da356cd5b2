"""ualinkd/bounded.py: a call that does not return in time is NotAnswering; results and
exceptions of one that does come back unchanged."""

from __future__ import annotations

import threading

import pytest

from ualinkd.bounded import NotAnswering, bounded


def test_result_and_exception_pass_through():
    assert bounded(lambda: 42, "x") == 42
    with pytest.raises(FileNotFoundError):
        bounded(lambda: open("/nonexistent/x"), "x")


def test_a_call_that_blocks_gives_up():
    gate = threading.Event()
    try:
        with pytest.raises(NotAnswering, match=r"node7: not answering after 0\.05 s"):
            bounded(gate.wait, "node7", timeout=0.05)
    finally:
        gate.set()  # let the abandoned thread go


def test_mountinfo_paths_with_escapes_and_utf8():
    """The kernel escapes space, tab, newline and backslash as octal and writes other bytes
    as they are: both undone on bytes (unicode_escape garbled '/tmp/ü x')."""
    from ualinkd.fuse.lowlevel import unescape_mountinfo

    assert unescape_mountinfo("/tmp/\u00fc\\040x") == "/tmp/\u00fc x"
    assert unescape_mountinfo("/a\\134b\\011c") == "/a\\b\tc"
    assert unescape_mountinfo("/plain") == "/plain"
