"""The multi-output convolutional layer, MOCK (Dutordoir et al. 2020, §3.3–4.2, eq. 3–5), as pure functions.

A layer maps an image to an image: f(x) = {g(x^[p])}_{p=1..P} (eq. 3), one output per patch, with
Cov[f_p(x), f_q(x')] = k_g(x^[p], x'^[q]) (eq. 4) — times k_loc(ℓ(p), ℓ(q)) for a TICK layer
(eq. 2). Each of the C_out output channels is an independent g_c with the same kernel; all share
the layer's M inducing patches u = g(Z) (patch space, §4.2), so there is one M×M Kuu per layer and
q(u_c) = N(Luu m_c, Luu S_c Luuᵀ) is whitened (u = Luu v, v ~ N(q_mu, q_sqrt q_sqrtᵀ)). The
conditional (eq. 5) per image n, patch p and channel c:

    mean_npc = a_npᵀ m_c + μ_npc,     a_np = Luu⁻¹ k_u(x_n^[p])                    ``[M]``
    var_npc  = k_g(x_n^[p], x_n^[p]) − a_npᵀ a_np + ‖S_cᵀᐟ² a_np‖²

and with ``full_cov=True`` the P×P covariance of each image (a_npᵀ a_nq terms), for small images and
tests; the marginals are the default because sampling the correlated outputs needs a P×P
Cholesky per image (§4.1).

Choices (documented once, here):

* multi-channel inputs: a patch is h×w×C_in values flattened (dy, dx, c), so the patch kernel
  sees all input channels at once (for SE, squared distances add up over channels); inducing
  patches are ``[M, h·w·C_in]``;
* the kernel object is the single-output one — :class:`~gpzoo.models.kernels.Convolutional`
  (``channels="patch"``) or :class:`~gpzoo.models.kernels.TICK` — built for the layer's input
  image shape; only its patch kernel (and TICK's locations) enter: patch weights and the
  normalisation belong to the sum over patches of eq. 1, which the layer does not take;
* identity mean (Dutordoir et al. 2020, §5.3): the input cropped to the H_out×W_out grid of patch
  centres — rows (h−1)//2 … (h−1)//2 + H_out − 1, columns likewise (the patch centre for odd h, w;
  the upper-left one of the central pixels for even ones) — then mapped from C_in to C_out
  channels by ``mean_weights`` ``[C_in, C_out]``; the default is the identity when C_in = C_out
  and otherwise the rectangular identity (channel c to channel c, zero-padding new channels, or
  dropping extra ones — as Salimbeni and Deisenroth 2017 pad their identity mean).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular

from gpzoo.inference.guides import conditional
from gpzoo.inference.inducing import InducingPatches, Kuu
from gpzoo.inference.linalg import cholesky_with_jitter
from gpzoo.inference.inducing import InducingPatchesWithLocations
from gpzoo.models.errors import InvalidArgumentError, ShapeError
from gpzoo.models.kernels.convolutional import Convolutional, extract_patches, is_plain_se
from gpzoo.models.kernels.tick import TICK, output_grid

__all__ = ["DEFAULT_JITTER", "LayerOutput", "centre_crop", "conv_layer_conditional", "identity_mean", "layer_covariances",
           "outputs_as_images"]

#: Jitter added to Kuu before its Cholesky (whitened layers: the prior is returned exactly for any jitter).
DEFAULT_JITTER = 1e-6


class LayerOutput(NamedTuple):
    """q(f) of one layer at a batch of images.

    ``mean`` ``[N, P, C_out]`` (identity mean included); ``var`` ``[N, P]`` for a q_sqrt shared by
    the output channels, ``[N, P, C_out]`` otherwise; with ``full_cov`` ``cov`` ``[N, P, P]`` or
    ``[N, C_out, P, P]`` as well (``var`` is then its diagonal). Patches p = r·W_out + c. A
    named tuple, so a pytree: the function can be jitted with ``full_cov`` and ``mean`` static.
    """

    mean: jax.Array
    var: jax.Array
    cov: jax.Array | None = None


# ----------------------------------------------------------------------------- mean function
def centre_crop(images, patch_shape):
    """images ``[N, H, W, C]`` cropped to the patch centres' grid ``[N, H_out, W_out, C]`` (module docstring)."""
    N, H, W, C = images.shape
    H_out, W_out = output_grid((H, W, C), patch_shape)
    top, left = (int(patch_shape[0]) - 1) // 2, (int(patch_shape[1]) - 1) // 2
    return images[:, top : top + H_out, left : left + W_out, :]  # [N, H_out, W_out, C]


def identity_mean(images, patch_shape, num_outputs: int, mean_weights=None):
    """The identity mean of a layer, ``[N, P, C_out]``: centre crop, channels mapped by ``mean_weights`` ``[C_in, C_out]``."""
    crop = centre_crop(images, patch_shape)  # [N, H_out, W_out, C_in]
    N, H_out, W_out, C_in = crop.shape
    flat = crop.reshape(N, H_out * W_out, C_in)  # [N, P, C_in]
    if mean_weights is None:
        if C_in == num_outputs:
            return flat  # [N, P, C_out]  exactly the crop
        mean_weights = jnp.eye(C_in, num_outputs, dtype=flat.dtype)  # [C_in, C_out]
    return jnp.einsum("npi,io->npo", flat, jnp.asarray(mean_weights, flat.dtype))  # [N, P, C_out]


