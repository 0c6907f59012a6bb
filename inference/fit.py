"""``fit``, ``predict`` and ``evaluate_elbo`` for every zoo model, and the table of inference methods.

A spec names its inference method (``spec.method``); :data:`METHODS` maps that name to the model
family (the class holding the NumPyro model and guide) and the fitter that trains it:

* ``"svgp"`` — :class:`~gpzoo.inference.svgp.SVGP` trained by SVI (:func:`~gpzoo.inference.svi.fit_svi`);
* ``"invariant-svgp"`` — :class:`~gpzoo.inference.invariant.InvariantSVGP` (sampled-orbit
  estimators, van der Wilk et al. 2018, eq. 16–21) trained by SVI;
* ``"svgp-logistic-pg"`` — the plain SVGP trained by Pólya–Gamma natural gradients
  (:func:`~gpzoo.inference.pg_natgrad.fit_pg_natgrad`);
* ``"deep-svgp"`` — :class:`~gpzoo.inference.deep_conv.DeepConvSVGP`, a deep convolutional GP
  (Dutordoir et al. 2020, §4) trained by SVI;
* ``"dkm"`` — :class:`~gpzoo.inference.dkm_family.DeepKernelMachine`, a deep kernel machine
  (Milsom et al. 2024) trained by SVI (:func:`~gpzoo.inference.dkm_family.fit_dkm`).

:func:`register_method` adds one. Prediction and ELBO evaluation need only the family, so they are
the same for every method. Every fitter validates its data eagerly (typed errors naming the
argument, before any tracing) and runs on the shared chunk runner
(:func:`gpzoo.inference.runner.run_chunks`: progress, checkpoints, resume, NaN guard, Ctrl-C).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import optax
import threadpoolctl

from gpzoo.inference.compilation import adaptive_jit
from gpzoo.inference.data import MemmapSource, check_new_inputs, check_new_source, validate_data
from gpzoo.inference.deep_conv import DeepConvSVGP
from gpzoo.inference.dkm_family import DeepKernelMachine, fit_dkm
from gpzoo.inference.family import check_family_class
from gpzoo.inference.inducing import InducingVariables
from gpzoo.inference.invariant import InvariantSVGP
from gpzoo.inference.linalg import float_dtype
from gpzoo.inference.natgrad import check_natgrad_spec
from gpzoo.inference.pg_natgrad import fit_pg_natgrad
from gpzoo.inference.programs import pad_rows, row_blocks
from gpzoo.inference.results import ElboEstimate, FitResult, Prediction
from gpzoo.inference.runner import AUTO_MAX_STEPS, FitSettings
from gpzoo.inference.scaling import Standardisation, check_data_scale
from gpzoo.inference.svgp import SVGP
from gpzoo.inference.svi import fit_svi
from gpzoo.models import draws
from gpzoo.models.errors import (
    ConvergenceWarning,
    GPZooError,
    InvalidArgumentError,
    as_float_array,
    check_flag,
    check_integer,
    check_seed,
)
from gpzoo.models.zoo import ModelSpec

__all__ = ["METHODS", "ElboCalls", "ElboEstimate", "FitResult", "Method", "Prediction", "PredictCalls", "build_family",
           "elbo_calls", "evaluate_elbo", "fit", "predict", "predict_calls", "register_method", "warn_if_unconverged"]


@dataclasses.dataclass(frozen=True)
class Method:
    """An inference method: the model family, the fitter that trains it, and what that fitter can do.

    ``family(spec, inducing, num_latent)`` builds the object holding ``model``/``guide`` for a
    minibatch ``(X, y, num_data)`` (:class:`~gpzoo.inference.family.ModelFamily`; one whose
    ``needs_data_indices`` is true also gets the rows' training-set positions ``data_indices``);
    ``fitter(spec, X, y, family_class=family, settings=FitSettings(...))`` trains it with
    :func:`fit`'s run settings and returns a :class:`FitResult`. ``data_parallel``: the fitter
    splits minibatches across devices (``fit(devices=...)``); ``streams_data``: it reads its
    minibatches from a :class:`~gpzoo.inference.data.MemmapSource`. A family class that does not
    implement the interface is refused, by name.
    """

    family: type
    fitter: Callable[..., FitResult]
    data_parallel: bool = False
    streams_data: bool = False
    name: str = ""

    def __post_init__(self):
        check_family_class(self.family, self.name or getattr(self.fitter, "__name__", "?"))


#: Inference method name (``ModelSpec.method``) -> :class:`Method`.
METHODS: dict[str, Method] = {
    "svgp": Method(SVGP, fit_svi, data_parallel=True, streams_data=True, name="svgp"),
    "invariant-svgp": Method(InvariantSVGP, fit_svi, data_parallel=True, streams_data=True, name="invariant-svgp"),
    "svgp-logistic-pg": Method(SVGP, fit_pg_natgrad, name="svgp-logistic-pg"),
    "deep-svgp": Method(DeepConvSVGP, fit_svi, data_parallel=True, streams_data=True, name="deep-svgp"),
    "dkm": Method(DeepKernelMachine, fit_dkm, name="dkm"),
}


def register_method(name: str, family: type, fitter: Callable[..., FitResult] = fit_svi, *,
                    data_parallel: bool | None = None, streams_data: bool | None = None) -> None:
    """Make ``ModelSpec(method=name)`` fit with ``fitter`` on model family ``family`` (default: SVI).

    ``data_parallel`` / ``streams_data`` declare what the fitter can do (default: what SVI can, for
    SVI, else nothing). ``family`` must implement :class:`~gpzoo.inference.family.ModelFamily`
    (an ``InvalidArgumentError`` names what it lacks)."""
    svi = fitter is fit_svi
    METHODS[name] = Method(family, fitter, data_parallel=svi if data_parallel is None else bool(data_parallel),
                           streams_data=svi if streams_data is None else bool(streams_data), name=name)


def _method(spec: ModelSpec) -> Method:
    if not isinstance(spec, ModelSpec):
        raise InvalidArgumentError("spec", f"expected a ModelSpec (zoo.get(name, ...)), got {type(spec).__name__}")
    if spec.method not in METHODS:
        raise InvalidArgumentError("method", f"unknown inference method {spec.method!r}; known: {sorted(METHODS)}")
    return METHODS[spec.method]


def build_family(spec: ModelSpec, inducing: InducingVariables, num_latent: int):
    """The model family of ``spec``'s method, built for these inducing variables and latent functions."""
    return _method(spec).family(spec, inducing, num_latent)


# ----------------------------------------------------------------------------- fitting
def fit(
    spec: ModelSpec,
    X,
    y=None,
    *,
    steps: int | str = 1000,
    batch_size: int | None = None,
    seed: int = 0,
    learning_rate: float | optax.Schedule = 0.01,
    optimizer: optax.GradientTransformation | str | None = None,
    natgrad_step: float | Callable | None = None,
    inducing: InducingVariables | None = None,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    progress: bool = True,
    chunk_size: int = 25,
    devices=None,
    max_steps: int = AUTO_MAX_STEPS,
    standardise: bool = False,
) -> FitResult:
    """Fit ``spec`` to (X, y) by the spec's inference method; returns a :class:`FitResult`.

    ``batch_size=None`` uses all data each step. ``optimizer`` defaults to Adam with
    ``learning_rate`` (a float or an optax schedule). With ``checkpoint_dir`` a checkpoint is
    written every ``checkpoint_every`` steps (default: every 10 % of the run) and at the end;
    ``resume=True`` continues from the checkpoint there and reproduces the uninterrupted run.
    Minibatches are drawn without replacement epoch by epoch, a pure function of seed and step.

    Convergence: the result's :attr:`~FitResult.converged` says whether the objective had levelled
    off by the last step (:func:`~gpzoo.inference.results.assess_convergence`: the last quarter's
    gain over the quarter before, against the trace's own noise and 1 % of the run's progress;
    None for fewer than 20 steps), and :attr:`~FitResult.convergence` gives the numbers and an
    estimate of the steps still needed. A fit that ends unconverged warns
    (:class:`~gpzoo.models.errors.ConvergenceWarning`, naming the model and the steps it likely
    needs). ``steps="auto"`` runs until the objective levels off
    (:func:`~gpzoo.inference.results.settled`, tested after every chunk of ``chunk_size`` steps),
    at least 500 and at most ``max_steps`` steps (default 10,000; it bounds only an ``"auto"``
    run); the steps run are ``len(result.objective_history)``.

    Data larger than memory: ``X`` may be a :class:`~gpzoo.inference.data.MemmapSource`
    (``open_npy(X_path, y_path)``; ``y=None`` takes the source's targets). Its rows are checked
    chunk by chunk and each minibatch is read from disk; the fit equals the in-memory one bit for
    bit when N <= ``INIT_ROWS`` (above it the inducing variables start from a seeded subsample).

    ``devices`` (a count, or a sequence of JAX devices; None: one device) trains data-parallel:
    each minibatch is split across the devices with ``jax.sharding``, parameters replicated, and the
    ELBO's data term summed across them (:mod:`gpzoo.inference.sharding`; ``batch_size`` must be a
    multiple of the device count). It applies to the models fitted by SVI, whose data term is a
    sum over data points; the Pólya–Gamma natural-gradient and deep-kernel-machine fitters refuse it.

    Data scale: data far from unit scale for the precision of the fit (feature columns spread over
    more than 1e2 or less than 1e-2, an offset float32 cannot resolve, regression targets of order
    1e2 and above) warn with a :class:`~gpzoo.models.errors.DataScaleWarning` naming ``X`` or ``y``.
    ``standardise=True`` centres and scales each feature column (images under a vector kernel: all
    pixels alike; images under a patch kernel stay in [0, 1]) and Gaussian regression targets, in float64 before the cast to the fit's precision;
    the map is stored in the result (``result.standardisation``, saved with it), ``predict``,
    ``evaluate_elbo`` and ``to_datatree`` take and return original units, and the objective and
    log densities of y include the change of variables (−log sd(y) per target), so they compare
    with fits without it (:mod:`gpzoo.inference.scaling`; not the default, which reports
    everything for the data as passed).

    Compiled once per model structure: a second fit of the same structure (other data of the same
    shape, seed, step count or learning rate) runs the programs the first compiled
    (:mod:`gpzoo.inference.programs`). A custom ``optimizer`` or learning-rate schedule is part of
    that structure by identity: pass the same object again to reuse the programs.

    ``optimizer="natgrad"``: each step a natural-gradient step on the Gaussian q(u) (``q_mu``,
    full ``q_sqrt``), then Adam with ``learning_rate`` on every other parameter from the ELBO's
    gradient at the new q(u) (:mod:`gpzoo.inference.natgrad`; svgp, invariant-svgp and the output layer of
    deep-svgp, with q_structure="full"; other methods and structures are refused naming
    ``optimizer``). ``natgrad_step`` is the step size γ: a float in (0, 1] or a schedule
    ``step -> γ``; default 1 for a Gaussian likelihood (one full-batch step reaches the optimal
    q(u)), else a warm-up from 1e-4 rising log-linearly to 0.1 over the first 5 steps.

    ``spec.method == "svgp-logistic-pg"`` is fitted by Pólya–Gamma natural gradients
    (``optimizer``/``learning_rate`` then drive the hyperparameter steps). OpenBLAS runs
    single-threaded during the fit: on a small shared machine its threads made the Cholesky
    gradient ~50x slower (``benchmarks/svgp_scaling.py``).
    """
    method = _method(spec)
    settings = FitSettings(steps=steps, batch_size=batch_size, seed=seed, learning_rate=learning_rate, optimizer=optimizer,
                           inducing=inducing, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                           resume=resume, progress=progress, chunk_size=chunk_size, devices=devices,
                           max_steps=max_steps, natgrad_step=natgrad_step)
    if optimizer is not None and isinstance(optimizer, str):
        check_natgrad_spec(spec, method.name, method.fitter is fit_svi)
    if y is None and not isinstance(X, MemmapSource):
        raise InvalidArgumentError("y", "pass the targets y (only a data source such as open_npy(X_path, y_path) carries its own)")
    fitter = getattr(method.fitter, "__name__", repr(method.fitter))
    if devices is not None and not method.data_parallel:
        raise InvalidArgumentError("devices", f"model {spec.name!r} is fitted by {fitter}, which does not split "
                                              "minibatches across devices; data-parallel training applies to the "
                                              "models fitted by SVI (their ELBO data term is a sum over data points)")
    if isinstance(X, MemmapSource) and not method.streams_data:
        raise InvalidArgumentError("X", f"model {spec.name!r} is fitted by {fitter}, which reads its data in memory; "
                                        "pass arrays (a data source is read by the SVI fitter)")
    standardisation = None
    if check_flag(standardise, "standardise"):
        if isinstance(X, MemmapSource):
            raise InvalidArgumentError("standardise", "applies to data held in memory; standardise the .npy files "
                                                      "before opening them")
        validate_data(spec, X, y)  # typed errors on the data as passed, before any arithmetic on it
        standardisation = Standardisation.of(spec, X, y)
        X, y = standardisation.inputs(X), standardisation.targets(y)
    elif not isinstance(X, MemmapSource):
        try:
            inputs, targets = as_float_array(X, "X", ndim=2), spec.likelihood.validate_targets(y)
        except GPZooError:
            pass  # the fitter's own checks raise it, naming the argument
        else:
            check_data_scale(spec, inputs, targets, stacklevel=3)
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        res = method.fitter(spec, X, y, family_class=method.family, settings=settings)
    if standardisation is not None:
        # the objective of the data as passed: each target's density carries the Jacobian 1 / sd(y)
        res = dataclasses.replace(res, standardisation=standardisation,
                                  objective_history=res.objective_history - res.num_data * standardisation.log_y_scale)
    warn_if_unconverged(res, stacklevel=3)
    return res


def warn_if_unconverged(res: FitResult, stacklevel: int = 2) -> None:
    """Issue a :class:`~gpzoo.models.errors.ConvergenceWarning` naming the model and the steps it
    likely needs when ``res``'s objective had not levelled off by its last step."""
    convergence = res.convergence
    if convergence.converged is not False:
        return
    message = (f"{res.spec.name}: {convergence.describe(res.objective)} in total; pass more steps, or "
               "steps='auto' to run until it levels off")
    warnings.warn(ConvergenceWarning(message, model=res.spec.name, steps=convergence.values,
                                     steps_needed=convergence.steps_needed, at_least=convergence.at_least),
                  stacklevel=stacklevel)


# ----------------------------------------------------------------------------- prediction
def _check_result(res) -> None:
    if not isinstance(res, FitResult):
        raise InvalidArgumentError("res", f"expected a FitResult (from fit or gpzoo.load), got {type(res).__name__}")


def _hyper_draws(res: FitResult, key, num_draws: int):
    """Draws of prior-carrying hyperparameters from their guide (empty dict when none)."""
    guide = res.family.hyper_guide
    if guide is None:
        return {}
    draws = guide.sample_posterior(key, res.params, sample_shape=(num_draws,))
    latent = {name for name, site in guide.prototype_trace.items() if site["type"] == "sample" and not site["is_observed"]}
    return {k: v for k, v in draws.items() if k in latent}


def predict(res: FitResult, X_new, *, num_samples: int = 0, seed: int = 0, batch_size: int = 512,
            num_hyper_samples: int = 16) -> Prediction:
    """Predictive q(f*) and y* at ``X_new`` (in chunks of ``batch_size`` rows; a
    :class:`~gpzoo.inference.data.MemmapSource` is read from disk a chunk at a time).

    ``num_samples`` > 0 also returns joint-marginal draws of f* ``[S, N, L]`` (independent per
    point). Models with sampled hyperparameters average over ``num_hyper_samples`` guide draws
    (mixture moments). A :class:`~gpzoo.inference.mcmc.SampleResult` of ``gpzoo.sample`` predicts
    with the mixture over its MCMC draws (:meth:`~gpzoo.inference.mcmc.SampleResult.predict`).
    """
    from gpzoo.inference.mcmc import SampleResult  # noqa: PLC0415 - only needed here

    if isinstance(res, SampleResult):
        return res.predict(X_new, batch_size=batch_size)
    _check_result(res)
    standardisation = res.standardisation
    if isinstance(X_new, MemmapSource):
        source = check_new_source(res, X_new)
        num_rows = len(source)
        rows_of = source.rows if standardisation is None else (  # mapped in float64, then cast
            lambda rows: standardisation.inputs(as_float_array(source.raw_rows(rows), "X_new", ndim=2)))
    else:
        X_new = check_new_inputs(res, X_new, original_units=True)
        num_rows, rows_of = X_new.shape[0], X_new.__getitem__
    check_integer(num_samples, "num_samples", minimum=0)
    check_seed(seed)
    check_integer(batch_size, "batch_size", minimum=1)
    check_integer(num_hyper_samples, "num_hyper_samples", minimum=1)
    calls = predict_calls(res, num_rows, rows_of, seed=seed, batch_size=batch_size, num_hyper_samples=num_hyper_samples)
    pieces = [calls.program(*calls.args(i)) for i in range(len(calls.slices))]
    counts = [sl.stop - sl.start for sl in calls.slices]  # blocks are padded: keep each one's own rows
    f_mean, f_var, y_mean, y_var, probs = (
        None if pieces[0][j] is None else np.concatenate([np.asarray(p[j])[:n] for p, n in zip(pieces, counts)])
        for j in range(5)
    )
    # the programs always return the moments; only probs may be None
    assert f_mean is not None and f_var is not None and y_mean is not None and y_var is not None
    f_samples = None
    if num_samples > 0:
        key_s = jax.random.split(jax.random.PRNGKey(seed), 3)[1]
        eps = np.asarray(draws.normal(key_s, (num_samples,) + f_mean.shape))
        f_samples = f_mean[None] + np.sqrt(np.maximum(f_var, 0.0))[None] * eps
    prediction = Prediction(f_mean, f_var, y_mean, y_var, probs, f_samples)
    return prediction if standardisation is None else standardisation.prediction(prediction)


@dataclasses.dataclass(frozen=True)
class PredictCalls:
    """The calls :func:`predict` makes of its compiled program: ``program(*args(i))`` for chunk ``i``
    of ``slices``, its rows padded to ``sizes[i]`` (:func:`~gpzoo.inference.programs.row_blocks`;
    the caller keeps the first ``len(slices[i])`` rows of each result). Built by :func:`predict_calls`."""

    program: Callable
    res: FitResult
    hyper: dict  # site -> [H, ...] draws of sampled hyperparameters; {} if none
    key: jax.Array
    slices: list
    rows_of: Callable  # slice -> rows of the inputs
    sizes: list = dataclasses.field(default_factory=list)  # padded rows of each slice

    def args(self, i: int) -> tuple:
        Xc = jnp.asarray(pad_rows(self.rows_of(self.slices[i]), self.sizes[i]), float_dtype())
        key = jax.random.fold_in(self.key, i)
        if self.hyper:
            return self.res.family, self.res.params, self.hyper, Xc, key
        return self.res.family, self.res.params, Xc, key


def predict_calls(res: FitResult, num_rows: int, rows_of: Callable, *, seed: int = 0, batch_size: int = 512,
                  num_hyper_samples: int = 16) -> PredictCalls:
    """The program and per-chunk arguments of ``predict(res, X, seed=seed, batch_size=batch_size,
    num_hyper_samples=num_hyper_samples)`` for validated inputs of ``num_rows`` rows read by ``rows_of``."""
    key_h, _, key_p = jax.random.split(jax.random.PRNGKey(seed), 3)
    hyper = _hyper_draws(res, key_h, num_hyper_samples)
    blocks = list(row_blocks(num_rows, batch_size))
    program = (_mixture_moments if hyper else _moments).optimised  # one build whatever the number of rows
    return PredictCalls(program, res, hyper, key_p, [b[0] for b in blocks], rows_of, [b[1] for b in blocks])


# Compiled once per family structure (gpzoo.inference.programs) and block size, and reused by every
# later call, fit and loaded model of that structure.
@adaptive_jit(static_argnums=0)
def _moments(family, params, Xc, key):
    """q(f*) moments ``[n, L]``, y* moments and class probabilities at inputs ``Xc`` ``[n, D]``."""
    with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=key):
        return family.predictive_moments(family.parts(), Xc, key)


