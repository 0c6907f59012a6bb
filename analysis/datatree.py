"""A fitted model as an ArviZ 1.x ``xarray.DataTree`` (built with ``arviz_base.from_dict``).

The training data are the data the approximate posterior is conditioned on, so they are ``y``
(ArviZ's convention); the held-out data are out-of-sample predictions. One chain of ``num_draws``
draws (θ_s, u_s) from the approximate posterior (see :mod:`gpzoo.inference.posterior`):

=========================== ===============================================================================
posterior                   ``u`` (chain, draw, latent, inducing): unwhitened inducing outputs u_s ~ q(u);
                            every hyperparameter, dots replaced by ``_`` (``kernel_lengthscale``): draws
                            θ_s ~ q(θ) for those with a prior, and θ* repeated over every draw for
                            type-II point estimates (see "Point estimates" below)
posterior_predictive        ``y`` (chain, draw, obs_id): training replicates y_n ~ p(y_n | u_s)
log_likelihood              ``y`` (chain, draw, obs_id): log p(y_n | u_s) = ∫ p(y_n | f) p(f | u_s) df of the
                            training points — the only variable, so ``az.loo(dt)`` / ``az.compare`` need no
                            ``var_name``
observed_data               ``y`` (obs_id): training targets
constant_data               ``X`` (obs_id, feature): training inputs, only when there are at most
                            ``MAX_STORED_FEATURES`` columns (tables); images are not copied, the shapes
                            are in the group's attrs (``X_shape``, ``image_shape``)
sample_stats                ``log_p`` = log p(u_s) [+ log p(θ_s)] + Σ_n log p(y_n | u_s) over the training
                            data (also as ArviZ's ``lp``) and ``log_q`` = log q(u_s) [+ log q(θ_s)], both in
                            u-space: the inputs of ``az.loo_approximate_posterior``
predictions                 ``y`` (chain, draw, obs_id): test-set replicates y*_n ~ p(y*_n | u_s)
predictions_constant_data   ``X`` (obs_id, feature): test inputs (same rule as ``constant_data``)
predictions_observed_data   ``y`` (obs_id): test targets
predictions_log_likelihood  ``y`` (chain, draw, obs_id): log p(y*_n | u_s) of the test points
predictions_moments         ``f_mean``/``f_var``/``y_mean``/``y_var`` (obs_id, latent) and, for
                            classification, ``probs`` (obs_id, class): the analytic q(f*) predictive of
                            :func:`gpzoo.inference.predict` on the test set (calibration metrics)
optimization                ``objective`` and ``step_size`` (step): the fit's trace (attrs ``objective`` /
                            ``step_size`` name them: e.g. ELBO and learning rate); the final variational
                            parameters (``q_mu``, ``q_sqrt``, ``inducing_Z``, q(θ)'s ``*_auto_loc`` ...);
                            the fit's diagnostics as attrs
=========================== ===============================================================================

Decisions:

* **Point estimates in ``posterior``.** With type-II hyperparameters the approximate posterior is
  q(u)·δ(θ − θ*), so θ* repeated over every draw is an exact sample of it; ``az.summary(dt)``,
  ``az.plot_forest`` and ``az.plot_dist`` then show the hyperparameters with no arguments (sd 0;
  r_hat and mcse are NaN for a constant). Each such variable's attrs say
  ``estimate = "type-II point estimate"``; the group's attrs list them (``type_II_point_estimates``)
  and the sampled ones (``sampled_hyperparameters``). A separate group would keep them out of
  ``az.summary(dt)``. Fixed hyperparameters are not inferred: they are listed in the group's attrs
  (``fixed_hyperparameters``) and in :meth:`FitResult.summary`. Inducing inputs Z are variational
  parameters of q(u) (Titsias 2009), not model hyperparameters: they live in ``optimization``.
* **Test data under the ``predictions_`` prefix.** ``predictions`` / ``predictions_constant_data``
  are ArviZ's groups for out-of-sample draws; the test targets and the test log-likelihood follow
  the same prefix (``predictions_observed_data``, ``predictions_log_likelihood``). A second
  variable in ``log_likelihood`` would make ``az.loo(dt)`` ask for ``var_name``.
  :func:`heldout_view` regroups them as a DataTree that ArviZ reads like any other
  (``az.plot_ppc_pit(heldout_view(dt))`` checks calibration on the test set).
* **Names.** Variables never contain dots (``kernel.base_kernel.lengthscale`` →
  ``kernel_base_kernel_lengthscale``); each variable's ``site`` attr and the root's ``site_names``
  (JSON ``{variable: NumPyro site}``) keep the mapping.
* **Coordinates.** ``obs_id`` holds the original row indices (``train_index`` / ``test_index``,
  default ``arange``; the training ones in the training groups, the test ones in the
  ``predictions_*`` groups); ``latent`` and ``inducing`` index q(u)'s outputs. Parameter axes are
  named after what they index where the size says so: ``feature`` (input column), ``patch_feature``
  (entry of a patch), ``patch``, ``channel``, ``latent``, ``inducing`` (``inducing_part_k`` for the
  k-th set of separate inducing variables), ``inducing_col`` (q_sqrt's columns); any other axis is
  ``<variable>_dim_<i>``.

Leave-one-out is about the training data; plain ``az.loo(dt)`` treats the draws of q as if they
were posterior draws, ``az.loo_approximate_posterior`` corrects for q (Magnusson et al. 2019)::

    az.loo(dt)
    az.loo_approximate_posterior(dt, dt.sample_stats.log_p, dt.sample_stats.log_q)
"""

