"""Likelihoods p(y | f) and their expectations under a Gaussian q(f) = N(μ, σ²).

Every likelihood provides what the sparse variational ELBO (van der Wilk et al. 2017, eq. 5, with the marginals
q(f_i) = N(μ_i, σ_i²) of van der Wilk et al. 2017, eq. 6) and prediction need:

* ``variational_expectation(y, mean, var, key=None)``: E_q(f)[log p(y|f)] per datum, ``[N]``;
* ``predict_mean_and_var(mean, var)``: moments of the predictive p(y*) = ∫ p(y*|f) q(f) df;
* ``predict_log_density(y, mean, var, key=None)``: log p(y*) per datum (held-out NLPP), ``[N]``;
* ``validate_targets(y)``: eager check of the targets, raising ``DataError`` naming ``y``;
* classification likelihoods also give ``predict_probs(mean, var, key=None)``: class
  probabilities ``[N, C]`` (``[N, 2]`` for binary), the one entry point analysis code uses.

``mean`` and ``var`` are ``[N, L]`` with ``L = num_latent`` latent functions (``L = C`` classes for
the categorical likelihoods, ``1`` otherwise). Likelihoods are immutable pytrees whose
hyperparameters (e.g. the Gaussian noise variance) become NumPyro sites through ``realise``.
Their methods are ``jax.jit``-compiled with the likelihood itself as a pytree argument, so an
eager call (notebook, analysis) runs as one program instead of op by op; inside an outer
``jit`` they simply inline.

How each expectation is computed (analytic where possible, Gauss–Hermite for 1-D
likelihoods, Monte Carlo only for the softmax):

=============  ==============================  ===================================
likelihood     E_q[log p(y|f)]                 predictive p(y*)
=============  ==============================  ===================================
Gaussian       analytic                        analytic
Bernoulli      Gauss–Hermite                   probit analytic, logit Gauss–Hermite
Poisson        analytic (log-normal moment)    moments analytic, density Gauss–Hermite
Softmax        reparameterised Monte Carlo     Monte Carlo
OneHotGaussian analytic (C Gaussian terms)      analytic moments, P(f_c is the max)
                                               by 1-D Gauss–Hermite
RobustMax      analytic in P(f_y is the max),  same
               P by 1-D Gauss–Hermite
=============  ==============================  ===================================
"""

from __future__ import annotations

import functools
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln, log_ndtr, logsumexp
import numpyro.distributions as dist
from jax.scipy.special import ndtr
from numpyro.distributions import constraints

from gpzoo.models import draws
from gpzoo.models.errors import DataError, HyperparameterError, InvalidArgumentError, as_float_array, is_concrete
from gpzoo.models.parameters import Fixed, Parameterised, check_hyperparameter, hyper, pytree_dataclass, static

__all__ = ["Bernoulli", "Gaussian", "Likelihood", "OneHotGaussian", "Poisson", "RobustMax", "Softmax"]

LOG_2PI = math.log(2.0 * math.pi)

#: Key used by the Monte Carlo *predictions* of ``Softmax`` when the caller passes none, so that
#: predictions are reproducible. Training (``variational_expectation``) always needs a real key.
DEFAULT_PREDICTION_KEY = 0


