"""The chunk runner every fitter shares: jit-compiled ``lax.scan`` chunks of steps, a progress bar,
checkpoints and exact resume, a NaN guard, and Ctrl-C that keeps the last completed chunk.

A fitter describes one step as a :class:`ChunkProgram` and hands it to :func:`run_chunks`
(the SVI fitter, :mod:`gpzoo.inference.svi`; the Pólya–Gamma natural-gradient fitter,
:mod:`gpzoo.inference.pg_natgrad`). ``steps="auto"`` runs until the objective levels off
(:func:`gpzoo.inference.results.settled`), checked on the host between chunks, at most ``max_steps``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from gpzoo.inference.checkpoint import CheckpointWriteError, check_config, load_checkpoint, read_config, save_checkpoint
from gpzoo.inference.data import MemmapSource, data_fingerprint
from gpzoo.inference.guides import UNCONSTRAINED_FORM
from gpzoo.inference.linalg import float_dtype
from gpzoo.inference.natgrad import NATGRAD, check_natgrad_step
from gpzoo.inference.results import settled
from gpzoo.inference.sharding import DataParallel, resolve_devices
from gpzoo.models.errors import CheckpointError, GPZooWarning, InvalidArgumentError, TrainingError, check_flag, check_integer, check_real, check_seed

__all__ = ["AUTO_MAX_STEPS", "RESUME_KEYS", "SCHEDULE_PROBE_STEPS", "ChunkProgram", "ClosureStep", "FitSettings", "restart_clock", "run_chunks"]

#: Steps at which a learning-rate schedule is evaluated to tell two schedules apart on resume.
SCHEDULE_PROBE_STEPS = (0, 1, 10, 100, 1000, 10000, 100000)
#: Default most steps of a ``steps="auto"`` run.
AUTO_MAX_STEPS = 10_000


@dataclasses.dataclass(frozen=True)
class FitSettings:
    """The run settings every fitter shares (the keyword arguments of :func:`gpzoo.inference.fit.fit`).

    ``batch_size=None`` uses all data each step; ``optimizer`` defaults to Adam with
    ``learning_rate`` (a float or an optax schedule); ``inducing`` replaces the spec's initial
    inducing variables; checkpoints go to ``checkpoint_dir`` every ``checkpoint_every`` steps;
    ``devices`` (a count or a sequence of JAX devices) splits each minibatch across devices
    (:mod:`gpzoo.inference.sharding`; None: one device). ``steps="auto"`` runs until the objective
    levels off (:func:`~gpzoo.inference.results.settled`, checked after every chunk), at most
    ``max_steps`` (default :data:`AUTO_MAX_STEPS`; it bounds only an ``"auto"`` run).
    ``optimizer="natgrad"`` takes natural-gradient steps of size ``natgrad_step`` on q(u) and Adam
    steps with ``learning_rate`` on everything else (:mod:`gpzoo.inference.natgrad`).
    """

    steps: int | str = 1000
    batch_size: int | None = None
    seed: int = 0
    learning_rate: Any = 0.01
    optimizer: Any = None
    inducing: Any = None
    checkpoint_dir: str | Path | None = None
    checkpoint_every: int | None = None
    resume: bool = False
    progress: bool = True
    chunk_size: int = 25
    devices: Any = None
    max_steps: int = AUTO_MAX_STEPS
    natgrad_step: Any = None

    def __post_init__(self):
        """Eager checks of every setting (typed errors naming it, before any tracing)."""
        if isinstance(self.steps, str):
            if self.steps != "auto":
                raise InvalidArgumentError("steps", f"expected a non-negative integer or 'auto', got {self.steps!r}")
        else:
            check_integer(self.steps, "steps", minimum=0)
        check_integer(self.max_steps, "max_steps", minimum=1)
        if self.batch_size is not None:
            check_integer(self.batch_size, "batch_size", minimum=1)
        check_seed(self.seed)
        if not callable(self.learning_rate):
            check_real(self.learning_rate, "learning_rate", positive=True)
        if self.optimizer is not None and not isinstance(self.optimizer, str) and not (callable(getattr(self.optimizer, "init", None))
                                               and callable(getattr(self.optimizer, "update", None))):
            raise InvalidArgumentError("optimizer", f"expected an optax.GradientTransformation (e.g. optax.adam(1e-2)), "
                                                    f"'natgrad' or None (Adam with learning_rate), got {self.optimizer!r}")
        if isinstance(self.optimizer, str) and self.optimizer != NATGRAD:
            raise InvalidArgumentError("optimizer", f"expected an optax.GradientTransformation (e.g. optax.adam(1e-2)), "
                                                    f"'natgrad' or None (Adam with learning_rate), got {self.optimizer!r}")
        check_natgrad_step(self.natgrad_step, self.optimizer)
        if self.checkpoint_dir is not None and not isinstance(self.checkpoint_dir, (str, os.PathLike)):
            raise InvalidArgumentError("checkpoint_dir", f"expected a path, got {self.checkpoint_dir!r}")
        if self.checkpoint_every is not None:
            check_integer(self.checkpoint_every, "checkpoint_every", minimum=1)
        check_flag(self.resume, "resume")
        check_flag(self.progress, "progress")
        check_integer(self.chunk_size, "chunk_size", minimum=1)
        if self.resume and self.checkpoint_dir is None:
            raise InvalidArgumentError("resume", "resume=True needs checkpoint_dir")
        resolve_devices(self.devices)

    @property
    def auto(self) -> bool:
        """True for ``steps="auto"``: run until the objective levels off."""
        return isinstance(self.steps, str)

    @property
    def step_limit(self) -> int:
        """The most steps the run may take: ``steps``, or ``max_steps`` for ``steps="auto"``."""
        return int(self.max_steps) if self.auto else int(self.steps)

    def data_parallel(self) -> DataParallel | None:
        """The device mesh of ``devices`` (None for one device, the default)."""
        devices = resolve_devices(self.devices)
        return None if devices is None else DataParallel(devices)

    @classmethod
    def from_keywords(cls, run: dict) -> "FitSettings":
        """Settings from ``fit``-style keyword arguments; an unknown one is an ``InvalidArgumentError`` naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(run) - known)
        if unknown:
            raise InvalidArgumentError(unknown[0], f"is not a fit setting; settings: {sorted(known)}")
        return cls(**run)

    def batch_size_for(self, num_data: int) -> int:
        """Eager checks of the settings for ``num_data`` training points; returns the batch size B.

        ``resume=True`` needs ``checkpoint_dir`` to exist (a mistyped path is a ``CheckpointError``,
        not a fresh start); an existing empty directory starts a fresh run.
        """
        B = num_data if self.batch_size is None else int(self.batch_size)
        if not 1 <= B <= num_data:
            raise InvalidArgumentError("batch_size", f"must be an integer in [1, {num_data}], got {self.batch_size!r}")
        if self.resume and not Path(self.checkpoint_dir).is_dir():
            raise CheckpointError(f"checkpoint_dir {str(self.checkpoint_dir)!r} does not exist, so there is nothing to resume "
                                  "(resume=True); check the path, or pass resume=False to start a new run")
        return B

    def resume_config(self, model: str, method: str, X, y, batch_size: int) -> dict:
        """The :data:`RESUME_KEYS` of a run of ``model`` by ``method`` on (X, y) with these settings.

        A checkpoint records them and a resumed run must agree on every one: the data fingerprint
        (:func:`~gpzoo.inference.data.data_fingerprint`, computed only when checkpointing), the
        seed, the learning rate (a schedule by its values at :data:`SCHEDULE_PROBE_STEPS`) and
        whether the optimiser is the default Adam (a custom optax transformation cannot be
        compared; its state shapes are). With ``resume=True`` they are compared with the
        checkpoint's here, before anything is compiled (``CheckpointError`` naming every
        difference, or ``steps`` below the steps already done).
        """
        rate = self.learning_rate
        rate = ([float(rate(s)) for s in SCHEDULE_PROBE_STEPS] if callable(rate) else float(rate))
        config = {"model": model, "method": method, "num_data": len(X) if isinstance(X, MemmapSource) else int(np.shape(X)[0]), "batch_size": int(batch_size),
                  "seed": int(self.seed), "learning_rate": rate, "optimizer": "adam" if self.optimizer is None else (NATGRAD if self.optimizer == NATGRAD else "custom"),
                  "dtype": str(np.dtype(float_dtype()) if isinstance(X, MemmapSource) else np.asarray(X).dtype),
                  "data_fingerprint": None if self.checkpoint_dir is None else data_fingerprint(X, y),
                  "unconstrained_form": UNCONSTRAINED_FORM}
        if self.resume and any(Path(self.checkpoint_dir).iterdir()):
            saved = read_config(self.checkpoint_dir)
            check_config(self.checkpoint_dir, saved, {k: config[k] for k in RESUME_KEYS})
            check_steps_done(self.checkpoint_dir, saved["step"], self.step_limit)
        return config

    def run(self, program: "ChunkProgram", state, diagnostics: dict):
        """:func:`run_chunks` of ``program`` from ``state`` with these settings; records ``seconds`` and
        ``steps`` (the steps run) in ``diagnostics``, and for ``steps="auto"`` ``auto_steps``
        (``max_steps``, and ``stopped``: ``"levelled off"`` or ``"max_steps"``).
        Returns ``(state, objective history, step-size history)``."""
        t0 = time.perf_counter()
        out = run_chunks(program, state, steps=self.step_limit, chunk_size=self.chunk_size,
                         checkpoint_dir=self.checkpoint_dir, checkpoint_every=self.checkpoint_every, resume=self.resume,
                         progress=self.progress, diagnostics=diagnostics, auto=self.auto)
        diagnostics["seconds"], diagnostics["steps"] = time.perf_counter() - t0, len(out[1])
        if self.auto:
            diagnostics["auto_steps"] = {"max_steps": int(self.max_steps),
                                         "stopped": "levelled off" if settled(out[1]) else "max_steps"}
        return out


