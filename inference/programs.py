"""Programs compiled once per model structure.

JAX compiles a jitted function once per (function, static arguments, argument shapes and dtypes).
gpzoo's programs are module-level jitted functions whose one static argument describes the
*structure* of the model — never a model object compared by identity, and never a closure made
per call. Everything numeric reaches the program as an array argument.

:func:`definition_of` splits a model family (the object holding a zoo model's NumPyro model and
guide, built from a :class:`~gpzoo.models.zoo.ModelSpec`, inducing variables and the number of
latent functions) into

* a :class:`FamilyDefinition`: hashable and compared by value — the family's class, the pytree
  structure of kernel (or a deep kernel machine's architecture, whose layers, widths and
  regularisers are all static fields), likelihood and inducing variables with their static fields, every
  non-array leaf (integers, flags, names), the spec's other fields, the number of latent
  functions and the default float dtype;
* its array leaves: initial hyperparameter values, inducing inputs, fixed values and the
  parameters of priors.

Inside a program :meth:`FamilyDefinition.build` puts the family back together from the traced
leaves, so initial values and fixed values are arguments, not constants compiled into the
program. Two fits of one zoo model (other data of the same shape, other seeds, step counts,
learning rates), and a model loaded from disk, therefore share every compiled program.

:func:`family_jit` turns a function ``fun(family, *args)`` into such a program.
:func:`row_blocks` cuts a varying number of rows into a few fixed padded block sizes, so that
``predict`` on 999 and then on 1,001 rows compiles nothing new. :class:`CompileCounter` counts XLA
compilations (JAX's compile-event monitoring), the measure the tests and benchmarks use.
:func:`enable_persistent_cache` turns on JAX's on-disk cache of compiled programs, which carries
them across processes (the command line and :func:`gpzoo.compare` use it by default).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["BLOCK_SIZES", "ByIdentity", "CompileCounter", "FamilyDefinition", "cache_dir", "definition_of", "enable_persistent_cache",
           "family_jit", "freeze", "pad_rows", "persistent_cache", "row_blocks"]


# ----------------------------------------------------------------------------- hashable definitions
class ByIdentity:
    """A value that cannot be compared by value (an unhashable object, a user's function): keyed by identity.

    It keeps the object alive, so its id is never reused while a compiled program refers to it."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return isinstance(other, ByIdentity) and other.value is self.value

    def __hash__(self):
        return id(self.value)

    def __repr__(self):
        return f"<{type(self.value).__name__} by identity>"


@dataclasses.dataclass(frozen=True)
class _Array:
    """A NumPy array kept static (integer index tables, shapes): compared by shape, dtype and bytes."""

    shape: tuple
    dtype: str
    data: bytes


def freeze(value) -> Any:
    """A hashable, value-compared stand-in for ``value`` (dicts, lists, tuples, dataclasses and NumPy
    arrays recursively; anything else hashable as itself, unhashable objects by identity)."""
    if isinstance(value, (str, bytes, int, float, complex, bool, type(None), type)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return _Array(value.shape, value.dtype.str, value.tobytes())
    if isinstance(value, dict):
        return ("dict", tuple(sorted(((freeze(k), freeze(v)) for k, v in value.items()), key=repr)))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(freeze(v) for v in value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value), tuple((f.name, freeze(getattr(value, f.name))) for f in dataclasses.fields(value)))
    try:
        hash(value)
    except TypeError:
        return ByIdentity(value)
    return value


def _is_dynamic(leaf) -> bool:
    """Whether a pytree leaf becomes an array argument (floating / complex values, JAX arrays) or
    stays part of the static definition (integers, flags, strings, None, objects)."""
    if isinstance(leaf, jax.Array):
        return True
    if isinstance(leaf, np.ndarray):
        return np.issubdtype(leaf.dtype, np.inexact)
    return isinstance(leaf, (float, complex, np.floating, np.complexfloating)) and not isinstance(leaf, bool)


_DYNAMIC = "<array argument>"


class FamilyDefinition:
    """The structure of a model family: hashable and compared by value (module docstring).

    ``build(leaves)`` makes the family from its array leaves (traced, inside a program). A family
    whose guide records concrete values when it is first traced (an autoguide over sampled
    hyperparameters) is keyed by its identity instead: its programs compile once per fitted model.
    """

    __slots__ = ("family_class", "treedef", "static_leaves", "key", "_template", "_hash")

    def __init__(self, family_class, treedef, static_leaves, key, template):
        self.family_class, self.treedef, self.static_leaves, self.key = family_class, treedef, static_leaves, key
        self._template = template  # (spec, num_latent): the fields outside the pytree, for build()
        self._hash = hash((family_class, treedef, static_leaves, key))

    def __eq__(self, other):
        return (isinstance(other, FamilyDefinition) and self._hash == other._hash and self.family_class is other.family_class
                and self.key == other.key and self.treedef == other.treedef and self.static_leaves == other.static_leaves)

    def __hash__(self):
        return self._hash

    def __repr__(self):
        return f"FamilyDefinition({self.family_class.__name__}, {self._template[0].name!r})"

    def build(self, leaves):
        """The family with these array leaves (in :func:`definition_of`'s order)."""
        spec, num_latent, original = self._template
        if original is not None:  # keyed by identity: the family itself (its values are compiled in)
            return original
        it = iter(leaves)
        merged = [next(it) if s is _DYNAMIC else (s.value if isinstance(s, ByIdentity) else _thaw(s)) for s in self.static_leaves]
        kernel, architecture, likelihood, inducing = jax.tree_util.tree_unflatten(self.treedef, merged)
        family = self.family_class(dataclasses.replace(spec, kernel=kernel, architecture=architecture, likelihood=likelihood),
                                   inducing, num_latent)
        family._definition = (self, tuple(leaves))
        return family


def _thaw(static):
    return np.frombuffer(static.data, dtype=np.dtype(static.dtype)).reshape(static.shape) if isinstance(static, _Array) else static


_SPEC_EXCLUDED = ("kernel", "architecture", "likelihood", "description")


def definition_of(family) -> tuple[FamilyDefinition, tuple]:
    """``(definition, leaves)`` of a model family (module docstring); computed once per family object."""
    cached = getattr(family, "_definition", None)
    if cached is not None:
        return cached
    spec = family.spec
    tree = (spec.kernel, spec.architecture, spec.likelihood, family.inducing)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    dynamic, static = [], []
    for leaf in leaves:
        if _is_dynamic(leaf):
            dynamic.append(jnp.asarray(leaf))
            static.append(_DYNAMIC)
        else:
            static.append(freeze(leaf))
    spec_key = tuple((f.name, freeze(getattr(spec, f.name))) for f in dataclasses.fields(spec) if f.name not in _SPEC_EXCLUDED)
    key = (spec_key, int(family.num_latent), str(jnp.zeros(()).dtype))
    by_identity = getattr(family, "hyper_guide", None) is not None
    try:
        hash((treedef, tuple(static), key))
    except TypeError:  # a static field that cannot be hashed (e.g. an array): programs compile per family object
        by_identity = True
    if by_identity:
        key = key + (ByIdentity(family),)
        treedef, static = ByIdentity(treedef), [ByIdentity(s) for s in static]
    definition = FamilyDefinition(type(family), treedef, tuple(static), key,
                                  (spec, family.num_latent, family if by_identity else None))
    cached = (definition, tuple(dynamic))
    family._definition = cached
    return cached


def family_jit(fun: Callable | None = None, *, static_argnums: tuple[int, ...] = (), **jit_kwargs):
    """``fun(family, *args)`` as a program compiled once per family *structure*.

    The returned callable takes the same arguments; it calls a jitted ``(definition, leaves, *args)``
    whose static argument is the family's :class:`FamilyDefinition`. ``static_argnums`` count
    ``fun``'s own positions (``family`` is 0 and is always static). ``.lower(*args)`` lowers it.
    """
    if fun is None:
        return functools.partial(family_jit, static_argnums=static_argnums, **jit_kwargs)
    return FamilyProgram(fun, static_argnums=static_argnums, **jit_kwargs)


class FamilyProgram:
    """A jitted program of a model family (:func:`family_jit`)."""

    def __init__(self, fun, *, static_argnums=(), **jit_kwargs):
        static = tuple(sorted({0, *(int(i) for i in np.atleast_1d(static_argnums))}))

        def with_family(definition, leaves, *args):
            return fun(definition.build(leaves), *args)

        functools.update_wrapper(with_family, fun)
        del with_family.__wrapped__  # its signature is (definition, leaves, *fun's arguments after the family)
        parameters = list(inspect.signature(fun).parameters.values())[1:]
        with_family.__signature__ = inspect.Signature(
            [inspect.Parameter("definition", inspect.Parameter.POSITIONAL_OR_KEYWORD),
             inspect.Parameter("leaves", inspect.Parameter.POSITIONAL_OR_KEYWORD), *parameters])
        self.fun = fun
        self.jitted = jax.jit(with_family, static_argnums=tuple(i + 1 if i > 0 else 0 for i in static), **jit_kwargs)
        functools.update_wrapper(self, fun)

    @staticmethod
    def _arguments(family, args):
        definition, leaves = definition_of(family)
        return (definition, leaves, *args)

    def __call__(self, family, *args):
        return self.jitted(*self._arguments(family, args))

    def lower(self, family, *args):
        return self.jitted.lower(*self._arguments(family, args))


# ----------------------------------------------------------------------------- padded row blocks
#: Row-block sizes of programs whose number of rows varies by call (predict, ELBO evaluation): a
#: remainder of n rows is padded to the smallest size >= n (capped at the caller's batch size).
BLOCK_SIZES = (64, 256, 1024, 4096)


def row_blocks(num_rows: int, batch_size: int) -> Iterator[tuple[slice, int]]:
    """``(rows, padded size)`` blocks covering ``range(num_rows)``: full blocks of ``batch_size``
    rows, then the remainder padded to the next of :data:`BLOCK_SIZES` (at most ``batch_size``)."""
    start = 0
    while start < num_rows:
        n = min(batch_size, num_rows - start)
        size = batch_size if n == batch_size else min([b for b in BLOCK_SIZES if b >= n] + [batch_size])
        yield slice(start, start + n), size
        start += n


def pad_rows(array, size: int):
    """``array`` with its first axis padded to ``size`` rows by repeating its last row (valid inputs)."""
    array = np.asarray(array)
    extra = size - array.shape[0]
    if extra <= 0:
        return array
    return np.concatenate([array, np.repeat(array[-1:], extra, axis=0)], axis=0)


# ----------------------------------------------------------------------------- counting compilations
_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_listeners: list["CompileCounter"] = []
_listeners_lock = threading.Lock()
_registered = False


def _on_duration(event: str, duration: float, **kwargs) -> None:
    if event == _BACKEND_COMPILE_EVENT:
        with _listeners_lock:
            for counter in _listeners:
                counter.count += 1
                counter.seconds += duration


def _on_event(event: str, **kwargs) -> None:
    if event == _CACHE_HIT_EVENT:
        with _listeners_lock:
            for counter in _listeners:
                counter.cache_hits += 1


class CompileCounter:
    """Counts compilations while active: ``with CompileCounter() as c: ...; c.count``.

    ``count`` is every program JAX did not find in its in-memory cache (each reaches XLA's
    compile step, JAX's ``backend_compile`` event), ``seconds`` their time, and ``cache_hits``
    those of them that JAX's persistent cache served instead of compiling.
    """

    def __init__(self):
        self.count, self.seconds, self.cache_hits = 0, 0.0, 0

    def __enter__(self):
        global _registered
        with _listeners_lock:
            if not _registered:
                jax.monitoring.register_event_duration_secs_listener(_on_duration)
                jax.monitoring.register_event_listener(_on_event)
                _registered = True
            _listeners.append(self)
        return self

    def __exit__(self, *exc):
        with _listeners_lock:
            _listeners.remove(self)
        return False


# ----------------------------------------------------------------------------- persistent cache
#: Environment variable naming the folder of the persistent compilation cache; "off" (or "0") turns it off.
CACHE_ENV = "GPZOO_COMPILATION_CACHE"
#: Size bound of the persistent cache (bytes; JAX evicts the least recently used entries above it).
CACHE_MAX_BYTES = 2 * 1024**3


def cache_dir() -> Path | None:
    """The persistent cache's folder: ``$GPZOO_COMPILATION_CACHE``, else ``$XDG_CACHE_HOME/gpzoo/jax``
    (``~/.cache/gpzoo/jax``); None when ``GPZOO_COMPILATION_CACHE`` is ``off`` or ``0``."""
    value = os.environ.get(CACHE_ENV)
    if value is not None and value.strip().lower() in ("off", "0", "false", "no", ""):
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpzoo" / "jax"


def enable_persistent_cache(path: str | os.PathLike | None = None, *, max_bytes: int = CACHE_MAX_BYTES) -> Path | None:
    """Turn on JAX's persistent compilation cache in ``path`` (default :func:`cache_dir`); returns the
    folder, or None when it is turned off or cannot be created (then nothing changes).

    Every program is kept, however quickly it compiled, up to ``max_bytes`` in all (least recently
    used entries are evicted): the small programs are most of a warm run's compilations (the README's
    main job, warm, 18.4-18.6 s against 19.0-19.2 s keeping only those over 0.2 s, for 1.8 MB of
    cache against 1.3 MB). A cache entry that cannot be written (a full disk) is skipped with JAX's
    warning, never raised (``jax_raise_persistent_cache_errors`` is set off): a cache never makes a
    fit fail."""
    folder = Path(path).expanduser() if path is not None else cache_dir()
    if folder is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    from jax.experimental.compilation_cache import compilation_cache  # noqa: PLC0415

    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_raise_persistent_cache_errors", False)  # a cache that cannot be written is skipped, with a warning
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    try:
        jax.config.update("jax_compilation_cache_max_size", int(max_bytes))
    except AttributeError:  # pragma: no cover - older JAX without the size bound
        pass
    compilation_cache.reset_cache()  # JAX opens its cache once per process, on the first compilation after this
    return folder


def persistent_cache() -> Path | None:
    """The persistent cache the command line and :func:`gpzoo.compare` compile into: the folder
    already configured (``jax_compilation_cache_dir``, e.g. by the user), else the one
    :func:`enable_persistent_cache` turns on (None when ``GPZOO_COMPILATION_CACHE=off``)."""
    configured = jax.config.jax_compilation_cache_dir
    if configured:
        return Path(configured)
    if not jax.config.jax_enable_compilation_cache:
        return None
    return enable_persistent_cache()
