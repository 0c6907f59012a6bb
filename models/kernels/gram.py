"""Kernels that act on Gram matrices: the layer maps of a deep kernel machine.

A deep kernel machine (DKM; Milsom et al. 2024, §2 and App. A) never sees features. Each layer
turns the Gram blocks of the previous layer into the blocks of a kernel, and every map here takes
and returns a :class:`GramBlocks` triple

    (G_ii, G_ti, diag G_tt)  ->  (K_ii, K_ti, diag K_tt),

because with IID likelihoods only the diagonal of the train/test block is ever needed
(Milsom et al. 2024, Algorithm 1).

Storage layout (Milsom et al. 2024, App. A.3 and Algorithm 1)
------------------------------------------------------------
Inducing points have **no spatial dimensions**, also in convolutional layers: the inducing block
is ``ii [P_i, P_i]``. Only the train/test points are image-like, one entry per (image, location):

* fully connected: ``ii [P_i, P_i]``, ``ti [B, P_i]``,       ``t [B]``;
* convolutional:   ``ii [P_i, P_i]``, ``ti [B, H, W, P_i]``, ``t [B, H, W]`` (channels last, NHWC).

An inducing Gram matrix with spatial positions, ``[P_i·H·W, P_i·H·W]``, is never formed (it is
10,240² for ten 32×32 inducing images). The "mix-up" weights ``C^ℓ [kh, kw, P_in, P_out]``
(Milsom et al. 2024, eq. 23) map the non-spatial inducing points of one layer into inducing
*patches* of the next, which is what lets them correlate with train/test patches (eq. 24).

Conventions that live here and nowhere else
-------------------------------------------
* Patch normalisation: every convolution divides by D = kh·kw (eq. 24a-c, "1/D Σ_d").
* Zero padding: positions outside the image carry zero features, so they add zero to K_ti and
  to the diagonal K_t, which is therefore an average pool that *includes* the padding (divisor D
  everywhere). Together with eq. 24a this makes the joint [inducing; train/test] kernel
  (1/D) Σ_d M_d Φ M_dᵀ for linear maps M_d, hence PSD, so the Nyström residual of the next step
  is non-negative in exact arithmetic.
* Kernel nonlinearities preserve the diagonal before their learned scale and bias:
  K = scale · k(G) + bias with k(G)_ii = G_ii — except the squared-exponential one
  (k(G)_ii = 1), kept for the paper's toy (§4.2).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular

from gpzoo.models.kernels.conv2d import conv2d

__all__ = [
    "GramBlocks",
    "diagonal",
    "arccos_kernel",
    "normalised_gaussian_kernel",
    "squared_exponential_kernel",
    "GRAM_KERNELS",
    "dense_mix",
    "conv_mix",
    "flatten_mix",
    "global_average_pool",
    "batch_kernel_norm",
    "convex_combination",
    "linear_input_gram",
    "patch_input_gram",
    "conv_output_shape",
]

_TINY = 1e-30  # floor under squared norms (zero-padded background pixels have G_t = 0)


def diagonal(A):
    """The diagonal of a square ``A [P, P]`` as a strided slice of its flattened entries ``[P]``.

    Same values as ``jnp.diagonal``, whose gradient XLA computes with a scatter-add per call
    (one of the slowest small ops of a CPU step); a slice's gradient is a padding.
    """
    P = A.shape[-1]
    return A.reshape(P * P)[:: P + 1]


class GramBlocks(NamedTuple):
    """The three blocks a DKM layer carries (see the module docstring for the layout).

    ii: ``[P, P]`` inducing block; ti: ``[B, *S, P]`` train/test-inducing block;
    t: ``[B, *S]`` diagonal of the train/test block; ``S`` is ``()`` or ``(H, W)``.
    """

    ii: jax.Array
    ti: jax.Array
    t: jax.Array


# --------------------------------------------------------------------------- nonlinearities


@jax.custom_jvp
def _arccos_j1(rho):
    """J₁(ρ)/π = (√(1−ρ²) + (π − arccos ρ) ρ) / π for ρ ∈ [−1, 1] (Cho & Saul 2009, order 1)."""
    rho = jnp.clip(rho, -1.0, 1.0)
    return (jnp.sqrt(jnp.maximum(1.0 - rho * rho, 0.0)) + (jnp.pi - jnp.arccos(rho)) * rho) / jnp.pi


@_arccos_j1.defjvp
def _arccos_j1_jvp(primals, tangents):
    # d/dρ J₁(ρ)/π = (π − arccos ρ)/π: finite at ρ = ±1, where the two autodiff pieces are ±inf.
    (rho,), (d_rho,) = primals, tangents
    clipped = jnp.clip(rho, -1.0, 1.0)
    return _arccos_j1(rho), (jnp.pi - jnp.arccos(clipped)) / jnp.pi * d_rho


def _cosines(G: GramBlocks):
    """Norm products and cosines of every block entry: ii ``[P, P]`` x2, ti ``[B, *S, P]`` x2."""
    g_i = jnp.maximum(diagonal(G.ii), _TINY)  # [P]
    g_t = jnp.maximum(G.t, _TINY)  # [B, *S]
    norm_ii = jnp.sqrt(g_i)[:, None] * jnp.sqrt(g_i)[None, :]  # [P, P]
    norm_ti = jnp.sqrt(g_t)[..., None] * jnp.sqrt(g_i)  # [B, *S, P]
    return norm_ii, G.ii / norm_ii, norm_ti, G.ti / norm_ti


def _diagonal_preserving(G: GramBlocks, k_ii, k_ti, scale, bias) -> GramBlocks:
    """Put G's diagonal back on k_ii exactly, then apply scale and bias to all three blocks."""
    eye = jnp.eye(G.ii.shape[0], dtype=bool)  # [P, P]
    k_ii = jnp.where(eye, G.ii, k_ii)  # [P, P]
    return GramBlocks(scale * k_ii + bias, scale * k_ti + bias, scale * G.t + bias)


