"""gpzoo.analysis.to_datatree, inference.posterior and FitResult.summary: ArviZ conventions, ArviZ
functions with their defaults, exact-GP LOO, the parameter table."""

from __future__ import annotations

import dataclasses
import json
import warnings

import arviz as az
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
import pytest
import xarray as xr
from arviz_base import from_dict

from gpzoo.analysis.compare import loo_approximate
from gpzoo.analysis.datatree import MIN_DRAWS, heldout_view, to_datatree
from gpzoo.analysis.report import read_datatree, write_datatree
from gpzoo.inference.exact import exact_log_marginal, optimal_q
from gpzoo.inference.fit import fit, predict
from gpzoo.inference.inducing import InducingPoints
from gpzoo.inference.posterior import conditional_given_u, pointwise_given_u, sample_inducing
from gpzoo.models import kernels, likelihoods, zoo
from gpzoo.models.errors import InvalidArgumentError, ShapeError
from gpzoo.models.parameters import Fixed
from gpzoo.models.zoo import ModelSpec
from numpyro import distributions as dist  # not `import numpyro.distributions`: see analysis/__init__.py

matplotlib.use("Agg")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")  # Pareto k, constant θ*

NUM_DRAWS = 100
HYPER = ["kernel_lengthscale", "kernel_variance", "likelihood_noise_variance"]
TRAIN_INDEX, TEST_INDEX = 1000 + 2 * np.arange(40), 3 * np.arange(15)  # original row labels


def _sin_data(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3.0, 3.0, (n, 1))  # [N, 1]
    return X, np.sin(2.0 * X[:, 0]) + 0.1 * rng.normal(size=n)  # [N]


@pytest.fixture(scope="module")
def regression():
    X, y = _sin_data(40, 0)
    X_test, y_test = _sin_data(15, 1)
    res = fit(zoo.get("svgp-rbf", input_dim=1, num_inducing=8), X, y, steps=100, learning_rate=0.05, progress=False)
    dt = to_datatree(res, X_test, y_test, num_draws=NUM_DRAWS, seed=0, train_index=TRAIN_INDEX, test_index=TEST_INDEX)
    return res, dt, X_test, y_test


@pytest.fixture(scope="module")
def binary():
    rng = np.random.default_rng(2)
    X = rng.uniform(-3.0, 3.0, (50, 1))
    y = (rng.uniform(size=50) < 1 / (1 + np.exp(-3 * X[:, 0]))).astype(np.int64)
    res = fit(zoo.get("svgp-rbf", input_dim=1, task="binary", num_inducing=6), X[:35], y[:35], steps=60,
              learning_rate=0.05, progress=False)
    return res, to_datatree(res, X[35:], y[35:], num_draws=NUM_DRAWS)


def _names(dt: xr.DataTree) -> set[str]:
    """Every variable, dimension and coordinate name of every group."""
    names = set()
    for node in dt.subtree:
        names |= set(node.data_vars) | set(node.dims) | set(node.coords)
    return names


