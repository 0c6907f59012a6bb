"""Natural-gradient steps on q(u) inside SVI (``fit(..., optimizer="natgrad")``).

The Gaussian q(u) (``q_mu`` ``[L, GM]``, ``q_sqrt`` ``[L, GM, GM]`` lower triangular, the
``"full"`` structure; whitened or not as ``spec.whiten`` says) takes a natural-gradient step, then
every other parameter (kernel hyperparameters, inducing inputs, likelihood parameters, hidden
layers) an Adam step with ``learning_rate`` from the ELBO's gradient at the new q(u): two
gradient evaluations per step, alternating as Salimbeni, Eleftheriadis & Hensman 2018 do
(also Hensman et al. 2013).

For each latent function, with natural parameters θ₁ = S⁻¹m, θ₂ = −½S⁻¹ and expectation
parameters η₁ = m, η₂ = S + mmᵀ, the natural gradient of the ELBO with respect to θ equals its
ordinary gradient with respect to η. The step differentiates the ELBO through
m = η₁, S = η₂ − η₁η₁ᵀ, q_sqrt = chol(S) and sets

    θ₁ ← θ₁ + γ ∂ELBO/∂η₁,    θ₂ ← θ₂ + γ ∂ELBO/∂η₂,

then maps back to (q_mu, q_sqrt) by one Cholesky factorisation of the new precision. For a
Gaussian likelihood with all data in the batch, γ = 1 lands on the optimal q(u) in one step (the
ELBO is then Titsias' collapsed bound at the current hyperparameters,
:func:`gpzoo.inference.exact.collapsed_elbo`). With minibatches the ELBO's data term is the
usual N/B-scaled estimate, so the step is a stochastic natural gradient. Linear maps of u act
linearly on natural parameters, so the whitened and unwhitened steps are the same step.

Step size γ (``natgrad_step``): a float in (0, 1], or a schedule ``step -> γ`` (a function of
the step count traced under jit, values in (0, 1]). Default: γ = 1 for a Gaussian likelihood;
otherwise :func:`natgrad_warmup`, which rises log-linearly from 1e-4 to 0.1 over the first
:data:`WARMUP_STEPS` steps and stays at 0.1 (a large early step on a non-conjugate likelihood
can leave the precision indefinite, which the NaN guard then reports as a ``TrainingError``).

Supported: the SVI-fitted families whose q(u) is the ``"full"`` Gaussian under the sites
``q_mu``/``q_sqrt`` — svgp, invariant-svgp and deep-svgp (its output layer's q(u); the hidden
layers' inducing outputs take Adam steps). Refused with an ``InvalidArgumentError`` naming
``optimizer``: the ``"diag"`` and ``"block"`` structures (no diagonal analogue is implemented), and
the methods not fitted by SVI (dkm, svgp-logistic-pg, which has its own natural gradients).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from numpyro.distributions import biject_to
from numpyro.infer.svi import SVIState, _make_loss_fn

from gpzoo.inference.guides import Q_SQRT
from gpzoo.models.errors import InvalidArgumentError, check_real

__all__ = ["NATGRAD", "WARMUP_END", "WARMUP_START", "WARMUP_STEPS", "check_natgrad_step", "check_natgrad_spec",
           "default_natgrad_step", "natgrad_update", "natgrad_warmup", "natural_q_step"]

#: The ``optimizer`` value that selects natural gradients for q(u).
NATGRAD = "natgrad"
WARMUP_START, WARMUP_END, WARMUP_STEPS = 1e-4, 0.1, 5
#: Probe steps at which a γ schedule's values are checked to lie in (0, 1].
PROBE_STEPS = (0, 1, 10, 100, 1000, 10000)


def natgrad_warmup(step):
    """γ_t: 1e-4 at t = 0 rising log-linearly to 0.1 at t = :data:`WARMUP_STEPS` − 1, then 0.1."""
    frac = jnp.clip(jnp.asarray(step, jnp.result_type(float)) / (WARMUP_STEPS - 1), 0.0, 1.0)
    return jnp.exp(math.log(WARMUP_START) + frac * (math.log(WARMUP_END) - math.log(WARMUP_START)))


def check_natgrad_step(natgrad_step, optimizer) -> None:
    """Eager check of ``natgrad_step``: None, a float in (0, 1] or a schedule with values in (0, 1]."""
    if natgrad_step is None:
        return
    if optimizer != NATGRAD:
        raise InvalidArgumentError("natgrad_step", f"applies only with optimizer={NATGRAD!r}, got optimizer={optimizer!r}")
    if callable(natgrad_step):
        values = [float(natgrad_step(s)) for s in PROBE_STEPS]
        bad = [(s, v) for s, v in zip(PROBE_STEPS, values) if not 0.0 < v <= 1.0]
        if bad:
            raise InvalidArgumentError("natgrad_step", f"a schedule's step sizes must lie in (0, 1]; at step {bad[0][0]} it is {bad[0][1]!r}")
        return
    check_real(natgrad_step, "natgrad_step", positive=True)
    if not 0.0 < float(natgrad_step) <= 1.0:
        raise InvalidArgumentError("natgrad_step", f"must lie in (0, 1], got {natgrad_step!r}")


def check_natgrad_spec(spec, method_name: str, svi: bool) -> None:
    """Refuse ``optimizer="natgrad"`` where q(u) is not the full Gaussian under ``q_mu``/``q_sqrt`` of an SVI fit."""
    if not svi:
        raise InvalidArgumentError("optimizer", f"optimizer={NATGRAD!r} applies to models fitted by SVI with a full "
                                                f"Gaussian q(u); model {spec.name!r} (method {method_name!r}) is not "
                                                "fitted by SVI")
    structure = getattr(spec, "q_structure", None)
    if structure != "full":
        raise InvalidArgumentError("optimizer", f"optimizer={NATGRAD!r} needs q_structure='full' (the natural-gradient "
                                                f"step is implemented for a full covariance only); model {spec.name!r} "
                                                f"has q_structure={structure!r}")


def default_natgrad_step(spec, natgrad_step):
    """The γ of a fit: ``natgrad_step`` if given, else 1 for a Gaussian likelihood, else :func:`natgrad_warmup`."""
    if natgrad_step is not None:
        return natgrad_step
    from gpzoo.models.likelihoods import Gaussian  # noqa: PLC0415

    return 1.0 if isinstance(spec.likelihood, Gaussian) else natgrad_warmup


def natural_q_step(q_mu, q_sqrt, grad_mu, grad_second, gamma):
    """(q_mu, q_sqrt) after θ ← θ + γ g, with g = (∂ELBO/∂η₁, ∂ELBO/∂η₂) ``[L, GM]``, ``[L, GM, GM]``."""

    from gpzoo.inference.pg_natgrad import _gaussian_from_precision  # noqa: PLC0415 - pg_natgrad imports the runner

    def one(m, sqrt, g1, g2):
        eye = jnp.eye(m.shape[0], dtype=m.dtype)
        inv_sqrt = jax.scipy.linalg.solve_triangular(sqrt, eye, lower=True)  # S^{-1/2}
        precision = inv_sqrt.T @ inv_sqrt  # S⁻¹ = −2θ₂
        g2 = 0.5 * (g2 + g2.T)
        new_precision = precision - 2.0 * gamma * g2
        shift = precision @ m + gamma * g1  # θ₁
        return _gaussian_from_precision(0.5 * (new_precision + new_precision.T), shift)

    return jax.vmap(one)(q_mu, q_sqrt, grad_mu, grad_second)


def natgrad_update(svi, state: SVIState, gamma, args, kwargs):
    """One step: the natural-gradient step on ``q_mu``/``q_sqrt``, then the optimiser's (Adam) step
    on every other parameter from the ELBO's gradient at the new q(u); returns ``(state, loss)``
    like ``SVI.update`` (the loss before the step)."""
    rng_key, rng_step = jax.random.split(state.rng_key)
    i, (unconstrained, opt_state) = state.optim_state
    loss_fn = _make_loss_fn(svi.loss, rng_step, svi.constrain_fn, svi.model, svi.guide, args, kwargs, svi.static_kwargs,
                            mutable_state=state.mutable_state)
    current = svi.constrain_fn(unconstrained)
    q_mu, q_sqrt = current["q_mu"], current["q_sqrt"]
    sqrt_to_raw = biject_to(Q_SQRT).inv

    def loss_of(raw, eta1, eta2):
        second = eta2 - eta1[..., :, None] * eta1[..., None, :]
        sqrt = jnp.linalg.cholesky(0.5 * (second + jnp.swapaxes(second, -1, -2)))
        raw = {**raw, "q_mu": eta1, "q_sqrt": sqrt_to_raw(sqrt)}
        return loss_fn(raw)

    eta2 = q_sqrt @ jnp.swapaxes(q_sqrt, -1, -2) + q_mu[..., :, None] * q_mu[..., None, :]
    (loss, mutable_state), (g1, g2) = jax.value_and_grad(loss_of, argnums=(1, 2), has_aux=True)(
        unconstrained, q_mu, eta2)
    # ∂ELBO/∂η = −∂loss/∂η
    new_mu, new_sqrt = natural_q_step(q_mu, q_sqrt, -g1, -g2, jnp.asarray(gamma, q_mu.dtype))
    stepped = {**unconstrained, "q_mu": new_mu, "q_sqrt": sqrt_to_raw(new_sqrt)}
    # the other parameters climb the ELBO at the new q(u) (alternating as Salimbeni et al. 2018 do):
    # a gradient taken at the old q(u) would move the hyperparameters against a q(u) already gone
    (_, mutable_state), g_raw = jax.value_and_grad(loss_fn, has_aux=True)(stepped)
    g_raw = {**g_raw, "q_mu": jnp.zeros_like(g_raw["q_mu"]), "q_sqrt": jnp.zeros_like(g_raw["q_sqrt"])}
    i_new, (params, opt_state) = svi.optim.update(g_raw, (i, (stepped, opt_state)), value=loss)
    params = {**params, "q_mu": stepped["q_mu"], "q_sqrt": stepped["q_sqrt"]}
    return SVIState((i_new, (params, opt_state)), mutable_state, rng_key), loss
