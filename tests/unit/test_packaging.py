"""packaging/: the container entrypoint run for real (dry run, and one real node), the
compose file and the Kubernetes manifests checked against the pod config schema, and the
systemd unit's ExecStart checked against the CLI's own parser."""

from __future__ import annotations

import configparser
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from ualinkd.cli.main import build_parser, free_tcp_ports, main
from ualinkd.config import PodConfig
from ualinkd.fabric.link import parse_address

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "packaging"
ENTRYPOINT = PKG / "entrypoint.sh"
VENV_BIN = Path(sys.executable).parent


def entrypoint(tmp: Path, env: dict[str, str], *args: str,
               timeout: float = 30) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "UALINK_PYTHON": sys.executable,
            "UALINK_RUNDIR": str(tmp / "run"), "UALINK_MOUNT": str(tmp / "mnt"),
            "UALINK_DRY_RUN": "1"}
    return subprocess.run(["bash", str(ENTRYPOINT), *args], env=base | env, text=True,
                          capture_output=True, timeout=timeout)


def write_pod(tmp: Path, nodes: int = 2) -> Path:
    conf = tmp / "pod.toml"
    conf.write_text(PodConfig.local(nodes, 1, free_tcp_ports(nodes)).to_toml())
    return conf


def parse_node_argv(argv: list[str]):
    args = build_parser().parse_args(argv)
    assert args.command == "node"
    return args


# -- the entrypoint ------------------------------------------------------------------------------


def test_entrypoint_validates_and_prints_the_exec_line(tmp_path):
    conf = write_pod(tmp_path)
    r = entrypoint(tmp_path, {"UALINK_CONFIG": str(conf), "UALINK_NODE": "node1",
                              "UALINK_TRACE": "json"}, "--kernel-quirks", "hello-no-reset")
    assert r.returncode == 0, r.stderr
    argv = shlex.split(r.stdout)
    assert argv[:2] == ["exec", "ualinkd"]
    args = parse_node_argv(argv[2:])
    assert (args.config, args.node, args.mount) == (str(conf), "node1", str(tmp_path / "mnt"))
    assert (args.trace, args.kernel_quirks) == ("json", "hello-no-reset")  # extra args pass
    assert (tmp_path / "mnt").is_dir()  # the mount point was made


def test_entrypoint_defaults_are_the_documented_paths(tmp_path):
    conf = write_pod(tmp_path)
    env = {"UALINK_CONFIG": str(conf), "UALINK_NODE": "node0"}
    r = subprocess.run(["bash", str(ENTRYPOINT)], text=True, capture_output=True, timeout=30,
                       env={"PATH": os.environ["PATH"], "UALINK_PYTHON": sys.executable,
                            "UALINK_DRY_RUN": "1", **env})
    assert r.returncode == 0, r.stderr
    assert shlex.split(r.stdout)[-2:] == ["--mount", "/run/ualinkd/node"]


@pytest.mark.parametrize("case, says", [
    ("unknown node", "invalid pod config: {conf}: no node named 'node7' (have: node0, node1)"),
    ("no config", "no pod config at {tmp}/absent.toml (mount it there, or set UALINK_CONFIG)"),
    ("short key", "invalid pod config: {conf}: [pod] key must be at least 16 bytes"),
    ("bad toml", "invalid pod config: {conf}: not valid TOML"),
])
def test_entrypoint_refuses_a_config_it_cannot_run(tmp_path, case, says):
    conf = write_pod(tmp_path)
    env = {"UALINK_CONFIG": str(conf), "UALINK_NODE": "node0"}
    if case == "unknown node":
        env["UALINK_NODE"] = "node7"
    elif case == "no config":
        env["UALINK_CONFIG"] = str(tmp_path / "absent.toml")
    elif case == "short key":
        (tmp_path / "key").write_text("00ff\n")
        env["UALINK_KEY_FILE"] = str(tmp_path / "key")
    else:
        conf.write_text("[pod\n")
    r = entrypoint(tmp_path, env)
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert line.startswith("ualinkd-entrypoint: " + says.format(conf=conf, tmp=tmp_path)), line