# ----------------------------------------------------------------------------- conventions
def test_groups_dims_and_coords(regression):
    res, dt, X_test, y_test = regression
    for group in ("posterior", "posterior_predictive", "log_likelihood", "observed_data", "sample_stats", "constant_data",
                  "predictions", "predictions_constant_data", "predictions_observed_data", "predictions_log_likelihood",
                  "predictions_moments", "optimization"):
        assert group in dt.children, group
    u = dt.posterior["u"]
    assert u.dims == ("chain", "draw", "latent", "inducing") and u.shape == (1, NUM_DRAWS, 1, 8)
    # training data are the conditioning data: y, with the original row labels
    for group in ("posterior_predictive", "log_likelihood"):
        assert list(dt[group].data_vars) == ["y"]
        assert dt[group]["y"].dims == ("chain", "draw", "obs_id")
        np.testing.assert_array_equal(dt[group]["obs_id"].values, TRAIN_INDEX)
    np.testing.assert_array_equal(dt.observed_data["y"].values, res.y_train)
    np.testing.assert_array_equal(dt.constant_data["X"].values, res.X_train)  # 1 column: inputs are stored
    # test data are predictions, with their own row labels
    for group in ("predictions", "predictions_log_likelihood"):
        assert dt[group]["y"].dims == ("chain", "draw", "obs_id")
        np.testing.assert_array_equal(dt[group]["obs_id"].values, TEST_INDEX)
    np.testing.assert_array_equal(dt.predictions_observed_data["y"].values, y_test)
    np.testing.assert_array_equal(dt.predictions_constant_data["X"].values, X_test)
    assert dt.predictions_moments["f_mean"].dims == ("obs_id", "latent")
    np.testing.assert_array_equal(dt.predictions_moments["obs_id"].values, TEST_INDEX)
    assert dt.sample_stats["log_p"].dims == ("chain", "draw")
    assert np.all(np.isfinite(dt.sample_stats["log_q"].values))
    # the optimisation trace and the final variational parameters
    opt = dt.optimization
    np.testing.assert_allclose(opt["objective"].values, res.objective_history)
    assert opt["objective"].sizes["step"] == 100 and opt.attrs["objective"] == "ELBO"
    assert opt["step_size"].attrs["name"] == "learning rate"
    np.testing.assert_array_equal(opt["q_mu"].values, res.params["q_mu"])
    assert opt["q_mu"].dims == ("latent", "inducing") and opt["q_sqrt"].dims == ("latent", "inducing", "inducing_col")
    assert opt["inducing_Z"].dims == ("inducing", "feature")
    # type-II point estimates: θ* in every draw, marked as such
    for var in HYPER:
        site = var.replace("_", ".", 1)
        assert dt.posterior[var].dims == ("chain", "draw")
        np.testing.assert_array_equal(dt.posterior[var].values, np.full((1, NUM_DRAWS), res.params[site]))
        assert dt.posterior[var].attrs["site"] == site and "type-II" in dt.posterior[var].attrs["estimate"]
    assert json.loads(dt.posterior.attrs["type_II_point_estimates"]) == HYPER
    sites = json.loads(dt.attrs["site_names"])
    assert sites["kernel_lengthscale"] == "kernel.lengthscale" and sites["inducing_Z"] == "inducing.Z"
    assert not [name for name in _names(dt) if "." in name]
    assert dt.attrs["task"] == "regression" and dt.attrs["num_train"] == 40


def test_no_internal_sites_in_the_groups(regression, binary):
    """Only model quantities are variables: no ``jitter`` (a numerical device of the Cholesky) in any group;
    the jitter the fit used is an attribute of ``optimization``."""
    for dt in (regression[1], binary[1]):
        assert not [node.path for node in dt.subtree if "jitter" in node.data_vars or "jitter" in node.coords]
        assert "jitter" in dt.optimization.attrs


def test_draws_match_q_and_the_conditional(regression):
    """E_s[μ(u_s)] ≈ E_q[f] and Var_s[μ(u_s)] + (Kff − Qff) ≈ Var_q[f] (law of total variance)."""
    res, _, X_test, _ = regression
    draws = sample_inducing(res, 1000, jax.random.PRNGKey(3))
    mean, var = conditional_given_u(res, X_test, draws)  # [S, N, L] each
    pred = predict(res, X_test)
    scale = np.sqrt(pred.f_var)
    np.testing.assert_allclose(mean.mean(0), pred.f_mean, atol=float(4 * scale.max() / np.sqrt(1000)))
    np.testing.assert_allclose(mean.var(0) + var[0], pred.f_var, rtol=0.1)
    assert np.all(var >= 0)