@adaptive_jit(static_argnums=0)
def _mixture_moments(family, params, hyper, Xc, key):
    """:func:`_moments` averaged over draws of the sampled hyperparameters ``hyper`` ``{site: [H, ...]}`` (mixture moments)."""
    num = jax.tree_util.tree_leaves(hyper)[0].shape[0]
    mean, var, y_mean, y_var, probs = jax.vmap(lambda h, k: _moments(family, {**params, **h}, Xc, k))(
        hyper, jax.random.split(key, num))
    return (mean.mean(0), var.mean(0) + mean.var(0), y_mean.mean(0), y_var.mean(0) + y_mean.var(0),
            None if probs is None else probs.mean(0))


@adaptive_jit(static_argnums=(0, 7))
def _ell_and_kl(family, params, Xc, yc, key, rows, mask, num_data):
    """Σ_n E_q[log p(y_n | f_n)] over the rows of a chunk where ``mask`` ``[n]`` is true (the rest pad
    the chunk to its block size) and KL[q(u) || p(u)]; ``num_data`` (static) set: per-datum
    parameters are read at training rows ``rows`` ``[n]``."""
    with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=key):
        parts = family.parts()
        lik_key = key if parts.likelihood.stochastic_expectation else None
        inputs = family.data_term_inputs(Xc, yc) if num_data is None else family.data_term_inputs(Xc, yc, rows, num_data)
        ell = jnp.sum(jnp.where(mask, family.expected_log_lik(parts, Xc, yc, lik_key, **inputs), 0.0))
        kl = family.kl(parts)
    return ell, kl