@dataclasses.dataclass
class ChunkProgram:
    """A fitting method as :func:`run_chunks` drives it.

    ``step`` is the static definition of one step (hashable and compared by value, e.g.
    :class:`~gpzoo.inference.svi.SviStep`): ``step.update(state, inputs, constants) -> (state,
    objective)`` is one step, where ``inputs`` are that step's ``step_inputs(step)`` (a pytree of
    arrays, e.g. its minibatch indices), ``constants`` the arrays every step reads (the data, the
    family's initial values, precomputed features; arguments of the compiled chunk, not
    checkpointed), and ``objective`` the value being maximised at the *incoming* state (ELBO, PG
    bound), so the objective of step t belongs to the parameters after t updates;
    ``step.jitter_of(state, constants)`` is the jitter the model's Cholesky factorisations need at
    ``state``. The chunk of steps is a module-level program with ``step`` static, so every run of
    one structure shares it. ``rate_at(step)`` is what ``step_size_history`` records;
    ``params_of(state)`` the constrained parameters a checkpoint stores; ``config`` names the run
    (:meth:`FitSettings.resume_config`; its :data:`RESUME_KEYS` must match to resume).
    The jitter is evaluated after every step inside the compiled chunk, and each step at which
    it rises above ``jitter`` (the spec's) or changes while above it is recorded in the
    diagnostics' ``jitter_events`` (``{"step", "jitter"}``; ``max_jitter`` is the largest,
    ``last_jitter`` the one the last state needs).
    ``after_chunk(step, state)`` runs after every completed chunk.
    """

    label: str
    objective: str
    step: Any
    step_inputs: Callable[[int], Any]
    rate_at: Callable[[int], float]
    params_of: Callable[[Any], dict]
    config: dict
    constants: Any = None
    hint: str = ""
    after_chunk: Callable[[int, Any], None] | None = None
    jitter: float = 0.0
    #: the jitter the initial state needs, when the fitter computed it with the state (else a program of its own does)
    initial_jitter: Any = None

    def record_jitter(self, steps, jitters, diagnostics: dict) -> None:
        """Append to ``diagnostics["jitter_events"]`` the steps (state after that many updates) whose
        jitter ``jitters`` ``[K]`` is above the spec's and differs from the level last recorded."""
        for step, jitter in zip(steps, np.asarray(jitters, dtype=float).tolist()):
            if jitter > self.jitter * 1.0001 and jitter != diagnostics.get("last_jitter"):
                diagnostics["jitter_events"].append({"step": int(step), "jitter": jitter})
            diagnostics["max_jitter"] = max(diagnostics.get("max_jitter", jitter), jitter)
            diagnostics["last_jitter"] = jitter


