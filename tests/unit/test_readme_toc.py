"""The README's front matter stays true (issue 32 item 8): its Contents list is exactly the
`##` sections that follow it, in order, and every command of a quick start exists — the
`ualinkd`/`ualinkctl` subcommands and flags (parsed by the CLIs' own argparse parsers), the
`make` targets, the repository's files and what libualink_c's Makefile builds, the compose
file's services and the image's programs.

`python tests/unit/test_readme_toc.py --write` rewrites the Contents list from the headings
(after a merge added a section); the test says so when the list is stale.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
CONTENTS = "## Contents"
REGENERATE = "python tests/unit/test_readme_toc.py --write"


# ---- the Contents list ------------------------------------------------------------------------


def headings(text: str, level: int = 2) -> list[str]:
    """The `#`*level headings of a Markdown text, outside code fences, in order."""
    out, fenced = [], False
    prefix = "#" * level + " "
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith(prefix):
            out.append(line[len(prefix):].strip())
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped,
    spaces to `-` (so `Pods in namespaces (containers…)` → `pods-in-namespaces-containers…`)."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def contents_lines(text: str) -> list[str]:
    """The Contents list as it should be: one line per `##` heading after `## Contents`."""
    after = text[text.index("\n" + CONTENTS + "\n") + len(CONTENTS) + 2:]
    seen: dict[str, int] = {}
    lines = []
    for h in headings(after):
        base = slug(h)
        n = seen.get(base, 0)
        seen[base] = n + 1
        lines.append(f"- [{h.replace('`', '')}](#{base if n == 0 else f'{base}-{n}'})")
    return lines


def contents_span(text: str) -> tuple[int, int]:
    """Where the list under `## Contents` is: from the first `- [` line to the line after
    the last (or, with no list yet, the end of the `<!-- … -->` note under the heading)."""
    start = text.index("\n" + CONTENTS + "\n") + len(CONTENTS) + 2
    end_of_section = text.index("\n## ", start) + 1
    lines = text[start:end_of_section].splitlines(keepends=True)
    pos, first, last, note_end = start, None, None, start - 1
    for line in lines:
        if line.startswith("- ["):
            first = pos if first is None else first
            last = pos + len(line)
        elif line.startswith("<!--"):
            note_end = pos + len(line)
        pos += len(line)
    if first is None or last is None:
        return note_end + 1, note_end + 1
    return first, last


def write_contents(text: str) -> str:
    first, last = contents_span(text)
    rest = text[last:] if text[last:].startswith("\n") else "\n" + text[last:]
    return text[:first] + "".join(line + "\n" for line in contents_lines(text)) + rest


def test_contents_lists_every_section_in_order():
    """README "Contents": the list is the `##` headings that follow it, each linking to its
    GitHub anchor; nothing before it but the quick starts."""
    text = README.read_text()
    first, last = contents_span(text)
    listed = text[first:last].splitlines()
    assert listed == contents_lines(text), (
        f"README's Contents list is stale: run `{REGENERATE}`")
    before = headings(text[:text.index("\n" + CONTENTS + "\n")])
    assert before == ["Quick starts"], before


def test_slug_is_githubs():
    assert slug("Pods in namespaces (containers without an engine)") == \
        "pods-in-namespaces-containers-without-an-engine"
    assert slug("The KFD (`/dev/kfd`) and Debian's libhsakmt") == \
        "the-kfd-devkfd-and-debians-libhsakmt"
    assert slug("A client in C") == "a-client-in-c"


def test_write_contents_is_a_fixed_point_and_adds_a_new_section():
    """The generator: applied twice it changes nothing; a section appended at the end (as
    the other branches do) appears last in the list."""
    text = README.read_text()
    once = write_contents(text)
    assert write_contents(once) == once
    grown = write_contents(once + "\n## A new section (`x`)\n\nbody\n")
    assert "- [A new section (x)](#a-new-section-x)\n" in grown
    assert contents_lines(grown)[-1] == "- [A new section (x)](#a-new-section-x)"


# ---- the quick starts' commands ---------------------------------------------------------------


def quick_starts(text: str) -> str:
    start = text.index("\n## Quick starts\n")
    return text[start:text.index("\n## ", start + 1)]


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", quick_starts(text), re.S)


SHELL_WORDS = {"until", "while", "do", "done", "if", "then", "fi", "!", "{", "}"}
BUILTINS = {"kill", "export", "unset", "cd", "umask", "true", "wait"}
REPO_DIRS = ("include/", "libualink_c/", "packaging/", "tests/", "benchmarks/", "ualinkd/")
REPO_PATH = re.compile(r"(?:^|=)((?:" + "|".join(map(re.escape, REPO_DIRS)) + r")[\w./@-]*)")


def makefile_targets(path: Path) -> set[str]:
    return set(re.findall(r"^([\w.-]+):", path.read_text(), re.M))


def built_by_libualink_c(name: str) -> bool:
    """A file under libualink_c/build/ that libualink_c's Makefile makes."""
    mk = (REPO / "libualink_c" / "Makefile").read_text()
    return f"$(B)/{name}" in mk