class Likelihood(Parameterised):
    """Base class; see the module docstring for the contract."""

    #: True when ``variational_expectation`` needs a PRNG key (Monte Carlo expectation).
    stochastic_expectation: ClassVar[bool] = False
    #: "regression" / "binary" / "multiclass" / "count": which analyses apply to predictions.
    #: True when E_q[log p(y|f)] is linear in the moments E[f] and E[f²] (Gaussian likelihoods):
    #: unbiased estimates of the moments then give an unbiased expectation (van der Wilk et al. 2018, eq. 15).
    linear_in_moments: ClassVar[bool] = False
    task: ClassVar[str] = "regression"

    def num_latent(self, num_classes: int | None = None) -> int:
        """Number of latent GP functions L this likelihood needs."""
        return 1

    def validate_targets(self, y) -> np.ndarray:
        """Return ``y`` as a NumPy array ``[N]`` after checking it lies in the support."""
        return as_float_array(y, "y", ndim=1)

    def variational_expectation(self, y, mean, var, key=None):  # pragma: no cover - abstract
        raise NotImplementedError

    def distribution(self, f) -> dist.Distribution:  # pragma: no cover - abstract
        """p(y | f) as a NumPyro distribution of batch shape ``[N]`` for latent values f ``[N, L]``:
        the observation site of the generative model (:mod:`gpzoo.inference.svgp`)."""
        raise NotImplementedError

    def predict_mean_and_var(self, mean, var):  # pragma: no cover - abstract
        raise NotImplementedError

    def predict_log_density(self, y, mean, var, key=None):  # pragma: no cover - abstract
        raise NotImplementedError

    def predict_probs(self, mean, var, key=None):
        """Class probabilities ``[N, C]``; only classification likelihoods have them."""
        raise NotImplementedError(f"{type(self).__name__} is a {self.task} likelihood and has no class probabilities")


# --------------------------------------------------------------------------- Gauss–Hermite


@functools.lru_cache(maxsize=None)
def _standard_normal_rule(num_points: int) -> tuple[np.ndarray, np.ndarray]:
    """Nodes z_q and log-weights of the rule E_N(0,1)[g(z)] ≈ Σ_q w_q g(z_q).

    Gauss–Hermite (Abramowitz & Stegun 25.4.46) with the change of variables z = √2 x,
    w_q = w_q^GH / √π; exact for polynomials g of degree < 2 Q. Computed once per ``num_points``.
    """
    x, w = np.polynomial.hermite.hermgauss(num_points)
    return np.sqrt(2.0) * x, np.log(w) - 0.5 * np.log(np.pi)


def _quadrature_points(mean, var, num_points: int):
    """Nodes f_q = μ + σ z_q of N(μ, σ²) for every entry of ``mean``/``var`` and the log-weights.

    mean, var [...] -> nodes [..., Q], log_weights [Q]
    """
    z, log_w = _standard_normal_rule(num_points)
    dtype = jnp.result_type(mean, var, jnp.float32)
    nodes = mean[..., None] + jnp.sqrt(var)[..., None] * jnp.asarray(z, dtype)
    return nodes, jnp.asarray(log_w, dtype)


def _gauss_hermite_expectation(log_lik, mean, var, num_points: int):
    """E_N(f; μ, σ²)[log_lik(f)] by Gauss–Hermite; ``log_lik`` maps ``[N, Q] -> [N, Q]``."""
    nodes, log_w = _quadrature_points(mean, var, num_points)  # [N, Q], [Q]
    return jnp.sum(jnp.exp(log_w) * log_lik(nodes), axis=-1)  # [N]


def _gauss_hermite_log_marginal(log_lik, mean, var, num_points: int):
    """log E_N(f; μ, σ²)[exp(log_lik(f))] by Gauss–Hermite, summed in log space (stable)."""
    nodes, log_w = _quadrature_points(mean, var, num_points)  # [N, Q], [Q]
    return logsumexp(log_lik(nodes) + log_w, axis=-1)  # [N]


def _log_prob_is_max(labels, mean, var, num_points: int):
    """log q(f_label > f_j for all j ≠ label) for independent q(f_j) = N(μ_j, σ_j²); ``[N]``.

    labels [N], mean/var [N, C]. The 1-D integral ∫ N(x; μ_y, σ_y²) Π_{j≠y} Φ((x − μ_j) / σ_j) dx
    by ``num_points``-point Gauss–Hermite, with the product summed in log space (``log_ndtr``).
    """
    onehot = jax.nn.one_hot(labels, mean.shape[-1], dtype=bool)  # [N, C]
    mu_y = jnp.sum(jnp.where(onehot, mean, 0.0), axis=-1)  # [N]
    var_y = jnp.sum(jnp.where(onehot, var, 0.0), axis=-1)  # [N]
    nodes, log_w = _quadrature_points(mu_y, var_y, num_points)  # [N, Q], [Q]
    z = (nodes[:, :, None] - mean[:, None, :]) / jnp.sqrt(var)[:, None, :]  # [N, Q, C]
    log_cdf = jnp.where(onehot[:, None, :], 0.0, log_ndtr(z))  # the j = y factor is left out
    return logsumexp(jnp.sum(log_cdf, axis=-1) + log_w, axis=-1)  # [N]


