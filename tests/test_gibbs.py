"""Pólya–Gamma Gibbs sampler for GP classification (PSW 2013 §3.1) against NUTS and closed forms."""

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro.infer import MCMC, NUTS

from gpzoo.inference.gibbs import MAX_JOINT_POINTS, MAX_NUM_DATA, gibbs_gp_classification, sample_f_given_omega, sample_omega
from gpzoo.models.errors import DataError, InvalidArgumentError, ShapeError
from gpzoo.models.kernels import SquaredExponential

SIGMAS = 4.0  # tolerance: 4 combined Monte Carlo standard errors
NUM_CHAINS, NUM_WARMUP, NUM_SAMPLES = 4, 500, 1000
JITTER = 1e-6


def _problem(n=20, seed=0):
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(-3.0, 3.0, size=(n, 1)), axis=0)  # [N, 1]
    y = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-2.0 * np.sin(1.5 * X[:, 0])))).astype(float)  # [N]
    return X, y


KERNEL = SquaredExponential(lengthscale=1.0, variance=2.0)


@pytest.fixture(scope="module")
def gibbs_and_nuts():
    X, y = _problem()
    X_test = np.linspace(-3.5, 3.5, 7)[:, None]  # [7, 1]
    gibbs = gibbs_gp_classification(KERNEL, X, y, num_chains=NUM_CHAINS, num_warmup=NUM_WARMUP,
                                    num_samples=NUM_SAMPLES, seed=1, X_test=X_test, jitter=JITTER)

    L = jnp.linalg.cholesky(KERNEL.K(X) + JITTER * jnp.eye(len(y)))  # [N, N]

    def model():  # non-centred: f = L v, v ~ N(0, I)
        v = numpyro.sample("v", dist.Normal(jnp.zeros(len(y)), 1.0).to_event(1))
        f = numpyro.deterministic("f", L @ v)
        numpyro.sample("y", dist.Bernoulli(logits=f).to_event(1), obs=jnp.asarray(y))

    mcmc = MCMC(NUTS(model), num_warmup=NUM_WARMUP, num_samples=NUM_SAMPLES, num_chains=NUM_CHAINS,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(2))
    f_nuts = np.asarray(mcmc.get_samples(group_by_chain=True)["f"])  # [C, S, N]
    nuts = az.from_dict({"posterior": {"f": f_nuts}}, dims={"f": ["obs_train"]})
    return X, y, X_test, gibbs, nuts


def test_gibbs_matches_nuts_means_and_sds_within_mc_error(gibbs_and_nuts):
    """|Δmean| <= 4·√(mcse_G² + mcse_N²) and |Δsd| likewise with the sd MCSEs, per latent f_n."""
    _, _, _, gibbs, nuts = gibbs_and_nuts
    for stat, method in (("mean", "mean"), ("std", "sd")):
        g = getattr(gibbs.posterior["f"], stat)(("chain", "draw")).values  # [N]
        n = getattr(nuts.posterior["f"], stat)(("chain", "draw")).values  # [N]
        se = np.sqrt(az.mcse(gibbs, var_names=["f"], method=method)["f"].values ** 2
                     + az.mcse(nuts, var_names=["f"], method=method)["f"].values ** 2)
        assert np.all(np.abs(g - n) <= SIGMAS * se), (stat, np.max(np.abs(g - n) / se))


def test_gibbs_chains_mix(gibbs_and_nuts):
    _, y, X_test, gibbs, _ = gibbs_and_nuts
    post = gibbs.posterior
    assert post.sizes == {"chain": NUM_CHAINS, "draw": NUM_SAMPLES, "obs_train": len(y), "obs_test": len(X_test)}
    rhat = az.rhat(gibbs, var_names=["f", "f_test"])
    assert max(float(v.max()) for v in rhat.data_vars.values()) < 1.01
    assert float(az.ess(gibbs, var_names=["f"], method="bulk")["f"].min()) > 0.25 * NUM_CHAINS * NUM_SAMPLES
    assert set(az.summary(gibbs, var_names=["f"]).columns) >= {"mean", "sd", "r_hat", "ess_bulk"}
    assert np.isfinite(gibbs.sample_stats["lp"].values).all()
    assert gibbs.log_likelihood["y"].shape == (NUM_CHAINS, NUM_SAMPLES, len(y))
    assert np.isfinite(az.loo(gibbs).elpd)


def test_predictive_draws_are_the_gp_conditional_of_the_training_draws(gibbs_and_nuts):
    """E[f* | f] = K*f K⁻¹ f is linear, so mean(f*) = K*f K⁻¹ mean(f) up to the conditional noise's MC error."""
    X, _, X_test, gibbs, _ = gibbs_and_nuts
    f = gibbs.posterior["f"].values.reshape(-1, len(X))  # [CS, N]
    f_test = gibbs.posterior["f_test"].values.reshape(-1, len(X_test))  # [CS, N*]
    K = np.asarray(KERNEL.K(X)) + JITTER * np.eye(len(X))
    A = np.linalg.solve(K, np.asarray(KERNEL.K(X, X_test))).T  # [N*, N]  K*f K⁻¹
    noise = f_test - f @ A.T  # [CS, N*]: independent of f, mean 0, var = diag(K** − Q**)
    np.testing.assert_allclose(noise.var(0), np.asarray(KERNEL.K_diag(X_test)) - np.sum(A * KERNEL.K(X_test, X), 1),
                               rtol=0.1, atol=1e-6)
    assert np.all(np.abs(noise.mean(0)) <= SIGMAS * noise.std(0) / np.sqrt(len(noise)) + 1e-9)


