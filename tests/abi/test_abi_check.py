"""`ualinkd abi-check`: a client's header against the emulator's structs and ioctl numbers
(issue 12 item 3). The C compiler decides every offset (ualinkd/abi_check.py's probe).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ualinkd import abi_check as check

ROOT = Path(__file__).resolve().parents[2]
PROJECT_HEADER = ROOT / "include" / "ualink" / "ualink_drm.h"
LIBDRM = Path("/usr/include/libdrm")
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
needs_libdrm = pytest.mark.skipif(not (LIBDRM / "amdgpu_drm.h").exists(),
                                  reason="needs libdrm-dev's amdgpu_drm.h")


def _abi_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ualinkd", "abi-check", *args],
                          capture_output=True, text=True, timeout=120, check=False)


@needs_cc
def test_project_header_passes_with_every_struct_and_ioctl_declared():
    """spec §1.3, §2.2: include/ualink/ualink_drm.h declares everything the emulator decodes,
    each at the emulator's offsets, and every emulated ioctl with the emulator's number."""
    r = check.check([str(PROJECT_HEADER)])
    assert r.ok, r.mismatches
    assert r.notes == []
    assert r.checked_structs == len(check.emulator_aggregates())
    assert r.checked_ioctls == len(check.emulator_ioctls())


@needs_cc
def test_probe_sees_what_the_emulator_has():
    """The probe's numbers for the project header are the emulator's own, field by field
    (the comparison that used to live in tests/abi as hand-written cffi cdefs)."""
    abi = check.probe([str(PROJECT_HEADER)])
    for agg in check.emulator_aggregates():
        assert abi.sizes[agg.ctype] == agg.size, agg.ctype
        for f in agg.fields:
            assert abi.fields[(agg.ctype, f.path)] == (f.offset, f.size), (agg.ctype, f.path)
            if f.signed is not None:
                assert abi.signed[(agg.ctype, f.path)] is f.signed, (agg.ctype, f.path)
    for macro, spec in check.emulator_ioctls().items():
        assert abi.ioctls[macro] == spec.cmd, macro


@needs_cc
@needs_libdrm
def test_libdrm_header_passes_with_older_layouts_noted():
    """Debian libdrm-dev (2.4.114): no UALink block (not declared), the 40-byte GEM_VA and
    the 368-byte drm_amdgpu_info_device as older prefixes, no mismatch; exit status 0."""
    p = _abi_check(str(LIBDRM / "amdgpu_drm.h"), "-I", str(LIBDRM))
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "`drm_amdgpu_ualink_handle` not declared" in out
    assert "`DRM_IOCTL_AMDGPU_UALINK_HANDLE` not declared" in out
    if "vm_timeline_point" not in (LIBDRM / "amdgpu_drm.h").read_text():  # libdrm < 2.4.121
        assert "`drm_amdgpu_gem_va` is an older prefix: 40 bytes (through `map_size`)" in out
        assert "`DRM_IOCTL_AMDGPU_GEM_VA` is 0x40286448: the older 40-byte argument" in out
    if "userq_ip_mask" not in (LIBDRM / "amdgpu_drm.h").read_text():
        assert ("`drm_amdgpu_info_device` is an older prefix: 368 bytes (through "
                "`tcc_disabled_mask`), emulator 448") in out
    assert re.search(r"^not answered by the emulator .*\bAMDGPU_SCHED\b", out, re.M)
    assert out.splitlines()[-1].startswith("ok: ")


def _edited_copy(tmp_path: Path, old: str, new: str) -> Path:
    text = PROJECT_HEADER.read_text()
    assert text.count(old) == 1, old
    copy = tmp_path / "ualink_drm.h"
    copy.write_text(text.replace(old, new))
    return copy


@needs_cc
def test_changed_field_type_fails_naming_the_field(tmp_path):
    """issue 12: a header with one field's type changed fails naming that field: the
    union's gem_handle as a u64 is the one line (the union's size does not change)."""
    copy = _edited_copy(tmp_path, "\t\t__u32 gem_handle;", "\t\t__u64 gem_handle;")
    p = _abi_check(str(copy))
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.splitlines() == [
        "`drm_amdgpu_ualink_handle_in.gem_handle` is 8 bytes, emulator expects 4",
        "1 mismatch: 62 structs and 33 ioctl numbers compared"]


@needs_cc
def test_changed_signedness_fails_naming_the_field(tmp_path):
    """A same-size type change is a type change too: drm_prime_handle.fd as __u32 (the
    kernel's is __s32, drm.h) fails naming the field."""
    text = PROJECT_HEADER.read_text()
    start = text.index("struct drm_prime_handle {")
    at = text.index("__s32 fd;", start)
    copy = tmp_path / "ualink_drm.h"
    copy.write_text(text[:at] + "__u32 fd;" + text[at + len("__s32 fd;"):])
    r = check.check([str(copy)])
    assert r.mismatches == ["`drm_prime_handle.fd` is unsigned, emulator expects signed"]


@needs_cc
def test_changed_field_type_moving_later_fields_names_each_offset(tmp_path):
    """flags as a u64 moves it and the union after it (spec §1.3 offsets 4 and 8), grows the
    struct, and so changes the ioctl number, which carries the size."""
    copy = _edited_copy(tmp_path, "\t__u32 flags;\n\tunion {", "\t__u64 flags;\n\tunion {")
    r = check.check([str(copy)])
    assert not r.ok
    assert r.mismatches == [
        "`drm_amdgpu_ualink_handle_in.flags` at offset 8, emulator expects 4",
        "`drm_amdgpu_ualink_handle_in.flags` is 8 bytes, emulator expects 4",
        "`drm_amdgpu_ualink_handle_in.gem_handle` at offset 16, emulator expects 8",
        "`drm_amdgpu_ualink_handle_in.import_ualink_handle` at offset 16, emulator expects 8",
        "`drm_amdgpu_ualink_handle_in` is 32 bytes, emulator expects 24",
        "`drm_amdgpu_ualink_handle.in` is 32 bytes, emulator expects 24",
        "`drm_amdgpu_ualink_handle` is 32 bytes, emulator expects 24",
        "`DRM_IOCTL_AMDGPU_UALINK_HANDLE` is 0xc020645b (dir 3, nr 0x5b, size 32), emulator "
        "expects 0xc018645b (dir 3, nr 0x5b, size 24)",
    ]


@needs_cc
def test_changed_ioctl_number_is_reported(tmp_path):
    """issue 12: the UALink ioctl's index moved (0x1B -> 0x1C) is a mismatch naming both
    numbers, while every struct still agrees."""
    text = PROJECT_HEADER.read_text()
    m = re.search(r"#define DRM_AMDGPU_UALINK_HANDLE\s+0x1[bB]", text)
    assert m, "the header defines DRM_AMDGPU_UALINK_HANDLE as 0x1B"
    copy = tmp_path / "ualink_drm.h"
    copy.write_text(text[: m.start()] + "#define DRM_AMDGPU_UALINK_HANDLE 0x1C" + text[m.end():])
    r = check.check([str(copy)])
    assert not r.ok
    assert r.mismatches == [
        "`DRM_IOCTL_AMDGPU_UALINK_HANDLE` is 0xc018645c (dir 3, nr 0x5c, size 24), emulator "
        "expects 0xc018645b (dir 3, nr 0x5b, size 24)"]


@needs_cc
@needs_libdrm
def test_header_named_through_include_dirs():
    """A HEADER that is not a file is #include <HEADER>, found through -I."""
    p = _abi_check("amdgpu_drm.h", "-I", str(LIBDRM))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "`drm_amdgpu_ualink_handle` not declared" in p.stdout


@needs_cc
def test_header_declaring_nothing_of_the_abi_fails(tmp_path):
    """A header with none of the structs or ioctls (the wrong file) is not a pass."""
    other = tmp_path / "other.h"
    other.write_text("struct unrelated { int x; };\n")
    p = _abi_check(str(other))
    assert p.returncode == 1
    assert "declares none of the emulator's structs or ioctls" in p.stdout


@needs_cc
def test_header_that_does_not_compile_exits_2(tmp_path):
    bad = tmp_path / "bad.h"
    bad.write_text("struct drm_gem_close { __u32 handle\n")
    p = _abi_check(str(bad))
    assert p.returncode == 2
    assert "does not compile" in p.stderr


@needs_cc
def test_a_member_the_header_lacks_is_named_with_the_size_it_costs(tmp_path):
    """Audit F: with the import arm deleted from drm_amdgpu_ualink_handle_in's union the
    struct shrinks; the report names the member it lacks (and where the emulator has it),
    not only the sizes."""
    copy = _edited_copy(tmp_path, "\t\t__u64 import_ualink_handle[2];\n", "")
    r = check.check([str(copy)])
    assert not r.ok
    assert ("`drm_amdgpu_ualink_handle_in.import_ualink_handle` is not in this header, "
            "emulator has it at offset 8 (16 bytes)") in r.mismatches, r.mismatches
    assert "`drm_amdgpu_ualink_handle_in` is 12 bytes, emulator expects 24" in r.mismatches


@needs_cc
def test_the_header_is_compiled_never_run(tmp_path):
    """issue 29 item 7: at cb563a2 abi-check built and ran a program including the header,
    so a header's constructor ran as whoever checked it (root). The values come from the
    object file now: the constructor never runs, and the report is the one the header's
    declarations make (the same as before)."""
    ran = tmp_path / "constructor-ran"
    hostile = tmp_path / "ualink_drm.h"
    hostile.write_text(PROJECT_HEADER.read_text() + f"""
#include <stdio.h>
__attribute__((constructor)) static void ualink_test_ctor(void) {{
    FILE *f = fopen("{ran}", "w");
    if (f) fclose(f);
}}
""")
    p = _abi_check(str(hostile))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout == "ok: 62 structs and 33 ioctl numbers compared\n"
    assert not ran.exists()


def test_values_are_read_from_the_object_files_section():
    """The ELF reader of the probe (elf(5)): 32- and 64-bit, either byte order; a file that
    is not ELF, or has no such section, is a CompileError, not a traceback."""
    import struct as s

    def elf(bits64: bool, order: str, data: bytes) -> bytes:
        names = b"\0.shstrtab\0ualink_abi_probe\0"
        ehsize, shentsize = (64, 64) if bits64 else (52, 40)
        sh = order + ("IIQQQQIIQQ" if bits64 else "IIIIIIIIII")
        body = data + names
        shoff = ehsize + len(body)
        head = b"\x7fELF" + bytes([2 if bits64 else 1, 1 if order == "<" else 2, 1]) + bytes(9)
        if bits64:
            head += s.pack(order + "HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, ehsize, 0, 0,
                           shentsize, 3, 1)
        else:
            head += s.pack(order + "HHIIIIIHHHHHH", 1, 3, 1, 0, 0, shoff, 0, ehsize, 0, 0,
                           shentsize, 3, 1)
        headers = [s.pack(sh, *[0] * 10),
                   s.pack(sh, 1, 3, 0, 0, ehsize + len(data), len(names), 0, 0, 1, 0),
                   s.pack(sh, 11, 1, 2, 0, ehsize, len(data), 0, 0, 8, 0)]
        return head + body + b"".join(headers)

    for bits64 in (True, False):
        for order in "<>":
            data = s.pack(order + "QQ", 0x75616C696E6B4142, 7)
            assert check._elf_section(elf(bits64, order, data), "ualink_abi_probe") == (
                data, order)
    with pytest.raises(check.CompileError, match="no nothing section"):
        check._elf_section(elf(True, "<", bytes(16)), "nothing")
    with pytest.raises(check.CompileError, match="not write an ELF"):
        check._elf_section(b"MZ" + bytes(100), "ualink_abi_probe")
    with pytest.raises(check.CompileError, match="malformed"):
        check._elf_section(elf(True, "<", bytes(16))[:80], "ualink_abi_probe")


# -- the KFD's header (issue 32 item 6) --------------------------------------------------------
KFD_HEADER = ROOT / "include" / "ualink" / "ualink_kfd.h"
SYSTEM_KFD = Path("/usr/include/linux/kfd_ioctl.h")


@needs_cc
def test_project_kfd_header_passes_with_every_struct_and_ioctl_declared():
    """issue 32 item 6: include/ualink/ualink_kfd.h is checked against the emulated KFD
    (kfd_ioctl.h's structs, every AMDKFD_IOC_* the KFD answers); at cb563a2 it failed as
    "declares none of the emulator's structs or ioctls"."""
    p = _abi_check(str(KFD_HEADER))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout == (f"ok: {len(check.kfd_aggregates())} structs and "
                        f"{len(check.kfd_ioctls())} ioctl numbers compared\n")
    abi = check.probe([str(KFD_HEADER)])
    for agg in check.kfd_aggregates():
        assert abi.sizes[agg.ctype] == agg.size, agg.ctype
        for f in agg.fields:
            assert abi.fields[(agg.ctype, f.path)] == (f.offset, f.size), (agg.ctype, f.path)
    for macro, spec in check.kfd_ioctls().items():
        assert abi.ioctls[macro] == spec.cmd, macro


@needs_cc
@pytest.mark.skipif(not SYSTEM_KFD.exists() or not (LIBDRM / "drm.h").exists(),
                    reason="needs linux-libc-dev's kfd_ioctl.h and libdrm-dev's drm.h")
def test_system_kfd_header_passes_with_its_differences_said():
    """Debian 12's <linux/kfd_ioctl.h> (linux-libc-dev 6.1, KFD 1.11; libhsakmt-dev 5.2.3
    ships none of its own): its <drm/drm.h> found as libdrm-dev's libdrm/drm.h; what came
    after it said, not failed: CREATE_QUEUE's 88-byte argument (1.17 grew it to 96) an older
    prefix, EXPORT_DMABUF (1.12) and RUNTIME_ENABLE (1.13) not declared; the drm.h it
    includes is not what is checked (no DRM line)."""
    p = _abi_check(str(SYSTEM_KFD))
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "drm_" not in out and "DRM_IOCTL" not in out
    minor = int(re.search(r"#define KFD_IOCTL_MINOR_VERSION (\d+)", SYSTEM_KFD.read_text())[1])
    if minor < 17:
        assert ("`kfd_ioctl_create_queue_args` is an older prefix: 88 bytes (through "
                "`ctl_stack_size`), emulator 96; sdma_engine_id, pad not declared (accepted: "
                "kfd_ioctl zero-extends a shorter argument and copies out only the caller's "
                "size)") in out
        assert ("`AMDKFD_IOC_CREATE_QUEUE` is 0xc0584b02: the older 88-byte argument "
                "(emulator 0xc0604b02; accepted)") in out
    if minor < 12:
        assert "`AMDKFD_IOC_EXPORT_DMABUF` not declared" in out
    assert re.search(r"^not answered by the emulator .*\bSMI_EVENTS\b", out, re.M)
    assert out.splitlines()[-1].startswith("ok: ")


def _edited_kfd(tmp_path: Path, old: str, new: str) -> Path:
    text = KFD_HEADER.read_text()
    assert text.count(old) == 1, old
    copy = tmp_path / "ualink_kfd.h"
    copy.write_text(text.replace(old, new))
    return copy


@needs_cc
def test_a_kfd_field_and_number_that_moved_are_named(tmp_path):
    """A libhsakmt copy with WAIT_EVENTS's num_events as a u64 (moving wait_for_all on, and
    the size in the number) fails naming each, as a DRM header does."""
    copy = _edited_kfd(tmp_path, "\t__u32 num_events;", "\t__u64 num_events;")
    r = check.check([str(copy)])
    assert r.mismatches == [
        "`kfd_ioctl_wait_events_args.num_events` is 8 bytes, emulator expects 4",
        "`kfd_ioctl_wait_events_args.wait_for_all` at offset 16, emulator expects 12",
        "`kfd_ioctl_wait_events_args.timeout` at offset 20, emulator expects 16",
        "`kfd_ioctl_wait_events_args.wait_result` at offset 24, emulator expects 20",
        "`kfd_ioctl_wait_events_args` is 32 bytes, emulator expects 24",
        "`AMDKFD_IOC_WAIT_EVENTS` is 0xc0204b0c (dir 3, nr 0x0c, size 32), emulator expects "
        "0xc0184b0c (dir 3, nr 0x0c, size 24)"]
    copy = _edited_kfd(tmp_path, "_IOWR(AMDKFD_IOCTL_BASE, 0x0C,", "_IOWR(AMDKFD_IOCTL_BASE, 0x0D,")
    p = _abi_check(str(copy))
    assert p.returncode == 1
    assert p.stdout.splitlines()[0] == (
        "`AMDKFD_IOC_WAIT_EVENTS` is 0xc0184b0d (dir 3, nr 0x0d, size 24), emulator expects "
        "0xc0184b0c (dir 3, nr 0x0c, size 24)")


@needs_cc
def test_a_header_with_both_uapis_is_checked_against_both(tmp_path):
    both = tmp_path / "both.h"
    both.write_text(f'#include "{PROJECT_HEADER}"\n#include "{KFD_HEADER}"\n')
    r = check.check([str(both)])
    assert r.ok and r.notes == [], r.mismatches + r.notes
    assert r.checked_structs == len(check.emulator_aggregates()) + len(check.kfd_aggregates())
    assert r.checked_ioctls == len(check.emulator_ioctls()) + len(check.kfd_ioctls())


def test_the_compiler_runs_bounded_in_memory_and_reads_no_stdin_of_ours(tmp_path, monkeypatch):
    """Issue 29 item 7, a header that attacks the compiler: `#include "/dev/zero"` makes
    cc1 read for ever (3 GiB in 5 s, all of the host's memory within the 120 s timeout, as
    root). Every compiler run gets RLIMIT_AS (2 GiB), RLIMIT_FSIZE and RLIMIT_CPU, and
    /dev/null as stdin when it reads no source from us. A stand-in $CC reports what it was
    given (at cb563a2 and before this: no limit, and our stdin)."""
    seen = tmp_path / "seen"
    fake = tmp_path / "cc"
    fake.write_text(f"#!/bin/sh\n{{ ulimit -v; ulimit -f; ulimit -t; "
                    f"[ -c /dev/stdin ] && echo tty || wc -c; }} >> {seen}\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    header = tmp_path / "h.h"
    header.write_text("#define X 1\n")
    with open("/dev/zero", "rb") as zero:  # (what a caller's stdin might hold)
        monkeypatch.setattr(sys, "stdin", zero)
        with pytest.raises(check.CompileError):
            check.probe([str(header)])
    got = seen.read_text().split()
    # ulimit -v is KiB, -f 512-byte blocks (POSIX sh); the -E run's stdin is our source
    assert got[:3] == [str(check._MAX_MEMORY >> 10), str(check._MAX_OUTPUT >> 9),
                       str(check._TIMEOUT)], got
    assert int(got[3]) > 0  # (the -E run read the include lines we gave it)


@needs_cc
def test_a_header_including_dev_zero_fails_in_seconds(tmp_path):
    """The end to end: a header including /dev/zero is one error line and exit 1 once cc1
    reaches the memory bound (a few seconds), not the whole host's memory."""
    import time

    header = tmp_path / "zero.h"
    header.write_text('#include "/dev/zero"\n')
    t = time.monotonic()
    p = _abi_check(str(header))
    took = time.monotonic() - t
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert took < 60, took
