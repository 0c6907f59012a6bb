"""The interface every model family implements, and the check the method table makes of it.

A *model family* holds a zoo model's generative NumPyro program and its guide, built from a
:class:`~gpzoo.models.zoo.ModelSpec`, its inducing variables and the number of latent functions
(:class:`~gpzoo.inference.svgp.SVGP` and its subclasses). ``fit``, ``predict``,
``evaluate_elbo``, the DataTree export and the report use only what :class:`ModelFamily` lists;
what a fitter can do with a family (split its minibatches across devices, stream its data from
disk) is declared on its entry in the method table (:class:`gpzoo.inference.fit.Method`), not
probed on the object.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from gpzoo.models.errors import InvalidArgumentError

__all__ = ["FAMILY_MEMBERS", "ModelFamily", "check_family_class"]


@runtime_checkable
class ModelFamily(Protocol):
    """What gpzoo reads of a model family (see :class:`~gpzoo.inference.svgp.SVGP` for each member's contract)."""

    spec: Any
    inducing: Any
    num_latent: int
    #: the guide of sampled hyperparameters (None when every hyperparameter is a point estimate)
    hyper_guide: Any
    #: whether the data term reads per-datum parameters at the rows' training-set positions
    needs_data_indices: bool
    #: whether the data term is a Monte Carlo estimate (its ELBO then has a standard error)
    stochastic_expectation: bool

    def model(self, X, y=None, num_data=None, data_indices=None) -> None: ...

    def guide(self, X, y=None, num_data=None, data_indices=None) -> None: ...

    def parts(self) -> Any: ...

    def predictive_moments(self, parts, X, key) -> tuple: ...

    def expected_log_lik(self, parts, X, y, key=None, **inputs) -> Any: ...

    def data_term_inputs(self, X, y, data_indices=None, num_data=None) -> dict: ...

    def kl(self, parts) -> Any: ...

    def prior(self, parts) -> Any: ...

    def posterior(self, parts) -> Any: ...

    def jitter_used(self, params) -> Any: ...

    def check_analytic_kl(self) -> None: ...


#: The members of :class:`ModelFamily` a family class must define (methods, or attributes and properties).
FAMILY_MEMBERS = ("model", "guide", "parts", "predictive_moments", "expected_log_lik", "data_term_inputs", "kl", "prior",
                  "posterior", "jitter_used", "check_analytic_kl", "needs_data_indices", "stochastic_expectation")


def check_family_class(family: Any, method: str) -> type:
    """``family`` if it is a class that implements :class:`ModelFamily`, else an ``InvalidArgumentError``
    naming the method, the class and every missing member (``spec``, ``inducing``, ``num_latent``
    and ``hyper_guide`` are set by its constructor, so only the class's members are checked)."""
    if not isinstance(family, type):
        raise InvalidArgumentError("family", f"method {method!r}: expected a model family class, got {family!r}")
    missing = [name for name in FAMILY_MEMBERS if not hasattr(family, name)]
    if missing:
        raise InvalidArgumentError(
            "family", f"method {method!r}: {family.__name__} does not implement the model family interface "
                      f"(gpzoo.inference.family.ModelFamily); missing: {', '.join(missing)}")
    return family
