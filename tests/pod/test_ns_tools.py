"""The testing API's own contract: the pytest fixture, `ualinkd pod --netns`, cleanup of a
crashed run's leftovers, and that nothing of a pod survives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ualinkd.testing import cleanup_stale

pytestmark = pytest.mark.pod


def netns_names() -> list[str]:
    try:
        return os.listdir("/run/netns")
    except FileNotFoundError:
        return []


@pytest.mark.ualink_pod(nodes=2, response_timeout_ms=300)
def test_fixture_pod_leaves_nothing(ualink_pod):
    """The fixture's pod is up (both links, plain /dev/dri inside); after close() its
    namespaces, processes and state directory are gone."""
    pod = ualink_pod
    assert pod.node(0).fabric() == {"node1": True}
    assert pod.node(1).run(["cat", "/sys/class/drm/renderD128/device/ualink/accel_state"]
                           ).stdout == "active\n"
    pids = [n.pid for n in pod.nodes]
    pod.node(1).stop()  # a stopped daemon must not keep close() waiting
    pod.close()
    assert not [ns for ns in netns_names() if ns.startswith(pod.prefix)]
    assert not any(os.path.exists(f"/proc/{p}") for p in pids)
    assert not pod.dir.exists()


def test_leftovers_of_a_dead_owner_are_removed(tmp_path):
    """A netns and a state directory named after an owner pid that no longer exists (a
    crashed run) are removed by the next start; a live owner's are left alone."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    mine = f"ualk-{dead.pid}-abcd"
    subprocess.run(["ip", "netns", "add", f"{mine}-node0"], check=True)
    (tmp_path / mine).mkdir()
    live = tmp_path / f"ualk-{os.getpid()}-beef"
    live.mkdir()
    try:
        assert mine in cleanup_stale(tmp_path)
        assert f"{mine}-node0" not in netns_names()
        assert not (tmp_path / mine).exists() and live.exists()
    finally:
        subprocess.run(["ip", "netns", "delete", f"{mine}-node0"], capture_output=True)


def test_ualinkd_pod_netns(tmp_path):
    """`ualinkd pod --netns` prints each node's ready line with its IP and how to run a
    client inside; SIGINT takes everything down. The root may hold a space; the pod's
    directory (its pod.toml holds the key) is private."""
    root = tmp_path / "pod root"
    proc = subprocess.Popen([sys.executable, "-m", "ualinkd", "pod", "--netns", "--nodes", "2",
                             "--root", str(root)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(4)]
        assert lines[0].startswith("node0 ready: ip=10.177.0.1 "), lines
        assert lines[1].startswith("node1 ready: ip=10.177.0.2 "), lines
        assert "nsenter --net=/run/netns/" in lines[3], lines
        pod_dir = lines[2].split(": ", 1)[1].strip()
        r = subprocess.run([sys.executable, "-m", "ualinkd.testing", pod_dir, "run", "node1",
                            "--", "ls", "/dev/dri"], capture_output=True, text=True, timeout=30)
        assert r.stdout == "card0\nrenderD128\n", r  # each GPU its card<n> too
        assert os.stat(pod_dir).st_mode & 0o777 == 0o700
        r = subprocess.run([sys.executable, "-m", "ualinkd.testing", pod_dir, "drop-next",
                            "node1", "BOGUS"], capture_output=True, text=True, timeout=30)
        assert r.returncode == 2 and "is not a message type" in r.stderr, r
        # ualinkctl inside a node finds the node by itself (its /sys is the node's).
        ctl = str(Path(sys.executable).parent / "ualinkctl")
        r = subprocess.run([sys.executable, "-m", "ualinkd.testing", pod_dir, "run", "node1",
                            "--", ctl, "state"], capture_output=True, text=True, timeout=30,
                           env={k: v for k, v in os.environ.items() if k != "UALINK_MOUNT"})
        assert r.returncode == 0 and "active" in r.stdout, r
        # A stopped node is "not answering" in the status table, never a hang (issue 11).
        tool = [sys.executable, "-m", "ualinkd.testing", pod_dir]
        subprocess.run([*tool, "stop", "node1"], check=True, timeout=30)
        try:
            r = subprocess.run([*tool, "status"], capture_output=True, text=True, timeout=30)
        finally:
            subprocess.run([*tool, "cont", "node1"], check=True, timeout=30)
        assert r.returncode == 0, r
        (n1,) = [line for line in r.stdout.splitlines() if line.startswith("node1 ")]
        assert n1.endswith("not answering (stopped?)"), r.stdout
        r = subprocess.run([ctl, "pod", "status", pod_dir], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0 and r.stdout.count(" serving ") == 2, r
        # A killed node is started again by the pod's own process (issue 11).
        subprocess.run([*tool, "kill", "node1"], check=True, timeout=30)
        r = subprocess.run([*tool, "start", "node1"], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0 and r.stdout.startswith("node1 ready: pid="), r
        r = subprocess.run([*tool, "status"], capture_output=True, text=True, timeout=30)
        assert "node0:up" in r.stdout and "node1:up" in r.stdout, r.stdout
        prefix = os.path.basename(pod_dir)
        assert [ns for ns in netns_names() if ns.startswith(prefix)]
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    time.sleep(0.1)
    assert not [ns for ns in netns_names() if ns.startswith(prefix)]
    assert not os.path.exists(pod_dir)
