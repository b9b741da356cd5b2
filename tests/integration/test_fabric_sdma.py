"""AMD's two-node UALink fabric test with the APIs Debian has (issue 30, "Tests that must
exist": two nodes; tests/c/fabric_sdma.c). On node 0 the exporter allocates VRAM, writes it
through its CPU mapping and UALink-exports it; on node 1 another process opens the KFD
(libhsakmt 5.2.3 ACQUIRE_VMs the render file), imports the handle on that file, maps the
BO into the KFD process's GPU VM with GEM_VA (what newer libhsakmt's hsaKmtMemoryVaMap
does) and an SDMA queue (hsaKmtCreateQueue(HSA_QUEUE_SDMA), BlitSdmaV4's packets) copies
remote->host (the exporter's bytes, over the fabric) and host->remote; the exporter sees
the stored bytes in its own memory. After the exporter frees the BO (the import revoked:
spec ualink-kernel-behaviour, revoke on close), the importer's next SDMA access is a GPU
page fault: no fence, the KFD's memory event, the node's gpu_faults counter, and nothing
hangs (both processes exit, both daemons answer)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from nodes import NEEDS_HSAKMT, SHIM, Node, c_program, running_pod

pytestmark = [
    pytest.mark.integration,
    NEEDS_HSAKMT,
]
BO_SIZE = 4 << 20


def env_for(mount: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "UALINK_DRI_DIR", "UALINK_DMABUF_DIR")}
    env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(mount / "dri"))
    return env


def fields(line: str) -> tuple[str, str, dict[str, str]]:
    status, step, *rest = line.split()
    return status, step, dict(w.split("=", 1) for w in rest if "=" in w)


def read_ok(proc: subprocess.Popen[str], step: str) -> dict[str, str]:
    """The next line of `proc`, which must be `ok <step> ...`."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    status, got, kv = fields(line) if line.strip() else ("eof", "", {})
    assert (status, got) == ("ok", step), f"{line!r} wanted ok {step}"
    return kv


def gpu_faults(node: Node) -> int:
    """The accel's GPU page-fault counter (debugfs dri/128/gpu_faults)."""
    return int(node.debug(128, "gpu_faults").strip())