def _log_prob_is_max_all(mean, var, num_points: int):
    """log P_c, P_c = q(f_c is the max), for every class ``[N, C]``, renormalised to sum to one.

    The classes' quadratures err independently, so Σ_c P_c = 1 holds only to the quadrature
    error (~1e-3 at 20 points for well-separated means); dividing by the sum removes it.
    """
    num_data, num_classes = mean.shape
    log_p = jax.vmap(
        lambda c: _log_prob_is_max(jnp.full((num_data,), c), mean, var, num_points), out_axes=1
    )(jnp.arange(num_classes))  # [N, C]
    return log_p - logsumexp(log_p, axis=-1, keepdims=True)


def _check_num_points(value, argument: str) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise InvalidArgumentError(argument, f"must be a positive integer, got {value!r}")


# --------------------------------------------------------------------------- targets


def _check_binary(y) -> np.ndarray:
    y = as_float_array(y, "y", ndim=1)
    bad = ~np.isin(y, (0.0, 1.0))
    if bad.any():
        raise DataError("y", f"binary labels must be 0 or 1; found {np.unique(y[bad])[:5].tolist()}")
    return y


def _check_counts(y) -> np.ndarray:
    y = as_float_array(y, "y", ndim=1)
    bad = (y < 0) | (y != np.floor(y))
    if bad.any():
        raise DataError("y", f"counts must be non-negative integers; found {np.unique(y[bad])[:5].tolist()}")
    return y


def _check_classes(y, num_classes: int) -> np.ndarray:
    y = as_float_array(y, "y", ndim=1)
    bad = (y < 0) | (y >= num_classes) | (y != np.floor(y))
    if bad.any():
        raise DataError(
            "y",
            f"class labels must be integers in [0, {num_classes}); found {np.unique(y[bad])[:5].tolist()}",
        )
    return y.astype(np.int64)


# --------------------------------------------------------------------------- Gaussian


def _gaussian_expectation(y, mean, var, noise):
    """E_N(f; μ, σ²)[log N(y; f, s²)] = −½ [log 2π s² + ((y − μ)² + σ²) / s²], elementwise."""
    return -0.5 * (LOG_2PI + jnp.log(noise) + ((y - mean) ** 2 + var) / noise)


@pytree_dataclass
class Gaussian(Likelihood):
    """y = f + ε, ε ~ N(0, noise_variance). All expectations are analytic.

    E_q[log p(y|f)] = −½ [log 2π s² + ((y − μ)² + σ²) / s²]  (s² = noise variance), the
    Gaussian term of van der Wilk et al. 2017, eq. 5; the predictive is N(μ, σ² + s²).
    """

    noise_variance: Any = hyper(1.0)
    linear_in_moments: ClassVar[bool] = True

    @jax.jit
    def variational_expectation(self, y, mean, var, key=None):
        # y [N], mean/var [N, 1] -> [N]
        return _gaussian_expectation(jnp.asarray(y, mean.dtype), mean[:, 0], var[:, 0], self.resolved().noise_variance)

    @jax.jit
    def predict_mean_and_var(self, mean, var):
        return mean, var + self.resolved().noise_variance

    def distribution(self, f) -> dist.Distribution:
        return dist.Normal(f[..., 0], jnp.sqrt(self.resolved().noise_variance))  # batch [N]

    @jax.jit
    def predict_log_density(self, y, mean, var, key=None):
        y, mu, v = jnp.asarray(y, mean.dtype), mean[:, 0], var[:, 0] + self.resolved().noise_variance  # [N]
        return -0.5 * (LOG_2PI + jnp.log(v) + (y - mu) ** 2 / v)


# --------------------------------------------------------------------------- Bernoulli

_LINKS = ("logit", "probit")


