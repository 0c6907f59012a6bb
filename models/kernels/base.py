"""Kernel base class, hyperparameter declaration and the kernel algebra (Duvenaud 2014, §1.3–1.4).

A kernel is an immutable pytree (a frozen dataclass registered with JAX) whose hyperparameters
are declared with :func:`gpzoo.models.parameters.hyper` and become NumPyro sites through
:meth:`Kernel.realise` (see :mod:`gpzoo.models.parameters`).

``k1 + k2`` and ``k1 * k2`` build :class:`Sum` / :class:`Product`; ``c * k`` with a number ``c``
scales by a fixed constant, ``k.scaled(v)`` by a trainable variance.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from numbers import Number
from typing import Any

import jax.numpy as jnp
import numpy as np
from numpyro.distributions import Distribution

from gpzoo.models.errors import HyperparameterError, ShapeError
from gpzoo.models.parameters import Fixed, Parameterised, hyper, pytree_dataclass, static

kernel_class = pytree_dataclass

__all__ = [
    "Fixed",
    "Kernel",
    "Product",
    "Scaled",
    "Sum",
    "hyper",
    "kernel_class",
    "static",
]


@dataclasses.dataclass(frozen=True, eq=False)
class Kernel(Parameterised):
    """Base class. Subclasses implement ``_K(X, Y)`` and ``_K_diag(X)`` on active columns.

    ``active_dims`` (keyword, static) selects input columns, as in Duvenaud 2014, §1.4 (additive
    kernels over subsets of inputs). Structured kernels on images override ``K``/``K_diag``.
    """

    active_dims: tuple[int, ...] | None = static(None, kw_only=True)

    def __post_init__(self):
        if self.active_dims is not None:
            object.__setattr__(self, "active_dims", tuple(int(i) for i in self.active_dims))
        super().__post_init__()

    # ----------------------------------------------------------------- covariance
    def K(self, X, Y=None):
        """Covariance matrix ``[N, M]`` between rows of ``X`` ``[N, D]`` and ``Y`` ``[M, D]``."""
        X = self._select(X)
        Y = X if Y is None else self._select(Y)
        return self.resolved()._K(X, Y)

    def K_diag(self, X):
        """Diagonal of ``K(X, X)``, shape ``[N]``, without forming the matrix."""
        return self.resolved()._K_diag(self._select(X))

    def _select(self, X):
        X = jnp.asarray(X)
        if self.active_dims is None:
            return X
        return X[..., jnp.asarray(self.active_dims)]

    def _K(self, X, Y):  # pragma: no cover - abstract
        raise NotImplementedError

    def _K_diag(self, X):  # pragma: no cover - abstract
        raise NotImplementedError

    def validate_inputs(self, X) -> None:
        """Raise a typed error if ``X`` ``[N, D]`` cannot be this kernel's input (before any tracing).

        Checks ``active_dims`` against D (JAX would clamp an index out of range and silently use
        another column) and per-dimension hyperparameters (ARD lengthscales) against the width
        the kernel sees; structured kernels add their own checks, combinators ask their parts.
        """
        width = np.shape(X)[-1]
        if self.active_dims is not None:
            bad = [i for i in self.active_dims if not -width <= i < width]
            if bad:
                raise ShapeError("active_dims", f"{type(self).__name__}.active_dims {list(self.active_dims)} has "
                                                f"{bad} outside the {width} input columns (0..{width - 1})")
            width = len(self.active_dims)
        self._check_dimension_widths(width)
        for child in self._children():
            child.validate_inputs(X if self.active_dims is None else self._select(X))

    def _check_dimension_widths(self, width: int) -> None:
        """Per-dimension hyperparameters (``dimension_fields``) hold 1 or ``width`` values."""
        for name in self.dimension_fields:
            value = getattr(self, name)
            if isinstance(value, Distribution):  # a prior: the shape of its draws
                shape = tuple(value.batch_shape) + tuple(value.event_shape)
            else:
                shape = np.shape(value.value if isinstance(value, Fixed) else value)
            if len(shape) > 1 or (len(shape) == 1 and shape[0] not in (1, width)):
                raise HyperparameterError(f"{type(self).__name__}.{name}", f"has shape {shape}; expected one value or one per "
                                                                          f"input column ({width}) it acts on")

    #: Hyperparameters that may hold one value per input column (ARD); see :meth:`validate_inputs`.
    dimension_fields = ()

    def _children(self) -> tuple["Kernel", ...]:
        """The kernels this one is built from (fields holding a Kernel or a tuple of them)."""
        children = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Kernel):
                children.append(value)
            elif isinstance(value, tuple) and _all_kernels(value):
                children.extend(value)
        return tuple(children)

    # ----------------------------------------------------------------- algebra
    def __add__(self, other):
        if not isinstance(other, Kernel):
            return NotImplemented
        return Sum(_flatten(self, Sum) + _flatten(other, Sum))

    def __mul__(self, other):
        if isinstance(other, Kernel):
            return Product(_flatten(self, Product) + _flatten(other, Product))
        if isinstance(other, Number) or (hasattr(other, "shape") and jnp.ndim(other) == 0):
            return Scaled(self, Fixed(other))
        return NotImplemented

    __rmul__ = __mul__

    def scaled(self, variance=1.0) -> "Scaled":
        """``variance * self`` with a trainable (or sampled, or fixed) ``variance``."""
        return Scaled(self, variance)


def _all_kernels(value) -> bool:
    return len(value) > 0 and all(isinstance(v, Kernel) for v in value)


def _flatten(kernel: Kernel, cls) -> tuple[Kernel, ...]:
    return tuple(kernel.kernels) if isinstance(kernel, cls) and kernel.active_dims is None else (kernel,)


@kernel_class
class Sum(Kernel):
    """``k(x, y) = Σ_i k_i(x, y)`` (Duvenaud 2014, eq. 1.9): superposition of independent functions."""

    kernels: tuple[Kernel, ...]

    def __post_init__(self):
        object.__setattr__(self, "kernels", tuple(self.kernels))
        if not _all_kernels(self.kernels):
            raise HyperparameterError("Sum.kernels", "must be a non-empty sequence of Kernel objects")
        super().__post_init__()

    def _K(self, X, Y):
        return sum(k.K(X, Y) for k in self.kernels)

    def _K_diag(self, X):
        return sum(k.K_diag(X) for k in self.kernels)


@kernel_class
class Product(Kernel):
    """``k(x, y) = Π_i k_i(x, y)`` (Duvenaud 2014, eq. 1.10): an AND of the factors' similarities."""

    kernels: tuple[Kernel, ...]

    def __post_init__(self):
        object.__setattr__(self, "kernels", tuple(self.kernels))
        if not _all_kernels(self.kernels):
            raise HyperparameterError("Product.kernels", "must be a non-empty sequence of Kernel objects")
        super().__post_init__()

    def _K(self, X, Y):
        out = self.kernels[0].K(X, Y)
        for k in self.kernels[1:]:
            out = out * k.K(X, Y)
        return out

    def _K_diag(self, X):
        out = self.kernels[0].K_diag(X)
        for k in self.kernels[1:]:
            out = out * k.K_diag(X)
        return out


@kernel_class
class Scaled(Kernel):
    """``k(x, y) = variance · k_0(x, y)``."""

    kernel: Kernel
    variance: Any = hyper(1.0)

    def _K(self, X, Y):
        return self.variance * self.kernel.K(X, Y)

    def _K_diag(self, X):
        return self.variance * self.kernel.K_diag(X)


def sum_kernels(kernels: Sequence[Kernel]) -> Kernel:
    """``Σ kernels`` as one kernel (a single kernel is returned unchanged)."""
    kernels = tuple(kernels)
    return kernels[0] if len(kernels) == 1 else Sum(kernels)
