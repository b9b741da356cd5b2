"""A pod of real node daemons, each in its own network and mount namespace (tests, demos).

Layout of one pod (prefix `ualk-<owner pid>-<4 hex>`, so leftovers of a crashed run are
found by name and removed at the next start):

- a netns `<prefix>-fabric` holding the bridge `br0`;
- per node a netns `<prefix>-<node>` with `eth0` (10.177.0.<i+1>/24, veth to `v<i>` on the
  bridge) and `lo`; the daemon runs there in a private mount namespace where its `dri/`,
  `dmabuf/`, `sys/class/drm`, `sys/kernel/debug/{dri,ualink_fabric}` and GPU directories
  are bound over the same paths of a real host and its `sys/dev/char/226:*` links copied
  (see nodeinit), so a client started with `node.run()` opens the plain
  `/dev/dri/renderD128` and walks `/sys/dev/char/226:128/device` as on a real host;
- a state directory (pod.toml, logs, notify sockets, mount points, pod.json for the command
  line) under /tmp/ualinkd-pods/<prefix>.

The host never sees the mounts: it reads a node's files through `/proc/<pid>/root`. Cleanup
(`Pod.close`, also from `atexit` and on SIGTERM/SIGHUP through SystemExit) kills every
process in the pod's namespaces and deletes the namespaces, which takes the veths, the
bridge and the mount namespaces (with the FUSE mounts) with them.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from .. import sysfs
from ..bounded import DEFAULT_TIMEOUT, NotAnswering, bounded
from ..config import AccelConfig, NodeConfig, PodConfig, VpodConfig
from ..fabric.dialing import links_at_start
from ..podinfo import NetnsNodeState, NetnsPodState, ReadError, node_leaks, node_report, pid_alive
from ..readiness import notify_socket, wait_ready
from ..ualink.state import AddrMode
from .agent import Agent

PREFIX = "ualk-"
STATE_ROOT = Path(os.environ.get("UALINKD_POD_STATE", "/tmp/ualinkd-pods"))
SUBNET = "10.177.0"
FABRIC_PORT = 7100
RENDER_MINOR = sysfs.RENDER_MINOR_BASE
_NS_RE = re.compile(r"^(ualk-(\d+)-[0-9a-f]{4})-")


class PodError(RuntimeError):
    """The pod could not do what was asked; the message says what and on which node."""


class PodUnavailable(PodError):
    """This machine cannot run namespaced pods (not root, a tool or /dev/fuse missing,
    netem not in the kernel); the message says exactly what is missing."""


# -- prerequisites ------------------------------------------------------------------------------
def _effective_caps() -> int:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return 0


def check_prerequisites() -> None:
    """Raise PodUnavailable naming everything that is missing."""
    missing = []
    caps = _effective_caps()
    for bit, name, why in ((21, "CAP_SYS_ADMIN", "namespaces and FUSE mounts"),
                           (12, "CAP_NET_ADMIN", "network namespaces and veths")):
        if not caps >> bit & 1:
            how = ("run as root" if os.geteuid() != 0
                   else f"in a container: --cap-add {name.removeprefix('CAP_')}")
            missing.append(f"{name} for {why} ({how})")
    for tool, pkg in (("ip", "iproute2"), ("unshare", "util-linux"),
                      ("nsenter", "util-linux"), ("mount", "mount")):
        if shutil.which(tool) is None:
            missing.append(f"the `{tool}` command ({pkg})")
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as e:
        hint = ("modprobe fuse" if e.errno == errno.ENOENT
                else "in a container: --device /dev/fuse")
        missing.append(f"/dev/fuse ({e.strerror}: {hint})")
    if missing:
        raise PodUnavailable("cannot run a namespaced ualink pod: missing " + "; ".join(missing))


def _run(cmd: Sequence[str], what: str, input: str | None = None,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(list(cmd), input=input, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise PodError(f"{what}: `{' '.join(cmd)}` failed: {r.stderr.strip() or r.returncode}")
    return r


def _netns_list() -> list[str]:
    try:
        return sorted(os.listdir("/run/netns"))
    except FileNotFoundError:
        return []


def _destroy_netns(names: Iterable[str]) -> None:
    """Kill every process in each netns (SIGCONT first: stopped ones must die too), then
    delete it (its veths, bridge and routes go with it)."""
    names = list(names)
    for _ in range(3):
        pids: set[int] = set()
        for ns in names:
            r = _run(["ip", "netns", "pids", ns], "list pids", check=False)
            pids |= {int(p) for p in r.stdout.split() if p.strip().isdigit()}
        if not pids:
            break
        for sig in (signal.SIGKILL, signal.SIGCONT):
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
    for ns in names:
        _run(["ip", "netns", "delete", ns], "delete netns", check=False)


def cleanup_stale(state_root: Path = STATE_ROOT) -> list[str]:
    """Remove what pods of dead owner processes left behind (namespaces, their processes,
    state directories); the prefixes removed."""
    stale: dict[str, list[str]] = {}
    for ns in _netns_list():
        m = _NS_RE.match(ns)
        if m and not pid_alive(int(m.group(2))):
            stale.setdefault(m.group(1), []).append(ns)
    for names in stale.values():
        _destroy_netns(names)
    if state_root.is_dir():
        for d in state_root.iterdir():
            m = re.match(r"^ualk-(\d+)-[0-9a-f]{4}$", d.name)
            if m and not pid_alive(int(m.group(1))):
                stale.setdefault(d.name, [])
                shutil.rmtree(d, ignore_errors=True)
    return sorted(stale)


# -- cleanup on the way out ---------------------------------------------------------------------
_live_pods: weakref.WeakSet[Pod] = weakref.WeakSet()


def _close_all() -> None:
    for pod in list(_live_pods):
        with contextlib.suppress(Exception):
            pod.close()


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds context managers, then atexit runs


def _install_exit_handlers() -> None:
    if getattr(_install_exit_handlers, "done", False):
        return
    _install_exit_handlers.done = True  # type: ignore[attr-defined]  # a once-only mark
    atexit.register(_close_all)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread: atexit only
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _exit_on_signal)


# -- the config ---------------------------------------------------------------------------------
def pod_config(nodes: int = 2, accels_per_node: int = 1,
               vpods: dict[int, Iterable[int]] | None = None,
               addr_mode: AddrMode = AddrMode.SOURCE_ALIASING,
               response_timeout_ms: int = 5000, send_ack_timeout_ms: int | None = None,
               vram_size: int | None = None) -> PodConfig:
    """A pod config for `Pod`: node i has accels i*K … i*K+K-1; `vpods` maps vPod id →
    member accels (default: every accel in vPod 1). Addresses are filled in by `Pod`."""
    base = PodConfig.local(nodes, accels_per_node)
    if vpods is None:
        vpods = {1: range(nodes * accels_per_node)}
    node_cfgs = tuple(
        replace(n, accels=tuple(AccelConfig(a.accel_id, vram_size=vram_size or None)
                                for a in n.accels))
        for n in base.nodes)
    cfg = replace(base, nodes=node_cfgs,
                  vpods=tuple(VpodConfig(v, frozenset(m), addr_mode) for v, m in vpods.items()),
                  response_timeout_ms=response_timeout_ms,
                  send_ack_timeout_ms=send_ack_timeout_ms or response_timeout_ms)
    cfg.validate()
    return cfg


# -- one node -----------------------------------------------------------------------------------
class PodNode:
    """One node daemon of a `Pod`: where it lives, how to read its files, and its faults."""

    def __init__(self, pod: Pod, index: int, config: NodeConfig) -> None:
        self.pod = pod
        self.index = index
        self.name = config.name
        self.accels = tuple(a.accel_id for a in config.accels)
        self.netns = f"{pod.prefix}-{config.name}"
        self.ip = f"{SUBNET}.{index + 1}"
        self.bridge_port = f"v{index}"
        self.dir = pod.dir / config.name
        self.mount = self.dir / "mnt"
        self.proc: subprocess.Popen[bytes] | None = None
        self.attached_pid: int | None = None  # a daemon another process started (attach)
        self.generation = 0  # daemon starts so far
        self.clients: list[subprocess.Popen[str]] = []

    def __repr__(self) -> str:
        return f"<PodNode {self.name} {self.ip} pid={self.pid}>"

    # -- where things are --------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        if self.proc is None:
            pid = self.attached_pid
            return pid if pid is not None and pid_alive(pid) else None
        return self.proc.pid if self.proc.poll() is None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    def _need_pid(self) -> int:
        pid = self.pid
        if pid is None:
            raise PodError(f"{self.name} is not running")
        return pid

    @property
    def root(self) -> Path:
        """The node's mount as the host reaches it (through the daemon's mount namespace)."""
        return Path(f"/proc/{self._need_pid()}/root{self.mount}")

    def minor(self, accel: int) -> int:
        return RENDER_MINOR + self.accels.index(accel)

    def render(self, accel: int | None = None) -> str:
        """The render node path *inside* the node (for clients run there)."""
        minor = RENDER_MINOR if accel is None else self.minor(accel)
        return f"/dev/dri/renderD{minor}"

    def read(self, rel: str, timeout: float = DEFAULT_TIMEOUT) -> str:
        """A file of the node's mount (e.g. "sys/kernel/debug/ualink_fabric"); a stopped
        node raises PodError after `timeout` s instead of blocking the caller for good."""
        try:
            return bounded(lambda: (self.root / rel).read_text(), self.name, timeout)
        except NotAnswering as e:
            raise PodError(str(e)) from None

    def write(self, rel: str, text: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        try:
            bounded(lambda: (self.root / rel).write_text(text), self.name, timeout)
        except NotAnswering as e:
            raise PodError(str(e)) from None

    def debug(self, name: str, minor: int = RENDER_MINOR) -> str:
        return self.read(sysfs.debugfs_file(minor, name))

    def sysfs(self, name: str, minor: int = RENDER_MINOR) -> str:
        return self.read(sysfs.ualink_file(minor, name))

    def fabric(self) -> dict[str, bool]:
        """Peer node name → link up."""
        return sysfs.parse_fabric(self.read(sysfs.FABRIC_STATUS))

    def report(self) -> dict[str, object]:
        """What `ualinkctl --mount <node> --json all` prints for this node."""
        try:
            return node_report(self.root)
        except ReadError as e:
            raise PodError(f"{self.name}: {e}") from None

    def leaks(self) -> list[str]:
        """What this node still holds (pins, NPA ranges, handles, open files, imports)."""
        try:
            return node_leaks(self.root, self.name)
        except ReadError as e:
            raise PodError(f"{self.name}: {e}") from None

    # -- clients inside the node ------------------------------------------------------------
    def enter_cmd(self, argv: Sequence[str], cwd: str | None = None) -> list[str]:
        """argv prefixed so that it runs in this node's network and mount namespaces."""
        pid = self._need_pid()
        return ["nsenter", f"--net=/run/netns/{self.netns}", f"--mount=/proc/{pid}/ns/mnt",
                f"--wd={cwd or os.getcwd()}", "--", *argv]

    def run(self, argv: Sequence[str], *, check: bool = False, timeout: float = 30,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run a command inside the node to completion (text output captured)."""
        return subprocess.run(self.enter_cmd(argv), capture_output=True, text=True,
                              check=check, timeout=timeout, input=input)

    def popen(self, argv: Sequence[str], **kw: object) -> subprocess.Popen[str]:
        """Start a command inside the node; the pod kills it at close if it still runs."""
        kw.setdefault("text", True)
        proc = subprocess.Popen(self.enter_cmd(argv), **kw)  # type: ignore[call-overload]  # Popen's
        self.clients.append(proc)
        return proc

    def agent(self) -> Agent:
        """A libualink client process inside the node, driven from the test (see agent)."""
        return Agent(self)

    # -- life --------------------------------------------------------------------------------
    def start(self, timeout: float = 20) -> None:
        self._wait_started(*self._launch(), timeout)

    def _launch(self) -> tuple[socket.socket, Path]:
        """Start the daemon; its readiness socket and log, for `_wait_started`."""
        if self.running:
            raise PodError(f"{self.name} is already running")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(exist_ok=True)
        notify = self.dir / "notify"
        sock = notify_socket(notify)
        cmd = ["ip", "netns", "exec", self.netns,
               "unshare", "--mount", "--propagation", "private",
               sys.executable, "-m", "ualinkd.netns.nodeinit", "--stage",
               str(self.dir / "stage"), "--",
               sys.executable, "-m", "ualinkd", "node", "--config", str(self.pod.config_path),
               "--node", self.name, "--mount", str(self.mount)]
        if self.pod.trace:
            cmd.append(f"--trace={self.pod.trace}")
            if self.pod.trace_file is not None:  # the same path inside: /dev, /sys are new
                cmd.append(f"--trace-file={self.pod.trace_file}")
            cmd += [f"--trace-filter={t}" for t in self.pod.trace_filter]
        self.generation += 1
        log = self.dir / f"daemon.{self.generation}.log"
        env = dict(os.environ, NOTIFY_SOCKET=str(notify))
        try:
            with open(log, "wb") as logf:
                self.proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=env,
                                             start_new_session=True)
        except BaseException:
            sock.close()
            raise
        return sock, log

    def _wait_started(self, sock: socket.socket, log: Path, timeout: float) -> None:
        """Until the daemon `_launch` started is ready, then its files bound in place."""
        assert self.proc is not None
        try:
            if not wait_ready(sock, self.proc, timeout):
                self.kill()
                raise PodError(f"{self.name} did not become ready:\n"
                               f"{log.read_text(errors='replace')[-3000:]}")
        finally:
            sock.close()
        self.pod._save_state()
        _run(["nsenter", f"--mount=/proc/{self.proc.pid}/ns/mnt", "--", sys.executable, "-m",
              "ualinkd.netns.nodeinit", "--bind", str(self.mount)],
             f"{self.name}: bind the node's files over /dev/dri and its GPUs' /sys")

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace")
                       for p in sorted(self.dir.glob("daemon.*.log")))

    def signal(self, sig: int) -> None:
        os.kill(self._need_pid(), sig)

    def kill(self) -> None:
        """SIGKILL the daemon (a crash): its mount namespace and FUSE mount go with it once
        no client is left inside."""
        if self.proc is None and self.pid is not None:
            self.signal(signal.SIGKILL)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.send_signal(signal.SIGCONT)
            self.proc.wait()

    def stop(self) -> None:
        """SIGSTOP the daemon (a hung node); its files then block readers until `cont()`."""
        self.signal(signal.SIGSTOP)

    def cont(self) -> None:
        self.signal(signal.SIGCONT)

    def terminate(self, timeout: float = 10) -> None:
        """A clean shutdown (SIGTERM), SIGKILL if it takes longer than `timeout`."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self, kill: bool = False, wait_links: bool = True) -> None:
        """A fresh daemon with no state (a node reset): SIGKILL (kill=True) or SIGTERM the
        old one if it still runs, start a new one, wait until its links are up."""
        if kill:
            self.kill()
        else:
            self.terminate()
        self.start()
        if wait_links:
            self.pod.wait_links()

    def _ip_fabric(self, *args: str) -> None:
        _run(["ip", "-n", self.pod.fabric_netns, "link", "set", self.bridge_port, *args],
             f"{self.name}: link {' '.join(args)}")

    def cut(self) -> None:
        """Pull the node's cable: its bridge port goes down (carrier lost on both ends);
        packets are dropped, TCP connections stay until someone times out."""
        self._ip_fabric("down")

    def heal(self) -> None:
        self._ip_fabric("up")

    def netem(self, delay_ms: float = 0, loss_pct: float = 0, jitter_ms: float = 0) -> None:
        """Delay/loss on the node's eth0 (tc netem); all zero removes it."""
        if shutil.which("tc") is None:
            raise PodUnavailable("netem needs the `tc` command (iproute2)")
        base = ["ip", "netns", "exec", self.netns, "tc", "qdisc"]
        if not delay_ms and not loss_pct:
            _run([*base, "del", "dev", "eth0", "root"], "netem off", check=False)
            return
        spec = ["netem"]
        if delay_ms:
            spec += ["delay", f"{delay_ms}ms"] + ([f"{jitter_ms}ms"] if jitter_ms else [])
        if loss_pct:
            spec += ["loss", f"{loss_pct}%"]
        r = _run([*base, "replace", "dev", "eth0", "root", *spec], "netem", check=False)
        if r.returncode != 0:
            if "unknown" in r.stderr.lower() or "not supported" in r.stderr.lower() \
                    or "no such file" in r.stderr.lower():
                raise PodUnavailable(
                    "tc netem is not available: this kernel has no sch_netem "
                    f"(CONFIG_NET_SCH_NETEM, module sch_netem); tc said: {r.stderr.strip()}")
            raise PodError(f"{self.name}: tc netem failed: {r.stderr.strip()}")

    def drop_next(self, msg_type: int, minor: int = RENDER_MINOR) -> None:
        """Drop the next received message of type `msg_type` on that accel (§5.12: one bit
        of the debugfs drop bitmap, cleared when it fires)."""
        rel = sysfs.debugfs_file(minor, sysfs.DROP_MSG)
        bitmap = sysfs.parse_drop_msg(self.read(rel)) | 1 << int(msg_type)
        self.write(rel, sysfs.show_drop_msg(bitmap))

    def _config(self, accel: int, **values: object) -> None:
        base = sysfs.ualink_file(self.minor(accel), "config")
        for name, value in values.items():
            if isinstance(value, set | frozenset):
                value = sorted(value)
            self.write(f"{base}/{name}", sysfs.show_value(value))
        self.write(f"{base}/commit", "true")

    def deactivate(self, accel: int | None = None) -> None:
        """Take an accel out of its vPod (config/vpod_id 0 + commit: PPOD_CONFIGURED)."""
        self._config(self.accels[0] if accel is None else accel, vpod_id=0)

    def join(self, accel: int, vpod_id: int, members: Iterable[int],
             addr_mode: AddrMode | None = None) -> None:
        """config/ vpod_id, vpod_size, vpod_active_accels (and addr_mode) + commit."""
        members = sorted(set(members))
        values: dict[str, object] = {"vpod_id": vpod_id, "vpod_size": len(members),
                                     "vpod_active_accels": members}
        if addr_mode is not None:
            values["addr_mode"] = addr_mode
        self._config(accel, **values)


# -- the pod ------------------------------------------------------------------------------------
class Pod:
    """N node daemons in namespaces. Use as a context manager (or call start()/close())."""

    def __init__(self, config: PodConfig | None = None, *, trace: str | None = None,
                 state_root: Path | str | None = None, ready_timeout: float = 20,
                 trace_file: Path | str | None = None,
                 trace_filter: Sequence[str] = ()) -> None:
        """`trace` ("text" or "json") traces every node into its daemon log, or with
        `trace_file` into that file (shared by the nodes, truncated at start, kept after
        close); `trace_filter` are `--trace-filter` terms."""
        config = config or pod_config()
        if len(config.nodes) > 250:
            raise PodError("at most 250 nodes in a namespaced pod")
        nodes = tuple(replace(n, address=f"{SUBNET}.{i + 1}:{FABRIC_PORT}")
                      for i, n in enumerate(config.nodes))
        self.config = replace(config, nodes=nodes)
        self.config.validate()
        self.trace = trace
        self.trace_file = Path(trace_file).absolute() if trace_file is not None else None
        self.trace_filter = tuple(trace_filter)
        if (self.trace_file or self.trace_filter) and not trace:
            raise PodError("trace_file and trace_filter need trace")
        self.ready_timeout = ready_timeout
        self.prefix = f"{PREFIX}{os.getpid()}-{secrets.token_hex(2)}"
        self.dir = Path(state_root or STATE_ROOT) / self.prefix
        self.config_path = self.dir / "pod.toml"
        self.fabric_netns = f"{self.prefix}-fabric"
        self.nodes = [PodNode(self, i, n) for i, n in enumerate(self.config.nodes)]
        self._netns: list[str] = []
        self._closed = False

    def __repr__(self) -> str:
        return f"<Pod {self.prefix} {len(self.nodes)} nodes>"

    @classmethod
    def attach(cls, pod_dir: str | Path) -> Pod:
        """The pod another process runs (its state directory): for faults and reading. It
        does not own the pod: close() does nothing, start()/restart() are not possible."""
        pod_dir = Path(pod_dir)
        try:
            state = NetnsPodState.load(pod_dir)
        except ReadError as e:
            raise PodError(str(e)) from None
        pod = cls(PodConfig.load(pod_dir / "pod.toml"))
        pod.prefix, pod.dir = state.prefix, pod_dir
        pod.config_path, pod.fabric_netns = pod_dir / "pod.toml", state.fabric_netns
        for node, ns in zip(pod.nodes, state.nodes, strict=True):
            node.netns, node.ip, node.bridge_port = ns.netns, ns.ip, ns.bridge_port
            node.dir, node.mount = Path(ns.mount).parent, Path(ns.mount)
            node.attached_pid = ns.pid
        pod._closed = True
        return pod

    def node(self, key: int | str) -> PodNode:
        if isinstance(key, int):
            return self.nodes[key]
        for n in self.nodes:
            if n.name == key:
                return n
        raise PodError(f"no node named {key!r} (have: {', '.join(n.name for n in self.nodes)})")

    def owner(self, accel: int) -> PodNode:
        """The node that holds `accel`."""
        for n in self.nodes:
            if accel in n.accels:
                return n
        raise PodError(f"no node holds accel {accel}")

    # -- life --------------------------------------------------------------------------------
    def __enter__(self) -> Pod:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Pod:
        check_prerequisites()
        cleanup_stale(self.dir.parent)
        _install_exit_handlers()
        _live_pods.add(self)
        try:
            self.dir.parent.mkdir(parents=True, exist_ok=True)
            self.dir.mkdir(mode=0o700)  # pod.toml holds the pod key
            self.config_path.write_text(self.config.to_toml())
            if self.trace_file is not None:
                self.trace_file.write_text("")  # this pod's trace; its nodes append to it
            self._make_network()
            # Every daemon starts at once, then each is waited for: one at a time, a pod of
            # 32 took as many start-ups end to end (a second or so each, on 2 CPUs).
            launched: list[tuple[PodNode, socket.socket, Path]] = []
            try:
                for node in self.nodes:
                    launched.append((node, *node._launch()))
                while launched:
                    node, sock, log = launched[0]
                    node._wait_started(sock, log, self.ready_timeout)  # (closes sock)
                    launched.pop(0)
            finally:
                for _, sock, _ in launched:
                    sock.close()
            self.wait_links(self.ready_timeout)
        except BaseException:
            self.close()
            raise
        return self

    def _add_netns(self, name: str) -> None:
        _run(["ip", "netns", "add", name], f"create netns {name}")
        self._netns.append(name)

    def _make_network(self) -> None:
        self._add_netns(self.fabric_netns)
        fab = ["link add br0 type bridge", "link set br0 up", "link set lo up"]
        for node in self.nodes:
            self._add_netns(node.netns)
            fab += [f"link add {node.bridge_port} type veth peer name eth0 netns {node.netns}",
                    f"link set {node.bridge_port} master br0",
                    f"link set {node.bridge_port} up"]
        _run(["ip", "-n", self.fabric_netns, "-batch", "-"], "make the fabric bridge",
             input="\n".join(fab) + "\n")
        for node in self.nodes:
            _run(["ip", "-n", node.netns, "-batch", "-"], f"{node.name}: address its eth0",
                 input=f"addr add {node.ip}/24 dev eth0\nlink set eth0 up\nlink set lo up\n")

    def _save_state(self) -> None:
        """pod.json (podinfo.NetnsPodState): how other processes reach the pod."""
        NetnsPodState(self.prefix, os.getpid(), self.fabric_netns, tuple(
            NetnsNodeState(n.name, n.index, n.netns, n.ip, n.pid, str(n.mount), n.accels,
                           n.bridge_port) for n in self.nodes)).save(self.dir)

    def close(self) -> None:
        """Stop every daemon and client, delete the namespaces and the state directory.
        Safe to call twice, and from atexit."""
        if self._closed:
            return
        self._closed = True
        _live_pods.discard(self)
        for node in self.nodes:
            for c in node.clients:
                if c.poll() is None:
                    c.kill()
            with contextlib.suppress(Exception):
                node.terminate(timeout=5)
        for node in self.nodes:
            for c in node.clients:
                with contextlib.suppress(Exception):
                    c.wait(5)
        _destroy_netns(self._netns)
        if os.environ.get("UALINKD_POD_KEEP_LOGS"):
            return
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- waiting and checking ----------------------------------------------------------------
    def running_nodes(self) -> list[PodNode]:
        return [n for n in self.nodes if n.running]

    def wait_links(self, timeout: float = 10) -> None:
        """Until every running node reports every other running node's link up; at once
        for a pod whose links come up on first use (fabric/dialing.py), which has none
        until its nodes use them."""
        if not links_at_start(self.config.fabric_links, len(self.config.nodes)):
            return
        deadline = time.monotonic() + timeout
        while True:
            alive = self.running_nodes()
            names = {n.name for n in alive}
            down = [f"{n.name}->{peer}" for n in alive
                    for peer, up in n.fabric().items() if peer in names and not up]
            if not down:
                return
            if time.monotonic() > deadline:
                raise PodError(f"fabric links still down after {timeout} s: {', '.join(down)}")
            time.sleep(0.02)

    def leaks(self) -> list[str]:
        return [leak for n in self.running_nodes() for leak in n.leaks()]

    def assert_clean(self, timeout: float = 5) -> None:
        """Every running node holds nothing (waits up to `timeout` for cleanup to finish)."""
        deadline = time.monotonic() + timeout
        while (found := self.leaks()) and time.monotonic() < deadline:
            time.sleep(0.05)
        if found:
            raise AssertionError("left behind:\n  " + "\n  ".join(found))

    # -- vPods -------------------------------------------------------------------------------
    def vpod_of(self, accel: int) -> int:
        node = self.owner(accel)
        return int(node.sysfs("vpod_id", node.minor(accel)))

    def set_vpod(self, vpod_id: int, members: Iterable[int],
                 addr_mode: AddrMode | None = None) -> None:
        """Make `members` the vPod `vpod_id` at runtime: an accel in another vPod leaves it
        first (vpod_id 0 + commit), then every member gets the new id, size and member list
        + commit (members already there are bounced by the membership change, §5.9)."""
        members = sorted(set(members))
        for accel in members:
            current = self.vpod_of(accel)
            if current not in (0, vpod_id):
                self.owner(accel).deactivate(accel)
        for accel in members:
            self.owner(accel).join(accel, vpod_id, members, addr_mode)

    def deactivate(self, accel: int) -> None:
        self.owner(accel).deactivate(accel)
