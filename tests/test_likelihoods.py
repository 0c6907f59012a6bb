"""Likelihoods: each expectation against brute force, each predictive normalised, bad labels rejected.

Monte Carlo references use NumPy draws (independent of the JAX code) and tolerances of
``Z`` standard errors of the reference (plus the estimator's own, for the MC likelihood).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, special, stats

from gpzoo.models.errors import DataError, HyperparameterError, InvalidArgumentError
from gpzoo.models.likelihoods import Bernoulli, Gaussian, Likelihood, OneHotGaussian, Poisson, RobustMax, Softmax
from gpzoo.models.likelihoods import _log_prob_is_max, _log_prob_is_max_all
from gpzoo.models.parameters import Fixed

Z = 5.0  # tolerance in standard errors; the RNG is seeded, so the tests are deterministic
NUM_REF = 200_000  # reference Monte Carlo draws per datum

MEAN = np.array([0.3, -1.2, 2.0, 0.0])  # [N]
VAR = np.array([0.5, 2.0, 0.1, 4.0])  # [N]

CLASS_MEAN = np.array([[0.3, 1.0, -1.0], [2.0, 0.0, 0.0], [-0.5, -0.4, 0.8]])  # [N, C]
CLASS_VAR = np.array([[0.5, 1.0, 2.0], [0.1, 3.0, 0.3], [1.0, 1.0, 1.0]])  # [N, C]
CLASS_Y = np.array([0, 2, 1])


def col(a):
    return jnp.asarray(a)[:, None]  # [N] -> [N, 1]


def latent_draws(mean, var, num=NUM_REF, seed=0):
    """Draws of f ~ N(mean, var): [num, *mean.shape]."""
    rng = np.random.default_rng(seed)
    return mean + np.sqrt(var) * rng.standard_normal((num, *np.shape(mean)))


def assert_matches_mc(estimate, samples, extra_se=0.0):
    """``estimate`` [N] equals the mean of ``samples`` [S, N] within Z standard errors."""
    se = samples.std(axis=0) / np.sqrt(samples.shape[0])
    np.testing.assert_array_less(np.abs(np.asarray(estimate) - samples.mean(axis=0)), Z * np.hypot(se, extra_se) + 1e-12)


def quad_expectation(g, mean, var):
    """E_N(f; mean, var)[g(f)] by adaptive quadrature, per datum."""
    return np.array(
        [
            integrate.quad(lambda f: g(f, i) * stats.norm.pdf(f, m, np.sqrt(v)), -np.inf, np.inf, epsabs=1e-12)[0]
            for i, (m, v) in enumerate(zip(mean, var))
        ]
    )


# --------------------------------------------------------------------------- Gaussian


def test_gaussian_expectation_equals_closed_form_and_monte_carlo():
    lik = Gaussian(noise_variance=0.3)
    y = np.array([0.1, -1.0, 2.5, 0.7])
    ve = lik.variational_expectation(jnp.asarray(y), col(MEAN), col(VAR))
    closed = stats.norm.logpdf(y, MEAN, np.sqrt(0.3)) - 0.5 * VAR / 0.3
    np.testing.assert_allclose(ve, closed, rtol=1e-12)
    f = latent_draws(MEAN, VAR)
    assert_matches_mc(ve, stats.norm.logpdf(y, f, np.sqrt(0.3)))
    np.testing.assert_allclose(
        lik.predict_log_density(jnp.asarray(y), col(MEAN), col(VAR)), stats.norm.logpdf(y, MEAN, np.sqrt(VAR + 0.3))
    )


def test_gaussian_accepts_fixed_noise_outside_a_model():
    lik = Gaussian(noise_variance=Fixed(0.3))
    y = jnp.asarray([0.1, -1.0, 2.5, 0.7])
    np.testing.assert_allclose(
        lik.variational_expectation(y, col(MEAN), col(VAR)),
        Gaussian(noise_variance=0.3).variational_expectation(y, col(MEAN), col(VAR)),
    )


# --------------------------------------------------------------------------- Bernoulli


def bernoulli_log_lik(link, y, f):
    sign = 2.0 * y - 1.0
    return special.log_ndtr(sign * f) if link == "probit" else -np.logaddexp(0.0, -sign * f)


@pytest.mark.parametrize("link", ["logit", "probit"])
def test_bernoulli_expectation_matches_quadrature_and_monte_carlo(link):
    lik = Bernoulli(link=link)
    y = np.array([1.0, 0.0, 0.0, 1.0])
    ve = lik.variational_expectation(jnp.asarray(y), col(MEAN), col(VAR))
    assert ve.shape == (4,)
    assert_matches_mc(ve, bernoulli_log_lik(link, y, latent_draws(MEAN, VAR)))
    # the default 20-point rule is within ~1e-6 of the exact integral; more points converge to it
    exact = quad_expectation(lambda f, i: bernoulli_log_lik(link, y[i], f), MEAN, VAR)
    np.testing.assert_allclose(ve, exact, atol=1e-5)
    fine = Bernoulli(link=link, num_gauss_hermite=80).variational_expectation(jnp.asarray(y), col(MEAN), col(VAR))
    np.testing.assert_allclose(fine, exact, atol=1e-10)


def test_probit_predictive_is_analytic():
    p1 = Bernoulli(link="probit").predict_probs(col(MEAN), col(VAR))[:, 1]
    np.testing.assert_allclose(p1, stats.norm.cdf(MEAN / np.sqrt(1.0 + VAR)), rtol=1e-12)


@pytest.mark.parametrize("link", ["logit", "probit"])
def test_bernoulli_predictive_normalised_and_matches_monte_carlo(link):
    lik = Bernoulli(link=link)
    probs = lik.predict_probs(col(MEAN), col(VAR))  # [N, 2]
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-12)
    p0 = np.exp(lik.predict_log_density(jnp.zeros(4), col(MEAN), col(VAR)))
    p1 = np.exp(lik.predict_log_density(jnp.ones(4), col(MEAN), col(VAR)))
    np.testing.assert_allclose(p0 + p1, 1.0, atol=1e-12)
    np.testing.assert_allclose(p1, probs[:, 1], rtol=1e-12)

    mean, var = lik.predict_mean_and_var(col(MEAN), col(VAR))
    assert mean.shape == var.shape == (4, 1)
    p_given_f = np.exp(bernoulli_log_lik(link, 1.0, latent_draws(MEAN, VAR)))  # [S, N]
    assert_matches_mc(mean[:, 0], p_given_f)
    np.testing.assert_allclose(var[:, 0], mean[:, 0] * (1.0 - mean[:, 0]))


# --------------------------------------------------------------------------- Poisson


@pytest.mark.parametrize("binsize", [1.0, 2.5])
def test_poisson_expectation_equals_closed_form_and_monte_carlo(binsize):
    lik = Poisson(binsize=binsize)
    y = np.array([0.0, 3.0, 7.0, 1.0])
    ve = lik.variational_expectation(jnp.asarray(y), col(MEAN), col(VAR))
    closed = y * (MEAN + np.log(binsize)) - binsize * np.exp(MEAN + VAR / 2) - special.gammaln(y + 1)
    np.testing.assert_allclose(ve, closed, rtol=1e-12)
    f = latent_draws(MEAN, VAR)
    assert_matches_mc(ve, stats.poisson.logpmf(y, binsize * np.exp(f)))


def test_poisson_predictive_moments_match_monte_carlo():
    lik = Poisson(binsize=2.5)
    mean, var = lik.predict_mean_and_var(col(MEAN), col(VAR))
    rng = np.random.default_rng(1)
    counts = rng.poisson(2.5 * np.exp(latent_draws(MEAN, VAR, num=400_000)))  # [S, N]
    assert_matches_mc(mean[:, 0], counts)
    centred_sq = (counts - counts.mean(0)) ** 2
    assert_matches_mc(var[:, 0], centred_sq)


def test_poisson_log_density_sums_to_one_and_matches_monte_carlo():
    lik = Poisson(binsize=2.5)
    mean, var = MEAN[:3], VAR[:3]
    # the outermost quadrature node of datum 1 has rate 2.5 e^{-1.2 + 7.6 √2} ≈ 3e4: sum far beyond it
    support = np.arange(60_000.0)
    log_p = lik.predict_log_density(
        jnp.repeat(support, 3), col(np.tile(mean, support.size)), col(np.tile(var, support.size))
    ).reshape(support.size, 3)  # [Y, N]
    np.testing.assert_allclose(np.exp(log_p).sum(0), 1.0, atol=1e-10)

    y = np.array([0.0, 3.0, 7.0])
    pmf = stats.poisson.pmf(y, 2.5 * np.exp(latent_draws(mean, var)))  # [S, N]
    assert_matches_mc(np.exp(lik.predict_log_density(jnp.asarray(y), col(mean), col(var))), pmf)


# --------------------------------------------------------------------------- Softmax


def softmax_reference(mean, var, num=NUM_REF):
    """Reference draws of softmax(f) [S, N, C]."""
    f = latent_draws(mean, var, num=num)
    return np.exp(f - special.logsumexp(f, axis=-1, keepdims=True))


def test_softmax_expectation_matches_brute_force_monte_carlo():
    lik = Softmax(num_classes=3, num_mc_samples=5000)
    assert lik.stochastic_expectation
    ve = lik.variational_expectation(jnp.asarray(CLASS_Y), jnp.asarray(CLASS_MEAN), jnp.asarray(CLASS_VAR), key=jax.random.PRNGKey(0))
    assert ve.shape == (3,)
    log_p = np.log(softmax_reference(CLASS_MEAN, CLASS_VAR))[:, np.arange(3), CLASS_Y]  # [S, N]
    assert_matches_mc(ve, log_p, extra_se=log_p.std(0) / np.sqrt(lik.num_mc_samples))


def test_softmax_draws_its_noise_once_for_both_precisions(float32):
    """ε is drawn in float32 and converted, so float32 and float64 see the same draws: the two
    estimates differ only by the float32 arithmetic on them (a few ulps), not by Monte Carlo noise."""
    lik = Softmax(num_classes=3, num_mc_samples=2000)
    key = jax.random.PRNGKey(4)
    ve32 = lik.variational_expectation(jnp.asarray(CLASS_Y), jnp.asarray(CLASS_MEAN, jnp.float32),
                                       jnp.asarray(CLASS_VAR, jnp.float32), key=key)
    jax.config.update("jax_enable_x64", True)
    ve64 = lik.variational_expectation(jnp.asarray(CLASS_Y), jnp.asarray(CLASS_MEAN, jnp.float64),
                                       jnp.asarray(CLASS_VAR, jnp.float64), key=key)
    assert ve32.dtype == jnp.float32 and ve64.dtype == jnp.float64
    mc_se = np.log(softmax_reference(CLASS_MEAN, CLASS_VAR, num=2000))[:, np.arange(3), CLASS_Y].std(0) / np.sqrt(2000)
    np.testing.assert_allclose(ve32, ve64, rtol=1e-5)
    assert np.all(np.abs(np.asarray(ve32, np.float64) - np.asarray(ve64)) < 1e-3 * mc_se)


def test_softmax_estimates_are_those_of_their_draws(precision):
    """Each estimate is the stated function of its S draws f = μ + σ ε, ε = draws.normal(key, [C, S, N]):
    the mean of log softmax(f)_y, the mean of softmax(f) and log mean exp log softmax(f)_y, recomputed here
    from the same ε in NumPy (float64); in float32 and float64, and with softmax arguments of ±1e3 (no overflow)."""
    from gpzoo.models import draws

    dtype, rtol = (np.float32, 2e-5) if precision == "float32" else (np.float64, 1e-12)
    lik = Softmax(num_classes=3, num_mc_samples=7)
    key = jax.random.PRNGKey(5)
    for scale in (1.0, 1e3):
        mean, var = scale * CLASS_MEAN, CLASS_VAR
        eps = np.asarray(draws.normal(key, (3, 7, 3), jnp.float32), np.float64)  # [C, S, N]
        f = np.moveaxis(mean, -1, 0)[:, None] + np.sqrt(np.moveaxis(var, -1, 0))[:, None] * eps  # [C, S, N]
        log_p = f - special.logsumexp(f, axis=0)  # [C, S, N]
        log_p_y = log_p[CLASS_Y, :, np.arange(3)].T  # [S, N]
        args = (jnp.asarray(mean, dtype), jnp.asarray(var, dtype))
        ve = lik.variational_expectation(jnp.asarray(CLASS_Y), *args, key=key)
        probs = lik.predict_probs(*args, key=key)
        log_density = lik.predict_log_density(jnp.asarray(CLASS_Y), *args, key=key)
        atol = rtol * scale
        np.testing.assert_allclose(ve, log_p_y.mean(0), rtol=rtol, atol=atol)
        np.testing.assert_allclose(probs, np.exp(log_p).mean(1).T, rtol=rtol, atol=rtol)
        np.testing.assert_allclose(log_density, special.logsumexp(log_p_y, axis=0) - np.log(7), rtol=rtol, atol=atol)


def test_softmax_expectation_needs_a_key():
    with pytest.raises(InvalidArgumentError) as info:
        Softmax(num_classes=3).variational_expectation(jnp.asarray(CLASS_Y), jnp.asarray(CLASS_MEAN), jnp.asarray(CLASS_VAR))
    assert info.value.argument == "key"


def test_softmax_predictive_normalised_and_matches_monte_carlo():
    lik = Softmax(num_classes=3, num_mc_samples=5000)
    mean, var = jnp.asarray(CLASS_MEAN), jnp.asarray(CLASS_VAR)
    probs = lik.predict_probs(mean, var, key=jax.random.PRNGKey(3))  # [N, C]
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-12)
    reference = softmax_reference(CLASS_MEAN, CLASS_VAR)  # [S, N, C]
    extra = reference.std(0) / np.sqrt(lik.num_mc_samples)
    for c in range(3):
        assert_matches_mc(probs[:, c], reference[:, :, c], extra_se=extra[:, c])

    # the same draws give every class's log density: Σ_c p(c) = 1 and p(c) = predict_probs
    log_p = np.stack(
        [lik.predict_log_density(jnp.full(3, c), mean, var, key=jax.random.PRNGKey(3)) for c in range(3)], axis=-1
    )
    np.testing.assert_allclose(np.exp(log_p).sum(-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(np.exp(log_p), probs, rtol=1e-10)

    p, v = lik.predict_mean_and_var(mean, var)  # default key
    np.testing.assert_allclose(p.sum(-1), 1.0, atol=1e-12)
    np.testing.assert_allclose(v, p * (1.0 - p))


# --------------------------------------------------------------------------- RobustMax


# q(f) variances of one datum's classes within a factor ~4 of each other, as with a shared kernel
ROBUST_VAR = np.array([[0.5, 1.0, 2.0], [0.8, 1.5, 0.6], [1.0, 1.0, 1.0]])  # [N, C]


def robustmax_log_lik(y, f, epsilon):
    """log p(y|f) [S, N] for draws f [S, N, C]."""
    num_classes = f.shape[-1]
    is_max = np.argmax(f, axis=-1) == y
    return np.where(is_max, np.log1p(-epsilon), np.log(epsilon / (num_classes - 1)))


@pytest.mark.parametrize("epsilon", [Fixed(1e-3), 0.05])
def test_robustmax_expectation_matches_monte_carlo(epsilon):
    lik = RobustMax(num_classes=3, epsilon=epsilon)
    ve = lik.variational_expectation(jnp.asarray(CLASS_Y), jnp.asarray(CLASS_MEAN), jnp.asarray(ROBUST_VAR))
    assert ve.shape == (3,)
    eps = epsilon.value if isinstance(epsilon, Fixed) else epsilon
    assert_matches_mc(ve, robustmax_log_lik(CLASS_Y, latent_draws(CLASS_MEAN, ROBUST_VAR), eps))


def robustmax_two_class_closed_form(y, mean, var, epsilon):
    """C = 2: P(f_y is the max) = Φ((μ_y − μ_o) / √(σ_y² + σ_o²)) exactly."""
    rows, other = np.arange(len(y)), 1 - y
    p_max = stats.norm.cdf((mean[rows, y] - mean[rows, other]) / np.sqrt(var[rows, y] + var[rows, other]))
    return p_max * np.log1p(-epsilon) + (1 - p_max) * np.log(epsilon)


def test_robustmax_two_classes_equals_closed_form():
    mean, var, y = CLASS_MEAN[:, :2], ROBUST_VAR[:, :2], np.array([0, 1, 1])
    ve = RobustMax(num_classes=2, epsilon=0.05).variational_expectation(jnp.asarray(y), jnp.asarray(mean), jnp.asarray(var))
    np.testing.assert_allclose(ve, robustmax_two_class_closed_form(y, mean, var, 0.05), atol=1e-8)


def test_robustmax_quadrature_converges_when_variances_differ_widely():
    # σ_y ≫ σ_other makes the integrand a sharp step: the 20-point rule is off by ~2e-2 here and
    # more nodes converge to the closed form (the documented limit of the GPflow-style rule)
    mean, var, y = np.array([[2.0, 0.0]]), np.array([[0.1, 3.0]]), np.array([1])
    closed = robustmax_two_class_closed_form(y, mean, var, 0.05)
    errors = []
    for num_points in (20, 200):
        lik = RobustMax(num_classes=2, epsilon=0.05, num_gauss_hermite=num_points)
        ve = lik.variational_expectation(jnp.asarray(y), jnp.asarray(mean), jnp.asarray(var))
        errors.append(abs(float(ve[0]) - closed[0]))
    assert errors[0] > 1e-3
    assert errors[1] < 1e-6


def test_robustmax_predictive_normalised_and_matches_monte_carlo():
    lik = RobustMax(num_classes=3, epsilon=0.05)
    mean, var = jnp.asarray(CLASS_MEAN), jnp.asarray(ROBUST_VAR)
    probs = lik.predict_probs(mean, var)  # [N, C]
    assert probs.shape == (3, 3)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-12)  # renormalised over classes
    f = latent_draws(CLASS_MEAN, ROBUST_VAR)
    for c in range(3):
        assert_matches_mc(probs[:, c], np.exp(robustmax_log_lik(c, f, 0.05)))
    log_p = jax.vmap(lambda c: lik.predict_log_density(jnp.full(3, c), mean, var), out_axes=1)(jnp.arange(3))
    np.testing.assert_allclose(np.exp(log_p), probs, rtol=1e-12)
    p, v = lik.predict_mean_and_var(mean, var)
    np.testing.assert_allclose(v, p * (1.0 - p))


def test_robustmax_predictive_sums_to_one_where_the_quadrature_errs():
    """σ_0 ≪ σ_1: each class's 20-point rule errs by ~1e-2, the renormalised probabilities do not."""
    lik = RobustMax(num_classes=2, epsilon=0.05)
    mean, var = jnp.asarray([[2.0, 0.0]]), jnp.asarray([[0.1, 3.0]])
    raw = jax.vmap(lambda c: jnp.exp(_log_prob_is_max(jnp.full(1, c), mean, var, lik.num_gauss_hermite)))(jnp.arange(2))
    assert abs(float(raw.sum()) - 1.0) > 1e-3
    np.testing.assert_allclose(lik.predict_probs(mean, var).sum(-1), 1.0, atol=1e-12)
    # the renormalised probabilities are closer to the closed form than the raw ones
    closed_p1 = stats.norm.cdf((0.0 - 2.0) / np.sqrt(0.1 + 3.0))  # P(f_1 > f_0) exactly
    p1 = float(np.exp(_log_prob_is_max_all(mean, var, lik.num_gauss_hermite))[0, 1])
    assert abs(p1 - closed_p1) < abs(float(raw[1, 0]) - closed_p1)


