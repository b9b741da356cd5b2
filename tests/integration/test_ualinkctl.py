"""ualinkctl against real daemons: every read subcommand as a table and as JSON with an
export, an import and a GPU fault present; the fault-injection commands taking effect
(§5.12 policy 9 drops, §5.9/§7.1 vPod commits); one-line explanations of failures."""

from __future__ import annotations

import errno
import json
import os
import signal
from dataclasses import replace

import pytest
from nodes import Client, running_node, running_pod, stop_process, wait_until

from ualinkd.cli import ctl
from ualinkd.cli.main import free_tcp_ports
from ualinkd.config import PodConfig
from ualinkd.sysfs import DATA_PLANE_STATUS

pytestmark = pytest.mark.integration

ACCEL_KEYS = {"render", "minor", "accel_id"}
STATE_KEYS = set(ctl.SYSFS_ATTRS)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = ctl.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def run_json(capsys, mount, *argv: str) -> dict:
    rc, out, err = run(capsys, "--mount", str(mount), "--json", *argv)
    assert rc == 0, err
    return json.loads(out)


def one_line_failure(capsys, *argv: str, status: int = 1) -> str:
    rc, out, err = run(capsys, *argv)
    assert rc == status, (out, err)
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and lines[0].startswith("ualinkctl: "), err
    return lines[0]


def short_timeout_pod(response_ms: int = 300) -> PodConfig:
    base = PodConfig.local(2, 1, free_tcp_ports(2))
    return replace(base, response_timeout_ms=response_ms, send_ack_timeout_ms=response_ms)


@pytest.fixture(scope="module")
def busy_pod(tmp_path_factory):
    """A two-node pod where node0 exports a 4 MiB BO that node1 has imported, and node1's
    GPU has faulted once. Read-only tests share it."""
    tmp = tmp_path_factory.mktemp("ctl-pod")
    with running_pod(tmp) as (a, b), Client(a.render()) as ca, Client(b.render()) as cb:
        handle = ca.export(ca.bo_create(4 << 20))
        fd = cb.import_(handle)
        with pytest.raises(OSError) as e:
            cb.gpu_read(0x7000_0000, 16)  # nothing mapped there: a GPU page fault
        assert e.value.errno == errno.EFAULT
        try:
            yield a, b, handle
        finally:
            os.close(fd)


# -- read commands --------------------------------------------------------------------------


def test_state(busy_pod, capsys):
    a, b, _ = busy_pod
    doc = run_json(capsys, b.mount, "state")
    assert doc["mount"] == str(b.mount)
    (acc,) = doc["accels"]
    assert set(acc) == ACCEL_KEYS | STATE_KEYS
    assert acc["render"] == "renderD128" and acc["minor"] == 128
    assert (acc["accel_id"], acc["accel_state"], acc["vpod_id"]) == (1, "active", 1)
    assert (acc["vpod_active_accels"], acc["local_accels"], acc["ppod_size"]) == ([0, 1], [1], 2)
    assert acc["addr_mode"] == "source-aliasing" and acc["link_type"] == "UALoE"
    rc, out, _ = run(capsys, "--mount", str(b.mount), "state")
    header, row, ppod = out.splitlines()
    assert header.split()[:4] == ["render", "accel", "state", "vpod"]
    assert row.split()[:4] == ["renderD128", "1", "active", "1"]
    assert row.index("active") == header.index("state")  # aligned columns
    assert ppod == f"pPod {acc['ppod_id']} (UALoE)"


def test_peers(busy_pod, capsys):
    a, b, _ = busy_pod
    # (the data channel is dialed once the link is up)
    assert wait_until(lambda: "channels 1\n" in (a.mount / DATA_PLANE_STATUS).read_text())
    doc = run_json(capsys, a.mount, "peers")
    (acc,) = doc["accels"]
    assert set(acc) == ACCEL_KEYS | {"peers"}
    (peer,) = acc["peers"]
    assert peer["accel"] == 1 and peer["state"] == "ESTABLISHED"
    assert isinstance(peer["generation"], int) and peer["generation"] >= 1
    assert doc["fabric"] == [{"node": "node1", "up": True}]
    rc, out, _ = run(capsys, "--mount", str(a.mount), "peers")
    lines = out.splitlines()
    assert lines[0].split() == ["render", "accel", "remote", "state", "generation"]
    assert lines[1].split()[:4] == ["renderD128", "0", "1", "ESTABLISHED"]
    assert lines[-2] == "fabric links: node1 up"
    assert lines[-1].startswith("data plane: 1 channels, ")  # (its counters: README)
    assert doc["data_plane"]["channels"] == 1


