"""The sparse variational GP as a generative NumPyro model + custom guide (van der Wilk et al. 2017, §2.1, eq. 5–6).

Model (a generative program: ``Predictive`` draws y, ``MCMC(NUTS)`` samples it, ``az.from_numpyro``
finds its log-likelihood)::

    θ ~ p(θ) or θ = numpyro.param          (kernel / likelihood / inducing hyperparameters)
    u ~ p(u) = N(0, Kuu)  (or v ~ N(0, I) whitened)                       site "u"  [L, GM]
    for n in plate("data", N, subsample B):
        f_n | u ~ N(Kfu Kuu⁻¹ u, Kff − Qff)                                 site "f"  [B, L]
        y_n | f_n ~ p(y | f_n)            (the likelihood's distribution)   site "y"  [B], observed

Guide: ``u ~ q(u)`` (:class:`gpzoo.inference.guides.InducingPosterior`) and ``f`` from the same
conditional p(f | u), plus, when some hyperparameters have priors, a mean-field normal guide over
them (``AutoNormal`` on those sites only). With f drawn from the same conditional in model and
guide, ``Trace_ELBO`` is the SVGP bound Σ_n E_q(f_n)[log p(y_n|f_n)] − KL[q(u) || p(u)];
:class:`gpzoo.inference.elbo.FastELBO` computes it with the KL analytic and the expectation
analytic / by quadrature, reading the model's ``y`` site's ``infer["expected_log_lik"]``.
Only the model's conditional is ever evaluated by the fast bound: the guide's copy is dead code
that XLA removes from the compiled step.
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import Distribution
from numpyro.distributions.kl import kl_divergence
from numpyro.infer.autoguide import AutoNormal

from gpzoo.inference.elbo import EXPECTED_LOG_LIK, INDUCING_SITE_KEY, LATENT_SITE_KEY
from gpzoo.inference.guides import InducingPosterior, InducingPrior, conditional, variational_params
from gpzoo.inference.inducing import InducingVariables, Kuf, Kuu
from gpzoo.inference.linalg import cholesky_with_jitter
from gpzoo.inference.programs import definition_of
from gpzoo.models.errors import InvalidArgumentError
from gpzoo.models.zoo import ModelSpec

__all__ = ["SVGP", "Parts", "has_prior"]

KERNEL_SITE, LIKELIHOOD_SITE, INDUCING_SITE = "kernel", "likelihood", "inducing"
#: Sample sites of the generative program: inducing outputs, latent values, observations.
U_SITE, F_SITE, Y_SITE = "u", "f", "y"
#: Smallest variance of p(f | u) handed to a Normal (Kff − Qff is ~0 at the inducing inputs).
MIN_CONDITIONAL_VARIANCE = 1e-12


@dataclasses.dataclass(frozen=True)
class Parts:
    """A realised model: hyperparameters bound, Kuu factorised and, for evaluation, q(u) read."""

    kernel: object
    likelihood: object
    inducing: InducingVariables
    Luu: jax.Array  # [G, M, M]
    jitter: jax.Array  # scalar actually used
    q_mu: jax.Array | None = None  # [L, GM]
    q_sqrt: jax.Array | None = None

    def with_posterior(self, q_u: InducingPosterior) -> "Parts":
        """These parts with q(u) taken from a guide's distribution."""
        return dataclasses.replace(self, q_mu=q_u.q_mu, q_sqrt=q_u.q_sqrt)


