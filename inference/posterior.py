"""Draws of the inducing outputs u ~ q(u) and the exact conditional p(f | u) of every SVGP family.

What a posterior *sample* of a sparse GP means (used by :func:`gpzoo.analysis.to_datatree`):

* u_s ~ q(u) — unwhitened inducing outputs ``[L, G·M]`` (a whitened guide draws v_s and
  returns u_s = Luu v_s), with their log densities under q and under the prior p(u), both in
  u-space (the Jacobian log|Luu| of the whitening is applied to both);
* p(f_n | u) = N(Kfu Kuu⁻¹ u, Kff − Qff) (van der Wilk et al. 2017, eq. 6 with S = 0) for any inputs;
* log p(y_n | u_s) = log ∫ p(y_n | f_n) p(f_n | u_s) df_n, which is exactly the likelihood's
  ``predict_log_density(y_n, μ_n(u_s), σ²_n)`` (analytic or quadrature, as the likelihood decides);
* replicated y_n ~ p(y_n | u_s) for posterior-predictive checks.

Sampled hyperparameters θ (sites with a prior) are drawn from their guide first; each u_s is
then drawn given θ_s and the log densities include log q(θ_s) and log p(θ_s). Only the M×M
blocks of Kuu are factorised (``cholesky_with_jitter``); Kuf is computed in chunks of inputs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.handlers import condition, seed, substitute, trace

from gpzoo.inference.compilation import adaptive_jit
from gpzoo.inference.data import check_new_inputs
from gpzoo.inference.guides import blockdiag_matvec, blockdiag_solve
from gpzoo.inference.linalg import float_dtype
from gpzoo.inference.programs import BLOCK_SIZES
from gpzoo.inference.results import FitResult
from gpzoo.models import draws
from gpzoo.models.errors import InvalidArgumentError, ShapeError

__all__ = ["InducingDraws", "PointwiseDraws", "Summaries", "conditional_given_u", "draws_and_summaries", "pointwise_given_u",
           "sample_inducing", "summaries_supported"]

#: Rows of X handled at once when forming Kuf ``[G, M, rows]`` (bounds memory for conv kernels).
CHUNK_ROWS = 256

@dataclasses.dataclass(frozen=True)
class InducingDraws:
    """S joint draws from the approximate posterior q(θ) q(u | θ) and their log densities."""

    u: np.ndarray  # [S, L, GM] unwhitened inducing outputs
    log_q: np.ndarray  # [S] log q(u_s) (+ log q(θ_s))
    log_prior: np.ndarray  # [S] log p(u_s) (+ log p(θ_s))
    hyper: dict[str, np.ndarray]  # site -> [S, ...] sampled hyperparameters; empty for type-II fits

    @property
    def num_draws(self) -> int:
        return int(self.u.shape[0])

@dataclasses.dataclass(frozen=True)
class PointwiseDraws:
    """Per-draw, per-point quantities given u_s: log p(y_n | u_s) and a replicate y_n ~ p(y | u_s)."""

    log_lik: np.ndarray  # [S, N]
    y_rep: np.ndarray  # [S, N] (integers for classification / count likelihoods)

# ----------------------------------------------------------------------------- helpers
def _check_family(res: FitResult):
    if not isinstance(res, FitResult):
        raise InvalidArgumentError("res", f"expected a FitResult from gpzoo.inference.fit, got {type(res).__name__}")
    family = res.family
    for needed in ("parts", "posterior", "prior"):
        if not hasattr(family, needed):
            raise InvalidArgumentError(
                "res", f"model {res.spec.name!r} (method {res.spec.method!r}) has no single inducing posterior q(u) to sample"
            )
    return family

def _parts(family, params):
    """The realised model (kernel, likelihood, Luu, q(u) parameters) at constrained ``params``."""
    with substitute(data=params), seed(rng_seed=0):
        return family.parts()

def _sample_hyper(res: FitResult, key, num_draws: int) -> dict[str, jax.Array]:
    """θ_s ~ q(θ) for the sites with a prior (empty dict for type-II fits), ``[S, ...]`` each.

    Drawn by running the hyper guide itself (seeded, its params substituted), so the draws come
    from exactly the distribution whose density ``_hyper_log_densities`` reads off the same guide.
    """
    guide = res.family.hyper_guide
    if guide is None:
        return {}
    X1 = jnp.asarray(res.X_train[:1])
    y1 = jnp.asarray(res.y_train[:1], float_dtype())

    def one(k):
        tr = trace(seed(substitute(guide, data=res.params), k)).get_trace(X1, y1, res.num_data)
        return {name: site["value"] for name, site in tr.items() if site["type"] == "sample" and not site.get("is_observed")}

    return jax.vmap(one)(jax.random.split(key, num_draws))

def _hyper_log_densities(family, num_data: int, params, values: dict, X1, y1):
    """(log q(θ), log p(θ)) of one draw θ, read off traces of the hyper guide and the model."""
    guide_tr = trace(substitute(condition(family.hyper_guide, values), data=params)).get_trace(X1, y1, num_data)
    model_tr = trace(seed(substitute(condition(family.model, values), data=params), 0)).get_trace(X1, y1, num_data)
    log_q = sum(jnp.sum(guide_tr[k]["fn"].log_prob(v)) for k, v in values.items())
    log_p = sum(jnp.sum(model_tr[k]["fn"].log_prob(v)) for k, v in values.items())
    return log_q, log_p

def _check_draws(res: FitResult, draws: InducingDraws) -> None:
    if not isinstance(draws, InducingDraws):
        raise InvalidArgumentError("draws", f"expected InducingDraws from sample_inducing, got {type(draws).__name__}")
    expected = tuple(np.shape(res.params["q_mu"]))
    if tuple(draws.u.shape[1:]) != expected:
        raise ShapeError("draws", f"u has shape {draws.u.shape}, expected [S, {expected[0]}, {expected[1]}] for this model")

# ----------------------------------------------------------------------------- q(u) draws
@adaptive_jit(static_argnums=(0, 1))
def _draw_inducing(family, num_data: int, params, hyper, keys, X1, y1):
    """vmap over draws s of (u_s ``[L, GM]``, log q, log p) given θ_s (``hyper``, possibly empty).

    Module-level and jitted with the family static, so repeated calls for one fit compile once.
    """

    def one(h, key):
        w, log_q, log_p = _draw_given_parts(family, _parts(family, {**params, **h}), key)
        if h:
            hq, hp = _hyper_log_densities(family, num_data, params, h, X1, y1)
            log_q, log_p = log_q + hq, log_p + hp
        return w, log_q, log_p

    return jax.vmap(one)(hyper, keys)


def _draw_given_parts(family, parts, key):
    """One draw u ``[L, GM]`` ~ q(u) of the realised model ``parts``, with log q(u) and log p(u)."""
    q, p = family.posterior(parts), family.prior(parts)
    w = q.sample(key)  # [L, GM]  (v when whitened)
    log_q, log_p = q.log_prob(w), p.log_prob(w)
    if family.spec.whiten:
        # u = Luu v: both densities pick up the same Jacobian −L Σ log diag Luu
        log_det = w.shape[0] * jnp.sum(jnp.log(jnp.diagonal(parts.Luu, axis1=-2, axis2=-1)))
        w, log_q, log_p = blockdiag_matvec(parts.Luu, w), log_q - log_det, log_p - log_det
    return w, log_q, log_p

def _draw_arguments(res: FitResult, num_draws: int, key, hyper):
    """The arguments of :func:`_draw_inducing` for ``sample_inducing(res, num_draws, key)``, given θ draws ``hyper``."""
    X1 = jnp.asarray(res.X_train[:1])
    y1 = jnp.asarray(res.y_train[:1], float_dtype())
    keys = jax.random.split(jax.random.split(key)[1], int(num_draws))
    return [res.family, int(res.num_data), res.params, hyper, keys, X1, y1]


def sample_inducing(res: FitResult, num_draws: int, key) -> InducingDraws:
    """Draw (θ_s, u_s) ~ q(θ) q(u | θ), s = 1..S, with log q and log p(u) (+ log p(θ)) of each."""
    _check_family(res)
    if not isinstance(num_draws, (int, np.integer)) or num_draws < 1:
        raise InvalidArgumentError("num_draws", f"must be a positive integer, got {num_draws!r}")
    hyper = _sample_hyper(res, jax.random.split(key)[0], int(num_draws))
    u, log_q, log_p = _draw_inducing.for_calls(1)(*_draw_arguments(res, num_draws, key, hyper))
    return InducingDraws(
        u=np.asarray(u), log_q=np.asarray(log_q, np.float64), log_prior=np.asarray(log_p, np.float64),
        hyper={k: np.asarray(v) for k, v in hyper.items()},
    )


# ----------------------------------------------------------------------------- p(f | u)
def _conditional(family, params, X, u):
    """p(f | u) at X ``[n, D]`` for draws u ``[S, L, GM]`` (unwhitened): mean, var ``[S, n, L]``.

    The family's own conditional (:meth:`~gpzoo.inference.svgp.SVGP.conditional_given_u`: exact, or
    estimated from orbit samples for a sampled invariant kernel), in its coordinates (v = Luu⁻¹ u when whitened).
    """
    with substitute(data=params), seed(rng_seed=0):
        return _conditional_given_parts(family, family.prior_parts(), X, u)


def _conditional_given_parts(family, parts, X, u):
    """:func:`_conditional` of the realised model ``parts``."""
    v = blockdiag_solve(parts.Luu, u) if family.spec.whiten else u  # [S, L, GM]
    mean, var = jax.vmap(lambda v_s: family.conditional_given_u(parts, X, v_s))(v)  # [S, n, L] x2
    return mean, jnp.maximum(var, 0.0), parts.likelihood

def _conditional_all(family, params, hyper, u, X):
    """mean ``[S, n, L]``, var ``[S, n, L]``, the realised likelihood, and whether it varies per draw."""
    if not hyper:
        mean, var, likelihood = _conditional(family, params, X, u)
        return mean, var, likelihood, False

    def one(h, u_s):  # u_s [L, GM]
        mean, var, likelihood = _conditional(family, {**params, **h}, X, u_s[None])
        return mean[0], var[0], likelihood

    mean, var, likelihood = jax.vmap(one)(hyper, u)
    return mean, var, likelihood, True

@adaptive_jit(static_argnums=0)
def _moments_chunk(family, params, hyper, u, Xc):
    return _conditional_all(family, params, hyper, u, Xc)[:2]

def _chunk_size(num_rows: int) -> int:
    """Rows of every chunk: ``CHUNK_ROWS``, or for fewer rows the smallest padded block size that holds
    them (:data:`~gpzoo.inference.programs.BLOCK_SIZES`), so a few shapes serve every test-set size."""
    return min([CHUNK_ROWS] + [b for b in BLOCK_SIZES if b >= num_rows])


def _num_chunks(X) -> int:
    return -(-X.shape[0] // _chunk_size(X.shape[0]))

def _chunks(X, *arrays):
    """Row chunks of :func:`_chunk_size` rows (the last padded by repeating row 0, so one shape compiles):
    yields (number of real rows, X chunk, other chunks)."""
    N = X.shape[0]
    size = _chunk_size(N)
    for start in range(0, N, size):
        stop = min(start + size, N)
        idx = np.arange(start, start + size)
        idx[stop - start :] = 0
        yield stop - start, X[idx], [a[idx] for a in arrays]

def conditional_given_u(res: FitResult, X, draws: InducingDraws):
    """Marginals of p(f_n | u_s) at X ``[N, D]``: mean ``[S, N, L]`` and var ``[S, N, L]``.

    The variance Kff − Qff does not depend on u; it is the same for every draw unless
    hyperparameters are sampled, when it changes with θ_s.
    """
    family = _check_family(res)
    _check_draws(res, draws)
    X = check_new_inputs(res, X, "X")
    hyper = {k: jnp.asarray(v) for k, v in draws.hyper.items()}
    means, vars_ = [], []
    program = _moments_chunk.for_calls(_num_chunks(X))
    for n, Xc, _ in _chunks(X):
        mean, var = program(family, res.params, hyper, jnp.asarray(draws.u), jnp.asarray(Xc))
        means.append(np.asarray(mean)[:, :n])
        vars_.append(np.asarray(var)[:, :n])
    return np.concatenate(means, axis=1), np.concatenate(vars_, axis=1)

# ----------------------------------------------------------------------------- p(y | u)
def _replicate(likelihood, mean, var, key):
    """y ~ p(y | u) = ∫ p(y | f) N(f; mean, var) df for one draw: mean/var ``[n, L]`` -> ``[n]``.

    Exact for every classification likelihood (class probabilities of the marginal), for the
    Gaussian (moments of N(mean, var + noise)) and for the Poisson (f drawn, then the count);
    another regression likelihood is sampled from its moment-matched normal.
    """
    task = likelihood.task
    key_f, key_y = jax.random.split(key)
    if task in ("binary", "multiclass"):
        probs = likelihood.predict_probs(mean, var, key=key_f)  # [n, C]
        return jax.random.categorical(key_y, jnp.log(jnp.maximum(probs, 0.0)), axis=-1)
    if task == "count":
        f = mean + jnp.sqrt(var) * draws.normal(key_f, mean.shape, mean.dtype)  # [n, 1]
        rate, _ = likelihood.predict_mean_and_var(f, jnp.zeros_like(f))  # E[y | f]
        return jax.random.poisson(key_y, rate[:, 0])
    y_mean, y_var = likelihood.predict_mean_and_var(mean, var)  # [n, 1]
    return y_mean[:, 0] + jnp.sqrt(y_var[:, 0]) * draws.normal(key_y, y_mean.shape[:1], y_mean.dtype)

def _pointwise_values(family, params, hyper, u, Xc, yc, key):
    """log p(y_n | u_s) ``[S, n]`` and replicates ``[S, n]`` for one chunk of inputs (traced by the programs below)."""
    return _pointwise_given_moments(*_conditional_all(family, params, hyper, u, Xc), yc, key)


def _pointwise_given_moments(mean, var, likelihood, per_draw: bool, yc, key):
    """:func:`_pointwise_values` from the moments ``[S, n, L]`` of p(f | u_s) (and the likelihood, per draw or not)."""
    S = mean.shape[0]
    keys = jax.random.split(key, 2 * S).reshape(2, S, -1)
    lik_axis = 0 if per_draw else None
    log_lik = jax.vmap(lambda lk, m, v, k: lk.predict_log_density(yc, m, v, key=k), in_axes=(lik_axis, 0, 0, 0))(
        likelihood, mean, var, keys[0]
    )  # [S, n]
    y_rep = jax.vmap(_replicate, in_axes=(lik_axis, 0, 0, 0))(likelihood, mean, var, keys[1])  # [S, n]
    return log_lik, y_rep


@adaptive_jit(static_argnums=0)
def _pointwise_chunk(family, params, hyper, u, Xc, yc, key):
    """log p(y_n | u_s) ``[S, n]`` and replicates ``[S, n]`` for one chunk of inputs."""
    return _pointwise_values(family, params, hyper, u, Xc, yc, key)


@adaptive_jit(static_argnums=0)
def _summary_chunk(family, params, keys, Xc, yc, key, moments_key):
    """One chunk's every report quantity in one program (fixed hyperparameters, analytic data term),
    from one realisation of the model (Kuu and its factor, traced once): the draws u_s ~ q(u) of
    :func:`_draw_inducing` (the same keys give the same draws in every chunk), :func:`_pointwise_values`
    given them, the q(f*) predictive moments of ``predict`` and, per row, E_q[log p(y_n | f_n)], with
    KL[q(u) || p(u)]. The chunk's kernel matrices (Kuf, diag Kff) are traced more than once and
    computed once (XLA merges the copies)."""
    with substitute(data=params), seed(rng_seed=0):
        parts = family.parts()
        u, log_q, log_p = jax.vmap(lambda k: _draw_given_parts(family, parts, k))(keys)
        log_lik, y_rep = _pointwise_given_moments(*_conditional_given_parts(family, parts, Xc, u), False, yc, key)
        moments = family.predictive_moments(parts, Xc, moments_key)
        ell = family.expected_log_lik(parts, Xc, yc, None, **family.data_term_inputs(Xc, yc))  # [n]
        kl = family.kl(parts)
    return (u, log_q, log_p), log_lik, y_rep, moments, ell, kl


def pointwise_given_u(res: FitResult, X, y, draws: InducingDraws, key) -> PointwiseDraws:
    """log p(y_n | u_s) ``[S, N]`` via ``likelihood.predict_log_density(y_n, μ_n(u_s), σ²_n)`` and
    replicates y_n ~ p(y_n | u_s) ``[S, N]``, in chunks of ``CHUNK_ROWS`` inputs."""
    family = _check_family(res)
    _check_draws(res, draws)
    X = check_new_inputs(res, X, "X")
    y = res.spec.likelihood.validate_targets(y)
    if y.shape[0] != X.shape[0]:
        raise ShapeError("y", f"has {y.shape[0]} rows but X has {X.shape[0]}")
    hyper = {k: jnp.asarray(v) for k, v in draws.hyper.items()}
    u = jnp.asarray(draws.u)
    logs, reps = [], []
    program = _pointwise_chunk.for_calls(_num_chunks(X))
    for i, (n, Xc, (yc,)) in enumerate(_chunks(X, np.asarray(y, float_dtype()))):
        log_lik, y_rep = program(family, res.params, hyper, u, jnp.asarray(Xc), jnp.asarray(yc), jax.random.fold_in(key, i))
        logs.append(np.asarray(log_lik, np.float64)[:, :n])
        reps.append(np.asarray(y_rep)[:, :n])
    return PointwiseDraws(np.concatenate(logs, axis=1), np.concatenate(reps, axis=1))


# ----------------------------------------------------------------------------- one pass for a report
@dataclasses.dataclass(frozen=True)
class Summaries:
    """What :func:`draws_and_summaries` computes over the rows of one ``(X, y)`` in one pass: the
    pointwise draws, the analytic predictive (``predict``'s moments) and the ELBO's data term and KL."""

    pointwise: PointwiseDraws
    f_mean: np.ndarray  # [N, L]
    f_var: np.ndarray  # [N, L]
    y_mean: np.ndarray  # [N, L]
    y_var: np.ndarray  # [N, L]
    probs: np.ndarray | None  # [N, C] (classification) or None
    expected_log_lik: float  # sum_n E_q[log p(y_n | f_n)] (float64 sum over rows)
    kl: float  # KL[q(u) || p(u)]


def summaries_supported(res: FitResult) -> bool:
    """Whether :func:`draws_and_summaries` applies: an SVGP-style family with every hyperparameter
    fixed or a point estimate, an analytic data term (its ELBO needs one draw) and no per-datum
    variational parameters."""
    family = res.family
    return (all(hasattr(family, name) for name in ("parts", "posterior", "prior", "predictive_moments", "kl",
                                                   "expected_log_lik", "data_term_inputs"))
            and family.hyper_guide is None and not family.stochastic_expectation
            and not family.needs_data_indices)


def _summary_inputs(res: FitResult, X, y):
    X = check_new_inputs(res, X, "X")
    y = res.spec.likelihood.validate_targets(y)
    if y.shape[0] != X.shape[0]:
        raise ShapeError("y", f"has {y.shape[0]} rows but X has {X.shape[0]}")
    return X, np.asarray(y, float_dtype())


def draws_and_summaries(res: FitResult, num_draws: int, key, inputs, moments_key) -> tuple[InducingDraws, list[Summaries]]:
    """``sample_inducing(res, num_draws, key)`` and, for each ``(X, y, pointwise_key)`` of ``inputs``,
    ``pointwise_given_u(res, X, y, draws, pointwise_key)`` with ``predict``'s moments at ``X`` (key
    ``fold_in(moments_key, chunk)``) and the ELBO's terms on (X, y): one program, run once per chunk
    of :data:`CHUNK_ROWS` rows, computes all of it (see :func:`summaries_supported`). The values
    equal the separate functions' up to rounding (XLA fuses the one program differently).
    """
    _check_family(res)
    if not summaries_supported(res):
        raise InvalidArgumentError("res", f"model {res.spec.name!r} has sampled hyperparameters, a Monte Carlo data "
                                          "term or per-datum parameters: use sample_inducing, pointwise_given_u, "
                                          "predict and evaluate_elbo")
    if isinstance(num_draws, bool) or not isinstance(num_draws, (int, np.integer)) or num_draws < 1:
        raise InvalidArgumentError("num_draws", f"must be a positive integer, got {num_draws!r}")
    checked = [(*_summary_inputs(res, X, y), k) for X, y, k in inputs]
    family, _, params, _, keys, _, _ = _draw_arguments(res, int(num_draws), key, {})
    inducing, found = None, []
    for X, y, pointwise_key in checked:
        logs, reps, moments, ell_total, kl = [], [], [], 0.0, None
        program = _summary_chunk.for_calls(_num_chunks(X))
        for i, (n, Xc, (yc,)) in enumerate(_chunks(X, y)):
            drawn, log_lik, y_rep, chunk_moments, ell, kl = program(
                family, params, keys, jnp.asarray(Xc), jnp.asarray(yc), jax.random.fold_in(pointwise_key, i),
                jax.random.fold_in(moments_key, i))
            if inducing is None:
                u, log_q, log_p = drawn
                inducing = InducingDraws(u=np.asarray(u), log_q=np.asarray(log_q, np.float64),
                                         log_prior=np.asarray(log_p, np.float64), hyper={})
            logs.append(np.asarray(log_lik, np.float64)[:, :n])
            reps.append(np.asarray(y_rep)[:, :n])
            moments.append([None if m is None else np.asarray(m)[:n] for m in chunk_moments])
            ell_total += float(np.sum(np.asarray(ell)[:n], dtype=np.float64))
        f_mean, f_var, y_mean, y_var, probs = (None if moments[0][j] is None else np.concatenate([m[j] for m in moments])
                                               for j in range(5))
        found.append(Summaries(PointwiseDraws(np.concatenate(logs, axis=1), np.concatenate(reps, axis=1)),
                               f_mean, f_var, y_mean, y_var, probs, ell_total, float(kl)))
    if inducing is None:  # no inputs: the draws alone
        inducing = sample_inducing(res, int(num_draws), key)
    return inducing, found
