"""Checkpoints: parameters and optimiser state as ``.npz`` plus ``config.json``; never pickle.

Layout of a checkpoint directory::

    config.json      model name, step, data size, seed, batch size, parameter names/shapes
    params.npz       constrained parameters by site name (readable by any NumPy user)
    state.npz        the optimiser state and PRNG key as an ordered list of leaves
    history.npz      ELBO and learning-rate traces up to ``step`` (one entry per step)

Every file is written to a temporary name and renamed, ``config.json`` last, and a Ctrl-C
(SIGINT) that arrives during a write is held until all four files are in place, then raised. Each
``.npz`` also records the step it belongs to, so a set left mixed by a harder stop (a killed
process) is detected on loading rather than resumed from. ``np.load(..., allow_pickle=False)``
refuses anything that would execute code.

A checkpoint is a state to resume from, so it holds finite numbers only: :func:`save_checkpoint`
refuses to write NaN/inf parameters or objective values, and :func:`load_checkpoint` refuses
them, and a ``history.npz`` whose traces are shorter or longer than the checkpoint's step (or
than the shapes ``config.json`` records), with a :class:`~gpzoo.models.errors.CheckpointError`
whose ``argument`` is the file at fault.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import tempfile
import threading
import zipfile
from pathlib import Path

import jax
import numpy as np

from gpzoo.models.errors import CheckpointError

__all__ = ["check_config", "load_checkpoint", "read_config", "save_checkpoint"]

#: Key under which every ``.npz`` of a checkpoint stores its step (checked against ``config.json``).
STEP_KEY = "checkpoint_step"


def atomic_write(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def sigint_deferred():
    """Hold a SIGINT that arrives inside the block and deliver it to the previous handler on exit.

    Signal handlers can only be set from the main thread; elsewhere the block runs unprotected.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            if callable(previous):
                previous(signal.SIGINT, received[0])  # the default handler raises KeyboardInterrupt
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt


def save_checkpoint(directory, *, params: dict, state, history: dict, config: dict) -> Path:
    """Write a checkpoint atomically into ``directory`` (created if needed); ``config["step"]`` is required."""
    directory = Path(directory)
    leaves = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(state)]
    params_np = {k: np.asarray(v) for k, v in params.items()}
    history_np = {k: np.asarray(v) for k, v in history.items()}
    if STEP_KEY in params_np or STEP_KEY in history_np:
        raise CheckpointError(f"{STEP_KEY!r} is reserved for the checkpoint's step", argument=STEP_KEY)
    bad = _non_finite(params_np, directory / "params.npz") or _non_finite(history_np, directory / "history.npz")
    if bad:
        raise CheckpointError(f"refusing to write a checkpoint in {str(directory)!r}: {bad[1]}; a checkpoint is a state "
                              "to resume from", argument=bad[0])
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"checkpoint_dir {str(directory)!r} cannot be created: {exc}", argument=str(directory)) from None
    config = dict(config)
    step = np.asarray(int(config["step"]))
    config["params"] = {k: list(v.shape) for k, v in params_np.items()}
    config["state_leaves"] = [list(leaf.shape) for leaf in leaves]
    config["history"] = {k: list(v.shape) for k, v in history_np.items()}
    try:
        with sigint_deferred():
            atomic_write(directory / "params.npz", lambda fh: np.savez(fh, **params_np, **{STEP_KEY: step}))
            atomic_write(directory / "state.npz", lambda fh: np.savez(fh, *leaves, **{STEP_KEY: step}))
            atomic_write(directory / "history.npz", lambda fh: np.savez(fh, **history_np, **{STEP_KEY: step}))
            atomic_write(directory / "config.json",
                         lambda fh: fh.write(json.dumps(config, indent=2, default=_jsonable).encode()))
    except OSError as exc:  # a full disk, a quota, a read-only or vanished folder: the files written stay consistent
        reason = errno.errorcode.get(exc.errno, "") if exc.errno else ""
        raise CheckpointWriteError(f"cannot write the checkpoint of step {int(step)} to {str(directory)!r}: "
                                   f"{exc.strerror or exc}{f' ({reason})' if reason else ''}",
                                   argument=str(directory)) from None
    return directory


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (no space left, no permission, ...). ``argument`` is the
    folder. The run itself is unaffected: ``fit`` warns and keeps its result in memory."""


def _non_finite(arrays: dict, path: Path) -> tuple[str, str] | None:
    """``(argument, sentence)`` about the first floating-point array of ``arrays`` with a NaN/inf
    value (``argument``: ``"PATH:NAME"``), or None when all are finite."""
    for name, arr in arrays.items():
        if arr.dtype.kind in "fc" and not np.all(np.isfinite(arr)):
            bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
            return f"{path}:{name}", f"{path.name} holds {bad} NaN/inf value(s) in {name!r}"
    return None


def read_config(directory) -> dict:
    """``config.json`` of the checkpoint in ``directory``; ``CheckpointError`` when missing or corrupt."""
    path = Path(directory) / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint in {str(directory)!r} is incomplete: config.json missing", argument=str(path)) from None
    except (ValueError, OSError, RecursionError) as exc:
        raise CheckpointError(f"checkpoint in {str(directory)!r} is corrupt: {type(exc).__name__}: {exc or 'empty file'}",
                              argument=str(path)) from None
    if not isinstance(config, dict) or type(config.get("step")) is not int or config["step"] < 0:
        raise CheckpointError(f"checkpoint in {str(directory)!r} is corrupt: config.json holds no integer 'step'",
                              argument=str(path))
    return config


def check_config(directory, config: dict, expect: dict) -> None:
    """``CheckpointError`` naming every ``expect`` entry that the checkpoint's ``config`` does not match
    (a missing ``method`` reads as ``"svi"``, the only method of older checkpoints)."""
    config = {"method": "svi", **config}
    differing = [k for k, v in expect.items() if config.get(k) != v]
    if differing:
        raise CheckpointError(f"checkpoint in {str(directory)!r} does not match this run: "
                              + "; ".join(_difference(k, config.get(k), expect[k]) for k in differing)
                              + ". Resume with the same data and settings, or start a new run in another checkpoint_dir",
                              argument=differing[0])


def _difference(key: str, saved, now) -> str:
    """One clause of a resume mismatch: what ``key`` was in the checkpoint and what it is now."""
    if key == "data_fingerprint":
        return "the training data (X, y) differ from the data the checkpoint was written with (their SHA-256 differs)"
    if saved is None:
        return f"{key} is {now!r} now but not recorded in the checkpoint (written by an older gpzoo)"
    return f"{key} is {saved!r} in the checkpoint but {now!r} now"


def _jsonable(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def load_checkpoint(directory, state_template=None, expect: dict | None = None):
    """Read a checkpoint; returns ``(config, params, state, history)``.

    ``expect`` holds ``config.json`` entries the caller requires (e.g. the model name and data
    size; :func:`check_config`);
    ``state_template`` (a freshly initialised optimiser state of the same model) gives the tree
    structure, and its leaf shapes must match the saved ones. Either mismatch raises
    ``CheckpointError``.
    """
    directory = Path(directory)
    steps = {}
    config = read_config(directory)
    current = directory / "params.npz"
    try:
        with np.load(current, allow_pickle=False) as f:
            params = {k: f[k] for k in f.files if k != STEP_KEY}
            steps["params.npz"] = f[STEP_KEY] if STEP_KEY in f.files else None
        current = directory / "state.npz"
        with np.load(current, allow_pickle=False) as f:
            leaves = [f[f"arr_{i}"] for i in range(sum(k.startswith("arr_") for k in f.files))]
            steps["state.npz"] = f[STEP_KEY] if STEP_KEY in f.files else None
        current = directory / "history.npz"
        with np.load(current, allow_pickle=False) as f:
            history = {k: f[k] for k in f.files if k != STEP_KEY}
            steps["history.npz"] = f[STEP_KEY] if STEP_KEY in f.files else None
    except FileNotFoundError as exc:
        raise CheckpointError(f"checkpoint in {str(directory)!r} is incomplete: {Path(exc.filename).name} missing",
                              argument=str(current)) from None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise CheckpointError(f"checkpoint in {str(directory)!r} is corrupt: {current.name}: {type(exc).__name__}: "
                              f"{exc or 'empty file'}", argument=str(current)) from None
    mixed = {name: int(step) for name, step in steps.items() if step is not None and int(step) != config.get("step")}
    if mixed:  # files from different writes: an earlier write was cut short
        raise CheckpointError(f"checkpoint in {str(directory)!r} is inconsistent: config.json is at step "
                              f"{config.get('step')} but {mixed} (a write was interrupted)",
                              argument=str(directory / next(iter(mixed))))
    _check_history(directory, config, history)
    bad = _non_finite(params, directory / "params.npz") or _non_finite(history, directory / "history.npz")
    if bad:
        raise CheckpointError(f"checkpoint in {str(directory)!r} is not a state to resume from: {bad[1]}",
                              argument=bad[0])
    if expect:
        check_config(directory, config, expect)
    state = None
    if state_template is not None:
        template_leaves, treedef = jax.tree_util.tree_flatten(state_template)
        shapes_ok = len(template_leaves) == len(leaves) and all(
            np.shape(t) == np.shape(s) for t, s in zip(template_leaves, leaves)
        )
        if not shapes_ok:
            raise CheckpointError(
                f"checkpoint in {str(directory)!r} does not match this model "
                f"(saved {len(leaves)} state arrays, expected {len(template_leaves)} of other shapes)",
                argument=str(directory / "state.npz"),
            )
        state = jax.tree_util.tree_unflatten(
            treedef, [np.asarray(s, dtype=np.asarray(t).dtype) for t, s in zip(template_leaves, leaves)]
        )
    return config, params, state, history


def _check_history(directory: Path, config: dict, history: dict) -> None:
    """``CheckpointError`` naming ``history.npz`` unless each trace holds one entry per step (and,
    where ``config.json`` records them, exactly the traces and shapes written)."""
    path = directory / "history.npz"
    recorded = config.get("history")
    if isinstance(recorded, dict):
        shapes = {k: list(np.shape(v)) for k, v in history.items()}
        if shapes != recorded:
            raise CheckpointError(f"checkpoint in {str(directory)!r} is corrupt: history.npz holds traces {shapes}, "
                                  f"config.json records {recorded} (shortened, truncated or replaced)", argument=str(path))
    for name, trace in history.items():
        if np.ndim(trace) >= 1 and len(trace) != config["step"]:
            raise CheckpointError(f"checkpoint in {str(directory)!r} is corrupt: history.npz holds {len(trace)} entries of "
                                  f"{name!r} but the checkpoint is at step {config['step']} (shortened or truncated)",
                                  argument=f"{path}:{name}")