#: Hyperparameter magnitudes outside this range are named when the objective is non-finite at step 0.
EXTREME_HYPERPARAMETERS = (1e-6, 1e6)


def initial_state_diagnosis(params: dict, gradient: bool = False) -> str:
    """What a non-finite objective at step 0 (before any update), or non-finite parameters after the
    first update (``gradient``: the gradient at the start was not finite), point to: the initial
    parameters that are non-finite, hyperparameters of extreme magnitude, else the data's scale —
    never the learning rate, which has not acted yet."""
    values = {name: np.asarray(value) for name, value in params.items()}
    nonfinite = sorted(name for name, value in values.items()
                       if value.dtype.kind in "fc" and not np.all(np.isfinite(value)))
    low, high = EXTREME_HYPERPARAMETERS
    extreme = []
    for name, value in values.items():
        if not name.startswith(("kernel.", "likelihood.")) or value.dtype.kind not in "fc" or name in nonfinite:
            continue
        magnitude = np.abs(value[value != 0]) if value.size else value
        if magnitude.size and (magnitude.max() > high or magnitude.min() < low):
            shown = magnitude.max() if magnitude.max() > high else magnitude.min()
            extreme.append(f"{name} = {float(shown):.3g}")
    causes = []
    if nonfinite:
        causes.append(f"the initial value of {', '.join(nonfinite)} is not finite")
    if extreme:
        causes.append(f"hyperparameters start far from unit scale ({', '.join(extreme)})")
    found = "; ".join(causes) if causes else (
        "every initial parameter is finite, so the data are the likely cause: inputs or targets far from unit "
        "scale (a DataScaleWarning says so; fit(..., standardise=True) rescales them) or duplicated inputs "
        "with too little jitter")
    what = ("The gradient of the objective is non-finite at the initial parameters (the first update made them "
            "non-finite)" if gradient else "The objective is non-finite at the initial parameters, before any update")
    return f"{what}, so the learning rate plays no part: {found}."


