"""A kernel's value depends on differences of its inputs only: a common shift of X and Z (a year axis, a
sensor reading 1000 ± 1) changes it by no more than the rounding of the shifted inputs themselves.

How the comparison is set up. ``X + c`` is rounded to the working precision before the kernel sees it,
and that rounding alone moves every coordinate by up to eps·|x + c|; no implementation can undo it. So
the reference is the kernel in float64 evaluated on exactly the rounded shifted inputs (cast
``X + c`` to the working precision, then subtract ``c`` in float64), and the tolerance allows the
computation the error of one more such rounding of every input coordinate of both arguments:

    |ΔK| ≤ 2 · Σ_e sup|∂k/∂x_e| · eps · max|x + c|,   sup|∂k/∂x_e| ≤ L σ² / ℓ

with eps the machine epsilon of the working precision, E coordinates, and L bounding the profile's
slope (1 for SE, RQ; √5 covers the Matérn family; 2π/(p ℓ) for the periodic kernel, 2π for the cosine
kernel). Patch kernels sum such terms with their patch weights: Kuf with Σ_p |w_p|, Kff with
(Σ_p |w_p|)². Distances by the uncentred expansion ‖x‖² − 2x·z + ‖z‖² miss this by orders of magnitude
(kernel errors of 0.1–1 at c = 1e4 in float32).

Fits: a two-moons classifier and a 1-D regression, both in float32 with their inputs shifted by 1e4,
reach the accuracy / RMSE of the unshifted fit.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpzoo.inference import fit, predict
from gpzoo.models import kernels, zoo
from gpzoo.models.kernels.convolutional import (
    AdditiveColourConvolutional,
    ConvolutionProducts,
    Convolutional,
    MatmulProducts,
    MultiChannelConvolutional,
    WeightedConvolutional,
    patch_sqdist,
    se_patch_cross_sum,
    se_patch_gram_sum,
)
from gpzoo.models.kernels.invariant import FiniteOrbit, InvariantKernel
from gpzoo.models.kernels.symmetry import ImageSymmetries
from gpzoo.models.kernels.tick import TICK

EPS = {"float32": float(np.finfo(np.float32).eps), "float64": float(np.finfo(np.float64).eps)}
#: The offsets: up to 1e4 in float32 (its 24-bit mantissa leaves ~3 decimal digits below 1e4), 1e8 in float64.
SHIFTS = [("float32", 1e3), ("float32", 1e4), ("float64", 1e4), ("float64", 1e8)]
SHIFT_IDS = [f"{p}-{c:g}" for p, c in SHIFTS]


def _set_precision(precision: str) -> None:
    jax.config.update("jax_enable_x64", precision == "float64")


def _shifted(arrays, c, precision):
    """(rounded shifted inputs in the working precision, the same values less c in float64)."""
    dtype = np.float32 if precision == "float32" else np.float64
    rounded = [np.asarray(a + c, dtype) for a in arrays]
    return rounded, [r.astype(np.float64) - c for r in rounded]


def _compare(evaluate, arrays, c, precision, slope, scale=1.0):
    """max |K(X + c, ...) − K_float64(rounded X + c − c, ...)| and its tolerance (module docstring).

    ``evaluate(*arrays)`` returns a tuple of kernel outputs; ``slope`` is Σ_e sup|∂k/∂x_e| for one
    argument and ``scale`` the patch weights' factor.
    """
    rounded, reference_inputs = _shifted(arrays, c, precision)
    _set_precision("float64")
    reference = [np.asarray(a, np.float64) for a in evaluate(*(jnp.asarray(r) for r in reference_inputs))]
    _set_precision(precision)
    got = [np.asarray(a, np.float64) for a in evaluate(*(jnp.asarray(r) for r in rounded))]
    largest = max(float(np.max(np.abs(r))) for r in rounded)
    tolerance = 2.0 * slope * scale * EPS[precision] * largest
    error = max(float(np.max(np.abs(g - r))) for g, r in zip(got, reference))
    return error, tolerance


# ----------------------------------------------------------------------------- stationary kernels
#: (kernel, sup of |∂k/∂x_e| per coordinate): σ² L / ℓ (module docstring)
STATIONARY = {
    "se": (kernels.SquaredExponential(lengthscale=0.7, variance=1.3), 1.3 / 0.7),
    "se-ard": (kernels.SquaredExponential(lengthscale=np.linspace(0.5, 2.0, 8), variance=1.0), 1.0 / 0.5),
    "matern12": (kernels.Matern12(lengthscale=0.8), math.sqrt(5) / 0.8),
    "matern32": (kernels.Matern32(lengthscale=0.8), math.sqrt(5) / 0.8),
    "matern52": (kernels.Matern52(lengthscale=0.8), math.sqrt(5) / 0.8),
    "rq": (kernels.RationalQuadratic(lengthscale=0.9, alpha=0.5), 1.0 / 0.9),
    "periodic": (kernels.Periodic(lengthscale=0.9, period=1.7), 2 * math.pi / (1.7 * 0.9**2)),
    "cosine": (kernels.Cosine(lengthscale=3.0), 2 * math.pi / 3.0),
}


@pytest.mark.parametrize("name", sorted(STATIONARY))
@pytest.mark.parametrize("columns", [2, 8], ids=["direct", "matmul"])
@pytest.mark.parametrize("precision,c", SHIFTS, ids=SHIFT_IDS)
def test_stationary_kernels_do_not_see_a_common_shift(float32, name, columns, precision, c):
    kernel, slope = STATIONARY[name]
    if name == "se-ard" and columns != 8:
        pytest.skip("one lengthscale per column of the 8-column inputs")
    rng = np.random.default_rng(0)
    X, Z = rng.normal(size=(30, columns)), rng.normal(size=(20, columns))
    error, tolerance = _compare(lambda X, Z: (kernel.K(X, Z), kernel.K(X), kernel.K_diag(X)), [X, Z], c, precision,
                                columns * slope)
    assert error <= tolerance, (error, tolerance)


@pytest.mark.parametrize("precision,c", SHIFTS, ids=SHIFT_IDS)
def test_scaled_sqdist_is_exact_zero_on_identical_points_and_has_gradients(float32, precision, c):
    """Identical points are at distance 0 under any shift; gradients match those of the unshifted inputs."""
    _set_precision(precision)
    rng = np.random.default_rng(1)
    for columns in (2, 8):
        X = jnp.asarray(rng.normal(size=(6, columns)) + c)
        assert float(jnp.max(jnp.abs(jnp.diagonal(kernels.scaled_sqdist(X, X, 0.5))))) == 0.0
        Y = jnp.asarray(rng.normal(size=(4, columns)) + c)
        grad = jax.grad(lambda X: jnp.sum(jnp.exp(-0.5 * kernels.scaled_sqdist(X, Y, 1.0))))(X)
        # closed form: ∂/∂x_n Σ_m exp(−½‖x_n − y_m‖²) = −Σ_m k_nm (x_n − y_m), on differences taken in float64
        diff = np.asarray(X, np.float64)[:, None, :] - np.asarray(Y, np.float64)[None, :, :]  # [N, M, D]
        k = np.exp(-0.5 * np.sum(diff**2, -1))  # [N, M]
        want = -np.einsum("nm,nmd->nd", k, diff)
        np.testing.assert_allclose(np.asarray(grad, np.float64), want, atol=2 * columns * EPS[precision] * (abs(c) + 4) * 4)


# ----------------------------------------------------------------------------- patch kernels
GREY, COLOUR, PATCH = (6, 6), (5, 5, 3), (3, 3)


def _se(lengthscale=0.8, variance=1.2):
    return kernels.SquaredExponential(lengthscale=lengthscale, variance=variance)


#: (kernel, inducing width E, sup |∂k_g/∂x_e| = σ² L / ℓ, Σ_p |w_p| of the patch weights)
PATCH_KERNELS = {
    "conv-fused": (Convolutional(_se(), GREY, PATCH, kuf_method="fused", kff_method="fused"), 9, 1.2 / 0.8, 1.0),
    "conv-distinct": (Convolutional(_se(), GREY, PATCH, kuf_method="fused", kff_method="distinct"), 9, 1.2 / 0.8, 1.0),
    "conv-autodiff-conv": (Convolutional(_se(), GREY, PATCH, kuf_method="autodiff", products="conv", kff_method="naive"), 9,
                           1.2 / 0.8, 1.0),
    "conv-autodiff-matmul": (Convolutional(_se(), GREY, PATCH, kuf_method="autodiff", products="matmul",
                                           kff_method="checkpoint"), 9, 1.2 / 0.8, 1.0),
    "conv-matern-ard": (Convolutional(kernels.Matern32(lengthscale=np.linspace(0.6, 1.4, 9)), GREY, PATCH), 9,
                        math.sqrt(5) / 0.6, 1.0),
    "conv-colour-separate": (Convolutional(_se(), COLOUR, PATCH, channels="separate", kuf_method="fused"), 9, 1.2 / 0.8, 1.0),
    "weighted": (WeightedConvolutional.create(_se(), GREY, PATCH, normalisation="sum"), 9, 1.2 / 0.8, 16.0),
    "additive-colour": (AdditiveColourConvolutional.create(_se(), COLOUR, PATCH), 27, 1.2 / 0.8, 1.0),
    "multi-channel": (MultiChannelConvolutional.create(_se(), COLOUR, PATCH), 9, 1.2 / 0.8, 1.0),
}


def _images(rng, kernel, n=5):
    return rng.uniform(0.0, 1.0, (n, kernel.input_dim))


@pytest.mark.parametrize("name", sorted(PATCH_KERNELS))
@pytest.mark.parametrize("precision,c", SHIFTS, ids=SHIFT_IDS)
def test_patch_kernels_do_not_see_a_common_pixel_offset(float32, name, precision, c):
    """Kuu, Kuf, the Kff diagonal and full Kff of every convolutional kernel, each of its Kuf / Kff paths."""
    kernel, width, slope, weight_sum = PATCH_KERNELS[name]
    rng = np.random.default_rng(2)
    X, Z = _images(rng, kernel), rng.uniform(0.0, 1.0, (7, width))

    def evaluate(X, Z):
        return kernel.Kzz(Z), kernel.Kzx(Z, X), kernel.K_diag(X), kernel.K(X)

    error, tolerance = _compare(evaluate, [X, Z], c, precision, width * slope, scale=weight_sum**2)
    assert error <= tolerance, (error, tolerance)


@pytest.mark.parametrize("kff_method", ["fused", "checkpoint"])
@pytest.mark.parametrize("precision,c", SHIFTS, ids=SHIFT_IDS)
def test_tick_does_not_see_a_common_pixel_offset(float32, kff_method, precision, c):
    """TICK (patches augmented with their locations): the fused and the plain paths; locations are not shifted."""
    kernel = TICK.create(_se(), GREY, PATCH, location_lengthscale=0.4, kff_method=kff_method,
                         kuf_method="fused" if kff_method == "fused" else "autodiff")
    rng = np.random.default_rng(3)
    X, Z = _images(rng, kernel), rng.uniform(0.0, 1.0, (7, 9))
    Z_loc = jnp.asarray(rng.uniform(0.0, 1.0, (7, 2)))

    def evaluate(X, Z):
        loc = Z_loc.astype(X.dtype)
        return kernel.Kzz(Z, Z_loc=loc), kernel.Kzx(Z, X, Z_loc=loc), kernel.K_diag(X), kernel.K(X)

    error, tolerance = _compare(evaluate, [X, Z], c, precision, 9 * 1.2 / 0.8)
    assert error <= tolerance, (error, tolerance)


@pytest.mark.parametrize("precision,c", SHIFTS, ids=SHIFT_IDS)
def test_invariant_kernel_does_not_see_a_common_pixel_offset(float32, precision, c):
    """A kernel summed over an image-symmetry orbit (rotations and flips keep a constant offset)."""
    kernel = InvariantKernel(_se(lengthscale=2.0), FiniteOrbit(ImageSymmetries((4, 4))))
    rng = np.random.default_rng(4)
    X, Y = rng.uniform(0.0, 1.0, (4, 16)), rng.uniform(0.0, 1.0, (3, 16))
    scale = kernel.orbit.group.order**2  # an unnormalised double sum over the orbit
    error, tolerance = _compare(lambda X, Y: (kernel.K(X, Y), kernel.K_diag(X)), [X, Y], c, precision, 16 * 1.2 / 2.0,
                                scale=scale)
    assert error <= tolerance, (error, tolerance)


@pytest.mark.parametrize("precision,c", SHIFTS, ids=SHIFT_IDS)
def test_patch_primitives_do_not_see_a_common_offset(float32, precision, c):
    """patch_sqdist (both product strategies), se_patch_cross_sum and se_patch_gram_sum, gradients included."""
    rng = np.random.default_rng(5)
    images, filters = rng.uniform(0, 1, (3, 5, 5, 2)), rng.uniform(0, 1, (4, 3, 3, 2))
    patches, Z = rng.uniform(0, 1, (3, 6, 5)), rng.uniform(0, 1, (4, 5))
    weights = rng.uniform(0.5, 1.5, 6)

    def evaluate(images, filters, patches, Z):
        cross = lambda p, z: jnp.sum(se_patch_cross_sum(p, z, weights, lengthscale=0.9) ** 2)  # noqa: E731
        gram = lambda p: jnp.sum(se_patch_gram_sum(p, jnp.ones(p.shape[:2], p.dtype), lengthscale=0.9))  # noqa: E731
        gp, gz = jax.grad(cross, argnums=(0, 1))(patches, Z)
        return (jnp.exp(-0.5 * patch_sqdist(images, filters, 0.9, ConvolutionProducts())),
                jnp.exp(-0.5 * patch_sqdist(images, filters, 0.9, MatmulProducts())),
                se_patch_cross_sum(patches, Z, weights, lengthscale=0.9), gp, gz,
                se_patch_gram_sum(patches, jnp.ones(patches.shape[:2], patches.dtype), lengthscale=0.9),
                jax.grad(gram)(patches))

    # the gradients are sums of up to P·M = 24 terms of slope ≤ Σ w (≤ 9) times 2·max K (≤ 9 · 6)
    error, tolerance = _compare(evaluate, [images, filters, patches, Z], c, precision, 18 / 0.9, scale=24 * 9 * 2 * 9 * 6)
    assert error <= tolerance, (error, tolerance)


# ----------------------------------------------------------------------------- fits in float32
def _moons():
    from sklearn.datasets import make_moons  # noqa: PLC0415

    X, y = make_moons(300, noise=0.15, random_state=0)
    X_test, y_test = make_moons(300, noise=0.15, random_state=1)
    return X, y, X_test, y_test


def test_two_moons_classifier_shifted_by_1e4_reaches_the_unshifted_accuracy_in_float32(float32):
    X, y, X_test, y_test = _moons()
    spec = zoo.get("svgp-rbf", input_dim=2, task="binary", num_inducing=16)
    accuracy = {}
    for c in (0.0, 1e4):
        res = fit(spec, X + c, y, steps=250, batch_size=100, learning_rate=0.05, progress=False)
        probs = predict(res, X_test + c).probs
        accuracy[c] = float(np.mean((probs[:, 1] > 0.5) == y_test))
    assert accuracy[0.0] >= 0.95, accuracy
    assert accuracy[1e4] >= accuracy[0.0] - 0.01, accuracy


def test_regression_shifted_by_1e4_reaches_the_unshifted_rmse_in_float32(float32):
    rng = np.random.default_rng(6)
    X = np.sort(rng.uniform(0.0, 10.0, (200, 1)), axis=0)
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=200)
    X_test = np.linspace(0.2, 9.8, 100)[:, None]
    spec = zoo.get("svgp-rbf", input_dim=1, num_inducing=16)
    rmse = {}
    for c in (0.0, 1e4):
        res = fit(spec, X + c, y, steps=300, learning_rate=0.05, progress=False)
        mean = predict(res, X_test + c).y_mean[:, 0]
        rmse[c] = float(np.sqrt(np.mean((mean - np.sin(X_test[:, 0])) ** 2)))
    assert rmse[0.0] <= 0.1, rmse
    assert rmse[1e4] <= 1.1 * rmse[0.0] + 0.01, rmse


@pytest.mark.parametrize("columns", [2, 8], ids=["direct", "matmul"])
def test_a_row_of_the_second_argument_does_not_depend_on_the_rows_beside_it(float32, columns):
    """Centring takes its reference from the first argument (inducing points, training inputs): in a block of
    prediction rows, a row gets the same bits whatever the other rows of the block are (padding included;
    blocks of one shape, as predictions use: a matmul of another shape may sum in another order)."""
    rng = np.random.default_rng(7)
    Z = jnp.asarray(rng.normal(size=(6, columns)) + 1e3, jnp.float32)
    X = jnp.asarray(rng.normal(size=(9, columns)) + 1e3, jnp.float32)
    for kernel in (kernels.SquaredExponential(lengthscale=0.7), kernels.Periodic(period=1.7), kernels.Cosine(lengthscale=3.0)):
        padded = jnp.concatenate([X[:4], jnp.zeros_like(X[4:])])  # zero rows, as a padded block
        np.testing.assert_array_equal(kernel.K(Z, X)[:, :4], kernel.K(Z, padded)[:, :4])
    conv = Convolutional(_se(), GREY, PATCH, kuf_method="fused")
    images = jnp.asarray(rng.uniform(0, 1, (5, 36)) + 1e3, jnp.float32)
    inducing = jnp.asarray(rng.uniform(0, 1, (4, 9)) + 1e3, jnp.float32)
    padded = jnp.concatenate([images[:2], jnp.zeros_like(images[2:])])
    np.testing.assert_array_equal(conv.Kzx(inducing, images)[:, :, :2], conv.Kzx(inducing, padded)[:, :, :2])
    np.testing.assert_array_equal(conv.K_diag(images)[:2], conv.K_diag(padded)[:2])
