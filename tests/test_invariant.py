"""Invariant kernels, orbit estimators, image transforms and the invariant SVGP (van der Wilk et al. 2018, §4–5, App. B)."""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest

from gpzoo.analysis import datasets
from gpzoo.inference import evaluate_elbo, fit, predict
from gpzoo.inference.guides import InducingPosterior
from gpzoo.inference.inducing import BaseInducingPoints
from gpzoo.inference.invariant import InvariantSVGP
from gpzoo.inference.svgp import SVGP
from gpzoo.models import zoo
from gpzoo.models.errors import InvalidArgumentError
from gpzoo.models.kernels import CyclicShift, ImageSymmetries, OrbitSum, SquaredExponential, SwapInputs
from gpzoo.models.kernels.invariant import (
    AffineAugmentation,
    FiniteOrbit,
    InterpretableAffineAugmentation,
    InvariantKernel,
    LocalDeformation,
    RotationAugmentation,
)
from gpzoo.models.likelihoods import Bernoulli, Gaussian, OneHotGaussian, Poisson
from gpzoo.models.zoo import ModelSpec

NUM_DRAWS = 4000
SIGMAS = 4.0  # tolerance: 4 standard errors of the Monte Carlo mean


def _rng(seed=0):
    return np.random.default_rng(seed)


def _within_standard_errors(draws, exact):
    """|mean − exact| <= 4 SE elementwise (SE from the draws' empirical spread), plus rounding slack."""
    draws = np.asarray(draws)
    mean = draws.mean(0)
    stderr = draws.std(0, ddof=1) / np.sqrt(draws.shape[0])
    assert np.all(np.abs(mean - exact) <= SIGMAS * stderr + 1e-10), (mean, exact, stderr)


# ----------------------------------------------------------------------------- exact finite orbits
@pytest.mark.parametrize("group,dim", [(SwapInputs(), 2), (ImageSymmetries((4, 4), flips=False), 16), (CyclicShift(5), 5)])
def test_exact_invariant_kernel_is_argumentwise_invariant_and_equals_orbit_sum(group, dim):
    base = SquaredExponential(lengthscale=1.3, variance=0.7)
    kernel = InvariantKernel(base, FiniteOrbit(group))
    X = _rng().normal(size=(6, dim))  # [N, D]
    K = kernel.K(X)  # [N, N]
    for g in range(group.order):
        gX = np.asarray(group.orbit(X)[g])  # [N, D]
        np.testing.assert_allclose(kernel.K(X, gX), K, atol=1e-12)  # K(X, gX) = K(X, X): f(x) = f(gx)
    np.testing.assert_allclose(K, OrbitSum(base, group).K(X), atol=1e-12)
    np.testing.assert_allclose(kernel.K_diag(X), np.diag(K), atol=1e-12)


def _finite_estimates(orbit, X, Z, base):
    kernel = InvariantKernel(base, orbit)

    def one(key):
        samples = kernel.sample_orbit(X, key)  # [S, N, D]
        kfu = orbit.single_weight() * kernel.Kzx_samples(Z, samples).sum(0)  # [M, N]
        return kernel.Kff_diag_estimate(samples), kfu

    return jax.jit(jax.vmap(one))(jax.random.split(jax.random.PRNGKey(1), NUM_DRAWS))


def test_subsampled_orbit_estimators_average_to_the_exact_double_and_single_sums():
    """App. B.1 (eq. 8/12): S=3 of |G|=8 elements without replacement; unbiased for k_f(x,x) and k_fu."""
    group = ImageSymmetries((3, 3))
    base = SquaredExponential(lengthscale=1.0)
    X, Z = _rng(1).uniform(size=(4, 9)), _rng(2).uniform(size=(3, 9))
    exact = InvariantKernel(base, FiniteOrbit(group))
    kff, kfu = _finite_estimates(FiniteOrbit(group, num_samples=3), X, Z, base)
    _within_standard_errors(kff, exact.K_diag(X))
    _within_standard_errors(kfu, exact.K_fu(X, Z))
    assert np.std(np.asarray(kff), 0).min() > 0  # really random