@pytree_dataclass
class Bernoulli(Likelihood):
    """Binary labels y ∈ {0, 1} with p(y=1|f) = σ(f) (``"logit"``) or Φ(f) (``"probit"``).

    * E_q[log p(y|f)] by ``num_gauss_hermite``-point Gauss–Hermite quadrature of
      log p(y|f) = log λ((2y − 1) f) with λ the link, evaluated with the stable
      ``log_sigmoid`` / ``log_ndtr`` (finite for |f| in the hundreds).
    * Predictive p(y*=1): probit analytic, Φ(μ / √(1 + σ²)) (Rasmussen & Williams 2006,
      eq. 3.82); logit by the same Gauss–Hermite rule (no closed form).
    """

    link: str = static("logit")
    num_gauss_hermite: int = static(20)
    task: ClassVar[str] = "binary"

    def __post_init__(self):
        if self.link not in _LINKS:
            raise InvalidArgumentError("link", f"must be one of {_LINKS}, got {self.link!r}")
        _check_num_points(self.num_gauss_hermite, "num_gauss_hermite")
        super().__post_init__()

    def validate_targets(self, y) -> np.ndarray:
        return _check_binary(y)

    def _log_link(self, signed_f):
        """log p(y|f) as a function of s·f with s = 2y − 1 ∈ {−1, +1}."""
        return log_ndtr(signed_f) if self.link == "probit" else jax.nn.log_sigmoid(signed_f)

    def _log_predictive(self, sign, mean, var):
        """log p(y*) for sign = 2y* − 1, shape [N]; mean/var [N, 1]."""
        mu, v = mean[:, 0], var[:, 0]  # [N]
        if self.link == "probit":
            return log_ndtr(sign * mu / jnp.sqrt(1.0 + v))
        return _gauss_hermite_log_marginal(
            lambda f: self._log_link(sign[:, None] * f), mu, v, self.num_gauss_hermite
        )

    @jax.jit
    def variational_expectation(self, y, mean, var, key=None):
        # y [N], mean/var [N, 1] -> [N]
        sign = 2.0 * jnp.asarray(y, mean.dtype) - 1.0  # [N]
        return _gauss_hermite_expectation(
            lambda f: self._log_link(sign[:, None] * f), mean[:, 0], var[:, 0], self.num_gauss_hermite
        )

    def distribution(self, f) -> dist.Distribution:
        if self.link == "probit":
            return dist.BernoulliProbs(ndtr(f[..., 0]))  # batch [N]
        return dist.BernoulliLogits(f[..., 0])  # batch [N]

    @jax.jit
    def predict_probs(self, mean, var, key=None):
        """[p(y*=0), p(y*=1)] per datum, ``[N, 2]``."""
        ones = jnp.ones(mean.shape[:1], mean.dtype)  # [N]
        log_p = jnp.stack([self._log_predictive(-ones, mean, var), self._log_predictive(ones, mean, var)], -1)
        return jnp.exp(log_p)  # [N, 2]

    @jax.jit
    def predict_mean_and_var(self, mean, var):
        """Mean p(y*=1) and variance p(1 − p) of the Bernoulli predictive, each ``[N, 1]``."""
        p = self.predict_probs(mean, var)[:, 1:]  # [N, 1]
        return p, p * (1.0 - p)

    @jax.jit
    def predict_log_density(self, y, mean, var, key=None):
        return self._log_predictive(2.0 * jnp.asarray(y, mean.dtype) - 1.0, mean, var)  # [N]


# --------------------------------------------------------------------------- Poisson


