"""Reference GP regression: exact posterior, log marginal likelihood, collapsed (Titsias) bound.

For small data sets these are the ground truth the sparse variational machinery is tested
against: with Z = X and the optimal q(u) the SVGP ELBO (van der Wilk et al. 2017, eq. 5) equals the exact log
marginal likelihood, and so does the collapsed bound. ``optimal_q`` gives that q(u) in closed
form for a Gaussian likelihood (Titsias 2009), factorising only M×M matrices.

``svgp_elbo`` is the full-batch SVGP bound (Hensman et al. 2015) for a
single latent function with a whitened q(v), v = Luu⁻¹u, and any likelihood whose expected
log-likelihood is deterministic (quadrature or closed form): a smooth function of the
hyperparameters and q, for optimisers that need one (the kernel search scores non-Gaussian data
with it).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.linalg import cho_solve, solve_triangular

from gpzoo.inference.linalg import cholesky_with_jitter

__all__ = ["collapsed_elbo", "exact_log_marginal", "exact_posterior", "gaussian_log_density", "optimal_q", "svgp_elbo",
           "whitened_kl", "whitened_moments"]

LOG_2PI = math.log(2.0 * math.pi)


def exact_log_marginal(kernel, noise_variance, X, y):
    """log N(y | 0, Kff + σ² I) for X ``[N, D]``, y ``[N]``."""
    N = X.shape[0]
    return gaussian_log_density(kernel.K(X) + noise_variance * jnp.eye(N, dtype=X.dtype), y)


def _log_density_from_factor(L, y):
    a = solve_triangular(L, y, lower=True)  # [N] = L⁻¹ y
    return -0.5 * (y.shape[-1] * LOG_2PI + jnp.sum(a**2)) - jnp.sum(jnp.log(jnp.diagonal(L))), a


@jax.custom_jvp
def gaussian_log_density(K, y):
    """log N(y | 0, K) for a positive-definite K ``[N, N]`` and y ``[N]`` (NaN where K is not).

    Differentiated by the closed form (Rasmussen & Williams 2006, eq. 5.9):
    d log N = ½ αᵀ dK α − ½ tr(K⁻¹ dK) − αᵀ dy with α = K⁻¹ y. Reverse mode then costs one factorisation
    and two triangular solves for K⁻¹ instead of the transpose of the factorisation's own derivative,
    about 30 % less for the gradient at N in the hundreds; higher derivatives are those of the factorisation.
    """
    return _log_density_from_factor(jnp.linalg.cholesky(K), y)[0]


@gaussian_log_density.defjvp
def _gaussian_log_density_jvp(primals, tangents):
    K, y = primals
    dK, dy = tangents
    L = jnp.linalg.cholesky(K)  # [N, N]
    value, a = _log_density_from_factor(L, y)
    alpha = solve_triangular(L, a, lower=True, trans=1)  # [N] = K⁻¹ y
    K_inv = cho_solve((L, True), jnp.eye(K.shape[-1], dtype=K.dtype))  # [N, N]
    return value, 0.5 * (alpha @ dK @ alpha) - 0.5 * jnp.sum(K_inv * dK) - alpha @ dy


def exact_posterior(kernel, noise_variance, X, y, X_new):
    """Mean and marginal variance ``[N*]`` of the latent f at ``X_new`` under the exact posterior."""
    N = X.shape[0]
    L = jnp.linalg.cholesky(kernel.K(X) + noise_variance * jnp.eye(N, dtype=X.dtype))  # [N, N]
    Ks = kernel.K(X, X_new)  # [N, N*]
    A = solve_triangular(L, Ks, lower=True)  # [N, N*]
    mean = A.T @ solve_triangular(L, y, lower=True)  # [N*]
    var = kernel.K_diag(X_new) - jnp.sum(A**2, axis=0)  # [N*]
    return mean, var


def _projection(kernel, noise_variance, Z, X, jitter):
    Luu, _ = cholesky_with_jitter(kernel.K(Z), jitter)  # [M, M]
    A = solve_triangular(Luu, kernel.K(Z, X), lower=True) / jnp.sqrt(noise_variance)  # [M, N]
    B = jnp.eye(Z.shape[0], dtype=X.dtype) + A @ A.T  # [M, M]
    return Luu, A, jnp.linalg.cholesky(B)


def collapsed_elbo(kernel, noise_variance, Z, X, y, jitter: float = 1e-6):
    """Titsias' collapsed bound log N(y | 0, Qff + σ²I) − tr(Kff − Qff) / (2σ²)."""
    N = X.shape[0]
    _, A, LB = _projection(kernel, noise_variance, Z, X, jitter)
    c = solve_triangular(LB, A @ y, lower=True) / jnp.sqrt(noise_variance)  # [M]
    log_det = 2.0 * jnp.sum(jnp.log(jnp.diagonal(LB))) + N * jnp.log(noise_variance)
    quad = jnp.sum(y**2) / noise_variance - jnp.sum(c**2)
    trace = jnp.sum(kernel.K_diag(X)) / noise_variance - jnp.sum(A**2)
    return -0.5 * (N * LOG_2PI + log_det + quad + trace)


