"""The zoo models are generative NumPyro programs: the fast ELBO equals Trace_ELBO's expectation,
Predictive draws y, and NUTS on the same model agrees with the exact GP and with the SVI fit."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest
from numpyro.infer import MCMC, NUTS, Predictive, Trace_ELBO

from gpzoo.inference import fit, predict
from gpzoo.inference.elbo import FastELBO
from gpzoo.inference.exact import exact_posterior
from gpzoo.inference.fit import build_family
from gpzoo.inference.inducing import InducingPoints
from gpzoo.models import kernels, likelihoods, zoo
from gpzoo.models.kernels import Fixed

N, M = 24, 5

LIKELIHOODS = {
    "gaussian": (lambda: likelihoods.Gaussian(noise_variance=0.3), "regression"),
    "bernoulli-logit": (lambda: likelihoods.Bernoulli(link="logit"), "binary"),
    "bernoulli-probit": (lambda: likelihoods.Bernoulli(link="probit"), "binary"),
    "poisson": (likelihoods.Poisson, "count"),
    "softmax": (lambda: likelihoods.Softmax(num_classes=3, num_mc_samples=20), "multiclass"),
    "robustmax": (lambda: likelihoods.RobustMax(num_classes=3), "multiclass"),
    "one-hot-gaussian": (lambda: likelihoods.OneHotGaussian(num_classes=3, noise_variance=0.5), "multiclass"),
}


def _data(task, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (N, 2))
    f = np.sin(2 * X[:, 0]) + 0.5 * X[:, 1]
    y = {"regression": f + 0.3 * rng.normal(size=N), "binary": (f > 0).astype(float),
         "count": rng.poisson(np.exp(0.5 * f)).astype(float),
         "multiclass": np.digitize(f, [-0.5, 0.5]).astype(float)}[task]
    return X, y


def _random_q(family, rng):
    """Parameters of the family at a random q(u) (not an optimum: the identity must hold anywhere)."""
    with numpyro.handlers.seed(rng_seed=0), numpyro.handlers.trace() as tr:
        family.parts()
    params = {name: site["value"] for name, site in tr.items() if site["type"] == "param"}
    q_mu, q_sqrt = params["q_mu"], params["q_sqrt"]
    params["q_mu"] = jnp.asarray(rng.normal(0, 0.7, q_mu.shape))
    if family.spec.q_structure == "full":
        noise = np.tril(rng.normal(0, 0.2, q_sqrt.shape), -1)
        params["q_sqrt"] = jnp.asarray(noise) + 0.6 * q_sqrt
    return params


@pytest.mark.parametrize("whiten", [True, False], ids=["whitened", "unwhitened"])
@pytest.mark.parametrize("name", sorted(LIKELIHOODS))
def test_fast_elbo_equals_trace_elbo_in_expectation(name, whiten):
    """FastELBO and Trace_ELBO on the same generative model and guide agree within 3 Monte Carlo s.e.,
    on a subsample (N/B scaling) with a random q(u)."""
    make, task = LIKELIHOODS[name]
    X, y = _data(task)
    spec = zoo.ModelSpec(name="gen", kernel=kernels.SquaredExponential(lengthscale=0.9, variance=1.2),
                         likelihood=make(), whiten=whiten, num_inducing=M)
    num_latent = spec.likelihood.num_latent(getattr(spec.likelihood, "num_classes", None))
    family = build_family(spec, InducingPoints(jnp.asarray(X[:M])), num_latent)
    params = _random_q(family, np.random.default_rng(1))
    batch = slice(3, 15)  # a minibatch of 12 of the 24 points, scaled by N/B
    args = (jnp.asarray(X[batch]), jnp.asarray(y[batch]))
    keys = jax.random.split(jax.random.PRNGKey(7), 4000)

    @jax.jit
    def both(key):
        fast = -FastELBO().loss(key, params, family.model, family.guide, *args, num_data=N)
        trace = -Trace_ELBO().loss(key, params, family.model, family.guide, *args, num_data=N)
        return fast, trace

    fast, trace = (np.asarray(v) for v in jax.lax.map(both, keys))
    se = np.sqrt(trace.var() / len(trace) + fast.var() / len(fast))
    assert np.all(np.isfinite(fast)) and np.all(np.isfinite(trace))
    assert abs(fast.mean() - trace.mean()) < 3 * se, (fast.mean(), trace.mean(), se)
    assert fast.std() < 0.2 * trace.std()  # the closed forms remove most of the Monte Carlo noise


@pytest.mark.parametrize("name", ["gaussian", "bernoulli-logit", "softmax"])
def test_predictive_draws_y_with_the_data_shape(name):
    make, task = LIKELIHOODS[name]
    X, y = _data(task)
    spec = zoo.ModelSpec(name="gen", kernel=kernels.SquaredExponential(), likelihood=make(), num_inducing=M)
    res = fit(spec, X, y, steps=5, progress=False)
    params = {k: jnp.asarray(v) for k, v in res.params.items()}
    draws = Predictive(res.family.model, guide=res.family.guide, params=params, num_samples=6,
                       return_sites=["y", "f", "u"])(jax.random.PRNGKey(0), jnp.asarray(X))
    assert draws["y"].shape == (6, N)
    assert draws["f"].shape == (6, N, res.num_latent)
    support = {"regression": None, "binary": {0, 1}, "multiclass": {0, 1, 2}}[task]
    if support is not None:
        assert set(np.unique(np.asarray(draws["y"]))) <= support


#: Zoo models whose default Predictive output is checked (small, one per model family class).
PREDICTIVE_MODELS = ["svgp-rbf", "svgp-logistic-pg", "dkm"]


@pytest.mark.parametrize("name", PREDICTIVE_MODELS)
def test_default_predictive_returns_y_and_f_and_no_internal_sites(name):
    """``Predictive(res.family.model, guide=res.family.guide, params=res.params, num_samples=S)(key, X_new)``
    as the README shows it, with no return_sites: y ``[S, N]`` and f ``[S, N, L]``, nothing internal."""
    from test_contract import _bars, _spec  # noqa: PLC0415 - the contract's small image data and specs

    X, y = _bars(30, 0)
    res = fit(_spec(name), X, y, steps=0, batch_size=15, progress=False)  # the initial q: only the sites matter
    draws = Predictive(res.family.model, guide=res.family.guide, params=res.params, num_samples=3)(
        jax.random.PRNGKey(0), jnp.asarray(X[:5]))
    assert set(draws) == {"y", "f"}, sorted(draws)
    assert draws["y"].shape == (3, 5) and draws["f"].shape == (3, 5, res.num_latent)


def test_predictive_f_moments_match_q_f():
    """Monte Carlo moments of f from Predictive(model, guide) equal the closed-form q(f*) of predict."""
    X, y = _data("regression")
    spec = zoo.ModelSpec(name="gen", kernel=kernels.SquaredExponential(), likelihood=likelihoods.Gaussian(0.3),
                         num_inducing=M)
    res = fit(spec, X, y, steps=60, learning_rate=0.05, progress=False)
    X_new = np.linspace(-2, 2, 7)[:, None].repeat(2, axis=1)
    params = {k: jnp.asarray(v) for k, v in res.params.items()}
    S = 20000
    f = np.asarray(Predictive(res.family.model, guide=res.family.guide, params=params, num_samples=S, return_sites=["f"])(
        jax.random.PRNGKey(3), jnp.asarray(X_new))["f"][..., 0])  # [S, 7]
    pred = predict(res, X_new)
    se_mean = np.sqrt(pred.f_var[:, 0] / S)
    np.testing.assert_array_less(np.abs(f.mean(0) - pred.f_mean[:, 0]), 4 * se_mean)
    np.testing.assert_allclose(f.var(0), pred.f_var[:, 0], rtol=4 * np.sqrt(2 / S))


def test_nuts_on_the_generative_model_agrees_with_the_exact_gp_and_svi():
    """Small Gaussian problem, inducing points at the data, fixed hyperparameters: the NUTS posterior of
    f at test points equals the exact GP posterior within Monte Carlo error; the SVI optimum equals both."""
    import arviz as az

    noise, n = 0.1, 12
    rng = np.random.default_rng(4)
    X = np.sort(rng.uniform(-2, 2, (n, 1)), axis=0)
    y = np.sin(2 * X[:, 0]) + np.sqrt(noise) * rng.normal(size=n)
    X_new = np.array([[-1.5], [0.1], [1.7]])
    kernel = kernels.SquaredExponential(lengthscale=Fixed(0.7), variance=Fixed(1.0))
    spec = zoo.ModelSpec(name="nuts", kernel=kernel, likelihood=likelihoods.Gaussian(noise_variance=Fixed(noise)),
                         num_inducing=n, jitter=1e-8)
    inducing = InducingPoints(Fixed(jnp.asarray(X)))
    family = build_family(spec, inducing, 1)

    mcmc = MCMC(NUTS(family.model, dense_mass=True, target_accept_prob=0.9), num_warmup=600, num_samples=1500,
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(0), jnp.asarray(X), jnp.asarray(y))
    u = mcmc.get_samples()["u"]  # [S, 1, n]
    with numpyro.handlers.seed(rng_seed=0):
        parts = family.prior_parts()
    cond_mean, cond_var = jax.vmap(lambda ui: family.conditional_given_u(parts, jnp.asarray(X_new), ui))(u)  # [S, 3, 1]
    nuts_mean = np.asarray(cond_mean[..., 0].mean(0))
    nuts_var = np.asarray(cond_var[..., 0].mean(0) + cond_mean[..., 0].var(0))

    exact_mean, exact_var = (np.asarray(v) for v in exact_posterior(kernel.resolved(), noise, jnp.asarray(X), jnp.asarray(y),
                                                                   jnp.asarray(X_new)))
    ess = np.asarray(numpyro.diagnostics.effective_sample_size(np.asarray(cond_mean[None, :, :, 0])))  # [3]
    assert np.all(ess > 200)
    np.testing.assert_array_less(np.abs(nuts_mean - exact_mean), 4 * np.sqrt(exact_var / ess))
    np.testing.assert_allclose(nuts_var, exact_var, rtol=4 * np.sqrt(2 / ess.min()))

    res = fit(spec, X, y, steps=1500, learning_rate=0.05, inducing=inducing, progress=False)
    pred = predict(res, X_new)
    np.testing.assert_allclose(pred.f_mean[:, 0], exact_mean, atol=2e-3)
    np.testing.assert_allclose(pred.f_var[:, 0], exact_var, rtol=2e-2, atol=1e-4)

    idata = az.from_numpyro(mcmc, log_likelihood=True)
    assert "log_likelihood" in idata.children and "y" in idata["log_likelihood"].data_vars
    assert idata["log_likelihood"]["y"].shape[-1] == n
