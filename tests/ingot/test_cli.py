"""The CLI forms users' scripts depend on: build --json, inspect, verify, schema, generate,
and how errors are reported (one line for a user error, a traceback for a bug)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ingot.cli import main
from ingot.cli_errors import INTERNAL_ERROR_EXIT, USER_ERROR_EXIT
from ingot.common.errors import IngotError

from fixtures import write_recipe

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_checkpoint):
    tmp = tmp_path_factory.mktemp("cli")
    recipe = write_recipe(tmp / "r.yaml", tiny_checkpoint)
    args = ["build", "--recipe", str(recipe), "--out", str(tmp / "art")]
    result = CliRunner().invoke(main, [*args, "--cache-dir", str(tmp / "cache"), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_build_json_reports_path_digest_and_stages(built):
    assert Path(built["artifact"]).is_dir()
    assert built["digest"].startswith("sha256:")
    stages = [s["stage"] for s in built["stages"]]
    assert stages == ["quantize", "export", "engine:onnxruntime-cpu", "package"]
    assert all({"seconds", "cached", "key"} <= set(s) for s in built["stages"])


def test_verify_ok_then_fails_on_a_flipped_byte(built, tmp_path):
    import shutil

    art = tmp_path / "art"
    shutil.copytree(built["artifact"], art)
    ok = CliRunner().invoke(main, ["verify", str(art)])
    assert ok.exit_code == 0 and built["digest"] in ok.output
    data = art / "engines" / "onnxruntime-cpu" / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    bad = CliRunner().invoke(main, ["verify", str(art)])
    assert bad.exit_code == 1
    assert "model.onnx.data" in bad.output
    refused = CliRunner().invoke(main, ["generate", str(art), "--prompt", "def"])
    assert refused.exit_code == 1
    assert "model.onnx.data" in refused.output


def test_inspect_json_and_text(built):
    as_json = CliRunner().invoke(main, ["inspect", built["artifact"], "--json"])
    manifest = json.loads(as_json.stdout)
    assert manifest["model"]["quantization"][0]["bits"] == 4
    text = CliRunner().invoke(main, ["inspect", built["artifact"]])
    assert "rtn int4 g32 sym" in text.output and "onnxruntime-cpu" in text.output


def test_generate_json_is_deterministic_for_a_seed(built):
    args = ["generate", built["artifact"], "--prompt", "def add", "--max-tokens", "12"]
    sampled = [*args, "--temperature", "0.8", "--top-p", "0.9", "--seed", "7", "--json"]
    first = json.loads(CliRunner().invoke(main, sampled).stdout)
    second = json.loads(CliRunner().invoke(main, sampled).stdout)
    assert first == second
    assert len(first["token_ids"]) <= 12 and first["prompt_token_ids"]
    streamed = CliRunner().invoke(main, args)
    assert streamed.exit_code == 0 and streamed.output.startswith("def add")


def test_schema_matches_the_committed_file():
    result = CliRunner().invoke(main, ["schema"])
    committed = json.loads((REPO / "recipes" / "recipe.schema.json").read_text())
    assert json.loads(result.stdout) == committed


def test_bad_recipe_is_one_clear_line(tmp_path, tiny_checkpoint):
    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint, export={"opset": 22})
    result = CliRunner().invoke(main, ["build", "--recipe", str(recipe), "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "export.opset" in result.output and "Traceback" not in result.output


# -- errors: a user error is one line, anything else is a bug with its traceback -----------


def _bad_recipe(tmp_path: Path) -> Path:
    bad = tmp_path / "bad.yaml"
    bad.write_text("source: {path: x}\nquantize: [{method: rtn, bits: 4, group_size: 32}]\n")
    return bad


def test_a_user_error_is_one_line_without_traceback(tmp_path):
    result = CliRunner().invoke(main, ["plan", "--recipe", str(_bad_recipe(tmp_path))])
    assert result.exit_code == USER_ERROR_EXIT
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"error: {tmp_path / 'bad.yaml'}: ") and "artifact" in line


def test_debug_shows_the_traceback_of_a_user_error(tmp_path):
    args = ["--debug", "plan", "--recipe", str(_bad_recipe(tmp_path))]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == USER_ERROR_EXIT
    assert "Traceback (most recent call last)" in result.stderr
    assert "RecipeError" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: ")


@pytest.mark.parametrize("bug", [KeyError("quantize"), ValueError("a bug, not bad input")])
def test_an_internal_error_says_so_with_its_traceback(monkeypatch, bug):
    import ingot.pipeline.recipe

    def broken():
        raise bug

    monkeypatch.setattr(ingot.pipeline.recipe, "recipe_json_schema", broken)
    result = CliRunner().invoke(main, ["schema"])
    assert result.exit_code == INTERNAL_ERROR_EXIT
    first = result.stderr.splitlines()[0]
    assert first == f"internal error, please report it: {type(bug).__name__}: {bug}"
    assert "Traceback (most recent call last)" in result.stderr
    assert "in broken" in result.stderr  # the frame that raised


def test_missing_evaluation_data_is_a_user_error(tmp_path, tiny_checkpoint):
    evaluate = {"perplexity": {"dataset": "missing.txt", "seq_len": 16}}
    recipe = write_recipe(tmp_path / "r.yaml", tiny_checkpoint, evaluate=evaluate)
    result = CliRunner().invoke(main, ["build", "--recipe", str(recipe), "--out", str(tmp_path)])
    assert result.exit_code == USER_ERROR_EXIT, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "missing.txt" in line


def test_a_usage_error_stays_clicks(tmp_path):
    result = CliRunner().invoke(main, ["plan"])
    assert result.exit_code == 2 and "Missing option '--recipe'" in result.stderr
    assert "internal error" not in result.stderr


def test_an_empty_prompt_is_a_user_error(built):
    result = CliRunner().invoke(main, ["generate", built["artifact"], "--prompt", ""])
    assert result.exit_code == USER_ERROR_EXIT
    assert result.stderr.strip() == "error: prompt is empty"


def _ingot_error_classes() -> list[type[IngotError]]:
    """Every IngotError subclass in ingot's packages (all their modules imported first)."""
    import importlib
    import pkgutil

    for name in ("common", "artifacts", "runtime", "calibration", "pipeline"):
        package = importlib.import_module(f"ingot.{name}")
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            importlib.import_module(module.name)
    for module in pkgutil.iter_modules(importlib.import_module("ingot").__path__, "ingot."):
        importlib.import_module(module.name)

    def below(cls: type) -> list[type]:
        return [c for sub in cls.__subclasses__() for c in (sub, *below(sub))]

    return sorted(set(below(IngotError)), key=lambda c: (c.__module__, c.__qualname__))


