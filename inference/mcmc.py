"""MCMC for zoo models: NUTS over the hyperparameters, with the GP's latent function marginalised
exactly or represented by whitened inducing outputs.

:func:`sample` runs NumPyro's NUTS (Hoffman & Gelman 2014) on one of two targets:

* ``"collapsed"`` (Gaussian likelihood, N up to :data:`MAX_EXACT_POINTS`): the hyperparameters θ
  alone, under the exact log marginal likelihood log N(y | 0, K_θ(X, X) + σ² I) + log p(θ). f is
  integrated out in closed form, so the chain moves in the few dimensions of θ.
* ``"whitened-inducing"`` (any likelihood of a sparse zoo model): θ jointly with whitened
  inducing outputs v ~ N(0, I), u = L_θ v with L_θ L_θᵀ = K_θ(Z, Z) (Hensman, Matthews, Filippone
  & Ghahramani 2015; GPflow's SGPMC). The likelihood of u is their lower bound
  exp(Σ_n E_{p(f_n | u)}[log p(y_n | f_n)]), the same expected log-likelihood as gpzoo's SVI data
  term with q(u) a point mass. Sampling v instead of u removes the funnel
  between u and the kernel's variance and lengthscales that makes an unwhitened chain stall.

Hyperparameters given as NumPyro distributions are sampled; the others (and the inducing inputs
Z) stay at their values in ``init`` (a :class:`~gpzoo.inference.results.FitResult`, e.g. a
type-II fit) or at the spec's initial values. NUTS needs a deterministic target: a likelihood whose
expectation is a Monte Carlo estimate (softmax) uses one fixed set of draws throughout.

After sampling, the standard checks become :class:`~gpzoo.models.errors.SamplerWarning`\\ s:
divergent transitions, a step size adapted below :data:`MIN_STEP_SIZE`, most draws hitting the
maximum tree depth, split r_hat above :data:`MAX_RHAT` and bulk ESS below :data:`MIN_ESS`
(Vehtari et al. 2021). The draws come back as an ArviZ DataTree with the conventions of
:func:`gpzoo.analysis.to_datatree` (``posterior``, ``log_likelihood`` ``y``, ``observed_data``,
``sample_stats``), so ``az.summary``, ``az.loo`` and ``az.compare`` against an SVI fit work as they
are; :meth:`SampleResult.predict` gives q(f*) as the mixture over draws.
"""

from __future__ import annotations

import dataclasses
import typing
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.diagnostics import effective_sample_size, split_gelman_rubin
from numpyro.handlers import seed, substitute
from numpyro.infer import MCMC, NUTS, init_to_median, init_to_value

from gpzoo.inference.exact import exact_log_marginal, exact_posterior
from gpzoo.inference.guides import blockdiag_matvec
from gpzoo.inference.results import FitResult, Prediction
from gpzoo.inference.svgp import KERNEL_SITE, LIKELIHOOD_SITE, SVGP
from gpzoo.models.errors import InvalidArgumentError, SamplerWarning, check_integer, check_real, check_seed
from gpzoo.models.likelihoods import Gaussian, Likelihood
from gpzoo.models.zoo import ModelSpec

__all__ = ["MAX_EXACT_POINTS", "MAX_RHAT", "MIN_ESS", "MIN_STEP_SIZE", "METHODS", "SampleResult", "sample"]

#: Targets of :func:`sample` (``method="auto"`` picks the first that applies).
METHODS = ("collapsed", "whitened-inducing")
#: Largest N for which ``method="auto"`` uses the exact collapsed target (an N×N Cholesky per gradient).
MAX_EXACT_POINTS = 2000
#: Diagnostic thresholds: split r_hat (Vehtari et al. 2021 recommend 1.01), bulk ESS over all chains,
#: the adapted step size below which a chain is taken to have collapsed, and the share of draws at the
#: maximum tree depth above which the sampler is said to be struggling.
MAX_RHAT, MIN_ESS, MIN_STEP_SIZE, MAX_TREEDEPTH_SHARE = 1.01, 100.0, 1e-5, 0.5
#: The whitened inducing outputs' site.
V_SITE = "v"
#: The fixed key of a Monte Carlo expected log-likelihood (softmax): NUTS needs a deterministic target.
_EXPECTATION_KEY = 20150101


