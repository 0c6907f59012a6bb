"""Where the fits of a comparison run: in this process, one after another, or as Ray tasks.

A comparison is a set of :class:`FitTask` — one model fitted with one seed — that share the
training data. Every backend runs :func:`fit_task` on each: fit, write the result with
:func:`gpzoo.save` (JSON + ``.npz``) as soon as it is finished, and remove the task's checkpoints;
the caller then reads every result back with :func:`gpzoo.load`. The results are therefore the
same, bit for bit, whichever backend ran them, and a run that stops half-way keeps every finished
fit (``gpzoo compare --resume`` continues it).

* ``"sequential"`` (default, no dependency): the tasks in order, in this process.
* ``"ray"`` (``pip install "gpzoo[ray]"``): each task a Ray task, on a local Ray instance started
  for the run (as many CPUs as the machine has) or on an existing cluster given by ``address``;
  ``cpus_per_fit`` CPUs are reserved per task. The training data go to Ray's object store once.
  A task that fails or whose worker dies is retried once; one that fails again is reported by
  name (:class:`FitTaskError`) after every other task has finished and been saved. On a cluster
  of several machines the output directory must be on a file system every node sees.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from gpzoo.models.errors import GPZooError, InvalidArgumentError

__all__ = ["BACKENDS", "FitOptions", "FitTask", "FitTaskError", "fit_task", "run_fits"]


class FitTaskError(GPZooError, RuntimeError):
    """One or more fits of a comparison failed (each named, with its error); the others were saved."""


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

    steps: int
    batch_size: int | None
    learning_rate: float
    checkpoint_every: int | None = None
    resume: bool = False
    progress: bool = False
    #: the caller's precision (``jax_enable_x64``), applied in worker processes; None: leave as it is
    enable_x64: bool | None = None


def fit_task(task: FitTask, X, y, options: FitOptions) -> str:
    """Fit ``task`` on (X, y), save the result to ``task.saved`` and drop its checkpoints; returns the saved path."""
    from gpzoo.inference.fit import fit  # noqa: PLC0415 - JAX-heavy, and imported in the worker that runs it
    from gpzoo.inference.io import save  # noqa: PLC0415

    if options.enable_x64 is not None:
        import jax  # noqa: PLC0415

        jax.config.update("jax_enable_x64", options.enable_x64)
    task.checkpoints.mkdir(parents=True, exist_ok=True)
    res = fit(task.spec, X, y, steps=options.steps, batch_size=options.batch_size, seed=task.seed,
              learning_rate=options.learning_rate, progress=options.progress, checkpoint_dir=task.checkpoints,
              checkpoint_every=options.checkpoint_every, resume=options.resume)
    save(res, task.saved)
    shutil.rmtree(task.checkpoints, ignore_errors=True)
    return str(task.saved)


def _fit_task_portable(task: FitTask, X, y, options: FitOptions) -> str:
    """:func:`fit_task` whose errors cross process boundaries: a gpzoo error becomes a RuntimeError
    carrying its type and message (Ray cannot rebuild exceptions with custom constructors)."""
    try:
        return fit_task(task, X, y, options)
    except GPZooError as exc:
        raise RuntimeError(f"{type(exc).__name__}: {exc}") from None


def _sequential(tasks: Sequence[FitTask], X, y, options: FitOptions, on_done: Callable[[FitTask], None]) -> None:
    for task in tasks:
        fit_task(task, X, y, options)
        on_done(task)


def _ray(tasks: Sequence[FitTask], X, y, options: FitOptions, on_done: Callable[[FitTask], None], *,
         address: str | None = None, cpus_per_fit: int = 1) -> None:
    try:
        import ray  # noqa: PLC0415 - optional dependency
    except ImportError:
        raise InvalidArgumentError("backend", 'the "ray" backend needs Ray: pip install "gpzoo[ray]"') from None
    started = not ray.is_initialized()
    # ray.init installs its own SIGINT/SIGTERM handlers in this process and its threads may change the
    # calling thread's signal mask; both are restored afterwards (fit's checkpointing relies on Ctrl-C)
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if started:
        ray.init(address=address, num_cpus=None if address else os.cpu_count(), include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
    try:
        available = ray.cluster_resources().get("CPU", 0)
        if cpus_per_fit > available:
            raise InvalidArgumentError("cpus_per_fit", f"asks for {cpus_per_fit} CPUs per fit but the Ray cluster has {available:g}")
        remote = ray.remote(num_cpus=cpus_per_fit, max_retries=1, retry_exceptions=True)(_fit_task_portable)
        import jax  # noqa: PLC0415

        quiet = dataclasses.replace(options, progress=False, enable_x64=bool(jax.config.jax_enable_x64))
        X_ref, y_ref = ray.put(np.asarray(X)), ray.put(np.asarray(y))
        pending = {remote.remote(task, X_ref, y_ref, quiet): task for task in tasks}
        failures = []
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                task = pending.pop(done[0])
                try:
                    ray.get(done[0])
                except (ray.exceptions.RayError, GPZooError) as exc:
                    cause = getattr(exc, "cause", None) or exc
                    text = str(cause) if type(cause) is RuntimeError else f"{type(cause).__name__}: {cause}"
                    failures.append(f"{task.name}: {' '.join(text.split())[:300]}")
                    continue
                on_done(task)
        except KeyboardInterrupt:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        if failures:
            raise FitTaskError(f"{len(failures)} of {len(tasks)} fit(s) failed twice on Ray: " + "; ".join(failures))
    finally:
        if started:
            ray.shutdown()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)


#: Backend name -> runner(tasks, X, y, options, on_done, **backend options).
BACKENDS: dict[str, Callable] = {"sequential": _sequential, "ray": _ray}


def run_fits(tasks: Sequence[FitTask], X, y, options: FitOptions, *, backend: str = "sequential",
             on_done: Callable[[FitTask], None] | None = None, **backend_options) -> None:
    """Run every task on ``backend`` (``"sequential"`` or ``"ray"``; Ray takes ``address`` and
    ``cpus_per_fit``); ``on_done(task)`` is called as each one is saved."""
    if backend not in BACKENDS:
        raise InvalidArgumentError("backend", f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "sequential" and backend_options:
        raise InvalidArgumentError(next(iter(backend_options)), "is an option of the ray backend only")
    BACKENDS[backend](list(tasks), X, y, options, on_done or (lambda task: None), **backend_options)
