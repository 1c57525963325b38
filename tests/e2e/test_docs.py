"""The README and docs/ hold only what is true of this checkout: every relative link reaches a
file (and a heading, where it names one), every `make` target and `rlvr` subcommand they name
exists, every shell block says whether CI runs it, and the blocks marked as run here run as
written (in seconds, on a CPU)."""
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
FIRST_SCREEN_LINES = 60  # what a newcomer sees before scrolling: the pitch, the data flow, the two commands
RUN_MARKER = "<!-- run in CI: test_docs.py"
MARKERS = (RUN_MARKER, "<!-- not run in CI", "<!-- job-submit:")


def doc_files() -> list[Path]:
    """README.md and every Markdown file under docs/ (results write-ups included)."""
    return [README, *sorted((REPO / "docs").rglob("*.md"))]


def guide_files() -> list[Path]:
    """The pages a user follows: README.md and docs/*.md (not the results' records)."""
    return [README, *sorted((REPO / "docs").glob("*.md"))]


def without_code(text: str) -> str:
    """The text with fenced blocks and inline code spans blanked (a link there is not a link)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", without_code(path.read_text()), re.M)}


def dead_links(path: Path) -> list[str]:
    """Each relative link of a Markdown file whose target file (or heading) does not exist."""
    dead = []
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", without_code(path.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
            continue  # http(s)://, mailto: and the like
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        name = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        if not dest.exists():
            dead.append(f"{name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            dead.append(f"{name}: {target} (no such heading in {dest.name})")
    return dead


def test_every_relative_link_resolves():
    dead = [d for f in doc_files() for d in dead_links(f)]
    assert not dead, "dead links:\n" + "\n".join(dead)


def test_the_link_check_finds_a_dead_link(tmp_path):
    (tmp_path / "there.md").write_text("# A heading\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [ok](there.md#a-heading) [web](https://example.com) `[code](nowhere.md)`\n"
                    "[gone](missing/file.json) [bad anchor](there.md#no-such-heading)\n")
    found = dead_links(page)
    assert len(found) == 2, found
    assert "missing/file.json" in found[0] and "no-such-heading" in found[1]


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", (REPO / "Makefile").read_text(), re.M))


def cli_commands() -> dict[str, set[str]]:
    """The `rlvr` subcommands, each with its own subcommands (e.g. `tasks mine`), as cli.main builds them."""
    from cli.main import SUBCOMMANDS
    sub = argparse.ArgumentParser(prog="rlvr").add_subparsers()
    for module in SUBCOMMANDS:
        module.register(sub)
    commands = {}
    for name, parser in sub.choices.items():
        nested = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        commands[name] = set(nested[0].choices) if nested else set()
    return commands


def code_text(text: str) -> str:
    """Only what is code: fenced blocks and inline spans (where a command is written)."""
    blocks = re.findall(r"^```.*?\n(.*?)^```", text, flags=re.S | re.M)
    return "\n".join(blocks + re.findall(r"`([^`\n]+)`", text))


def named_commands(text: str) -> tuple[set[str], set[tuple[str, str]]]:
    code = code_text(text)
    make = set(re.findall(r"\bmake[ \t]+(?:-\S+[ \t]+\S+[ \t]+)*([a-z][\w-]*)", code))
    rlvr = set(re.findall(r"(?:\brlvr|\bcli\.main)[ \t]+([a-z][\w-]*)(?:[ \t]+([a-z][\w-]*))?", code))
    return make, rlvr


def check_commands(text: str) -> list[str]:
    make, rlvr = named_commands(text)
    targets, commands = makefile_targets(), cli_commands()
    missing = [f"make {t}" for t in sorted(make - targets)]
    for cmd, arg in sorted(rlvr):
        if cmd not in commands:
            missing.append(f"rlvr {cmd}")
        elif commands[cmd] and arg and arg not in commands[cmd]:
            missing.append(f"rlvr {cmd} {arg}")
    return missing


def test_the_first_screen_names_the_two_commands_and_they_exist():
    first = "\n".join(README.read_text().splitlines()[:FIRST_SCREEN_LINES])
    make, _ = named_commands(first)
    assert {"train", "test"} <= make, make
    assert not check_commands(first)


def test_every_make_target_and_rlvr_subcommand_the_docs_name_exists():
    missing = [f"{f.relative_to(REPO)}: {m}" for f in guide_files() for m in check_commands(f.read_text())]
    assert not missing, "\n".join(missing)


def test_the_command_check_finds_a_missing_command():
    text = "```bash\nmake train\nmake no-such-target\nrlvr tasks mine x\nrlvr tasks frobnicate\nrlvr nosuch\n```\n"
    assert check_commands(text) == ["make no-such-target", "rlvr nosuch", "rlvr tasks frobnicate"]


def test_the_readme_lists_every_rlvr_subcommand():
    table = README.read_text().split("## The `rlvr` command", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([a-z][\w-]*)` \|", table, re.M))
    assert listed == set(cli_commands()), listed ^ set(cli_commands())


def shell_blocks(path: Path) -> list[tuple[str, str]]:
    """(the line before the block, the block) for each ```bash block."""
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r"^([^\n]*)\n```(?:bash|sh)\n(.*?)^```", path.read_text(), flags=re.S | re.M)]


def test_every_shell_block_says_whether_ci_runs_it():
    unmarked = [f"{f.relative_to(REPO)}: {block.splitlines()[0]}" for f in guide_files()
                for before, block in shell_blocks(f) if not before.startswith(MARKERS)]
    assert not unmarked, "shell blocks without a <!-- run in CI / not run in CI --> comment:\n" + "\n".join(unmarked)


def runnable_blocks() -> list[tuple[str, str]]:
    return [(f"{f.relative_to(REPO)}:{i}", block) for f in guide_files()
            for i, (before, block) in enumerate(shell_blocks(f)) if before.startswith(RUN_MARKER)]


@pytest.mark.parametrize("where,block", runnable_blocks(), ids=[w for w, _ in runnable_blocks()])
def test_marked_block_runs_as_written(where, block, tmp_path):
    """The block runs in a folder that looks like a set-up checkout: `.venv` (the venv running
    the tests, linked), and this checkout's files, with this checkout's code first on the path."""
    if not (Path(sys.prefix) / "bin" / "rlvr").exists():
        pytest.skip("the venv has no rlvr entry point (the project is not installed in it)")
    for entry in REPO.iterdir():
        if entry.name not in (".venv", ".git"):
            (tmp_path / entry.name).symlink_to(entry)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, f"{where}\n{block}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