def test_with_replacement_draws_average_to_the_normalised_double_integral():
    """Eq. 21 / App. B eq. 15: draws from p(x_a|x) uniform on the orbit estimate (1/G²) Σ Σ k_g."""
    group = CyclicShift(6)
    base = SquaredExponential(lengthscale=0.8)
    X, Z = _rng(3).normal(size=(4, 6)), _rng(4).normal(size=(3, 6))
    exact = InvariantKernel(base, FiniteOrbit(group))
    kff, kfu = _finite_estimates(FiniteOrbit(group, num_samples=4, replace=True), X, Z, base)
    _within_standard_errors(kff, exact.K_diag(X) / 36)
    _within_standard_errors(kfu, exact.K_fu(X, Z) / 6)
    np.testing.assert_allclose(InvariantKernel(base, FiniteOrbit(group, num_samples=4, replace=True)).K(X), exact.K(X) / 36)


# ----------------------------------------------------------------------------- ELBO terms
def _family(orbit, likelihood, whiten=True, q_structure="full", num_inducing=5, dim=9):
    kernel = InvariantKernel(SquaredExponential(lengthscale=1.2, variance=0.05), orbit)
    spec = ModelSpec(name="t", kernel=kernel, likelihood=likelihood, num_inducing=num_inducing, inducing="invariant-points",
                     whiten=whiten, q_structure=q_structure, method="invariant-svgp")
    Z = BaseInducingPoints(jnp.asarray(_rng(5).uniform(size=(num_inducing, dim))))
    return InvariantSVGP(spec, Z, likelihood.num_latent())


def _random_q(family, seed=6):
    rng = _rng(seed)
    L, M = family.num_latent, family.inducing.num_inducing
    q_sqrt = np.tril(rng.normal(size=(L, M, M))) * 0.3 + np.eye(M) * 0.5
    return {"q_mu": jnp.asarray(rng.normal(size=(L, M))), "q_sqrt": jnp.asarray(q_sqrt)}


def _ell(family, params, X, y, key):
    with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
        parts = family.parts()
    return family.expected_log_lik(parts, X, y, key)


@pytest.mark.parametrize("whiten", [True, False])
def test_exact_orbit_estimates_equal_the_svgp_conditional(whiten):
    """With the whole orbit every weight is 1: the estimators reproduce q(f_n)'s moments exactly."""
    group = ImageSymmetries((3, 3))
    family = _family(FiniteOrbit(group), Gaussian(noise_variance=0.1), whiten=whiten)
    X = jnp.asarray(_rng(7).uniform(size=(6, 9)))
    params = _random_q(family)
    with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
        parts = family.parts()
    est = jax.jit(lambda x: family.moment_estimates(parts, x, jax.random.PRNGKey(0)))(X)
    mean, var = jax.jit(lambda x: SVGP.latent_moments(family, parts, x))(X)
    np.testing.assert_allclose(est.mean, mean, atol=1e-10)
    np.testing.assert_allclose(est.var, var, atol=1e-10)
    np.testing.assert_allclose(est.second_moment, mean**2 + var, atol=1e-10)


@pytest.mark.parametrize("likelihood,whiten", [(Gaussian(noise_variance=0.1), True), (Gaussian(noise_variance=0.1), False),
                                               (OneHotGaussian(num_classes=3, noise_variance=0.1), True),
                                               (Bernoulli(link="logit"), True)])
