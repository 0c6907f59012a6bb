"""Where the fits of a comparison run: in this process, one after another, or on a pool of Ray actors.

A comparison is a set of :class:`FitTask` — one model fitted with one seed — that share the
training data. Every backend runs :func:`fit_task` on each: fit, write the result with
:func:`gpzoo.save` (JSON + ``.npz``) as soon as it is finished, and remove the task's checkpoints;
the caller then reads every result back with :func:`gpzoo.load`. The results are therefore the
same, bit for bit, whichever backend ran them, and a run that stops half-way keeps every finished
fit (``gpzoo compare --resume`` continues it).

* ``"sequential"`` (default, no dependency): the tasks in order, in this process.
* ``"ray"`` (``pip install "gpzoo[ray]"``): the tasks on a pool of Ray actors, on a local Ray
  instance started for the run (as many CPUs as the machine has) or on an existing cluster given
  by ``address``; each actor reserves ``cpus_per_fit`` CPUs and there are as many as the cluster
  holds (at most one per task). The actors are created first, so that they import gpzoo and JAX
  while the training data go to Ray's object store (once), and each runs one task after another
  (:class:`Dispatcher` chooses which). A task that fails or whose actor dies is retried once (on a
  fresh actor if its own died); one that fails again is reported by name (:class:`FitTaskError`)
  after every other task has finished and been saved. On a cluster of several machines the output
  directory must be on a file system every node sees.

Every backend fits with JAX's persistent compilation cache: the user's (``gpzoo compare`` and
:func:`gpzoo.compare` use :func:`~gpzoo.inference.programs.persistent_cache`, kept between runs),
or else one in ``compile-cache/`` beside the tasks' checkpoints (:data:`COMPILE_CACHE`,
:func:`~gpzoo.inference.tasks.compile_cache`), removed once every task has finished and kept,
like the checkpoints, for ``--resume`` when a run stops early. Within one process the fits of one
model share their programs anyway (a program is compiled once per model structure,
:mod:`gpzoo.inference.programs`); the persistent cache carries them to Ray's actors and to the
next run (the same executables: results do not change). ``benchmarks/ray_speedup.py`` times whole
runs with and without it.

What a Ray run costs beyond its fits is mostly each actor's start: its process imports gpzoo's
fitting code and JAX (:mod:`gpzoo.inference.tasks`, about 1.3 s of CPU; not :mod:`gpzoo.analysis`),
and on the 2-core machine its first task began 1.4–2.7 s after the run's start.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import threading
from collections.abc import Callable, Sequence

import numpy as np

from gpzoo.inference.tasks import FitActor, FitOptions, FitTask, compile_cache, fit_task
from gpzoo.models.errors import GPZooError, InvalidArgumentError

__all__ = ["BACKENDS", "COMPILE_CACHE", "Dispatcher", "FitOptions", "FitTask", "FitTaskError", "compile_cache", "fit_task",
           "run_fits"]  # FitTask, FitOptions, fit_task, compile_cache: from gpzoo.inference.tasks

#: Folder, beside the tasks' checkpoint folders, of the run's JAX persistent compilation cache.
COMPILE_CACHE = "compile-cache"


class FitTaskError(GPZooError, RuntimeError):
    """One or more fits of a comparison failed (each named, with its error); the others were saved."""


def _same_spec(a, b) -> bool:
    """Whether two tasks fit the same model (a spec without a usable ``==`` is a model of its own)."""
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - e.g. array-valued fields: not comparable, so not the same model
        return False


class Dispatcher:
    """Which task a free worker runs next, so that a model's programs compile once per run.

    The fits of one model share their compiled programs through the run's compilation cache once
    the first of them has compiled. A free worker therefore takes, in the tasks' order, the first
    task of (1) a model one of whose fits has finished (its programs are in the cache), else
    (2) a model no worker has started (so two workers do not compile the same programs at once),
    else (3) any task: a worker is never left idle while tasks wait. A task put back for a retry
    (:meth:`retry`) counts as the first in that order.
    """

    def __init__(self, tasks: Sequence[FitTask]):
        self._waiting = list(tasks)
        self._model_of: dict[str, int] = {}  # task name -> its model's index, tasks of equal specs sharing one
        specs: list[object] = []
        for task in self._waiting:
            self._model_of[task.name] = next((index for index, spec in enumerate(specs) if _same_spec(spec, task.spec)), len(specs))
            if self._model_of[task.name] == len(specs):
                specs.append(task.spec)
        self._started: set[int] = set()
        self._finished: set[int] = set()

    def __len__(self) -> int:
        return len(self._waiting)

    def next(self) -> FitTask | None:
        """The task a free worker should run now (taken off the queue); None when none waits."""
        if not self._waiting:
            return None
        models = [self._model_of[task.name] for task in self._waiting]
        for wanted in (lambda m: m in self._finished, lambda m: m not in self._started, lambda m: True):
            for position, model in enumerate(models):
                if wanted(model):
                    self._started.add(model)
                    return self._waiting.pop(position)
        raise AssertionError("unreachable")  # pragma: no cover - the last rule takes any task

    def finished(self, task: FitTask) -> None:
        """``task`` has finished: its model's programs are compiled."""
        self._finished.add(self._model_of[task.name])

    def retry(self, task: FitTask) -> None:
        """Put ``task`` back, first in line."""
        self._waiting.insert(0, task)


