"""Calibration metrics and figures (analysis/calibration.py): each test states one fact."""

import math

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
import xarray as xr
from matplotlib.figure import Figure
from scipy import stats

from gpzoo.analysis import calibration as cal
from gpzoo.models.errors import DataError, InvalidArgumentError, ShapeError

NUM_CLASSES = 10
N_LARGE = 200_000


def top_label_predictions(rng, confidence, p_correct, num_classes=NUM_CLASSES):
    """Probabilities with top-label confidence ``confidence [N]`` (rest spread evenly), labels
    equal to the top class with probability ``p_correct [N]``, else uniform over the others."""
    n = confidence.shape[0]
    top = rng.integers(num_classes, size=n)
    probs = np.repeat(((1 - confidence) / (num_classes - 1))[:, None], num_classes, axis=1)
    probs[np.arange(n), top] = confidence
    other = (top + rng.integers(1, num_classes, size=n)) % num_classes
    labels = np.where(rng.uniform(size=n) < p_correct, top, other)
    return probs, labels


def noise_floor(probs, labels, binning):
    """Expected ECE of a perfectly calibrated model from sampling noise alone:
    Σ_b (n_b/N) E|N(0, v_b/n_b)| with v_b the mean Bernoulli variance c(1-c) in bin b."""
    table = cal.reliability_curve(probs, labels, binning=binning)
    conf = probs.max(axis=1)
    n = conf.shape[0]
    filled = table[table["count"] > 0]
    v = filled["confidence"] * (1 - filled["confidence"])  # upper bound on mean c(1-c) by Jensen
    return float(math.sqrt(2 / math.pi) * np.sum(np.sqrt(filled["count"] * v)) / n)


# ----------------------------------------------------------------------------- ECE / MCE


@pytest.mark.parametrize("binning", cal.BINNINGS)
def test_calibrated_predictions_have_ece_at_the_sampling_noise_floor(binning):
    rng = np.random.default_rng(0)
    confidence = rng.uniform(0.2, 1.0, size=N_LARGE)
    probs, labels = top_label_predictions(rng, confidence, p_correct=confidence)
    floor = noise_floor(probs, labels, binning)
    ece = cal.classification_metrics(probs, labels, binning=binning)["ece"]
    assert floor < 0.004  # the test can tell calibrated (≈ floor) from the 1/6 below
    assert ece < 3 * floor


@pytest.mark.parametrize("binning", cal.BINNINGS)
def test_over_confident_predictions_have_the_analytic_ece(binning):
    # Reported confidence c ~ U(1/2, 1) is sqrt-sharpened: the true accuracy is c². As c - c² > 0
    # in every bin, ECE = E[c - c²] = 3/4 - 7/12 = 1/6 whatever the binning.
    rng = np.random.default_rng(1)
    confidence = rng.uniform(0.5, 1.0, size=N_LARGE)
    probs, labels = top_label_predictions(rng, confidence, p_correct=confidence**2)
    metrics = cal.classification_metrics(probs, labels, binning=binning)
    tolerance = 5 * math.sqrt(0.25 / N_LARGE)  # 5 sd of a mean of N Bernoulli outcomes
    assert metrics["ece"] == pytest.approx(1 / 6, abs=tolerance)
    if binning == "equal-width":
        # Largest gap in the lowest occupied bin c ∈ (1/2, 8/15]: E[c] - E[c²] under U(a, b).
        a, b = 0.5, 8 / 15
        expected_mce = (a + b) / 2 - (a * a + a * b + b * b) / 3
        assert metrics["mce"] == pytest.approx(expected_mce, abs=5 * math.sqrt(0.25 / (N_LARGE / 15)))


def test_mce_is_at_least_ece_and_binning_is_stated():
    rng = np.random.default_rng(2)
    probs = rng.dirichlet(np.ones(4), size=500)
    labels = rng.integers(4, size=500)
    for binning in cal.BINNINGS:
        metrics = cal.classification_metrics(probs, labels, num_bins=10, binning=binning)
        assert metrics["mce"] >= metrics["ece"] > 0
        assert metrics["binning"].startswith(f"10 {binning} bins of top-label confidence")


def test_equal_mass_bins_have_equal_counts_even_with_tied_confidences():
    rng = np.random.default_rng(3)
    confidence = np.round(rng.uniform(0.5, 1.0, size=150), 1)  # only six distinct values
    probs = np.stack([confidence, 1 - confidence], axis=1)
    labels = rng.integers(2, size=150)
    table = cal.reliability_curve(probs, labels, num_bins=15, binning="equal-mass")
    assert table["count"].tolist() == [10] * 15
    assert np.all(np.diff(table["lower"]) >= 0)