from __future__ import annotations

import dataclasses
import json
import re

import jax
import numpy as np
import numpyro  # noqa: F401 - loaded before arviz_base (see gpzoo.analysis)
import xarray as xr
from arviz_base import from_dict

from gpzoo.inference.fit import predict
from gpzoo.inference.posterior import (
    PointwiseDraws,
    draws_and_summaries,
    pointwise_given_u,
    sample_inducing,
    summaries_supported,
)
from gpzoo.inference.results import FIXED, SAMPLED, TYPE_II, ElboEstimate, FitResult, Prediction
from gpzoo.models.errors import GPZooError, InvalidArgumentError, ShapeError, as_float_array
from gpzoo.models.parameters import Parameterised

__all__ = ["LOO_VAR_NAME", "MAX_STORED_FEATURES", "MIN_DRAWS", "datatree_and_elbo", "heldout_view", "to_datatree",
           "variable_name"]

#: Inputs with at most this many columns are stored in ``constant_data``; wider ones (images) are not.
MAX_STORED_FEATURES = 64
#: The log-likelihood variable PSIS-LOO is computed on (the training data, the only one in ``log_likelihood``).
LOO_VAR_NAME = "y"
#: Fewest draws accepted: PSIS fits a generalised Pareto tail to floor(S/5) of S draws (3√(S/r_eff) for large
#: S) and needs at least 5, and with exactly 5 tail draws ArviZ's fit returns k = NaN at every point (measured:
#: S = 25-29 gave NaN Pareto k everywhere, S = 30 finite k), so a report stores at least 30.
MIN_DRAWS = 30
OBS_DIM = "obs_id"
#: Test-set groups and the ArviZ group each plays the role of in :func:`heldout_view`.
#: Variational parameters with one entry per training point (the free Pólya–Gamma tilts c_n of
#: :mod:`gpzoo.inference.invariant`): their axis is ``obs_id``.
PER_DATUM_SITES = ("pg_free_c",)
HELDOUT_GROUPS = {"predictions": "posterior_predictive", "predictions_observed_data": "observed_data",
                  "predictions_log_likelihood": "log_likelihood", "predictions_constant_data": "constant_data"}


def variable_name(site: str) -> str:
    """The DataTree variable of a NumPyro site: dots become underscores (``kernel.lengthscale`` → ``kernel_lengthscale``)."""
    return site.replace(".", "_")