def test_arviz_functions_with_their_defaults(regression):
    """az.loo, az.summary, az.plot_forest, az.plot_ppc_pit with no extra arguments."""
    res, dt, _, _ = regression
    loo = az.loo(dt, pointwise=True)
    assert loo.n_data_points == 40 and np.isfinite(loo.elpd)
    approx = az.loo_approximate_posterior(dt, dt.sample_stats["log_p"], dt.sample_stats["log_q"])
    assert approx.approx_posterior and np.isfinite(approx.elpd)
    summary = az.summary(dt)
    assert len(summary) == 8 + 3  # u [1, 8] and the three hyperparameters
    for var in HYPER:
        assert float(summary.loc[var, "mean"]) == pytest.approx(float(res.params[var.replace("_", ".", 1)]))
        assert float(summary.loc[var, "sd"]) == pytest.approx(0.0, abs=1e-12)
    assert az.plot_forest(dt, var_names=HYPER, backend="matplotlib") is not None
    assert az.plot_ppc_pit(dt, backend="matplotlib") is not None  # training replicates
    assert az.plot_ppc_pit(heldout_view(dt), backend="matplotlib") is not None  # test set


def test_compare_and_plot_compare(regression):
    _, dt, _, _ = regression
    other = dt.copy()
    other["log_likelihood"] = dt["log_likelihood"].to_dataset() - 0.5  # a uniformly worse predictor
    table = az.compare({"good": dt, "worse": other})
    assert list(table.index) == ["good", "worse"]
    assert table.loc["worse", "elpd_diff"] == pytest.approx(-20.0, rel=1e-6)  # 40 points × 0.5 (ArviZ 1.x: negative)
    assert az.plot_compare(table, backend="matplotlib") is not None


def test_ppc_plots(binary):
    _, dt_bin = binary
    for group in ("posterior_predictive", "predictions"):
        assert set(np.unique(dt_bin[group]["y"].values)) <= {0, 1}
        assert dt_bin[group]["y"].dtype.kind == "i"
    assert az.plot_ppc_pava(dt_bin, backend="matplotlib") is not None
    assert az.plot_ppc_pava(heldout_view(dt_bin), backend="matplotlib") is not None
    probs = dt_bin.predictions_moments["probs"].values
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-6)


def test_netcdf_round_trip(regression, tmp_path):
    _, dt, _, _ = regression
    dt.to_netcdf(tmp_path / "plain.nc")
    with xr.open_datatree(tmp_path / "plain.nc") as back:
        assert back.identical(dt)
    assert read_datatree(write_datatree(dt, tmp_path / "model.nc")).identical(dt)


def test_include_train_false_and_bad_input(regression):
    res, _, X_test, y_test = regression
    dt = to_datatree(res, X_test, y_test, num_draws=NUM_DRAWS, include_train=False)  # same shapes: no recompilation
    assert "log_likelihood" not in dt.children and "log_p" not in dt.sample_stats
    assert "predictions_log_likelihood" in dt.children
    np.testing.assert_array_equal(dt.predictions["obs_id"].values, np.arange(15))  # default row labels
    with pytest.raises(InvalidArgumentError, match="num_draws"):
        to_datatree(res, X_test, y_test, num_draws=0)
    with pytest.raises(InvalidArgumentError, match="X_test"):
        to_datatree(res, X_test[:3], y_test)
    with pytest.raises(ShapeError, match="test_index"):
        to_datatree(res, X_test, y_test, test_index=np.arange(3))
    with pytest.raises(InvalidArgumentError, match="train_index"):
        to_datatree(res, X_test, y_test, train_index=np.zeros(40))


