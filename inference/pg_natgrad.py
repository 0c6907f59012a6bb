"""Pólya–Gamma coordinate ascent / natural gradients for the logistic SVGP (Wenzel et al. 2019).

The model is the plain SVGP of van der Wilk et al. 2017, §2.1 with a Bernoulli-logit likelihood, one latent
function and inducing points. Its Pólya–Gamma (PG) augmented bound (van der Wilk et al. 2018, eq. 22–23, with
q(ω_n) = PG(1, c_n) and κ_n = y_n − ½) is

    L(q(u), c) = Σ_n [−log 2 + κ_n E[f_n] − ½ E[ω_n] E[f_n²] − KL[PG(1, c_n) || PG(1, 0)]]
                 − KL[q(u) || p(u)],                                                      (PG)

:func:`pg_bound`, built from :func:`gpzoo.inference.polya_gamma.pg_logistic_bound`: the same bound the
Adam path optimises. Because (PG) is quadratic in f, it is conditionally conjugate (Wenzel et al.
2019, "Efficient Gaussian process classification using Pólya–Gamma data augmentation", AAAI; §3
"variational bound", §4 "stochastic variational inference"; its equations are written out here
rather than cited by number):

* q(ω_n): the optimum is PG(1, c_n), c_n = √E_q[f_n²] (:func:`optimal_c`; d(PG)/dc_n = 0).
* q(u): in whitened coordinates v = Luu⁻¹ u (p(v) = N(0, I)), with A = Luu⁻¹ Kuf ``[M, N]``,
  f_n = a_nᵀ v + (prior conditional noise), θ_n = E[ω_n] = tanh(c_n/2)/(2c_n), (PG) is
  −½ vᵀ(I + A diag(θ) Aᵀ)v + vᵀ A κ + const in expectation, so its optimal q(v) = N(Λ⁻¹h, Λ⁻¹) has
  natural parameters
      h = (N/B) A_b κ_b,   Λ = I + (N/B) A_b diag(θ_b) A_bᵀ     (η1 = h, η2 = −½Λ),
  over a minibatch b of B points (B = N: exact). This is the Kuu⁻¹Kuf form transformed by
  the linear map u = Luu v, which maps natural parameters linearly, so steps in either coordinate
  system are the same step; the whitened one only factorises matrices ⪰ I (well conditioned).
* The natural-gradient step with size ρ on a conditionally conjugate bound is the convex
  combination of natural parameters, η ← (1 − ρ) η + ρ η̂ (Hoffman et al. 2013, SVI). ρ = 1 with
  B = N is coordinate ascent (CAVI): each step maximises (PG) over c, then over q(u), so (PG) never
  decreases. Minibatches use the Robbins–Monro schedule ρ_t = (t + τ)^(−κ), κ ∈ (½, 1]
  (:func:`robbins_monro`; Σρ_t = ∞, Σρ_t² < ∞), default τ = 1, κ = 0.6.
* Full-batch CAVI is a fixed-point iteration on θ = E[ω] ``[N]``; ``acceleration="anderson"``
  extrapolates it from its last few iterates (Anderson mixing with a monotonicity safeguard,
  :func:`anderson_cavi_update`), which reaches the same fixed point in fewer sweeps.
* Hyperparameters (kernel variance and lengthscale, inducing inputs Z): one optax Adam step on
  (PG) between natural-gradient steps, as Wenzel et al. do, with q(u) held fixed in the spec's
  parameterisation (whitened: q(v)) and c at its optimum (the envelope theorem: the gradient of
  max_c (PG) is the gradient at fixed optimal c, so c is a constant there).

Cost. Everything (PG) needs from the kernel is :class:`PGFeatures`: Luu, A = Luu⁻¹ Kuf and the
prior conditional variances k_nn − a_nᵀ a_n (:func:`pg_features`). With the hyperparameters and Z
fixed they do not change between updates, so ``fit_pg_natgrad`` computes them once per fit (for
all N points while M·N ≤ ``FEATURE_CACHE_ELEMENTS``; minibatches then take their columns) and a
step (:func:`natural_update`) is two [M, N] matrix products — S^{1/2}ᵀA for the variances and
A diag(θ) Aᵀ for Λ — plus M×M factorisations; no Kuu, Cholesky of Kuu or solve against Kuf per
step. With hyperparameters trained, the natural step and the hyperparameter gradient share one
evaluation of the features (``jax.vjp``) instead of computing them twice.

The fitted q(u) is stored under the SVGP guide's own names (``q_mu`` ``[1, M]``, ``q_sqrt``
``[1, M, M]`` lower triangular, whitened or not as ``spec.whiten`` says) with the constrained
hyperparameters, so :func:`gpzoo.inference.fit.predict`, :func:`gpzoo.inference.fit.evaluate_elbo` (which
reports the exact Gauss–Hermite ELBO ≥ (PG)) and :func:`gpzoo.analysis.datatree.to_datatree` work
unchanged. NumPyro's SVI is not used: its ELBO machinery has no natural-gradient step. The loop
(chunks, progress, checkpoints and resume, NaN guard, Ctrl-C) is :func:`gpzoo.inference.runner.run_chunks`,
the one the SVI path uses.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import optax
from jax.scipy.linalg import solve_triangular
from numpyro.distributions import biject_to, constraints

from gpzoo.inference.data import BatchSchedule, validate_data
from gpzoo.inference.linalg import float_dtype
from gpzoo.inference.results import FitResult
from gpzoo.inference.programs import ByIdentity, FamilyDefinition, definition_of, family_jit
from gpzoo.inference.runner import ChunkProgram, FitSettings
from gpzoo.inference.inducing import InducingPoints, Kuf, inducing_for
from gpzoo.inference.polya_gamma import pg1_mean, optimal_c, pg_logistic_bound
from gpzoo.inference.svgp import SVGP, has_prior
from gpzoo.models.errors import InvalidArgumentError
from gpzoo.models.likelihoods import Bernoulli
from gpzoo.models.zoo import ModelSpec

__all__ = [
    "ACCELERATIONS",
    "ANDERSON_MEMORY",
    "AndersonMemory",
    "FEATURE_CACHE_ELEMENTS",
    "METHOD",
    "PGFeatures",
    "anderson_cavi_update",
    "anderson_init",
    "check_spec",
    "features_bound",
    "fit_pg_natgrad",
    "natural_step",
    "natural_update",
    "pg_bound",
    "pg_features",
    "robbins_monro",
]

#: ``ModelSpec.method`` that :func:`gpzoo.inference.fit.fit` routes here.
METHOD = "svgp-logistic-pg"
Q_SITES = ("q_mu", "q_sqrt")
#: With fixed hyperparameters, A = Luu⁻¹ Kuf is kept for all N points when M·N is at most this
#: (2^26 elements: 512 MiB in float64); above it each step computes its batch's columns.
FEATURE_CACHE_ELEMENTS = 2**26
#: Differences of past iterates Anderson-accelerated CAVI extrapolates from (``acceleration="anderson"``).
ANDERSON_MEMORY = 5
#: Values of ``fit_pg_natgrad(acceleration=...)``.
ACCELERATIONS = (None, "anderson")


# ----------------------------------------------------------------------------- checks
def check_spec(spec: ModelSpec) -> None:
    """Raise ``InvalidArgumentError`` unless ``spec`` is a single-latent logistic SVGP this path fits."""
    lik = spec.likelihood
    if not (isinstance(lik, Bernoulli) and lik.link == "logit"):
        raise InvalidArgumentError("likelihood", f"the Pólya–Gamma path needs Bernoulli(link='logit'), got {lik!r}")
    if spec.inducing != "points":
        raise InvalidArgumentError("inducing", f"the Pólya–Gamma path supports inducing points only, got {spec.inducing!r}")
    if spec.q_structure != "full":
        raise InvalidArgumentError("q_structure", f"natural-gradient steps give a full-rank q(u); got {spec.q_structure!r}")
    if has_prior(spec):
        raise InvalidArgumentError("kernel", "the Pólya–Gamma path learns point hyperparameters; remove the priors")


def robbins_monro(tau: float = 1.0, kappa: float = 0.6) -> Callable[[int], float]:
    """ρ_t = (t + τ)^(−κ) with κ ∈ (½, 1], τ ≥ 1 (Hoffman et al. 2013): Σρ = ∞, Σρ² < ∞, ρ ≤ 1."""
    if not 0.5 < kappa <= 1.0:
        raise InvalidArgumentError("kappa", f"must lie in (0.5, 1], got {kappa}")
    if not tau >= 1.0:
        raise InvalidArgumentError("tau", f"must be >= 1 so that every step size is <= 1, got {tau}")
    return lambda step: float((step + tau) ** (-kappa))


# ----------------------------------------------------------------------------- features and the bound
class PGFeatures(NamedTuple):
    """What (PG) needs from the kernel at given hyperparameters, for N inputs (a pytree)."""

    Luu: jax.Array  # [M, M]  chol(Kuu + jitter)
    A: jax.Array  # [M, N]  Luu⁻¹ Kuf
    resid: jax.Array  # [N]  k(x_n, x_n) − a_nᵀ a_n: the prior conditional variance of f_n given u

    def columns(self, idx) -> PGFeatures:
        """The features of the inputs ``idx`` ``[B]``."""
        return PGFeatures(self.Luu, self.A[:, idx], self.resid[idx])


def _parts(family: SVGP, params):
    with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
        return family.parts()


def pg_features(family: SVGP, params: dict, X) -> PGFeatures:
    """:class:`PGFeatures` of inputs ``X`` ``[N, D]`` at the constrained ``params`` (q(u) is not read)."""
    parts = _parts(family, params)
    Luu = parts.Luu[0]  # [M, M]
    A = solve_triangular(Luu, Kuf(parts.inducing, parts.kernel, X)[0], lower=True)  # [M, N]
    return PGFeatures(Luu, A, parts.kernel.K_diag(X) - jnp.sum(A**2, 0))


def _whitened(features: PGFeatures, q_mu, q_sqrt, whiten: bool):
    """q(v) of v = Luu⁻¹ u as (mean ``[M]``, lower S^{1/2} ``[M, M]``) from the guide's ``[1, M]``, ``[1, M, M]``."""
    mean, sqrt = q_mu[0], q_sqrt[0]
    if whiten:
        return mean, sqrt
    return solve_triangular(features.Luu, mean, lower=True), solve_triangular(features.Luu, sqrt, lower=True)


