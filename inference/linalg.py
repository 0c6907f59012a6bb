"""Shared linear algebra: Cholesky with recorded jitter, blockwise triangular solves.

Nothing larger than one M×M block is ever factorised: covariances of several inducing groups are
kept as a stack of blocks ``[G, M, M]`` (block-diagonal Kuu, van der Wilk et al. 2017, App. C).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

__all__ = ["MAX_JITTER_TRIES", "block_solve", "cholesky_with_jitter", "float_dtype"]

#: How many times the jitter is multiplied by 10 before giving up (the Cholesky is then NaN and
#: training stops with a ``TrainingError`` naming the step).
MAX_JITTER_TRIES = 6


def float_dtype():
    """The floating dtype gpzoo computes in: float64 when ``jax_enable_x64`` is on, else float32."""
    return jnp.float64 if jax.config.jax_enable_x64 else jnp.float32


def _chol(K, jitter):
    # K [..., M, M] -> [..., M, M]
    eye = jnp.eye(K.shape[-1], dtype=K.dtype)
    return jnp.linalg.cholesky(K + jitter * eye)


def cholesky_with_jitter(K, jitter: float):
    """Lower Cholesky factor of ``K + jitter·I`` ``[..., M, M]``, retrying with 10× more jitter.

    Returns ``(L, jitter_used)``. The search for a jitter that works runs without gradients
    (``lax.while_loop``); the returned factor is one differentiable Cholesky at the jitter found,
    so the gradient is that of ``chol(K + jitter_used·I)``. ``jitter_used`` is reported by the
    model as a deterministic site so a fit can record every increase.
    """
    K_const = jax.lax.stop_gradient(K)
    jitter0 = jnp.asarray(jitter, K.dtype)

    def failed(state):
        L, _, tries = state
        return jnp.logical_and(jnp.logical_not(jnp.all(jnp.isfinite(L))), tries < MAX_JITTER_TRIES)

    def retry(state):
        _, j, tries = state
        j = 10.0 * j
        return _chol(K_const, j), j, tries + 1

    _, jitter_used, _ = jax.lax.while_loop(failed, retry, (_chol(K_const, jitter0), jitter0, 0))
    jitter_used = jax.lax.stop_gradient(jitter_used)
    return _chol(K, jitter_used), jitter_used


def block_solve(L, B, *, transpose: bool = False):
    """Solve ``L X = B`` (or ``Lᵀ X = B``) block by block: L ``[G, M, M]``, B ``[G, M, K]``."""
    return solve_triangular(L, B, lower=True, trans=1 if transpose else 0)