# ----------------------------------------------------------------------------- ELBO
def evaluate_elbo(res: FitResult, X=None, y=None, *, num_samples: int = 32, seed: int = 0,
                  batch_size: int = 512) -> ElboEstimate:
    """Full-data ELBO Σ_n E_q[log p(y_n|f_n)] − KL (van der Wilk et al. 2017, eq. 5) with its Monte Carlo SE.

    Defaults to the training data (per-datum variational parameters, such as free Pólya–Gamma
    tilts, are used there; on other data their family's default stands in). Terms that are analytic (Gaussian, Gauss–Hermite, the KL)
    contribute no Monte Carlo error; with none stochastic (no Monte Carlo likelihood, no sampled
    orbits, no sampled hyperparameters) a single draw is used and SE = 0 (the value is exact). A
    stochastic estimate from ``num_samples=1`` has no standard error to report: SE is NaN.
    ``num_samples`` >= 1 and ``batch_size`` >= 1 are checked for every model.
    """
    _check_result(res)
    check_integer(num_samples, "num_samples", minimum=1)
    check_seed(seed)
    check_integer(batch_size, "batch_size", minimum=1)
    if (X is None) != (y is None):
        raise InvalidArgumentError("X" if X is None else "y", "pass X and y together (or neither, for the training data)")
    standardisation = res.standardisation
    if X is not None and y is not None and standardisation is not None:  # original units -> the model's
        validate_data(res.spec, X, y)
        X = standardisation.inputs(as_float_array(X, "X", ndim=2))
        y = standardisation.targets(res.spec.likelihood.validate_targets(y))
    training = (X is None and y is None) or (
        np.shape(X) == res.X_train.shape and np.shape(y) == res.y_train.shape
        and np.array_equal(np.asarray(X, res.X_train.dtype), res.X_train) and np.array_equal(y, res.y_train))
    X, y = validate_data(res.spec, res.X_train if X is None else X, res.y_train if y is None else y)
    calls = elbo_calls(res, X, y, training=training, num_samples=num_samples, seed=seed, batch_size=batch_size)
    S = calls.num_draws
    estimates, ell_total, kl_total = [], 0.0, 0.0
    for s in range(S):
        extra = _hyper_log_ratio(res, calls.hyper_draw(s), X[:1], y[:1]) if calls.hyper else 0.0
        ell, kl = 0.0, 0.0
        for i in range(len(calls.slices)):
            e, kl = calls.program(*calls.args(s, i))
            ell += float(e)
        estimates.append(ell - float(kl) - extra)
        ell_total += ell / S
        kl_total += float(kl) / S
    elbo_draws = np.asarray(estimates)
    stderr = float(elbo_draws.std(ddof=1) / math.sqrt(S)) if S > 1 else (math.nan if calls.stochastic else 0.0)
    estimate = ElboEstimate(float(elbo_draws.mean()), stderr, ell_total, kl_total, S, elbo_draws)
    return estimate if standardisation is None else standardisation.elbo(estimate, len(y))


