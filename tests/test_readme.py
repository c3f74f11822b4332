"""The README, true to the letter: its commands run as written; and docs/design.md's layout table lists every module.

Every fenced `bash` block is run, command by command, exactly as written, in the repository root
with this venv's `python` first on the PATH (the README asks for the venv to be active). A block
that is too expensive or has placeholders carries `<!-- not-run: why -->` on the line before its
fence; its `python -m decoding` commands without placeholders are still parsed by the CLI, so a
renamed or removed option fails here too. Paths under `assets/` must exist in every command.
Commands on `--model smollm2` are skipped until that model has been fetched.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from decoding.fetch import is_fetched

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DESIGN = ROOT / "docs" / "design.md"  # its table under "How the code is laid out" lists every module
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.*?)\s*-->")
PLACEHOLDER = re.compile(r"^(\.\.\.|[A-Z][A-Z_]*[A-Z](/[A-Z_]+)?)$")  # `...`, FILE, PATH_OR_HUB_ID, USER/NAME
# What a cheap command must never be: these install, push or run the whole suite. Mark them not-run.
NEVER_RUN = ("pip ", "apt-get ", "sudo ", "git push", "bash .ci/run", "python3.11 -m venv")
TIMEOUT_S = 300


@dataclass(frozen=True)
class Command:
    line: int  # where it starts in the README
    text: str
    not_run: str | None  # why its block is not run; None if it is

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text.replace("\\\n", " "), comments=True)  # a backslash-newline joins lines

    @property
    def id(self) -> str:
        return f"L{self.line}:{' '.join(self.argv)[:60]}"


def fenced_blocks(text: str) -> list[tuple[int, str, list[str], str | None]]:
    """(first body line number, info string, body lines, not-run reason) for every fenced block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.match(r"^(```+|~~~+)\s*(\S*)", lines[i])
        if not fence:
            i += 1
            continue
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        reason = NOT_RUN.search(previous)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence.group(1))), len(lines))
        blocks.append((i + 2, fence.group(2), lines[i + 1:end], reason.group(1) if reason else None))
        i = end + 1
    return blocks


def split_commands(first_line: int, body: list[str], not_run: str | None) -> list[Command]:
    """Shell commands, one per line, except where a quote stays open or a line ends in a backslash."""
    commands, pending, start = [], "", first_line
    for number, line in enumerate(body, start=first_line):
        if not pending:
            start = number
        pending = f"{pending}\n{line}" if pending else line
        if pending.rstrip().endswith("\\"):
            continue
        try:
            words = shlex.split(pending.replace("\\\n", " "), comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        if words:
            commands.append(Command(start, pending, not_run))
        pending = ""
    assert not pending, f"README line {start}: unfinished command {pending!r}"
    return commands


def readme_commands() -> list[Command]:
    return [command for first, info, body, reason in fenced_blocks(README.read_text(encoding="utf-8"))
            if info == "bash" for command in split_commands(first, body, reason)]


COMMANDS = readme_commands()
RUN = [c for c in COMMANDS if c.not_run is None]
NOT_RUN_DECODING = [c for c in COMMANDS if c.not_run is not None and c.argv[:3] == ["python", "-m", "decoding"]
                    and not any(PLACEHOLDER.match(word) for word in c.argv)]


def test_the_readme_has_commands_both_run_and_not():
    assert len(RUN) >= 5 and len(COMMANDS) > len(RUN)
    assert any(c.argv[:4] == ["python", "-m", "decoding", "generate"] for c in RUN)
    assert any(c.argv[:3] == ["python", "-m", "scripts.deploy"] and "--dry-run" in c.argv for c in RUN)


def test_the_splitter_keeps_quoted_newlines_and_continuations():
    body = ['a --x "one', 'two"', "b \\", "  --y 1   # comment", "", "# only a comment", "c '[[0],[1]]'"]
    commands = split_commands(10, body, None)
    assert [c.argv for c in commands] == [["a", "--x", "one\ntwo"], ["b", "--y", "1"], ["c", "[[0],[1]]"]]
    assert [c.line for c in commands] == [10, 12, 16]
    text = "x\n<!-- not-run: slow -->\n\n```bash\nsleep 9\n```\n```bash\necho hi\n```\n```\nnot bash\n```\n"
    assert [(info, body, reason) for _, info, body, reason in fenced_blocks(text)] == [
        ("bash", ["sleep 9"], "slow"), ("bash", ["echo hi"], None), ("", ["not bash"], None)]


@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_paths_the_commands_name_exist(command):
    for word in command.argv:
        if word.startswith("assets/"):
            assert (ROOT / word).exists(), f"README line {command.line}: {word} does not exist"


@pytest.mark.parametrize("command", NOT_RUN_DECODING, ids=[c.id for c in NOT_RUN_DECODING])
def test_commands_not_run_still_parse(command, capsys):
    """Expensive commands are not run, but the CLI must still accept every option they use."""
    from decoding.cli import build_parser

    argv = command.argv[3:]
    try:
        build_parser(argv).parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"README line {command.line}: the CLI refuses it: {capsys.readouterr().err.strip()} ({e})")


