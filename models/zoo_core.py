"""What every zoo family module imports: :class:`ModelSpec`, :class:`Common`, :class:`Option` and :func:`register`.

A family module (:mod:`gpzoo.models.zoo_convolutional`, ...) registers its builders here;
:mod:`gpzoo.models.zoo` imports every family module explicitly and is where users look models
up (``zoo.get``, ``zoo.names``, ``zoo.options``). Keeping the registry in this small module lets
the family modules import it without importing :mod:`gpzoo.models.zoo` (no import cycle).

A builder's signature is the declaration of its options::

    @register("my-model", "one line for `gpzoo list`", num_inducing=32)
    def build(common: Common, patch_shape: PatchShape = (3, 3), ard: Ard = False) -> ModelSpec: ...

``common`` holds the dataset facts and fitting options every model shares; every other
parameter is keyword-able, has a default and a type annotation, optionally
``Annotated[type, "one line of help"]``. :func:`parse_text` turns command-line text into a
value of that type.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import inspect
import math
import re
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal

import numpy as np

from numpyro.distributions import Distribution

from gpzoo.models.dkm import DKMConfig
from gpzoo.models.errors import GPZooError, InvalidArgumentError, check_integer, check_real, is_number, model_float_dtype
from gpzoo.models.kernels import Kernel
from gpzoo.models.kernels.convolutional import image_dims
from gpzoo.models.likelihoods import Likelihood
from gpzoo.models.parameters import Fixed

__all__ = ["COMMON_FIELDS", "DATASET_FACTS", "LIKELIHOOD_NAMES", "REGISTRY", "TASKS", "Ard", "Common", "Entry", "Lengthscale", "ModelSpec",
           "Option", "UnknownModelError", "default_likelihood", "likelihood_from_name", "parse_text", "register", "type_name"]


#: The largest number of values per input (``input_dim``, H·W·C): JAX indexes arrays with 32-bit integers by default.
MAX_INPUT_DIM = 2**31 - 1
#: The tasks a zoo model can serve (``Common.task``).
TASKS = ("regression", "binary", "multiclass")


class UnknownModelError(GPZooError, KeyError):
    """Raised for a model name that is not in the zoo; the message lists the valid names."""

    argument = "model"  # the model name: `zoo.get(name)`, `gpzoo fit --model`

    def __str__(self):
        return str(self.args[0])


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Everything that defines a zoo model, independent of how it is fitted.

    The prior over the latent functions is given by exactly one of two fields:

    * ``kernel`` — the covariance function of a GP model (every family but the deep kernel machine);
    * ``architecture`` — a deep kernel machine's :class:`~gpzoo.models.dkm.DKMConfig` (its Gram
      layers, kernel nonlinearity and regularisers; Milsom, Anson, Aitchison 2024), whose learned
      Gram matrices give the output GP's covariance. ``kernel`` is then None.

    :attr:`covariance_model` is whichever is set: the inputs are checked against it and the
    inducing variables initialised from it. A spec with neither, with both, or with a ``DKMConfig``
    as its ``kernel`` is refused (``InvalidArgumentError`` naming the field).

    ``inducing`` names the inducing-variable kind ("points", "patches", ... or a tuple of kinds for
    a sum kernel with separate inducing sets); ``method`` names the inference family in
    :mod:`gpzoo.inference` ("svgp" for the sparse variational GP of van der Wilk et al. 2017, §2.1).
    """

    name: str
    kernel: Kernel | None
    likelihood: Likelihood
    num_inducing: int = 16
    inducing: str | tuple[str, ...] = "points"
    inducing_init: str = "random"
    whiten: bool = True
    q_structure: str = "full"
    jitter: float = 1e-6
    method: str = "svgp"
    input_kind: str = "any"  # "image", "tabular" or "any"
    image_shape: tuple[int, ...] | None = None
    description: str = ""
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    architecture: DKMConfig | None = None

    def __post_init__(self):
        if isinstance(self.kernel, DKMConfig):
            raise InvalidArgumentError("kernel", "a DKMConfig is a deep kernel machine's architecture, not a kernel: pass it "
                                                 "as architecture=..., with kernel=None")
        if self.architecture is not None and not isinstance(self.architecture, DKMConfig):
            raise InvalidArgumentError("architecture", f"expected a DKMConfig (a deep kernel machine) or None, got "
                                                       f"{type(self.architecture).__name__}")
        if self.kernel is None and self.architecture is None:
            raise InvalidArgumentError("kernel", "a model needs a kernel (or, for a deep kernel machine, an architecture)")
        if self.kernel is not None and self.architecture is not None:
            raise InvalidArgumentError("architecture", "a model has a kernel or a deep kernel machine's architecture, not "
                                                       "both; set kernel=None")
        # jitter is added to Kuu's diagonal in the model's precision: positive and finite there, and a
        # real number (a bool or a string is refused by name, not cast)
        jitter = check_real(self.jitter, "jitter", positive=True)
        with np.errstate(over="ignore"):
            in_precision = np.asarray(jitter, dtype=model_float_dtype())
        if not np.isfinite(in_precision):
            raise InvalidArgumentError("jitter", f"must be finite in {model_float_dtype()}, got {self.jitter!r}")

    @property
    def covariance_model(self) -> Kernel | DKMConfig:
        """The kernel, or a deep kernel machine's architecture: what the inputs are checked against
        (its ``validate_inputs``, where it has one) and the inducing variables are initialised from."""
        if self.architecture is not None:
            return self.architecture
        assert self.kernel is not None  # __post_init__: a kernel or an architecture
        return self.kernel

    def replace(self, **changes) -> "ModelSpec":
        return dataclasses.replace(self, **changes)