def _bound_terms(features: PGFeatures, mean_v, sqrt_v):
    """(E f ``[N]``, E f² ``[N]``, KL[q(v) || N(0, I)]) for q(v) = N(mean_v, sqrt_v sqrt_vᵀ).

    q(f_n) in whitened form (van der Wilk et al. 2017, eq. 6): E f_n = a_nᵀ m, Var f_n = resid_n + ‖S^{1/2}ᵀ a_n‖²;
    the KL equals KL[q(u) || p(u)] in either parameterisation (u = Luu v is linear).
    """
    A = features.A
    mean = A.T @ mean_v  # [N]
    var = features.resid + jnp.sum((sqrt_v.T @ A) ** 2, 0)  # [N]
    M = A.shape[0]
    kl = 0.5 * (jnp.sum(sqrt_v**2) + mean_v @ mean_v - M - 2.0 * jnp.sum(jnp.log(jnp.diagonal(sqrt_v))))
    return mean, mean**2 + var, kl


def features_bound(features: PGFeatures, y, q_mu, q_sqrt, *, scale=1.0, whiten: bool = True, c=None):
    """(PG) from features: scale·Σ_n pg_logistic_bound(y_n, E f_n, E f_n², c_n) − KL (van der Wilk et al. 2018, eq. 23).

    ``q_mu`` ``[1, M]``, ``q_sqrt`` ``[1, M, M]`` in the guide's parameterisation (``whiten``);
    ``c`` ``[N]`` the PG tilts, default their optimum √E[f²] (no gradient through it).
    """
    mean_v, sqrt_v = _whitened(features, q_mu, q_sqrt, whiten)
    mean, second, kl = _bound_terms(features, mean_v, sqrt_v)
    if c is None:
        c = jax.lax.stop_gradient(optimal_c(second))  # [N]
    return scale * jnp.sum(pg_logistic_bound(y, mean, second, c)) - kl


