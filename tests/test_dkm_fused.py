"""The Nyström step (``dkm.nystrom``: K_ii factorised inside, closed-form VJP) against autodiff, and
the training step ``gpzoo.fit`` runs on a DKM against optax's Adam.

Values and gradients must equal those of the plain program (chol K_ii, the triangular solves of
Milsom et al. 2024, eq. 32, differentiated by JAX: :func:`plain_nystrom` here), in float64 to
rounding and in float32 (the library default) to single precision.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.linalg import solve_triangular

import optax
from numpyro.distributions import biject_to, constraints

from gpzoo.inference import build_family, dkm, fit
from gpzoo.inference.data import BatchSchedule
from gpzoo.inference.dkm import DKMConfig, GramLayerSpec, nystrom
from gpzoo.inference.dkm_family import INDUCING_KIND, GramInitialisation
from gpzoo.inference.elbo import FastELBO
from gpzoo.inference.inducing import initialise_inducing, register_initialiser
from gpzoo.models.errors import NumericalError, TrainingError
from gpzoo.models.kernels.gram import GramBlocks
from gpzoo.models.likelihoods import Bernoulli, Softmax
from gpzoo.models.zoo_dkm import architecture_spec


def _problem(dtype, spatial=()):
    """Unconstrained (A, B, K_ti, K_t, mean, weights): K_ii = A Aᵀ/6 + 0.1 I, Σ = B Bᵀ/6, some residuals < 0."""
    rng = np.random.default_rng(21)
    P, N = 5, 7
    A = jnp.asarray(rng.normal(size=(P, 6)), dtype)
    B = jnp.asarray(rng.normal(size=(P, 6)), dtype)
    K_ti = jnp.asarray(0.3 * rng.normal(size=(N, *spatial, P)), dtype)
    K_t = jnp.asarray(rng.uniform(0.5, 2.0, size=(N, *spatial)), dtype)
    K_t = K_t.reshape(-1).at[:2].set(1e-3).reshape(K_t.shape)  # below ‖L⁻¹k‖²: clipped residuals
    mean = jnp.asarray(rng.normal(size=(P, 3)), dtype)
    w_ti = jnp.asarray(rng.normal(size=(N, *spatial, P)), dtype)
    w_t = jnp.asarray(rng.normal(size=(N, *spatial)), dtype)
    return A, B, K_ti, K_t, mean, w_ti, w_t


def plain_nystrom(K_ii, K_ti, K_t, Sigma, mean=None, residual_tol=None):
    """``dkm.nystrom`` written as the textbook program, for JAX to differentiate: L = chol K_ii,
    X = L⁻¹K_it, then G_ti = Xᵀ L⁻¹Σ and G_t = diag(Xᵀ L⁻¹ΣL⁻ᵀ X) + max(K_t − ‖X‖², 0) (a Gram
    layer), or f_mean = Xᵀ L⁻¹mean, f_var = ‖(L⁻¹S)ᵀX‖² + max(K_t − ‖X‖², 0) (the output GP)."""
    shape, P = K_ti.shape, K_ti.shape[-1]
    L = jnp.linalg.cholesky(K_ii)
    X = solve_triangular(L, K_ti.reshape(-1, P).T, lower=True)  # [P, N]
    residual = K_t.reshape(-1) - jnp.sum(X * X, axis=0)
    ratio = residual / jnp.abs(K_t.reshape(-1))
    tol = dkm.default_residual_tol(K_ti.dtype) if residual_tol is None else residual_tol
    checks = {"min_residual": jnp.min(ratio), "residual_ok": jnp.min(ratio) >= -tol, "chol_ok": jnp.all(jnp.isfinite(L))}
    A = solve_triangular(L, Sigma, lower=True)  # [P, P] = L⁻¹Σ
    M = solve_triangular(L, A.T, lower=True)  # [P, P] = L⁻¹ΣL⁻ᵀ
    var = jnp.sum((M @ X) * X, axis=0) + jnp.maximum(residual, 0.0)
    if mean is None:
        return GramBlocks(Sigma, (X.T @ A).reshape(shape), var.reshape(K_t.shape)), checks, L
    mu_s = solve_triangular(L, mean, lower=True)
    return (X.T @ mu_s, var, 0.5 * jnp.sum(mu_s * mu_s)), checks, L


def plain_exact_kl(G_chol, K, K_chol=None):
    """The exact KL ½[tr(K⁻¹G) − P + log|K| − log|G|] written plainly, for JAX to differentiate through
    its own L = chol K (``K_chol`` is ignored)."""
    L = jnp.linalg.cholesky(K)
    A = solve_triangular(L, G_chol, lower=True)
    return 0.5 * (jnp.sum(A * A) - K.shape[-1] + 2.0 * jnp.sum(jnp.log(jnp.diagonal(L)))
                  - 2.0 * jnp.sum(jnp.log(jnp.diagonal(G_chol))))


def _gram(A, jitter=0.0):
    return A @ A.T / A.shape[1] + jitter * jnp.eye(A.shape[0], dtype=A.dtype)


def _tol(dtype):
    return (1e-11, 1e-12) if dtype == jnp.float64 else (2e-4, 2e-5)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.parametrize("spatial", [(), (2, 3)])
def test_layer_step_and_its_gradients_equal_autodiff_of_the_plain_program(dtype, spatial):
    A, B, K_ti, K_t, _, w_ti, w_t = _problem(dtype, spatial)

    def plain(A, B, K_ti, K_t):
        G, _, _ = plain_nystrom(_gram(A, 0.1), K_ti, K_t, _gram(B))
        return jnp.sum(w_ti * G.ti) + jnp.sum(w_t * G.t) + jnp.sum(G.ii)

    def fused(A, B, K_ti, K_t):
        G, _, _ = nystrom(_gram(A, 0.1), K_ti, K_t, _gram(B))
        return jnp.sum(w_ti * G.ti) + jnp.sum(w_t * G.t) + jnp.sum(G.ii)

    rtol, atol = _tol(dtype)
    G_plain, checks_plain, _ = plain_nystrom(_gram(A, 0.1), K_ti, K_t, _gram(B))
    G_fused, checks, L = nystrom(_gram(A, 0.1), K_ti, K_t, _gram(B))
    for a, b in zip(G_fused, G_plain):
        assert a.dtype == dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    np.testing.assert_allclose(L, jnp.linalg.cholesky(_gram(A, 0.1)), rtol=rtol, atol=atol)
    np.testing.assert_allclose(checks["min_residual"], checks_plain["min_residual"], rtol=rtol)
    assert float(checks["min_residual"]) < 0 and bool(checks["chol_ok"])
    grads_plain = jax.jit(jax.grad(plain, argnums=(0, 1, 2, 3)))(A, B, K_ti, K_t)
    grads_fused = jax.jit(jax.grad(fused, argnums=(0, 1, 2, 3)))(A, B, K_ti, K_t)
    for a, b in zip(grads_fused, grads_plain):
        assert a.dtype == dtype
        np.testing.assert_allclose(a, b, rtol=10 * rtol, atol=10 * atol)
    assert float(jnp.max(jnp.abs(grads_fused[3].reshape(-1)[:2]))) == 0.0  # clipped residual: no gradient


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_output_moments_and_gradients_equal_the_triangular_solve_program(dtype):
    A, B, K_ti, K_t, mean, w_ti, _ = _problem(dtype)
    w_mean = w_ti[:, :3]

    def plain(A, B, K_ti, K_t, mean):  # the output step of dkm.forward written with solves against L
        L = jnp.linalg.cholesky(_gram(A, 0.1))
        X_s = solve_triangular(L, K_ti.T, lower=True)
        mu_s = solve_triangular(L, mean, lower=True)
        Y = solve_triangular(L, B / jnp.sqrt(6.0), lower=True)
        f_var = jnp.maximum(K_t - jnp.sum(X_s * X_s, 0), 0.0) + jnp.sum((Y.T @ X_s) ** 2, 0)
        return X_s.T @ mu_s, f_var, 0.5 * jnp.sum(mu_s * mu_s)

    def fused(A, B, K_ti, K_t, mean):
        return nystrom(_gram(A, 0.1), K_ti, K_t, _gram(B), mean)[0]

    def scalar(moments):
        def f(*args):
            f_mean, f_var, kl = moments(*args)
            return jnp.sum(w_mean * f_mean) + jnp.sum(jnp.sin(f_var)) + 1.7 * kl
        return f

    rtol, atol = _tol(dtype)
    args = (A, B, K_ti, K_t, mean)
    for a, b in zip(fused(*args), plain(*args)):
        assert a.dtype == dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    K_inv = np.linalg.inv(np.asarray(_gram(A, 0.1), np.float64))
    np.testing.assert_allclose(fused(*args)[2], 0.5 * np.sum(np.asarray(mean) * (K_inv @ np.asarray(mean))), rtol=rtol)
    grads_fused = jax.jit(jax.grad(scalar(fused), argnums=range(5)))(*args)
    for a, b in zip(grads_fused, jax.jit(jax.grad(scalar(plain), argnums=range(5)))(*args)):
        assert a.dtype == dtype
        np.testing.assert_allclose(a, b, rtol=10 * rtol, atol=10 * atol)


def _family(config, X, dtype):
    """The model family ``gpzoo.fit`` builds for ``config`` on X (the NNGP start) and its initial parameters."""
    spec = architecture_spec(config)
    init = initialise_inducing(spec.inducing, spec.covariance_model, np.asarray(X), spec.num_inducing, jax.random.PRNGKey(0))
    return build_family(spec, init, config.num_outputs), {k: jnp.asarray(v, dtype) for k, v in init.values.items()}


def _bound(family, X, y, num_data):
    """The bound ``gpzoo.fit`` maximises, ``(params, key) -> FastELBO`` of the family's model and guide."""
    return lambda p, k: -FastELBO().loss(k, p, family.model, family.guide, X, y, num_data=num_data)


