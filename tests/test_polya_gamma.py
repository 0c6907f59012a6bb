"""PolyaGamma distribution, its KL and the PG logistic bound (inference/polya_gamma.py).

Reference: the ``polyagamma`` package (density and sampler, NumPy). float64 throughout (conftest).
Sampling tests share one batched draw of 20,000 samples per (b, c) (fixture ``draws``).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest
from numpyro.distributions.kl import kl_divergence
from numpyro.infer import SVI, TraceMeanField_ELBO
from polyagamma import polyagamma_pdf, random_polyagamma
from scipy import integrate, stats

from gpzoo.inference.polya_gamma import PolyaGamma, optimal_c, pg_logistic_bound
from gpzoo.models.errors import DataError, HyperparameterError, InvalidArgumentError

B_VALUES = (1.0, 2.0, 3.5)
C_VALUES = (0.0, 0.5, 2.0, 10.0)
GRID = [(b, c) for b in B_VALUES for c in C_VALUES]
NUM_DRAWS = 20_000


def _exact_moments(b, c):
    """Mean and variance of PG(b, c) in NumPy (PSW 2013 §3.1), c > 0 only."""
    mean = b / (2 * c) * math.tanh(c / 2)
    var = b / (4 * c**3) * (math.sinh(c) - c) / math.cosh(c / 2) ** 2
    return mean, var


@jax.jit
def _log_density(x, b, c):
    """log p(x | b, c) from our log_prob; one compilation for every scalar (b, c)."""
    return PolyaGamma(b, c).log_prob(x)


# Integration grid in u = log x: the density of log ω is smooth, and outside [1e-7, 300] the mass
# is below e^{-1/(8·1e-7)} (left) and e^{-π²·300/8} (right) for every (b, c) tested.
_LOG_X = np.linspace(math.log(1e-7), math.log(300.0), 40_001)


def _integrate_log_grid(values_times_x):
    """∫ f(x) dx given f(x)·x on the ``_LOG_X`` grid (Simpson in u = log x)."""
    return integrate.simpson(values_times_x, x=_LOG_X)


@functools.lru_cache(maxsize=None)
def _pdf_times_x(b, c):
    """p(x | b, c)·x on the ``_LOG_X`` grid (cached: shared by the integral and the CDF tests)."""
    x = np.exp(_LOG_X)
    return np.exp(np.asarray(_log_density(jnp.asarray(x), b, c))) * x


def _cdf_on_grid(b, c):
    """(x, CDF(x)) on the ``_LOG_X`` grid by cumulative Simpson integration of our density."""
    return np.exp(_LOG_X), integrate.cumulative_simpson(_pdf_times_x(b, c), x=_LOG_X, initial=0.0)


@pytest.fixture(scope="module")
def draws():
    """{(b, c): 20,000 draws}: one jit-compiled batched call for the whole (b, c) grid."""
    b = jnp.asarray([g[0] for g in GRID])  # [12]
    c = jnp.asarray([g[1] for g in GRID])  # [12]
    sample = jax.jit(lambda key: PolyaGamma(b, c).sample(key, (NUM_DRAWS,)))
    s = np.asarray(sample(jax.random.key(2024)))  # [NUM_DRAWS, 12]
    return {g: s[:, i] for i, g in enumerate(GRID)}


# ----------------------------------------------------------------------------------------------
# density
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("b", B_VALUES)
def test_log_prob_matches_polyagamma_pdf(b):
    # polyagamma_pdf sums the small-x series without cancellation control, so it is accurate only
    # up to x ≈ 4 (checked against 100-digit mpmath during development); compare there, in log
    # form so the far-left tail (density < 1e-300) is compared too.
    x = np.logspace(-4, math.log10(3.5), 200)
    for c in C_VALUES:
        ours = np.asarray(PolyaGamma(b, c).log_prob(jnp.asarray(x)))
        ref = polyagamma_pdf(x, h=b, z=c, return_log=True)
        np.testing.assert_allclose(np.exp(ours - ref), 1.0, rtol=1e-6, atol=0, err_msg=f"b={b} c={c}")
        ref_pdf = polyagamma_pdf(x, h=b, z=c)
        bulk = ref_pdf > 1e-250
        np.testing.assert_allclose(np.exp(ours[bulk]), ref_pdf[bulk], rtol=1e-6, atol=0, err_msg=f"b={b} c={c}")


@pytest.mark.parametrize("b, c", GRID)
def test_density_integrates_to_one(b, c):
    assert abs(_integrate_log_grid(_pdf_times_x(b, c)) - 1.0) < 1e-9


def test_log_prob_finite_and_decreasing_in_tails():
    x = jnp.logspace(-4, 2, 400)  # [400]
    b = jnp.asarray([0.3, 1.0, 2.0, 3.5, 10.0, 30.0])[:, None, None]  # [6, 1, 1]
    c = jnp.asarray([0.0, 0.5, 2.0, 10.0, 50.0])[None, :, None]  # [1, 5, 1]
    lp = np.asarray(jax.jit(lambda b, c: PolyaGamma(b, c).log_prob(x))(b, c))  # [6, 5, 400]
    assert np.all(np.isfinite(lp))
    beyond_mode = np.asarray(x)[None, None, :] > np.asarray(b / 4 + 6 * jnp.sqrt(b / 24))  # [6, 1, 400]
    steps = np.diff(lp, axis=-1)  # [6, 5, 399]
    assert np.all(np.where(beyond_mode[..., 1:], steps < 0, True))  # strictly decreasing: never negative/flat
    with pytest.warns(UserWarning, match="support"):
        outside = PolyaGamma(1.0, 0.0, validate_args=True).log_prob(jnp.asarray([0.0, -1.0]))
    assert np.asarray(outside).tolist() == [-np.inf, -np.inf]


def test_log_prob_large_x_continues_small_x_exactly():
    # The two representations agree where both are accurate (x ∈ [1.5, 2.5]): a switching glitch
    # would show up here, and in the gradient.
    from gpzoo.inference.polya_gamma import _log_pdf_large_x, _log_pdf_small_x

    x = jnp.linspace(1.5, 2.5, 11)
    b = jnp.asarray([0.5, 1.0, 3.5, 10.0])[:, None] * jnp.ones_like(x)  # [4, 11]
    both = jax.jit(lambda x, b: (_log_pdf_small_x(x, b)[0], _log_pdf_large_x(x, b)[0]))
    small, large = both(jnp.broadcast_to(x, b.shape), b)
    np.testing.assert_allclose(small, large, rtol=0, atol=1e-10)
    log_prob = jax.jit(lambda v: PolyaGamma(2.0, 1.0).log_prob(v))
    eps = 1e-6
    fd = (log_prob(3.0 + eps) - log_prob(3.0 - eps)) / (2 * eps)
    np.testing.assert_allclose(jax.jit(jax.grad(log_prob))(3.0), fd, rtol=1e-6)


# ----------------------------------------------------------------------------------------------
# moments
# ----------------------------------------------------------------------------------------------


def test_mean_and_variance_closed_forms_and_limits():
    c = jnp.asarray([0.0, 1e-9, 1e-3, 0.5, 1.0 - 1e-12, 1.0 + 1e-12, 2.0, 10.0, 800.0, -2.0])
    d = PolyaGamma(3.0, c)
    mean, var = np.asarray(d.mean), np.asarray(d.variance)
    assert mean[0] == pytest.approx(3 / 4, rel=1e-15) and var[0] == pytest.approx(3 / 24, rel=1e-15)
    for i in (3, 6, 7):
        ref_mean, ref_var = _exact_moments(3.0, float(c[i]))
        assert mean[i] == pytest.approx(ref_mean, rel=1e-13) and var[i] == pytest.approx(ref_var, rel=1e-12)
    assert var[4] == pytest.approx(var[5], rel=1e-12)  # Taylor / direct branches meet at |c| = 1
    # small c: Taylor to second order (no cancellation); large c: b/(2c), b/(2c³) asymptotes
    assert var[2] == pytest.approx(3 * (1 / 24 - 1e-6 / 120), rel=1e-10)
    assert mean[8] == pytest.approx(3 / 1600, rel=1e-14) and var[8] == pytest.approx(3 / (2 * 800**3), rel=1e-13)
    assert mean[9] == mean[6] and var[9] == var[6]  # even in c
    grads = jax.grad(lambda cc: PolyaGamma(1.0, cc).mean + PolyaGamma(1.0, cc).variance)(0.0)
    assert float(grads) == 0.0


@pytest.mark.parametrize("b, c", GRID)
def test_sample_moments_match_closed_form(draws, b, c):
    s = draws[(b, c)]
    d = PolyaGamma(b, c)
    mean, var = float(d.mean), float(d.variance)
    se_mean = math.sqrt(var / NUM_DRAWS)
    fourth = np.mean((s - s.mean()) ** 4)
    se_var = math.sqrt((fourth - s.var() ** 2) / NUM_DRAWS)
    assert abs(s.mean() - mean) < 4.5 * se_mean
    assert abs(s.var() - var) < 4.5 * se_var
    assert np.all(s > 0)


@pytest.mark.parametrize("b, c", GRID)
def test_samples_match_polyagamma_two_sample_ks(draws, b, c):
    rng = np.random.default_rng(7)
    if float(b).is_integer():
        ref = random_polyagamma(b, c, size=NUM_DRAWS, method="devroye", random_state=rng)
    else:
        # polyagamma 2.0.2's default sampler for h = 3.5 is biased: at 1e6 draws its mean is off by
        # ~18 standard errors and its variance by +5% (measured; its Devroye method, exact, needs
        # integer h). PG(3.5) = PG(3) + PG(0.5) (independent): Devroye for the bulk, default for 0.5
        # (whose measured bias is ≲ 0.3 standard errors of the PG(3.5) mean at this sample size).
        ref = random_polyagamma(3, c, size=NUM_DRAWS, method="devroye", random_state=rng)
        ref = ref + random_polyagamma(0.5, c, size=NUM_DRAWS, random_state=rng)
    assert stats.ks_2samp(draws[(b, c)], ref).pvalue > 1e-3


@pytest.mark.parametrize("b, c", GRID)
def test_samples_match_exact_cdf_one_sample_ks(draws, b, c):
    # Independent of the reference sampler: the CDF integrated from our (reference-checked) density.
    x, cdf = _cdf_on_grid(b, c)
    assert abs(cdf[-1] - 1.0) < 1e-6
    assert stats.kstest(draws[(b, c)], lambda v: np.interp(v, x, cdf)).pvalue > 1e-3


def test_sample_is_jittable_vmappable_and_reproducible():
    c = jnp.asarray([[0.0, 1.0, 5.0]])  # batch [1, 3]
    d = PolyaGamma(1.0, c)
    s1 = d.sample(jax.random.key(0), (4, 2))
    assert s1.shape == (4, 2, 1, 3) and s1.dtype == jnp.float64
    np.testing.assert_array_equal(s1, d.sample(jax.random.key(0), (4, 2)))
    keys = jax.random.split(jax.random.key(1), 3)

    @jax.jit
    def traced(cc, key, keys):  # c traced (b concrete); plain and vmapped over keys
        d = PolyaGamma(1.0, cc)
        return d.sample(key, (4, 2)), jax.vmap(lambda k: d.sample(k, (4, 2)))(keys)

    s_jit, batched = traced(c, jax.random.key(0), keys)
    np.testing.assert_allclose(s_jit, s1, rtol=1e-12)
    looped = jnp.stack([d.sample(k, (4, 2)) for k in keys])
    np.testing.assert_allclose(batched, looped, rtol=1e-12)
    assert not np.allclose(batched[0], batched[1])


def test_traced_b_and_float32_sampling():
    # b traced at construction -> gamma-series sampler for all of b; float32 inputs -> float32 draws
    n = 20_000
    s = jax.jit(lambda b, key: PolyaGamma(b, 2.0).sample(key, (n,)))(jnp.asarray(2.0), jax.random.key(3))
    mean, var = _exact_moments(2.0, 2.0)
    assert abs(float(s.mean()) - mean) < 4.5 * math.sqrt(var / n)
    d32 = PolyaGamma(jnp.float32(1.0), jnp.float32(3.0))
    s32 = d32.sample(jax.random.key(4), (n,))
    assert s32.dtype == jnp.float32 and bool(jnp.all(s32 > 0))
    mean, var = _exact_moments(1.0, 3.0)
    assert abs(float(s32.mean()) - mean) < 4.5 * math.sqrt(var / n)
    lp32 = d32.log_prob(jnp.logspace(-4, 2, 50, dtype=jnp.float32))
    assert lp32.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(lp32)))


def test_invalid_parameters_raise_typed_errors():
    with pytest.raises(HyperparameterError, match="b"):
        PolyaGamma(0.0, 1.0)
    with pytest.raises(HyperparameterError, match="c"):
        PolyaGamma(1.0, np.nan)


# ----------------------------------------------------------------------------------------------
# KL divergence
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("b, c_q, c_p", [(1.0, 0.5, 2.0), (1.0, 2.0, 0.0), (3.5, 10.0, 0.5), (2.0, 0.0, 10.0)])
def test_kl_matches_quadrature(b, c_q, c_p):
    x = jnp.exp(jnp.asarray(_LOG_X))
    log_q = np.asarray(_log_density(x, b, c_q))
    log_p = np.asarray(_log_density(x, b, c_p))
    numeric = _integrate_log_grid(np.exp(log_q) * (log_q - log_p) * np.asarray(x))  # ∫ q log(q/p) dx
    q, p = PolyaGamma(b, c_q), PolyaGamma(b, c_p)
    assert float(kl_divergence(q, p)) == pytest.approx(numeric, rel=1e-8, abs=1e-11)
    assert float(kl_divergence(q, q)) == 0.0


def test_kl_broadcasts_and_rejects_different_b():
    kl = kl_divergence(PolyaGamma(1.0, jnp.asarray([0.0, 1.0, 2.0])), PolyaGamma(1.0, 0.5))
    assert kl.shape == (3,) and bool(jnp.all(kl >= 0))
    with pytest.raises(InvalidArgumentError, match="equal b"):
        kl_divergence(PolyaGamma(1.0, 1.0), PolyaGamma(2.0, 1.0))


def test_trace_mean_field_elbo_uses_the_analytic_kl():
    def model():
        numpyro.sample("omega", PolyaGamma(1.0, 0.0).expand([3]).to_event(1))

    def guide():
        c = numpyro.param("c", jnp.asarray([0.5, 1.0, 3.0]))
        numpyro.sample("omega", PolyaGamma(1.0, c).to_event(1))

    elbo = TraceMeanField_ELBO()
    losses = [float(elbo.loss(jax.random.key(seed), {}, model, guide)) for seed in range(4)]
    expected = float(jnp.sum(kl_divergence(PolyaGamma(1.0, jnp.asarray([0.5, 1.0, 3.0])), PolyaGamma(1.0, 0.0))))
    assert losses == pytest.approx([expected] * 4, rel=1e-12)  # no Monte Carlo noise at all
    # SVI drives q towards the prior: the loss decreases
    svi = SVI(model, guide, numpyro.optim.Adam(0.1), elbo)
    result = svi.run(jax.random.key(0), 50, progress_bar=False)
    assert result.losses[-1] < result.losses[0]


# ----------------------------------------------------------------------------------------------
# PG logistic bound (van der Wilk et al. 2018, eq. 22–23)
# ----------------------------------------------------------------------------------------------


def _gauss_hermite_log_sigmoid(sign, mean, var, degree=120):
    """E_{N(mean, var)}[log σ(sign · f)] ``[N]`` by Gauss–Hermite (probabilists')."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(degree)
    f = mean[:, None] + np.sqrt(var)[:, None] * nodes[None, :]  # [N, Q]
    return np.sum(weights * -np.logaddexp(0.0, -sign[:, None] * f), axis=1) / math.sqrt(2 * math.pi)


def test_pg_bound_with_optimal_c_is_jaakkola_jordan_and_a_lower_bound():
    rng = np.random.default_rng(0)
    n = 50
    y = rng.integers(0, 2, n).astype(float)
    mean = rng.normal(0, 2, n)
    var = rng.uniform(0.01, 3.0, n)
    second = mean**2 + var
    sign = 2 * y - 1
    c = np.asarray(optimal_c(jnp.asarray(second)))
    bound = np.asarray(pg_logistic_bound(jnp.asarray(y), jnp.asarray(mean), jnp.asarray(second), jnp.asarray(c)))
    assert bound.shape == (n,)
    # optimised Jaakkola–Jordan: log σ(ξ) + (s μ − ξ)/2 − λ(ξ)(E f² − ξ²), λ(ξ) = tanh(ξ/2)/(4ξ),
    # at ξ² = E f² the last term vanishes
    jj = -np.logaddexp(0.0, -c) + (sign * mean - c) / 2
    np.testing.assert_allclose(bound, jj, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(bound, (y - 0.5) * mean - c / 2 - np.log1p(np.exp(-c)), rtol=1e-12)
    truth = _gauss_hermite_log_sigmoid(sign, mean, var)
    assert np.all(bound <= truth + 1e-12)
    # for any c it is the JJ bound at ξ = c, never above the optimum
    for scale in (0.5, 0.9, 1.1, 2.0):
        xi = c * scale
        other = np.asarray(pg_logistic_bound(jnp.asarray(y), jnp.asarray(mean), jnp.asarray(second), jnp.asarray(xi)))
        jj_xi = -np.logaddexp(0.0, -xi) + (sign * mean - xi) / 2 - np.tanh(xi / 2) / (4 * xi) * (second - xi**2)
        np.testing.assert_allclose(other, jj_xi, rtol=1e-11, atol=1e-12)
        assert np.all(other <= bound + 1e-12)

    def total(cc):
        return jnp.sum(pg_logistic_bound(jnp.asarray(y), jnp.asarray(mean), jnp.asarray(second), cc))

    grad_c = jax.grad(total)(jnp.asarray(c))
    np.testing.assert_allclose(grad_c, 0.0, atol=1e-10)


def test_pg_bound_at_c_zero_and_label_check():
    value = pg_logistic_bound(jnp.asarray([1.0]), jnp.asarray([0.3]), jnp.asarray([0.5]), jnp.asarray([0.0]))
    assert float(value[0]) == pytest.approx(-math.log(2) + 0.5 * 0.3 - 0.5 / 8, rel=1e-14)  # E[PG(1,0)] = 1/4, KL = 0
    with pytest.raises(DataError, match="y"):
        pg_logistic_bound(jnp.asarray([-1.0, 1.0]), jnp.zeros(2), jnp.ones(2), jnp.ones(2))
