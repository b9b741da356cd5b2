"""The README's C example compiles and does what its comments say, against a real pod."""

from __future__ import annotations

import re
import subprocess

import pytest
from nodes import BUILD, REPO, c_program, running_pod

pytestmark = pytest.mark.integration


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## A client in C"):]
    m = re.search(r"```c\n(.*?)```", section, re.S)
    assert m, "README has no C example under 'A client in C'"
    return m.group(1)


def test_readme_c_example_runs(tmp_path):
    """README "A client in C": export on node0, import/map/load on node1 → "hello"."""
    c_program("libualink.so")
    src = tmp_path / "example.c"
    body = readme_example()
    includes = "\n".join(line for line in body.splitlines() if line.startswith("#include"))
    code = "\n".join(line for line in body.splitlines() if not line.startswith("#include"))
    src.write_text(f"#include <stdio.h>\n{includes}\nint main(void)\n{{\n{code}\n"
                   '    printf("%s\\n", buf);\n    return 0;\n}\n')
    exe = tmp_path / "example"
    subprocess.run(["cc", "-std=gnu11", "-Wall", "-Werror", "-Wno-unused-variable",
                    f"-I{REPO / 'include'}", str(src), "-o", str(exe), f"-L{BUILD}",
                    "-lualink", f"-Wl,-rpath,{BUILD}"], check=True)
    with running_pod(tmp_path / "pod") as (a, b):
        root = tmp_path / "ualink-pod"
        root.mkdir()
        (root / "node0").symlink_to(a.mount)
        (root / "node1").symlink_to(b.mount)
        out = subprocess.run([str(exe)], cwd=tmp_path, check=True, capture_output=True,
                             text=True, timeout=30).stdout
    assert out == "hello\n"
