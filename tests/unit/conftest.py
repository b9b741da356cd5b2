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