@dataclasses.dataclass(frozen=True)
class ElboCalls:
    """The calls :func:`evaluate_elbo` makes of its compiled program: ``program(*args(s, i))`` for
    draw ``s`` < ``num_draws`` and row slice ``i`` of ``slices`` (padded to ``sizes[i]`` rows, masked).
    Built by :func:`elbo_calls`."""

    program: Callable
    res: FitResult
    X: np.ndarray
    y: np.ndarray
    num_draws: int
    stochastic: bool
    hyper: dict  # site -> [S, ...] draws of sampled hyperparameters; {} if none
    keys: jax.Array  # [S] one key per draw
    slices: list
    with_indices: bool
    sizes: list = dataclasses.field(default_factory=list)  # padded rows of each slice

    def hyper_draw(self, s: int) -> dict:
        """Draw ``s`` of the sampled hyperparameters."""
        return {k: v[s] for k, v in self.hyper.items()}

    def args(self, s: int, i: int) -> tuple:
        sl, size = self.slices[i], self.sizes[i]
        params = {**self.res.params, **self.hyper_draw(s)}
        return (self.res.family, params, jnp.asarray(pad_rows(self.X[sl], size)),
                jnp.asarray(pad_rows(self.y[sl], size), float_dtype()), jax.random.fold_in(self.keys[s], i),
                pad_rows(np.arange(sl.start, sl.stop), size), np.arange(size) < sl.stop - sl.start,
                self.res.num_data if self.with_indices else None)


