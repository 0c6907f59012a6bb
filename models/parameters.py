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

import numpy as np

from gpzoo.models.errors import HyperparameterError, is_concrete, model_float_dtype

__all__ = ["Fixed", "Parameterised", "check_hyperparameter", "hyper", "pytree_dataclass", "static"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Fixed:
    """A hyperparameter value that is held constant (never a ``numpyro.param``)."""

    value: Any


def hyper(default: Any = dataclasses.MISSING, *, constraint=constraints.positive, maximum: float | None = None, kw_only=False):
    """Declare a hyperparameter field with the NumPyro ``constraint`` its value must satisfy.

    ``maximum``: the largest magnitude a value given at construction may have (e.g. an angle in
    degrees), checked with the constraint; training is not bounded by it.
    """
    metadata = {"constraint": constraint} if maximum is None else {"constraint": constraint, "maximum": float(maximum)}
    return dataclasses.field(default=default, metadata=metadata, kw_only=kw_only)


def check_hyperparameter(value, argument: str, constraint=constraints.positive, maximum: float | None = None) -> None:
    """Raise ``HyperparameterError`` naming ``argument`` unless a concrete ``value`` is a valid hyperparameter.

    The value is converted to the precision models compute in (float32 unless ``jax_enable_x64``)
    first, and the checks run on the converted numbers: real (no strings, booleans, complex
    numbers or objects), finite after conversion (1e39 is inf in float32), within the
    ``constraint`` (``positive``: > 0 after conversion, so 1e-50 that rounds to 0 in float32 is
    refused; ``unit_interval``: in [0, 1]; ``real``: any finite value) and, when given, with
    magnitude at most ``maximum``. Tracers and ``None`` pass (nothing to check before tracing).
    """
    if value is None or not is_concrete(value):
        return
    kind = f"{value!r} ({type(value).__name__})"
    if isinstance(value, (str, bytes)):
        raise HyperparameterError(argument, f"must be a real number or an array of them, got the string {value!r}")
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001 - anything unconvertible is the user's input
        raise HyperparameterError(argument, f"must be a real number or an array of them, got {kind}") from None
    if arr.dtype.kind == "c":
        raise HyperparameterError(argument, f"must be real, got the complex value(s) {arr.tolist()}")
    if arr.dtype.kind not in "iuf":
        raise HyperparameterError(argument, f"must be a real number or an array of them, got {kind}"
                                            + ("" if arr.dtype.kind == "b" else f" of dtype {arr.dtype}"))
    dtype = model_float_dtype()
    with np.errstate(over="ignore", under="ignore"):
        converted = arr.astype(dtype)
    if not np.all(np.isfinite(converted)):
        if np.all(np.isfinite(arr)):
            raise HyperparameterError(argument, f"{_shown(arr, ~np.isfinite(converted))} is outside the {dtype.name} range "
                                                f"(|x| <= {float(np.finfo(dtype).max):.4g}) models compute in")
        raise HyperparameterError(argument, f"must be finite, got {_shown(arr, ~np.isfinite(arr))}")
    if constraint is constraints.positive and np.any(converted <= 0):
        rounded = f" (it rounds to 0 in {dtype.name})" if np.all(arr > 0) else ""
        raise HyperparameterError(argument, f"must be positive and finite, got {_shown(arr, converted <= 0)}{rounded}")
    if constraint is constraints.unit_interval and np.any((converted < 0) | (converted > 1)):
        raise HyperparameterError(argument, f"must lie in [0, 1], got {_shown(arr, (converted < 0) | (converted > 1))}")
    if maximum is not None and np.any(np.abs(converted) > maximum):
        raise HyperparameterError(argument, f"must have magnitude at most {maximum:g}, got {_shown(arr, np.abs(converted) > maximum)}")


def _shown(arr: np.ndarray, bad: np.ndarray) -> str:
    """``arr`` for a message: the value itself when small, else its shape and a few offending entries."""
    if arr.size <= 8:
        return str(arr.tolist())
    return f"an array of shape {arr.shape} with {int(np.count_nonzero(bad))} such entries, e.g. {arr[bad][:3].tolist()}"


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
            check_hyperparameter(raw, f"{type(self).__name__}.{f.name}", constraint, f.metadata.get("maximum"))

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
