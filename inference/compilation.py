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

Programs are no longer compiled ahead of their first call on threads: with each compiled once per
structure and kept in the persistent cache, doing so saved 5.7 % of the default comparison's report
phase (``benchmarks/compile_once.py``, part ``ahead_of_time``), below the 10 % that would pay for
its threads and plumbing.
"""

from __future__ import annotations

import functools

import jax

from gpzoo.inference.programs import FamilyProgram

__all__ = ["QUICK_COMPILE_OPTIONS", "QUICK_MAX_CALLS", "AdaptiveJit", "adaptive_jit"]

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
