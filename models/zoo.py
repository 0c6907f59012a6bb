"""The model zoo: a registry from a model name to a :class:`ModelSpec`.

A spec says what a model *is* — kernel (prior), likelihood, which inducing variables and how
many, the q(u) structure and the inference method by name — and nothing about fitting it.
Builders receive the dataset's facts (``image_shape``, ``num_classes``, input dimension and
task) plus user options, so one name works on any compatible dataset::

    spec = zoo.get("svgp-rbf", input_dim=2, task="binary", num_inducing=32)
    zoo.options("conv")                               # [Option(name="patch_shape", ...), ...]
    zoo.parse_option("conv", "patch_shape", "5x5")    # (5, 5)

Every model is a builder ``builder(common: Common, **own_options)`` registered with
:func:`register` (:mod:`gpzoo.models.zoo_core`); its signature declares its options (type,
default, help). This module imports each family module explicitly, so ``names()`` is complete
as soon as ``gpzoo.models.zoo`` is imported.
"""

from __future__ import annotations

from gpzoo.models import kernels
from gpzoo.models import zoo_convolutional, zoo_deep, zoo_dkm, zoo_invariant, zoo_pg, zoo_tick  # noqa: F401 - each registers its family
from gpzoo.models.errors import HyperparameterError, InvalidArgumentError, unknown_name_message
from gpzoo.models.zoo_core import (
    DATASET_FACTS,
    LIKELIHOOD_NAMES,
    REGISTRY,
    Ard,
    Common,
    Entry,
    Lengthscale,
    ModelSpec,
    Option,
    UnknownModelError,
    default_likelihood,
    likelihood_from_name,
    register,
)

__all__ = ["DATASET_FACTS", "LIKELIHOOD_NAMES", "Common", "ModelSpec", "Option", "UnknownModelError", "default_likelihood", "describe", "get",
           "likelihood_from_name", "names", "option_names", "options", "parse_option", "register"]


def _entry(name: str) -> Entry:
    if name not in REGISTRY:
        raise UnknownModelError(unknown_name_message("model", name, sorted(REGISTRY)))
    return REGISTRY[name]


def names() -> list[str]:
    """Every registered model name, sorted."""
    return sorted(REGISTRY)


def describe() -> dict[str, str]:
    """``{name: one-line description}`` for every model."""
    return {n: REGISTRY[n].description for n in sorted(REGISTRY)}


def options(name: str) -> list[Option]:
    """The options model ``name`` takes: its own (from its builder's signature) first, then the
    :class:`Common` ones (``kind`` "common" or "dataset"), with the model's defaults."""
    return list(_entry(name).options)


def option_names(name: str) -> list[str]:
    """The option names model ``name`` accepts, sorted."""
    return sorted(o.name for o in options(name))


def _option(name: str, key: str) -> Option:
    found = {o.name: o for o in options(name)}
    if key not in found:
        raise InvalidArgumentError(key, f"model {name!r} takes no option {key!r}; options: {sorted(found)}")
    return found[key]


def parse_option(name: str, key: str, text: str):
    """Option ``key`` of model ``name`` from its command-line ``text`` ("5x5", "true", "0.5,1", "none", ...),
    converted to the declared type; ``InvalidArgumentError`` naming ``key`` when unknown or malformed."""
    return _option(name, key).parse(text)


def get(name: str, **given) -> ModelSpec:
    """Build the spec of model ``name``; an option that model does not take, or a value not of the
    option's declared type, raises ``InvalidArgumentError`` naming the option (before any tracing)."""
    entry = _entry(name)
    for key, value in given.items():
        _option(name, key).check(value)
    options = set(given)
    shared = {k: given.pop(k) for k in list(given) if k in Common.__dataclass_fields__}
    try:
        spec = entry.builder(Common(**(entry.common_defaults | shared)), **given)
    except HyperparameterError as error:  # "SquaredExponential.lengthscale": name the option the user gave
        option = str(error.argument).rsplit(".", 1)[-1]
        if option in options and option != error.argument:
            raise HyperparameterError(option, error.message) from error
        raise
    return spec.replace(name=name, description=spec.description or entry.description)


# ----------------------------------------------------------------------------- built-in models
@register("svgp-rbf", "SVGP with a squared-exponential (ARD) kernel on the raw inputs, inducing points", num_inducing=32)
def _svgp_rbf(common: Common, lengthscale: Lengthscale = None, ard: Ard = False) -> ModelSpec:
    lengthscale = common.lengthscale(lengthscale, image_shape=common.image_shape, ard=ard)
    # pytree_dataclass is opaque to mypy (no dataclass_transform), so it sees no fields
    return common.spec("svgp-rbf", kernels.SquaredExponential(lengthscale=lengthscale, variance=1.0))  # type: ignore[call-arg]
