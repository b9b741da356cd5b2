"""AMDGPU_CS through Debian's libdrm_amdgpu 2.4.114, unmodified (tests/c/libdrm_cs.c, and
libdrm's own amdgpu_stress), via the shim against real nodes (issue 35, "Tests that must
exist"): a context, a BO list, an SDMA IB with a COPY_LINEAR submitted by amdgpu_cs_submit
and run by the node's engine edge, its fence queried and waited for, the copied bytes
checked by GPU loads, a syncobj out of amdgpu_cs_submit_raw2 signaled; a GFX IB refused with
EINVAL (no GFX ring here); a faulting IB's context guilty, the others running; a copy out of
a UALink-imported BO on another node."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess

import pytest
from nodes import SHIM, c_program, running_node, running_pod
from test_libdrm import libdrm_exporter, passed, run_shimmed

from ualinkd.cli import ctl

pytestmark = pytest.mark.integration


def test_libdrm_command_submission(tmp_path):
    c_program("libualink_shim.so")
    with running_node(tmp_path) as node:
        s = passed(run_shimmed("libdrm_cs", node.mount))
        assert s["gfx_ib"]["ret"] == str(-errno.EINVAL)
        assert s["cs_submit"]["seq"] == "1"
        # amdgpu_cs_query_fence_status: expired; amdgpu_cs_wait_fences(all): status 1
        assert s["fence"] == {"status": "ok", "expired": "1", "signaled": "1"}
        assert s["sdma_copy"]["equal"] == "1"
        assert s["syncobj_out"]["seq"] == "2"
        assert node.proc.poll() is None, node.log_text()


def test_a_faulting_ib_makes_its_context_guilty_and_others_go_on(tmp_path):
    """An SDMA IB whose COPY_LINEAR reads an unmapped VA (libdrm_cs.c, a second context):
    amdgpu_cs_submit succeeds (the job was accepted: a fault is no CS error), its fence
    answers -ETIME as the scheduler's job timeout leaves a hung job's fence
    (drm_sched_job_timedout -> amdgpu_job_timedout), QUERY_STATE2 says GUILTY
    (amdgpu_ctx_query2), a later CS on that context is ECANCELED (amdgpu_cs_parser_init);
    one log line names the context and the fault; the first context's next copy runs and it
    is not guilty. An IB at an unmapped VA is accepted and faults the same way."""
    c_program("libualink_shim.so")
    with running_node(tmp_path) as node:
        s = passed(run_shimmed("libdrm_cs", node.mount))
        assert s["fault_submit"]["ret"] == "0"
        assert s["fault_fence"]["ret"] == str(-errno.ETIME)
        assert s["fault_guilty"]["guilty"] == "1"
        assert s["guilty_submit"]["ret"] == str(-errno.ECANCELED)
        assert s["other_ctx_runs"] == {"status": "ok", "expired": "1", "equal": "1",
                                       "guilty": "0"}
        # an IB at an unmapped VA: accepted (gfx9 SDMA rings have no parse_cs), then the
        # same fault and guilt
        assert s["unmapped_ib_submit"]["ret"] == "0"
        assert s["unmapped_ib_fence"] == {"status": "ok", "ret": str(-errno.ETIME),
                                          "guilty": "1"}
        lines = [ln for ln in node.log_text().splitlines() if "AMDGPU_CS" in ln]
        assert len(lines) == 2, lines
        assert all("GPU page fault" in ln and "guilty" in ln for ln in lines), lines
        assert node.proc.poll() is None, node.log_text()


def test_an_sdma_ib_copies_out_of_a_ualink_imported_bo(tmp_path):
    """Issue 35: a copy out of a UALink-imported BO on another node. libdrm_fabric.c exports
    a VRAM BO holding a GPU store on node 0; libdrm_cs.c on node 1 imports it by its handle
    (UALINK_HANDLE IMPORT, amdgpu_bo_import of the dma-buf, GEM_VA), submits an SDMA IB
    copying the stored bytes out of it into a local VRAM BO and finds them there (the IB's
    reads go over the fabric, as the queues' copies do)."""
    c_program("libualink_shim.so")
    with running_pod(tmp_path, nodes=2) as (a, b):
        with libdrm_exporter(a.mount) as (exporter, head):
            r = run_shimmed("libdrm_cs", b.mount, "import", head["export"]["lo"],
                            head["export"]["hi"], "4096", head["gpu_store"]["text"])
            s = passed(r)
            assert s["import_copy"] == {"status": "ok", "expired": "1", "equal": "1"}
            out, err = exporter.communicate("", timeout=30)
            assert exporter.returncode == 0, out + err
        assert a.proc.poll() is None and b.proc.poll() is None


AMDGPU_STRESS = "/usr/bin/amdgpu_stress"


@pytest.mark.skipif(not os.path.exists(AMDGPU_STRESS),
                    reason="libdrm-tests is not installed (make apt installs it)")
def test_amdgpu_stress_copies_between_vram_and_gtt(tmp_path):
    """Issue 35's first test as a user runs it: libdrm's own amdgpu_stress (Debian's
    libdrm-tests 2.4.114), `-b v 2m -b g 2m -c 0 1 1m 4` -- a 2 MiB VRAM and a 2 MiB GTT
    BO, then copies of 1 MiB from the first to the second, 4 of them, each an SDMA IB
    (COPY_LINEAR) submitted with amdgpu_cs_submit_raw2 and waited for -- through the shim on
    a 1-node pod: exit 0 and its report of the 4 IBs."""
    c_program("libualink_shim.so")
    with running_pod(tmp_path, nodes=1) as (node,):
        env = {k: v for k, v in os.environ.items()
               if k not in ("LD_PRELOAD", "UALINK_DRI_DIR", "UALINK_DMABUF_DIR")}
        env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"))
        r = subprocess.run([AMDGPU_STRESS, "-b", "v", "2m", "-b", "g", "2m",
                            "-c", "0", "1", "1m", "4"], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}{r.stderr}{node.log_text()}"
        assert "failed" not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr
        # its report after the copies: "Submitted 4 IBs to copy from 0(va) to 1(va) ..."
        assert re.search(r"Submitted 4 IBs to copy from 0\(\w+\) to 1\(\w+\) 1048576 bytes",
                         r.stdout), r.stdout
        assert node.proc.poll() is None, node.log_text()


def test_a_polling_ib_waits_in_its_ioctl_without_holding_up_the_node(tmp_path):
    """CS runs the job before it answers (amdgpu/cs.py); an IB blocked on a POLL_REGMEM
    waits in its own task (drm/device.py awaits a handler off the FUSE serving thread), so
    the node still serves: the same process's second thread releases the poll with a GPU
    store (pwrite at the word's VA) 300 ms later, the fence after the poll lands and the
    ioctl answers within a second, the fence signaled."""
    c_program("libualink_shim.so")
    with running_node(tmp_path) as node:
        s = passed(run_shimmed("libdrm_cs", node.mount, "poll"))
        p = s["poll_ib"]
        assert (p["expired"], p["fence"]) == ("1", "7"), p
        assert 300 <= int(p["ms"]) < 1000, p
        print(f"polling IB released by a GPU store 300 ms later: CS answered in {p['ms']} ms")


def test_traced_cs_chunks_ib_packets_and_ualinkctl_cs(tmp_path, capsys):
    """Issue 35 item 4, on a node traced as JSON running libdrm_cs.c: each AMDGPU_CS record
    carries its chunks as amdgpu_cs_pass1 read them (libdrm's amdgpu_cs_submit: the IB
    chunk's ip_type DMA, ring 0, va_start and ib_bytes; amdgpu_cs_submit_raw2's SYNCOBJ_OUT
    chunk its handle); each IB's packets executed are `ib` records naming the file,
    context, sequence and IB, the packet decoded (COPY_LINEAR) with the memory it read and
    wrote, and the faulting IB an `error` record. While the client holds its contexts
    (`hold`), `ualinkctl cs` lists them: the guilty ones with -ETIME, the good one with its
    submissions and packets; --json has the same rows."""
    c_program("libualink_shim.so")
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "UALINK_DRI_DIR", "UALINK_DMABUF_DIR")}
    with running_node(tmp_path, trace="json") as node:
        env.update(LD_PRELOAD=str(SHIM), UALINK_DRI_DIR=str(node.mount / "dri"))
        proc = subprocess.Popen([c_program("libdrm_cs"), "hold"], env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        try:
            assert proc.stdout is not None
            out = ""
            while "ok hold" not in out:
                line = proc.stdout.readline()
                assert line, out + node.log_text()
                out += line
            capsys.readouterr()
            assert ctl.main(["--mount", str(node.mount), "cs"]) == 0
            table = capsys.readouterr().out
            assert ctl.main(["--mount", str(node.mount), "cs", "--json"]) == 0
            rows = json.loads(capsys.readouterr().out)["accels"][0]["cs"]
            rest, err = proc.communicate("\n", timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, out + rest + err
        pid = proc.pid
        mine = [r for r in rows if r["pid"] == pid]
        assert len(mine) == 3, rows  # the first context and the two guilty ones
        good = [r for r in mine if not r["guilty"]]
        guilty = [r for r in mine if r["guilty"]]
        assert len(good) == 1 and len(guilty) == 2, mine
        assert good[0]["submissions"] == good[0]["submitted"] == good[0]["signaled"] == 3
        assert good[0]["packets"] >= 3 and good[0]["last_error"] == 0, good
        assert all(r["last_error"] == -errno.ETIME and r["submissions"] == 1 for r in guilty)
        assert table.count(f" {pid} ") == 3 and table.count("-ETIME") == 2, table
        recs = [json.loads(ln) for ln in node.out.read_text().splitlines()
                if ln.startswith("{")]
        cs = [r for r in recs if r["type"] == "ioctl" and r["ioctl"] == "AMDGPU_CS"
              and r["pid"] == pid]
        first = cs[0]
        ib = next(ch for ch in first["chunks"] if ch["id"] == "IB")
        assert ib["ip_type"] == 2 and ib["ring"] == 0 and ib["ib_bytes"] > 0, first
        assert any(ch["id"] == "SYNCOBJ_OUT" and len(ch["handles"]) == 1
                   for r in cs for ch in r.get("chunks", [])), cs
        ibs = [r for r in recs if r["type"] == "ib" and r["pid"] == pid]
        firsts = [r for r in ibs if r["seq"] == 1 and r["ctx_id"] == first["in"]["ctx_id"]]
        copy = next(r for r in firsts if r["event"] == "packet"
                    and "COPY_LINEAR" in r["detail"])
        assert copy["file"] == first["file"] and copy["ib"] == 0, copy
        assert copy["ib_va"] == ib["va_start"], copy
        assert {m["op"] for m in copy["mem"]} == {"read", "write"}, copy
        errors = [r for r in ibs if r["event"] == "error"]
        assert len(errors) == 2 and all("fault" in r["detail"] for r in errors), errors
        assert node.proc.poll() is None, node.log_text()
