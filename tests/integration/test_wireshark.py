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
import uuid
from pathlib import Path

import pytest
from nodes import Client, running_pod
from test_pod_fabric import pod_config

from ualinkd import native
from ualinkd.fabric import wire as w

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(any(shutil.which(t) is None for t in ("tshark", "dumpcap", "text2pcap")),
                       reason="needs tshark, dumpcap and text2pcap (apt-get install tshark)"),
]
needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="capturing on lo needs root (CAP_NET_RAW)")
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


@needs_root
def test_tshark_decodes_a_pod_capture(tmp_path):
    """Handshake (AUTH_HELLO with version 4 and the node name), each accel's INCARNATION
    (§13 N2), HELLO, NPA_REQ with the exported handle, NPA_RSP, ACKs, a LOAD and a STORE
    with their NPA addresses, DATA."""
    config = pod_config(2)
    ports = [int(n.address.rsplit(":", 1)[1]) for n in config.nodes]
    pcap = tmp_path / "fabric.pcapng"
    with capture(pcap, ports), running_pod(tmp_path, config=config) as (a, b), \
            Client(a.render()) as ca, Client(b.render()) as cb:
        # exported by accel 1, so bits 9..0 of the handle (its accel id) are not zero
        bo = cb.bo_create(1 << 16)
        handle = cb.export(bo)
        fd = ca.import_(handle)
        gem = ca.fd_to_handle(fd)
        os.close(fd)
        ca.va_map(gem, VA, 1 << 16)
        assert ca.gpu_write(VA + 4096, b"seen by tshark") == 14
        assert ca.gpu_read(VA + 4096, 14) == b"seen by tshark"
    r = subprocess.run(["tshark", "-n", "-X", f"lua_script:{DISSECTOR}", "-r", str(pcap), "-V"],
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Lua: Error" not in out and "Lua: Error" not in r.stderr, out[-3000:] + r.stderr
    lo, hi = handle
    assert lo & 0x3FF == 1
    want = f"0x{hi:016x}{lo:016x}"  # the handle UALINK_HANDLE gave (§5.3's rebuild)
    assert "malformed" not in out
    assert "UALink fabric frame: AUTH_HELLO" in out
    assert "Protocol version: 4" in out
    assert "Node name: node0" in out and "Node name: node1" in out
    assert "UALink fabric frame: INCARNATION" in out and "Manager incarnation: 0x" in out
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


def _tshark(pcap: Path, *extra: str) -> str:
    r = subprocess.run(["tshark", "-n", "-X", f"lua_script:{DISSECTOR}", "-r", str(pcap),
                        *extra], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0 and "Lua: Error" not in r.stdout + r.stderr, r.stdout + r.stderr
    return r.stdout


def test_every_frame_and_message_type_from_wire_py(tmp_path):
    """Frames built by ualinkd/fabric/wire.py's own encoder, one stream: each of the twelve
    frame types and seven messages decodes to its fields (a handle with bits 9..0 rebuilt as
    the exporter's accel, 4: the receiver of NPA_REQ, the sender of NPA_RSP); two frames in
    one segment and one frame split over two segments (TCP reassembly) decode too."""
    lo = 0xAAAA_BBBB_CCCC_D400
    pod = uuid.UUID("12345678-9abc-def0-1234-56789abcdef0")
    frames = [
        w.AuthHello(pod, "node7", bytes(range(32))),
        w.AuthChallenge("node8", bytes(32), bytes(32)), w.AuthProof(bytes(32)), w.AuthOk(),
        w.Msg(1, 3, 4, w.Hello(receiver_id=4, sender_id=3).encode()),
        w.Msg(2, 4, 3, w.HelloAck().encode()),
        w.Msg(3, 3, 4, w.NpaReq(lo, 0x1122_3344_5566_7788).encode()),
        w.Msg(4, 4, 3, w.NpaRsp(lo, 256, 0x802).encode()),
        w.Msg(5, 4, 3, w.NpaFail(lo, 3).encode()),
        w.Msg(6, 4, 3, w.NpaRevoke(lo, 0x1122_3344_5566_7788).encode()),
        w.Msg(7, 3, 4, w.NpaRelease(lo, 0x1122_3344_5566_7788).encode()),
        w.Ack(6, -110), w.Ping(0xFEED, 1234), w.Pong(0xFEED),
        w.Incarnation(4, 0x0123_4567_89AB_CDEF),
        w.Load(8, 3, 4, 0x803000, 4096, 5000), w.Store(9, 3, 4, 0x803010, b"hello", 5001),
        w.Data(8, 0, b"x" * 10), w.Data(9, -62),
    ]
    raw = [w.encode_frame(f) for f in frames]
    # segments: the handshake one by one, two messages together, the NPA_RSP split in two
    segments = [*raw[:5], raw[5] + raw[6], raw[7][:10], raw[7][10:], *raw[8:]]
    text = tmp_path / "frames.txt"
    text.write_text("".join("0000 " + " ".join(f"{b:02x}" for b in seg) + "\n\n"
                            for seg in segments))
    pcap = tmp_path / "frames.pcap"
    subprocess.run(["text2pcap", "-q", "-T", "40001,40002", str(text), str(pcap)],
                   check=True, timeout=60)
    out = _tshark(pcap, "-V")
    assert "malformed" not in out
    for want in (
        "Protocol version: 4", "Channel: link (0)",
        "UALink fabric frame: INCARNATION", "Accel: 4",
        "Manager incarnation: 0x0123456789abcdef",
        "Pod UUID: 12345678-9abc-def0-1234-56789abcdef0",
        "Node name: node7", "Node name: node8", "UALink fabric frame: AUTH_PROOF",
        "UALink fabric frame: AUTH_OK",
        "UALink message: HELLO", "Receiver accel id: 4", "Sender accel id: 3",
        "UALink message: HELLO_ACK",
        "UALink message: NPA_REQ", "UALink handle: 0x1122334455667788aaaabbbbccccd404",
        "UALink message: NPA_RSP", "Size (pages): 256", "NPA offset (pages): 0x00000802",
        "UALink message: NPA_FAIL", "Reason: DUPLICATE (3)",
        "UALink message: NPA_REVOKE", "UALink message: NPA_RELEASE",
        "Status: -110", "Token: 0x000000000000feed", "Link clock (ms): 1234",
        "NPA byte address: 0x0000000000803000", "Length: 4096",
        "Deadline (receiver's link clock, ms): 5000", "NPA byte address: 0x0000000000803010",
        "Deadline (receiver's link clock, ms): 5001", "Status: -62",
    ):
        assert want in out, want
    summary = _tshark(pcap)
    for want in ("MSG seq=2 4->3 HELLO_ACK | MSG seq=3 3->4 NPA_REQ handle=0x11223344",
                 "NPA_RSP handle_lo=0xaaaabbbbccccd404 size_pages=256 npa_offset=0x802",
                 "ACK seq=6 status=-110 ETIMEDOUT", "STORE seq=9 3->4 npa=0x0000000000803010 "
                 "len=5", "DATA seq=9 status=-62 ETIME len=0"):
        assert want in summary, summary


def test_a_data_channels_handshake_and_a_version_2_hello(tmp_path):
    """A data channel is its own TCP stream: its AUTH_HELLO (version 4, channel 1) is found
    by the heuristic and shows its channel; a version 2 HELLO (no channel byte) on another
    stream is found and decoded too (a capture of an older pod)."""
    pod = uuid.UUID("12345678-9abc-def0-1234-56789abcdef0")
    data = w.encode_frame(w.AuthHello(pod, "node3", bytes(32), channel=w.Channel.DATA))
    old = w.encode_frame(w.AuthHello(pod, "node4", bytes(32), version=2))
    pcaps = []
    for i, raw in enumerate((data, old)):
        text = tmp_path / f"hello{i}.txt"
        text.write_text("0000 " + " ".join(f"{b:02x}" for b in raw) + "\n\n")
        pcaps.append(tmp_path / f"hello{i}.pcap")
        subprocess.run(["text2pcap", "-q", "-T", f"{40005 + 2 * i},{40006 + 2 * i}", str(text),
                        str(pcaps[-1])], check=True, timeout=60)
    out = _tshark(pcaps[0], "-V")
    assert "malformed" not in out
    assert "Protocol version: 4" in out and "Channel: data channel (1)" in out, out
    assert "AUTH_HELLO v4 node=node3 channel=data channel" in _tshark(pcaps[0])
    out = _tshark(pcaps[1], "-V")
    assert "Protocol version: 2" in out and "Node name: node4" in out, out
    assert "Channel" not in out and "malformed" not in out


def test_a_frame_of_the_wrong_length_is_marked_malformed(tmp_path):
    """An ACK whose length (5) is not its layout's (9; wire.py refuses it) on a link already
    recognised: marked malformed, not read past its end."""
    bad_ack = (5).to_bytes(4, "little") + bytes([w.FrameType.ACK]) + bytes(4)
    text = tmp_path / "bad.txt"
    text.write_text("".join("0000 " + " ".join(f"{b:02x}" for b in seg) + "\n\n"
                            for seg in (w.encode_frame(w.Ping(1, 2)), bad_ack)))
    pcap = tmp_path / "bad.pcap"
    subprocess.run(["text2pcap", "-q", "-T", "40003,40004", str(text), str(pcap)],
                   check=True, timeout=60)
    summary = _tshark(pcap)
    assert "PING token=0x0000000000000001 clock=2" in summary
    assert "ACK [malformed]" in summary
    assert "ACK frame of length 5: malformed" in _tshark(pcap, "-V")
