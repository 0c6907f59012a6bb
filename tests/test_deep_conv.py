"""Deep convolutional GPs (Dutordoir et al. 2020, §4, eq. 6): the bound's parts against their definitions.

float64 (conftest) unless a test says otherwise. Small grey 6×6 images, 3×3 patches at every
layer (6 → 4 → 2), a few inducing patches per layer, parameters set away from their initial values.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import pytest

from gpzoo.inference import evaluate_elbo, fit
from gpzoo.inference.deep_conv import DeepConvSVGP, DeepInducing
from gpzoo.inference.elbo import FastELBO
from gpzoo.inference.inducing import initialise_inducing
from gpzoo.inference.svgp import SVGP
from gpzoo.models import zoo
from gpzoo.models.errors import InvalidArgumentError, ShapeError
from gpzoo.models.kernels.deep_convolutional import DeepConvolutional

IMAGE = (6, 6)
N, M = 24, 5


def _data(seed=0, n=N):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, IMAGE[0] * IMAGE[1]))
    y = (X.reshape(n, *IMAGE)[:, :3].mean(axis=(1, 2)) > 0.5).astype(float)
    return X, y


def _spec(name, **options):
    return zoo.get(name, input_dim=IMAGE[0] * IMAGE[1], task="binary", image_shape=IMAGE, num_inducing=M,
                   **({"patch_shape": (3, 3)} | options))


def _tril(rng, *shape):
    return np.tril(rng.normal(size=shape) * 0.2) + 0.6 * np.eye(shape[-1])


def _params(family, rng, X):
    """Every param of the family's guide: q's random, everything else at its initial value."""
    tr = numpyro.handlers.trace(numpyro.handlers.seed(family.guide, 0)).get_trace(jnp.asarray(X[:2]), None, len(X))
    params = {}
    for name, site in tr.items():
        if site["type"] != "param":
            continue
        value = np.asarray(site["value"])
        if name.endswith("q_mu"):
            value = rng.normal(size=value.shape) * 0.5
        elif name.endswith("q_sqrt"):
            value = _tril(rng, *value.shape)
        params[name] = jnp.asarray(value)
    return params


def _fast_elbo(family, params, X, y, key, num_data=None):
    """The fast ELBO (one compiled program: eager dispatch of every small op costs more than compiling)."""
    @jax.jit
    def elbo(params, X, y, key):
        return -FastELBO().loss(key, params, family.model, family.guide, X, y, num_data=num_data or len(X))

    return elbo(params, jnp.asarray(X), jnp.asarray(y), key)


def _family(spec, X, seed=0):
    inducing = initialise_inducing(spec.inducing, spec.kernel, X, spec.num_inducing, jax.random.PRNGKey(seed), spec.inducing_init)
    return DeepConvSVGP(spec, inducing, 1) if isinstance(spec.kernel, DeepConvolutional) else SVGP(spec, inducing, 1)


# ----------------------------------------------------------------------------- bound
@pytest.mark.parametrize("kind", ["tick", "conv"])
def test_one_layer_deep_model_is_the_single_layer_model(kind, precision):
    """num_layers = 1: the deep model's fast ELBO equals weighted-tick's (weighted-conv's) at the same
    parameters — no hidden layer, no Monte Carlo (Bernoulli by quadrature), so to rounding."""
    X, y = _data()
    single = _family(_spec(f"weighted-{kind}"), X)
    deep_spec = _spec(f"deep-{kind}", num_layers=1)
    deep = DeepConvSVGP(deep_spec, DeepInducing((), single.inducing), 1)
    params = _params(single, np.random.default_rng(1), X)
    renamed = {name.replace("kernel.", "kernel.output.", 1).replace("inducing.", "inducing.output.", 1): value
               for name, value in params.items()}
    key = jax.random.PRNGKey(0)
    a, b = float(_fast_elbo(single, params, X, y, key)), float(_fast_elbo(deep, renamed, X, y, key))
    assert np.isfinite(a)
    np.testing.assert_allclose(b, a, rtol=1e-5 if precision == "float32" else 1e-12)


def _deep_family(name="deep-tick", **options):
    X, y = _data()
    spec = _spec(name, **options)
    family = _family(spec, X)
    return family, _params(family, np.random.default_rng(2), X), X, y


def _gaussian_kl(q_mu, q_sqrt):
    """Σ_c KL[N(m_c, L_c L_cᵀ) || N(0, I)] written out: ½ (tr S + mᵀm − M − log|S|)."""
    total = 0.0
    for m, L in zip(np.asarray(q_mu), np.asarray(q_sqrt)):
        S = L @ L.T
        total += 0.5 * (np.trace(S) + m @ m - len(m) - np.linalg.slogdet(S)[1])
    return total


def test_kl_is_the_sum_of_the_layers_analytic_kls():
    """Two layers, the hidden one with two channels: the family's KL, and the KL part of the fast ELBO
    (its value minus its data term), are Σ_ℓ KL[q(u_ℓ) || p(u_ℓ)], each written out."""
    family, params, X, y = _deep_family(hidden_channels=2)
    expected = _gaussian_kl(params["q_mu"], params["q_sqrt"]) + _gaussian_kl(params["hidden.1.q_mu"], params["hidden.1.q_sqrt"])
    @jax.jit
    def kls(params, X, y, key):
        with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
            kl = family.kl(family.parts())
        handlers = numpyro.handlers
        guide = handlers.trace(handlers.substitute(handlers.seed(family.guide, 1), data=params)).get_trace(X, y, N)
        model = handlers.trace(handlers.replay(handlers.substitute(handlers.seed(family.model, 2), data=params), guide)).get_trace(X, y, N)
        index = list(model).index("y")
        data_term = jnp.sum(model["y"]["infer"]["expected_log_lik"](guide["u"]["fn"], jax.random.fold_in(key, index)))
        return kl, data_term - FastELBO.elbo_of_traces(model, guide, key)

    kl, elbo_kl = kls(params, jnp.asarray(X), jnp.asarray(y), jax.random.PRNGKey(3))
    np.testing.assert_allclose(float(kl), expected, rtol=1e-10)
    np.testing.assert_allclose(float(elbo_kl), expected, rtol=1e-10)


def test_minibatch_estimates_average_to_the_full_data_elbo():
    """The mean of 200 minibatch fast-ELBO estimates (B = 6 of N = 24, scaled N/B) lies within 3 standard
    errors of evaluate_elbo's full-data estimate (eq. 6 estimated without bias, §4)."""
    X, y = _data()
    res = fit(_spec("deep-tick"), X, y, steps=0, progress=False)
    full = evaluate_elbo(res, num_samples=64)
    params = {k: jnp.asarray(v) for k, v in res.params.items()}
    family = res.family
    Xj, yj = jnp.asarray(X), jnp.asarray(y)

    def estimate(key):
        key_rows, key_elbo = jax.random.split(key)
        rows = jax.random.choice(key_rows, N, (6,), replace=False)
        return -FastELBO().loss(key_elbo, params, family.model, family.guide, Xj[rows], yj[rows], num_data=N)

    draws = np.asarray(jax.lax.map(jax.jit(estimate), jax.random.split(jax.random.PRNGKey(5), 200)))
    se = np.hypot(draws.std(ddof=1) / np.sqrt(len(draws)), full.stderr)
    assert full.stderr > 0 and abs(draws.mean() - full.elbo) < 3 * se, (draws.mean(), full.elbo, se)


def test_hidden_layer_without_variance_is_the_shallower_model_on_the_crop():
    """A hidden layer with (almost) zero prior variance and q mean 0 passes the centre crop through:
    the 2-layer deep-conv ELBO equals the 1-layer model's on the 4×4 crops, at the same output-layer parameters."""
    X, y = _data()
    two = _family(_spec("deep-conv", num_layers=2, hidden_variance=1e-12), X)
    crops = X.reshape(N, *IMAGE)[:, 1:5, 1:5].reshape(N, 16)
    one_spec = zoo.get("deep-conv", input_dim=16, task="binary", image_shape=(4, 4), num_inducing=M, patch_shape=(3, 3), num_layers=1)
    one = DeepConvSVGP(one_spec, DeepInducing((), two.inducing.output), 1)
    params = _params(two, np.random.default_rng(4), X)
    params["hidden.1.q_mu"] = jnp.zeros_like(params["hidden.1.q_mu"])
    one_params = {k: v for k, v in params.items() if not k.startswith(("hidden.", "kernel.layers", "inducing.layers"))}
    key = jax.random.PRNGKey(0)
    a, b = float(_fast_elbo(one, one_params, crops, y, key)), float(_fast_elbo(two, params, X, y, key))
    kl_hidden = _gaussian_kl(params["hidden.1.q_mu"], params["hidden.1.q_sqrt"])
    np.testing.assert_allclose(b, a - kl_hidden, rtol=1e-6)


# ----------------------------------------------------------------------------- hidden sampling schemes
def _brute_force_patch_kff(images, base, patch):
    """Kff between every pair of h×w patches of each image ``[N, P, P]``, patches cut out one by one."""
    N, H, W = images.shape[:3]
    rows = [images[:, i:i + patch[0], j:j + patch[1]].reshape(N, -1) for i in range(H - patch[0] + 1) for j in range(W - patch[1] + 1)]
    patches = np.stack(rows, axis=1)  # [N, P, E]
    return np.stack([np.asarray(base.K(jnp.asarray(p), jnp.asarray(p))) for p in patches])


@pytest.mark.parametrize("scheme, precision", [("inducing", "float32"), ("marginal", "float64"), ("full", "float32"),
                                               ("full", "float64")], indirect=["precision"])
def test_hidden_sampling_schemes_draw_the_distributions_they_name(scheme, precision):
    """Dutordoir et al. 2020, §4.1. Every scheme has mean crop + A m and per-patch variance ‖A_p S‖² + (Kff − Qff)_pp;
    between patches, "inducing" has covariance A S Sᵀ Aᵀ, "marginal" none, "full" A S Sᵀ Aᵀ + (Kff − Qff) with Kff
    brute-forced over explicit patches. 4,000 draws; every entry within 5.5 standard errors."""
    family, params, X, _ = _deep_family("deep-conv", num_layers=2, hidden_channels=2, hidden_sampling=scheme)
    dtype = jnp.float64 if precision == "float64" else jnp.float32
    params = {k: jnp.asarray(v, dtype) for k, v in params.items()}
    images = jnp.asarray(X[:2].reshape(2, *IMAGE, 1), dtype)
    with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
        layer = family.prior_parts().hidden[0]
    A, crop, residual = (np.asarray(a, np.float64) for a in layer.moments(images))  # [B, P, M], [B, P, C], [B, P]
    q_mu, q_sqrt = np.asarray(layer.q_mu, np.float64), np.asarray(layer.q_sqrt, np.float64)
    kff = _brute_force_patch_kff(np.asarray(images, np.float64), family.spec.kernel.layers[0].base_kernel.resolved(), (3, 3))
    draw = jax.jit(jax.vmap(lambda k: family.hidden_draw(layer, images, *jax.random.split(k))))
    samples = np.asarray(draw(jax.random.split(jax.random.PRNGKey(1), 4000)), np.float64)  # [S, B, P, C]
    assert samples.dtype == np.float64 and draw(jax.random.split(jax.random.PRNGKey(1), 2)).dtype == dtype
    P = A.shape[1]
    for b in range(2):
        np.testing.assert_allclose(np.diagonal(kff[b]), residual[b] + np.sum(A[b] ** 2, -1), rtol=1e-4)  # the same Kff diagonal
        for c in range(2):
            through_q = A[b] @ q_sqrt[c] @ q_sqrt[c].T @ A[b].T  # [P, P]
            cov = {"inducing": through_q + np.diag(residual[b]), "marginal": np.diag(np.diag(through_q) + residual[b]),
                   "full": through_q + kff[b] - A[b] @ A[b].T}[scheme]
            x = samples[:, b, :, c]  # [S, P]
            mean_se = np.sqrt(np.diag(cov) / len(x))
            assert np.all(np.abs(x.mean(0) - (crop[b, :, c] + A[b] @ q_mu[c])) < 5.5 * mean_se + 1e-5)
            cov_se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / len(x))  # [P, P]
            assert np.all(np.abs(np.cov(x.T) - cov) < 5.5 * cov_se + 1e-5), scheme
            off = ~np.eye(P, dtype=bool)
            assert np.max(np.abs(through_q[off]) / cov_se[off]) > 10  # the schemes are told apart


