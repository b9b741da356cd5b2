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
