"""Pólya–Gamma coordinate ascent / natural gradients for the logistic SVGP (Wenzel et al. 2019).

The model is the plain SVGP of seed 000 §2.1 with a Bernoulli-logit likelihood, one latent
function and inducing points. Its Pólya–Gamma (PG) augmented bound (seed 001 eq. 22–23, with
q(ω_n) = PG(1, c_n) and κ_n = y_n − ½) is

    L(q(u), c) = Σ_n [−log 2 + κ_n E[f_n] − ½ E[ω_n] E[f_n²] − KL[PG(1, c_n) || PG(1, 0)]]
                 − KL[q(u) || p(u)],                                                      (PG)

:func:`pg_bound`, built from :func:`inference.polya_gamma.pg_logistic_bound`: the same bound the
Adam path optimises. Because (PG) is quadratic in f, it is conditionally conjugate (Wenzel et al.
2019, "Efficient Gaussian process classification using Pólya–Gamma data augmentation", AAAI; §3
"variational bound", §4 "stochastic variational inference"; that paper is not among the seeds, so
its equations are written out here rather than cited by number):

* q(ω_n): the optimum is PG(1, c_n), c_n = √E_q[f_n²] (:func:`optimal_c`; d(PG)/dc_n = 0).
* q(u): in whitened coordinates v = Luu⁻¹ u (p(v) = N(0, I)), with A = Luu⁻¹ Kuf ``[M, N]``,
  f_n = a_nᵀ v + (prior conditional noise), θ_n = E[ω_n] = tanh(c_n/2)/(2c_n), (PG) is
  −½ vᵀ(I + A diag(θ) Aᵀ)v + vᵀ A κ + const in expectation, so its optimal q(v) = N(Λ⁻¹h, Λ⁻¹) has
  natural parameters
      h = (N/B) A_b κ_b,   Λ = I + (N/B) A_b diag(θ_b) A_bᵀ     (η1 = h, η2 = −½Λ),
  over a minibatch b of B points (B = N: exact). This is the brief's Kuu⁻¹Kuf form transformed by
  the linear map u = Luu v, which maps natural parameters linearly, so steps in either coordinate
  system are the same step; the whitened one only factorises matrices ⪰ I (well conditioned).
* The natural-gradient step with size ρ on a conditionally conjugate bound is the convex
  combination of natural parameters, η ← (1 − ρ) η + ρ η̂ (Hoffman et al. 2013, SVI). ρ = 1 with
  B = N is coordinate ascent (CAVI): each step maximises (PG) over c, then over q(u), so (PG) never
  decreases. Minibatches use the Robbins–Monro schedule ρ_t = (t + τ)^(−κ), κ ∈ (½, 1]
  (:func:`robbins_monro`; Σρ_t = ∞, Σρ_t² < ∞), default τ = 1, κ = 0.6.
* Hyperparameters (kernel variance and lengthscale, inducing inputs Z): one optax Adam step on
  (PG) between natural-gradient steps, as Wenzel et al. do, with q(u) held fixed in the spec's
  parameterisation (whitened: q(v)) and c at its optimum (the envelope theorem: the gradient of
  max_c (PG) is the gradient at fixed optimal c, so c is a constant there).

The fitted q(u) is stored under the SVGP guide's own names (``q_mu`` ``[1, M]``, ``q_sqrt``
``[1, M, M]`` lower triangular, whitened or not as ``spec.whiten`` says) with the constrained
hyperparameters, so :func:`inference.fit.predict`, :func:`inference.fit.evaluate_elbo` (which
reports the exact Gauss–Hermite ELBO ≥ (PG)) and :func:`analysis.datatree.to_datatree` work
unchanged. NumPyro's SVI is not used: its ELBO machinery has no natural-gradient step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import optax
from jax.scipy.linalg import solve_triangular
from numpyro.distributions import biject_to, constraints
from numpyro.distributions.kl import kl_divergence
from tqdm.auto import tqdm

from inference.fit import FitResult, _BatchSchedule, _float_dtype, _jitter_used, validate_data
from inference.inducing import InducingPoints, InducingVariables, Kuf, initialise_inducing
from inference.polya_gamma import _pg1_mean, optimal_c, pg_logistic_bound
from inference.svgp import SVGP, _has_prior
from models.errors import InvalidArgumentError, TrainingError
from models.likelihoods import Bernoulli
from models.zoo import ModelSpec

__all__ = ["METHOD", "check_spec", "fit_pg_natgrad", "natural_step", "pg_bound", "robbins_monro"]

#: ``ModelSpec.method`` that :func:`inference.fit.fit` routes here.
METHOD = "svgp-logistic-pg"
Q_SITES = ("q_mu", "q_sqrt")


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
    if _has_prior(spec):
        raise InvalidArgumentError("kernel", "the Pólya–Gamma path learns point hyperparameters; remove the priors")


def robbins_monro(tau: float = 1.0, kappa: float = 0.6) -> Callable[[int], float]:
    """ρ_t = (t + τ)^(−κ) with κ ∈ (½, 1], τ ≥ 1 (Hoffman et al. 2013): Σρ = ∞, Σρ² < ∞, ρ ≤ 1."""
    if not 0.5 < kappa <= 1.0:
        raise InvalidArgumentError("kappa", f"must lie in (0.5, 1], got {kappa}")
    if not tau >= 1.0:
        raise InvalidArgumentError("tau", f"must be >= 1 so that every step size is <= 1, got {tau}")
    return lambda step: float((step + tau) ** (-kappa))


# ----------------------------------------------------------------------------- the bound
def _parts(family: SVGP, params):
    with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
        return family.parts()


def pg_bound(family: SVGP, params: dict, X, y, num_data: int | None = None, c=None):
    """(PG): (N/B) Σ_b pg_logistic_bound(y_b, E f_b, E f_b², c_b) − KL[q(u) || p(u)] (seed 001 eq. 23).

    ``params`` are the family's constrained NumPyro params (``kernel.*``, ``inducing.Z``, ``q_mu``,
    ``q_sqrt``); ``c`` ``[B]`` the PG tilts, default their optimum √E[f²] (no gradient through it).
    """
    parts = _parts(family, params)
    mean, var = family.latent_moments(parts, X)  # [B, 1] each
    second = mean[:, 0] ** 2 + var[:, 0]  # [B]
    if c is None:
        c = jax.lax.stop_gradient(optimal_c(second))  # [B]
    scale = (num_data or X.shape[0]) / X.shape[0]
    kl = kl_divergence(family.posterior(parts), family.prior(parts))
    return scale * jnp.sum(pg_logistic_bound(y, mean[:, 0], second, c)) - kl


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


def natural_step(family: SVGP, params: dict, X, y, num_data: int, rho):
    """One natural-gradient step of q(u) on a batch; returns (new q_mu, new q_sqrt, (PG) before the step).

    Closed-form c_b = √E[f_b²] at the current q, then η ← (1 − ρ)η + ρ η̂ with η̂ the batch's
    optimal natural parameters (module docstring). The returned bound is (PG) at the incoming
    parameters with optimal c — the same number :func:`pg_bound` gives there.
    """
    parts = _parts(family, params)
    whiten = family.spec.whiten
    Luu = parts.Luu[0]  # [M, M]
    M, B = Luu.shape[0], X.shape[0]
    eye = jnp.eye(M, dtype=Luu.dtype)
    A = solve_triangular(Luu, Kuf(parts.inducing, parts.kernel, X)[0], lower=True)  # [M, B]  Luu⁻¹ Kuf
    q_mu, q_sqrt = parts.q_mu[0], parts.q_sqrt[0]  # [M], [M, M]
    if not whiten:  # q(u) -> q(v), v = Luu⁻¹ u
        q_mu = solve_triangular(Luu, q_mu, lower=True)
        q_sqrt = solve_triangular(Luu, q_sqrt, lower=True)
    # q(f_b) marginals and the optimal PG tilts (seed 000 eq. 6 in whitened form; seed 001 eq. 23)
    mean = A.T @ q_mu  # [B]
    var = parts.kernel.K_diag(X) - jnp.sum(A**2, 0) + jnp.sum((q_sqrt.T @ A) ** 2, 0)  # [B]
    second = mean**2 + var  # [B]
    c = optimal_c(second)  # [B]
    kappa = jnp.asarray(y, Luu.dtype) - 0.5  # [B]
    scale = num_data / B
    kl = kl_divergence(family.posterior(parts), family.prior(parts))
    bound = scale * jnp.sum(pg_logistic_bound(y, mean, second, c)) - kl
    # natural parameters: batch optimum (h_opt, Λ_opt) and the current q(v) (h, Λ)
    theta = _pg1_mean(c)  # [B]  E[ω_b]
    precision_opt = eye + scale * (A * theta) @ A.T  # [M, M]
    shift_opt = scale * A @ kappa  # [M]
    inv_sqrt = solve_triangular(q_sqrt, eye, lower=True)  # [M, M]  S^{-1/2}
    precision = inv_sqrt.T @ inv_sqrt  # [M, M]  S⁻¹
    shift = precision @ q_mu  # [M]
    precision = (1.0 - rho) * precision + rho * precision_opt
    precision = 0.5 * (precision + precision.T)
    new_mu, new_sqrt = _gaussian_from_precision(precision, (1.0 - rho) * shift + rho * shift_opt)
    if not whiten:  # back to u = Luu v (a product of lower-triangular matrices stays lower)
        new_mu, new_sqrt = Luu @ new_mu, Luu @ new_sqrt
    return new_mu[None], new_sqrt[None], bound


# ----------------------------------------------------------------------------- fitting
def _param_sites(family: SVGP) -> dict:
    """Initial constrained value and constraint of every ``numpyro.param`` the family declares."""
    with numpyro.handlers.trace() as tr, numpyro.handlers.seed(rng_seed=0):
        family.parts()
    return {name: (site["value"], site["kwargs"].get("constraint", constraints.real))
            for name, site in tr.items() if site["type"] == "param"}


def fit_pg_natgrad(
    spec: ModelSpec,
    X,
    y,
    *,
    steps: int = 100,
    batch_size: int | None = None,
    seed: int = 0,
    step_size: float | Callable[[int], float] | None = None,
    learning_rate: float | optax.Schedule = 0.01,
    optimizer: optax.GradientTransformation | None = None,
    learn_hyperparameters: bool | None = None,
    learn_inducing: bool = True,
    inducing: InducingVariables | None = None,
    progress: bool = True,
    chunk_size: int = 25,
) -> FitResult:
    """Fit the logistic SVGP ``spec`` by PG natural gradients / CAVI; returns a :class:`FitResult`.

    ``step_size`` is ρ: a constant or a function of the step; default 1 with all data (CAVI) and
    :func:`robbins_monro` with minibatches. ``learn_hyperparameters`` (default
    ``spec.options.get("learn_hyperparameters", True)``) adds one Adam step (``learning_rate``, or
    ``optimizer``) on (PG) for the kernel hyperparameters — and Z unless ``learn_inducing=False`` —
    after each natural step. ``elbo_history[t]`` is (PG) on step t's batch (scaled to N) before
    the step; ``learning_rate_history`` holds ρ_t (the Adam rate is in ``diagnostics``).
    """
    if not isinstance(spec, ModelSpec):
        raise InvalidArgumentError("spec", f"expected a ModelSpec (zoo.get(name, ...)), got {type(spec).__name__}")
    check_spec(spec)
    X, y = validate_data(spec, X, y)
    N = X.shape[0]
    if not isinstance(steps, (int, np.integer)) or steps < 0:
        raise InvalidArgumentError("steps", f"must be a non-negative integer, got {steps!r}")
    B = N if batch_size is None else batch_size
    if not isinstance(B, (int, np.integer)) or not 1 <= B <= N:
        raise InvalidArgumentError("batch_size", f"must be an integer in [1, {N}], got {batch_size!r}")
    if step_size is None:
        step_size = spec.options.get("step_size") or (1.0 if B == N else robbins_monro())
    rho_at = step_size if callable(step_size) else (lambda step: float(step_size))
    if not callable(step_size) and not 0.0 < float(step_size) <= 1.0:
        raise InvalidArgumentError("step_size", f"must lie in (0, 1], got {step_size!r}")
    if learn_hyperparameters is None:
        learn_hyperparameters = bool(spec.options.get("learn_hyperparameters", True))

    key_inducing, _ = jax.random.split(jax.random.PRNGKey(seed))
    if inducing is None:
        inducing = initialise_inducing(spec.inducing, spec.kernel, X, spec.num_inducing, key_inducing, spec.inducing_init)
    if not isinstance(inducing, InducingPoints):
        raise InvalidArgumentError("inducing", f"the Pólya–Gamma path supports InducingPoints, got {type(inducing).__name__}")
    family = SVGP(spec, inducing, num_latent=1)

    sites = _param_sites(family)
    trainable = {n for n in sites if n not in Q_SITES and learn_hyperparameters and (learn_inducing or not n.startswith("inducing."))}
    fixed = {n: v for n, (v, _) in sites.items() if n not in trainable and n not in Q_SITES}
    transforms = {n: biject_to(sites[n][1]) for n in trainable}
    optimizer = optimizer or optax.adam(learning_rate)

    def constrained(state):
        return {**fixed, **{n: transforms[n](v) for n, v in state["hyper"].items()}, "q_mu": state["q_mu"], "q_sqrt": state["q_sqrt"]}

    hyper0 = {n: transforms[n].inv(sites[n][0]) for n in sorted(trainable)}
    # the scan carry: unconstrained trained hyperparameters, q(u) in the guide's names, Adam state
    state = {"hyper": hyper0, "q_mu": sites["q_mu"][0], "q_sqrt": sites["q_sqrt"][0], "opt": optimizer.init(hyper0)}

    X_j, y_j = jnp.asarray(X), jnp.asarray(y, dtype=_float_dtype())

    def step(state, inputs):
        batch_idx, rho, on = inputs
        Xb, yb = X_j[batch_idx], y_j[batch_idx]
        q_mu, q_sqrt, bound = natural_step(family, constrained(state), Xb, yb, N, rho)
        new = {**state, "q_mu": q_mu, "q_sqrt": q_sqrt}
        if trainable:
            def loss(hyper):
                return -pg_bound(family, constrained({**new, "hyper": hyper}), Xb, yb, N)

            grads = jax.grad(loss)(new["hyper"])
            updates, opt = optimizer.update(grads, new["opt"], new["hyper"])
            new = {**new, "hyper": optax.apply_updates(new["hyper"], updates), "opt": opt}
        new = jax.tree_util.tree_map(lambda a, b: jnp.where(on, a, b), new, state)  # padded steps: no-op
        return new, bound

    run_chunk = jax.jit(lambda state, idx, rhos, active: jax.lax.scan(step, state, (idx, rhos, active)))
    jitter_at = jax.jit(lambda params: _jitter_used(family, params))
    batches = _BatchSchedule(N, B, seed)
    diagnostics = {"jitter": float(spec.jitter), "jitter_events": [], "dtype": str(np.dtype(_float_dtype())),
                   "seconds": 0.0, "method": METHOD, "learn_hyperparameters": bool(learn_hyperparameters),
                   "trained_hyperparameters": sorted(trainable),
                   "hyper_learning_rate": None if callable(learning_rate) else float(learning_rate)}

    def record_jitter(at_step, state):
        jitter = float(jitter_at(constrained(state)))
        if jitter > spec.jitter * 1.0001:
            diagnostics["jitter_events"].append({"step": at_step, "jitter": jitter})

    record_jitter(0, state)
    history, rhos_seen = [], []
    chunk = max(1, min(chunk_size, steps))
    bar = tqdm(total=steps, desc=f"fit {spec.name} (PG natural gradient)", disable=not progress, unit="step", leave=False)
    t0 = time.perf_counter()
    done = 0
    try:
        while done < steps:
            k = min(chunk, steps - done)
            idx = np.stack([batches(s) for s in range(done, done + k)] + [batches(done)] * (chunk - k))  # [chunk, B]
            rhos = np.asarray([rho_at(s) for s in range(done, done + k)] + [1.0] * (chunk - k), dtype=np.dtype(_float_dtype()))
            new_state, bounds = run_chunk(state, idx, rhos, np.arange(chunk) < k)
            bounds = np.asarray(bounds)[:k]
            if not np.all(np.isfinite(bounds)) or not all(np.all(np.isfinite(np.asarray(v))) for v in jax.tree_util.tree_leaves(new_state)):
                bad = done + (int(np.argmin(np.isfinite(bounds))) if not np.all(np.isfinite(bounds)) else k)
                raise TrainingError(
                    f"the Pólya–Gamma bound became non-finite at step {bad} of {spec.name!r}. "
                    "Try a smaller step_size or learning_rate, or a larger jitter.",
                    step=bad,
                )
            state = new_state
            history.extend(bounds.tolist())
            rhos_seen.extend(rhos[:k].tolist())
            done += k
            record_jitter(done, state)
            bar.update(k)
            bar.set_postfix(bound=f"{history[-1]:.4g}")
    finally:
        bar.close()
    diagnostics["seconds"] = time.perf_counter() - t0
    diagnostics["steps"] = steps
    params = {n: np.asarray(v) for n, v in constrained(state).items()}
    return FitResult(
        spec=spec, inducing=inducing, num_latent=1, params=params,
        elbo_history=np.asarray(history), learning_rate_history=np.asarray(rhos_seen),
        diagnostics=diagnostics, num_data=N, X_train=np.asarray(X), y_train=np.asarray(y),
        seed=seed, batch_size=B, _family=family,
    )
