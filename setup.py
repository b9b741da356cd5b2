# The cffi binding of libfuse3's low-level API is compiled at install time
# (API mode: the C compiler checks every struct and callback signature).
#
# A wheel also carries the C side (ualinkd/native.py says where it is found): libualink.so,
# the LD_PRELOAD shim, the headers, a pkg-config file, the example clients and the Wireshark dissector, built here by
# libualink_c/Makefile into ualinkd/_native/. An editable install (`pip install -e .`, what
# `make setup` does) skips it: the checkout's libualink_c/build/ is used in place.
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
EXAMPLES = ("export", "import", "share", "peer")
PC = """\
prefix=${pcfiledir}/../..
includedir=${prefix}/include
libdir=${prefix}/lib

Name: ualink
Description: ualinkd's client library (the UALink ioctls of an emulated amdgpu node)
Version: %s
Cflags: -I${includedir}
Libs: -L${libdir} -Wl,-rpath,${libdir} -lualink
"""


class build_py_with_native(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        out = Path(self.build_lib) / "ualinkd" / "_native"
        shutil.rmtree(out, ignore_errors=True)
        (out / "lib" / "pkgconfig").mkdir(parents=True)
        (out / "bin").mkdir()
        with tempfile.TemporaryDirectory() as tmp:
            b = Path(tmp)
            # The examples look for libualink.so in ../lib once installed (and next to
            # themselves in a checkout build: the Makefile's $ORIGIN).
            subprocess.run(["make", "-s", "-C", str(HERE / "libualink_c"), f"B={b}",
                            "LDFLAGS=-Wl,-rpath,'$$ORIGIN/../lib'", "lib", "shim",
                            *(str(b / e) for e in EXAMPLES)], check=True)
            for so in ("libualink.so", "libualink_shim.so"):
                shutil.copy2(b / so, out / "lib" / so)
            os.symlink("libualink.so", out / "lib" / "libualink.so.0")
            for e in EXAMPLES:
                shutil.copy2(b / e, out / "bin" / e)
        shutil.copytree(HERE / "include", out / "include")
        (out / "share" / "wireshark").mkdir(parents=True)
        shutil.copy2(HERE / "packaging" / "wireshark" / "ualink.lua",
                     out / "share" / "wireshark" / "ualink.lua")
        version = self.distribution.get_version()
        (out / "lib" / "pkgconfig" / "ualink.pc").write_text(PC % version)


setup(cffi_modules=["ualinkd/fuse/_build.py:ffibuilder"],
      cmdclass={"build_py": build_py_with_native})
