"""Inter-domain SVGP for invariant kernels with sampled orbits (van der Wilk et al. 2018, §4.2–4.5, App. B; van der Wilk et al. 2017, App. D).

Inducing variables u = g(Z) live in the *base* function's input space (van der Wilk et al. 2018, eq. 13, van der Wilk et al. 2017
eq. D.30–D.32): Kuu = k_g(Z, Z) and k_fu(x, z) = Σ_a k_g(x_a, z) (or ∫ p(x_a|x) k_g(x_a, z)).
:class:`~gpzoo.inference.inducing.BaseInducingPoints` is that inducing type (initialiser kind ``"invariant-points"``).

For finite orbits evaluated whole, Kuf and Kff are exact and the ordinary SVGP path applies
(``method="svgp"``). When the orbit is sub-sampled or the kernel is a double integral over an
augmentation density, :class:`InvariantSVGP` (``method="invariant-svgp"``) replaces q(f_n)'s
moments by unbiased estimates from one set of S samples per minibatch (van der Wilk et al. 2018, eq. 16–21):

    μ̂_n   = w₁ Σ_s a_s,                    a_s = k_g(x^(s), Z) Kuu⁻¹ m            (eq. 16–17)
    μ̂²_n  = Σ_{s,s'} w_{ss'} a_s a_s'                                              (eq. 18, 21)
    σ̂²_n  = k̂_f(x_n, x_n) − Σ w_{ss'} e_sᵀ e_s' + Σ w_{ss'} v_sᵀ v_s'             (eq. 19–21)

with e_s = Luu⁻¹ k_g(Z, x^(s)) and v_s = S^{1/2}ᵀ (whitened: e_s, else Kuu⁻¹ k_g(Z, x^(s))), so
that e_sᵀe_s' − v_sᵀv_s' = k_sᵀ Kuu⁻¹ (Kuu − S) Kuu⁻¹ k_s'. Each pair estimate costs O(S·M) per
datum (App. B.2.1). The weights w come from the orbit (:mod:`gpzoo.models.kernels.invariant`).

Likelihoods: the estimates are unbiased only for expressions *linear* in μ_n, μ_n², σ_n², so a
sampled kernel is paired with

* ``Gaussian`` (and ``OneHotGaussian``, one such term per class, for multi-class as in §5.2):
  E_q[log p(y_n|f_n)] = −½[log 2πs² + (y² − 2yμ + μ² + σ²)/s²] (eq. 15), computed by the
  likelihood itself with mean μ̂ and "variance" μ̂² + σ̂² − μ̂² (which keeps it linear); any
  likelihood with ``linear_in_moments`` qualifies;
* ``Bernoulli(link="logit")``: the Pólya–Gamma bound (eq. 22–23, :func:`pg_logistic_bound`) with
  q(ω_n) = PG(1, c_n). Every c_n gives a lower bound, and for fixed c the bound is linear in
  μ_n and E[f_n²], so its estimate stays unbiased as long as c does not depend on the orbit
  samples it is evaluated with. ``spec.options["pg_c"]`` selects how c_n is chosen:

  - ``"closed-form"`` (default): c_n = √(E[f_n²]) (Jaakkola–Jordan's optimum for a given E[f_n²],
    :func:`optimal_c`), computed without gradient from an *independent* set of orbit samples.
    The paper (van der Wilk et al. 2018, §4.5) says the optimum cannot be used because it depends non-linearly on μ_n, σ_n;
    plugging in an independent noisy estimate keeps the bound unbiased at the price of a c that
    is slightly off the optimum (the bound is then lower by the resulting Jensen gap).
  - ``"recognition"``: the paper's amortised q(ω_n) (§4.5, following Kingma & Welling 2014):
    c_n = softplus(MLP(x_n, 2y_n − 1)), a tanh MLP with hidden widths
    ``spec.options.get("pg_recognition_hidden", (32, 32))`` whose weights are ``numpyro.param``
    sites ``pg_recognition.*`` trained jointly with q(u) and θ by the ELBO. c does not depend
    on the orbit samples, so no second estimate is needed.
  - ``"free"``: one free c_n > 0 per training point, the ``numpyro.param`` site ``pg_free_c``
    ``[N]`` (positive constraint, initial 1), trained with q(u) and θ by the ELBO. The family sets
    ``needs_data_indices``, so ``fit`` passes each minibatch's rows in the training set
    (``data_indices``) and the model reads c at those rows; ``evaluate_elbo`` passes all rows of
    the training data. Like the recognition network's, these c do not depend on the orbit
    samples. On data other than the training set no c_n exists and the closed-form tilt is used
    (any c gives a valid bound).

Any other likelihood raises ``InvalidArgumentError`` naming ``likelihood``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpyro
from jax.scipy.linalg import solve_triangular
from numpyro.distributions import constraints

from gpzoo.inference.guides import conditional, sqrt_times
from gpzoo.inference.inducing import BaseInducingPoints
from gpzoo.inference.polya_gamma import PolyaGamma, optimal_c, pg_logistic_bound
from gpzoo.inference.svgp import SVGP, Parts
from gpzoo.models import draws
from gpzoo.models.errors import InvalidArgumentError
from gpzoo.models.kernels.invariant import InvariantKernel, pair_sum
from gpzoo.models.likelihoods import Bernoulli

__all__ = [
    "DEFAULT_PREDICTION_ROUNDS",
    "DEFAULT_RECOGNITION_HIDDEN",
    "FREE_C_SITE",
    "InvariantSVGP",
    "MomentEstimates",
    "PG_C_CHOICES",
    "RECOGNITION_SITE",
    "recognition_c",
]

#: Independent sample sets averaged by ``latent_moments`` (prediction): S·rounds samples per input.
DEFAULT_PREDICTION_ROUNDS = 16
#: Values of ``spec.options["pg_c"]``: how the tilt c_n of q(ω_n) = PG(1, c_n) is chosen (module docstring).
PG_C_CHOICES = ("closed-form", "recognition", "free")
#: Hidden-layer widths of the recognition network (x_n, y_n) -> c_n.
DEFAULT_RECOGNITION_HIDDEN = (32, 32)
#: Prefix of the recognition network's ``numpyro.param`` sites.
RECOGNITION_SITE = "pg_recognition"
#: ``numpyro.param`` site of the free per-datum tilts ``[N]`` (``pg_c="free"``).
FREE_C_SITE = "pg_free_c"
#: Sample site of the Pólya–Gamma variables ω_n of the augmented Bernoulli model (eq. 22).
OMEGA_SITE = "omega"


class MomentEstimates(NamedTuple):
    """Unbiased estimates ``[N, L]`` of μ_n, E[f_n²] = μ_n² + σ_n² and σ_n² (van der Wilk et al. 2018, eq. 16–21); a pytree."""

    mean: jax.Array  # [N, L]
    second_moment: jax.Array  # [N, L]
    var: jax.Array  # [N, L]


def _pair_scalar(values, w_off, w_diag):
    """Pair estimate for scalar samples ``[L, S, N]`` -> ``[N, L]``."""
    return jax.vmap(lambda v: pair_sum(v[:, :, None], w_off, w_diag), out_axes=1)(values)  # [N, L]


class InvariantSVGP(SVGP):
    """SVGP whose expected log-likelihood uses the unbiased invariant-kernel estimators (module docstring)."""

    #: Independent orbit-sample sets averaged for q(f*) in ``predict`` (S·rounds samples per input).
    prediction_rounds = DEFAULT_PREDICTION_ROUNDS
    #: The same for the generative program's p(f | u) of an augmentation density (no closed form):
    #: a Monte Carlo conditional whose bias against the exact double-integral kernel falls as 1/rounds.
    conditional_rounds = DEFAULT_PREDICTION_ROUNDS

    def __init__(self, spec, inducing, num_latent):
        super().__init__(spec, inducing, num_latent)
        kernel = spec.kernel
        if not isinstance(kernel, InvariantKernel):
            raise InvalidArgumentError("kernel", f"invariant-svgp needs an InvariantKernel, got {type(kernel).__name__}")
        if not isinstance(inducing, BaseInducingPoints):
            raise InvalidArgumentError("inducing", f"invariant-svgp needs BaseInducingPoints, got {type(inducing).__name__}")
        if kernel.is_sampled and not _is_gaussian_in_f(spec.likelihood):
            raise InvalidArgumentError(
                "likelihood",
                f"a sampled invariant kernel needs a likelihood whose expectation is linear in μ_n, μ_n², σ_n² "
                f"(Gaussian, or Bernoulli(link='logit') through the Pólya–Gamma bound); got {type(spec.likelihood).__name__}"
                + (f"(link={spec.likelihood.link!r})" if isinstance(spec.likelihood, Bernoulli) else ""),
            )
        self.pg_c, self.recognition_hidden = _pg_c_options(spec)

    @property
    def needs_data_indices(self) -> bool:
        """Free per-datum tilts are read at the batch's training-set rows, which ``fit`` then passes."""
        return self.pg_c == "free"

    # ------------------------------------------------------------------ estimators
    def moment_estimates(self, parts: Parts, X, key) -> MomentEstimates:
        """One draw of the unbiased estimates of μ_n, E[f_n²], σ_n² from S orbit samples.

        ``parts.q_sqrt=None`` means q(u) is a point mass at ``parts.q_mu`` (the moments of p(f | u)).
        """
        kernel = parts.kernel
        w_off, w_diag = kernel.orbit.pair_weights()
        w_single = kernel.orbit.single_weight()
        samples = kernel.sample_orbit(X, key)  # [S, N, D]
        S, N, _ = samples.shape
        Kzx = kernel.Kzx_samples(parts.inducing.Z, samples)  # [S, M, N]
        M = Kzx.shape[1]
        Luu = parts.Luu[0]  # [M, M]
        E = solve_triangular(Luu, jnp.moveaxis(Kzx, 0, 1).reshape(M, S * N), lower=True)  # [M, S*N]  Luu⁻¹ k_s
        B = E if self.spec.whiten else solve_triangular(Luu, E, lower=True, trans=1)  # [M, S*N]
        a = (parts.q_mu @ B).reshape(-1, S, N)  # [L, S, N]
        mean = w_single * jnp.sum(a, axis=1).T  # [N, L]
        mean_sq = _pair_scalar(a, w_off, w_diag)  # [N, L]
        kff = kernel.Kff_diag_estimate(samples)  # [N]
        qff = pair_sum(jnp.moveaxis(E.reshape(M, S, N), 0, 2), w_off, w_diag)  # [N]
        var = jnp.broadcast_to((kff - qff)[:, None], mean.shape)  # [N, L]
        if parts.q_sqrt is not None:
            V = sqrt_times(parts.q_sqrt, self.spec.q_structure, B)  # [L, M, S*N]
            V = jnp.moveaxis(V.reshape(V.shape[0], M, S, N), 2, 1)  # [L, S, M, N]
            var = var + jax.vmap(lambda v: pair_sum(jnp.moveaxis(v, 1, 2), w_off, w_diag), out_axes=1)(V)  # [N, L]
        return MomentEstimates(mean, mean_sq + var, var)

    @property
    def stochastic_expectation(self) -> bool:
        """Sampled orbits make the expected log-likelihood an unbiased Monte Carlo estimate."""
        return bool(self.spec.kernel.is_sampled) or super().stochastic_expectation

    @property
    def per_point_draws(self) -> bool:
        """Only a Monte Carlo likelihood draws per data point: the orbit samples are shared by every row
        (``InvariantKernel.sample_orbit``), so a data-parallel step may split the rows
        (:func:`gpzoo.inference.sharding.per_point_draws`)."""
        return bool(self.spec.likelihood.stochastic_expectation)

    def data_term_inputs(self, X, y, data_indices=None, num_data=None) -> dict:
        """The Pólya–Gamma tilts that live in NumPyro params (``pg_c`` "recognition" or "free"), as
        ``{"tilt": c}`` ``[N]``; empty for the closed form and for likelihoods without the PG bound.

        ``"recognition"``: the network's output at (x_n, y_n). ``"free"``: the param ``pg_free_c``
        ``[num_data]`` at rows ``data_indices`` ``[N]``; without rows (data outside the training
        set) the closed form stands in. Call inside a NumPyro model (their values are params).
        """
        if not self._uses_pg_bound:
            return {}
        if self.pg_c == "free" and data_indices is not None:
            if num_data is None:
                raise InvalidArgumentError("num_data", "free tilts need the training-set size with data_indices")
            c_all = numpyro.param(FREE_C_SITE, jnp.ones((num_data,), jnp.result_type(X, float)),
                                  constraint=constraints.positive)  # [num_data]
            return {"tilt": c_all[data_indices]}  # [N]
        if self.pg_c == "recognition":
            return {"tilt": recognition_c(self.recognition_params(X.shape[1], jnp.result_type(X, float)), X, y)}  # [N]
        return {}

    def expected_log_lik(self, parts: Parts, X, y, key=None, tilt=None):
        """Unbiased estimate of E_q(f_n)[log p(y_n|f_n)] (Gaussian, eq. 15) or of the PG bound (eq. 23), ``[N]``.

        ``tilt`` ``[N]``: c_n of q(ω_n) = PG(1, c_n) from :meth:`data_term_inputs`; without it the
        closed form √Ê[f_n²] (van der Wilk et al. 2018, §4.5), from an orbit-sample draw independent
        of the one the bound is evaluated with, without gradient.
        """
        if not parts.kernel.is_sampled:
            return super().expected_log_lik(parts, X, y, key)
        key = _key(key)
        key_moments, key_c = jax.random.split(key)
        est = self.moment_estimates(parts, X, key_moments)
        if parts.likelihood.linear_in_moments:
            # (y − μ̂)² + (Ê[f²] − μ̂²) = y² − 2yμ̂ + Ê[f²]: linear in the estimates, hence unbiased
            return parts.likelihood.variational_expectation(y, est.mean, est.second_moment - est.mean**2)
        if tilt is None:
            tilt = self._closed_form_tilt(parts, X, key_c)  # an independent draw: c is fixed given it
        return pg_logistic_bound(y, est.mean[:, 0], est.second_moment[:, 0], tilt)  # [N]

    @property
    def auxiliary_sites(self) -> tuple[str, ...]:
        """Pólya–Gamma variables ω_n when the bound is the PG one (sampled kernel, Bernoulli-logit)."""
        return (OMEGA_SITE,) if self._uses_pg_bound else ()

    @property
    def _uses_pg_bound(self) -> bool:
        return bool(self.spec.kernel.is_sampled) and isinstance(self.spec.likelihood, Bernoulli)

    def auxiliary_model(self, f) -> dict:
        """ω_n | y_n, f_n ~ PG(1, f_n): with it, log p(y_n | f_n) + log p(ω_n | f_n) = κ_n f_n − log 2 − ω_n f_n²/2
        + log PG(ω_n; 1, 0), the augmented joint of van der Wilk et al. 2018, eq. 22, whose ELBO under
        q(ω_n) = PG(1, c_n) is the bound of eq. 23 that the fast ELBO computes."""
        return {OMEGA_SITE: PolyaGamma(1.0, f[..., 0])} if self._uses_pg_bound else {}

    def auxiliary_guide(self, parts: Parts, X, y, data_indices, num_data) -> dict:
        """q(ω_n) = PG(1, c_n) with the tilt of :meth:`expected_log_lik` (closed form from an orbit draw)."""
        if not self._uses_pg_bound:
            return {}
        tilt = self.data_term_inputs(X, y, data_indices, num_data).get("tilt")
        if tilt is None:
            tilt = self._closed_form_tilt(parts, X, _key(None))
        return {OMEGA_SITE: PolyaGamma(1.0, tilt)}

    def _closed_form_tilt(self, parts: Parts, X, key):
        """c_n = √Ê[f_n²] ``[N]`` from one orbit draw made with ``key``, without gradient (§4.5)."""
        estimate = self.moment_estimates(parts, X, key)
        return jax.lax.stop_gradient(optimal_c(jnp.maximum(estimate.second_moment[:, 0], 1e-12)))

    def recognition_params(self, input_dim: int, dtype) -> dict[str, jax.Array]:
        """The recognition network's weights as ``numpyro.param`` sites ``pg_recognition.{W,b}{i}``.

        Initial values are deterministic (Glorot-normal from a fixed key, so no seeded context is
        needed), with a zero last layer and bias softplus⁻¹(1): every c_n starts at 1.
        """
        widths = (input_dim + 1, *self.recognition_hidden, 1)
        keys = jax.random.split(jax.random.PRNGKey(0), len(widths) - 1)
        params = {}
        for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
            last = i == len(widths) - 2
            W0 = jnp.zeros((fan_in, fan_out), dtype) if last else (
                draws.normal(keys[i], (fan_in, fan_out), dtype) * math.sqrt(2.0 / (fan_in + fan_out)))
            b0 = jnp.full((fan_out,), _SOFTPLUS_INV_ONE if last else 0.0, dtype)
            params[f"W{i}"] = numpyro.param(f"{RECOGNITION_SITE}.W{i}", W0)  # [fan_in, fan_out]
            params[f"b{i}"] = numpyro.param(f"{RECOGNITION_SITE}.b{i}", b0)  # [fan_out]
        return params

    def latent_moments(self, parts: Parts, X):
        """q(f) marginals ``[N, L]`` for prediction: estimates averaged over ``prediction_rounds`` sample sets.

        The average of unbiased estimates is unbiased; the variance estimate is clipped at 1e-12
        (a noisy estimate can be negative).
        """
        if not parts.kernel.is_sampled:
            return super().latent_moments(parts, X)
        return self._averaged_moments(parts, X, self.prediction_rounds)

    def conditional_given_u(self, parts: Parts, X, u):
        """p(f | u) ``[N, L]`` x2: exact for finite orbits (also when training sub-samples them); for an
        augmentation density (no closed form) estimated like :meth:`latent_moments` with q(u) a point mass at u."""
        if parts.kernel.has_closed_form:  # the whole orbit's k_fu and k_ff, also when training sub-samples it
            Kmn = parts.kernel.K_fu(X, parts.inducing.Z)[None]  # [1, M, N]
            return conditional(Kmn, parts.Luu, parts.kernel.K_diag(X), u, jnp.zeros_like(u), "diag", self.spec.whiten)
        return self._averaged_moments(dataclasses.replace(parts, q_mu=u, q_sqrt=None), X, self.conditional_rounds)

    def _averaged_moments(self, parts: Parts, X, rounds: int):
        """Mean and variance ``[N, L]`` averaged over ``rounds`` independent orbit-sample sets."""
        keys = jax.random.split(_key(None), rounds)  # [R, 2]
        means, variances = jax.lax.map(lambda k: (lambda e: (e.mean, e.var))(self.moment_estimates(parts, X, k)), keys)  # [R, N, L] x2
        return jnp.mean(means, axis=0), jnp.maximum(jnp.mean(variances, axis=0), 1e-12)  # [N, L] x2