def test_full_sampling_model_has_every_between_patch_covariance():
    """With hidden_sampling="full" the model's p(h_1 | x, v) is Normal with covariance (Kff − Qff + jitter·I) ⊗ I_C
    over the patch-major outputs, Kff brute-forced over explicit patches; "inducing" keeps its diagonal only."""
    for scheme in ("full", "inducing"):
        family, params, X, _ = _deep_family("deep-conv", num_layers=2, hidden_channels=2, hidden_sampling=scheme)
        images = jnp.asarray(X[:2].reshape(2, *IMAGE, 1))
        with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
            layer = family.prior_parts().hidden[0]
            latent = family._hidden_latent(layer, images, params["hidden.1.q_mu"])
        A = np.asarray(layer.moments(images)[0])
        kff = _brute_force_patch_kff(np.asarray(images), family.spec.kernel.layers[0].base_kernel.resolved(), (3, 3))
        for b in range(2):
            R = kff[b] - A[b] @ A[b].T
            jitter = family.spec.jitter * np.eye(len(R))  # the factorisation's, as for Kuu
            expected = np.kron(R + jitter, np.eye(2)) if scheme == "full" else np.kron(np.diag(np.diag(R)), np.eye(2))
            got = np.asarray(latent.covariance_matrix[b]) if scheme == "full" else np.diag(np.asarray(latent.base_dist.scale[b]) ** 2)
            np.testing.assert_allclose(got, expected, atol=1e-5 * np.max(np.abs(R)))


