"""The Wireshark dissector (packaging/wireshark/ualink.lua, issue 12 item 4) decodes a capture
of a real pod's fabric: two node daemons on 127.0.0.1, a client exporting, importing, loading
and storing, captured on lo by dumpcap and read back by Debian's tshark."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nodes import Client, running_pod
from test_pod_fabric import pod_config

from ualinkd import native

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("tshark") is None or shutil.which("dumpcap") is None,
                       reason="needs tshark and dumpcap (apt-get install tshark)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="capturing on lo needs root (CAP_NET_RAW)"),
]
VA = 0x7F0000000000
DISSECTOR = native.layout().wireshark


@contextlib.contextmanager
def capture(path: Path, ports: list[int]):
    """dumpcap on lo for the pod's ports, running before the first link comes up."""
    filt = " or ".join(f"tcp port {p}" for p in ports)
    proc = subprocess.Popen(["dumpcap", "-q", "-i", "lo", "-f", filt, "-w", str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not (path.exists() and path.stat().st_size > 0):  # the pcapng header
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read() if proc.stderr else ""
                raise RuntimeError(f"dumpcap did not start: {err}")
            time.sleep(0.05)
        yield
    finally:
        time.sleep(0.3)  # the last segments reach the file
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_config_wireshark_prints_the_dissector():
    """`ualinkd config --wireshark` names the file (the checkout's here; a wheel's in
    tests/integration/test_installed_package.py)."""
    out = subprocess.run([sys.executable, "-m", "ualinkd", "config", "--wireshark"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert Path(out.strip()) == DISSECTOR
    assert DISSECTOR.is_file()


def test_tshark_decodes_a_pod_capture(tmp_path):
    """Handshake (AUTH_HELLO with version 2 and the node name), HELLO, NPA_REQ with the
    exported handle, NPA_RSP, ACKs, a LOAD and a STORE with their NPA addresses, DATA."""
    config = pod_config(2)
    ports = [int(n.address.rsplit(":", 1)[1]) for n in config.nodes]
    pcap = tmp_path / "fabric.pcapng"
    with capture(pcap, ports), running_pod(tmp_path, config=config) as (a, b), \
            Client(a.render()) as ca, Client(b.render()) as cb:
        bo = ca.bo_create(1 << 16)
        handle = ca.export(bo)
        fd = cb.import_(handle)
        gem = cb.fd_to_handle(fd)
        os.close(fd)
        cb.va_map(gem, VA, 1 << 16)
        assert cb.gpu_write(VA + 4096, b"seen by tshark") == 14
        assert cb.gpu_read(VA + 4096, 14) == b"seen by tshark"
    r = subprocess.run(["tshark", "-n", "-X", f"lua_script:{DISSECTOR}", "-r", str(pcap), "-V"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Lua: Error" not in out and "Lua: Error" not in r.stderr, out[-3000:] + r.stderr
    lo, hi = handle
    want = f"0x{hi:016x}{lo & ~0x3FF & (2**64 - 1):016x}"
    assert "UALink fabric frame: AUTH_HELLO" in out
    assert "Protocol version: 2" in out
    assert "Node name: node0" in out and "Node name: node1" in out
    assert "UALink message: HELLO" in out
    assert "UALink message: NPA_REQ" in out
    assert f"UALink handle: {want}" in out
    assert "UALink message: NPA_RSP" in out
    assert "UALink fabric frame: ACK" in out
    assert "UALink fabric frame: LOAD" in out
    assert "UALink fabric frame: STORE" in out
    assert "UALink fabric frame: DATA" in out
    summary = subprocess.run(["tshark", "-n", "-X", f"lua_script:{DISSECTOR}", "-r", str(pcap)],
                             capture_output=True, text=True, timeout=120, check=True).stdout
    assert f"NPA_REQ handle={want}" in summary
    assert "len=14" in summary  # the STORE's and the LOAD's 14 bytes