def test_robustmax_epsilon_is_fixed_by_default_and_trainable_when_a_number():
    assert isinstance(RobustMax(num_classes=3).epsilon, Fixed)
    assert jax.tree_util.tree_leaves(RobustMax(num_classes=3, epsilon=0.01).realise("lik"))  # a param site
    with pytest.raises(HyperparameterError):
        RobustMax(num_classes=3, epsilon=0.0)


# --------------------------------------------------------------------------- OneHotGaussian


def test_one_hot_gaussian_expectation_is_the_sum_of_per_class_gaussian_terms():
    """E_q[log p(e_y|f)] = Σ_c Gaussian term with target 1[y = c] (van der Wilk et al. 2018, §5.2)."""
    lik = OneHotGaussian(num_classes=3, noise_variance=0.3)
    mean, var = jnp.asarray(CLASS_MEAN), jnp.asarray(CLASS_VAR)
    ve = lik.variational_expectation(jnp.asarray(CLASS_Y), mean, var)
    onehot = np.eye(3)[CLASS_Y]  # [N, C]
    per_class = [Gaussian(noise_variance=0.3).variational_expectation(jnp.asarray(onehot[:, c]), mean[:, c:c + 1], var[:, c:c + 1])
                 for c in range(3)]
    np.testing.assert_allclose(ve, np.sum(per_class, axis=0), rtol=1e-12)
    f = latent_draws(CLASS_MEAN, CLASS_VAR)  # [S, N, C]
    log_lik = stats.norm.logpdf(onehot, f, np.sqrt(0.3)).sum(-1)  # [S, N]
    assert_matches_mc(ve, log_lik)


