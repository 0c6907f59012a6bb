"""Non-stationary dot-product kernels and the two trivial ones (Duvenaud 2014, §1.2–1.4).

``Linear`` and ``Polynomial`` are inner products of (shifted) inputs, computed as one matmul;
``Constant`` and ``White`` are the bias and white-noise components of additive models.
Every kernel accepts a scalar or per-dimension (ARD) ``variance`` where it has one.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from numpyro.distributions import constraints

from gpzoo.models.errors import HyperparameterError
from gpzoo.models.kernels.base import Kernel, hyper, kernel_class, static

__all__ = ["Constant", "Linear", "Polynomial", "White"]


@kernel_class
class Linear(Kernel):
    """Lin: Σ_d σ_d² (x_d − c_d)(y_d − c_d) (Duvenaud 2014, Fig. 1.1, §1.3.2).

    The marginal standard deviation grows linearly away from ``offset`` c (unconstrained, may be
    per dimension). Duvenaud's bias term σ_b² is ``Constant``: write ``Linear() + Constant()``.
    """

    variance: Any = hyper(1.0)
    offset: Any = hyper(0.0, constraint=constraints.real)

    def _K(self, X, Y):
        Xc = X - self.offset  # [N, D]
        Yc = Y - self.offset  # [M, D]
        return (Xc * self.variance) @ Yc.T  # [N, M]

    def _K_diag(self, X):
        Xc = X - self.offset  # [N, D]
        return jnp.sum(Xc**2 * self.variance, axis=-1)  # [N]


@kernel_class
class Polynomial(Kernel):
    """(Σ_d σ_d² x_d y_d + c)^degree: a product of ``degree`` linear kernels (Duvenaud 2014, §1.3.2,
    "Polynomial Regression"), i.e. a prior on polynomials of that degree.

    ``degree`` is a static positive integer; ``offset`` c > 0 keeps all lower-order terms.
    """

    degree: int = static(2)
    variance: Any = hyper(1.0)
    offset: Any = hyper(1.0)

    def __post_init__(self):
        if isinstance(self.degree, bool) or not isinstance(self.degree, int) or self.degree < 1:
            raise HyperparameterError("Polynomial.degree", f"must be a positive integer, got {self.degree!r}")
        super().__post_init__()

    def _K(self, X, Y):
        return ((X * self.variance) @ Y.T + self.offset) ** self.degree  # [N, M]

    def _K_diag(self, X):
        return (jnp.sum(X**2 * self.variance, axis=-1) + self.offset) ** self.degree  # [N]


@kernel_class
class Constant(Kernel):
    """σ² for every pair of inputs: a random constant offset (the bias σ_b² of Duvenaud 2014, Fig. 1.1 Lin)."""

    variance: Any = hyper(1.0)

    def _K(self, X, Y):
        return self.variance * jnp.ones((X.shape[0], Y.shape[0]), X.dtype)  # [N, M]

    def _K_diag(self, X):
        return self.variance * jnp.ones(X.shape[:1], X.dtype)  # [N]


@jax.jit
def _rows_equal(X, Y):
    """``[N, M]`` boolean: row n of ``X`` equals row m of ``Y`` in every coordinate.

    Jitted so XLA fuses the comparison into the reduction (no ``[N, M, D]`` buffer is formed).
    """
    return jnp.all(X[:, None, :] == Y[None, :, :], axis=-1)  # [N, M]


@kernel_class
class White(Kernel):
    """WN: σ² δ(x, y), the zero-lengthscale limit of SE (Duvenaud 2014, §1.4.1).

    δ is exact equality of the (active) input coordinates, so ``K(X) = σ² I`` for distinct rows
    and the kernel is the same function whether it is evaluated alone or inside a sum. Observation
    noise of a regression belongs in the Gaussian likelihood; this kernel is for noise-like
    *components* of an additive prior.
    """

    variance: Any = hyper(1.0)

    def _K(self, X, Y):
        return self.variance * _rows_equal(X, Y).astype(X.dtype)  # [N, M]

    def _K_diag(self, X):
        return self.variance * jnp.ones(X.shape[:1], X.dtype)  # [N]
