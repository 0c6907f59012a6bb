"""Translation-insensitive convolutional kernel, TICK (Dutordoir et al. 2020, §3.2, eq. 2).

The patch-response function sees a patch *and where it is*::

    f(x) = Σ_p w_p g(x^[p], ℓ(p)),   k_g((x^[p], ℓ(p)), (x'^[q], ℓ(q))) = k_patch(x^[p], x'^[q]) · k_loc(ℓ(p), ℓ(q))

so Kff(x, x') = Σ_pq w_p w_q k_patch(x^[p], x'^[q]) k_loc(ℓ(p), ℓ(q)). k_loc is a squared
exponential with unit variance and its own learned lengthscale ``location_lengthscale``: a long
one gives back the translation-invariant kernel of van der Wilk et al. 2017, eq. 13–14 (k_loc ≡ 1),
a short one only compares patches at the same place (Kff = Σ_p w_p² k_patch(x^[p], x'^[p])).

Location convention (one place: :func:`patch_locations`): patch p = (r, c) of the stride-s grid of
H_out × W_out patches has its upper-left corner at pixel (r·s, c·s); ℓ(p) divides that by the
corner of the last patch, ((H_out − 1)·s, (W_out − 1)·s), so ℓ(p) = (r/(H_out − 1), c/(W_out − 1))
∈ [0, 1]², row first. Data locations and inducing locations Z_loc live in this same space.

Inducing variables live in patch × location space (Dutordoir et al. 2020, §4.2): u_m = g(z_m, z_loc,m),
so Kuu = k_patch(Z, Z) ∘ k_loc(Z_loc, Z_loc) and Kuf = Σ_p w_p k_patch(z, x^[p]) k_loc(z_loc, ℓ(p))
(:class:`gpzoo.inference.inducing.InducingPatchesWithLocations`).

Hot paths reuse the convolutional machinery (:mod:`gpzoo.models.kernels.convolutional`). With an
SE patch kernel the product k_patch · k_loc is one SE kernel on patches augmented with their
location, [x^[p]/ℓ, ℓ(p)/λ] (λ the location lengthscale), so the Kff diagonal is the fused
symmetric sweep :func:`se_patch_gram_sum` and Kuf the fused matmul–exp–sum
:func:`se_patch_cross_sum`, both on E + 2 columns, with an ARD lengthscale [ℓ·1_E, λ, λ]: no
``[N, P, P]`` or ``[N, P, M, E]`` array. The price over the plain conv kernel is honest: every
patch is distinct once its location is attached (the distinct-patch sweep of the conv kernel has
nothing to merge), and the gradient with respect to λ needs the K·(w ∘ u) products of the sweep.
Other patch kernels multiply blocks of k_patch by the fixed ``[P, P]`` matrix k_loc(ℓ, ℓ).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import constraints

from gpzoo.models.errors import InvalidArgumentError, ShapeError
from gpzoo.models.kernels.base import Fixed, hyper, kernel_class
from gpzoo.models.kernels.convolutional import (
    KFF_METHODS,
    KUF_FUSED_MIN_INDUCING,
    ConvolutionalKernel,
    check_patch_weights,
    evaluate_sweep,
    grid_patches,
    is_plain_se,
    pad_rows,
    tile_rows,
    image_dims,
    se_patch_cross_sum,
    se_patch_gram_sum,
)
from gpzoo.models.kernels.stationary import scaled_sqdist

__all__ = ["TICK", "TICK_KFF_METHODS", "location_gram", "output_grid", "patch_locations"]

#: Kff-diagonal paths of TICK: the conv kernel's ``"distinct"`` sweep is absent (no two patches are
#: equal once their locations are attached).
TICK_KFF_METHODS = tuple(m for m in KFF_METHODS if m != "distinct")


def output_grid(image_shape, patch_shape) -> tuple[int, int]:
    """(H_out, W_out): the stride-1 grid of patches (van der Wilk et al. 2017, §3: (H − h + 1)(W − w + 1))."""
    H, W, _ = image_dims(image_shape)
    h, w = (int(s) for s in patch_shape)
    if h > H or w > W or min(h, w) < 1:
        raise ShapeError("patch_shape", f"patch {tuple(patch_shape)} does not fit the image {(H, W)}")
    return H - h + 1, W - w + 1


def patch_locations(image_shape, patch_shape) -> np.ndarray:
    """ℓ(p) of every patch, ``[P, 2]`` (row, col) in [0, 1]², in the patch order of :func:`extract_patches`.

    Patch p = (r, c) (p = r·W_out + c) has ℓ(p) = (r/(H_out − 1), c/(W_out − 1)): the pixel
    location of its upper-left corner, (r·s, c·s), divided by that of the last patch (the stride
    s cancels, so a strided grid has the same locations). A single row (H_out = 1) or column
    (W_out = 1) of patches has that coordinate 0: all patches share it, and k_loc depends on
    differences only. This is the only place the convention is written down; inducing locations
    initialised from patch p are ℓ(p) exactly.
    """
    H_out, W_out = output_grid(image_shape, patch_shape)
    rows = np.arange(H_out, dtype=np.float64) / max(H_out - 1, 1)  # [H_out]
    cols = np.arange(W_out, dtype=np.float64) / max(W_out - 1, 1)  # [W_out]
    grid = np.stack(np.meshgrid(rows, cols, indexing="ij"), axis=-1)  # [H_out, W_out, 2]  row first
    return grid.reshape(H_out * W_out, 2)  # [P, 2]


def location_gram(A, B, location_lengthscale):
    """k_loc(a, b) = exp(−½‖(a − b)/λ‖²) (unit variance) between locations A ``[P, 2]`` and B ``[M, 2]``: ``[P, M]``."""
    return jnp.exp(-0.5 * scaled_sqdist(A, B, location_lengthscale))  # [P, M]


@kernel_class
class TICK(ConvolutionalKernel):
    """Translation-insensitive convolutional kernel (Dutordoir et al. 2020, eq. 2): f(x) = Σ_p w_p g(x^[p], ℓ(p)).

    ``base_kernel`` is k_patch on h×w×C colour patches (one stream: all channels of a patch are
    flattened into one vector, so their squared distances add up in an SE kernel);
    ``location_lengthscale`` λ is the lengthscale of the unit-variance SE k_loc over
    :func:`patch_locations`; ``weights`` ``[P]`` are learned patch weights (van der Wilk et al. 2017,
    eq. 17), or ``Fixed`` ones for the unweighted kernel (:meth:`create` with ``weighted=False``).
    Normalisation, patch extraction and input checks are those of the conv kernels
    (:class:`ConvolutionalKernel`). Inducing variables: ``InducingPatchesWithLocations``
    (:mod:`gpzoo.inference.inducing`); plain inducing patches are refused with a typed error.
    """

    location_lengthscale: Any = hyper(kw_only=True)
    weights: Any = hyper(constraint=constraints.real, kw_only=True)

    def __post_init__(self):
        if self.kff_method not in TICK_KFF_METHODS:
            raise InvalidArgumentError(
                "kff_method", f"must be one of {TICK_KFF_METHODS} for TICK (every patch is distinct by its location), got {self.kff_method!r}"
            )
        super().__post_init__()
        check_patch_weights(self.weights, (self.num_patches,), "weights")
        raw = self.location_lengthscale.value if isinstance(self.location_lengthscale, Fixed) else self.location_lengthscale
        if isinstance(raw, (int, float, np.ndarray, jax.Array, list, tuple)) and np.shape(raw) not in ((), (2,)):
            raise ShapeError("location_lengthscale", f"expected a scalar or one value per axis (row, col), got shape {np.shape(raw)}")

    @classmethod
    def create(cls, base_kernel, image_shape, patch_shape=(3, 3), location_lengthscale=0.5, *, weighted: bool = True, **options):
        """TICK with unit patch weights: learned (``weighted=True``, the paper's kernel) or ``Fixed``."""
        weights = jnp.ones(grid_patches(image_shape, patch_shape))  # [P]
        return cls(base_kernel, image_shape, patch_shape, location_lengthscale=location_lengthscale,
                   weights=weights if weighted else Fixed(weights), **options)

    # ------------------------------------------------------------------ structure
    @property
    def num_streams(self) -> int:
        return 1

    @property
    def output_shape(self) -> tuple[int, int]:
        """(H_out, W_out), the grid of patch locations."""
        return output_grid(self.image_shape, self.patch_shape)

    def _raw_weights(self):
        return jnp.reshape(self.weights, (1, self.num_patches))  # [1, P]

    def locations(self, dtype=None):
        """ℓ(p) of every patch ``[P, 2]`` (:func:`patch_locations`)."""
        return jnp.asarray(patch_locations(self.image_shape, self.patch_shape), dtype)  # [P, 2]

    def _location_scales(self, dtype):
        return jnp.broadcast_to(jnp.asarray(self.location_lengthscale, dtype), (2,))  # [2]

    def _augmented_lengthscale(self, base, E, dtype):
        """[ℓ_patch (scalar or ARD, broadcast to E), λ, λ]: the SE lengthscale on augmented patches ``[E+2]``."""
        patch = jnp.broadcast_to(jnp.asarray(base.lengthscale, dtype), (E,))  # [E]
        return jnp.concatenate([patch, self._location_scales(dtype)])  # [E+2]

    def _check_inducing(self, Z, Z_loc):
        if Z_loc is None:
            raise InvalidArgumentError(
                "inducing", "TICK's inducing variables live in patch × location space: use InducingPatchesWithLocations "
                "(gpzoo.inference.inducing), not InducingPatches",
            )
        if np.ndim(Z) != 2 or np.shape(Z)[1] != self.patch_dim:
            raise ShapeError("Z", f"expected [M, {self.patch_dim}] inducing patches, got shape {np.shape(Z)}")
        if np.shape(Z_loc) != (np.shape(Z)[0], 2):
            raise ShapeError("Z_loc", f"expected [{np.shape(Z)[0]}, 2] inducing locations (row, col), got shape {np.shape(Z_loc)}")

    # ------------------------------------------------------------------ inter-domain covariances
    def Kzz(self, Z, *, Z_loc=None):
        """Kuu ``[1, M, M]`` = k_patch(Z, Z) ∘ k_loc(Z_loc, Z_loc) (Dutordoir et al. 2020, §4.2)."""
        self._check_inducing(Z, Z_loc)
        return evaluate_sweep(self.resolved(), "_kzz_loc", jnp.asarray(Z), jnp.asarray(Z_loc))  # [1, M, M]

    def Kzx(self, Z, X, *, Z_loc=None):
        """Kuf ``[1, M, N]`` = Σ_p w_p k_patch(z, x^[p]) k_loc(z_loc, ℓ(p)) (Dutordoir et al. 2020, §4.2 with eq. 2)."""
        self._check_inducing(Z, Z_loc)
        return evaluate_sweep(self.resolved(), "_kzx_loc", jnp.asarray(Z), jnp.asarray(Z_loc), jnp.asarray(X))  # [1, M, N]

    def _kzz_loc(self, Z, Z_loc):
        base = self.base_kernel.resolved()
        K = base.K(Z, Z) * location_gram(Z_loc, Z_loc, self._location_scales(Z.dtype))  # [M, M]
        return K[None]  # [1, M, M]

    def _kzx_loc(self, Z, Z_loc, X):
        base = self.base_kernel.resolved()
        dtype = jnp.result_type(X.dtype, Z.dtype)
        weights = self._patch_weights()[0].astype(dtype)  # [P]
        locations = self.locations(dtype)  # [P, 2]
        fused_auto = is_plain_se(base) and Z.shape[0] >= KUF_FUSED_MIN_INDUCING
        if self.kuf_method == "fused" or (self.kuf_method == "auto" and fused_auto):
            patches = self._stream_patches(X.astype(dtype))[0]  # [N, P, E]
            N, P, E = patches.shape
            augmented = jnp.concatenate([patches, jnp.broadcast_to(locations, (N, P, 2))], axis=-1)  # [N, P, E+2]
            Z_aug = jnp.concatenate([Z, Z_loc], axis=-1).astype(dtype)  # [M, E+2]
            ls = self._augmented_lengthscale(base, E, dtype)  # [E+2]
            sums = se_patch_cross_sum(augmented, Z_aug, weights, lengthscale=ls)  # [N, M]
            return (jnp.asarray(base.variance, dtype) * sums.T)[None]  # [1, M, N]
        K_patch = self._patch_filter_cov(Z, X)[0]  # [N, P, M]  k_patch(x^[p], z_m), patch matmuls
        K_loc = location_gram(locations, Z_loc.astype(dtype), self._location_scales(dtype))  # [P, M]
        weighted_loc = (weights[:, None] * K_loc).astype(K_patch.dtype)  # [P, M]
        # multiply-and-reduce rather than an einsum: the conv kernels' measured choice for XLA on CPU
        return jnp.sum(K_patch * weighted_loc[None], axis=1).T[None]  # [1, M, N]

    # ------------------------------------------------------------------ Kff
    def _group_k_diag(self, X):
        """diag Kff ``[1, N]``: Σ_pq w_p w_q k_patch(x^[p], x^[q]) k_loc(ℓ(p), ℓ(q)), the hot path (N·P² evaluations)."""
        base = self.base_kernel.resolved()
        patches = self._stream_patches(X)[0]  # [N, P, E]
        N, P, E = patches.shape
        dtype = patches.dtype
        weights = jnp.broadcast_to(self._patch_weights()[0].astype(dtype), (N, P))  # [N, P]
        locations = self.locations(dtype)  # [P, 2]
        method = self.kff_method
        if method == "auto":
            method = "fused" if is_plain_se(base) else "checkpoint"
        if method == "fused":
            if not is_plain_se(base):
                raise InvalidArgumentError("kff_method", f"'fused' needs a SquaredExponential base kernel, got {type(base).__name__}")
            augmented = jnp.concatenate([patches, jnp.broadcast_to(locations, (N, P, 2))], axis=-1)  # [N, P, E+2]
            ls = self._augmented_lengthscale(base, E, dtype)  # [E+2]
            sums = se_patch_gram_sum(augmented, weights, self.kff_block, lengthscale=ls)  # [N]
            return (jnp.asarray(base.variance, dtype) * sums)[None]  # [1, N]
        K_loc = location_gram(locations, locations, self._location_scales(dtype))  # [P, P]
        if method == "checkpoint":
            return _checkpointed_located_gram_sum(base, patches, weights, K_loc, self.kff_block)[None]  # [1, N]
        K = jax.vmap(base.K)(patches, patches) * K_loc  # [N, P, P]  "naive": the reference
        return jnp.einsum("np,npq,nq->n", weights, K, weights)[None]  # [1, N]

    def _k_full(self, X, Y):
        """Full Kff ``[N, N']``, one image of X at a time (exact GPs, tests, plots)."""
        base = self.base_kernel.resolved()
        Px = self._stream_patches(X)[0]  # [N, P, E]
        Py = self._stream_patches(Y)[0]  # [N', P, E]
        Ny, P, E = Py.shape
        dtype = Py.dtype
        weights = self._patch_weights()[0].astype(dtype)  # [P]
        locations = self.locations(dtype)  # [P, 2]
        K_loc = location_gram(locations, locations, self._location_scales(dtype))  # [P, P]
        Py_rows = Py.reshape(Ny * P, E)  # [N'*P, E]

        def row(x):  # x [P, E]
            K = base.K(x, Py_rows).reshape(P, Ny, P) * K_loc[:, None, :]  # [P, N', P]
            return jnp.einsum("p,pnq,q->n", weights, K, weights)  # [N']

        return jax.lax.map(row, Px)  # [N, N']

    # ------------------------------------------------------------------ per-patch covariances (multi-output layer)
    def patch_cross_covariance(self, patches, Z, Z_loc):
        """k_g((x^[p], ℓ(p)), (z_m, z_loc,m)) for every image, patch and inducing point: ``[N, P, M]``.

        patches ``[N, P, E]`` (rows of :func:`extract_patches`); one patch matmul (van der Wilk et
        al. 2017, App. A.2) for k_patch times the ``[P, M]`` location factor. Unweighted: the
        multi-output layer of Dutordoir et al. 2020, eq. 3–4 does not sum over patches.
        """
        self._check_inducing(Z, Z_loc)
        base = self.base_kernel.resolved()
        N, P, E = patches.shape
        K_patch = base.K(patches.reshape(N * P, E), Z).reshape(N, P, -1)  # [N, P, M]
        K_loc = location_gram(self.locations(patches.dtype), Z_loc, self._location_scales(patches.dtype))  # [P, M]
        return K_patch * K_loc[None]  # [N, P, M]

    def location_covariance(self, dtype=None):
        """k_loc(ℓ(p), ℓ(q)) between the patch locations ``[P, P]``."""
        locations = self.locations(dtype)  # [P, 2]
        return location_gram(locations, locations, self._location_scales(locations.dtype))  # [P, P]


def _checkpointed_located_gram_sum(kernel, patches, weights, K_loc, block_size: int | None):
    """Σ_pq w_p w_q k(x_p, x_q) k_loc(p, q) per row for any patch kernel: row blocks under ``jax.checkpoint``.

    patches ``[R, P, E]``, weights ``[R, P]``, K_loc ``[P, P]`` -> ``[R]`` (the conv kernels'
    row-block scan with the fixed location factor applied to each ``[R, b, P]`` block).
    """
    R, P, E = patches.shape
    block = tile_rows(R, P, block_size)
    Xp, wp, num_blocks = pad_rows(patches, weights, block)  # [R, Pp, E], [R, Pp]
    Pp = Xp.shape[1]
    Lp = jnp.pad(K_loc, ((0, Pp - P), (0, Pp - P)))  # [Pp, Pp]  padded patches have weight 0
    row_blocks = jnp.moveaxis(Xp.reshape(R, num_blocks, block, E), 1, 0)  # [nb, R, b, E]
    weight_blocks = jnp.moveaxis(wp.reshape(R, num_blocks, block), 1, 0)  # [nb, R, b]
    loc_blocks = Lp.reshape(num_blocks, block, Pp)  # [nb, b, Pp]

    @jax.checkpoint
    def block_value(rows, wb, lb):  # [R, b, E], [R, b], [b, Pp]
        Kb = jax.vmap(kernel.K)(rows, Xp) * lb[None]  # [R, b, Pp]
        return jnp.einsum("rb,rbp,rp->r", wb, Kb, wp)  # [R]

    def body(total, xs):
        return total + block_value(*xs), None

    return jax.lax.scan(body, jnp.zeros((R,), patches.dtype), (row_blocks, weight_blocks, loc_blocks))[0]  # [R]
