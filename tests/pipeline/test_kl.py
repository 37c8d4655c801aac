import math

import numpy as np
import pytest

from ingot.pipeline.evaluate.kl import kl_sum, mean_kl


def test_kl_of_identical_logits_is_zero():
    logits = np.random.default_rng(0).normal(size=(5, 11)).astype(np.float32)
    assert mean_kl(logits, logits) == pytest.approx(0.0, abs=1e-12)
    assert mean_kl(logits, logits + 3.0) == pytest.approx(0.0, abs=1e-9)  # shift-invariant


def test_kl_matches_the_definition_and_is_asymmetric():
    p = np.log(np.array([[0.5, 0.25, 0.25]]))
    q = np.log(np.array([[0.25, 0.5, 0.25]]))
    expected = 0.5 * math.log(2.0) + 0.25 * math.log(0.5)
    assert kl_sum(p, q) == pytest.approx(expected, rel=1e-12)
    wide = np.log(np.array([[0.9, 0.05, 0.05]]))
    assert mean_kl(wide, q) != pytest.approx(mean_kl(q, wide))


def test_mean_kl_averages_rows_across_chunks():
    rng = np.random.default_rng(1)
    ref, out = rng.normal(size=(2, 150, 7))  # more rows than one chunk
    per_row = [kl_sum(ref[i : i + 1], out[i : i + 1]) for i in range(150)]
    assert mean_kl(ref, out) == pytest.approx(sum(per_row) / 150, rel=1e-12)
    assert min(per_row) > 0


def test_kl_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        kl_sum(np.zeros((2, 3)), np.zeros((2, 4)))
