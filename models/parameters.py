"""Immutable parameterised objects (kernels, likelihoods, inducing variables) and NumPyro sites.

Hyperparameters are ordinary dataclass fields declared with :func:`hyper`; their *value* decides
how :meth:`Parameterised.realise` treats them inside a NumPyro model:

* a number or array  -> ``numpyro.param`` (type-II maximum likelihood, the papers' choice),
  with the field's constraint (``positive`` by default);
* a NumPyro ``Distribution`` -> ``numpyro.sample`` (fully Bayesian hyperparameter);
* ``Fixed(value)`` -> a constant that is never trained.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpyro
from numpyro.distributions import Distribution, constraints

from gpzoo.models.errors import HyperparameterError, check_positive, is_concrete

__all__ = ["Fixed", "Parameterised", "hyper", "pytree_dataclass", "static"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Fixed:
    """A hyperparameter value that is held constant (never a ``numpyro.param``)."""

    value: Any


def hyper(default: Any = dataclasses.MISSING, *, constraint=constraints.positive, kw_only=False):
    """Declare a hyperparameter field with the NumPyro ``constraint`` its value must satisfy."""
    return dataclasses.field(default=default, metadata={"constraint": constraint}, kw_only=kw_only)


def static(default: Any = dataclasses.MISSING, *, kw_only=False):
    """Declare a static (non-pytree, hashable) configuration field, e.g. shapes or flags."""
    return dataclasses.field(default=default, metadata={"static": True}, kw_only=kw_only)


def pytree_dataclass(cls):
    """Make ``cls`` a frozen dataclass registered as a JAX pytree (static fields as metadata).

    Unflattening rebuilds the object *without* running ``__init__``/``__post_init__``: the
    leaves JAX puts back need not be valid hyperparameters (cotangents of a lengthscale may be
    negative, ``vmap``/``tree_map`` use placeholders), and construction-time normalisation has
    already happened on the object that was flattened. So ``jax.grad`` with respect to a kernel
    object returns a kernel-shaped pytree of gradients.
    """
    cls = dataclasses.dataclass(frozen=True, eq=False, repr=True)(cls)
    fields = dataclasses.fields(cls)
    data = tuple(f.name for f in fields if not f.metadata.get("static"))
    meta = tuple(f.name for f in fields if f.metadata.get("static"))
    keys = tuple(jax.tree_util.GetAttrKey(name) for name in data)

    def flatten_with_keys(obj):
        return tuple((key, getattr(obj, name)) for key, name in zip(keys, data)), tuple(getattr(obj, n) for n in meta)

    def flatten(obj):
        return tuple(getattr(obj, name) for name in data), tuple(getattr(obj, n) for n in meta)

    def unflatten(aux, children):
        obj = object.__new__(cls)
        for name, value in zip(data, children):
            object.__setattr__(obj, name, value)
        for name, value in zip(meta, aux):
            object.__setattr__(obj, name, value)
        return obj

    jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
    return cls


def _is_child_tuple(value) -> bool:
    return isinstance(value, tuple) and len(value) > 0 and all(isinstance(v, Parameterised) for v in value)


@dataclasses.dataclass(frozen=True, eq=False)
class Parameterised:
    """Base of every immutable object with hyperparameters (validated eagerly when concrete)."""

    # ----------------------------------------------------------------- construction checks
    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            constraint = f.metadata.get("constraint")
            if constraint is None or isinstance(value, Distribution):
                continue
            raw = value.value if isinstance(value, Fixed) else value
            name = f"{type(self).__name__}.{f.name}"
            if constraint is constraints.positive:
                check_positive(raw, name)
            elif constraint is constraints.unit_interval and is_concrete(raw):
                arr = jnp.asarray(raw)
                if bool(jnp.any((arr < 0) | (arr > 1))):
                    raise HyperparameterError(name, f"must lie in [0, 1], got {arr.tolist()}")

    # ----------------------------------------------------------------- NumPyro integration
    def realise(self, name: str = "kernel") -> "Parameterised":
        """Return a copy whose hyperparameters are NumPyro sites named ``{name}.{field}``.

        Child objects (kernels inside a combinator, say) are realised recursively.

        Call inside a NumPyro model (or guide); outside one, ``numpyro.param`` returns the
        initial value so the result is the object with plain array hyperparameters.
        """
        updates = {}
        for f in dataclasses.fields(self):
            if f.metadata.get("static"):
                continue
            value = getattr(self, f.name)
            site = f"{name}.{f.name}"
            if isinstance(value, Parameterised):
                updates[f.name] = value.realise(site)
            elif _is_child_tuple(value):
                updates[f.name] = tuple(k.realise(f"{site}.{i}") for i, k in enumerate(value))
            elif isinstance(value, Distribution):
                updates[f.name] = numpyro.sample(site, value)
            elif isinstance(value, Fixed):
                updates[f.name] = jnp.asarray(value.value)
            elif "constraint" in f.metadata:
                updates[f.name] = numpyro.param(site, jnp.asarray(value), constraint=f.metadata["constraint"])
        return dataclasses.replace(self, **updates)

    def resolved(self) -> "Parameterised":
        """This object with ``Fixed`` fields replaced by their values (children untouched).

        Lets a kernel be evaluated outside a NumPyro model; a field that holds a prior
        (a ``Distribution``) has no value there and raises ``HyperparameterError``.
        """
        updates = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Fixed):
                updates[f.name] = jnp.asarray(value.value)
            elif isinstance(value, Distribution):
                raise HyperparameterError(
                    f"{type(self).__name__}.{f.name}",
                    "holds a prior distribution; evaluate the object inside a NumPyro model after "
                    ".realise(), or give the hyperparameter a value",
                )
        return dataclasses.replace(self, **updates) if updates else self