def outputs_as_images(values, kernel):
    """Per-patch outputs ``[N, P, C]`` as images ``[N, H_out, W_out, C]`` (the next layer's input)."""
    H_out, W_out = output_grid(kernel.image_shape, kernel.patch_shape)
    return values.reshape(values.shape[0], H_out, W_out, values.shape[-1])  # [N, H_out, W_out, C]


# ----------------------------------------------------------------------------- covariances
def _check_layer(kernel, inducing):
    if isinstance(kernel, TICK):
        if not isinstance(inducing, InducingPatchesWithLocations):
            raise InvalidArgumentError("inducing", f"a TICK layer needs InducingPatchesWithLocations, got {type(inducing).__name__}")
    elif isinstance(kernel, Convolutional):
        if kernel.channels != "patch":
            raise InvalidArgumentError("kernel", "a convolutional layer acts on h×w×C_in patches: use channels='patch'")
        if not isinstance(inducing, InducingPatches):
            raise InvalidArgumentError("inducing", f"a convolutional layer needs InducingPatches, got {type(inducing).__name__}")
    else:
        raise InvalidArgumentError("kernel", f"a layer kernel is Convolutional or TICK, got {type(kernel).__name__}")


def layer_covariances(images, kernel, inducing, *, full_cov: bool = False):
    """(Kuu ``[M, M]``, per-patch Kuf ``[N, P, M]``, Kff ``[N, P]`` or ``[N, P, P]``) of the layer (eq. 4, §4.2).

    Kuu is the registered ``Kuu`` of the (inducing, kernel) pair (k_g(Z, Z), × k_loc for TICK);
    Kuf_npm = k_g((x_n^[p], ℓ(p)), (z_m, z_loc,m)) by one patch matmul (van der Wilk et al. 2017,
    App. A.2), N×P×M; Kff is k_g between the patches of each image (diagonal: P kernel values).
    """
    _check_layer(kernel, inducing)
    base = kernel.base_kernel.resolved()
    patches = extract_patches(images, kernel.patch_shape)  # [N, P, E]
    N, P, E = patches.shape
    Kmm = Kuu(inducing, kernel)[0]  # [M, M]
    tick = isinstance(kernel, TICK)
    loc = kernel.resolved().location_covariance(patches.dtype) if tick else None  # [P, P]
    if is_plain_se(base):
        Kfu = _se_cross_covariance(patches, inducing, base, kernel.resolved() if tick else None)  # [N, P, M]
    elif tick:
        Kfu = kernel.resolved().patch_cross_covariance(patches, inducing.Z, inducing.Z_loc)  # [N, P, M]
    else:
        Kfu = base.K(patches.reshape(N * P, E), inducing.Z).reshape(N, P, -1)  # [N, P, M]
    if full_cov:
        Kff = jax.vmap(base.K)(patches, patches)  # [N, P, P]
        Kff = Kff if loc is None else Kff * loc[None]  # [N, P, P]
    else:
        Kff = base.K_diag(patches.reshape(N * P, E)).reshape(N, P)  # [N, P]  (k_loc(ℓ, ℓ) = 1)
    return Kmm, Kfu, Kff


def _se_cross_covariance(patches, inducing, base, tick):
    """SE k_g(x^[p], z_m) (× k_loc(ℓ(p), z_loc,m) for a TICK layer) ``[N, P, M]`` as one matmul and one exp.

    Patches (with their locations, for TICK) are scaled by their lengthscales and augmented so that
    −½‖a − b‖² = a·b − ½‖a‖² − ½‖b‖² (van der Wilk et al. 2017, eq. A.5); the exponent is clipped at 0
    (rounding). Its gradient is a few passes over ``[N·P, M]``: 1.4× faster than the kernel's own
    K (distances, rounding guard, location factor) with its gradient for a 2-layer deep TICK step.
    """
    N, P, E = patches.shape
    ls = jnp.asarray(base.lengthscale, patches.dtype)
    x, z = patches / ls, inducing.Z / ls  # [N, P, E], [M, E]
    if tick is not None:
        scale = jnp.asarray(tick.location_lengthscale, patches.dtype)
        x = jnp.concatenate([x, jnp.broadcast_to(tick.locations(patches.dtype) / scale, (N, P, 2))], axis=-1)  # [N, P, E+2]
        z = jnp.concatenate([z, inducing.Z_loc / scale], axis=-1)  # [M, E+2]
    rows = x.reshape(N * P, -1)  # [NP, E']
    log_k = rows @ z.T - 0.5 * jnp.sum(rows**2, -1)[:, None] - 0.5 * jnp.sum(z**2, -1)[None, :]  # [NP, M]
    return (jnp.asarray(base.variance, patches.dtype) * jnp.exp(jnp.minimum(log_k, 0.0))).reshape(N, P, -1)  # [N, P, M]


