"""Checkpoints: parameters and optimiser state as ``.npz`` plus ``config.json``; never pickle.

Layout of a checkpoint directory::

    config.json      model name, step, data size, seed, batch size, parameter names/shapes
    params.npz       constrained parameters by site name (readable by any NumPy user)
    state.npz        the optimiser state and PRNG key as an ordered list of leaves
    history.npz      ELBO and learning-rate traces up to ``step``

Every file is written to a temporary name and renamed, and ``config.json`` is renamed last, so
an interrupted write leaves the previous checkpoint intact. ``np.load(..., allow_pickle=False)``
refuses anything that would execute code.
"""

from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path

import jax
import numpy as np

from models.errors import CheckpointError

__all__ = ["load_checkpoint", "save_checkpoint"]


def _atomic_write(path: Path, write) -> None:
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


def save_checkpoint(directory, *, params: dict, state, history: dict, config: dict) -> Path:
    """Write a checkpoint atomically into ``directory`` (created if needed)."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"checkpoint_dir {str(directory)!r} cannot be created: {exc}") from None
    leaves = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(state)]
    params_np = {k: np.asarray(v) for k, v in params.items()}
    config = dict(config)
    config["params"] = {k: list(v.shape) for k, v in params_np.items()}
    config["state_leaves"] = [list(leaf.shape) for leaf in leaves]
    _atomic_write(directory / "params.npz", lambda fh: np.savez(fh, **params_np))
    _atomic_write(directory / "state.npz", lambda fh: np.savez(fh, *leaves))
    _atomic_write(directory / "history.npz", lambda fh: np.savez(fh, **{k: np.asarray(v) for k, v in history.items()}))
    _atomic_write(directory / "config.json", lambda fh: fh.write(json.dumps(config, indent=2, default=_jsonable).encode()))
    return directory


def _jsonable(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def load_checkpoint(directory, state_template=None):
    """Read a checkpoint; returns ``(config, params, state, history)``.

    ``state_template`` (a freshly initialised optimiser state of the same model) gives the tree
    structure; its leaf shapes must match the saved ones or ``CheckpointError`` is raised.
    """
    directory = Path(directory)
    try:
        config = json.loads((directory / "config.json").read_text())
        with np.load(directory / "params.npz", allow_pickle=False) as f:
            params = {k: f[k] for k in f.files}
        with np.load(directory / "state.npz", allow_pickle=False) as f:
            leaves = [f[f"arr_{i}"] for i in range(len(f.files))]
        with np.load(directory / "history.npz", allow_pickle=False) as f:
            history = {k: f[k] for k in f.files}
    except FileNotFoundError as exc:
        raise CheckpointError(f"checkpoint in {str(directory)!r} is incomplete: {Path(exc.filename).name} missing") from None
    except (ValueError, OSError, zipfile.BadZipFile, json.JSONDecodeError, KeyError) as exc:
        raise CheckpointError(f"checkpoint in {str(directory)!r} is corrupt: {exc}") from None
    state = None
    if state_template is not None:
        template_leaves, treedef = jax.tree_util.tree_flatten(state_template)
        shapes_ok = len(template_leaves) == len(leaves) and all(
            np.shape(t) == np.shape(s) for t, s in zip(template_leaves, leaves)
        )
        if not shapes_ok:
            raise CheckpointError(
                f"checkpoint in {str(directory)!r} does not match this model "
                f"(saved {len(leaves)} state arrays, expected {len(template_leaves)} of other shapes)"
            )
        state = jax.tree_util.tree_unflatten(
            treedef, [np.asarray(s, dtype=np.asarray(t).dtype) for t, s in zip(template_leaves, leaves)]
        )
    return config, params, state, history
