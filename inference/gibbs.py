"""Pólya–Gamma Gibbs sampler for exact GP classification on small data (a reference posterior).

Model: f ~ N(0, K), y_n | f_n ~ Bernoulli(σ(f_n)), with the kernel's hyperparameters fixed. By
Polson, Scott & Windle (2013, Thm 1; van der Wilk et al. 2018, eq. 22)

    σ((2y_n − 1) f_n) = ½ e^{κ_n f_n} E_{PG(1,0)}[e^{−ω_n f_n²/2}],      κ_n = y_n − ½,

so augmenting with ω_n ~ PG(1, 0) makes the likelihood Gaussian in f and the two-block Gibbs
sampler of PSW 2013 §3.1 (with the identity as design matrix and the GP as prior) exact:

    ω_n | f   ~ PG(1, f_n)                                   (PSW 2013 §3.1, by the tilt eq. 2)
    f | ω, y  ~ N(Σ κ, Σ),      Σ = (K⁻¹ + Ω)⁻¹,  Ω = diag(ω).

The Gaussian block is the posterior of a GP regression on pseudo-targets z = Ω⁻¹κ with
heteroscedastic noise Ω⁻¹. It is drawn without ever inverting K (nor Ω, when some ω_n are tiny)
by Matheron's rule ("perturb the prior, then condition"): with g ~ N(0, K) and ε ~ N(0, I),

    f = g + K Ω^{1/2} B⁻¹ (Ω^{-1/2} κ − Ω^{1/2} g − ε),        B = I + Ω^{1/2} K Ω^{1/2},

which has mean K(K + Ω⁻¹)⁻¹ z = Σκ and covariance K − K(K + Ω⁻¹)⁻¹K = Σ (Woodbury). B has all
eigenvalues ≥ 1, so its Cholesky is well conditioned (the stable form of Rasmussen & Williams
2006, Alg. 3.2). Test inputs are handled in the same draw: g is a joint prior draw at
[X; X_test] (one Cholesky of the joint K, computed once) and f_test = g_test + K_{*f} (same
vector), an exact draw from p(f, f_test | ω, y).

Cost: one N×N Cholesky per sweep and chain, hence the limit ``MAX_NUM_DATA``. Chains run in
parallel (``jax.vmap``), sweeps in jit-compiled ``lax.scan`` chunks (a progress bar advances per
chunk). The result is an ArviZ 1.x ``xarray.DataTree`` (built with ``arviz_base.from_dict``):

================== ==========================================================================
posterior          ``f`` (chain, draw, obs_train); ``f_test`` (…, obs_test) with ``X_test``;
                   ``omega`` (…, obs_train) with ``store_omega=True``
log_likelihood     ``y`` (chain, draw, obs_train): log σ((2y_n − 1) f_n) (for ``az.loo``)
observed_data      ``y`` (obs_train)
constant_data      ``X`` (obs_train, feature), ``X_test`` (obs_test, feature) when given
sample_stats       ``lp``: log N(f | 0, K) + Σ_n log σ((2y_n − 1) f_n)
================== ==========================================================================

so ``az.summary(dt)``, ``az.rhat(dt)``, ``az.ess(dt)`` and ``az.loo(dt)`` work directly.
"""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from arviz_base import from_dict
from jax.scipy.linalg import cho_solve, solve_triangular
from tqdm.auto import tqdm

from gpzoo.inference.linalg import cholesky_with_jitter
from gpzoo.inference.polya_gamma import PolyaGamma
from gpzoo.inference.runner import restart_clock
from gpzoo.models.errors import InvalidArgumentError, ShapeError, as_float_array
from gpzoo.models.likelihoods import Bernoulli

__all__ = ["MAX_JOINT_POINTS", "MAX_NUM_DATA", "gibbs_gp_classification", "sample_f_given_omega", "sample_omega"]

#: Largest training set accepted: each sweep factorises an N×N matrix per chain (O(N³)).
MAX_NUM_DATA = 1000
#: Largest N + N* accepted: the joint prior covariance at [X; X_test] is factorised once, O((N + N*)³).
MAX_JOINT_POINTS = 5000

_LOG_2PI = math.log(2.0 * math.pi)


# ----------------------------------------------------------------------------- the two blocks
def sample_omega(key, f):
    """ω ~ p(ω | f) = Π_n PG(1, f_n) ``[N]`` (PSW 2013 §3.1), exact Devroye draws."""
    return PolyaGamma(1.0, f).sample(key)


