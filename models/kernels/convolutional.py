"""Convolutional kernels on images, for inter-domain inducing patches (seed 000 §3, App. A–C).

A patch-response function g ~ GP(0, k_g) on patches induces a GP on images (seed 000 eq. 13–14)::

    f(x) = Σ_s Σ_p w_sp g_s(x^[sp])

with P patches per *stream* s. Streams are how colour channels meet patches (seed 000 §3.4):

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
  sum defining f (GPflow's convention: Kuf / P, Kff / P²), ``"sum"`` is seed 000 eq. 13 as written.
  Both are the same model up to the base kernel's variance; only
  :meth:`ConvolutionalKernel._patch_weights` applies it;
* how patch inner products x^[p]·z are computed is an injected strategy
  (:class:`ConvolutionProducts` or :class:`MatmulProducts`, seed 000 App. A.2).

Hot paths. Kuf for a stationary base kernel uses ‖x_p‖² − 2 x_p·z + ‖z‖² (seed 000 eq. A.5)
with both inner products from the strategy (never an ``[N, P, M, E]`` broadcast). The Kff
diagonal Σ_pq w_p w_q k(x_p, x_q) needs N·P² base-kernel evaluations; for the SE base kernel it
is :func:`se_patch_gram_sum`, a ``jax.custom_vjp`` whose forward pass under differentiation
computes the value and all its gradients in one sweep over row blocks (each exp evaluated once,
no ``[N, P, P]`` temporary kept for the backward pass). Other base kernels use row blocks under
``jax.checkpoint`` (same memory bound, recomputation in the backward pass).
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

from models.errors import InvalidArgumentError, ShapeError, as_float_array, is_concrete
from models.kernels.base import Fixed, Kernel, Sum, hyper, kernel_class, static
from models.kernels.stationary import SquaredExponential, Stationary

__all__ = [
    "AdditiveColourConvolutional",
    "ConvolutionProducts",
    "Convolutional",
    "ConvolutionalKernel",
    "ImageSum",
    "KFF_METHODS",
    "MatmulProducts",
    "MultiChannelConvolutional",
    "WeightedConvolutional",
    "extract_patches",
    "patch_gram_sum",
    "patch_sqdist",
    "se_patch_gram_sum",
]

NORMALISATIONS = ("mean", "sum")
KFF_METHODS = ("auto", "fused", "checkpoint", "naive")
#: Target number of elements of one ``[R, block, P]`` tile of the Kff diagonal (see benchmarks/conv_kernels.py).
KFF_TILE_ELEMENTS = 2**22
_HIGHEST = jax.lax.Precision.HIGHEST  # distances by expansion need full-precision dots (no TF32 on GPUs)


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


@functools.lru_cache(maxsize=64)
def _patch_index(height: int, width: int, channels: int, patch_h: int, patch_w: int) -> np.ndarray:
    """Flat pixel indices ``[P, h*w*C]`` of every stride-1 patch of a channel-last image."""
    rows = np.arange(height - patch_h + 1)[:, None, None, None, None]  # [H', 1, 1, 1, 1]
    cols = np.arange(width - patch_w + 1)[None, :, None, None, None]  # [1, W', 1, 1, 1]
    dy = np.arange(patch_h)[None, None, :, None, None]  # [1, 1, h, 1, 1]
    dx = np.arange(patch_w)[None, None, None, :, None]  # [1, 1, 1, w, 1]
    c = np.arange(channels)[None, None, None, None, :]  # [1, 1, 1, 1, C]
    index = ((rows + dy) * width + (cols + dx)) * channels + c  # [H', W', h, w, C]
    return index.reshape((height - patch_h + 1) * (width - patch_w + 1), patch_h * patch_w * channels)


def extract_patches(images, patch_shape):
    """All stride-1 patches of ``images`` ``[B, H, W, C]`` as rows: ``[B, P, h*w*C]`` (one gather)."""
    B, H, W, C = images.shape
    index = _patch_index(H, W, C, *patch_shape)  # [P, E]
    return images.reshape(B, H * W * C)[:, index]  # [B, P, E]


# ----------------------------------------------------------------------------- inner-product strategies
@dataclasses.dataclass(frozen=True)
class ConvolutionProducts:
    """x^[p]·z for every patch p and filter z as one convolution (seed 000 App. A.2, fig. A.1).

    The filters are the (scaled) inducing patches; ``lax.conv_general_dilated`` with stride 1
    and VALID padding is the cross-correlation Σ_e x^[p]_e z_e.
    """

    def __call__(self, images, filters):
        """images ``[B, H, W, C]``, filters ``[F, h, w, C]`` -> ``[B, P, F]``."""
        kernel_hwio = jnp.moveaxis(filters, 0, -1)  # [h, w, C, F]
        out = jax.lax.conv_general_dilated(
            images, kernel_hwio, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=_HIGHEST
        )  # [B, H', W', F]
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
    """Scaled squared distances ‖(x^[p] − z_f)/ℓ‖² ``[B, P, F]`` by seed 000 eq. A.5.

    images ``[B, H, W, C]``, filters ``[F, h, w, C]``; ``lengthscale`` is a scalar or one value
    per patch element (ARD over the h·w·C positions). Both ‖x^[p]/ℓ‖² (the squared image
    against a window of 1/ℓ²) and x^[p]·z/ℓ² are inner products computed by ``products``.
    """
    h, w, C = filters.shape[1:]
    inv_l2 = jnp.broadcast_to(1.0 / jnp.asarray(lengthscale, filters.dtype) ** 2, (h * w * C,))  # [E]
    inv_l2 = inv_l2.reshape(1, h, w, C)  # [1, h, w, C]
    cross = products(images, filters * inv_l2)  # [B, P, F]
    x_sq = products(images**2, inv_l2)  # [B, P, 1]
    z_sq = jnp.sum(filters**2 * inv_l2, axis=(1, 2, 3))  # [F]
    return jnp.maximum(x_sq - 2.0 * cross + z_sq, 0.0)  # [B, P, F]


# ----------------------------------------------------------------------------- Kff diagonal
def _tile_rows(R: int, P: int, block_size: int | None) -> int:
    if block_size is not None:
        return int(max(1, min(P, block_size)))
    return int(max(1, min(P, KFF_TILE_ELEMENTS // max(1, R * P))))


def _pad_rows(U, w, block: int):
    """Pad the patch axis to a multiple of ``block`` with zero-weight patches."""
    P = U.shape[1]
    pad = -P % block
    Up = jnp.pad(U, ((0, 0), (0, pad), (0, 0)))  # [R, Pp, E]
    wp = jnp.pad(w, ((0, 0), (0, pad)))  # [R, Pp]
    return Up, wp, (P + pad) // block


def _se_gram_sweep(U, w, block: int, with_grads: bool):
    """One sweep over row blocks of Σ_pq w_p w_q exp(−½‖u_p − u_q‖²); optionally its gradients.

    U ``[R, P, E]`` (patches / ℓ), w ``[R, P]``. Returns value ``[R]`` and, with gradients,
    dU ``[R, P, E]`` and dw ``[R, P]``. With K_pq = exp(−½ r²_pq) and (Kw)_p = Σ_q K_pq w_q:
    ∂/∂w_p = 2 (Kw)_p,  ∂/∂u_p = −2 w_p (u_p (Kw)_p − Σ_q K_pq w_q u_q)  (K symmetric).
    """
    R, P, E = U.shape
    Up, wp, num_blocks = _pad_rows(U, w, block)  # [R, Pp, E], [R, Pp]
    sq = jnp.sum(Up**2, axis=-1)  # [R, Pp]
    rhs = jnp.concatenate([wp[..., None], wp[..., None] * Up], axis=-1) if with_grads else wp[..., None]  # [R, Pp, 1(+E)]
    blocks = (
        jnp.moveaxis(Up.reshape(R, num_blocks, block, E), 1, 0),  # [nb, R, b, E]
        jnp.moveaxis(wp.reshape(R, num_blocks, block), 1, 0),  # [nb, R, b]
        jnp.moveaxis(sq.reshape(R, num_blocks, block), 1, 0),  # [nb, R, b]
    )

    def body(total, xs):
        Ub, wb, sqb = xs  # [R, b, E], [R, b], [R, b]
        cross = jnp.einsum("rbe,rpe->rbp", Ub, Up, precision=_HIGHEST)  # [R, b, Pp]
        K = jnp.exp(-0.5 * jnp.maximum(sqb[:, :, None] + sq[:, None, :] - 2.0 * cross, 0.0))  # [R, b, Pp]
        KW = jnp.einsum("rbp,rpk->rbk", K, rhs, precision=_HIGHEST)  # [R, b, 1(+E)]
        Kw = KW[..., 0]  # [R, b]
        total = total + jnp.sum(wb * Kw, axis=-1)  # [R]
        if not with_grads:
            return total, None
        dU = -2.0 * wb[..., None] * (Ub * Kw[..., None] - KW[..., 1:])  # [R, b, E]
        return total, (dU, 2.0 * Kw)

    total, grads = jax.lax.scan(body, jnp.zeros((R,), U.dtype), blocks)  # [R]
    if not with_grads:
        return total, None, None
    dU = jnp.moveaxis(grads[0], 0, 1).reshape(R, -1, E)[:, :P]  # [R, P, E]
    dw = jnp.moveaxis(grads[1], 0, 1).reshape(R, -1)[:, :P]  # [R, P]
    return total, dU, dw


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _se_gram(U, w, block):
    return _se_gram_sweep(U, w, block, with_grads=False)[0]  # [R]


def _se_gram_fwd(U, w, block):
    value, dU, dw = _se_gram_sweep(U, w, block, with_grads=True)  # [R], [R, P, E], [R, P]
    return value, (dU, dw)


def _se_gram_bwd(block, residuals, cotangent):
    dU, dw = residuals  # [R, P, E], [R, P]
    return cotangent[:, None, None] * dU, cotangent[:, None] * dw


_se_gram.defvjp(_se_gram_fwd, _se_gram_bwd)


def se_patch_gram_sum(U, weights, block_size: int | None = None):
    """Σ_pq w_p w_q exp(−½‖u_p − u_q‖²) per row: U ``[R, P, E]``, weights ``[R, P]`` -> ``[R]``.

    The Kff diagonal of a convolutional kernel with an SE base kernel (seed 000 eq. 18, with
    u = patches/ℓ and the variance applied by the caller). A ``jax.custom_vjp``: under
    differentiation the forward pass computes value and gradients in the same sweep over row
    blocks ``[R, block, P]`` and keeps only ``[R, P, E]`` + ``[R, P]`` for the backward pass, so
    each of the R·P² exps is evaluated once and no ``[R, P, P]`` array is ever stored.
    First-order reverse mode only (no forward mode, no Hessians).
    """
    U = jnp.asarray(U)
    weights = jnp.broadcast_to(jnp.asarray(weights, U.dtype), U.shape[:2])  # [R, P]
    return _se_gram(U, weights, _tile_rows(U.shape[0], U.shape[1], block_size))


def _checkpointed_gram_sum(kernel: Kernel, patches, weights, block_size: int | None):
    """Σ_pq w_p w_q k(x_p, x_q) for any base kernel, row block by row block under ``jax.checkpoint``."""
    R, P, E = patches.shape
    block = _tile_rows(R, P, block_size)
    Xp, wp, num_blocks = _pad_rows(patches, weights, block)  # [R, Pp, E], [R, Pp]
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

    ``method``: ``"fused"`` (SE base kernel only, :func:`se_patch_gram_sum`), ``"checkpoint"``
    (any kernel, row blocks under ``jax.checkpoint``), ``"naive"`` (materialises ``[R, P, P]``;
    the reference for tests and benchmarks) or ``"auto"`` (fused for SE, else checkpoint).
    """
    kernel = kernel.resolved()
    weights = jnp.broadcast_to(weights, patches.shape[:2])  # [R, P]
    if method == "auto":
        method = "fused" if _is_plain_se(kernel) else "checkpoint"
    if method == "fused":
        if not _is_plain_se(kernel):
            raise InvalidArgumentError("kff_method", f"'fused' needs a SquaredExponential base kernel, got {type(kernel).__name__}")
        lengthscale = jnp.asarray(kernel.lengthscale, patches.dtype)  # [] or [E]
        return kernel.variance * se_patch_gram_sum(patches / lengthscale, weights, block_size)  # [R]
    if method == "checkpoint":
        return _checkpointed_gram_sum(kernel, patches, weights, block_size)  # [R]
    if method == "naive":
        K = jax.vmap(kernel.K)(patches, patches)  # [R, P, P]
        return jnp.einsum("rp,rpq,rq->r", weights, K, weights)  # [R]
    raise InvalidArgumentError("kff_method", f"unknown method {method!r}; use one of {KFF_METHODS}")


