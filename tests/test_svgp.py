"""The sparse variational GP core against exact references (float64)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from gpzoo.inference.elbo import FastELBO
from numpyro.distributions.kl import kl_divergence

from gpzoo.inference import evaluate_elbo, fit, predict
from gpzoo.inference.exact import collapsed_elbo, exact_log_marginal, exact_posterior, gaussian_log_density, optimal_q
from gpzoo.inference.guides import InducingPosterior, InducingPrior, sqrt_dense
from gpzoo.inference.inducing import InducingPoints
from gpzoo.inference.linalg import cholesky_with_jitter
from gpzoo.models import kernels, likelihoods, zoo
from gpzoo.models.kernels import Fixed

NOISE = 0.05
JITTER = 1e-10


def _regression(n=30, seed=0):
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(-3, 3, (n, 1)), axis=0)
    y = np.sin(2 * X[:, 0]) + np.sqrt(NOISE) * rng.normal(size=n)
    return X, y


def _fixed_spec(whiten=True, q_structure="full"):
    """SE kernel and Gaussian noise with hyperparameters held fixed (so q(u) is the only unknown)."""
    return zoo.ModelSpec(
        name="svgp-fixed",
        kernel=kernels.SquaredExponential(lengthscale=Fixed(0.8), variance=Fixed(1.3)),
        likelihood=likelihoods.Gaussian(noise_variance=Fixed(NOISE)),
        whiten=whiten,
        q_structure=q_structure,
        jitter=JITTER,
    )


def _with_q(res, q_mu, q_sqrt):
    res.params = {**res.params, "q_mu": np.asarray(q_mu), "q_sqrt": np.asarray(q_sqrt)}
    return res


@pytest.fixture(scope="module")
def data():
    return _regression()


@pytest.mark.parametrize("whiten", [True, False])
def test_elbo_with_optimal_q_equals_exact_marginal(data, whiten):
    X, y = data
    spec = _fixed_spec(whiten=whiten)
    res = fit(spec, X, y, steps=0, inducing=InducingPoints(jnp.asarray(X)), progress=False)
    kern = spec.kernel.resolved()
    q_mu, q_sqrt = optimal_q(kern, NOISE, jnp.asarray(X), jnp.asarray(X), jnp.asarray(y), whiten=whiten, jitter=JITTER)
    elbo = evaluate_elbo(_with_q(res, q_mu, q_sqrt)).elbo
    exact = float(exact_log_marginal(kern, NOISE, jnp.asarray(X), jnp.asarray(y)))
    assert abs(elbo - exact) / abs(exact) < 1e-6

    collapsed = float(collapsed_elbo(kern, NOISE, jnp.asarray(X), jnp.asarray(X), jnp.asarray(y), jitter=JITTER))
    assert abs(collapsed - exact) / abs(exact) < 1e-6

    X_new = np.linspace(-4, 4, 17)[:, None]
    pred = predict(res, X_new)
    mean, var = exact_posterior(kern, NOISE, jnp.asarray(X), jnp.asarray(y), jnp.asarray(X_new))
    np.testing.assert_allclose(pred.f_mean[:, 0], mean, atol=1e-6)
    np.testing.assert_allclose(pred.f_var[:, 0], var, atol=1e-6)
    np.testing.assert_allclose(pred.y_var[:, 0], var + NOISE, atol=1e-6)


def test_sparse_bounds_are_below_exact_and_collapsed_is_tightest(data):
    X, y = data
    spec = _fixed_spec()
    Z = X[::3]
    kern = spec.kernel.resolved()
    res = fit(spec, X, y, steps=0, inducing=InducingPoints(jnp.asarray(Z)), progress=False)
    q_mu, q_sqrt = optimal_q(kern, NOISE, jnp.asarray(Z), jnp.asarray(X), jnp.asarray(y), jitter=JITTER)
    elbo = evaluate_elbo(_with_q(res, q_mu, q_sqrt)).elbo
    collapsed = float(collapsed_elbo(kern, NOISE, jnp.asarray(Z), jnp.asarray(X), jnp.asarray(y), jitter=JITTER))
    exact = float(exact_log_marginal(kern, NOISE, jnp.asarray(X), jnp.asarray(y)))
    # with the optimal q the uncollapsed bound equals the collapsed one; both lie below log p(y)
    assert abs(elbo - collapsed) < 1e-6 * abs(exact)
    assert collapsed < exact
    # any other q is worse
    worse = evaluate_elbo(_with_q(res, q_mu * 0.9, q_sqrt)).elbo
    assert worse < elbo


def _random_q(rng, L, G, M, structure):
    q_mu = rng.normal(size=(L, G * M))
    if structure == "diag":
        return q_mu, np.exp(0.3 * rng.normal(size=(L, G * M)))
    if structure == "block":
        sq = np.tril(rng.normal(size=(L, G, M, M)) * 0.3)
        idx = np.arange(M)
        sq[..., idx, idx] = np.exp(0.2 * rng.normal(size=(L, G, M)))
        return q_mu, sq
    sq = np.tril(rng.normal(size=(L, G * M, G * M)) * 0.3)
    idx = np.arange(G * M)
    sq[..., idx, idx] = np.exp(0.2 * rng.normal(size=(L, G * M)))
    return q_mu, sq


@pytest.mark.parametrize("structure", ["full", "block", "diag"])
@pytest.mark.parametrize("whiten", [True, False])
def test_kl_matches_closed_form(structure, whiten):
    rng = np.random.default_rng(1)
    L, G, M = 2, 3, 4
    Z = rng.normal(size=(G, M, 2))
    Kuu = np.stack([np.asarray(kernels.SquaredExponential(lengthscale=1.5).K(z)) for z in Z])
    Luu, _ = cholesky_with_jitter(jnp.asarray(Kuu), 1e-8)
    q_mu, q_sqrt = _random_q(rng, L, G, M, structure)
    q = InducingPosterior(jnp.asarray(q_mu), jnp.asarray(q_sqrt), structure)
    p = InducingPrior(Luu, L, whiten)
    # dense reference: independent latent functions, block-diagonal prior covariance
    S_sqrt = np.asarray(sqrt_dense(jnp.asarray(q_sqrt), structure))
    P = np.eye(G * M) if whiten else np.asarray(jax.scipy.linalg.block_diag(*[Luu[g] @ Luu[g].T for g in range(G)]))
    expected = sum(
        float(kl_divergence(
            dist.MultivariateNormal(q_mu[l], scale_tril=S_sqrt[l]),
            dist.MultivariateNormal(np.zeros(G * M), covariance_matrix=P),
        ))
        for l in range(L)
    )
    np.testing.assert_allclose(float(kl_divergence(q, p)), expected, rtol=1e-9)
    # log densities agree with the dense MVN too (used by PSIS-LOO)
    u = q.sample(jax.random.PRNGKey(0), (5,))
    ref_q = sum(dist.MultivariateNormal(q_mu[l], scale_tril=S_sqrt[l]).log_prob(u[:, l]) for l in range(L))
    ref_p = sum(dist.MultivariateNormal(np.zeros(G * M), covariance_matrix=P).log_prob(u[:, l]) for l in range(L))
    np.testing.assert_allclose(q.log_prob(u), ref_q, rtol=1e-9)
    np.testing.assert_allclose(p.log_prob(u), ref_p, rtol=1e-9)


def test_whitened_and_unwhitened_give_same_elbo_for_equivalent_q(data):
    X, y = data
    Z = jnp.asarray(X[::2])
    elbos = []
    for whiten in (True, False):
        res = fit(_fixed_spec(whiten=whiten), X, y, steps=0, inducing=InducingPoints(Z), progress=False)
        rng = np.random.default_rng(3)
        v_mu, v_sqrt = _random_q(rng, 1, 1, Z.shape[0], "full")
        if not whiten:
            Luu, _ = cholesky_with_jitter(_fixed_spec().kernel.resolved().K(Z), JITTER)
            v_mu, v_sqrt = v_mu @ np.asarray(Luu).T, np.asarray(Luu) @ v_sqrt
        elbos.append(evaluate_elbo(_with_q(res, v_mu, v_sqrt)).elbo)
    np.testing.assert_allclose(elbos[0], elbos[1], rtol=1e-9)


def _loss(res, X, y, num_data, seed):
    fam = res.family
    return float(
        FastELBO().loss(jax.random.PRNGKey(seed), res.params, fam.model, fam.guide, jnp.asarray(X), jnp.asarray(y), num_data=num_data)
    )


def test_minibatch_elbo_is_unbiased_and_loss_is_deterministic(data):
    X, y = data
    spec = zoo.get("svgp-rbf", input_dim=1, num_inducing=8)
    res = fit(spec, X, y, steps=20, progress=False, seed=1)
    N = X.shape[0]
    full = -_loss(res, X, y, N, 0)
    # the analytic KL makes the loss independent of the PRNG key (no Monte Carlo fallback)
    assert _loss(res, X, y, N, 0) == _loss(res, X, y, N, 12345)
    np.testing.assert_allclose(full, evaluate_elbo(res).elbo, rtol=1e-10)
    # averaging the N/B-scaled minibatch estimate over a partition of the data gives the full ELBO
    perm = np.random.default_rng(0).permutation(N)
    estimates = [-_loss(res, X[idx], y[idx], N, 0) for idx in perm.reshape(6, 5)]
    np.testing.assert_allclose(np.mean(estimates), full, rtol=1e-10)
    assert np.std(estimates) > 0  # a single minibatch is a noisy estimate


def test_bernoulli_svgp_classifies_two_moons():
    from sklearn.datasets import make_moons

    X, y = make_moons(400, noise=0.15, random_state=0)
    X_test, y_test = make_moons(400, noise=0.15, random_state=1)
    spec = zoo.get("svgp-rbf", input_dim=2, task="binary", num_inducing=20)
    res = fit(spec, X, y, steps=400, batch_size=100, learning_rate=0.05, progress=False)
    probs = predict(res, X_test).probs
    accuracy = np.mean((probs[:, 1] > 0.5) == y_test)
    assert accuracy >= 0.95, accuracy  # stated goal: >= 95 % held-out accuracy on two moons
    assert res.objective_history[-20:].mean() > res.objective_history[:20].mean()


def test_hyperparameters_with_priors_are_sampled_and_fitted(data):
    X, y = data
    spec = zoo.ModelSpec(
        name="svgp-bayes",
        kernel=kernels.SquaredExponential(lengthscale=dist.LogNormal(0.0, 1.0), variance=1.0),
        likelihood=likelihoods.Gaussian(noise_variance=0.1),
        num_inducing=8,
    )
    res = fit(spec, X, y, steps=150, learning_rate=0.05, progress=False)
    assert any("lengthscale" in k for k in res.params)  # guide parameters of the sampled site
    est = evaluate_elbo(res, num_samples=8)
    assert est.num_samples == 8 and est.stderr > 0 and np.isfinite(est.elbo)
    pred = predict(res, X[:5])
    assert np.all(pred.f_var > 0)


def test_gaussian_log_density_differentiates_as_the_plain_cholesky_expression(precision):
    """The closed-form derivative of log N(y | 0, K) equals autodiff through the factorisation: value,
    gradient in K and y, and a Hessian-vector product (second order through the rule), in float32 and float64."""
    dtype, rtol = (jnp.float32, 5e-4) if precision == "float32" else (jnp.float64, 1e-9)
    rng = np.random.default_rng(3)
    A = rng.normal(size=(7, 7))
    K = jnp.asarray(A @ A.T / 7 + 0.3 * np.eye(7), dtype)
    y = jnp.asarray(rng.normal(size=7), dtype)
    V = jnp.asarray(rng.normal(size=(7, 7)), dtype)

    def plain(K, y):
        L = jnp.linalg.cholesky(K)
        a = jax.scipy.linalg.solve_triangular(L, y, lower=True)
        return -0.5 * (7 * np.log(2 * np.pi) + jnp.sum(a**2)) - jnp.sum(jnp.log(jnp.diagonal(L)))

    reference = jax.scipy.stats.multivariate_normal.logpdf(np.asarray(y, np.float64), np.zeros(7), np.asarray(K, np.float64))
    np.testing.assert_allclose(gaussian_log_density(K, y), reference, rtol=rtol)
    for ours, theirs in zip(jax.grad(gaussian_log_density, argnums=(0, 1))(K, y), jax.grad(plain, argnums=(0, 1))(K, y)):
        np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=rtol)
    hvp = [jax.jvp(lambda K: jax.grad(f)(K, y), (K,), (V,))[1] for f in (gaussian_log_density, plain)]
    np.testing.assert_allclose(hvp[0], hvp[1], rtol=10 * rtol, atol=10 * rtol)
    # batched, as the structure search evaluates its restarts
    batch = jax.vmap(jax.value_and_grad(gaussian_log_density))(jnp.stack([K, 2 * K]), jnp.stack([y, y]))
    np.testing.assert_allclose(batch[1][1], jax.grad(gaussian_log_density)(2 * K, y), rtol=rtol, atol=rtol)


def test_q_sqrt_is_optimised_on_its_diagonal_not_its_logarithm(precision):
    """q_sqrt's unconstrained form holds its entries themselves: a lower-triangular factor with a
    non-negative diagonal round-trips exactly, and a change of an unconstrained diagonal entry moves
    the factor's diagonal by the same amount at any scale (with exp(x) on the diagonal, a step at a
    standard deviation of 0.2 would move it a fifth as far)."""
    from numpyro.distributions import biject_to

    from gpzoo.inference.guides import Q_SQRT

    dtype = jnp.dtype(precision)
    to_sqrt = biject_to(Q_SQRT)
    factor = jnp.asarray([[0.2, 0.0, 0.0], [-0.7, 1.5, 0.0], [0.3, 0.1, 0.05]], dtype)
    raw = to_sqrt.inv(factor)
    assert raw.shape == (6,) and raw.dtype == dtype
    np.testing.assert_array_equal(to_sqrt(raw), factor)
    assert Q_SQRT(to_sqrt(jnp.linspace(-2.0, 2.0, 6, dtype=dtype)))  # any raw vector gives a valid factor
    slope = jax.jacfwd(lambda r: jnp.diagonal(to_sqrt(r)))(raw)[:, 3:]  # d diag / d raw diagonal entries
    np.testing.assert_array_equal(slope, np.eye(3, dtype=dtype))


def test_every_svgp_guide_declares_q_sqrt_with_the_linear_diagonal_parameterisation():
    """fit's SVGP family declares q_sqrt (full structure) under Q_SQRT (natural-gradient steps write q_sqrt
    back through the same transform: tests/test_natgrad.py's unit step reaches the collapsed bound)."""
    from gpzoo.inference.guides import Q_SQRT

    X, y = _regression()
    res = fit(zoo.get("svgp-rbf", input_dim=1, num_inducing=5), X, y, steps=0, progress=False)
    trace = numpyro.handlers.trace(numpyro.handlers.seed(res.family.guide, 0)).get_trace(jnp.asarray(X), jnp.asarray(y))
    assert trace["q_sqrt"]["kwargs"]["constraint"] is Q_SQRT