def arccos_kernel(G: GramBlocks, scale=1.0, bias=0.0) -> GramBlocks:
    """Arc-cosine (ReLU) kernel on Gram blocks, with learned scale and bias.

    k(G)_ij = (1/π) √(G_ii G_jj) (sin θ + (π − θ) cos θ), cos θ = G_ij / √(G_ii G_jj), which is
    2·E[relu(u) relu(v)] for (u, v) ~ N(0, [[G_ii, G_ij], [G_ij, G_jj]]) (Cho & Saul 2009; the
    NNGP ReLU layer). k preserves the diagonal, so K_ii = scale·G_ii + bias on it.
    """
    norm_ii, cos_ii, norm_ti, cos_ti = _cosines(G)
    k_ii = norm_ii * _arccos_j1(cos_ii)  # [P, P]
    k_ti = norm_ti * _arccos_j1(cos_ti)  # [B, *S, P]
    return _diagonal_preserving(G, k_ii, k_ti, scale, bias)


def _ng_ti_value(G_ti, g_t, g_i, inv_l2):
    norm = jnp.sqrt(g_t)[..., None] * jnp.sqrt(g_i)  # [B, *S, P]
    cos = G_ti / norm
    return norm * jnp.exp((jnp.clip(cos, -1.0, 1.0) - 1.0) * inv_l2), norm, cos


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _ng_ti(G_ti, g_t, g_i, inv_l2: float):
    """k_ti = n·exp((clip(G_ti/n) − 1)/ℓ²), n = √(g_t g_i): the train/test block of the normalised Gaussian.

    Its hand-written VJP reads G_ti and the cotangent once and writes one ``[B, *S, P]`` array
    (autodiff of the composition materialises several broadcasts of the same size; on a CPU the
    backward of this block alone took as long as the forward convolution after it).
    """
    return _ng_ti_value(G_ti, g_t, g_i, inv_l2)[0]


def _ng_ti_fwd(G_ti, g_t, g_i, inv_l2):
    return _ng_ti(G_ti, g_t, g_i, inv_l2), (G_ti, g_t, g_i)