class SVGP:
    """Builds the NumPyro model/guide of a :class:`ModelSpec` with given inducing variables."""

    def __init__(self, spec: ModelSpec, inducing: InducingVariables, num_latent: int):
        self.spec, self.inducing, self.num_latent = spec, inducing, num_latent
        def kuu_at_init():
            with numpyro.handlers.seed(rng_seed=0), numpyro.handlers.block():
                return Kuu(inducing.realise(INDUCING_SITE), spec.kernel.realise(KERNEL_SITE))  # [G, M, M]

        self.num_groups = int(jax.eval_shape(kuu_at_init).shape[0])  # shapes only: nothing is computed
        hyper_model = numpyro.handlers.block(self.model, hide=[U_SITE, F_SITE, *self.auxiliary_sites])
        self.hyper_guide = AutoNormal(hyper_model) if has_prior(spec) else None

    # ------------------------------------------------------------------ shared pieces
    def prior_parts(self) -> Parts:
        """Realise the hyperparameters and factorise Kuu inside the current NumPyro context (no q(u))."""
        spec = self.spec
        kernel = spec.kernel.realise(KERNEL_SITE)
        likelihood = spec.likelihood.realise(LIKELIHOOD_SITE)
        inducing = self.inducing.realise(INDUCING_SITE)
        Luu, jitter = cholesky_with_jitter(Kuu(inducing, kernel), spec.jitter)  # [G, M, M]
        return Parts(kernel, likelihood, inducing, Luu, jitter)

    def variational_params(self):
        """Declare q(u)'s ``q_mu`` ``[L, GM]`` and ``q_sqrt`` params (shared by name with every caller)."""
        return variational_params(
            self.num_latent, self.num_groups, self.inducing.num_inducing, self.spec.q_structure,
            init_sqrt=None if self.spec.whiten else self._init_unwhitened_sqrt(),
        )

    def parts(self) -> Parts:
        """Realise hyperparameters and q(u) inside the current NumPyro context (evaluation, prediction)."""
        q_mu, q_sqrt = self.variational_params()
        return dataclasses.replace(self.prior_parts(), q_mu=q_mu, q_sqrt=q_sqrt)

    def conditional_given_u(self, parts: Parts, X, u):
        """Mean and variance ``[N, L]`` of p(f | u) at inputs X (q(u) a point mass at u ``[L, GM]``)."""
        Kmn = Kuf(parts.inducing, parts.kernel, X)  # [G, M, N]
        Kff_diag = parts.kernel.K_diag(X)  # [N]
        return conditional(Kmn, parts.Luu, Kff_diag, u, jnp.zeros_like(u), "diag", self.spec.whiten)

    def latent_moments(self, parts: Parts, X):
        """q(f) marginals at inputs X: mean, var ``[N, L]``."""
        Kmn = Kuf(parts.inducing, parts.kernel, X)  # [G, M, N]
        Kff_diag = parts.kernel.K_diag(X)  # [N]
        return conditional(Kmn, parts.Luu, Kff_diag, parts.q_mu, parts.q_sqrt, self.spec.q_structure, self.spec.whiten)

    def predictive_moments(self, parts: Parts, X, key):
        """q(f*) moments ``[N, L]``, y* moments and class probabilities (None unless classifying) at inputs X."""
        mean, var = self.latent_moments(parts, X)
        y_mean, y_var = parts.likelihood.predict_mean_and_var(mean, var)
        classify = parts.likelihood.task in ("binary", "multiclass")
        probs = parts.likelihood.predict_probs(mean, var, key=key) if classify else None
        return mean, var, y_mean, y_var, probs

    def kl(self, parts: Parts):
        """KL[q(u) || p(u)] of every inducing site of the model (analytic; ``parts`` carries q(u))."""
        return kl_divergence(self.posterior(parts), self.prior(parts))

    @property
    def stochastic_expectation(self) -> bool:
        """Whether :meth:`expected_log_lik` is a Monte Carlo estimate (so the ELBO has an SE)."""
        return bool(self.spec.likelihood.stochastic_expectation)

    def expected_log_lik(self, parts: Parts, X, y, key=None):
        """E_q(f_n)[log p(y_n | f_n)], ``[N]``: a function of ``parts`` (with q(u)), calling no NumPyro primitive."""
        mean, var = self.latent_moments(parts, X)
        return parts.likelihood.variational_expectation(y, mean, var, key=key)

    def data_term_inputs(self, X, y, data_indices=None, num_data=None) -> dict:
        """Extra keyword arguments of :meth:`expected_log_lik` that live in NumPyro params (e.g. per-datum
        variational parameters); read inside the model's NumPyro context. None for the plain SVGP."""
        return {}

    def prior(self, parts: Parts) -> InducingPrior:
        return InducingPrior(parts.Luu, self.num_latent, self.spec.whiten)

    def posterior(self, parts: Parts) -> InducingPosterior:
        return InducingPosterior(parts.q_mu, parts.q_sqrt, self.spec.q_structure)

    # ------------------------------------------------------------------ NumPyro program
    #: Families with per-datum variational parameters set this: ``fit`` then passes the batch's
    #: training-set rows as ``data_indices`` to ``model``/``guide``, and the model hands them (with
    #: ``num_data``) to :meth:`expected_log_lik`.
    needs_data_indices = False

    def model(self, X, y=None, num_data=None, data_indices=None):
        """The generative program (module docstring) for a minibatch X ``[B, D]`` (and y ``[B]``, or None to draw it).

        ``num_data``: N of the full data set (N/B scaling); ``data_indices`` ``[B]``: the rows'
        positions in the training set (``needs_data_indices``).
        """
        parts = self.prior_parts()
        u = numpyro.sample(U_SITE, self.prior(parts))  # [L, GM]
        batch = X.shape[0]
        infer = {}
        if y is not None:
            inputs = self.data_term_inputs(X, y, data_indices, rows_in(num_data, batch))

            def expected_log_lik(q_u, key):  # [B]; the fast ELBO's data term (gpzoo.inference.elbo)
                return self.expected_log_lik(parts.with_posterior(q_u), X, y, key, **inputs)

            infer = {EXPECTED_LOG_LIK: expected_log_lik, INDUCING_SITE_KEY: U_SITE,
                     LATENT_SITE_KEY: (F_SITE, *self.auxiliary_sites)}
        with data_plate(num_data, batch):
            f = numpyro.sample(F_SITE, self._latent(parts, X, u))  # [B, L]
            numpyro.sample(Y_SITE, parts.likelihood.distribution(f), obs=self._observed(y), infer=infer)
            if y is not None:
                for name, fn in self.auxiliary_model(f).items():
                    numpyro.sample(name, fn)

    def guide(self, X, y=None, num_data=None, data_indices=None):
        """q(θ) (sampled hyperparameters, if any), q(u), and f from the model's conditional p(f | u).

        f is a guide site only when y is given (the bound scores it against the model's f); without y
        the model draws f ~ p(f | u) itself, the same conditional, so ``Predictive(model, guide=guide)``
        returns f with y.
        """
        hyper = self.hyper_guide(X, y, num_data) if self.hyper_guide is not None else {}
        q_mu, q_sqrt = self.variational_params()
        u = numpyro.sample(U_SITE, InducingPosterior(q_mu, q_sqrt, self.spec.q_structure))  # [L, GM]
        # the hyperparameters' sample sites belong to the hyper guide: here they only take its values
        with numpyro.handlers.block(hide_fn=lambda site: site["type"] == "sample"), numpyro.handlers.substitute(data=hyper):
            parts = self.prior_parts()
        batch = X.shape[0]
        with data_plate(num_data, batch):
            if y is not None:
                numpyro.sample(F_SITE, self._latent(parts, X, u))  # [B, L]
            if y is not None and self.auxiliary_sites:
                posterior = dataclasses.replace(parts, q_mu=q_mu, q_sqrt=q_sqrt)
                for name, fn in self.auxiliary_guide(posterior, X, y, data_indices, rows_in(num_data, batch)).items():
                    numpyro.sample(name, fn)

    #: Auxiliary latent sites of the observation model (e.g. Pólya–Gamma variables), integrated out
    #: by the fast ELBO's data term together with f. None for the plain SVGP.
    auxiliary_sites: tuple[str, ...] = ()

    def auxiliary_model(self, f) -> dict:
        """The model's auxiliary sites given f ``[B, L]`` (name -> distribution, batch ``[B]``)."""
        return {}

    def auxiliary_guide(self, parts: Parts, X, y, data_indices, num_data) -> dict:
        """The guide's distributions of the auxiliary sites (``parts`` carries q(u))."""
        return {}

    def _latent(self, parts: Parts, X, u) -> dist.Distribution:
        """p(f | u) as independent Normals: batch ``[B]``, event ``[L]``."""
        mean, var = self.conditional_given_u(parts, X, u)  # [B, L] x2
        return dist.Normal(mean, jnp.sqrt(jnp.maximum(var, MIN_CONDITIONAL_VARIANCE))).to_event(1)

    def _observed(self, y):
        """y as the observation site takes it: integer labels for classification and count likelihoods."""
        if y is None or self.spec.likelihood.task == "regression":
            return y
        return jnp.asarray(y).astype(jnp.int32)

    def jitter_used(self, params) -> jax.Array:
        """The jitter the Cholesky of Kuu needs at constrained ``params`` (scalar; > spec.jitter after an increase)."""
        with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
            kernel = self.spec.kernel.realise(KERNEL_SITE)
            inducing = self.inducing.realise(INDUCING_SITE)
            return cholesky_with_jitter(Kuu(inducing, kernel), self.spec.jitter)[1]

    def check_analytic_kl(self) -> None:
        """Raise ``TypeError`` unless KL[q(u) || p(u)] is analytic (no silent Monte Carlo fallback).

        Checked once per model structure (the KL's dispatch depends on nothing else)."""
        definition = definition_of(self)[0]
        if definition in _ANALYTIC_KL:
            return

        def kl():
            with numpyro.handlers.seed(rng_seed=0), numpyro.handlers.block():
                parts = self.parts()
            return kl_divergence(self.posterior(parts), self.prior(parts))

        try:
            jax.eval_shape(kl)  # traced only: the dispatch happens at trace time
        except NotImplementedError as exc:  # pragma: no cover - guards future families
            raise TypeError(f"no analytic KL registered for the inducing site of {self.spec.name!r}") from exc
        _ANALYTIC_KL.add(definition)

    def _init_unwhitened_sqrt(self):
        """chol Kuu at the initial hyperparameters (q(u) starts at the prior), or the identity."""
        if has_prior(self.spec):
            return None
        K = Kuu(self.inducing.resolved(), self.spec.kernel.resolved())
        return cholesky_with_jitter(K, self.spec.jitter)[0]