@pytest.mark.parametrize("scheme, precision", [("marginal", "float32"), ("full", "float64")], indirect=["precision"])
def test_each_hidden_sampling_scheme_fits_predicts_and_compiles_once(scheme, precision):
    """Each scheme fits and predicts; a second fit (other data, seed, steps, learning rate) and a prediction on
    another number of rows compile nothing: the scheme is part of the programs' key, not a value baked in."""
    from gpzoo.inference import predict
    from gpzoo.inference.programs import CompileCounter

    X, y = _data()
    res = fit(_spec("deep-tick", num_layers=2, hidden_sampling=scheme), X, y, steps=5, progress=False)
    assert res.spec.kernel.sampling == scheme and np.all(np.isfinite(res.objective_history))
    assert res.params["q_mu"].dtype == np.dtype(precision)
    probs = np.asarray(predict(res, X[:4]).probs)
    assert probs.shape[0] == 4 and np.all((probs >= 0) & (probs <= 1))
    X2, y2 = _data(seed=1)
    with CompileCounter() as counter:
        again = fit(_spec("deep-tick", num_layers=2, hidden_sampling=scheme), X2, y2, steps=8, seed=3, learning_rate=0.02,
                    progress=False)
        predict(again, X2[:7])
    assert counter.count == 0


# ----------------------------------------------------------------------------- options and errors
def test_default_patches_are_clipped_to_fit_and_layers_chain():
    """Default 5×5 patches on 6×6 images through two layers become 3×3 (6 → 4 → 2); on 28×28 they stay
    5×5 (28 → 24 → 20, the paper's §4 example); channels chain from layer to layer."""
    small = zoo.get("deep-tick", image_shape=(6, 6), task="binary", num_layers=2).kernel
    assert [k.patch_shape for k in small.layers + (small.output,)] == [(3, 3), (3, 3)]
    big = zoo.get("deep-conv", image_shape=(28, 28), task="multiclass", num_classes=10, num_layers=3, hidden_channels=(3, 2)).kernel
    assert [k.patch_shape for k in big.layers] == [(5, 5), (5, 5)] and big.output.image_shape == (20, 20, 2)
    assert big.layers[1].image_shape == (24, 24, 3)