def _is_plain_se(kernel) -> bool:
    return type(kernel) is SquaredExponential and kernel.active_dims is None


def _is_fast_stationary(kernel) -> bool:
    """Stationary kernels whose covariance is variance·profile(scaled distance²): Kuf by eq. A.5."""
    return isinstance(kernel, Stationary) and type(kernel)._K is Stationary._K and kernel.active_dims is None


# ----------------------------------------------------------------------------- kernels
@functools.partial(jax.jit, static_argnums=(1,))
def _evaluate(kernel, method: str, *args):
    """``kernel.<method>(*args)`` compiled once per kernel structure and argument shapes.

    Eager calls (notebooks, tests) then reuse the compiled row-block scans instead of tracing
    them again on every call; inside an outer trace (``fit``) this is an ordinary nested call.
    """
    return getattr(kernel, method)(*args)


def _check_weights(value, expected: tuple[int, ...], name: str) -> None:
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
    ``Kzz`` / ``Kzx`` are the inter-domain covariances that :mod:`inference.inducing` registers
    for :class:`~inference.inducing.InducingPatches` (seed 000 eq. 15–16, 19, 23).

    Options: ``products`` ("matmul" — the default, 1.3–1.7× faster than "conv" for Kuf on the
    benchmark CPU, see benchmarks/conv_kernels.py — "conv", or any strategy object with
    ``__call__(images [B, H, W, C], filters [F, h, w, C]) -> [B, P, F]``, hashable since it is
    static pytree data) computes patch inner products;
    ``kff_method`` picks the Kff-diagonal path (:data:`KFF_METHODS`); ``kff_block`` fixes its row
    block (default: tiles of about :data:`KFF_TILE_ELEMENTS` elements).
    """

    base_kernel: Kernel
    image_shape: tuple = static()
    patch_shape: tuple = static((3, 3))
    normalisation: str = static("mean", kw_only=True)
    products: Any = static("matmul", kw_only=True)
    kff_method: str = static("auto", kw_only=True)
    kff_block: int | None = static(None, kw_only=True)

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
        if self.kff_method == "fused" and type(self.base_kernel) is not SquaredExponential:
            raise InvalidArgumentError("kff_method", "'fused' needs a SquaredExponential base kernel")
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
        """P, patches per stream (seed 000 §3: (W − w + 1)(H − h + 1))."""
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
        """G: inducing-output groups per inducing patch (C for multi-channel, seed 000 App. C.1)."""
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
        """Kuu ``[G, M, M]`` between inducing patches ``Z`` ``[M, E]``: k_g(Z, Z) (seed 000 eq. 16).

        Additive colour: Σ_c v_c k(Z_c, Z_c) (eq. 25); multi-channel: one block per g_c (eq. C.21).
        """
        return _evaluate(self.resolved(), "_kzz", jnp.asarray(Z))  # [G, M, M]

    def Kzx(self, Z, X):
        """Kuf ``[G, M, N]``: Σ_p w_sp k_g(x^[sp], z) summed over streams (seed 000 eq. 15, 19, 23)."""
        return _evaluate(self.resolved(), "_kzx", jnp.asarray(Z), jnp.asarray(X))  # [G, M, N]

    def _kzz(self, Z):
        base = self.base_kernel.resolved()
        filters = self._stream_filters(Z)  # [Sf, M, h, w, Cs]
        Zs = filters.reshape(filters.shape[0], filters.shape[1], -1)  # [Sf, M, E]
        blocks = jax.vmap(base.K)(Zs, Zs)  # [Sf, M, M]
        if blocks.shape[0] > 1:
            K = jnp.einsum("s,smk->mk", self._stream_scales().astype(blocks.dtype), blocks)  # [M, M]
        else:
            K = blocks[0]  # [M, M]
        return jnp.broadcast_to(K, (self.num_output_groups,) + K.shape)  # [G, M, M]

    def _kzx(self, Z, X):
        K = self._patch_filter_cov(Z, X)  # [S, N, P, M]
        weights = self._patch_weights().astype(K.dtype)  # [S, P]
        scales = self._stream_scales().astype(K.dtype)  # [S]
        per_stream = jnp.einsum("snpm,sp,s->smn", K, weights, scales)  # [S, M, N]
        if self.num_output_groups == 1:
            return jnp.sum(per_stream, axis=0, keepdims=True)  # [1, M, N]
        return per_stream  # [S, M, N]

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
        """diag Kff ``[N]``: Σ_pq w_p w_q k_g(x^[p], x^[q]) (seed 000 eq. 14, 18), the hot path."""
        return jnp.sum(self.group_K_diag(X), axis=0)  # [N]

    def group_K_diag(self, X):
        """Prior variance of each inducing-output group's part of f, ``[G, N]`` (sums to K_diag).

        One group except for the multi-channel kernel, whose groups are the channel functions
        Σ_p w_pc g_c(x^[pc]) of seed 000 eq. 22.
        """
        return _evaluate(self.resolved(), "_group_k_diag", jnp.asarray(X))  # [G, N]

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
        """Full Kff ``[N, N']`` (seed 000 eq. 14): one image of X at a time (``lax.map``), for
        exact GPs, tests and plots; training needs only the diagonal."""
        return _evaluate(self, "_k_full", X, Y)  # [N, N']

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

    def inducing_space_patches(self, X):
        """Every patch of ``X`` in the inducing-patch space, ``[N·S·P, E]`` (for initialisation)."""
        patches = self._stream_patches(jnp.asarray(X))  # [S, N, P, E]
        if self.patch_channels != self.stream_channels:  # additive colour: colour patches, C streams of 1 channel
            patches = jnp.moveaxis(patches, 0, -1).reshape(-1, self.patch_dim)  # [N*P, h*w*C]
        return patches.reshape(-1, patches.shape[-1])  # [N*S*P, E]


def _grid_patches(image_shape, patch_shape) -> int:
    """P for ``create`` (at least 1, so that a patch larger than the image reaches the typed check)."""
    H, W, _ = image_dims(image_shape)
    return max(1, H - int(patch_shape[0]) + 1) * max(1, W - int(patch_shape[1]) + 1)


@kernel_class
class Convolutional(ConvolutionalKernel):
    """Translation-invariant convolutional kernel f(x) = Σ_p g(x^[p]) (seed 000 eq. 13–16).

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
    """Weighted convolutional kernel f(x) = Σ_p w_p g(x^[p]) (seed 000 eq. 17–19).

    ``weights`` ``[P]`` (``[C·P]`` with ``channels="separate"``, channel-major) are kernel
    hyperparameters, learned with the ELBO; :meth:`create` starts them at 1 (plain conv).
    """

    weights: Any = hyper(constraint=constraints.real, kw_only=True)

    def __post_init__(self):
        super().__post_init__()
        _check_weights(self.weights, (self.num_streams * self.num_patches,), "weights")

    @classmethod
    def create(cls, base_kernel, image_shape, patch_shape=(3, 3), **options):
        """The kernel with unit weights (equal to :class:`Convolutional` until trained)."""
        streams = image_dims(image_shape)[2] if options.get("channels", "patch") == "separate" else 1
        weights = jnp.ones(streams * _grid_patches(image_shape, patch_shape))  # [S*P]
        return cls(base_kernel, image_shape, patch_shape, weights=weights, **options)

    def _raw_weights(self):
        return jnp.reshape(self.weights, (self.num_streams, self.num_patches))  # [S, P]


@kernel_class
class AdditiveColourConvolutional(ConvolutionalKernel):
    """Additive colour kernel (seed 000 eq. 24–25): f(x) = Σ_p w_p g̃(x^[p]) on colour patches with
    g̃ ~ GP(0, Σ_c v_c k_g(z_c, z'_c)), i.e. independent g_c per channel with weights w_p √v_c.

    Inducing patches are h×w×C colour patches (u = g̃(Z)); the base kernel is shared by the
    channels, ``channel_variances`` v ``[C]`` weigh them (the paper's w_c). ``weights`` ``[P]``.
    """

    weights: Any = hyper(constraint=constraints.real, kw_only=True)
    channel_variances: Any = hyper(kw_only=True)

    independent_streams = True

    def __post_init__(self):
        super().__post_init__()
        _check_weights(self.weights, (self.num_patches,), "weights")
        _check_weights(self.channel_variances, (self.num_channels,), "channel_variances")

    @classmethod
    def create(cls, base_kernel, image_shape, patch_shape=(3, 3), **options):
        """Unit patch weights, channel variances 1/C (so g̃ starts with the base kernel's variance)."""
        C = image_dims(image_shape)[2]
        weights = jnp.ones(_grid_patches(image_shape, patch_shape))  # [P]
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
    """Multi-channel kernel f(x) = Σ_p Σ_c w_pc g_c(x^[pc]) with independent g_c (seed 000 eq. 22–23).

    All g_c share the inducing patches Z ``[M, h·w]`` but have their own inducing outputs: C·M
    in all, Kuu is C identical blocks ``[C, M, M]`` and Kuf is ``[C, M, N]`` (App. C.1–C.2); the
    guide may be full-rank over C·M or mean-field per channel. ``weights`` ``[C, P]``.
    """

    weights: Any = hyper(constraint=constraints.real, kw_only=True)

    independent_streams = True

    def __post_init__(self):
        super().__post_init__()
        _check_weights(self.weights, (self.num_channels, self.num_patches), "weights")

    @classmethod
    def create(cls, base_kernel, image_shape, patch_shape=(3, 3), **options):
        """Unit weights for every channel and patch."""
        weights = jnp.ones((image_dims(image_shape)[2], _grid_patches(image_shape, patch_shape)))  # [C, P]
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
    """A :class:`Sum` of kernels on images (e.g. conv + RBF, seed 000 §3.3) that validates its
    inputs through the summands that can (``fit`` calls ``kernel.validate_inputs``)."""

    def validate_inputs(self, X) -> None:
        for kernel in self.kernels:
            check = getattr(kernel, "validate_inputs", None)
            if check is not None:
                check(X)