def test_exports(busy_pod, capsys):
    a, b, handle = busy_pod
    doc = run_json(capsys, a.mount, "exports")
    (exp,) = doc["accels"][0]["exports"]
    assert exp == {"handle_lo": f"{handle[0]:#018x}", "handle_hi": f"{handle[1]:#018x}",
                   "bo": exp["bo"], "size": 4 << 20, "pins": 1, "importers": [1]}
    rc, out, _ = run(capsys, "--mount", str(a.mount), "exports")
    header, row = out.splitlines()
    assert header.split() == ["render", "accel", "handle_lo", "handle_hi", "bo", "size",
                              "pins", "importers"]
    assert f"{handle[0]:#018x}" in row and "4 MiB" in row and row.endswith(" 1")
    assert run(capsys, "--mount", str(b.mount), "exports")[1] == "(no exports)\n"


def test_imports(busy_pod, capsys):
    a, b, handle = busy_pod
    (imp,) = run_json(capsys, b.mount, "imports")["accels"][0]["imports"]
    assert imp == {"handle_lo": f"{handle[0]:#018x}", "handle_hi": f"{handle[1]:#018x}",
                   "exporter": 0, "state": "READY", "pages": 1024}
    out = run(capsys, "--mount", str(b.mount), "imports")[1]
    assert out.splitlines()[1].split()[2:] == [f"{handle[0]:#018x}", f"{handle[1]:#018x}",
                                               "0", "READY", "1024"]


def test_npa(busy_pod, capsys):
    a, b, _ = busy_pod
    assert run_json(capsys, a.mount, "npa")["accels"][0]["npa"] == {"used_pages": 1024,
                                                                   "mappings": 1}
    assert run_json(capsys, b.mount, "npa")["accels"][0]["npa"] == {"used_pages": 0,
                                                                   "mappings": 0}
    out = run(capsys, "--mount", str(a.mount), "npa")[1]
    assert out.splitlines()[1].split() == ["renderD128", "0", "1024", "1"]


def test_faults(busy_pod, capsys):
    a, b, _ = busy_pod
    assert run_json(capsys, b.mount, "faults")["accels"][0]["faults"] == {
        "gpu_faults": 1, "drop_msg": 0, "drop_next": []}
    assert run_json(capsys, a.mount, "faults")["accels"][0]["faults"]["gpu_faults"] == 0
    out = run(capsys, "--mount", str(b.mount), "faults")[1]
    assert out.splitlines()[1].split() == ["renderD128", "1", "1", "0x0", "-"]


def test_objects(busy_pod, capsys):
    a, b, _ = busy_pod
    acc = run_json(capsys, a.mount, "objects")["accels"][0]
    (obj,) = acc["objects"]
    assert obj["size"] == 4 << 20 and obj["handle_count"] == 1 and obj["refcount"] >= 1
    assert {"pid": os.getpid(), "uid": os.getuid(), "handles": 1} in acc["clients"]
    out = run(capsys, "--mount", str(a.mount), "objects")[1]
    objects, clients = out.split("\n\n")
    assert objects.splitlines()[0] == "objects" and "4 MiB" in objects
    assert clients.splitlines()[0] == "clients" and str(os.getpid()) in clients


def test_all_is_every_section_in_one_document(busy_pod, capsys):
    a, b, handle = busy_pod
    doc = run_json(capsys, b.mount, "all")
    (acc,) = doc["accels"]
    assert set(acc) == (ACCEL_KEYS | STATE_KEYS | {"peers", "exports", "imports", "npa",
                                                  "faults", "objects", "clients", "kfd",
                                                  "kfd_processes", "kfd_queues", "cs"})
    assert doc["fabric"] == [{"node": "node0", "up": True}]
    assert acc["imports"][0]["handle_lo"] == f"{handle[0]:#018x}"
    out = run(capsys, "--mount", str(b.mount), "all")[1]
    titles = [part.splitlines()[0] for part in out.strip().split("\n\n")]
    assert titles == ["state", "peers", "exports", "imports", "npa", "faults", "objects",
                      "clients", "kfd processes", "kfd", "kfd queues", "cs"]