@pytree_dataclass
class Poisson(Likelihood):
    """Counts y ∈ {0, 1, ...}, y | f ~ Poisson(binsize · exp(f)).

    * E_q[log p(y|f)] = y (μ + log b) − b exp(μ + σ²/2) − log y!, analytic from the
      log-normal moment E[e^f] = e^{μ+σ²/2}.
    * Predictive moments by the laws of total expectation and variance:
      E[y*] = b e^{μ+σ²/2}, Var[y*] = E[y*] + b² (e^{σ²} − 1) e^{2μ+σ²}.
    * log p(y*) by ``num_gauss_hermite``-point Gauss–Hermite, summed in log space.

    ``binsize`` (b) is the exposure of each count, a fixed constant as in GPflow.
    """

    binsize: float = static(1.0)
    num_gauss_hermite: int = static(20)
    task: ClassVar[str] = "count"

    def __post_init__(self):
        # a static constant, checked like a hyperparameter: in the model's precision (1e39 is inf in float32)
        check_hyperparameter(self.binsize, "binsize")
        if np.ndim(self.binsize) != 0:
            raise HyperparameterError("binsize", f"must be one positive number, got shape {np.shape(self.binsize)}")
        _check_num_points(self.num_gauss_hermite, "num_gauss_hermite")
        super().__post_init__()

    def validate_targets(self, y) -> np.ndarray:
        return _check_counts(y)

    def _log_lik(self, y, f):
        return y * (f + math.log(self.binsize)) - self.binsize * jnp.exp(f) - gammaln(y + 1.0)

    @jax.jit
    def variational_expectation(self, y, mean, var, key=None):
        # y [N], mean/var [N, 1] -> [N]
        y, mu, v = jnp.asarray(y, mean.dtype), mean[:, 0], var[:, 0]
        return y * (mu + math.log(self.binsize)) - self.binsize * jnp.exp(mu + 0.5 * v) - gammaln(y + 1.0)

    def distribution(self, f) -> dist.Distribution:
        return dist.Poisson(self.binsize * jnp.exp(f[..., 0]))  # batch [N]

    @jax.jit
    def predict_mean_and_var(self, mean, var):
        expected = self.binsize * jnp.exp(mean + 0.5 * var)  # [N, 1]
        return expected, expected + jnp.expm1(var) * expected**2

    @jax.jit
    def predict_log_density(self, y, mean, var, key=None):
        y = jnp.asarray(y, mean.dtype)[:, None]  # [N, 1] against nodes [N, Q]
        return _gauss_hermite_log_marginal(lambda f: self._log_lik(y, f), mean[:, 0], var[:, 0], self.num_gauss_hermite)


# --------------------------------------------------------------------------- categorical


class _Categorical(Likelihood):
    """Shared parts of the C-class likelihoods: C latent functions, labels in [0, C)."""

    task: ClassVar[str] = "multiclass"

    def __post_init__(self):
        _check_num_points(self.num_classes, "num_classes")
        if self.num_classes < 2:
            raise InvalidArgumentError("num_classes", f"must be at least 2, got {self.num_classes}")
        super().__post_init__()

    def num_latent(self, num_classes: int | None = None) -> int:
        if num_classes is not None and num_classes != self.num_classes:
            raise InvalidArgumentError(
                "num_classes", f"the data have {num_classes} classes but the likelihood has {self.num_classes}"
            )
        return self.num_classes

    def validate_targets(self, y) -> np.ndarray:
        """Labels as an integer array ``[N]`` with values in [0, num_classes)."""
        return _check_classes(y, self.num_classes)

    @jax.jit
    def predict_mean_and_var(self, mean, var):
        """Moments of the one-hot y*: mean p(y*=c) and variance p(1 − p), each ``[N, C]``."""
        p = self.predict_probs(mean, var)
        return p, p * (1.0 - p)


