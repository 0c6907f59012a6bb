"""Likelihoods p(y | f) and their expectations under a Gaussian q(f) = N(μ, σ²).

Every likelihood provides what the sparse variational ELBO (seed 000 eq. 5) and prediction need:

* ``variational_expectation(y, mean, var)``: E_q(f)[log p(y|f)] per datum, ``[N]``;
* ``predict_mean_and_var(mean, var)``: moments of the predictive p(y*) = ∫ p(y*|f) q(f) df;
* ``predict_log_density(y, mean, var)``: log p(y*) per datum (held-out NLPP);
* ``validate_targets(y)``: eager check of the targets, raising ``DataError`` naming ``y``.

``mean`` and ``var`` are ``[N, L]`` with ``L = num_latent`` latent functions (``L = C`` classes for
the categorical likelihoods, ``1`` otherwise). Likelihoods are immutable pytrees whose
hyperparameters (e.g. the Gaussian noise variance) become NumPyro sites through ``realise``.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from models.errors import DataError, as_float_array
from models.parameters import Parameterised, hyper, pytree_dataclass, static

__all__ = ["Likelihood", "Gaussian"]

LOG_2PI = float(np.log(2.0 * np.pi))


class Likelihood(Parameterised):
    """Base class; see the module docstring for the contract."""

    #: True when ``variational_expectation`` needs a PRNG key (Monte Carlo expectation).
    stochastic_expectation: bool = False
    #: "regression" / "binary" / "multiclass" / "count": which analyses apply to predictions.
    task: str = "regression"

    def num_latent(self, num_classes: int | None = None) -> int:
        """Number of latent GP functions L this likelihood needs."""
        return 1

    def validate_targets(self, y) -> np.ndarray:
        """Return ``y`` as a NumPy array ``[N]`` after checking it lies in the support."""
        return as_float_array(y, "y", ndim=1)

    def variational_expectation(self, y, mean, var, key=None):  # pragma: no cover - abstract
        raise NotImplementedError

    def predict_mean_and_var(self, mean, var):  # pragma: no cover - abstract
        raise NotImplementedError

    def predict_log_density(self, y, mean, var, key=None):  # pragma: no cover - abstract
        raise NotImplementedError


@pytree_dataclass
class Gaussian(Likelihood):
    """y = f + ε, ε ~ N(0, noise_variance). All expectations are analytic."""

    noise_variance: Any = hyper(1.0)
    task: str = static("regression")

    def variational_expectation(self, y, mean, var, key=None):
        # y [N], mean/var [N, 1] -> [N]
        mu, v = mean[:, 0], var[:, 0]
        return -0.5 * (LOG_2PI + jnp.log(self.noise_variance) + ((y - mu) ** 2 + v) / self.noise_variance)

    def predict_mean_and_var(self, mean, var):
        return mean, var + self.noise_variance

    def predict_log_density(self, y, mean, var, key=None):
        mu, v = mean[:, 0], var[:, 0] + self.noise_variance
        return -0.5 * (LOG_2PI + jnp.log(v) + (y - mu) ** 2 / v)


def _check_binary(y) -> np.ndarray:
    y = as_float_array(y, "y", ndim=1)
    bad = ~np.isin(y, (0.0, 1.0))
    if bad.any():
        raise DataError("y", f"binary labels must be 0 or 1; found {np.unique(y[bad])[:5].tolist()}")
    return y
