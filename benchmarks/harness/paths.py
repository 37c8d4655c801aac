"""Where the benchmarks find their inputs and peers, and how their reports name paths.

Every default is found from this file's place in the checkout, never from a fixed location:
the shared models and data sit beside the repository (`../shared/models`, `../shared/data`),
each peer's virtualenv inside it (`benchmarks/.venvs/<peer>`, made by
`benchmarks/peers/setup.sh <peer>` from `benchmarks/peers/<peer>.txt`). Every benchmark takes
these as options; this module only supplies the defaults.

Reports are committed, so they must not name the machine that wrote them: `portable` rewrites
each absolute path under a known root relative to the repository root (`../shared/...`,
`benchmarks/...`) or from a placeholder (`<bench-cache>/...`, `<tmp>/...`, `~/...`).

Only the standard library: tests load this file by its path, and workers import it under a
peer's interpreter.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "PEERS",
    "REPO",
    "RESULTS",
    "SHARED",
    "VENVS",
    "bench_cache_dir",
    "data_dir",
    "missing_peer",
    "models_dir",
    "peer_python",
    "peer_requirements",
    "peer_version",
    "portable",
    "portable_report",
]

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
PEERS = REPO / "benchmarks" / "peers"  # one requirements file per peer, and setup.sh
VENVS = REPO / "benchmarks" / ".venvs"  # git-ignored: built by setup.sh, never committed
RESULTS = REPO / "benchmarks" / "results"  # the committed reports, <benchmark>.json and .md


def models_dir() -> Path:
    """The shared model checkpoints (pydoc-16m, ...)."""
    return SHARED / "models"


def data_dir() -> Path:
    """The shared text corpora (pydoc-calib.txt, pydoc-eval.txt, ...)."""
    return SHARED / "data"


def peer_python(peer: str) -> Path:
    """The interpreter of a peer's own virtualenv. Not resolved: the venv's `python` is a link
    to the base interpreter, and only the link's path makes it use the venv's packages."""
    return VENVS / peer / "bin" / "python"


def peer_version(python: Path, distribution: str) -> str | None:
    """`distribution`'s version in `python`'s environment; None if either is missing."""
    script = f"from importlib.metadata import version; print(version({distribution!r}))"
    try:
        done = subprocess.run([str(python), "-c", script], capture_output=True, text=True)
    except OSError:  # no such interpreter
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def peer_requirements(peer: str) -> Path:
    return PEERS / f"{peer}.txt"


def missing_peer(peer: str, distribution: str, python: Path) -> dict[str, Any] | None:
    """A failed record naming the setup command, or None when the peer is installed: a
    benchmark shows a peer it cannot run as a failed row, never as a crash."""
    if peer_version(python, distribution) is not None:
        return None
    return {
        "ok": False,
        "error": f"{distribution} is not installed for {python}: run "
        f"benchmarks/peers/setup.sh {peer} (or pass its interpreter)",
    }


def bench_cache_dir() -> Path:
    """Built models, artifacts and engines kept between runs (GBs, so outside the repository):
    $INGOT_BENCH_CACHE, else ~/.cache/ingot-bench."""
    root = os.environ.get("INGOT_BENCH_CACHE") or Path.home() / ".cache" / "ingot-bench"
    return Path(root)


def portable(text: str, roots: Mapping[str | Path, str] | None = None) -> str:
    """`text` with every absolute path under a known root rewritten from that root's name.

    Known roots: the shared folder (`../shared`), the repository (paths come out relative to
    it), the benchmark cache (`<bench-cache>`), the temporary directory (`<tmp>`) and the home
    directory (`~`), plus `roots` (path -> name, e.g. a peer's virtualenv). Paths are matched
    anywhere in `text`, so commands and tracebacks come out clean too; a path under no root is
    left as it is.
    """
    named: dict[str, str] = {}
    for root, name in [*_default_roots(), *(roots or {}).items()]:
        for form in {os.path.abspath(root), os.path.realpath(root)}:
            if form != os.sep:  # "/" is a prefix of everything: never a root
                named.setdefault(form, name)
    # Longest first: a root inside another one (the cache inside home) takes precedence.
    for root in sorted(named, key=len, reverse=True):
        text = _replace_root(text, root, named[root])
    return text


def portable_report(value: Any, roots: Mapping[str | Path, str] | None = None) -> Any:
    """A JSON-like report with `portable` applied to every string in it."""
    if isinstance(value, str):
        return portable(value, roots)
    if isinstance(value, Mapping):
        return {key: portable_report(item, roots) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [portable_report(item, roots) for item in value]
    return value


def _default_roots() -> list[tuple[str | Path, str]]:
    return [
        (SHARED, "../shared"),
        (REPO, "."),
        (bench_cache_dir(), "<bench-cache>"),
        (tempfile.gettempdir(), "<tmp>"),
        (Path.home(), "~"),
    ]


def _replace_root(text: str, root: str, name: str) -> str:
    # The root must start a path (not continue a longer one) and end at a separator or at the
    # end of the path: /srv/repo must not match inside /srv/repo-old or /x/srv/repo.
    pattern = re.compile(rf"(?<![\w.~/-]){re.escape(root)}(/|(?![\w.-]))")

    def rewrite(match: re.Match[str]) -> str:
        if not match.group(1):
            return name
        return "" if name == "." else name + "/"  # repository paths come out relative

    return pattern.sub(rewrite, text)