def test_omega_conditional_mean_is_tanh_f_over_2f():
    """E[ω | f] = tanh(f/2)/(2f) (PSW 2013 §3.1; limit 1/4 at f = 0)."""
    f = jnp.asarray([-4.0, -0.7, 0.0, 0.3, 1.5, 6.0])
    draws = jax.vmap(lambda k: sample_omega(k, f))(jax.random.split(jax.random.PRNGKey(0), 20000))  # [S, 6]
    exact = np.where(f == 0, 0.25, np.tanh(f / 2) / (2 * np.where(f == 0, 1.0, f)))
    stderr = np.asarray(draws).std(0, ddof=1) / np.sqrt(draws.shape[0])
    assert np.all(np.abs(np.asarray(draws).mean(0) - exact) <= SIGMAS * stderr)


def test_f_given_omega_has_the_closed_form_gaussian_moments():
    """Matheron's draw has mean Σκ and covariance Σ = (K⁻¹ + Ω)⁻¹ (computed here by explicit inverses)."""
    rng = np.random.default_rng(3)
    X = rng.uniform(-2, 2, size=(5, 1))
    K = np.asarray(KERNEL.K(X)) + 1e-3 * np.eye(5)  # well conditioned: the explicit inverse is accurate
    omega = np.array([0.02, 0.1, 0.25, 0.8, 3.0])
    kappa = np.array([0.5, -0.5, 0.5, 0.5, -0.5])
    Sigma = np.linalg.inv(np.linalg.inv(K) + np.diag(omega))
    mean = Sigma @ kappa
    L = jnp.linalg.cholesky(K)
    draws = np.asarray(jax.vmap(lambda k: sample_f_given_omega(k, L, jnp.asarray(K), jnp.asarray(omega), jnp.asarray(kappa)))(
        jax.random.split(jax.random.PRNGKey(4), 40000)))  # [S, 5]
    S = draws.shape[0]
    sd = np.sqrt(np.diag(Sigma))
    assert np.all(np.abs(draws.mean(0) - mean) <= SIGMAS * sd / np.sqrt(S))
    # sample covariance entries: SE of Σ̂_ij ≈ √((Σ_ii Σ_jj + Σ_ij²)/S)
    cov_se = np.sqrt((np.outer(sd**2, sd**2) + Sigma**2) / S)
    assert np.all(np.abs(np.cov(draws.T) - Sigma) <= SIGMAS * cov_se)


def test_thinning_and_omega_storage():
    X, y = _problem(n=8, seed=5)
    dt = gibbs_gp_classification(KERNEL, X, y, num_chains=2, num_warmup=10, num_samples=7, thin=3, store_omega=True,
                                 chunk_size=4)
    assert dt.posterior["f"].shape == (2, 7, 8) and dt.posterior["omega"].shape == (2, 7, 8)
    assert np.all(dt.posterior["omega"].values > 0)
    assert "f_test" not in dt.posterior
    # same seed, different chunking: the same draws (keys depend only on sweep and chain)
    again = gibbs_gp_classification(KERNEL, X, y, num_chains=2, num_warmup=10, num_samples=7, thin=3, chunk_size=50)
    np.testing.assert_allclose(again.posterior["f"].values, dt.posterior["f"].values, atol=1e-12)


def test_progress_bar_says_compiling_then_times_the_compiled_chunks(monkeypatch):
    import io  # noqa: PLC0415

    from tqdm import tqdm as plain_tqdm  # noqa: PLC0415

    import gpzoo.inference.gibbs as gibbs  # noqa: PLC0415

    bars = []

    class Bar(plain_tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, file=io.StringIO(), **kwargs)
            self.shown = [str(self.postfix)]
            bars.append(self)

        def update(self, n=1):
            super().update(n)
            self.shown.append(str(self.postfix))

        def close(self):
            self.final = self.format_dict
            super().close()

    monkeypatch.setattr(gibbs, "tqdm", Bar)
    X, y = _problem(n=8, seed=5)
    gibbs_gp_classification(KERNEL, X, y, num_chains=1, num_warmup=4, num_samples=8, chunk_size=4, progress=True)
    (bar,) = bars
    assert bar.shown == ["compiling", "compiling", "", ""]  # cleared once the first chunk is back
    assert bar.final["n"] == 12 and bar.final["initial"] == 4  # the clock restarted after the first chunk


def test_bad_inputs_raise_typed_errors():
    X, y = _problem(n=6)
    with pytest.raises(DataError, match="y"):
        gibbs_gp_classification(KERNEL, X, np.where(y > 0, 1.0, -1.0))
    with pytest.raises(ShapeError, match="y"):
        gibbs_gp_classification(KERNEL, X, y[:-1])
    with pytest.raises(ShapeError, match="X"):
        gibbs_gp_classification(KERNEL, X[:, 0], y)
    with pytest.raises(ShapeError, match="X_test"):
        gibbs_gp_classification(KERNEL, X, y, X_test=np.zeros((3, 2)))
    with pytest.raises(InvalidArgumentError, match="N \\+ N\\*"):
        gibbs_gp_classification(KERNEL, X, y, X_test=np.zeros((MAX_JOINT_POINTS, 1)))
    with pytest.raises(InvalidArgumentError, match="thin"):
        gibbs_gp_classification(KERNEL, X, y, thin=0)
    with pytest.raises(InvalidArgumentError, match=f"N <= {MAX_NUM_DATA}"):
        gibbs_gp_classification(KERNEL, np.zeros((MAX_NUM_DATA + 1, 1)), np.zeros(MAX_NUM_DATA + 1))