def test_entrypoint_splices_the_key_file_into_a_private_copy(tmp_path):
    conf = write_pod(tmp_path)
    key = "ab" * 32
    (tmp_path / "key").write_text(key + "\n")
    r = entrypoint(tmp_path, {"UALINK_CONFIG": str(conf), "UALINK_NODE": "node0",
                              "UALINK_KEY_FILE": str(tmp_path / "key")})
    assert r.returncode == 0, r.stderr
    args = parse_node_argv(shlex.split(r.stdout)[2:])
    effective = Path(args.config)
    assert effective == tmp_path / "run" / "pod.toml"
    assert effective.stat().st_mode & 0o777 == 0o600
    cfg = PodConfig.load(effective)
    assert cfg == replace(PodConfig.load(conf), key=key)  # nothing else changed


def test_entrypoint_takes_the_key_from_the_environment(tmp_path):
    """UALINK_KEY (a Secret as an environment variable: podman kube play has no Secret
    volumes) is spliced in as UALINK_KEY_FILE's is; both at once are refused."""
    conf = write_pod(tmp_path)
    key = "ab" * 32
    r = entrypoint(tmp_path, {"UALINK_CONFIG": str(conf), "UALINK_NODE": "node0",
                              "UALINK_KEY": key})
    assert r.returncode == 0, r.stderr
    copy = tmp_path / "run" / "pod.toml"
    assert f"--config {copy} " in r.stdout
    assert tomllib.loads(copy.read_text())["pod"]["key"] == key
    assert copy.stat().st_mode & 0o777 == 0o600
    (tmp_path / "k").write_text(key)
    r = entrypoint(tmp_path, {"UALINK_CONFIG": str(conf), "UALINK_NODE": "node0",
                              "UALINK_KEY": key, "UALINK_KEY_FILE": str(tmp_path / "k")})
    assert r.returncode == 2 and "both set" in r.stderr


def test_entrypoint_makes_an_emptydir_run_directory_its_own(tmp_path):
    """An orchestrator's emptyDir at /run/ualinkd is mode 0777; the trace socket lives there and
    a daemon refuses a trace directory others may write (issue 29, replay/record.py
    check_trace_dir), so the entrypoint takes group/other write off a run directory it owns."""
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o777)
    r = entrypoint(tmp_path, {"UALINK_CONFIG": str(write_pod(tmp_path)), "UALINK_NODE": "node0"})
    assert r.returncode == 0, r.stderr
    assert run.stat().st_mode & 0o022 == 0


@pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="the entrypoint wants /dev/fuse")
def test_entrypoint_says_it_waits_for_its_address(tmp_path):
    """Issue 32: the wait for the node's own fabric name (a headless Service's record) is
    said at once, not after a silent minute, and its failure names what to check."""
    doc = tomllib.loads(write_pod(tmp_path).read_text())
    doc["nodes"][0]["address"] = "ualinkd-0.no-such-service.invalid:7000"
    conf = tmp_path / "named.toml"
    conf.write_text(PodConfig.from_dict(doc).to_toml())
    start = time.monotonic()
    r = entrypoint(tmp_path, {"UALINK_CONFIG": str(conf), "UALINK_NODE": "node0",
                              "UALINK_DRY_RUN": "0", "UALINK_DNS_WAIT": "2"})
    assert r.returncode == 1 and time.monotonic() - start < 20, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == ("ualinkd-entrypoint: waiting for our fabric address "
                        "ualinkd-0.no-such-service.invalid to resolve (2s left)"), lines
    assert "does not resolve after 2s" in lines[-1] and "headless Service" in lines[-1]


def test_entrypoint_runs_a_node_config_without_the_pod_key(tmp_path):
    """Issue 10 item 8: a node's own file from `ualinkd node-config` (its link keys, no pod
    key) is a config the entrypoint runs; it refuses the file for another node, which has no
    key for that node's link with a third."""
    conf = write_pod(tmp_path, nodes=3)
    own = tmp_path / "node0.toml"
    assert main(["node-config", "--config", str(conf), "--node", "node0", "--out",
                 str(own)]) == 0
    assert own.stat().st_mode & 0o777 == 0o600
    assert PodConfig.load(own).key == ""
    r = entrypoint(tmp_path, {"UALINK_CONFIG": str(own), "UALINK_NODE": "node0"})
    assert r.returncode == 0, r.stderr
    assert parse_node_argv(shlex.split(r.stdout)[2:]).config == str(own)
    r = entrypoint(tmp_path, {"UALINK_CONFIG": str(own), "UALINK_NODE": "node1"})
    assert r.returncode == 2
    assert "no key for the link between 'node1' and 'node2'" in r.stderr


