"""pytest plugin (entry point `ualinkd`): the `ualink_pod` fixture and the `pod` marker.

    @pytest.mark.ualink_pod(nodes=3, accels_per_node=2, response_timeout_ms=300)
    def test_something(ualink_pod):
        ualink_pod.node(1).kill()

The marker's keywords go to `pod_config` (a `config=PodConfig` keyword is used as is).
The test is skipped only when this machine cannot run namespaced pods (not root, a tool or
/dev/fuse missing: `PodUnavailable`); any other failure to start is an error.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .pod import Pod, PodUnavailable, check_prerequisites, pod_config


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pod: real daemons in network and mount namespaces (needs root)")
    config.addinivalue_line(
        "markers", "ualink_pod(**kw): the shape of the `ualink_pod` fixture's pod "
                   "(keywords of ualinkd.testing.pod_config, or config=PodConfig)")


def pod_or_skip(**kw: object) -> Pod:
    """A started Pod, or pytest.skip when the machine cannot run one."""
    try:
        check_prerequisites()
    except PodUnavailable as e:
        pytest.skip(str(e))
    config = kw.pop("config", None) or pod_config(**kw)  # type: ignore[arg-type]
    return Pod(config).start()  # type: ignore[arg-type]


@pytest.fixture
def ualink_pod(request: pytest.FixtureRequest) -> Iterator[Pod]:
    """A started pod (default: two nodes, one accel each, one vPod), closed afterwards
    whatever happens in the test."""
    marker = request.node.get_closest_marker("ualink_pod")
    pod = pod_or_skip(**(marker.kwargs if marker else {}))
    try:
        yield pod
    finally:
        pod.close()