@dataclasses.dataclass
class SampleResult:
    """The draws of :func:`sample` and what is needed to predict with them.

    ``samples`` maps each sampled site (hyperparameters by their site name, ``v`` and ``u`` for the
    whitened-inducing target) to ``[chains, draws, ...]``; ``fixed`` holds the parameters that were
    not sampled (constrained values); ``diagnostics`` the numbers behind the warnings
    (``divergences``, ``step_size`` per chain, ``treedepth_share``, ``max_rhat``, ``min_ess``,
    ``problems``); ``datatree`` the ArviZ DataTree.
    """

    spec: ModelSpec
    method: str
    samples: dict[str, np.ndarray]
    fixed: dict[str, np.ndarray]
    diagnostics: dict[str, Any]
    datatree: Any
    X_train: np.ndarray
    y_train: np.ndarray
    init: FitResult = dataclasses.field(repr=False)
    seed: int = 0

    @property
    def num_chains(self) -> int:
        return int(next(iter(self.samples.values())).shape[0]) if self.samples else 0

    @property
    def hyper_draws(self) -> dict[str, np.ndarray]:
        """The sampled hyperparameters, ``[chains * draws, ...]`` each, keyed by site name."""
        return {k: _flat(v) for k, v in self.samples.items() if k not in (V_SITE, "u")}

    def predict(self, X_new, *, batch_size: int = 512) -> Prediction:
        """q(f*) at ``X_new`` as the mixture over draws: mean of the per-draw means, and the mean of
        the per-draw variances plus the variance of the means; y moments and class probabilities
        from the likelihood applied per draw, then averaged."""
        X_new = np.asarray(X_new, dtype=self.X_train.dtype)
        if X_new.ndim != 2 or X_new.shape[1] != self.X_train.shape[1]:
            raise InvalidArgumentError("X_new", f"expected [N, {self.X_train.shape[1]}] inputs, got shape {X_new.shape}")
        chunks = [self._predict_chunk(X_new[i:i + batch_size]) for i in range(0, X_new.shape[0], batch_size)]
        fields: dict[str, Any] = {}
        for name in ("f_mean", "f_var", "y_mean", "y_var", "probs"):
            parts = [getattr(c, name) for c in chunks]
            fields[name] = None if parts[0] is None else np.concatenate(parts, axis=0)
        return Prediction(**fields)

    def _predict_chunk(self, Xc) -> Prediction:
        hyper = {k: jnp.asarray(v) for k, v in self.hyper_draws.items()}
        if self.method == "collapsed":
            mean, var = _collapsed_moments(self.spec, self.fixed, hyper, jnp.asarray(self.X_train),
                                           jnp.asarray(self.y_train, self.X_train.dtype), jnp.asarray(Xc))
            mean, var = mean[..., None], var[..., None]  # [S, n, 1]
        else:
            v = jnp.asarray(_flat(self.samples[V_SITE]))  # [S, L, GM]
            mean, var = _whitened_moments(self.init.family, self.fixed, hyper, v, jnp.asarray(Xc))
        likelihood, per_draw = _likelihood_draws(self.spec, self.fixed, hyper)
        y_mean, y_var, probs = _predictive(likelihood, per_draw, mean, var, self.spec.likelihood.task)
        f_mean = np.asarray(mean.mean(axis=0))
        f_var = np.asarray(var.mean(axis=0) + mean.var(axis=0))
        y_m = np.asarray(y_mean.mean(axis=0))
        y_v = np.asarray(y_var.mean(axis=0) + y_mean.var(axis=0))
        return Prediction(f_mean=f_mean, f_var=f_var, y_mean=y_m, y_var=y_v,
                          probs=None if probs is None else np.asarray(probs.mean(axis=0)))


def _flat(a) -> np.ndarray:
    a = np.asarray(a)
    return a.reshape((-1,) + a.shape[2:])


# ----------------------------------------------------------------------------- targets
def _factor(name: str, log_factor) -> None:
    """``numpyro.factor``, written out with ``dist.Unit``: NumPyro's own reads the submodule
    ``numpyro.distributions.distribution`` as an attribute, which is missing when arviz was imported
    before numpyro (the module is loaded, but never bound to its parent package)."""
    unit = dist.Unit(log_factor)
    numpyro.sample(name, unit, obs=unit.sample(None), infer={"is_auxiliary": True})