@pytest.mark.parametrize("kl", ["taylor_frobenius", "exact"])
def test_objective_and_gradient_equal_the_autodiff_program(monkeypatch, kl, precision):
    """The bound ``gpzoo.fit`` maximises (an fc Gram layer with a mixing matrix 8 -> 6, SE kernel, softmax
    output, SKR on) and its gradient are the same with ``dkm.nystrom`` and with :func:`plain_nystrom`
    in the Gram layer, in float64 to rounding and in float32 to single precision. The reference
    differentiates the exact KL through its own factor of K_ii (:func:`plain_exact_kl`), where the
    library reuses the Nyström step's factor and a closed-form VJP; the Taylor forms read K_ii."""
    dtype = jnp.float64 if precision == "float64" else jnp.float32
    rng = np.random.default_rng(5)
    X = jnp.asarray(rng.normal(size=(20, 2)), dtype)
    y = jnp.asarray(rng.integers(0, 2, 20), dtype)
    config = DKMConfig(layers=(GramLayerSpec(6),), likelihood=Softmax(num_classes=2, num_mc_samples=4),
                       num_outputs=2, num_input_inducing=8, kernel="squared_exponential", nu=0.5, skr=True,
                       skr_gamma=4, kl=kl)
    family, params = _family(config, X, dtype)
    # move away from the NNGP start so every KL and gradient is non-zero (q_sqrt stays lower triangular)
    params = {k: v + jnp.asarray(0.05 * (np.tril if k == "q_sqrt" else np.asarray)(rng.normal(size=v.shape)), dtype)
              for k, v in params.items()}
    key = jax.random.PRNGKey(3)

    def value_and_grad():
        return jax.jit(jax.value_and_grad(_bound(family, X, y, 40)))(params, key)

    value, grads = value_and_grad()
    monkeypatch.setattr(dkm, "nystrom", plain_nystrom)
    monkeypatch.setattr(dkm, "_exact_kl", plain_exact_kl)
    value_plain, grads_plain = value_and_grad()
    rtol = 1e-10 if dtype == jnp.float64 else 1e-4
    assert value.dtype == dtype
    np.testing.assert_allclose(value, value_plain, rtol=rtol)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(grads_plain))
    for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(grads_plain)):
        assert a.dtype == dtype
        np.testing.assert_allclose(a, b, rtol=rtol * 10, atol=rtol * 10 * scale)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_frobenius_kl_vjp_diagonal_and_factor_equal_autodiff_of_their_formulas(dtype):
    """gram_kl("taylor_frobenius")'s closed-form VJP, the sliced diagonal and chol_factor's single select
    equal autodiff of the formulas they replace (cho_solve, jnp.diagonal, tril + diag(exp(diag)))."""
    from jax.scipy.linalg import cho_solve

    from gpzoo.models.kernels.gram import diagonal

    rng = np.random.default_rng(8)
    P = 6
    raw = jnp.asarray(0.3 * rng.normal(size=(P, P)), dtype)
    A = jnp.asarray(rng.normal(size=(P, P + 2)), dtype)
    W = jnp.asarray(rng.normal(size=(P, P)), dtype)
    rtol, atol = _tol(dtype)

    def factor_formula(r):
        return (jnp.tril(r, -1) + jnp.diag(jnp.exp(jnp.diagonal(r)))) / float(np.sqrt(P))

    def kl_formula(r, A):
        V, K = factor_formula(r), _gram(A, 0.1)
        D = cho_solve((V, True), K) - jnp.eye(P, dtype=dtype)
        return 0.25 * jnp.sum(D * D)

    def kl_library(r, A):
        return dkm.gram_kl(dkm.chol_factor(r), None, _gram(A, 0.1), "taylor_frobenius")

    np.testing.assert_array_equal(dkm.chol_factor(raw), factor_formula(raw))
    np.testing.assert_array_equal(diagonal(W), jnp.diagonal(W))
    np.testing.assert_allclose(jax.grad(lambda w: jnp.sum(jnp.sin(diagonal(w))))(W),
                               jax.grad(lambda w: jnp.sum(jnp.sin(jnp.diagonal(w))))(W), rtol=rtol, atol=atol)
    np.testing.assert_allclose(jax.grad(lambda r: jnp.sum(W * dkm.chol_factor(r)))(raw),
                               jax.grad(lambda r: jnp.sum(W * factor_formula(r)))(raw), rtol=rtol, atol=atol)
    np.testing.assert_allclose(kl_library(raw, A), kl_formula(raw, A), rtol=rtol)
    assert float(kl_library(raw, A)) > 1e-3
    for a, b in zip(jax.jit(jax.grad(kl_library, argnums=(0, 1)))(raw, A), jax.jit(jax.grad(kl_formula, argnums=(0, 1)))(raw, A)):
        assert a.dtype == dtype
        np.testing.assert_allclose(a, b, rtol=10 * rtol, atol=10 * atol * float(jnp.max(jnp.abs(b))))


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_exact_kl_vjp_equals_autodiff_through_the_cholesky_factor(dtype):
    """gram_kl("exact") with a given factor of K (no gradient through it) has the value and the gradients,
    with respect to V's raw parameters and to K, of the plain formula differentiated through chol K."""
    rng = np.random.default_rng(9)
    P = 6
    raw = jnp.asarray(0.3 * rng.normal(size=(P, P)), dtype)
    A = jnp.asarray(rng.normal(size=(P, P + 2)), dtype)
    rtol, atol = _tol(dtype)

    def kl_library(r, A):
        K = _gram(A, 0.1)
        return dkm.gram_kl(dkm.chol_factor(r), jax.lax.stop_gradient(jnp.linalg.cholesky(K)), K, "exact")

    def kl_formula(r, A):
        return plain_exact_kl(dkm.chol_factor(r), _gram(A, 0.1))

    np.testing.assert_allclose(kl_library(raw, A), kl_formula(raw, A), rtol=rtol)
    assert float(kl_library(raw, A)) > 1e-2
    np.testing.assert_allclose(dkm.gram_kl(dkm.chol_factor(raw), None, _gram(A, 0.1), "exact"), kl_formula(raw, A), rtol=rtol)
    for a, b in zip(jax.jit(jax.grad(kl_library, argnums=(0, 1)))(raw, A), jax.jit(jax.grad(kl_formula, argnums=(0, 1)))(raw, A)):
        assert a.dtype == dtype
        assert float(jnp.max(jnp.abs(b))) > 1e-3
        np.testing.assert_allclose(a, b, rtol=10 * rtol, atol=10 * atol * float(jnp.max(jnp.abs(b))))


