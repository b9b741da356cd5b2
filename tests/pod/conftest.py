"""The shared pod of the tests/pod tier: 4 nodes × 2 accels, two vPods each spanning all
four nodes (vPod 1: accels 0 2 4 6 on renderD128, vPod 2: accels 1 3 5 7 on renderD129),
300 ms timeouts. Each test gets it back healthy (every node running and linked) and checks
that every node holds nothing afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pod_layout import TIMEOUT_MS, VPOD1, VPOD2

from ualinkd.testing import Pod, pod_config
from ualinkd.testing.plugin import pod_or_skip


def restore(pod: Pod) -> None:
    """Undo any fault a test left: continue, heal, restart, re-form the vPods."""
    for node in pod.nodes:
        if node.running:
            node.cont()
        node.heal()
    for node in pod.nodes:
        if not node.running:
            node.start()
    pod.wait_links()


@pytest.fixture(scope="module")
def shared_pod() -> Iterator[Pod]:
    pod = pod_or_skip(config=pod_config(nodes=4, accels_per_node=2,
                                        vpods={1: VPOD1, 2: VPOD2},
                                        response_timeout_ms=TIMEOUT_MS,
                                        vram_size=1 << 30))
    try:
        yield pod
    finally:
        pod.close()


@pytest.fixture
def pod(shared_pod: Pod) -> Iterator[Pod]:
    restore(shared_pod)
    shared_pod.assert_clean()
    yield shared_pod
    restore(shared_pod)
    shared_pod.assert_clean()
