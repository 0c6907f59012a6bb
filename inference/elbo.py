"""gpzoo's fast ELBO: a NumPyro ``ELBO`` whose value equals ``Trace_ELBO``'s in expectation.

Every zoo model is a generative NumPyro program (:mod:`gpzoo.inference.svgp`): inducing outputs
``u ~ p(u)``, latent values ``f ~ p(f | u)`` under a data plate, and ``y ~ p(y | f)`` observed. Its
guide draws ``u ~ q(u)`` and ``f`` from the *same* conditional. ``Trace_ELBO`` estimates

    E_q[log p(y | f)] + E_q[log p(u) − log q(u)] + E_q[log p(f | u) − log p(f | u)] (+ hyperparameters)

by sampling; the last bracket is exactly zero. :class:`FastELBO` computes the same bound with the
Monte Carlo noise removed where the maths allows (van der Wilk et al. 2017, eq. 5):

* the data term from the observed site's ``infer["expected_log_lik"]``, a function of the guide's
  q(u) that the model attaches to ``y``: E_q(f_n)[log p(y_n | f_n)] in closed form (Gaussian),
  by Gauss–Hermite (1-D likelihoods) or Monte Carlo (softmax, sampled orbits), times the plate's
  N/B scale;
* ``KL[q(u) || p(u)]`` analytically (any latent site whose pair of distributions has a registered
  ``kl_divergence``);
* the latent sites the data term integrates out (``infer["latent_site"]``: f, and auxiliary
  variables such as Pólya–Gamma ω whose model and guide terms the data term already holds)
  contribute nothing;
* every other site as ``Trace_ELBO`` does: log p − log q of the guide's draw (sampled
  hyperparameters), log p of observed sites without an expected log-likelihood.

The site-level contract a model meets to use it: an observed site carries ``infer`` keys
``expected_log_lik`` (``fn(q_u, key) -> [B]``, built from values the model computed, calling no
NumPyro primitive), ``inducing_site`` (the name of u) and ``latent_site`` (the name of f, or a
tuple of f and the auxiliary sites).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from numpyro.distributions.kl import kl_divergence
from numpyro.handlers import replay, seed, substitute, trace
from numpyro.infer.elbo import ELBO

__all__ = ["FastELBO", "EXPECTED_LOG_LIK", "INDUCING_SITE_KEY", "LATENT_SITE_KEY"]

#: ``infer`` keys of an observed site whose expectation the ELBO takes in closed form.
EXPECTED_LOG_LIK, INDUCING_SITE_KEY, LATENT_SITE_KEY = "expected_log_lik", "inducing_site", "latent_site"


def _scaled_sum(site, value):
    scale = site.get("scale")
    total = jnp.sum(value)
    return total if scale is None else scale * total


class FastELBO(ELBO):
    """The ELBO of a gpzoo model with analytic KL and closed-form / quadrature expectations (module docstring).

    ``num_particles`` > 1 averages independent estimates (only the Monte Carlo parts vary).
    """

    def loss_with_mutable_state(self, rng_key, param_map, model, guide, *args, **kwargs):
        def single_particle(key):
            key_guide, key_model, key_lik = jax.random.split(key, 3)
            guide_trace = trace(substitute(seed(guide, key_guide), data=param_map)).get_trace(*args, **kwargs)
            model_trace = trace(replay(substitute(seed(model, key_model), data=param_map), guide_trace)).get_trace(
                *args, **kwargs)
            return self.elbo_of_traces(model_trace, guide_trace, key_lik)

        if self.num_particles == 1:
            elbo = single_particle(rng_key)
        else:
            elbo = jnp.mean(self.vectorize_particles_fn(single_particle, jax.random.split(rng_key, self.num_particles)))
        return {"loss": -elbo, "mutable_state": None}

    @staticmethod
    def elbo_of_traces(model_trace, guide_trace, key):
        """The bound from a model trace replayed against ``guide_trace`` (see the module docstring)."""
        integrated = set()  # latent sites whose log p − log q cancel exactly (f given u)
        elbo = 0.0
        for index, (name, site) in enumerate(model_trace.items()):
            if site["type"] == "sample" and site["is_observed"] and EXPECTED_LOG_LIK in site["infer"]:
                info = site["infer"]
                q_u = guide_trace[info[INDUCING_SITE_KEY]]["fn"]
                ell = info[EXPECTED_LOG_LIK](q_u, jax.random.fold_in(key, index))  # [B]
                elbo = elbo + _scaled_sum(site, ell)
                latent = info[LATENT_SITE_KEY]
                integrated.update((latent,) if isinstance(latent, str) else latent)
        for name, site in model_trace.items():
            if site["type"] != "sample" or name in integrated:
                continue
            if site["is_observed"]:
                if EXPECTED_LOG_LIK not in site["infer"]:
                    elbo = elbo + _scaled_sum(site, site["fn"].log_prob(site["value"]))
                continue
            guide_site = guide_trace[name]
            try:
                kl = kl_divergence(guide_site["fn"], site["fn"])
            except NotImplementedError:
                log_ratio = site["fn"].log_prob(site["value"]) - guide_site["fn"].log_prob(site["value"])
                elbo = elbo + _scaled_sum(site, log_ratio)
            else:
                elbo = elbo - _scaled_sum(site, kl)
        return elbo