def test_subsampled_elbo_terms_average_to_the_exact_ones(likelihood, whiten):
    """Eq. 15 (Gaussian, and summed over one-hot classes) and the PG bound (eq. 23, at the c of an
    independent draw) are unbiased per datum."""
    group = ImageSymmetries((3, 3))
    exact = _family(FiniteOrbit(group), likelihood, whiten=whiten)
    sampled = _family(FiniteOrbit(group, num_samples=4), likelihood, whiten=whiten)
    X = jnp.asarray(_rng(8).uniform(size=(5, 9)))
    y = jnp.asarray(_rng(9).normal(size=5) if isinstance(likelihood, Gaussian) else _rng(9).integers(0, 2, 5).astype(float))
    params = _random_q(exact)
    draws = jax.jit(jax.vmap(lambda k: _ell(sampled, params, X, y, k)))(jax.random.split(jax.random.PRNGKey(2), NUM_DRAWS))
    if likelihood.linear_in_moments:
        _within_standard_errors(draws, _ell(exact, params, X, y, None))
    else:
        # the PG bound at the optimal c equals the Jaakkola–Jordan bound; at an estimated c it is lower
        from gpzoo.inference.polya_gamma import optimal_c, pg_logistic_bound

        with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
            parts = exact.parts()
        mean, var = exact.latent_moments(parts, X)
        bound = pg_logistic_bound(y, mean[:, 0], mean[:, 0] ** 2 + var[:, 0], optimal_c(mean[:, 0] ** 2 + var[:, 0]))
        stderr = np.asarray(draws).std(0, ddof=1) / np.sqrt(NUM_DRAWS)
        assert np.all(np.asarray(draws).mean(0) <= bound + SIGMAS * stderr)
        assert np.all(np.asarray(draws).mean(0) >= bound - 0.5)  # close to it: c is a good estimate


@pytest.mark.parametrize("likelihood", [Poisson(), Bernoulli(link="probit")])
def test_sampled_kernels_refuse_likelihoods_that_are_not_gaussian_in_f(likelihood):
    with pytest.raises(InvalidArgumentError, match="likelihood"):
        _family(FiniteOrbit(ImageSymmetries((3, 3)), num_samples=3), likelihood)
    _family(FiniteOrbit(ImageSymmetries((3, 3))), likelihood)  # the exact kernel takes any likelihood


# ----------------------------------------------------------------------------- transforms
IMAGE_SHAPE = (6, 6)


def _images(n=3):
    return jnp.asarray(_rng(10).uniform(size=(n, 36)))  # [N, 36]


@pytest.mark.parametrize("cls", [AffineAugmentation, InterpretableAffineAugmentation])
def test_affine_with_zero_range_is_the_identity(cls):
    X = _images()
    samples = cls(IMAGE_SHAPE, num_samples=3).sample(X, jax.random.PRNGKey(0))  # [3, N, 36]
    np.testing.assert_array_equal(samples, jnp.broadcast_to(X, samples.shape))


def test_rotation_by_90_degrees_is_np_rot90_and_matches_rotate_images():
    X = _images()
    rot = InterpretableAffineAugmentation(IMAGE_SHAPE, lower=(90.0, 0, 0, 0, 0, 0), upper=(90.0, 0, 0, 0, 0, 0), num_samples=2)
    samples = rot.sample(X, jax.random.PRNGKey(0))  # [2, N, 36]
    expected = np.stack([np.rot90(x.reshape(IMAGE_SHAPE)).ravel() for x in np.asarray(X)])
    np.testing.assert_allclose(samples[0], expected, atol=1e-12)
    # an arbitrary angle agrees with the dataset's (SciPy-checked) rotation
    angle = 33.0
    rot = InterpretableAffineAugmentation(IMAGE_SHAPE, lower=(angle, 0, 0, 0, 0, 0), upper=(angle, 0, 0, 0, 0, 0), num_samples=2)
    np.testing.assert_allclose(rot.sample(X, jax.random.PRNGKey(0))[0],
                               datasets.rotate_images(np.asarray(X), np.full(3, angle), IMAGE_SHAPE), atol=1e-12)


