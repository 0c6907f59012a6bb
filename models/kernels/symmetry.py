"""Kernels invariant to a finite group of input transformations (Duvenaud 2014, §1.7, van der Wilk et al. 2017, App. D).

A GP sample is invariant, f(x) = f(g x) for all g ∈ G, iff its kernel is argument-wise invariant
(Duvenaud 2014, eq. 1.34, van der Wilk et al. 2017, eq. D.28). Duvenaud 2014, §1.7.1 gives three recipes for building such a
kernel from any base kernel k; each is a kernel here, with the group injected as an object:

* ``OrbitSum``:        Σ_g Σ_g' k(g x, g' y)          (eq. 1.35, van der Wilk et al. 2017, eq. D.29); a
  constructor of :class:`~gpzoo.models.kernels.invariant.InvariantKernel` with the whole orbit,
  the one home of the double sum
* ``OrbitProjection``: k(A_G(x), A_G(y))              (eq. 1.38; A_G maps onto a fundamental domain)
* ``OrbitProduct``:    Π_g Π_g' k(g x, g' y)          (eq. 1.39)

A group (:class:`FiniteGroup`) knows only how it acts on input rows: ``orbit(X)`` ``[G, N, D]``
applies every element, ``canonical(X)`` ``[N, D]`` picks one representative per orbit. The same
objects serve the (sampled-orbit) invariant kernels of van der Wilk et al. 2018.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from gpzoo.models.errors import HyperparameterError, ShapeError
from gpzoo.models.kernels.base import Kernel, kernel_class, static

__all__ = [
    "CyclicShift",
    "FiniteGroup",
    "ImageSymmetries",
    "OrbitProduct",
    "OrbitProjection",
    "PermutationGroup",
    "Reflection",
    "SwapInputs",
]


# ===================================================================================== groups
class FiniteGroup:
    """A finite group G acting on input rows x ∈ R^D (immutable and hashable: a static field).

    Subclasses implement ``order`` and ``_orbit``; ``canonical`` has a generic default.
    Element 0 of every orbit is the identity.
    """

    @property
    def order(self) -> int:  # pragma: no cover - abstract
        """|G|, the number of group elements (and the leading axis of ``orbit``)."""
        raise NotImplementedError

    def check_inputs(self, X) -> None:
        """Raise ``ShapeError`` when ``X`` is not ``[N, D]`` with a D this group can act on."""
        if jnp.ndim(X) != 2:
            raise ShapeError("X", f"{type(self).__name__} acts on [N, D] inputs, got shape {jnp.shape(X)}")

    def orbit(self, X):
        """Every group element applied to every row: ``[G, N, D]`` from ``X`` ``[N, D]``.

        ``orbit(X)[g, n]`` is g(x_n); ``orbit(X)[0] == X`` (identity first). The set of rows
        ``{orbit(X)[g, n] : g}`` is the orbit O_G(x_n) of van der Wilk et al. 2017, App. D.2.
        """
        X = jnp.asarray(X)
        self.check_inputs(X)
        return self._orbit(X)

    def _orbit(self, X):  # pragma: no cover - abstract
        raise NotImplementedError

    def canonical(self, X):
        """A_G(x): one representative of each row's orbit, ``[N, D]`` (Duvenaud 2014, eq. 1.38).

        Default: the lexicographically smallest orbit element, a valid projection onto a
        fundamental domain for every finite group (equal orbits have equal minima). For
        ``SwapInputs`` this is Duvenaud's [min(x1, x2), max(x1, x2)].
        """
        X = jnp.asarray(X)
        self.check_inputs(X)
        return _lexicographic_min(self, X)  # [N, D]


def _keep_smallest(candidates, column):
    """Scan step: keep the ``candidates`` ``[G, N]`` that are smallest in ``column`` ``[G, N]``."""
    best = jnp.min(jnp.where(candidates, column, jnp.inf), axis=0)  # [N]
    return candidates & (column == best[None, :]), None  # [G, N]


@functools.partial(jax.jit, static_argnums=0)
def _lexicographic_min(group: FiniteGroup, X):
    """The lexicographically smallest element of each row's orbit, ``[N, D]``.

    A scan over coordinates narrows the set of orbit elements still tied for the minimum.
    """
    orbit = group.orbit(X)  # [G, N, D]
    candidates = jnp.ones(orbit.shape[:2], bool)  # [G, N]
    candidates, _ = jax.lax.scan(_keep_smallest, candidates, jnp.moveaxis(orbit, 2, 0))  # [G, N]
    index = jax.lax.stop_gradient(jnp.argmax(candidates, axis=0))  # [N]
    return jnp.take_along_axis(orbit, index[None, :, None], axis=0)[0]  # [N, D]


class PermutationGroup(FiniteGroup):
    """A group acting by permuting input columns; subclasses give ``permutations()`` ``[G, D]``.

    Row g of ``permutations()`` is the column order of g(x): g(x) = x[permutations()[g]];
    ``num_features`` is the D it acts on.
    """

    def permutations(self) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def order(self) -> int:
        return self.permutations().shape[0]

    def check_inputs(self, X) -> None:
        super().check_inputs(X)
        if jnp.shape(X)[1] != self.num_features:
            name, shape = type(self).__name__, jnp.shape(X)
            raise ShapeError("X", f"{name} acts on {self.num_features} columns, got shape {shape}")

    def _orbit(self, X):
        return jnp.moveaxis(X[:, self.permutations()], 1, 0)  # [G, N, D]


@dataclasses.dataclass(frozen=True)
class SwapInputs(PermutationGroup):
    """G_swap = {identity, swap of columns ``first`` and ``second``} (Duvenaud 2014, eq. 1.32–1.33)."""

    num_features: int = 2
    first: int = 0
    second: int = 1

    def __post_init__(self):
        in_range = 0 <= self.first < self.num_features and 0 <= self.second < self.num_features
        if not in_range or self.first == self.second:
            raise HyperparameterError(
                "SwapInputs", f"needs two distinct columns in [0, {self.num_features}), got {self.first}, {self.second}"
            )

    def permutations(self) -> np.ndarray:
        identity = np.arange(self.num_features)  # [D]
        swap = identity.copy()  # [D]
        swap[[self.first, self.second]] = [self.second, self.first]
        return np.stack([identity, swap])  # [2, D]


@dataclasses.dataclass(frozen=True)
class CyclicShift(PermutationGroup):
    """All D cyclic shifts of a 1-D signal of length ``num_features`` (Duvenaud 2014, eq. 1.45)."""

    num_features: int

    def __post_init__(self):
        if self.num_features < 1:
            raise HyperparameterError("CyclicShift.num_features", f"must be positive, got {self.num_features}")

    def permutations(self) -> np.ndarray:
        shifts = np.arange(self.num_features)[:, None]  # [G, 1]
        return (shifts + np.arange(self.num_features)[None, :]) % self.num_features  # [G, D]


@dataclasses.dataclass(frozen=True)
class ImageSymmetries(PermutationGroup):
    """90° rotations and/or flips of images stored flattened as rows of length H·W.

    ``rotations`` and ``flips``: the dihedral group D4 (8 elements, square images);
    ``rotations`` only: C4 (4 elements, square images); ``flips`` only: {identity, left-right
    flip, up-down flip, 180° rotation} (4 elements, any H × W). Duvenaud 2014, §1.7.4 (pixel
    permutations of images), van der Wilk et al. 2017, App. D.2.
    """

    image_shape: tuple[int, int]
    rotations: bool = True
    flips: bool = True

    def __post_init__(self):
        object.__setattr__(self, "image_shape", tuple(int(s) for s in self.image_shape))
        if len(self.image_shape) != 2 or min(self.image_shape) < 1:
            raise ShapeError("image_shape", f"must be (H, W) with positive sizes, got {self.image_shape}")
        if self.rotations and self.image_shape[0] != self.image_shape[1]:
            raise ShapeError("image_shape", f"90° rotations need square images, got {self.image_shape}")
        if not (self.rotations or self.flips):
            raise HyperparameterError("ImageSymmetries", "needs rotations, flips or both")

    @property
    def num_features(self) -> int:
        return self.image_shape[0] * self.image_shape[1]

    def permutations(self) -> np.ndarray:
        pixels = np.arange(self.num_features).reshape(self.image_shape)  # [H, W]
        if self.rotations:
            starts = [pixels, np.fliplr(pixels)] if self.flips else [pixels]
            images = [np.rot90(start, k) for start in starts for k in range(4)]
        else:
            images = [pixels, np.fliplr(pixels), np.flipud(pixels), np.rot90(pixels, 2)]
        return np.stack([image.reshape(-1) for image in images])  # [G, H*W]


@dataclasses.dataclass(frozen=True)
class Reflection(FiniteGroup):
    """Reflection about zero, {x, −x} on the columns ``dims`` (all when None) (Duvenaud 2014, eq. 1.42–1.43)."""

    dims: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.dims is not None:
            object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))

    @property
    def order(self) -> int:
        return 2

    def check_inputs(self, X) -> None:
        super().check_inputs(X)
        if self.dims is not None and not all(-jnp.shape(X)[1] <= d < jnp.shape(X)[1] for d in self.dims):
            raise ShapeError("X", f"Reflection.dims={self.dims} needs more columns than shape {jnp.shape(X)}")

    def _signs(self, X):
        """+1 on untouched columns, −1 on reflected ones, ``[D]``."""
        num_features = X.shape[1]
        dims = range(num_features) if self.dims is None else self.dims
        signs = np.ones(num_features)  # [D]
        signs[list(dims)] = -1.0
        return jnp.asarray(signs, X.dtype)  # [D]

    def _orbit(self, X):
        return jnp.stack([X, X * self._signs(X)])  # [2, N, D]

    def canonical(self, X):
        """Flip each row so that its first non-zero reflected coordinate is positive (|x| in 1-D)."""
        X = jnp.asarray(X)
        self.check_inputs(X)
        signs = self._signs(X)  # [D]
        reflected = jnp.where(signs < 0, X, 0.0)  # [N, D]
        first = jnp.argmax(reflected != 0, axis=1)  # [N]
        leading = jnp.take_along_axis(reflected, first[:, None], axis=1)[:, 0]  # [N]
        flip = jnp.where(leading < 0, -1.0, 1.0)  # [N]
        return jnp.where(signs < 0, X * flip[:, None], X)  # [N, D]


# ===================================================================================== kernels
def _check_symmetrised(kernel) -> None:
    name = type(kernel).__name__
    if not isinstance(kernel.base_kernel, Kernel):
        raise HyperparameterError(f"{name}.base_kernel", f"must be a Kernel, got {type(kernel.base_kernel).__name__}")
    if not isinstance(kernel.group, FiniteGroup):
        raise HyperparameterError(f"{name}.group", f"must be a FiniteGroup, got {type(kernel.group).__name__}")


# The two helpers below are jitted (the group is static) so that eager calls, as in a notebook,
# compile once per shape instead of dispatching G²-sized intermediate ops one by one.
@functools.partial(jax.jit, static_argnums=1)
def _orbit_blocks(base_kernel: Kernel, group: FiniteGroup, X, Y):
    """k(g x_n, g' y_m) for all g, g', n, m: ``[G, N, G, M]``."""
    orbit_x = group.orbit(X)  # [G, N, D]
    orbit_y = group.orbit(Y)  # [G, M, D]
    G, N, D = orbit_x.shape
    M = orbit_y.shape[1]
    K = base_kernel.K(orbit_x.reshape(G * N, D), orbit_y.reshape(G * M, D))  # [G*N, G*M]
    return K.reshape(G, N, G, M)  # [G, N, G, M]


@functools.partial(jax.jit, static_argnums=1)
def _per_datum_blocks(base_kernel: Kernel, group: FiniteGroup, X):
    """k(g x_n, g' x_n) for every n: ``[N, G, G]``, batched, never the ``[N, N]`` matrix."""
    orbit_x = group.orbit(X)  # [G, N, D]
    return jax.vmap(base_kernel.K, in_axes=1)(orbit_x)  # [N, G, G]


@kernel_class
class OrbitProjection(Kernel):
    """k(x, y) = k_base(A_G(x), A_G(y)), projection onto a fundamental domain (Duvenaud 2014, eq. 1.38).

    A_G is ``group.canonical``; one base-kernel evaluation per pair, but f has a non-differentiable
    seam where A_G switches representative.
    """

    base_kernel: Kernel
    group: FiniteGroup = static()

    def __post_init__(self):
        _check_symmetrised(self)
        super().__post_init__()

    def _K(self, X, Y):
        return self.base_kernel.K(self.group.canonical(X), self.group.canonical(Y))  # [N, M]

    def _K_diag(self, X):
        return self.base_kernel.K_diag(self.group.canonical(X))  # [N]


@kernel_class
class OrbitProduct(Kernel):
    """k(x, y) = Π_g Π_g' k_base(g x, g' y), the product over orbits (Duvenaud 2014, eq. 1.39).

    Argument-wise invariant by construction, so its samples are G-invariant (eq. 1.34). Unlike
    the sum it is not positive semi-definite for every base kernel; for SE and a group of
    isometries (e.g. permutations) and a scalar lengthscale it equals SE(Σ_g g x, Σ_g g y) · h(x) h(y),
    hence PSD. The prior variance can
    collapse towards zero away from the data (Duvenaud 2014, Fig. 1.10, right).
    """

    base_kernel: Kernel
    group: FiniteGroup = static()

    def __post_init__(self):
        _check_symmetrised(self)
        super().__post_init__()

    def _K(self, X, Y):
        return jnp.prod(_orbit_blocks(self.base_kernel, self.group, X, Y), axis=(0, 2))  # [N, M]

    def _K_diag(self, X):
        return jnp.prod(_per_datum_blocks(self.base_kernel, self.group, X), axis=(1, 2))  # [N]