@pytest.mark.integration
def test_entrypoint_runs_a_node_and_clears_its_stale_mount(tmp_path):
    """The real thing: exec'd into a daemon that says READY=1 and serves the mount; after a
    SIGKILL the next start clears the dead mount; SIGTERM unmounts."""
    from ualinkd.fuse.lowlevel import clear_stale_mount, fuse_mounts_at

    conf = write_pod(tmp_path, nodes=1)
    mount = tmp_path / "mnt"
    notify = tmp_path / "notify"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify))
    sock.settimeout(0.1)

    def start() -> subprocess.Popen[str]:
        env = {"PATH": os.environ["PATH"], "UALINK_PYTHON": sys.executable,
               "UALINKD": str(VENV_BIN / "ualinkd"), "UALINK_CONFIG": str(conf),
               "UALINK_NODE": "node0", "UALINK_MOUNT": str(mount),
               "NOTIFY_SOCKET": str(notify)}
        proc = subprocess.Popen(["bash", str(ENTRYPOINT)], env=env, text=True,
                                stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if b"READY=1" in sock.recv(64):
                    return proc
            except TimeoutError:
                pass
            assert proc.poll() is None, proc.stderr.read()
        proc.kill()
        raise AssertionError("no READY=1")

    procs = []
    try:
        proc = start()
        procs.append(proc)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert b"node" in cmdline and b"bash" not in cmdline[0]  # exec'd: no shell left
        assert (mount / "dri" / "renderD128").exists()
        proc.kill()
        proc.wait()
        assert fuse_mounts_at(str(mount))  # the dead daemon's mount
        proc = start()
        procs.append(proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        assert "clearing the stale FUSE mount at " + str(mount) in proc.stderr.read()
        assert not fuse_mounts_at(str(mount))
    finally:
        sock.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        if fuse_mounts_at(str(mount)):
            clear_stale_mount(mount)


# -- compose -----------------------------------------------------------------------------------


def test_compose_runs_the_nodes_of_its_pod_config():
    doc = yaml.safe_load((PKG / "compose.yaml").read_text())
    services = doc["services"]
    assert len(services) == 3
    toml_sources = set()
    for name, svc in services.items():
        assert svc["environment"]["UALINK_NODE"] == name
        assert svc["hostname"] == name
        assert "/dev/fuse:/dev/fuse" in svc["devices"] and "SYS_ADMIN" in svc["cap_add"]
        assert (PKG / svc["build"]["context"] / svc["build"]["dockerfile"]).resolve() == \
            PKG / "Containerfile"
        (vol,) = svc["volumes"]
        src, target, mode = vol.split(":")
        assert (target, mode) == ("/etc/ualinkd/pod.toml", "ro")
        toml_sources.add(src)
        assert svc["networks"] == ["fabric"]
        assert svc["secrets"] == ["ualink_pod_key"]
        assert svc["environment"]["UALINK_KEY_FILE"] == "/run/secrets/ualink_pod_key"
    assert doc["networks"]["fabric"]["internal"] is True
    assert doc["secrets"]["ualink_pod_key"]["file"] == "./compose/pod.key"
    (src,) = toml_sources
    with open(PKG / src, "rb") as f:
        cfg = PodConfig.from_dict(tomllib.load(f), src)
    assert [n.name for n in cfg.nodes] == list(services)
    for n in cfg.nodes:
        host, port = parse_address(n.address)
        assert (host, port) == (n.name, 7000)  # the service name, the port the image EXPOSEs
    assert {m for v in cfg.vpods for m in v.members} == {a.accel_id for n in cfg.nodes
                                                         for a in n.accels}


# -- Kubernetes -----------------------------------------------------------------------------------


def test_statefulset_nodes_are_its_pods_and_addresses_the_headless_service():
    docs = {d["kind"]: d for d in yaml.safe_load_all((PKG / "k8s/statefulset.yaml").read_text())}
    svc, cm, sts = docs["Service"], docs["ConfigMap"], docs["StatefulSet"]
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert sts["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (port,) = svc["spec"]["ports"]
    pod_spec = sts["spec"]["template"]["spec"]
    (ctr,) = pod_spec["containers"]
    (cport,) = ctr["ports"]
    assert (cport["name"], cport["containerPort"]) == (port["targetPort"], port["port"])

    cfg = PodConfig.from_dict(tomllib.loads(cm["data"]["pod.toml"]), "ConfigMap pod.toml")
    name, svc_name = sts["metadata"]["name"], svc["metadata"]["name"]
    replicas = sts["spec"]["replicas"]
    assert [n.name for n in cfg.nodes] == [f"{name}-{i}" for i in range(replicas)]
    for i, n in enumerate(cfg.nodes):
        assert parse_address(n.address) == (f"{name}-{i}.{svc_name}", port["port"])

    env = {e["name"]: e for e in ctr["env"]}
    assert env["UALINK_NODE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    conf_mount = mounts["/etc/ualinkd/pod.toml"]
    assert volumes[conf_mount["name"]]["configMap"]["name"] == cm["metadata"]["name"]
    assert conf_mount["subPath"] == "pod.toml"
    key_path = Path(env["UALINK_KEY_FILE"]["value"])
    key_vol = volumes[mounts[str(key_path.parent)]["name"]]
    assert "secretName" in key_vol["secret"]


# -- systemd ---------------------------------------------------------------------------------------


def read_unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # keys are case-sensitive in systemd
    unit.read(PKG / "ualinkd@.service")
    return unit


def test_systemd_unit_execstart_is_what_the_cli_parses():
    svc = read_unit()["Service"]
    assert svc["Type"] == "notify" and svc["NotifyAccess"] == "main"
    argv = shlex.split(svc["ExecStart"].replace("%i", "node0"))
    assert argv[0] == "/usr/local/bin/ualinkd"
    args = parse_node_argv(argv[1:])
    assert (args.config, args.node, args.mount) == ("/etc/ualinkd/pod.toml", "node0",
                                                    "/run/ualinkd/node0")


def test_systemd_unit_hardening_keeps_the_mount_visible():
    """Options that make a private mount namespace would hide the FUSE mount from the host
    (systemd makes it a slave); the rest must still allow /dev/fuse and mount(2)."""
    svc = read_unit()["Service"]
    namespaced = {"ProtectSystem", "ProtectHome", "ReadWritePaths", "ReadOnlyPaths",
                  "InaccessiblePaths", "PrivateTmp", "PrivateDevices", "PrivateMounts",
                  "ProtectKernelTunables", "ProtectControlGroups", "ProtectKernelModules",
                  "ProtectKernelLogs", "ProtectProc", "TemporaryFileSystem", "BindPaths",
                  "BindReadOnlyPaths", "MountFlags", "RootDirectory", "RootImage"}
    assert not namespaced & set(svc)
    assert "CAP_SYS_ADMIN" in svc["CapabilityBoundingSet"].split()
    assert svc["NoNewPrivileges"] == "yes"
    assert svc["DeviceAllow"] == "/dev/fuse rw" and svc["DevicePolicy"] == "closed"
    assert "@mount" in svc["SystemCallFilter"].split()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    text = (PKG / "ualinkd@.service").read_text()
    unit = tmp_path / "ualinkd@node0.service"
    unit.write_text(text.replace("/usr/local/bin/ualinkd", str(VENV_BIN / "ualinkd")))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                       text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), r.stderr


# -- the image -----------------------------------------------------------------------------------


def test_containerfile_copies_what_the_ignore_file_lets_through():
    text = (PKG / "Containerfile").read_text()
    assert 'ENTRYPOINT ["/usr/local/bin/ualinkd-entrypoint"]' in text
    assert "COPY packaging/entrypoint.sh /usr/local/bin/ualinkd-entrypoint" in text
    ignore = (PKG / "Containerfile.dockerignore").read_text().split()
    for line in text.splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and not parts[1].startswith("--from"):
            for src in parts[1:-1]:
                # build/wheelhouse is made on the host by `make wheelhouse` (no network in
                # the build); everything else is in the checkout.
                makefile = (REPO / "Makefile").read_text()
                made = src == "build/wheelhouse" and "wheelhouse:" in makefile
                assert made or (REPO / src).exists(), src
                assert f"!{src}" in ignore or f"!{src}/" in ignore, src
    assert os.access(ENTRYPOINT, os.X_OK)
    r = subprocess.run(["bash", "-n", str(ENTRYPOINT)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_k8s_manifests_validate_against_the_kubernetes_schemas():
    """Issue 11: every resource of packaging/k8s/ passes the Kubernetes OpenAPI schemas,
    strictly (no unknown fields), and the image is pinned and never pulled."""
    import kubernetes_validate

    for path in (PKG / "k8s").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            kubernetes_validate.validate(doc, "1.30.0", strict=True)
    docs = {d["kind"]: d for d in yaml.safe_load_all((PKG / "k8s/statefulset.yaml").read_text())}
    (container,) = docs["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    # issue 32: the name `make image` gives it under podman (what `podman save` puts in the
    # archive a kind/k3s user loads); `ualinkd:0.1.0` would be docker.io/library/… there
    assert container["image"] == "localhost/ualinkd:0.1.0"
    assert container["imagePullPolicy"] == "Never"


def _containers(path: Path) -> list[dict]:
    out = []
    for doc in yaml.safe_load_all(path.read_text()):
        spec = doc.get("spec", {})
        spec = spec.get("template", {}).get("spec", spec)
        out += spec.get("containers", [])
    return out


def test_k8s_pods_ask_only_for_what_fuse_needs():
    """Issue 32: Pod Security refuses `privileged: true`; a node needs mount(2) (SYS_ADMIN,
    AppArmor unconfined where it is on) and the fuse device: the StatefulSet takes the
    device from a device plugin (squat.ai/fuse) in a namespace whose Pod Security level
    admits SYS_ADMIN; the podman variant from a CharDevice hostPath (podman makes it a
    device)."""
    for path in (PKG / "k8s").glob("*.yaml"):
        assert "privileged: true" not in path.read_text(), path
        for c in _containers(path):
            sc = c["securityContext"]
            assert "privileged" not in sc and sc["capabilities"] == {"add": ["SYS_ADMIN"]}
    docs = {d["kind"]: d for d in yaml.safe_load_all((PKG / "k8s/statefulset.yaml").read_text())}
    ns = docs["Namespace"]["metadata"]
    assert ns["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    for kind in ("Service", "ConfigMap", "StatefulSet"):
        assert docs[kind]["metadata"]["namespace"] == ns["name"]
    (c,) = _containers(PKG / "k8s/statefulset.yaml")
    assert c["resources"]["limits"] == {"squat.ai/fuse": 1}
    assert c["securityContext"]["appArmorProfile"] == {"type": "Unconfined"}


def test_podman_kube_variant_is_one_pod_of_the_config_nodes():
    """podman-pod.yaml (what `podman kube play` of podman 4.3 runs; the container tier runs
    it): one Pod, a container per node of its ConfigMap's pod.toml, named by UALINK_NODE,
    addresses on 127.0.0.1 (the Pod's one network namespace; no DNS), distinct ports; none
    of what podman 4.3 lacks or breaks on: subPath, Secret volumes, StatefulSet."""
    docs = list(yaml.safe_load_all((PKG / "k8s/podman-pod.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["ConfigMap", "Pod"]
    cm, pod = docs
    cfg = PodConfig.from_dict(tomllib.loads(cm["data"]["pod.toml"]), "ConfigMap pod.toml")
    spec = pod["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert not [v for v in volumes.values() if "secret" in v]
    assert volumes["fuse"]["hostPath"] == {"path": "/dev/fuse", "type": "CharDevice"}
    names = []
    for c in spec["containers"]:
        env = {e["name"]: e for e in c["env"]}
        names.append(env["UALINK_NODE"]["value"])
        assert env["UALINK_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "key"
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        assert all("subPath" not in m for m in mounts.values())
        conf = Path(env["UALINK_CONFIG"]["value"])
        assert volumes[mounts[str(conf.parent)]["name"]]["configMap"]["name"] == \
            cm["metadata"]["name"] and conf.name in cm["data"]
        assert c["image"] == "localhost/ualinkd:0.1.0" and c["imagePullPolicy"] == "Never"
    assert names == [n.name for n in cfg.nodes]
    addresses = [parse_address(n.address) for n in cfg.nodes]
    assert {h for h, _ in addresses} == {"127.0.0.1"}
    assert len({p for _, p in addresses}) == len(addresses)