def _key(key):
    """The given key, else NumPyro's (inside a seeded model), else a fixed key (eager calls)."""
    if key is not None:
        return key
    key = numpyro.prng_key()
    return jax.random.PRNGKey(0) if key is None else key


_SOFTPLUS_INV_ONE = math.log(math.e - 1.0)  # softplus(this) = 1


def recognition_c(params: dict[str, jax.Array], X, y):
    """c_n = softplus(MLP(x_n, 2y_n − 1)) ``[N]`` > 0: the amortised q(ω_n) of van der Wilk et al. 2018, §4.5.

    ``params``: ``W{i}`` ``[fan_in, fan_out]``, ``b{i}`` ``[fan_out]`` for i = 0..n−1 (tanh
    between layers); ``X`` ``[N, D]``, ``y`` ``[N]`` in {0, 1}. PG(1, c) is even in c, so c > 0
    loses nothing.
    """
    h = jnp.concatenate([X, (2.0 * y - 1.0)[:, None].astype(X.dtype)], axis=1)  # [N, D+1]
    num_layers = len(params) // 2
    for i in range(num_layers):
        h = h @ params[f"W{i}"] + params[f"b{i}"]  # [N, width_i]
        if i < num_layers - 1:
            h = jnp.tanh(h)
    return jax.nn.softplus(h[:, 0])  # [N]