def pg_bound(family: SVGP, params: dict, X, y, num_data: int | None = None, c=None):
    """(PG): (N/B) Σ_b pg_logistic_bound(y_b, E f_b, E f_b², c_b) − KL[q(u) || p(u)] (van der Wilk et al. 2018, eq. 23).

    ``params`` are the family's constrained NumPyro params (``kernel.*``, ``inducing.Z``, ``q_mu``,
    ``q_sqrt``); ``c`` ``[B]`` the PG tilts, default their optimum √E[f²] (no gradient through it).
    """
    scale = (num_data or X.shape[0]) / X.shape[0]
    return features_bound(pg_features(family, params, X), y, params["q_mu"], params["q_sqrt"], scale=scale,
                          whiten=family.spec.whiten, c=c)


# ----------------------------------------------------------------------------- q(u) update
def _gaussian_from_precision(precision, shift):
    """(mean, lower S^{1/2}) of N(Λ⁻¹h, Λ⁻¹) from Λ ``[M, M]``, h ``[M]``, factorising Λ once.

    With J the exchange matrix, chol(JΛJ) = L' gives Λ = U Uᵀ for the upper-triangular U = J L' J,
    so Λ⁻¹ = U⁻ᵀ U⁻¹ and U⁻ᵀ is the *lower* square root the guide's ``q_sqrt`` must be — no
    explicit inverse of Λ and no second factorisation. Λ ⪰ min(1, λ_min(current Λ)) here, so a
    plain Cholesky is safe (a failure shows as NaN and stops the fit with a ``TrainingError``).
    """
    upper = jnp.linalg.cholesky(precision[::-1, ::-1])[::-1, ::-1]  # [M, M], Λ = U Uᵀ
    q_sqrt = solve_triangular(upper, jnp.eye(precision.shape[0], dtype=precision.dtype), lower=False, trans=1)  # U⁻ᵀ
    mean = q_sqrt @ solve_triangular(upper, shift, lower=False)  # U⁻ᵀ U⁻¹ h  [M]
    return mean, q_sqrt


