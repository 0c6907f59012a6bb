"""gpzoo.sample: NUTS on zoo models that mixes, checked against exact answers.

* The whitened-inducing target with fixed hyperparameters and Z = X is the exact GP: its f* mean and
  sd match the closed form within 4 Monte Carlo standard errors.
* The collapsed target with a prior on the lengthscale matches a quadrature of the same posterior
  over log ℓ (f* mean and sd, and E[ℓ], within 4 Monte Carlo standard errors), with r_hat < 1.01
  over 4 chains and no divergences; its DataTree works with az.summary, az.loo and az.compare
  against an SVI fit.
* On a sparse convolutional model with a Bernoulli likelihood and priors on the kernel's
  hyperparameters, the chains mix (r_hat < 1.05, ESS > 100 for every hyperparameter).
* A broken sampler setting is reported (SamplerWarning); bad arguments are typed errors.
"""

from __future__ import annotations

import dataclasses
import warnings

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro.distributions as dist
import pytest
from numpyro.diagnostics import effective_sample_size

import gpzoo
from gpzoo.inference.exact import exact_log_marginal, exact_posterior
from gpzoo.inference.mcmc import sample
from gpzoo.models import zoo
from gpzoo.models.errors import InvalidArgumentError, SamplerWarning
from gpzoo.models.kernels import SquaredExponential
from gpzoo.models.parameters import Fixed
from test_contract import _bars  # 6×6 images of one horizontal or vertical bar

NOISE, VARIANCE = 0.04, 1.0
X_STAR = np.linspace(-3.5, 3.5, 7)[:, None]


def _data(n=20, seed=0):
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(-3, 3, (n, 1)), axis=0)
    return X, np.sin(1.5 * X[:, 0]) + np.sqrt(NOISE) * rng.normal(size=n)


def _spec(lengthscale, num_inducing):
    spec = zoo.get("svgp-rbf", input_dim=1, num_inducing=num_inducing)
    kernel = SquaredExponential(lengthscale=lengthscale, variance=Fixed(VARIANCE))
    likelihood = dataclasses.replace(spec.likelihood, noise_variance=Fixed(NOISE))
    return dataclasses.replace(spec, kernel=kernel, likelihood=likelihood)


def _mixture_and_errors(means, variances, chains):
    """Mixture mean and sd over draws ``[S, n]`` and their Monte Carlo standard errors.

    The mixture's mean is E[m_s] and its variance E[w_s] − E[m_s]² with w_s = v_s + m_s²; each
    expectation's s.e. is its draws' sd over √ESS (ESS of those draws over the chains), and the
    variance's s.e. is taken as s.e.(E[w]) + 2 |E[m]| s.e.(E[m]) (a bound on the delta method's),
    the sd's as s.e.(var) / (2 sd)."""
    m, v = np.asarray(means, np.float64), np.asarray(variances, np.float64)
    w = v + m**2

    def mean_and_se(a):
        ess = effective_sample_size(a.reshape(chains, -1, a.shape[-1]))  # [n]
        return a.mean(axis=0), a.std(axis=0) / np.sqrt(ess)

    mean, se_mean = mean_and_se(m)
    second, se_second = mean_and_se(w)
    sd = np.sqrt(second - mean**2)
    se_sd = (se_second + 2 * np.abs(mean) * se_mean) / (2 * sd) + 1e-12
    return mean, sd, se_mean, se_sd


def test_whitened_inducing_nuts_with_z_at_the_data_is_the_exact_gp():
    """Fixed hyperparameters, Z = X: the posterior of v is Gaussian and p(f* | y) is the exact GP's."""
    X, y = _data()
    spec = _spec(Fixed(0.8), num_inducing=X.shape[0])
    init = gpzoo.fit(spec, X, y, steps=0, progress=False)
    init.params["inducing.Z"] = X.copy()  # Z = X exactly
    with warnings.catch_warnings():
        warnings.simplefilter("error", SamplerWarning)
        res = sample(init, None, None, num_warmup=300, num_samples=400, num_chains=4, method="whitened-inducing",
                     chain_method="vectorized")
    assert res.method == "whitened-inducing" and res.diagnostics["divergences"] == 0
    # per-draw moments of p(f* | u_s): the mixture over draws is the sampler's p(f* | y)
    from gpzoo.inference.mcmc import _flat, _whitened_moments  # noqa: PLC0415

    m, v = _whitened_moments(init.family, res.fixed, {}, jnp.asarray(_flat(res.samples["v"])), jnp.asarray(X_STAR))
    mean, sd, se_mean, se_sd = _mixture_and_errors(m[..., 0], v[..., 0], chains=4)
    kernel = SquaredExponential(lengthscale=0.8, variance=VARIANCE)
    exact_mean, exact_var = (np.asarray(a) for a in exact_posterior(kernel, NOISE, X, y, X_STAR))
    assert np.all(np.abs(mean - exact_mean) < 4 * se_mean), (mean, exact_mean, se_mean)
    assert np.all(np.abs(sd - np.sqrt(exact_var)) < 4 * se_sd), (sd, np.sqrt(exact_var), se_sd)
    pred = res.predict(X_STAR)  # the same mixture through the public method
    np.testing.assert_allclose(pred.f_mean[:, 0], mean, rtol=1e-10)
    np.testing.assert_allclose(pred.f_var[:, 0], sd**2, rtol=1e-10)