def test_one_hot_gaussian_class_probabilities_are_the_probability_of_the_argmax():
    lik = OneHotGaussian(num_classes=3, noise_variance=0.3)
    mean, var = jnp.asarray(CLASS_MEAN), jnp.asarray(ROBUST_VAR)
    probs = lik.predict_probs(mean, var)  # [N, C]
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-12)
    winners = np.argmax(latent_draws(CLASS_MEAN, ROBUST_VAR), axis=-1)  # [S, N]
    for c in range(3):
        assert_matches_mc(probs[:, c], (winners == c).astype(float))
    log_p = jax.vmap(lambda c: lik.predict_log_density(jnp.full(3, c), mean, var), out_axes=1)(jnp.arange(3))
    np.testing.assert_allclose(np.exp(log_p), probs, rtol=1e-10)
    m, v = lik.predict_mean_and_var(mean, var)  # Gaussian predictive of the one-hot vector
    np.testing.assert_allclose(m, mean)
    np.testing.assert_allclose(v, var + 0.3)


def test_one_hot_gaussian_log_density_stays_finite_when_the_label_is_far_from_the_max():
    lik = OneHotGaussian(num_classes=3)
    mean, var = jnp.asarray([[40.0, -40.0, 0.0]]), jnp.asarray([[1e-3, 1e-3, 1e-3]])
    log_p = lik.predict_log_density(jnp.asarray([1]), mean, var)
    assert np.isfinite(log_p).all() and float(log_p[0]) < -100.0


