"""Calibration of predictions: classification, binary (PAV) and regression.

Pure functions on NumPy arrays (or an ArviZ DataTree where ArviZ itself needs one): analysis code
receives predictions, never model objects.

* multi-class — :func:`classification_metrics` (ECE and MCE with their binning stated, NLL,
  NLL on misclassified points, Brier score, top-k error for k = 1, 2, 3 as in Dutordoir et al. 2020, Table 1,
  the last three from :mod:`gpzoo.analysis.metrics`, which also holds the input checks used here),
  :func:`reliability_curve` and :func:`reliability_figure` (reliability diagram of top-label
  confidence). ArviZ has no binned reliability diagram or ECE, so these are written here.
* binary — :func:`pav_calibration_figure` draws ArviZ's PAV-adjusted calibration plot
  (:func:`arviz_plots.plot_ppc_pava`, Dimitriadis et al. 2021) and
  :func:`pav_calibration_error` gives the matching CORP score decomposition.
* regression — :func:`regression_metrics` (Gaussian predictive NLL, RMSE, central-interval
  coverage, closed-form CRPS, PIT values), :func:`crps_from_draws` (ArviZ's sample CRPS),
  :func:`pit_figure` / :func:`ppc_pit_figure` (ArviZ PIT Δ-ECDF plots).

Conventions. Probabilities are ``probs [N, C]`` (rows sum to 1) or, for a binary problem,
``probs [N]`` = p(y = 1). Labels are integers ``0 .. C-1``. Every input check raises a typed
error from :mod:`gpzoo.models.errors` naming the argument, before any computation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpyro  # noqa: F401 - loaded before arviz_base, which the plots import (see gpzoo.analysis)
import pandas as pd
import xarray as xr
from matplotlib.figure import Figure
from scipy.optimize import isotonic_regression
from scipy.special import ndtr, ndtri

from gpzoo.analysis.display import new_figure
from gpzoo.analysis.metrics import PROB_ATOL, check_labels, check_probs, classification_table
from gpzoo.models.errors import DataError, InvalidArgumentError, ShapeError, as_float_array

__all__ = [
    "BINNINGS",
    "PROB_ATOL",
    "binary_datatree",
    "classification_metrics",
    "crps_from_draws",
    "pav_calibration_error",
    "pav_calibration_figure",
    "pit_figure",
    "ppc_pit_figure",
    "predictive_datatree",
    "regression_metrics",
    "reliability_curve",
    "reliability_figure",
]

BINNINGS = ("equal-width", "equal-mass")
OBS_DIM = "obs"
_NOT_BINARY = "PAV calibration is binary: expected p(y=1) as a 1-D array, got shape {shape}"


# ----------------------------------------------------------------------------- validation


def _check_binning(num_bins, binning: str, num_rows: int) -> int:
    if binning not in BINNINGS:
        raise InvalidArgumentError("binning", f"must be one of {BINNINGS}, got {binning!r}")
    if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 1:
        raise InvalidArgumentError("num_bins", f"must be a positive integer, got {num_bins!r}")
    if binning == "equal-mass" and num_bins > num_rows:
        raise InvalidArgumentError(
            "num_bins", f"equal-mass binning needs num_bins <= number of predictions ({num_rows}), got {num_bins}"
        )
    return int(num_bins)


# ----------------------------------------------------------------------------- multi-class


def _top_label(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-label confidence ``[N]`` and correctness ``[N]`` (argmax ties go to the lowest index)."""
    predicted = np.argmax(probs, axis=1)  # [N]
    confidence = probs[np.arange(probs.shape[0]), predicted]  # [N]
    return confidence, (predicted == labels)


def _binning_description(num_bins: int, binning: str, num_rows: int) -> str:
    if binning == "equal-width":
        return f"{num_bins} equal-width bins of top-label confidence on [0, 1], bins (lo, hi]"
    low, high = num_rows // num_bins, -(-num_rows // num_bins)
    sizes = f"{low}" if low == high else f"{low}-{high}"
    return f"{num_bins} equal-mass bins of top-label confidence ({sizes} predictions each, by rank)"


