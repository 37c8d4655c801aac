"""pyproject.toml lists its packages by hand (setuptools' package-dir maps five top-level
directories into one namespace, which automatic discovery cannot follow): every directory with
an __init__.py must be listed, or the wheel silently lacks it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_directory_is_in_the_wheel():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for package, directory in config["package-dir"].items():
        for init in (ROOT / directory).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / directory).parts
            found.add(".".join([package, *parts]))
    assert found - listed == set(), "packages missing from pyproject.toml"
    assert listed - found == set(), "pyproject.toml lists packages that do not exist"
