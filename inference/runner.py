"""The chunk runner every fitter shares: jit-compiled ``lax.scan`` chunks of steps, a progress bar,
checkpoints and exact resume, a NaN guard, and Ctrl-C that keeps the last completed chunk.

A fitter describes one step as a :class:`ChunkProgram` and hands it to :func:`run_chunks`
(the SVI fitter, :mod:`gpzoo.inference.svi`; the Pólya–Gamma natural-gradient fitter,
:mod:`gpzoo.inference.pg_natgrad`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from gpzoo.inference.checkpoint import load_checkpoint, save_checkpoint
from gpzoo.models.errors import InvalidArgumentError, TrainingError

__all__ = ["RESUME_KEYS", "ChunkProgram", "FitSettings", "run_chunks"]


@dataclasses.dataclass(frozen=True)
class FitSettings:
    """The run settings every fitter shares (the keyword arguments of :func:`gpzoo.inference.fit.fit`).

    ``batch_size=None`` uses all data each step; ``optimizer`` defaults to Adam with
    ``learning_rate`` (a float or an optax schedule); ``inducing`` replaces the spec's initial
    inducing variables; checkpoints go to ``checkpoint_dir`` every ``checkpoint_every`` steps.
    """

    steps: int = 1000
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

    @classmethod
    def from_keywords(cls, run: dict) -> "FitSettings":
        """Settings from ``fit``-style keyword arguments; an unknown one is an ``InvalidArgumentError`` naming it."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(run) - known)
        if unknown:
            raise InvalidArgumentError(unknown[0], f"is not a fit setting; settings: {sorted(known)}")
        return cls(**run)

    def batch_size_for(self, num_data: int) -> int:
        """Eager checks of the settings for ``num_data`` training points; returns the batch size B."""
        if not isinstance(self.steps, (int, np.integer)) or self.steps < 0:
            raise InvalidArgumentError("steps", f"must be a non-negative integer, got {self.steps!r}")
        B = num_data if self.batch_size is None else self.batch_size
        if not isinstance(B, (int, np.integer)) or not 1 <= B <= num_data:
            raise InvalidArgumentError("batch_size", f"must be an integer in [1, {num_data}], got {self.batch_size!r}")
        if self.resume and self.checkpoint_dir is None:
            raise InvalidArgumentError("resume", "resume=True needs checkpoint_dir")
        return int(B)

    def run(self, program: "ChunkProgram", state, diagnostics: dict):
        """:func:`run_chunks` of ``program`` from ``state`` with these settings; records ``seconds`` and
        ``steps`` in ``diagnostics``. Returns ``(state, objective history, step-size history)``."""
        t0 = time.perf_counter()
        out = run_chunks(program, state, steps=self.steps, chunk_size=self.chunk_size, checkpoint_dir=self.checkpoint_dir,
                         checkpoint_every=self.checkpoint_every, resume=self.resume, progress=self.progress,
                         diagnostics=diagnostics)
        diagnostics["seconds"], diagnostics["steps"] = time.perf_counter() - t0, self.steps
        return out


@dataclasses.dataclass
class ChunkProgram:
    """A fitting method as :func:`run_chunks` drives it.

    ``update(state, inputs, constants) -> (state, objective)`` is one step: ``inputs`` are that
    step's ``step_inputs(step)`` (a pytree of arrays, e.g. its minibatch indices), ``constants``
    the arrays every step reads (the data, precomputed features; passed to the compiled chunk as
    arguments rather than baked into it, and not checkpointed), and ``objective`` the value being
    maximised at the *incoming* state (ELBO, PG bound), so the objective of step t belongs to the
    parameters after t updates. ``rate_at(step)`` is what ``step_size_history``
    records; ``params_of(state)`` the constrained parameters a checkpoint stores; ``config`` names
    the run (``model``, ``method``, ``num_data``, ``batch_size``, ``seed``; the first four must
    match to resume). ``after_chunk(step, state)`` runs after every completed chunk (e.g. to
    record jitter increases in the diagnostics).
    """

    label: str
    objective: str
    update: Callable[[Any, Any, Any], tuple[Any, jax.Array]]
    step_inputs: Callable[[int], Any]
    rate_at: Callable[[int], float]
    params_of: Callable[[Any], dict]
    config: dict
    constants: Any = None
    hint: str = ""
    after_chunk: Callable[[int, Any], None] | None = None


#: ``config`` keys that must agree between a checkpoint and the run that resumes from it.
RESUME_KEYS = ("model", "method", "num_data", "batch_size")


