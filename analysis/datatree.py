"""A fitted model as an ArviZ 1.x ``xarray.DataTree`` (built with ``arviz_base.from_dict``).

Groups (one chain of ``num_draws`` draws from the approximate posterior, see
:mod:`gpzoo.inference.posterior`):

================== ==========================================================================
posterior          ``u`` (chain, draw, latent, inducing): unwhitened inducing outputs u ~ q(u);
                   plus every sampled hyperparameter (site name) when the model has priors
posterior_predictive ``y`` (…, obs_test) and ``y_train`` (…, obs_train): y_n ~ p(y_n | u_s)
log_likelihood     ``y`` / ``y_train``: log p(y_n | u_s) = ∫ p(y_n | f) p(f | u_s) df
observed_data      ``y`` (obs_test), ``y_train`` (obs_train)
sample_stats       ``log_p`` = log p(u_s) + Σ_n log p(y_n | u_s) over the training data (the
                   unnormalised log posterior, also as ArviZ's ``lp``) and ``log_q`` = log q(u_s),
                   both in u-space (+ hyperparameter terms): the inputs of
                   ``az.loo_approximate_posterior``
constant_data      ``X`` (obs_test, feature) and ``X_train`` (obs_train, feature) only when there
                   are at most ``MAX_STORED_FEATURES`` input columns (tables); images are not
                   copied, their shapes are in the group's attrs (``X_shape``, ``X_train_shape``,
                   ``image_shape``) — a report stays small and the data live in the dataset
predictive_moments ``f_mean``/``f_var``/``y_mean``/``y_var`` (obs_test, latent) and, for
                   classification, ``probs`` (obs_test, class): the analytic q(f*) predictive of
                   :func:`gpzoo.inference.predict` used for calibration metrics
optimization       ``elbo`` and ``learning_rate`` (step), the final type-II point estimates
                   (``kernel.*``, ``likelihood.*``, ``inducing.*``) and the fit's diagnostics
================== ==========================================================================

Leave-one-out is about the training data, so pass ``var_name="y_train"`` (also stored in the
root attribute ``loo_var_name``)::

    az.loo(dt, var_name="y_train")
    az.loo_approximate_posterior(dt, dt.sample_stats.log_p, dt.sample_stats.log_q, var_name="y_train")
"""

from __future__ import annotations

import json

import jax
import numpy as np
import xarray as xr
from arviz_base import from_dict

from gpzoo.inference.fit import predict
from gpzoo.inference.results import FitResult
from gpzoo.inference.posterior import pointwise_given_u, sample_inducing
from gpzoo.models.errors import InvalidArgumentError, ShapeError

__all__ = ["LOO_VAR_NAME", "MAX_STORED_FEATURES", "MIN_DRAWS", "to_datatree"]

#: Inputs with at most this many columns are stored in ``constant_data``; wider ones (images) are not.
MAX_STORED_FEATURES = 64
#: The log-likelihood variable PSIS-LOO is computed on (the data the posterior is conditioned on).
LOO_VAR_NAME = "y_train"
#: Fewest draws accepted: PSIS fits a Pareto tail to min(S/5, 3√S) draws and needs at least 5.
MIN_DRAWS = 25


def to_datatree(res: FitResult, X_test, y_test, *, num_draws: int = 200, seed: int = 0,
                include_train: bool = True) -> xr.DataTree:
    """Draw ``num_draws`` samples of u ~ q(u) and return the fit as an ArviZ DataTree (see module doc).

    ``include_train=False`` leaves out the training points (and with them ``log_p``, which sums
    over them) for large training sets; held-out points are always included.
    """
    if not isinstance(res, FitResult):
        raise InvalidArgumentError("res", f"expected a FitResult from gpzoo.inference.fit, got {type(res).__name__}")
    if not isinstance(num_draws, (int, np.integer)) or num_draws < MIN_DRAWS:
        raise InvalidArgumentError(
            "num_draws", f"must be an integer >= {MIN_DRAWS} (PSIS-LOO fits a Pareto tail to the largest draws), got {num_draws!r}"
        )
    X_test = np.asarray(X_test)
    y_test = res.spec.likelihood.validate_targets(y_test)
    if X_test.ndim != 2 or X_test.shape[0] != y_test.shape[0]:
        raise ShapeError("X_test", f"expected [{y_test.shape[0]}, D] to match y_test, got shape {X_test.shape}")
    key_u, key_test, key_train = jax.random.split(jax.random.PRNGKey(seed), 3)

    draws = sample_inducing(res, int(num_draws), key_u)
    test = pointwise_given_u(res, X_test, y_test, draws, key_test)
    train = pointwise_given_u(res, res.X_train, res.y_train, draws, key_train) if include_train else None
    pred = predict(res, X_test, seed=seed)

    S = draws.num_draws
    L, GM = draws.u.shape[1:]
    task = res.spec.likelihood.task
    label_dtype = np.int64 if task in ("binary", "multiclass", "count") else None

    def targets(y):
        return y.astype(label_dtype) if label_dtype is not None else np.asarray(y)

    coords = {"obs_test": np.arange(len(y_test)), "latent": np.arange(L), "inducing": np.arange(GM)}
    dims = {"u": ["latent", "inducing"], "y": ["obs_test"]}
    posterior = {"u": draws.u[None]}  # [1, S, L, GM]
    for name, value in draws.hyper.items():
        posterior[name] = value[None]  # [1, S, ...]
        dims[name] = [f"{name}_dim_{i}" for i in range(value.ndim - 1)]
    data = {
        "posterior": posterior,
        "posterior_predictive": {"y": targets(test.y_rep)[None]},
        "log_likelihood": {"y": test.log_lik[None]},
        "observed_data": {"y": targets(y_test)},
        "sample_stats": {"log_q": draws.log_q[None]},
    }
    if train is not None:
        coords["obs_train"] = np.arange(len(res.y_train))
        dims["y_train"] = ["obs_train"]
        data["posterior_predictive"]["y_train"] = targets(train.y_rep)[None]
        data["log_likelihood"]["y_train"] = train.log_lik[None]
        data["observed_data"]["y_train"] = targets(res.y_train)
        log_p = draws.log_prior + train.log_lik.sum(axis=1)  # [S]
        data["sample_stats"].update(log_p=log_p[None], lp=log_p[None])

    constant, constant_attrs = _constant_data(res, X_test, include_train)
    if constant:
        data["constant_data"] = constant
        dims.update({"X": ["obs_test", "feature"], "X_train": ["obs_train", "feature"]})
        coords["feature"] = np.arange(X_test.shape[1])
    else:
        data["constant_data"] = {}

    attrs = {
        "/": _netcdf_attrs({
            "model": res.spec.name,
            "description": res.spec.description,
            "task": task,
            "likelihood": type(res.spec.likelihood).__name__,
            "num_inducing": res.spec.num_inducing,
            "num_latent": L,
            "num_train": res.num_data,
            "num_test": len(y_test),
            "num_draws": S,
            "seed": seed,
            "loo_var_name": LOO_VAR_NAME if train is not None else "",
            "inference_library": "gpzoo (numpyro SVI)",
        }),
        "constant_data": _netcdf_attrs(constant_attrs),
        "sample_stats": {"log_p": "log p(u) [+ log p(theta)] + sum_n log p(y_train_n | u)", "log_q": "log q(u) [+ log q(theta)]"},
    }
    dt = from_dict(data, dims=dims, coords=coords, attrs=attrs)
    dt["predictive_moments"] = xr.DataTree(_predictive_moments(pred, len(y_test), L))
    dt["optimization"] = xr.DataTree(_optimization(res))
    return dt


