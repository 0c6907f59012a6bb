"""Typed errors and eager input checks shared by every gpzoo layer.

Every check runs on concrete (NumPy / non-traced JAX) values before any JAX tracing, so a user
sees one sentence naming the offending argument instead of a traceback from inside XLA.
"""

from __future__ import annotations

import difflib
import re
import warnings
from collections.abc import Sequence

import numpy as np
from jax import core as jax_core


class GPZooError(Exception):
    """Base class of every error gpzoo raises on purpose.

    ``argument`` names what is wrong: the argument, path, file or field (``"FILE:FIELD"``), or None
    where nothing applies. A subclass sets it in its constructor; one constructed with a message
    alone takes it from the argument its message starts with, when it starts with one (a single
    word followed by a colon, as in ``"out_dir: cannot write ..."``, or by a quoted value, as in
    ``"checkpoint_dir '/runs/a' does not exist"``), else None.
    """

    argument: str | None = None

    def __init__(self, *args, argument: str | None = None):
        super().__init__(*args)
        if argument is not None:
            self.argument = argument
        elif type(self).argument is None and "argument" not in self.__dict__:
            self.argument = _leading_argument(args[0]) if len(args) == 1 else None


#: The argument an error message starts with: one identifier (dots allowed), then a colon and a
#: space (``"steps: ..."``) or a space and a quoted value (``"checkpoint_dir '/runs/a' does not exist"``).
_ARGUMENT_PREFIX = re.compile(r"([A-Za-z_][A-Za-z0-9_.]*)(?:: | ['\"])")


def _leading_argument(message) -> str | None:
    match = _ARGUMENT_PREFIX.match(message) if isinstance(message, str) else None
    return match.group(1) if match else None


class InvalidArgumentError(GPZooError, ValueError):
    """An argument has the wrong value, shape or dtype. ``argument`` names it; ``message`` is the
    sentence about it (the error's text is ``"argument: message"``)."""

    def __init__(self, argument: str, message: str):
        self.argument = argument
        self.message = message
        super().__init__(f"{argument}: {message}")


class ShapeError(InvalidArgumentError):
    """An array argument has the wrong shape."""


class DataError(InvalidArgumentError):
    """Data contain NaN/inf, labels outside the likelihood's support, or similar."""


class HyperparameterError(InvalidArgumentError):
    """A kernel or likelihood hyperparameter is outside its domain (e.g. non-positive)."""


class CheckpointError(GPZooError, OSError):
    """A checkpoint is missing, corrupt, non-finite, or belongs to a different model. ``argument``
    is the checkpoint file or folder at fault (or the setting that differs); pass it as
    ``argument=``, else it is read from an ``"argument: ..."`` prefix of the message."""

    def __init__(self, message: str, argument: str | None = None):
        super().__init__(message, argument=None if argument is None else str(argument))


class TrainingError(GPZooError, FloatingPointError):
    """Training diverged (NaN/inf loss); ``step`` is the first bad step.

    ``argument`` is the checkpoint written before the bad step, when there is one, else None.
    """

    def __init__(self, message: str, step: int | None, checkpoint: str | None = None):
        self.step = step
        self.checkpoint = checkpoint
        super().__init__(message, argument=None if checkpoint is None else str(checkpoint))


class NumericalError(TrainingError):
    """A factorisation or a variance failed numerically (e.g. a Cholesky, a negative Nyström
    residual). ``layer`` and ``stage`` say where; ``step`` is the training step, or ``None``
    outside training. A subclass of ``TrainingError`` so a fit's divergence handling catches it.
    """

    def __init__(self, message: str, layer: str, stage: str, step: int | None = None, checkpoint: str | None = None):
        self.layer = layer
        self.stage = stage
        where = f"{layer}, {stage}" + ("" if step is None else f", training step {step}")
        super().__init__(f"{where}: {message}", step=step, checkpoint=checkpoint)


def closest_name(name, valid: Sequence[str]) -> str | None:
    """The valid name nearest to a mistyped ``name`` (``difflib.get_close_matches``, case ignored),
    or None when none is close."""
    if not isinstance(name, str):
        return None
    by_lower = {v.lower(): v for v in valid}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1)
    return by_lower[close[0]] if close else None


def unknown_name_message(kind: str, name, valid: Sequence[str]) -> str:
    """``unknown KIND 'NAME'; did you mean 'NEAREST'? valid: A, B, ...`` (the question only when a
    valid name is close to ``name``)."""
    nearest = closest_name(name, valid)
    hint = "" if nearest is None else f" did you mean {nearest!r}?"
    return f"unknown {kind} {name!r};{hint} valid: {', '.join(valid)}"


def is_concrete(x) -> bool:
    """True when ``x`` holds actual numbers (not a JAX tracer)."""
    return not isinstance(x, jax_core.Tracer)