def elbo_calls(res: FitResult, X, y, *, training: bool, num_samples: int = 32, seed: int = 0,
               batch_size: int = 512) -> ElboCalls:
    """The program and per-call arguments of :func:`evaluate_elbo` on validated data (X, y);
    ``training``: they are the training data (per-datum parameters are read at their rows)."""
    family = res.family
    # per-datum parameters exist for training rows only; elsewhere such a family uses its default
    with_indices = training and family.needs_data_indices
    stochastic = family.stochastic_expectation or family.hyper_guide is not None
    S = num_samples if stochastic else 1
    keys = jax.random.split(jax.random.PRNGKey(seed), S)
    hyper = _hyper_draws(res, jax.random.PRNGKey(seed + 1), S)
    blocks = list(row_blocks(X.shape[0], batch_size))
    return ElboCalls(_ell_and_kl.optimised, res, X, y, S, stochastic, hyper, keys, [b[0] for b in blocks], with_indices,
                     [b[1] for b in blocks])


def _hyper_log_ratio(res: FitResult, values: dict, X, y) -> float:
    """log q(θ) − log p(θ) for sampled hyperparameters (their single-draw KL estimate)."""
    family = res.family
    guide_tr = numpyro.handlers.trace(
        numpyro.handlers.substitute(numpyro.handlers.condition(family.hyper_guide, values), data=res.params)
    ).get_trace(jnp.asarray(X), jnp.asarray(y), res.num_data)
    model_tr = numpyro.handlers.trace(
        numpyro.handlers.seed(numpyro.handlers.substitute(numpyro.handlers.condition(family.model, values), data=res.params), 0)
    ).get_trace(jnp.asarray(X), jnp.asarray(y), res.num_data)
    total = 0.0
    for name, value in values.items():
        total += float(jnp.sum(guide_tr[name]["fn"].log_prob(value)) - jnp.sum(model_tr[name]["fn"].log_prob(value)))
    return total