class ClosureStep:
    """A step given as closures (``update(state, inputs, constants)``, ``jitter_of(state)``), keyed by
    identity: its chunk program compiles once per object. For fitters whose step is not yet a
    value-compared definition."""

    def __init__(self, update, jitter_of):
        self._update, self._jitter_of = update, jitter_of

    def update(self, state, inputs, constants):
        return self._update(state, inputs, constants)

    def jitter_of(self, state, constants):
        return self._jitter_of(state)


#: ``config`` keys that must agree between a checkpoint and the run that resumes from it
#: (:meth:`FitSettings.resume_config`).
RESUME_KEYS = ("model", "method", "num_data", "batch_size", "seed", "learning_rate", "optimizer", "dtype", "data_fingerprint",
               "unconstrained_form")


def check_steps_done(checkpoint_dir, done: int, steps: int) -> None:
    """``CheckpointError`` naming ``steps`` when a checkpoint already holds more steps than the run asks for."""
    if done > steps:
        raise CheckpointError(f"steps: the checkpoint in {str(checkpoint_dir)!r} already holds {done} steps, more than "
                              f"steps={steps}; pass steps >= {done} to continue it, or start a new run")


def _finite(tree) -> jax.Array:
    """True when every floating leaf of ``tree`` is finite (a scalar bool)."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


@functools.partial(jax.jit, static_argnums=0)
def _jitter(step, state, constants):
    """The jitter ``step``'s model needs at ``state`` (the check before the first step)."""
    return step.jitter_of(state, constants)


def restart_clock(bar) -> None:
    """Time the progress ``bar`` from now on, at its current count: after the first chunk, whose
    time is mostly compilation, so that the rate and the ETA come from compiled chunks only (else
    the ETA is many times too long until the moving average forgets the first chunk). The elapsed
    time shown counts from here too. A disabled bar has no clock."""
    if getattr(bar, "disable", True):
        return
    done = bar.n
    bar.reset()  # the clock and the rate's moving averages restart (at count 0)
    bar.n = bar.last_print_n = bar.initial = done  # initial: tqdm's rate without averages is (n - initial) / elapsed


@functools.partial(jax.jit, static_argnums=0)
def _run_chunk(step, state, inputs, active, constants):
    """``K`` steps of ``step`` in one ``lax.scan`` (inputs ``[K, ...]`` per step; ``active`` ``[K]``: padded
    steps are no-ops). Returns the state and per step (objective, state finite, jitter needed)."""
    objective_dtype = jnp.zeros(()).dtype  # the default float: float64 under x64, else float32

    def body(state, per_step):
        step_inputs, on = per_step

        def update(state):
            new_state, objective = step.update(state, step_inputs, constants)
            return new_state, jnp.asarray(objective, objective_dtype)

        # a padded step (the last chunk before a checkpoint or the end) runs no update at all
        new_state, objective = jax.lax.cond(on, update, lambda state: (state, jnp.zeros((), objective_dtype)), state)
        return new_state, (objective, _finite(new_state), step.jitter_of(new_state, constants))

    return jax.lax.scan(body, state, (inputs, active))


