"""gpzoo.analysis.to_datatree and inference.posterior: ArviZ conventions, ArviZ functions, exact-GP LOO."""

from __future__ import annotations

import dataclasses
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
from gpzoo.analysis.datatree import to_datatree
from gpzoo.analysis.report import read_datatree, write_datatree
from gpzoo.inference.exact import exact_log_marginal, optimal_q
from gpzoo.inference.fit import fit, predict
from gpzoo.inference.inducing import InducingPoints
from gpzoo.inference.posterior import conditional_given_u, pointwise_given_u, sample_inducing
from gpzoo.models import kernels, likelihoods, zoo
from gpzoo.models.errors import InvalidArgumentError
from gpzoo.models.zoo import ModelSpec
from numpyro import distributions as dist  # not `import numpyro.distributions`: see analysis/__init__.py

matplotlib.use("Agg")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # ArviZ's Pareto-k / single-chain warnings

NUM_DRAWS = 100


def _sin_data(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3.0, 3.0, (n, 1))  # [N, 1]
    return X, np.sin(2.0 * X[:, 0]) + 0.1 * rng.normal(size=n)  # [N]


@pytest.fixture(scope="module")
def regression():
    X, y = _sin_data(40, 0)
    X_test, y_test = _sin_data(15, 1)
    res = fit(zoo.get("svgp-rbf", input_dim=1, num_inducing=8), X, y, steps=100, learning_rate=0.05, progress=False)
    dt = to_datatree(res, X_test, y_test, num_draws=NUM_DRAWS, seed=0)
    return res, dt, X_test, y_test


@pytest.fixture(scope="module")
def binary():
    rng = np.random.default_rng(2)
    X = rng.uniform(-3.0, 3.0, (50, 1))
    y = (rng.uniform(size=50) < 1 / (1 + np.exp(-3 * X[:, 0]))).astype(np.int64)
    res = fit(zoo.get("svgp-rbf", input_dim=1, task="binary", num_inducing=6), X[:35], y[:35], steps=60,
              learning_rate=0.05, progress=False)
    return res, to_datatree(res, X[35:], y[35:], num_draws=NUM_DRAWS)


# ----------------------------------------------------------------------------- conventions
def test_groups_dims_and_coords(regression):
    res, dt, X_test, _ = regression
    for group in ("posterior", "posterior_predictive", "log_likelihood", "observed_data", "sample_stats",
                  "constant_data", "predictive_moments", "optimization"):
        assert group in dt.children, group
    u = dt.posterior["u"]
    assert u.dims == ("chain", "draw", "latent", "inducing")
    assert u.shape == (1, NUM_DRAWS, 1, 8)
    for group in ("posterior_predictive", "log_likelihood"):
        assert dt[group]["y"].dims == ("chain", "draw", "obs_test")
        assert dt[group]["y_train"].dims == ("chain", "draw", "obs_train")
        assert dt[group]["y_train"].sizes["obs_train"] == 40
    assert dt.observed_data["y"].dims == ("obs_test",)
    np.testing.assert_array_equal(dt.observed_data["y_train"].values, res.y_train)
    np.testing.assert_array_equal(dt.constant_data["X"].values, X_test)  # 1 column: inputs are stored
    assert dt.sample_stats["log_p"].dims == ("chain", "draw")
    assert np.all(np.isfinite(dt.sample_stats["log_q"].values))
    opt = dt.optimization
    np.testing.assert_allclose(opt["elbo"].values, res.objective_history)
    assert opt["elbo"].sizes["step"] == 100 and "learning_rate" in opt
    assert float(opt["kernel.lengthscale"]) == pytest.approx(float(res.params["kernel.lengthscale"]))
    assert dt.attrs["loo_var_name"] == "y_train" and dt.attrs["task"] == "regression"


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


def test_summary_and_loo(regression):
    _, dt, _, _ = regression
    summary = az.summary(dt)
    assert len(summary) == 8 and np.all(np.isfinite(summary["mean"].astype(float)))
    loo = az.loo(dt, var_name="y_train", pointwise=True)
    assert loo.n_data_points == 40 and np.isfinite(loo.elpd)
    approx = az.loo_approximate_posterior(dt, dt.sample_stats["log_p"], dt.sample_stats["log_q"], var_name="y_train")
    assert approx.approx_posterior and np.isfinite(approx.elpd)