def test_hand_computed_three_sample_example():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.62, 0.28], [0.2, 0.5, 0.3]])
    labels = np.array([0, 2, 1])  # correct, wrong (true label ranked 2nd), correct
    m = cal.classification_metrics(probs, labels)
    assert m["nll"] == pytest.approx(-(math.log(0.7) + math.log(0.28) + math.log(0.5)) / 3)
    assert m["nll_misclassified"] == pytest.approx(-math.log(0.28))
    brier_rows = [0.3**2 + 0.2**2 + 0.1**2, 0.1**2 + 0.62**2 + 0.72**2, 0.2**2 + 0.5**2 + 0.3**2]
    assert m["brier"] == pytest.approx(np.mean(brier_rows))
    assert (m["top1_error"], m["top2_error"], m["top3_error"]) == pytest.approx((1 / 3, 0, 0))
    assert m["accuracy"] == pytest.approx(2 / 3)
    # Each point alone in its 15-bin: gaps |0.7 - 1|, |0.62 - 0|, |0.5 - 1|.
    assert m["ece"] == pytest.approx((0.3 + 0.62 + 0.5) / 3)
    assert m["mce"] == pytest.approx(0.62)


def test_ece_weights_bins_by_count_and_bins_are_right_closed():
    # Three predictions at 0.9 (2 correct) and one at 0.55 (correct): gaps 0.9 - 2/3 and 0.45.
    probs = np.array([0.9, 0.9, 0.1, 0.55])  # p(y=1); top-label confidences 0.9, 0.9, 0.9, 0.55
    labels = np.array([1, 1, 1, 1])
    m = cal.classification_metrics(probs, labels)
    assert m["ece"] == pytest.approx((3 * (0.9 - 2 / 3) + 0.45) / 4)
    assert m["mce"] == pytest.approx(0.45)
    # With 4 bins the edges 0.5 and 0.75 are exact: bins are (lo, hi].
    table = cal.reliability_curve(np.array([0.75, 0.5]), np.array([1, 0]), num_bins=4)
    assert table["count"].tolist() == [0, 1, 1, 0]


def test_top_k_error_is_non_increasing_and_zero_at_k_equal_c():
    rng = np.random.default_rng(4)
    for num_classes in (2, 3, 5):
        probs = rng.dirichlet(np.ones(num_classes), size=300)
        labels = rng.integers(num_classes, size=300)
        m = cal.classification_metrics(probs, labels)
        errors = [m[f"top{k}_error"] for k in range(1, min(3, num_classes) + 1)]
        assert all(a >= b for a, b in zip(errors, errors[1:]))
        assert m["top1_error"] == pytest.approx(1 - m["accuracy"])
        assert ("top3_error" in m) == (num_classes >= 3)
        if num_classes <= 3:
            assert m[f"top{num_classes}_error"] == 0


def test_top1_error_equals_one_minus_accuracy_under_ties():
    probs = np.array([[1 / 3, 1 / 3, 1 / 3], [0.4, 0.4, 0.2]])
    labels = np.array([1, 0])  # argmax picks class 0 in both rows
    m = cal.classification_metrics(probs, labels)
    assert m["accuracy"] == 0.5
    assert m["top1_error"] == 0.5
    assert m["top2_error"] == 0.0


def test_binary_probabilities_as_vector_equal_two_column_form():
    rng = np.random.default_rng(5)
    p = rng.uniform(size=400)
    y = (rng.uniform(size=400) < p).astype(int)
    assert cal.classification_metrics(p, y) == cal.classification_metrics(np.stack([1 - p, p], 1), y)


# ----------------------------------------------------------------------------- input checks


@pytest.mark.parametrize(
    "probs, labels, error, argument",
    [
        (np.array([[0.5, 0.6], [0.5, 0.5]]), [0, 1], DataError, "probs"),  # row sums to 1.1
        (np.array([[1.2, -0.2], [0.5, 0.5]]), [0, 1], DataError, "probs"),  # outside [0, 1]
        (np.array([0.2, np.nan]), [0, 1], DataError, "probs"),
        (np.array([[0.5, 0.5], [0.5, 0.5]]), [0, 2], DataError, "labels"),  # label >= C
        (np.array([[0.5, 0.5], [0.5, 0.5]]), [0, 0.5], DataError, "labels"),
        (np.array([[0.5, 0.5], [0.5, 0.5]]), [0, 1, 1], ShapeError, "labels"),  # length mismatch
        (np.ones((2, 1)), [0, 0], ShapeError, "probs"),
    ],
)
def test_bad_classification_input_raises_a_typed_error_naming_the_argument(probs, labels, error, argument):
    with pytest.raises(error) as info:
        cal.classification_metrics(probs, labels)
    assert info.value.argument == argument


