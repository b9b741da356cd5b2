"""Where the C side of ualinkd is: libualink.so, the LD_PRELOAD shim, the headers, the
pkg-config file, the example clients and the Wireshark dissector.

A wheel (or `pip install .`) carries them inside the package, in `ualinkd/_native/`
(setup.py builds them with libualink_c/Makefile); a source checkout (`pip install -e .`, the
tests) uses `libualink_c/build/` and `include/` of the checkout, built by `make c`.
`ualinkd config --cflags|--libs|--shim|...` prints these paths, pkg-config style.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
_CHECKOUT = _PACKAGE.parent


@dataclass(frozen=True, slots=True)
class NativeLayout:
    include_dir: Path  # holds ualink/ualink.h and ualink/ualink_drm.h
    lib_dir: Path  # holds libualink.so (and libualink.a in a checkout)
    shim: Path  # libualink_shim.so
    bin_dir: Path  # the example clients: export, import, share, peer
    pkgconfig_dir: Path | None  # holds ualink.pc (None: a checkout not built yet)
    installed: bool  # inside the package (a wheel) rather than a source checkout
    wireshark: Path  # the fabric protocol's Lua dissector (tshark -X lua_script:...)

    @property
    def library(self) -> Path:
        return self.lib_dir / "libualink.so"


def layout() -> NativeLayout:
    """The installed layout if the package carries one, else the checkout's."""
    native = _PACKAGE / "_native"
    if (native / "lib" / "libualink.so").exists():
        return NativeLayout(native / "include", native / "lib",
                            native / "lib" / "libualink_shim.so", native / "bin",
                            native / "lib" / "pkgconfig", True,
                            native / "share" / "wireshark" / "ualink.lua")
    build = _CHECKOUT / "libualink_c" / "build"
    pc = build / "pkgconfig"  # libualink_c/Makefile writes it with the checkout's paths
    return NativeLayout(_CHECKOUT / "include", build, build / "libualink_shim.so", build,
                        pc if (pc / "ualink.pc").exists() else None, False,
                        _CHECKOUT / "packaging" / "wireshark" / "ualink.lua")


def library_path() -> Path:
    """libualink.so, for cffi's ABI mode (UALINK_LIBRARY overrides). Raises
    FileNotFoundError naming the fix when neither the package nor a checkout has it."""
    env = os.environ.get("UALINK_LIBRARY")
    if env:
        return Path(env)
    lay = layout()
    if not lay.library.exists():
        where = ("run `make c` in the checkout" if (_CHECKOUT / "libualink_c").is_dir()
                 else "reinstall ualinkd from a wheel or source tree that builds it")
        raise FileNotFoundError(f"libualink.so is not built ({lay.library}): {where}")
    return lay.library