def to_datatree(res: FitResult, X_test, y_test, *, num_draws: int = 200, seed: int = 0, include_train: bool = True,
                train_index=None, test_index=None) -> xr.DataTree:
    """Draw ``num_draws`` samples of (θ, u) from the approximate posterior and return the fit as an
    ArviZ DataTree (layout and decisions in the module docstring).

    ``train_index`` / ``test_index`` (default ``arange``) are the original row labels of the
    training and test points, stored as the ``obs_id`` coordinate. ``include_train=False`` leaves
    out the training groups (and ``log_p``, which sums over them) for large training sets; then
    ``az.loo`` has nothing to work on, the test-set groups are always there.
    """
    return datatree_and_elbo(res, X_test, y_test, num_draws=num_draws, seed=seed, include_train=include_train,
                             train_index=train_index, test_index=test_index)[0]


def datatree_and_elbo(res: FitResult, X_test, y_test, *, num_draws: int = 200, seed: int = 0, include_train: bool = True,
                      train_index=None, test_index=None) -> tuple[xr.DataTree, ElboEstimate | None]:
    """:func:`to_datatree` and, where it comes from the same pass over the data, the full-data ELBO.

    For a model with fixed or point-estimated hyperparameters and an analytic data term
    (:func:`gpzoo.inference.posterior.summaries_supported`) one program per chunk of rows gives the
    pointwise log-likelihoods, the test-set predictive moments and the ELBO's data term and KL
    (the kernel matrices of a chunk are computed once for all three); the ELBO is then exact
    (one draw, standard error 0) and returned with the tree. Otherwise (or without the training
    points) the pieces come from ``pointwise_given_u``, ``predict`` and no ELBO (None).
    """
    if not isinstance(res, FitResult):
        raise InvalidArgumentError("res", f"expected a FitResult from gpzoo.inference.fit, got {type(res).__name__}")
    if isinstance(num_draws, bool) or not isinstance(num_draws, (int, np.integer)) or num_draws < MIN_DRAWS:
        raise InvalidArgumentError(
            "num_draws", f"must be an integer >= {MIN_DRAWS} (PSIS-LOO fits a Pareto tail to the largest draws), got {num_draws!r}"
        )
    X_test = np.asarray(X_test)
    y_test = res.spec.likelihood.validate_targets(y_test)
    if X_test.ndim != 2 or X_test.shape[0] != y_test.shape[0]:
        raise ShapeError("X_test", f"expected [{y_test.shape[0]}, D] to match y_test, got shape {X_test.shape}")
    train_index = _row_index(train_index, len(res.y_train), "train_index")
    test_index = _row_index(test_index, len(y_test), "test_index")
    standardisation = res.standardisation
    X_given, y_given = X_test, y_test  # in the units of the data passed to fit
    if standardisation is not None:  # computed in the model's units, reported in the original ones
        X_test = standardisation.inputs(as_float_array(X_test, "X_test", ndim=2))
        y_test = standardisation.targets(y_test)
    key_u, key_test, key_train = jax.random.split(jax.random.PRNGKey(seed), 3)

    elbo = None
    if summaries_supported(res):
        key_moments = jax.random.split(jax.random.PRNGKey(seed), 3)[2]  # predict(res, X_test, seed=seed)'s key
        inputs = [(X_test, y_test, key_test)] + ([(res.X_train, res.y_train, key_train)] if include_train else [])
        draws, found = draws_and_summaries(res, int(num_draws), key_u, inputs, key_moments)
        test = found[0].pointwise
        pred = Prediction(found[0].f_mean, found[0].f_var, found[0].y_mean, found[0].y_var, found[0].probs)
        train = None
        if include_train:
            on_train = found[1]
            train = on_train.pointwise
            value = on_train.expected_log_lik - on_train.kl
            elbo = ElboEstimate(value, 0.0, on_train.expected_log_lik, on_train.kl, 1, np.array([value]))
    else:
        draws = sample_inducing(res, int(num_draws), key_u)
        test = pointwise_given_u(res, X_test, y_test, draws, key_test)
        train = pointwise_given_u(res, res.X_train, res.y_train, draws, key_train) if include_train else None
        pred = predict(dataclasses.replace(res, standardisation=None), X_test, seed=seed)  # the model's units

    if standardisation is not None:
        test, pred = _original_units(standardisation, test), standardisation.prediction(pred)
        train = None if train is None else _original_units(standardisation, train)
        elbo = None if elbo is None else standardisation.elbo(elbo, res.num_data)
        X_train, y_train = standardisation.original_inputs(res.X_train), standardisation.original_targets(res.y_train)
    else:
        X_train, y_train = res.X_train, res.y_train
    X_test, y_test = X_given, y_given
    S = draws.num_draws
    L, GM = draws.u.shape[1:]
    task = res.spec.likelihood.task
    label_dtype = np.int64 if task in ("binary", "multiclass", "count") else None

    def targets(y):
        return y.astype(label_dtype) if label_dtype is not None else np.asarray(y)

    naming = _AxisNames(res, L, GM, train_index)
    info = res.parameter_info()
    posterior, var_attrs, sites = {"u": draws.u[None]}, {}, {"u": "u"}  # u: [1, S, L, GM]
    dims = {"u": ["latent", "inducing"], "y": [OBS_DIM], "X": [OBS_DIM, "feature"]}
    point, sampled, fixed = [], [], {}
    for row in info:
        var = variable_name(row.name)
        if row.role == FIXED:
            fixed[row.name] = row.value.tolist()
            continue
        if row.role == TYPE_II:
            site_value = np.broadcast_to(row.value, (1, S) + row.value.shape).copy()  # θ* in every draw
            point.append(var)
            estimate = "type-II point estimate (maximises the objective; repeated over draws: q(u) delta(theta - theta*))"
        elif row.role == SAMPLED:
            site_value = np.asarray(draws.hyper[row.name])[None]  # [1, S, ...]
            sampled.append(var)
            estimate = "draws from q(theta)"
        else:
            continue
        _record_site(sites, var, row.name)
        posterior[var] = site_value
        dims[var] = naming.dims(row.name, site_value.shape[2:])
        var_attrs[var] = {"site": row.name, "estimate": estimate, "class": row.owner, "constraint": row.constraint,
                          "prior": row.prior}

    data = {"posterior": posterior, "sample_stats": {"log_q": draws.log_q[None]},
            "predictions": {"y": targets(test.y_rep)[None]},
            "predictions_log_likelihood": {"y": test.log_lik[None]},
            "predictions_observed_data": {"y": targets(y_test)}}
    coords = naming.coords  # obs_id: the training rows
    pred_coords = {**naming.coords, OBS_DIM: test_index}
    if train is not None:
        data["posterior_predictive"] = {"y": targets(train.y_rep)[None]}
        data["log_likelihood"] = {"y": train.log_lik[None]}
        data["observed_data"] = {"y": targets(y_train)}
        log_p = draws.log_prior + train.log_lik.sum(axis=1)  # [S]
        data["sample_stats"].update(log_p=log_p[None], lp=log_p[None])
    stored = X_test.shape[1] <= MAX_STORED_FEATURES
    if stored:
        data["predictions_constant_data"] = {"X": X_test}
        if train is not None:
            data["constant_data"] = {"X": np.asarray(X_train)}
    input_attrs = {"image_shape": list(res.spec.image_shape or ()), "stored_inputs": int(stored)}

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
            "objective": res.objective,
            "standardised": int(standardisation is not None),
            "inference_library": "gpzoo (numpyro)",
        }),
        "posterior": _netcdf_attrs({
            "type_II_point_estimates": json.dumps(point),
            "sampled_hyperparameters": json.dumps(sampled),
            "fixed_hyperparameters": json.dumps(fixed),
        }),
        "sample_stats": {"log_p": "log p(u) [+ log p(theta)] + sum_n log p(y_n | u) over the training data",
                         "log_q": "log q(u) [+ log q(theta)]"},
        "predictions_constant_data": _netcdf_attrs({**input_attrs, "X_shape": list(X_test.shape)}),
    }
    if "constant_data" in data:
        attrs["constant_data"] = _netcdf_attrs({**input_attrs, "X_shape": list(res.X_train.shape)})
    attrs = {group: value for group, value in attrs.items() if group == "/" or group in data}
    dt = from_dict(data, dims=dims, coords=coords, pred_dims=dims, pred_coords=pred_coords, attrs=attrs)
    posterior_ds = dt["posterior"].to_dataset()
    for var, site_attrs in var_attrs.items():
        posterior_ds[var].attrs = _netcdf_attrs(site_attrs)
    dt["posterior"] = posterior_ds
    dt["predictions_moments"] = xr.DataTree(_predictive_moments(pred, test_index, L))
    optimization, opt_sites = _optimization(res, info, naming)
    dt["optimization"] = xr.DataTree(optimization)
    for var, site in opt_sites.items():
        _record_site(sites, var, site)
    dt.attrs["site_names"] = json.dumps(sites)
    return dt, elbo


