"""Inter-domain SVGP for invariant kernels with sampled orbits (seed 001 §4.2–4.5, App. B; seed 000 App. D).

Inducing variables u = g(Z) live in the *base* function's input space (seed 001 eq. 13, seed 000
eq. D.30–D.32): Kuu = k_g(Z, Z) and k_fu(x, z) = Σ_a k_g(x_a, z) (or ∫ p(x_a|x) k_g(x_a, z)).
:class:`BaseInducingPoints` is that inducing type (initialiser kind ``"invariant-points"``).

For finite orbits evaluated whole, Kuf and Kff are exact and the ordinary SVGP path applies
(``method="svgp"``). When the orbit is sub-sampled or the kernel is a double integral over an
augmentation density, :class:`InvariantSVGP` (``method="invariant-svgp"``) replaces q(f_n)'s
moments by unbiased estimates from one set of S samples per minibatch (seed 001 eq. 16–21):

    μ̂_n   = w₁ Σ_s a_s,                    a_s = k_g(x^(s), Z) Kuu⁻¹ m            (eq. 16–17)
    μ̂²_n  = Σ_{s,s'} w_{ss'} a_s a_s'                                              (eq. 18, 21)
    σ̂²_n  = k̂_f(x_n, x_n) − Σ w_{ss'} e_sᵀ e_s' + Σ w_{ss'} v_sᵀ v_s'             (eq. 19–21)

with e_s = Luu⁻¹ k_g(Z, x^(s)) and v_s = S^{1/2}ᵀ (whitened: e_s, else Kuu⁻¹ k_g(Z, x^(s))), so
that e_sᵀe_s' − v_sᵀv_s' = k_sᵀ Kuu⁻¹ (Kuu − S) Kuu⁻¹ k_s'. Each pair estimate costs O(S·M) per
datum (App. B.2.1). The weights w come from the orbit (:mod:`models.kernels.invariant`).

Likelihoods: the estimates are unbiased only for expressions *linear* in μ_n, μ_n², σ_n², so a
sampled kernel is paired with

* ``Gaussian``: E_q[log p(y_n|f_n)] = −½[log 2πs² + (y² − 2yμ + μ² + σ²)/s²] (eq. 15), computed
  by the likelihood itself with mean μ̂ and "variance" μ̂² + σ̂² − μ̂² (which keeps it linear);
* ``Bernoulli(link="logit")``: the Pólya–Gamma bound (eq. 22–23, :func:`pg_logistic_bound`) with
  q(ω_n) = PG(1, c_n), c_n = √(E[f_n²]) in closed form (Jaakkola–Jordan's optimum) instead of
  the seed's recognition network. c_n is computed, without gradient, from an *independent* set
  of orbit samples, so given c the bound estimate stays unbiased (and every c gives a bound).

Any other likelihood raises ``InvalidArgumentError`` naming ``likelihood``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from jax.scipy.linalg import solve_triangular
from numpyro.distributions import constraints

from inference.fit import register_family
from inference.guides import _sqrt_times
from inference.inducing import InducingVariables, Kuf, Kuu, initialise_inducing, register_initialiser
from inference.polya_gamma import optimal_c, pg_logistic_bound
from inference.svgp import SVGP, Parts
from models.errors import InvalidArgumentError
from models.kernels.invariant import InvariantKernel, pair_sum
from models.likelihoods import Bernoulli, Gaussian
from models.parameters import hyper, pytree_dataclass

__all__ = ["BaseInducingPoints", "InvariantSVGP", "MomentEstimates", "DEFAULT_PREDICTION_ROUNDS"]

#: Independent sample sets averaged by ``latent_moments`` (prediction): S·rounds samples per input.
DEFAULT_PREDICTION_ROUNDS = 16


@pytree_dataclass
class BaseInducingPoints(InducingVariables):
    """u = g(Z): the base function at inducing inputs ``Z`` ``[M, D]`` (seed 001 eq. 13, seed 000 eq. D.31–D.32)."""

    Z: Any = hyper(constraint=constraints.real)

    @property
    def num_inducing(self) -> int:
        return int(np.shape(self.Z.value if hasattr(self.Z, "value") else self.Z)[0])


@Kuu.register(BaseInducingPoints, InvariantKernel)
def _kuu_base(inducing, kernel):
    return kernel.base_kernel.K(inducing.Z)[None]  # [1, M, M]  k_g(Z, Z)


@Kuf.register(BaseInducingPoints, InvariantKernel, object)
def _kuf_base(inducing, kernel, X):
    if kernel.is_sampled:
        raise InvalidArgumentError(
            "kernel", "Kuf of a sampled invariant kernel is only estimated; use method='invariant-svgp' (seed 001 eq. 16–17)")
    return kernel.K_fu(X, inducing.Z)[None]  # [1, M, N]


@register_initialiser("invariant-points")
def _init_base_points(kernel, X, num_inducing, key, method):
    """Z from training inputs (random or k-means), as for ordinary points: they lie in g's input space too."""
    return BaseInducingPoints(initialise_inducing("points", kernel, X, num_inducing, key, method).Z)