#: Option types shared by several families (the annotation carries the help line).
Lengthscale = Annotated[float | tuple[float, ...] | None,
                        "initial SE lengthscale, one value or one per input (0.5,1,2); none: max(1, √D/2) on images of D pixels, 1 on tables"]
Ard = Annotated[bool, "one lengthscale per input dimension (automatic relevance determination)"]


@dataclasses.dataclass(frozen=True)
class Common:
    """The dataset facts and fitting options every zoo model takes (see ``zoo.get``), and the
    facts derived from them that several families need (image shape, default lengthscale)."""

    input_dim: Annotated[int | None, "number of input features D"] = None
    task: Annotated[str, "'regression', 'binary' or 'multiclass'"] = "regression"
    num_classes: Annotated[int | None, "number of classes (multiclass tasks)"] = None
    image_shape: Annotated[tuple[int, ...] | None, "(H, W) or (H, W, C) of image inputs"] = None
    num_inducing: Annotated[int, "number of inducing points / patches M"] = 16
    likelihood: Annotated[Likelihood | None, "likelihood; default: the task's (default_likelihood)"] = None
    whiten: Annotated[bool, "store q(u) in whitened coordinates"] = True
    q_structure: Annotated[Literal["full", "block", "diag"], "covariance of q(u): full, block-diagonal or mean-field"] = "full"
    inducing_init: Annotated[str, "initial inducing inputs: 'random', 'kmeans' (or 'uniform' for patches)"] = "random"

    def __post_init__(self):
        """Eager checks of the shared options (typed errors naming the option, before any tracing)."""
        if self.input_dim is not None and check_integer(self.input_dim, "input_dim", minimum=1) > MAX_INPUT_DIM:
            raise InvalidArgumentError("input_dim", f"{self.input_dim} exceeds {MAX_INPUT_DIM}, the most values per input "
                                                    "JAX's 32-bit indices reach")
        if self.task not in TASKS:
            raise InvalidArgumentError("task", f"unknown task {self.task!r}; use one of {', '.join(map(repr, TASKS))}")
        if self.num_classes is not None:
            check_integer(self.num_classes, "num_classes", minimum=2)
            if self.task == "binary" and self.num_classes != 2:
                raise InvalidArgumentError("num_classes", f"a binary task has 2 classes, got {self.num_classes}")
            if self.task == "regression":
                raise InvalidArgumentError("num_classes", f"a regression task has no classes, got {self.num_classes}; "
                                                          "set task='multiclass' for a classifier")
        check_integer(self.num_inducing, "num_inducing", minimum=1)
        for name, tp in typing.get_type_hints(Common, include_extras=True).items():
            if not _matches(tp, getattr(self, name)):
                raise InvalidArgumentError(name, f"expected {type_name(tp)}, got {getattr(self, name)!r}")
        shape = self.given_image_shape()
        if shape is not None and math.prod(shape) > MAX_INPUT_DIM:
            raise InvalidArgumentError("image_shape", f"{shape} has {math.prod(shape)} values, more than {MAX_INPUT_DIM}, the "
                                                      "most JAX's 32-bit indices reach")

    def resolved_likelihood(self) -> Likelihood:
        """The given likelihood, else the task's default (:func:`default_likelihood`)."""
        return self.likelihood or default_likelihood(self.task, self.num_classes)

    def spec(self, name: str, kernel: Kernel | None, **fields) -> ModelSpec:
        """A :class:`ModelSpec` with these options; ``fields`` set or override the others (a deep
        kernel machine passes ``kernel=None`` and its ``architecture`` among them)."""
        values: dict[str, Any] = dict(likelihood=self.resolved_likelihood(), num_inducing=self.num_inducing, whiten=self.whiten,
                      q_structure=self.q_structure, inducing_init=self.inducing_init,
                      image_shape=tuple(self.image_shape) if self.image_shape else None)
        return ModelSpec(name=name, kernel=kernel, **(values | fields))

    def given_image_shape(self) -> tuple[int, ...] | None:
        """``image_shape`` as ints ((H, W) or (H, W, C), H·W·C = ``input_dim`` when both are given), or None."""
        if self.image_shape is None:
            return None
        image_dims(self.image_shape)  # typed error for a malformed shape
        shape = tuple(int(s) for s in self.image_shape)
        if self.input_dim is not None and math.prod(shape) != int(self.input_dim):
            raise InvalidArgumentError("image_shape", f"{shape} has {math.prod(shape)} pixels but input_dim is {self.input_dim}")
        return shape

    def required_image_shape(self, missing: str) -> tuple[int, ...]:
        """:meth:`given_image_shape`, else a square grey image (side √``input_dim``); else
        ``InvalidArgumentError("image_shape", missing)``."""
        shape = self.given_image_shape()
        if shape is not None:
            return shape
        side = math.isqrt(int(self.input_dim)) if self.input_dim else 0
        if not self.input_dim or side * side != int(self.input_dim):
            raise InvalidArgumentError("image_shape", missing)
        return (side, side)

    def lengthscale(self, lengthscale=None, *, image_shape=None, ard: bool = False):
        """``lengthscale``, else the initial SE lengthscale: max(1, √D / 2) for images (``image_shape``
        given) of D values in [0, 1] (D = ``input_dim``, else the image's size; distances between
        images grow like √D, and GPflow users start there), 1 on tables. With ``ard``, one
        lengthscale per input dimension ``[input_dim]``."""
        if lengthscale is None:
            num_values = self.input_dim or math.prod(image_shape or ())
            lengthscale = max(1.0, math.sqrt(num_values) / 2.0) if image_shape else 1.0
        elif isinstance(lengthscale, (tuple, list, np.ndarray)):
            lengthscale = np.asarray(lengthscale, dtype=float)
            if self.input_dim and lengthscale.size not in (1, self.input_dim):
                raise InvalidArgumentError("lengthscale", f"has {lengthscale.size} values; expected one, or one per input "
                                                          f"dimension ({self.input_dim})")
        if not ard:
            return lengthscale
        if not self.input_dim:
            raise InvalidArgumentError("input_dim", "ARD lengthscales need the input dimension")
        return np.full(self.input_dim, lengthscale)


