"""Inducing variables and their covariances ``Kuu`` / ``Kuf``, registered per (inducing, kernel) pair.

As in GPflow, an inducing-variable type is little more than a container; what it *means* for a
given kernel lives in the two covariance functions registered for the pair (multipledispatch,
which also resolves subclasses). A new structured kernel adds one inducing type and two
registrations; the conditional, the KL and the training loop are shared (STYLE.md).

Conventions (one place): ``Kuu`` returns a stack of blocks ``[G, M, M]`` *without* jitter (the
Cholesky adds it) and ``Kuf`` returns ``[G, M, N]``; the G·M inducing outputs are ordered group
by group. Ordinary points have G = 1; separate inducing sets for a sum of kernels
(conv + RBF, seed 000 §3.3) or one set per colour channel (seed 000 eq. 22–23) have G > 1 and
a block-diagonal Kuu.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from multipledispatch import Dispatcher
from numpyro.distributions import constraints

from models.errors import InvalidArgumentError
from models.kernels import Kernel, Sum
from models.parameters import Parameterised, hyper, pytree_dataclass

__all__ = [
    "InducingPoints",
    "InducingVariables",
    "Kuf",
    "Kuu",
    "SeparateInducing",
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
    """u = f(Z): values of the GP at inducing inputs ``Z`` ``[M, D]`` (seed 000 §2.1)."""

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
