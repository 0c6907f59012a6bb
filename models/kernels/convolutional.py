"""Convolutional kernels on images, for inter-domain inducing patches (van der Wilk et al. 2017, §3, App. A–C).

A patch-response function g ~ GP(0, k_g) on patches induces a GP on images (van der Wilk et al. 2017, eq. 13–14)::

    f(x) = Σ_s Σ_p w_sp g_s(x^[sp])

with P patches per *stream* s. Streams are how colour channels meet patches (van der Wilk et al. 2017, §3.4):

========================================  =========================  =====================
kernel                                    streams, patch space       g
========================================  =========================  =====================
:class:`Convolutional` (eq. 13–16)        1, w×h×C colour patches    one g, w = 1
  ``channels="separate"``                 C, w×h patches per channel one g for all channels
:class:`WeightedConvolutional` (eq. 17–19) as above                   one g, learned w
:class:`AdditiveColourConvolutional`      C, w×h (g̃ on w×h×C)        g̃ = Σ_c √v_c g_c (eq. 24–25)
:class:`MultiChannelConvolutional`        C, w×h, shared Z           independent g_c (eq. 22–23)
========================================  =========================  =====================

Conventions, each in one place:

* images are rows of ``X`` flattened channel-last, ``[N, H*W*C]``; ``image_shape`` is (H, W) or
  (H, W, C); patches are taken with stride 1 and no padding, patch p = (i, j) in row-major order
  over the (H−h+1)×(W−w+1) grid, patch elements (dy, dx, c) in row-major order — the same order
  as the rows of the inducing patches Z ``[M, E]`` (:func:`extract_patches`);
* normalisation: ``normalisation="mean"`` divides the patch weights by the number of terms in the
  sum defining f (GPflow's convention: Kuf / P, Kff / P²), ``"sum"`` is van der Wilk et al. 2017, eq. 13 as written.
  Both are the same model up to the base kernel's variance; only
  :meth:`ConvolutionalKernel._patch_weights` applies it;
* how patch inner products x^[p]·z are computed is an injected strategy
  (:class:`ConvolutionProducts` or :class:`MatmulProducts`, van der Wilk et al. 2017, App. A.2).

Hot paths. Kuf for a stationary base kernel uses ‖x_p‖² − 2 x_p·z + ‖z‖² (van der Wilk et al. 2017, eq. A.5)
(never an ``[N, P, M, E]`` broadcast), on values from which an offset shared by the inducing
patches has been taken (:func:`offset_reference`: pixel values 1000 ± 1 would otherwise cancel
away the differences in float32). For the SE base kernel it is :func:`se_patch_cross_sum`,
a ``jax.custom_vjp``: matmul, exp and the weighted sum over patches in one fusion forward, and
one chunked pass over K = exp(−½r²) for all gradients backward (no ``[N, P, M]`` array either
way); other stationary kernels take both inner products from the strategy and plain autodiff
(``kuf_method="autodiff"`` selects this path for SE too). The Kff
diagonal Σ_pq w_p w_q k(x_p, x_q) needs N·P² base-kernel evaluations; for the SE base kernel it
is :func:`se_patch_gram_sum`, a ``jax.custom_vjp`` whose forward pass under differentiation
computes the value and the gradients that are needed in one sweep that visits each unordered
pair of patch blocks once (the Gram is symmetric: ≈ N·P²/2 exps, each evaluated once, no
``[N, P, P]`` temporary); with a scalar lengthscale and data patches that are not differentiated
its gradients are a few scalars per image. Equal patches have equal rows in the Gram, so an image
with a background (MNIST: ~40% of its 5×5 patches are blank; rectangles: ~80% of 3×3) is swept
over its distinct patches with summed weights (``kff_method="distinct"``, the default on CPU):
exact, with work that follows the distinct patches. Other base kernels use row blocks under
``jax.checkpoint`` (same memory bound, recomputation in the backward pass). The choice is the
kernel's static ``kff_method`` field, part of its structure: a compiled program never depends on
anything else.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import constraints

from gpzoo.models.errors import InvalidArgumentError, ShapeError, as_float_array, is_concrete, warn_unit_range
from gpzoo.models.kernels.base import Fixed, Kernel, Sum, hyper, kernel_class, static
from gpzoo.models.kernels.conv2d import conv2d
from gpzoo.models.kernels.stationary import SquaredExponential, Stationary

__all__ = [
    "AdditiveColourConvolutional",
    "ConvolutionProducts",
    "Convolutional",
    "ConvolutionalKernel",
    "ImageSum",
    "KFF_METHODS",
    "KUF_METHODS",
    "MatmulProducts",
    "MultiChannelConvolutional",
    "WeightedConvolutional",
    "extract_patches",
    "offset_reference",
    "patch_gram_sum",
    "patch_sqdist",
    "se_patch_cross_sum",
    "se_patch_gram_sum",
]

NORMALISATIONS = ("mean", "sum")
KFF_METHODS = ("auto", "fused", "distinct", "checkpoint", "naive")
KUF_METHODS = ("auto", "fused", "autodiff")
#: Target number of elements of one ``[R, block, P]`` tile of the Kff diagonal (see benchmarks/conv_kernels.py).
KFF_TILE_ELEMENTS = 2**22
_HIGHEST = jax.lax.Precision.HIGHEST  # distances by expansion need full-precision dots (no TF32 on GPUs)


def offset_reference(parts, axes):
    """A common point to subtract from every part before distances by expansion: ``[1, ..., K]``.

    ``parts``: arrays whose trailing axes line up, reduced over their leading ``axes`` to one
    value per remaining position. Where the values' mean is larger than their spread (max − min),
    i.e. where they share an offset (pixel values 1000 ± 1), it is that mean; elsewhere 0, so
    inputs near the origin (images in [0, 1]) are left exactly as they are. Distances are unchanged
    by any common shift, and subtracting the reference is exact for values near it, so
    ‖x‖² − 2 x·z + ‖z‖² then cancels only up to the spread of the values, not their magnitude. A
    constant of the computation (``stop_gradient``): gradients are those of the uncentred inputs.
    Callers take it from the inducing patches (Kuf) or from one image's own patches (Kff), never
    from a batch of images, so an image's values do not depend on the images beside it.
    """
    parts = [p for p in parts if p.size]
    if not parts:
        return 0.0
    count = sum(math.prod(p.shape[a] for a in axes) for p in parts)
    total = sum(jnp.sum(p, axis=axes, keepdims=True) for p in parts)
    top = functools.reduce(jnp.maximum, [jnp.max(p, axis=axes, keepdims=True) for p in parts])
    bottom = functools.reduce(jnp.minimum, [jnp.min(p, axis=axes, keepdims=True) for p in parts])
    mean = total / count
    return jax.lax.stop_gradient(jnp.where(jnp.abs(mean) > top - bottom, mean, jnp.zeros_like(mean)))


# ----------------------------------------------------------------------------- patches
def image_dims(image_shape) -> tuple[int, int, int]:
    """(H, W, C) from ``image_shape`` (H, W) or (H, W, C); raises ``ShapeError`` naming ``image_shape``."""
    try:
        shape = tuple(int(s) for s in image_shape)
    except TypeError:
        raise ShapeError("image_shape", f"expected (H, W) or (H, W, C), got {image_shape!r}") from None
    if len(shape) not in (2, 3) or min(shape) < 1:
        raise ShapeError("image_shape", f"expected (H, W) or (H, W, C) of positive ints, got {image_shape!r}")
    return shape if len(shape) == 3 else shape + (1,)


def extract_patches(images, patch_shape):
    """All stride-1 patches of ``images`` ``[B, H, W, C]`` as rows: ``[B, P, h*w*C]``.

    One strided slice per patch offset (dy, dx), stacked: XLA's CPU backend laid a flat-index
    gather out image-minor and transposed it for every consumer, which cost 10% of an MNIST-10
    training step (benchmarks/conv_kernels.py).
    """
    B, H, W, C = images.shape
    h, w = patch_shape
    rows, cols = H - h + 1, W - w + 1
    shifted = [images[:, dy : dy + rows, dx : dx + cols, :] for dy in range(h) for dx in range(w)]  # h*w × [B, H', W', C]
    return jnp.stack(shifted, axis=3).reshape(B, rows * cols, h * w * C)  # [B, P, E]  elements (dy, dx, c)


# ----------------------------------------------------------------------------- inner-product strategies
@dataclasses.dataclass(frozen=True)
class ConvolutionProducts:
    """x^[p]·z for every patch p and filter z as one convolution (van der Wilk et al. 2017, App. A.2, fig. A.1).

    The filters are the (scaled) inducing patches; a stride-1 convolution with VALID padding
    (:func:`~gpzoo.models.kernels.conv2d.conv2d`, whose filter gradient XLA:CPU runs as a library
    convolution inside ``gpzoo.fit``'s compiled scan too) is the cross-correlation Σ_e x^[p]_e z_e.
    """

    def __call__(self, images, filters):
        """images ``[B, H, W, C]``, filters ``[F, h, w, C]`` -> ``[B, P, F]``."""
        kernel_hwio = jnp.moveaxis(filters, 0, -1)  # [h, w, C, F]
        out = conv2d(images, kernel_hwio, 1, ((0, 0), (0, 0)), _HIGHEST)  # [B, H', W', F]
        return out.reshape(out.shape[0], -1, out.shape[-1])  # [B, P, F]


@dataclasses.dataclass(frozen=True)
class MatmulProducts:
    """x^[p]·z as one patch matmul ``[B·P, E] @ [E, F]`` (GPflow's formulation)."""

    def __call__(self, images, filters):
        """images ``[B, H, W, C]``, filters ``[F, h, w, C]`` -> ``[B, P, F]``."""
        patches = extract_patches(images, filters.shape[1:3])  # [B, P, E]
        flat = filters.reshape(filters.shape[0], -1)  # [F, E]
        return jnp.einsum("bpe,fe->bpf", patches, flat, precision=_HIGHEST)  # [B, P, F]


PATCH_PRODUCTS = {"conv": ConvolutionProducts(), "matmul": MatmulProducts()}


def patch_sqdist(images, filters, lengthscale, products=ConvolutionProducts()):
    """Scaled squared distances ‖(x^[p] − z_f)/ℓ‖² ``[B, P, F]`` by van der Wilk et al. 2017, eq. A.5.

    images ``[B, H, W, C]``, filters ``[F, h, w, C]``; ``lengthscale`` is a scalar or one value
    per patch element (ARD over the h·w·C positions). Both ‖x^[p]/ℓ‖² (the squared image
    against a window of 1/ℓ²) and x^[p]·z/ℓ² are inner products computed by ``products``, after
    a pixel offset shared by the filters is taken off each channel of both (:func:`offset_reference`).
    """
    h, w, C = filters.shape[1:]
    reference = offset_reference([filters], (0, 1, 2))  # [1, 1, 1, C]  a pixel offset shared by the filters, per channel
    images, filters = images - reference, filters - reference  # [B, H, W, C], [F, h, w, C]
    inv_l2 = jnp.broadcast_to(1.0 / jnp.asarray(lengthscale, filters.dtype) ** 2, (h * w * C,))  # [E]
    inv_l2 = inv_l2.reshape(1, h, w, C)  # [1, h, w, C]
    cross = products(images, filters * inv_l2)  # [B, P, F]
    x_sq = products(images**2, inv_l2)  # [B, P, 1]
    z_sq = jnp.sum(filters**2 * inv_l2, axis=(1, 2, 3))  # [F]
    return jnp.maximum(x_sq - 2.0 * cross + z_sq, 0.0)  # [B, P, F]


# ----------------------------------------------------------------------------- Kuf, SE base kernel
#: Target number of elements of one ``[r, P, M]`` chunk of the fused Kuf backward pass (fits in L2).
KUF_CHUNK_ELEMENTS = 2**18
#: ``kuf_method="auto"`` takes the fused path from this many inducing patches on: with M = 16
#: (rectangles) plain autodiff was ~15% faster per ELBO step, from M = 48 on the fused path was
#: 2-3x faster (benchmarks/conv_kernels.py).
KUF_FUSED_MIN_INDUCING = 32


@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class _CrossNeeds:
    """Which inputs of :func:`se_patch_cross_sum` the backward pass differentiates (static residual)."""

    patches: bool
    inducing: bool
    lengthscale: bool
    weights: bool


def _augmented(patches, Z, inv_l2):
    """Rows whose products are −½‖(x − z)/ℓ‖² (van der Wilk et al. 2017, eq. A.5 as one matmul):
    [x, −½‖x‖²_a, 1] ``[R, P, E+2]`` and [a∘z, 1, −½‖z‖²_a] ``[M, E+2]``, a = 1/ℓ² ``[E]``."""
    half_x = -0.5 * jnp.sum(patches**2 * inv_l2, axis=-1, keepdims=True)  # [R, P, 1]
    half_z = -0.5 * jnp.sum(Z**2 * inv_l2, axis=-1, keepdims=True)  # [M, 1]
    left = jnp.concatenate([patches, half_x, jnp.ones_like(half_x)], axis=-1)  # [R, P, E+2]
    right = jnp.concatenate([Z * inv_l2, jnp.ones_like(half_z), half_z], axis=-1)  # [M, E+2]
    return left, right


def _cross_rows(R: int, P: int, M: int, chunk_rows: int | None) -> int:
    if chunk_rows is not None:
        return int(max(1, min(R, chunk_rows)))
    return int(max(1, min(R, KUF_CHUNK_ELEMENTS // max(1, P * M))))


def _se_cross_value(patches, Z, lengthscale, weights):
    """Σ_p w_p exp(−½‖(x_rp − z_m)/ℓ‖²) ``[R, M]``: one matmul, exp and weighted sum over p.

    Written as ``sum(exp(matmul) * w)`` — no einsum for the sum — so that XLA's CPU backend runs
    matmul, exp and reduction as one fusion without an ``[R, P, M]`` array (an einsum for the
    sum forces K into memory and took ~4x longer at the MNIST sizes, benchmarks/conv_kernels.py).
    """
    inv_l2 = jnp.broadcast_to(1.0 / lengthscale**2, Z.shape[-1:])  # [E]
    left, right = _augmented(patches, Z, inv_l2)  # [R, P, E+2], [M, E+2]
    S = jnp.einsum("rpe,me->rpm", left, right, precision=_HIGHEST)  # [R, P, M]  −½ r²
    return jnp.sum(jnp.exp(S) * weights[:, None], axis=1)  # [R, M]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _se_cross(patches, Z, lengthscale, weights, chunk_rows):
    return _se_cross_value(patches, Z, lengthscale, weights)  # [R, M]


def _se_cross_fwd(patches, Z, lengthscale, weights, chunk_rows):
    """Forward pass under differentiation: the value; only ``[R, M]`` is kept besides the inputs."""
    needs = _CrossNeeds(patches.perturbed, Z.perturbed, lengthscale.perturbed, weights.perturbed)
    xs, zs, ls, ws = patches.value, Z.value, lengthscale.value, weights.value
    value = _se_cross_value(xs, zs, ls, ws)  # [R, M]
    return value, (xs, zs, ls, ws, value, needs)


def _se_cross_bwd(chunk_rows, residuals, cotangent):
    """Gradients from one pass over K = exp(−½r²), recomputed in chunks of r images (no ``[R, P, M]`` array).

    With c_rpm = ḡ_rm w_p K_rpm (ḡ the cotangent), C_rp = Σ_m c_rpm, Y_me = Σ_rp c_rpm x_rpe and
    c_m = Σ_rp c_rpm = Σ_r ḡ_rm value_rm:
    ∂/∂w_p = Σ_rm ḡ_rm K_rpm; ∂/∂z_me = a_e (Y_me − c_m z_me);
    ∂/∂ℓ_e = a_e/ℓ_e (Σ_rp C_rp x²_rpe − 2 Σ_m z_me Y_me + Σ_m c_m z²_me) (that is Σ c (x − z)²_e / ℓ_e³);
    ∂/∂x_rpe = a_e (Σ_m c_rpm z_me − C_rp x_rpe). Per chunk: one matmul for K, one for Y.
    """
    xs, zs, ls, ws, value, needs = residuals
    g = cotangent  # [R, M]
    R, P, E = xs.shape
    M = zs.shape[0]
    dtype = xs.dtype
    inv_l2 = jnp.broadcast_to(1.0 / ls**2, (E,))  # [E]
    r = _cross_rows(R, P, M, chunk_rows)
    n = -(-R // r)
    pad = n * r - R
    xp = jnp.pad(xs, ((0, pad), (0, 0), (0, 0)))  # [n*r, P, E]  padded rows have zero cotangent
    gp = jnp.pad(g, ((0, pad), (0, 0)))  # [n*r, M]
    left, right = _augmented(xp, zs, inv_l2)  # [n*r, P, E+2], [M, E+2]
    want_y = needs.inducing or needs.lengthscale
    want_c = needs.weights or needs.lengthscale or needs.patches
    wx = (xp * ws[:, None]).reshape(n, r, P, E) if want_y else None  # [n, r, P, E]

    def body(carry, chunk):
        y_t, cw, q1 = carry  # [E, M], [P], [E]
        L, gk, wxk, xk = chunk  # [r, P, E+2], [r, M], [r, P, E] or None, [r, P, E]
        Kg = jnp.exp(jnp.einsum("rpe,me->rpm", L, right, precision=_HIGHEST)) * gk[:, None, :]  # [r, P, M]
        dx = None
        if want_y:
            y_t = y_t + jnp.einsum("rpe,rpm->em", wxk, Kg, precision=_HIGHEST)  # [E, M]
        if want_c:
            c_rows = jnp.sum(Kg, axis=-1)  # [r, P]  Σ_m ḡ K
            cw = cw + jnp.sum(c_rows, axis=0)
            if needs.lengthscale:
                q1 = q1 + jnp.sum((c_rows * ws)[..., None] * xk**2, axis=(0, 1))  # Σ C x²
            if needs.patches:
                KgZ = jnp.einsum("rpm,me->rpe", Kg, zs, precision=_HIGHEST)  # [r, P, E]
                dx = ws[:, None] * inv_l2 * (KgZ - c_rows[..., None] * xk)  # [r, P, E]
        return (y_t, cw, q1), dx

    init = (jnp.zeros((E, M), dtype), jnp.zeros((P,), dtype), jnp.zeros((E,), dtype))
    chunks = (left.reshape(n, r, P, E + 2), gp.reshape(n, r, M), wx, xp.reshape(n, r, P, E))
    (y_t, cw, q1), dx = jax.lax.scan(body, init, chunks)
    Y = y_t.T  # [M, E]
    c_m = jnp.sum(g * value, axis=0)  # [M]
    dX = dZ = dls = dw = None
    if needs.patches:
        dX = dx.reshape(n * r, P, E)[:R]  # [R, P, E]
    if needs.inducing:
        dZ = inv_l2 * (Y - c_m[:, None] * zs)  # [M, E]
    if needs.lengthscale:
        Q = q1 - 2.0 * jnp.sum(zs * Y, axis=0) + jnp.sum(c_m[:, None] * zs**2, axis=0)  # [E]  Σ c (x − z)²
        dls_e = Q * inv_l2 / ls  # [E]
        dls = jnp.sum(dls_e) if jnp.ndim(ls) == 0 else dls_e
    if needs.weights:
        dw = cw  # [P]
    return dX, dZ, dls, dw


_se_cross.defvjp(_se_cross_fwd, _se_cross_bwd, symbolic_zeros=True)


def se_patch_cross_sum(patches, Z, weights, chunk_rows: int | None = None, *, lengthscale=None):
    """Σ_p w_p exp(−½‖(x_rp − z_m)/ℓ‖²) per row and inducing patch: patches ``[R, P, E]``, Z ``[M, E]``,
    weights ``[P]`` -> ``[R, M]``.

    Kuf of a convolutional kernel with an SE base kernel (van der Wilk et al. 2017, eq. 15, 19; the variance
    applied by the caller); ``lengthscale`` is a scalar or ``[E]`` (default 1). A
    ``jax.custom_vjp``: the forward pass is one fused matmul–exp–sum (van der Wilk et al. 2017, eq. A.5, never an
    ``[R, P, M]`` array); the backward pass recomputes K in chunks of ``chunk_rows`` rows (default:
    about :data:`KUF_CHUNK_ELEMENTS` elements) and reads each chunk once for all gradients that are
    needed (symbolic zeros: data patches that are not differentiated cost nothing). An offset
    shared by the inducing patches is taken off both first (:func:`offset_reference`), so the
    expansion and the gradients' sums cancel only up to the spread of the values. First-order
    reverse mode only (no forward mode, no Hessians).
    """
    patches = jnp.asarray(patches)
    dtype = patches.dtype
    Z = jnp.asarray(Z, dtype)
    reference = offset_reference([Z], (0,))  # [1, E]  an offset shared by the inducing patches
    patches, Z = patches - reference, Z - reference  # [R, P, E], [M, E]
    weights = jnp.broadcast_to(jnp.asarray(weights, dtype), patches.shape[1:2])  # [P]
    lengthscale = jnp.asarray(1.0 if lengthscale is None else lengthscale, dtype)  # [] or [E]
    return _se_cross(patches, Z, lengthscale, weights, chunk_rows)  # [R, M]


# ----------------------------------------------------------------------------- Kff diagonal
def tile_rows(R: int, P: int, block_size: int | None) -> int:
    if block_size is not None:
        return int(max(1, min(P, block_size)))
    return int(max(1, min(P, KFF_TILE_ELEMENTS // max(1, R * P))))


def pad_rows(U, w, block: int):
    """Pad the patch axis to a multiple of ``block`` with zero-weight patches."""
    P = U.shape[1]
    pad = -P % block
    Up = jnp.pad(U, ((0, 0), (0, pad), (0, 0)))  # [R, Pp, E]
    wp = jnp.pad(w, ((0, 0), (0, pad)))  # [R, Pp]
    return Up, wp, (P + pad) // block


#: Target side of one square ``[b, b]`` block of the patch Gram in the symmetric SE sweep.
SE_BLOCK = 56
#: Target number of elements of one ``[r, b, h·b]`` tile of the symmetric SE sweep on accelerators.
#: On CPU a tile is one image (r = 1): XLA's CPU backend ran the batched small matmuls of r > 1
#: tiles 1.5-2x slower than one plain matmul per image (benchmarks/conv_kernels.py, MNIST and
#: rectangles sizes), and a [b, h·b] tile of ~20k elements stays in L2.
SE_TILE_ELEMENTS = 2**18


def _se_plan(R: int, P: int, block_size: int | None, one_image: bool = False) -> tuple[int, int, int, int]:
    """Blocking of the symmetric sweep: (nb column blocks of b patches, h blocks per band, r rows per chunk).

    The P patches are cut into nb blocks of b (an odd nb by default, so no block pair is
    visited twice); row block i meets the band of column blocks i, i+1, ..., i+nb//2 (mod nb),
    which covers every unordered block pair once: about P²/2 + P·b/2 exps instead of P².
    """
    if block_size is None:
        nb = max(1, round(P / SE_BLOCK))
        nb += 1 - nb % 2  # odd
    else:
        nb = max(1, math.ceil(P / max(1, int(block_size))))
    b = math.ceil(P / nb)
    h = nb // 2 + 1
    if one_image or jax.default_backend() == "cpu":
        return nb, b, h, 1
    r = int(max(1, min(R, SE_TILE_ELEMENTS // (b * h * b))))
    return nb, b, h, r


#: Side of the square tiles of the distinct-patch sweep, and how many of its tiles cost about one
#: band tile: an image whose distinct patches fill na blocks takes the pair sweep when its
#: na(na+1)/2 tiles are at most DISTINCT_TILES_PER_BAND_TILE × nb (benchmarks/conv_kernels.py).
DISTINCT_BLOCK = 64
DISTINCT_TILES_PER_BAND_TILE = 3
#: Only images with at least this fraction of constant patches (a background) look for repeated
#: patches: sorting the patches costs ~10% of the band sweep, wasted where all patches differ.
DISTINCT_MIN_CONSTANT_FRACTION = 0.25


def _distinct_rows(U, w):
    """The distinct rows of one image's patches and their summed weights.

    U ``[P, E]``, w ``[P]`` -> distinct rows first ``[P, E]`` (the rest zero), group weights
    ``[P]`` (Σ w over equal rows; zero past the groups), the group of each row ``[P]`` and the
    number of groups ``[]``. Rows are ordered by a fixed projection and equal neighbours merged:
    exact (only equal rows merge; equal rows that a projection tie separates stay apart).
    """
    P, E = U.shape
    direction = 1.0 + 0.6180339887 * jnp.arange(E, dtype=U.dtype)  # [E] any generic direction
    order = jnp.argsort(U @ direction)  # [P]
    Us = U[order]  # [P, E]
    first = jnp.concatenate([jnp.ones((1,), bool), jnp.any(Us[1:] != Us[:-1], axis=-1)])  # [P] starts a group
    sorted_group = jnp.cumsum(first) - 1  # [P]
    group = jnp.zeros((P,), sorted_group.dtype).at[order].set(sorted_group)  # [P]
    Ud = jnp.zeros_like(U).at[sorted_group].set(Us)  # [P, E]  (equal rows write the same values)
    # group weights in two stages (runs of at most 32 sorted rows, then their runs per group):
    # one float32 sum along a group of hundreds of background patches lost 1e-5 relative
    run = jnp.cumsum(first | (jnp.arange(P) % 32 == 0)) - 1  # [P] run of each sorted row
    num_runs = P + P // 32 + 1  # a bound on the number of runs
    run_sums = jax.ops.segment_sum(w[order], run, num_segments=num_runs, indices_are_sorted=True)  # [num_runs]
    run_group = jnp.full((num_runs,), P, sorted_group.dtype).at[run].set(sorted_group)  # [num_runs]  P: no run
    Wd = jax.ops.segment_sum(run_sums, run_group, num_segments=P, indices_are_sorted=True)  # [P]
    return Ud, Wd, group, sorted_group[-1] + 1


@functools.lru_cache(maxsize=64)
def _block_pairs(nb: int) -> tuple[np.ndarray, np.ndarray]:
    """Block pairs (i ≤ j) ordered by j: the first na(na+1)/2 are those within the first na blocks."""
    pairs = [(i, j) for j in range(nb) for i in range(j + 1)]
    return np.array([i for i, _ in pairs], np.int32), np.array([j for _, j in pairs], np.int32)


def _pair_sweep(Ud, Wd, num_blocks, b: int, need_rhs: bool, with_h: bool):
    """value, t and K·[w, w∘U] of one image over the block pairs of its distinct rows (dynamic count).

    Ud ``[Pd, E]`` distinct rows padded with zero weight, Wd ``[Pd]``, ``num_blocks`` (traced)
    blocks of b rows hold all groups. Returns ``[]``, ``[]``, ``[Pd, K]`` or None (per group).
    """
    Pd, E = Ud.shape
    dtype = Ud.dtype
    half_sq = -0.5 * jnp.sum(Ud**2, axis=-1, keepdims=True)  # [Pd, 1]
    ones = jnp.ones_like(half_sq)
    left = jnp.concatenate([Ud, half_sq, ones], axis=-1)  # [Pd, E+2]
    right = jnp.concatenate([Ud, ones, half_sq], axis=-1)  # [Pd, E+2]
    H = jnp.concatenate([Wd[:, None]] + ([Wd[:, None] * Ud] if need_rhs else []), axis=-1) if with_h else None  # [Pd, K]
    first, second = (jnp.asarray(a) for a in _block_pairs(Pd // b))

    def body(k, carry):
        total, t, KH = carry  # [], [], [Pd, K] or None
        i, j = first[k] * b, second[k] * b
        Li, Rj = jax.lax.dynamic_slice_in_dim(left, i, b, 0), jax.lax.dynamic_slice_in_dim(right, j, b, 0)  # [b, E+2]
        wi, wj = jax.lax.dynamic_slice_in_dim(Wd, i, b, 0), jax.lax.dynamic_slice_in_dim(Wd, j, b, 0)  # [b]
        S = jnp.matmul(Li, Rj.T, precision=_HIGHEST)  # [b, b]  −½ r²
        K = jnp.exp(S)  # [b, b]
        off = (i != j).astype(dtype)  # an off-diagonal block pair counts twice and serves both blocks
        WW = (1.0 + off) * wi[:, None] * wj[None, :]  # [b, b]
        total = total + jnp.sum(K * WW)
        t = t + jnp.sum(K * S * WW)
        if KH is None:
            return total, t, KH
        Hi, Hj = jax.lax.dynamic_slice_in_dim(H, i, b, 0), jax.lax.dynamic_slice_in_dim(H, j, b, 0)  # [b, K]
        rows = jnp.matmul(K, Hj, precision=_HIGHEST)  # [b, K]
        cols = jnp.matmul(K.T, Hi, precision=_HIGHEST) * off  # [b, K]
        KH = jax.lax.dynamic_update_slice_in_dim(KH, jax.lax.dynamic_slice_in_dim(KH, i, b, 0) + rows, i, 0)
        KH = jax.lax.dynamic_update_slice_in_dim(KH, jax.lax.dynamic_slice_in_dim(KH, j, b, 0) + cols, j, 0)
        return total, t, KH

    zero = jnp.zeros((), dtype)
    init = (zero, zero, None if H is None else jnp.zeros_like(H))
    return jax.lax.fori_loop(0, num_blocks * (num_blocks + 1) // 2, body, init)


def _se_band_sweep(U, w, block_size, *, need_kw: bool, need_rhs: bool, distinct: bool = False):
    """One symmetric sweep over the SE patch Gram K_pq = exp(−½‖u_p − u_q‖²) of every row.

    U ``[R, P, E]`` (patches / ℓ), w ``[R, P]``. Returns ``value`` ``[R]`` = Σ_pq w_p w_q K_pq,
    ``t`` ``[R]`` = Σ_pq w_p w_q K_pq (−½ r²_pq) (the scalar-lengthscale gradient), and, when
    asked, ``Kw`` ``[R, P]`` = K w (``need_kw``) and ``KWU`` ``[R, P, E]`` = K (w ∘ U)
    (``need_rhs``, the patch gradient). The exponent comes from one matmul of augmented
    patches [u, −½‖u‖², 1]·[u, 1, −½‖u‖²] = −½ r²; a block of K is evaluated once, and serves its
    row block (K rhs) and, off the diagonal, its column block (Kᵀ rhs) by symmetry. Images are
    processed r at a time so that one ``[r, b, h·b]`` tile stays in cache.

    ``distinct``: one image at a time, and an image with few distinct patches (constant
    backgrounds) is swept over the block pairs of its distinct patches with summed weights
    (:func:`_distinct_rows`, :func:`_pair_sweep`): exact, and the work follows the number of
    distinct patches instead of P².
    """
    R, P, E = U.shape
    nb, b, h, r = _se_plan(R, P, block_size, one_image=distinct)
    Pp, Rp, hb = nb * b, -(-R // r) * r, h * b
    dtype = U.dtype
    wrap = (h - 1) * b  # the band of the last row blocks wraps around to the first columns
    with_h = need_kw or need_rhs
    # band position j of row block i is column block i + j // b: block 0 is the diagonal block
    # (its own transpose), and with an even nb the last block pair of the band is met twice
    pair = np.full(hb, 2.0)  # [hb] weight of the unordered pair in the sums
    pair[:b] = 1.0
    if nb % 2 == 0 and nb > 1:
        pair[(h - 1) * b:] = 1.0
    transpose = jnp.asarray((pair == 2.0).astype(np.float64), dtype)  # [hb] blocks that also serve their column block
    pair = jnp.asarray(pair, dtype)

    def band_inputs(u, wu):
        """Augmented rows of r images ``[r, Pp, E+2]``, band columns ``[r, Pp+wrap, E+2]``, their
        weights ``[r, Pp+wrap]`` and right-hand sides ``[r, Pp+wrap, K]`` (or None)."""
        up = jnp.pad(u, ((0, 0), (0, Pp - P), (0, 0)))  # [r, Pp, E]  padded patches have weight 0
        wp = jnp.pad(wu, ((0, 0), (0, Pp - P)))  # [r, Pp]
        half_sq = -0.5 * jnp.sum(up**2, axis=-1, keepdims=True)  # [r, Pp, 1]
        ones = jnp.ones_like(half_sq)
        left = jnp.concatenate([up, half_sq, ones], axis=-1)  # [r, Pp, E+2]
        right = jnp.concatenate([up, ones, half_sq], axis=-1)  # [r, Pp, E+2]
        right = jnp.concatenate([right, right[:, :wrap]], axis=1)  # [r, Pp+wrap, E+2]
        w_cols = jnp.concatenate([wp, wp[:, :wrap]], axis=1)  # [r, Pp+wrap]
        columns = [w_cols[..., None]] if with_h else []
        if need_rhs:
            wup = wp[..., None] * up  # [r, Pp, E]
            columns.append(jnp.concatenate([wup, wup[:, :wrap]], axis=1))
        rhs = jnp.concatenate(columns, axis=-1) if columns else None  # [r, Pp+wrap, K]
        return left, right, w_cols, rhs

    def band(u, wu):
        """The band sweep of r images ``[r, P, E]``, ``[r, P]``: ``[r]``, ``[r]``, ``[r, Pp, K]`` or None."""
        L, Rr, wc, H = band_inputs(u, wu)

        def body(carry, i):
            total, t, col = carry  # [r], [r], [r, Pp+wrap, K]
            start = i * b
            Li = jax.lax.dynamic_slice_in_dim(L, start, b, 1)  # [r, b, E+2]
            wi = jax.lax.dynamic_slice_in_dim(wc, start, b, 1)  # [r, b]
            Rband = jax.lax.dynamic_slice_in_dim(Rr, start, hb, 1)  # [r, hb, E+2]
            wband = jax.lax.dynamic_slice_in_dim(wc, start, hb, 1)  # [r, hb]
            # −½ r² by expansion; rounding can make it slightly positive where r² ≈ 0, which
            # moves K by the same relative amount as a clamp would (no extra pass for a clamp)
            S = jnp.einsum("rbe,rce->rbc", Li, Rband, precision=_HIGHEST)  # [r, b, hb]
            K = jnp.exp(S)  # [r, b, hb]
            WK = K * (wband * pair)[:, None, :]  # [r, b, hb]
            total = total + jnp.einsum("rbc,rb->r", WK, wi)  # Σ w w K
            t = t + jnp.einsum("rbc,rb->r", WK * S, wi)  # Σ w w K (−½ r²)
            if H is None:
                return (total, t, col), None
            Hi = jax.lax.dynamic_slice_in_dim(H, start, b, 1)  # [r, b, K]
            Hband = jax.lax.dynamic_slice_in_dim(H, start, hb, 1)  # [r, hb, K]
            rows = jnp.einsum("rbc,rck->rbk", K, Hband, precision=_HIGHEST)  # [r, b, K]
            cols = jnp.einsum("rbc,rbk->rck", K, Hi, precision=_HIGHEST) * transpose[:, None]  # [r, hb, K]
            col = jax.lax.dynamic_update_slice_in_dim(col, jax.lax.dynamic_slice_in_dim(col, start, hb, 1) + cols, start, 1)
            return (total, t, col), rows

        K_ = 0 if H is None else H.shape[-1]
        init = (jnp.zeros((r,), dtype), jnp.zeros((r,), dtype), jnp.zeros((r, Pp + wrap, K_), dtype))
        (total, t, col), rows = jax.lax.scan(body, init, jnp.arange(nb))
        if H is None:
            return total, t, None
        KH = jnp.moveaxis(rows, 0, 1).reshape(r, Pp, K_) + col[:, :Pp]  # [r, Pp, K]
        KH = KH.at[:, :wrap].add(col[:, Pp:])
        return total, t, KH

    sweep = band
    if distinct:  # r = 1
        bd = DISTINCT_BLOCK if block_size is None else max(1, int(block_size))
        Pd = -(-P // bd) * bd

        def distinct_sweep(u, wu):  # one image: the pair sweep over its distinct patches, or the band
            Ud, Wd, group, n = _distinct_rows(u[0], wu[0])  # [P, E], [P], [P], []
            num_blocks = (n + bd - 1) // bd

            def pairs():
                padded = jnp.pad(Ud, ((0, Pd - P), (0, 0))), jnp.pad(Wd, (0, Pd - P))  # [Pd, E], [Pd]
                total, t, KH = _pair_sweep(*padded, num_blocks, bd, need_rhs, with_h)
                if KH is not None:
                    KH = jnp.pad(KH[group], ((0, Pp - P), (0, 0)))[None]  # [1, Pp, K]  back to the patches
                return total[None], t[None], KH

            use_pairs = num_blocks * (num_blocks + 1) // 2 <= DISTINCT_TILES_PER_BAND_TILE * nb
            return jax.lax.cond(use_pairs, pairs, lambda: band(u, wu))

        def sweep(u, wu):
            constant = jnp.sum(jnp.max(u[0], axis=-1) == jnp.min(u[0], axis=-1))  # [] constant patches
            return jax.lax.cond(constant >= DISTINCT_MIN_CONSTANT_FRACTION * P, distinct_sweep, band, u, wu)

    Ur = jnp.pad(U, ((0, Rp - R), (0, 0), (0, 0))).reshape(Rp // r, r, P, E)  # [Rp/r, r, P, E]
    wr = jnp.pad(w, ((0, Rp - R), (0, 0))).reshape(Rp // r, r, P)  # [Rp/r, r, P]
    total, t, KH = jax.lax.map(lambda xs: sweep(*xs), (Ur, wr))
    total, t = total.reshape(Rp)[:R], t.reshape(Rp)[:R]  # [R], [R]
    if KH is None:
        return total, t, None, None
    KH = KH.reshape(Rp, Pp, -1)[:R, :P]  # [R, P, K]
    return total, t, KH[..., 0], (KH[..., 1:] if need_rhs else None)


def _se_value(X, lengthscale, w, block_size, distinct):
    return _se_band_sweep(X / lengthscale, w, block_size, need_kw=False, need_rhs=False, distinct=distinct)[0]  # [R]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _se_gram(X, lengthscale, w, block_size, distinct):
    return _se_value(X, lengthscale, w, block_size, distinct)  # [R]


def _se_gram_fwd(X, lengthscale, w, block_size, distinct):
    """Value and the gradients that are needed, in the same sweep (``symbolic_zeros``: inputs that
    are not differentiated — the data patches, the unit weights of the plain kernel — cost nothing).

    Scalar lengthscale, patches not differentiated: ∂/∂ℓ needs only t = Σ w w K (−½ r²/ℓ²):
    ∂value/∂ℓ = −2 t / ℓ. Otherwise the patch gradient ∂/∂u_p = −2 w_p (u_p (Kw)_p − Σ_q K_pq w_q u_q)
    gives ∂/∂X = (∂/∂U)/ℓ and ∂/∂ℓ_e = −Σ_p (∂/∂U_pe) U_pe / ℓ_e.
    """
    Xv, ls, wv = X.value, lengthscale.value, w.value
    ls_scalar = jnp.ndim(ls) == 0
    need_rhs = X.perturbed or (lengthscale.perturbed and not ls_scalar)
    U = Xv / ls  # [R, P, E]
    value, t, Kw, KWU = _se_band_sweep(U, wv, block_size, need_kw=w.perturbed or need_rhs, need_rhs=need_rhs, distinct=distinct)
    dU = -2.0 * wv[..., None] * (U * Kw[..., None] - KWU) if need_rhs else None  # [R, P, E]
    dX = dU / ls if X.perturbed else None  # [R, P, E]
    dls = None
    if lengthscale.perturbed:
        dls = -2.0 * t / ls if not need_rhs else -jnp.sum(dU * U, axis=1) / ls  # [R] or [R, E]
        if ls_scalar and dls.ndim == 2:
            dls = jnp.sum(dls, axis=-1)  # [R]
    dw = 2.0 * Kw if w.perturbed else None  # [R, P]
    return value, (dX, dls, dw)


def _se_gram_bwd(block_size, distinct, residuals, cotangent):
    dX, dls, dw = residuals  # [R, P, E] or None, [R] / [R, E] or None, [R, P] or None
    ct = cotangent  # [R]
    out_X = None if dX is None else ct[:, None, None] * dX  # [R, P, E]
    out_ls = None if dls is None else jnp.tensordot(ct, dls, axes=(0, 0))  # [] or [E]
    out_w = None if dw is None else ct[:, None] * dw  # [R, P]
    return out_X, out_ls, out_w


_se_gram.defvjp(_se_gram_fwd, _se_gram_bwd, symbolic_zeros=True)


def se_patch_gram_sum(U, weights, block_size: int | None = None, *, lengthscale=None, distinct: bool = False):
    """Σ_pq w_p w_q exp(−½‖u_p − u_q‖²) per row, u = U / ``lengthscale``: U ``[R, P, E]``, weights ``[R, P]`` -> ``[R]``.

    The Kff diagonal of a convolutional kernel with an SE base kernel (van der Wilk et al. 2017, eq. 18, the
    variance applied by the caller); ``lengthscale`` is a scalar or ``[E]`` (default 1). A
    ``jax.custom_vjp`` whose forward pass computes value and the gradients that are needed in one
    symmetric sweep (:func:`_se_band_sweep`): about R·P²/2 exps, each evaluated once, never an
    ``[R, P, P]`` array. With the data patches not differentiated and a scalar lengthscale the
    gradients are scalars per row (no K·(w∘U) products at all). ``block_size`` fixes the side
    of the square Gram blocks. ``distinct``: sweep each image over its distinct patches when they
    are few (exact; ``kff_method="distinct"``). A row whose patches share an offset (pixel values
    1000 ± 1) is first centred on it (:func:`offset_reference`). First-order reverse mode only (no
    forward mode, no Hessians).
    """
    U = jnp.asarray(U)
    # an offset per row and element (0 for images near the origin, so the distinct sweep's test for
    # constant patches sees them as they are); TICK's location columns need their own
    U = U - offset_reference([U], (1,))  # [R, P, E]
    weights = jnp.broadcast_to(jnp.asarray(weights, U.dtype), U.shape[:2])  # [R, P]
    lengthscale = jnp.asarray(1.0 if lengthscale is None else lengthscale, U.dtype)  # [] or [E]
    return _se_gram(U, lengthscale, weights, block_size, bool(distinct))


def _checkpointed_gram_sum(kernel: Kernel, patches, weights, block_size: int | None):
    """Σ_pq w_p w_q k(x_p, x_q) for any base kernel, row block by row block under ``jax.checkpoint``."""
    R, P, E = patches.shape
    block = tile_rows(R, P, block_size)
    Xp, wp, num_blocks = pad_rows(patches, weights, block)  # [R, Pp, E], [R, Pp]
    row_blocks = jnp.moveaxis(Xp.reshape(R, num_blocks, block, E), 1, 0)  # [nb, R, b, E]
    weight_blocks = jnp.moveaxis(wp.reshape(R, num_blocks, block), 1, 0)  # [nb, R, b]

    @jax.checkpoint
    def block_value(rows, wb):  # [R, b, E], [R, b]
        Kb = jax.vmap(kernel.K)(rows, Xp)  # [R, b, Pp]
        return jnp.einsum("rb,rbp,rp->r", wb, Kb, wp)  # [R]

    def body(total, xs):
        return total + block_value(*xs), None

    return jax.lax.scan(body, jnp.zeros((R,), patches.dtype), (row_blocks, weight_blocks))[0]  # [R]


def patch_gram_sum(kernel: Kernel, patches, weights, method: str = "auto", block_size: int | None = None):
    """Σ_pq w_p w_q k(x_p, x_q) per row: patches ``[R, P, E]``, weights ``[R, P]`` -> ``[R]``.

    ``method``: ``"fused"`` (SE base kernel only, :func:`se_patch_gram_sum`, the symmetric band
    sweep), ``"distinct"`` (the same, each image over its distinct patches when they are few),
    ``"checkpoint"`` (any kernel, row blocks under ``jax.checkpoint``), ``"naive"`` (materialises
    ``[R, P, P]``; the reference for tests and benchmarks) or ``"auto"`` (for SE: distinct on CPU,
    where images are swept one at a time anyway, fused on accelerators; else checkpoint).
    """
    kernel = kernel.resolved()
    weights = jnp.broadcast_to(weights, patches.shape[:2])  # [R, P]
    if method == "auto":
        distinct = jax.default_backend() == "cpu"
        method = ("distinct" if distinct else "fused") if is_plain_se(kernel) else "checkpoint"
    if method in ("fused", "distinct"):
        if not is_plain_se(kernel):
            raise InvalidArgumentError("kff_method", f"{method!r} needs a SquaredExponential base kernel, got {type(kernel).__name__}")
        lengthscale = jnp.asarray(kernel.lengthscale, patches.dtype)  # [] or [E]
        sums = se_patch_gram_sum(patches, weights, block_size, lengthscale=lengthscale, distinct=method == "distinct")  # [R]
        return kernel.variance * sums
    if method == "checkpoint":
        return _checkpointed_gram_sum(kernel, patches, weights, block_size)  # [R]
    if method == "naive":
        K = jax.vmap(kernel.K)(patches, patches)  # [R, P, P]
        return jnp.einsum("rp,rpq,rq->r", weights, K, weights)  # [R]
    raise InvalidArgumentError("kff_method", f"unknown method {method!r}; use one of {KFF_METHODS}")


def is_plain_se(kernel) -> bool:
    return type(kernel) is SquaredExponential and kernel.active_dims is None


def _is_fast_stationary(kernel) -> bool:
    """Stationary kernels whose covariance is variance·profile(scaled distance²): Kuf by eq. A.5."""
    return isinstance(kernel, Stationary) and type(kernel)._K is Stationary._K and kernel.active_dims is None


# ----------------------------------------------------------------------------- kernels
def evaluate_sweep(kernel, method: str, *args):
    """``kernel.<method>(*args)`` compiled once per kernel structure and argument shapes.

    Eager calls (notebooks, tests) then reuse the compiled row-block scans instead of tracing
    them again on every call; inside an outer trace (``fit``) this is an ordinary nested call.
    """
    return _evaluate_sweep(kernel, method, *args)


@functools.partial(jax.jit, static_argnums=1)
def _evaluate_sweep(kernel, method: str, *args):
    return getattr(kernel, method)(*args)


def check_patch_weights(value, expected: tuple[int, ...], name: str) -> None:
    """Shape check of a concrete weight array (tracers, priors and pytree placeholders pass)."""
    raw = value.value if isinstance(value, Fixed) else value
    if not isinstance(raw, (np.ndarray, jax.Array, list, tuple, float, int)) or not is_concrete(raw):
        return
    if np.shape(raw) != expected:
        raise ShapeError(name, f"expected shape {expected}, got {np.shape(raw)}")


@dataclasses.dataclass(frozen=True, eq=False)
class ConvolutionalKernel(Kernel):
    """Base of the convolutional family: f(x) = Σ_s Σ_p w_sp g_s(x^[sp]) (module docstring).

    Subclasses say how images split into streams, what the inducing patches are per stream, and
    the patch weights; everything else (Kuu, Kuf, Kff diagonal, K, input checks) is shared.
    ``Kzz`` / ``Kzx`` are the inter-domain covariances that :mod:`gpzoo.inference.inducing` registers
    for :class:`~gpzoo.inference.inducing.InducingPatches` (van der Wilk et al. 2017, eq. 15–16, 19, 23).

    Options: ``products`` ("matmul" — the default, 1.3–1.7× faster than "conv" for Kuf on the
    benchmark CPU, see benchmarks/conv_kernels.py — "conv", or any strategy object with
    ``__call__(images [B, H, W, C], filters [F, h, w, C]) -> [B, P, F]``, hashable since it is
    static pytree data) computes patch inner products;
    ``kff_method`` picks the Kff-diagonal path (:data:`KFF_METHODS`, :func:`patch_gram_sum`);
    ``kff_block`` fixes its block side (default: :data:`SE_BLOCK` / :data:`DISTINCT_BLOCK` for
    SE, tiles of about :data:`KFF_TILE_ELEMENTS` elements otherwise); ``kuf_method`` picks the
    Kuf path (:data:`KUF_METHODS`): ``"fused"`` (SE base kernel only, :func:`se_patch_cross_sum`,
    a custom gradient), ``"autodiff"`` (any stationary base kernel: distances by ``products``, plain
    autodiff) or ``"auto"`` (fused for SE with at least :data:`KUF_FUSED_MIN_INDUCING` inducing
    patches).
    """

    base_kernel: Kernel
    image_shape: tuple = static()
    patch_shape: tuple = static((3, 3))
    normalisation: str = static("mean", kw_only=True)
    products: Any = static("matmul", kw_only=True)
    kff_method: str = static("auto", kw_only=True)
    kff_block: int | None = static(None, kw_only=True)
    kuf_method: str = static("auto", kw_only=True)

    #: Streams are independent GPs g_s (no cross-stream terms in Kff); subclasses override.
    independent_streams = False

    def __post_init__(self):
        image_dims(self.image_shape)  # validates
        object.__setattr__(self, "image_shape", tuple(int(s) for s in self.image_shape))
        try:
            patch = tuple(int(s) for s in self.patch_shape)
        except TypeError:
            raise ShapeError("patch_shape", f"expected (h, w), got {self.patch_shape!r}") from None
        object.__setattr__(self, "patch_shape", patch)
        self._check_patch_fits()
        if isinstance(self.products, str):
            if self.products not in PATCH_PRODUCTS:
                raise InvalidArgumentError("products", f"unknown strategy {self.products!r}; use one of {sorted(PATCH_PRODUCTS)}")
            object.__setattr__(self, "products", PATCH_PRODUCTS[self.products])
        elif not callable(self.products):
            raise InvalidArgumentError("products", f"must be 'conv', 'matmul' or a callable strategy, got {self.products!r}")
        if self.normalisation not in NORMALISATIONS:
            raise InvalidArgumentError("normalisation", f"must be one of {NORMALISATIONS}, got {self.normalisation!r}")
        if self.kff_method not in KFF_METHODS:
            raise InvalidArgumentError("kff_method", f"must be one of {KFF_METHODS}, got {self.kff_method!r}")
        if not isinstance(self.base_kernel, Kernel):
            raise InvalidArgumentError("base_kernel", f"must be a Kernel, got {type(self.base_kernel).__name__}")
        if self.kff_method in ("fused", "distinct") and type(self.base_kernel) is not SquaredExponential:
            raise InvalidArgumentError("kff_method", f"{self.kff_method!r} needs a SquaredExponential base kernel")
        if self.kuf_method not in KUF_METHODS:
            raise InvalidArgumentError("kuf_method", f"must be one of {KUF_METHODS}, got {self.kuf_method!r}")
        if self.kuf_method == "fused" and type(self.base_kernel) is not SquaredExponential:
            raise InvalidArgumentError("kuf_method", "'fused' needs a SquaredExponential base kernel")
        super().__post_init__()

    def _check_patch_fits(self):
        if len(self.patch_shape) != 2 or min(self.patch_shape) < 1:
            raise ShapeError("patch_shape", f"expected (h, w) of positive ints, got {self.patch_shape!r}")
        H, W, _ = image_dims(self.image_shape)
        h, w = self.patch_shape
        if h > H or w > W:
            raise ShapeError("patch_shape", f"patch {self.patch_shape} is larger than the image {(H, W)} (image_shape {self.image_shape})")

    # ------------------------------------------------------------------ shapes
    @property
    def num_channels(self) -> int:
        return image_dims(self.image_shape)[2]

    @property
    def input_dim(self) -> int:
        """Number of columns of X: H·W·C."""
        return math.prod(image_dims(self.image_shape))

    @property
    def num_patches(self) -> int:
        """P, patches per stream (van der Wilk et al. 2017, §3: (W − w + 1)(H − h + 1))."""
        H, W, _ = image_dims(self.image_shape)
        return (H - self.patch_shape[0] + 1) * (W - self.patch_shape[1] + 1)

    @property
    def num_streams(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def stream_channels(self) -> int:
        """Channels in one stream's patches (C for colour patches, 1 per channel otherwise)."""
        return self.num_channels // self.num_streams

    @property
    def patch_channels(self) -> int:
        """Channels of an inducing patch: Z is ``[M, h·w·patch_channels]``."""
        return self.stream_channels

    @property
    def patch_dim(self) -> int:
        """E, the length of an inducing patch."""
        return self.patch_shape[0] * self.patch_shape[1] * self.patch_channels

    @property
    def num_output_groups(self) -> int:
        """G: inducing-output groups per inducing patch (C for multi-channel, van der Wilk et al. 2017, App. C.1)."""
        return 1

    @property
    def num_terms(self) -> int:
        """Number of terms in the sum that defines f (what ``normalisation="mean"`` divides by)."""
        return self.num_streams * self.num_patches

    # ------------------------------------------------------------------ conventions (one place each)
    def _patch_weights(self):
        """Effective weights ``[S, P]`` of f = Σ_s Σ_p w_sp g_s(x^[sp]), normalisation included."""
        scale = 1.0 / self.num_terms if self.normalisation == "mean" else 1.0
        return scale * self._raw_weights()  # [S, P]

    def _raw_weights(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def _stream_scales(self):
        """Per-stream variances v_s ``[S]`` multiplying k_g (only the additive colour kernel has them)."""
        return jnp.ones((self.num_streams,))  # [S]

    def _stream_images(self, X):
        """Images of every stream ``[S, N, H, W, C/S]`` from flattened rows ``X`` ``[N, H*W*C]``."""
        H, W, C = image_dims(self.image_shape)
        images = X.reshape(X.shape[0], H, W, C)  # [N, H, W, C]
        if self.num_streams == 1:
            return images[None]  # [1, N, H, W, C]
        return jnp.moveaxis(images, -1, 0)[..., None]  # [C, N, H, W, 1]

    def _stream_filters(self, Z):
        """Inducing patches as filters per stream ``[S or 1, M, h, w, C/S]`` (1: shared by streams)."""
        h, w = self.patch_shape
        return Z.reshape(1, Z.shape[0], h, w, self.stream_channels)  # [1, M, h, w, C/S]

    def _stream_patches(self, X):
        """Patches of every stream ``[S, N, P, E]``."""
        images = self._stream_images(X)  # [S, N, H, W, Cs]
        S, N = images.shape[:2]
        return extract_patches(images.reshape(S * N, *images.shape[2:]), self.patch_shape).reshape(S, N, self.num_patches, -1)

    # ------------------------------------------------------------------ inter-domain covariances
    def Kzz(self, Z):
        """Kuu ``[G, M, M]`` between inducing patches ``Z`` ``[M, E]``: k_g(Z, Z) (van der Wilk et al. 2017, eq. 16).

        Additive colour: Σ_c v_c k(Z_c, Z_c) (eq. 25); multi-channel: one block per g_c (eq. C.21).
        """
        return evaluate_sweep(self.resolved(), "_kzz", jnp.asarray(Z))  # [G, M, M]

    def Kzx(self, Z, X):
        """Kuf ``[G, M, N]``: Σ_p w_sp k_g(x^[sp], z) summed over streams (van der Wilk et al. 2017, eq. 15, 19, 23)."""
        return evaluate_sweep(self.resolved(), "_kzx", jnp.asarray(Z), jnp.asarray(X))  # [G, M, N]

    def _kzz(self, Z):
        base = self.base_kernel.resolved()
        filters = self._stream_filters(Z)  # [Sf, M, h, w, Cs]
        Zs = filters.reshape(filters.shape[0], filters.shape[1], -1)  # [Sf, M, E]
        blocks = jax.vmap(base.K)(Zs, Zs)  # [Sf, M, M]
        if blocks.shape[0] == self.num_streams:  # one filter per stream: Σ_s v_s k(Z_s, Z_s), even for a single stream
            K = jnp.einsum("s,smk->mk", self._stream_scales().astype(blocks.dtype), blocks)  # [M, M]
        else:  # filters shared by the streams (their scales are 1)
            K = blocks[0]  # [M, M]
        return jnp.broadcast_to(K, (self.num_output_groups,) + K.shape)  # [G, M, M]

    def _kzx(self, Z, X):
        weights = self._patch_weights() * self._stream_scales()[:, None]  # [S, P]
        base = self.base_kernel.resolved()
        fused_auto = is_plain_se(base) and Z.shape[0] >= KUF_FUSED_MIN_INDUCING
        if self.kuf_method == "fused" or (self.kuf_method == "auto" and fused_auto):
            per_stream = self._se_stream_cross(Z, X, base, weights)  # [S, M, N]
        else:
            K = self._patch_filter_cov(Z, X)  # [S, N, P, M]
            w = weights.astype(K.dtype)
            # a fused multiply-and-reduce: as an einsum (a matrix-vector product per image) XLA's CPU
            # backend took 3-4x longer for MNIST sizes (benchmarks/gpflow_side_by_side.py)
            per_stream = jnp.swapaxes(jnp.sum(K * w[:, None, :, None], axis=2), 1, 2)  # [S, M, N]
        if self.num_output_groups == 1:
            return jnp.sum(per_stream, axis=0, keepdims=True)  # [1, M, N]
        return per_stream  # [S, M, N]

    def _se_stream_cross(self, Z, X, base, weights):
        """Σ_p w_sp k_g(x^[sp], z_m) for every stream by :func:`se_patch_cross_sum`: ``[S, M, N]``."""
        patches = self._stream_patches(X)  # [S, N, P, E]
        dtype = patches.dtype
        filters = self._stream_filters(Z)  # [Sf, M, h, w, Cs]
        Zs = filters.reshape(filters.shape[0], filters.shape[1], -1).astype(dtype)  # [Sf, M, E]
        lengthscale = jnp.asarray(base.lengthscale, dtype)  # [] or [E]
        weights = weights.astype(dtype)  # [S, P]

        def one(p, z, w):  # [N, P, E], [M, E], [P] -> [N, M]
            return se_patch_cross_sum(p, z, w, lengthscale=lengthscale)

        if patches.shape[0] == 1:
            sums = one(patches[0], Zs[0], weights[0])[None]  # [1, N, M]
        else:
            sums = jax.vmap(one, in_axes=(0, 0 if Zs.shape[0] > 1 else None, 0))(patches, Zs if Zs.shape[0] > 1 else Zs[0], weights)
        return jnp.asarray(base.variance, dtype) * jnp.swapaxes(sums, 1, 2)  # [S, M, N]

    def _patch_filter_cov(self, Z, X):
        """k_g(x^[sp], z_m) for every stream, image, patch and inducing patch: ``[S, N, P, M]``."""
        base = self.base_kernel.resolved()
        images = self._stream_images(X)  # [S, N, H, W, Cs]
        filters = self._stream_filters(Z)  # [Sf, M, h, w, Cs]
        S, N = images.shape[:2]
        M = filters.shape[1]
        if _is_fast_stationary(base):
            lengthscale = base.lengthscale
            if filters.shape[0] == 1:
                r2 = patch_sqdist(images.reshape(S * N, *images.shape[2:]), filters[0], lengthscale, self.products)  # [S*N, P, M]
                r2 = r2.reshape(S, N, -1, M)  # [S, N, P, M]
            else:
                r2 = jax.vmap(lambda im, fl: patch_sqdist(im, fl, lengthscale, self.products))(images, filters)  # [S, N, P, M]
            return base.variance * base.profile(r2)  # [S, N, P, M]
        patches = self._stream_patches(X)  # [S, N, P, E]
        E = patches.shape[-1]
        Zs = filters.reshape(filters.shape[0], M, E)  # [Sf, M, E]
        Zs = jnp.broadcast_to(Zs, (S, M, E))  # [S, M, E]
        return jax.vmap(lambda p, z: base.K(p.reshape(-1, E), z).reshape(N, -1, M))(patches, Zs)  # [S, N, P, M]

    # ------------------------------------------------------------------ Kff
    def _K_diag(self, X):
        """diag Kff ``[N]``: Σ_pq w_p w_q k_g(x^[p], x^[q]) (van der Wilk et al. 2017, eq. 14, 18), the hot path."""
        return jnp.sum(self.group_K_diag(X), axis=0)  # [N]

    def group_K_diag(self, X):
        """Prior variance of each inducing-output group's part of f, ``[G, N]`` (sums to K_diag).

        One group except for the multi-channel kernel, whose groups are the channel functions
        Σ_p w_pc g_c(x^[pc]) of van der Wilk et al. 2017, eq. 22.
        """
        return evaluate_sweep(self.resolved(), "_group_k_diag", jnp.asarray(X))  # [G, N]

    def _group_k_diag(self, X):
        base = self.base_kernel.resolved()
        patches = self._stream_patches(X)  # [S, N, P, E]
        S, N, P, E = patches.shape
        weights = self._patch_weights().astype(patches.dtype)  # [S, P]
        if self.independent_streams:
            rows = jnp.swapaxes(patches, 0, 1).reshape(N * S, P, E)  # [N*S, P, E]
            row_weights = jnp.broadcast_to(weights, (N, S, P)).reshape(N * S, P)  # [N*S, P]
            gram = patch_gram_sum(base, rows, row_weights, self.kff_method, self.kff_block).reshape(N, S)  # [N, S]
            per_stream = gram * self._stream_scales().astype(gram.dtype)  # [N, S]
            if self.num_output_groups == 1:
                return jnp.sum(per_stream, axis=1)[None]  # [1, N]
            return per_stream.T  # [S, N]
        rows = jnp.swapaxes(patches, 0, 1).reshape(N, S * P, E)  # [N, S*P, E]
        row_weights = jnp.broadcast_to(weights.reshape(S * P), (N, S * P))  # [N, S*P]
        return patch_gram_sum(base, rows, row_weights, self.kff_method, self.kff_block)[None]  # [1, N]

    def _K(self, X, Y):
        """Full Kff ``[N, N']`` (van der Wilk et al. 2017, eq. 14): one image of X at a time (``lax.map``), for
        exact GPs, tests and plots; training needs only the diagonal."""
        return evaluate_sweep(self, "_k_full", X, Y)  # [N, N']

    def _k_full(self, X, Y):
        base = self.base_kernel.resolved()
        Px = jnp.swapaxes(self._stream_patches(X), 0, 1)  # [N, S, P, E]
        Py = self._stream_patches(Y)  # [S, N', P, E]
        S, Ny, P, E = Py.shape
        weights = self._patch_weights().astype(Py.dtype)  # [S, P]
        scales = self._stream_scales().astype(Py.dtype)  # [S]
        if self.independent_streams:

            def row(x):  # x [S, P, E]
                K = jax.vmap(lambda a, b: base.K(a, b.reshape(-1, E)))(x, Py).reshape(S, P, Ny, P)  # [S, P, N', P]
                return jnp.einsum("sp,spnq,sq,s->n", weights, K, weights, scales)  # [N']

        else:
            flat_w = weights.reshape(S * P)  # [S*P]
            Py_rows = jnp.swapaxes(Py, 0, 1).reshape(Ny * S * P, E)  # [N'*S*P, E]

            def row(x):  # x [S, P, E]
                K = base.K(x.reshape(S * P, E), Py_rows).reshape(S * P, Ny, S * P)  # [S*P, N', S*P]
                return jnp.einsum("a,anb,b->n", flat_w, K, flat_w)  # [N']

        return jax.lax.map(row, Px)  # [N, N']

    # ------------------------------------------------------------------ checks and helpers
    def validate_inputs(self, X) -> None:
        """Eager checks of image rows ``X`` ``[N, H*W*C]``: typed errors naming ``X`` / ``patch_shape``."""
        self._check_patch_fits()
        arr = as_float_array(X, "X", ndim=2)
        if arr.shape[1] != self.input_dim:
            raise ShapeError(
                "X",
                f"has {arr.shape[1]} columns but image_shape {self.image_shape} needs {self.input_dim} "
                "(rows are flattened channel-last images)",
            )
        warn_unit_range(arr, "convolutional models start from hyperparameters set for pixel values in [0, 1]")

    def inducing_space_patches(self, X):
        """Every patch of ``X`` in the inducing-patch space, ``[N·S·P, E]`` (for initialisation)."""
        patches = self._stream_patches(jnp.asarray(X))  # [S, N, P, E]
        if self.patch_channels != self.stream_channels:  # additive colour: colour patches, C streams of 1 channel
            patches = jnp.moveaxis(patches, 0, -1).reshape(-1, self.patch_dim)  # [N*P, h*w*C]
        return patches.reshape(-1, patches.shape[-1])  # [N*S*P, E]


def grid_patches(image_shape, patch_shape) -> int:
    """P for ``create`` (at least 1, so that a patch larger than the image reaches the typed check)."""
    H, W, _ = image_dims(image_shape)
    return max(1, H - int(patch_shape[0]) + 1) * max(1, W - int(patch_shape[1]) + 1)


@kernel_class
class Convolutional(ConvolutionalKernel):
    """Translation-invariant convolutional kernel f(x) = Σ_p g(x^[p]) (van der Wilk et al. 2017, eq. 13–16).

    ``channels="patch"`` (default): g acts on h×w×C colour patches (the colour-patch variant of
    §3.4; the plain kernel for grey images). ``channels="separate"``: each channel's h×w patches
    are patches of their own, C·P in all, with one g (the baseline of §3.4).
    """

    channels: str = static("patch", kw_only=True)

    def __post_init__(self):
        if self.channels not in ("patch", "separate"):
            raise InvalidArgumentError("channels", f"must be 'patch' or 'separate', got {self.channels!r}")
        super().__post_init__()

    @property
    def num_streams(self) -> int:
        return 1 if self.channels == "patch" else self.num_channels

    def _raw_weights(self):
        return jnp.ones((self.num_streams, self.num_patches))  # [S, P]


@kernel_class
class WeightedConvolutional(Convolutional):
    """Weighted convolutional kernel f(x) = Σ_p w_p g(x^[p]) (van der Wilk et al. 2017, eq. 17–19).

    ``weights`` ``[P]`` (``[C·P]`` with ``channels="separate"``, channel-major) are kernel
    hyperparameters, learned with the ELBO; :meth:`create` starts them at 1 (plain conv).
    """

    weights: Any = hyper(constraint=constraints.real, kw_only=True)

    def __post_init__(self):
        super().__post_init__()
        check_patch_weights(self.weights, (self.num_streams * self.num_patches,), "weights")

    @classmethod
    def create(cls, base_kernel, image_shape, patch_shape=(3, 3), **options):
        """The kernel with unit weights (equal to :class:`Convolutional` until trained)."""
        streams = image_dims(image_shape)[2] if options.get("channels", "patch") == "separate" else 1
        weights = jnp.ones(streams * grid_patches(image_shape, patch_shape))  # [S*P]
        return cls(base_kernel, image_shape, patch_shape, weights=weights, **options)

    def _raw_weights(self):
        return jnp.reshape(self.weights, (self.num_streams, self.num_patches))  # [S, P]


@kernel_class
class AdditiveColourConvolutional(ConvolutionalKernel):
    """Additive colour kernel (van der Wilk et al. 2017, eq. 24–25): f(x) = Σ_p w_p g̃(x^[p]) on colour patches with
    g̃ ~ GP(0, Σ_c v_c k_g(z_c, z'_c)), i.e. independent g_c per channel with weights w_p √v_c.

    Inducing patches are h×w×C colour patches (u = g̃(Z)); the base kernel is shared by the
    channels, ``channel_variances`` v ``[C]`` weigh them (the paper's w_c). ``weights`` ``[P]``.
    """

    weights: Any = hyper(constraint=constraints.real, kw_only=True)
    channel_variances: Any = hyper(kw_only=True)

    independent_streams = True

    def __post_init__(self):
        super().__post_init__()
        check_patch_weights(self.weights, (self.num_patches,), "weights")
        check_patch_weights(self.channel_variances, (self.num_channels,), "channel_variances")

    @classmethod
    def create(cls, base_kernel, image_shape, patch_shape=(3, 3), **options):
        """Unit patch weights, channel variances 1/C (so g̃ starts with the base kernel's variance)."""
        C = image_dims(image_shape)[2]
        weights = jnp.ones(grid_patches(image_shape, patch_shape))  # [P]
        return cls(base_kernel, image_shape, patch_shape, weights=weights, channel_variances=jnp.ones(C) / C, **options)

    @property
    def num_streams(self) -> int:
        return self.num_channels

    @property
    def patch_channels(self) -> int:
        return self.num_channels

    @property
    def num_terms(self) -> int:
        return self.num_patches

    def _raw_weights(self):
        return jnp.broadcast_to(self.weights, (self.num_streams, self.num_patches))  # [S, P]

    def _stream_scales(self):
        return jnp.broadcast_to(self.channel_variances, (self.num_streams,))  # [C]

    def _stream_filters(self, Z):
        h, w = self.patch_shape
        colour = Z.reshape(Z.shape[0], h, w, self.num_channels)  # [M, h, w, C]
        return jnp.moveaxis(colour, -1, 0)[..., None]  # [C, M, h, w, 1]


@kernel_class
class MultiChannelConvolutional(ConvolutionalKernel):
    """Multi-channel kernel f(x) = Σ_p Σ_c w_pc g_c(x^[pc]) with independent g_c (van der Wilk et al. 2017, eq. 22–23).

    All g_c share the inducing patches Z ``[M, h·w]`` but have their own inducing outputs: C·M
    in all, Kuu is C identical blocks ``[C, M, M]`` and Kuf is ``[C, M, N]`` (App. C.1–C.2); the
    guide may be full-rank over C·M or mean-field per channel. ``weights`` ``[C, P]``.
    """

    weights: Any = hyper(constraint=constraints.real, kw_only=True)

    independent_streams = True

    def __post_init__(self):
        super().__post_init__()
        check_patch_weights(self.weights, (self.num_channels, self.num_patches), "weights")

    @classmethod
    def create(cls, base_kernel, image_shape, patch_shape=(3, 3), **options):
        """Unit weights for every channel and patch."""
        weights = jnp.ones((image_dims(image_shape)[2], grid_patches(image_shape, patch_shape)))  # [C, P]
        return cls(base_kernel, image_shape, patch_shape, weights=weights, **options)

    @property
    def num_streams(self) -> int:
        return self.num_channels

    @property
    def num_output_groups(self) -> int:
        return self.num_channels

    def _raw_weights(self):
        return jnp.reshape(self.weights, (self.num_streams, self.num_patches))  # [C, P]


@kernel_class
class ImageSum(Sum):
    """A :class:`Sum` of kernels on images (e.g. conv + RBF, van der Wilk et al. 2017, §3.3) that validates its
    inputs through the summands that can (``fit`` calls ``kernel.validate_inputs``)."""

    def validate_inputs(self, X) -> None:
        for kernel in self.kernels:
            check = getattr(kernel, "validate_inputs", None)
            if check is not None:
                check(X)