class MomentEstimates(NamedTuple):
    """Unbiased estimates ``[N, L]`` of μ_n, E[f_n²] = μ_n² + σ_n² and σ_n² (seed 001 eq. 16–21); a pytree."""

    mean: jax.Array  # [N, L]
    second_moment: jax.Array  # [N, L]
    var: jax.Array  # [N, L]


def _pair_scalar(values, w_off, w_diag):
    """Pair estimate for scalar samples ``[L, S, N]`` -> ``[N, L]``."""
    return jax.vmap(lambda v: pair_sum(v[:, :, None], w_off, w_diag), out_axes=1)(values)  # [N, L]


class InvariantSVGP(SVGP):
    """SVGP whose expected log-likelihood uses the unbiased invariant-kernel estimators (module docstring)."""

    prediction_rounds = DEFAULT_PREDICTION_ROUNDS

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

    # ------------------------------------------------------------------ estimators
    def moment_estimates(self, parts: Parts, X, key) -> MomentEstimates:
        """One draw of the unbiased estimates of μ_n, E[f_n²], σ_n² from S orbit samples."""
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
        V = _sqrt_times(parts.q_sqrt, self.spec.q_structure, B)  # [L, M, S*N]
        V = jnp.moveaxis(V.reshape(V.shape[0], M, S, N), 2, 1)  # [L, S, M, N]
        mean = w_single * jnp.sum(a, axis=1).T  # [N, L]
        mean_sq = _pair_scalar(a, w_off, w_diag)  # [N, L]
        kff = kernel.Kff_diag_estimate(samples)  # [N]
        qff = pair_sum(jnp.moveaxis(E.reshape(M, S, N), 0, 2), w_off, w_diag)  # [N]
        sv = jax.vmap(lambda v: pair_sum(jnp.moveaxis(v, 1, 2), w_off, w_diag), out_axes=1)(V)  # [N, L]
        var = (kff - qff)[:, None] + sv  # [N, L]
        return MomentEstimates(mean, mean_sq + var, var)

    def expected_log_lik(self, parts: Parts, X, y, key=None):
        """Unbiased estimate of E_q(f_n)[log p(y_n|f_n)] (Gaussian, eq. 15) or of the PG bound (eq. 23), ``[N]``."""
        if not parts.kernel.is_sampled:
            return super().expected_log_lik(parts, X, y, key)
        key = _key(key)
        key_moments, key_c = jax.random.split(key)
        est = self.moment_estimates(parts, X, key_moments)
        if isinstance(parts.likelihood, Gaussian):
            # (y − μ̂)² + (Ê[f²] − μ̂²) = y² − 2yμ̂ + Ê[f²]: linear in the estimates, hence unbiased
            return parts.likelihood.variational_expectation(y, est.mean, est.second_moment - est.mean**2)
        c_est = self.moment_estimates(parts, X, key_c)  # independent draw: c is fixed given it
        c = jax.lax.stop_gradient(optimal_c(jnp.maximum(c_est.second_moment[:, 0], 1e-12)))  # [N]
        return pg_logistic_bound(y, est.mean[:, 0], est.second_moment[:, 0], c)  # [N]

    def latent_moments(self, parts: Parts, X):
        """q(f) marginals ``[N, L]`` for prediction: estimates averaged over ``prediction_rounds`` sample sets.

        The average of unbiased estimates is unbiased; the variance estimate is clipped at 1e-12
        (a noisy estimate can be negative).
        """
        if not parts.kernel.is_sampled:
            return super().latent_moments(parts, X)
        keys = jax.random.split(_key(None), self.prediction_rounds)  # [R, 2]
        means, variances = jax.lax.map(lambda k: (lambda e: (e.mean, e.var))(self.moment_estimates(parts, X, k)), keys)  # [R, N, L] x2
        return jnp.mean(means, axis=0), jnp.maximum(jnp.mean(variances, axis=0), 1e-12)  # [N, L] x2


def _key(key):
    """The given key, else NumPyro's (inside a seeded model), else a fixed key (eager calls)."""
    if key is not None:
        return key
    key = numpyro.prng_key()
    return jax.random.PRNGKey(0) if key is None else key


def _is_gaussian_in_f(likelihood) -> bool:
    return isinstance(likelihood, Gaussian) or (isinstance(likelihood, Bernoulli) and likelihood.link == "logit")


register_family("invariant-svgp", InvariantSVGP)
