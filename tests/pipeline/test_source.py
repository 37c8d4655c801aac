"""Source resolution: local directories are pinned by file digests; remote code and pickles are
refused; hub sources download only safe files at a pinned commit."""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import sys
import types
from pathlib import Path

import pytest

from ingot.pipeline.source import SourceError, resolve_source

from fixtures import make_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("src") / "m")


def test_local_source_pins_every_file(ckpt):
    src = resolve_source({"path": str(ckpt)})
    assert src.revision is None
    assert set(src.files) >= {"config.json", "tokenizer.json", "model.safetensors"}
    weights = (ckpt / "model.safetensors").read_bytes()
    assert src.files["model.safetensors"] == hashlib.sha256(weights).hexdigest()


def test_remote_code_is_refused(ckpt, tmp_path):
    copy = shutil.copytree(ckpt, tmp_path / "m")
    config = json.loads((copy / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(SourceError, match="remote code"):
        resolve_source({"path": str(copy)})


@pytest.mark.parametrize("missing", ["config.json", "tokenizer.json"])
def test_missing_file_is_named(ckpt, tmp_path, missing):
    copy = shutil.copytree(ckpt, tmp_path / "m")
    (copy / missing).unlink()
    with pytest.raises(SourceError, match=missing):
        resolve_source({"path": str(copy)})


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_malformed_config_json_is_named(ckpt, tmp_path, text):
    copy = shutil.copytree(ckpt, tmp_path / "m")
    (copy / "config.json").write_text(text)
    with pytest.raises(SourceError, match=r"m/config\.json"):
        resolve_source({"path": str(copy)})


def test_not_a_directory(tmp_path):
    with pytest.raises(SourceError, match="not a directory"):
        resolve_source({"path": str(tmp_path / "nope")})


def test_hub_source_downloads_only_safe_files_at_the_pinned_commit(ckpt, monkeypatch):
    calls = {}

    class FakeApi:
        def model_info(self, repo_id, revision):
            calls["info"] = (repo_id, revision)
            return types.SimpleNamespace(sha="a" * 40)

    def fake_file(repo_id, filename, revision):
        calls.setdefault("files", []).append((repo_id, filename, revision))
        return str(ckpt / filename)

    def fake_snapshot(repo_id, revision, allow_patterns):
        calls["snapshot"] = (repo_id, revision, allow_patterns)
        return str(ckpt)

    fake = types.SimpleNamespace(
        HfApi=FakeApi, hf_hub_download=fake_file, snapshot_download=fake_snapshot
    )
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    src = resolve_source({"hub": "org/model", "revision": "main"})
    assert src.revision == "a" * 40
    assert calls["info"] == ("org/model", "main")
    assert calls["files"] == [("org/model", "config.json", "a" * 40)]  # first, alone
    repo, revision, patterns = calls["snapshot"]
    assert (repo, revision) == ("org/model", "a" * 40)  # the resolved commit, not the branch
    assert not any(p.endswith((".py", ".bin", ".pt", ".pkl")) for p in patterns)


# --- the hub offline: a populated Hugging Face cache, or one line saying what to do -----------

SHA = "0123456789abcdef0123456789abcdef01234567"


def hf_cache_with(cache: Path, repo: str, checkpoint: Path, *, only: set[str] | None = None):
    """A Hugging Face hub cache (HF_HUB_CACHE) holding ``checkpoint`` as ``repo`` at commit
    SHA, laid out as huggingface_hub writes it: models--org--name/blobs/<hash>,
    snapshots/<commit>/<file> -> ../../blobs/<hash>, refs/main = <commit>."""
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / SHA
    snapshot.mkdir(parents=True)
    (repo_dir / "blobs").mkdir()
    for file in sorted(checkpoint.iterdir()):
        if only is not None and file.name not in only:
            continue
        data = file.read_bytes()
        blob = repo_dir / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", blob.name))
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(SHA)
    return snapshot


@pytest.fixture
def no_network(tmp_path, monkeypatch):
    """The hub at a closed port on 127.0.0.1 (refused at once: nothing leaves this machine)
    and an empty HF cache in tmp_path; yields the cache directory."""
    from huggingface_hub import constants

    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
        cache = tmp_path / "hf-cache"
        cache.mkdir()
        for name, value in (("HF_ENDPOINT", endpoint), ("HF_HUB_CACHE", str(cache))):
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        monkeypatch.setattr(
            constants,
            "HUGGINGFACE_CO_URL_TEMPLATE",
            endpoint + "/{repo_id}/resolve/{revision}/{filename}",
        )
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        yield cache


@pytest.fixture
def offline(no_network, monkeypatch):
    """HF_HUB_OFFLINE=1 on top of no_network (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return no_network


@pytest.mark.parametrize("revision", [SHA, "main"])
def test_hub_source_resolves_from_the_hf_cache_offline(ckpt, offline, revision):
    snapshot = hf_cache_with(offline, "org/name", ckpt)
    src = resolve_source({"hub": "org/name", "revision": revision})
    assert src.path == snapshot and src.revision == SHA  # a branch resolves through refs/
    local = resolve_source({"path": str(ckpt)})
    assert src.files == local.files


def test_a_populated_cache_also_serves_when_the_hub_cannot_be_reached(ckpt, no_network):
    snapshot = hf_cache_with(no_network, "org/name", ckpt)
    src = resolve_source({"hub": "org/name", "revision": SHA})
    assert src.path == snapshot and src.revision == SHA


def _assert_one_line_naming(message: str, *names: str) -> None:
    assert "\n" not in message.strip(), message
    for name in (*names, "HF_HUB_OFFLINE=1", "source.path", "network access"):
        assert name in message, (name, message)


def test_no_network_and_no_cache_is_one_line_naming_id_and_revision(no_network):
    with pytest.raises(SourceError) as error:
        resolve_source({"hub": "org/name", "revision": SHA})
    _assert_one_line_naming(str(error.value), "org/name", SHA, "cannot be reached")


def test_offline_and_no_cache_is_one_line_naming_id_and_revision(offline):
    with pytest.raises(SourceError) as error:
        resolve_source({"hub": "org/name", "revision": "main"})
    _assert_one_line_naming(str(error.value), "org/name", "main", "HF_HUB_OFFLINE is set")


def test_an_incomplete_cached_snapshot_is_the_same_one_line(ckpt, offline):
    hf_cache_with(offline, "org/name", ckpt, only={"config.json"})  # what `ingot plan` fetched
    with pytest.raises(SourceError) as error:
        resolve_source({"hub": "org/name", "revision": SHA})
    _assert_one_line_naming(str(error.value), "org/name", SHA)


def test_plan_reads_config_json_from_the_cache_offline(ckpt, offline):
    from ingot.pipeline.plan import read_hf_config

    snapshot = hf_cache_with(offline, "org/name", ckpt)
    config, local = read_hf_config({"hub": "org/name", "revision": SHA})
    assert config == json.loads((ckpt / "config.json").read_text()) and local == snapshot
    # only config.json cached: enough for a plan (weights sized from the shapes)
    shutil.rmtree(offline / "models--org--name")
    hf_cache_with(offline, "org/name", ckpt, only={"config.json"})
    config, local = read_hf_config({"hub": "org/name", "revision": "main"})
    assert config["hidden_size"] == 64 and local is None


def test_plan_without_network_or_cache_is_one_line(no_network):
    from ingot.pipeline.plan import read_hf_config

    with pytest.raises(SourceError) as error:
        read_hf_config({"hub": "org/name", "revision": SHA})
    _assert_one_line_naming(str(error.value), "org/name", SHA, "--config")


def hub_recipe(path: Path) -> Path:
    """fixtures.write_recipe with ``source: {hub: org/name, revision: SHA}``."""
    import yaml

    from fixtures import write_recipe

    recipe = yaml.safe_load(write_recipe(path, path.parent).read_text())
    recipe["source"] = {"hub": "org/name", "revision": SHA}
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def test_build_from_the_hf_cache_offline(ckpt, offline, tmp_path):
    from ingot.pipeline.build import build
    from ingot.pipeline.cache import StageCache

    hf_cache_with(offline, "org/name", ckpt)
    recipe = hub_recipe(tmp_path / "r.yaml")
    result = build(recipe, tmp_path / "out", cache=StageCache(tmp_path / "cache"))
    lock = json.loads((result.artifact / "ingot.lock").read_text())
    assert lock["source"]["revision"] == SHA


def test_ingot_build_without_network_prints_one_error_line(no_network, tmp_path):
    from click.testing import CliRunner

    from ingot.cli import main

    recipe = hub_recipe(tmp_path / "r.yaml")
    result = CliRunner().invoke(
        main, ["build", "--recipe", str(recipe), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: source.hub: org/name"), result.stderr
    assert SHA in lines[0]


@pytest.mark.parametrize(
    ("error", "says"),
    [
        ("GatedRepoError", "gated repository"),
        ("RepositoryNotFoundError", "no such repository"),
        ("RevisionNotFoundError", "has no revision v9"),
    ],
)
def test_what_the_hub_refuses_is_one_line(monkeypatch, error, says):
    refused = type(error, (OSError,), {})

    class FakeApi:
        def model_info(self, repo_id, revision):
            raise refused("404 Client Error.\n\nRepository Not Found for url: ...")

    fake = types.SimpleNamespace(HfApi=FakeApi)
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    with pytest.raises(SourceError) as caught:
        resolve_source({"hub": "org/model", "revision": "v9"})
    message = str(caught.value)
    assert message.startswith("source.hub: org/model at revision v9: ") and says in message
    assert "\n" not in message