def test_bad_binning_and_regression_input_raise_typed_errors():
    probs, labels = np.array([[0.6, 0.4]] * 3), [0, 1, 0]
    with pytest.raises(InvalidArgumentError, match="binning"):
        cal.reliability_curve(probs, labels, binning="quantile")
    with pytest.raises(InvalidArgumentError, match="num_bins"):
        cal.reliability_curve(probs, labels, num_bins=4, binning="equal-mass")
    with pytest.raises(DataError) as info:
        cal.regression_metrics([0.0, 1.0], [0.0, 1.0], [1.0, 0.0])
    assert info.value.argument == "var"
    with pytest.raises(ShapeError) as info:
        cal.regression_metrics([0.0, 1.0], [0.0], [1.0, 1.0])
    assert info.value.argument == "mean"


# ----------------------------------------------------------------------------- regression


def gaussian_regression(rng, n, var_scale=1.0):
    mean = rng.normal(size=n)
    var = rng.uniform(0.2, 2.0, size=n)
    y = mean + np.sqrt(var) * rng.normal(size=n)
    return y, mean, var * var_scale


def test_coverage_of_a_correct_gaussian_predictive_is_nominal_and_wider_one_over_covers():
    rng = np.random.default_rng(6)
    n = 20_000
    levels = (0.5, 0.8, 0.9, 0.95)
    coverage = cal.regression_metrics(*gaussian_regression(rng, n), levels=levels)["coverage"]
    too_wide = cal.regression_metrics(*gaussian_regression(rng, n, var_scale=4.0), levels=levels)["coverage"]
    for level in levels:
        sd = math.sqrt(level * (1 - level) / n)
        assert coverage[level] == pytest.approx(level, abs=4 * sd)
        assert too_wide[level] > level + 4 * sd


def test_nll_and_rmse_match_scipy():
    rng = np.random.default_rng(7)
    y, mean, var = gaussian_regression(rng, 50)
    m = cal.regression_metrics(y, mean, var)
    assert m["nll"] == pytest.approx(-np.mean(stats.norm.logpdf(y, mean, np.sqrt(var))))
    assert m["rmse"] == pytest.approx(np.sqrt(np.mean((y - mean) ** 2)))


def test_closed_form_crps_matches_monte_carlo_and_arviz_sample_crps():
    # CRPS(F, y) = E|X - y| - ½ E|X - X'| for X, X' ~ F independent (Gneiting & Raftery 2007).
    rng = np.random.default_rng(8)
    y = np.array([0.0, 1.5, -2.0, 0.3])
    mean = np.array([0.0, 0.5, 1.0, 0.3])
    std = np.array([1.0, 0.5, 2.0, 3.0])
    num_draws = 200_000
    x = mean + std * rng.normal(size=(num_draws, 4))  # [S, N]
    x_prime = mean + std * rng.normal(size=(num_draws, 4))
    monte_carlo = np.mean(np.abs(x - y), axis=0) - 0.5 * np.mean(np.abs(x - x_prime), axis=0)  # [N]
    closed = [cal.regression_metrics(y[i : i + 1], mean[i : i + 1], std[i : i + 1] ** 2)["crps"] for i in range(4)]
    np.testing.assert_allclose(closed, monte_carlo, atol=0.01 * std.max())
    # At z = 0 the closed form is σ (√2 - 1) / √π.
    assert closed[0] == pytest.approx((math.sqrt(2) - 1) / math.sqrt(math.pi))
    arviz = cal.crps_from_draws(y, x[:20_000], pointwise=True)
    np.testing.assert_allclose(arviz, closed, atol=0.02 * std.max())


def test_pit_of_correct_model_is_uniform_and_of_overdispersed_model_is_not():
    rng = np.random.default_rng(9)
    pit = cal.regression_metrics(*gaussian_regression(rng, 5_000))["pit_values"]
    bad = cal.regression_metrics(*gaussian_regression(rng, 5_000, var_scale=4.0))["pit_values"]
    assert stats.kstest(pit, "uniform").pvalue > 1e-3
    assert stats.kstest(bad, "uniform").pvalue < 1e-3


