"""Training data as every fitter sees it: eager validation, minibatch schedules, row chunks.

``validate_data`` is the one place where X and y are checked against a spec (typed errors naming
the argument, before any tracing) and cast to :func:`~gpzoo.inference.linalg.float_dtype`.
Minibatches are a pure function of (seed, step) (:class:`BatchSchedule`), so a resumed fit sees
exactly the batches of the uninterrupted one.

Data larger than memory: :class:`MemmapSource` (:func:`open_npy`) reads X from a memory-mapped
``.npy`` file, a minibatch (or a chunk of rows) at a time; ``fit`` and ``predict`` accept it in
place of X (and y).
"""

from __future__ import annotations

import hashlib
import mmap
import os
from pathlib import Path

import numpy as np

from gpzoo.inference.linalg import float_dtype
from gpzoo.models.errors import InvalidArgumentError, ShapeError, as_float_array

__all__ = ["INIT_ROWS", "BatchSchedule", "MemmapSource", "check_new_inputs", "check_new_source", "data_fingerprint",
           "num_latent_functions", "open_npy", "row_slices", "validate_data", "validate_source"]

#: Bytes of X read at once when a :class:`MemmapSource` is checked, fingerprinted or subsampled.
CHUNK_BYTES = 16 * 2**20
#: Rows of a :class:`MemmapSource` the inducing variables are initialised from: all of a smaller
#: data set (then a source and in-memory arrays give the same fit), else a seeded subsample.
INIT_ROWS = 10_000