def natural_update(features: PGFeatures, y, q_mu, q_sqrt, *, scale, rho, whiten: bool = True):
    """One natural-gradient step of q(u) on a batch with precomputed features; returns (q_mu, q_sqrt, (PG) before).

    ``features`` and ``y`` ``[B]`` are the batch's, ``scale`` = N/B, ``rho`` the step size;
    ``q_mu`` ``[1, M]``, ``q_sqrt`` ``[1, M, M]`` in the guide's parameterisation (``whiten``),
    returned in it. Closed-form c_b = √E[f_b²] at the current q, then η ← (1 − ρ)η + ρ η̂ with η̂
    the batch's optimal natural parameters (module docstring). The returned bound is (PG) at the
    incoming q with optimal c, the number :func:`features_bound` gives there.
    """
    mean_v, sqrt_v = _whitened(features, q_mu, q_sqrt, whiten)  # [M], [M, M]
    A = features.A  # [M, B]
    eye = jnp.eye(A.shape[0], dtype=A.dtype)
    mean, second, kl = _bound_terms(features, mean_v, sqrt_v)  # [B], [B], scalar
    c = optimal_c(second)  # [B]
    bound = scale * jnp.sum(pg_logistic_bound(y, mean, second, c)) - kl
    # natural parameters: the batch optimum (h_opt, Λ_opt), mixed with the current q(v)'s (h, Λ)
    theta = pg1_mean(c)  # [B]  E[ω_b]
    precision_opt = eye + scale * (A * theta) @ A.T  # [M, M]
    shift_opt = scale * A @ (jnp.asarray(y, A.dtype) - 0.5)  # [M]

    def mixed():
        inv_sqrt = solve_triangular(sqrt_v, eye, lower=True)  # [M, M]  S^{-1/2}
        precision = inv_sqrt.T @ inv_sqrt  # [M, M]  S⁻¹
        return (1.0 - rho) * precision + rho * precision_opt, (1.0 - rho) * (precision @ mean_v) + rho * shift_opt

    # ρ = 1 (CAVI) needs nothing of the current q(v): skip forming S⁻¹
    precision, shift = jax.lax.cond(rho == 1.0, lambda: (precision_opt, shift_opt), mixed)
    new_mean, new_sqrt = _gaussian_from_precision(0.5 * (precision + precision.T), shift)
    if not whiten:  # back to u = Luu v (a product of lower-triangular matrices stays lower)
        new_mean, new_sqrt = features.Luu @ new_mean, features.Luu @ new_sqrt
    return new_mean[None], new_sqrt[None], bound


def natural_step(family: SVGP, params: dict, X, y, num_data: int, rho):
    """:func:`natural_update` computing the batch's features from ``params`` first (one self-contained step)."""
    return natural_update(pg_features(family, params, X), y, params["q_mu"], params["q_sqrt"],
                          scale=num_data / X.shape[0], rho=rho, whiten=family.spec.whiten)


