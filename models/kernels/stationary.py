"""Stationary kernels k(x, y) = σ² κ(r), r = ‖(x − y)/ℓ‖ (seed 004 §1.2, Fig. 1.1).

Distances are computed with a matmul, ‖x‖² − 2 x·y + ‖y‖² (seed 000 App. A.2), never with an
``[N, M, D]`` broadcast; ``lengthscale`` may be a scalar or one value per input dimension (ARD).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from models.kernels.base import Kernel, hyper, kernel_class

__all__ = ["Stationary", "SquaredExponential", "scaled_sqdist", "safe_sqrt"]


def scaled_sqdist(X, Y, lengthscale):
    """Squared distances ``[N, M]`` between ``X/ℓ`` ``[N, D]`` and ``Y/ℓ`` ``[M, D]`` via a matmul."""
    Xs = X / lengthscale  # [N, D]
    Ys = Y / lengthscale  # [M, D]
    cross = Xs @ Ys.T  # [N, M]
    r2 = jnp.sum(Xs**2, -1)[:, None] - 2.0 * cross + jnp.sum(Ys**2, -1)[None, :]
    return jnp.maximum(r2, 0.0)


def safe_sqrt(r2):
    """``sqrt`` with a finite gradient at 0 (distance between identical points)."""
    tiny = jnp.finfo(jnp.result_type(r2, jnp.float32)).tiny
    return jnp.sqrt(jnp.maximum(r2, tiny))


class Stationary(Kernel):
    """Base of kernels that depend on the scaled distance only: σ² κ(r²)."""

    def _K(self, X, Y):
        return self.variance * self.profile(scaled_sqdist(X, Y, self.lengthscale))

    def _K_diag(self, X):
        return jnp.broadcast_to(self.variance * self.profile(jnp.zeros((), X.dtype)), X.shape[:1])

    def profile(self, r2):  # pragma: no cover - abstract
        """κ as a function of the squared scaled distance ``r2`` (κ(0) = 1)."""
        raise NotImplementedError


@kernel_class
class SquaredExponential(Stationary):
    """SE / RBF: σ² exp(−r²/2) (seed 004 Fig. 1.1). ARD when ``lengthscale`` is a vector."""

    lengthscale: Any = hyper(1.0)
    variance: Any = hyper(1.0)

    def profile(self, r2):
        return jnp.exp(-0.5 * r2)


RBF = SquaredExponential