# --------------------------------------------------------------------------- contract


def all_likelihoods():
    """(likelihood, targets [N], mean [N, L], var [N, L]) for every class."""
    mean1, var1 = col(MEAN), col(VAR)
    cmean, cvar = jnp.asarray(CLASS_MEAN), jnp.asarray(CLASS_VAR)
    return [
        (Gaussian(noise_variance=0.3), jnp.asarray([0.1, -1.0, 2.5, 0.7]), mean1, var1),
        (Bernoulli(link="logit"), jnp.asarray([1.0, 0.0, 0.0, 1.0]), mean1, var1),
        (Bernoulli(link="probit"), jnp.asarray([1.0, 0.0, 0.0, 1.0]), mean1, var1),
        (Poisson(binsize=2.0), jnp.asarray([0.0, 3.0, 7.0, 1.0]), mean1, var1),
        (Softmax(num_classes=3, num_mc_samples=50), jnp.asarray(CLASS_Y), cmean, cvar),
        (RobustMax(num_classes=3), jnp.asarray(CLASS_Y), cmean, cvar),
        (OneHotGaussian(num_classes=3), jnp.asarray(CLASS_Y), cmean, cvar),
    ]


def _name(case):
    lik = case[0]
    return type(lik).__name__ + (f"-{lik.link}" if isinstance(lik, Bernoulli) else "")


