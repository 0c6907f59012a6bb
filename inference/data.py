"""Training data as every fitter sees it: eager validation, minibatch schedules, row chunks.

``validate_data`` is the one place where X and y are checked against a spec (typed errors naming
the argument, before any tracing) and cast to :func:`~gpzoo.inference.linalg.float_dtype`.
Minibatches are a pure function of (seed, step) (:class:`BatchSchedule`), so a resumed fit sees
exactly the batches of the uninterrupted one.
"""

from __future__ import annotations

import hashlib

import numpy as np

from gpzoo.inference.linalg import float_dtype
from gpzoo.models.errors import ShapeError, as_float_array

__all__ = ["BatchSchedule", "check_new_inputs", "data_fingerprint", "num_latent_functions", "row_slices", "validate_data"]


def validate_data(spec, X, y):
    """Eager checks of X ``[N, D]`` and y against ``spec``; returns NumPy arrays (X float, y as targets)."""
    X = as_float_array(X, "X", ndim=2)
    y = spec.likelihood.validate_targets(y)
    if y.shape[0] != X.shape[0]:
        raise ShapeError("y", f"has {y.shape[0]} rows but X has {X.shape[0]}")
    if X.shape[0] == 0:
        raise ShapeError("X", "is empty")
    check = getattr(spec.kernel, "validate_inputs", None)
    if check is not None:
        check(X)
    return X.astype(float_dtype()), y


def check_new_inputs(res, X, argument: str = "X_new") -> np.ndarray:
    """Eager checks of inputs ``X`` ``[N, D]`` for the fitted model ``res`` (same width D, kernel's own checks)."""
    X = as_float_array(X, argument, ndim=2)
    if X.shape[0] == 0:
        raise ShapeError(argument, f"is empty (shape {X.shape}); pass at least one row")
    if X.shape[1] != res.X_train.shape[1]:
        raise ShapeError(argument, f"has {X.shape[1]} columns; the model was fitted on {res.X_train.shape[1]}")
    check = getattr(res.spec.kernel, "validate_inputs", None)
    if check is not None:
        check(X)
    return X.astype(float_dtype())


def data_fingerprint(X, y) -> str:
    """SHA-256 (hex) of the training data: shapes, dtypes and bytes of X and y.

    A checkpoint records it, and resuming on other data (even of the same shape) is refused.
    """
    digest = hashlib.sha256()
    for array in (X, y):
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.data)
    return digest.hexdigest()


def num_latent_functions(spec) -> int:
    """L, the number of latent functions of ``spec``'s likelihood (one per class where it needs them)."""
    return spec.likelihood.num_latent(getattr(spec.likelihood, "num_classes", None))


def row_slices(num_rows: int, size: int):
    """Consecutive slices of at most ``size`` rows covering ``range(num_rows)``."""
    for start in range(0, num_rows, size):
        yield slice(start, min(num_rows, start + size))


class BatchSchedule:
    """Minibatch indices ``[B]`` as a pure function of the step: epoch-wise permutations (no replacement)."""

    def __init__(self, num_data: int, batch_size: int, seed: int):
        self.N, self.B, self.seed = num_data, batch_size, seed
        self.per_epoch = max(1, num_data // batch_size)
        self._epoch, self._perm = -1, None

    def __call__(self, step: int) -> np.ndarray:
        if self.B == self.N:
            return np.arange(self.N)
        epoch, pos = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.N)
        return self._perm[pos * self.B : (pos + 1) * self.B]