def _range_gradients(make, params):
    X = _images()

    def loss(p):
        return jnp.sum(jnp.sin(make(p).sample(X, jax.random.PRNGKey(3)) * 3.0))

    return jax.jit(jax.grad(loss))(params)


@pytest.mark.parametrize("name", ["rotation", "affine", "interpretable", "deformation"])
def test_gradients_reach_the_range_parameters(name):
    makers = {
        "rotation": (lambda p: RotationAugmentation(IMAGE_SHAPE, max_angle=p["a"], num_samples=4), {"a": 30.0}),
        "affine": (lambda p: AffineAugmentation(IMAGE_SHAPE, lower=p["lo"], upper=p["hi"], num_samples=4),
                   {"lo": -0.1 * jnp.ones(6), "hi": 0.1 * jnp.ones(6)}),
        "interpretable": (lambda p: InterpretableAffineAugmentation(IMAGE_SHAPE, lower=p["lo"], upper=p["hi"], num_samples=4),
                          {"lo": jnp.asarray([-20.0, -0.1, -0.1, -0.1, -1, -1]), "hi": jnp.asarray([20.0, 0.1, 0.1, 0.1, 1, 1])}),
        "deformation": (lambda p: LocalDeformation(IMAGE_SHAPE, displacement=p["d"], max_angle=p["a"], num_samples=4),
                        {"d": 0.7, "a": 10.0}),
    }
    make, params = makers[name]
    grads = jax.tree_util.tree_leaves(_range_gradients(make, params))
    for g in grads:
        assert np.all(np.isfinite(g)) and np.all(np.abs(g) > 0), grads


def test_augmentation_kernel_has_no_closed_form_and_says_so():
    kernel = InvariantKernel(SquaredExponential(), RotationAugmentation(IMAGE_SHAPE, num_samples=2))
    with pytest.raises(InvalidArgumentError, match="kernel"):
        kernel.K(_images())


# ----------------------------------------------------------------------------- zoo + end to end
def test_zoo_names_and_methods():
    assert {"invariant-rot", "invariant-affine", "invariant-deform", "invariant-finite"} <= set(zoo.names())
    assert zoo.get("invariant-finite", input_dim=2).method == "svgp"
    assert zoo.get("invariant-finite", image_shape=(4, 4), num_orbit_samples=2).method == "invariant-svgp"
    for name in ("invariant-rot", "invariant-affine", "invariant-deform"):
        assert zoo.get(name, image_shape=(6, 6), task="binary").method == "invariant-svgp"
    with pytest.raises(InvalidArgumentError, match="likelihood"):
        zoo.get("invariant-rot", image_shape=(6, 6), task="multiclass", num_classes=3)


def test_fit_invariant_finite_on_symmetric_toy_improves_the_elbo_and_predicts_invariantly():
    data = datasets.load("symmetric-toy", num_train=60, num_test=50)
    spec = zoo.get("invariant-finite", input_dim=2, num_inducing=10)
    res = fit(spec, data.X_train, data.y_train, steps=150, learning_rate=0.03, progress=False)
    assert res.objective_history[-10:].mean() > res.objective_history[:10].mean() + 10.0
    pred = predict(res, data.X_test)
    pred_swapped = predict(res, data.X_test[:, ::-1])
    np.testing.assert_allclose(pred.f_mean, pred_swapped.f_mean, atol=1e-8)
    np.testing.assert_allclose(pred.f_var, pred_swapped.f_var, atol=1e-8)


def test_fit_invariant_rot_on_tiny_images_improves_the_elbo():
    data = datasets.load("digits-8x8", classes=(0, 1))
    X, y = data.X_train[:60], data.y_train[:60]
    spec = zoo.get("invariant-rot", image_shape=(8, 8), task="binary", num_inducing=8, num_orbit_samples=4)
    res = fit(spec, X, y, steps=60, batch_size=30, learning_rate=0.05, progress=False)
    assert np.all(np.isfinite(res.objective_history))
    assert res.objective_history[-10:].mean() > res.objective_history[:10].mean() + 2.0
    assert np.isfinite(res.params["kernel.orbit.max_angle"]) and res.params["kernel.orbit.max_angle"] != 45.0
    pred = predict(res, data.X_test[:20])
    assert np.all((pred.probs >= 0) & (pred.probs <= 1)) and np.all(pred.f_var > 0)
    elbo = evaluate_elbo(res, X, y)
    assert np.isfinite(elbo.elbo)