# ----------------------------------------------------------------------------- groups
def _constant_data(res: FitResult, X_test, include_train: bool):
    attrs = {"X_shape": list(X_test.shape), "X_train_shape": list(res.X_train.shape),
             "image_shape": list(res.spec.image_shape or ()),
             "stored_inputs": int(X_test.shape[1] <= MAX_STORED_FEATURES)}
    if X_test.shape[1] > MAX_STORED_FEATURES:
        return {}, attrs
    data = {"X": np.asarray(X_test)}
    if include_train:
        data["X_train"] = np.asarray(res.X_train)
    return data, attrs


def _predictive_moments(pred, num_test: int, num_latent: int) -> xr.Dataset:
    obs, latent = np.arange(num_test), np.arange(num_latent)
    ds = xr.Dataset(
        {name: (("obs_test", "latent"), np.asarray(getattr(pred, name))) for name in ("f_mean", "f_var", "y_mean", "y_var")
         if np.asarray(getattr(pred, name)).shape == (num_test, num_latent)},
        coords={"obs_test": obs, "latent": latent},
    )
    if pred.probs is not None:
        probs = np.asarray(pred.probs)  # [T, C]
        ds["probs"] = xr.DataArray(probs, dims=("obs_test", "class"), coords={"class": np.arange(probs.shape[1])})
    ds.attrs["source"] = "gpzoo.inference.predict: analytic q(f*) marginals"
    return ds


def _optimization(res: FitResult) -> xr.Dataset:
    steps = np.arange(len(res.objective_history))
    ds = xr.Dataset(
        {"elbo": ("step", np.asarray(res.objective_history, np.float64)),
         "learning_rate": ("step", np.asarray(res.step_size_history, np.float64))},
        coords={"step": steps},
    )
    for name, value in res.params.items():
        if name.startswith(("kernel.", "likelihood.", "inducing.")):
            value = np.asarray(value)
            ds[name] = xr.DataArray(value, dims=[f"{name}_dim_{i}" for i in range(value.ndim)])
    diag = res.diagnostics
    ds.attrs = _netcdf_attrs({
        "final_elbo": res.final_objective,
        "steps": len(res.objective_history),
        "batch_size": res.batch_size,
        "seed": res.seed,
        "seconds": diag.get("seconds", float("nan")),
        "jitter": diag.get("jitter", res.spec.jitter),
        "jitter_events": json.dumps(diag.get("jitter_events", [])),
        "dtype": diag.get("dtype", ""),
        "whiten": res.spec.whiten,
        "q_structure": res.spec.q_structure,
    })
    return ds


def _netcdf_attrs(attrs: dict) -> dict:
    """Attributes netCDF can store: None -> "", bool -> int, containers -> JSON text."""
    out = {}
    for key, value in attrs.items():
        if value is None:
            value = ""
        elif isinstance(value, (bool, np.bool_)):
            value = int(value)
        elif isinstance(value, dict):
            value = json.dumps(value)
        elif isinstance(value, (list, tuple)) and not value:
            value = ""
        elif isinstance(value, (list, tuple)) and not all(isinstance(v, (int, float, np.number)) for v in value):
            value = json.dumps(list(value))
        out[key] = value
    return out