def _realised(spec: ModelSpec, fixed: dict):
    """The spec's kernel and likelihood with sampled sites drawn and the others at ``fixed``."""
    assert spec.kernel is not None  # both targets sample kernel models (a deep kernel machine has none)
    with substitute(data=fixed):
        return spec.kernel.realise(KERNEL_SITE), spec.likelihood.realise(LIKELIHOOD_SITE)


def _collapsed_model(spec: ModelSpec, fixed: dict, X, y):
    """θ ~ p(θ); log N(y | 0, K_θ + (σ² + jitter) I) as a factor."""
    kernel, likelihood = _realised(spec, fixed)
    noise = likelihood.resolved().noise_variance + spec.jitter
    _factor("log_marginal", exact_log_marginal(kernel.resolved(), noise, X, y))


def _whitened_model(family: SVGP, fixed: dict, X, y):
    """θ ~ p(θ), v ~ N(0, I) ``[L, GM]``, u = L_θ v; Σ_n E_{p(f_n | u)}[log p(y_n | f_n)] as a factor."""
    with substitute(data=fixed):
        parts = family.prior_parts()
    shape = (family.num_latent, family.num_groups * family.inducing.num_inducing)
    v = numpyro.sample(V_SITE, dist.Normal(jnp.zeros(shape, X.dtype), 1.0).to_event(2))
    u = blockdiag_matvec(parts.Luu, v)  # [L, GM]
    numpyro.deterministic("u", u)
    coordinates = v if family.spec.whiten else u  # what the family's conditional takes
    mean, var = family.conditional_given_u(parts, X, coordinates)  # [N, L] x2
    key = jax.random.PRNGKey(_EXPECTATION_KEY)
    likelihood = typing.cast(Likelihood, parts.likelihood)  # Parts types it as object
    ell = likelihood.variational_expectation(y, mean, jnp.maximum(var, 0.0), key=key)  # [N]
    _factor("expected_log_lik", ell.sum())


# ----------------------------------------------------------------------------- predictions
def _collapsed_moments(spec, fixed, hyper, X, y, Xc):
    """Per-draw exact posterior mean and variance of f at ``Xc``: ``[S, n]`` each."""
    def one(draw):
        with seed(rng_seed=0):
            kernel, likelihood = _realised(spec, {**fixed, **draw})
        noise = likelihood.resolved().noise_variance + spec.jitter
        return exact_posterior(kernel.resolved(), noise, X, y, Xc)

    return _over_draws(one, hyper)


def _whitened_moments(family, fixed, hyper, v, Xc):
    """Per-draw mean and variance ``[S, n, L]`` of p(f | u_s, θ_s) at ``Xc``."""
    def one(args):
        draw, v_s = args
        with seed(rng_seed=0), substitute(data={**fixed, **draw}):
            parts = family.prior_parts()
        coordinates = v_s if family.spec.whiten else blockdiag_matvec(parts.Luu, v_s)
        mean, var = family.conditional_given_u(parts, Xc, coordinates)
        return mean, jnp.maximum(var, 0.0)

    return jax.lax.map(one, (hyper, v))


def _over_draws(fn, hyper):
    """``fn`` of each draw of ``hyper`` (``[S, ...]`` per site), stacked; one draw of nothing without sampled sites."""
    if hyper:
        return jax.lax.map(fn, hyper)
    mean, var = fn({})
    return mean[None], var[None]


def _likelihood_draws(spec, fixed, hyper):
    """``(likelihood, per_draw)``: the realised likelihood, stacked over draws (a pytree with a leading
    draw axis) when it has sampled sites, else one object shared by every draw."""
    sampled = {k: v for k, v in hyper.items() if k.startswith(LIKELIHOOD_SITE + ".")}

    def one(draw):
        with seed(rng_seed=0):
            return _realised(spec, {**fixed, **draw})[1]

    return (jax.vmap(one)(sampled), True) if sampled else (one({}), False)


