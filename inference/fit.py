"""Fitting, prediction and ELBO evaluation for every zoo model.

``fit`` validates the data eagerly (typed errors naming the argument, before any tracing), builds
the model family named by the spec, and runs optax through NumPyro's SVI with jit-compiled
chunks of steps (``lax.scan``), minibatches drawn without replacement epoch by epoch (a pure
function of seed and step, so a resumed run sees the same batches), a progress bar, checkpoints,
and a NaN guard that stops at the first bad step with the last good checkpoint on disk. The loop
itself (:func:`run_chunks`, driving a :class:`ChunkProgram`) is shared with the Pólya–Gamma
natural-gradient path (:mod:`gpzoo.inference.pg_natgrad`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from collections.abc import Callable
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

from gpzoo.inference.checkpoint import load_checkpoint, save_checkpoint
from gpzoo.inference.inducing import InducingVariables, initialise_inducing
from gpzoo.inference.inducing import Kuu
from gpzoo.inference.linalg import cholesky_with_jitter
from gpzoo.inference.svgp import INDUCING_SITE, KERNEL_SITE, SVGP
from gpzoo.models.errors import InvalidArgumentError, ShapeError, TrainingError, as_float_array
from gpzoo.models.zoo import ModelSpec

__all__ = ["ChunkProgram", "ElboEstimate", "FitResult", "Prediction", "build_family", "evaluate_elbo", "fit", "predict", "run_chunks"]

#: "svgp-logistic-pg" fits a plain SVGP by Pólya–Gamma natural gradients (:mod:`gpzoo.inference.pg_natgrad`);
#: its model and guide are the SVGP's, so prediction and the ELBO use them unchanged.
_FAMILIES = {"svgp": SVGP, "svgp-logistic-pg": SVGP}


def register_family(name: str, builder) -> None:
    """Make ``ModelSpec(method=name)`` fit with ``builder(spec, inducing, num_latent)``.

    The family's ``model``/``guide`` take ``(X, y, num_data)`` for a minibatch of rows. A family
    whose ``needs_data_indices`` attribute is true (per-datum variational parameters, e.g. free
    Pólya–Gamma tilts) also gets ``data_indices`` ``[B]``, the rows' positions in the training
    set, in ``model``/``guide`` and, with ``num_data``, in ``expected_log_lik`` (from
    :func:`evaluate_elbo`, on the training data only).
    """
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
        """The model family (e.g. :class:`gpzoo.inference.svgp.SVGP`) holding model and guide."""
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
    (:func:`gpzoo.inference.pg_natgrad.fit_pg_natgrad`; ``optimizer``/``learning_rate`` then drive the
    hyperparameter steps). Both paths share one chunk runner (:func:`run_chunks`: progress,
    checkpoints, resume, NaN guard, Ctrl-C). OpenBLAS runs single-threaded during the fit: on a
    small shared machine its threads made the Cholesky gradient ~50x slower
    (``benchmarks/svgp_scaling.py``).
    """
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        if isinstance(spec, ModelSpec) and spec.method == "svgp-logistic-pg":
            from gpzoo.inference.pg_natgrad import fit_pg_natgrad  # noqa: PLC0415 - it imports this module

            return fit_pg_natgrad(spec, X, y, steps=steps, batch_size=batch_size, seed=seed, learning_rate=learning_rate,
                                  optimizer=optimizer, inducing=inducing, checkpoint_dir=checkpoint_dir,
                                  checkpoint_every=checkpoint_every, resume=resume, progress=progress,
                                  chunk_size=chunk_size)
        return _fit_svi(spec, X, y, steps=steps, batch_size=batch_size, seed=seed, learning_rate=learning_rate,
                        optimizer=optimizer, inducing=inducing, checkpoint_dir=checkpoint_dir,
                        checkpoint_every=checkpoint_every, resume=resume, progress=progress, chunk_size=chunk_size)


