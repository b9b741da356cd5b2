"""Pods of real ualinkd daemons in network and mount namespaces, with faults as one-liners.

    from ualinkd.testing import Pod, pod_config
    with Pod(pod_config(nodes=3)) as pod:
        pod.node(1).run(["cat", "/sys/class/drm/renderD128/device/ualink/accel_state"])
        pod.node(0).kill()

`pytest` gets the `ualink_pod` fixture from `ualinkd.testing.plugin`; the command line
`python -m ualinkd.testing POD-DIR kill node1` injects faults into a running pod.
"""

from .pod import (
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
