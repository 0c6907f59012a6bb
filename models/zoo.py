"""The model zoo: a registry from a model name to a :class:`ModelSpec`.

A spec says what a model *is* — kernel (prior), likelihood, which inducing variables and how
many, the q(u) structure and the inference method by name — and nothing about fitting it.
Builders receive the dataset's facts (``image_shape``, ``num_classes``, input dimension and
task) plus user options, so one name works on any compatible dataset::

    spec = zoo.get("svgp-rbf", input_dim=2, task="binary", num_inducing=32)

Registering a model is one decorated function; ``names()`` lists them all. A builder either
takes every fact and option as keywords, or takes a first parameter ``common:`` :class:`Common`
(the facts and options every model shares, filled in by :func:`get` with the defaults given to
:func:`register`) plus its own options as keywords.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from gpzoo.models import kernels
from gpzoo.models.errors import InvalidArgumentError
from gpzoo.models.kernels import Kernel
from gpzoo.models.likelihoods import Likelihood

__all__ = ["LIKELIHOOD_NAMES", "Common", "ModelSpec", "UnknownModelError", "default_likelihood", "describe", "get", "likelihood_from_name",
           "names", "option_names", "register"]


class UnknownModelError(KeyError):
    """Raised for a model name that is not in the zoo; the message lists the valid names."""

    def __str__(self):
        return str(self.args[0])


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """Everything that defines a zoo model, independent of how it is fitted.

    ``inducing`` names the inducing-variable kind ("points", "patches", ... or a tuple of kinds for
    a sum kernel with separate inducing sets); ``method`` names the inference family in
    :mod:`inference` ("svgp" for the sparse variational GP of van der Wilk et al. 2017, §2.1).
    """

    name: str
    kernel: Kernel
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

    def replace(self, **changes) -> "ModelSpec":
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True)
class Common:
    """The dataset facts and fitting options every zoo model takes (see :func:`get`)."""

    input_dim: int | None = None
    task: str = "regression"
    num_classes: int | None = None
    image_shape: tuple[int, ...] | None = None
    num_inducing: int = 16
    likelihood: Likelihood | None = None
    whiten: bool = True
    q_structure: str = "full"
    inducing_init: str = "random"

    def resolved_likelihood(self) -> Likelihood:
        """The given likelihood, else the task's default (:func:`default_likelihood`)."""
        return self.likelihood or default_likelihood(self.task, self.num_classes)

    def spec(self, name: str, kernel: Kernel, **fields) -> ModelSpec:
        """A :class:`ModelSpec` with these options; ``fields`` set or override the others."""
        values = dict(likelihood=self.resolved_likelihood(), num_inducing=self.num_inducing, whiten=self.whiten,
                      q_structure=self.q_structure, inducing_init=self.inducing_init,
                      image_shape=tuple(self.image_shape) if self.image_shape else None)
        return ModelSpec(name=name, kernel=kernel, **(values | fields))


_COMMON_FIELDS = frozenset(f.name for f in dataclasses.fields(Common))
_REGISTRY: dict[str, tuple[Callable[..., ModelSpec], str, dict[str, Any]]] = {}


def register(name: str, description: str, **common_defaults):
    """Register ``builder`` under ``name``.

    ``builder(**facts_and_options) -> ModelSpec``, or ``builder(common: Common, **own_options)``
    whose ``common`` gets ``common_defaults`` (e.g. ``num_inducing=32``) where the caller is silent.
    """
    unknown = sorted(set(common_defaults) - _COMMON_FIELDS)
    if unknown:
        raise InvalidArgumentError(unknown[0], f"not a Common field; fields: {sorted(_COMMON_FIELDS)}")

    def wrap(builder):
        _REGISTRY[name] = (builder, description, common_defaults)
        return builder

    return wrap


def _takes_common(builder) -> bool:
    return next(iter(inspect.signature(builder).parameters), None) == "common"