def _fit_svi(spec, X, y, *, steps, batch_size, seed, learning_rate, optimizer, inducing, checkpoint_dir,
             checkpoint_every, resume, progress, chunk_size) -> FitResult:
    """``fit`` for every NumPyro-SVI family: optax through ``SVI``, run by :func:`run_chunks`."""
    if not isinstance(spec, ModelSpec):
        raise InvalidArgumentError("spec", f"expected a ModelSpec (zoo.get(name, ...)), got {type(spec).__name__}")
    X, y = validate_data(spec, X, y)
    N = X.shape[0]
    B = check_run_arguments(N, steps, batch_size, checkpoint_dir, resume)

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
        state = jax.jit(lambda key, idx: svi.init(key, X_j[idx], y_j[idx], num_data=N, **_index_kwargs(family, idx)))(
            key_svi, init_idx)
    else:  # the autoguide records concrete prototype values at init: it must not run under jit
        state = svi.init(key_svi, X_j[init_idx], y_j[init_idx], num_data=N, **_index_kwargs(family, init_idx))
    family.check_analytic_kl()

    def update(state, batch_idx, data):
        X_all, y_all = data
        new_state, loss = svi.update(state, X_all[batch_idx], y_all[batch_idx], num_data=N, **_index_kwargs(family, batch_idx))
        return new_state, -loss

    get_params = jax.jit(svi.get_params)
    jitter_at = jax.jit(lambda params: _jitter_used(family, params))
    diagnostics = {"jitter": float(spec.jitter), "jitter_events": [], "dtype": str(np.dtype(_float_dtype())), "seconds": 0.0}

    def record_jitter(step, state):
        jitter = float(jitter_at(get_params(state)))
        if jitter > spec.jitter * 1.0001:
            diagnostics["jitter_events"].append({"step": step, "jitter": jitter})

    program = ChunkProgram(
        label=f"fit {spec.name}", objective="ELBO", update=update, step_inputs=batches, constants=(X_j, y_j),
        rate_at=lambda step: float(schedule(step)), params_of=get_params,
        config={"model": spec.name, "method": "svi", "num_data": N, "batch_size": B, "seed": seed},
        hint="Try a smaller learning_rate or larger jitter.", after_chunk=record_jitter,
    )
    t0 = time.perf_counter()
    state, elbo_hist, lr_hist = run_chunks(program, state, steps=steps, chunk_size=chunk_size, checkpoint_dir=checkpoint_dir,
                                           checkpoint_every=checkpoint_every, resume=resume, progress=progress,
                                           diagnostics=diagnostics)
    diagnostics["seconds"] = time.perf_counter() - t0
    diagnostics["steps"] = steps
    params = {k: np.asarray(v) for k, v in get_params(state).items()}
    return FitResult(
        spec=spec, inducing=inducing, num_latent=num_latent, params=params,
        elbo_history=np.asarray(elbo_hist), learning_rate_history=np.asarray(lr_hist),
        diagnostics=diagnostics, num_data=N, X_train=np.asarray(X), y_train=np.asarray(y),
        seed=seed, batch_size=B, _family=family,
    )


def _index_kwargs(family, batch_idx) -> dict:
    """``{"data_indices": batch_idx}`` for families that read training-set row indices, else ``{}``."""
    return {"data_indices": batch_idx} if getattr(family, "needs_data_indices", False) else {}


def check_run_arguments(num_data: int, steps, batch_size, checkpoint_dir, resume) -> int:
    """Eager checks of the arguments every fitting method shares; returns the batch size B."""
    if not isinstance(steps, (int, np.integer)) or steps < 0:
        raise InvalidArgumentError("steps", f"must be a non-negative integer, got {steps!r}")
    B = num_data if batch_size is None else batch_size
    if not isinstance(B, (int, np.integer)) or not 1 <= B <= num_data:
        raise InvalidArgumentError("batch_size", f"must be an integer in [1, {num_data}], got {batch_size!r}")
    if resume and checkpoint_dir is None:
        raise InvalidArgumentError("resume", "resume=True needs checkpoint_dir")
    return int(B)


# ----------------------------------------------------------------------------- the chunk runner
@dataclasses.dataclass
class ChunkProgram:
    """A fitting method as :func:`run_chunks` drives it.

    ``update(state, inputs, constants) -> (state, objective)`` is one step: ``inputs`` are that
    step's ``step_inputs(step)`` (a pytree of arrays, e.g. its minibatch indices), ``constants``
    the arrays every step reads (the data, precomputed features; passed to the compiled chunk as
    arguments rather than baked into it, and not checkpointed), and ``objective`` the value being
    maximised at the *incoming* state (ELBO, PG bound), so the objective of step t belongs to the
    parameters after t updates. ``rate_at(step)`` is what ``learning_rate_history``
    records; ``params_of(state)`` the constrained parameters a checkpoint stores; ``config`` names
    the run (``model``, ``method``, ``num_data``, ``batch_size``, ``seed``; the first four must
    match to resume). ``after_chunk(step, state)`` runs after every completed chunk (e.g. to
    record jitter increases in the diagnostics).
    """

    label: str
    objective: str
    update: Callable[[Any, Any, Any], tuple[Any, jax.Array]]
    step_inputs: Callable[[int], Any]
    rate_at: Callable[[int], float]
    params_of: Callable[[Any], dict]
    config: dict
    constants: Any = None
    hint: str = ""
    after_chunk: Callable[[int, Any], None] | None = None


