"""Convolutional kernels and inducing patches (van der Wilk et al. 2017, §3, App. A–C) against brute force, float64.

Brute-force references extract patches with explicit Python loops and sum base-kernel values
one pair at a time, independently of the library's stream/patch machinery.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads
from matplotlib.figure import Figure

from gpzoo.inference import fit, predict
from gpzoo.analysis.figures import inducing_patches_figure
from gpzoo.inference.components import _realised_parts, component_variances, inducing_patch_outputs
from gpzoo.inference.inducing import InducingPatches, InducingPoints, Kuf, Kuu, SeparateInducing, initialise_inducing
from gpzoo.models import kernels, zoo
from gpzoo.models.errors import DataError, InvalidArgumentError, ShapeError
from gpzoo.models.kernels.convolutional import (
    AdditiveColourConvolutional,
    Convolutional,
    ImageSum,
    MultiChannelConvolutional,
    WeightedConvolutional,
    extract_patches,
    _distinct_rows,
    patch_gram_sum,
    se_patch_cross_sum,
    se_patch_gram_sum,
)

GREY, GREY_PATCH = (5, 6), (2, 3)
COLOUR, COLOUR_PATCH = (5, 4, 3), (2, 2)
LS, VAR = 0.9, 1.7


# ----------------------------------------------------------------------------- brute force
def _se(a, b, ls=LS, var=VAR):
    return var * np.exp(-0.5 * np.sum(((np.asarray(a) - np.asarray(b)) / ls) ** 2))


def _loop_patches(image, patch):
    """Patches of one image ``[H, W, C]`` by loops, rows (dy, dx, c): ``[P, h*w*C]``."""
    H, W, _ = image.shape
    h, w = patch
    return np.array([image[i : i + h, j : j + w, :].reshape(-1) for i in range(H - h + 1) for j in range(W - w + 1)])


def _image(x, shape):
    return np.asarray(x).reshape(shape if len(shape) == 3 else shape + (1,))


def _brute(X, Z, shape, patch, weights, scales=None, mode="patch", k=_se):
    """(Kuu [G, M, M], Kuf [G, M, N], Kff diagonal [N]) of f = Σ_s Σ_p w_sp g_s(x^[sp]) by loops.

    mode: "patch" (one g on colour patches), "separate" (one g, per-channel patches),
    "additive" (g̃ = Σ_c v_c k(z_c, z'_c) on colour patches), "multichannel" (independent g_c, shared Z).
    """
    X, Z = np.asarray(X), np.asarray(Z)
    M, N = Z.shape[0], X.shape[0]
    C = _image(X[0], shape).shape[-1]
    h, w = patch

    def channel(z, c):  # colour patch row -> channel c, [h*w]
        return z.reshape(h, w, C)[..., c].reshape(-1)

    if mode == "patch":
        Kuu = np.array([[[k(a, b) for b in Z] for a in Z]])
        streams = [(_loop_patches(_image(x, shape), patch),) for x in X]
    elif mode == "additive":
        Kuu = np.array([[[sum(scales[c] * k(channel(a, c), channel(b, c)) for c in range(C)) for b in Z] for a in Z]])
    else:
        Kuu = np.array([[k(a, b) for b in Z] for a in Z])[None].repeat(C if mode == "multichannel" else 1, 0)

    def per_channel(x):  # [C, P, h*w]
        img = _image(x, shape)
        return np.stack([_loop_patches(img[..., c : c + 1], patch) for c in range(C)])

    G = C if mode == "multichannel" else 1
    Kuf, Kff = np.zeros((G, M, N)), np.zeros(N)
    for n, x in enumerate(X):
        if mode == "patch":
            P = streams[n][0]
            wv = np.ravel(weights)
            for m in range(M):
                Kuf[0, m, n] = sum(wv[p] * k(P[p], Z[m]) for p in range(len(P)))
            Kff[n] = sum(wv[p] * wv[q] * k(P[p], P[q]) for p in range(len(P)) for q in range(len(P)))
        elif mode == "separate":
            Pc = per_channel(x).reshape(-1, h * w)  # channel-major, [C*P, h*w]
            wv = np.ravel(weights)
            for m in range(M):
                Kuf[0, m, n] = sum(wv[p] * k(Pc[p], Z[m]) for p in range(len(Pc)))
            Kff[n] = sum(wv[p] * wv[q] * k(Pc[p], Pc[q]) for p in range(len(Pc)) for q in range(len(Pc)))
        else:
            Pc = per_channel(x)  # [C, P, h*w]
            wc = np.broadcast_to(weights, Pc.shape[:2])  # [C, P]
            v = scales if mode == "additive" else np.ones(C)
            for c in range(C):
                for m in range(M):
                    zc = channel(Z[m], c) if mode == "additive" else Z[m]
                    Kuf[c if G > 1 else 0, m, n] += v[c] * sum(wc[c, p] * k(Pc[c, p], zc) for p in range(Pc.shape[1]))
                Kff[n] += v[c] * sum(wc[c, p] * wc[c, q] * k(Pc[c, p], Pc[c, q])
                                     for p in range(Pc.shape[1]) for q in range(Pc.shape[1]))
    return Kuu, Kuf, Kff


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(0)


def _data(rng, shape, patch, N=3, M=4, colour_inducing=True):
    X = rng.uniform(size=(N, int(np.prod(shape))))
    C = shape[2] if len(shape) == 3 else 1
    Z = rng.uniform(size=(M, patch[0] * patch[1] * (C if colour_inducing else 1)))
    return X, Z


def _base():
    return kernels.SquaredExponential(lengthscale=LS, variance=VAR)


def evaluate_sweep(kern, Z, X, full=False):
    """(Kzz, Kzx, K_diag[, K]) of ``kern`` in one compiled call (compilation dominates this file)."""
    def all_at_once(Z, X):
        out = (kern.Kzz(Z), kern.Kzx(Z, X), kern.K_diag(X))
        return out + (kern.K(X),) if full else out

    return tuple(np.asarray(a) for a in jax.jit(all_at_once)(jnp.asarray(Z), jnp.asarray(X)))


# ----------------------------------------------------------------------------- exactness
def test_extract_patches_matches_loops(rng):
    for shape, patch in [(GREY, GREY_PATCH), (COLOUR, COLOUR_PATCH)]:
        X, _ = _data(rng, shape, patch)
        full = shape if len(shape) == 3 else shape + (1,)
        got = np.asarray(extract_patches(jnp.asarray(X).reshape((-1,) + full), patch))  # [N, P, E]
        want = np.stack([_loop_patches(_image(x, shape), patch) for x in X])
        np.testing.assert_array_equal(got, want)


#: The Kuf paths: the fused SE custom gradient, and autodiff with either patch-product strategy.
KUF_PATHS = [dict(kuf_method="fused"), dict(kuf_method="autodiff", products="conv"), dict(kuf_method="autodiff", products="matmul")]
KUF_IDS = ["fused", "autodiff-conv", "autodiff-matmul"]


@pytest.mark.parametrize("kuf", KUF_PATHS, ids=KUF_IDS)
def test_conv_kernel_equals_brute_force_sums(rng, kuf):
    """Kuu, Kuf and the Kff diagonal of van der Wilk et al. 2017, eq. 14–16 (and 18–19) against explicit sums."""
    X, Z = _data(rng, GREY, GREY_PATCH)
    kern = Convolutional(_base(), GREY, GREY_PATCH, normalisation="sum", **kuf)
    P = kern.num_patches
    Kuu_, Kuf_, Kff = _brute(X, Z, GREY, GREY_PATCH, np.ones(P))
    np.testing.assert_allclose(Kuu(InducingPatches(jnp.asarray(Z)), kern), Kuu_, rtol=1e-10)
    np.testing.assert_allclose(Kuf(InducingPatches(jnp.asarray(Z)), kern, jnp.asarray(X)), Kuf_, rtol=1e-10)
    np.testing.assert_allclose(kern.K_diag(X), Kff, rtol=1e-10)
    weights = rng.normal(size=P)
    wkern = WeightedConvolutional(_base(), GREY, GREY_PATCH, weights=weights, normalisation="sum", **kuf)
    _, wKuf, wKff = _brute(X, Z, GREY, GREY_PATCH, weights)
    np.testing.assert_allclose(wkern.Kzx(Z, X), wKuf, rtol=1e-10)
    np.testing.assert_allclose(wkern.K_diag(X), wKff, rtol=1e-10)


def test_mean_normalisation_is_gpflow_convention(rng):
    """"mean" divides Kuf by P and Kff by P² (GPflow); Kuu is unchanged."""
    X, Z = _data(rng, GREY, GREY_PATCH)
    summed = Convolutional(_base(), GREY, GREY_PATCH, normalisation="sum")
    mean = Convolutional(_base(), GREY, GREY_PATCH, normalisation="mean")
    P = summed.num_patches
    np.testing.assert_allclose(mean.Kzz(Z), summed.Kzz(Z), rtol=1e-12)
    np.testing.assert_allclose(mean.Kzx(Z, X), summed.Kzx(Z, X) / P, rtol=1e-12)
    np.testing.assert_allclose(mean.K_diag(X), summed.K_diag(X) / P**2, rtol=1e-12)


@pytest.mark.parametrize("kuf", KUF_PATHS, ids=KUF_IDS)
def test_colour_variants_equal_brute_force(rng, kuf):
    X, Z = _data(rng, COLOUR, COLOUR_PATCH, N=2, M=3)
    C = COLOUR[2]
    Zgrey = Z[:, : COLOUR_PATCH[0] * COLOUR_PATCH[1]]
    opts = dict(normalisation="sum", **kuf)
    # colour patches (van der Wilk et al. 2017, §3.4), weighted
    k = WeightedConvolutional.create(_base(), COLOUR, COLOUR_PATCH, **opts)
    w = rng.normal(size=k.weights.shape)
    k = WeightedConvolutional(_base(), COLOUR, COLOUR_PATCH, weights=w, **opts)
    _, Kuf_, Kff = _brute(X, Z, COLOUR, COLOUR_PATCH, w, mode="patch")
    _, Kzx, Kdiag = evaluate_sweep(k, Z, X)
    np.testing.assert_allclose(Kzx, Kuf_, rtol=1e-10)
    np.testing.assert_allclose(Kdiag, Kff, rtol=1e-10)
    # every channel's patches with one g (baseline of §3.4)
    w = rng.normal(size=C * k.num_patches)
    k = WeightedConvolutional(_base(), COLOUR, COLOUR_PATCH, weights=w, channels="separate", **opts)
    _, Kuf_, Kff = _brute(X, Zgrey, COLOUR, COLOUR_PATCH, w, mode="separate")
    _, Kzx, Kdiag = evaluate_sweep(k, Zgrey, X)
    np.testing.assert_allclose(Kzx, Kuf_, rtol=1e-10)
    np.testing.assert_allclose(Kdiag, Kff, rtol=1e-10)
    # additive colour (eq. 24–25)
    w, v = rng.normal(size=k.num_patches), rng.uniform(0.5, 2.0, size=C)
    k = AdditiveColourConvolutional(_base(), COLOUR, COLOUR_PATCH, weights=w, channel_variances=v, **opts)
    Kuu_, Kuf_, Kff = _brute(X, Z, COLOUR, COLOUR_PATCH, w, scales=v, mode="additive")
    for got, want in zip(evaluate_sweep(k, Z, X), (Kuu_, Kuf_, Kff)):
        np.testing.assert_allclose(got, want, rtol=1e-10)
    # multi-channel (eq. 22–23): C blocks of Kuu, Kuf [C, M, N]
    w = rng.normal(size=(C, k.num_patches))
    k = MultiChannelConvolutional(_base(), COLOUR, COLOUR_PATCH, weights=w, **opts)
    Kuu_, Kuf_, Kff = _brute(X, Zgrey, COLOUR, COLOUR_PATCH, w, mode="multichannel")
    np.testing.assert_allclose(Kuu(InducingPatches(jnp.asarray(Zgrey)), k), Kuu_, rtol=1e-10)
    np.testing.assert_allclose(Kuf(InducingPatches(jnp.asarray(Zgrey)), k, jnp.asarray(X)), Kuf_, rtol=1e-10)
    np.testing.assert_allclose(evaluate_sweep(k, Zgrey, X)[2], Kff, rtol=1e-10)


def test_additive_colour_on_one_channel_scales_kuu_like_kuf_and_kff(rng):
    """One channel (grey images): Kuu = v k_g(Z, Z) as Kuf and Kff carry v, so Kff − Qff stays PSD
    (Kuu once dropped v for a single stream: negative predictive variances as soon as v > 1)."""
    X, Z = _data(rng, GREY, GREY_PATCH, N=3, M=4)
    w, v = rng.normal(size=Convolutional(_base(), GREY, GREY_PATCH).num_patches), np.array([1.7])
    k = AdditiveColourConvolutional(_base(), GREY, GREY_PATCH, weights=w, channel_variances=v, normalisation="sum")
    Kuu_, Kuf_, Kff = _brute(X, Z, GREY, GREY_PATCH, w, scales=v, mode="additive")
    for got, want in zip(evaluate_sweep(k, Z, X), (Kuu_, Kuf_, Kff)):
        np.testing.assert_allclose(got, want, rtol=1e-10)
    Kuu_, Kuf_ = k.Kzz(Z)[0], k.Kzx(Z, X)[0]
    Qff = Kuf_.T @ np.linalg.solve(Kuu_, Kuf_)  # [N, N]
    assert np.all(np.diag(k.K(X)) - np.diag(Qff) > -1e-8)


def test_multichannel_equals_explicit_per_channel_sum(rng):
    """f = Σ_c f_c with f_c a weighted conv GP on channel c: K, K_diag and Kuf blocks agree."""
    X, Z = _data(rng, COLOUR, COLOUR_PATCH, N=3, M=3, colour_inducing=False)
    H, W, C = COLOUR
    multi = MultiChannelConvolutional.create(_base(), COLOUR, COLOUR_PATCH, normalisation="sum")
    w = rng.normal(size=multi.weights.shape)
    multi = MultiChannelConvolutional(_base(), COLOUR, COLOUR_PATCH, weights=w, normalisation="sum")
    channel = [X.reshape(-1, H, W, C)[..., c].reshape(len(X), -1) for c in range(C)]
    parts = [WeightedConvolutional(_base(), (H, W), COLOUR_PATCH, weights=w[c], normalisation="sum") for c in range(C)]
    _, Kzx, Kdiag, K = evaluate_sweep(multi, Z, X, full=True)
    per_channel = [evaluate_sweep(p, Z, x, full=True) for p, x in zip(parts, channel)]
    np.testing.assert_allclose(K, sum(c[3] for c in per_channel), rtol=1e-10)
    np.testing.assert_allclose(Kdiag, sum(c[2] for c in per_channel), rtol=1e-10)
    np.testing.assert_allclose(Kzx, np.concatenate([c[1] for c in per_channel]), rtol=1e-10)
    np.testing.assert_allclose(multi.group_K_diag(X), np.stack([c[2] for c in per_channel]), rtol=1e-10)


def _all_kernels(base):
    return [
        Convolutional(base, GREY, GREY_PATCH),
        WeightedConvolutional(base, GREY, GREY_PATCH, weights=np.linspace(-1, 2, 16)),
        Convolutional(base, COLOUR, COLOUR_PATCH, channels="separate"),
        AdditiveColourConvolutional.create(base, COLOUR, COLOUR_PATCH),
        MultiChannelConvolutional.create(base, COLOUR, COLOUR_PATCH),
    ]


@pytest.mark.parametrize("base", [_base(), kernels.Matern32(lengthscale=0.7, variance=1.2)], ids=["se", "matern32"])
def test_K_diag_equals_diag_K_and_Qff_below_Kff(rng, base):
    """diag K = K_diag for every variant and base kernel; Kff − Qff is PSD (Qff = Σ_g Kfu_g Kuu_g⁻¹ Kuf_g)."""
    variants = _all_kernels(base) if isinstance(base, kernels.SquaredExponential) else _all_kernels(base)[2:5:2]
    for kern in variants:
        X, _ = _data(rng, kern.image_shape, kern.patch_shape, N=6)
        Z = rng.uniform(size=(5, kern.patch_dim))
        Kzz, Kzx, Kdiag, K = evaluate_sweep(kern, Z, X, full=True)  # [G, M, M], [G, M, N], [N], [N, N]
        np.testing.assert_allclose(np.diag(K), Kdiag, rtol=1e-10)
        np.testing.assert_allclose(K, K.T, rtol=1e-10)
        Qff = sum(Kzx[g].T @ np.linalg.solve(Kzz[g], Kzx[g]) for g in range(Kzz.shape[0]))
        assert np.linalg.eigvalsh(K - Qff).min() > -1e-8 * np.abs(K).max(), type(kern).__name__


def test_generic_base_kernel_path_equals_fast_path(rng):
    """A base kernel outside the SE fast path (SE × constant) gives the same Kuf, Kff and K."""
    X, Z = _data(rng, COLOUR, COLOUR_PATCH, N=3)
    slow_base = kernels.SquaredExponential(lengthscale=LS, variance=1.0) * VAR
    for fast, slow in zip(_all_kernels(_base()), _all_kernels(slow_base)):
        Zk = Z[:, : fast.patch_dim]
        Xk = X[:, : fast.input_dim]
        for a, b in zip(evaluate_sweep(slow, Zk, Xk), evaluate_sweep(fast, Zk, Xk)):
            np.testing.assert_allclose(a, b, rtol=1e-10)


def test_unit_weights_reduce_weighted_to_plain_conv(rng):
    for shape, patch, channels in [(GREY, GREY_PATCH, "patch"), (COLOUR, COLOUR_PATCH, "patch"), (COLOUR, COLOUR_PATCH, "separate")]:
        plain = Convolutional(_base(), shape, patch, channels=channels)
        weighted = WeightedConvolutional.create(_base(), shape, patch, channels=channels)
        X, Z = _data(rng, shape, patch)
        Z = Z[:, : plain.patch_dim]
        for a, b in zip(evaluate_sweep(weighted, Z, X, full=True), evaluate_sweep(plain, Z, X, full=True)):
            np.testing.assert_allclose(a, b, rtol=1e-12)


def test_conv_plus_rbf_equals_sum_of_parts(rng):
    """Block-diagonal Kuu and stacked Kuf of van der Wilk et al. 2017, eq. C.18–C.20."""
    X, Z = _data(rng, GREY, GREY_PATCH, N=4, M=3)
    conv = WeightedConvolutional(_base(), GREY, GREY_PATCH, weights=rng.normal(size=16))
    rbf = kernels.SquaredExponential(lengthscale=2.0, variance=0.3)
    Zimg = rng.uniform(size=(3, X.shape[1]))
    kern = ImageSum((conv, rbf))
    inducing = SeparateInducing((InducingPatches(jnp.asarray(Z)), InducingPoints(jnp.asarray(Zimg))))
    Kmm, Kmn = Kuu(inducing, kern), Kuf(inducing, kern, jnp.asarray(X))  # [2, M, M], [2, M, N]
    np.testing.assert_allclose(Kmm[0], conv.Kzz(Z)[0], rtol=1e-12)
    np.testing.assert_allclose(Kmm[1], rbf.K(Zimg), rtol=1e-12)
    np.testing.assert_allclose(Kmn[0], conv.Kzx(Z, X)[0], rtol=1e-12)
    np.testing.assert_allclose(Kmn[1], rbf.K(Zimg, X), rtol=1e-12)
    np.testing.assert_allclose(kern.K_diag(X), conv.K_diag(X) + rbf.K_diag(X), rtol=1e-12)
    np.testing.assert_allclose(kern.K(X), conv.K(X) + rbf.K(X), rtol=1e-12)


def test_conv_and_matmul_products_agree(rng):
    """The two Kuf strategies (van der Wilk et al. 2017, App. A.2) and the fused SE path agree, also with an ARD
    lengthscale over patch positions."""
    base = kernels.SquaredExponential(lengthscale=np.linspace(0.5, 1.5, 12), variance=VAR)
    X, Z = _data(rng, COLOUR, COLOUR_PATCH, N=5, M=6)
    conv = Convolutional(base, COLOUR, COLOUR_PATCH, products="conv", kuf_method="autodiff")
    matmul = Convolutional(base, COLOUR, COLOUR_PATCH, products="matmul", kuf_method="autodiff")
    fused = Convolutional(base, COLOUR, COLOUR_PATCH, kuf_method="fused")
    np.testing.assert_allclose(conv.Kzx(Z, X), matmul.Kzx(Z, X), rtol=1e-12)
    np.testing.assert_allclose(fused.Kzx(Z, X), matmul.Kzx(Z, X), rtol=1e-12)
    patches = np.stack([_loop_patches(_image(x, COLOUR), COLOUR_PATCH) for x in X])  # [N, P, E]
    want = np.einsum("npm->mn", np.array([[[_se(p, z, base.lengthscale) for z in Z] for p in pn] for pn in patches])) / conv.num_patches
    np.testing.assert_allclose(conv.Kzx(Z, X)[0], want, rtol=1e-10)


# ----------------------------------------------------------------------------- Kuf gradients
def _naive_cross(X, Z, ls, w):
    """Σ_p w_p exp(−½‖(x_rp − z_m)/ℓ‖²) with explicit differences (plain autodiff reference): [R, M]."""
    diff = (X[:, :, None, :] - Z[None, None]) / ls  # [R, P, M, E]
    return jnp.einsum("p,rpm->rm", w, jnp.exp(-0.5 * jnp.sum(diff**2, -1)))


@pytest.mark.parametrize("chunk", [None, 1, 3, 7])  # 3 pads the last chunk of 7 rows
def test_fused_kuf_gradients_for_every_subset_of_inputs(rng, chunk):
    """se_patch_cross_sum (custom gradient, chunked backward pass) equals plain autodiff of the
    explicit formula for each subset of (patches, inducing patches, lengthscale, weights), scalar
    or ARD lengthscale."""
    X = jnp.asarray(rng.normal(size=(7, 11, 4)))  # [R, P, E]
    Z = jnp.asarray(rng.normal(size=(5, 4)))  # [M, E]
    w = jnp.asarray(rng.normal(size=11))  # [P]
    ct = jnp.asarray(rng.normal(size=(7, 5)))  # [R, M]

    def naive(X, Z, ls, w):
        return jnp.sum(ct * _naive_cross(X, Z, ls, w))

    def fused(X, Z, ls, w):
        return jnp.sum(ct * se_patch_cross_sum(X, Z, w, chunk, lengthscale=ls))

    subsets = [(0, 1, 2, 3), (1,), (2,), (3,), (0,), (1, 3)]

    @jax.jit
    def value_and_every_subset(X, Z, ls, w):
        # one program per lengthscale shape (compilation dominates): each jax.grad traces the custom
        # gradient with its own symbolic zeros, as a separate call would
        return fused(X, Z, ls, w), [jax.grad(fused, argnums=argnums)(X, Z, ls, w) for argnums in subsets]

    for ls in (jnp.float64(1.3), jnp.asarray(rng.uniform(0.5, 2.0, size=4))):
        value, grads = value_and_every_subset(X, Z, ls, w)
        np.testing.assert_allclose(value, naive(X, Z, ls, w), rtol=1e-12)
        for argnums, got in zip(subsets, grads, strict=True):
            want = jax.grad(naive, argnums=argnums)(X, Z, ls, w)
            assert len(got) == len(want) == len(argnums)
            for a, b in zip(got, want):
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    check_grads(jax.jit(lambda X, Z, w: se_patch_cross_sum(X, Z, w, 3)), (X, Z, w), order=1, modes=("rev",))


def test_kuf_methods_agree_with_all_gradients(rng):
    """fused and autodiff Kuf: same values and gradients w.r.t. every kernel hyperparameter
    (weights, channel variances, lengthscale, variance), the inducing patches and the images,
    for every kernel variant (one stream, separate channels, additive colour, multi-channel)."""
    base = kernels.SquaredExponential(lengthscale=np.float64(LS), variance=np.float64(VAR))
    for kern in _all_kernels(base):
        X, _ = _data(rng, kern.image_shape, kern.patch_shape, N=4)
        Z = jnp.asarray(rng.uniform(size=(3, kern.patch_dim)))
        X = jnp.asarray(X)

        def objective(k, Z, X):
            return jnp.sum(jnp.sin(k.Kzx(Z, X)))

        results = [jax.jit(jax.value_and_grad(objective, argnums=(0, 1, 2)))(dataclasses.replace(kern, kuf_method=m), Z, X)
                   for m in ("fused", "autodiff")]
        (v_fused, g_fused), (v_auto, g_auto) = results
        np.testing.assert_allclose(v_fused, v_auto, rtol=1e-12)
        for a, b in zip(jax.tree.leaves(g_fused), jax.tree.leaves(g_auto)):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, err_msg=type(kern).__name__)


# ----------------------------------------------------------------------------- Kff diagonal gradients
def _naive_gram(U, w):
    """Σ_pq w_p w_q exp(−½‖u_p − u_q‖²) with explicit differences (plain autodiff reference)."""
    diff = U[:, :, None, :] - U[:, None, :, :]  # [R, P, P, E]
    return jnp.einsum("rp,rpq,rq->r", w, jnp.exp(-0.5 * jnp.sum(diff**2, -1)), w)


def test_fused_kff_value_and_gradients_equal_naive_autodiff(rng):
    U = jnp.asarray(rng.normal(size=(3, 11, 4)))  # [R, P, E]
    w = jnp.asarray(rng.normal(size=(3, 11)))  # [R, P]
    ct = jnp.asarray(rng.normal(size=3))  # [R]
    g_naive = jax.grad(lambda U, w: jnp.dot(ct, _naive_gram(U, w)), argnums=(0, 1))(U, w)
    for block in (4, 11):  # 4 leaves a padded last block
        fused = lambda U, w: se_patch_gram_sum(U, w, block)  # noqa: E731
        value, g_fused = jax.jit(jax.value_and_grad(lambda U, w: jnp.dot(ct, fused(U, w)), argnums=(0, 1)))(U, w)
        np.testing.assert_allclose(fused(U, w), _naive_gram(U, w), rtol=1e-12)
        for a, b in zip(g_fused, g_naive):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    check_grads(jax.jit(lambda U, w: se_patch_gram_sum(U, w, 4)), (U, w), order=1, modes=("rev",))


@pytest.mark.parametrize("P, block", [(11, None), (30, 4), (30, 5), (64, 8), (97, 11)])  # odd / even block counts, padding
def test_symmetric_se_sweep_gradients_for_every_subset_of_inputs(rng, P, block):
    """The fused sweep computes only the gradients asked for (symbolic zeros): each subset of
    (patches, lengthscale, weights), scalar or ARD lengthscale, equals plain autodiff."""
    X = jnp.asarray(rng.normal(size=(3, P, 4)))  # [R, P, E]
    w = jnp.asarray(rng.normal(size=(3, P)))  # [R, P]
    ct = jnp.asarray(rng.normal(size=3))  # [R]

    _assert_sweep_matches_autodiff(rng, X, w, ct, lambda X, ls, w: se_patch_gram_sum(X, w, block, lengthscale=ls))


def _assert_sweep_matches_autodiff(rng, X, w, ct, sweep):
    """``ct · sweep(X, ls, w)`` and its gradients for every subset of (X, ls, w) equal autodiff of
    the explicit Gram, for a scalar and an ARD lengthscale."""
    def naive(X, ls, w):
        return jnp.dot(ct, _naive_gram(X / ls, w))

    def swept(X, ls, w):
        return jnp.dot(ct, sweep(X, ls, w))

    subsets = [(0, 1, 2), (1,), (2,), (1, 2), (0,)]

    @jax.jit
    def value_and_every_subset(X, ls, w):
        # one program per lengthscale shape (compilation dominates): each jax.grad traces the sweep
        # with its own symbolic zeros, as a separate call would
        return swept(X, ls, w), [jax.grad(swept, argnums=argnums)(X, ls, w) for argnums in subsets]

    for ls in (jnp.float64(1.3), jnp.asarray(rng.uniform(0.5, 2.0, size=4))):
        value, grads = value_and_every_subset(X, ls, w)
        np.testing.assert_allclose(value, naive(X, ls, w), rtol=1e-12)
        for argnums, got in zip(subsets, grads, strict=True):
            want = jax.grad(naive, argnums=argnums)(X, ls, w)
            assert len(got) == len(want) == len(argnums)
            for a, b in zip(got, want):
                np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def _with_repeats(rng, R, P, E):
    """Rows of patches: a background (half the patches zero, the rest binary), binary patches
    (few distinct values) and all-distinct patches — each sweep path of ``distinct=True`` is taken."""
    X = rng.normal(size=(R, P, E))
    X[0] = rng.integers(0, 2, size=(P, E))
    X[0, : P // 2] = 0.0
    X[1] = rng.integers(0, 2, size=(P, E))
    X[1, : P // 3] = 0.0
    return X


@pytest.mark.parametrize("P, block", [(11, None), (30, 4), (30, 5), (64, 8), (97, 11)])
def test_distinct_patch_sweep_gradients_for_every_subset_of_inputs(rng, P, block):
    """``distinct=True`` (each image over its distinct patches with summed weights, or the band)
    equals plain autodiff of the explicit Gram for each subset of inputs, scalar or ARD lengthscale."""
    X = jnp.asarray(_with_repeats(rng, 3, P, 4))  # [R, P, E]
    w = jnp.asarray(rng.normal(size=(3, P)))  # [R, P]
    ct = jnp.asarray(rng.normal(size=3))  # [R]

    _assert_sweep_matches_autodiff(rng, X, w, ct,
                                   lambda X, ls, w: se_patch_gram_sum(X, w, block, lengthscale=ls, distinct=True))


def test_distinct_rows_merge_only_equal_patches(rng):
    """Groups of :func:`_distinct_rows` hold equal patches only, their weights sum to the total, and
    the distinct count is exact for patches with repeats."""
    U = _with_repeats(rng, 2, 40, 3)[1]  # [P, E]
    w = rng.normal(size=40)
    Ud, Wd, group, n = (np.asarray(a) for a in _distinct_rows(jnp.asarray(U), jnp.asarray(w)))
    assert int(n) == len(np.unique(U, axis=0))
    np.testing.assert_array_equal(Ud[group], U)  # every patch is its group's representative
    np.testing.assert_allclose(Wd.sum(), w.sum(), rtol=1e-12)
    np.testing.assert_allclose(Wd[int(n):], 0.0)


def test_kff_methods_agree_with_hyperparameter_gradients(rng):
    """fused / distinct / checkpoint / naive paths: same values and gradients w.r.t. lengthscale,
    variance, weights, X (images with a zero background and binary images included)."""
    X = rng.uniform(size=(4, 30))
    X[0, :18] = 0.0
    X[1] = rng.integers(0, 2, size=30)
    X = jnp.asarray(X)
    w0 = jnp.asarray(rng.normal(size=16))

    def objective(method):
        def f(ls, var, w, X):
            base = kernels.SquaredExponential(lengthscale=ls, variance=var)
            kern = WeightedConvolutional(base, GREY, GREY_PATCH, weights=w, kff_method=method, kff_block=5)
            return jnp.sum(jnp.sin(kern.K_diag(X)))

        return jax.value_and_grad(f, argnums=(0, 1, 2, 3))

    args = (jnp.float64(LS), jnp.float64(VAR), w0, X)
    ref_value, ref_grads = objective("naive")(*args)
    for method in ("fused", "distinct", "checkpoint"):
        value, grads = objective(method)(*args)
        np.testing.assert_allclose(value, ref_value, rtol=1e-12)
        for a, b in zip(grads, ref_grads):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_fused_paths_reject_other_base_kernels(rng):
    with pytest.raises(InvalidArgumentError, match="kff_method"):
        patch_gram_sum(kernels.Matern32(), jnp.ones((1, 3, 2)), jnp.ones((1, 3)), method="fused")
    with pytest.raises(InvalidArgumentError, match="kff_method"):
        Convolutional(kernels.Matern32(), GREY, GREY_PATCH, kff_method="fused")
    with pytest.raises(InvalidArgumentError, match="kuf_method"):
        Convolutional(kernels.Matern32(), GREY, GREY_PATCH, kuf_method="fused")
    with pytest.raises(InvalidArgumentError, match="kuf_method"):
        Convolutional(_base(), GREY, GREY_PATCH, kuf_method="einsum")


# ----------------------------------------------------------------------------- initialisation and errors
def test_patch_initialisers(rng):
    X = (rng.uniform(size=(6, 30)) > 0.6).astype(float)
    kern = Convolutional(_base(), GREY, GREY_PATCH)
    key = jax.random.PRNGKey(0)
    pool = {tuple(p) for x in X for p in _loop_patches(_image(x, GREY), GREY_PATCH)}
    Z = np.asarray(initialise_inducing("patches", kern, X, 8, key, "random").Z)
    assert Z.shape == (8, 6) and len({tuple(z) for z in Z}) == 8 and all(tuple(z) in pool for z in Z)
    assert np.asarray(initialise_inducing("patches", kern, X, 5, key, "kmeans").Z).shape == (5, 6)
    Zu = np.asarray(initialise_inducing("patches", kern, X, 7, key, "uniform").Z)
    assert Zu.shape == (7, 6) and Zu.min() >= 0 and Zu.max() <= 1
    with pytest.raises(InvalidArgumentError, match="num_inducing") as err:
        initialise_inducing("patches", kern, X, len(pool) + 1, key, "random")
    assert err.value.argument == "num_inducing"
    additive = AdditiveColourConvolutional.create(_base(), COLOUR, COLOUR_PATCH)
    Xc = rng.uniform(size=(2, 60))
    Zc = np.asarray(initialise_inducing("patches", additive, Xc, 4, key, "random").Z)
    colour_pool = {tuple(p) for x in Xc for p in _loop_patches(_image(x, COLOUR), COLOUR_PATCH)}
    assert Zc.shape == (4, 12) and all(tuple(z) in colour_pool for z in Zc)


def test_bad_inputs_raise_typed_errors():
    kern = Convolutional(_base(), GREY, GREY_PATCH)
    with pytest.raises(ShapeError) as err:
        kern.validate_inputs(np.zeros((2, 31)))
    assert err.value.argument == "X"
    X = np.zeros((2, 30))
    X[0, 3] = np.nan
    with pytest.raises(DataError) as err:
        kern.validate_inputs(X)
    assert err.value.argument == "X"
    with pytest.raises(ShapeError) as err:
        Convolutional(_base(), (4, 4), (5, 3))
    assert err.value.argument == "patch_shape"
    with pytest.raises(ShapeError) as err:
        zoo.get("conv", image_shape=(4, 4), patch_shape=(3, 5))
    assert err.value.argument == "patch_shape"
    with pytest.raises(ShapeError) as err:
        WeightedConvolutional(_base(), GREY, GREY_PATCH, weights=np.ones(5))
    assert err.value.argument == "weights"
    with pytest.raises(InvalidArgumentError) as err:
        zoo.get("conv", input_dim=30)
    assert err.value.argument == "image_shape"
    spec = zoo.get("conv", image_shape=GREY, patch_shape=GREY_PATCH, task="binary", num_inducing=4)
    with pytest.raises(ShapeError) as err:
        fit(spec, np.zeros((3, 29)), np.array([0, 1, 0]), steps=1, progress=False)
    assert err.value.argument == "X"


def test_zoo_specs():
    for name in ["conv", "weighted-conv", "conv+rbf", "weighted-conv+rbf", "colour-patch-conv",
                 "additive-colour-conv", "multichannel-conv"]:
        spec = zoo.get(name, image_shape=COLOUR, patch_shape=COLOUR_PATCH, task="binary", num_inducing=4)
        assert spec.input_kind == "image" and spec.image_shape == COLOUR and spec.name == name
        assert spec.inducing == (("patches", "points") if "rbf" in name else "patches")
    multi = zoo.get("multichannel-conv", image_shape=COLOUR, patch_shape=COLOUR_PATCH).kernel
    assert multi.Kzz(np.zeros((4, 4))).shape == (3, 4, 4)


# ----------------------------------------------------------------------------- fitting end to end
def _rectangles(n, size=8, seed=0):
    """Outlines of random rectangles; label 1 when wider than tall (van der Wilk et al. 2017, §3.1, small)."""
    rng = np.random.default_rng(seed)
    X, y = np.zeros((n, size * size)), np.zeros(n, int)
    for i in range(n):
        while True:
            h, w = rng.integers(2, size + 1, 2)
            if h != w:
                break
        top, left = rng.integers(0, size - h + 1), rng.integers(0, size - w + 1)
        img = np.zeros((size, size))
        img[top, left : left + w] = img[top + h - 1, left : left + w] = 1
        img[top : top + h, left] = img[top : top + h, left + w - 1] = 1
        X[i], y[i] = img.ravel(), int(w > h)
    return X, y


@pytest.fixture(scope="module")
def fitted():
    X, y = _rectangles(40)
    out = {}
    for name in ("conv", "conv+rbf"):
        spec = zoo.get(name, image_shape=(8, 8), task="binary", num_inducing=6)
        out[name] = fit(spec, X, y, steps=60, seed=0, progress=False, chunk_size=30)
    return X, y, out


@pytest.mark.parametrize("name", ["conv", "conv+rbf"])
def test_tiny_fit_improves_elbo(fitted, name):
    res = fitted[2][name]
    elbo = res.objective_history
    assert len(elbo) == 60 and np.all(np.isfinite(elbo))
    assert elbo[-5:].mean() > elbo[:5].mean() + 1.0


def test_translation_invariance_of_fitted_conv(fitted):
    """Two images equal up to a shift that keeps every non-zero patch inside: same K rows and f."""
    X, _, out = fitted
    res = out["conv"]
    a = np.zeros((8, 8))
    a[3:5, 2:4] = [[1.0, 0.5], [0.25, 1.0]]
    b = np.roll(a, (1, 2), axis=(0, 1))
    pair = np.stack([a.ravel(), b.ravel()])
    kern = res.spec.kernel.resolved()
    K = np.asarray(kern.K(pair, X))
    np.testing.assert_allclose(K[0], K[1], rtol=1e-10)
    pred = predict(res, pair)
    np.testing.assert_allclose(pred.f_mean[0], pred.f_mean[1], rtol=1e-8)
    np.testing.assert_allclose(pred.f_var[0], pred.f_var[1], rtol=1e-8)


def test_component_variances_and_patch_figure(fitted):
    X, _, out = fitted
    res = out["conv+rbf"]
    comp = component_variances(res, X[:10])
    assert comp.names == ["0:Convolutional", "1:SquaredExponential"]
    fitted_kernel = _realised_parts(res).kernel
    np.testing.assert_allclose(comp.prior_var.sum(0), fitted_kernel.K_diag(X[:10]), rtol=1e-10)
    assert comp.prior_var.shape == (2, 10) and comp.posterior_var.shape == (2, 10, 1)
    assert np.all(comp.posterior_var > 0) and np.all(np.isfinite(comp.posterior_var))
    total = predict(res, X[:10])
    np.testing.assert_allclose(comp.posterior_mean.sum(0), total.f_mean, rtol=1e-8, atol=1e-10)
    assert set(comp.summary()) == set(comp.names)
    patches = inducing_patch_outputs(out["conv"])
    assert patches.patches.shape == (6, 3, 3, 1) and patches.outputs.shape == (1, 6, 1)
    fig = inducing_patches_figure(out["conv"])
    assert isinstance(fig, Figure) and len([ax for ax in fig.axes if ax.images]) == 6


@pytest.mark.benchmark
@pytest.mark.parametrize("config", ["rectangles", "mnist10", "mnist10-tick"])
def test_conv_kernels_benchmark_runs_quick(tmp_path, config):
    """benchmarks/conv_kernels.py still runs against the library (tiny sizes; ``-m benchmark``)."""
    import importlib.util  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "conv_kernels.py"
    spec = importlib.util.spec_from_file_location("_benchmark_conv_kernels", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    report = module.main(["--quick", "--config", config, "--out", str(tmp_path / "conv_kernels.json")])
    assert {"machine", "rates", "bound_s", "step_over_bound", "timings", "agreement"} <= set(report)
    assert all(v < 1e-4 for v in report["agreement"].values())
    assert report["step_over_bound"]["cpu_s"]["elbo_step"] > 0
    # the bound counts the Kff pairs' inner products (E + 2 columns for TICK's located patches) on top of the earlier count
    s, counts = report["setting"], report["counts"]
    E = s["E"] + (2 if s["located_patches"] else 0)
    assert counts["kff_inner_product_flops"] == 2 * s["B"] * s["P"] ** 2 * E
    assert counts["kuf_backward_flops"] == 2 * s["B"] * s["P"] * s["M"] * E
    for clock in ("cpu_s", "wall_s"):
        assert report["bound_s"][clock] > report["bound_exps_kuf_forward_s"][clock]
