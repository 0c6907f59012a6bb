"""Data scale: the check that warns about data far from unit scale, and ``fit(standardise=True)``.

Every zoo model starts its hyperparameters at unit scale (lengthscales and signal variances of 1,
a noise variance of order 1) and its GP prior has mean zero. Data far from that scale fit slowly
or not at all: regression targets of order 1e6 need a signal variance of 1e12 that Adam at a
learning rate of 0.01 reaches only after thousands of steps, and inputs spread over 1e4 need
lengthscales as far from their start. In float32 a large common offset also costs resolution:
a column at 1e5 ± 1 keeps about two significant digits of its spread.

:func:`check_data_scale` warns (:class:`~gpzoo.models.errors.DataScaleWarning`, naming ``X`` or
``y`` and the fix) when

* a feature column's standard deviation lies outside [1e-2, 1e2] — for image inputs, the standard
  deviation of all pixels together (a pixel that is almost always 0 is no problem); models whose
  kernel checks its images itself (the patch kernels) warn with
  :class:`~gpzoo.models.errors.ImageRangeWarning` on pixels outside [0, 1] instead;
* a feature column's offset leaves less than 1 % of its spread resolvable in the precision of the
  fit (|mean| · eps / sd > 1e-2: above about 8e4 sd in float32, 4e13 sd in float64);
* regression targets (Gaussian likelihood) have a root mean square above 1e2 or below 1e-2, or a
  standard deviation outside [1e-2, 1e2] — the zero-mean prior must then explain the offset.

A lengthscale of 1 against features spread over hundreds (pixels in [0, 255], or in [0, 1] times
1,000) makes every pair of points look unrelated at the start, and a fit from there may never
recover: an RBF model on rectangles images scaled by 1e3 ends at chance accuracy.

:class:`Standardisation` is what ``fit(..., standardise=True)`` applies: each feature column
centred and divided by its standard deviation (images under a vector kernel: all pixels by one
mean and standard deviation; images under a patch kernel are left in [0, 1], where those kernels
expect them) and Gaussian regression targets likewise, computed
in float64 from the data as given, before the cast to the model's precision. It is stored in the
:class:`~gpzoo.inference.results.FitResult` (and saved with it); :func:`~gpzoo.inference.fit.predict`,
:func:`~gpzoo.inference.fit.evaluate_elbo` and :func:`~gpzoo.analysis.datatree.to_datatree` take
and return data in the original units. Densities of y carry the change of variables: each
target's log density is that of the standardised target minus log sd(y), so ELBOs and
log-likelihoods compare with those of models fitted without standardisation.

It is not the default: the objective, the ELBO and the hyperparameters would then be reported
for data other than the data passed, which makes a fit harder to compare with other tools and
with fits of the same data by other means; the warning says when it is needed.
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np

from gpzoo.models.errors import (
    DataScaleWarning,
    GPZooError,
    ImageRangeWarning,
    InvalidArgumentError,
    as_float_array,
    model_float_dtype,
)

__all__ = ["SCALE_RANGE", "Standardisation", "check_data_scale", "is_regression", "scale_problems"]

#: Standard deviations (and, for regression targets, root mean squares) outside this range are far
#: from the unit scale every zoo model starts from.
SCALE_RANGE = (1e-2, 1e2)
#: A feature column's offset is too large when float rounding at its magnitude exceeds this
#: fraction of its standard deviation.
RESOLUTION = 1e-2


def is_regression(spec) -> bool:
    """True when ``spec``'s targets are real numbers modelled with a Gaussian likelihood."""
    from gpzoo.models.likelihoods import Gaussian  # noqa: PLC0415 - keeps this module light

    return isinstance(spec.likelihood, Gaussian)


def _image_inputs(spec) -> bool:
    return spec.image_shape is not None


