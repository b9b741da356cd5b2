"""The installable product (issue 11 item 2): a wheel carries libualink, the shim, the
headers, a pkg-config file and the example clients; a user project with only that wheel
installed compiles a C client from the installed files and runs it in a pod through the
installed pytest fixture. Needs root (the pod), gcc, and the pip registry (build deps)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CLIENT = r"""
#include <stdio.h>
#include <ualink/ualink.h>

int main(int argc, char **argv)
{
    ualink_dev *dev;
    uint32_t bo;
    uint64_t h[2];
    int r = ualink_open(argc > 1 ? argv[1] : "/dev/dri/renderD128", &dev);
    if (r == 0)
        r = ualink_bo_create(dev, 1 << 20, 4096, AMDGPU_GEM_DOMAIN_VRAM, 0, &bo);
    if (r == 0)
        r = ualink_export(dev, bo, h);
    if (r) {
        fprintf(stderr, "client: %d\n", r);
        return 1;
    }
    printf("exported %016llx%016llx\n", (unsigned long long)h[1], (unsigned long long)h[0]);
    return 0;
}
"""

USER_TEST = """
def test_client_in_a_pod(ualink_pod):
    out = ualink_pod.node(1).run(["{client}"], check=True, timeout=60)
    assert out.stdout.startswith("exported ") and len(out.stdout.split()[1]) == 32
"""


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    kw.setdefault("timeout", 600)
    r = subprocess.run(argv, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    assert r.returncode == 0, f"{argv[:3]} failed:\n{r.stdout}\n{r.stderr}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel built from this checkout (and pytest) in it."""
    if os.geteuid() != 0:
        pytest.skip("the pod needs root")
    tmp = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "dist"),
          str(REPO)])
    wheel = next((tmp / "dist").glob("ualinkd-*.whl"))
    env_dir = tmp / "venv"
    venv.create(env_dir, with_pip=True)
    _run([str(env_dir / "bin" / "pip"), "install", "-q", str(wheel), "pytest", "pytest-trio"])
    return env_dir


def test_wheel_carries_the_c_side(installed: Path):
    """`ualinkd config` names files inside the installed package, and they exist."""
    cfg = _run([str(installed / "bin" / "ualinkd"), "config", "--includedir", "--libdir",
                "--shim", "--bindir"]).stdout.split()
    site = str(installed / "lib")
    assert all(p.startswith(site) for p in cfg), cfg
    include, lib, shim, bindir = map(Path, cfg)
    assert (include / "ualink" / "ualink.h").is_file()
    assert (include / "ualink" / "ualink_drm.h").is_file()
    assert (lib / "libualink.so").is_file() and shim.is_file()
    assert {"export", "import", "share", "peer"} <= {p.name for p in bindir.iterdir()}
    # The examples find the installed library by themselves (no LD_LIBRARY_PATH).
    ldd = _run(["ldd", str(bindir / "export")]).stdout
    found = [line.split("=>")[1].split()[0] for line in ldd.splitlines() if "libualink" in line]
    assert [Path(os.path.realpath(f)).parent for f in found] == [lib.resolve()], ldd
    # issue 12: the Wireshark dissector is in the package, and the installed header passes
    # the installed `ualinkd abi-check`.
    lua = Path(_run([str(installed / "bin" / "ualinkd"), "config", "--wireshark"]).stdout.strip())
    assert str(lua).startswith(site) and lua.name == "ualink.lua" and lua.is_file()
    check = _run([str(installed / "bin" / "ualinkd"), "abi-check",
                  str(include / "ualink" / "ualink_drm.h")]).stdout
    assert check.splitlines()[-1].startswith("ok: "), check
    # issue 32 item 6: and so does the KFD's, checked against the emulated KFD.
    kfd = _run([str(installed / "bin" / "ualinkd"), "abi-check",
                str(include / "ualink" / "ualink_kfd.h")]).stdout
    assert kfd.splitlines() == ["ok: 31 structs and 30 ioctl numbers compared"], kfd


def test_user_project_builds_a_client_and_runs_the_fixture(installed: Path, tmp_path: Path):
    """Compile with `ualinkd config --cflags --libs` and with pkg-config, then a pytest run
    in the user's project, using only the installed plugin, runs the client in a pod."""
    (tmp_path / "client.c").write_text(CLIENT)
    flags = _run([str(installed / "bin" / "ualinkd"), "config", "--cflags", "--libs"])
    _run(["cc", "-o", str(tmp_path / "client"), str(tmp_path / "client.c"),
          *flags.stdout.split()])
    pc_dir = _run([str(installed / "bin" / "ualinkd"), "config", "--pkgconfig-path"]).stdout
    pc = _run(["pkg-config", "--cflags", "--libs", "ualink"],
              env={**os.environ, "PKG_CONFIG_PATH": pc_dir.strip()})
    _run(["cc", "-o", str(tmp_path / "client_pc"), str(tmp_path / "client.c"),
          *pc.stdout.split()])
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(USER_TEST).replace("{client}", str(tmp_path / "client")))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    r = subprocess.run([str(installed / "bin" / "python"), "-m", "pytest", "-q", "-p",
                        "no:cacheprovider", str(tmp_path / "test_user.py")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
    # and the plugin was the installed package's, not this checkout's
    where = _run([str(installed / "bin" / "python"), "-c",
                  "import ualinkd.testing.plugin as p; print(p.__file__)"], cwd=tmp_path)
    assert where.stdout.startswith(str(installed)), where.stdout


def test_checkout_pkg_config_builds_a_client(tmp_path: Path):
    """The README's `PKG_CONFIG_PATH=$(ualinkd config --pkgconfig-path) pkg-config --cflags
    --libs ualink` in a checkout (`make setup`'s editable install): libualink_c/Makefile's
    ualink.pc names the checkout's include/ and build/, and a client built with it runs
    the library (it links, loads through the rpath, and asks for a mount it lacks)."""
    ualinkd = Path(sys.executable).parent / "ualinkd"
    pc_dir = _run([str(ualinkd), "config", "--pkgconfig-path"]).stdout.strip()
    assert pc_dir and (Path(pc_dir) / "ualink.pc").is_file(), pc_dir
    pc = _run(["pkg-config", "--cflags", "--libs", "ualink"],
              env={**os.environ, "PKG_CONFIG_PATH": pc_dir}).stdout.split()
    assert f"-I{REPO / 'include'}" in pc, pc
    (tmp_path / "client.c").write_text(CLIENT)
    _run(["cc", "-o", str(tmp_path / "client"), str(tmp_path / "client.c"), *pc])
    ldd = _run(["ldd", str(tmp_path / "client")]).stdout
    assert str(REPO / "libualink_c" / "build" / "libualink.so") in ldd, ldd
