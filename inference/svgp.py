"""The sparse variational GP as a NumPyro model + custom guide (van der Wilk et al. 2017, §2.1, eq. 5–6).

Model::

    θ ~ p(θ) or θ = numpyro.param          (kernel / likelihood / inducing hyperparameters)
    u ~ p(u) = N(0, Kuu)  (or v ~ N(0, I) whitened)                       site "u"
    for n in plate("data", N, subsample B):  factor E_q(f_n)[log p(y_n | f_n)]  site "ell"

Guide: ``u ~ q(u)`` (:class:`gpzoo.inference.guides.InducingPosterior`) plus, when some hyperparameters
have priors, a mean-field normal guide over them (``AutoNormal`` on those sites only).

``TraceMeanField_ELBO`` then gives exactly Σ_n E_q(f_n)[log p(y_n|f_n)] − KL[q(u) || p(u)]:
the KL through the analytic registration of the (q, p) pair, the expectation inside the factor
(analytic / Gauss–Hermite / Monte Carlo as the likelihood decides), scaled N/B by the plate.
The model reads ``q_mu`` / ``q_sqrt`` — the same NumPyro params the guide declares — to form
q(f_n); this is the inter-domain SVGP of GPflow written in NumPyro idiom.
"""

from __future__ import annotations

import dataclasses

import jax
import numpyro
from numpyro.distributions import Distribution
from numpyro.distributions.kl import kl_divergence
from numpyro.infer.autoguide import AutoNormal

from gpzoo.inference.guides import InducingPosterior, InducingPrior, conditional, variational_params
from gpzoo.inference.inducing import InducingVariables, Kuf, Kuu
from gpzoo.inference.linalg import cholesky_with_jitter
from gpzoo.models.errors import InvalidArgumentError
from gpzoo.models.zoo import ModelSpec

__all__ = ["SVGP", "Parts"]

KERNEL_SITE, LIKELIHOOD_SITE, INDUCING_SITE = "kernel", "likelihood", "inducing"


@dataclasses.dataclass(frozen=True)
class Parts:
    """A realised model: hyperparameters bound, Kuu factorised, q(u) parameters read."""

    kernel: object
    likelihood: object
    inducing: InducingVariables
    Luu: jax.Array  # [G, M, M]
    jitter: jax.Array  # scalar actually used
    q_mu: jax.Array  # [L, GM]
    q_sqrt: jax.Array