COMMON_FIELDS = tuple(f.name for f in dataclasses.fields(Common))
#: The :class:`Common` fields a dataset determines (the CLI sets them from ``--data``).
DATASET_FACTS = ("input_dim", "task", "num_classes", "image_shape")


# ----------------------------------------------------------------------------- options
@dataclasses.dataclass(frozen=True)
class Option:
    """One keyword a zoo model takes, as its builder (or :class:`Common`) declares it.

    ``kind`` is ``"model"`` for the builder's own options, ``"common"`` for the fitting options
    every model shares and ``"dataset"`` for the dataset facts (:data:`DATASET_FACTS`).
    """

    name: str
    type: Any
    default: Any
    help: str = ""
    kind: str = "model"

    @property
    def type_name(self) -> str:
        return type_name(self.type)

    def parse(self, text: str):
        """The value ``text`` (command-line form) stands for; ``InvalidArgumentError`` naming the option."""
        return parse_text(self.type, text, self.name)

    def check(self, value) -> None:
        """``InvalidArgumentError`` naming the option unless ``value`` is of its declared type (:func:`_matches`)."""
        if not _matches(self.type, value):
            raise InvalidArgumentError(self.name, f"expected {self.type_name}, got {value!r} ({type(value).__name__})")


def _split_annotated(annotation) -> tuple[Any, str]:
    """(type, help) of ``Annotated[type, "help"]`` (the outermost help of nested ones); (annotation, "") otherwise."""
    if typing.get_origin(annotation) is Annotated:
        base, *metadata = typing.get_args(annotation)
        return base, next((m for m in reversed(metadata) if isinstance(m, str)), "")
    return annotation, ""


