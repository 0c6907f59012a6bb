"""TICK (Dutordoir et al. 2020, §3.2, eq. 2) and the multi-output convolutional layer (eq. 3–5) against brute force.

float64 (conftest) unless a test says otherwise. Brute-force references take patches and their
locations with explicit Python loops over (row, col) and sum kernel values one patch pair at a
time, independently of the library's patch machinery and of its location convention.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpzoo.inference import conv_layer
from gpzoo.inference.conv_layer import centre_crop
from gpzoo.inference.guides import conditional
from gpzoo.inference.inducing import InducingPatches, Kuf, Kuu
from test_convolutional import _rectangles
from gpzoo.inference.inducing import InducingPatchesWithLocations, initial_patches_with_locations, initialise_inducing
from gpzoo.models import kernels
from gpzoo.models.errors import InvalidArgumentError, ShapeError
from gpzoo.models.kernels import TICK, Convolutional, WeightedConvolutional, patch_locations
from gpzoo.models.kernels.convolutional import extract_patches
from gpzoo.models.parameters import Fixed

IMAGE, PATCH = (7, 10), (3, 4)  # non-square image and patch: H_out = 5, W_out = 7, P = 35
H_OUT, W_OUT = 5, 7
LS, VAR, LOC_LS = 0.9, 1.7, 0.3


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(0)


def _base(ls=LS, var=VAR):
    return kernels.SquaredExponential(lengthscale=ls, variance=var)


def _tick(weights, loc_ls=LOC_LS, shape=IMAGE, patch=PATCH, base=None, normalisation="sum", **options):
    return TICK(base or _base(), shape, patch, location_lengthscale=loc_ls, weights=weights, normalisation=normalisation, **options)


def _data(rng, N=4, M=4, shape=IMAGE, patch=PATCH):
    C = shape[2] if len(shape) == 3 else 1
    X = rng.uniform(size=(N, int(np.prod(shape))))
    Z = rng.uniform(size=(M, patch[0] * patch[1] * C))
    Z_loc = rng.uniform(size=(M, 2))
    return X, Z, Z_loc


# ----------------------------------------------------------------------------- brute force
def _se(a, b, ls):
    return np.exp(-0.5 * np.sum(((np.asarray(a) - np.asarray(b)) / ls) ** 2))


def _loop_patches(image, patch):
    """(patches [P, h*w*C], locations [P, 2]) of one image [H, W, C] by loops over (row, col).

    The location of patch (r, c) is written out independently of the library: the upper-left
    corner (r, c) divided by that of the last patch, row first."""
    H, W, _ = image.shape
    h, w = patch
    H_out, W_out = H - h + 1, W - w + 1
    patches, locations = [], []
    for r in range(H_out):
        for c in range(W_out):
            patches.append(image[r : r + h, c : c + w, :].reshape(-1))
            locations.append((r / (H_out - 1) if H_out > 1 else 0.0, c / (W_out - 1) if W_out > 1 else 0.0))
    return np.array(patches), np.array(locations)


def _images(X, shape):
    return np.asarray(X).reshape((len(X),) + (tuple(shape) if len(shape) == 3 else tuple(shape) + (1,)))


def _brute(X, Z, Z_loc, weights, shape=IMAGE, patch=PATCH, k_patch=None, loc_ls=LOC_LS):
    """(Kuu [M, M], Kuf [M, N], Kff [N, N]) of TICK by explicit sums over [N, P, N, P] patch pairs."""
    k_patch = k_patch or (lambda a, b: VAR * _se(a, b, LS))
    per_image = [_loop_patches(img, patch) for img in _images(X, shape)]
    N, M = len(X), len(Z)
    Kuu_ = np.array([[k_patch(Z[a], Z[b]) * _se(Z_loc[a], Z_loc[b], loc_ls) for b in range(M)] for a in range(M)])
    Kuf_ = np.zeros((M, N))
    Kff = np.zeros((N, N))
    for n, (Pn, Ln) in enumerate(per_image):
        for m in range(M):
            Kuf_[m, n] = sum(weights[p] * k_patch(Z[m], Pn[p]) * _se(Z_loc[m], Ln[p], loc_ls) for p in range(len(Pn)))
        for n2, (Pm, Lm) in enumerate(per_image):
            Kff[n, n2] = sum(weights[p] * weights[q] * k_patch(Pn[p], Pm[q]) * _se(Ln[p], Lm[q], loc_ls)
                             for p in range(len(Pn)) for q in range(len(Pm)))
    return Kuu_, Kuf_, Kff


@jax.jit
def _all_at_once(kern, Z, Z_loc, X):
    inducing = InducingPatchesWithLocations(Z, Z_loc)
    return Kuu(inducing, kern)[0], Kuf(inducing, kern, X)[0], kern.K_diag(X), kern.K(X)


def evaluate_sweep(kern, Z, Z_loc, X):
    """(Kuu, Kuf, K_diag, K) of a TICK kernel in one compiled call. The kernel is an argument, so
    kernels of one structure share the compilation (which dominates this file's time)."""
    return tuple(np.asarray(a) for a in _all_at_once(kern, *(jnp.asarray(a) for a in (Z, Z_loc, X))))


# ----------------------------------------------------------------------------- location convention
def test_patch_locations_are_row_first_and_normalised_on_a_non_square_grid():
    """ℓ of patch (r, c) is exactly (r/(H_out − 1), c/(W_out − 1)) at index r·W_out + c — the
    order of the patches themselves — and a single row or column of patches sits at 0."""
    locations = patch_locations(IMAGE, PATCH)
    assert locations.shape == (H_OUT * W_OUT, 2)
    for r in range(H_OUT):
        for c in range(W_OUT):
            assert tuple(locations[r * W_OUT + c]) == (r / (H_OUT - 1), c / (W_OUT - 1))
    X = np.arange(70.0)[None]
    patches = np.asarray(extract_patches(jnp.asarray(X).reshape(1, 7, 10, 1), PATCH))[0]  # [P, E]
    np.testing.assert_array_equal(patches, _loop_patches(_images(X, IMAGE)[0], PATCH)[0])  # same patch order
    np.testing.assert_array_equal(patch_locations((3, 10), (3, 4))[:, 0], 0.0)  # H_out = 1
    np.testing.assert_array_equal(patch_locations((3, 10), (3, 4))[:, 1], np.arange(7) / 6)
    np.testing.assert_array_equal(patch_locations((6, 4), (2, 4))[:, 1], 0.0)  # W_out = 1
    np.testing.assert_array_equal(patch_locations((4, 4), (4, 4)), [[0.0, 0.0]])  # one patch


def test_initialised_inducing_points_sit_where_their_patch_came_from(rng):
    """Each initial inducing patch is a training patch p with z_loc = ℓ(p) exactly, so
    k_loc(z_loc, ℓ(p)) = 1 for the data's own locations (no pixel / (col, row) mismatch)."""
    X = rng.uniform(size=(4, 70))  # all patches distinct: each one identifies its (image, r, c)
    kern = TICK.create(_base(), IMAGE, PATCH, LOC_LS)
    Z, Z_loc = initial_patches_with_locations(kern, X, 12, np.random.default_rng(1))
    where = {tuple(p): loc for x in _images(X, IMAGE) for p, loc in zip(*_loop_patches(x, PATCH))}
    assert Z.shape == (12, 12) and Z_loc.shape == (12, 2) and len({tuple(z) for z in Z}) == 12
    for z, loc in zip(Z, Z_loc):
        np.testing.assert_array_equal(loc, where[tuple(z)])
    K_loc = np.asarray(kernels.location_gram(jnp.asarray(kern.locations()), jnp.asarray(Z_loc), LOC_LS))  # [P, M]
    for m, loc in enumerate(Z_loc):
        p = int(np.flatnonzero((kern.locations() == loc).all(axis=1))[0])
        assert K_loc[p, m] == 1.0
    inducing = initialise_inducing("patch-locations", kern, X, 5, jax.random.PRNGKey(0))
    assert isinstance(inducing, InducingPatchesWithLocations) and inducing.Z.shape == (5, 12)


# ----------------------------------------------------------------------------- exactness
#: The static configuration most tests share (one compilation of ``_all_at_once`` for N = M = 4).
FUSED = dict(kuf_method="fused", kff_method="fused", kff_block=8)


def test_fast_paths_equal_brute_force_pair_sums(rng):
    """Kuu, Kuf (fused, and autodiff with either patch-product strategy), the Kff diagonal (fused
    sweep, checkpointed row blocks, naive) and the full K on a 7×10 image with 3×4 patches equal
    explicit sums over [N, P, N, P] patch pairs (Dutordoir et al. 2020, eq. 2, §4.2)."""
    X, Z, Z_loc = _data(rng)
    weights = rng.normal(size=H_OUT * W_OUT)
    Kuu_, Kuf_, Kff = _brute(X, Z, Z_loc, weights)
    for a, b in zip(evaluate_sweep(_tick(weights, **FUSED), Z, Z_loc, X), (Kuu_, Kuf_, np.diag(Kff), Kff)):
        np.testing.assert_allclose(a, b, rtol=1e-10)
    kuf = jax.jit(lambda k, Z, Z_loc, X: k.Kzx(Z, X, Z_loc=Z_loc)[0])
    for options in (dict(kuf_method="autodiff", products="conv"), dict(kuf_method="autodiff", products="matmul")):
        np.testing.assert_allclose(kuf(_tick(weights, **options), Z, Z_loc, X), Kuf_, rtol=1e-10)
    kff = jax.jit(lambda k, X: k.K_diag(X))
    for method in ("checkpoint", "naive"):
        np.testing.assert_allclose(kff(_tick(weights, kff_method=method, kff_block=8), X), np.diag(Kff), rtol=1e-10)


def test_colour_patches_and_generic_patch_kernel_equal_brute_force(rng):
    """Colour images (a patch is h×w×C values) with an SE patch kernel, and a Matérn patch kernel
    (the generic paths: autodiff Kuf, checkpointed Kff row blocks)."""
    shape = (5, 6, 2)
    X, Z, Z_loc = _data(rng, N=2, M=3, shape=shape, patch=(2, 3))
    weights = rng.normal(size=4 * 4)
    Kuu_, Kuf_, Kff = _brute(X, Z, Z_loc, weights, shape=shape, patch=(2, 3))
    matern = kernels.Matern32(lengthscale=0.7, variance=1.2)

    def matern32(a, b):
        r = np.sqrt(3.0) * np.sqrt(np.sum(((a - b) / 0.7) ** 2))
        return 1.2 * (1.0 + r) * np.exp(-r)

    want = _brute(X, Z, Z_loc, weights, shape=shape, patch=(2, 3), k_patch=matern32)
    for base, (Kuu_, Kuf_, Kff) in ((None, (Kuu_, Kuf_, Kff)), (matern, want)):
        got = evaluate_sweep(_tick(weights, shape=shape, patch=(2, 3), base=base), Z, Z_loc, X)
        for a, b in zip(got, (Kuu_, Kuf_, np.diag(Kff), Kff)):
            np.testing.assert_allclose(a, b, rtol=1e-10)


def test_long_location_lengthscale_gives_the_convolutional_kernel(rng):
    """k_loc ≡ 1 (ℓ_loc → ∞): TICK equals Convolutional (unit weights) and WeightedConvolutional
    (Kuu, Kuf, Kff diagonal and full) to 1e-10, whatever the inducing locations."""
    X, Z, Z_loc = _data(rng)
    conv_all = jax.jit(lambda k, Z, X: (k.Kzz(Z)[0], k.Kzx(Z, X)[0], k.K_diag(X), k.K(X)))
    w = rng.normal(size=H_OUT * W_OUT)
    pairs = [
        (Convolutional(_base(), IMAGE, PATCH, normalisation="sum", **FUSED), _tick(np.ones(H_OUT * W_OUT), loc_ls=1e8, **FUSED)),
        (WeightedConvolutional(_base(), IMAGE, PATCH, weights=w, normalisation="sum", **FUSED), _tick(w, loc_ls=1e8, **FUSED)),
    ]
    for conv, tick in pairs:
        for a, b in zip(evaluate_sweep(tick, Z, Z_loc, X), conv_all(conv, jnp.asarray(Z), jnp.asarray(X))):
            np.testing.assert_allclose(a, b, rtol=1e-10)


def test_short_location_lengthscale_compares_patches_at_the_same_place(rng):
    """ℓ_loc → 0: Kff(x, x') = Σ_p w_p² k_patch(x^[p], x'^[p])."""
    X, Z, Z_loc = _data(rng)
    weights = rng.normal(size=H_OUT * W_OUT)
    _, _, K_diag, K = evaluate_sweep(_tick(weights, loc_ls=1e-3, **FUSED), Z, Z_loc, X)
    patches = [_loop_patches(img, PATCH)[0] for img in _images(X, IMAGE)]
    want = np.array([[sum(weights[p] ** 2 * VAR * _se(a[p], b[p], LS) for p in range(len(a))) for b in patches] for a in patches])
    np.testing.assert_allclose(K, want, rtol=1e-10)
    np.testing.assert_allclose(K_diag, np.diag(want), rtol=1e-10)


def test_joint_prior_of_inducing_and_function_values_is_psd(rng):
    """[[Kuu, Kuf], [Kfu, Kff]] is a covariance matrix: smallest eigenvalue ≥ −1e-8·trace."""
    X, Z, Z_loc = _data(rng)
    Kuu_, Kuf_, K_diag, K = evaluate_sweep(_tick(rng.normal(size=H_OUT * W_OUT), **FUSED), Z, Z_loc, X)
    joint = np.block([[Kuu_, Kuf_], [Kuf_.T, K]])
    np.testing.assert_allclose(np.diag(K), K_diag, rtol=1e-10)
    assert np.linalg.eigvalsh(joint).min() >= -1e-8 * np.trace(joint)


# ----------------------------------------------------------------------------- gradients
def _jnp_brute(params, X, shape=IMAGE, patch=PATCH):
    """(Kuf [M, N], Kff diagonal [N]) by explicit differences ([N, P, M, E] and [N, P, P, E]), for autodiff."""
    h, w = patch
    images = X.reshape((X.shape[0],) + shape + (1,))
    H_out, W_out = shape[0] - h + 1, shape[1] - w + 1
    patches = jnp.stack([images[:, r : r + h, c : c + w, :].reshape(X.shape[0], -1)
                         for r in range(H_out) for c in range(W_out)], axis=1)  # [N, P, E]
    locations = jnp.array([(r / (H_out - 1), c / (W_out - 1)) for r in range(H_out) for c in range(W_out)])  # [P, 2]

    def k(a, b, loc_a, loc_b):  # [..., E], [..., 2]
        return params["var"] * jnp.exp(-0.5 * jnp.sum(((a - b) / params["ls"]) ** 2, -1)
                                       - 0.5 * jnp.sum(((loc_a - loc_b) / params["loc_ls"]) ** 2, -1))

    Kpm = k(patches[:, :, None], params["Z"][None, None], locations[None, :, None], params["Z_loc"][None, None])  # [N, P, M]
    Kpq = k(patches[:, :, None], patches[:, None], locations[None, :, None], locations[None, None])  # [N, P, P]
    wts = params["w"]
    return jnp.einsum("p,npm->mn", wts, Kpm), jnp.einsum("p,npq,q->n", wts, Kpq, wts)


def test_fast_path_gradients_equal_autodiff_of_brute_force(rng):
    """Gradients of the fused Kuf and Kff-diagonal paths w.r.t. ℓ_loc, Z_loc and Z (and ℓ, σ², w)
    equal plain autodiff of the explicit sums."""
    X, Z, Z_loc = _data(rng, N=3, M=4)
    X = jnp.asarray(X)
    params = dict(ls=jnp.float64(LS), var=jnp.float64(VAR), loc_ls=jnp.float64(LOC_LS), Z=jnp.asarray(Z),
                  Z_loc=jnp.asarray(Z_loc), w=jnp.asarray(rng.normal(size=H_OUT * W_OUT)))
    ct_uf, ct_ff = jnp.asarray(rng.normal(size=(4, 3))), jnp.asarray(rng.normal(size=3))

    def fast(p):
        kern = TICK(_base(p["ls"], p["var"]), IMAGE, PATCH, location_lengthscale=p["loc_ls"], weights=p["w"],
                    normalisation="sum", kuf_method="fused", kff_method="fused", kff_block=8)
        Kmn = kern.Kzx(p["Z"], X, Z_loc=p["Z_loc"])[0]  # [M, N]
        return jnp.sum(ct_uf * Kmn) + jnp.dot(ct_ff, kern.K_diag(X))

    def brute(p):
        Kmn, Kdiag = _jnp_brute(p, X)
        return jnp.sum(ct_uf * Kmn) + jnp.dot(ct_ff, Kdiag)

    value, got = jax.jit(jax.value_and_grad(fast))(params)
    want_value, want = jax.jit(jax.value_and_grad(brute))(params)
    np.testing.assert_allclose(value, want_value, rtol=1e-12)
    for name in ("loc_ls", "Z_loc", "Z", "ls", "var", "w"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-9, atol=1e-12, err_msg=name)


def test_fast_paths_equal_brute_force_in_float32(rng, float32):
    X, Z, Z_loc = _data(rng, N=3, M=4)
    weights = rng.normal(size=H_OUT * W_OUT)
    Kuu_, Kuf_, Kff = _brute(X, Z, Z_loc, weights)
    kern = _tick(np.float32(weights), **FUSED)
    got = evaluate_sweep(kern, np.float32(Z), np.float32(Z_loc), np.float32(X))
    assert all(a.dtype == np.float32 for a in got)
    scale = np.abs(Kff).max()
    for a, b in zip(got, (Kuu_, Kuf_, np.diag(Kff), Kff)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * scale)


# ----------------------------------------------------------------------------- the multi-output layer
#: Compiled once per kernel structure and argument shapes; the layer tests share shapes so that
#: compilations (about a second each) are reused.
conv_layer_conditional = jax.jit(conv_layer.conv_layer_conditional, static_argnames=("full_cov", "mean"))
LAYER_IMAGE = IMAGE + (2,)  # C_in = 2: a patch is 3×4×2 values
C_OUT, M_LAYER = 2, 4


def _whitened_q(rng, M=M_LAYER, C_out=C_OUT):
    q_mu = rng.normal(size=(M, C_out))
    q_sqrt = np.tril(rng.normal(size=(C_out, M, M)) * 0.3) + np.eye(M) * 0.5  # [C_out, M, M]
    return q_mu, q_sqrt


def _prior_q(M=M_LAYER, C_out=C_OUT):
    """q(u) = p(u) in whitened coordinates, with one S per output channel."""
    return np.zeros((M, C_out)), np.broadcast_to(np.eye(M), (C_out, M, M))


def _layer_kernels(shape, patch):
    conv = Convolutional(_base(), shape, patch, normalisation="sum", kff_method="fused")
    tick = TICK.create(_base(), shape, patch, LOC_LS, weighted=False, normalisation="sum")
    return conv, tick


def _inducing(kern, Z, Z_loc):
    return InducingPatchesWithLocations(jnp.asarray(Z), jnp.asarray(Z_loc)) if isinstance(kern, TICK) else InducingPatches(jnp.asarray(Z))


@pytest.fixture(scope="module")
def layer_data():
    rng = np.random.default_rng(3)
    images = rng.uniform(size=(3,) + LAYER_IMAGE)  # [N, H, W, C_in]
    _, Z, Z_loc = _data(rng, M=M_LAYER, shape=LAYER_IMAGE)
    return images, Z, Z_loc


def test_prior_layer_returns_the_crop_and_the_prior_and_sums_to_the_single_output_kernel(layer_data):
    """With q(u) = p(u): the mean is exactly the identity mean, a centre crop (rows (h−1)//2 + r,
    columns (w−1)//2 + c); the marginal variance is the prior variance of each output; the P×P
    covariance is the prior of eq. 4 (× k_loc), which summed over p, q is the single-output conv
    (TICK) kernel's Kff diagonal, with multi-channel patches as in the conv kernel."""
    images, Z, Z_loc = layer_data
    X = images.reshape(len(images), -1)
    crop = np.array([[images[n, r + 1, c + 1] for r in range(H_OUT) for c in range(W_OUT)] for n in range(3)])  # [N, P, C_in]
    np.testing.assert_array_equal(np.asarray(centre_crop(jnp.asarray(images), PATCH)).reshape(3, -1, 2), crop)
    for kern in _layer_kernels(LAYER_IMAGE, PATCH):
        inducing = _inducing(kern, Z, Z_loc)
        marginal = conv_layer_conditional(images, kern, inducing, np.zeros((M_LAYER, C_OUT)), np.eye(M_LAYER))  # shared S
        np.testing.assert_array_equal(marginal.mean, crop)
        assert marginal.var.shape == (3, H_OUT * W_OUT)
        np.testing.assert_allclose(marginal.var, VAR, rtol=1e-10)  # k_patch(x, x) k_loc(ℓ, ℓ) = σ²
        full = conv_layer_conditional(images, kern, inducing, *_prior_q(), full_cov=True)
        assert full.cov.shape == (3, C_OUT, H_OUT * W_OUT, H_OUT * W_OUT)
        np.testing.assert_array_equal(full.mean, crop)
        np.testing.assert_allclose(full.cov.sum(axis=(2, 3)), np.stack([kern.K_diag(X)] * C_OUT, axis=1), rtol=1e-10)


def test_identity_mean_maps_channels():
    """C_in ≠ C_out: channel c to channel c, new channels zero, extra ones dropped; or ``mean_weights``."""
    images = jnp.asarray(np.random.default_rng(4).uniform(size=(2, 5, 6, 2)))
    crop = np.asarray(centre_crop(images, (3, 3))).reshape(2, -1, 2)  # [N, P, 2]
    wider = np.asarray(conv_layer.identity_mean(images, (3, 3), 3))
    np.testing.assert_array_equal(wider[..., :2], crop)
    np.testing.assert_array_equal(wider[..., 2], 0.0)
    np.testing.assert_array_equal(np.asarray(conv_layer.identity_mean(images, (3, 3), 1))[..., 0], crop[..., 0])
    mixed = np.asarray(conv_layer.identity_mean(images, (3, 3), 1, mean_weights=np.full((2, 1), 0.5)))
    np.testing.assert_allclose(mixed[..., 0], crop.mean(-1), rtol=1e-12)


def test_layer_marginals_are_the_diagonal_of_the_full_covariance(layer_data):
    images, Z, Z_loc = layer_data
    q_mu, q_sqrt = _whitened_q(np.random.default_rng(5))
    tick = _layer_kernels(LAYER_IMAGE, PATCH)[1]
    inducing = _inducing(tick, Z, Z_loc)
    marginal = conv_layer_conditional(images, tick, inducing, q_mu, q_sqrt)
    full = conv_layer_conditional(images, tick, inducing, q_mu, q_sqrt, full_cov=True)
    assert marginal.mean.shape == (3, H_OUT * W_OUT, C_OUT) and marginal.var.shape == (3, H_OUT * W_OUT, C_OUT)
    np.testing.assert_allclose(marginal.mean, full.mean, rtol=1e-10)
    np.testing.assert_allclose(marginal.var, np.swapaxes(np.diagonal(full.cov, axis1=-2, axis2=-1), 1, 2), rtol=1e-10)
    np.testing.assert_allclose(marginal.var, full.var, rtol=1e-10)
    assert np.all(marginal.var > 0) and not np.allclose(marginal.mean, full.mean[..., :1])


def test_layer_with_one_whole_image_patch_is_the_base_kernel_svgp(rng):
    """patch = whole image: one output, whose q(f) is the plain SVGP conditional of the base kernel
    with inducing points Z in image space (van der Wilk et al. 2017, eq. 6); k_loc(ℓ, z_loc) = 1."""
    shape = (3, 4)
    images = rng.uniform(size=(5,) + shape + (1,))
    X = images.reshape(5, -1)
    Z = rng.uniform(size=(M_LAYER, 12))
    q_mu, q_sqrt = _whitened_q(rng)
    Luu = jnp.linalg.cholesky(_base().K(Z) + conv_layer.DEFAULT_JITTER * np.eye(M_LAYER))
    want_mean, want_var = conditional(_base().K(Z, X)[None], Luu[None], _base().K_diag(X), q_mu.T, q_sqrt, "full", True)
    for kern in _layer_kernels(shape, shape):
        out = conv_layer_conditional(images, kern, _inducing(kern, Z, np.zeros((M_LAYER, 2))), q_mu, q_sqrt, mean="zero")
        np.testing.assert_allclose(out.mean[:, 0], want_mean, rtol=1e-10)
        np.testing.assert_allclose(out.var[:, 0], want_var, rtol=1e-10)


# ----------------------------------------------------------------------------- errors and the zoo
def test_bad_inputs_raise_typed_errors(rng):
    with pytest.raises(ShapeError) as err:
        TICK.create(_base(), (4, 4), (5, 3))
    assert err.value.argument == "patch_shape"
    with pytest.raises(ShapeError) as err:
        InducingPatchesWithLocations(jnp.zeros((4, 12)), jnp.zeros((4, 3)))
    assert err.value.argument == "Z_loc"
    with pytest.raises(ShapeError) as err:
        TICK.create(_base(), IMAGE, PATCH, 0.3, weighted=True).Kzz(np.zeros((4, 12)), Z_loc=np.zeros((3, 2)))
    assert err.value.argument == "Z_loc"
    tick = TICK.create(_base(), IMAGE, PATCH)
    with pytest.raises(InvalidArgumentError) as err:
        Kuu(InducingPatches(jnp.zeros((4, 12))), tick)
    assert err.value.argument == "inducing"
    with pytest.raises(InvalidArgumentError) as err:
        Kuu(InducingPatchesWithLocations(jnp.zeros((4, 12)), jnp.zeros((4, 2))), Convolutional(_base(), IMAGE, PATCH))
    assert err.value.argument == "inducing"
    with pytest.raises(InvalidArgumentError) as err:
        TICK.create(_base(), IMAGE, PATCH, kff_method="distinct")
    assert err.value.argument == "kff_method"
    with pytest.raises(ShapeError) as err:
        tick.validate_inputs(np.zeros((2, 71)))
    assert err.value.argument == "X"
    images = np.zeros((2,) + IMAGE + (1,))
    inducing = InducingPatchesWithLocations(jnp.zeros((4, 12)), jnp.zeros((4, 2)))
    with pytest.raises(ShapeError) as err:
        conv_layer_conditional(images, tick, inducing, np.zeros((4, 2)), np.eye(3))
    assert err.value.argument == "q_sqrt"
    with pytest.raises(ShapeError) as err:
        conv_layer_conditional(np.zeros((2, 7, 9, 1)), tick, inducing, np.zeros((4, 2)), np.eye(4))
    assert err.value.argument == "images"
    with pytest.raises(InvalidArgumentError) as err:
        conv_layer_conditional(images, tick, InducingPatches(jnp.zeros((4, 12))), np.zeros((4, 2)), np.eye(4))
    assert err.value.argument == "inducing"
    with pytest.raises(InvalidArgumentError) as err:
        initialise_inducing("patch-locations", tick, np.zeros((2, 70)), 3, jax.random.PRNGKey(0))
    assert err.value.argument == "num_inducing"


def test_zoo_tick_models_build_and_train():
    """``tick`` (fixed unit weights) and ``weighted-tick`` build TICK specs for any image and task;
    the paper's weighted-tick trains on small rectangles: the ELBO goes up, λ is learned."""
    from gpzoo.inference import fit  # noqa: PLC0415
    from gpzoo.models import zoo  # noqa: PLC0415

    for name in ("tick", "weighted-tick"):
        spec = zoo.get(name, image_shape=(8, 8), task="binary", num_inducing=6)
        assert isinstance(spec.kernel, TICK) and spec.inducing == "patch-locations" and spec.input_kind == "image"
        assert isinstance(spec.kernel.weights, Fixed) == (name == "tick")
        colour = zoo.get(name, image_shape=(5, 6, 3), task="multiclass", num_classes=4, patch_shape=(2, 3))
        assert colour.kernel.patch_dim == 18 and colour.kernel.num_patches == 16 and colour.likelihood.num_latent(4) >= 1
    with pytest.raises(ShapeError) as err:
        zoo.get("tick", image_shape=(4, 4), patch_shape=(3, 5))
    assert err.value.argument == "patch_shape"
    X, y = _rectangles(40)
    unweighted = zoo.get("tick", image_shape=(8, 8), task="binary").kernel  # Fixed unit weights
    np.testing.assert_allclose(unweighted.K_diag(X[:3]), spec.kernel.K_diag(X[:3]), rtol=1e-12)
    res = fit(spec, X, y, steps=40, seed=0, progress=False, chunk_size=40)
    elbo = res.objective_history
    assert np.all(np.isfinite(elbo)) and elbo[-5:].mean() > elbo[:5].mean() + 1.0
    assert "kernel.location_lengthscale" in res.params and "inducing.Z_loc" in res.params