@pytest.mark.parametrize("case", all_likelihoods(), ids=_name)
def test_shapes_and_jit(case):
    lik, y, mean, var = case
    key = jax.random.PRNGKey(0)
    num_data, num_latent = mean.shape
    assert lik.num_latent() == num_latent
    ve = jax.jit(lambda y, m, v: lik.variational_expectation(y, m, v, key=key))(y, mean, var)  # inside a model's jit
    assert ve.shape == (num_data,)
    assert lik.predict_log_density(y, mean, var, key=key).shape == (num_data,)
    p_mean, p_var = lik.predict_mean_and_var(mean, var)
    assert p_mean.shape == p_var.shape == mean.shape
    assert np.all(np.asarray(p_var) >= 0)
    if lik.task in ("binary", "multiclass"):
        assert lik.predict_probs(mean, var).shape == (num_data, max(num_latent, 2))
    else:
        with pytest.raises(NotImplementedError):
            lik.predict_probs(mean, var)


@pytest.mark.parametrize("case", all_likelihoods(), ids=_name)
def test_float32_in_float32_out(case):
    lik, y, mean, var = case
    mean, var, key = mean.astype(jnp.float32), var.astype(jnp.float32), jax.random.PRNGKey(0)
    both = jax.jit(lambda m, v: (lik.variational_expectation(y, m, v, key=key), lik.predict_log_density(y, m, v, key=key)))
    assert [out.dtype for out in both(mean, var)] == [jnp.float32, jnp.float32]