def option_names(name: str) -> list[str]:
    """The option names model ``name`` accepts, sorted."""
    _load_families()
    builder = _entry(name)[0]
    own = [p for p in inspect.signature(builder).parameters if p != "common"]
    return sorted(set(own) | (_COMMON_FIELDS if _takes_common(builder) else set()))


def _entry(name: str):
    if name not in _REGISTRY:
        raise UnknownModelError(f"unknown model {name!r}; valid: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def names() -> list[str]:
    """Every registered model name, sorted."""
    _load_families()
    return sorted(_REGISTRY)


def describe() -> dict[str, str]:
    """``{name: one-line description}`` for every model."""
    _load_families()
    return {n: _REGISTRY[n][1] for n in sorted(_REGISTRY)}


def get(name: str, **options) -> ModelSpec:
    """Build the spec of model ``name``; options not used by that model raise an error."""
    _load_families()
    builder, description, common_defaults = _entry(name)
    params = inspect.signature(builder).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        valid = option_names(name)
        unknown = sorted(set(options) - set(valid))
        if unknown:
            raise InvalidArgumentError(unknown[0], f"model {name!r} takes no option {unknown[0]!r}; options: {valid}")
    if _takes_common(builder):
        shared = {k: options.pop(k) for k in list(options) if k in _COMMON_FIELDS}
        spec = builder(Common(**(common_defaults | shared)), **options)
    else:
        spec = builder(**options)
    return spec.replace(name=name, description=spec.description or description)


def default_likelihood(task: str = "regression", num_classes: int | None = None) -> Likelihood:
    """The likelihood a zoo model uses for ``task`` unless told otherwise."""
    from gpzoo.models import likelihoods  # noqa: PLC0415 - keeps import order simple for plug-ins

    if task == "regression":
        return likelihoods.Gaussian(noise_variance=0.1)
    if task == "binary":
        return likelihoods.Bernoulli(link="logit")
    if task == "multiclass":
        if not num_classes:
            raise InvalidArgumentError("num_classes", "multiclass models need the number of classes")
        return likelihoods.RobustMax(num_classes=num_classes)
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
    return {
        "gaussian": lambda: likelihoods.Gaussian(noise_variance=0.1),
        "poisson": likelihoods.Poisson,
        "bernoulli-logit": lambda: likelihoods.Bernoulli(link="logit"),
        "bernoulli-probit": lambda: likelihoods.Bernoulli(link="probit"),
        "robustmax": lambda: likelihoods.RobustMax(num_classes=num_classes),
        "softmax": lambda: likelihoods.Softmax(num_classes=num_classes),
        "one-hot-gaussian": lambda: likelihoods.OneHotGaussian(num_classes=num_classes),
    }[name]()


# ----------------------------------------------------------------------------- built-in models
@register("svgp-rbf", "SVGP with a squared-exponential (ARD) kernel on the raw inputs, inducing points", num_inducing=32)
def _svgp_rbf(common: Common, lengthscale: float | None = None, ard: bool = False) -> ModelSpec:
    input_dim = common.input_dim
    if lengthscale is None:
        # images of D pixels in [0, 1]: distances grow like sqrt(D); start there (as GPflow users do)
        lengthscale = float(max(1.0, (input_dim or 1) ** 0.5 / 2)) if common.image_shape else 1.0
    if ard:
        if not input_dim:
            raise InvalidArgumentError("input_dim", "ARD lengthscales need the input dimension")
        import numpy as np  # noqa: PLC0415

        lengthscale = np.full(input_dim, lengthscale)
    return common.spec("svgp-rbf", kernels.SquaredExponential(lengthscale=lengthscale, variance=1.0))


def _load_families():
    """Import the modules whose import registers more models (conv, invariant, ...)."""
    import importlib  # noqa: PLC0415

    for module in _FAMILY_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


#: Modules that register zoo models on import; a module that is not present is skipped.
_FAMILY_MODULES = ("gpzoo.models.zoo_convolutional", "gpzoo.models.zoo_invariant", "gpzoo.models.zoo_pg")
