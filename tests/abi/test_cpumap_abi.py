"""UALINKD_IOCTL_MMAP_GRANT: ualinkd/abi/cpumap.py and include/ualink/ualink_cpumap.h agree as a
C compiler sees the header (the shim and tests/c/cpu_map.c are built from it)."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

from ualinkd.abi import cpumap

ROOT = Path(__file__).resolve().parents[2]
PROBE = r"""
#include <stddef.h>
#include <stdio.h>
#include "ualink/ualink_cpumap.h"
#define OFF(f) printf(#f " %zu\n", offsetof(struct ualinkd_mmap_grant, f))
int main(void)
{
    printf("size %zu\nfetch %zu\ncmd %lu\n", sizeof(struct ualinkd_mmap_grant),
           sizeof(struct ualinkd_mmap_fetch), (unsigned long)UALINKD_IOCTL_MMAP_GRANT);
    printf("fmt %s\n", UALINKD_CPUMAP_SOCKET_FMT);
    OFF(offset); OFF(length); OFF(prot); OFF(flags); OFF(fmode); OFF(pad); OFF(grant);
    OFF(socket);
    return 0;
}
"""


def test_header_matches_the_python_layout(tmp_path):
    """sizeof, every offset, the ioctl number and the socket name format are the same."""
    src, exe = tmp_path / "probe.c", tmp_path / "probe"
    src.write_text(PROBE)
    subprocess.run(["cc", "-std=gnu11", "-Wall", "-Werror", f"-I{ROOT / 'include'}", "-o",
                    str(exe), str(src)], check=True)
    out = dict(line.split(" ", 1) for line in
               subprocess.run([str(exe)], capture_output=True, text=True,
                              check=True).stdout.splitlines())
    layout = cpumap.MMAP_GRANT
    assert int(out["size"]) == layout.size == 48
    assert int(out["fetch"]) == cpumap.GRANT_REPLY_SIZE
    assert int(out["cmd"]) == cpumap.UALINKD_IOCTL_MMAP_GRANT
    names = [sub.name for sub in layout.schema.subcons]
    fmt = layout.fast.format
    for i, name in enumerate(names):
        assert int(out[name]) == struct.calcsize("<" + fmt[1 : 1 + i]), name
    c_format = out["fmt"].replace("%016llx", "{:016x}")  # printf's, in Python's spelling
    assert cpumap.socket_name(0xAB) == b"\0" + c_format.format(0xAB).encode()