# ----------------------------------------------------------------------------- accelerated CAVI
class AndersonMemory(NamedTuple):
    """The carry of Anderson-accelerated CAVI (:func:`anderson_cavi_update`) over N points, memory m; a pytree."""

    theta: jax.Array  # [N]  θ = E[ω] defining the current q(v) = q(θ) (meaningful once `started`)
    thetas: jax.Array  # [m+1, N]  accepted iterates, oldest first; the last `count` rows are valid
    residuals: jax.Array  # [m+1, N]  G(θ) − θ at them
    count: jax.Array  # int32 scalar
    best_bound: jax.Array  # (PG) at the last accepted iterate (the lowest float before the first)
    best_step: jax.Array  # [N]  G(θ) at it: the plain CAVI step a rejected extrapolation falls back to
    started: jax.Array  # bool: false while q(v) is still the initial q, not of the form q(θ)


def anderson_init(num_data: int, memory: int = ANDERSON_MEMORY, dtype=None) -> AndersonMemory:
    """An empty :class:`AndersonMemory` for ``num_data`` points remembering ``memory`` differences."""
    dtype = dtype or float_dtype()
    zeros = jnp.zeros((memory + 1, num_data), dtype)
    lowest = jnp.asarray(jnp.finfo(dtype).min, dtype)  # below every bound, and finite (the NaN guard checks the state)
    return AndersonMemory(jnp.zeros(num_data, dtype), zeros, zeros, jnp.asarray(0, jnp.int32), lowest,
                          jnp.zeros(num_data, dtype), jnp.asarray(False))


def _push(rows, row):
    """Drop the oldest of ``rows`` ``[m+1, N]`` and append ``row`` ``[N]``."""
    return jnp.concatenate([rows[1:], row[None]], axis=0)


def anderson_cavi_update(features: PGFeatures, y, q_mu, q_sqrt, memory: AndersonMemory, *, whiten: bool = True):
    """One full-batch CAVI sweep accelerated by Anderson mixing; returns (q_mu, q_sqrt, memory, (PG) before).

    Full-batch CAVI with ρ = 1 is a fixed-point iteration θ ← G(θ) on θ_n = E[ω_n]: q(v) = q(θ)
    has Λ = I + A diag(θ) Aᵀ, h = Aκ, and G(θ)_n = tanh(c_n/2)/(2c_n) at c_n = √E_q(θ)[f_n²]
    (module docstring). It converges linearly, slowly when c and q(u) are strongly coupled.
    Anderson mixing (Walker & Ni 2011, "Anderson acceleration for fixed-point iterations", SIAM
    J. Numer. Anal. 49(4); written out here: no library in the stack provides it) extrapolates
    from the last m iterates x_j and residuals f_j = G(x_j) − x_j:

        γ = argmin_γ ‖f_k − ΔF γ‖² (ridge 1e-10·tr),   x_{k+1} = x_k + f_k − (ΔX + ΔF) γ,

    then clips θ to [0, ¼] (the range of E[ω]; Λ ⪰ I stays positive definite). Safeguard
    (monotonicity control): an iterate whose (PG) is below the last accepted one is rejected, the
    memory cleared and the plain CAVI step from the last accepted iterate taken instead, so the
    accepted iterates never decrease (PG). Each sweep costs one CAVI step plus O(N m²). Every
    q(θ) is a valid q(u) and (PG) at it a valid bound; the fixed point is CAVI's.
    """
    mean_v, sqrt_v = _whitened(features, q_mu, q_sqrt, whiten)
    A = features.A  # [M, N]
    M = A.shape[0]
    mean, second, kl = _bound_terms(features, mean_v, sqrt_v)  # [N], [N], scalar
    c = optimal_c(second)  # [N]
    bound = jnp.sum(pg_logistic_bound(y, mean, second, c)) - kl
    step = pg1_mean(c)  # [N]  G(θ) (or the first CAVI step from the initial q)
    accept = bound >= memory.best_bound - 1e-12 * jnp.abs(memory.best_bound)
    push = jnp.logical_and(accept, memory.started)
    thetas = jnp.where(push, _push(memory.thetas, memory.theta), memory.thetas)  # [m+1, N]
    residuals = jnp.where(push, _push(memory.residuals, step - memory.theta), memory.residuals)
    count = jnp.where(push, jnp.minimum(memory.count + 1, thetas.shape[0]), jnp.where(accept, memory.count, 0))
    # ΔX, ΔF [N, m]: differences of consecutive rows, zeroed where a row is not valid
    valid = jnp.arange(1, thetas.shape[0]) >= thetas.shape[0] - count + 1  # [m]
    dX = jnp.where(valid, jnp.diff(thetas, axis=0).T, 0.0)  # [N, m]
    dF = jnp.where(valid, jnp.diff(residuals, axis=0).T, 0.0)  # [N, m]
    gram = dF.T @ dF  # [m, m]
    ridge = 1e-10 * jnp.trace(gram) + jnp.finfo(gram.dtype).tiny
    f = residuals[-1]  # [N]
    gamma = jnp.linalg.solve(gram + ridge * jnp.eye(gram.shape[0], dtype=gram.dtype), dF.T @ f)  # [m]
    mixed = thetas[-1] + f - (dX + dF) @ gamma  # [N]
    theta = jnp.where(push, mixed, jnp.where(accept, step, memory.best_step))
    theta = jnp.clip(theta, 0.0, 0.25)
    memory = AndersonMemory(theta, thetas, residuals, count, jnp.where(accept, bound, memory.best_bound),
                            jnp.where(accept, step, memory.best_step), jnp.asarray(True))
    precision = jnp.eye(M, dtype=A.dtype) + (A * theta) @ A.T  # [M, M]
    new_mean, new_sqrt = _gaussian_from_precision(0.5 * (precision + precision.T), A @ (jnp.asarray(y, A.dtype) - 0.5))
    if not whiten:
        new_mean, new_sqrt = features.Luu @ new_mean, features.Luu @ new_sqrt
    return new_mean[None], new_sqrt[None], memory, bound


