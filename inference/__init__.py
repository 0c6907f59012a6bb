"""Approximate-posterior side of gpzoo: inducing variables, guides, fitting and prediction."""

import inference.invariant  # noqa: F401  (registers the invariant-svgp family)
from inference.fit import ElboEstimate, FitResult, Prediction, evaluate_elbo, fit, predict, register_family

__all__ = ["ElboEstimate", "FitResult", "Prediction", "evaluate_elbo", "fit", "predict", "register_family"]
