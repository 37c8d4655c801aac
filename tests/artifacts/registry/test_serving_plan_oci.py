"""`ingot plan oci://...@sha256:... --serve`: the plan of a pushed artifact, pulling none of its
weights (the `common` files and the manifest only), and the same numbers as the directory's."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from ingot.artifacts.oci import push
from ingot.artifacts.registry_client import Retry
from ingot.cli import main

pytestmark = pytest.mark.registry
FAST = Retry(attempts=3, backoff=0.01, max_backoff=0.05, timeout=5.0)


def test_plan_of_a_reference_pulls_no_weights(registry, artifact, tmp_path):
    pushed = push(artifact, registry.ref("plan/tiny:v1"), retry=FAST)
    reference = f"oci://{registry.host}/plan/tiny@{pushed.digest}"
    store = tmp_path / "store"
    args = ["--serve", "--memory", "1GiB", "--json"]
    result = CliRunner().invoke(
        main, ["plan", reference, *args], env={"INGOT_STORE_DIR": str(store)}
    )
    assert result.exit_code == 0, result.output
    local = CliRunner().invoke(main, ["plan", str(artifact), *args])
    planned, expected = json.loads(result.output), json.loads(local.output)
    assert planned.pop("artifact") == reference
    expected.pop("artifact")
    assert planned == expected and planned["weight_files"] > 0
    pulled = [p for p in store.rglob("*") if p.is_file() and not p.is_symlink()]
    assert "config.json" in {p.name for p in pulled}
    assert sum(p.stat().st_size for p in pulled) < planned["weight_files"] / 2
