"""The SVI fitter: optax through NumPyro's ``SVI`` on a family's model and guide, with gpzoo's
:class:`~gpzoo.inference.elbo.FastELBO` (analytic KL, closed-form / quadrature expectations).

Used for every family whose parameters are all trained by gradient steps on the ELBO (the
method table in :mod:`gpzoo.inference.fit` says which). The loop is :func:`gpzoo.inference.runner.run_chunks`.
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import optax
from numpyro.infer import SVI
from numpyro.optim import optax_to_numpyro

from gpzoo.inference.elbo import FastELBO
from gpzoo.inference.data import (BatchSchedule, MemmapSource, initial_rows, num_latent_functions, validate_data,
                                  validate_source)
from gpzoo.inference.inducing import inducing_for
from gpzoo.inference.linalg import float_dtype
from gpzoo.inference.results import FitResult
from gpzoo.inference.runner import ChunkProgram, FitSettings
from gpzoo.inference.sharding import per_point_draws

__all__ = ["fit_svi"]


def index_kwargs(family, batch_idx) -> dict:
    """``{"data_indices": batch_idx}`` for families that read training-set row indices, else ``{}``."""
    return {"data_indices": batch_idx} if getattr(family, "needs_data_indices", False) else {}


def fit_svi(spec, X, y, *, family_class, settings: FitSettings) -> FitResult:
    """Fit ``spec`` with the model and guide of ``family_class(spec, inducing, num_latent)`` by SVI.

    ``X`` is an array ``[N, D]`` or a :class:`~gpzoo.inference.data.MemmapSource` (its minibatches
    are read from disk each step; the schedule, a pure function of (seed, step), is the same).
    With ``settings.devices`` every minibatch is split across the devices
    (:mod:`gpzoo.inference.sharding`): parameters replicated, each device's share of the rows
    differentiated by ``jax.shard_map`` and the gradients all-reduced once
    (:meth:`~gpzoo.inference.sharding.DataParallel.svi_update`); a family whose data term draws
    random numbers per data point (:func:`~gpzoo.inference.sharding.per_point_draws`) keeps the
    sharding-constraint step (:meth:`~gpzoo.inference.sharding.DataParallel.shard_rows`), whose
    draws are those of the single-device step.
    """
    source = X if isinstance(X, MemmapSource) else None
    if source is None:
        X, y = validate_data(spec, X, y)
        N = X.shape[0]
    else:
        y = validate_source(spec, source, y)
        N = len(source)
    B = settings.batch_size_for(N)
    parallel = settings.data_parallel()
    if parallel is not None:
        parallel.check_batch_size(B)
    config = settings.resume_config(spec.name, "svi", X, y, B)
    seed, learning_rate, optimizer, inducing = settings.seed, settings.learning_rate, settings.optimizer, settings.inducing

    key = jax.random.PRNGKey(seed)
    key_inducing, key_svi = jax.random.split(key)
    inducing = inducing_for(spec, X if source is None else initial_rows(source, seed), key_inducing, inducing)
    num_latent = num_latent_functions(spec)
    family = family_class(spec, inducing, num_latent)

    y_j = jnp.asarray(y, dtype=float_dtype())
    X_j = jnp.asarray(X) if source is None else None
    if optimizer is None:
        optimizer = optax.adam(learning_rate)
    schedule = learning_rate if callable(learning_rate) else (lambda step: learning_rate)
    svi = SVI(family.model, family.guide, optax_to_numpyro(optimizer), FastELBO())
    batches = BatchSchedule(N, B, seed)
    init_idx = batches(0)
    # the first batch is passed in, not closed over: a closed-over array would be compiled in as a constant
    X_init = X_j[init_idx] if source is None else jnp.asarray(source.rows(init_idx))
    y_init = y_j[init_idx]
    if family.hyper_guide is None:
        state = jax.jit(lambda key, idx, Xb, yb: svi.init(key, Xb, yb, num_data=N, **index_kwargs(family, idx)))(
            key_svi, init_idx, X_init, y_init)
    else:  # the autoguide records concrete prototype values at init: it must not run under jit
        state = svi.init(key_svi, X_init, y_init, num_data=N, **index_kwargs(family, init_idx))
    family.check_analytic_kl()
    split_loss = parallel is not None and not per_point_draws(family)  # else the sharding-constraint step
    if split_loss:
        parallel.check_no_mutable_state(state)

    def update(state, inputs, data):
        # in memory: the step's rows are gathered from the data on the device; from a source they come with the step
        (batch_idx, X_batch), y_all = (inputs, data[0]) if source is not None else ((inputs, data[0][inputs]), data[1])
        y_batch = y_all[batch_idx]
        if split_loss:
            new_state, loss = parallel.svi_update(svi, state, X_batch, y_batch, static_kwargs={"num_data": N},
                                                  **index_kwargs(family, batch_idx))
            return new_state, -loss
        if parallel is not None:
            X_batch, y_batch, batch_idx = parallel.shard_rows(X_batch, y_batch, batch_idx)
        new_state, loss = svi.update(state, X_batch, y_batch, num_data=N, **index_kwargs(family, batch_idx))
        return new_state, -loss

    step_inputs = batches if source is None else (lambda step: (batches(step), source.rows(batches(step))))
    constants = (X_j, y_j) if source is None else (y_j,)
    if parallel is not None:
        state, constants = parallel.replicate(state), parallel.replicate(constants)
    get_params = jax.jit(svi.get_params)
    diagnostics = {"jitter": float(spec.jitter), "jitter_events": [], "dtype": str(np.dtype(float_dtype())), "seconds": 0.0}
    if parallel is not None:
        diagnostics["devices"] = [str(d) for d in parallel.devices]
        diagnostics["data_parallel_step"] = "shard_map" if split_loss else "sharding constraint"

    program = ChunkProgram(
        label=f"fit {spec.name}", objective="ELBO", update=update, step_inputs=step_inputs, constants=constants,
        rate_at=lambda step: float(schedule(step)), params_of=get_params,
        config=config,
        hint="Try a smaller learning_rate or larger jitter.",
        jitter_of=lambda state: family.jitter_used(svi.get_params(state)), jitter=float(spec.jitter),
    )
    state, objective_hist, rate_hist = settings.run(program, state, diagnostics)
    params = {k: np.asarray(v) for k, v in get_params(state).items()}
    return FitResult(
        spec=spec, inducing=inducing, num_latent=num_latent, params=params,
        objective_history=np.asarray(objective_hist), step_size_history=np.asarray(rate_hist),
        diagnostics=diagnostics, num_data=N, X_train=np.asarray(X if source is None else source.X),
        y_train=np.asarray(y), family=family, seed=seed, batch_size=B,
    )