def _declared_options(function, defaults: dict[str, Any], kind: Callable[[str], str]) -> tuple[Option, ...]:
    """The options ``function``'s keyword parameters declare (``common`` and ``self`` excepted)."""
    hints = typing.get_type_hints(function, include_extras=True)
    options = []
    for param in inspect.signature(function).parameters.values():
        if param.name in ("common", "self"):
            continue
        tp, help_line = _split_annotated(hints[param.name])
        options.append(Option(param.name, tp, defaults.get(param.name, param.default), help_line, kind(param.name)))
    return tuple(options)


def _check_builder(name: str, builder) -> None:
    """A builder is ``builder(common: Common, <keyword options with annotations and defaults>)``."""
    params = list(inspect.signature(builder).parameters.values())
    if not params or params[0].name != "common":
        raise TypeError(f"zoo builder {name!r}: the first parameter must be `common: Common`")
    for p in params[1:]:
        if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            raise TypeError(f"zoo builder {name!r}: option {p.name!r} must be a keyword parameter (no *args / **kwargs)")
        if p.default is p.empty or p.annotation is p.empty:
            raise TypeError(f"zoo builder {name!r}: option {p.name!r} needs a type annotation and a default")
        if p.name in COMMON_FIELDS:
            raise TypeError(f"zoo builder {name!r}: option {p.name!r} is a Common field; read it from `common`")


@dataclasses.dataclass(frozen=True)
class Entry:
    """A registered model: its builder, description, :class:`Common` defaults and declared options."""

    builder: Callable[..., ModelSpec]
    description: str
    common_defaults: dict[str, Any]
    options: tuple[Option, ...]


#: name -> :class:`Entry`; filled by :func:`register` as the family modules are imported.
REGISTRY: dict[str, Entry] = {}


def register(name: str, description: str, **common_defaults):
    """Register ``builder(common: Common, **own_options) -> ModelSpec`` under ``name``.

    ``common_defaults`` (e.g. ``num_inducing=32``) fill ``common`` where the caller is silent.
    The options are read from the builder's signature here, so a malformed builder fails on import.
    """
    unknown = sorted(set(common_defaults) - set(COMMON_FIELDS))
    if unknown:
        raise InvalidArgumentError(unknown[0], f"not a Common field; fields: {sorted(COMMON_FIELDS)}")

    def wrap(builder):
        _check_builder(name, builder)
        own = _declared_options(builder, {}, lambda _: "model")
        shared = _declared_options(Common.__init__, common_defaults,
                                   lambda field: "dataset" if field in DATASET_FACTS else "common")
        REGISTRY[name] = Entry(builder, description, dict(common_defaults), own + shared)
        return builder

    return wrap