def run_chunks(program: ChunkProgram, state, *, steps: int, chunk_size: int, checkpoint_dir, checkpoint_every,
               resume: bool, progress: bool, diagnostics: dict, auto: bool = False):
    """Run ``program`` from ``state`` to ``steps`` steps; returns ``(state, objective history, rate history)``.

    Steps run in jit-compiled ``lax.scan`` chunks of one length (``chunk_size``; padded steps
    run no update: a ``lax.cond`` skips them), cut at the checkpoint cadence so that a checkpoint is written every
    ``checkpoint_every`` steps (default: every 10 % of the run) and at the end. ``resume=True``
    continues from the checkpoint in ``checkpoint_dir`` (when there is one); since the step
    inputs and rates are pure functions of the step, the resumed run reproduces the
    uninterrupted one exactly.

    NaN guard: a non-finite objective or state stops the run with a ``TrainingError`` naming the
    first step whose incoming state is bad; the state one step earlier is replayed (with the same
    compiled chunk) and checkpointed as the last good one. A ``KeyboardInterrupt`` checkpoints the
    last completed chunk (when it is not on disk yet) and propagates; a Ctrl-C during a checkpoint
    write is held until the write is complete (:mod:`gpzoo.inference.checkpoint`).

    ``auto=True`` (``fit(steps="auto")``; ``steps`` is then the most it may run) stops after the
    first chunk at whose end the objective history has levelled off
    (:func:`~gpzoo.inference.results.settled`), and checkpoints there. The test runs on the host
    on the history each chunk already brings back (no extra device sync), and the chunks keep
    their one compiled length, so an automatic run compiles nothing a fixed one does not. The stop
    is a function of the history alone, so a resumed automatic run stops where the uninterrupted
    one does.
    """
    checkpoint_every = checkpoint_every or max(1, steps // 10)
    if checkpoint_every < 1:
        raise InvalidArgumentError("checkpoint_every", f"must be a positive integer, got {checkpoint_every!r}")
    name = program.config.get("model")
    start, objective_hist, rate_hist = 0, [], []
    diagnostics.setdefault("jitter_events", [])
    if resume and any(Path(checkpoint_dir).iterdir()):
        config, _, state, history = load_checkpoint(checkpoint_dir, state_template=state,
                                                     expect={k: program.config.get(k) for k in RESUME_KEYS})
        start = int(config["step"])
        check_steps_done(checkpoint_dir, start, steps)
        objective_hist, rate_hist = list(history["objective"]), list(history["step_size"])
        diagnostics["jitter_events"] = list(config.get("jitter_events", []))
        diagnostics.update({k: config[k] for k in ("max_jitter", "last_jitter") if k in config})
    else:
        first = program.initial_jitter if program.initial_jitter is not None else _jitter(program.step, state, program.constants)
        program.record_jitter([start], [first], diagnostics)
        if program.after_chunk is not None:
            program.after_chunk(start, state)

    def run_chunk(state, inputs, active, constants):
        return _run_chunk(program.step, state, inputs, active, constants)

    chunk = max(1, chunk_size)  # one compiled scan length for every run (padded steps are skipped)

    def chunk_inputs(first: int, count: int):
        per_step = [program.step_inputs(s) for s in range(first, first + count)]
        per_step += [per_step[0]] * (chunk - count)
        return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *per_step), np.arange(chunk) < count, program.constants

    def checkpoint(step, state) -> bool:
        """Write a checkpoint; on a write failure (a full disk, say) warn once, naming the folder, stop
        checkpointing and go on: the fit keeps its result in memory. True when written."""
        if "checkpoint_error" in diagnostics:
            return False
        try:
            save_checkpoint(
                checkpoint_dir, params=program.params_of(state), state=state,
                history={"objective": np.asarray(objective_hist[:step]), "step_size": np.asarray(rate_hist[:step])},
                config={**program.config, "step": step, "jitter_events": diagnostics["jitter_events"],
                        **{k: diagnostics[k] for k in ("max_jitter", "last_jitter") if k in diagnostics}},
            )
        except CheckpointWriteError as exc:
            diagnostics["checkpoint_error"] = str(exc)
            warnings.warn(GPZooWarning(f"{exc}; checkpointing stops here and the fit goes on, its result kept in memory "
                                       "(save it with gpzoo.save where there is space)"), stacklevel=4)
            return False
        return True

    # (steps done, state after them), assigned in one statement so that an interrupt sees a consistent pair;
    # `previous` is the pair one chunk earlier (the NaN guard may need a state from before `committed`)
    committed, previous = (start, state), None
    saved_step = start if resume and start > 0 else None  # step of the checkpoint on disk from this run
    # "compiling" until the first chunk returns: its program is compiled (or read from the cache) first
    bar = tqdm(total=steps, initial=start, desc=program.label, disable=not progress, unit="step", leave=False,
               postfix="compiling")
    levelled = auto and settled(objective_hist)  # a resumed automatic run may have levelled off already
    try:
        while committed[0] < steps and not levelled:
            step, state = committed
            k = min(chunk, steps - step, checkpoint_every - step % checkpoint_every)
            new_state, (objective, finite, jitters) = run_chunk(state, *chunk_inputs(step, k))
            objective, finite = np.asarray(objective)[:k], np.asarray(finite)[:k]
            # jitters[j] belongs to the state after step+j+1 updates; a non-finite state is the NaN guard's
            program.record_jitter(range(step + 1, step + k + 1), np.where(finite, np.asarray(jitters)[:k], program.jitter),
                                  diagnostics)
            if not (np.all(np.isfinite(objective)) and np.all(finite)):
                # objective[j] is that of the state after step+j updates, finite[j] is about the one after step+j+1
                bad_objective = [step + int(j) for j in np.flatnonzero(~np.isfinite(objective))[:1]]
                bad_state = [step + int(j) + 1 for j in np.flatnonzero(~finite)[:1]]
                bad = min(bad_objective + bad_state)
                good = max(bad - 1, start)  # the last state whose objective and parameters are finite
                base_step, base_state = (step, state) if good >= step or previous is None else previous
                objective_hist = (objective_hist + objective.tolist())[:good]  # it held `step` entries
                rate_hist = (rate_hist + [program.rate_at(s) for s in range(step, step + k)])[:good]
                if good > base_step:
                    base_state = run_chunk(base_state, *chunk_inputs(base_step, good - base_step))[0]
                if checkpoint_dir is not None and good > start and checkpoint(good, base_state):
                    saved_step = good
                what = (f"the {program.objective} became {objective[bad - step]}" if bad_objective and bad == bad_objective[0]
                        else "the parameters became non-finite")
                where = f"; last good checkpoint (step {good}) in {checkpoint_dir}" if saved_step == good else ""
                # by step 1 the learning rate has not shaped anything (Adam's first step moves each parameter
                # by about the learning rate): the cause is the data or the starting point
                hint = initial_state_diagnosis(program.params_of(state), gradient=bad == 1) if bad <= 1 and step == 0 \
                    else program.hint
                raise TrainingError(
                    f"{what} at step {bad} of {name!r}{where}. {hint}".rstrip(),
                    step=bad,
                    checkpoint=str(checkpoint_dir) if where else None,
                )
            objective_hist.extend(objective.tolist())
            rate_hist.extend(program.rate_at(s) for s in range(step, step + k))
            committed, previous = (step + k, new_state), committed
            if program.after_chunk is not None:
                program.after_chunk(step + k, new_state)
            levelled = auto and settled(objective_hist)
            if (checkpoint_dir is not None and ((step + k) % checkpoint_every == 0 or step + k == steps or levelled)
                    and checkpoint(step + k, new_state)):
                saved_step = step + k
            bar.update(k)
            if step == start:
                restart_clock(bar)
            bar.set_postfix({program.objective.split()[-1]: f"{objective_hist[-1]:.4g}"})
    except KeyboardInterrupt:
        if checkpoint_dir is not None and committed[0] > start and saved_step != committed[0]:
            checkpoint(*committed)
        raise
    finally:
        bar.close()
    return committed[1], objective_hist[: committed[0]], rate_hist[: committed[0]]
