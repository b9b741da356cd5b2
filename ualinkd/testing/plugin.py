"""pytest plugin (entry point `ualinkd`): the `ualink_pod` fixtures and the `pod` marker.

    @pytest.mark.ualink_pod(nodes=3, accels_per_node=2, response_timeout_ms=300, trace=True)
    def test_something(ualink_pod):
        ualink_pod.node(1).kill()

The marker's keywords go to `pod_config` (a `config=PodConfig` keyword is used as is;
`trace=True` or `trace="json"` traces every node's ioctls into its log, `trace_file=PATH`
into that file instead, `trace_filter=["kind=ioctl"]` filters it). `ualink_pod` is one
pod per test; `ualink_pod_session` one pod for the whole session (default shape, no marker).
A test that fails gets every node's daemon log (and trace) in its report.

When this machine cannot run namespaced pods (not root, no CAP_NET_ADMIN, no /dev/fuse, a
tool missing: `PodUnavailable`, which names each) the test is skipped — or fails, with
`--ualink-require` or UALINK_REQUIRE=1, so a CI that must test the fabric cannot go green
testing nothing. Any other failure to start is an error.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from ..netns.pod import Pod, PodUnavailable, check_prerequisites, pod_config

_PODS = pytest.StashKey[list[Pod]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--ualink-require", action="store_true", default=False,
                     help="ualinkd: fail (not skip) tests whose pod this machine cannot run "
                          "(also UALINK_REQUIRE=1)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "pod: real daemons in network and mount namespaces (needs root)")
    config.addinivalue_line(
        "markers", "ualink_pod(**kw): the shape of the `ualink_pod` fixture's pod "
                   "(keywords of ualinkd.testing.pod_config, config=PodConfig, trace=...)")


def _required(config: pytest.Config) -> bool:
    return bool(config.getoption("--ualink-require", default=False)) or \
        os.environ.get("UALINK_REQUIRE") == "1"


def pod_or_skip(required: bool = False, **kw: object) -> Pod:
    """A started Pod, or pytest.skip (pytest.fail when `required`) when the machine cannot
    run one."""
    try:
        check_prerequisites()
    except PodUnavailable as e:
        if required:
            pytest.fail(f"{e} (--ualink-require / UALINK_REQUIRE=1: not skipped)",
                        pytrace=False)
        pytest.skip(str(e))
    trace = kw.pop("trace", None)
    if trace is True:
        trace = "text"
    trace_file = kw.pop("trace_file", None)
    trace_filter = kw.pop("trace_filter", ())
    # kw: the marker's keywords, whatever a test wrote; pod_config and Pod check them
    config = kw.pop("config", None) or pod_config(**kw)  # type: ignore[arg-type]
    return Pod(config, trace=trace or None, trace_file=trace_file,  # type: ignore[arg-type]
               trace_filter=trace_filter).start()  # type: ignore[arg-type]


def _attach(request: pytest.FixtureRequest, pod: Pod) -> None:
    request.node.stash.setdefault(_PODS, []).append(pod)


@pytest.fixture
def ualink_pod(request: pytest.FixtureRequest) -> Iterator[Pod]:
    """A started pod (default: two nodes, one accel each, one vPod), closed afterwards
    whatever happens in the test."""
    marker = request.node.get_closest_marker("ualink_pod")
    pod = pod_or_skip(_required(request.config), **(marker.kwargs if marker else {}))
    _attach(request, pod)
    try:
        yield pod
    finally:
        pod.close()


@pytest.fixture(scope="session")
def _ualink_session_pod(request: pytest.FixtureRequest) -> Iterator[Pod]:
    pod = pod_or_skip(_required(request.config))
    try:
        yield pod
    finally:
        pod.close()


@pytest.fixture
def ualink_pod_session(request: pytest.FixtureRequest, _ualink_session_pod: Pod) -> Pod:
    """One pod (the default shape) shared by every test of the session that asks for it."""
    _attach(request, _ualink_session_pod)
    return _ualink_session_pod


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if report.failed:
        for pod in item.stash.get(_PODS, []):
            for node in pod.nodes:
                try:
                    text = node.log_text()
                except OSError as e:
                    text = f"(no log: {e.strerror})"
                report.sections.append((f"ualinkd {node.name} log ({report.when})",
                                        text[-20000:] or "(empty)"))
    return report
