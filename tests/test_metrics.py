"""Top-k error and NLL (Dutordoir et al. 2020, Table 1) on probabilities whose answers are worked out by hand."""

import math

import numpy as np
import pytest

from gpzoo.analysis.calibration import classification_metrics
from gpzoo.analysis.metrics import classification_table, nll, nll_misclassified, top_k_error
from gpzoo.models.errors import DataError, InvalidArgumentError

#: Four points, three classes: the true label ranks 0, 1, 2 and 0.
PROBS = np.array([[0.7, 0.2, 0.1],
                  [0.5, 0.3, 0.2],   # label 1: second
                  [0.6, 0.3, 0.1],   # label 2: third
                  [0.1, 0.1, 0.8]])
LABELS = np.array([0, 1, 2, 2])


def test_hand_worked_table():
    """top-1 misses points 2 and 3, top-2 misses point 3, top-3 misses nothing; NLL is −mean log p(y)
    over all four and over the two misses."""
    assert top_k_error(PROBS, LABELS, 1) == 0.5
    assert top_k_error(PROBS, LABELS, 2) == 0.25
    assert top_k_error(PROBS, LABELS, 3) == 0.0
    np.testing.assert_allclose(nll(PROBS, LABELS), -np.mean(np.log([0.7, 0.3, 0.1, 0.8])), rtol=1e-14)
    np.testing.assert_allclose(nll_misclassified(PROBS, LABELS), -np.mean(np.log([0.3, 0.1])), rtol=1e-14)
    table = classification_table(PROBS, LABELS)
    assert table["num_misclassified"] == 2 and table["num_samples"] == 4
    assert [table[f"top{k}_error"] for k in (1, 2, 3)] == [0.5, 0.25, 0.0]


def test_ties_go_to_the_lower_class_so_top1_error_is_one_minus_accuracy():
    """Uniform probabilities: argmax is class 0, so only label-0 points count as top-1 hits."""
    probs = np.full((3, 3), 1 / 3)
    labels = np.array([0, 1, 2])
    assert top_k_error(probs, labels, 1) == pytest.approx(2 / 3)
    assert top_k_error(probs, labels, 2) == pytest.approx(1 / 3)
    metrics = classification_metrics(probs, labels)
    assert metrics["top1_error"] == pytest.approx(1 - metrics["accuracy"])


def test_perfect_and_hopeless_predictions():
    """All right: NLL 0 and no misses (NaN); a true label given probability 0: NLL is +inf, never clipped."""
    eye = np.eye(3)
    assert nll(eye, [0, 1, 2]) == 0.0 and math.isnan(nll_misclassified(eye, [0, 1, 2]))
    assert nll(eye, [1, 1, 2]) == math.inf and nll_misclassified(eye, [1, 1, 2]) == math.inf


def test_binary_probabilities_and_calibration_agree(rng=np.random.default_rng(0)):
    """p(y = 1) as a vector is the two-column table [1 − p, p]; calibration's metrics are these numbers."""
    p = rng.uniform(size=50)
    y = (rng.uniform(size=50) < p).astype(int)
    assert classification_table(p, y) == classification_table(np.stack([1 - p, p], axis=1), y)
    table, metrics = classification_table(p, y), classification_metrics(p, y)
    for key in ("top1_error", "top2_error", "nll", "nll_misclassified"):
        assert table[key] == metrics[key]


def test_bad_inputs_raise_typed_errors_naming_the_argument():
    for k in (0, 4, 1.5, True):
        with pytest.raises(InvalidArgumentError) as info:
            top_k_error(PROBS, LABELS, k)
        assert info.value.argument == "k"
    with pytest.raises(DataError) as info:
        nll(PROBS, [0, 1, 2, 3])
    assert info.value.argument == "labels"
    with pytest.raises(DataError) as info:
        nll_misclassified(PROBS * 0.5, LABELS)
    assert info.value.argument == "probs"