def as_float_array(x, argument: str, ndim: int | tuple[int, ...] | None = None) -> np.ndarray:
    """Convert ``x`` to a finite float NumPy array, checking its rank; raise naming ``argument``."""
    try:
        arr = np.asarray(x)
    except Exception as exc:  # noqa: BLE001 - anything unconvertible is the user's input
        raise DataError(argument, f"cannot be converted to an array ({exc})") from None
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise DataError(argument, f"must be numeric, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.complexfloating):  # a cast to float would drop the imaginary parts
        raise DataError(argument, f"must be real, got complex dtype {arr.dtype}")
    arr = arr.astype(np.float64 if arr.dtype == np.float64 else np.result_type(arr.dtype, np.float32))
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if arr.ndim not in allowed:
            raise ShapeError(argument, f"expected {' or '.join(map(str, allowed))}-D array, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise DataError(argument, f"contains {bad} NaN/inf value(s)")
    # finite here but past the range of the precision gpzoo computes in (1e39 in float32): inf after conversion
    largest = float(np.finfo(model_float_dtype()).max)
    if arr.size and float(np.max(np.abs(arr))) > largest:
        bad = int(np.count_nonzero(np.abs(arr) > largest))
        raise DataError(argument, f"contains {bad} value(s) beyond the {np.dtype(model_float_dtype()).name} range "
                                  f"(|x| <= {largest:.4g}) gpzoo computes in; rescale the data or enable float64")
    return arr


def check_positive(value, argument: str) -> None:
    """Raise ``HyperparameterError`` when a concrete ``value`` has any entry <= 0."""
    if value is None or not is_concrete(value):
        return
    arr = np.asarray(value)
    if not np.issubdtype(arr.dtype, np.number):
        return
    if np.any(~np.isfinite(arr)) or np.any(arr <= 0):
        raise HyperparameterError(argument, f"must be positive and finite, got {arr.tolist()}")


def is_number(value, kinds) -> bool:
    """True for a 0-d numeric value of ``kinds`` (NumPy dtype kinds), bools and strings excluded."""
    if isinstance(value, (bool, np.bool_, str, bytes)) or not is_concrete(value):
        return False
    try:
        arr = np.asarray(value)
    except Exception:  # noqa: BLE001 - anything unconvertible is not a number
        return False
    return arr.ndim == 0 and arr.dtype.kind in kinds


def check_integer(value, argument: str, minimum: int | None = None) -> int:
    """``value`` as an ``int`` (an integer type, not a bool, string or float) >= ``minimum``; else
    ``InvalidArgumentError`` naming ``argument``."""
    if not is_number(value, "iu"):
        raise InvalidArgumentError(argument, f"must be an integer{'' if minimum is None else f' >= {minimum}'}, "
                                             f"got {value!r} ({type(value).__name__})")
    number = int(value)
    if minimum is not None and number < minimum:
        raise InvalidArgumentError(argument, f"must be an integer >= {minimum}, got {number}")
    return number


def check_real(value, argument: str, *, positive: bool = False) -> float:
    """``value`` as a finite ``float`` (an int or float, not a bool or string), > 0 with ``positive``;
    else ``InvalidArgumentError`` naming ``argument``."""
    expected = "a positive finite number" if positive else "a finite number"
    if not is_number(value, "iuf"):
        raise InvalidArgumentError(argument, f"must be {expected}, got {value!r} ({type(value).__name__})")
    number = float(value)
    if not np.isfinite(number) or (positive and number <= 0):
        raise InvalidArgumentError(argument, f"must be {expected}, got {number!r}")
    return number


#: Largest ``seed`` (PRNG keys and NumPy generators take it as an unsigned 32-bit integer).
MAX_SEED = 2**32 - 1


def check_seed(value, argument: str = "seed") -> int:
    """``value`` as a random seed: an integer in [0, :data:`MAX_SEED`]; else ``InvalidArgumentError``."""
    if check_integer(value, argument, minimum=0) > MAX_SEED:
        raise InvalidArgumentError(argument, f"must be an integer in [0, {MAX_SEED}], got {value}")
    return int(value)


def check_flag(value, argument: str) -> bool:
    """``value`` as a ``bool`` (True/False, not 0/1 or a string); else ``InvalidArgumentError``."""
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgumentError(argument, f"must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


class GPZooWarning(UserWarning):
    """Base class of every warning gpzoo issues on purpose (e.g. image values outside [0, 1])."""


class ImageRangeWarning(GPZooWarning):
    """Image inputs of a convolutional model have values outside [0, 1]."""


class DataScaleWarning(GPZooWarning):
    """Training data far from the unit scale the zoo models start from (features spread over
    thousands, regression targets of order 1e6, an offset float32 cannot resolve): ``argument``
    names ``X`` or ``y``; the message says what was found and the fix (``fit(standardise=True)``)."""

    def __init__(self, message: str, argument: str = ""):
        super().__init__(message)
        self.argument = argument


class UnverifiedModelWarning(GPZooWarning):
    """A saved model predates signed manifests (format version < 3): it loads, but nothing checks
    its ``model.json``; re-saving it signs it."""


#: Slack on the [0, 1] range of image values (float round-off).
UNIT_RANGE_TOLERANCE = 1e-6


def unit_range_problem(arr: np.ndarray, tol: float = UNIT_RANGE_TOLERANCE) -> str | None:
    """The sentence that says values of the finite array ``arr`` leave [0, 1] by more than ``tol``; None when they do not.

    The one wording of the image-range check: the data set validators raise it, the
    convolutional kernels warn with it.
    """
    if arr.size == 0:
        return None
    lo, hi = float(arr.min()), float(arr.max())
    if lo < -tol or hi > 1 + tol:
        return f"image values must lie in [0, 1] (tolerance {tol:g}), found range [{lo:g}, {hi:g}]"
    return None


def warn_unit_range(arr: np.ndarray, why: str, stacklevel: int = 3) -> None:
    """:class:`ImageRangeWarning` (``X``: the :func:`unit_range_problem` sentence; ``why``) when the
    image values ``arr`` leave [0, 1]; ``stacklevel`` counts from the caller of the kernel check."""
    problem = unit_range_problem(arr)
    if problem:
        warnings.warn(f"X: {problem}; {why} (rescale, e.g. X / 255)", ImageRangeWarning, stacklevel=stacklevel)


def as_int_pair(value, argument: str, minimum: int, expected: str) -> tuple[int, int]:
    """``value`` as a pair of ints each >= ``minimum``, else ``ShapeError`` saying ``expected``."""
    try:
        pair = tuple(int(s) for s in value)
    except (TypeError, ValueError):
        raise ShapeError(argument, f"expected {expected}, got {value!r}") from None
    if len(pair) != 2 or min(pair) < minimum:
        raise ShapeError(argument, f"expected {expected}, got {value!r}")
    return pair


class ModelFileError(GPZooError, OSError):
    """A saved model (``gpzoo.save`` / ``gpzoo.load``) is missing, corrupt, tampered with, from a
    newer format, or names a class outside the allowed modules. ``path`` is the file or directory
    at fault; ``argument`` is ``path``, or ``"PATH:FIELD"`` when one field of that file is
    (``field``, e.g. ``result.params.q_mu``)."""

    def __init__(self, path, message: str, field: str | None = None):
        self.path = str(path)
        self.field = field
        super().__init__(f"{self.path}: {message}", argument=self.path if field is None else f"{self.path}:{field}")


class MissingDependencyError(GPZooError, ImportError):
    """An optional package that a data set or file format needs is not installed. ``argument`` names
    what asked for it (e.g. the data set), ``package`` the missing module and ``extra`` the gpzoo
    extra that installs it (``pip install "gpzoo[extra]"``)."""

    def __init__(self, argument: str, package: str, extra: str, what: str):
        self.argument, self.package, self.extra = argument, package, extra
        super().__init__(f"{argument}: {what} needs the optional package {package!r}, which is not installed; "
                         f'install it with: pip install "gpzoo[{extra}]"')
        self.name = package  # ImportError's module name (GPZooError.__init__ takes no ``name=``)


def model_float_dtype() -> np.dtype:
    """The floating dtype models compute in: float64 when ``jax_enable_x64`` is on, else float32."""
    from jax import dtypes  # noqa: PLC0415 - appended helper; the module's imports stay as they are

    return np.dtype(dtypes.canonicalize_dtype(np.float64))


class ConvergenceWarning(GPZooWarning):
    """A fit ended before its objective levelled off (``FitResult.converged`` is False).

    ``model`` names the model, ``steps`` the steps it ran and ``steps_needed`` the estimated total
    it likely needs (``at_least``: a lower bound; ``FitResult.convergence`` has the numbers).
    """

    def __init__(self, message: str, model: str = "", steps: int = 0, steps_needed: int | None = None,
                 at_least: bool = False):
        super().__init__(message)
        self.model, self.steps, self.steps_needed, self.at_least = model, steps, steps_needed, at_least


class SamplerWarning(GPZooWarning):
    """An MCMC run (``gpzoo.sample``) whose draws fail a standard check: divergences, a collapsed
    step size, saturated tree depth, split r_hat too high or effective sample size too low.
    ``model`` names the model and ``problem`` says what was found and what to try."""

    def __init__(self, model: str, problem: str):
        super().__init__(f"{model}: {problem}")
        self.model, self.problem = model, problem
