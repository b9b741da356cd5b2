"""Pods of real ualinkd daemons in network and mount namespaces, with faults as one-liners:
the test-facing face of the supervisor in ualinkd.netns.

    from ualinkd.testing import Pod, pod_config
    with Pod(pod_config(nodes=3)) as pod:
        pod.node(1).run(["cat", "/sys/class/drm/renderD128/device/ualink/accel_state"])
        pod.node(0).kill()

`pytest` gets the `ualink_pod` fixture from `ualinkd.testing.plugin`; the command line
`python -m ualinkd.testing POD-DIR kill node1` injects faults into a running pod.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..netns.pod import (
        FABRIC_PORT,
        SUBNET,
        Pod,
        PodError,
        PodNode,
        PodUnavailable,
        check_prerequisites,
        cleanup_stale,
        pod_config,
    )


def __getattr__(name: str) -> Any:
    # Loaded on first use: `python -m ualinkd.netns.nodeinit` runs twice per pod node
    # start and needs none of it (pod.py pulls in the config and the manager).
    if name in __all__:
        from ..netns import pod

        return getattr(pod, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FABRIC_PORT",
    "SUBNET",
    "Pod",
    "PodError",
    "PodNode",
    "PodUnavailable",
    "check_prerequisites",
    "cleanup_stale",
    "pod_config",
]