# ----------------------------------------------------------------------------- q(ω) options (van der Wilk et al. 2018, §4.5)
def _pg_family(pg_c, variance=0.05, likelihood=Bernoulli(link="logit"), **options):
    orbit = FiniteOrbit(ImageSymmetries((3, 3)), num_samples=4)
    kernel = InvariantKernel(SquaredExponential(lengthscale=1.2, variance=variance), orbit)
    spec = ModelSpec(name="t", kernel=kernel, likelihood=likelihood, num_inducing=5, inducing="invariant-points",
                     method="invariant-svgp", options={"pg_c": pg_c, **options})
    return InvariantSVGP(spec, BaseInducingPoints(jnp.asarray(_rng(5).uniform(size=(5, 9)))), 1)


def test_recognition_c_gives_a_valid_bound_below_the_closed_form_optimum():
    """For any c the PG bound (eq. 23) is ≤ its value at c = √E[f²] (same estimate) and ≤ E_q[log σ] (exact moments)."""
    from gpzoo.inference.invariant import recognition_c
    from gpzoo.inference.polya_gamma import optimal_c, pg_logistic_bound

    family = _pg_family("recognition")
    X = jnp.asarray(_rng(8).uniform(size=(12, 9)))
    y = jnp.asarray(_rng(9).integers(0, 2, 12).astype(float))
    rng = _rng(11)
    net = {name: jnp.asarray(v + rng.normal(size=v.shape)) for name, v in family.recognition_params(9, jnp.float64).items()}
    params = {**_random_q(family), **{f"pg_recognition.{k}": v for k, v in net.items()}}
    key = jax.random.PRNGKey(3)
    with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
        parts = family.parts()
        ell = family.expected_log_lik(parts, X, y, key, **family.data_term_inputs(X, y))
    c = recognition_c(net, X, y)  # [N]
    assert np.all(c > 0) and np.std(np.asarray(c)) > 1e-3  # the perturbed network gives varied c_n
    est = family.moment_estimates(parts, X, jax.random.split(key)[0])  # the draw expected_log_lik used
    np.testing.assert_allclose(ell, pg_logistic_bound(y, est.mean[:, 0], est.second_moment[:, 0], c), rtol=1e-12)
    positive = np.asarray(est.second_moment[:, 0]) > 0
    best = pg_logistic_bound(y, est.mean[:, 0], est.second_moment[:, 0], optimal_c(jnp.maximum(est.second_moment[:, 0], 0)))
    assert np.all(np.asarray(ell)[positive] <= np.asarray(best)[positive] + 1e-12)
    # validity against the exact expected log-likelihood (whole orbit: exact q(f) moments, Gauss–Hermite)
    exact = _family(FiniteOrbit(ImageSymmetries((3, 3))), Bernoulli(link="logit"))
    with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
        parts_exact = exact.parts()
    mean, var = exact.latent_moments(parts_exact, X)
    true_ell = Bernoulli(link="logit").variational_expectation(y, mean, var)
    assert np.all(np.asarray(pg_logistic_bound(y, mean[:, 0], mean[:, 0] ** 2 + var[:, 0], c)) <= np.asarray(true_ell) + 1e-10)