# ----------------------------------------------------------------------------- PAV (binary)


def test_binary_datatree_forecast_is_within_half_a_draw_of_the_probability():
    rng = np.random.default_rng(10)
    p = rng.uniform(size=300)
    y = (rng.uniform(size=300) < p).astype(int)
    tree = cal.binary_datatree(p, y, num_draws=50)
    draws = tree["posterior_predictive"]["y"]
    assert draws.dims == ("chain", "draw", "obs")
    assert np.max(np.abs(draws.mean(("chain", "draw")).values - p)) <= 1 / (2 * 50) + 1e-12
    np.testing.assert_array_equal(tree["observed_data"]["y"].values, y)


def test_pav_decomposition_is_exact_and_separates_calibrated_from_over_confident():
    rng = np.random.default_rng(11)
    n = 20_000
    q = rng.uniform(size=n)
    y = (rng.uniform(size=n) < q).astype(int)
    sharpened = q**3 / (q**3 + (1 - q) ** 3)  # same ranking, over-confident
    good = cal.pav_calibration_error(q, y)
    bad = cal.pav_calibration_error(sharpened, y)
    for r in (good, bad):
        assert r["brier"] == pytest.approx(r["mcb"] - r["dsc"] + r["unc"])
        assert r["mcb"] >= 0 and r["dsc"] >= 0
    # Same ranking -> same PAV fit -> same discrimination; only miscalibration differs.
    assert bad["dsc"] == pytest.approx(good["dsc"])
    assert good["mcb"] < 0.002 < 0.02 < bad["mcb"]
    assert good["mean_abs_gap"] < bad["mean_abs_gap"]
    # Binary Brier is half the multi-class Brier of classification_metrics.
    assert 2 * good["brier"] == pytest.approx(cal.classification_metrics(q, y)["brier"])


def test_pav_error_from_datatree_matches_the_array_form():
    rng = np.random.default_rng(12)
    p = rng.uniform(size=2_000)
    y = (rng.uniform(size=2_000) < p).astype(int)
    from_tree = cal.pav_calibration_error(cal.binary_datatree(p, y, num_draws=1_000))
    from_arrays = cal.pav_calibration_error(p, y)
    for key in from_arrays:
        assert from_tree[key] == pytest.approx(from_arrays[key], abs=2e-3)


def test_pav_figure_runs_from_arrays_and_from_a_predictive_datatree():
    rng = np.random.default_rng(13)
    p = rng.uniform(size=200)
    y = (rng.uniform(size=200) < p).astype(int)
    draws = (rng.uniform(size=(2, 40, 200)) < p).astype(int)  # [chain, draw, obs]
    tree = cal.predictive_datatree(draws, y)
    for fig in (cal.pav_calibration_figure(p, y, num_draws=40), cal.pav_calibration_figure(tree)):
        assert isinstance(fig, Figure) and len(fig.axes) >= 1


def test_pav_rejects_non_binary_or_incomplete_datatrees():
    rng = np.random.default_rng(14)
    tree = cal.predictive_datatree(rng.normal(size=(1, 10, 20)), rng.normal(size=20))
    with pytest.raises(DataError, match="binary"):
        cal.pav_calibration_figure(tree)
    no_observed = xr.DataTree.from_dict({"posterior_predictive": tree["posterior_predictive"].to_dataset()})
    with pytest.raises(DataError, match="observed_data"):
        cal.pav_calibration_error(no_observed)


# ----------------------------------------------------------------------------- figures


@pytest.mark.parametrize("binning", cal.BINNINGS)
def test_reliability_figure_has_diagram_and_count_panels(binning):
    rng = np.random.default_rng(15)
    probs = rng.dirichlet(np.ones(5), size=300)
    labels = rng.integers(5, size=300)
    fig = cal.reliability_figure(probs, labels, num_bins=10, binning=binning)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    heights = [patch.get_height() for patch in fig.axes[1].patches]
    assert sum(heights) == 300


def test_pit_figures_run_from_gaussian_moments_and_from_draws():
    rng = np.random.default_rng(16)
    y, mean, var = gaussian_regression(rng, 200)
    assert isinstance(cal.pit_figure(y, mean, var), Figure)
    assert isinstance(cal.pit_figure(y, mean, var, coverage=True), Figure)
    draws = mean + np.sqrt(var) * rng.normal(size=(2, 50, 200))
    assert isinstance(cal.ppc_pit_figure(cal.predictive_datatree(draws, y)), Figure)
