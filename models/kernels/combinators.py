"""Kernels built from other kernels and known functions (Duvenaud 2014, §1.5, §1.9, §1.10).

* ``ChangePoint`` / ``ChangeWindow``: sigmoid-weighted switches between two kernels
  (Duvenaud 2014, eq. 1.19–1.20 and the change-window paragraph after it).
* ``FunctionScaled``: multiplication by a known function, a(x) k(x, y) a(y) (Duvenaud 2014, eq. 1.21).
* ``Categorical``: SE-ARD on the one-of-k encoding of an integer-coded column (Duvenaud 2014, eq. 1.51).
* ``Coregionalization``: multi-output kernel k(x, y) · B[i, i'] (Duvenaud 2014, eq. 1.52).

All of them are "multiply by a(x) a(y), then add" constructions, so they stay positive
semi-definite whatever their hyperparameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import constraints

from gpzoo.models.errors import DataError, HyperparameterError, ShapeError, is_concrete
from gpzoo.models.kernels.base import Kernel, hyper, kernel_class, static
from gpzoo.models.kernels.stationary import scaled_sqdist

__all__ = ["Categorical", "ChangePoint", "ChangeWindow", "Coregionalization", "FunctionScaled"]


def _check_kernel(value, argument: str) -> None:
    if not isinstance(value, Kernel):
        raise HyperparameterError(argument, f"must be a Kernel, got {type(value).__name__}")


def _check_column(X, column: int, argument: str) -> None:
    if X.ndim != 2 or not -X.shape[1] <= column < X.shape[1]:
        raise ShapeError(argument, f"needs a 2-D input with a column {column}, got shape {X.shape}")


def _switch(k_on: Kernel, k_off: Kernel, w_x, w_y, X, Y):
    """w(x) k_on(x, y) w(y) + (1 − w(x)) k_off(x, y) (1 − w(y)) (Duvenaud 2014, eq. 1.19), ``[N, M]``."""
    on = w_x[:, None] * k_on.K(X, Y) * w_y[None, :]  # [N, M]
    off = (1.0 - w_x)[:, None] * k_off.K(X, Y) * (1.0 - w_y)[None, :]  # [N, M]
    return on + off


def _switch_diag(k_on: Kernel, k_off: Kernel, w_x, X):
    return w_x**2 * k_on.K_diag(X) + (1.0 - w_x) ** 2 * k_off.K_diag(X)  # [N]


@kernel_class
class ChangePoint(Kernel):
    """CP(k_before, k_after) = σ̄ k_before σ̄' + σ k_after σ' (Duvenaud 2014, eq. 1.19–1.20).

    σ(x) = sigmoid(steepness · (x[dim] − location)) rises from 0 to 1 across the change, so
    ``before`` governs x[dim] ≪ location and ``after`` governs x[dim] ≫ location (eq. 1.19 with
    k_1 = after, k_2 = before). ``location`` is unconstrained, ``steepness`` positive.
    """

    before: Kernel
    after: Kernel
    location: Any = hyper(0.0, constraint=constraints.real)
    steepness: Any = hyper(1.0)
    dim: int = static(0)

    def __post_init__(self):
        _check_kernel(self.before, "ChangePoint.before")
        _check_kernel(self.after, "ChangePoint.after")
        super().__post_init__()

    def weight(self, X):
        """σ(x) ``[N]``: the share of ``after`` at each input."""
        _check_column(X, self.dim, "X")
        return jax.nn.sigmoid(self.steepness * (X[:, self.dim] - self.location))  # [N]

    def _K(self, X, Y):
        return _switch(self.after, self.before, self.weight(X), self.weight(Y), X, Y)  # [N, M]

    def _K_diag(self, X):
        return _switch_diag(self.after, self.before, self.weight(X), X)  # [N]


@kernel_class
class ChangeWindow(Kernel):
    """Change-window: ``inside`` within an interval of x[dim], ``outside`` elsewhere (Duvenaud 2014, §1.5).

    As eq. 1.19 with σ(x) replaced by a product of a rising and a falling sigmoid,
    w(x) = sigmoid(s (x − location + width/2)) · sigmoid(−s (x − location − width/2)), where s is
    ``steepness``. ``location`` (the window's centre) is unconstrained; ``width`` and
    ``steepness`` are positive.
    """

    outside: Kernel
    inside: Kernel
    location: Any = hyper(0.0, constraint=constraints.real)
    width: Any = hyper(1.0)
    steepness: Any = hyper(1.0)
    dim: int = static(0)

    def __post_init__(self):
        _check_kernel(self.outside, "ChangeWindow.outside")
        _check_kernel(self.inside, "ChangeWindow.inside")
        super().__post_init__()

    def weight(self, X):
        """w(x) ``[N]``: the share of ``inside`` at each input."""
        _check_column(X, self.dim, "X")
        x = X[:, self.dim] - self.location  # [N]
        half = 0.5 * self.width
        return jax.nn.sigmoid(self.steepness * (x + half)) * jax.nn.sigmoid(-self.steepness * (x - half))  # [N]

    def _K(self, X, Y):
        return _switch(self.inside, self.outside, self.weight(X), self.weight(Y), X, Y)  # [N, M]

    def _K_diag(self, X):
        return _switch_diag(self.inside, self.outside, self.weight(X), X)  # [N]


@kernel_class
class FunctionScaled(Kernel):
    """a(x) k(x, y) a(y): the prior of f = a · g, g ~ GP(0, k), for a known a (Duvenaud 2014, eq. 1.21).

    ``function`` maps inputs ``[N, D]`` (after ``active_dims``) to ``[N]``; it must be a pure JAX
    function. It is a static field, so it is part of the kernel's identity under ``jax.jit``.
    """

    base_kernel: Kernel
    function: Callable = static()

    def __post_init__(self):
        _check_kernel(self.base_kernel, "FunctionScaled.base_kernel")
        if not callable(self.function):
            got = type(self.function).__name__
            raise HyperparameterError("FunctionScaled.function", f"must be callable, got {got}")
        super().__post_init__()

    def scale(self, X):
        """a(x) ``[N]``, checked to be one value per input."""
        a = jnp.asarray(self.function(X))  # [N]
        if a.shape != X.shape[:1]:
            raise ShapeError("FunctionScaled.function", f"must map [N, D] inputs to [N], got {X.shape} -> {a.shape}")
        return a

    def _K(self, X, Y):
        return self.scale(X)[:, None] * self.base_kernel.K(X, Y) * self.scale(Y)[None, :]  # [N, M]

    def _K_diag(self, X):
        return self.scale(X) ** 2 * self.base_kernel.K_diag(X)  # [N]


def _integer_codes(x, num_values: int, argument: str):
    """Round an integer-coded column ``[N]`` to int32, checking ``0 <= x < num_values`` when concrete."""
    if is_concrete(x):
        values = np.asarray(x)
        if values.size and (
            not np.all(np.isfinite(values))
            or np.any(values != np.round(values))
            or values.min() < 0
            or values.max() >= num_values
        ):
            raise DataError(argument, f"must hold integer codes in [0, {num_values}), got values in "
                            f"[{values.min()}, {values.max()}]")
    return jnp.round(x).astype(jnp.int32)  # [N]


@kernel_class
class Categorical(Kernel):
    """SE-ARD on one-of-k codes of a single integer-coded column (Duvenaud 2014, eq. 1.51).

    k(i, j) = σ² for i = j and σ² exp(−(1/ℓ_i² + 1/ℓ_j²)/2) otherwise; a short lengthscale
    ℓ_i makes category i uncorrelated with the others. Select the column with ``active_dims``.
    ``lengthscale`` is a scalar or one value per category (``num_categories``, static).
    """

    num_categories: int = static()
    lengthscale: Any = hyper(1.0)
    variance: Any = hyper(1.0)

    def __post_init__(self):
        if isinstance(self.num_categories, bool) or not isinstance(self.num_categories, int) or self.num_categories < 1:
            raise HyperparameterError(
                "Categorical.num_categories", f"must be a positive integer, got {self.num_categories!r}"
            )
        lengthscale = self.lengthscale
        if is_concrete(lengthscale) and isinstance(lengthscale, (int, float, np.ndarray, jax.Array, list, tuple)):
            size = np.size(lengthscale)
            if size not in (1, self.num_categories):
                raise HyperparameterError(
                    "Categorical.lengthscale", f"needs 1 or num_categories={self.num_categories} values, got {size}"
                )
        super().__post_init__()

    def one_hot(self, X):
        """One-of-k encoding ``[N, C]`` of the single input column of ``X`` ``[N, 1]``."""
        if X.ndim != 2 or X.shape[1] != 1:
            message = f"Categorical acts on one integer-coded column (use active_dims), got shape {X.shape}"
            raise ShapeError("X", message)
        codes = _integer_codes(X[:, 0], self.num_categories, "X")  # [N]
        return jax.nn.one_hot(codes, self.num_categories, dtype=jnp.result_type(float))  # [N, C]

    def _K(self, X, Y):
        r2 = scaled_sqdist(self.one_hot(X), self.one_hot(Y), self.lengthscale)  # [N, M]
        return self.variance * jnp.exp(-0.5 * r2)  # [N, M]

    def _K_diag(self, X):
        return self.variance * jnp.ones(X.shape[:1], jnp.result_type(float))  # [N]


@kernel_class
class Coregionalization(Kernel):
    """Multi-output kernel k(x, i, y, i') = k_x(x, y) · B[i, i'] (Duvenaud 2014, eq. 1.52, Bonilla et al.).

    The column ``output_column`` (after ``active_dims``; default the last) holds the output
    index i ∈ {0..P−1}; ``base_kernel`` sees the remaining columns. B = W Wᵀ + diag(κ) with
    ``W`` ``[P, rank]`` real-valued and ``kappa`` positive (scalar or ``[P]``), so B is
    positive definite.
    """

    base_kernel: Kernel
    W: Any = hyper(constraint=constraints.real)
    kappa: Any = hyper(1.0)
    output_column: int = static(-1)

    def __post_init__(self):
        _check_kernel(self.base_kernel, "Coregionalization.base_kernel")
        if is_concrete(self.W) and isinstance(self.W, (np.ndarray, jax.Array, list, tuple)) and np.ndim(self.W) != 2:
            shape = np.shape(self.W)
            raise HyperparameterError("Coregionalization.W", f"must be a [P, rank] matrix, got shape {shape}")
        super().__post_init__()

    @property
    def num_outputs(self) -> int:
        return jnp.shape(self.resolved().W)[0]

    def coregionalization_matrix(self):
        """B = W Wᵀ + diag(κ), ``[P, P]``."""
        k = self.resolved()
        W = jnp.asarray(k.W)  # [P, rank]
        kappa = jnp.broadcast_to(k.kappa, W.shape[:1])  # [P]
        return W @ W.T + jnp.diag(kappa)  # [P, P]

    def _split(self, X):
        """Features ``[N, D−1]`` and output indices ``[N]`` of ``X`` ``[N, D]``."""
        _check_column(X, self.output_column, "X")
        column = self.output_column % X.shape[1]
        features = X[:, [d for d in range(X.shape[1]) if d != column]]  # [N, D-1]
        return features, _integer_codes(X[:, column], self.num_outputs, "X")

    def _K(self, X, Y):
        features_x, index_x = self._split(X)  # [N, D-1], [N]
        features_y, index_y = self._split(Y)  # [M, D-1], [M]
        B = self.coregionalization_matrix()  # [P, P]
        return self.base_kernel.K(features_x, features_y) * B[index_x[:, None], index_y[None, :]]  # [N, M]

    def _K_diag(self, X):
        features, index = self._split(X)  # [N, D-1], [N]
        B = self.coregionalization_matrix()  # [P, P]
        return self.base_kernel.K_diag(features) * B[index, index]  # [N]