def _reliability(confidence: np.ndarray, correct: np.ndarray, num_bins: int, binning: str) -> pd.DataFrame:
    """Per-bin table from top-label ``confidence [N]`` and ``correct [N]`` (checked inputs)."""
    num_rows = confidence.shape[0]
    if binning == "equal-width":
        grid = np.linspace(0.0, 1.0, num_bins + 1)  # [B+1]
        bin_index = np.searchsorted(grid[1:-1], confidence, side="left")  # [N], bins (lo, hi]
        lower, upper = grid[:-1], grid[1:]
    else:
        # Split by rank so that counts differ by at most one, even with tied confidences.
        order = np.argsort(confidence, kind="stable")  # [N]
        sizes = np.full(num_bins, num_rows // num_bins)
        sizes[: num_rows % num_bins] += 1
        bin_index = np.empty(num_rows, dtype=np.int64)
        bin_index[order] = np.repeat(np.arange(num_bins), sizes)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        lower = confidence[order[starts]]
        upper = confidence[order[starts + sizes - 1]]
    count = np.bincount(bin_index, minlength=num_bins)  # [B]
    conf_sum = np.bincount(bin_index, weights=confidence, minlength=num_bins)
    correct_sum = np.bincount(bin_index, weights=correct.astype(np.float64), minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.where(count > 0, conf_sum / count, np.nan)
        accuracy = np.where(count > 0, correct_sum / count, np.nan)
    table = pd.DataFrame(
        {
            "lower": lower,
            "upper": upper,
            "count": count,
            "confidence": mean_conf,
            "accuracy": accuracy,
            "gap": mean_conf - accuracy,  # > 0: over-confident in this bin
        }
    )
    table.index.name = "bin"
    table.attrs["binning"] = _binning_description(num_bins, binning, num_rows)
    return table


def reliability_curve(probs, labels, num_bins: int = 15, binning: str = "equal-width") -> pd.DataFrame:
    """Reliability table of top-label confidence: one row per bin.

    Columns: ``lower``/``upper`` (bin edges for "equal-width"; smallest/largest confidence in the
    bin for "equal-mass"), ``count``, ``confidence`` (mean top-label confidence), ``accuracy``,
    ``gap = confidence - accuracy`` (positive means over-confident). Empty bins have count 0 and
    NaN means. ``table.attrs["binning"]`` states the binning in words.

    "equal-width": ``num_bins`` bins (lo, hi] on [0, 1] (Guo et al. 2017). "equal-mass": bins of
    equal count (by rank, sizes differ by at most one), Nixon et al. 2019's adaptive binning.
    """
    p = check_probs(probs)  # [N, C]
    y = check_labels(labels, p.shape[1], p.shape[0])  # [N]
    num_bins = _check_binning(num_bins, binning, p.shape[0])
    confidence, correct = _top_label(p, y)
    return _reliability(confidence, correct, num_bins, binning)


def classification_metrics(probs, labels, *, num_bins: int = 15, binning: str = "equal-width") -> dict:
    """Calibration and accuracy metrics of class probabilities ``probs [N, C]`` (or ``[N]`` binary).

    Returns a dict:
      * ``ece`` = Σ_b (n_b / N) |conf_b − acc_b| and ``mce`` = max_b |conf_b − acc_b| over the
        non-empty bins of top-label confidence; ``binning`` states how the bins were made;
      * ``nll`` = −mean log p(y_n) (``inf`` if a true label was given probability 0, never
        clipped) and ``nll_misclassified`` (same on the top-1 errors; NaN if there are none),
        as in Dutordoir et al. 2020, Table 1;
      * ``brier`` = mean Σ_c (p_c − 1[y = c])² (multi-class form: for C = 2 it is twice the
        binary score mean (p − y)²);
      * ``accuracy`` and ``top{k}_error`` for k = 1, 2, 3 with k ≤ C: the fraction of points whose
        label is not among the k largest probabilities (Dutordoir et al. 2020, §5.1), ties broken towards the
        lower class index as :func:`numpy.argmax` does, so ``top1_error = 1 − accuracy``;
      * ``num_samples``, ``num_classes``.

    ArviZ has none of these for given probabilities (``arviz_stats.metrics(kind="acc")`` scores
    predictive draws), so they are computed here.
    """
    p = check_probs(probs)  # [N, C]
    num_rows, num_classes = p.shape
    y = check_labels(labels, num_classes, num_rows)  # [N]
    num_bins = _check_binning(num_bins, binning, num_rows)

    confidence, correct = _top_label(p, y)
    table = _reliability(confidence, correct, num_bins, binning)
    filled = table[table["count"] > 0]
    abs_gap = filled["gap"].abs().to_numpy()
    ece = float(np.sum(filled["count"].to_numpy() / num_rows * abs_gap))
    mce = float(np.max(abs_gap))

    one_hot = np.eye(num_classes)[y]  # [N, C]
    table_one = classification_table(p, y)  # top-k errors and NLLs (gpzoo.analysis.metrics)

    result = {
        "ece": ece,
        "mce": mce,
        "binning": table.attrs["binning"],
        "nll": table_one["nll"],
        "nll_misclassified": table_one["nll_misclassified"],
        "brier": float(np.mean(np.sum((p - one_hot) ** 2, axis=1))),
        "accuracy": float(np.mean(correct)),
    }
    result.update({key: value for key, value in table_one.items() if key.startswith("top")})
    result["num_samples"] = num_rows
    result["num_classes"] = num_classes
    return result


def reliability_figure(
    probs, labels, *, num_bins: int = 15, binning: str = "equal-width", title: str | None = None
) -> Figure:
    """Reliability diagram of top-label confidence with the per-bin counts underneath.

    Top panel: accuracy per bin drawn as bars over each bin's extent, the mean confidence of each
    bin as a marker, and the diagonal of perfect calibration; ECE/MCE and the binning are in the
    title. Bottom panel: number of predictions per bin. ArviZ has no binned reliability diagram
    (its PAV plot is :func:`pav_calibration_figure`), so this is drawn with matplotlib; the figure
    is created without pyplot, so nothing global is touched.
    """
    table = reliability_curve(probs, labels, num_bins=num_bins, binning=binning)
    metrics = classification_metrics(probs, labels, num_bins=num_bins, binning=binning)
    filled = table[table["count"] > 0]
    if binning == "equal-width":
        left, width = table["lower"].to_numpy(), (table["upper"] - table["lower"]).to_numpy()
    else:  # contiguous bars between the midpoints of neighbouring equal-mass bins
        lower, upper = table["lower"].to_numpy(), table["upper"].to_numpy()
        edges = np.concatenate([lower[:1], (upper[:-1] + lower[1:]) / 2, upper[-1:]])  # [B+1]
        left, width = edges[:-1], np.diff(edges)

    fig = new_figure(figsize=(5.0, 6.0), layout="constrained")
    ax_rel, ax_count = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    ax_rel.bar(left, np.nan_to_num(table["accuracy"].to_numpy()), width=width, align="edge",
               edgecolor="black", alpha=0.7, label="accuracy")
    ax_rel.plot(filled["confidence"], filled["confidence"], "o", color="C3", markersize=3, label="mean confidence")
    ax_rel.plot([0, 1], [0, 1], "--", color="gray", label="perfect calibration")
    ax_rel.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy")
    ax_rel.legend(loc="upper left", fontsize="small")
    ax_rel.set_title(
        title or f"ECE {metrics['ece']:.4f}, MCE {metrics['mce']:.4f}\n{metrics['binning']}", fontsize="small"
    )
    ax_count.bar(left, table["count"].to_numpy(), width=width, align="edge", edgecolor="black", color="C0")
    ax_count.set(xlabel="top-label confidence", ylabel="count")
    return fig


# ----------------------------------------------------------------------------- DataTree helpers


def predictive_datatree(draws, observed, *, var_name: str = "y") -> xr.DataTree:
    """Minimal ArviZ DataTree (``posterior_predictive`` + ``observed_data``) from raw arrays.

    ``draws`` is ``[S, N]`` (one chain) or ``[chains, draws, N]``; ``observed`` is ``[N]``. The
    variable is ``var_name`` with observation dimension ``obs``, the same layout as
    ``analysis.datatree.to_datatree``, so every helper here accepts either. Built with
    :func:`arviz_base.from_dict`.
    """
    from arviz_base import from_dict

    draw_arr = as_float_array(draws, "draws", ndim=(2, 3))
    obs_arr = as_float_array(observed, "observed", ndim=1)
    if draw_arr.ndim == 2:
        draw_arr = draw_arr[None]  # [1, S, N]
    if draw_arr.shape[-1] != obs_arr.shape[0]:
        raise ShapeError(
            "draws", f"last axis has {draw_arr.shape[-1]} observations but observed has {obs_arr.shape[0]}"
        )
    raw_draws, raw_obs = np.asarray(draws), np.asarray(observed)
    if np.issubdtype(raw_draws.dtype, np.integer) or raw_draws.dtype == bool:
        draw_arr = draw_arr.astype(np.int64)  # keep discrete draws discrete (PAV, rootograms)
    if np.issubdtype(raw_obs.dtype, np.integer) or raw_obs.dtype == bool:
        obs_arr = obs_arr.astype(np.int64)
    return from_dict(
        {"posterior_predictive": {var_name: draw_arr}, "observed_data": {var_name: obs_arr}},
        dims={var_name: [OBS_DIM]},
    )


def binary_datatree(probs, labels, *, num_draws: int = 200, seed: int = 0, var_name: str = "y") -> xr.DataTree:
    """DataTree of Bernoulli predictive draws for binary probabilities ``probs [N]`` (= p(y=1)).

    ArviZ's PAV plot takes its forecast as the mean of predictive draws and its consistency band
    from isotonic fits of each draw. The draws are stratified: observation n gets exactly
    ``round(p_n * num_draws)`` ones, placed at random among its draws, so the forecast ArviZ sees
    differs from ``p_n`` by at most ``1 / (2 num_draws)`` and each draw is a Bernoulli replicate
    of the data.
    """
    p = check_probs(probs)  # [N, 2]
    y = check_labels(labels, 2, p.shape[0])
    if isinstance(num_draws, bool) or not isinstance(num_draws, (int, np.integer)) or num_draws < 2:
        raise InvalidArgumentError("num_draws", f"must be an integer >= 2, got {num_draws!r}")
    ones = np.rint(p[:, 1] * num_draws).astype(np.int64)  # [N]
    rows = (np.arange(num_draws)[None, :] < ones[:, None]).astype(np.int64)  # [N, S]
    draws = np.random.default_rng(seed).permuted(rows, axis=1).T  # [S, N]
    return predictive_datatree(draws, y, var_name=var_name)


def _predictive_pair(data, var_name: str) -> tuple[xr.DataArray, xr.DataArray]:
    """``(posterior_predictive[var_name], observed_data[var_name])`` of a DataTree, checked."""
    for group in ("posterior_predictive", "observed_data"):
        if group not in data.children:
            raise DataError("data", f"DataTree has no '{group}' group (has {sorted(data.children)})")
        if var_name not in data[group].data_vars:
            raise DataError("var_name", f"'{var_name}' is not a variable of '{group}' ({list(data[group].data_vars)})")
    return data["posterior_predictive"][var_name], data["observed_data"][var_name]


def _binary_tree(data, labels, var_name: str, num_draws: int, seed: int) -> xr.DataTree:
    """Accept a DataTree of 0/1 draws, or raw ``probs [N]`` + ``labels``; return a checked DataTree."""
    if isinstance(data, xr.DataTree):
        if labels is not None:
            raise InvalidArgumentError("labels", "give labels only with raw probabilities, not with a DataTree")
        predictive, observed = _predictive_pair(data, var_name)
        for name, values in (("posterior_predictive", predictive.values), ("observed_data", observed.values)):
            if not np.all(np.isin(values, (0, 1))):
                raise DataError("data", f"'{name}/{var_name}' must hold binary 0/1 values for a PAV calibration plot")
        return data
    if labels is None:
        raise InvalidArgumentError("labels", "are required when data is an array of probabilities")
    if np.ndim(data) != 1:
        raise ShapeError("probs", _NOT_BINARY.format(shape=np.shape(data)))
    return binary_datatree(data, labels, num_draws=num_draws, seed=seed, var_name=var_name)


# ----------------------------------------------------------------------------- binary (PAV)


def pav_calibration_figure(
    data, labels=None, *, var_name: str = "y", ci_prob: float | None = None, num_draws: int = 200, seed: int = 0
) -> Figure:
    """ArviZ's PAV-adjusted calibration plot (:func:`arviz_plots.plot_ppc_pava`) as a matplotlib Figure.

    ``data`` is either a DataTree with ``posterior_predictive`` (0/1 draws, dims chain, draw, obs)
    and ``observed_data`` — e.g. from ``analysis.datatree.to_datatree`` — or raw probabilities
    ``probs [N]`` = p(y=1) together with ``labels [N]``, turned into a DataTree by
    :func:`binary_datatree`. The band is ArviZ's consistency band at ``ci_prob`` (default
    ``rcParams["stats.ci_prob"]``).
    """
    from arviz_plots import plot_ppc_pava

    tree = _binary_tree(data, labels, var_name, num_draws, seed)
    collection = plot_ppc_pava(tree, var_names=var_name, ci_prob=ci_prob, backend="matplotlib")
    return collection.get_viz("figure")


def pav_calibration_error(data, labels=None, *, var_name: str = "y") -> dict:
    """CORP decomposition of the binary Brier score on the PAV calibration curve (Dimitriadis et al. 2021).

    With forecasts x_n (``probs [N]``, or the mean of a DataTree's predictive draws as ArviZ uses),
    labels y_n, the PAV fit c_n = CEP(x_n) (isotonic regression of y on x, tied forecasts pooled)
    and the base rate r = mean(y), S(·) the mean squared error against y:
      ``brier = S(x)`` (binary: mean (x − y)², half of ``classification_metrics``' multi-class
      Brier), ``mcb = S(x) − S(c)`` ≥ 0 (miscalibration), ``dsc = S(r) − S(c)`` ≥ 0
      (discrimination), ``unc = S(r)``, so that ``brier = mcb − dsc + unc``; also
      ``mean_abs_gap = mean |x − c|``, the PAV analogue of ECE without binning.

    ArviZ fits the same curve inside :func:`arviz_stats.helper_stats.isotonic_fit` (with
    :func:`scipy.optimize.isotonic_regression`) but returns only the plotted curve and band and
    does not pool tied forecasts, so the one PAV fit is repeated here with the same SciPy routine.
    """
    if isinstance(data, xr.DataTree):
        if labels is not None:
            raise InvalidArgumentError("labels", "give labels only with raw probabilities, not with a DataTree")
        _binary_tree(data, None, var_name, 2, 0)
        predictive, observed = _predictive_pair(data, var_name)
        sample_dims = [d for d in predictive.dims if d != OBS_DIM and d not in observed.dims]
        forecast = predictive.mean(sample_dims).values.ravel().astype(np.float64)  # [N]
        outcome = observed.values.ravel().astype(np.float64)  # [N]
    else:
        if labels is None:
            raise InvalidArgumentError("labels", "are required when data is an array of probabilities")
        if np.ndim(data) != 1:
            raise ShapeError("probs", _NOT_BINARY.format(shape=np.shape(data)))
        forecast = check_probs(data)[:, 1]
        outcome = check_labels(labels, 2, forecast.shape[0]).astype(np.float64)

    unique_x, inverse, counts = np.unique(forecast, return_inverse=True, return_counts=True)
    mean_y = np.bincount(inverse, weights=outcome) / counts  # [U], ties pooled
    cep = isotonic_regression(mean_y, weights=counts.astype(np.float64), increasing=True).x[inverse]  # [N]
    base_rate = outcome.mean()
    score_x = float(np.mean((forecast - outcome) ** 2))
    score_c = float(np.mean((cep - outcome) ** 2))
    score_r = float(np.mean((base_rate - outcome) ** 2))
    return {
        "brier": score_x,
        "mcb": score_x - score_c,
        "dsc": score_r - score_c,
        "unc": score_r,
        "mean_abs_gap": float(np.mean(np.abs(forecast - cep))),
    }


# ----------------------------------------------------------------------------- regression


def _check_gaussian(y, mean, var) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Flattened float64 ``y, mean, var`` of equal shape, ``var > 0``."""
    y_arr = as_float_array(y, "y").astype(np.float64)
    mean_arr = as_float_array(mean, "mean").astype(np.float64)
    var_arr = as_float_array(var, "var").astype(np.float64)
    for name, arr in (("mean", mean_arr), ("var", var_arr)):
        if arr.shape != y_arr.shape:
            raise ShapeError(name, f"must have the shape of y {y_arr.shape}, got {arr.shape}")
    if y_arr.size == 0:
        raise ShapeError("y", "needs at least one observation, got 0")
    if np.any(var_arr <= 0):
        raise DataError("var", f"predictive variances must be positive; smallest is {var_arr.min():.6g}")
    return y_arr.ravel(), mean_arr.ravel(), var_arr.ravel()


def _gaussian_pit(y: np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    return ndtr((y - mean) / np.sqrt(var))  # Φ(z), [N]


def regression_metrics(y, mean, var, *, levels: Sequence[float] = (0.5, 0.8, 0.9, 0.95)) -> dict:
    """Scores of a Gaussian predictive N(mean, var) for observations ``y`` (arrays of one shape).

    Returns a dict:
      * ``nll`` = mean ½ log(2π σ²) + (y − μ)² / (2σ²); ``rmse`` of the predictive mean;
      * ``coverage``: {level: fraction of y inside the central interval μ ± Φ⁻¹((1+level)/2) σ};
      * ``crps`` = mean σ [z (2Φ(z) − 1) + 2φ(z) − 1/√π], z = (y − μ)/σ, the closed form for a
        Gaussian (Gneiting et al. 2005, eq. 5); lower is better. (ArviZ's sample CRPS,
        :func:`crps_from_draws`, estimates the same from draws and is negated there.)
      * ``pit_values [N]`` = Φ(z), uniform on [0, 1] when the predictive is calibrated;
      * ``num_samples``.

    ArviZ scores predictive draws rather than closed-form moments (``arviz_stats.metrics``,
    ``loo_score``), and the Gaussian moments give these exactly, so they are computed here.
    """
    y_arr, mean_arr, var_arr = _check_gaussian(y, mean, var)
    level_arr = np.asarray(levels, dtype=np.float64).ravel()
    if level_arr.size == 0 or np.any(~np.isfinite(level_arr)) or np.any(level_arr <= 0) or np.any(level_arr >= 1):
        raise InvalidArgumentError("levels", f"must be probabilities strictly inside (0, 1), got {list(levels)}")
    std = np.sqrt(var_arr)
    z = (y_arr - mean_arr) / std  # [N]
    pdf = np.exp(-0.5 * z**2) / math.sqrt(2 * math.pi)
    cdf = ndtr(z)
    half_widths = ndtri((1 + level_arr) / 2)  # [L], in units of σ
    return {
        "nll": float(np.mean(0.5 * np.log(2 * np.pi * var_arr) + 0.5 * z**2)),
        "rmse": float(np.sqrt(np.mean((y_arr - mean_arr) ** 2))),
        "coverage": {float(level): float(np.mean(np.abs(z) <= h)) for level, h in zip(level_arr, half_widths)},
        "crps": float(np.mean(std * (z * (2 * cdf - 1) + 2 * pdf - 1 / math.sqrt(math.pi)))),
        "pit_values": cdf,
        "num_samples": int(y_arr.size),
    }


def crps_from_draws(y, draws, *, pointwise: bool = False):
    """Sample CRPS of predictive ``draws`` (``[S, N]`` or ``[chains, draws, N]``) at observations ``y [N]``.

    Uses ArviZ's probability-weighted-moment CRPS estimator
    (``arviz_stats.base.array_stats.loo_score``, the kernel of :func:`arviz_stats.loo_score`)
    with uniform weights, i.e. plain draws rather than PSIS-LOO, and flips its sign back so that
    lower is better, as ``regression_metrics``' closed form. For predictives that are not
    Gaussian (mixtures from deep GPs, Poisson counts). Returns the mean, or ``[N]`` if
    ``pointwise``.
    """
    from arviz_stats.base import array_stats

    y_arr = as_float_array(y, "y", ndim=1).astype(np.float64)
    draw_arr = as_float_array(draws, "draws", ndim=(2, 3)).astype(np.float64)
    if draw_arr.ndim == 2:
        draw_arr = draw_arr[None]  # [1, S, N]
    if draw_arr.shape[-1] != y_arr.shape[0]:
        raise ShapeError("draws", f"last axis has {draw_arr.shape[-1]} observations but y has {y_arr.shape[0]}")
    samples = np.moveaxis(draw_arr, -1, 0)  # [N, chains, S]
    scores = -np.asarray(array_stats.loo_score(samples, y_arr, np.zeros_like(samples), kind="crps"))  # [N]
    return scores if pointwise else float(np.mean(scores))


def pit_figure(y, mean, var, *, coverage: bool = False, method: str = "pot_c") -> Figure:
    """PIT Δ-ECDF of a Gaussian predictive with ArviZ's uniformity test, as a matplotlib Figure.

    The PIT values Φ((y − μ)/σ) are exact here, so they go straight to
    :func:`arviz_plots.plot_ecdf_pit` (``method`` is its uniformity test, default "pot_c"; its
    p-value is printed on the plot). ``coverage=True`` plots central-interval coverage instead.
    For predictive draws in a DataTree use :func:`ppc_pit_figure`.
    """
    from arviz_plots import plot_ecdf_pit

    pit = _gaussian_pit(*_check_gaussian(y, mean, var))
    tree = xr.DataTree.from_dict({"pit": xr.Dataset({"y": ((OBS_DIM,), pit)})})
    collection = plot_ecdf_pit(
        tree, group="pit", sample_dims=[OBS_DIM], method=method, coverage=coverage, backend="matplotlib"
    )
    return collection.get_viz("figure")


def ppc_pit_figure(data: xr.DataTree, *, var_name: str = "y", coverage: bool = False, method: str = "pot_c") -> Figure:
    """ArviZ's posterior-predictive PIT Δ-ECDF (:func:`arviz_plots.plot_ppc_pit`) as a matplotlib Figure.

    ``data`` has ``posterior_predictive`` draws and ``observed_data`` (e.g. from
    ``analysis.datatree.to_datatree`` or :func:`predictive_datatree`).
    """
    from arviz_plots import plot_ppc_pit

    if not isinstance(data, xr.DataTree):
        raise InvalidArgumentError("data", f"must be an xarray DataTree, got {type(data).__name__}")
    _predictive_pair(data, var_name)
    collection = plot_ppc_pit(data, var_names=var_name, method=method, coverage=coverage, backend="matplotlib")
    return collection.get_viz("figure")
