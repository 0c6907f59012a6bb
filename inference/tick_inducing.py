"""Inducing variables of the TICK kernel: patches with locations (Dutordoir et al. 2020, §3.2, §4.2).

u_m = g(z_m, z_loc,m) is the patch-response function at an inducing patch ``Z`` ``[M, E]`` *placed*
at an inducing location ``Z_loc`` ``[M, 2]`` (row, col in the [0, 1]² convention of
:func:`gpzoo.models.kernels.tick.patch_locations`). The covariances registered here for
(:class:`InducingPatchesWithLocations`, :class:`~gpzoo.models.kernels.tick.TICK`) are

    Kuu = k_patch(Z, Z) ∘ k_loc(Z_loc, Z_loc)                         ``[1, M, M]``
    Kuf = Σ_p w_p k_patch(z, x^[p]) k_loc(z_loc, ℓ(p))                 ``[1, M, N]``

computed by the kernel (fused SE paths, patch matmuls otherwise). The initialiser
``"patch-locations"`` draws distinct training patches and the location each came from, so an
inducing point starts with k_loc(z_loc, ℓ(p)) = 1 for its own patch p.

Kept apart from :mod:`gpzoo.inference.inducing` while that module is restructured; it registers
with the same ``Kuu`` / ``Kuf`` dispatchers and initialiser registry, so importing it is enough.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from numpyro.distributions import Distribution, constraints

from gpzoo.inference.inducing import InducingVariables, Kuf, Kuu, register_initialiser
from gpzoo.models.errors import InvalidArgumentError, ShapeError
from gpzoo.models.kernels import Kernel
from gpzoo.models.kernels.tick import TICK
from gpzoo.models.parameters import Fixed, hyper, pytree_dataclass

__all__ = ["InducingPatchesWithLocations", "PATCH_LOCATION_POOL_SIZE", "initial_patches_with_locations"]


def _shape(value):
    """Shape of a hyperparameter value (``Fixed`` unwrapped); None for a prior."""
    if isinstance(value, Distribution):
        return None
    return np.shape(value.value if isinstance(value, Fixed) else value)


@pytree_dataclass
class InducingPatchesWithLocations(InducingVariables):
    """u = g(Z, Z_loc): inducing patches ``Z`` ``[M, E]`` at inducing locations ``Z_loc`` ``[M, 2]``.

    Both are learned (unconstrained) by default; wrap either in ``Fixed`` to hold it. Locations
    use the kernel's convention (row, col) ∈ [0, 1]² (:func:`gpzoo.models.kernels.tick.patch_locations`).
    """

    Z: Any = hyper(constraint=constraints.real)
    Z_loc: Any = hyper(constraint=constraints.real)

    def __post_init__(self):
        z, loc = _shape(self.Z), _shape(self.Z_loc)
        if z is not None and len(z) != 2:
            raise ShapeError("Z", f"expected [M, E] inducing patches, got shape {z}")
        if loc is not None and (len(loc) != 2 or loc[1] != 2 or (z is not None and loc[0] != z[0])):
            M = "M" if z is None else z[0]
            raise ShapeError("Z_loc", f"expected [{M}, 2] inducing locations (row, col), got shape {loc}")
        super().__post_init__()

    @property
    def num_inducing(self) -> int:
        return int(_shape(self.Z)[0])


@Kuu.register(InducingPatchesWithLocations, TICK)
def _kuu_patch_locations(inducing, kernel):
    return kernel.Kzz(inducing.Z, Z_loc=inducing.Z_loc)  # [1, M, M]


@Kuf.register(InducingPatchesWithLocations, TICK, object)
def _kuf_patch_locations(inducing, kernel, X):
    return kernel.Kzx(inducing.Z, X, Z_loc=inducing.Z_loc)  # [1, M, N]


@Kuu.register(InducingPatchesWithLocations, Kernel)
def _kuu_patch_locations_unsupported(inducing, kernel):
    raise InvalidArgumentError("inducing", f"inducing patches with locations need a TICK kernel, got {type(kernel).__name__}")


@Kuf.register(InducingPatchesWithLocations, Kernel, object)
def _kuf_patch_locations_unsupported(inducing, kernel, X):
    raise InvalidArgumentError("inducing", f"inducing patches with locations need a TICK kernel, got {type(kernel).__name__}")


#: Distinct training patches collected before the initialiser stops scanning more images.
PATCH_LOCATION_POOL_SIZE = 20_000


def initial_patches_with_locations(kernel: TICK, X, num_inducing: int, rng: np.random.Generator):
    """``num_inducing`` distinct training patches ``[M, E]`` and the location each came from ``[M, 2]``.

    Images are visited in random order, and so are the occurrences of a patch within them, so a
    patch seen at several places (a blank background) starts at one of those places at random.
    Raises ``InvalidArgumentError`` naming ``num_inducing`` when there are fewer distinct patches.
    """
    X = np.asarray(X)
    locations = np.asarray(kernel.locations(), X.dtype)  # [P, 2]
    E = kernel.patch_dim
    enough = max(PATCH_LOCATION_POOL_SIZE, num_inducing)
    pool, pool_loc = np.zeros((0, E), X.dtype), np.zeros((0, 2), X.dtype)  # [K, E], [K, 2]
    for chunk in np.array_split(rng.permutation(X.shape[0]), max(1, X.shape[0] // 128)):
        patches = np.asarray(kernel.inducing_space_patches(X[chunk]))  # [n*P, E]  image-major, patch order
        where = np.tile(locations, (len(chunk), 1))  # [n*P, 2]
        order = rng.permutation(patches.shape[0])
        candidates = np.concatenate([pool, patches[order]]), np.concatenate([pool_loc, where[order]])
        _, first = np.unique(candidates[0], axis=0, return_index=True)  # first occurrence: pool, then random
        first = np.sort(first)
        pool, pool_loc = candidates[0][first], candidates[1][first]
        if pool.shape[0] >= enough:
            break
    if num_inducing > pool.shape[0]:
        raise InvalidArgumentError(
            "num_inducing", f"M={num_inducing} exceeds the {pool.shape[0]} distinct training patches of shape {kernel.patch_shape}"
        )
    pick = rng.choice(pool.shape[0], num_inducing, replace=False)  # [M]
    return pool[pick], pool_loc[pick]  # [M, E], [M, 2]


@register_initialiser("patch-locations")
def _init_patch_locations(kernel, X, num_inducing, key, method):
    """Inducing patches with locations from data (Dutordoir et al. 2020, §5.3: random training patches),
    each at the location ℓ(p) it was taken from; ``method`` must be ``"random"``."""
    if not isinstance(kernel, TICK):
        raise InvalidArgumentError("inducing", f"'patch-locations' needs a TICK kernel, got {type(kernel).__name__}")
    if method != "random":
        raise InvalidArgumentError("inducing_init", f"'patch-locations' supports method 'random' only, got {method!r}")
    X = np.asarray(X)
    kernel.validate_inputs(X)
    rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
    Z, Z_loc = initial_patches_with_locations(kernel, X, num_inducing, rng)
    return InducingPatchesWithLocations(jnp.asarray(Z, dtype=X.dtype), jnp.asarray(Z_loc, dtype=X.dtype))
