"""The README's quick starts for runtime authors and for an ABI mismatch, run as written
(issue 32 item 8): each shell block is run by bash in a scratch directory that looks like a
fresh clone after `make setup` (its `.venv`, `include` and `libualink_c` are the checkout's),
with its `hello.c` taken from the README, and must print what its `# …` lines say it prints
(`…` standing for anything). The pod it starts is a real `ualinkd pod`, stopped by the
block's own `kill %1`; whatever is left is killed and unmounted afterwards.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest
from nodes import REPO, c_program, force_unmount

pytestmark = pytest.mark.integration


def quick_starts() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("\n## Quick starts\n")
    return text[start:text.index("\n## ", start + 1)]


def subsection(title: str) -> str:
    qs = quick_starts()
    start = qs.index(f"\n### {title}")
    end = qs.find("\n### ", start + 1)
    return qs[start:end if end > 0 else len(qs)]


def expected_lines(block: str) -> list[re.Pattern[str]]:
    """A comment line alone under a command is its output, `…` anything in it."""
    pats = []
    for line in block.splitlines():
        if line.startswith("# "):
            parts = [re.escape(p) for p in line[2:].split("…")]
            pats.append(re.compile("^" + ".*".join(parts) + "$", re.M))
    return pats


def run_block(tmp: Path, block: str, files: dict[str, str]) -> str:
    """The block, minus its `make setup` (done: the checkout's build is linked in), by
    bash in `tmp`; stdout and stderr together. A watchdog kills it after 120 s."""
    lines = block.splitlines()
    assert lines[0].split("#")[0].split() == ["make", "setup"], lines[0]
    for name in (".venv", "include", "libualink_c"):
        (tmp / name).symlink_to(REPO / name)
    for name, body in files.items():
        (tmp / name).write_text(body)
    proc = subprocess.Popen(["bash", "-c", "\n".join(lines[1:]) + "\n"], cwd=tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"the quick start did not finish in 120 s:\n{out}") from None
    finally:
        with_pod = tmp / "ualink-pod"
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the pod, if `kill %1` did not stop it
        except ProcessLookupError:
            pass
        if with_pod.is_dir():
            for node in with_pod.glob("node*"):
                force_unmount(node)
    return out


def assert_prints(block: str, out: str) -> None:
    pats = expected_lines(block)
    assert pats, block
    for pat in pats:
        assert pat.search(out), f"no line matching {pat.pattern!r} in:\n{out}"


def test_quick_start_runtime_author(tmp_path):
    """README "A C program on an emulated GPU": an unmodified libdrm_amdgpu program, built
    with `cc`, opens /dev/dri/renderD128 through the shim and sees node0's MI300X; the pod
    is stopped and unmounted by the block's `kill %1`."""
    c_program("libualink_shim.so")
    section = subsection("A C program on an emulated GPU")
    hello = re.search(r"```c\n(.*?)```", section, re.S)
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert hello and block
    out = run_block(tmp_path, block.group(1), {"hello.c": hello.group(1)})
    assert_prints(block.group(1), out)
    for node in (tmp_path / "ualink-pod").glob("node*"):
        assert not os.path.ismount(node), f"{node} still mounted after `kill %1`:\n{out}"


def test_quick_start_abi_mismatch(tmp_path):
    """README "An ABI mismatch": abi-check names the widened field of the edited header;
    the traced pod shows the refused import's ioctl, decoded, with its errno."""
    c_program("import")
    block = re.search(r"```sh\n(.*?)```", subsection("An ABI mismatch"), re.S)
    assert block
    out = run_block(tmp_path, block.group(1), {})
    assert_prints(block.group(1), out)