class MemmapSource:
    """Inputs X ``[N, D]`` in a ``.npy`` file, memory-mapped (``np.load(mmap_mode="r")``), and targets y ``[N]``.

    Never holds all of X: :meth:`rows` reads the rows a minibatch or a chunk needs and then hands
    the mapped pages back to the operating system (``madvise(MADV_DONTNEED)``; they stay in the
    page cache, outside this process's resident memory). Rows come out as
    :func:`~gpzoo.inference.linalg.float_dtype` arrays cast exactly as in-memory data are, so
    ``fit``/``predict`` on a source give the results of the same arrays held in memory.
    ``y`` (a path to a ``.npy`` file, an array, or None for prediction inputs) is small and loaded.
    """

    def __init__(self, X, y=None):
        if isinstance(X, (str, os.PathLike)):
            path = Path(X)
            if not path.is_file():
                raise InvalidArgumentError("X", f"no such file {str(path)!r}")
            try:
                X = np.load(path, mmap_mode="r", allow_pickle=False)
            except (ValueError, OSError) as exc:
                raise InvalidArgumentError("X", f"{str(path)!r} is not a readable .npy file ({exc})") from None
        if not isinstance(X, np.ndarray):
            raise InvalidArgumentError("X", f"expected a .npy path or a memory-mapped array, got {type(X).__name__}")
        if X.ndim != 2:
            raise ShapeError("X", f"expected a 2-D array [N, D], got shape {X.shape}")
        if X.dtype == object or not (np.issubdtype(X.dtype, np.number) or X.dtype == bool):
            raise InvalidArgumentError("X", f"must be numeric, got dtype {X.dtype}")
        if isinstance(y, (str, os.PathLike)):
            if not Path(y).is_file():
                raise InvalidArgumentError("y", f"no such file {str(y)!r}")
            y = np.load(y, allow_pickle=False)
        self.X, self.y = X, None if y is None else np.asarray(y)
        self._map = getattr(X, "_mmap", None) if isinstance(X, np.memmap) else None
        # a whole C-ordered .npy file (not a view of one): rows are read from the file itself
        whole_file = isinstance(X, np.memmap) and isinstance(X.base, mmap.mmap) and X.flags.c_contiguous
        self._file = open(X.filename, "rb") if whole_file and X.filename else None  # noqa: SIM115 - kept open for reads

    def __del__(self):
        if getattr(self, "_file", None) is not None:
            self._file.close()

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.X.shape)

    def __len__(self) -> int:
        return int(self.X.shape[0])

    def __repr__(self) -> str:
        where = f" of {self.X.filename!r}" if isinstance(self.X, np.memmap) else ""
        return f"MemmapSource(X{where} {self.X.shape} {self.X.dtype}, y={None if self.y is None else self.y.shape})"

    @property
    def chunk_rows(self) -> int:
        """Rows read at once by :meth:`chunks` (about :data:`CHUNK_BYTES`)."""
        return max(1, CHUNK_BYTES // max(1, self.X.shape[1] * self.X.dtype.itemsize))

    def release(self) -> None:
        """Drop the mapped pages from this process's resident memory (no-op for an in-memory array)."""
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def raw_rows(self, index) -> np.ndarray:
        """Rows ``index`` (a slice or integer array) of X as stored ``[n, D]``.

        From a ``.npy`` file the rows are read with ``os.pread`` (into the page cache, not into
        this process): touching a memory map maps whole runs of file pages around every row read
        (about a megabyte each with large page-cache folios), so a few hundred scattered rows would
        map hundreds of megabytes. Other arrays are indexed, then their pages handed back.
        """
        if self._file is None:
            out = np.array(self.X[index])
            self.release()
            return out
        N, D = self.X.shape
        row = D * self.X.dtype.itemsize
        fd = self._file.fileno()
        if isinstance(index, slice):
            start, stop, stride = index.indices(N)
            if stride == 1:
                count = max(0, stop - start)
                data = os.pread(fd, count * row, self.X.offset + start * row) if count else b""
                return np.frombuffer(data, self.X.dtype).reshape(count, D)
            index = np.arange(start, stop, stride)
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        if index.size and (index.min() < 0 or index.max() >= N):
            raise IndexError(f"row index out of range [0, {N})")
        out = np.empty((index.size, D), self.X.dtype)  # [n, D]
        for k, r in enumerate(index.tolist()):
            out[k] = np.frombuffer(os.pread(fd, row, self.X.offset + r * row), self.X.dtype)
        return out

    def rows(self, index, argument: str = "X") -> np.ndarray:
        """Rows ``index`` of X as the fit reads them: checked finite and cast to float_dtype ``[n, D]``."""
        return as_float_array(self.raw_rows(index), argument, ndim=2).astype(float_dtype())

    def chunks(self, argument: str = "X"):
        """``(slice, rows)`` over all of X, :attr:`chunk_rows` at a time (each checked and cast as :meth:`rows`)."""
        for sl in row_slices(len(self), self.chunk_rows):
            yield sl, self.rows(sl, argument)


def open_npy(X_path, y_path=None) -> MemmapSource:
    """A :class:`MemmapSource` over the ``.npy`` files of X ``[N, D]`` (and y ``[N]``)."""
    return MemmapSource(X_path, y_path)


def validate_source(spec, source: MemmapSource, y=None):
    """Eager checks of a source's X (chunk by chunk, never all at once) and of y (``y`` or the source's own).

    Returns y as :func:`validate_data` does.
    """
    y = source.y if y is None else y
    if y is None:
        raise InvalidArgumentError("y", "the data source holds no targets: pass y, or open_npy(X_path, y_path)")
    y = spec.likelihood.validate_targets(y)
    if y.shape[0] != len(source):
        raise ShapeError("y", f"has {y.shape[0]} rows but X has {len(source)}")
    if len(source) == 0:
        raise ShapeError("X", "is empty")
    check = getattr(spec.covariance_model, "validate_inputs", None)
    for _, chunk in source.chunks("X"):
        if check is not None:
            check(chunk)
    return y


def check_new_source(res, source: MemmapSource, argument: str = "X_new") -> MemmapSource:
    """:func:`check_new_inputs` for a data source, chunk by chunk."""
    if len(source) == 0:
        raise ShapeError(argument, f"is empty (shape {source.shape}); pass at least one row")
    if source.shape[1] != res.X_train.shape[1]:
        raise ShapeError(argument, f"has {source.shape[1]} columns; the model was fitted on {res.X_train.shape[1]}")
    check = getattr(res.spec.covariance_model, "validate_inputs", None)
    for _, chunk in source.chunks(argument):
        if check is not None:
            check(chunk)
    return source


def initial_rows(source: MemmapSource, seed: int) -> np.ndarray:
    """The rows the inducing variables start from: all of X up to :data:`INIT_ROWS` rows, else a
    seeded subsample of that many (in file order)."""
    if len(source) <= INIT_ROWS:
        return np.concatenate([chunk for _, chunk in source.chunks()])
    idx = np.sort(np.random.default_rng([seed, 1]).choice(len(source), INIT_ROWS, replace=False))
    return source.rows(idx)


def validate_data(spec, X, y):
    """Eager checks of X ``[N, D]`` and y against ``spec``; returns NumPy arrays (X float, y as targets)."""
    X = as_float_array(X, "X", ndim=2)
    y = spec.likelihood.validate_targets(y)
    if y.shape[0] != X.shape[0]:
        raise ShapeError("y", f"has {y.shape[0]} rows but X has {X.shape[0]}")
    if X.shape[0] == 0:
        raise ShapeError("X", "is empty")
    check = getattr(spec.covariance_model, "validate_inputs", None)
    if check is not None:
        check(X)
    return X.astype(float_dtype()), y


def check_new_inputs(res, X, argument: str = "X_new", *, original_units: bool = False) -> np.ndarray:
    """Eager checks of inputs ``X`` ``[N, D]`` for the fitted model ``res`` (same width D, kernel's own checks).

    ``original_units``: ``X`` is in the units of the data passed to ``fit``; a model fitted with
    ``standardise=True`` maps it to its own (in float64, before the cast to the model's precision)."""
    X = as_float_array(X, argument, ndim=2)
    if X.shape[0] == 0:
        raise ShapeError(argument, f"is empty (shape {X.shape}); pass at least one row")
    if X.shape[1] != res.X_train.shape[1]:
        raise ShapeError(argument, f"has {X.shape[1]} columns; the model was fitted on {res.X_train.shape[1]}")
    check = getattr(res.spec.covariance_model, "validate_inputs", None)
    if check is not None:
        check(X)
    if original_units and getattr(res, "standardisation", None) is not None:
        X = res.standardisation.inputs(X)
    return X.astype(float_dtype())


def data_fingerprint(X, y) -> str:
    """SHA-256 (hex) of the training data: shapes, dtypes and bytes of X and y.

    A checkpoint records it, and resuming on other data (even of the same shape) is refused.
    A :class:`MemmapSource` is read chunk by chunk, its rows as the fit reads them (float_dtype),
    so it has the fingerprint of the same data held in memory.
    """
    digest = hashlib.sha256()
    if isinstance(X, MemmapSource):
        digest.update(f"{np.dtype(float_dtype()).str}{X.shape}".encode())
        for _, chunk in X.chunks():
            digest.update(np.ascontiguousarray(chunk).data)
    else:
        array = np.ascontiguousarray(X)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.data)
    array = np.ascontiguousarray(y)
    digest.update(f"{array.dtype.str}{array.shape}".encode())
    digest.update(array.data)
    return digest.hexdigest()


def num_latent_functions(spec) -> int:
    """L, the number of latent functions of ``spec``'s likelihood (one per class where it needs them)."""
    return spec.likelihood.num_latent(getattr(spec.likelihood, "num_classes", None))


def row_slices(num_rows: int, size: int):
    """Consecutive slices of at most ``size`` rows covering ``range(num_rows)``."""
    for start in range(0, num_rows, size):
        yield slice(start, min(num_rows, start + size))


class BatchSchedule:
    """Minibatch indices ``[B]`` as a pure function of the step: epoch-wise permutations (no replacement)."""

    def __init__(self, num_data: int, batch_size: int, seed: int):
        self.N, self.B, self.seed = num_data, batch_size, seed
        self.per_epoch = max(1, num_data // batch_size)
        self._epoch, self._perm = -1, None

    def __call__(self, step: int) -> np.ndarray:
        if self.B == self.N:
            return np.arange(self.N)
        epoch, pos = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.N)
        return self._perm[pos * self.B : (pos + 1) * self.B]