def _predictive(likelihood, per_draw: bool, mean, var, task):
    """y moments ``[S, n, K]`` and class probabilities ``[S, n, C]`` (None unless classifying) per draw."""
    axes = (0 if per_draw else None, 0, 0)
    y_mean, y_var = jax.vmap(lambda lk, m, v: lk.predict_mean_and_var(m, v), in_axes=axes)(likelihood, mean, var)
    if task not in ("binary", "multiclass"):
        return y_mean, y_var, None
    key = jax.random.PRNGKey(_EXPECTATION_KEY)
    probs = jax.vmap(lambda lk, m, v: lk.predict_probs(m, v, key=key), in_axes=axes)(likelihood, mean, var)
    return y_mean, y_var, probs


def _pointwise_log_lik(result: SampleResult) -> np.ndarray:
    """log p(y_n | latent_s, θ_s) ``[chains, draws, N]``: ∫ p(y_n | f_n) p(f_n | ·) df_n with p(f_n | ·) the
    draw's exact posterior marginal at the training point (collapsed) or p(f_n | u_s) (whitened-inducing),
    the likelihood's ``predict_log_density`` — the convention of gpzoo's SVI DataTrees."""
    X, y = result.X_train, result.y_train
    hyper = {k: jnp.asarray(v) for k, v in result.hyper_draws.items()}
    if result.method == "collapsed":
        mean, var = _collapsed_moments(result.spec, result.fixed, hyper, jnp.asarray(X), jnp.asarray(y, X.dtype),
                                       jnp.asarray(X))
        mean, var = mean[..., None], var[..., None]
    else:
        v = jnp.asarray(_flat(result.samples[V_SITE]))
        mean, var = _whitened_moments(result.init.family, result.fixed, hyper, v, jnp.asarray(X))
    likelihood, per_draw = _likelihood_draws(result.spec, result.fixed, hyper)
    observed = result.init.family._observed(jnp.asarray(y)) if hasattr(result.init.family, "_observed") else y
    key = jax.random.PRNGKey(_EXPECTATION_KEY)
    log_lik = np.asarray(jax.vmap(lambda lk, m, v: lk.predict_log_density(observed, m, v, key=key),
                                  in_axes=(0 if per_draw else None, 0, 0))(likelihood, mean, var))  # [S, N]
    chains = result.num_chains
    return log_lik.reshape(chains, -1, log_lik.shape[-1])


# ----------------------------------------------------------------------------- the entry point
def _choose(method: str, spec: ModelSpec, family, num_data: int) -> str:
    if method not in ("auto", *METHODS):
        raise InvalidArgumentError("method", f"must be 'auto' or one of {', '.join(METHODS)}, got {method!r}")
    exact_ok = isinstance(spec.likelihood, Gaussian) and spec.kernel is not None
    sparse_ok = type(family) is SVGP
    if method == "auto":
        method = "collapsed" if exact_ok and num_data <= MAX_EXACT_POINTS else "whitened-inducing"
    if method == "collapsed" and not exact_ok:
        raise InvalidArgumentError("method", f"'collapsed' needs a Gaussian likelihood; model {spec.name!r} has "
                                             f"{type(spec.likelihood).__name__} (use 'whitened-inducing')")
    if method == "whitened-inducing" and not sparse_ok:
        raise InvalidArgumentError("spec", f"model {spec.name!r} (method {spec.method!r}) has no single Gaussian "
                                           "inducing prior to whiten: sample supports the SVGP-family zoo models "
                                           "(svgp-rbf, the convolutional, TICK and Pólya–Gamma models)")
    return method


def _fixed_params(res: FitResult) -> dict[str, np.ndarray]:
    """The parameters NUTS holds fixed: hyperparameters without a prior and the inducing inputs."""
    skip = ("q_mu", "q_sqrt")
    return {k: np.asarray(v) for k, v in res.params.items()
            if k not in skip and not k.endswith(("_auto_loc", "_auto_scale"))}


