"""STYLE rule 1: the sans-IO packages never import trio, socket or the FUSE binding.

Every module of `ualinkd.abi`, `.drm`, `.amdgpu` and `.ualink` is parsed and each import
(absolute, relative, or through importlib/__import__ with a literal name) is checked.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["abi", "drm", "amdgpu", "ualink"]
FORBIDDEN = ("trio", "socket", "ualinkd.fuse", "cffi", "_fuse_ll", "asyncio", "selectors",
             "ualinkd.daemon", "ualinkd.cli", "ualinkd.fabric.agent", "ualinkd.fabric.link")
MODULES = sorted(p for pkg in PACKAGES for p in (ROOT / "ualinkd" / pkg).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call):
            fn = node.func
            fname = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if fname in ("import_module", "__import__") and node.args and isinstance(
                node.args[0], ast.Constant
            ):
                found.add(str(node.args[0].value))
    return found


def test_modules_found():
    """STYLE 1: the walk covers the four packages."""
    names = {module_name(p) for p in MODULES}
    assert {"ualinkd.abi.structs", "ualinkd.drm.device", "ualinkd.amdgpu.driver",
            "ualinkd.ualink.manager"} <= names


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_no_io_imports(path):
    """STYLE 1: no trio, socket, FUSE binding (or other I/O layer) in the sans-IO core."""
    bad = sorted(
        m for m in imports_of(path)
        if any(m == f or m.startswith(f + ".") for f in FORBIDDEN)
    )
    assert bad == [], f"{module_name(path)} imports {bad}"


def test_importing_the_core_loads_no_io_module():
    """STYLE 1: importing the sans-IO packages (in a fresh interpreter) pulls in no trio,
    no FUSE binding and no fabric transport, not even indirectly."""
    code = (
        "import sys\n"
        + "".join(f"import {module_name(p)}\n" for p in MODULES)
        + "bad = [m for m in sys.modules if m.split('.')[0] in ('trio', 'cffi', '_fuse_ll')"
        " or m.startswith(('ualinkd.fuse', 'ualinkd.fabric.agent', 'ualinkd.fabric.link'))]\n"
        "print(sorted(bad))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       cwd=ROOT, check=True)
    assert r.stdout.strip() == "[]"
