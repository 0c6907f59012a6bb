"""One fit of a comparison, runnable in any process: :class:`FitTask`, :func:`fit_task` and the worker that runs them.

A comparison (:func:`gpzoo.compare`) is a set of :class:`FitTask` — one model fitted with one seed —
that share the training data; :mod:`gpzoo.analysis.backends` runs them in this process or on Ray.
:func:`fit_task` fits one, writes the result with :func:`gpzoo.save` (JSON + ``.npz``) as soon as it
is finished and removes the task's checkpoints. This module is what a Ray worker imports to run
them (:class:`FitActor`): it needs gpzoo's fitting code, not the evaluation side (``gpzoo.analysis``,
which loads pandas, xarray and matplotlib: 0.7 s more per worker).

The fits run with JAX's persistent compilation cache in one folder per run (:func:`compile_cache`):
the fits of one model with different seeds run the same programs, so only the first compiles them
and the others — in the same process or in any other — read them back (the same executables:
results do not change, bit for bit).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from pathlib import Path

from gpzoo.models.errors import GPZooError

__all__ = ["CACHE_MIN_COMPILE_S", "SHARED_CACHE_MAX_BYTES", "FitActor", "FitOptions", "FitTask", "compile_cache", "fit_task",
           "fit_task_portable"]

#: Programs that compile faster than this are not cached (reading one back costs about a millisecond).
CACHE_MIN_COMPILE_S = 0.0
#: Size cap of a cache that several processes share: set, JAX locks the folder (``filelock``) around each read and write.
SHARED_CACHE_MAX_BYTES = 4 << 30


@dataclasses.dataclass(frozen=True)
class FitTask:
    """One model fitted with one seed: ``name`` is the run's name in the report."""

    name: str
    spec: object
    seed: int
    saved: Path
    checkpoints: Path


@dataclasses.dataclass(frozen=True)
class FitOptions:
    """The :func:`gpzoo.fit` settings every task shares."""

    steps: int | str  # a count, or "auto"
    batch_size: int | None
    learning_rate: float
    checkpoint_every: int | None = None
    resume: bool = False
    progress: bool = False
    #: the caller's precision (``jax_enable_x64``), applied in worker processes; None: leave as it is
    enable_x64: bool | None = None
    #: JAX's persistent compilation cache folder for the fits (:func:`compile_cache`); None: none
    compile_cache: Path | None = None
    #: the cache is shared by several processes at once (Ray actors): lock it around reads and writes
    shared_cache: bool = False
    #: the cache outlives the run (the user's, :func:`gpzoo.inference.programs.persistent_cache`): never removed
    keep_compile_cache: bool = False
    #: ``fit(..., standardise=True)``: features and regression targets centred and scaled (undone in predict)
    standardise: bool = False


@contextlib.contextmanager
def compile_cache(directory: Path | None, *, shared: bool = False):
    """Use JAX's persistent compilation cache in ``directory`` inside the block, then restore JAX's settings.

    Programs compiled in the block are written there and any program already there is read back
    instead of compiled (the same executable). ``shared``: several processes use the folder at
    once; JAX then locks it around each read and write. Nothing is changed when ``directory`` is
    None, when the caller configured a cache of their own or when JAX's cache is disabled.
    """
    import jax  # noqa: PLC0415 - JAX-heavy
    from jax.experimental.compilation_cache import compilation_cache  # noqa: PLC0415

    if directory is None or jax.config.jax_compilation_cache_dir or not jax.config.jax_enable_compilation_cache:
        yield
        return
    settings = {"jax_compilation_cache_dir": str(directory), "jax_persistent_cache_min_compile_time_secs": CACHE_MIN_COMPILE_S}
    if shared:
        settings["jax_compilation_cache_max_size"] = SHARED_CACHE_MAX_BYTES
    previous = {name: getattr(jax.config, name) for name in settings}
    Path(directory).mkdir(parents=True, exist_ok=True)
    for name, value in settings.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()  # JAX opens its cache once per process, on the first compilation after this
    try:
        yield
    finally:
        for name, value in previous.items():
            jax.config.update(name, value)
        compilation_cache.reset_cache()


def fit_task(task: FitTask, X, y, options: FitOptions) -> str:
    """Fit ``task`` on (X, y), save the result to ``task.saved`` and drop its checkpoints; returns the saved path."""
    from gpzoo.inference.fit import fit  # noqa: PLC0415 - JAX-heavy, and imported in the worker that runs it
    from gpzoo.inference.io import save  # noqa: PLC0415

    if options.enable_x64 is not None:
        import jax  # noqa: PLC0415

        jax.config.update("jax_enable_x64", options.enable_x64)
    task.checkpoints.mkdir(parents=True, exist_ok=True)
    with compile_cache(options.compile_cache, shared=options.shared_cache):
        res = fit(task.spec, X, y, steps=options.steps, batch_size=options.batch_size, seed=task.seed,
                  learning_rate=options.learning_rate, progress=options.progress, checkpoint_dir=task.checkpoints,
                  checkpoint_every=options.checkpoint_every, resume=options.resume, standardise=options.standardise)
    # The run owns task.saved (its output directory was checked for another report before any fit);
    # a save interrupted by a crash may have left part of a model there for --resume to replace.
    save(res, task.saved, overwrite=True)
    shutil.rmtree(task.checkpoints, ignore_errors=True)
    return str(task.saved)


def fit_task_portable(task: FitTask, X, y, options: FitOptions) -> str:
    """:func:`fit_task` whose errors cross process boundaries: a gpzoo error becomes a RuntimeError
    carrying its type and message (Ray cannot rebuild exceptions with custom constructors)."""
    try:
        return fit_task(task, X, y, options)
    except GPZooError as exc:
        raise RuntimeError(f"{type(exc).__name__}: {exc}") from None


class FitActor:
    """A worker that runs fit tasks one after another (the Ray backend's actor, made one by
    ``ray.remote``). Its process imports this module, and with it gpzoo's fitting code and JAX,
    when the actor is created, not when its first task arrives."""

    def __init__(self, enable_x64: bool):
        import jax  # noqa: PLC0415

        jax.config.update("jax_enable_x64", enable_x64)
        jax.devices()  # the backend starts now too

    def run(self, task: FitTask, X, y, options: FitOptions) -> str:
        return fit_task_portable(task, X, y, options)
