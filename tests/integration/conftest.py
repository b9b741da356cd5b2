"""The node most integration test files share: one `ualinkd node` (one accel, the default
pod) per test module, stopped and its mount cleared when the module is done. A file that
needs another shape defines its own `node`."""

from __future__ import annotations

import pytest
from nodes import running_node


@pytest.fixture(scope="module")
def node(request, tmp_path_factory):
    with running_node(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])) as n:
        yield n
