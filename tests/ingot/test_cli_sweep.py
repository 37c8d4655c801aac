"""`ingot sweep`'s options: usage errors, one-line user errors before any build, and picking
again from an existing DIR/sweep.json (no rebuild). The sweep itself runs end to end in
tests/pipeline/sweep/test_sweep_end_to_end.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ingot.cli import main

from fixtures import write_recipe


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def swept(tmp_path: Path) -> Path:
    """A sweep DIR as a sweep leaves it: sweep.json and the variants' recipes."""
    rows = []
    for name, kl, size, b32 in (("a", 0.01, 2**31, 900.0), ("b", 0.015, 2**29, 300.0)):
        (tmp_path / "recipes").mkdir(exist_ok=True)
        (tmp_path / "recipes" / f"{name}.yaml").write_text(f"# {name}\n")
        rows.append(
            {
                "name": name,
                "recipe": f"recipes/{name}.yaml",
                "kl": kl,
                "perplexity": 5.0,
                "perplexity_ood": 9.0,
                "artifact_bytes": size,
                "tok_s_batch1": 50.0,
                "tok_s_batch32": b32,
                "ttft_ms_p50": 30.0,
                "build_s": 4.0,
                "peak_build_bytes": 2**30,
                "pareto": True,
                "error": None,
            }
        )
    (tmp_path / "sweep.json").write_text(json.dumps({"recipe": "r.yaml", "variants": rows}))
    return tmp_path


def test_picking_again_reads_sweep_json(swept):
    result = _invoke(
        "sweep", "--out", str(swept), "--pick", "kl<=0.02", "--maximize", "tok_s_batch32"
    )
    assert result.exit_code == 0, result.output
    assert result.output == f"picked    a -> {swept / 'picked.yaml'}\n"
    assert (swept / "picked.yaml").read_text() == "# a\n"
    result = _invoke("sweep", "--out", str(swept), "--pick", "kl<=0.02,artifact_bytes<=1GiB")
    assert (swept / "picked.yaml").read_text() == "# b\n"


def test_nothing_meeting_the_constraints_is_one_line(swept):
    result = _invoke("sweep", "--out", str(swept), "--pick", "kl<=0.005")
    assert result.exit_code == 1
    assert result.output == (
        "error: --pick: no variant meets kl<=0.005: kl<=0.005 excluded the closest, "
        "a (kl 0.01), b (kl 0.015)\n"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--recipe", "r.yaml"], "--recipe and --axes go together"),
        ([], "give --recipe and --axes, or --pick"),
        (["--pick", "kl<=1", "--maximize", "kl", "--minimize", "kl"], "exclude each other"),
    ],
)
def test_usage_errors(tmp_path, args, message):
    result = _invoke("sweep", "--out", str(tmp_path), *args)
    assert result.exit_code == 2 and message in result.output


def test_executor_options_reach_the_executor(tmp_path):
    base = ["sweep", "--recipe", "r.yaml", "--axes", "a.yaml", "--out", str(tmp_path)]
    result = _invoke(*base, "--executor-option", "jobs=0")
    assert result.exit_code == 1 and "jobs must be an integer >= 1, not 0" in result.output
    result = _invoke(*base, "--executor-option", "jobs")
    assert result.exit_code == 2 and "'jobs' is not KEY=VALUE" in result.output


def test_bad_input_fails_in_one_line_before_any_build(tmp_path):
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "ckpt")  # no evaluate section
    (tmp_path / "axes.yaml").write_text("axes: {quantize.0.bits: [4, 8]}\nood_text: o.txt\n")
    base = ["sweep", "--recipe", str(recipe), "--axes", str(tmp_path / "axes.yaml")]
    base += ["--out", str(tmp_path / "out")]
    result = _invoke(*base, "--pick", "speed>=1")
    assert result.exit_code == 1 and result.output.startswith("error: --pick: unknown field")
    result = _invoke(*base)
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert "evaluate.perplexity: required by ingot sweep" in result.output
    assert not (tmp_path / "out").exists()