def _quadrature(X, y, prior, grid):
    """p(f* | y) = ∫ p(f* | y, ℓ) p(ℓ | y) dℓ on a fine grid of log ℓ: mixture mean and sd at X_STAR, E[ℓ]."""
    def at(ell):
        kernel = SquaredExponential(lengthscale=ell, variance=VARIANCE)
        # the prior density in log ℓ (the grid's variable) is p(ℓ)·ℓ
        log_w = exact_log_marginal(kernel, NOISE + 1e-6, X, y) + prior.log_prob(ell) + jnp.log(ell)
        return log_w, *exact_posterior(kernel, NOISE + 1e-6, X, y, X_STAR)

    log_w, means, variances = (np.asarray(a) for a in jax.jit(jax.vmap(at))(jnp.asarray(grid)))
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    mean = w @ means
    var = w @ (variances + means**2) - mean**2
    return mean, np.sqrt(var), float(w @ grid)


def test_collapsed_nuts_matches_quadrature_and_works_with_arviz():
    X, y = _data()
    prior = dist.LogNormal(0.0, 0.5)
    spec = _spec(prior, num_inducing=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SamplerWarning)  # a healthy run raises none
        res = sample(spec, X, y, num_warmup=300, num_samples=500, num_chains=4, chain_method="vectorized")
    assert res.method == "collapsed"
    assert res.diagnostics["divergences"] == 0 and res.diagnostics["max_rhat"] < 1.01, res.diagnostics
    ells = res.samples["kernel.lengthscale"]  # [chains, draws]
    from gpzoo.inference.mcmc import _collapsed_moments  # noqa: PLC0415

    m, v = _collapsed_moments(res.spec, res.fixed, {"kernel.lengthscale": jnp.asarray(ells.reshape(-1))},
                              jnp.asarray(X), jnp.asarray(y), jnp.asarray(X_STAR))
    mean, sd, se_mean, se_sd = _mixture_and_errors(m, v, chains=4)
    grid = np.exp(np.linspace(np.log(0.05), np.log(20.0), 1500))
    ref_mean, ref_sd, ref_ell = _quadrature(X, y, prior, grid)
    assert np.all(np.abs(mean - ref_mean) < 4 * se_mean), (mean, ref_mean, se_mean)
    assert np.all(np.abs(sd - ref_sd) < 4 * se_sd), (sd, ref_sd, se_sd)
    ess_ell = float(effective_sample_size(ells[..., None].astype(np.float64))[0])
    assert abs(ells.mean() - ref_ell) < 4 * ells.std() / np.sqrt(ess_ell)

    # ArviZ: summary with r_hat and ESS, PSIS-LOO, and a comparison against an SVI fit of the same data
    dt = res.datatree
    summary = az.summary(dt)
    assert "kernel_lengthscale" in summary.index and {"r_hat", "ess_bulk"} <= set(summary.columns)
    assert float(summary.loc["kernel_lengthscale", "r_hat"]) < 1.01
    loo = az.loo(dt)
    assert np.isfinite(loo.elpd)
    svi = gpzoo.fit(_spec(0.8, num_inducing=8), X, y, steps=200, learning_rate=0.05, progress=False)
    table = az.compare({"nuts": dt, "svi": gpzoo.to_datatree(svi, X[:5], y[:5], num_draws=200)})
    assert set(table.index) == {"nuts", "svi"}
    pred = gpzoo.predict(res, X_STAR)  # gpzoo.predict takes a SampleResult too
    np.testing.assert_allclose(pred.f_mean[:, 0], mean, rtol=1e-10)


def test_a_sparse_convolutional_bernoulli_model_mixes(float32):
    """conv on 6×6 bar images, priors on its patch kernel's lengthscale and variance, whitened
    inducing outputs: every hyperparameter's chains mix (float32, the library's default precision)."""
    X, y = _bars(24, 0)
    y = y.astype(int)
    spec = zoo.get("conv", input_dim=36, task="binary", num_classes=2, image_shape=(6, 6), num_inducing=6)
    base = dataclasses.replace(spec.kernel.base_kernel, lengthscale=dist.LogNormal(0.0, 0.5),
                               variance=dist.LogNormal(0.0, 0.5))
    spec = dataclasses.replace(spec, kernel=dataclasses.replace(spec.kernel, base_kernel=base))
    res = sample(spec, X, y, num_warmup=200, num_samples=250, num_chains=4, chain_method="vectorized")
    assert res.method == "whitened-inducing"
    hypers = [k for k in res.samples if k.startswith("kernel.")]
    assert sorted(hypers) == ["kernel.base_kernel.lengthscale", "kernel.base_kernel.variance"]
    for name in hypers:
        assert res.diagnostics["rhat"][name] < 1.05 and res.diagnostics["ess"][name] > 100, (name, res.diagnostics)
    probs = res.predict(X[:10]).probs
    assert probs.shape == (10, 2) and np.allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert np.mean(probs.argmax(axis=1) == y[:10]) >= 0.8


