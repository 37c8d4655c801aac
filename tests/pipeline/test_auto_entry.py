"""`method: auto` as a recipe entry (pipeline/quantize/methods/auto.py): its candidates are the
other methods' entries, validated as theirs with one-line errors under
`quantize.N.candidates.M`; it needs calibration; the recipe checks check each candidate
against the modules the entry selects and the budget against the cheapest choice, in stored
bytes as the export writes them (weight_bytes.py). The choice under the budget
(knapsack.py) is the brute force's optimum."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import yaml

from ingot.pipeline.preflight import check_recipe_against_model
from ingot.pipeline.quantize.knapsack import choose
from ingot.pipeline.quantize.method import method_of
from ingot.pipeline.quantize.weight_bytes import weight_bytes
from ingot.pipeline.recipe import RecipeError, load_recipe
from ingot.pipeline.recipe.quantize import quantize_entry

from fixtures import model_config

GPTQ4 = {"method": "gptq", "bits": 4, "group_size": 32}
RTN8 = {"method": "rtn", "bits": 8, "group_size": -1}


def _recipe(tmp_path, auto: dict, calibration: bool = True):
    recipe = {
        "source": {"path": "./ckpt"},
        "quantize": [{"method": "auto", **auto}],
        "export": {"max_seq_len": 128},
        "artifact": {"name": "tiny"},
    }
    if calibration:
        recipe["calibration"] = {"dataset": "calib.txt", "samples": 4, "seq_len": 32}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _problems(tmp_path, auto: dict) -> str:
    with pytest.raises(RecipeError) as error:
        check_recipe_against_model(load_recipe(_recipe(tmp_path, auto)), model_config())
    return str(error.value)


def test_an_auto_entry_holds_candidates_of_the_other_methods():
    entry = quantize_entry({"method": "auto", "budget_bits": 4.5, "candidates": [GPTQ4, RTN8]})
    assert [c.method for c in entry.candidates] == ["gptq", "rtn"]
    assert entry.calibrated and entry.bits == 5
    assert entry.targets == ["re:layers\\..*"] and entry.ignore == ["lm_head"]
    assert method_of(entry).searches(entry)
    assert list(method_of(entry).nested(entry)) == ["candidates.0", "candidates.1"]
    # The measurement is shared by entries that differ in their budget only
    other = quantize_entry({"method": "auto", "budget_bits": 6.0, "candidates": [GPTQ4, RTN8]})
    assert method_of(entry).measure_key(entry) == method_of(other).measure_key(other)


@pytest.mark.parametrize(
    ("candidate", "line"),
    [
        ({**GPTQ4, "bits": 3}, "quantize.0.candidates.1.bits: "),
        ({"method": "gptq", "bits": 4}, "quantize.0.candidates.1.group_size: "),
        ({**RTN8, "rounding": "up"}, "quantize.0.candidates.1.rounding: unknown field"),
        ({"method": "auto", "budget_bits": 4, "candidates": [RTN8]}, "candidates.1.method: "),
    ],
)
def test_a_bad_candidate_is_one_line_naming_its_field(tmp_path, candidate, line):
    path = _recipe(tmp_path, {"budget_bits": 5, "candidates": [RTN8, candidate]})
    with pytest.raises(RecipeError) as error:
        load_recipe(path)
    [problem] = error.value.problems
    assert line in problem, problem


def test_an_auto_entry_needs_calibration(tmp_path):
    path = _recipe(tmp_path, {"budget_bits": 5, "candidates": [RTN8]}, calibration=False)
    with pytest.raises(RecipeError) as error:
        load_recipe(path)
    assert "calibration" in str(error.value) and "auto" in str(error.value)


def test_each_candidate_is_checked_against_the_selected_modules(tmp_path):
    # hidden_size 64: a group of 128 does not divide q_proj's input
    g128 = {"method": "rtn", "bits": 4, "group_size": 128}
    problems = _problems(tmp_path, {"budget_bits": 9, "candidates": [RTN8, g128]})
    assert "quantize.0.candidates.1.group_size: 128 does not divide hidden_size 64" in problems


def test_a_candidate_takes_the_entrys_modules(tmp_path):
    narrowed = {**RTN8, "targets": ["re:.*q_proj"]}
    problems = _problems(tmp_path, {"budget_bits": 9, "candidates": [narrowed]})
    assert "quantize.0.candidates.0.targets: a candidate quantizes the modules" in problems


def test_a_budget_below_the_cheapest_choice_is_refused_before_any_work(tmp_path):
    # int4 g32 with fp32 scales stores 4 + 32/32 = 5 bits per weight
    problems = _problems(tmp_path, {"budget_bits": 4.9, "candidates": [GPTQ4, RTN8]})
    assert (
        "quantize.0.budget_bits: 4.9 is below the cheapest choice of its candidates, " in problems
    )
    assert "5.000 bits per weight" in problems
    check_recipe_against_model(  # exactly the cheapest fits
        load_recipe(_recipe(tmp_path, {"budget_bits": 5.0, "candidates": [GPTQ4, RTN8]})),
        model_config(),
    )


@pytest.mark.parametrize(
    ("spec", "stored"),
    [
        # int4 codes two per byte, an fp32 scale per 32 weights
        (GPTQ4, 64 * 128 // 2 + 64 * 4 * 4),
        # asymmetric: int4 zero points too, two per byte
        ({**GPTQ4, "symmetric": False}, 64 * 128 // 2 + 64 * 4 * 4 + 64 * 4 // 2),
        (RTN8, 64 * 128 + 64 * 4),
        # W8A8: int8 codes, fp32 scale and int8 zero point per row, the input's scale and zero
        ({"method": "smoothquant"}, 64 * 128 + 64 * 5 + 5),
        ({"method": "fp8"}, 64 * 128 + 64 * 4),
    ],
)
def test_stored_bytes_count_codes_scales_and_zero_points(spec, stored):
    assert weight_bytes(quantize_entry(spec), 64, 128) == stored


def test_the_choice_is_the_brute_forces_optimum():
    rng = np.random.default_rng(0)
    for _ in range(40):
        units, options = rng.integers(1, 6), rng.integers(1, 4)
        costs = rng.integers(1, 30, size=(units, options))
        losses = rng.random((units, options))
        budget = int(rng.integers(costs.min(axis=1).sum(), costs.max(axis=1).sum() + 1))
        best = min(
            (
                sum(losses[u, c] for u, c in enumerate(pick))
                for pick in itertools.product(range(options), repeat=units)
                if sum(costs[u, c] for u, c in enumerate(pick)) <= budget
            ),
        )
        pick = choose(costs, losses, budget)
        assert sum(costs[u, c] for u, c in enumerate(pick)) <= budget
        assert sum(losses[u, c] for u, c in enumerate(pick)) == pytest.approx(best)


def test_a_coarse_step_still_fits_the_budget_in_bytes():
    rng = np.random.default_rng(1)
    costs = rng.integers(1000, 5000, size=(50, 4))
    losses = rng.random((50, 4))
    budget = int(costs.mean(axis=1).sum())
    pick = choose(costs, losses, budget, steps=64)  # steps of ~2.4 KB
    assert sum(costs[u, c] for u, c in enumerate(pick)) <= budget
    with pytest.raises(ValueError, match="over the budget"):
        choose(costs, losses, int(costs.min(axis=1).sum()) - 1)


def test_inspect_describes_the_resolution_in_a_line():
    record = {
        "method": "auto",
        "budget_bits": 5.5,
        "stored_bits": 5.45,
        "resolved": [
            {**GPTQ4, "symmetric": True, "modules": 25},
            {**RTN8, "symmetric": True, "modules": 3},
        ],
    }
    describe = method_of(
        quantize_entry({"method": "auto", "budget_bits": 5.5, "candidates": [RTN8]})
    ).describe
    assert describe(record) == (
        "auto, budget 5.5 bits per weight (5.45 used): gptq int4 g32 sym x25, rtn int8 g-1 sym x3"
    )