def sample_f_given_omega(key, L_all, K_cols, omega, kappa):
    """One exact draw of (f, f_test) | ω, y ``[N + N*]`` by Matheron's rule (module docstring).

    ``L_all`` ``[N+N*, N+N*]``: Cholesky of the (jittered) prior covariance at [X; X_test];
    ``K_cols`` ``[N+N*, N]``: its first N columns (the training block K = ``K_cols[:N]``);
    ``omega``, ``kappa`` ``[N]``: PG variables and y − ½. Returns
    f = g + K_{·f} Ω^{1/2} B⁻¹ (Ω^{-1/2} κ − Ω^{1/2} g_f − ε), B = I + Ω^{1/2} K Ω^{1/2}.
    """
    N = omega.shape[0]
    key_prior, key_noise = jax.random.split(key)
    g = L_all @ jax.random.normal(key_prior, (L_all.shape[0],), L_all.dtype)  # [N+N*] ~ N(0, K_all)
    root = jnp.sqrt(omega)  # [N]  Ω^{1/2}
    B = jnp.eye(N, dtype=K_cols.dtype) + root[:, None] * K_cols[:N] * root[None, :]  # [N, N]
    LB = jnp.linalg.cholesky(B)  # [N, N]
    residual = kappa / root - root * g[:N] - jax.random.normal(key_noise, (N,), K_cols.dtype)  # [N]  Ω^{1/2}(z − g − e)
    alpha = root * cho_solve((LB, True), residual)  # [N]  (K + Ω⁻¹)⁻¹ (z − g − e)
    return g + K_cols @ alpha  # [N+N*]


def _sweep(key, L_all, K_cols, kappa, f):
    """One Gibbs sweep of one chain: ω | f, then (f, f_test) | ω, y. Returns (f_all ``[N+N*]``, ω ``[N]``)."""
    key_omega, key_f = jax.random.split(key)
    omega = sample_omega(key_omega, f)  # [N]
    return sample_f_given_omega(key_f, L_all, K_cols, omega, kappa), omega


