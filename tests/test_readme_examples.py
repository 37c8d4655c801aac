"""README's examples run, doctest-style, on the demo artifact built in this session.

Every ```python block runs (each in a fresh namespace, stdout captured), and every `ingot
generate`, `ingot inspect` or `ingot verify` command on `out/demo` in a code block (fenced or
indented; one `&&` step of a longer line counts) runs as a subprocess. README's `out/demo` is
where `ingot build --recipe recipes/demo.yaml` puts the demo; here it is replaced by the
session's build of that recipe (the `demo_artifact` fixture), and nothing else is changed.
Commands that install, build, serve or reach a registry are not run.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
INGOT = str(Path(sys.executable).parent / "ingot")  # the console script beside python
DEMO = "out/demo"
CLI_REFERENCE = re.compile(r"<!-- cli-reference -->.*?<!-- /cli-reference -->", re.S)
SHELL = {"sh", "bash", "shell", "console"}  # the fence languages of shell blocks
RUNNABLE = {"generate", "inspect", "verify"}  # read the artifact; cheap; touch nothing else


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number, source) of each ```python block."""
    return [
        (text[: m.start()].count("\n") + 2, m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)
    ]


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of every line of a shell block (fenced as sh, or indented),
    outside the CLI reference (usage lines, not commands)."""
    text = CLI_REFERENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    lines, fence, indented, previous_blank = [], None, False, True
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None  # its language, while open
            continue
        # An indented block opens after a blank line and runs while lines stay indented.
        indented = fence is None and line.startswith("    ") and (indented or previous_blank)
        if fence in SHELL or indented:
            lines.append((number, line.strip()))
        previous_blank = not line.strip()
    return lines


def demo_commands(text: str) -> list[tuple[int, list[str]]]:
    """(line number, argv) of each runnable `ingot` command on the demo artifact."""
    commands = []
    for number, line in code_lines(text):
        for step in line.split("&&"):
            if not re.match(r"\s*(\S*/)?ingot ", step) or DEMO not in step:
                continue  # indented prose (a file tree) need not even parse as shell
            argv = shlex.split(step, comments=True)
            if (
                len(argv) > 2
                and Path(argv[0]).name == "ingot"
                and argv[1] in RUNNABLE
                and DEMO in argv
            ):
                commands.append((number, argv))
    return commands


TEXT = README.read_text()
PYTHON = python_blocks(TEXT)
COMMANDS = demo_commands(TEXT)


def test_readme_has_examples_to_run():
    # A guard against an extraction that silently finds nothing.
    assert len(PYTHON) >= 2, PYTHON
    assert len(COMMANDS) >= 2, COMMANDS


@pytest.mark.parametrize("line, source", PYTHON, ids=[f"README.md:{n}" for n, _ in PYTHON])
def test_python_block_runs(line, source, demo_artifact, capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # README's relative paths are from the repository's root
    assert f'"{DEMO}"' in source, "an example that does not load the demo cannot run here"
    source = source.replace(f'"{DEMO}"', repr(str(demo_artifact)))
    exec(compile(source, f"README.md:{line}", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    assert out.strip(), "the example printed nothing"
    print(out)  # shown with -s / on failure


@pytest.mark.parametrize("line, argv", COMMANDS, ids=[f"README.md:{n}" for n, _ in COMMANDS])
def test_demo_command_runs(line, argv, demo_artifact):
    argv = [INGOT, *(str(demo_artifact) if arg == DEMO else arg for arg in argv[1:])]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