#: ``config`` keys that must agree between a checkpoint and the run that resumes from it.
RESUME_KEYS = ("model", "method", "num_data", "batch_size")


def _finite(tree) -> jax.Array:
    """True when every floating leaf of ``tree`` is finite (a scalar bool)."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def run_chunks(program: ChunkProgram, state, *, steps: int, chunk_size: int, checkpoint_dir, checkpoint_every,
               resume: bool, progress: bool, diagnostics: dict):
    """Run ``program`` from ``state`` to ``steps`` steps; returns ``(state, objective history, rate history)``.

    Steps run in jit-compiled ``lax.scan`` chunks of one length (``chunk_size``; padded steps
    leave the state as is), cut at the checkpoint cadence so that a checkpoint is written every
    ``checkpoint_every`` steps (default: every 10 % of the run) and at the end. ``resume=True``
    continues from the checkpoint in ``checkpoint_dir`` (when there is one); since the step
    inputs and rates are pure functions of the step, the resumed run reproduces the
    uninterrupted one exactly.

    NaN guard: a non-finite objective or state stops the run with a ``TrainingError`` naming the
    first step whose incoming state is bad; the state one step earlier is replayed (with the same
    compiled chunk) and checkpointed as the last good one. A ``KeyboardInterrupt`` checkpoints the
    last completed chunk (when it is not on disk yet) and propagates; a Ctrl-C during a checkpoint
    write is held until the write is complete (:mod:`gpzoo.inference.checkpoint`).
    """
    checkpoint_every = checkpoint_every or max(1, steps // 10)
    if checkpoint_every < 1:
        raise InvalidArgumentError("checkpoint_every", f"must be a positive integer, got {checkpoint_every!r}")
    name = program.config.get("model")
    start, objective_hist, rate_hist = 0, [], []
    if resume and (Path(checkpoint_dir) / "config.json").exists():
        config, _, state, history = load_checkpoint(checkpoint_dir, state_template=state,
                                                     expect={k: program.config.get(k) for k in RESUME_KEYS})
        start = int(config["step"])
        objective_hist, rate_hist = list(history["elbo"]), list(history["learning_rate"])
        diagnostics["jitter_events"] = list(config.get("jitter_events", []))
    elif program.after_chunk is not None:
        program.after_chunk(start, state)

    def run_chunk(state, inputs, active, constants):  # inputs: [K, ...] per step, active [K]: padded steps are no-ops
        def body(state, step):
            step_inputs, on = step
            new_state, objective = program.update(state, step_inputs, constants)
            new_state = jax.tree_util.tree_map(lambda a, b: jnp.where(on, a, b), new_state, state)
            return new_state, (objective, _finite(new_state))

        return jax.lax.scan(body, state, (inputs, active))

    run_chunk = jax.jit(run_chunk)
    chunk = max(1, min(chunk_size, steps))  # one compiled scan length for the whole run

    def chunk_inputs(first: int, count: int):
        per_step = [program.step_inputs(s) for s in range(first, first + count)]
        per_step += [per_step[0]] * (chunk - count)
        return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *per_step), np.arange(chunk) < count, program.constants

    def checkpoint(step, state):
        save_checkpoint(
            checkpoint_dir, params=program.params_of(state), state=state,
            history={"elbo": np.asarray(objective_hist[:step]), "learning_rate": np.asarray(rate_hist[:step])},
            config={**program.config, "step": step, "jitter_events": diagnostics["jitter_events"]},
        )

    # (steps done, state after them), assigned in one statement so that an interrupt sees a consistent pair;
    # `previous` is the pair one chunk earlier (the NaN guard may need a state from before `committed`)
    committed, previous = (start, state), None
    saved_step = start if resume and start > 0 else None  # step of the checkpoint on disk from this run
    bar = tqdm(total=steps, initial=start, desc=program.label, disable=not progress, unit="step", leave=False)
    try:
        while committed[0] < steps:
            step, state = committed
            k = min(chunk, steps - step, checkpoint_every - step % checkpoint_every)
            new_state, (objective, finite) = run_chunk(state, *chunk_inputs(step, k))
            objective, finite = np.asarray(objective)[:k], np.asarray(finite)[:k]
            if not (np.all(np.isfinite(objective)) and np.all(finite)):
                # objective[j] is that of the state after step+j updates, finite[j] is about the one after step+j+1
                bad_objective = [step + int(j) for j in np.flatnonzero(~np.isfinite(objective))[:1]]
                bad_state = [step + int(j) + 1 for j in np.flatnonzero(~finite)[:1]]
                bad = min(bad_objective + bad_state)
                good = max(bad - 1, start)  # the last state whose objective and parameters are finite
                base_step, base_state = (step, state) if good >= step or previous is None else previous
                objective_hist = (objective_hist + objective.tolist())[:good]  # it held `step` entries
                rate_hist = (rate_hist + [program.rate_at(s) for s in range(step, step + k)])[:good]
                if good > base_step:
                    base_state = run_chunk(base_state, *chunk_inputs(base_step, good - base_step))[0]
                if checkpoint_dir is not None and good > start:
                    checkpoint(good, base_state)
                    saved_step = good
                what = (f"the {program.objective} became {objective[bad - step]}" if bad_objective and bad == bad_objective[0]
                        else "the parameters became non-finite")
                where = f"; last good checkpoint (step {good}) in {checkpoint_dir}" if saved_step == good else ""
                raise TrainingError(
                    f"{what} at step {bad} of {name!r}{where}. {program.hint}".rstrip(),
                    step=bad,
                    checkpoint=str(checkpoint_dir) if where else None,
                )
            objective_hist.extend(objective.tolist())
            rate_hist.extend(program.rate_at(s) for s in range(step, step + k))
            committed, previous = (step + k, new_state), committed
            if program.after_chunk is not None:
                program.after_chunk(step + k, new_state)
            if checkpoint_dir is not None and ((step + k) % checkpoint_every == 0 or step + k == steps):
                checkpoint(step + k, new_state)
                saved_step = step + k
            bar.update(k)
            bar.set_postfix({program.objective.split()[-1]: f"{objective_hist[-1]:.4g}"})
    except KeyboardInterrupt:
        if checkpoint_dir is not None and committed[0] > start and saved_step != committed[0]:
            checkpoint(*committed)
        raise
    finally:
        bar.close()
    return committed[1], objective_hist[: committed[0]], rate_hist[: committed[0]]


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
    """Full-data ELBO Σ_n E_q[log p(y_n|f_n)] − KL (van der Wilk et al. 2017, eq. 5) with its Monte Carlo SE.

    Defaults to the training data (per-datum variational parameters, such as free Pólya–Gamma
    tilts, are used there; on other data their family's default stands in). Terms that are analytic (Gaussian, Gauss–Hermite, the KL)
    contribute no Monte Carlo error; with none stochastic (no Monte Carlo likelihood, no sampled
    orbits, no sampled hyperparameters) a single draw is used and SE = 0.
    """
    training = (X is None and y is None) or (
        X is not None and y is not None and np.shape(X) == res.X_train.shape and np.shape(y) == res.y_train.shape
        and np.array_equal(X, res.X_train) and np.array_equal(y, res.y_train))
    X = res.X_train if X is None else X
    y = res.y_train if y is None else y
    X, y = validate_data(res.spec, X, y)
    family = res.family
    # per-datum parameters exist for training rows only; elsewhere such a family uses its default
    with_indices = training and getattr(family, "needs_data_indices", False)
    stochastic = family.stochastic_expectation or family.hyper_guide is not None
    S = num_samples if stochastic else 1
    if S < 1:
        raise InvalidArgumentError("num_samples", f"must be >= 1, got {num_samples}")
    keys = jax.random.split(jax.random.PRNGKey(seed), S)

    def ell_and_kl(params, Xc, yc, key, rows):
        with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=key):
            parts = family.parts()
            lik_key = key if parts.likelihood.stochastic_expectation else None
            index_kwargs = {"data_indices": rows, "num_data": res.num_data} if with_indices else {}
            ell = jnp.sum(family.expected_log_lik(parts, Xc, yc, lik_key, **index_kwargs))
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
            e, kl = ell_and_kl(params, jnp.asarray(X[sl]), jnp.asarray(y[sl], _float_dtype()), jax.random.fold_in(keys[s], i),
                               np.arange(sl.start, sl.stop))
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