def _finite(tree) -> jax.Array:
    """True when every floating leaf of ``tree`` is finite (a scalar bool)."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.asarray(True)


def run_chunks(program: ChunkProgram, state, *, steps: int, chunk_size: int, checkpoint_dir, checkpoint_every,
               resume: bool, progress: bool, diagnostics: dict):
    """Run ``program`` from ``state`` to ``steps`` steps; returns ``(state, objective history, rate history)``.

    Steps run in jit-compiled ``lax.scan`` chunks of one length (``chunk_size``; padded steps
    leave the state as is), cut at the checkpoint cadence so that a checkpoint is written every
    ``checkpoint_every`` steps (default: every 10 % of the run) and at the end. ``resume=True``
    continues from the checkpoint in ``checkpoint_dir`` (when there is one); since the step
    inputs and rates are pure functions of the step, the resumed run reproduces the
    uninterrupted one exactly.

    NaN guard: a non-finite objective or state stops the run with a ``TrainingError`` naming the
    first step whose incoming state is bad; the state one step earlier is replayed (with the same
    compiled chunk) and checkpointed as the last good one. A ``KeyboardInterrupt`` checkpoints the
    last completed chunk (when it is not on disk yet) and propagates; a Ctrl-C during a checkpoint
    write is held until the write is complete (:mod:`gpzoo.inference.checkpoint`).
    """
    checkpoint_every = checkpoint_every or max(1, steps // 10)
    if checkpoint_every < 1:
        raise InvalidArgumentError("checkpoint_every", f"must be a positive integer, got {checkpoint_every!r}")
    name = program.config.get("model")
    start, objective_hist, rate_hist = 0, [], []
    if resume and (Path(checkpoint_dir) / "config.json").exists():
        config, _, state, history = load_checkpoint(checkpoint_dir, state_template=state,
                                                     expect={k: program.config.get(k) for k in RESUME_KEYS})
        start = int(config["step"])
        objective_hist, rate_hist = list(history["objective"]), list(history["step_size"])
        diagnostics["jitter_events"] = list(config.get("jitter_events", []))
    elif program.after_chunk is not None:
        program.after_chunk(start, state)

    def run_chunk(state, inputs, active, constants):  # inputs: [K, ...] per step, active [K]: padded steps are no-ops
        def body(state, step):
            step_inputs, on = step
            new_state, objective = program.update(state, step_inputs, constants)
            new_state = jax.tree_util.tree_map(lambda a, b: jnp.where(on, a, b), new_state, state)
            return new_state, (objective, _finite(new_state))

        return jax.lax.scan(body, state, (inputs, active))

    run_chunk = jax.jit(run_chunk)
    chunk = max(1, min(chunk_size, steps))  # one compiled scan length for the whole run

    def chunk_inputs(first: int, count: int):
        per_step = [program.step_inputs(s) for s in range(first, first + count)]
        per_step += [per_step[0]] * (chunk - count)
        return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *per_step), np.arange(chunk) < count, program.constants

    def checkpoint(step, state):
        save_checkpoint(
            checkpoint_dir, params=program.params_of(state), state=state,
            history={"objective": np.asarray(objective_hist[:step]), "step_size": np.asarray(rate_hist[:step])},
            config={**program.config, "step": step, "jitter_events": diagnostics["jitter_events"]},
        )

    # (steps done, state after them), assigned in one statement so that an interrupt sees a consistent pair;
    # `previous` is the pair one chunk earlier (the NaN guard may need a state from before `committed`)
    committed, previous = (start, state), None
    saved_step = start if resume and start > 0 else None  # step of the checkpoint on disk from this run
    bar = tqdm(total=steps, initial=start, desc=program.label, disable=not progress, unit="step", leave=False)
    try:
        while committed[0] < steps:
            step, state = committed
            k = min(chunk, steps - step, checkpoint_every - step % checkpoint_every)
            new_state, (objective, finite) = run_chunk(state, *chunk_inputs(step, k))
            objective, finite = np.asarray(objective)[:k], np.asarray(finite)[:k]
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
                if checkpoint_dir is not None and good > start:
                    checkpoint(good, base_state)
                    saved_step = good
                what = (f"the {program.objective} became {objective[bad - step]}" if bad_objective and bad == bad_objective[0]
                        else "the parameters became non-finite")
                where = f"; last good checkpoint (step {good}) in {checkpoint_dir}" if saved_step == good else ""
                raise TrainingError(
                    f"{what} at step {bad} of {name!r}{where}. {program.hint}".rstrip(),
                    step=bad,
                    checkpoint=str(checkpoint_dir) if where else None,
                )
            objective_hist.extend(objective.tolist())
            rate_hist.extend(program.rate_at(s) for s in range(step, step + k))
            committed, previous = (step + k, new_state), committed
            if program.after_chunk is not None:
                program.after_chunk(step + k, new_state)
            if checkpoint_dir is not None and ((step + k) % checkpoint_every == 0 or step + k == steps):
                checkpoint(step + k, new_state)
                saved_step = step + k
            bar.update(k)
            bar.set_postfix({program.objective.split()[-1]: f"{objective_hist[-1]:.4g}"})
    except KeyboardInterrupt:
        if checkpoint_dir is not None and committed[0] > start and saved_step != committed[0]:
            checkpoint(*committed)
        raise
    finally:
        bar.close()
    return committed[1], objective_hist[: committed[0]], rate_hist[: committed[0]]