def test_options_after_the_subcommand_and_from_the_environment(busy_pod, capsys,
                                                                monkeypatch):
    a, b, _ = busy_pod
    assert run(capsys, "state", "--json", "--mount", str(a.mount))[0] == 0
    monkeypatch.setenv("UALINK_MOUNT", str(a.mount))
    rc, out, _ = run(capsys, "--json", "npa")
    assert rc == 0 and json.loads(out)["accels"][0]["accel_id"] == 0


def test_a_lone_node(tmp_path, capsys):
    with running_node(tmp_path) as n:
        doc = run_json(capsys, n.mount, "all")
        assert doc["fabric"] == [] and doc["accels"][0]["peers"] == []
        out = run(capsys, "--mount", str(n.mount), "peers")[1]
        assert out == ("(no peer connections)\nfabric links: none (no peer nodes)\n"
                       "data plane: 0 channels, 0 loads carried, 0 served, 0 handed back\n")


# -- fault injection ---------------------------------------------------------------------------


def test_drop_next_makes_the_next_import_time_out(tmp_path, capsys):
    """§5.12, policy 9: dropping the next NPA_RSP at the importer: that import times out
    after the pod's response_timeout_ms; the drop is used up and the next import works."""
    with running_pod(tmp_path, config=short_timeout_pod(300)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            handle = ca.export(ca.bo_create())
            rc, out, err = run(capsys, "--mount", str(b.mount), "drop-next", "npa_rsp")
            assert rc == 0, err
            assert out == ("renderD128: the next NPA_RSP it receives is dropped "
                           "(ualink_drop_msg 0x10: NPA_RSP)\n")
            faults = run_json(capsys, b.mount, "faults")["accels"][0]["faults"]
            assert (faults["drop_msg"], faults["drop_next"]) == (0x10, ["NPA_RSP"])
            with pytest.raises(OSError) as e:
                cb.import_(handle)
            assert e.value.errno == errno.ETIMEDOUT
            faults = run_json(capsys, b.mount, "faults")["accels"][0]["faults"]
            assert (faults["drop_msg"], faults["drop_next"]) == (0, [])
            os.close(cb.import_(handle))
            # Bits add up: two types armed at once, by name and by number.
            assert run(capsys, "--mount", str(a.mount), "drop-next", "HELLO")[0] == 0
            rc, out, _ = run(capsys, "--mount", str(a.mount), "drop-next", "7",
                             "--render", "renderD128")
            assert rc == 0 and "ualink_drop_msg 0x82: HELLO, NPA_RELEASE" in out


def test_deactivate_reactivate_and_vpod(tmp_path, capsys):
    """§5.9, §7.1, policy 8: deactivate (vpod_id 0 + commit) leaves PPOD_CONFIGURED and
    refuses imports; reactivate joins vPod 1 again with the pending members; `vpod` writes
    the members, size and addr_mode too."""
    with running_pod(tmp_path, config=short_timeout_pod(500)) as (a, b):
        with Client(a.render()) as ca, Client(b.render()) as cb:
            handle = ca.export(ca.bo_create())
            rc, out, err = run(capsys, "--mount", str(b.mount), "deactivate")
            assert (rc, out) == (0, "renderD128: accel 1 left vPod 1; now ppod_configured\n")
            acc = run_json(capsys, b.mount, "state")["accels"][0]
            assert (acc["accel_state"], acc["vpod_id"]) == ("ppod_configured", 0)
            with pytest.raises(OSError) as e:
                cb.import_(handle)
            assert e.value.errno == errno.EOPNOTSUPP
            rc, out, err = run(capsys, "--mount", str(b.mount), "reactivate", "--id", "1")
            assert rc == 0, err
            assert out == ("renderD128: accel 1 in vPod 1 (members 0,1, source-aliasing); "
                           "now active\n")
            assert b.sysfs(128, "accel_state") == "active\n"
            os.close(cb.import_(handle))
            # Out and back in through `vpod`, changing the address mode, JSON output.
            assert run(capsys, "--mount", str(b.mount), "deactivate", "--render", "128")[0] == 0
            doc = run_json(capsys, b.mount, "vpod", "--id", "1", "--members", "0,1",
                           "--addr-mode", "source-identification")
            acc = doc["accels"][0]
            assert (acc["accel_state"], acc["vpod_id"], acc["addr_mode"]) == (
                "active", 1, "source-identification")
            assert doc["message"].endswith("now active")


def test_moving_between_vpods_needs_force_and_ends_in_error(tmp_path, capsys):
    """§5.9: a config update from vPod 1 straight to vPod 3 puts the accel in ERROR;
    ualinkctl refuses without --force and says why. §7.1: config/commit does not refuse an
    accel in ERROR; the update keeps it in ERROR (§5.9 "any other case") and ualinkctl says
    so; leaving (vPod id 0) recovers."""
    with running_pod(tmp_path) as (a, b):
        line = one_line_failure(capsys, "--mount", str(b.mount), "vpod", "--id", "3",
                                "--members", "0,1")
        assert line == ("ualinkctl: vPod 3 not committed: accel 1 is active in vPod 1; leave "
                        "it first (ualinkctl deactivate), or --force to send the accel to "
                        "error as the kernel would")
        assert b.sysfs(128, "vpod_id") == "1\n"
        rc, out, err = run(capsys, "--mount", str(b.mount), "vpod", "--id", "3", "--members",
                           "0,1", "--force")
        assert rc == 0, err
        assert "now error" in out
        assert b.sysfs(128, "accel_state") == "error\n"
        line = one_line_failure(capsys, "--mount", str(b.mount), "reactivate", "--id", "3")
        assert line == ("ualinkctl: vPod 3 committed, and accel 1 is now error: it was error "
                        "in vPod 3, and only leaving its vPod takes an accel out of error; "
                        "ualinkctl deactivate recovers it")
        assert (b.sysfs(128, "accel_state"), b.sysfs(128, "vpod_id")) == ("error\n", "3\n")
        rc, out, err = run(capsys, "--mount", str(b.mount), "deactivate")
        assert (rc, out) == (0, "renderD128: accel 1 left vPod 3; now ppod_configured\n"), err
        assert run(capsys, "--mount", str(b.mount), "reactivate", "--id", "1")[0] == 0
        assert b.sysfs(128, "accel_state") == "active\n"


# -- failures explain themselves ------------------------------------------------------------------


def test_refused_commits_say_why(tmp_path, capsys):
    with running_pod(tmp_path) as (a, b):
        m = str(b.mount)
        assert run(capsys, "--mount", m, "deactivate")[0] == 0
        line = one_line_failure(capsys, "--mount", m, "vpod", "--id", "3", "--members", "0")
        assert line == ("ualinkctl: vPod 3 not committed: accel 1 is ppod_configured; the "
                        "vPod needs accel 1 among its members (members: 0) (EINVAL)")
        line = one_line_failure(capsys, "--mount", m, "vpod", "--id", "3", "--members",
                                "0,1,2")
        assert line == ("ualinkctl: vPod 3 not committed: accel 1 is ppod_configured; the "
                        "vPod has 3 members but the pPod only 2 accels (EINVAL)")
        assert b.sysfs(128, "accel_state") == "ppod_configured\n"
        # The pending members are now 0,1,2: reactivate says so rather than guessing.
        line = one_line_failure(capsys, "--mount", m, "reactivate", "--id", "1")
        assert "the vPod has 3 members but the pPod only 2 accels (EINVAL)" in line
        assert run(capsys, "--mount", m, "vpod", "--id", "1", "--members", "0,1")[0] == 0


def test_mount_failures_say_why(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert one_line_failure(capsys, "--mount", str(missing), "state") == (
        f"ualinkctl: {missing} does not exist (is the node running? --mount DIR)")
    assert one_line_failure(capsys, "--mount", str(tmp_path), "all") == (
        f"ualinkctl: {tmp_path} is not a ualinkd mount (no sys/class/drm)")
    with running_pod(tmp_path) as (a, b):
        b.stop(signal.SIGKILL)
        line = one_line_failure(capsys, "--mount", str(b.mount), "state")
        assert line == (f"ualinkctl: {b.mount}: the node's daemon is gone and left its mount "
                        f"behind (ENOTCONN); clear it with fusermount3 -uz {b.mount}")


def test_usage_errors_exit_2(busy_pod, capsys):
    a, b, _ = busy_pod
    m = str(a.mount)
    assert "--mount DIR is needed" in run(capsys, "state")[2]
    for argv, says in [
        (["drop-next", "FOO"], "'FOO' is not a message type (one of HELLO, HELLO_ACK"),
        (["drop-next", "HELLO", "--render", "renderD200"],
         "no renderD200 on this node (it has renderD128)"),
        (["vpod", "--id", "0", "--members", "0"], "0 is no vPod: use deactivate"),
        (["vpod", "--id", "2", "--members", "0,300"], "accel ids are 0..255"),
        (["reactivate"], "the following arguments are required: --id"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ]:
        rc, out, err = run(capsys, "--mount", m, *argv)
        assert rc == 2 and says in err, (argv, err)
    assert run(capsys, "--help")[0] == 0


# -- parsing (no daemon) -------------------------------------------------------------------------


def test_an_accel_in_error_is_refused_only_for_its_vpod():
    """§7.1 config/commit: EINVAL only below PPOD_CONFIGURED or for an invalid vPod, so
    for an accel in error the explanation is the vPod's fault, not the state."""
    accel = {"accel_id": 1, "accel_state": "error", "ppod_size": 2}
    pending = {"vpod_active_accels": [0, 1, 2], "vpod_size": 3, "addr_mode": "source-aliasing"}
    assert ctl.explain_vpod_refusal(accel, pending) == (
        "accel 1 is error; the vPod has 3 members but the pPod only 2 accels")
    pending = {"vpod_active_accels": [0], "vpod_size": 1, "addr_mode": "source-aliasing"}
    assert ctl.explain_vpod_refusal(accel, pending) == (
        "accel 1 is error; the vPod needs accel 1 among its members (members: 0)")


def test_unknown_fields_are_kept_and_garbage_is_one_line():
    fmt = ctl.DEBUGFS_FORMATS["ualink_peers"]
    assert ctl.parse_line("accel=3 state=PENDING generation=2 retries=4 mode=x", fmt) == {
        "accel": 3, "state": "PENDING", "generation": 2, "retries": 4, "mode": "x"}
    with pytest.raises(ctl.CtlError) as e:
        ctl.parse_line("accel=x", fmt, "ualink_peers")
    assert str(e.value).startswith("ualink_peers: cannot parse 'accel=x'")
    assert ctl.parse_line("0x1 0x2 bo=1 size=4096 pins=0 importers=",
                          ctl.DEBUGFS_FORMATS["ualink_exports"])["importers"] == []


def test_a_stopped_node_is_not_answering_instead_of_a_hang(tmp_path):
    """Issue 11: every read of a node's files by ualinkctl is bounded. On a SIGSTOPped
    daemon `ualinkctl state` says it is not answering and exits 1 (the watchdog, far above
    the 2 s bound, turns a regression into a failure, not a hung CI)."""
    import subprocess
    import sys
    from pathlib import Path

    ualinkctl = str(Path(sys.executable).parent / "ualinkctl")
    with running_node(tmp_path) as n:
        stop_process(n.proc.pid)
        try:
            for argv in (["state"], ["--json", "all"], ["drop-next", "NPA_RSP"]):
                r = subprocess.run([ualinkctl, "--mount", str(n.mount), *argv],
                                   capture_output=True, text=True, timeout=30)
                assert r.returncode == 1, (argv, r.stdout, r.stderr)
                assert "not answering after 2 s (is the node's daemon stopped?)" in r.stderr
                assert r.stderr.count("\n") == 1, r.stderr
        finally:
            os.kill(n.proc.pid, signal.SIGCONT)
        r = subprocess.run([ualinkctl, "--mount", str(n.mount), "state"], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, r.stderr
