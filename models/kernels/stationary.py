"""Stationary kernels k(x, y) = σ² κ(r), r = ‖(x − y)/ℓ‖ (Duvenaud 2014, §1.2, Fig. 1.1).

Squared distances never depend on where the inputs sit, only on their differences: a shared offset
(a year axis, a sensor reading 1000 ± 1) changes a kernel value by no more than the rounding of the
inputs themselves. With a few input columns (≤ :data:`DIRECT_MAX_DIM`) the distances are summed
from differences column by column. With more they come from a matmul, ‖x‖² − 2 x·y + ‖y‖²
(van der Wilk et al. 2017, App. A.2), after both sides are centred on a common reference point
(:func:`centred`), so that its cancellation is bounded by the spread of the inputs instead of
their magnitude. Neither form builds an ``[N, M, D]`` array. ``lengthscale`` may be a scalar or one
value per input dimension (ARD).

A row of the second argument meets the same arithmetic whatever other rows come with it (the
reference is taken from the first argument: the inducing points of Kuf, the training inputs of a
prediction), so predictions in blocks, padded or not, are equal bit for bit.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gpzoo.models.kernels.base import Kernel, hyper, kernel_class

__all__ = [
    "RBF",
    "Cosine",
    "Matern12",
    "Matern32",
    "Matern52",
    "Periodic",
    "RationalQuadratic",
    "SquaredExponential",
    "Stationary",
    "centred",
    "safe_sqrt",
    "scaled_sqdist",
]

#: Up to this many input columns the squared distances are summed from differences column by
#: column (exact zeros, no cancellation; D ``[N, M]`` terms); from D + 1 on by one matmul.
DIRECT_MAX_DIM = 4


def centred(X, Y):
    """``X`` ``[N, D]`` and ``Y`` ``[M, D]`` less a common reference point, the mean of the rows of ``X``.

    The reference is a constant of the computation (``stop_gradient``): every function of
    differences x − y is unchanged by it, so gradients with respect to X and Y are those of the
    uncentred inputs. Subtracting it is exact for inputs within a factor of two of it (Sterbenz),
    so a shared offset is removed before anything can round away the differences. It is taken
    from ``X`` alone, so that each row of ``Y`` is treated alike whatever rows ``Y`` holds besides
    (blocks and padding change nothing). Costs O((N + M)·D).
    """
    reference = jax.lax.stop_gradient(jnp.sum(X, axis=0) / max(X.shape[0], 1))  # [D]
    return X - reference, Y - reference  # [N, D], [M, D]


def scaled_sqdist(X, Y, lengthscale):
    """Squared distances ``[N, M]`` between ``X/ℓ`` ``[N, D]`` and ``Y/ℓ`` ``[M, D]``, shift-invariant.

    With at most :data:`DIRECT_MAX_DIM` columns the distances are sums of squared scaled
    differences ((x_d − y_d)/ℓ_d)², one column at a time: no cancellation, identical points at
    distance exactly 0. With more, a matmul expansion on inputs centred on a common reference
    (:func:`centred`); there values below its rounding error (a few ulps of ‖x‖² + ‖y‖²) are set
    to 0, so identical points are at distance exactly 0 too; otherwise kernels that take a square
    root (Matérn) would turn a 1e-16 rounding error into a 1e-8 error on the diagonal.
    """
    D = X.shape[-1]
    if D <= DIRECT_MAX_DIM:
        dtype = jnp.result_type(X, Y, lengthscale, 1.0)  # integer inputs and lengthscales compute in floats
        inverse = jnp.broadcast_to(1.0 / jnp.asarray(lengthscale, dtype), (D,))  # [D]
        r2 = jnp.zeros((X.shape[0], Y.shape[0]), dtype)  # [N, M]
        for d in range(D):
            r2 = r2 + ((X[:, d, None] - Y[None, :, d]) * inverse[d]) ** 2  # [N, M]
        return r2
    X, Y = centred(X, Y)
    Xs = X / lengthscale  # [N, D]
    Ys = Y / lengthscale  # [M, D]
    cross = Xs @ Ys.T  # [N, M]
    norms = jnp.sum(Xs**2, -1)[:, None] + jnp.sum(Ys**2, -1)[None, :]  # [N, M]
    r2 = norms - 2.0 * cross  # [N, M]
    rounding = 8.0 * jnp.finfo(jnp.result_type(r2, jnp.float32)).eps * norms  # [N, M]
    return jnp.where(r2 > rounding, r2, 0.0)  # [N, M]


def safe_sqrt(r2):
    """``sqrt`` with a finite gradient at 0 (distance between identical points)."""
    tiny = jnp.finfo(jnp.result_type(r2, jnp.float32)).tiny
    return jnp.sqrt(jnp.maximum(r2, tiny))


class Stationary(Kernel):
    """Base of kernels that depend on the scaled distance only: σ² κ(r²)."""

    dimension_fields = ("lengthscale",)

    def _K(self, X, Y):
        return self.variance * self.profile(scaled_sqdist(X, Y, self.lengthscale))  # [N, M]

    def _K_diag(self, X):
        return jnp.broadcast_to(self.variance * self.profile(jnp.zeros((), X.dtype)), X.shape[:1])  # [N]

    def profile(self, r2):  # pragma: no cover - abstract
        """κ as a function of the squared scaled distance ``r2`` (κ(0) = 1)."""
        raise NotImplementedError


@kernel_class
class SquaredExponential(Stationary):
    """SE / RBF: σ² exp(−r²/2) (Duvenaud 2014, Fig. 1.1). ARD when ``lengthscale`` is a vector."""

    lengthscale: Any = hyper(1.0)
    variance: Any = hyper(1.0)

    def profile(self, r2):
        return jnp.exp(-0.5 * r2)


RBF = SquaredExponential


@kernel_class
class Matern12(Stationary):
    """Matérn ν=1/2 (exponential / Ornstein–Uhlenbeck): σ² exp(−r).

    One of the "local" variants of SE that Duvenaud 2014, §1.2 mentions; samples are continuous but
    nowhere differentiable.
    """

    lengthscale: Any = hyper(1.0)
    variance: Any = hyper(1.0)

    def profile(self, r2):
        return jnp.exp(-safe_sqrt(r2))


@kernel_class
class Matern32(Stationary):
    """Matérn ν=3/2: σ² (1 + √3 r) exp(−√3 r) (Duvenaud 2014, §1.2, "local" SE variant); once-differentiable samples."""

    lengthscale: Any = hyper(1.0)
    variance: Any = hyper(1.0)

    def profile(self, r2):
        sqrt3_r = np.sqrt(3.0) * safe_sqrt(r2)
        return (1.0 + sqrt3_r) * jnp.exp(-sqrt3_r)


@kernel_class
class Matern52(Stationary):
    """Matérn ν=5/2: σ² (1 + √5 r + 5r²/3) exp(−√5 r) (Duvenaud 2014, §1.2); twice-differentiable samples."""

    lengthscale: Any = hyper(1.0)
    variance: Any = hyper(1.0)

    def profile(self, r2):
        sqrt5_r = np.sqrt(5.0) * safe_sqrt(r2)
        return (1.0 + sqrt5_r + 5.0 / 3.0 * r2) * jnp.exp(-sqrt5_r)


@kernel_class
class RationalQuadratic(Stationary):
    """RQ: σ² (1 + r²/(2α))^(−α), a scale mixture of SE kernels (Duvenaud 2014, §1.2, Fig. 1.1 family).

    ``alpha`` → ∞ recovers SE; small ``alpha`` mixes many lengthscales.
    """

    lengthscale: Any = hyper(1.0)
    variance: Any = hyper(1.0)
    alpha: Any = hyper(1.0)

    def profile(self, r2):
        return (1.0 + 0.5 * r2 / self.alpha) ** (-self.alpha)


@kernel_class
class Periodic(Stationary):
    """Per: σ² exp(−2 Σ_d sin²(π (x_d − y_d)/p_d) / ℓ_d²) (Duvenaud 2014, eq. 1.41, Fig. 1.1).

    Implemented exactly as eq. 1.41 states it: the projection of each input onto the circle,
    u(x) = [sin(2πx/p), cos(2πx/p)] / ℓ, followed by SE on u, whose squared distance is a matmul
    (‖u(x) − u(y)‖² = 4 Σ_d sin²(π (x_d − y_d)/p_d) / ℓ_d²). ``period`` may be per dimension.
    """

    lengthscale: Any = hyper(1.0)
    variance: Any = hyper(1.0)
    period: Any = hyper(1.0)

    dimension_fields = ("lengthscale", "period")

    def _K(self, X, Y):
        X, Y = centred(X, Y)  # phases of differences from a common reference, not of the raw inputs
        U = self._circle(X)  # [N, 2D]
        V = self._circle(Y)  # [M, 2D]
        return self.variance * self.profile(scaled_sqdist(U, V, 1.0))  # [N, M]

    def _circle(self, X):
        """u(x) = [sin(2πx/p), cos(2πx/p)] / ℓ, the projection onto the fundamental domain."""
        phase = 2.0 * np.pi * X / self.period  # [N, D]
        lengthscale = jnp.broadcast_to(self.lengthscale, X.shape[-1:])  # [D]
        return jnp.concatenate([jnp.sin(phase) / lengthscale, jnp.cos(phase) / lengthscale], axis=-1)  # [N, 2D]

    def profile(self, r2):
        return jnp.exp(-0.5 * r2)


@kernel_class
class Cosine(Stationary):
    """Cosine: σ² cos(2π Σ_d (x_d − y_d)/ℓ_d), a single Fourier feature (Duvenaud 2014, §1.6, eq. 1.22).

    With a = 2π Σ_d x_d/ℓ_d the kernel is cos(a)cos(b) + sin(a)sin(b): a rank-2 feature inner
    product, computed as such (an outer product, never an ``[N, M, D]`` difference).
    """

    lengthscale: Any = hyper(1.0)
    variance: Any = hyper(1.0)

    def _K(self, X, Y):
        X, Y = centred(X, Y)  # phases of differences from a common reference, not of the raw inputs
        a = self._phase(X)  # [N]
        b = self._phase(Y)  # [M]
        features_x = jnp.stack([jnp.cos(a), jnp.sin(a)], axis=-1)  # [N, 2]
        features_y = jnp.stack([jnp.cos(b), jnp.sin(b)], axis=-1)  # [M, 2]
        return self.variance * (features_x @ features_y.T)  # [N, M]

    def _K_diag(self, X):
        return self.variance * jnp.ones(X.shape[:1], X.dtype)  # [N]

    def _phase(self, X):
        return 2.0 * np.pi * jnp.sum(X / self.lengthscale, axis=-1)  # [N]