def _warns_on_range(spec) -> bool:
    """Whether ``spec``'s kernel warns on pixels outside [0, 1] (probed on one image of 2s)."""
    probe = np.full((1, int(np.prod(spec.image_shape))), 2.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            spec.covariance_model.validate_inputs(probe)
        except GPZooError:
            return False
    return any(issubclass(w.category, ImageRangeWarning) for w in caught)


def scale_problems(spec, X, y, dtype=None) -> list[tuple[str, str]]:
    """``(argument, sentence)`` for every way the data ``X`` ``[N, D]`` / ``y`` are far from unit
    scale for ``spec`` in precision ``dtype`` (default: the precision gpzoo computes in); [] if none."""
    eps = float(np.finfo(np.dtype(dtype or model_float_dtype())).eps)
    low, high = SCALE_RANGE
    problems = []
    X = np.asarray(X, np.float64)
    checks_itself = _image_inputs(spec) and _warns_on_range(spec)
    if _image_inputs(spec) and not checks_itself and X.size:
        X = X.reshape(-1, 1)  # all pixels as one feature
    if not (_image_inputs(spec) and checks_itself) and X.ndim == 2 and X.shape[0] > 1:
        sd, mean = X.std(axis=0), X.mean(axis=0)
        varying = sd > 0
        wide = np.flatnonzero(varying & ((sd > high) | (sd < low)))
        if wide.size:
            j = int(wide[np.argmax(np.abs(np.log10(sd[wide])))])
            if _image_inputs(spec):
                problems.append(("X", f"the pixel values have standard deviation {sd[j]:.3g} (outside [{low:g}, {high:g}]); "
                                      "lengthscales start at 1 and images are expected in [0, 1]"))
            else:
                problems.append(("X", f"feature column {j} has standard deviation {sd[j]:.3g} ({wide.size} of {X.shape[1]} "
                                      f"column(s) outside [{low:g}, {high:g}]); lengthscales start at 1"))
        with np.errstate(divide="ignore", invalid="ignore"):
            lost = np.where(varying, np.abs(mean) * eps / np.where(varying, sd, 1.0), 0.0)
        far = np.flatnonzero(lost > RESOLUTION)
        if far.size:
            j = int(far[np.argmax(lost[far])])
            problems.append(("X", f"feature column {j} is offset by {mean[j]:.3g}, {abs(mean[j]) / sd[j]:.3g} times its "
                                  f"standard deviation: {np.dtype(dtype or model_float_dtype()).name} resolves only "
                                  f"{lost[j]:.2g} of that spread"))
    if is_regression(spec):
        y = np.asarray(y, np.float64)
        if y.size > 1:
            sd, rms = float(y.std()), float(np.sqrt(np.mean(y ** 2)))
            if rms > high or rms < low or (sd > 0 and not low <= sd <= high):
                problems.append(("y", f"the regression targets have mean {float(y.mean()):.3g} and standard deviation "
                                      f"{sd:.3g}; the GP prior has mean 0 and signal and noise variances start at 1"))
    return problems


def check_data_scale(spec, X, y, stacklevel: int = 3) -> None:
    """Warn (:class:`~gpzoo.models.errors.DataScaleWarning`) once per argument whose data are far
    from unit scale (:func:`scale_problems`), naming the fix."""
    for argument, sentence in scale_problems(spec, X, y):
        fix = ("pass standardise=True (fit centres and scales X and y, and predict undoes it) or rescale "
               f"{argument} yourself")
        warnings.warn(DataScaleWarning(f"{argument} is far from unit scale: {sentence}. Fits on such data converge "
                                       f"slowly or not at all; {fix}.", argument=argument), stacklevel=stacklevel)


def _scale(sd: np.ndarray) -> np.ndarray:
    """Standard deviations with constant columns (sd 0) left unscaled."""
    return np.where(sd > 0, sd, 1.0)


@dataclasses.dataclass(frozen=True)
class Standardisation:
    """The affine map ``fit(standardise=True)`` applied to the training data (module docstring).

    ``x_shift`` / ``x_scale`` ``[D]``: feature columns as the model sees them are
    ``(X - x_shift) / x_scale`` (None: inputs unchanged, e.g. images); ``y_shift`` / ``y_scale``:
    likewise for regression targets (None: targets unchanged, e.g. class labels).
    """

    x_shift: np.ndarray | None = None
    x_scale: np.ndarray | None = None
    y_shift: float | None = None
    y_scale: float | None = None

    def __post_init__(self):
        for name in ("x_shift", "x_scale"):
            value = getattr(self, name)
            if value is not None:
                arr = np.asarray(value, np.float64)
                if arr.ndim != 1 or not np.all(np.isfinite(arr)):
                    raise InvalidArgumentError(name, f"must be a finite 1-D array, got {arr!r}")
                object.__setattr__(self, name, arr)
        if (self.x_shift is None) != (self.x_scale is None) or (
                self.x_shift is not None and self.x_scale is not None and self.x_shift.shape != self.x_scale.shape):
            raise InvalidArgumentError("x_scale", "x_shift and x_scale go together, one entry per feature")
        if self.x_scale is not None and np.any(self.x_scale <= 0):
            raise InvalidArgumentError("x_scale", "must be positive")
        if (self.y_shift is None) != (self.y_scale is None):
            raise InvalidArgumentError("y_scale", "y_shift and y_scale go together")
        for name in ("y_shift", "y_scale"):
            value = getattr(self, name)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) \
                        or not math.isfinite(float(value)):
                    raise InvalidArgumentError(name, f"must be a finite number, got {value!r}")
                object.__setattr__(self, name, float(value))
        if self.y_scale is not None and self.y_scale <= 0:
            raise InvalidArgumentError("y_scale", f"must be positive, got {self.y_scale}")

    @classmethod
    def of(cls, spec, X, y) -> Standardisation:
        """The standardisation of training data ``X`` ``[N, D]``, ``y`` for ``spec`` (module docstring)."""
        X = as_float_array(X, "X", ndim=2).astype(np.float64)
        x_shift = x_scale = y_shift = y_scale = None
        if not _image_inputs(spec):
            x_shift, x_scale = X.mean(axis=0), _scale(X.std(axis=0))
        elif not _warns_on_range(spec):  # images under a kernel that takes any pixel values:
            # one shift and scale for every pixel, so that the image stays an image
            x_shift, x_scale = np.full(X.shape[1], X.mean()), np.full(X.shape[1], _scale(np.asarray(X.std())))
        if is_regression(spec):
            targets = as_float_array(y, "y").astype(np.float64)
            y_shift, y_scale = float(targets.mean()), float(_scale(np.asarray(targets.std())))
        return cls(x_shift, x_scale, y_shift, y_scale)

    @property
    def log_y_scale(self) -> float:
        """log sd(y): what the change of variables subtracts from each target's log density (0 if y is unchanged)."""
        return 0.0 if self.y_scale is None else math.log(self.y_scale)

    def inputs(self, X) -> np.ndarray:
        """Inputs ``[N, D]`` in original units -> as the model sees them (float64)."""
        X = np.asarray(X, np.float64)
        return X if self.x_shift is None else (X - self.x_shift) / self.x_scale

    def original_inputs(self, X) -> np.ndarray:
        """Inputs as the model sees them -> original units."""
        X = np.asarray(X, np.float64)
        return X if self.x_shift is None else X * self.x_scale + self.x_shift

    def targets(self, y) -> np.ndarray:
        """Targets in original units -> as the model sees them (float64; class labels unchanged)."""
        if self.y_shift is None:
            return np.asarray(y)
        return (np.asarray(y, np.float64) - self.y_shift) / self.y_scale

    def original_targets(self, y) -> np.ndarray:
        """Targets (or draws of them) as the model sees them -> original units."""
        if self.y_shift is None:
            return np.asarray(y)
        return np.asarray(y, np.float64) * self.y_scale + self.y_shift

    def prediction(self, pred):
        """A :class:`~gpzoo.inference.results.Prediction` in the model's units -> original units
        (means shifted and scaled, variances scaled by sd(y)², class probabilities unchanged)."""
        if self.y_shift is None:
            return pred
        scale, shift = self.y_scale, self.y_shift
        return dataclasses.replace(
            pred, f_mean=np.asarray(pred.f_mean) * scale + shift, f_var=np.asarray(pred.f_var) * scale ** 2,
            y_mean=np.asarray(pred.y_mean) * scale + shift, y_var=np.asarray(pred.y_var) * scale ** 2,
            f_samples=None if pred.f_samples is None else np.asarray(pred.f_samples) * scale + shift)

    def elbo(self, estimate, num_points: int):
        """An :class:`~gpzoo.inference.results.ElboEstimate` of ``num_points`` standardised targets
        -> that of the original targets (each target's density divided by sd(y))."""
        if self.y_shift is None:
            return estimate
        shift = num_points * self.log_y_scale
        return dataclasses.replace(estimate, elbo=estimate.elbo - shift, expected_log_lik=estimate.expected_log_lik - shift,
                                   draws=np.asarray(estimate.draws) - shift)