def _original_units(standardisation, draws: PointwiseDraws) -> PointwiseDraws:
    """Pointwise log-likelihoods and replicates of standardised targets -> those of the original
    targets (each log density minus log sd(y), the change of variables)."""
    return PointwiseDraws(draws.log_lik - standardisation.log_y_scale, standardisation.original_targets(draws.y_rep))


def heldout_view(dt: xr.DataTree) -> xr.DataTree:
    """The test-set groups of a :func:`to_datatree` result under ArviZ's in-sample names
    (``predictions`` → ``posterior_predictive``, ``predictions_observed_data`` → ``observed_data``,
    ``predictions_log_likelihood`` → ``log_likelihood``, ``predictions_constant_data`` →
    ``constant_data``), with ``posterior`` and the root attrs, so ArviZ's checks run on held-out data."""
    if not isinstance(dt, xr.DataTree) or "predictions" not in dt.children:
        raise InvalidArgumentError("dt", "expected a DataTree from gpzoo.analysis.to_datatree (with a 'predictions' group)")
    groups = {"posterior": dt["posterior"].to_dataset()} if "posterior" in dt.children else {}
    groups.update({new: dt[old].to_dataset() for old, new in HELDOUT_GROUPS.items() if old in dt.children})
    view = xr.DataTree.from_dict(groups)
    view.attrs = dict(dt.attrs)
    return view