@pytree_dataclass
class Softmax(_Categorical):
    """Categorical y ∈ {0..C−1} with p(y=c|f) = softmax(f)_c over C independent latent GPs.

    No closed form or 1-D quadrature exists, so every expectation is a reparameterised Monte
    Carlo average over S = ``num_mc_samples`` draws f^(s) = μ + σ ⊙ ε^(s), ε^(s) ~ N(0, I):

    * E_q[log p(y|f)] ≈ (1/S) Σ_s log softmax(f^(s))_y — unbiased, differentiable in μ and σ²
      (the reparameterisation trick, Kingma & Welling 2014; as in doubly stochastic VI,
      Salimbeni & Deisenroth 2017). It needs a fresh PRNG ``key`` per step.
    * p(y*=c) ≈ (1/S) Σ_s softmax(f^(s))_c. Predictions without a key use the fixed key
      ``DEFAULT_PREDICTION_KEY`` so they are reproducible; the same draws serve every class,
      so the probabilities sum to one exactly.
    """

    num_classes: int = static()
    num_mc_samples: int = static(100)
    stochastic_expectation: ClassVar[bool] = True

    def __post_init__(self):
        _check_num_points(self.num_mc_samples, "num_mc_samples")
        super().__post_init__()

    def _latent_draws(self, mean, var, key):
        """S reparameterised draws f^(s) = μ + σ ⊙ ε^(s), class-major: mean/var [N, C] -> [C, S, N].

        Class-major because every use reduces over the classes (the log-sum-exp, the label's entry):
        across C contiguous [S, N] slabs that is elementwise work, where along a minor axis of length
        C it is a short reduction per draw. Value and gradient of the expected log-likelihood, draws
        included, on a loaded 2-core CPU: 30.0 → 17.8–20.9 ms at S = 1,000, N = 64, C = 10 (float32),
        1.84 → 1.56 ms at S = 100, N = 256, C = 2 (float64); in the whole DKM training steps of
        ``benchmarks/dkm_step.py`` the gain is a few per cent.

        ε is drawn in float32 whatever the model's precision, then converted: the same key gives
        the same draws in float32 and float64, and a float64 model draws its noise at the float32
        cost (2.7× faster on a 2-core CPU: 51,200 draws in 0.88 ms against 2.39 ms). The estimate
        does not lose accuracy: its Monte Carlo error, O(1/√S), dwarfs float32's 2⁻²⁴ resolution
        of ε (the arithmetic on the draws stays in the model's precision).
        """
        dtype = jnp.result_type(mean, var, jnp.float32)
        mean_c, sd_c = jnp.moveaxis(mean, -1, 0)[:, None], jnp.moveaxis(jnp.sqrt(var), -1, 0)[:, None]  # [C, 1, N]
        eps = draws.normal(key, (mean.shape[-1], self.num_mc_samples, *mean.shape[:-1]), jnp.float32)
        # the barrier keeps the draw out of its consumers' fusion: fused, XLA's CPU code for the
        # float32 inverse error function rounds differently from one program to the next (on AMD
        # EPYC, 1,199 of 45,000 draws differed by an ulp between predict_probs and predict_log_density)
        eps = jax.lax.optimization_barrier(eps).astype(dtype)
        return mean_c + sd_c * eps  # [C, S, N]

    def _label_log_probs(self, y, mean, var, key):
        """log softmax(f^(s))_y for the S draws: [S, N]."""
        f = self._latent_draws(mean, var, key)  # [C, S, N]
        labels = jnp.asarray(y).astype(jnp.int32)  # [N]
        # a one-hot mask instead of a gather: same values, and its gradient is a product, not a scatter-add
        one_hot = labels == jnp.arange(self.num_classes)[:, None, None]  # [C, 1, N]
        return jnp.sum(jnp.where(one_hot, f, 0.0), axis=0) - logsumexp(f, axis=0)

    @staticmethod
    def _prediction_key(key):
        return jax.random.PRNGKey(DEFAULT_PREDICTION_KEY) if key is None else key

    @jax.jit
    def variational_expectation(self, y, mean, var, key=None):
        # y [N], mean/var [N, C] -> [N]
        if key is None:
            raise InvalidArgumentError(
                "key",
                "Softmax.variational_expectation is a Monte Carlo estimate and needs a PRNG key "
                "(jax.random.PRNGKey), a fresh one per training step",
            )
        return jnp.mean(self._label_log_probs(y, mean, var, key), axis=0)

    def distribution(self, f) -> dist.Distribution:
        return dist.CategoricalLogits(f)  # batch [N], f [N, C]

    @jax.jit
    def predict_probs(self, mean, var, key=None):
        f = self._latent_draws(mean, var, self._prediction_key(key))  # [C, S, N]
        probs = jnp.mean(jnp.exp(f - logsumexp(f, axis=0)), axis=1)  # [C, N]
        return jnp.moveaxis(probs, 0, -1)  # [N, C]

    @jax.jit
    def predict_log_density(self, y, mean, var, key=None):
        log_p_y = self._label_log_probs(y, mean, var, self._prediction_key(key))  # [S, N]
        return logsumexp(log_p_y, axis=0) - math.log(self.num_mc_samples)


