"""No tracked file names a location of one particular machine.

The benchmarks once read their models from a fixed folder of the host that ran them, and their
committed reports recorded its paths (issue: "Benchmarks tied to one machine"). This scans
every tracked text file for the absolute paths that only exist on one machine: a fixed
top-level folder (`work`, `root`, `Users`), a home directory, a named temporary path, a Windows
drive. System locations (proc, dev, usr), URLs, and placeholders such as `<store>/tmp/` are
not machine paths. It also checks what keeps the benchmarks portable:
benchmarks/harness/paths.py (the defaults found from the checkout, and the rewriting of report
paths) and the peers' requirements files.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[1]

# A path starts a token: at the line start, after whitespace, a quote or backtick, an opening
# bracket, or an assignment / option / list separator. After anything else (a word character,
# `.`, `/`, `~`, `>`) the text continues a relative path, a URL or a placeholder.
_START = r"""(?:^|(?<=[\s"'`(\[{=:,;]))"""
# Folders fixed at the top of one machine's layout (a workspace, root's or a macOS home).
_MACHINE_ROOTS = ("work", "root", "Users")
_PATTERNS = {
    "a machine-specific folder": re.compile(rf"{_START}/(?:{'|'.join(_MACHINE_ROOTS)})/"),
    "a home directory": re.compile(rf"{_START}/home/\w[^/\s]*/"),
    "a Windows drive": re.compile(rf"{_START}[A-Z]:\\\\?\w"),
}
# A named temporary path is a location only outside tests: tests take theirs from tmp_path,
# and a literal one there is data (say, a hostile absolute path an artifact must refuse).
_TMP = re.compile(rf"{_START}/tmp/[\w.-]")
_TOKEN = re.compile(r"""[^\s"'`)\]\\]+""")  # the whole path, for the failure message

_PEERS = ("llmcompressor", "onnxruntime-genai")  # the peers the benchmarks run
_TORCH_PIN = "torch==2.13.0"  # as pyproject.toml: a range would pull a multi-GB CUDA build


def machine_paths(text: str, is_test: bool = False) -> list[tuple[int, str, str]]:
    """(line number, what, the path) of each machine path in `text`."""
    patterns = dict(_PATTERNS) if is_test else {**_PATTERNS, "a fixed temporary path": _TMP}
    hits = []
    for number, line in enumerate(text.splitlines(), start=1):
        for what, pattern in patterns.items():
            for match in pattern.finditer(line):
                path = _TOKEN.match(line, match.start())
                hits.append((number, what, path.group(0) if path else match.group(0)))
    return hits


def _tracked_files() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: cannot list the tracked files")
    done = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout: {done.stderr.decode().strip()}")
    return [name for name in done.stdout.decode().split("\0") if name]


def _text(path: Path) -> str | None:
    """The file's text, or None for a binary file (or one deleted in the working tree)."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_no_tracked_file_holds_a_machine_path() -> None:
    hits = []
    for name in _tracked_files():
        if any(part.startswith(".venv") for part in Path(name).parts):
            continue  # virtualenvs are never tracked; ignored here in case one is
        text = _text(REPO / name)
        if text is None:
            continue
        for number, what, found in machine_paths(text, is_test=name.startswith("tests/")):
            hits.append(f"{name}:{number}: {what}: {found!r}")
    assert not hits, (
        "tracked files name paths of one particular machine; find them from the repository "
        "(benchmarks/harness/paths.py), take them as options, or write them relative:\n"
        + "\n".join(hits)
    )


def _join(*parts: str) -> str:
    # Sample paths are assembled, so this file holds none of them literally.
    return "/".join(parts)


@pytest.mark.parametrize(
    "line",
    [
        f'PYDOC_DIR = Path("{_join("", "work", "shared", "models", "pydoc-16m")}")',
        f"    {_join('', 'work', 'llmc-venv', 'bin', 'python')} benchmarks/quantize_llmc.py",
        f'  "artifact": "{_join("", "root", ".cache", "ingot-bench", "artifacts", "a")}",',
        f'parser.add_argument("--work", default="{_join("", "tmp", "ingot-bench-quantize")}")',
        f"Model: pydoc-16m ({_join('', 'work', 'shared', 'models', 'pydoc-16m')});",
        f"see {_join('', 'home', 'alice', 'src', 'ingot')}",
        f"cache = {_join('', 'Users', 'bob', 'Library')}",
        'model = r"C:' + "\\".join(["", "Users", "bob", "models"]) + '"',
        'File \\"' + _join("", "work", "venv", "lib", "x.py") + '\\", line 3',
    ],
)
def test_machine_paths_are_found(line: str) -> None:
    assert machine_paths(line)


@pytest.mark.parametrize(
    "line",
    [
        'cpuinfo = _read("/proc/cpuinfo")',
        'REGISTRY_BIN = "/usr/bin/docker-registry"',
        "shm = Path('/dev/shm')",
        f"url = '{_join('https://example.com', 'work', 'root', 'Users', 'home', 'x', '')}'",
        "`<store>/tmp/` while it is hashed",
        "<root>/tmp/<hex>.partial",
        "benchmarks/work/results and ~/work/x and ../shared/models/pydoc-16m",
        "<bench-cache>/artifacts/pydoc-16m-int4-g32 and <tmp>/ingot-serve-bench-x/ortgenai",
        'pattern = re.compile(r"\\d+:\\s*(\\w+)")',
    ],
)
def test_portable_lines_pass(line: str) -> None:
    assert not machine_paths(line)


def test_a_literal_temporary_path_is_data_in_tests() -> None:
    line = f'("{_join("", "tmp", "escape.txt")}", "absolute path"),'
    assert machine_paths(line) and not machine_paths(line, is_test=True)


# -- benchmarks/harness/paths.py: defaults from the checkout, reports without machine paths --


@pytest.fixture(scope="module")
def paths() -> ModuleType:
    # Loaded by its path (it imports only the standard library): the test needs no
    # benchmarks package on sys.path.
    path = REPO / "benchmarks" / "harness" / "paths.py"
    spec = importlib.util.spec_from_file_location("bench_paths", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_defaults_are_found_from_the_checkout(paths: ModuleType) -> None:
    assert paths.REPO == REPO
    assert paths.models_dir() == REPO.parent / "shared" / "models"
    assert paths.data_dir() == REPO.parent / "shared" / "data"
    assert paths.peer_python("llmcompressor") == (
        REPO / "benchmarks" / ".venvs" / "llmcompressor" / "bin" / "python"
    )


def test_report_paths_come_out_relative(
    paths: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INGOT_BENCH_CACHE", str(tmp_path / "cache"))
    model = paths.models_dir() / "pydoc-16m"
    assert paths.portable(str(model)) == "../shared/models/pydoc-16m"
    assert paths.portable(str(REPO / "benchmarks" / "x.py")) == "benchmarks/x.py"
    assert paths.portable(str(REPO)) == "."
    # The cache lies inside the temporary directory here: the longer root wins.
    artifact = tmp_path / "cache" / "artifacts" / "a"
    assert paths.portable(str(artifact)) == "<bench-cache>/artifacts/a"
    out = Path(tempfile.gettempdir()) / "ingot-serve-bench-x" / "ortgenai"
    command = f"python -m builder -m {model} -o {out}"
    expected = (
        "python -m builder -m ../shared/models/pydoc-16m -o <tmp>/ingot-serve-bench-x/ortgenai"
    )
    assert paths.portable(command) == expected
    # A root is a whole path component: a sibling folder with a longer name is not inside it.
    sibling = paths.portable(f"{REPO}-old/x")
    assert sibling.endswith(f"{REPO.name}-old/x") and sibling != "-old/x"


def test_reports_are_rewritten_throughout(paths: ModuleType, tmp_path: Path) -> None:
    venv = tmp_path / "peer-venv"
    trace = f'File "{venv}/lib/python3.11/site-packages/llmcompressor/core.py", line 1'
    report = {"rows": [{"trace": trace, "seconds": 1.5}], "model": str(paths.models_dir())}
    clean = paths.portable_report(report, {venv: "<llmcompressor-venv>"})
    assert clean == {
        "rows": [
            {
                "trace": 'File "<llmcompressor-venv>/lib/python3.11/site-packages/'
                'llmcompressor/core.py", line 1',
                "seconds": 1.5,
            }
        ],
        "model": "../shared/models",
    }


# -- the peers: one committed requirements file each ---------------------------------------


@pytest.mark.parametrize("peer", _PEERS)
def test_each_peer_has_a_requirements_file(paths: ModuleType, peer: str) -> None:
    requirements = pytest.importorskip("packaging.requirements")
    file = paths.peer_requirements(peer)
    assert file.is_file(), f"{peer}: no {file.relative_to(REPO)} (setup.sh installs from it)"
    lines = [line.split("#")[0].strip() for line in file.read_text().splitlines()]
    parsed = [requirements.Requirement(line) for line in lines if line]
    assert parsed, f"{file.name} declares nothing"
    for requirement in parsed:
        if requirement.name == "torch":
            assert str(requirement) == _TORCH_PIN, f"{file.name}: torch must be {_TORCH_PIN}"