# ----------------------------------------------------------------------------- the conditional
def _check_arguments(images, kernel, q_mu, q_sqrt, mean_weights):
    if np.ndim(images) != 4:
        raise ShapeError("images", f"expected [N, H, W, C_in], got shape {np.shape(images)}")
    if tuple(np.shape(images)[1:]) != tuple(kernel.image_shape) + (() if len(kernel.image_shape) == 3 else (1,)):
        expected = tuple(kernel.image_shape) + (() if len(kernel.image_shape) == 3 else (1,))
        raise ShapeError("images", f"the layer kernel was built for images {expected}, got {tuple(np.shape(images)[1:])}")
    if np.ndim(q_mu) != 2:
        raise ShapeError("q_mu", f"expected [M, C_out], got shape {np.shape(q_mu)}")
    M, C_out = np.shape(q_mu)
    if np.shape(q_sqrt) not in ((M, M), (C_out, M, M)):
        raise ShapeError("q_sqrt", f"expected [M, M] (shared) or [C_out, M, M] = {(C_out, M, M)}, got shape {np.shape(q_sqrt)}")
    C_in = np.shape(images)[3]
    if mean_weights is not None and np.shape(mean_weights) != (C_in, C_out):
        raise ShapeError("mean_weights", f"expected [C_in, C_out] = {(C_in, C_out)}, got shape {np.shape(mean_weights)}")


def conv_layer_conditional(images, kernel, inducing, q_mu, q_sqrt, *, full_cov: bool = False, mean: str = "identity",
                           mean_weights=None, jitter: float = DEFAULT_JITTER) -> LayerOutput:
    """q(f(x)) of a whitened multi-output convolutional layer at images ``[N, H, W, C_in]`` (eq. 3–5).

    ``kernel``: :class:`~gpzoo.models.kernels.Convolutional` (``channels="patch"``) with
    ``InducingPatches``, or :class:`~gpzoo.models.kernels.TICK` with ``InducingPatchesWithLocations``;
    ``q_mu`` ``[M, C_out]``; ``q_sqrt`` ``[C_out, M, M]`` (one S per output channel) or ``[M, M]``
    (shared), lower triangular; ``mean``: ``"identity"`` (centre crop, ``mean_weights``) or
    ``"zero"``; ``jitter`` is added to Kuu before its Cholesky. Marginals by the shared
    :func:`gpzoo.inference.guides.conditional`; ``full_cov`` forms the P×P covariance per image.
    """
    _check_arguments(images, kernel, q_mu, q_sqrt, mean_weights)
    if mean not in ("identity", "zero"):
        raise InvalidArgumentError("mean", f"must be 'identity' or 'zero', got {mean!r}")
    images = jnp.asarray(images)
    dtype = images.dtype
    q_mu, q_sqrt = jnp.asarray(q_mu, dtype), jnp.asarray(q_sqrt, dtype)
    shared = q_sqrt.ndim == 2
    M, C_out = q_mu.shape
    Kmm, Kfu, Kff = layer_covariances(images, kernel, inducing, full_cov=full_cov)  # [M, M], [N, P, M], [N, P(, P)]
    N, P, _ = Kfu.shape
    Luu = cholesky_with_jitter(Kmm, jitter)[0]  # [M, M]
    sqrt = q_sqrt[None] if shared else q_sqrt  # [L, M, M]  L = 1 (shared) or C_out
    prior_mean = identity_mean(images, kernel.patch_shape, C_out, mean_weights) if mean == "identity" else 0.0  # [N, P, C_out]
    if not full_cov:
        Kuf = Kfu.reshape(N * P, M).T[None]  # [1, M, N*P]
        f_mean, f_var = conditional(Kuf, Luu[None], Kff.reshape(N * P), q_mu.T, sqrt, "full", whiten=True)  # [NP, C_out], [NP, L]
        var = f_var.reshape(N, P) if shared else f_var.reshape(N, P, C_out)  # [N, P] or [N, P, C_out]
        return LayerOutput(f_mean.reshape(N, P, C_out) + prior_mean, var)
    A = solve_triangular(Luu, Kfu.reshape(N * P, M).T, lower=True).reshape(M, N, P)  # [M, N, P]  Luu⁻¹ Kuf
    f_mean = jnp.einsum("mnp,mc->npc", A, q_mu)  # [N, P, C_out]
    prior_cov = Kff - jnp.einsum("mnp,mnq->npq", A, A)  # [N, P, P]  Kff − Qff
    SA = jnp.einsum("lji,jnp->lnip", sqrt, A)  # [L, N, M, P]  Sᵀᐟ² a
    cov = prior_cov[:, None] + jnp.einsum("lnip,lniq->nlpq", SA, SA)  # [N, L, P, P]
    cov = cov[:, 0] if shared else cov  # [N, P, P] or [N, C_out, P, P]
    var = jnp.diagonal(cov, axis1=-2, axis2=-1)  # [N, P] or [N, C_out, P]
    var = var if shared else jnp.swapaxes(var, 1, 2)  # [N, P] or [N, P, C_out]
    return LayerOutput(f_mean + prior_mean, var, cov)