# ----------------------------------------------------------------------------- text -> typed value
_TRUE, _FALSE = ("true", "yes", "1"), ("false", "no", "0")
_ITEM_SEPARATORS = re.compile(r"[x×,\s]+")


class _NotText(ValueError):
    """The type has no text form (e.g. a kernel or likelihood object)."""


def _is_union(tp) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def type_name(tp) -> str:
    """A short readable name of an option type: ``tuple[int, int]``, ``float | None``, ``'mean' | 'sum'``."""
    tp, _ = _split_annotated(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if _is_union(tp):
        return " | ".join(type_name(a) for a in args)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (tuple, list):
        inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in args)
        return f"{origin.__name__}[{inner}]"
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def _from_text(tp, text: str):
    tp, _ = _split_annotated(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if _is_union(tp):
        if type(None) in args and text.lower() == "none":
            return None
        failures = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _from_text(arg, text)
            except ValueError as exc:
                failures.append(exc)
        raise _NotText() if all(isinstance(f, _NotText) for f in failures) else ValueError()
    if origin is Literal:
        for choice in args:
            if str(choice) == text:
                return choice
        raise ValueError()
    if tp is bool:
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ValueError()
    if tp in (int, float, str):
        return tp(text)
    if origin in (tuple, list):
        items = [item for item in _ITEM_SEPARATORS.split(text.strip("()[] ")) if item]
        variadic = origin is list or (len(args) == 2 and args[1] is Ellipsis)
        if not items or (not variadic and len(items) != len(args)):
            raise ValueError()
        item_types = args[:1] * len(items) if variadic else args
        return origin(_from_text(t, item) for t, item in zip(item_types, items))
    raise _NotText()


def _matches(tp, value) -> bool:
    """True when ``value`` is of the declared option type ``tp``.

    Numbers: an ``int`` option takes an integer (not a bool), a ``float`` option a finite int or
    float, or a hyperparameter prior or ``Fixed`` value; tuples and lists take sequences or 1-D
    arrays of matching items; class annotations use ``isinstance``; a type this cannot check
    (``Any``, a protocol) accepts anything and leaves the checks to the builder.
    """
    tp, _ = _split_annotated(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if _is_union(tp):
        return any(_matches(arg, value) for arg in args)
    if tp is type(None):
        return value is None
    if origin is Literal:
        return any(type(value) is type(choice) and value == choice for choice in args)
    if tp is bool:
        return isinstance(value, (bool, np.bool_))
    if tp is int:
        return is_number(value, "iu")
    if tp is float:
        return (is_number(value, "iuf") and bool(np.isfinite(float(value)))) or isinstance(value, (Distribution, Fixed))
    if tp is str:
        return isinstance(value, str)
    if origin in (tuple, list):
        if isinstance(value, (str, bytes)) or not (isinstance(value, (tuple, list)) or np.ndim(value) == 1):
            return False
        items = list(value)
        if len(args) == 2 and args[1] is Ellipsis or origin is list:
            return len(items) > 0 and all(_matches(args[0] if args else Any, item) for item in items)
        return len(items) == len(args) and all(_matches(t, item) for t, item in zip(args, items))
    if origin is collections.abc.Callable or tp is collections.abc.Callable:
        return callable(value)
    if isinstance(tp, type) and tp is not Any:
        return isinstance(value, tp)
    return True


def parse_text(tp, text: str, argument: str):
    """The value of type ``tp`` that command-line ``text`` stands for.

    ``int``, ``float``, ``str``; ``bool`` from true/false/yes/no/1/0; ``None`` from "none";
    a ``Literal`` choice by its text; tuples and lists from items separated by ``x``, ``,`` or
    spaces ("5x5", "5,5", "(5, 5)", "0.5,1,2"). Anything else raises ``InvalidArgumentError``
    naming ``argument`` and the expected type.
    """
    try:
        return _from_text(tp, str(text).strip())
    except _NotText:
        raise InvalidArgumentError(argument, f"a {type_name(tp)} cannot be given as text; pass it from Python") from None
    except ValueError:
        hint = " (true/false, yes/no or 1/0)" if _split_annotated(tp)[0] is bool else ""
        raise InvalidArgumentError(argument, f"expected {type_name(tp)}{hint}, got {text!r}") from None


# ----------------------------------------------------------------------------- likelihoods
def default_likelihood(task: str = "regression", num_classes: int | None = None) -> Likelihood:
    """The likelihood a zoo model uses for ``task`` unless told otherwise."""
    from gpzoo.models import likelihoods  # noqa: PLC0415 - keeps import order simple for plug-ins

    # call-arg ignores here and below: pytree_dataclass is opaque to mypy (no dataclass_transform),
    # so it sees no fields
    if task == "regression":
        return likelihoods.Gaussian(noise_variance=0.1)  # type: ignore[call-arg]
    if task == "binary":
        return likelihoods.Bernoulli(link="logit")  # type: ignore[call-arg]
    if task == "multiclass":
        if not num_classes:
            raise InvalidArgumentError("num_classes", "multiclass models need the number of classes")
        return likelihoods.RobustMax(num_classes=num_classes)  # type: ignore[call-arg]
    raise InvalidArgumentError("task", f"unknown task {task!r}; use 'regression', 'binary' or 'multiclass'")


#: Likelihoods by name, with the task each serves (``likelihood_from_name``; the CLI's ``--likelihood``).
LIKELIHOOD_NAMES = {
    "gaussian": "regression", "poisson": "regression", "bernoulli-logit": "binary", "bernoulli-probit": "binary",
    "robustmax": "multiclass", "softmax": "multiclass", "one-hot-gaussian": "multiclass",
}


def likelihood_from_name(name: str, task: str, num_classes: int | None = None) -> Likelihood:
    """The likelihood called ``name`` (a key of :data:`LIKELIHOOD_NAMES`) for a ``task`` dataset."""
    from gpzoo.models import likelihoods  # noqa: PLC0415

    if name not in LIKELIHOOD_NAMES:
        raise InvalidArgumentError("likelihood", f"unknown likelihood {name!r}; valid: {', '.join(LIKELIHOOD_NAMES)}")
    if LIKELIHOOD_NAMES[name] != task:
        valid = [n for n, t in LIKELIHOOD_NAMES.items() if t == task]
        raise InvalidArgumentError("likelihood", f"{name!r} is a {LIKELIHOOD_NAMES[name]} likelihood but the task is {task}; "
                                                 f"for {task}: {', '.join(valid)}")
    if task == "multiclass" and not num_classes:
        raise InvalidArgumentError("num_classes", "multiclass likelihoods need the number of classes")
    # call-arg ignores: pytree_dataclass is opaque to mypy (no dataclass_transform), so it sees no fields
    return {
        "gaussian": lambda: likelihoods.Gaussian(noise_variance=0.1),  # type: ignore[call-arg]
        "poisson": likelihoods.Poisson,
        "bernoulli-logit": lambda: likelihoods.Bernoulli(link="logit"),  # type: ignore[call-arg]
        "bernoulli-probit": lambda: likelihoods.Bernoulli(link="probit"),  # type: ignore[call-arg]
        "robustmax": lambda: likelihoods.RobustMax(num_classes=num_classes),  # type: ignore[call-arg]
        "softmax": lambda: likelihoods.Softmax(num_classes=num_classes),  # type: ignore[call-arg]
        "one-hot-gaussian": lambda: likelihoods.OneHotGaussian(num_classes=num_classes),  # type: ignore[call-arg]
    }[name]()