def test_sampled_hyperparameters_are_drawn_per_draw():
    """A lengthscale with a prior: each u_s comes with its own θ_s ~ q(θ), and log q / log p
    include log q(θ_s) / log p(θ_s) (checked against the LogNormal guide and prior directly).
    In the DataTree the draws are in ``posterior``, a Fixed hyperparameter only in attrs."""
    X, y = _sin_data(20, 4)
    prior = dist.LogNormal(0.0, 0.5)
    spec = ModelSpec(name="rbf-prior", kernel=kernels.SquaredExponential(lengthscale=prior, variance=Fixed(1.0)),
                     likelihood=likelihoods.Gaussian(noise_variance=0.1), num_inducing=5)
    res = fit(spec, X, y, steps=5, progress=False)
    draws = sample_inducing(res, MIN_DRAWS, jax.random.PRNGKey(0))
    ls = draws.hyper["kernel.lengthscale"]  # [S]
    assert ls.shape == (MIN_DRAWS,) and np.all(ls > 0) and np.unique(ls).size == MIN_DRAWS
    assert np.all(np.isfinite(draws.log_q)) and np.all(np.isfinite(draws.log_prior))
    # the θ-part of log p − log q: log p(θ) − log q(θ); the u-part is independent of the guide of θ
    guide = dist.LogNormal(res.params["kernel.lengthscale_auto_loc"], res.params["kernel.lengthscale_auto_scale"])
    theta_part = np.asarray(prior.log_prob(ls) - guide.log_prob(ls))  # [S]
    u_part = (draws.log_prior - draws.log_q) - theta_part
    q_u = draws.log_q - np.asarray(guide.log_prob(ls))  # log q(u_s | θ_s)
    assert np.all(np.isfinite(u_part)) and np.all(np.isfinite(q_u))
    pointwise = pointwise_given_u(res, X, y, draws, jax.random.PRNGKey(1))
    assert pointwise.log_lik.shape == (MIN_DRAWS, 20) and np.all(np.isfinite(pointwise.log_lik))

    dt = to_datatree(res, X, y, num_draws=MIN_DRAWS)  # the shapes above: nothing new to compile but predict
    assert np.unique(dt.posterior["kernel_lengthscale"].values).size == MIN_DRAWS
    assert dt.posterior["kernel_lengthscale"].attrs["estimate"] == "draws from q(theta)"
    assert json.loads(dt.posterior.attrs["sampled_hyperparameters"]) == ["kernel_lengthscale"]
    assert json.loads(dt.posterior.attrs["fixed_hyperparameters"]) == {"kernel.variance": 1.0}
    assert "kernel_variance" not in dt.posterior and "kernel_lengthscale_auto_loc" in dt.optimization
    table = res.summary()
    assert table.loc["kernel.lengthscale", "role"] == "sampled" and "LogNormal" in table.loc["kernel.lengthscale", "prior"]
    assert not table.loc["kernel.variance", "trainable"] and table.loc["kernel.variance", "role"] == "fixed"


# ----------------------------------------------------------------------------- parameter table
def _check_summary(res, fixed=()):
    table = res.summary()
    assert list(table.columns) == ["class", "role", "constraint", "transform", "prior", "trainable", "shape", "dtype", "value"]
    assert set(table.index) == set(res.params) | set(fixed)
    for name, value in res.params.items():
        assert table.loc[name, "shape"] == np.shape(value), name
        assert table.loc[name, "dtype"] == str(np.asarray(value).dtype)
    assert len(table.loc["q_sqrt", "value"]) < 120  # arrays are shortened
    return table


def test_summary_of_svgp_rbf(regression):
    res, _, _, _ = regression
    table = _check_summary(res)
    assert list(table.index[:3]) == ["kernel.lengthscale", "kernel.variance", "likelihood.noise_variance"]
    assert table.loc["kernel.lengthscale", "class"] == "SquaredExponential"
    assert table.loc["kernel.lengthscale", "constraint"] == "Positive" and table.loc["kernel.lengthscale", "transform"] == "Exp"
    assert table.loc["kernel.lengthscale", "role"] == "type-II"
    assert table.loc["q_sqrt", "constraint"] == "LowerCholesky" and table.loc["inducing.Z", "role"] == "variational"
    assert table.loc["q_sqrt", "transform"] == "LinearDiagonalCholesky"  # its entries, the diagonal not through exp
    assert float(table.loc["kernel.variance", "value"]) == pytest.approx(float(res.params["kernel.variance"]), rel=1e-3)
    html = res._repr_html_()
    assert res.header() in html and "<table" in html and "q_sqrt" in html


