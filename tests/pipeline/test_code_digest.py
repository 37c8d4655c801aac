"""code_digest: what re-keys the stage cache when the build's code changes."""

import sys

from ingot.pipeline.cache import code_digest


def _package(root, monkeypatch):
    pkg = root / "digestpkg"
    (pkg / "sweep").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "stage.py").write_text("X = 1\n")
    (pkg / "sweep" / "__init__.py").write_text("")
    (pkg / "sweep" / "run.py").write_text("Y = 1\n")
    monkeypatch.syspath_prepend(str(root))
    sys.modules.pop("digestpkg", None)
    return pkg


def test_an_excluded_subpackage_does_not_change_the_digest(tmp_path, monkeypatch):
    pkg = _package(tmp_path, monkeypatch)
    before = code_digest("digestpkg", exclude=("sweep",))
    (pkg / "sweep" / "run.py").write_text("Y = 2\n")
    assert code_digest("digestpkg", exclude=("sweep",)) == before
    assert code_digest("digestpkg") != before  # without the exclusion it counts
    (pkg / "stage.py").write_text("X = 2\n")
    assert code_digest("digestpkg", exclude=("sweep",)) != before


def test_the_build_code_digest_leaves_the_sweep_out():
    from ingot.pipeline import build

    whole = code_digest("ingot.pipeline", "ingot.calibration", "ingot.artifacts")
    assert build._source_digest_of_build_code() != whole