@pytest.mark.parametrize("case", all_likelihoods(), ids=_name)
def test_gradients_finite_for_extreme_means(case):
    lik, y, mean, var = case
    extreme = jnp.where(jnp.arange(mean.size).reshape(mean.shape) % 2 == 0, 30.0, -30.0)  # ±30

    def objective(m, v):
        key = jax.random.PRNGKey(0)
        return jnp.sum(lik.variational_expectation(y, m, v, key=key) + lik.predict_log_density(y, m, v, key=key))

    value, grads = jax.jit(jax.value_and_grad(objective, argnums=(0, 1)))(extreme, var)
    assert np.isfinite(value)
    for g in grads:
        assert np.all(np.isfinite(g))


BAD_LABELS = [
    (Bernoulli(), [0.0, 2.0]),
    (Bernoulli(link="probit"), [0.5, 1.0]),
    (Bernoulli(), [-1.0, 1.0]),
    (Poisson(), [1.0, -1.0]),
    (Poisson(), [1.5, 2.0]),
    (Softmax(num_classes=3), [0, 3]),
    (Softmax(num_classes=3), [-1, 2]),
    (RobustMax(num_classes=3), [0.5, 1.0]),
    (RobustMax(num_classes=3), [0, 7]),
    (OneHotGaussian(num_classes=3), [0, 1.5]),
    (Gaussian(), [0.0, np.nan]),
]


