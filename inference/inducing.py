"""Inducing variables and their covariances ``Kuu`` / ``Kuf``, registered per (inducing, kernel) pair.

As in GPflow, an inducing-variable type is little more than a container; what it *means* for a
given kernel lives in the two covariance functions registered for the pair (multipledispatch,
which also resolves subclasses). A new structured kernel adds one inducing type and two
registrations; the conditional, the KL and the training loop are shared.

Conventions (one place): ``Kuu`` returns a stack of blocks ``[G, M, M]`` *without* jitter (the
Cholesky adds it) and ``Kuf`` returns ``[G, M, N]``; the G·M inducing outputs are ordered group
by group. Ordinary points have G = 1; separate inducing sets for a sum of kernels
(conv + RBF, van der Wilk et al. 2017, §3.3) or one set per colour channel (van der Wilk et al. 2017, eq. 22–23) have G > 1 and
a block-diagonal Kuu.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from multipledispatch import Dispatcher
from numpyro.distributions import Distribution, constraints

from gpzoo.models.errors import InvalidArgumentError, ShapeError, as_float_array
from gpzoo.models.kernels import Kernel, Sum
from gpzoo.models.kernels.convolutional import ConvolutionalKernel
from gpzoo.models.kernels.invariant import InvariantKernel
from gpzoo.models.kernels.tick import TICK
from gpzoo.models.parameters import Fixed, Parameterised, hyper, pytree_dataclass

__all__ = [
    "BaseInducingPoints",
    "InducingPatches",
    "InducingPatchesWithLocations",
    "InducingPoints",
    "InducingVariables",
    "Kuf",
    "Kuu",
    "SeparateInducing",
    "check_inducing",
    "inducing_for",
    "initialise_inducing",
    "register_initialiser",
]

Kuu = Dispatcher("Kuu")
Kuf = Dispatcher("Kuf")  # registered on (inducing, kernel, object): the third argument is X


class InducingVariables(Parameterised):
    """Base of inducing-variable containers. ``num_inducing`` is M (per group)."""

    @property
    def num_inducing(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError


@pytree_dataclass
class InducingPoints(InducingVariables):
    """u = f(Z): values of the GP at inducing inputs ``Z`` ``[M, D]`` (van der Wilk et al. 2017, §2.1)."""

    Z: Any = hyper(constraint=constraints.real)

    @property
    def num_inducing(self) -> int:
        return int(np.shape(self.Z.value if hasattr(self.Z, "value") else self.Z)[0])


@pytree_dataclass
class SeparateInducing(InducingVariables):
    """One inducing set per summand of a :class:`Sum` kernel; Kuu is block-diagonal (App. C).

    All parts must have the same M so the blocks stack as ``[G, M, M]``.
    """

    parts: tuple

    def __post_init__(self):
        object.__setattr__(self, "parts", tuple(self.parts))
        sizes = {p.num_inducing for p in self.parts}
        if len(sizes) != 1:
            raise InvalidArgumentError("num_inducing", f"separate inducing sets need equal sizes, got {sorted(sizes)}")
        super().__post_init__()

    @property
    def num_inducing(self) -> int:
        return self.parts[0].num_inducing


@Kuu.register(InducingPoints, Kernel)
def _kuu_points(inducing, kernel):
    return kernel.K(inducing.Z)[None]  # [1, M, M]


@Kuf.register(InducingPoints, Kernel, object)
def _kuf_points(inducing, kernel, X):
    return kernel.K(inducing.Z, X)[None]  # [1, M, N]


def _check_parts(inducing, kernel):
    if len(inducing.parts) != len(kernel.kernels):
        raise InvalidArgumentError(
            "inducing", f"{len(inducing.parts)} inducing sets for a sum of {len(kernel.kernels)} kernels"
        )


@Kuu.register(SeparateInducing, Sum)
def _kuu_separate(inducing, kernel):
    _check_parts(inducing, kernel)
    return jnp.concatenate([Kuu(p, k) for p, k in zip(inducing.parts, kernel.kernels)], axis=0)  # [G, M, M]


@Kuf.register(SeparateInducing, Sum, object)
def _kuf_separate(inducing, kernel, X):
    _check_parts(inducing, kernel)
    return jnp.concatenate([Kuf(p, k, X) for p, k in zip(inducing.parts, kernel.kernels)], axis=0)  # [G, M, N]


# ----------------------------------------------------------------------------- initialisation
_INITIALISERS: dict[str, Callable[..., InducingVariables]] = {}


def register_initialiser(kind: str):
    """Register ``fn(kernel, X, num_inducing, key, method) -> InducingVariables`` under ``kind``."""

    def wrap(fn):
        _INITIALISERS[kind] = fn
        return fn

    return wrap


def initialise_inducing(kind, kernel: Kernel, X, num_inducing: int, key, method: str = "random"):
    """Build inducing variables of ``kind`` (a name, or a tuple of names for a sum kernel)."""
    if isinstance(kind, tuple):
        if not isinstance(kernel, Sum) or len(kernel.kernels) != len(kind):
            raise InvalidArgumentError("inducing", f"{kind} needs a Sum kernel of {len(kind)} parts")
        keys = jax.random.split(key, len(kind))
        return SeparateInducing(
            tuple(initialise_inducing(k, kk, X, num_inducing, sk, method) for k, kk, sk in zip(kind, kernel.kernels, keys))
        )
    if kind not in _INITIALISERS:
        raise InvalidArgumentError("inducing", f"unknown inducing kind {kind!r}; known: {sorted(_INITIALISERS)}")
    return _INITIALISERS[kind](kernel, X, num_inducing, key, method)


@register_initialiser("points")
def _init_points(kernel, X, num_inducing, key, method):
    X = np.asarray(X)
    distinct = np.unique(X, axis=0).shape[0]
    if num_inducing > distinct:
        raise InvalidArgumentError(
            "num_inducing", f"M={num_inducing} exceeds the {distinct} distinct training inputs"
        )
    if method == "random":
        idx = np.asarray(jax.random.choice(key, X.shape[0], (num_inducing,), replace=False))
        Z = X[idx]
    elif method == "kmeans":
        from sklearn.cluster import KMeans  # noqa: PLC0415 - optional, only for this initialiser

        seed = int(jax.random.randint(key, (), 0, 2**31 - 1))
        Z = KMeans(num_inducing, n_init=3, random_state=seed).fit(X).cluster_centers_
    else:
        raise InvalidArgumentError("inducing_init", f"unknown method {method!r}; use 'random' or 'kmeans'")
    return InducingPoints(jnp.asarray(Z, dtype=X.dtype))


# ----------------------------------------------------------------------------- inducing patches
@pytree_dataclass
class InducingPatches(InducingVariables):
    """u = g(Z): the patch-response function at inducing patches ``Z`` ``[M, E]`` (van der Wilk et al. 2017, §3.1).

    Inter-domain: Z lives in patch space, not image space. Kuu = k_g(Z, Z) (eq. 16) and
    Kuf = Σ_p w_p k_g(x^[p], Z) (eq. 15, 19) come from the kernel's ``Kzz`` / ``Kzx``; the
    multi-channel kernel gives C output groups for one set of patches (eq. 22–23, App. C).
    """

    Z: Any = hyper(constraint=constraints.real)

    @property
    def num_inducing(self) -> int:
        return int(np.shape(self.Z.value if hasattr(self.Z, "value") else self.Z)[0])


@Kuu.register(InducingPatches, ConvolutionalKernel)
def _kuu_patches(inducing, kernel):
    return kernel.Kzz(inducing.Z)  # [G, M, M]


@Kuf.register(InducingPatches, ConvolutionalKernel, object)
def _kuf_patches(inducing, kernel, X):
    return kernel.Kzx(inducing.Z, X)  # [G, M, N]


def _refuse_other_kernels(inducing_type: type, message: str) -> None:
    """Register Kuu/Kuf of (``inducing_type``, any other kernel) as a typed error: ``message``, got <kernel>."""

    def refuse(inducing, kernel, *X):
        raise InvalidArgumentError("inducing", f"{message}, got {type(kernel).__name__}")

    Kuu.register(inducing_type, Kernel)(refuse)
    Kuf.register(inducing_type, Kernel, object)(refuse)


_refuse_other_kernels(InducingPatches, "inducing patches need a convolutional kernel")


#: Distinct training patches collected before "random"/"kmeans" stop scanning more images.
PATCH_POOL_SIZE = 20_000


def _unique_rows(rows: np.ndarray) -> np.ndarray:
    """``np.unique(rows, axis=0)``, faster: exact duplicates are dropped first by comparing each row's
    bytes (one sort of fixed-size byte strings), then the few distinct rows are sorted as numbers
    (which also merges -0.0 with 0.0). The same rows in the same order."""
    rows = np.ascontiguousarray(rows)
    if rows.ndim != 2 or rows.shape[0] == 0 or rows.shape[1] == 0:
        return np.unique(rows, axis=0)
    as_bytes = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    first = np.unique(as_bytes, return_index=True)[1]
    return np.unique(rows[np.sort(first)], axis=0)


def _distinct_patches(kernel: ConvolutionalKernel, X: np.ndarray, rng: np.random.Generator, enough: int) -> np.ndarray:
    """Distinct patches ``[K, E]`` of images taken in random order, until ``enough`` are found or X ends."""
    pool = np.zeros((0, kernel.patch_dim), X.dtype)  # [K, E]
    for chunk in np.array_split(rng.permutation(X.shape[0]), max(1, X.shape[0] // 128)):
        patches = np.asarray(kernel.inducing_space_patches(X[chunk]))  # [n*S*P, E]
        pool = _unique_rows(np.concatenate([pool, _unique_rows(patches)]))  # [K, E]
        if pool.shape[0] >= enough:
            break
    return pool


@register_initialiser("patches")
def _init_patches(kernel, X, num_inducing, key, method):
    """Inducing patches from data: ``"random"`` distinct training patches, ``"kmeans"`` centres of
    distinct training patches (sklearn), or ``"uniform"`` noise over the pixel range (van der Wilk et al. 2017, §3.1)."""
    if not isinstance(kernel, ConvolutionalKernel):
        raise InvalidArgumentError("inducing", f"'patches' needs a convolutional kernel, got {type(kernel).__name__}")
    X = np.asarray(X)
    kernel.validate_inputs(X)
    rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 2**31 - 1)))
    if method == "uniform":
        Z = rng.uniform(X.min(), X.max(), (num_inducing, kernel.patch_dim))  # [M, E]
    elif method in ("random", "kmeans"):
        pool = _distinct_patches(kernel, X, rng, max(PATCH_POOL_SIZE, num_inducing))  # [K, E]
        if num_inducing > pool.shape[0]:
            raise InvalidArgumentError(
                "num_inducing", f"M={num_inducing} exceeds the {pool.shape[0]} distinct training patches of shape {kernel.patch_shape}"
            )
        if method == "random":
            Z = pool[rng.choice(pool.shape[0], num_inducing, replace=False)]  # [M, E]
        else:
            from sklearn.cluster import KMeans  # noqa: PLC0415 - optional, only for this initialiser

            Z = KMeans(num_inducing, n_init=3, random_state=int(rng.integers(2**31 - 1))).fit(pool).cluster_centers_  # [M, E]
    else:
        raise InvalidArgumentError("inducing_init", f"unknown method {method!r}; use 'random', 'kmeans' or 'uniform'")
    return InducingPatches(jnp.asarray(Z, dtype=jax.dtypes.canonicalize_dtype(X.dtype)))


# ----------------------------------------------------------------------------- invariant kernels: inducing points of the base function
@pytree_dataclass
class BaseInducingPoints(InducingPoints):
    """u = g(Z): the *base* function at inducing inputs ``Z`` ``[M, D]`` of an invariant kernel
    (van der Wilk et al. 2018, eq. 13; van der Wilk et al. 2017, eq. D.31–D.32)."""


@Kuu.register(BaseInducingPoints, InvariantKernel)
def _kuu_base(inducing, kernel):
    return kernel.base_kernel.K(inducing.Z)[None]  # [1, M, M]  k_g(Z, Z)


@Kuf.register(BaseInducingPoints, InvariantKernel, object)
def _kuf_base(inducing, kernel, X):
    if kernel.is_sampled:
        raise InvalidArgumentError(
            "kernel", "Kuf of a sampled invariant kernel is only estimated; use method='invariant-svgp' (van der Wilk et al. 2018, eq. 16–17)")
    return kernel.K_fu(X, inducing.Z)[None]  # [1, M, N]


@register_initialiser("invariant-points")
def _init_base_points(kernel, X, num_inducing, key, method):
    """Z from training inputs (random or k-means), as for ordinary points: they lie in g's input space too."""
    return BaseInducingPoints(initialise_inducing("points", kernel, X, num_inducing, key, method).Z)