@pytree_dataclass
class RobustMax(_Categorical):
    """Robust-max categorical likelihood (Hernández-Lobato, Hernández-Lobato & Dupont 2011; GPflow).

    p(y=c|f) = 1 − ε if c = argmax_j f_j, else ε / (C − 1). With P_y = q(f_y is the max),
    everything is analytic in P_y:

    * E_q[log p(y|f)] = P_y log(1 − ε) + (1 − P_y) log(ε / (C − 1));
    * p(y*=c) = P_c (1 − ε) + (1 − P_c) ε / (C − 1).

    P_y = ∫ N(x; μ_y, σ_y²) Π_{j≠y} Φ((x − μ_j) / σ_j) dx is a 1-D integral, computed by
    ``num_gauss_hermite``-point Gauss–Hermite quadrature with the product summed in log space
    (``log_ndtr``). ``epsilon`` is ``Fixed`` by default (not trained); pass a number to learn it.
    Predicted P_c are renormalised over classes, so class probabilities sum to one exactly
    (training uses the unnormalised P_y, as GPflow does).
    """

    num_classes: int = static()
    epsilon: Any = hyper(Fixed(1e-3), constraint=constraints.unit_interval)
    num_gauss_hermite: int = static(20)

    def __post_init__(self):
        _check_num_points(self.num_gauss_hermite, "num_gauss_hermite")
        raw = self.epsilon.value if isinstance(self.epsilon, Fixed) else self.epsilon
        if isinstance(raw, (int, float, np.ndarray, jax.Array)) and is_concrete(raw):
            if not 0.0 < float(np.asarray(raw)) < 1.0:
                raise HyperparameterError("RobustMax.epsilon", f"must lie strictly inside (0, 1), got {raw}")
        super().__post_init__()

    def _hit_and_miss(self, dtype):
        """p(y=c|f) when c is the argmax (1 − ε) and when it is not (ε / (C − 1))."""
        eps = jnp.asarray(self.resolved().epsilon, dtype)
        return 1.0 - eps, eps / (self.num_classes - 1)

    @jax.jit
    def variational_expectation(self, y, mean, var, key=None):
        # y [N], mean/var [N, C] -> [N]
        p_max = jnp.exp(_log_prob_is_max(jnp.asarray(y).astype(jnp.int32), mean, var, self.num_gauss_hermite))  # [N]
        hit, miss = self._hit_and_miss(p_max.dtype)
        return p_max * jnp.log(hit) + (1.0 - p_max) * jnp.log(miss)

    @jax.jit
    def predict_probs(self, mean, var, key=None):
        p_max = jnp.exp(_log_prob_is_max_all(mean, var, self.num_gauss_hermite))  # [N, C]
        hit, miss = self._hit_and_miss(p_max.dtype)
        return miss + p_max * (hit - miss)

    def distribution(self, f) -> dist.Distribution:
        hit, miss = self._hit_and_miss(f.dtype)
        is_max = jax.nn.one_hot(jnp.argmax(f, axis=-1), self.num_classes, dtype=f.dtype)  # [N, C]
        return dist.CategoricalProbs(miss + is_max * (hit - miss))  # batch [N]

    @jax.jit
    def predict_log_density(self, y, mean, var, key=None):
        probs = self.predict_probs(mean, var)  # [N, C]
        labels = jnp.asarray(y).astype(jnp.int32)  # [N]
        return jnp.log(jnp.take_along_axis(probs, labels[:, None], axis=-1)[:, 0])  # miss > 0 keeps the log finite