def test_pg_c_options_are_checked():
    with pytest.raises(InvalidArgumentError, match="pg_c") as info:
        _pg_family("optimal")
    assert info.value.argument == "pg_c"
    with pytest.raises(InvalidArgumentError, match="pg_recognition_hidden"):
        _pg_family("recognition", pg_recognition_hidden=(0,))
    for choice in ("recognition", "free"):
        with pytest.raises(InvalidArgumentError, match="pg_c.*Pólya") as info:
            _pg_family(choice, likelihood=Gaussian(noise_variance=0.1))
        assert info.value.argument == "pg_c"
    assert _pg_family("closed-form").pg_c == "closed-form" and not _pg_family("closed-form").needs_data_indices
    assert _pg_family("free").needs_data_indices


def _exact_twin(family):
    """The same model with the whole orbit: exact q(f) moments (the sampled estimates' expectation)."""
    kernel = InvariantKernel(family.spec.kernel.base_kernel, FiniteOrbit(ImageSymmetries((3, 3))))
    return InvariantSVGP(family.spec.replace(kernel=kernel, method="svgp", options={}), family.inducing, 1)


def _exact_pg_bound(family, params, X, y, c):
    """Σ_n pg_logistic_bound(y_n, μ_n, E f_n², c_n) − KL with exact moments ``[N]`` (the expectation of the estimate)."""
    from numpyro.distributions.kl import kl_divergence

    from gpzoo.inference.polya_gamma import pg_logistic_bound

    exact = _exact_twin(family)
    with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
        parts = exact.parts()
        mean, var = exact.latent_moments(parts, jnp.asarray(X))
        kl = kl_divergence(exact.posterior(parts), exact.prior(parts))
    second = mean[:, 0] ** 2 + var[:, 0]  # [N]
    return float(jnp.sum(pg_logistic_bound(jnp.asarray(y), mean[:, 0], second, c)) - kl), np.asarray(second)


def test_free_c_of_row_n_is_used_for_row_n():
    """The model reads c at the batch's training-set rows: factor b = PG bound of row idx[b] at c[idx[b]]."""
    from gpzoo.inference.invariant import FREE_C_SITE
    from gpzoo.inference.polya_gamma import pg_logistic_bound

    family = _pg_family("free")
    N = 12
    # constant images: every symmetry fixes them, so each orbit-sample estimate is the exact moment
    X = jnp.asarray(np.repeat(_rng(14).uniform(0.0, 2.0, size=(N, 1)), 9, axis=1))  # [N, 9]
    y = jnp.asarray(_rng(15).integers(0, 2, N).astype(float))
    c = jnp.asarray(0.3 + 0.25 * np.arange(N))  # [N], distinct per row
    params = {**_random_q(family), FREE_C_SITE: c}
    idx = np.array([7, 2, 11, 0])
    model = numpyro.handlers.seed(numpyro.handlers.substitute(family.model, data=params), rng_seed=1)
    tr = numpyro.handlers.trace(model).get_trace(X[idx], y[idx], N, data_indices=idx)
    assert tr[FREE_C_SITE]["type"] == "param" and tr["y"]["scale"] == N / len(idx)
    q_u = InducingPosterior(params["q_mu"], params["q_sqrt"], family.spec.q_structure)
    ell = tr["y"]["infer"]["expected_log_lik"](q_u, jax.random.PRNGKey(0))  # the fast ELBO's data term
    exact = _exact_twin(family)
    with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
        mean, var = exact.latent_moments(exact.parts(), X[idx])
    expected = pg_logistic_bound(y[idx], mean[:, 0], mean[:, 0] ** 2 + var[:, 0], c[idx])
    np.testing.assert_allclose(ell, expected, rtol=1e-10)
    assert not np.allclose(expected, pg_logistic_bound(y[idx], mean[:, 0], mean[:, 0] ** 2 + var[:, 0], c[:4]))


