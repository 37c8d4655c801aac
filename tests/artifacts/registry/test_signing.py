"""Signatures (sigstore model_signing, key-based): sign, verify, refuse before load."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from ingot.artifacts import ArtifactError, manifest_digest, verify_artifact
from ingot.artifacts.oci import pull, push
from ingot.artifacts.registry_client import Retry
from ingot.artifacts.signing import SIGNATURE_NAME, sign_artifact, verify_signature
from ingot.runtime import LoadedModel

pytestmark = pytest.mark.registry
FAST = Retry(attempts=3, backoff=0.01, max_backoff=0.05, timeout=5.0)


def test_signed_artifact_verifies_and_loads(artifact, keys):
    before = manifest_digest(artifact)
    signature = sign_artifact(artifact, keys["private"])
    assert signature == artifact / SIGNATURE_NAME
    assert manifest_digest(artifact) == before  # the signature is next to the manifest
    verify_artifact(artifact)  # model.sig is admitted unlisted
    verify_signature(artifact, keys["public"])
    model = LoadedModel.load(artifact, verify_key=keys["public"])
    assert model.manifest.name == "tiny"


def test_wrong_key_is_refused_before_load(artifact, keys):
    sign_artifact(artifact, keys["private"])
    with pytest.raises(ArtifactError, match=r"model\.sig: signature does not verify"):
        LoadedModel.load(artifact, verify_key=keys["other_public"])


def test_unsigned_artifact_is_refused_when_a_signature_is_required(artifact, keys):
    with pytest.raises(ArtifactError, match="unsigned and a signature is required"):
        LoadedModel.load(artifact, require_signature=True, verify_key=keys["public"])
    with pytest.raises(ValueError, match="needs verify_key"):
        LoadedModel.load(artifact, require_signature=True)
    # Not required: a key only checks a signature that is there.
    LoadedModel.load(artifact, require_signature=False, verify_key=keys["public"])


def test_a_manifest_changed_after_signing_is_refused(artifact, keys):
    sign_artifact(artifact, keys["private"])
    data = json.loads((artifact / "manifest.json").read_text())
    data["version"] = "9.9.9"
    (artifact / "manifest.json").write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    with pytest.raises(ArtifactError, match="signature does not verify"):
        verify_signature(artifact, keys["public"])


def test_signature_travels_through_the_registry(registry, artifact, keys, store, tmp_path):
    sign_artifact(artifact, keys["private"])
    push(artifact, registry.ref("models/signed:v1"), retry=FAST)

    def check(root):
        verify_signature(root, keys["public"])

    good = pull(registry.ref("models/signed:v1"), out=tmp_path / "good", store=store, check=check)
    assert (good.path / SIGNATURE_NAME).read_bytes() == (artifact / SIGNATURE_NAME).read_bytes()

    def wrong(root):
        verify_signature(root, keys["other_public"])

    with pytest.raises(ArtifactError, match="does not verify"):
        pull(registry.ref("models/signed:v1"), out=tmp_path / "bad", store=store, check=wrong)
    assert not (tmp_path / "bad").exists()  # nothing unverified is left behind


def test_recipe_signs_at_package_time(built, keys, tmp_path):
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache
    from ingot.pipeline.recipe import RecipeError

    recipe = yaml.safe_load(built.recipe.read_text())
    shutil.copy(keys["private"], tmp_path / "release.pem")
    recipe["artifact"]["sign"] = {"key": "release.pem"}  # relative to the recipe file
    (tmp_path / "signed.yaml").write_text(yaml.safe_dump(recipe))
    result = build(tmp_path / "signed.yaml", tmp_path / "out", cache=StageCache(built.cache))
    verify_signature(result.artifact, keys["public"])
    with pytest.raises(ArtifactError, match="does not verify"):
        verify_signature(result.artifact, keys["other_public"])

    recipe["artifact"]["sign"] = {"key": "missing.pem"}
    (tmp_path / "missing.yaml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(RecipeError, match=r"artifact\.sign\.key: .*missing\.pem"):
        build(tmp_path / "missing.yaml", tmp_path / "out2", cache=StageCache(built.cache))
    assert not (tmp_path / "out2").exists()