@pytest.mark.parametrize("command", RUN, ids=[c.id for c in RUN])
def test_readme_command_runs_as_written(command):
    assert not command.text.lstrip().startswith(NEVER_RUN), (
        f"README line {command.line}: mark this block <!-- not-run: why --> rather than run it in the tests")
    words = command.argv
    if "--model" in words and words[words.index("--model") + 1] == "smollm2" and not is_fetched("smollm2"):
        pytest.skip("smollm2 is not fetched here (python -m decoding fetch smollm2, online)")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "HF_HUB_OFFLINE": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")  # a shared CI machine: threads fighting over cores are slow
    done = subprocess.run(["bash", "-c", command.text], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert done.returncode == 0, (f"README line {command.line} failed ({done.returncode}):\n{command.text}\n"
                                  f"{done.stderr[-2000:]}")


# ----- the layout table -----
def layout_rows() -> list[list[str]]:
    """The paths each row of the table under "How the code is laid out" names, in order:
    `dir/a.py`, `b.py` in one cell is dir/a.py, dir/b.py; a folder's own row is `dir/`."""
    text = DESIGN.read_text(encoding="utf-8")
    section = text.split("## How the code is laid out", 1)[1].split("\n## ", 1)[0]
    rows = []
    for row in section.splitlines():
        if not row.startswith("|"):
            continue
        base, paths = "", []
        for item in re.findall(r"`([^`]+)`", row.split("|")[1]):
            if "/" in item.rstrip("/"):
                base = item.rsplit("/", 1)[0] + "/"
            paths.append(item if "/" in item or not base else base + item)
        if paths:
            rows.append(paths)
    return rows


def layout_paths() -> set[str]:
    return {path for row in layout_rows() for path in row}


def modules() -> set[str]:
    """The Python modules under decoding/, app/ and scripts/ that git tracks (package markers aside)."""
    try:
        tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "decoding", "app", "scripts"],
                                 capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: whatever is on disk
        tracked = [str(p.relative_to(ROOT)) for d in ("decoding", "app", "scripts") for p in (ROOT / d).rglob("*.py")]
    return {p for p in tracked if p.endswith(".py") and not p.endswith("__init__.py")}


def test_layout_table_lists_every_module():
    missing = sorted(modules() - layout_paths())
    assert not missing, f"add these to docs/design.md's table under 'How the code is laid out': {missing}"


def test_layout_table_names_each_module_once_under_its_own_folder():
    """Rows come in folders: a folder's row (`app/`), then the rows of what lies directly in it;
    no module sits among another folder's rows, and none is listed twice."""
    listed, folder, misplaced = [], None, []
    for row in layout_rows():
        if row[0].endswith("/"):
            folder = row[0]
            continue
        listed += row
        misplaced += [path for path in row if folder is None or path.rsplit("/", 1)[0] + "/" != folder]
    assert not misplaced, f"docs/design.md's layout table lists these under another folder's heading: {misplaced}"
    twice = sorted({path for path in listed if listed.count(path) > 1})
    assert not twice, f"docs/design.md's layout table lists these twice: {twice}"


def test_layout_table_names_only_what_exists():
    gone = sorted(p for p in layout_paths() if not (ROOT / p).exists())
    assert not gone, f"docs/design.md's layout table names files that do not exist: {gone}"
