"""Approximate-posterior side of gpzoo: inducing variables, guides, fitting and prediction."""

import gpzoo.inference.invariant  # noqa: F401  (registers the invariant-svgp family)
from gpzoo.inference.fit import ElboEstimate, FitResult, Prediction, evaluate_elbo, fit, predict, register_family
from gpzoo.inference.gibbs import gibbs_gp_classification

__all__ = [
    "ElboEstimate",
    "FitResult",
    "Prediction",
    "evaluate_elbo",
    "fit",
    "gibbs_gp_classification",
    "predict",
    "register_family",
]