@pytest.mark.parametrize("options, argument", [
    ({"num_layers": 4}, "num_layers"),
    ({"num_layers": 2, "patch_shape": (5, 5)}, "patch_shape"),
    ({"num_layers": 3, "hidden_channels": (1, 2, 3)}, "hidden_channels"),
    ({"num_layers": 2, "patch_sides": (3,)}, "patch_sides"),
    ({"num_layers": 2, "hidden_variance": 0.0}, "hidden_variance"),
    ({"num_layers": 2, "hidden_sampling": "patches"}, "hidden_sampling"),
])
def test_bad_options_raise_typed_errors_naming_them(options, argument):
    with pytest.raises(InvalidArgumentError) as info:
        zoo.get("deep-tick", image_shape=(6, 6), task="binary", **options)
    assert info.value.argument == argument


def test_layers_that_do_not_chain_are_refused():
    spec = _spec("deep-conv", num_layers=2)
    kernel = spec.kernel
    with pytest.raises(ShapeError) as info:
        DeepConvolutional(kernel.layers, kernel.layers[0], channels=kernel.channels, num_inducing=kernel.num_inducing)
    assert info.value.argument in ("output", "layers[0]")
    with pytest.raises(InvalidArgumentError) as info:
        kernel.K(np.zeros((1, 36)))
    assert info.value.argument == "kernel"


def test_user_given_deep_inducing_is_checked_layer_by_layer():
    """Inducing sets for another depth, or patches of the wrong size in one layer, are refused before any tracing."""
    X, y = _data()
    spec = _spec("deep-conv", num_layers=2)
    inducing = initialise_inducing(spec.inducing, spec.kernel, X, M, jax.random.PRNGKey(0), spec.inducing_init)
    for wrong in (DeepInducing((), inducing.output),
                  DeepInducing((type(inducing.layers[0])(inducing.layers[0].Z[:, :4]),), inducing.output)):
        with pytest.raises(InvalidArgumentError) as info:
            fit(spec, X, y, steps=1, inducing=wrong, progress=False)
        assert info.value.argument == "inducing"