# ----------------------------------------------------------------------------- driver
def gibbs_gp_classification(
    kernel,
    X,
    y,
    *,
    num_chains: int = 4,
    num_warmup: int = 500,
    num_samples: int = 1000,
    thin: int = 1,
    seed: int = 0,
    X_test=None,
    store_omega: bool = False,
    jitter: float = 1e-6,
    progress: bool = False,
    chunk_size: int = 100,
) -> xr.DataTree:
    """Exact posterior draws of the latent f of a logistic GP classifier (PG Gibbs; module docstring).

    ``kernel``: any gpzoo kernel with fixed hyperparameters (``kernel.K``); ``X`` ``[N, D]``,
    ``y`` ``[N]`` in {0, 1}, N ≤ ``MAX_NUM_DATA``. Runs ``num_chains`` chains from independent
    prior draws of f for ``num_warmup`` discarded sweeps, then keeps every ``thin``-th of the next
    ``num_samples · thin`` sweeps. ``jitter`` is added to K's diagonal (raised tenfold while the
    Cholesky fails; the value used is in the root attrs). Returns an ArviZ DataTree.
    """
    X = as_float_array(X, "X", ndim=2)
    y = Bernoulli(link="logit").validate_targets(y)
    N, D = X.shape
    if y.shape[0] != N:
        raise ShapeError("y", f"has {y.shape[0]} rows but X has {N}")
    if N == 0:
        raise ShapeError("X", "is empty")
    if N > MAX_NUM_DATA:
        raise InvalidArgumentError(
            "X", f"has {N} rows; the exact Gibbs sampler factorises an N×N matrix every sweep and is limited to "
            f"N <= {MAX_NUM_DATA}. Use a sparse variational model (inference.fit) for larger data")
    if X_test is not None:
        X_test = as_float_array(X_test, "X_test", ndim=2)
        if X_test.shape[1] != D:
            raise ShapeError("X_test", f"expected [N*, {D}] to match X, got shape {X_test.shape}")
        if N + X_test.shape[0] > MAX_JOINT_POINTS:
            raise InvalidArgumentError(
                "X_test", f"N + N* = {N + X_test.shape[0]} > {MAX_JOINT_POINTS}: the joint draw factorises the prior "
                "covariance at [X; X_test]; pass fewer test inputs per call")
    for name, value, minimum in (("num_chains", num_chains, 1), ("num_warmup", num_warmup, 0),
                                 ("num_samples", num_samples, 1), ("thin", thin, 1), ("chunk_size", chunk_size, 1)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
            raise InvalidArgumentError(name, f"must be an integer >= {minimum}, got {value!r}")
    if not (isinstance(jitter, (int, float)) and jitter >= 0):
        raise InvalidArgumentError("jitter", f"must be a non-negative float, got {jitter!r}")

    dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
    X_all = jnp.asarray(X if X_test is None else np.concatenate([X, X_test]), dtype)  # [N+N*, D]
    K_prior = kernel.K(X_all)  # [N+N*, N+N*]
    L_all, jitter_used = cholesky_with_jitter(K_prior, jitter)  # [N+N*, N+N*]
    if not bool(jnp.all(jnp.isfinite(L_all))):
        raise InvalidArgumentError("kernel", "its covariance at [X; X_test] is not positive definite even with added jitter")
    K_all = K_prior + jitter_used * jnp.eye(X_all.shape[0], dtype=dtype)  # [N+N*, N+N*] = L_all L_allᵀ
    K_cols = K_all[:, :N]  # [N+N*, N]: the columns of the training points
    kappa = jnp.asarray(y, dtype) - 0.5  # [N]

    key_init, key_run = jax.random.split(jax.random.PRNGKey(seed))
    f0 = (L_all @ jax.random.normal(key_init, (X_all.shape[0], num_chains), dtype)).T  # [C, N+N*] prior draws

    total = num_warmup + num_samples * thin
    chunk = min(chunk_size, total)
    chains = jnp.arange(num_chains)

    @jax.jit
    def run_chunk(f_all, start):  # f_all [C, N+N*] -> last state, per-sweep (f_all [K, C, N+N*], ω [K, C, N])
        def body(state, t):
            keys = jax.vmap(lambda c: jax.random.fold_in(jax.random.fold_in(key_run, t), c))(chains)  # [C, 2]
            new, omega = jax.vmap(_sweep, in_axes=(0, None, None, None, 0))(keys, L_all, K_cols, kappa, state[:, :N])
            new = jnp.where(t < total, new, state)  # sweeps past the end (last chunk's padding) do nothing
            return new, (new, omega)

        return jax.lax.scan(body, f_all, start + jnp.arange(chunk))

    keep = np.arange(num_warmup + thin - 1, total, thin)  # global indices of the kept sweeps
    kept_f, kept_omega = [], []
    state = f0
    t0 = time.perf_counter()
    with tqdm(total=total, desc="gibbs", disable=not progress, unit="sweep", leave=False, postfix="compiling") as bar:
        for start in range(0, total, chunk):
            state, (f_chunk, omega_chunk) = run_chunk(state, start)
            rows = keep[(keep >= start) & (keep < start + chunk)] - start
            if rows.size:
                kept_f.append(np.asarray(f_chunk)[rows])  # [k, C, N+N*]
                if store_omega:
                    kept_omega.append(np.asarray(omega_chunk)[rows])  # [k, C, N]
            bar.update(min(chunk, total - start))
            if start == 0:  # the first chunk's time was mostly compilation: the ETA comes from the others
                restart_clock(bar)
                bar.set_postfix_str("")
    seconds = time.perf_counter() - t0

    f_all = np.swapaxes(np.concatenate(kept_f), 0, 1)  # [C, S, N+N*]
    f_train = f_all[..., :N]  # [C, S, N]
    log_lik, lp = _log_density(f_train, y, L_all[:N, :N])

    coords = {"obs_train": np.arange(N), "feature": np.arange(D)}
    dims = {"f": ["obs_train"], "y": ["obs_train"], "omega": ["obs_train"], "X": ["obs_train", "feature"]}
    posterior = {"f": f_train}
    constant = {"X": X}
    if X_test is not None:
        coords["obs_test"] = np.arange(X_test.shape[0])
        dims.update(f_test=["obs_test"], X_test=["obs_test", "feature"])
        posterior["f_test"] = f_all[..., N:]
        constant["X_test"] = X_test
    if store_omega:
        posterior["omega"] = np.swapaxes(np.concatenate(kept_omega), 0, 1)  # [C, S, N]
    data = {
        "posterior": posterior,
        "log_likelihood": {"y": log_lik},
        "observed_data": {"y": y.astype(np.int64)},
        "constant_data": constant,
        "sample_stats": {"lp": lp},
    }
    attrs = {"/": {
        "inference_library": "gpzoo (Pólya-Gamma Gibbs)",
        "kernel": type(kernel).__name__,
        "num_train": N,
        "num_chains": num_chains,
        "num_warmup": num_warmup,
        "num_samples": num_samples,
        "thin": thin,
        "seed": seed,
        "jitter": float(jitter_used),
        "seconds": seconds,
    }}
    return from_dict(data, dims=dims, coords=coords, attrs=attrs)


def _log_density(f, y, L):
    """Per-datum log σ((2y−1)f) ``[C, S, N]`` and lp = log N(f|0, LLᵀ) + Σ_n log σ ``[C, S]``."""
    f = jnp.asarray(f)
    log_lik = jax.nn.log_sigmoid((2.0 * jnp.asarray(y, f.dtype) - 1.0) * f)  # [C, S, N]
    white = solve_triangular(L, f.reshape(-1, f.shape[-1]).T, lower=True)  # [N, C·S]
    log_prior = (-0.5 * jnp.sum(white**2, axis=0) - jnp.sum(jnp.log(jnp.diagonal(L)))
                 - 0.5 * f.shape[-1] * _LOG_2PI).reshape(f.shape[:-1])  # [C, S]
    return np.asarray(log_lik), np.asarray(log_prior + jnp.sum(log_lik, axis=-1))
