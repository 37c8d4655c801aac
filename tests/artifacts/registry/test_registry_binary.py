"""The registry tests fetch Debian's docker-registry themselves when the machine lacks it, so the
README's test command passes on a fresh machine with no manual step."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import registry_binary

pytestmark = pytest.mark.registry


def test_a_missing_system_binary_is_fetched_once_and_runs(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(registry_binary, "SYSTEM_BIN", tmp_path / "absent" / "docker-registry")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    binary = registry_binary.registry_binary()

    assert binary.is_relative_to(tmp_path / "cache")
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and "distribution" in version.stdout
    stamp = binary.stat().st_mtime_ns
    assert registry_binary.registry_binary() == binary  # reused, not fetched again
    assert binary.stat().st_mtime_ns == stamp


def test_no_apt_says_what_is_missing(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(registry_binary, "SYSTEM_BIN", tmp_path / "absent" / "docker-registry")
    monkeypatch.setenv("PATH", str(tmp_path))  # neither apt-get nor dpkg-deb
    with pytest.raises(RuntimeError, match="no apt-get / dpkg-deb"):
        registry_binary.registry_binary()


def test_the_system_binary_is_preferred(tmp_path, monkeypatch) -> None:
    system = tmp_path / "docker-registry"
    system.write_text("#!/bin/sh\n")
    system.chmod(0o755)
    monkeypatch.setattr(registry_binary, "SYSTEM_BIN", system)
    assert registry_binary.registry_binary() == Path(system)
