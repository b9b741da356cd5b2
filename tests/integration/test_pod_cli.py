"""`ualinkd pod` as a user's terminal sees it: SIGHUP stops it like SIGTERM, a SIGKILL'd pod
takes its node daemons (and their mounts) with it, and a second pod on the same root never
overwrites the pod.toml of nodes that still serve it (DESIGN "Interfaces").

Every process and FUSE mount a test leaves under its tmp directory is killed and lazily
unmounted afterwards, even when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ualinkd.fuse.lowlevel import fuse_mounts_under

pytestmark = pytest.mark.integration


# -- what runs under a directory (from /proc: a stat could hang) -----------------------------
def alive(pid: int) -> bool:
    """Running (a zombie nobody reaps counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def pids_using(top: Path) -> set[int]:
    """Processes with `top`, or a path below it, among their arguments."""
    top_b = os.fsencode(top)
    found = set()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(a == top_b or a.startswith(top_b + b"/") for a in argv):
            found.add(int(d))
    return found


def node_pids(root: Path) -> set[int]:
    conf = os.fsencode(root / "pod.toml")
    found = set()
    for pid in pids_using(root):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
            if b"node" in argv and conf in argv:
                found.add(pid)
    return found


def wait_for(cond: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def tmp(tmp_path: Path) -> Iterator[Path]:
    """tmp_path, and afterwards nothing left running or mounted under it."""
    yield tmp_path
    left = pids_using(tmp_path)
    for pid in left:
        for sig in (signal.SIGKILL, signal.SIGCONT):
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
    wait_for(lambda: not any(alive(p) for p in left), 10)
    for point in reversed(fuse_mounts_under(tmp_path)):
        subprocess.run(["umount", "-l", point], capture_output=True)
    assert not left, f"processes left running: {sorted(left)}"


# -- one `ualinkd pod` ------------------------------------------------------------------------
def ignore_sighup() -> None:
    """What nohup does before it execs."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def default_sighup() -> None:
    """What a terminal's shell gives the pod: SIGHUP at its default. The test run itself may
    be under nohup (an ignored SIGHUP is inherited), and the pod then rightly keeps it."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


class PodProcess:
    def __init__(self, root: Path, nodes: int, nohup: bool = False) -> None:
        self.root = root
        self.out = root.parent / f"{root.name}.out"
        self.err = root.parent / f"{root.name}.err"

        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ualinkd", "pod", "--nodes", str(nodes),
                 "--root", str(root)], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                preexec_fn=ignore_sighup if nohup else default_sighup)
        self.nodes: set[int] = set()

    def stderr(self) -> str:
        return self.err.read_text()

    def wait_ready(self, nodes: int, timeout: float = 60) -> None:
        """Until the pod printed a ready line per node (it does once the links are up)."""
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"the pod exited with {self.proc.returncode}:\n"
                                     f"{self.stderr()}")
            return self.out.read_text().count(" ready: ") == nodes
        assert wait_for(ready, timeout), f"the pod is not ready:\n{self.stderr()}"
        self.nodes = node_pids(self.root)
        assert len(self.nodes) == nodes, self.nodes
        for i in range(nodes):
            assert (self.root / f"node{i}" / "dri" / "renderD128").exists()


@contextlib.contextmanager
def pod(root: Path, nodes: int = 2, nohup: bool = False) -> Iterator[PodProcess]:
    p = PodProcess(root, nodes, nohup)
    try:
        p.wait_ready(nodes)
        yield p
    finally:
        if p.proc.poll() is None:
            p.proc.kill()
        p.proc.wait()


def test_a_node_forked_by_the_pod_is_as_if_exec_d(tmp):
    """`ualinkd pod` forks its nodes from itself, with the node code imported once (cli/pod.py
    _fork_node): each still shows the command line `ualinkd node` would have had (ps, pgrep
    -f), leads a session of its own, and holds none of the pod's fds (its root lock, the
    other nodes' readiness sockets)."""
    root = tmp / "pod"
    with pod(root, nodes=2) as p:
        for pid in p.nodes:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            name = argv[argv.index(b"--node") + 1].decode()
            assert argv == [os.fsencode(a) for a in (
                sys.executable, "-m", "ualinkd", "node", "--config", str(root / "pod.toml"),
                "--node", name, "--mount", str(root / name), "")]
            assert os.getsid(pid) == pid
            fds = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()
                   if fd.name not in ("0", "1", "2")]
            assert str(root) not in fds, fds  # the pod's flock on its root
            assert not any(f.startswith("socket:") and _is_notify(pid, f) for f in fds)
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(30) == 0