# ----------------------------------------------------------------------------- fitting
@dataclasses.dataclass(frozen=True)
class PgStep:
    """The static definition of a Pólya–Gamma natural-gradient step (hashable, compared by value):
    the family's structure, the trained hyperparameters' names and constraints, and the step's
    options. Its constants are ``(family leaves, fixed params, N/B, X, y[, all features])``."""

    definition: FamilyDefinition
    trainable: tuple[str, ...]
    constraints: tuple  # of each trained hyperparameter (NumPyro constraints, by identity)
    whiten: bool
    full_batch: bool
    cached: bool
    acceleration: str | None
    optimizer: Any = None
    schedule: Any = None

    def make_optimizer(self, learning_rate=0.0):
        if self.optimizer is not None:
            return self.optimizer.value
        return optax.inject_hyperparams(optax.adam)(learning_rate=self.schedule.value if self.schedule is not None else learning_rate)

    def constrained(self, state, constants) -> dict:
        fixed = constants[1]
        hyper = {n: biject_to(c.value)(state["hyper"][n]) for n, c in zip(self.trainable, self.constraints)}
        return {**fixed, **hyper, "q_mu": state["q_mu"], "q_sqrt": state["q_sqrt"]}

    def update(self, state, inputs, constants):
        family = self.definition.build(constants[0])
        scale, X_all, y_all = constants[2:5]
        batch_idx, rho = inputs
        if self.trainable:
            Xb, yb = X_all[batch_idx], y_all[batch_idx]
            features, pullback = jax.vjp(
                lambda hyper: pg_features(family, self.constrained({**state, "hyper": hyper}, constants), Xb), state["hyper"])
            q_mu, q_sqrt, bound = natural_update(features, yb, state["q_mu"], state["q_sqrt"], scale=scale, rho=rho,
                                                 whiten=self.whiten)
            # Adam on the hyperparameters at the new q(u), c at its optimum (held constant: envelope theorem)
            feature_grads = jax.grad(lambda f: -features_bound(f, yb, q_mu, q_sqrt, scale=scale, whiten=self.whiten))(features)
            (grads,) = pullback(feature_grads)
            updates, opt = self.make_optimizer().update(grads, state["opt"], state["hyper"])
            return {"hyper": optax.apply_updates(state["hyper"], updates), "q_mu": q_mu, "q_sqrt": q_sqrt, "opt": opt}, bound
        if self.full_batch and self.cached:
            features, yb = constants[5], y_all
        elif self.cached:
            features, yb = constants[5].columns(batch_idx), y_all[batch_idx]
        else:
            features, yb = pg_features(family, self.constrained(state, constants), X_all[batch_idx]), y_all[batch_idx]
        if self.acceleration == "anderson":
            q_mu, q_sqrt, memory, bound = anderson_cavi_update(features, yb, state["q_mu"], state["q_sqrt"],
                                                               state["anderson"], whiten=self.whiten)
            return {**state, "q_mu": q_mu, "q_sqrt": q_sqrt, "anderson": memory}, bound
        q_mu, q_sqrt, bound = natural_update(features, yb, state["q_mu"], state["q_sqrt"], scale=scale, rho=rho, whiten=self.whiten)
        return {**state, "q_mu": q_mu, "q_sqrt": q_sqrt}, bound

    def jitter_of(self, state, constants):
        return self.definition.build(constants[0]).jitter_used(self.constrained(state, constants))


