"""Programs compiled for how often they run.

On the CPU, XLA spends most of a program's compile time in LLVM's backend optimisation. A program
that runs only a few times — a report's posterior draws, ``predict`` on a test set of a few hundred
points, a full-data ELBO estimate — finishes sooner when it is compiled with backend optimisation
off. Measured on this project's default comparison (weighted conv model, 256-row chunk of
``pointwise_given_u`` with 100 draws, 2-core CPU): 1.7 s to compile and 0.23 s per call without
backend optimisation, against 3.7 s and 0.09 s with it; the break-even lies near 14 calls.

:func:`adaptive_jit` jits a function both ways (each compiled lazily, on first use) and
:meth:`AdaptiveJit.for_calls` picks the quick build for at most :data:`QUICK_MAX_CALLS` calls. On
other backends (GPU) the optimised build is always used. Both builds compute the same function;
their results may differ in the last bits (XLA fuses differently), so a caller that must
reproduce earlier output exactly should ask for the same number of calls. Both builds take the
model family's structure as their static argument (:mod:`gpzoo.inference.programs`), so each is
compiled once per structure and shared by every fit and loaded model of it; ``predict`` and
``evaluate_elbo``, which users call again and again, always run the optimised build.

:class:`AheadOfTime` compiles programs before their first call: it traces and lowers each in the
calling thread (NumPyro's effect handlers live on one process-wide stack, so tracing stays on one
thread) and hands XLA's compilation, which releases the GIL, to a pool of threads. A later call
with the same static arguments and argument shapes finds the executable in JAX's cache. A report
lowers the programs of every model first and then works through the models while the later
ones compile, so compilation overlaps the Python work (DataTrees, netCDF, figures).

Compiling on more threads pays only where cores are idle: measured on a 2-core machine at load
average 11 (the report phase of the default comparison), compiling its 12 programs on 2 threads
took 15.7 s of CPU against 13.6–14.5 s one after another, and the report took no less wall time.
:func:`idle_compile_workers` therefore asks how many cores are free *now*: it samples the
system's idle time over a tenth of a second (Linux ``/proc/stat``) while this process waits. The
1-minute load average is no guide right after fitting: it still counts this process's own fits,
which have just finished (after a minute of fitting on 2 idle cores it reads about 1.7, so a rule
on it found no idle core and compiled one program after another).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import math
import os
import time

import jax

from gpzoo.inference.programs import FamilyProgram

__all__ = ["QUICK_COMPILE_OPTIONS", "QUICK_MAX_CALLS", "AdaptiveJit", "AheadOfTime", "adaptive_jit", "idle_compile_workers", "idle_cores"]

_log = logging.getLogger(__name__)

#: XLA options of the quick build: LLVM backend optimisation off.
QUICK_COMPILE_OPTIONS = {"xla_backend_optimization_level": 0}
#: Up to this many calls of a program, the quick build is used (below the measured break-even).
QUICK_MAX_CALLS = 8


class AdaptiveJit:
    """``fun(family, *args)`` compiled once per family structure (:func:`gpzoo.inference.programs.family_jit`)
    with XLA's default optimisation (:attr:`optimised`, also what a plain call runs) and without
    backend optimisation (:attr:`quick`); :meth:`for_calls` chooses. Both trace the same program."""

    def __init__(self, fun, **jit_kwargs):
        self.optimised = FamilyProgram(fun, **jit_kwargs)
        self.quick = FamilyProgram(fun, compiler_options=QUICK_COMPILE_OPTIONS, **jit_kwargs)
        functools.update_wrapper(self, fun)

    def __call__(self, *args, **kwargs):
        return self.optimised(*args, **kwargs)

    def for_calls(self, calls: int):
        """The build to use for a run of ``calls`` calls: quick for few calls on the CPU."""
        if calls <= QUICK_MAX_CALLS and jax.default_backend() == "cpu":
            return self.quick
        return self.optimised


def adaptive_jit(fun=None, **jit_kwargs):
    """Decorator: ``@adaptive_jit(static_argnums=0)`` makes an :class:`AdaptiveJit` (argument 0 is the family)."""
    if fun is None:
        return functools.partial(adaptive_jit, **jit_kwargs)
    return AdaptiveJit(fun, **jit_kwargs)


def idle_cores(interval: float = 0.1) -> float | None:
    """Cores left idle by every process over the next ``interval`` seconds (this thread sleeps
    meanwhile, so it counts none of this process's finished work), from the kernel's CPU time
    counters (``/proc/stat``); None where they cannot be read (not Linux)."""
    first = _cpu_times()
    if first is None:
        return None
    time.sleep(interval)
    second = _cpu_times()
    if second is None:
        return None
    busy, total = second[0] - first[0], second[1] - first[1]
    if total <= 0:
        return None
    return (total - busy) / total * first[2]


def _cpu_times() -> tuple[int, int, int] | None:
    """(busy ticks, all ticks, number of CPUs) summed over the machine's CPUs, from ``/proc/stat``."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    fields = lines[0].split() if lines else []
    if len(fields) < 5 or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    cpus = sum(1 for line in lines[1:] if line.startswith("cpu") and line[3:4].isdigit())
    return sum(ticks) - idle, sum(ticks), max(cpus, 1)


def idle_compile_workers(most: int = 2) -> int:
    """Threads worth compiling on now, at most ``most``: the cores :func:`idle_cores` finds idle
    (capped at the cores this process may run on), less the one the calling thread will use. Where
    the CPU counters cannot be read, the cores the 1-minute load average leaves idle (this
    process's running thread included in it); 0 where neither is known."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    idle = idle_cores()
    if idle is not None:
        return max(0, min(int(most), math.floor(min(idle, cores) - 1 + 0.25)))
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not available on this platform
        return 0
    return max(0, min(int(most), math.floor(cores - load)))


class AheadOfTime:
    """Compile jitted programs on ``workers`` threads ahead of their first call (module docstring).

    :meth:`submit` lowers ``program(*args)`` now, in this thread, and queues its compilation under
    a ``tag``; :meth:`wait` blocks until every program of a tag has compiled, after which calls of
    those programs run at once. A program that fails to lower or compile here is left to its first
    call, which compiles it again and raises the error where it belongs (this is an optimisation
    only: no result depends on it). ``workers=0`` does nothing (programs compile on first call).
    Use as a context manager: leaving it cancels queued compilations and joins the threads.
    """

    def __init__(self, workers: int = 2):
        self.workers = int(workers)
        self._pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="gpzoo-compile") \
            if self.workers > 0 else None
        self._pending: dict[object, list[concurrent.futures.Future]] = {}

    def submit(self, tag, program, *args) -> None:
        """Lower ``program`` (a ``jax.jit`` function) at ``args`` (arrays or ``jax.ShapeDtypeStruct``)
        and queue its compilation under ``tag``."""
        if self._pool is None:
            return
        try:
            lowered = program.lower(*args)
        except Exception as exc:  # noqa: BLE001 - the first real call raises it properly
            _log.debug("ahead-of-time lowering of %s failed: %r", getattr(program, "__name__", program), exc)
            return
        self._pending.setdefault(tag, []).append(self._pool.submit(lowered.compile))

    def wait(self, tag) -> None:
        """Block until the programs queued under ``tag`` have compiled (or failed to)."""
        concurrent.futures.wait(self._pending.pop(tag, []))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._pending.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