def compose_services() -> set[str]:
    import yaml

    return set(yaml.safe_load((REPO / "packaging" / "compose.yaml").read_text())["services"])


def image_programs() -> set[str]:
    """The commands the image puts on PATH (its Containerfile names each)."""
    text = (REPO / "packaging" / "Containerfile").read_text()
    return set(re.findall(r"\b(ualink(?:ctl|d|-[a-z]+))\b", text))


def parse_cli(prog: str, argv: list[str]) -> None:
    """argv through the CLI's own parser: an unknown subcommand or flag is an error."""
    if prog == "ualinkd":
        from ualinkd.cli.main import build_parser
    else:
        from ualinkd.cli.ctl import build_parser
    try:
        build_parser().parse_args(argv)
    except SystemExit as e:
        raise AssertionError(f"`{prog} {shlex.join(argv)}` does not parse") from e


def commands(block: str) -> Iterator[tuple[str, list[str]]]:
    """Each simple command of a shell block as (line, argv), variables of the block expanded,
    `$(…)` commands given on their own, redirection targets dropped (kept as made files)."""
    env: dict[str, str] = {"PWD": str(REPO)}
    for line in block.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        subs = re.findall(r"\$\(([^()]*)\)", line)
        body = re.sub(r"\$\(([^()]*)\)", "SUBST", line)
        for sub in subs:
            yield from ((line, argv) for _, argv in commands(sub))
        lex = shlex.shlex(body, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        lex.commenters = "#"
        words: list[str] = []
        redirect = ""
        for tok in [*lex, ";"]:
            if tok in {";", "&&", "||", "|", "&", "(", ")"}:
                if words:
                    yield line, words
                words = []
            elif tok in {">", ">>", "<"}:
                redirect = tok
            elif redirect:
                if redirect != "<":
                    words.append(">" + tok)  # kept so the checker sees what is written
                redirect = ""
            else:
                for name, value in env.items():
                    tok = tok.replace(f"${name}", value)
                if tok.startswith("$") and tok[1:] in env:
                    continue
                if not words and re.fullmatch(r"[A-Z_]+=.*", tok) and " " in tok:
                    env[tok.split("=", 1)[0]] = tok.split("=", 1)[1]
                if " " in tok and not words and tok.split()[0].startswith(".venv/"):
                    words.extend(tok.split())  # a `$C` holding a command
                    continue
                words.append(tok)


class Checker:
    """What one quick-start block may name: the state it builds up (files made, pods)."""

    def __init__(self) -> None:
        self.made: set[str] = set()
        self.pod_nodes = 0
        self.pod_root = ""

    def path(self, line: str, tok: str) -> None:
        """A repository path in a word must exist (or be built by libualink_c's Makefile);
        a path into the pod's root needs a pod started with that root and that node."""
        tok = tok.replace(f"{REPO}/", "")
        for m in REPO_PATH.finditer(tok):
            rel = m.group(1).rstrip("/.")
            if rel.startswith("libualink_c/build/"):
                assert built_by_libualink_c(rel.split("/", 2)[2]), f"{line}: {rel} is not built"
            else:
                assert (REPO / rel).exists() or (REPO / rel).parent.is_dir(), \
                    f"{line}: {rel} is not in the repository"
        m = re.search(r"ualink-pod/node(\d+)", tok)
        if m:
            assert self.pod_root == "ualink-pod", f"{line}: no pod started at ./ualink-pod"
            assert int(m.group(1)) < self.pod_nodes, f"{line}: the pod has no node{m.group(1)}"

    def check(self, line: str, argv: list[str]) -> None:
        while argv and (argv[0] in SHELL_WORDS or re.fullmatch(r"[A-Za-z_]+=.*", argv[0])):
            self.path(line, argv[0])
            argv = argv[1:]
        if not argv:
            return
        for i, tok in enumerate(argv):
            if tok.startswith(">"):
                self.made.add(tok[1:])
            elif i and argv[i - 1] == "-o":
                self.made.add(tok)
            else:
                self.path(line, tok)
        args = [t for t in argv[1:] if not t.startswith(">")]
        prog = argv[0]
        name = prog.rsplit("/", 1)[-1]
        if name in {"ualinkd", "ualinkctl"}:
            assert prog in {name, f".venv/bin/{name}"}, f"{line}: {prog}"
            parse_cli(name, args)
            if name == "ualinkd" and args and args[0] == "pod":
                from ualinkd.cli.main import build_parser
                ns = build_parser().parse_args(args)
                self.pod_root, self.pod_nodes = ns.root.removeprefix("./"), ns.nodes
        elif prog == "make":
            targets = makefile_targets(REPO / "Makefile")
            for t in args:
                assert t in targets, f"{line}: no make target {t!r}"
        elif prog == ".venv/bin/podman-compose":
            self.compose(line, args)
        elif prog == ".venv/bin/pip":
            assert args[:1] == ["install"], line
        elif prog.startswith("./"):
            assert prog[2:] in self.made, f"{line}: {prog} is made by no earlier command"
        elif prog.startswith(("libualink_c/", str(REPO))):
            pass  # checked as a path above
        elif prog not in BUILTINS:
            assert shutil.which(prog) or prog in {"apt-get"}, f"{line}: no command {prog!r}"

    def compose(self, line: str, args: list[str]) -> None:
        while args and args[0] == "-f":
            assert (REPO / args[1]).is_file(), f"{line}: no {args[1]}"
            args = args[2:]
        assert args and args[0] in {"up", "down", "exec", "ps", "logs"}, line
        if args[0] != "exec":
            return
        rest = [a for a in args[1:] if a != "-T"]
        assert rest[0] in compose_services(), f"{line}: no service {rest[0]!r}"
        assert rest[1] in image_programs(), f"{line}: the image has no {rest[1]!r}"
        if rest[1] == "ualinkctl":
            parse_cli("ualinkctl", rest[2:])
        for tok in rest[2:]:
            if tok.startswith("/run/"):
                mount = "/run/ualinkd/node"
                assert tok.startswith(mount + "/"), f"{line}: {tok}"
                assert mount in (REPO / "packaging" / "entrypoint.sh").read_text()


def test_quick_starts_are_three_short_shell_blocks():
    """Issue 32 item 8: one quick start per kind of user, each a short pasteable block."""
    text = README.read_text()
    qs = quick_starts(text)
    assert len(headings(qs, 3)) == 3, headings(qs, 3)
    blocks = sh_blocks(text)
    assert len(blocks) == 3
    for block in blocks:
        assert len(block.splitlines()) <= 15, block


@pytest.mark.parametrize("index", [0, 1, 2])
def test_quick_start_commands_exist(index: int):
    """Every command of quick start `index`: subcommands and flags parse with the CLIs'
    parsers, make targets exist, files are in the repository or built, `./prog` was made
    by an earlier line, the pod's paths name a node the block's pod has."""
    block = sh_blocks(README.read_text())[index]
    checker = Checker()
    seen = 0
    for line, argv in commands(block):
        checker.check(line, argv)
        seen += 1
    assert seen >= 5


def test_checker_refuses_what_does_not_exist():
    """The checker can fail: a made-up flag, subcommand, target, file or node is refused."""
    bad = [
        ".venv/bin/ualinkd pod --nodes 2 --frobnicate",
        ".venv/bin/ualinkd frobnicate",
        ".venv/bin/ualinkctl --mount x statez",
        "make frobnicate",
        "LD_PRELOAD=$PWD/libualink_c/build/libnothing.so ls",
        ".venv/bin/ualinkd abi-check include/ualink/nothing/at/all.h",
        ".venv/bin/ualinkd pod --nodes 2 --root ./ualink-pod &\nls ualink-pod/node2/dri",
        "./hello",
        'C=".venv/bin/podman-compose -f packaging/compose.yaml"\n$C exec node7 ualinkctl peers',
        'C=".venv/bin/podman-compose -f packaging/compose.yaml"\n$C exec node0 rocminfo',
        'C=".venv/bin/podman-compose -f packaging/compose.yaml"\n$C exec node0 ualinkctl x',
    ]
    for block in bad:
        checker = Checker()
        with pytest.raises(AssertionError):
            for line, argv in commands(block):
                checker.check(line, argv)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: {REGENERATE}")
    README.write_text(write_contents(README.read_text()))