def sample(
    model: ModelSpec | FitResult,
    X,
    y,
    *,
    num_warmup: int = 500,
    num_samples: int = 500,
    num_chains: int = 4,
    seed: int = 0,
    method: str = "auto",
    target_accept_prob: float = 0.8,
    max_tree_depth: int = 10,
    step_size: float = 1.0,
    adapt_step_size: bool = True,
    dense_mass: bool = False,
    chain_method: str = "sequential",
    progress: bool = False,
) -> SampleResult:
    """Sample a zoo model's posterior by NUTS (module docstring): returns a :class:`SampleResult`.

    ``model`` is a :class:`ModelSpec` or a :class:`FitResult` (whose inducing inputs and type-II
    hyperparameters are kept, and whose q(u) mean starts the chains of the whitened-inducing
    target). ``method``: ``"auto"`` (collapsed for a Gaussian likelihood with N ≤
    ``MAX_EXACT_POINTS``, else whitened-inducing), ``"collapsed"`` or ``"whitened-inducing"``.
    The NUTS settings are NumPyro's (``target_accept_prob``, ``max_tree_depth``, the initial
    ``step_size``, ``adapt_step_size``, ``dense_mass``); ``chain_method`` is ``"sequential"`` or
    ``"vectorized"`` (``"parallel"`` needs one device per chain). Problems found in the draws are
    issued as :class:`~gpzoo.models.errors.SamplerWarning` and kept in ``result.diagnostics``.
    """
    from gpzoo.inference.fit import fit  # noqa: PLC0415 - fit imports this package's other modules

    num_warmup = check_integer(num_warmup, "num_warmup", minimum=0)
    num_samples = check_integer(num_samples, "num_samples", minimum=2)
    num_chains = check_integer(num_chains, "num_chains", minimum=1)
    max_tree_depth = check_integer(max_tree_depth, "max_tree_depth", minimum=1)
    seed = check_seed(seed)
    target_accept_prob = check_real(target_accept_prob, "target_accept_prob", positive=True)
    if not target_accept_prob < 1:
        raise InvalidArgumentError("target_accept_prob", f"must lie in (0, 1), got {target_accept_prob}")
    step_size = check_real(step_size, "step_size", positive=True)
    if chain_method not in ("sequential", "vectorized", "parallel"):
        raise InvalidArgumentError("chain_method", f"must be 'sequential', 'vectorized' or 'parallel', got {chain_method!r}")
    if isinstance(model, FitResult):
        init = model
    elif isinstance(model, ModelSpec):
        init = fit(model, X, y, steps=0, progress=False, seed=seed)  # validates X, y; initial Z and hyperparameters
    else:
        raise InvalidArgumentError("model", f"expected a ModelSpec or a FitResult, got {type(model).__name__}")
    spec = init.spec
    X_train, y_train = np.asarray(init.X_train), np.asarray(init.y_train)
    if isinstance(model, FitResult) and X is not None:
        if np.shape(X) != X_train.shape or not np.array_equal(np.asarray(X, X_train.dtype), X_train):
            raise InvalidArgumentError("X", "differs from the data the FitResult was fitted to (pass X=None, y=None "
                                            "to sample on its training data)")
    method = _choose(method, spec, init.family, X_train.shape[0])
    model_fn: Callable[..., None]
    fixed = _fixed_params(init)
    Xj = jnp.asarray(X_train)
    if method == "collapsed":
        model_fn = _collapsed_model
        args = (spec, fixed, Xj, jnp.asarray(y_train, X_train.dtype))
        init_strategy = init_to_median(num_samples=15)
    else:
        family = init.family
        model_fn = _whitened_model
        args = (family, fixed, Xj, family._observed(jnp.asarray(y_train)))
        start = {}
        if isinstance(model, FitResult) and spec.whiten:
            start[V_SITE] = jnp.asarray(init.params["q_mu"])
        init_strategy = init_to_value(values=start) if start else init_to_median(num_samples=15)
    kernel = NUTS(model_fn, target_accept_prob=target_accept_prob, max_tree_depth=max_tree_depth, step_size=step_size,
                  adapt_step_size=adapt_step_size, dense_mass=dense_mass, init_strategy=init_strategy)
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method=chain_method, progress_bar=progress)
    with warnings.catch_warnings():
        # NumPyro warns that sequential chains are not run in parallel on one CPU device; that is the point here
        warnings.filterwarnings("ignore", message="There are not enough devices", category=UserWarning)
        mcmc.run(jax.random.PRNGKey(seed), *args, extra_fields=("diverging", "num_steps", "adapt_state.step_size"))
    samples = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    extra = {k: np.asarray(v) for k, v in mcmc.get_extra_fields(group_by_chain=True).items()}
    result = SampleResult(spec=spec, method=method, samples=samples, fixed=fixed, diagnostics={}, datatree=None,
                          X_train=X_train, y_train=y_train, init=init, seed=seed)
    result.diagnostics = _diagnose(result, extra, max_tree_depth)
    for problem in result.diagnostics["problems"]:
        warnings.warn(SamplerWarning(spec.name, problem), stacklevel=2)
    result.datatree = _datatree(result, extra)
    return result