@functools.partial(jax.jit, static_argnums=0)
def _constrained(step: PgStep, state, constants) -> dict:
    return step.constrained(state, constants)


@functools.partial(jax.jit, static_argnums=0)
def _all_features(step: PgStep, state, constants):
    """The features of every training input at the initial state (fixed hyperparameters: computed once)."""
    return pg_features(step.definition.build(constants[0]), step.constrained(state, constants), constants[3])


#: Constraint of every param site, per family structure (recorded when :func:`_param_values` is traced).
_SITE_CONSTRAINTS: dict = {}


@family_jit
def _param_values(family: SVGP) -> dict:
    """Initial constrained value of every ``numpyro.param`` the family declares (one program per structure)."""
    with numpyro.handlers.trace() as tr, numpyro.handlers.seed(rng_seed=0):
        family.parts()
    _SITE_CONSTRAINTS.setdefault(definition_of(family)[0], {
        name: site["kwargs"].get("constraint", constraints.real) for name, site in tr.items() if site["type"] == "param"})
    return {name: site["value"] for name, site in tr.items() if site["type"] == "param"}


def _param_sites(family: SVGP) -> dict:
    """Initial constrained value and constraint of every ``numpyro.param`` the family declares."""
    values = _param_values(family)
    site_constraints = _SITE_CONSTRAINTS[definition_of(family)[0]]
    return {name: (value, site_constraints[name]) for name, value in values.items()}


