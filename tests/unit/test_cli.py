"""`ualinkd`'s argument handling: --version, -v on either side of the subcommand, and
`ualinkd check`, which validates a pod file exactly as a start would and runs nothing."""

from __future__ import annotations

import logging

import pytest
from ualink_testkit import pod_doc

import ualinkd
from ualinkd.cli.main import build_parser, main
from ualinkd.config import PodConfig


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"ualinkd {ualinkd.__version__}"


@pytest.mark.parametrize("argv", [
    ["-v", "pod", "--nodes", "3"],
    ["pod", "-v", "--nodes", "3"],
    ["pod", "--nodes", "3", "--verbose"],
])
def test_verbose_before_or_after_the_subcommand(argv):
    args = build_parser().parse_args(argv)
    assert (args.command, args.verbose, args.nodes) == ("pod", True, 3)


def test_no_verbose_is_quiet():
    assert build_parser().parse_args(["pod"]).verbose is False


def _write(tmp_path, doc: dict) -> str:
    path = tmp_path / "pod.toml"
    path.write_text(PodConfig.from_dict(doc).to_toml())
    return str(path)


def test_check_accepts_a_good_file_and_names_what_is_in_it(tmp_path, capsys):
    path = _write(tmp_path, pod_doc(nodes=[[{"id": 0}], [{"id": 1}, {"id": 2}]]))
    assert main(["check", "--config", path, "--node", "node1"]) == 0
    assert capsys.readouterr().out == f"{path}: ok: 2 nodes, 3 accels, 1 vPod, key authentication\n"
    assert main(["check", path]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: ok: 2 nodes")


def test_check_refuses_what_a_start_would_refuse(tmp_path, capsys):
    """The same ConfigError a start gives (exit status 2, one line), e.g. a wrong type."""
    path = tmp_path / "pod.toml"
    text = PodConfig.from_dict(pod_doc()).to_toml()
    text = text.replace("bandwidth = 100", 'bandwidth = "fast"', 1)
    path.write_text(text)
    assert main(["check", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"ualinkd: {path}: nodes[0].accels[0].bandwidth: 'fast' is not an integer\n"
    good = _write(tmp_path, pod_doc())
    assert main(["check", "--config", good, "--node", "nodeX"]) == 2
    assert "no node named 'nodeX'" in capsys.readouterr().err
    logging.getLogger().handlers.clear()


@pytest.mark.parametrize("key, why", [
    ("", "[pod] key must be at least 16 bytes"),
    ("abcd", "[pod] key must be at least 16 bytes"),
    ("zz" * 16, "[pod] key must be hexadecimal")])
def test_check_refuses_a_key_a_node_would_refuse(tmp_path, capsys, key, why):
    """`ualinkd node` checks its links' keys (fabric/auth.py node_keys) before it runs;
    `check` runs the same check, for every node or the one named."""
    text = PodConfig.from_dict(pod_doc()).to_toml()
    path = tmp_path / "pod.toml"
    lines = [f'key = "{key}"' if ln.startswith("key = ") else ln for ln in text.splitlines()]
    path.write_text("\n".join(lines) + "\n")
    for argv in (["check", str(path)], ["check", str(path), "--node", "node1"]):
        assert main(argv) == 2
        assert why in capsys.readouterr().err
    logging.getLogger().handlers.clear()


@pytest.mark.parametrize("address, why", [
    ("127.0.0.1", "address '127.0.0.1' is not host:port (no port)"),
    ("127.0.0.1:99999", "address '127.0.0.1:99999': port 99999 is outside 0..65535"),
    ("no-such-host.invalid:7000", "host 'no-such-host.invalid' of address "
                                  "'no-such-host.invalid:7000' does not resolve here"),
])
def test_check_refuses_an_address_the_node_would_refuse(tmp_path, capsys, address, why):
    """Issue 32, item 3: `check` refuses what the node then refuses when it listens or
    dials (fabric/link.py parse_address, the resolver): no port, a port over 65535, a host
    that does not resolve, naming the node and the host; `--no-resolve` skips only the
    last (a file for a container network checked outside it)."""
    path = tmp_path / "pod.toml"
    # written as text: PodConfig itself refuses the first two
    text = PodConfig.from_dict(pod_doc()).to_toml()
    good = PodConfig.from_dict(pod_doc()).nodes[1].address
    path.write_text(text.replace(f'address = "{good}"', f'address = "{address}"'))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ualinkd: {path}: node 'node1': ") and why in err, err
    resolves_only = "resolve" in why
    assert main(["check", "--no-resolve", str(path)]) == (0 if resolves_only else 2)
    capsys.readouterr()
    logging.getLogger().handlers.clear()


def test_unknown_kernel_quirk_is_named_as_the_option(tmp_path, capsys):
    """Issue 32, item 9: `--kernel-quirks bogus` says so as the option the user typed, not
    as the made-up pod's `<built-in>` source; nothing is started or created."""
    root = tmp_path / "pod"
    assert main(["pod", "--nodes", "1", "--root", str(root), "--kernel-quirks", "bogus"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ualinkd: --kernel-quirks: unknown kernel quirk bogus (known: "), err
    assert "<built-in>" not in err and not root.exists()
    assert main(["pod", "--nodes", "1", "--root", str(root), "--profile", "mi999"]) == 2
    assert "--profile 'mi999' is not a device profile" in capsys.readouterr().err
    logging.getLogger().handlers.clear()


def test_make_test_says_why_tests_were_skipped():
    """Issue 32, item 9: `make test` runs pytest with -rs, so a skipped test's reason (a
    missing tool, no root) is printed instead of a bare count."""
    import shutil
    import subprocess
    from pathlib import Path

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run(["make", "-n", "-C", str(repo), "test", "VPY=python3",
                        "VENV=/nonexistent"], capture_output=True, text=True, timeout=60)
    line = next(ln for ln in r.stdout.splitlines() if "-m pytest" in ln and "tests/" not in ln)
    assert "-rs" in line.split(), line