def _is_notify(pid: int, link: str) -> bool:
    """Whether the socket `link` ("socket:[inode]") of process `pid` is bound to a path of
    the pod's readiness sockets (.notify-NAME)."""
    inode = link[len("socket:["):-1]
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        cols = line.split()
        if cols[6] == inode and len(cols) > 7 and "/.notify-" in cols[7]:
            return True
    return False


def test_sighup_stops_the_pod_as_sigterm_does(tmp):
    """A closed terminal or a dropped ssh session (SIGHUP): every node daemon stops and
    unmounts, and the pod exits 0 as for SIGTERM."""
    root = tmp / "pod"
    with pod(root) as p:
        p.proc.send_signal(signal.SIGHUP)
        assert p.proc.wait(30) == 0, p.stderr()
        assert not any(alive(pid) for pid in p.nodes)
        assert not fuse_mounts_under(root)
        assert sorted(x.name for x in root.iterdir()) == [".nodes.json", "node0", "node1",
                                                          "pod.toml"]


def test_nohup_pod_survives_sighup(tmp):
    """`nohup ualinkd pod &`: a SIGHUP inherited as ignored stays ignored; SIGTERM stops it."""
    root = tmp / "pod"
    with pod(root, nohup=True) as p:
        p.proc.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert p.proc.poll() is None and all(alive(pid) for pid in p.nodes)
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(30) == 0, p.stderr()


def test_stopped_node_left_on_the_root_does_not_hang_the_start(tmp):
    """A node of a dead pod that is SIGSTOPped (its mount answers nothing): the next pod does
    not hang on it (no statfs into that mount from the pod itself); it reports the mount and
    exits 1, and once the node runs again it finishes dying and the root is usable."""
    root = tmp / "pod"
    with pod(root, nodes=1) as p:
        (node,) = p.nodes
        os.kill(node, signal.SIGSTOP)
        p.proc.kill()
        p.proc.wait()
    second = subprocess.run([sys.executable, "-m", "ualinkd", "pod", "--nodes", "1",
                             "--root", str(root)], capture_output=True, text=True, timeout=60)
    assert second.returncode == 1 and str(root / "node0") in second.stderr, second.stderr
    os.kill(node, signal.SIGCONT)  # its parent-death SIGTERM is delivered now
    assert wait_for(lambda: not alive(node), 10)
    assert wait_for(lambda: not fuse_mounts_under(root), 5)


def test_sigkilled_pod_takes_its_nodes_and_mounts_with_it(tmp):
    """The node daemons die with the pod process even when it gets SIGKILL (parent-death
    signal SIGTERM: they unmount on the way out), and the next pod on the root starts."""
    root = tmp / "pod"
    with pod(root) as p:
        p.proc.kill()
        p.proc.wait()
        assert wait_for(lambda: not any(alive(pid) for pid in p.nodes), 10), \
            f"node daemons {sorted(pid for pid in p.nodes if alive(pid))} outlived the pod"
        assert wait_for(lambda: not fuse_mounts_under(root), 5), fuse_mounts_under(root)
    with pod(root) as p:
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(30) == 0, p.stderr()
    assert not fuse_mounts_under(root)


def test_pod_restarted_at_once_after_a_sigkill(tmp):
    """A new pod started the moment the old one was SIGKILL'd waits for the old nodes to
    unmount (they are on their way out) and starts."""
    root = tmp / "pod"
    with pod(root) as old:
        old.proc.kill()
        old.proc.wait()
        with pod(root) as new:
            assert not any(alive(pid) for pid in old.nodes)
            assert not new.nodes & old.nodes
            new.proc.send_signal(signal.SIGTERM)
            assert new.proc.wait(30) == 0, new.stderr()
    assert not fuse_mounts_under(root)