@pytree_dataclass
class OneHotGaussian(_Categorical):
    """C-class labels treated as regression on one-hot targets: C latent GPs, each with Gaussian noise.

    The multi-class likelihood of van der Wilk et al. 2018, §5.2 ("for multi-class classification, we are
    currently forced to use the Gaussian likelihood"): label y ↦ e_y ∈ {0, 1}^C and
    p(e_y | f) = Π_c N(e_{y,c}; f_c, s²) with one shared noise variance s². So

    * E_q[log p(y|f)] = Σ_c −½ [log 2π s² + ((e_{y,c} − μ_c)² + σ_c²) / s²], analytic and linear in
      μ_c and E[f_c²] (so an invariant kernel's unbiased moment estimates give an unbiased bound);
    * the predicted class is argmax_c μ_c, and ``predict_probs`` gives P_c = q(f_c is the max) over
      the latent marginals (the 1-D Gauss–Hermite integral ``RobustMax`` uses), renormalised; the
      held-out log density is log P_y, a proper score for the class decision the model makes;
    * ``predict_mean_and_var`` gives the Gaussian predictive of the one-hot vector, (μ, σ² + s²).
    """

    num_classes: int = static()
    noise_variance: Any = hyper(0.1)
    num_gauss_hermite: int = static(20)
    linear_in_moments: ClassVar[bool] = True

    def __post_init__(self):
        _check_num_points(self.num_gauss_hermite, "num_gauss_hermite")
        super().__post_init__()

    @jax.jit
    def variational_expectation(self, y, mean, var, key=None):
        # y [N], mean/var [N, C] -> [N]
        onehot = jax.nn.one_hot(jnp.asarray(y).astype(jnp.int32), self.num_classes, dtype=mean.dtype)  # [N, C]
        return jnp.sum(_gaussian_expectation(onehot, mean, var, self.resolved().noise_variance), axis=-1)

    @jax.jit
    def predict_mean_and_var(self, mean, var):
        return mean, var + self.resolved().noise_variance

    def distribution(self, f) -> dist.Distribution:
        return OneHotNormal(f, jnp.sqrt(self.resolved().noise_variance))  # batch [N]

    @jax.jit
    def predict_probs(self, mean, var, key=None):
        return jnp.exp(_log_prob_is_max_all(mean, var, self.num_gauss_hermite))  # [N, C]

    @jax.jit
    def predict_log_density(self, y, mean, var, key=None):
        log_p = _log_prob_is_max_all(mean, var, self.num_gauss_hermite)  # [N, C]
        labels = jnp.asarray(y).astype(jnp.int32)  # [N]
        return jnp.take_along_axis(log_p, labels[:, None], axis=-1)[:, 0]


class OneHotNormal(dist.Distribution):
    """Labels y ∈ {0..C−1} observed as one-hot vectors e_y with Gaussian noise: log p(y | f) = Σ_c log N(e_{y,c}; f_c, s²).

    The observation site of :class:`OneHotGaussian`. Its ``log_prob`` is the regression density of
    the one-hot vector (it does not sum to one over the C labels: the model is a regression on
    e_y, van der Wilk et al. 2018, §5.2); ``sample`` returns the label of the largest noisy output,
    argmax_c (f_c + ε_c), the class decision the model makes for a draw of f.
    """

    arg_constraints = {"f": constraints.real, "scale": constraints.positive}
    pytree_data_fields = ("f", "scale")

    def __init__(self, f, scale, *, validate_args=None):
        self.f, self.scale = f, scale  # f [N, C], scale scalar
        super().__init__(batch_shape=jnp.shape(f)[:-1], event_shape=(), validate_args=validate_args)

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        return constraints.integer_interval(0, self.f.shape[-1] - 1)

    def sample(self, key, sample_shape=()):
        noisy = self.f + self.scale * draws.normal(key, sample_shape + self.f.shape, self.f.dtype)  # [..., N, C]
        return jnp.argmax(noisy, axis=-1)

    def log_prob(self, value):
        onehot = jax.nn.one_hot(jnp.asarray(value).astype(jnp.int32), self.f.shape[-1], dtype=self.f.dtype)  # [..., N, C]
        return jnp.sum(dist.Normal(self.f, self.scale).log_prob(onehot), axis=-1)  # [..., N]
