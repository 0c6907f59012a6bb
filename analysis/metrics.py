"""Classification metrics of Dutordoir et al. 2020, Table 1: top-k error and negative log-likelihood.

Pure NumPy on given class probabilities ``probs [N, C]`` (rows sum to 1; a 1-D ``probs [N]`` is
p(y = 1) of a binary problem) and integer labels ``0 .. C−1``; analysis code receives predictions,
never model objects. Every input check raises a typed error from :mod:`gpzoo.models.errors`
naming the argument, before any computation. The checks here are the ones
:mod:`gpzoo.analysis.calibration` uses too.

* :func:`top_k_error` — the fraction of points whose true label is not among the k largest
  probabilities (Dutordoir et al. 2020, §5.1); ties are broken towards the lower class index, as
  :func:`numpy.argmax` breaks them, so the top-1 error is 1 − accuracy also under ties;
* :func:`nll` — −mean_n log p(y_n), natural log, on all points; ``inf`` when a true label got
  probability 0 (never clipped: a confident miss is the failure the metric exists to show);
* :func:`nll_misclassified` — the same on the top-1 errors only ("NLL misses"); NaN if there are none;
* :func:`classification_table` — all of them for k = 1, 2, 3 (k ≤ C), as the columns of Table 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gpzoo.models.errors import DataError, InvalidArgumentError, ShapeError, as_float_array

__all__ = ["PROB_ATOL", "TABLE_ONE_KS", "check_labels", "check_probs", "classification_table", "label_rank", "nll",
           "nll_misclassified", "top_k_error"]

PROB_ATOL = 1e-4  # tolerance on probabilities leaving [0, 1] and on rows summing to 1 (float32 softmax)
#: The k of the top-k errors in Dutordoir et al. 2020, Table 1.
TABLE_ONE_KS = (1, 2, 3)


# ----------------------------------------------------------------------------- validation
def check_probs(probs, argument: str = "probs") -> np.ndarray:
    """Return float64 class probabilities ``[N, C]``; a 1-D input is p(y=1) of a binary problem."""
    arr = as_float_array(probs, argument, ndim=(1, 2)).astype(np.float64)
    if arr.shape[0] == 0:
        raise ShapeError(argument, "needs at least one row (prediction), got 0")
    if np.any(arr < -PROB_ATOL) or np.any(arr > 1 + PROB_ATOL):
        raise DataError(
            argument, f"probabilities must lie in [0, 1]; found values in [{arr.min():.6g}, {arr.max():.6g}]"
        )
    arr = np.clip(arr, 0.0, 1.0)
    if arr.ndim == 1:
        return np.stack([1.0 - arr, arr], axis=1)  # [N, 2]
    if arr.shape[1] < 2:
        raise ShapeError(argument, f"needs at least 2 class columns, got shape {arr.shape}")
    row_sums = arr.sum(axis=1)  # [N]
    worst = int(np.argmax(np.abs(row_sums - 1.0)))
    if abs(row_sums[worst] - 1.0) > PROB_ATOL:
        raise DataError(
            argument, f"each row must sum to 1 (tolerance {PROB_ATOL}); row {worst} sums to {row_sums[worst]:.6g}"
        )
    return arr


def check_labels(labels, num_classes: int, num_rows: int, argument: str = "labels") -> np.ndarray:
    """Return int64 labels ``[N]`` in ``0 .. num_classes-1``, matching ``num_rows``."""
    arr = np.asarray(labels)
    if arr.ndim != 1:
        raise ShapeError(argument, f"expected a 1-D array of class labels, got shape {arr.shape}")
    if arr.shape[0] != num_rows:
        raise ShapeError(argument, f"has {arr.shape[0]} labels but there are {num_rows} predictions")
    if arr.dtype == bool:
        arr = arr.astype(np.int64)
    if not np.issubdtype(arr.dtype, np.number):
        raise DataError(argument, f"must be integer class labels, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise DataError(argument, "must be integer class labels; found non-integer or NaN values")
    arr = arr.astype(np.int64)
    if np.any(arr < 0) or np.any(arr >= num_classes):
        raise DataError(
            argument,
            f"labels must lie in 0 .. {num_classes - 1} (number of classes); found {arr.min()} .. {arr.max()}",
        )
    return arr


def _checked(probs, labels) -> tuple[np.ndarray, np.ndarray]:
    p = check_probs(probs)  # [N, C]
    return p, check_labels(labels, p.shape[1], p.shape[0])


def _check_k(k, num_classes: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= num_classes:
        raise InvalidArgumentError("k", f"must be an integer from 1 to the number of classes ({num_classes}), got {k!r}")
    return int(k)


# ----------------------------------------------------------------------------- metrics on checked arrays
def label_rank(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Position ``[N]`` of the true label in the stable descending order of checked ``probs`` ``[N, C]``.

    Rank 0 means the label is the argmax; ties are broken towards the lower class index, exactly
    as :func:`numpy.argmax`, so ``top-1 error == 1 - accuracy`` also under ties.
    """
    p_true = probs[np.arange(probs.shape[0]), labels][:, None]  # [N, 1]
    class_index = np.arange(probs.shape[1])[None, :]  # [1, C]
    ahead = (probs > p_true) | ((probs == p_true) & (class_index < labels[:, None]))  # [N, C]
    return ahead.sum(axis=1)


def _log_p_true(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(probs[np.arange(probs.shape[0]), labels])  # [N]


# ----------------------------------------------------------------------------- public metrics
def top_k_error(probs, labels, k: int = 1) -> float:
    """Fraction of points whose label is not among the ``k`` largest probabilities (module docstring)."""
    p, y = _checked(probs, labels)
    return float(np.mean(label_rank(p, y) >= _check_k(k, p.shape[1])))


def nll(probs, labels) -> float:
    """−mean_n log p(y_n) over all points (``inf`` if a true label has probability 0)."""
    p, y = _checked(probs, labels)
    return float(-np.mean(_log_p_true(p, y)))


def nll_misclassified(probs, labels) -> float:
    """−mean log p(y_n) over the top-1 errors only; NaN when every point is classified correctly."""
    p, y = _checked(probs, labels)
    missed = label_rank(p, y) >= 1  # [N]
    return float(-np.mean(_log_p_true(p, y)[missed])) if missed.any() else math.nan


def classification_table(probs, labels, ks: Sequence[int] | None = None) -> dict:
    """Dutordoir et al. 2020, Table 1 for one model: ``top{k}_error`` for each k in ``ks`` (default
    1, 2, 3, those ≤ C), ``nll``, ``nll_misclassified``, ``num_misclassified`` and ``num_samples``.
    Errors are fractions (the paper prints percentages, and NLL × 10 on all points)."""
    p, y = _checked(probs, labels)
    num_classes = p.shape[1]
    ks = tuple(k for k in TABLE_ONE_KS if k <= num_classes) if ks is None else tuple(_check_k(k, num_classes) for k in ks)
    rank = label_rank(p, y)  # [N]
    log_p = _log_p_true(p, y)  # [N]
    missed = rank >= 1
    table = {f"top{k}_error": float(np.mean(rank >= k)) for k in ks}
    table.update(nll=float(-np.mean(log_p)), nll_misclassified=float(-np.mean(log_p[missed])) if missed.any() else math.nan,
                 num_misclassified=int(missed.sum()), num_samples=int(p.shape[0]))
    return table
