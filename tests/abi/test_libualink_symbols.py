"""libualink.so exports exactly the functions declared in include/ualink/ualink.h.

STYLE.md rule 11: hidden visibility plus a version script; this test is the check that
the two fences, the header and the built library agree (no internal helper leaks, no API
function is left out).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEADER = ROOT / "include" / "ualink" / "ualink.h"
LIBDIR = ROOT / "libualink_c"
LIBRARY = LIBDIR / "build" / "libualink.so"
VERSION_SCRIPT = LIBDIR / "libualink.map"

pytestmark = pytest.mark.skipif(shutil.which("nm") is None, reason="needs binutils' nm")


def header_functions(text: str) -> set[str]:
    """Names of the `ualink_*(` declarations, ignoring comments and preprocessor lines."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    return set(re.findall(r"\b(ualink_\w+)\s*\(", text))


def version_nodes(text: str) -> set[str]:
    """Version node names defined by a GNU ld version script (`NAME { ... };`)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return set(re.findall(r"(\w+)\s*\{", text))


def dynamic_symbols(library: Path) -> dict[str, str]:
    """Defined dynamic symbols of `library`: name (version suffix removed) -> nm type."""
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    symbols = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        kind, name = fields[-2], fields[-1]
        symbols[name.split("@", 1)[0]] = kind
    return symbols


@pytest.fixture(scope="module")
def library() -> Path:
    if not LIBRARY.exists():
        subprocess.run(["make", "-C", str(LIBDIR), "lib"], check=True, capture_output=True)
    return LIBRARY


def test_header_parser_sees_the_api():
    names = header_functions(HEADER.read_text())
    assert {"ualink_open", "ualink_close", "ualink_import", "ualink_gpu_write"} <= names
    assert "ualink_dev" not in names


def test_exports_exactly_the_header_api(library: Path):
    api = header_functions(HEADER.read_text())
    symbols = dynamic_symbols(library)
    # A named version node appears as an absolute symbol of the same name.
    nodes = {name for name, kind in symbols.items() if kind == "A"}
    assert nodes <= version_nodes(VERSION_SCRIPT.read_text())
    exported = {name: kind for name, kind in symbols.items() if name not in nodes}

    assert set(exported) == api, (
        f"missing from the library: {sorted(api - set(exported))}; "
        f"exported but not in the header: {sorted(set(exported) - api)}"
    )
    assert all(kind == "T" for kind in exported.values()), exported
