"""Invariant kernels built from orbits and augmentation distributions (van der Wilk et al. 2018, §4, App. B; van der Wilk et al. 2017, App. D).

f(x) = Σ_{x_a ∈ A(x)} g(x_a) with g ~ GP(0, k_g) has the double-sum kernel (van der Wilk et al. 2018, eq. 7)
k_f(x, x') = Σ_a Σ_a' k_g(x_a, x'_a); an augmentation density p(x_a|x) gives the double
integral k_f(x, x') = ∬ p(x_a|x) p(x'_a|x') k_g(x_a, x'_a) (eq. 8). :class:`InvariantKernel`
takes the base kernel k_g and an *orbit object* (injected, not subclassed) that says how A(x) or
p(x_a|x) is sampled and how the samples are weighted:

* :class:`FiniteOrbit` — a finite group from :mod:`gpzoo.models.kernels.symmetry`; the whole orbit
  (exact, eq. 7), a subset drawn without replacement (App. B.1, eq. 8/12), or uniform draws
  with replacement (the normalised double integral over the orbit, eq. 21);
* :class:`RotationAugmentation`, :class:`AffineAugmentation` (6 free parameters),
  :class:`InterpretableAffineAugmentation` (rotation, log-scales, shear, translation) and
  :class:`LocalDeformation` — image transforms x_a = T_φ(x), φ ~ Uniform(φ_min, φ_max), whose
  range parameters are trained by reparameterisation through bilinear interpolation (§5).

Every orbit object draws ``num_samples`` transformations per call and applies the *same* ones
to every row of the minibatch (as van der Wilk et al. 2018's implementation does): the estimators stay unbiased
per datum, and the samples of different data are simply correlated.

Unbiased estimators (weights of :meth:`Orbit.pair_weights` / :meth:`Orbit.single_weight`), with
S samples x^(1..S) of one datum and r any pair function (k_g, or products of k_g(·, z)):

    Σ_a Σ_a' r  ≈  w_off Σ_{s≠s'} r(x^(s), x^(s')) + w_diag Σ_s r(x^(s), x^(s))
    Σ_a r(x_a)  ≈  w_single Σ_s r(x^(s))

exact orbit: (1, 1), 1; subset of S out of G without replacement (App. B eq. 8):
(G(G−1)/(S(S−1)), G/S), G/S; density or with-replacement draws (eq. 21 / App. B eq. 15):
(1/(S(S−1)), 0), 1/S.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.ndimage import map_coordinates
from numpyro.distributions import constraints

from gpzoo.models import draws
from gpzoo.models.errors import (
    HyperparameterError,
    InvalidArgumentError,
    ShapeError,
    as_float_array,
    as_int_pair,
    warn_unit_range,
)
from gpzoo.models.kernels.base import Kernel, hyper, kernel_class, static
from gpzoo.models.kernels.symmetry import FiniteGroup, PermutationGroup
from gpzoo.models.parameters import Parameterised, pytree_dataclass

__all__ = [
    "AffineAugmentation",
    "FiniteOrbit",
    "ImageAugmentation",
    "InterpretableAffineAugmentation",
    "InvariantKernel",
    "LocalDeformation",
    "Orbit",
    "OrbitSum",
    "RotationAugmentation",
    "pair_sum",
    "warp_images",
]


# ===================================================================================== estimators
def pair_sum(values, w_off: float, w_diag: float):
    """Σ_{s,s'} w_{ss'} ⟨v_s, v_s'⟩ for ``values`` ``[S, N, K]`` -> ``[N]`` (van der Wilk et al. 2018, App. B eq. 12, 15).

    w_{ss'} = w_off off the diagonal and w_diag on it. O(S·K) per datum: the double sum of an
    inner product factorises (App. B.2.1): Σ_{s≠s'} ⟨v_s, v_s'⟩ = ‖Σ_s v_s‖² − Σ_s ‖v_s‖².
    """
    total = jnp.sum(values, axis=0)  # [N, K]
    diagonal = jnp.sum(values**2, axis=(0, 2))  # [N]
    return w_off * (jnp.sum(total**2, axis=-1) - diagonal) + w_diag * diagonal  # [N]


# ===================================================================================== orbits
@dataclasses.dataclass(frozen=True, eq=False)
class Orbit(Parameterised):
    """How A(x) or p(x_a|x) is sampled: ``sample(X, key)`` ``[S, N, D]`` and the estimator weights."""

    @property
    def sample_size(self) -> int:  # pragma: no cover - abstract
        """S, the number of samples per datum that ``sample`` returns."""
        raise NotImplementedError

    @property
    def is_exact(self) -> bool:
        """True when ``sample`` returns the whole (finite) orbit: every estimate is then exact."""
        return False

    def pair_weights(self) -> tuple[float, float]:  # pragma: no cover - abstract
        """(w_off, w_diag) of the double-sum / double-integral estimator (module docstring)."""
        raise NotImplementedError

    def single_weight(self) -> float:  # pragma: no cover - abstract
        """w_single of the single-sum / single-integral estimator of k_fu (van der Wilk et al. 2018, eq. 17)."""
        raise NotImplementedError

    def sample(self, X, key):  # pragma: no cover - abstract
        """``[S, N, D]`` samples x^(s) of A(x_n) / p(x_a|x_n) for ``X`` ``[N, D]``."""
        raise NotImplementedError

    def validate_inputs(self, X) -> None:
        """Raise a typed error (before tracing) when ``X`` cannot be transformed."""


@pytree_dataclass
class FiniteOrbit(Orbit):
    """The orbit of a finite group G (van der Wilk et al. 2018, eq. 6–7; van der Wilk et al. 2017, eq. D.29–D.31).

    ``num_samples=None`` (or ≥ |G| without replacement): the whole orbit, exact double sum.
    ``num_samples=S < |G|``: S distinct elements drawn without replacement, App. B.1 estimator
    (unbiased for the double *sum*). ``replace=True``: S uniform draws with replacement, which
    estimate the normalised double integral over the orbit, (1/|G|²) Σ Σ k_g (eq. 8 with p(x_a|x)
    uniform on A(x); eq. 21 estimator). The same group elements are used for every datum.
    """

    group: FiniteGroup = static()
    num_samples: int | None = static(None)
    replace: bool = static(False)
    average: bool = static(False)

    def __post_init__(self):
        if not isinstance(self.group, FiniteGroup):
            raise HyperparameterError("FiniteOrbit.group", f"must be a FiniteGroup, got {type(self.group).__name__}")
        if self.num_samples is not None and (int(self.num_samples) < 2):
            raise HyperparameterError("FiniteOrbit.num_samples", f"the pair estimator needs >= 2 samples, got {self.num_samples}")
        super().__post_init__()

    @property
    def is_exact(self) -> bool:
        return not self.replace and (self.num_samples is None or self.num_samples >= self.group.order)

    @property
    def sample_size(self) -> int:
        return self.group.order if self.is_exact else int(self.num_samples)

    @property
    def normalised(self) -> bool:
        """True when the kernel is the orbit *average* (1/G²) Σ Σ (with-replacement draws estimate it)."""
        return self.replace or self.average

    def pair_weights(self) -> tuple[float, float]:
        G, S = self.group.order, self.sample_size
        if self.is_exact:
            return 1.0, 1.0
        if self.replace:
            return 1.0 / (S * (S - 1)), 0.0
        return G * (G - 1) / (S * (S - 1)), G / S

    def single_weight(self) -> float:
        G, S = self.group.order, self.sample_size
        if self.is_exact:
            return 1.0
        return 1.0 / S if self.replace else G / S

    def validate_inputs(self, X) -> None:
        self.group.check_inputs(X)

    def full_orbit(self, X):
        """Every group element applied to every row, ``[G, N, D]``."""
        return self.group.orbit(X)  # [G, N, D]

    def sample(self, X, key=None):
        X = jnp.asarray(X)  # [N, D]
        if self.is_exact:
            return self.full_orbit(X)  # [G, N, D]
        G, S = self.group.order, self.sample_size
        if self.replace:
            index = jax.random.randint(key, (S,), 0, G)  # [S]
        else:
            index = jax.random.permutation(key, G)[:S]  # [S]
        if isinstance(self.group, PermutationGroup):
            self.group.check_inputs(X)
            columns = jnp.asarray(self.group.permutations())[index]  # [S, D]
            return jnp.moveaxis(X[:, columns], 1, 0)  # [S, N, D]
        return self.full_orbit(X)[index]  # [S, N, D]


# ===================================================================================== image transforms
def _image_grid(image_shape, dtype):
    """Cartesian coordinates (right, up) of every pixel about the image centre, ``[2, H, W]``."""
    height, width = image_shape
    rows, cols = jnp.meshgrid(jnp.arange(height, dtype=dtype), jnp.arange(width, dtype=dtype), indexing="ij")  # [H, W]
    return jnp.stack([cols - (width - 1) / 2.0, (height - 1) / 2.0 - rows])  # [2, H, W]


def _to_pixel_coordinates(source, image_shape):
    """Cartesian (right, up) ``[S, 2, H, W]`` -> (row, col) coordinates for ``map_coordinates``."""
    height, width = image_shape
    return jnp.stack([(height - 1) / 2.0 - source[:, 1], source[:, 0] + (width - 1) / 2.0], axis=1)  # [S, 2, H, W]


def warp_images(X, source, image_shape):
    """Bilinear resampling: output pixel p of sample s shows the input at ``source[s, :, p]``.

    ``X`` ``[N, H*W]`` (grey images, flattened row-major), ``source`` ``[S, 2, H, W]`` Cartesian
    (right, up) coordinates about the centre; returns ``[S, N, H*W]``. Zero outside the image.
    ``jax.scipy.ndimage.map_coordinates`` with ``order=1`` is differentiable in the coordinates,
    so gradients reach the transformation parameters (reparameterisation, van der Wilk et al. 2018, §5).
    """
    images = X.reshape((-1,) + tuple(image_shape))  # [N, H, W]
    coords = _to_pixel_coordinates(source, image_shape)  # [S, 2, H, W]

    def one(image, grid):  # [H, W], [2, H, W] -> [H, W]
        return map_coordinates(image, [grid[0], grid[1]], order=1, mode="constant", cval=0.0)

    out = jax.vmap(lambda grid: jax.vmap(lambda image: one(image, grid))(images))(coords)  # [S, N, H, W]
    return out.reshape(coords.shape[0], images.shape[0], -1)  # [S, N, H*W]


def _uniform(key, lower, upper, num_samples):
    """φ = φ_min + (φ_max − φ_min) u, u ~ U(0, 1): reparameterised draws ``[S, P]``."""
    lower, upper = jnp.asarray(lower), jnp.asarray(upper)  # [P]
    u = draws.uniform(key, (num_samples,) + lower.shape, dtype=jnp.result_type(lower, upper, float))  # [S, P]
    return lower + (upper - lower) * u  # [S, P]


def _rotation(theta):
    """2×2 rotation matrices ``[S, 2, 2]`` for angles ``theta`` ``[S]`` (radians, anticlockwise)."""
    c, s = jnp.cos(theta), jnp.sin(theta)  # [S]
    return jnp.stack([jnp.stack([c, -s], -1), jnp.stack([s, c], -1)], -2)  # [S, 2, 2]


def _apply_affine(matrix, shift, grid):
    """source = matrix · p + shift for every pixel p: ``[S, 2, 2]``, ``[S, 2]``, ``[2, H, W]`` -> ``[S, 2, H, W]``."""
    return jnp.einsum("sij,jhw->sihw", matrix, grid) + shift[:, :, None, None]  # [S, 2, H, W]


def _check_image_shape(image_shape) -> tuple[int, int]:
    return as_int_pair(image_shape, "image_shape", 2, "grey images (H, W) with H, W >= 2 for image augmentations")


@dataclasses.dataclass(frozen=True, eq=False)
class ImageAugmentation(Orbit):
    """A distribution p(x_a|x) of transformed images (double integral, van der Wilk et al. 2018, eq. 8).

    Subclasses give ``source_grid(key, dtype)`` ``[S, 2, H, W]``: where each output pixel samples
    the input, one grid per sample, shared by the minibatch. Estimator weights: eq. 21.
    """

    def __post_init__(self):
        object.__setattr__(self, "image_shape", _check_image_shape(self.image_shape))
        if int(self.num_samples) < 2:
            raise HyperparameterError(f"{type(self).__name__}.num_samples", f"the eq. 21 estimator needs >= 2 samples, got {self.num_samples}")
        super().__post_init__()

    @property
    def sample_size(self) -> int:
        return int(self.num_samples)

    def pair_weights(self) -> tuple[float, float]:
        S = self.sample_size
        return 1.0 / (S * (S - 1)), 0.0

    def single_weight(self) -> float:
        return 1.0 / self.sample_size

    def validate_inputs(self, X) -> None:
        if np.ndim(X) != 2 or np.shape(X)[1] != math.prod(self.image_shape):
            raise ShapeError("X", f"expected [N, {math.prod(self.image_shape)}] images of shape {self.image_shape}, got {np.shape(X)}")
        # the warp fills with 0 outside the frame: a background other than 0 becomes an edge
        warn_unit_range(as_float_array(X, "X", ndim=2), f"{type(self).__name__} resamples images filling 0 outside the "
                                                         "frame, so pixel values are expected in [0, 1] on a background of 0")

    def sample(self, X, key):
        X = jnp.asarray(X)  # [N, H*W]
        source = self.resolved().source_grid(key, X.dtype)  # [S, 2, H, W]
        return warp_images(X, source, self.image_shape)  # [S, N, H*W]

    def source_grid(self, key, dtype):  # pragma: no cover - abstract
        raise NotImplementedError


#: Largest rotation range (degrees) an augmentation accepts at construction: U(−360°, 360°) already covers every angle.
MAX_ANGLE_DEGREES = 360.0
#: Largest log-scale range accepted at construction (e^10 ≈ 2·10⁴: the image shrinks below one pixel long before).
MAX_LOG_SCALE = 10.0


@pytree_dataclass
class RotationAugmentation(ImageAugmentation):
    """x_a = x rotated by φ ~ Uniform(−α, α) degrees, α = ``max_angle`` learned (van der Wilk et al. 2018, §5.1).

    Positive angles turn the picture anticlockwise as displayed, so 90° equals ``np.rot90``
    (same convention as :func:`gpzoo.analysis.datasets.rotate_images`).
    """

    image_shape: tuple[int, int] = static()
    max_angle: Any = hyper(45.0, maximum=MAX_ANGLE_DEGREES)
    num_samples: int = static(8)

    def source_grid(self, key, dtype):
        u = draws.uniform(key, (self.num_samples,), dtype=dtype)  # [S]
        angle = self.max_angle * (2.0 * u - 1.0)  # [S] degrees
        matrix = _rotation(-jnp.deg2rad(angle))  # [S, 2, 2]: output p shows the input at R(−φ) p
        return _apply_affine(matrix, jnp.zeros((self.num_samples, 2), dtype), _image_grid(self.image_shape, dtype))  # [S, 2, H, W]


@dataclasses.dataclass(frozen=True, eq=False)
class _UniformRangeAugmentation(ImageAugmentation):
    """φ ~ Uniform(``lower``, ``upper``) over six transform parameters, both bounds unconstrained and
    trained (van der Wilk et al. 2018, §5); subclasses map a batch of φ to sampling grids with ``grid_from``."""

    image_shape: tuple[int, int] = static()
    lower: Any = hyper((0.0,) * 6, constraint=constraints.real)
    upper: Any = hyper((0.0,) * 6, constraint=constraints.real)
    num_samples: int = static(8)

    def source_grid(self, key, dtype):
        phi = _uniform(key, self.lower, self.upper, self.num_samples).astype(dtype)  # [S, 6]
        return self.grid_from(phi, dtype)  # [S, 2, H, W]

    def grid_from(self, phi, dtype):  # pragma: no cover - abstract
        raise NotImplementedError


@pytree_dataclass
class AffineAugmentation(_UniformRangeAugmentation):
    """General 2-D affine augmentation with 6 free parameters (van der Wilk et al. 2018, §5 "Affine transformations").

    φ = (a11, a12, a21, a22, t_right, t_up) ~ Uniform(``lower``, ``upper``); the output pixel at
    Cartesian p (pixels about the centre) samples the input at (I + [[a11, a12], [a21, a22]]) p + t
    (the sampling-grid parameterisation of spatial transformer networks, van der Wilk et al. 2018, footnote 3),
    so zero ranges give the identity. ``lower``/``upper`` are unconstrained and both trained.
    """

    def grid_from(self, phi, dtype):
        matrix = jnp.eye(2, dtype=dtype) + phi[:, :4].reshape(-1, 2, 2)  # [S, 2, 2]
        return _apply_affine(matrix, phi[:, 4:], _image_grid(self.image_shape, dtype))  # [S, 2, H, W]


#: Parameter order of :class:`InterpretableAffineAugmentation`.
INTERPRETABLE_PARAMETERS = ("angle_deg", "log_scale_x", "log_scale_y", "shear", "shift_right", "shift_up")


@pytree_dataclass
class InterpretableAffineAugmentation(_UniformRangeAugmentation):
    """Affine augmentation in interpretable coordinates (van der Wilk et al. 2018, §5): φ ~ Uniform(lower, upper) with
    φ = (angle° anticlockwise, log scale x, log scale y, shear, shift right, shift up in pixels).

    Forward map F = R(angle) · [[1, shear], [0, 1]] · diag(e^{sx}, e^{sy}); the output pixel p
    samples the input at F⁻¹ (p − shift). Zero ranges give the identity; a pure rotation by 90°
    equals ``np.rot90``.
    """

    def grid_from(self, phi, dtype):
        return _interpretable_grid(phi, self.image_shape, dtype)  # [S, 2, H, W]


def _interpretable_grid(phi, image_shape, dtype):
    """Source grid F⁻¹(p − t) for interpretable parameters ``phi`` ``[S, 6]`` -> ``[S, 2, H, W]``."""
    angle, scale_x, scale_y, shear, shift = jnp.deg2rad(phi[:, 0]), phi[:, 1], phi[:, 2], phi[:, 3], phi[:, 4:]  # [S] x4, [S, 2]
    zeros, ones = jnp.zeros_like(shear), jnp.ones_like(shear)  # [S]
    inv_scale = jnp.stack([jnp.stack([jnp.exp(-scale_x), zeros], -1), jnp.stack([zeros, jnp.exp(-scale_y)], -1)], -2)  # [S, 2, 2]
    inv_shear = jnp.stack([jnp.stack([ones, -shear], -1), jnp.stack([zeros, ones], -1)], -2)  # [S, 2, 2]
    matrix = inv_scale @ inv_shear @ _rotation(-angle)  # [S, 2, 2]  F⁻¹
    shift_back = -jnp.einsum("sij,sj->si", matrix, shift)  # [S, 2]  −F⁻¹ t
    return _apply_affine(matrix, shift_back, _image_grid(image_shape, dtype))  # [S, 2, H, W]


def _gaussian_smoother(size: int, width: float, dtype):
    """Row-normalised Gaussian smoothing matrix ``[size, size]`` (std ``width`` pixels)."""
    offsets = jnp.arange(size, dtype=dtype)  # [size]
    weights = jnp.exp(-0.5 * ((offsets[:, None] - offsets[None, :]) / width) ** 2)  # [size, size]
    return weights / jnp.sum(weights, axis=1, keepdims=True)  # [size, size]


@pytree_dataclass
class LocalDeformation(ImageAugmentation):
    """Local elastic deformations plus a small random affine map (van der Wilk et al. 2018, §5 "Local deformations").

    A simplified, documented version of the infiMNIST deformations (Loosli et al. 2007): white
    noise on the pixel grid per displacement component is smoothed by a Gaussian of
    ``smoothness`` pixels (fixed), scaled to unit standard deviation and multiplied by the learned
    ``displacement`` (pixels); on top of it an affine map with rotation ~ U(−``max_angle``,
    ``max_angle``)°, log-scales ~ U(−``max_log_scale``, ``max_log_scale``) and shear ~
    U(−``max_shear``, ``max_shear``), all learned. infiMNIST's thickening and its *spatially
    varying* local affine fields are not modelled.
    """

    image_shape: tuple[int, int] = static()
    displacement: Any = hyper(1.0)
    max_angle: Any = hyper(10.0, maximum=MAX_ANGLE_DEGREES)
    max_log_scale: Any = hyper(0.1, maximum=MAX_LOG_SCALE)
    max_shear: Any = hyper(0.1)
    smoothness: float = static(3.0)
    num_samples: int = static(8)

    def source_grid(self, key, dtype):
        key_field, key_affine = jax.random.split(key)
        S, (H, W) = self.num_samples, self.image_shape
        noise = draws.normal(key_field, (S, 2, H, W), dtype)  # [S, 2, H, W]
        field = jnp.einsum("hk,sckl,wl->schw", _gaussian_smoother(H, self.smoothness, dtype), noise,
                           _gaussian_smoother(W, self.smoothness, dtype))  # [S, 2, H, W]
        field = field / jnp.sqrt(jnp.mean(field**2, axis=(2, 3), keepdims=True) + 1e-12)  # [S, 2, H, W] unit RMS
        u = 2.0 * draws.uniform(key_affine, (S, 4), dtype) - 1.0  # [S, 4] in (−1, 1)
        zeros = jnp.zeros((S,), dtype)  # [S]
        phi = jnp.stack([self.max_angle * u[:, 0], self.max_log_scale * u[:, 1], self.max_log_scale * u[:, 2],
                         self.max_shear * u[:, 3], zeros, zeros], axis=-1)  # [S, 6]
        return _interpretable_grid(phi, self.image_shape, dtype) + self.displacement * field  # [S, 2, H, W]


# ===================================================================================== kernel
@kernel_class
class InvariantKernel(Kernel):
    """k_f from a base kernel k_g and an injected orbit (van der Wilk et al. 2018, eq. 7 / eq. 8, van der Wilk et al. 2017, eq. D.29).

    Exact finite orbits: ``K``/``K_diag`` are the double sum (or, with ``replace=True``, the
    orbit average (1/G²) Σ Σ), evaluated in closed form for *any* ``FiniteOrbit`` (also the
    sub-sampled ones, whose exact kernel is still known). Augmentation densities have no closed
    form: ``K`` raises and the model uses the unbiased estimators (``inference.invariant``).
    """

    base_kernel: Kernel
    orbit: Orbit

    def __post_init__(self):
        if not isinstance(self.base_kernel, Kernel):
            raise HyperparameterError("InvariantKernel.base_kernel", f"must be a Kernel, got {type(self.base_kernel).__name__}")
        if not isinstance(self.orbit, Orbit):
            raise HyperparameterError("InvariantKernel.orbit", f"must be an Orbit, got {type(self.orbit).__name__}")
        super().__post_init__()

    @property
    def has_closed_form(self) -> bool:
        return isinstance(self.orbit, FiniteOrbit)

    @property
    def is_sampled(self) -> bool:
        """True when training needs the sampled estimators (not the whole finite orbit)."""
        return not self.orbit.is_exact

    def validate_inputs(self, X) -> None:
        self.orbit.validate_inputs(np.asarray(X))

    # ------------------------------------------------------------------ closed form (finite groups)
    def _closed_form_orbit(self, X):
        if not self.has_closed_form:
            raise InvalidArgumentError(
                "kernel", f"{type(self.orbit).__name__} defines a double-integral kernel (van der Wilk et al. 2018, eq. 8) with no closed "
                "form; fit it with method='invariant-svgp', which uses the unbiased estimators of eq. 16–21")
        return self.orbit.full_orbit(X)  # [G, N, D]

    def _scale(self):
        return 1.0 / self.orbit.group.order**2 if self.orbit.normalised else 1.0

    def _K(self, X, Y):
        orbit_x = self._closed_form_orbit(X)  # [G, N, D]
        orbit_y = self._closed_form_orbit(Y)  # [G, M, D]
        G, N, D = orbit_x.shape
        K = self.base_kernel.K(orbit_x.reshape(G * N, D), orbit_y.reshape(-1, D))  # [G*N, G*M]
        return self._scale() * K.reshape(G, N, G, -1).sum(axis=(0, 2))  # [N, M]

    def _K_diag(self, X):
        orbit_x = self._closed_form_orbit(X)  # [G, N, D]
        blocks = jax.vmap(self.base_kernel.K, in_axes=1)(orbit_x)  # [N, G, G]
        return self._scale() * blocks.sum(axis=(1, 2))  # [N]

    def K_fu(self, X, Z):
        """Closed-form k_fu(x_n, z_m) = Σ_a k_g(x_a, z_m) (van der Wilk et al. 2018, eq. 13), ``[M, N]``."""
        orbit_x = self._closed_form_orbit(X)  # [G, N, D]
        G, N, D = orbit_x.shape
        K = self.base_kernel.K(Z, orbit_x.reshape(G * N, D)).reshape(-1, G, N)  # [M, G, N]
        scale = 1.0 / G if self.orbit.normalised else 1.0
        return scale * K.sum(axis=1)  # [M, N]

    # ------------------------------------------------------------------ sampled pieces (van der Wilk et al. 2018, eq. 16–21)
    def sample_orbit(self, X, key):
        """``[S, N, D]`` orbit / augmentation samples of every row of ``X`` (shared across rows)."""
        return self.orbit.sample(X, key)

    def Kzx_samples(self, Z, samples):
        """k_g(z_m, x_n^(s)) for every sample: ``Z`` ``[M, D]``, samples ``[S, N, D]`` -> ``[S, M, N]``."""
        S, N, D = samples.shape
        K = self.base_kernel.K(Z, samples.reshape(S * N, D))  # [M, S*N]
        return jnp.moveaxis(K.reshape(-1, S, N), 1, 0)  # [S, M, N]

    def Kff_diag_estimate(self, samples):
        """Unbiased k_f(x_n, x_n) from one set of samples ``[S, N, D]`` -> ``[N]`` (eq. 21 / App. B eq. 12)."""
        w_off, w_diag = self.orbit.pair_weights()
        blocks = jax.vmap(self.base_kernel.K, in_axes=1)(samples)  # [N, S, S]
        diagonal = jnp.trace(blocks, axis1=1, axis2=2)  # [N]
        return w_off * (jnp.sum(blocks, axis=(1, 2)) - diagonal) + w_diag * diagonal  # [N]


def OrbitSum(base_kernel: Kernel, group: FiniteGroup, normalise: bool = False) -> InvariantKernel:  # noqa: N802 - a kernel constructor
    """k(x, y) = c Σ_g Σ_g' k_base(g x, g' y), the sum over orbits (Duvenaud 2014, eq. 1.35; van der Wilk et al. 2017, eq. D.29).

    The prior of f(x) = Σ_g f_base(g x) (van der Wilk et al. 2017, eq. D.30); c = 1, or 1/G² when
    ``normalise`` (the prior of the orbit *average*). An :class:`InvariantKernel` over the whole
    :class:`FiniteOrbit` of ``group``; costs G² base-kernel evaluations per pair of inputs.
    """
    if not isinstance(base_kernel, Kernel):
        raise HyperparameterError("OrbitSum.base_kernel", f"must be a Kernel, got {type(base_kernel).__name__}")
    if not isinstance(group, FiniteGroup):
        raise HyperparameterError("OrbitSum.group", f"must be a FiniteGroup, got {type(group).__name__}")
    return InvariantKernel(base_kernel, FiniteOrbit(group, average=bool(normalise)))