def _step_config():
    return DKMConfig(layers=(GramLayerSpec(5),), likelihood=Bernoulli(), num_outputs=1, num_input_inducing=5,
                     kernel="squared_exponential", skr=False, skr_jitter=0.0, kl="taylor_frobenius")


def test_fit_step_is_adam_on_the_gradient_of_the_program_bound():
    """``gpzoo.fit`` on a DKM runs Adam (here β = (0.8, 0.9), the paper's) on the gradient of the
    program's bound with respect to the unconstrained parameters: after two steps its parameters equal
    optax's per-leaf Adam driven by ``jax.grad`` of −FastELBO (q_sqrt through NumPyro's lower-Cholesky
    bijection), on fit's own full-batch row order. Deterministic: no SKR, Bernoulli by Gauss–Hermite."""
    rng = np.random.default_rng(2)
    X = rng.normal(size=(12, 2))
    y = rng.integers(0, 2, 12).astype(float)
    config = _step_config()
    # eps well above the rounding of a near-zero gradient entry: with optax's 1e-8, Adam's first steps
    # (m / (sqrt(v) + eps), about sign(g)) turn a 1e-14 difference in such an entry between two correct
    # programs into 1e-8 in the parameters, and which entries sit there depends on the CPU's instruction set
    adam = optax.adam(1e-2, b1=0.8, b2=0.9, eps=1e-4)
    res = fit(architecture_spec(config), X, y, steps=2, seed=0, optimizer=adam, progress=False)
    family = res.family
    bijection = biject_to(constraints.lower_cholesky)

    def loss(u, rows):  # −bound at unconstrained u on the rows of one step
        params = dict(u, q_sqrt=bijection(u["q_sqrt"]))
        return -_bound(family, jnp.asarray(X[rows]), jnp.asarray(y[rows]), 12)(params, jax.random.PRNGKey(0))

    u = {k: jnp.asarray(v) for k, v in family.inducing.values.items()}
    u["q_sqrt"] = bijection.inv(u["q_sqrt"])
    state = adam.init(u)
    batches = BatchSchedule(12, 12, 0)
    for step in range(2):
        grads = jax.grad(loss)(u, batches(step))
        updates, state = adam.update(grads, state, u)
        u = optax.apply_updates(u, updates)
    u["q_sqrt"] = bijection(u["q_sqrt"])
    assert u.keys() == res.params.keys()
    for name, value in u.items():
        np.testing.assert_allclose(res.params[name], value, rtol=1e-7, atol=1e-10, err_msg=name)


@register_initialiser("dkm-gram-nan-output-mean")
def _nan_output_mean(config, X, num_inducing, key, method):
    """The NNGP start with one entry of q(u)'s mean NaN (the network itself is sound)."""
    values = dict(initialise_inducing(INDUCING_KIND, config, X, num_inducing, key, method).values)
    values["q_mu"] = np.asarray(values["q_mu"]).copy()
    values["q_mu"][0, 0] = np.nan
    return GramInitialisation(values)


def test_a_nan_in_the_parameters_stops_the_fit_naming_the_step():
    """A non-finite parameter the network checks do not see stops ``gpzoo.fit`` at the step where the
    bound became non-finite, with a ``TrainingError`` naming that step and the ELBO (not a
    ``NumericalError``: no layer's Cholesky or Nyström residual failed)."""
    rng = np.random.default_rng(2)
    X = rng.normal(size=(12, 2))
    y = rng.integers(0, 2, 12).astype(float)
    spec = architecture_spec(_step_config()).replace(inducing="dkm-gram-nan-output-mean")
    with pytest.raises(TrainingError, match="ELBO became nan at step 0") as err:
        fit(spec, X, y, steps=2, seed=0, progress=False)
    assert err.value.step == 0 and not isinstance(err.value, NumericalError)
