"""Approximate-posterior side of gpzoo: inducing variables, guides, fitting and prediction."""

from gpzoo.inference.fit import METHODS, Method, build_family, evaluate_elbo, fit, predict, register_method
from gpzoo.inference.data import MemmapSource, open_npy
from gpzoo.inference.gibbs import gibbs_gp_classification
from gpzoo.inference.io import load, save
from gpzoo.inference.results import ElboEstimate, FitResult, Prediction

__all__ = [
    "METHODS",
    "ElboEstimate",
    "FitResult",
    "MemmapSource",
    "Method",
    "Prediction",
    "build_family",
    "evaluate_elbo",
    "fit",
    "gibbs_gp_classification",
    "load",
    "open_npy",
    "predict",
    "register_method",
    "save",
]
