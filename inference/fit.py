"""Fitting, prediction and ELBO evaluation for every zoo model.

``fit`` validates the data eagerly (typed errors naming the argument, before any tracing), builds
the model family named by the spec, and runs optax through NumPyro's SVI with jit-compiled
chunks of steps (``lax.scan``), minibatches drawn without replacement epoch by epoch (a pure
function of seed and step, so a resumed run sees the same batches), a progress bar, checkpoints,
and a NaN guard that stops at the first bad step with the last good checkpoint on disk.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import optax
import threadpoolctl
from numpyro.infer import SVI, TraceMeanField_ELBO
from numpyro.optim import optax_to_numpyro
from tqdm.auto import tqdm

from inference.checkpoint import load_checkpoint, save_checkpoint
from inference.inducing import InducingVariables, initialise_inducing
from inference.inducing import Kuu
from inference.linalg import cholesky_with_jitter
from inference.svgp import INDUCING_SITE, KERNEL_SITE, SVGP
from models.errors import CheckpointError, InvalidArgumentError, ShapeError, TrainingError, as_float_array
from models.zoo import ModelSpec

__all__ = ["ElboEstimate", "FitResult", "Prediction", "evaluate_elbo", "fit", "predict", "build_family"]

#: "svgp-logistic-pg" fits a plain SVGP by Pólya–Gamma natural gradients (:mod:`inference.pg_natgrad`);
#: its model and guide are the SVGP's, so prediction and the ELBO use them unchanged.
_FAMILIES = {"svgp": SVGP, "svgp-logistic-pg": SVGP}


def register_family(name: str, builder) -> None:
    """Make ``ModelSpec(method=name)`` fit with ``builder(spec, inducing, num_latent)``."""
    _FAMILIES[name] = builder


def build_family(spec: ModelSpec, inducing: InducingVariables, num_latent: int):
    if spec.method not in _FAMILIES:
        raise InvalidArgumentError("method", f"unknown inference method {spec.method!r}; known: {sorted(_FAMILIES)}")
    return _FAMILIES[spec.method](spec, inducing, num_latent)


# ----------------------------------------------------------------------------- results
@dataclasses.dataclass
class FitResult:
    """A fitted model: its spec, the inducing structure, the learned parameters and the traces."""

    spec: ModelSpec
    inducing: InducingVariables
    num_latent: int
    params: dict[str, np.ndarray]
    elbo_history: np.ndarray
    learning_rate_history: np.ndarray
    diagnostics: dict[str, Any]
    num_data: int
    X_train: np.ndarray
    y_train: np.ndarray
    seed: int = 0
    batch_size: int | None = None
    _family: Any = dataclasses.field(default=None, repr=False)

    @property
    def family(self):
        """The model family (e.g. :class:`inference.svgp.SVGP`) holding model and guide."""
        if self._family is None:
            self._family = build_family(self.spec, self.inducing, self.num_latent)
        return self._family

    @property
    def final_elbo(self) -> float:
        return float(self.elbo_history[-1]) if len(self.elbo_history) else float("nan")

    def hyperparameters(self) -> dict[str, np.ndarray]:
        """Type-II point estimates of kernel/likelihood hyperparameters (constrained)."""
        return {k: v for k, v in self.params.items() if k.startswith(("kernel.", "likelihood."))}


@dataclasses.dataclass
class Prediction:
    """q(f*) marginals ``[N, L]``, predictive moments of y, class probabilities, optional samples."""

    f_mean: np.ndarray
    f_var: np.ndarray
    y_mean: np.ndarray
    y_var: np.ndarray
    probs: np.ndarray | None = None
    f_samples: np.ndarray | None = None


@dataclasses.dataclass
class ElboEstimate:
    """Full-data ELBO with its Monte Carlo standard error (0 when every term is analytic)."""

    elbo: float
    stderr: float
    expected_log_lik: float
    kl: float
    num_samples: int
    draws: np.ndarray


# ----------------------------------------------------------------------------- validation
def _float_dtype():
    return jnp.float64 if jax.config.jax_enable_x64 else jnp.float32


def validate_data(spec: ModelSpec, X, y):
    """Eager checks of X and y against the spec; returns NumPy arrays (X float, y as targets)."""
    X = as_float_array(X, "X", ndim=2)
    y = spec.likelihood.validate_targets(y)
    if y.shape[0] != X.shape[0]:
        raise ShapeError("y", f"has {y.shape[0]} rows but X has {X.shape[0]}")
    if X.shape[0] == 0:
        raise ShapeError("X", "is empty")
    check = getattr(spec.kernel, "validate_inputs", None)
    if check is not None:
        check(X)
    return X.astype(_float_dtype()), y


def _num_latent(spec: ModelSpec, y) -> int:
    num_classes = getattr(spec.likelihood, "num_classes", None)
    return spec.likelihood.num_latent(num_classes)


# ----------------------------------------------------------------------------- fitting
def fit(
    spec: ModelSpec,
    X,
    y,
    *,
    steps: int = 1000,
    batch_size: int | None = None,
    seed: int = 0,
    learning_rate: float | optax.Schedule = 0.01,
    optimizer: optax.GradientTransformation | None = None,
    inducing: InducingVariables | None = None,
    checkpoint_dir: str | Path | None = None,
    checkpoint_every: int | None = None,
    resume: bool = False,
    progress: bool = True,
    chunk_size: int = 25,
) -> FitResult:
    """Fit ``spec`` to (X, y) by maximising the ELBO; returns a :class:`FitResult`.

    ``batch_size=None`` uses all data each step. ``optimizer`` defaults to Adam with
    ``learning_rate`` (a float or an optax schedule). With ``checkpoint_dir`` a checkpoint is
    written every ``checkpoint_every`` steps (default: every 10 % of the run) and at the end;
    ``resume=True`` continues from the checkpoint there and reproduces the uninterrupted run.

    ``spec.method == "svgp-logistic-pg"`` is fitted by Pólya–Gamma natural gradients
    (:func:`inference.pg_natgrad.fit_pg_natgrad`; ``optimizer``/``learning_rate`` then drive the
    hyperparameter steps; no checkpoints). OpenBLAS runs single-threaded during the fit: on a
    small shared machine its threads made the Cholesky gradient ~50x slower
    (``benchmarks/svgp_scaling.py``).
    """
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        if isinstance(spec, ModelSpec) and spec.method == "svgp-logistic-pg":
            if checkpoint_dir is not None or resume:
                raise InvalidArgumentError("checkpoint_dir", "the svgp-logistic-pg path does not write checkpoints")
            from inference.pg_natgrad import fit_pg_natgrad  # noqa: PLC0415 - it imports this module

            return fit_pg_natgrad(spec, X, y, steps=steps, batch_size=batch_size, seed=seed, learning_rate=learning_rate,
                                  optimizer=optimizer, inducing=inducing, progress=progress, chunk_size=chunk_size)
        return _fit_svi(spec, X, y, steps=steps, batch_size=batch_size, seed=seed, learning_rate=learning_rate,
                        optimizer=optimizer, inducing=inducing, checkpoint_dir=checkpoint_dir,
                        checkpoint_every=checkpoint_every, resume=resume, progress=progress, chunk_size=chunk_size)


def _fit_svi(spec, X, y, *, steps, batch_size, seed, learning_rate, optimizer, inducing, checkpoint_dir,
             checkpoint_every, resume, progress, chunk_size) -> FitResult:
    """``fit`` for every NumPyro-SVI family: optax through ``SVI`` in jitted ``lax.scan`` chunks."""
    if not isinstance(spec, ModelSpec):
        raise InvalidArgumentError("spec", f"expected a ModelSpec (zoo.get(name, ...)), got {type(spec).__name__}")
    X, y = validate_data(spec, X, y)
    N = X.shape[0]
    if not isinstance(steps, (int, np.integer)) or steps < 0:
        raise InvalidArgumentError("steps", f"must be a non-negative integer, got {steps!r}")
    B = N if batch_size is None else batch_size
    if not isinstance(B, (int, np.integer)) or not 1 <= B <= N:
        raise InvalidArgumentError("batch_size", f"must be an integer in [1, {N}], got {batch_size!r}")
    if resume and checkpoint_dir is None:
        raise InvalidArgumentError("resume", "resume=True needs checkpoint_dir")
    checkpoint_every = checkpoint_every or max(1, steps // 10)

    key = jax.random.PRNGKey(seed)
    key_inducing, key_svi = jax.random.split(key)
    if inducing is None:
        inducing = initialise_inducing(spec.inducing, spec.kernel, X, spec.num_inducing, key_inducing, spec.inducing_init)
    num_latent = _num_latent(spec, y)
    family = build_family(spec, inducing, num_latent)

    X_j, y_j = jnp.asarray(X), jnp.asarray(y, dtype=_float_dtype())
    if optimizer is None:
        optimizer = optax.adam(learning_rate)
    schedule = learning_rate if callable(learning_rate) else (lambda step: learning_rate)
    svi = SVI(family.model, family.guide, optax_to_numpyro(optimizer), TraceMeanField_ELBO())
    batches = _BatchSchedule(N, B, seed)
    init_idx = batches(0)
    if family.hyper_guide is None:
        state = jax.jit(lambda key, Xb, yb: svi.init(key, Xb, yb, num_data=N))(key_svi, X_j[init_idx], y_j[init_idx])
    else:  # the autoguide records concrete prototype values at init: it must not run under jit
        state = svi.init(key_svi, X_j[init_idx], y_j[init_idx], num_data=N)
    family.check_analytic_kl()

    start, elbo_hist, lr_hist = 0, [], []
    if resume and (Path(checkpoint_dir) / "config.json").exists():
        config, _, state, history = load_checkpoint(checkpoint_dir, state_template=state)
        if config.get("model") != spec.name or config.get("num_data") != N or config.get("batch_size") != B:
            raise CheckpointError(
                f"checkpoint in {str(checkpoint_dir)!r} was written for model {config.get('model')!r} "
                f"(N={config.get('num_data')}, batch_size={config.get('batch_size')}), not {spec.name!r} (N={N}, batch_size={B})"
            )
        start = int(config["step"])
        elbo_hist, lr_hist = list(history["elbo"]), list(history["learning_rate"])

    def run_chunk(state, idx, active):  # idx [K, B], active [K]: padded steps leave the state as is
        def body(state, inputs):
            batch_idx, on = inputs
            new_state, loss = svi.update(state, X_j[batch_idx], y_j[batch_idx], num_data=N)
            state = jax.tree_util.tree_map(lambda a, b: jnp.where(on, a, b), new_state, state)
            return state, loss

        return jax.lax.scan(body, state, (idx, active))

    run_chunk = jax.jit(run_chunk)
    get_params = jax.jit(svi.get_params)
    jitter_at = jax.jit(lambda params: _jitter_used(family, params))
    diagnostics = {"jitter": float(spec.jitter), "jitter_events": [], "dtype": str(np.dtype(_float_dtype())), "seconds": 0.0}

    def checkpoint(step, state):
        if checkpoint_dir is None:
            return
        save_checkpoint(
            checkpoint_dir,
            params=get_params(state),
            state=state,
            history={"elbo": np.asarray(elbo_hist[:step]), "learning_rate": np.asarray(lr_hist[:step])},
            config={"model": spec.name, "step": step, "num_data": N, "batch_size": B, "seed": seed,
                    "jitter_events": diagnostics["jitter_events"]},
        )

    def record_jitter(step, state):
        jitter = float(jitter_at(get_params(state)))
        if jitter > spec.jitter * 1.0001:
            diagnostics["jitter_events"].append({"step": step, "jitter": jitter})

    record_jitter(start, state)
    chunk = max(1, min(chunk_size, steps))  # one compiled scan length for the whole run
    bar = tqdm(total=steps, initial=start, desc=f"fit {spec.name}", disable=not progress, unit="step", leave=False)
    t0 = time.perf_counter()
    step = start
    try:
        while step < steps:
            k = min(chunk, steps - step, checkpoint_every - step % checkpoint_every)
            idx = np.stack([batches(s) for s in range(step, step + k)] + [batches(step)] * (chunk - k))  # [chunk, B]
            new_state, losses = run_chunk(state, idx, np.arange(chunk) < k)
            losses = np.asarray(losses)[:k]
            if not np.all(np.isfinite(losses)):
                # the loss at step `bad` is evaluated at the parameters the update of step bad-1
                # produced, so the last state known to be good is the one at step bad-1
                bad = step + int(np.argmin(np.isfinite(losses)))
                good = max(bad - 1, start)
                state = _advance(svi, state, X_j, y_j, N, batches, step, good)
                elbo_hist.extend((-losses[: good - step]).tolist())
                lr_hist.extend(float(schedule(s)) for s in range(step, good))
                checkpoint(good, state)
                where = f"; last good checkpoint (step {good}) in {checkpoint_dir}" if checkpoint_dir else ""
                raise TrainingError(
                    f"loss became {losses[bad - step]} at step {bad} of {spec.name!r}{where}. "
                    "Try a smaller learning_rate or larger jitter.",
                    step=bad,
                    checkpoint=str(checkpoint_dir) if checkpoint_dir else None,
                )
            state = new_state
            elbo_hist.extend((-losses).tolist())
            lr_hist.extend(float(schedule(s)) for s in range(step, step + k))
            step += k
            record_jitter(step, state)
            if step % checkpoint_every == 0 or step == steps:
                checkpoint(step, state)
            bar.update(k)
            bar.set_postfix(elbo=f"{elbo_hist[-1]:.4g}")
    finally:
        bar.close()
    diagnostics["seconds"] = time.perf_counter() - t0
    diagnostics["steps"] = steps
    params = {k: np.asarray(v) for k, v in get_params(state).items()}
    return FitResult(
        spec=spec, inducing=inducing, num_latent=num_latent, params=params,
        elbo_history=np.asarray(elbo_hist), learning_rate_history=np.asarray(lr_hist),
        diagnostics=diagnostics, num_data=N, X_train=np.asarray(X), y_train=np.asarray(y),
        seed=seed, batch_size=B, _family=family,
    )


class _BatchSchedule:
    """Minibatch indices as a pure function of the step: epoch-wise permutations (no replacement)."""

    def __init__(self, num_data: int, batch_size: int, seed: int):
        self.N, self.B, self.seed = num_data, batch_size, seed
        self.per_epoch = max(1, num_data // batch_size)
        self._epoch, self._perm = -1, None

    def __call__(self, step: int) -> np.ndarray:
        if self.B == self.N:
            return np.arange(self.N)
        epoch, pos = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.N)
        return self._perm[pos * self.B : (pos + 1) * self.B]


def _advance(svi, state, X, y, N, batches, start, stop):
    """Replay steps ``start..stop-1`` one at a time (used to reach the last good state)."""
    for s in range(start, stop):
        idx = batches(s)
        state, _ = svi.update(state, X[idx], y[idx], num_data=N)
    return state


def _jitter_used(family, params):
    with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
        kernel = family.spec.kernel.realise(KERNEL_SITE)
        inducing = family.inducing.realise(INDUCING_SITE)
        return cholesky_with_jitter(Kuu(inducing, kernel), family.spec.jitter)[1]


# ----------------------------------------------------------------------------- prediction
def _hyper_draws(res: FitResult, key, num_draws: int):
    """Draws of prior-carrying hyperparameters from their guide (empty dict when none)."""
    guide = res.family.hyper_guide
    if guide is None:
        return {}
    draws = guide.sample_posterior(key, res.params, sample_shape=(num_draws,))
    latent = {name for name, site in guide.prototype_trace.items() if site["type"] == "sample" and not site["is_observed"]}
    return {k: v for k, v in draws.items() if k in latent}


def _chunks(n: int, size: int):
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))


def predict(res: FitResult, X_new, *, num_samples: int = 0, seed: int = 0, batch_size: int = 512,
            num_hyper_samples: int = 16) -> Prediction:
    """Predictive q(f*) and y* at ``X_new`` (in chunks of ``batch_size`` rows).

    ``num_samples`` > 0 also returns joint-marginal draws of f* ``[S, N, L]`` (independent per
    point). Models with sampled hyperparameters average over ``num_hyper_samples`` guide draws
    (mixture moments).
    """
    X_new = as_float_array(X_new, "X_new", ndim=2)
    if X_new.shape[1] != res.X_train.shape[1]:
        raise ShapeError("X_new", f"has {X_new.shape[1]} columns; the model was fitted on {res.X_train.shape[1]}")
    check = getattr(res.spec.kernel, "validate_inputs", None)
    if check is not None:
        check(X_new)
    family = res.family
    key_h, key_s, key_p = jax.random.split(jax.random.PRNGKey(seed), 3)
    hyper = _hyper_draws(res, key_h, num_hyper_samples)

    def moments(params, Xc, key):
        with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=key):
            parts = family.parts()
            mean, var = family.latent_moments(parts, Xc)
            y_mean, y_var = parts.likelihood.predict_mean_and_var(mean, var)
            probs = parts.likelihood.predict_probs(mean, var, key=key) if parts.likelihood.task in ("binary", "multiclass") else None
        return mean, var, y_mean, y_var, probs

    def combined(Xc, key):
        if not hyper:
            return moments(res.params, Xc, key)
        outs = jax.vmap(lambda h, k: moments({**res.params, **h}, Xc, k))(hyper, jax.random.split(key, num_hyper_samples))
        mean, var, y_mean, y_var, probs = outs
        f_mean = mean.mean(0)
        f_var = var.mean(0) + mean.var(0)
        ym = y_mean.mean(0)
        yv = y_var.mean(0) + y_mean.var(0)
        return f_mean, f_var, ym, yv, None if probs is None else probs.mean(0)

    combined = jax.jit(combined)
    pieces = [combined(jnp.asarray(X_new[sl], _float_dtype()), jax.random.fold_in(key_p, i))
              for i, sl in enumerate(_chunks(X_new.shape[0], batch_size))]
    f_mean, f_var, y_mean, y_var, probs = (
        None if pieces[0][j] is None else np.concatenate([np.asarray(p[j]) for p in pieces]) for j in range(5)
    )
    f_samples = None
    if num_samples > 0:
        eps = np.asarray(jax.random.normal(key_s, (num_samples,) + f_mean.shape))
        f_samples = f_mean[None] + np.sqrt(np.maximum(f_var, 0.0))[None] * eps
    return Prediction(f_mean, f_var, y_mean, y_var, probs, f_samples)


# ----------------------------------------------------------------------------- ELBO
def evaluate_elbo(res: FitResult, X=None, y=None, *, num_samples: int = 32, seed: int = 0,
                  batch_size: int = 512) -> ElboEstimate:
    """Full-data ELBO Σ_n E_q[log p(y_n|f_n)] − KL (seed 000 eq. 5) with its Monte Carlo SE.

    Defaults to the training data. Terms that are analytic (Gaussian, Gauss–Hermite, the KL)
    contribute no Monte Carlo error; with none stochastic (no Monte Carlo likelihood, no sampled
    orbits, no sampled hyperparameters) a single draw is used and SE = 0.
    """
    X = res.X_train if X is None else X
    y = res.y_train if y is None else y
    X, y = validate_data(res.spec, X, y)
    family = res.family
    stochastic = family.stochastic_expectation or family.hyper_guide is not None
    S = num_samples if stochastic else 1
    if S < 1:
        raise InvalidArgumentError("num_samples", f"must be >= 1, got {num_samples}")
    keys = jax.random.split(jax.random.PRNGKey(seed), S)

    def ell_and_kl(params, Xc, yc, key):
        with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=key):
            parts = family.parts()
            lik_key = key if parts.likelihood.stochastic_expectation else None
            ell = jnp.sum(family.expected_log_lik(parts, Xc, yc, lik_key))
            kl = numpyro.distributions.kl.kl_divergence(family.posterior(parts), family.prior(parts))
        return ell, kl

    ell_and_kl = jax.jit(ell_and_kl)
    hyper = _hyper_draws(res, jax.random.PRNGKey(seed + 1), S)
    draws, ell_total, kl_total = [], 0.0, 0.0
    for s in range(S):
        params = dict(res.params)
        extra = 0.0
        if hyper:
            h = {k: v[s] for k, v in hyper.items()}
            params.update(h)
            extra = _hyper_log_ratio(res, h, X[:1], y[:1])
        ell, kl = 0.0, 0.0
        for i, sl in enumerate(_chunks(X.shape[0], batch_size)):
            e, kl = ell_and_kl(params, jnp.asarray(X[sl]), jnp.asarray(y[sl], _float_dtype()), jax.random.fold_in(keys[s], i))
            ell += float(e)
        draws.append(ell - float(kl) - extra)
        ell_total += ell / S
        kl_total += float(kl) / S
    draws = np.asarray(draws)
    stderr = float(draws.std(ddof=1) / math.sqrt(S)) if S > 1 else 0.0
    return ElboEstimate(float(draws.mean()), stderr, ell_total, kl_total, S, draws)


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