class SVGP:
    """Builds the NumPyro model/guide of a :class:`ModelSpec` with given inducing variables."""

    def __init__(self, spec: ModelSpec, inducing: InducingVariables, num_latent: int):
        self.spec, self.inducing, self.num_latent = spec, inducing, num_latent
        def kuu_at_init():
            with numpyro.handlers.seed(rng_seed=0), numpyro.handlers.block():
                return Kuu(inducing.realise(INDUCING_SITE), spec.kernel.realise(KERNEL_SITE))  # [G, M, M]

        self.num_groups = int(jax.eval_shape(kuu_at_init).shape[0])  # shapes only: nothing is computed
        hyper_model = numpyro.handlers.block(self.model, hide=["u"])
        self.hyper_guide = AutoNormal(hyper_model) if _has_prior(spec) else None

    # ------------------------------------------------------------------ shared pieces
    def parts(self) -> Parts:
        """Realise hyperparameters and q(u) inside the current NumPyro context."""
        spec = self.spec
        kernel = spec.kernel.realise(KERNEL_SITE)
        likelihood = spec.likelihood.realise(LIKELIHOOD_SITE)
        inducing = self.inducing.realise(INDUCING_SITE)
        Luu, jitter = cholesky_with_jitter(Kuu(inducing, kernel), spec.jitter)  # [G, M, M]
        q_mu, q_sqrt = variational_params(
            self.num_latent, self.num_groups, self.inducing.num_inducing, spec.q_structure,
            init_sqrt=None if spec.whiten else self._init_unwhitened_sqrt(),
        )
        return Parts(kernel, likelihood, inducing, Luu, jitter, q_mu, q_sqrt)

    def latent_moments(self, parts: Parts, X):
        """q(f) marginals at inputs X: mean, var ``[N, L]``."""
        Kmn = Kuf(parts.inducing, parts.kernel, X)  # [G, M, N]
        Kff_diag = parts.kernel.K_diag(X)  # [N]
        return conditional(Kmn, parts.Luu, Kff_diag, parts.q_mu, parts.q_sqrt, self.spec.q_structure, self.spec.whiten)

    @property
    def stochastic_expectation(self) -> bool:
        """Whether :meth:`expected_log_lik` is a Monte Carlo estimate (so the ELBO has an SE)."""
        return bool(self.spec.likelihood.stochastic_expectation)

    def expected_log_lik(self, parts: Parts, X, y, key=None):
        """E_q(f_n)[log p(y_n | f_n)], ``[N]``."""
        mean, var = self.latent_moments(parts, X)
        return parts.likelihood.variational_expectation(y, mean, var, key=key)

    def prior(self, parts: Parts) -> InducingPrior:
        return InducingPrior(parts.Luu, self.num_latent, self.spec.whiten)

    def posterior(self, parts: Parts) -> InducingPosterior:
        return InducingPosterior(parts.q_mu, parts.q_sqrt, self.spec.q_structure)

    # ------------------------------------------------------------------ NumPyro program
    #: Families with per-datum variational parameters set this: ``fit`` then passes the batch's
    #: training-set rows as ``data_indices`` to ``model``/``guide``, and the model hands them (with
    #: ``num_data``) to :meth:`expected_log_lik`.
    needs_data_indices = False

    def model(self, X, y, num_data=None, data_indices=None):
        """X, y: a minibatch (or all data); ``num_data``: N of the full data set (N/B scaling);
        ``data_indices`` ``[B]``: the rows' positions in the training set (``needs_data_indices``)."""
        parts = self.parts()
        numpyro.deterministic("jitter", parts.jitter)
        numpyro.sample("u", self.prior(parts))
        batch = X.shape[0]
        key = numpyro.prng_key() if parts.likelihood.stochastic_expectation else None
        rows = {} if data_indices is None else {"data_indices": data_indices, "num_data": num_data or batch}
        with numpyro.plate("data", num_data or batch, subsample_size=batch):
            numpyro.factor("ell", self.expected_log_lik(parts, X, y, key, **rows))

    def guide(self, X, y, num_data=None, data_indices=None):
        if self.hyper_guide is not None:
            self.hyper_guide(X, y, num_data)
        parts_q = variational_params(
            self.num_latent, self.num_groups, self.inducing.num_inducing, self.spec.q_structure,
            init_sqrt=None if self.spec.whiten else self._init_unwhitened_sqrt(),
        )
        numpyro.sample("u", InducingPosterior(*parts_q, self.spec.q_structure))

    def check_analytic_kl(self) -> None:
        """Raise ``TypeError`` unless KL[q(u) || p(u)] is analytic (no silent Monte Carlo fallback)."""
        def kl():
            with numpyro.handlers.seed(rng_seed=0), numpyro.handlers.block():
                parts = self.parts()
            return kl_divergence(self.posterior(parts), self.prior(parts))

        try:
            jax.eval_shape(kl)  # traced only: the dispatch happens at trace time
        except NotImplementedError as exc:  # pragma: no cover - guards future families
            raise TypeError(f"no analytic KL registered for the inducing site of {self.spec.name!r}") from exc

    def _init_unwhitened_sqrt(self):
        """chol Kuu at the initial hyperparameters (q(u) starts at the prior), or the identity."""
        if _has_prior(self.spec):
            return None
        K = Kuu(self.inducing.resolved(), self.spec.kernel.resolved())
        return cholesky_with_jitter(K, self.spec.jitter)[0]


def _has_prior(spec: ModelSpec) -> bool:
    leaves = jax.tree_util.tree_leaves(
        (spec.kernel, spec.likelihood), is_leaf=lambda x: isinstance(x, Distribution)
    )
    return any(isinstance(leaf, Distribution) for leaf in leaves)


def check_num_latent(num_latent) -> int:
    if int(num_latent) < 1:
        raise InvalidArgumentError("num_latent", f"must be >= 1, got {num_latent}")
    return int(num_latent)