def _pg_c_options(spec) -> tuple[str, tuple[int, ...]]:
    """``spec.options["pg_c"]`` (default "closed-form") and the recognition widths, checked."""
    options = spec.options or {}
    choice = options.get("pg_c", "closed-form")
    if choice not in PG_C_CHOICES:
        raise InvalidArgumentError("pg_c", f"must be one of {PG_C_CHOICES}, got {choice!r}")
    uses_pg = spec.kernel.is_sampled and isinstance(spec.likelihood, Bernoulli)
    if choice != "closed-form" and not uses_pg:
        raise InvalidArgumentError(
            "pg_c", f"{choice!r} applies only to the Pólya–Gamma bound (a sampled invariant kernel with "
            f"Bernoulli(link='logit')); this model does not use it")
    hidden = options.get("pg_recognition_hidden", DEFAULT_RECOGNITION_HIDDEN)
    try:
        hidden = tuple(int(h) for h in hidden)
    except (TypeError, ValueError):
        raise InvalidArgumentError("pg_recognition_hidden", f"must be a sequence of positive ints, got {hidden!r}") from None
    if any(h < 1 for h in hidden):
        raise InvalidArgumentError("pg_recognition_hidden", f"must be a sequence of positive ints, got {hidden!r}")
    return choice, hidden


def _is_gaussian_in_f(likelihood) -> bool:
    return likelihood.linear_in_moments or (isinstance(likelihood, Bernoulli) and likelihood.link == "logit")

