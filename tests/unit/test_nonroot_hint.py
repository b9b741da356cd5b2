"""Running without root (README): a failed mount says what to change for this user."""

from __future__ import annotations

import os

from ualinkd.fuse import lowlevel


def test_root_needs_nothing(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert lowlevel.non_root_mount_hint("/nonexistent") == ""


def test_a_user_is_told_each_missing_piece(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    conf = tmp_path / "fuse.conf"
    conf.write_text("# user_allow_other\nmount_max = 1000\n")
    hint = lowlevel.non_root_mount_hint(str(conf))
    assert "/dev/fuse is not read/writable by this user" in hint
    assert f"add the line `user_allow_other` to {conf}" in hint
    conf.write_text("user_allow_other  # clients of other uids\n")
    monkeypatch.setattr(os, "access", lambda path, mode: True)
    assert lowlevel.non_root_mount_hint(str(conf)) == ""
