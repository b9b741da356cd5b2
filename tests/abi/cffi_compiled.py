"""The one way tests/abi asks the C compiler: cffi's API mode, a module built in a temporary
directory and imported from it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import cffi


def compiled(tmp: Path, name: str, cdef: str, source: str,
             include_dirs: list[str]) -> ModuleType:
    """`source` compiled against `cdef` (cffi fills in every `...`) as module `name`."""
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    ffi.set_source(name, source, include_dirs=include_dirs)
    ffi.compile(tmpdir=str(tmp), verbose=False)
    sys.path.insert(0, str(tmp))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(tmp))