def test_compare_and_plot_compare(regression):
    _, dt, _, _ = regression
    other = dt.copy()
    other["log_likelihood"] = dt["log_likelihood"].to_dataset() - 0.5  # a uniformly worse predictor
    table = az.compare({"good": dt, "worse": other}, var_name="y_train")
    assert list(table.index) == ["good", "worse"]
    assert table.loc["worse", "elpd_diff"] == pytest.approx(-20.0, rel=1e-6)  # 40 points × 0.5 (ArviZ 1.x: negative)
    assert az.plot_compare(table, backend="matplotlib") is not None


def test_ppc_plots(regression, binary):
    _, dt, _, _ = regression
    _, dt_bin = binary
    assert az.plot_ppc_pit(dt, backend="matplotlib") is not None
    assert set(np.unique(dt_bin.posterior_predictive["y"].values)) <= {0, 1}
    assert dt_bin.posterior_predictive["y"].dtype.kind == "i"
    assert az.plot_ppc_pava(dt_bin, backend="matplotlib") is not None
    probs = dt_bin.predictive_moments["probs"].values
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-6)


def test_netcdf_round_trip(regression, tmp_path):
    _, dt, _, _ = regression
    path = write_datatree(dt, tmp_path / "model.nc")
    back = read_datatree(path)
    assert back.identical(dt)


def test_include_train_false_and_bad_input(regression):
    res, _, X_test, y_test = regression
    dt = to_datatree(res, X_test, y_test, num_draws=NUM_DRAWS, include_train=False)  # same shapes: no recompilation
    assert list(dt.log_likelihood.data_vars) == ["y"] and "log_p" not in dt.sample_stats
    assert "obs_train" not in dt.posterior_predictive.dims
    with pytest.raises(InvalidArgumentError, match="num_draws"):
        to_datatree(res, X_test, y_test, num_draws=0)
    with pytest.raises(InvalidArgumentError, match="X_test"):
        to_datatree(res, X_test[:3], y_test)


def test_sampled_hyperparameters_are_drawn_per_draw():
    """A lengthscale with a prior: each u_s comes with its own θ_s ~ q(θ), and log q / log p
    include log q(θ_s) / log p(θ_s) (checked against the LogNormal guide and prior directly)."""
    X, y = _sin_data(20, 4)
    prior = dist.LogNormal(0.0, 0.5)
    spec = ModelSpec(name="rbf-prior", kernel=kernels.SquaredExponential(lengthscale=prior, variance=1.0),
                     likelihood=likelihoods.Gaussian(noise_variance=0.1), num_inducing=5)
    res = fit(spec, X, y, steps=5, progress=False)
    draws = sample_inducing(res, 16, jax.random.PRNGKey(0))
    ls = draws.hyper["kernel.lengthscale"]  # [S]
    assert ls.shape == (16,) and np.all(ls > 0) and np.unique(ls).size == 16
    assert np.all(np.isfinite(draws.log_q)) and np.all(np.isfinite(draws.log_prior))
    # the θ-part of log p − log q: log p(θ) − log q(θ); the u-part is independent of the guide of θ
    guide = dist.LogNormal(res.params["kernel.lengthscale_auto_loc"], res.params["kernel.lengthscale_auto_scale"])
    theta_part = np.asarray(prior.log_prob(ls) - guide.log_prob(ls))  # [S]
    u_part = (draws.log_prior - draws.log_q) - theta_part
    q_u = draws.log_q - np.asarray(guide.log_prob(ls))  # log q(u_s | θ_s)
    assert np.all(np.isfinite(u_part)) and np.all(np.isfinite(q_u))
    pointwise = pointwise_given_u(res, X[:5], y[:5], draws, jax.random.PRNGKey(1))
    assert pointwise.log_lik.shape == (16, 5) and np.all(np.isfinite(pointwise.log_lik))


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