def _sequential(tasks: Sequence[FitTask], X, y, options: FitOptions, on_done: Callable[[FitTask], None]) -> None:
    for task in tasks:
        fit_task(task, X, y, options)
        on_done(task)


def _ray_error_text(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None) or exc
    text = str(cause) if type(cause) is RuntimeError else f"{type(cause).__name__}: {cause}"
    return " ".join(text.split())[:300]


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
    actors: list = []
    try:
        available = ray.cluster_resources().get("CPU", 0)
        if cpus_per_fit > available:
            raise InvalidArgumentError("cpus_per_fit", f"asks for {cpus_per_fit} CPUs per fit but the Ray cluster has {available:g}")
        if not tasks:
            return
        import jax  # noqa: PLC0415

        enable_x64 = bool(jax.config.jax_enable_x64)
        actor_class = ray.remote(num_cpus=cpus_per_fit, max_restarts=0)(FitActor)
        # the actors start (imports) while the data go to the object store
        actors = [actor_class.remote(enable_x64) for _ in range(max(1, min(len(tasks), int(available // cpus_per_fit))))]
        quiet = dataclasses.replace(options, progress=False, enable_x64=enable_x64, shared_cache=True)
        X_ref, y_ref = ray.put(np.asarray(X)), ray.put(np.asarray(y))
        queue = Dispatcher(tasks)
        running: dict = {}  # object ref -> (actor, task)
        attempts: dict[str, int] = {}
        failures = []

        def submit(actor) -> None:
            task = queue.next()
            if task is not None:
                attempts[task.name] = attempts.get(task.name, 0) + 1
                running[actor.run.remote(task, X_ref, y_ref, quiet)] = (actor, task)

        for actor in actors:
            submit(actor)
        while running:  # Ctrl-C leaves this loop: the finally clause kills the actors and their fits with them
            done, _ = ray.wait(list(running), num_returns=1)
            actor, task = running.pop(done[0])
            try:
                ray.get(done[0])
            except (ray.exceptions.RayError, GPZooError) as exc:
                if isinstance(exc, ray.exceptions.RayActorError):  # the actor's process died: a fresh one takes over
                    actors.remove(actor)
                    actor = actor_class.remote(enable_x64)
                    actors.append(actor)
                if attempts[task.name] < 2:
                    queue.retry(task)
                else:
                    failures.append(f"{task.name}: {_ray_error_text(exc)}")
            else:
                queue.finished(task)
                on_done(task)
            submit(actor)
        for actor in actors:  # idle now: each leaves once it has reported its tasks' events to Ray (ray.timeline)
            actor.__ray_terminate__.remote()
        actors = []
        if failures:
            raise FitTaskError(f"{len(failures)} of {len(tasks)} fit(s) failed twice on Ray: " + "; ".join(failures))
    finally:
        for actor in actors:  # an error or Ctrl-C: the actors stop now, and a fit still running with them
            ray.kill(actor)
        if started:
            ray.shutdown()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)
        rearm_sigint()


def rearm_sigint() -> None:
    """Install the current Python SIGINT handler again at the C level (main thread only).

    Ray's native threads can replace the process's SIGINT action behind Python's back; the Python
    handler then still reads as installed but Ctrl-C no longer reaches it. The Ray backend calls
    this when it is done, so that a later fit's Ctrl-C raises ``KeyboardInterrupt`` and checkpoints
    as documented.
    """
    if threading.current_thread() is threading.main_thread():
        handler = signal.getsignal(signal.SIGINT)
        if handler is not None:
            signal.signal(signal.SIGINT, handler)


#: Backend name -> runner(tasks, X, y, options, on_done, **backend options).
BACKENDS: dict[str, Callable] = {"sequential": _sequential, "ray": _ray}


def run_fits(tasks: Sequence[FitTask], X, y, options: FitOptions, *, backend: str = "sequential",
             on_done: Callable[[FitTask], None] | None = None, **backend_options) -> None:
    """Run every task on ``backend`` (``"sequential"`` or ``"ray"``; Ray takes ``address`` and
    ``cpus_per_fit``); ``on_done(task)`` is called as each one is saved.

    ``options.compile_cache`` None: the cache is ``compile-cache/`` in the folder that holds the
    tasks' checkpoint folders (none when they lie in several), removed when every task has finished
    (a cache with ``options.keep_compile_cache``, such as the user's, is kept)."""
    if backend not in BACKENDS:
        raise InvalidArgumentError("backend", f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "sequential" and backend_options:
        raise InvalidArgumentError(next(iter(backend_options)), "is an option of the ray backend only")
    tasks = list(tasks)
    if options.compile_cache is None:
        folders = {task.checkpoints.parent for task in tasks}
        options = dataclasses.replace(options, compile_cache=folders.pop() / COMPILE_CACHE if len(folders) == 1 else None)
    BACKENDS[backend](tasks, X, y, options, on_done or (lambda task: None), **backend_options)
    if options.compile_cache is not None and not options.keep_compile_cache:  # every task finished: nothing left to resume
        shutil.rmtree(options.compile_cache, ignore_errors=True)