# ----------------------------------------------------------------------------- names
def _record_site(sites: dict, var: str, site: str) -> None:
    """``sites[var] = site``, refusing two sites that would share one variable name."""
    if var in sites and sites[var] != site:
        raise InvalidArgumentError("res", f"sites {sites[var]!r} and {site!r} would both be stored as {var!r}")
    sites[var] = site


def _row_index(index, n: int, argument: str) -> np.ndarray:
    if index is None:
        return np.arange(n)
    index = np.asarray(index)
    if index.ndim != 1 or index.shape[0] != n:
        raise ShapeError(argument, f"expected {n} row labels, got shape {index.shape}")
    if len(np.unique(index)) != n:
        raise InvalidArgumentError(argument, "row labels must be unique")
    return index


class _AxisNames:
    """Readable dimension names for parameter axes, chosen by the parameter's field and checked
    against the sizes they must have (a name always means one size within a DataTree)."""

    def __init__(self, res: FitResult, num_latent: int, num_inducing: int, train_index: np.ndarray):
        self.train_index = train_index
        sizes = {OBS_DIM: len(train_index), "feature": int(res.X_train.shape[1]), "latent": num_latent,
                 "inducing": num_inducing, "inducing_col": num_inducing}
        for obj in _objects(res.spec.kernel):
            for attr, dim in (("num_patches", "patch"), ("patch_dim", "patch_feature"), ("num_channels", "channel")):
                try:
                    value = getattr(obj, attr, None)
                except (TypeError, ValueError, GPZooError):  # a shape property this kernel's configuration cannot answer
                    value = None
                if isinstance(value, (int, np.integer)) and dim not in sizes:
                    sizes[dim] = int(value)
        self.sizes = sizes

    @property
    def coords(self) -> dict[str, np.ndarray]:
        """Coordinates of every named dimension: the training rows' labels for ``obs_id``, else ``arange``."""
        return {dim: self.train_index if dim == OBS_DIM else np.arange(size) for dim, size in self.sizes.items()}

    def dims(self, site: str, shape: tuple) -> list[str]:
        var = variable_name(site)
        candidates = self._candidates(site, len(shape))
        names = []
        for i, size in enumerate(shape):
            choice = next((c for c in (candidates[i] if i < len(candidates) else ())
                           if self.sizes.get(c) == size and c not in names), None)
            names.append(choice or f"{var}_dim_{i}")
        return names

    def _candidates(self, site: str, ndim: int) -> list[tuple[str, ...]]:
        field = site.rsplit(".", 1)[-1]
        features = ("feature", "patch_feature")
        if field == "lengthscale":
            return [features] * ndim
        if field == "weights":
            return [("patch",)] if ndim == 1 else [("channel",), ("patch",)]
        if field == "channel_variances":
            return [("channel",)]
        if field == "Z":
            part = re.fullmatch(r"inducing\.parts\.(\d+)\.Z", site)
            if part:
                return [(f"inducing_part_{part.group(1)}",), features]  # its size: register_size
            return [("inducing",), features]
        if field == "q_mu":
            return [("latent",), ("inducing",)]
        if field == "q_sqrt":
            return [("latent",), ("inducing",), ("inducing_col",)]
        if field == "variance" and ndim == 1:
            return [("latent",)]
        if field in PER_DATUM_SITES:
            return [(OBS_DIM,)]
        return []

    def register_size(self, dim: str, size: int) -> None:
        self.sizes.setdefault(dim, int(size))


