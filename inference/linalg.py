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
    (``lax.while_loop``); its last factor is the result, differentiable as ``chol(K + jitter_used·I)``
    (:func:`_factor_of`), so K is factorised once when the first jitter works. ``jitter_used`` is
    reported by the model as a deterministic site so a fit can record every increase.
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

    L, jitter_used, _ = jax.lax.while_loop(failed, retry, (_chol(K_const, jitter0), jitter0, 0))
    jitter_used = jax.lax.stop_gradient(jitter_used)
    eye = jnp.eye(K.shape[-1], dtype=K.dtype)
    return _factor_of(K + jitter_used * eye, jax.lax.stop_gradient(L)), jitter_used


@jax.custom_jvp
def _factor_of(A, L):
    """``L``, the lower Cholesky factor of ``A`` ``[..., M, M]`` computed by the caller, differentiable in
    A as ``jnp.linalg.cholesky(A)`` is (L itself carries no derivative).

    Tangent (Murray 2016, the rule ``jnp.linalg.cholesky`` uses, on the symmetrised tangent as it reads
    (A + Aᵀ)/2): L̇ = L Φ(L⁻¹ Ȧ L⁻ᵀ), Φ = lower triangle with the diagonal halved. Linear in Ȧ, so
    reverse mode is its transpose; the rule calls this function again for its own L, so higher orders
    are those of the Cholesky factorisation too.
    """
    return L


@_factor_of.defjvp
def _factor_of_jvp(primals, tangents):
    A, L = primals
    L = _factor_of(A, L)  # differentiable in A: second derivatives see chol's dependence on A
    dA = tangents[0]
    dA = 0.5 * (dA + jnp.swapaxes(dA, -1, -2))
    left = solve_triangular(L, dA, lower=True)  # [..., M, M] = L⁻¹ Ȧ
    inner = solve_triangular(L, jnp.swapaxes(left, -1, -2), lower=True)  # L⁻¹ Ȧ L⁻ᵀ (Ȧ symmetric)
    eye = jnp.eye(A.shape[-1], dtype=A.dtype)
    phi = jnp.tril(inner) * (1.0 - 0.5 * eye)
    return L, L @ phi


def block_solve(L, B, *, transpose: bool = False):
    """Solve ``L X = B`` (or ``Lᵀ X = B``) block by block: L ``[G, M, M]``, B ``[G, M, K]``."""
    return solve_triangular(L, B, lower=True, trans=1 if transpose else 0)
