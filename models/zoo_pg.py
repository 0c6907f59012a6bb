"""Zoo model ``svgp-logistic-pg``: the logistic SVGP fitted by Pólya–Gamma natural gradients.

Same prior and inducing points as ``svgp-rbf`` (SE kernel, M = 32 by default) with a
Bernoulli-logit likelihood and ``method="svgp-logistic-pg"``, which :func:`gpzoo.inference.fit` routes to
:func:`gpzoo.inference.pg_natgrad.fit_pg_natgrad` (closed-form q(ω) = PG(1, c), natural-gradient /
coordinate-ascent q(u), Adam on the hyperparameters; Wenzel et al. 2019; the bound is van der Wilk et al. 2018
eq. 22–23). Registered when :mod:`gpzoo.models.zoo` imports this module.

``whiten`` (default True) chooses the coordinates in which q(u) is stored and held fixed while the
hyperparameters move; the natural-gradient step itself is the same step in both. ``step_size``
(ρ, default 1 full-batch / Robbins–Monro with minibatches), ``learn_hyperparameters`` and
``acceleration`` (``"anderson"``: Anderson-mixed full-batch CAVI with fixed hyperparameters) are
recorded in ``spec.options`` and read by the fit.
"""

from __future__ import annotations

from typing import Annotated, Literal

from gpzoo.models import kernels
from gpzoo.models.errors import InvalidArgumentError
from gpzoo.models.likelihoods import Bernoulli
from gpzoo.models.zoo_core import Ard, Common, Lengthscale, ModelSpec, register

METHOD = "svgp-logistic-pg"


@register("svgp-logistic-pg", "Logistic SVGP (RBF, inducing points) fitted by Pólya–Gamma natural gradients / CAVI (Wenzel et al. 2019)",
          num_inducing=32, task="binary")
def _svgp_logistic_pg(common: Common, lengthscale: Lengthscale = 1.0, variance: Annotated[float, "initial kernel variance"] = 1.0,
                      ard: Ard = False,
                      step_size: Annotated[float | None, "natural-gradient step ρ in (0, 1]; none: 1 full-batch, Robbins–Monro with minibatches"] = None,
                      learn_hyperparameters: Annotated[bool, "also fit the kernel hyperparameters (Adam)"] = True,
                      acceleration: Annotated[Literal["anderson"] | None, "anderson: Anderson-mixed full-batch CAVI, fixed hyperparameters"] = None,
                      ) -> ModelSpec:
    likelihood = common.resolved_likelihood()
    if not (isinstance(likelihood, Bernoulli) and likelihood.link == "logit"):
        raise InvalidArgumentError("likelihood", f"svgp-logistic-pg needs a Bernoulli-logit likelihood (task='binary'), got {likelihood!r}")
    if common.q_structure != "full":
        raise InvalidArgumentError("q_structure", f"natural-gradient steps give a full-rank q(u); got {common.q_structure!r}")
    if step_size is not None and not 0.0 < float(step_size) <= 1.0:
        raise InvalidArgumentError("step_size", f"must lie in (0, 1], got {step_size!r}")
    lengthscale = common.lengthscale(lengthscale, image_shape=common.image_shape, ard=ard)
    if acceleration not in (None, "anderson"):
        raise InvalidArgumentError("acceleration", f"must be None or 'anderson', got {acceleration!r}")
    options = {"learn_hyperparameters": bool(learn_hyperparameters)} | ({} if step_size is None else {"step_size": float(step_size)})
    if acceleration is not None:
        options["acceleration"] = acceleration
    return common.spec("svgp-logistic-pg", kernels.SquaredExponential(lengthscale=lengthscale, variance=variance),
                       likelihood=likelihood, method=METHOD, options=options)