def optimal_q(kernel, noise_variance, Z, X, y, *, whiten: bool = True, jitter: float = 1e-6):
    """The ELBO-optimal Gaussian q(u) for Gaussian noise: ``(q_mu [1, M], q_sqrt [1, M, M])``.

    Whitened: S_v = (I + σ⁻² A₀A₀ᵀ)⁻¹, m_v = σ⁻² S_v A₀ y with A₀ = Luu⁻¹ Kuf; unwhitened
    u = Luu v. Only M×M matrices are factorised.
    """
    Luu, A, LB = _projection(kernel, noise_variance, Z, X, jitter)
    M = Z.shape[0]
    S = cho_solve((LB, True), jnp.eye(M, dtype=X.dtype))  # [M, M]  B^{-1}
    m = cho_solve((LB, True), A @ y) / jnp.sqrt(noise_variance)  # [M]
    S_sqrt = jnp.linalg.cholesky(S)  # [M, M]
    if not whiten:
        m, S_sqrt = Luu @ m, Luu @ S_sqrt
    return m[None], S_sqrt[None]


def whitened_moments(kernel, Z, q_mu, q_sqrt, X, jitter: float = 1e-6, *, component=None, full_cov: bool = False):
    """Mean ``[N]`` and variance ``[N]`` (``full_cov``: covariance ``[N, N]``) of q(f(X)) = ∫ p(f | u) q(u) du
    for whitened q(v) = N(q_mu, q_sqrt q_sqrtᵀ), u = Luu v (q_mu ``[M]``, q_sqrt ``[M, M]`` lower
    triangular): mean Aᵀm, covariance K(X, X) − AᵀA + AᵀSSᵀA with A = Luu⁻¹ K(Z, X).

    ``component``: a summand k_i of ``kernel``; then q(f_i(X)) of that additive component through the
    same inducing outputs u = f(Z): A = Luu⁻¹ K_i(Z, X) and K_i(X, X) in place of K's (Luu stays the sum's)."""
    part = kernel if component is None else component
    Luu, _ = cholesky_with_jitter(kernel.K(Z), jitter)  # [M, M]
    A = solve_triangular(Luu, part.K(Z, X), lower=True)  # [M, N]
    SA = q_sqrt.T @ A  # [M, N]
    if full_cov:
        return A.T @ q_mu, part.K(X) - A.T @ A + SA.T @ SA
    return A.T @ q_mu, part.K_diag(X) - jnp.sum(A**2, axis=0) + jnp.sum(SA**2, axis=0)


def whitened_kl(q_mu, q_sqrt):
    """KL[N(q_mu, S Sᵀ) ‖ N(0, I)] = ½ (tr S Sᵀ + mᵀm − M − log|S Sᵀ|) for S = ``q_sqrt`` lower triangular."""
    return 0.5 * (jnp.sum(q_sqrt**2) + jnp.sum(q_mu**2) - q_mu.shape[-1]) - jnp.sum(jnp.log(jnp.abs(jnp.diagonal(q_sqrt))))


def svgp_elbo(kernel, likelihood, Z, q_mu, q_sqrt, X, y, jitter: float = 1e-6):
    """Σ_n E_q(f_n)[log p(y_n | f_n)] − KL[q(v) ‖ p(v)] on the whole data set (module docstring); the
    likelihood's ``variational_expectation`` gives each expectation."""
    mean, var = whitened_moments(kernel, Z, q_mu, q_sqrt, X, jitter)  # [N] x2
    expected = likelihood.variational_expectation(y, mean[:, None], var[:, None])  # [N]
    return jnp.sum(expected) - whitened_kl(q_mu, q_sqrt)
