"""The SVI fitter: optax through NumPyro's ``SVI`` on a family's model and guide, with gpzoo's
:class:`~gpzoo.inference.elbo.FastELBO` (analytic KL, closed-form / quadrature expectations).

Used for every family whose parameters are all trained by gradient steps on the ELBO (the
method table in :mod:`gpzoo.inference.fit` says which). The loop is :func:`gpzoo.inference.runner.run_chunks`.

Its programs — the initial state, the chunk of steps, the parameter read-out — are module-level
jitted functions whose static argument is an :class:`SviStep`: the model family's structure
(:class:`~gpzoo.inference.programs.FamilyDefinition`) and the optimiser's. The data, the number
of data points, the family's initial values, the PRNG key and the learning rate are array
arguments (the default Adam reads its learning rate from its state,
``optax.inject_hyperparams``), so every fit of one structure runs the programs the first
compiled.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

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
from gpzoo.inference.natgrad import NATGRAD, default_natgrad_step, natgrad_update
from gpzoo.inference.programs import ByIdentity, FamilyDefinition, definition_of
from gpzoo.inference.results import FitResult
from gpzoo.inference.runner import ChunkProgram, FitSettings
from gpzoo.inference.sharding import per_point_draws

__all__ = ["SviStep", "fit_svi"]


def index_kwargs(family, batch_idx) -> dict:
    """``{"data_indices": batch_idx}`` for families that read training-set row indices, else ``{}``."""
    return {"data_indices": batch_idx} if family.needs_data_indices else {}


#: Constrain functions (unconstrained -> constrained parameters) of each step structure, recorded
#: when its initial state is traced; they hold only the sites' constraint transforms.
_CONSTRAIN: dict = {}


@dataclasses.dataclass(frozen=True)
class SviStep:
    """The static definition of an SVI fit's programs (hashable, compared by value).

    ``optimizer``: None for the default Adam (learning rate from its state), else the user's
    optax transformation (by identity); ``schedule``: a learning-rate schedule of the default Adam
    (by identity), None for a constant rate. ``num_data`` is static only where it shapes the
    program (per-datum parameters, data-parallel steps); else it is the constants' second entry.
    ``natgrad``: None for plain optimiser steps; else q(u) takes natural-gradient steps
    (:mod:`gpzoo.inference.natgrad`) with step size ``"constant"`` (the constants' last entry) or a
    schedule of the step count (by identity).
    """

    definition: FamilyDefinition
    optimizer: Any = None
    schedule: Any = None
    from_source: bool = False
    split_loss: bool = False
    parallel: Any = None
    num_data: int | None = None
    natgrad: Any = None

    def make_optimizer(self, learning_rate=0.0):
        if self.optimizer is not None:
            return self.optimizer.value
        rate = self.schedule.value if self.schedule is not None else learning_rate
        return optax.inject_hyperparams(optax.adam)(learning_rate=rate)

    def svi(self, family, learning_rate=0.0) -> SVI:
        svi = SVI(family.model, family.guide, optax_to_numpyro(self.make_optimizer(learning_rate)), FastELBO())
        if self in _CONSTRAIN:
            svi.constrain_fn = _CONSTRAIN[self]
        return svi

    def realise(self, constants):
        """(family, SVI, N) from the constants ``(leaves, N, ...)`` inside a program."""
        family = self.definition.build(constants[0])
        svi = self.svi(family)
        if svi.constrain_fn is None:  # pragma: no cover - the initial state is always traced first
            raise RuntimeError("the SVI step was traced before its initial state")
        return family, svi, (self.num_data if self.num_data is not None else constants[1])

    def update(self, state, inputs, constants):
        family, svi, N = self.realise(constants)
        data = constants[2:]
        # in memory: the step's rows are gathered from the data on the device; from a source they come with the step
        (batch_idx, X_batch), y_all = (inputs, data[0]) if self.from_source else ((inputs, data[0][inputs]), data[1])
        y_batch = y_all[batch_idx]
        parallel = None if self.parallel is None else self.parallel.value
        if self.split_loss:
            new_state, loss = parallel.svi_update(svi, state, X_batch, y_batch, static_kwargs={"num_data": N},
                                                  **index_kwargs(family, batch_idx))
            return new_state, -loss
        if parallel is not None:
            X_batch, y_batch, batch_idx = parallel.shard_rows(X_batch, y_batch, batch_idx)
        if self.natgrad is not None:
            gamma = constants[-1] if self.natgrad == "constant" else self.natgrad.value(state.optim_state[0])
            new_state, loss = natgrad_update(svi, state, gamma, (X_batch, y_batch),
                                             {"num_data": N, **index_kwargs(family, batch_idx)})
            return new_state, -loss
        new_state, loss = svi.update(state, X_batch, y_batch, num_data=N, **index_kwargs(family, batch_idx))
        return new_state, -loss

    def jitter_of(self, state, constants):
        family, svi, _ = self.realise(constants)
        return family.jitter_used(svi.get_params(state))

    def params_of(self, state, constants):
        return self.realise(constants)[1].get_params(state)


@functools.partial(jax.jit, static_argnums=0)
def _initial_state(step: SviStep, leaves, key, idx, X_batch, y_batch, num_data, learning_rate):
    family = step.definition.build(leaves)
    svi = step.svi(family, learning_rate)
    N = step.num_data if step.num_data is not None else num_data
    state = svi.init(key, X_batch, y_batch, num_data=N, **index_kwargs(family, idx))
    _CONSTRAIN.setdefault(step, svi.constrain_fn)
    return state, family.jitter_used(svi.get_params(state))  # the runner's check before the first step, in the same program


@functools.partial(jax.jit, static_argnums=0)
def _params(step: SviStep, state, constants):
    return step.params_of(state, constants)


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
    definition, leaves = definition_of(family)

    dtype = float_dtype()
    y_j = jnp.asarray(y, dtype=dtype)
    X_j = jnp.asarray(X) if source is None else None
    schedule = learning_rate if callable(learning_rate) else (lambda step: learning_rate)
    natgrad = optimizer == NATGRAD
    gamma = default_natgrad_step(spec, settings.natgrad_step) if natgrad else None
    if natgrad:
        optimizer = None  # Adam with learning_rate on everything but q(u)
    # natural gradients take the sharding-constraint step (gradients of the whole batch's ELBO)
    split_loss = parallel is not None and not per_point_draws(family) and not natgrad
    step = SviStep(
        definition,
        optimizer=None if optimizer is None else ByIdentity(optimizer),
        schedule=ByIdentity(learning_rate) if optimizer is None and callable(learning_rate) else None,
        from_source=source is not None, split_loss=split_loss,
        parallel=None if parallel is None else ByIdentity(parallel),
        num_data=N if (parallel is not None or family.needs_data_indices) else None,
        natgrad=None if not natgrad else (ByIdentity(gamma) if callable(gamma) else "constant"),
    )
    batches = BatchSchedule(N, B, seed)
    init_idx = batches(0)
    X_init = X_j[init_idx] if source is None else jnp.asarray(source.rows(init_idx))
    y_init = y_j[init_idx]
    num_data = np.asarray(N, dtype)
    rate0 = np.asarray(0.0 if callable(learning_rate) else learning_rate, dtype)
    initial_jitter = None
    if family.hyper_guide is None:
        state, initial_jitter = _initial_state(step, leaves, key_svi, init_idx, X_init, y_init, num_data, rate0)
    else:  # the autoguide records concrete prototype values at init: it must not run under jit
        svi = step.svi(family, rate0)
        state = svi.init(key_svi, X_init, y_init, num_data=step.num_data or N, **index_kwargs(family, init_idx))
        _CONSTRAIN.setdefault(step, svi.constrain_fn)
    family.check_analytic_kl()
    if split_loss:
        parallel.check_no_mutable_state(state)

    step_inputs = batches if source is None else (lambda s: (batches(s), source.rows(batches(s))))
    constants = (leaves, num_data, X_j, y_j) if source is None else (leaves, num_data, y_j)
    if step.natgrad == "constant":
        constants = constants + (np.asarray(gamma, dtype),)
    if parallel is not None:
        state, constants = parallel.replicate(state), parallel.replicate(constants)
    diagnostics = {"jitter": float(spec.jitter), "jitter_events": [], "dtype": str(np.dtype(dtype)), "seconds": 0.0}
    if parallel is not None:
        diagnostics["devices"] = [str(d) for d in parallel.devices]
        diagnostics["data_parallel_step"] = "shard_map" if split_loss else "sharding constraint"

    program = ChunkProgram(
        label=f"fit {spec.name}", objective="ELBO", step=step, step_inputs=step_inputs, constants=constants,
        rate_at=lambda s: float(schedule(s)), params_of=lambda state: _params(step, state, constants),
        config=config, hint="Try a smaller learning_rate or larger jitter.", jitter=float(spec.jitter),
        initial_jitter=initial_jitter,
    )
    state, objective_hist, rate_hist = settings.run(program, state, diagnostics)
    params = {k: np.asarray(v) for k, v in _params(step, state, constants).items()}
    return FitResult(
        spec=spec, inducing=inducing, num_latent=num_latent, params=params,
        objective_history=np.asarray(objective_hist), step_size_history=np.asarray(rate_hist),
        diagnostics=diagnostics, num_data=N, X_train=np.asarray(X if source is None else source.X),
        y_train=np.asarray(y), family=family, seed=seed, batch_size=B,
    )