def test_second_pod_on_a_live_root_keeps_its_pod_toml(tmp):
    """A second `ualinkd pod` on the root of a running one exits 1 and leaves its pod.toml
    (the running nodes' config, with its key) alone; the first pod keeps working."""
    root = tmp / "pod"
    with pod(root) as first:
        conf = (root / "pod.toml").read_bytes()
        r = subprocess.run([sys.executable, "-m", "ualinkd", "pod", "--nodes", "3", "--root",
                            str(root)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, r.stderr
        assert f"another `ualinkd pod` is running on {root}" in r.stderr
        assert (root / "pod.toml").read_bytes() == conf
        assert not (root / "node2").exists()
        assert "node1 up" in (root / "node0/sys/kernel/debug/ualink_fabric").read_text()
        first.proc.send_signal(signal.SIGINT)
        assert first.proc.wait(30) == 0, first.stderr()
    assert not fuse_mounts_under(root)


def test_live_node_left_on_the_root_blocks_the_start(tmp):
    """A node daemon still serving ROOT/node0 without its pod (e.g. a pod killed by an
    older ualinkd): the new pod waits a little for it to go, then exits 1 naming the mount,
    and pod.toml stays as it was."""
    root = tmp / "pod"
    with pod(root) as p:
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(30) == 0
    conf = (root / "pod.toml").read_bytes()
    env = {k: v for k, v in os.environ.items() if not k.startswith("UALINKD_")}
    orphan = subprocess.Popen([sys.executable, "-m", "ualinkd", "node", "--config",
                               str(root / "pod.toml"), "--node", "node0", "--mount",
                               str(root / "node0")], env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: (root / "node0/dri/renderD128").exists(), 30)
        r = subprocess.run([sys.executable, "-m", "ualinkd", "pod", "--nodes", "2", "--root",
                            str(root)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, r.stderr
        assert f"{root / 'node0'} is still served by a live FUSE server" in r.stderr
        assert (root / "pod.toml").read_bytes() == conf
        assert orphan.poll() is None
    finally:
        orphan.terminate()
        orphan.wait(20)
    assert not fuse_mounts_under(root)


def test_dead_mount_left_on_the_root_is_cleared(tmp):
    """A node daemon SIGKILL'd together with its pod leaves a dead FUSE mount; the next
    pod on the root clears it and starts."""
    root = tmp / "pod"
    with pod(root) as p:
        (victim,) = [pid for pid in p.nodes
                     if str(root / "node1").encode() in Path(f"/proc/{pid}/cmdline").read_bytes()]
        p.proc.send_signal(signal.SIGSTOP)  # so that it cannot clear the mount itself
        os.kill(victim, signal.SIGKILL)
        assert wait_for(lambda: not alive(victim), 10)
        p.proc.kill()
        p.proc.wait()
        assert wait_for(lambda: not any(alive(pid) for pid in p.nodes), 10)
    assert fuse_mounts_under(root) == [str(root / "node1")]  # dead, ENOTCONN
    with pod(root) as p:
        assert "pod.toml" in os.listdir(root)
        p.proc.send_signal(signal.SIGINT)
        assert p.proc.wait(30) == 0, p.stderr()
    assert not fuse_mounts_under(root)


def test_netns_pod_nodes_die_with_it_and_sighup_stops_it(tmp):
    """`ualinkd pod --netns`: the node daemons (started through ip netns exec, unshare and
    nodeinit, all exec'ing) die with a SIGKILL'd pod; the namespaces it leaves are removed
    by the next start, and SIGHUP stops that one as SIGTERM does (exit 0, all gone)."""
    from ualinkd.testing import PodUnavailable, check_prerequisites, cleanup_stale

    try:
        check_prerequisites()
    except PodUnavailable as e:
        pytest.skip(str(e))
    root = tmp / "pods"

    def start() -> tuple[subprocess.Popen[bytes], str, set[int]]:
        out = tmp / "netns.out"
        with open(out, "w") as f:
            proc = subprocess.Popen([sys.executable, "-m", "ualinkd", "pod", "--netns",
                                     "--nodes", "2", "--root", str(root)], stdout=f,
                                    stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                    preexec_fn=default_sighup)
        assert wait_for(lambda: "faults:" in out.read_text() or proc.poll() is not None, 60)
        text = out.read_text()
        assert proc.poll() is None, text
        prefix = os.path.basename(re.search(r"^pod dir: (.*)$", text, re.M).group(1))
        return proc, prefix, {int(pid) for pid in re.findall(r" pid=(\d+) ", text)}

    def netns(prefix: str) -> list[str]:
        return [ns for ns in os.listdir("/run/netns") if ns.startswith(prefix)]

    proc, prefix, nodes = start()
    try:
        assert len(nodes) == 2
        proc.kill()
        proc.wait()
        assert wait_for(lambda: not any(alive(pid) for pid in nodes), 10), \
            f"node daemons {sorted(pid for pid in nodes if alive(pid))} outlived the pod"
        proc, prefix2, _ = start()
        assert not netns(prefix) and not (root / prefix).exists()
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(30) == 0
        assert not netns(prefix2) and not (root / prefix2).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cleanup_stale(root)


def test_a_dead_node_leaves_the_others_running_and_starts_again(tmp):
    """Issue 11: one node's death is a fault to study, not the pod's end: the pod says so
    (one line naming the signal), the other node keeps serving, `ualinkd start-node` brings
    the node back with its links; every node running at the stop: exit status 0."""
    root = tmp / "pod"
    with pod(root, nodes=2) as p:
        victim = next(pid for pid in p.nodes
                      if b"node1" in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0"))
        os.kill(victim, signal.SIGKILL)
        assert wait_for(lambda: "node1 was killed by SIGKILL" in p.stderr(), 10), p.stderr()
        assert "node0 keeps running" in p.stderr()
        assert p.proc.poll() is None  # the pod goes on
        ctl = [str(Path(sys.executable).parent / "ualinkctl"), "--mount", str(root / "node0"),
               "state"]
        state = subprocess.run(ctl, capture_output=True, text=True, timeout=30)
        assert state.returncode == 0 and "active" in state.stdout.lower(), state
        again = subprocess.run([sys.executable, "-m", "ualinkd", "start-node", "--root",
                                str(root), "node1"], capture_output=True, text=True, timeout=90)
        assert again.returncode == 0, again.stderr
        assert again.stdout.startswith("node1 ready: mount=")
        # the pod's own ready line's fields (`ualinkd pod` prints the same for node1)
        assert again.stdout.rstrip().endswith(
            f"render={root / 'node1'}/dri/renderD128 accels=1"), again.stdout
        assert (root / "node1" / "dri" / "renderD128").exists()
        busy = subprocess.run([sys.executable, "-m", "ualinkd", "start-node", "--root",
                               str(root), "node1"], capture_output=True, text=True, timeout=90)
        assert busy.returncode == 1 and "node1 is running" in busy.stderr
        fabric = root / "node0" / "sys" / "kernel" / "debug" / "ualink_fabric"
        assert wait_for(lambda: "node1 up" in fabric.read_text(), 20), fabric.read_text()
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(timeout=30) == 0
    assert not node_pids(root)


def test_silent_control_clients_hold_up_no_request(tmp):
    """The pod's control socket: clients that connect and send nothing are read without
    blocking and closed after 2 s; a `ualinkd start-node` behind four of them is answered
    within its own 3 s (it waited 2 s for each, in turn, before), and the pod still watches
    its nodes."""
    import socket

    root = tmp / "pod"
    with pod(root, nodes=2) as p:
        silent = []
        try:
            for _ in range(4):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(str(root / ".control"))
                silent.append(s)
            busy = subprocess.run([sys.executable, "-m", "ualinkd", "start-node", "--root",
                                   str(root), "--timeout", "3", "node1"],
                                  capture_output=True, text=True, timeout=60)
            assert busy.returncode == 1 and "node1 is running" in busy.stderr, busy.stderr
            for s in silent:  # closed by the pod once their 2 s are up
                s.settimeout(10)
                assert s.recv(1) == b""
        finally:
            for s in silent:
                s.close()
        os.kill(min(p.nodes), signal.SIGKILL)
        assert wait_for(lambda: "was killed by SIGKILL" in p.stderr(), 10), p.stderr()
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(timeout=30) == 1


def test_a_node_dead_at_the_stop_is_in_the_exit_status(tmp):
    root = tmp / "pod"
    with pod(root, nodes=2) as p:
        os.kill(min(p.nodes), signal.SIGKILL)
        assert wait_for(lambda: "was killed by SIGKILL" in p.stderr(), 10), p.stderr()
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(timeout=30) == 1


def test_start_node_without_a_pod_says_so(tmp):
    r = subprocess.run([sys.executable, "-m", "ualinkd", "start-node", "--root", str(tmp),
                        "node0"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "no `ualinkd pod` is running on" in r.stderr


def test_ualinkctl_pod_status_shows_every_node_and_a_stopped_one(tmp):
    """Issue 11: `ualinkctl pod status ROOT|ROOT/pod.toml` is one table of every node (and
    --json); a SIGSTOPped node is "not answering (stopped?)" within the read bound, the
    others still answer, and the exit status says not every node serves."""
    import json

    root = tmp / "pod"
    ctl = str(Path(sys.executable).parent / "ualinkctl")
    with pod(root, nodes=3) as p:
        r = subprocess.run([ctl, "pod", "status", str(root)], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].split() == ["node", "address", "accels", "status", "state", "links"]
        assert [ln.split()[0] for ln in lines[1:]] == ["node0", "node1", "node2"]
        assert all(" serving " in ln and " active " in ln for ln in lines[1:]), r.stdout
        # `status` is the default: `ualinkctl pod ROOT` prints the same table
        r2 = subprocess.run([ctl, "pod", str(root)], capture_output=True, text=True, timeout=60)
        assert (r2.returncode, r2.stdout.splitlines()[0]) == (0, lines[0]), r2.stderr
        victim = next(pid for pid in p.nodes
                      if b"node1" in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0"))
        os.kill(victim, signal.SIGSTOP)
        try:
            r = subprocess.run([ctl, "pod", "status", str(root / "pod.toml"), "--json"],
                               capture_output=True, text=True, timeout=60)
        finally:
            os.kill(victim, signal.SIGCONT)
        assert r.returncode == 1, r.stderr
        status = {n["node"]: n["status"] for n in json.loads(r.stdout)["nodes"]}
        assert status == {"node0": "serving", "node1": "not answering (stopped?)",
                          "node2": "serving"}
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(timeout=30) == 0


# -- issue 32: your own pod file, `ualinkd run`, the papercuts ---------------------------------
UALINKD = [sys.executable, "-m", "ualinkd"]
CTL = str(Path(sys.executable).parent / "ualinkctl")


@contextlib.contextmanager
def pod_with(root: Path, *args: str, ready: int) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`ualinkd pod --root ROOT ARGS` until `ready` ready lines; (the process, its stdout so
    far). Killed afterwards if still running."""
    out = root.parent / f"{root.name}.out"
    err = root.parent / f"{root.name}.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([*UALINKD, "pod", "--root", str(root), *args], stdout=o,
                                stderr=e, stdin=subprocess.DEVNULL, text=True,
                                preexec_fn=default_sighup)
    try:
        assert wait_for(lambda: proc.poll() is not None
                        or out.read_text().count(" ready: ") == ready, 60), err.read_text()
        assert proc.poll() is None, err.read_text()
        yield proc, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def own_pod_file(path: Path, names: tuple[str, ...], accels: int, port0: bool) -> bytes:
    """A pod file a user wrote: nodes `names` with `accels` accels each, on ports the kernel
    picks (host:0) or on free ports written down; its bytes."""
    from dataclasses import replace

    from ualinkd.cli.main import free_tcp_ports
    from ualinkd.config import PodConfig

    base = PodConfig.local(len(names), accels,
                           [0] * len(names) if port0 else free_tcp_ports(len(names)))
    config = replace(base, nodes=tuple(replace(n, name=name)
                                       for n, name in zip(base.nodes, names, strict=True)))
    path.write_text("# my pod\n" + config.to_toml())
    return path.read_bytes()


def test_pod_config_file_and_profile_run_as_written(tmp):
    """Issue 32, item 3: `ualinkd pod --config FILE --profile mi210` runs the nodes FILE
    names (mounted at ROOT/NAME, host:0 given free ports) with every accel an MI210, and
    leaves FILE as it was; the running config is ROOT/pod.toml, marked as the pod's own.
    Item 9: the ready line of a 2-accel node names both render nodes."""
    from ualinkd.cli.pod import GENERATED_MARK

    mine = tmp / "mine.toml"
    before = own_pod_file(mine, ("gpu-a", "gpu-b"), 2, port0=True)
    root = tmp / "pod"
    with pod_with(root, "--config", str(mine), "--profile", "mi210", ready=2) as (proc, out):
        ready = [ln for ln in out.splitlines() if " ready: " in ln]
        assert [ln.split()[0] for ln in ready] == ["gpu-a", "gpu-b"]
        a = root / "gpu-a"
        assert f"render={a}/dri/renderD128,{a}/dri/renderD129 accels=0,1" in ready[0], ready
        for minor in (128, 129):
            dev = a / f"sys/class/drm/renderD{minor}/device/device"
            assert dev.read_text().strip() == "0x740f"  # amdgpu/profile.py's mi210
        assert "gpu-a up" in (root / "gpu-b/sys/kernel/debug/ualink_fabric").read_text()
        assert mine.read_bytes() == before
        running = (root / "pod.toml").read_text()
        assert running.splitlines()[0] == GENERATED_MARK
        assert ":0\"" not in running and 'profile = "mi210"' in running
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    assert mine.read_bytes() == before
    assert not fuse_mounts_under(root)


def test_pod_never_rewrites_a_users_pod_toml_nor_mounts_over_files(tmp):
    """Issue 32, item 3: a pod.toml under ROOT that `ualinkd pod` did not write is refused
    (exit 2, one line saying --config or --overwrite) and kept byte for byte; --config
    ROOT/pod.toml runs it without touching it; a node directory that holds files is never
    mounted over (exit 2, the files still there)."""
    root = tmp / "pod"
    root.mkdir()
    before = own_pod_file(root / "pod.toml", ("node0",), 1, port0=False)
    r = subprocess.run([*UALINKD, "pod", "--nodes", "1", "--root", str(root)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr == (f"ualinkd: {root}/pod.toml is not one `ualinkd pod` wrote: run that "
                        f"pod with --config {root}/pod.toml, or pass --overwrite to replace "
                        "it\n")
    assert (root / "pod.toml").read_bytes() == before and not (root / "node0").exists()
    # run from it, but changed (--profile): the change would have to be written over it
    r = subprocess.run([*UALINKD, "pod", "--config", str(root / "pod.toml"), "--profile",
                        "mi210", "--root", str(root)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "copy it elsewhere" in r.stderr, r.stderr
    assert (root / "pod.toml").read_bytes() == before and not (root / "node0").exists()
    with pod_with(root, "--config", str(root / "pod.toml"), ready=1) as (proc, _):
        assert (root / "pod.toml").read_bytes() == before
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    assert (root / "pod.toml").read_bytes() == before
    other = tmp / "other"
    (other / "node0").mkdir(parents=True)
    (other / "node0" / "notes.txt").write_text("mine")
    r = subprocess.run([*UALINKD, "pod", "--nodes", "1", "--root", str(other)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"{other}/node0 is not empty" in r.stderr and "Traceback" not in r.stderr
    assert (other / "node0" / "notes.txt").read_text() == "mine"
    assert not fuse_mounts_under(other) and not (other / "pod.toml").exists()
    with pod_with(root, "--nodes", "1", "--overwrite", ready=1) as (proc, _):
        assert (root / "pod.toml").read_bytes() != before
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


@pytest.mark.parametrize("argv", [["pod", "--nodes", "1"], ["start-node", "node0"],
                                  ["pod", "--netns", "--nodes", "1"]])
@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_root_that_cannot_be_a_directory_is_one_line(tmp, argv, where):
    """Issue 32, item 9: --root naming a file, or a path under a file, is one line and a
    non-zero status, no traceback (and no pod started)."""
    (tmp / "f").write_text("")
    root = tmp / "f" if where == "file" else tmp / "f" / "pod"
    r = subprocess.run([*UALINKD, *argv, "--root", str(root)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode in (1, 2), r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert str(tmp / "f") in r.stderr


def test_pod_interrupted_before_ready_exits_with_the_signal(tmp):
    """Issue 32, item 9: a pod stopped by SIGINT before it served (here: waiting for a
    stopped node of a dead pod to leave the root) exits 130, as a shell reports an
    interrupted command, not 0."""
    root = tmp / "pod"
    with pod(root, nodes=1) as p:
        (node,) = p.nodes
        os.kill(node, signal.SIGSTOP)
        p.proc.kill()
        p.proc.wait()
    try:
        second = subprocess.Popen([*UALINKD, "pod", "--nodes", "1", "--root", str(root)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  preexec_fn=default_sighup)
        # it asks the stopped mount from a child (`stat -f`, 2 s) and waits up to 5 s
        # (_LIVE_MOUNT_GRACE) for it to go: interrupted there, with its handlers set
        assert wait_for(lambda: any(
            _is_child_stat(int(d), second.pid) for d in os.listdir("/proc") if d.isdigit()),
            30), "the pod never asked the stopped mount"
        second.send_signal(signal.SIGINT)
        out, err = second.communicate(timeout=30)
        assert second.returncode == 128 + signal.SIGINT, err
        assert " ready: " not in out
    finally:
        os.kill(node, signal.SIGCONT)  # its parent-death SIGTERM is delivered now
    assert wait_for(lambda: not alive(node), 10)
    assert wait_for(lambda: not fuse_mounts_under(root), 5)


def _is_child_stat(pid: int, parent: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return ppid == parent and f.read().split(b"\0")[0] == b"stat"
    except (OSError, ValueError, IndexError):
        return False


def test_ualinkd_run_sets_up_the_shim_and_refuses_what_is_not_a_node(tmp):
    """Issue 32, item 2: `ualinkd run NODE -- PROG` runs PROG with the shim preloaded and
    UALINK_DRI_DIR / UALINK_MOUNT the node's absolute paths (NODE a mount directory, or a
    name with --root), exit status PROG's; a pod root, a plain directory or a missing path
    is refused in one line naming why (the root's nodes suggested)."""
    root = tmp / "pod"
    with pod_with(root, "--nodes", "2", ready=2) as (proc, _):
        script = ('echo "$LD_PRELOAD|$UALINK_DRI_DIR|$UALINK_MOUNT"; '
                  'stat -c %t:%T /dev/dri/renderD128; lsmod | grep -c "^amdgpu "; exit 7')
        rel = os.path.relpath(root / "node1")
        for argv in (["run", rel, "--", "sh", "-c", script],
                     ["run", "--root", str(root), "node1", "sh", "-c", script]):
            r = subprocess.run([*UALINKD, *argv], capture_output=True, text=True, timeout=60)
            assert r.returncode == 7, r.stderr
            env, chr_, amdgpu = r.stdout.splitlines()
            shim, dri, mount = env.split("|")
            assert shim.endswith("libualink_shim.so") and os.path.isabs(shim)
            assert (dri, mount) == (f"{root}/node1/dri", f"{root}/node1")
            assert chr_ == "e2:80" and amdgpu == "1"  # 226:128, and lsmod lists amdgpu
        for bad, why in ((root, "not a mount point"), (tmp / "nope", "it does not exist")):
            r = subprocess.run([*UALINKD, "run", str(bad), "--", "true"], capture_output=True,
                               text=True, timeout=60)
            assert r.returncode == 2, r.stderr
            assert r.stderr.startswith(f"ualinkd run: {bad} is not a ualinkd node's mount "
                                       f"({why})"), r.stderr
        assert f"its nodes: {root}/node0, {root}/node1" in subprocess.run(
            [*UALINKD, "run", str(root), "--", "true"], capture_output=True, text=True,
            timeout=60).stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


@pytest.fixture(scope="module")
def public_pod() -> Iterator[tuple[Path, str]]:
    """One `ualinkd pod --nodes 2 --accels-per-node 2` in a directory every user may enter
    (pytest's own are 0700): (its root, its ready lines). Stopped, unmounted and removed
    afterwards."""
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="ualink-ctl-", dir="/tmp"))
    top.chmod(0o755)
    root = top / "pod"
    try:
        with pod_with(root, "--nodes", "2", "--accels-per-node", "2", ready=2) as (proc, out):
            yield root, out
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
    finally:
        left = pids_using(top)
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for point in reversed(fuse_mounts_under(top)):
            subprocess.run(["umount", "-l", point], capture_output=True)
        shutil.rmtree(top, ignore_errors=True)


def test_ready_line_names_every_render_node(public_pod):
    """Issue 32, item 9: a node with two accels is ready with both render nodes named."""
    root, out = public_pod
    ready = [ln for ln in out.splitlines() if " ready: " in ln]
    n1 = root / "node1"
    assert ready[1] == (f"node1 ready: mount={n1} render={n1}/dri/renderD128,"
                        f"{n1}/dri/renderD129 accels=2,3"), ready


def test_ualinkctl_pod_as_another_user(public_pod):
    """Issue 32, item 9: `ualinkctl pod ROOT` works for a user who cannot read pod.toml (it
    holds the key: mode 0600); the pod's key-less ROOT/.nodes.json names the nodes."""
    root, _ = public_pod
    assert (root / "pod.toml").stat().st_mode & 0o777 == 0o600
    r = subprocess.run([CTL, "pod", str(root)], capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)))
    assert r.returncode == 0, r.stderr
    rows = [ln.split() for ln in r.stdout.splitlines()[1:]]
    assert [(row[0], row[2], row[3]) for row in rows] == [
        ("node0", "0,1", "serving"), ("node1", "2,3", "serving")], r.stdout
    assert "(root only)" in r.stdout  # debugfs: the links are not this user's to read


def test_ualinkctl_pod_json_accels_are_numbers(public_pod):
    """Issue 32, item 9: `ualinkctl pod --json` gives each node's accels as a list of
    numbers, not the table's "0,1" string."""
    import json

    root, _ = public_pod
    r = subprocess.run([CTL, "pod", str(root), "--json"], capture_output=True, text=True,
                       timeout=60)
    assert [n["accels"] for n in json.loads(r.stdout)["nodes"]] == [[0, 1], [2, 3]]


def test_ualinkctl_pod_watch_says_when_and_clears_a_terminal(public_pod):
    """Issue 32, item 9: `ualinkctl pod --watch` heads each table with the pod and the time;
    to a file the tables follow one another, on a terminal each redraws the screen."""
    import pty

    root, _ = public_pod
    stamp = re.compile(rf"^{re.escape(str(root))} at \d\d:\d\d:\d\d \(every 0.2 s", re.M)
    log = root.parent / "watch.out"
    with open(log, "w") as f:
        watch = subprocess.Popen([CTL, "pod", str(root), "--watch", "0.2"], stdout=f)
    try:
        assert wait_for(lambda: len(stamp.findall(log.read_text())) >= 2, 30)
    finally:
        watch.send_signal(signal.SIGINT)
        watch.wait(30)
    assert "\x1b[2J" not in log.read_text()
    leader, follower = pty.openpty()
    watch = subprocess.Popen([CTL, "pod", str(root), "--watch", "0.2"], stdout=follower,
                             stderr=subprocess.DEVNULL)
    os.close(follower)
    seen = ""
    try:
        deadline = time.monotonic() + 30
        while seen.count("\x1b[H\x1b[2J") < 2 and time.monotonic() < deadline:
            seen += os.read(leader, 65536).decode(errors="replace")
    finally:
        watch.send_signal(signal.SIGINT)
        watch.wait(30)
        os.close(leader)
    assert seen.count(f"\x1b[H\x1b[2J{root} at ") >= 2, seen


def test_ualinkctl_mount_of_a_pod_root_names_its_nodes(public_pod):
    """Issue 32, item 9: `ualinkctl --mount ROOT` (a pod's root, not a node) says so and
    names ROOT/node0 and the pod's nodes."""
    root, _ = public_pod
    r = subprocess.run([CTL, "--mount", str(root), "state"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1
    assert r.stderr == (f"ualinkctl: {root} is not a ualinkd mount (no sys/class/drm); a pod "
                        f"root: --mount {root}/node0 (its nodes: node0, node1; `ualinkctl pod "
                        f"{root}` shows them all)\n"), r.stderr


def test_ualinkd_run_inside_a_netns_node(tmp):
    """Issue 32, items 1 and 2 on a `ualinkd pod --netns` pod: `ualinkd run --root POD-DIR
    NODE -- PROG` runs PROG inside the node's namespaces with the shim pointed at the node's
    mount there: /dev/dri/renderD128 is the node's character device 226:128, kmod's lsmod
    lists amdgpu with the node's sys/module/amdgpu (its size, not an error), and rocminfo
    lists the node's GPU (--profile mi210: the gfx90a ROCr 5.2.3 knows)."""
    from ualinkd.testing import PodUnavailable, check_prerequisites, cleanup_stale

    try:
        check_prerequisites()
    except PodUnavailable as e:
        pytest.skip(str(e))
    root = tmp / "pods"
    out = tmp / "netns.out"
    with open(out, "w") as f:
        proc = subprocess.Popen([*UALINKD, "pod", "--netns", "--nodes", "1", "--profile",
                                 "mi210", "--root", str(root)], stdout=f,
                                stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, preexec_fn=default_sighup)
    try:
        assert wait_for(lambda: "faults:" in out.read_text() or proc.poll() is not None, 60)
        assert proc.poll() is None, out.read_text()
        pod_dir = re.search(r"^pod dir: (.*)$", out.read_text(), re.M).group(1)
        r = subprocess.run([*UALINKD, "run", "--root", pod_dir, "node0", "--", "sh", "-c",
                            "stat -c %t:%T /dev/dri/renderD128; lsmod"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == "e2:80", r.stdout
        assert ["amdgpu", "9928704", "0"] in [ln.split() for ln in lines], r.stdout
        assert r.stderr == "", r.stderr  # no libkmod error, no word from the shim
        if shutil.which("rocminfo"):  # ROCr 5.2.3 finds the node's MI210 inside the node
            r = subprocess.run([*UALINKD, "run", "--root", pod_dir, "node0", "--", "rocminfo"],
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr
            assert "ROCk module is loaded" in r.stdout
            assert "amdgcn-amd-amdhsa--gfx90a" in r.stdout
        r = subprocess.run([*UALINKD, "run", "--root", pod_dir, "node9", "--", "true"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "node9" in r.stderr, r.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cleanup_stale(root)