def test_a_broken_sampler_setting_is_reported():
    """No step-size adaptation from a step of 1e-9: the chains do not move, every tree hits the maximum
    depth, and the warnings say so (the healthy runs above raise none)."""
    X, y = _data(12)
    spec = _spec(dist.LogNormal(0.0, 0.5), num_inducing=4)
    with pytest.warns(SamplerWarning) as record:
        res = sample(spec, X, y, num_warmup=0, num_samples=20, num_chains=2, step_size=1e-9, adapt_step_size=False,
                     max_tree_depth=3)
    text = " ".join(str(w.message) for w in record)
    assert "step size collapsed" in text and "maximum tree depth" in text
    assert res.diagnostics["treedepth_share"] == 1.0 and len(res.diagnostics["problems"]) >= 2


def test_bad_arguments_are_typed_errors():
    X, y = _data(10)
    spec = _spec(dist.LogNormal(0.0, 0.5), num_inducing=4)
    for kwargs, argument in (({"method": "hmc"}, "method"), ({"num_chains": 0}, "num_chains"),
                             ({"num_samples": 1}, "num_samples"), ({"target_accept_prob": 1.5}, "target_accept_prob"),
                             ({"chain_method": "threads"}, "chain_method")):
        with pytest.raises(InvalidArgumentError) as info:
            sample(spec, X, y, **kwargs)
        assert info.value.argument == argument
    binary = zoo.get("svgp-rbf", input_dim=1, task="binary", num_classes=2, num_inducing=4)
    with pytest.raises(InvalidArgumentError, match="Gaussian likelihood") as info:
        sample(binary, X, (y > 0).astype(int), method="collapsed")
    assert info.value.argument == "method"
    with pytest.raises(InvalidArgumentError) as info:
        sample("svgp-rbf", X, y)
    assert info.value.argument == "model"


def test_arviz_imported_before_numpyro_breaks_nothing():
    """arviz first, then NumPyro, then gpzoo (a notebook's usual order): a fit with a prior (an
    AutoNormal guide) and numpyro.factor work."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    code = ("import arviz, numpyro, numpyro.distributions as dist, dataclasses, numpy as np, gpzoo\n"
            "from gpzoo.models.kernels import SquaredExponential\n"
            "spec = gpzoo.zoo.get('svgp-rbf', input_dim=1, num_inducing=4)\n"
            "spec = dataclasses.replace(spec, kernel=SquaredExponential(lengthscale=dist.LogNormal(0.0, 1.0)))\n"
            "X = np.linspace(0, 1, 10)[:, None]\n"
            "res = gpzoo.fit(spec, X, np.sin(X[:, 0]), steps=2, progress=False)\n"
            "from numpyro.handlers import seed, trace\n"
            "tr = trace(seed(lambda: numpyro.factor('f', 1.0), 0)).get_trace()\n"
            "print('ok', np.isfinite(res.final_objective), float(tr['f']['fn'].log_prob(tr['f']['value'])))\n")
    import os  # noqa: PLC0415

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0 and "ok True 1.0" in proc.stdout, proc.stderr[-2000:]


def test_a_sampled_noise_variance_enters_the_prediction_draw_by_draw():
    """A prior on the likelihood's noise: each draw's likelihood is its own, so the predictive
    variance of y exceeds that of f by exactly the posterior mean of the noise variance."""
    X, y = _data(15)
    spec = _spec(Fixed(0.8), num_inducing=5)
    spec = dataclasses.replace(spec, likelihood=dataclasses.replace(spec.likelihood,
                                                                    noise_variance=dist.LogNormal(-3.0, 0.5)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SamplerWarning)  # a short run: only the predictive's algebra is checked
        res = sample(spec, X, y, num_warmup=50, num_samples=50, num_chains=2)
    noise = res.samples["likelihood.noise_variance"]
    assert res.method == "collapsed" and np.unique(noise).size > 1
    pred = gpzoo.predict(res, X_STAR)
    np.testing.assert_allclose(pred.y_var[:, 0] - pred.f_var[:, 0], noise.mean(), rtol=1e-8)
    assert res.datatree["log_likelihood"]["y"].shape == (2, 50, X.shape[0])