def _objects(obj):
    """``obj`` and every object below it in a Parameterised tree (children, tuples of children)."""
    yield obj
    if not isinstance(obj, Parameterised):
        return
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name, None)
        for child in value if isinstance(value, tuple) else (value,):
            if isinstance(child, Parameterised):
                yield from _objects(child)


# ----------------------------------------------------------------------------- groups
def _predictive_moments(pred, test_index: np.ndarray, num_latent: int) -> xr.Dataset:
    num_test = len(test_index)
    ds = xr.Dataset(
        {name: ((OBS_DIM, "latent"), np.asarray(getattr(pred, name))) for name in ("f_mean", "f_var", "y_mean", "y_var")
         if np.asarray(getattr(pred, name)).shape == (num_test, num_latent)},
        coords={OBS_DIM: test_index, "latent": np.arange(num_latent)},
    )
    if pred.probs is not None:
        probs = np.asarray(pred.probs)  # [T, C]
        ds["probs"] = xr.DataArray(probs, dims=(OBS_DIM, "class"), coords={"class": np.arange(probs.shape[1])})
    ds.attrs["source"] = "gpzoo.inference.predict: analytic q(f*) marginals on the test set"
    return ds


def _optimization(res: FitResult, info, naming: _AxisNames) -> tuple[xr.Dataset, dict]:
    """The fit's trace (``objective``, ``step_size`` over ``step``), the final variational parameters, diagnostics."""
    steps = np.arange(len(res.objective_history))
    ds = xr.Dataset(
        {"objective": ("step", np.asarray(res.objective_history, np.float64), {"name": res.objective}),
         "step_size": ("step", np.asarray(res.step_size_history, np.float64), {"name": res.step_size})},
        coords={"step": steps},
    )
    sites = {}
    for row in info:
        if row.is_hyperparameter:
            continue
        var = variable_name(row.name)
        part = re.fullmatch(r"inducing\.parts\.(\d+)\.Z", row.name)
        if part and row.value.ndim:
            naming.register_size(f"inducing_part_{part.group(1)}", row.value.shape[0])
        dims = naming.dims(row.name, row.value.shape)
        all_coords = naming.coords
        coords = {d: all_coords[d] for d in dims if d in all_coords}
        if var in ds:
            raise InvalidArgumentError("res", f"parameter {row.name!r} would overwrite the optimisation variable {var!r}")
        ds[var] = xr.DataArray(row.value, dims=dims, coords=coords,
                               attrs=_netcdf_attrs({"site": row.name, "class": row.owner, "constraint": row.constraint}))
        sites[var] = row.name
    diag = res.diagnostics
    ds.attrs = _netcdf_attrs({
        "objective": res.objective,
        "step_size": res.step_size,
        "final_objective": res.final_objective,
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
    return ds, sites


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