def test_sdma_copies_remote_memory_both_ways_and_faults_after_revoke(tmp_path: Path):
    c_program("libualink_shim.so")
    c_program("fabric_sdma")
    with running_pod(tmp_path, nodes=2) as (a, b):
        exporter = subprocess.Popen([c_program("fabric_sdma"), "export"], env=env_for(a.mount),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        importer = None
        try:
            exp = read_ok(exporter, "export")
            assert int(exp["size"]) == BO_SIZE
            importer = subprocess.Popen(
                [c_program("fabric_sdma"), "import", exp["lo"], exp["hi"]],
                env=env_for(b.mount), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
            assert importer.stdout is not None and importer.stdin is not None
            assert exporter.stdin is not None
            lines = []
            while not any(ln.startswith(("ok copy_host_to_remote", "fail")) for ln in lines):
                line = importer.stdout.readline()
                if not line:
                    break
                lines.append(line)
            out = "".join(lines)
            assert "ok copy_remote_to_host" in out, out + importer.stderr.read() + b.log_text()
            stored = fields(lines[-1])[2]
            assert lines[-1].startswith("ok copy_host_to_remote"), out + b.log_text()
            # the exporter sees what the importer's SDMA engine stored, in its own memory
            exporter.stdin.write(f"check {stored['offset']} {stored['size']} {stored['seed']}\n"
                                 "check 0 4096 1\n")
            exporter.stdin.flush()
            assert read_ok(exporter, "check") == {"equal": "1"}
            assert read_ok(exporter, "check") == {"equal": "1"}
            # the exporter frees the BO: the importer's next SDMA access faults
            faults_before = gpu_faults(b)
            exporter.stdin.write("free\n")
            exporter.stdin.flush()
            read_ok(exporter, "freed")
            importer.stdin.write("again\n")
            importer.stdin.flush()
            rest, err = importer.communicate(timeout=60)
            assert importer.returncode == 0, out + rest + err + b.log_text()[-3000:]
            revoked = next(fields(ln)[2] for ln in rest.splitlines()
                           if ln.startswith("ok revoked_copy"))
            assert revoked["fenced"] == "0"
            assert revoked["memory_event"] == "1", rest
            # the fault's page, as WAIT_EVENTS copies kfd_signal_vm_fault_event's data out
            va = int(next(fields(ln)[2]["va"] for ln in lines if ln.startswith("ok import")), 16)
            assert va <= int(revoked["fault_va"], 16) < va + BO_SIZE, (rest, out)
            assert "ok done" in rest
            assert gpu_faults(b) > faults_before, b.debug(128, "gpu_faults")
            out2, err2 = exporter.communicate("", timeout=30)
            assert exporter.returncode == 0 and "ok done" in out2, out2 + err2
            # nothing hangs: both daemons still answer
            for node in (a, b):
                assert (node.mount / "dri" / "renderD128").exists()
                assert node.proc.poll() is None
        finally:
            for p in (exporter, importer):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait()


def test_rocr_async_copy_of_remote_memory_as_amds_fabric_test(tmp_path: Path):
    """The importer as AMD's two-node test writes it, on Debian's ROCr 5.2.3
    (tests/c/rocr_fabric.c): a dummy AQL queue "to create a VMID", the import and GEM_VA on
    the render file ROCr's libhsakmt acquired, hsa_amd_memory_async_copy naming the CPU as
    destination agent (ROCr's device->host SDMA blit) and back; the exporter sees the bytes.
    After the exporter frees the BO, the next copy is a GPU page fault that ROCr's VM-fault
    handler reports ("Memory access fault by GPU node-N") before it aborts the process, as it
    does on hardware: visible, and no hang."""
    import dataclasses
    import signal

    from ualinkd.cli.main import free_tcp_ports
    from ualinkd.config import AccelConfig, PodConfig

    base = PodConfig.local(2, 1, free_tcp_ports(2))
    config = dataclasses.replace(base, nodes=tuple(
        dataclasses.replace(n, accels=(dataclasses.replace(n.accels[0], profile="mi210"),))
        if n.accels else n for n in base.nodes))
    assert all(isinstance(a, AccelConfig) for n in config.nodes for a in n.accels)
    size = 4 << 20
    c_program("rocr_fabric")
    with running_pod(tmp_path, config=config) as (a, b):
        exporter = subprocess.Popen([c_program("fabric_sdma"), "export", str(size)],
                                    env=env_for(a.mount), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        importer = None
        try:
            exp = read_ok(exporter, "export")
            env = {k: v for k, v in env_for(b.mount).items() if not k.startswith("HSA")}
            importer = subprocess.Popen([c_program("rocr_fabric"), exp["lo"], exp["hi"],
                                         str(size)], env=env, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
            assert importer.stdin is not None and exporter.stdin is not None
            read_ok(importer, "import")
            read_ok(importer, "copy_remote_to_host")
            stored = read_ok(importer, "copy_host_to_remote")
            exporter.stdin.write(f"check {stored['offset']} {stored['size']} {stored['seed']}\n")
            exporter.stdin.flush()
            assert read_ok(exporter, "check") == {"equal": "1"}
            faults_before = gpu_faults(b)
            exporter.stdin.write("free\n")
            exporter.stdin.flush()
            read_ok(exporter, "freed")
            importer.stdin.write("again\n")
            importer.stdin.flush()
            rest, err = importer.communicate(timeout=90)
            assert importer.returncode == -signal.SIGABRT, (rest, err[-2000:])
            assert "Memory access fault by GPU node-" in err, err[-2000:]
            assert gpu_faults(b) > faults_before
            out2, err2 = exporter.communicate("", timeout=30)
            assert exporter.returncode == 0 and "ok done" in out2, out2 + err2
            assert a.proc.poll() is None and b.proc.poll() is None
        finally:
            for p in (exporter, importer):
                if p is not None and p.poll() is None:
                    p.kill()
                    p.wait()