def test_fit_with_free_c_on_minibatches_approaches_the_optimal_c_bound():
    """Free per-datum c trained on minibatches of 10 (of 40) rows: at the fitted q(u), every c_n is near row n's
    optimum √E[f_n²], so the bound beats c = 1 (the initial c, also the recognition network's initial output)
    and nearly reaches the bound at the closed-form optimal c; evaluate_elbo reads the trained c."""
    from gpzoo.inference.invariant import FREE_C_SITE

    X = _rng(12).uniform(size=(40, 9))
    y = (X.sum(1) > 4.5).astype(float)  # invariant under every symmetry of the 3×3 square
    spec = _pg_family("free", variance=1.0).spec.replace(num_inducing=8)
    res = fit(spec, X, y, steps=300, batch_size=10, learning_rate=0.05, progress=False)
    assert np.all(np.isfinite(res.objective_history))
    c = res.params[FREE_C_SITE]  # [N]
    assert c.shape == (40,) and np.all(c > 0)
    family = res.family
    free, second = _exact_pg_bound(family, res.params, X, y, jnp.asarray(c))
    initial, _ = _exact_pg_bound(family, res.params, X, y, jnp.ones(40))
    optimal, _ = _exact_pg_bound(family, res.params, X, y, jnp.sqrt(jnp.asarray(second)))
    assert initial < free <= optimal + 1e-9
    assert optimal - free < 0.05 * (optimal - initial)
    # row by row, the c of row n fits row n (minibatch rows misread would leave c unrelated to its row's optimum)
    relative_error = np.abs(c - np.sqrt(second)) / np.sqrt(second)
    assert np.median(relative_error) < 0.1 and relative_error.max() < 0.5
    assert np.corrcoef(c, np.sqrt(second))[0, 1] > 0.9
    # evaluate_elbo on the training data uses the free c (all rows): with c = 5 everywhere it estimates that bound
    from dataclasses import replace

    res5 = replace(res, params={**res.params, FREE_C_SITE: np.full(40, 5.0)})
    estimate = evaluate_elbo(res5, num_samples=64)
    at_five, _ = _exact_pg_bound(family, res.params, X, y, jnp.full(40, 5.0))
    assert abs(estimate.elbo - at_five) <= 4.0 * estimate.stderr + 1e-6
    assert estimate.elbo < free - 1.0  # far from the trained c, so the test above can tell them apart


def test_fit_with_recognition_network_improves_the_elbo_and_trains_the_network():
    X = _rng(12).uniform(size=(60, 9))
    y = (X.sum(1) > 4.5).astype(float)  # invariant under every symmetry of the 3×3 square
    spec = _pg_family("recognition", variance=1.0, pg_recognition_hidden=(16,)).spec.replace(num_inducing=8)
    res = fit(spec, X, y, steps=150, learning_rate=0.03, progress=False)
    assert np.all(np.isfinite(res.objective_history))
    assert res.objective_history[-10:].mean() > res.objective_history[:10].mean() + 2.0
    assert {"pg_recognition.W0", "pg_recognition.b1"} <= set(res.params)
    assert np.abs(res.params["pg_recognition.W1"]).max() > 1e-3  # the zero-initialised last layer moved
    assert np.isfinite(evaluate_elbo(res, num_samples=4).elbo)


def test_evaluate_elbo_of_a_sampled_kernel_is_a_monte_carlo_estimate_with_its_se():
    """Sampled orbits make E log p(y|f) random: several draws and SE > 0; the exact orbit needs one."""
    X = _rng(13).uniform(size=(40, 9))
    y = (X.sum(1) > 4.5).astype(float)
    facts = dict(input_dim=9, image_shape=(3, 3), task="binary", num_inducing=6)
    sampled = fit(zoo.get("invariant-rot", num_orbit_samples=2, **facts), X, y, steps=5, progress=False)
    estimate = evaluate_elbo(sampled, num_samples=6)
    assert estimate.num_samples == 6 and estimate.stderr > 0 and np.ptp(estimate.draws) > 0
    exact = fit(zoo.get("invariant-finite", **facts), X, y, steps=5, progress=False)
    assert evaluate_elbo(exact, num_samples=6).num_samples == 1