@pytest.mark.parametrize(("lik", "y"), BAD_LABELS, ids=lambda v: type(v).__name__ if isinstance(v, Likelihood) else str(v))
def test_labels_outside_support_raise_data_error(lik, y):
    with pytest.raises(DataError) as info:
        lik.validate_targets(np.asarray(y))
    assert info.value.argument == "y"


def test_valid_labels_pass_validation():
    np.testing.assert_array_equal(Bernoulli().validate_targets([0, 1, 1]), [0.0, 1.0, 1.0])
    np.testing.assert_array_equal(Poisson().validate_targets([0, 4, 12]), [0.0, 4.0, 12.0])
    labels = Softmax(num_classes=3).validate_targets([0.0, 2.0, 1.0])
    assert labels.dtype.kind == "i"
    np.testing.assert_array_equal(labels, [0, 2, 1])


def test_invalid_configuration_raises():
    with pytest.raises(InvalidArgumentError) as info:
        Bernoulli(link="cloglog")
    assert info.value.argument == "link"
    with pytest.raises(InvalidArgumentError):
        Softmax(num_classes=1)
    with pytest.raises(InvalidArgumentError):
        Poisson(binsize=0.0)
    with pytest.raises(InvalidArgumentError) as info:
        Softmax(num_classes=3).num_latent(num_classes=4)
    assert info.value.argument == "num_classes"
    assert RobustMax(num_classes=4).num_latent(4) == 4