def fit_pg_natgrad(
    spec: ModelSpec,
    X,
    y,
    *,
    family_class: type = SVGP,
    step_size: float | Callable[[int], float] | None = None,
    learn_hyperparameters: bool | None = None,
    learn_inducing: bool = True,
    acceleration: str | None = None,
    settings: FitSettings | None = None,
    **run,
) -> FitResult:
    """Fit the logistic SVGP ``spec`` by PG natural gradients / CAVI; returns a :class:`FitResult`.

    ``step_size`` is ρ: a constant or a function of the step; default 1 with all data (CAVI) and
    :func:`robbins_monro` with minibatches. ``learn_hyperparameters`` (default
    ``spec.options.get("learn_hyperparameters", True)``) adds one Adam step (``learning_rate``, or
    ``optimizer``) on (PG) for the kernel hyperparameters — and Z unless ``learn_inducing=False`` —
    after each natural step; without it the features are computed once (module docstring).
    ``acceleration="anderson"`` (default ``spec.options.get("acceleration")``) runs full-batch
    CAVI with Anderson mixing (:func:`anderson_cavi_update`; fixed hyperparameters, all data, ρ = 1).
    ``objective_history[t]`` is (PG) on step t's batch (scaled to N) before the step;
    ``step_size_history`` holds ρ_t (the Adam rate is in ``diagnostics``). Checkpoints,
    ``resume`` and the NaN guard behave as in :func:`gpzoo.inference.fit.fit`, whose keyword
    arguments (``steps``, ``batch_size``, ``seed``, ...) this takes as ``**run`` or as ``settings``.
    """
    if not isinstance(spec, ModelSpec):
        raise InvalidArgumentError("spec", f"expected a ModelSpec (zoo.get(name, ...)), got {type(spec).__name__}")
    check_spec(spec)
    X, y = validate_data(spec, X, y)
    N = X.shape[0]
    settings = FitSettings.from_keywords(run) if settings is None else settings
    B = settings.batch_size_for(N)
    seed, learning_rate, optimizer, inducing = settings.seed, settings.learning_rate, settings.optimizer, settings.inducing
    if step_size is None:
        step_size = spec.options.get("step_size") or (1.0 if B == N else robbins_monro())
    rho_at = step_size if callable(step_size) else (lambda step: float(step_size))
    if not callable(step_size) and not 0.0 < float(step_size) <= 1.0:
        raise InvalidArgumentError("step_size", f"must lie in (0, 1], got {step_size!r}")
    if learn_hyperparameters is None:
        learn_hyperparameters = bool(spec.options.get("learn_hyperparameters", True))
    if acceleration is None:
        acceleration = spec.options.get("acceleration")
    if acceleration not in ACCELERATIONS:
        raise InvalidArgumentError("acceleration", f"must be one of {ACCELERATIONS}, got {acceleration!r}")
    if acceleration == "anderson" and (B != N or learn_hyperparameters or callable(step_size) or float(step_size) != 1.0):
        raise InvalidArgumentError("acceleration", "Anderson-accelerated CAVI needs all data per step (batch_size=None), "
                                   "step_size=1 and fixed hyperparameters (learn_hyperparameters=False)")

    config = settings.resume_config(spec.name, METHOD if acceleration is None else f"{METHOD}+{acceleration}", X, y, B)

    key_inducing, _ = jax.random.split(jax.random.PRNGKey(seed))
    inducing = inducing_for(spec, X, key_inducing, inducing)
    if not isinstance(inducing, InducingPoints):
        raise InvalidArgumentError("inducing", f"the Pólya–Gamma path supports InducingPoints, got {type(inducing).__name__}")
    family = family_class(spec, inducing, num_latent=1)

    sites = _param_sites(family)
    trainable = {n for n in sites if n not in Q_SITES and learn_hyperparameters and (learn_inducing or not n.startswith("inducing."))}
    fixed = {n: jnp.asarray(v) for n, (v, _) in sites.items() if n not in trainable and n not in Q_SITES}
    names = tuple(sorted(trainable))
    definition, leaves = definition_of(family)
    step = PgStep(
        definition, trainable=names, constraints=tuple(ByIdentity(sites[n][1]) for n in names), whiten=bool(spec.whiten),
        full_batch=B == N, cached=not trainable and spec.num_inducing * N <= FEATURE_CACHE_ELEMENTS,
        acceleration=acceleration,
        optimizer=None if optimizer is None else ByIdentity(optimizer),
        schedule=ByIdentity(learning_rate) if optimizer is None and callable(learning_rate) else None,
    )
    dtype = np.dtype(float_dtype())
    hyper0 = {n: biject_to(sites[n][1]).inv(sites[n][0]) for n in names}
    # the scan carry: unconstrained trained hyperparameters, q(u) in the guide's names, Adam state
    opt = step.make_optimizer(np.asarray(0.0 if callable(learning_rate) else learning_rate, dtype))
    state = {"hyper": hyper0, "q_mu": sites["q_mu"][0], "q_sqrt": sites["q_sqrt"][0], "opt": opt.init(hyper0)}
    if acceleration == "anderson":
        state["anderson"] = anderson_init(N)

    X_j, y_j = jnp.asarray(X), jnp.asarray(y, dtype=float_dtype())
    constants = (leaves, fixed, np.asarray(N / B, dtype), X_j, y_j)
    if step.cached:
        constants = constants + (_all_features(step, state, constants),)

    batches = BatchSchedule(N, B, seed)
    diagnostics = {"jitter": float(spec.jitter), "jitter_events": [], "dtype": str(dtype),
                   "seconds": 0.0, "method": METHOD, "learn_hyperparameters": bool(learn_hyperparameters),
                   "acceleration": acceleration,
                   "trained_hyperparameters": sorted(trainable),
                   "hyper_learning_rate": None if callable(learning_rate) else float(learning_rate)}

    program = ChunkProgram(
        label=f"fit {spec.name} (PG natural gradient)", objective="Pólya–Gamma bound", constants=constants,
        step=step,
        step_inputs=lambda s: (batches(s), np.asarray(rho_at(s), dtype)), rate_at=lambda s: float(rho_at(s)),
        params_of=lambda state: _constrained(step, state, constants),
        config={**config, "trained_hyperparameters": sorted(trainable)},
        hint="Try a smaller step_size or learning_rate, or a larger jitter.",
        jitter=float(spec.jitter),
    )
    state, history, rhos_seen = settings.run(program, state, diagnostics)
    params = {n: np.asarray(v) for n, v in _constrained(step, state, constants).items()}
    return FitResult(
        spec=spec, inducing=inducing, num_latent=1, params=params,
        objective_history=np.asarray(history), step_size_history=np.asarray(rhos_seen),
        diagnostics=diagnostics, num_data=N, X_train=np.asarray(X), y_train=np.asarray(y),
        family=family, seed=seed, batch_size=B, objective="Pólya–Gamma bound", step_size="natural-gradient step ρ",
    )
