"""Approximate-posterior side of gpzoo: inducing variables, guides, fitting and prediction."""

from inference.fit import ElboEstimate, FitResult, Prediction, evaluate_elbo, fit, predict, register_family

__all__ = ["ElboEstimate", "FitResult", "Prediction", "evaluate_elbo", "fit", "predict", "register_family"]
