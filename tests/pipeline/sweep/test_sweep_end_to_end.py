"""`ingot sweep` end to end on a tiny checkpoint, through the real local executor and speed
measurement: three variants (float, int4, and an int4 group size the model cannot take),
the three result files, the KL in every build's eval report, the Pareto flags against a
brute-force check, and the picked recipe building to the very artifact the sweep measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from test_pareto_pick import brute_force_front

from ingot.cli import main
from ingot.pipeline.sweep import speed

from fixtures import make_checkpoint, write_recipe

TEXT = " ".join(
    f"def f{i}(a, b):\n    return a * {i} + b  # the quick brown fox" for i in range(60)
)
OOD = " ".join(f"Lists, tuples and dictionaries number {i} of the built-ins." for i in range(60))
INT4 = {"method": "rtn", "bits": 4, "group_size": 32, "symmetric": True, "ignore": ["lm_head"]}
# The fields, exactly, in its order.
FIELDS = (
    "name recipe kl perplexity perplexity_ood artifact_bytes tok_s_batch1 tok_s_batch32 "
    "ttft_ms_p50 build_s peak_build_bytes pareto error"
)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    (root / "eval.txt").write_text(TEXT)
    (root / "ood.txt").write_text(OOD)
    write_recipe(
        root / "base.yaml",
        make_checkpoint(root / "ckpt"),
        quantize=[INT4],
        targets=[{"engine": "onnxruntime", "matmul_accuracy_level": 0}],  # exact: KL of fp32 ~0
        evaluate={"perplexity": {"dataset": "eval.txt", "seq_len": 32, "max_windows": 3}},
    )
    axes = {
        "axes": {"quantize": [[], [INT4], [{**INT4, "group_size": 128}]]},
        "ood_text": "ood.txt",
        "speed": {"rounds": 1, "prompt_tokens": 8, "output_tokens": 4, "concurrency": 4},
    }
    (root / "axes.yaml").write_text(yaml.safe_dump(axes, sort_keys=False))
    args = ["sweep", "--recipe", str(root / "base.yaml"), "--axes", str(root / "axes.yaml")]
    args += ["--out", str(root / "out"), "--cache-dir", str(root / "cache")]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(speed, "SETTLE_MAX_S", 0.0)  # time at once: the numbers are not judged
        result = CliRunner().invoke(
            main, [*args, "--pick", "kl<=1", "--minimize", "artifact_bytes"]
        )
    assert result.exit_code == 0, result.output
    return root


def _rows(sweep: Path) -> dict[str, dict]:
    data = json.loads((sweep / "out" / "sweep.json").read_text())
    return {row["name"]: row for row in data["variants"]}


def test_results_rows_and_the_invalid_variant(sweep):
    out = sweep / "out"
    assert (out / "sweep.md").is_file() and (out / "pareto.png").stat().st_size > 10_000
    rows = _rows(sweep)
    assert list(rows) == [
        "no-quantize",
        "group_size32",
        "group_size128",
    ]
    float_, int4, invalid = rows.values()
    assert all(" ".join(row) == FIELDS for row in rows.values())
    assert invalid["error"].startswith("quantize.0.group_size: 128 does not divide")
    assert invalid["kl"] is None and invalid["pareto"] is False
    for row in (float_, int4):
        assert row["error"] is None and (out / row["recipe"]).is_file()
        assert row["tok_s_batch1"] > 0 and row["tok_s_batch32"] > 0 and row["ttft_ms_p50"] > 0
        assert row["build_s"] > 0 and row["peak_build_bytes"] > 2**20
        assert row["perplexity_ood"] > 1 and row["perplexity_ood"] != row["perplexity"]
    assert float_["kl"] < 1e-6 < 1e-3 < int4["kl"]  # an exact fp32 engine vs int4
    assert float_["artifact_bytes"] > int4["artifact_bytes"]
    markdown = (out / "sweep.md").read_text()
    assert "| * | `group_size32` |" in markdown
    assert "- `group_size128`: quantize.0.group_size: 128" in markdown


def test_pareto_flags_match_the_brute_force_check(sweep):
    rows = list(_rows(sweep).values())
    assert [r["pareto"] for r in rows] == brute_force_front(rows)


def test_every_builds_eval_report_carries_the_kl(sweep):
    rows = _rows(sweep)
    for name, row in rows.items():
        if row["error"] is None:
            report = sweep / "out" / "artifacts" / name / "eval"
            ppl = json.loads((report / "report.json").read_text())["perplexity"]
            assert ppl["engine_kl"] == row["kl"] and ppl["engine"] == row["perplexity"]
            # At accuracy level 0 the engine computes the IR's logits: the IR's KL.
            assert ppl["engine_kl"] == pytest.approx(ppl["kl"], rel=1e-3, abs=1e-7)
            assert "mean KL to original" in (report / "report.md").read_text()


def test_the_picked_recipe_builds_the_measured_artifact(sweep):
    chosen = _rows(sweep)["group_size32"]  # the smallest under kl<=1
    picked = sweep / "out" / "picked.yaml"
    assert picked.read_bytes() == (sweep / "out" / chosen["recipe"]).read_bytes()
    args = ["build", "--recipe", str(picked), "--out", str(sweep / "again")]
    result = CliRunner().invoke(main, [*args, "--cache-dir", str(sweep / "cache"), "--json"])
    assert result.exit_code == 0, result.output
    built = json.loads(result.output)
    assert all(s["cached"] for s in built["stages"] if s["stage"] != "package")
    artifact = Path(built["artifact"])
    ppl = json.loads((artifact / "eval" / "report.json").read_text())["perplexity"]
    size = sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file())
    assert (ppl["engine_kl"], size) == (chosen["kl"], chosen["artifact_bytes"])