def _ng_ti_bwd(inv_l2, residuals, k_bar):
    # ∂k/∂G = e/ℓ² and ∂k/∂n = e(1 − c/ℓ²) where |c| < 1; where the cosine is clipped, ∂k/∂G = 0, ∂k/∂n = e.
    G_ti, g_t, g_i = residuals
    k, norm, cos = _ng_ti_value(G_ti, g_t, g_i, inv_l2)
    e = k / norm
    inside = jnp.abs(cos) < 1.0
    G_bar = jnp.where(inside, k_bar * e * inv_l2, 0.0)  # [B, *S, P]
    w = k_bar * jnp.where(inside, k - G_ti * inv_l2 * e, k)  # [B, *S, P] = k̄ · n · ∂k/∂n
    spatial = tuple(range(g_t.ndim))
    return G_bar, 0.5 * jnp.sum(w, axis=-1) / g_t, 0.5 * jnp.sum(w, axis=spatial) / g_i


_ng_ti.defvjp(_ng_ti_fwd, _ng_ti_bwd)


def normalised_gaussian_kernel(G: GramBlocks, scale=1.0, bias=0.0, lengthscale=1.0) -> GramBlocks:
    """Normalised Gaussian kernel on Gram blocks (Shankar et al. 2020), learned scale and bias.

    k(G)_ij = √(G_ii G_jj) · exp((cos θ_ij − 1) / ℓ²): a squared-exponential kernel between the
    unit-normalised features (‖x̂ − ŷ‖² = 2(1 − cos θ)) times their norms; PSD for PSD G, and
    diagonal-preserving. Milsom et al. 2024 (§4.1) use it as a cheaper, more stable
    alternative to the arc-cosine kernel.
    """
    g_i = jnp.maximum(diagonal(G.ii), _TINY)  # [P]
    g_t = jnp.maximum(G.t, _TINY)  # [B, *S]
    norm_ii = jnp.sqrt(g_i)[:, None] * jnp.sqrt(g_i)[None, :]  # [P, P]
    if isinstance(lengthscale, (int, float)):
        inv_l2 = 1.0 / (float(lengthscale) ** 2)
        k_ti = _ng_ti(G.ti, g_t, g_i, inv_l2)  # [B, *S, P]
    else:  # a traced lengthscale: plain autodiff
        inv_l2 = 1.0 / (lengthscale * lengthscale)
        k_ti = _ng_ti_value(G.ti, g_t, g_i, inv_l2)[0]
    k_ii = norm_ii * jnp.exp((jnp.clip(G.ii / norm_ii, -1.0, 1.0) - 1.0) * inv_l2)  # [P, P]
    return _diagonal_preserving(G, k_ii, k_ti, scale, bias)


def squared_exponential_kernel(G: GramBlocks, scale=1.0, bias=0.0, lengthscale=1.0) -> GramBlocks:
    """Squared-exponential kernel on Gram blocks, with learned scale and bias.

    k(G)_ij = exp(−(G_ii + G_jj − 2 G_ij) / (2ℓ²)), the SE kernel of the features whose Gram matrix
    is G (their squared distance from inner products); PSD for PSD G. Not diagonal-preserving:
    k(G)_ii = 1, so K_t = scale + bias. Milsom et al. 2024 (§4.2) use it in their one-layer toy.
    """
    g_i = diagonal(G.ii)  # [P]
    inv_2l2 = 0.5 / (lengthscale * lengthscale)
    d_ii = jnp.maximum(g_i[:, None] + g_i[None, :] - 2.0 * G.ii, 0.0)  # [P, P]
    d_ti = jnp.maximum(G.t[..., None] + g_i - 2.0 * G.ti, 0.0)  # [B, *S, P]
    k_ii = jnp.exp(-d_ii * inv_2l2)
    k_ii = jnp.where(jnp.eye(g_i.shape[0], dtype=bool), 1.0, k_ii)  # exactly 1 on the diagonal
    return GramBlocks(scale * k_ii + bias, scale * jnp.exp(-d_ti * inv_2l2) + bias, jnp.full_like(G.t, scale + bias))


#: Name -> nonlinearity; each has signature ``(G, scale, bias) -> K``.
GRAM_KERNELS = {"arccos": arccos_kernel, "normalised_gaussian": normalised_gaussian_kernel,
                "squared_exponential": squared_exponential_kernel}


