"""The CLI commands, reproducible pushes, and registry credentials (env and Docker config)."""

from __future__ import annotations

import base64
import json

import pytest
from click.testing import CliRunner

from ingot.artifacts.oci import pull, push
from ingot.artifacts.registry_client import RegistryError, Retry
from ingot.cli import main

pytestmark = pytest.mark.registry
FAST = Retry(attempts=3, backoff=0.01, max_backoff=0.05, timeout=5.0)


def test_cli_push_sign_pull_verify(registry, artifact, keys, tmp_path, monkeypatch):
    monkeypatch.setenv("INGOT_STORE_DIR", str(tmp_path / "store"))
    runner = CliRunner()
    signed = runner.invoke(main, ["sign", str(artifact), "--key", str(keys["private"])])
    assert signed.exit_code == 0, signed.output
    pushed = runner.invoke(main, ["push", str(artifact), registry.ref("cli/tiny:v1"), "--json"])
    assert pushed.exit_code == 0, pushed.output
    info = json.loads(pushed.output)
    assert info["tag"] == "v1" and info["reference"] == f"{registry.host}/cli/tiny@{info['digest']}"

    out = tmp_path / "models" / "tiny"  # the init-container one-liner
    args = ["pull", f"oci://{info['reference']}", "--out", str(out)]
    pulled = runner.invoke(main, [*args, "--verify-key", str(keys["public"])])
    assert pulled.exit_code == 0, pulled.output
    verified = runner.invoke(main, ["verify", str(out), "--verify-key", str(keys["public"])])
    assert verified.exit_code == 0 and "signature ok" in verified.output

    refused = runner.invoke(main, ["verify", str(out), "--verify-key", str(keys["other_public"])])
    assert refused.exit_code == 1 and "does not verify" in refused.output
    wrong = runner.invoke(main, [*args[:2], "--out", str(tmp_path / "x"), "--verify-key",
                                 str(keys["other_public"])])  # fmt: skip
    assert wrong.exit_code == 1 and "does not verify" in wrong.output
    bad_ref = runner.invoke(main, ["pull", "oci://localhost:5000/Bad/Name:v1"])
    assert bad_ref.exit_code == 1 and "repository component 'Bad'" in bad_ref.output


def test_two_builds_from_empty_caches_push_to_the_same_digest(registry, built, tmp_path):
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    again = build(built.recipe, tmp_path / "again", cache=StageCache(tmp_path / "empty-cache"))
    first = push(built.artifact, registry.ref("repro/tiny:a"), retry=FAST)
    second = push(again.artifact, registry.ref("repro/tiny:b"), retry=FAST)
    assert first.digest == second.digest


def test_credentials_come_from_env_or_docker_config(
    private_registry, artifact, store, tmp_path, monkeypatch
):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.docker/config.json
    monkeypatch.delenv("DOCKER_CONFIG", raising=False)
    ref = private_registry.ref("private/tiny:v1")
    with pytest.raises(RegistryError, match="authentication failed.*INGOT_REGISTRY_USER"):
        push(artifact, ref, retry=FAST)

    monkeypatch.setenv("INGOT_REGISTRY_USER", "alice")
    monkeypatch.setenv("INGOT_REGISTRY_PASSWORD", "secret")
    push(artifact, ref, retry=FAST)
    monkeypatch.delenv("INGOT_REGISTRY_USER")
    monkeypatch.delenv("INGOT_REGISTRY_PASSWORD")

    config = tmp_path / "docker" / "config.json"
    config.parent.mkdir()
    auth = base64.b64encode(b"alice:secret").decode()
    config.write_text(json.dumps({"auths": {private_registry.host: {"auth": auth}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(config.parent))
    pulled = pull(ref, out=tmp_path / "out", store=store, retry=FAST)
    assert (pulled.path / "manifest.json").read_bytes() == (artifact / "manifest.json").read_bytes()