def test_header_names_the_objective_the_step_size_and_which_estimate(regression):
    """The header states the learning rate's value (not only its name), and says whether its ELBO is
    the last step's (here full-batch) value or a full-data evaluate_elbo estimate, which it then equals."""
    from gpzoo import evaluate_elbo  # noqa: PLC0415

    res, _, _, _ = regression
    header = res.header()
    assert header == f"svgp-rbf: ELBO {res.final_objective:.6g} after 100 steps, last learning rate 0.05"
    estimate = evaluate_elbo(res)
    with_estimate = res.header(estimate)
    assert f"ELBO {estimate.elbo:.6g} ± " in with_estimate and "(full data)" in with_estimate
    minibatch = dataclasses.replace(res, batch_size=10)
    assert "(last step, one minibatch of 10)" in minibatch.header()


def test_conv_model_summary_and_named_dims():
    """A weighted convolutional model: every parameter listed with its shape; patch axes named."""
    rng = np.random.default_rng(6)
    X = rng.uniform(0.0, 1.0, (24, 25))  # 5×5 images
    y = (X[:, :12].sum(1) > 6).astype(np.int64)
    spec = zoo.get("weighted-conv", image_shape=(5, 5), patch_shape=(3, 3), num_inducing=4, task="binary")
    res = fit(spec, X, y, steps=3, progress=False)
    table = _check_summary(res)
    assert table.loc["kernel.weights", "shape"] == (9,) and table.loc["inducing.Z", "shape"] == (4, 9)
    dt = to_datatree(res, X, y, num_draws=MIN_DRAWS)  # test set = training set: one compilation of the pointwise terms
    assert dt.posterior["kernel_weights"].dims == ("chain", "draw", "patch")
    assert dt.optimization["inducing_Z"].dims == ("inducing", "patch_feature")
    assert dt.predictions_constant_data["X"].dims == ("obs_id", "feature")  # 25 columns: stored
    assert not [name for name in _names(dt) if "." in name]
    assert "kernel_weights" in az.summary(dt, var_names=["kernel_weights"]).index[0]


def test_float32_datatree(float32, tmp_path):
    """With x64 off the fit, the draws and the parameter table are float32; ArviZ and netCDF still work."""
    X, y = _sin_data(30, 7)
    res = fit(zoo.get("svgp-rbf", input_dim=1, num_inducing=6), X, y, steps=20, learning_rate=0.05, progress=False)
    assert res.params["kernel.lengthscale"].dtype == np.float32
    table = _check_summary(res)
    assert set(table["dtype"]) == {"float32"}
    dt = to_datatree(res, X, y, num_draws=MIN_DRAWS)
    assert dt.posterior["u"].dtype == np.float32 and dt.posterior["kernel_lengthscale"].dtype == np.float32
    assert np.isfinite(az.loo(dt).elpd)
    assert np.all(np.isfinite(az.loo(dt, pointwise=True).pareto_k))  # enough draws for PSIS's Pareto fit
    assert "kernel_lengthscale" in az.summary(dt).index
    dt.to_netcdf(tmp_path / "f32.nc")
    with xr.open_datatree(tmp_path / "f32.nc") as back:
        assert back.identical(dt)


# ----------------------------------------------------------------------------- exact GP
N_EXACT, NOISE = 30, 0.09


def _exact_problem():
    rng = np.random.default_rng(5)
    X = np.sort(rng.uniform(-3.0, 3.0, (N_EXACT, 1)), axis=0)  # [N, 1]
    y = np.sin(X[:, 0]) + np.sqrt(NOISE) * rng.normal(size=N_EXACT)  # [N]
    kernel = kernels.SquaredExponential(lengthscale=1.0, variance=1.0)
    return X, y, kernel