# --------------------------------------------------------------------------- mixing / convolution


def _pads(padding: str, kernel_shape) -> tuple[tuple[int, int], ...]:
    if padding == "same":  # odd filters: centred, output size ceil(H / stride)
        return tuple((k // 2, k // 2) for k in kernel_shape)
    if padding == "valid":
        return tuple((0, 0) for _ in kernel_shape)
    raise ValueError(f"padding must be 'same' or 'valid', got {padding!r}")


def _padded_windows(x, window, stride: int, pads):
    """``x [B, H, W, ...]`` zero-padded on its spatial axes, and the slices of the kh row offsets and
    kw column offsets that a strided window at offset (dy, dx) reads: (padded, rows, cols)."""
    (kh, kw), ((lo_h, hi_h), (lo_w, hi_w)) = window, pads
    H, W = x.shape[1:3]
    padded = jnp.pad(x, ((0, 0), (lo_h, hi_h), (lo_w, hi_w)) + ((0, 0),) * (x.ndim - 3))
    Ho, Wo = (H + lo_h + hi_h - kh) // stride + 1, (W + lo_w + hi_w - kw) // stride + 1
    rows = [slice(dy, dy + stride * (Ho - 1) + 1, stride) for dy in range(kh)]
    cols = [slice(dx, dx + stride * (Wo - 1) + 1, stride) for dx in range(kw)]
    return padded, rows, cols


def _shifted_views(x, window, stride: int, pads):
    """The kh·kw zero-padded, strided windows of ``x [B, H, W, ...]``, each ``[B, H', W', ...]``, in (dy, dx) order."""
    padded, rows, cols = _padded_windows(x, window, stride, pads)
    return [padded[:, r, c] for r in rows for c in cols]


def _window_sum(x, window, stride: int, pads):
    """Zero-padded sliding-window sum of ``x [B, H, W]`` -> ``[B, H', W']``.

    Separable: kh row-shifted slices summed, then kw column-shifted ones (XLA's CPU convolution
    with one channel is ~10× slower than these adds).
    """
    padded, rows, cols = _padded_windows(x, window, stride, pads)
    summed = sum(padded[:, r, :] for r in rows)  # [B, H', W + pads]
    return sum(summed[:, :, c] for c in cols)  # [B, H', W']


def conv_output_shape(spatial_shape, filter_shape, stride: int, padding: str = "same") -> tuple[int, int]:
    """Output (H', W') of a conv/pool with the geometry used here (symmetric k//2 zero padding)."""
    pads = _pads(padding, filter_shape)
    return tuple((n + lo + hi - k) // stride + 1 for n, k, (lo, hi) in zip(spatial_shape, filter_shape, pads))


def dense_mix(K: GramBlocks, weights) -> GramBlocks:
    """Fully connected mix-up (Milsom et al. 2024, eq. 23 with D = 1): weights ``[P_in, P_out]``.

    K'_ii = Cᵀ K_ii C ``[P_out, P_out]``, K'_ti = K_ti C ``[B, P_out]``, K'_t = K_t ``[B]``.
    """
    ii = weights.T @ K.ii @ weights  # [P_out, P_out]
    return GramBlocks(0.5 * (ii + ii.T), K.ti @ weights, K.t)


def conv_mix(K: GramBlocks, weights, stride: int = 1, padding: str = "same") -> GramBlocks:
    """Convolutional mixing C^ℓ of Milsom et al. 2024, eq. 24a-c / Algorithm 1.

    weights ``C [kh, kw, P_in, P_out]``, D = kh·kw; with zero padding and stride s:

    * K'_ii = (1/D) Σ_d C_dᵀ K_ii C_d                     ``[P_out, P_out]``
    * K'_ti[b, r] = (1/D) Σ_d K_ti[b, s·r + d] C_d        ``[B, H', W', P_out]`` (a conv2d)
    * K'_t[b, r]  = (1/D) Σ_d K_t[b, s·r + d]             ``[B, H', W']`` (average pool)
    """
    kh, kw, _, _ = weights.shape
    D = kh * kw
    pads = _pads(padding, (kh, kw))
    ii = jnp.einsum("hwab,ac,hwcd->bd", weights, K.ii, weights) / D  # [P_out, P_out]
    ti = conv2d(K.ti, weights, stride, pads) / D  # [B, H', W', P_out]
    t = _window_sum(K.t, (kh, kw), stride, pads) / D  # [B, H', W']
    return GramBlocks(0.5 * (ii + ii.T), ti, t)


def flatten_mix(K: GramBlocks, weights) -> GramBlocks:
    """"Flatten" head: one mixing filter over the whole feature map (valid padding), S = H·W.

    weights ``[H, W, P_in, P_out]``. K'_ti = (1/S) Σ_r K_ti[r] C_r ``[B, P_out]``,
    K'_ii = (1/S) Σ_r C_rᵀ K_ii C_r ``[P_out, P_out]``, K'_t = mean_r K_t[r] ``[B]``: the kernel
    of a linear readout with independent weights per location.
    """
    out = conv_mix(K, weights, stride=1, padding="valid")  # ti [B, 1, 1, P_out], t [B, 1, 1]
    return GramBlocks(out.ii, out.ti[:, 0, 0, :], out.t[:, 0, 0])


def global_average_pool(G: GramBlocks, jitter: float = 0.0):
    """Global average pooling of a spatial Gram layer into a flat one (Milsom et al. 2024, Alg. 1).

    G^flat_ii = G_ii, G^flat_ti = (1/S) Σ_r G_ti[r] ``[B, P]``, and the pooled diagonal
    (1/S²) Σ_{r,s} G_tt[(b,r),(b,s)] needs the cross-location entries, which a DKM never forms.
    They are Nyström-completed from the inducing block: G_tt[r, s] ≈ G_ti[r] G_ii⁻¹ G_it[s] +
    δ_rs ρ_r with the residual ρ_r = G_t[r] − G_ti[r] G_ii⁻¹ G_it[r] (the same completion the
    DKM's own prediction step makes; off-diagonal residual correlations are dropped):

        G^flat_t = ḡ G_ii⁻¹ ḡᵀ + (1/S²) Σ_r ρ_r,   ḡ = (1/S) Σ_r G_ti[r].

    Computed with triangular solves against chol(G_ii + jitter·I). Returns ``(blocks, checks)``;
    ``checks`` holds ``chol_ok`` (bool) and ``min_residual`` (the smallest ρ_r / G_t[r]) so the
    caller can raise a typed error outside of ``jit``.
    """
    B = G.ti.shape[0]
    P = G.ii.shape[0]
    S = math.prod(G.t.shape[1:])
    L = jnp.linalg.cholesky(G.ii + jitter * jnp.eye(P, dtype=G.ii.dtype))  # [P, P]
    g_bar = jnp.mean(G.ti.reshape(B, S, P), axis=1)  # [B, P]
    A_bar = solve_triangular(L, g_bar.T, lower=True)  # [P, B]
    A = solve_triangular(L, G.ti.reshape(B * S, P).T, lower=True)  # [P, B·S]
    t_flat = G.t.reshape(B * S)  # [B·S]
    residual = t_flat - jnp.sum(A * A, axis=0)  # [B·S]
    ratio = residual / jnp.maximum(t_flat, _TINY)  # [B·S]
    pooled_t = jnp.sum(A_bar * A_bar, axis=0) + jnp.sum(
        jnp.maximum(residual, 0.0).reshape(B, S), axis=1
    ) / (S * S)  # [B]
    checks = {"chol_ok": jnp.all(jnp.isfinite(L)), "min_residual": jnp.min(ratio)}
    return GramBlocks(G.ii, g_bar, pooled_t), checks


# --------------------------------------------------------------------------- normalisation, skips


def batch_kernel_norm(G: GramBlocks, log_scale_inducing, log_scale_data, mode: str = "local") -> GramBlocks:
    """Batch kernel normalisation (Milsom et al. 2024; the batch-norm analogue of §4.1).

    Rescales the joint Gram matrix by a positive diagonal, so it stays PSD: every inducing point
    is normalised by its own diagonal (G_ii → correlation) and each train/test entry by its own
    diagonal (``mode="local"``) or by the mean diagonal of its image (``mode="image"``), then
    learned scales s_i = exp(log_scale_inducing) and s_t = exp(log_scale_data) restore a size:
    G_ii ← s_i² G_ii/√(d_i d_j), G_ti ← s_i s_t G_ti/√(d_t d_i), G_t ← s_t² G_t/d_t.
    """
    d_i = jnp.maximum(diagonal(G.ii), _TINY)  # [P]
    if mode == "local":
        d_t = jnp.maximum(G.t, _TINY)  # [B, *S]
    elif mode == "image":
        spatial = tuple(range(1, G.t.ndim))
        d_t = jnp.broadcast_to(jnp.maximum(jnp.mean(G.t, axis=spatial, keepdims=True), _TINY), G.t.shape)  # [B, *S]
    else:
        raise ValueError(f"mode must be 'local' or 'image', got {mode!r}")
    s_i, s_t = jnp.exp(log_scale_inducing), jnp.exp(log_scale_data)
    r_i = jnp.sqrt(d_i)  # [P]
    r_t = jnp.sqrt(d_t)  # [B, *S]
    ii = s_i * s_i * G.ii / (r_i[:, None] * r_i[None, :])  # [P, P]
    ti = s_i * s_t * G.ti / (r_t[..., None] * r_i)  # [B, *S, P]
    t = s_t * s_t * G.t / d_t  # [B, *S]
    return GramBlocks(ii, ti, t)


def convex_combination(G_a: GramBlocks, G_b: GramBlocks, weight_b=0.5) -> GramBlocks:
    """(1 − w)·G_a + w·G_b blockwise: the skip connection of Milsom et al. 2024, §4.1."""
    return GramBlocks(*((1.0 - weight_b) * a + weight_b * b for a, b in zip(G_a, G_b)))


# --------------------------------------------------------------------------- input layer


def linear_input_gram(X_inducing, X) -> GramBlocks:
    """G⁰ = (1/ν₀) [X_i; X_t][X_i; X_t]ᵀ (Milsom et al. 2024, Algorithm 1).

    X_inducing ``[P, ν₀]``, X ``[B, ν₀]`` -> ii ``[P, P]``, ti ``[B, P]``, t ``[B]``.
    """
    nu0 = X.shape[-1]
    return GramBlocks(X_inducing @ X_inducing.T / nu0, X @ X_inducing.T / nu0, jnp.sum(X * X, axis=-1) / nu0)


def patch_input_gram(Z, X) -> GramBlocks:
    """Input Gram of image patches: the linear patch kernel with zero padding ("same").

    Z ``[P, kh, kw, C]`` inducing patches, X ``[B, H, W, C]`` images; ν₀ = kh·kw·C:
    ii = Z Zᵀ/ν₀ ``[P, P]``, ti[b, r] = ⟨X[b, r + d], Z⟩/ν₀ ``[B, H, W, P]`` (a conv2d, as patches @ Zᵀ),
    t[b, r] = ‖X[b, r + d]‖²/ν₀ ``[B, H, W]`` (a sum pool of Σ_c X²).
    """
    P, kh, kw, C = Z.shape
    nu0 = kh * kw * C
    pads = _pads("same", (kh, kw))
    Z_flat = Z.reshape(P, nu0)  # [P, ν₀], window order (dy, dx, c)
    ii = Z_flat @ Z_flat.T / nu0  # [P, P]
    # The patches of X do not depend on any parameter: one matmul against them (and its transpose for
    # ∂/∂Z) is ~10× faster on a CPU than XLA's convolution with C = 3 input channels and its filter gradient.
    patches = jnp.concatenate(_shifted_views(X, (kh, kw), 1, pads), axis=-1)  # [B, H, W, ν₀]
    ti = patches @ Z_flat.T / nu0  # [B, H, W, P]
    sq = jnp.sum(X * X, axis=-1)  # [B, H, W]
    t = _window_sum(sq, (kh, kw), 1, pads) / nu0  # [B, H, W]
    return GramBlocks(ii, ti, t)
