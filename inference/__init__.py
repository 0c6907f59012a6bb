"""Approximate-posterior side of gpzoo: inducing variables, guides, fitting and prediction."""

from gpzoo.inference.fit import METHODS, Method, build_family, evaluate_elbo, fit, predict, register_method
from gpzoo.inference.data import MemmapSource, open_npy
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


def __getattr__(name: str):
    # the Gibbs sampler loads xarray and ArviZ (0.35 s): imported on first use, so that a process
    # that only fits (a Ray worker of `gpzoo compare`) starts without them
    if name == "gibbs_gp_classification":
        from gpzoo.inference.gibbs import gibbs_gp_classification  # noqa: PLC0415

        return gibbs_gp_classification
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