#: Model structures whose KL[q(u) || p(u)] was found analytic (:meth:`SVGP.check_analytic_kl`).
_ANALYTIC_KL: set = set()


def data_plate(num_data, batch: int):
    """The plate of a minibatch of ``batch`` rows out of ``num_data`` (None: the minibatch is all the data).

    ``num_data`` may be a traced array (compiled programs take N as an argument, so fits on data
    sets of different sizes share them): the plate then has the minibatch's size and a
    ``scale`` handler applies the N/B weight, the same weight a subsampled plate gives its sites.
    """
    if num_data is None or isinstance(num_data, (int, np.integer)):
        return numpyro.plate("data", batch if num_data is None else int(num_data), subsample_size=batch)
    return _scaled_plate(num_data, batch)


@contextlib.contextmanager
def _scaled_plate(num_data, batch: int):
    with numpyro.handlers.scale(scale=jnp.asarray(num_data) / batch), numpyro.plate("data", batch) as rows:
        yield rows


def rows_in(num_data, batch: int):
    """``num_data`` where given, else the minibatch's size (N of a call without ``num_data``)."""
    return batch if num_data is None else num_data


def has_prior(spec: ModelSpec) -> bool:
    leaves = jax.tree_util.tree_leaves(
        (spec.kernel, spec.likelihood), is_leaf=lambda x: isinstance(x, Distribution)
    )
    return any(isinstance(leaf, Distribution) for leaf in leaves)


def check_num_latent(num_latent) -> int:
    if int(num_latent) < 1:
        raise InvalidArgumentError("num_latent", f"must be >= 1, got {num_latent}")
    return int(num_latent)
