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
from gpzoo.inference.data import BatchSchedule, num_latent_functions, validate_data
from gpzoo.inference.inducing import inducing_for
from gpzoo.inference.linalg import float_dtype
from gpzoo.inference.results import FitResult
from gpzoo.inference.runner import ChunkProgram, FitSettings

__all__ = ["fit_svi"]


def index_kwargs(family, batch_idx) -> dict:
    """``{"data_indices": batch_idx}`` for families that read training-set row indices, else ``{}``."""
    return {"data_indices": batch_idx} if getattr(family, "needs_data_indices", False) else {}


def fit_svi(spec, X, y, *, family_class, settings: FitSettings) -> FitResult:
    """Fit ``spec`` with the model and guide of ``family_class(spec, inducing, num_latent)`` by SVI."""
    X, y = validate_data(spec, X, y)
    N = X.shape[0]
    B = settings.batch_size_for(N)
    config = settings.resume_config(spec.name, "svi", X, y, B)
    seed, learning_rate, optimizer, inducing = settings.seed, settings.learning_rate, settings.optimizer, settings.inducing

    key = jax.random.PRNGKey(seed)
    key_inducing, key_svi = jax.random.split(key)
    inducing = inducing_for(spec, X, key_inducing, inducing)
    num_latent = num_latent_functions(spec)
    family = family_class(spec, inducing, num_latent)

    X_j, y_j = jnp.asarray(X), jnp.asarray(y, dtype=float_dtype())
    if optimizer is None:
        optimizer = optax.adam(learning_rate)
    schedule = learning_rate if callable(learning_rate) else (lambda step: learning_rate)
    svi = SVI(family.model, family.guide, optax_to_numpyro(optimizer), FastELBO())
    batches = BatchSchedule(N, B, seed)
    init_idx = batches(0)
    if family.hyper_guide is None:
        state = jax.jit(lambda key, idx: svi.init(key, X_j[idx], y_j[idx], num_data=N, **index_kwargs(family, idx)))(
            key_svi, init_idx)
    else:  # the autoguide records concrete prototype values at init: it must not run under jit
        state = svi.init(key_svi, X_j[init_idx], y_j[init_idx], num_data=N, **index_kwargs(family, init_idx))
    family.check_analytic_kl()

    def update(state, batch_idx, data):
        X_all, y_all = data
        new_state, loss = svi.update(state, X_all[batch_idx], y_all[batch_idx], num_data=N, **index_kwargs(family, batch_idx))
        return new_state, -loss

    get_params = jax.jit(svi.get_params)
    diagnostics = {"jitter": float(spec.jitter), "jitter_events": [], "dtype": str(np.dtype(float_dtype())), "seconds": 0.0}

    program = ChunkProgram(
        label=f"fit {spec.name}", objective="ELBO", update=update, step_inputs=batches, constants=(X_j, y_j),
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
        diagnostics=diagnostics, num_data=N, X_train=np.asarray(X), y_train=np.asarray(y),
        family=family, seed=seed, batch_size=B,
    )