def _brute_force_loo(kernel, X, y):
    """Σ_i log p(y_i | y_-i): the exact GP posterior refitted on the other N − 1 points, N times."""
    K = np.asarray(kernel.K(jnp.asarray(X)))  # [N, N]
    total = 0.0
    for i in range(len(y)):
        keep = np.arange(len(y)) != i
        L = np.linalg.cholesky(K[np.ix_(keep, keep)] + NOISE * np.eye(len(y) - 1))  # [N-1, N-1]
        a = np.linalg.solve(L, K[keep, i])  # [N-1]
        mean = a @ np.linalg.solve(L, y[keep])
        v = K[i, i] - a @ a + NOISE  # predictive variance of y_i
        total += -0.5 * (np.log(2 * np.pi * v) + (y[i] - mean) ** 2 / v)
    return total


def test_psis_loo_of_exact_posterior_draws_matches_brute_force():
    """az.loo on a DataTree of exact posterior draws of f agrees with exact leave-one-out."""
    X, y, kernel = _exact_problem()
    Xj = jnp.asarray(X)
    K = kernel.K(Xj)  # [N, N]
    L = jnp.linalg.cholesky(K + NOISE * jnp.eye(N_EXACT))
    A = jax.scipy.linalg.solve_triangular(L, K, lower=True)  # [N, N]
    mean = A.T @ jax.scipy.linalg.solve_triangular(L, jnp.asarray(y), lower=True)  # [N]
    cov = K - A.T @ A  # [N, N]
    f = np.asarray(jax.random.multivariate_normal(jax.random.PRNGKey(0), mean, cov + 1e-9 * jnp.eye(N_EXACT), (4000,)))
    log_lik = -0.5 * (np.log(2 * np.pi * NOISE) + (y[None] - f) ** 2 / NOISE)  # [S, N]
    dt = from_dict({"posterior": {"f": f[None]}, "log_likelihood": {"y": log_lik[None]}, "observed_data": {"y": y}},
                   dims={"f": ["obs"], "y": ["obs"]})
    loo = az.loo(dt)
    assert abs(loo.elpd - _brute_force_loo(kernel, X, y)) < loo.se


def test_to_datatree_with_exact_q_gives_log_marginal_and_exact_loo():
    """Z = X and the optimal q(u) (the exact posterior): log p − log q = log p(y) for every draw,
    and PSIS-LOO of the approximate posterior matches brute-force LOO within its standard error."""
    X, y, kernel = _exact_problem()
    Xj = jnp.asarray(X)
    spec = ModelSpec(name="exact", kernel=kernel, likelihood=likelihoods.Gaussian(noise_variance=NOISE),
                     num_inducing=N_EXACT, jitter=1e-8)
    res = fit(spec, X, y, steps=0, progress=False, inducing=InducingPoints(Xj))
    q_mu, q_sqrt = optimal_q(kernel, NOISE, Xj, Xj, jnp.asarray(y), whiten=True, jitter=spec.jitter)
    res = dataclasses.replace(res, params={**res.params, "q_mu": np.asarray(q_mu), "q_sqrt": np.asarray(q_sqrt)})
    dt = to_datatree(res, X[:4], y[:4], num_draws=500, seed=1)
    gap = (dt.sample_stats["log_p"] - dt.sample_stats["log_q"]).values.ravel()  # [S]
    assert np.std(gap) < 1e-3
    assert np.mean(gap) == pytest.approx(float(exact_log_marginal(kernel, NOISE, Xj, jnp.asarray(y))), abs=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loo = loo_approximate(dt)
    assert abs(loo.elpd - _brute_force_loo(kernel, X, y)) < loo.se
    assert isinstance(dt, xr.DataTree)