def test_every_ingot_error_is_a_one_line_user_error(monkeypatch):
    """Whatever IngotError a command raises is reported as ``error: <message>``, exit 1: the
    CLI's policy is the root class, not a list of them."""
    import ingot.pipeline.recipe

    classes = _ingot_error_classes()
    names = {cls.__name__ for cls in classes}
    assert {"RecipeError", "ArtifactError", "ConfigError", "NoCompatibleEngine"} <= names
    assert {"UserError", "UnknownPlugin", "KVCacheTooSmall", "Eagle3Error"} <= names
    wrong = []
    for cls in classes:
        # args only: constructors take other things. Exception's __new__, because a class
        # whose first base is IngotError may not call a second base's own (MemoryError's).
        error = Exception.__new__(cls, "what to change")

        def failing(error=error):
            raise error

        monkeypatch.setattr(ingot.pipeline.recipe, "recipe_json_schema", failing)
        result = CliRunner().invoke(main, ["schema"])
        if (result.exit_code, result.stderr) != (USER_ERROR_EXIT, "error: what to change\n"):
            wrong.append(
                f"{cls.__module__}.{cls.__qualname__}: {result.exit_code} {result.stderr!r}"
            )
    assert not wrong, "\n".join(wrong)


def test_an_os_error_is_a_user_error(monkeypatch):
    import ingot.pipeline.recipe

    def failing():
        raise FileNotFoundError(2, "No such file or directory", "recipes/missing.yaml")

    monkeypatch.setattr(ingot.pipeline.recipe, "recipe_json_schema", failing)
    result = CliRunner().invoke(main, ["schema"])
    assert result.exit_code == USER_ERROR_EXIT
    assert result.stderr == "error: [Errno 2] No such file or directory: 'recipes/missing.yaml'\n"