# ----------------------------------------------------------------------------- diagnostics
def _diagnose(result: SampleResult, extra: dict, max_tree_depth: int) -> dict[str, Any]:
    """Divergences, adapted step sizes, tree-depth saturation, split r_hat and bulk ESS of every
    sampled scalar (the whitened v included), and the sentences of the problems found."""
    divergences = int(extra["diverging"].sum())
    step_size = extra["adapt_state.step_size"][:, -1].astype(float)
    saturated = float(np.mean(extra["num_steps"] >= 2**max_tree_depth - 1))
    rhat, ess = {}, {}
    for name, value in result.samples.items():
        if name == "u":
            continue
        flat = value.reshape(value.shape[:2] + (-1,)).astype(np.float64)  # [chains, draws, k]
        if result.num_chains > 1:
            rhat[name] = float(np.nanmax(split_gelman_rubin(flat)))
        ess[name] = float(np.nanmin(effective_sample_size(flat)))
    problems = []
    total = int(extra["diverging"].size)
    if divergences:
        problems.append(f"{divergences} of {total} transitions diverged: the posterior has regions the step size cannot "
                        "follow (raise target_accept_prob, or reparameterise)")
    if np.any(step_size < MIN_STEP_SIZE):
        problems.append(f"the step size collapsed to {step_size.min():.2g} (chains {np.flatnonzero(step_size < MIN_STEP_SIZE).tolist()}): "
                        "the chains barely move")
    if saturated > MAX_TREEDEPTH_SHARE:
        problems.append(f"{saturated:.0%} of the draws hit the maximum tree depth {max_tree_depth}: the trajectories are "
                        "cut short (raise max_tree_depth, or check for a badly scaled posterior)")
    bad_rhat = {k: v for k, v in rhat.items() if not v <= MAX_RHAT}
    if bad_rhat:
        shown = ", ".join(f"{k} {v:.3f}" for k, v in sorted(bad_rhat.items()))
        problems.append(f"split r_hat above {MAX_RHAT} ({shown}): the chains disagree (run longer or more warmup)")
    low_ess = {k: v for k, v in ess.items() if not v >= MIN_ESS}
    if low_ess:
        shown = ", ".join(f"{k} {v:.0f}" for k, v in sorted(low_ess.items()))
        problems.append(f"effective sample size below {MIN_ESS:.0f} ({shown}): too few independent draws for stable "
                        "estimates (run longer)")
    return {"divergences": divergences, "step_size": step_size.tolist(), "treedepth_share": saturated,
            "rhat": rhat, "ess": ess, "max_rhat": max(rhat.values(), default=float("nan")),
            "min_ess": min(ess.values(), default=float("nan")), "problems": problems}


def _datatree(result: SampleResult, extra: dict):
    """The draws as an ArviZ DataTree (``arviz_base.from_dict``) with gpzoo's SVI conventions."""
    from arviz_base import from_dict  # noqa: PLC0415

    posterior = {name.replace(".", "_"): value for name, value in result.samples.items() if name != V_SITE}
    log_lik = _pointwise_log_lik(result)
    sample_stats = {"diverging": extra["diverging"].astype(bool), "n_steps": extra["num_steps"],
                    "step_size": extra["adapt_state.step_size"]}
    dims = {"u": ["latent", "inducing"], "y": ["obs_id"]}
    dt = from_dict({"posterior": posterior, "log_likelihood": {"y": log_lik},
                    "observed_data": {"y": result.y_train}, "sample_stats": sample_stats},
                   dims=dims, coords={"obs_id": np.arange(result.y_train.shape[0])})
    dt.attrs["gpzoo_model"] = result.spec.name
    dt.attrs["mcmc_target"] = result.method
    dt["posterior"].attrs["sampled_hyperparameters"] = ",".join(
        k.replace(".", "_") for k in result.samples if k not in (V_SITE, "u"))
    return dt