# ----------------------------------------------------------------------------- TICK: inducing patches with locations
# u_m = g(z_m, z_loc,m): the patch-response function at an inducing patch Z [M, E] placed at an inducing
# location Z_loc [M, 2] (row, col in the [0, 1]² convention of gpzoo.models.kernels.tick.patch_locations);
# Kuu = k_patch(Z, Z) ∘ k_loc(Z_loc, Z_loc) and Kuf = Σ_p w_p k_patch(z, x^[p]) k_loc(z_loc, ℓ(p))
# (Dutordoir et al. 2020, §3.2, §4.2). The initialiser "patch-locations" draws distinct training patches
# and the location each came from, so an inducing point starts with k_loc(z_loc, ℓ(p)) = 1 for its patch p.
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


_refuse_other_kernels(InducingPatchesWithLocations, "inducing patches with locations need a TICK kernel")


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
    dtype = jax.dtypes.canonicalize_dtype(X.dtype)  # a float64 X in float32 mode gives float32 patches, silently
    return InducingPatchesWithLocations(jnp.asarray(Z, dtype=dtype), jnp.asarray(Z_loc, dtype=dtype))


# ----------------------------------------------------------------------------- user-given inducing variables
def check_inducing(inducing, kernel: Kernel, X) -> None:
    """Eager checks of user-given inducing variables against ``kernel`` and the inputs ``X`` ``[N, D]``:
    their type, one set per summand for separate sets, and the width of ``Z`` (D for points, the
    kernel's patch size E for patches); typed errors naming ``inducing``."""
    if not isinstance(inducing, InducingVariables):
        raise InvalidArgumentError("inducing", f"expected inducing variables (e.g. InducingPoints(Z)), got {type(inducing).__name__}")
    own_check = getattr(inducing, "check_against", None)  # containers of per-layer sets (gpzoo.inference.deep_conv)
    if own_check is not None:
        own_check(kernel, X)
        return
    if isinstance(inducing, SeparateInducing):
        if not isinstance(kernel, Sum):
            raise InvalidArgumentError("inducing", f"separate inducing sets need a sum kernel, got {type(kernel).__name__}")
        _check_parts(inducing, kernel)
        for part, summand in zip(inducing.parts, kernel.kernels):
            check_inducing(part, summand, X)
        return
    patches = isinstance(inducing, (InducingPatches, InducingPatchesWithLocations))
    if patches and not isinstance(kernel, ConvolutionalKernel):
        raise InvalidArgumentError("inducing", f"inducing patches need a convolutional kernel, got {type(kernel).__name__}")
    Z = inducing.Z.value if isinstance(inducing.Z, Fixed) else inducing.Z
    if isinstance(Z, Distribution):
        return
    Z = as_float_array(Z, "inducing", ndim=2)  # [M, width]
    width, what = (kernel.patch_dim, f"patches of {kernel.patch_dim} values") if patches else (np.shape(X)[1], f"{np.shape(X)[1]} input columns")
    if Z.shape[0] < 1 or Z.shape[1] != width:
        raise ShapeError("inducing", f"inducing inputs Z have shape {Z.shape}; the kernel's inputs are {what}, so Z must be [M >= 1, {width}]")


def inducing_for(spec, X, key, given=None) -> InducingVariables:
    """The inducing variables a fit starts from: ``given`` (checked by :func:`check_inducing`) or the
    spec's own kind, number and initialisation on the training inputs ``X`` ``[N, D]``."""
    if given is not None:
        check_inducing(given, spec.covariance_model, X)
        return given
    return initialise_inducing(spec.inducing, spec.covariance_model, X, spec.num_inducing, key, spec.inducing_init)
