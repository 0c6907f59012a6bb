"""The deep kernel machine as a generative NumPyro program + guide (Milsom, Anson, Aitchison 2024, §2–3, App. A).

A DKM is the infinite-width limit of a deep GP whose intermediate layers have N_ℓ = N ν_ℓ
features, trained on a tempered ELBO (App. A.1, eq. 12–14): the features of layer ℓ then only
enter through their Gram matrix, whose posterior concentrates on a point G_ℓ. Written as a
program over what remains random (``model``; sites in quotes)::

    for every Gram layer ℓ = 1..L:
        K_ℓ = C_ℓ Φ(G̃_{ℓ−1})                         kernel blocks (ii, ti, diag tt) of the previous layer
        G_ℓ = V_ℓ V_ℓᵀ                                  a point-estimated latent (param "dkm.layer_ℓ.V")
        factor "gram_kl.layer_ℓ" = −ν_ℓ KL(N(0, G_ℓ) ‖ N(0, K_ℓ))        the tempered log prior of G_ℓ
        E_ℓ ~ N(0, I)  [P_ℓ, γ_ℓ]                       "skr.layer_ℓ" (only with SKR on)
        G̃_ℓ = (V_ℓ E_ℓ)(V_ℓ E_ℓ)ᵀ/γ_ℓ + λI  (SKR, eq. 4), or G_ℓ + λI without SKR; Nyström completes
                                                        the train/test blocks (eq. 32)
    K_out = Φ(G̃_L) (after global average pooling for conv)
    u ~ N(0, K_out,ii) per output                      "u"  [L, P]
    for n in plate("data", N, subsample B):
        f_n | u ~ N(k_n K⁻¹ u, k_nn − k_n K⁻¹ k_nᵀ)     "f"  [B, L]
        y_n ~ p(y | f_n)                               "y", observed

Guide: the same params, E_ℓ from the *same* N(0, I) (its log p − log q is exactly 0: SKR is
noise of the model that the guide does not update), u ~ q(u) = N(μ_c, Σ) with per-output means
``q_mu [L, P]`` and one covariance shared by the outputs (``q_sqrt [1, P, P]``, the paper's
output layer, App. A.2), and f from the same conditional. ``Trace_ELBO`` of this pair is

    (N/B) Σ_b E_q[log p(y_b | f_b)] − Σ_ℓ ν_ℓ KL_ℓ − w_out KL(q(u) ‖ p(u)),

the DKM objective (eq. 2 / 27) averaged over the SKR noise; it is what ``gpzoo.fit`` maximises
(:func:`fit_dkm`). w_out is ``DKMConfig.output_kl_weight`` (1, the untempered output layer of
eq. 14, unless set): the u sites of model and guide are scaled by it. The Gram terms are factors: they are
the log densities of the point-estimated G_ℓ under their tempered prior, log p(G_ℓ | K_ℓ)^β with
β = 1/N, which for a Wishart prior of N_ℓ = ν_ℓ N features is −ν_ℓ KL + const (eq. 12–14) — with
a Taylor KL form (``DKMConfig.kl``) the factor is that approximation of it, nothing else. The
output KL is always the exact Gaussian KL: u is a sampled site (the paper's Taylor expansion is of
the intermediate Gram terms, §3.2). :class:`~gpzoo.inference.elbo.FastELBO` computes the same
bound with the expectation in closed form / by quadrature and the u-KL analytic.

Evaluation (``gpzoo.predict``, ``evaluate_elbo``, the DataTree) uses the paper's test-time rule
G̃_ℓ = G_ℓ + λI (§3.1, the mean of the SKR draw), so it is deterministic; with SKR on,
``evaluate_elbo`` is therefore the bound of the evaluation-mode network, not the noise-averaged
training objective (equal when ``skr=False``). ``Predictive`` draws from the full program,
SKR noise included.

Numerics: a failed Cholesky or a negative Nyström residual (beyond rounding) in any layer makes
the program's variances NaN, so the fit's NaN guard stops at that step; :func:`fit_dkm` then
replays the run to that step and raises a :class:`~gpzoo.models.errors.NumericalError` naming
the layer, the stage and the step. cond(G_ℓ) of every layer at the start and the end of the fit
is in ``FitResult.diagnostics["gram_condition"]``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

from gpzoo.inference import dkm
from gpzoo.inference.elbo import EXPECTED_LOG_LIK, INDUCING_SITE_KEY, LATENT_SITE_KEY
from gpzoo.inference.guides import InducingPosterior, InducingPrior, conditional
from gpzoo.inference.inducing import register_initialiser
from gpzoo.inference.linalg import float_dtype
from gpzoo.inference.results import FitResult
from gpzoo.inference.runner import FitSettings
from gpzoo.inference.svgp import F_SITE, LIKELIHOOD_SITE, MIN_CONDITIONAL_VARIANCE, SVGP, U_SITE, Y_SITE, data_plate
from gpzoo.inference.svi import fit_svi
from gpzoo.models.dkm import DKMConfig
from gpzoo.models.errors import InvalidArgumentError, NumericalError, TrainingError

__all__ = ["DeepKernelMachine", "GramInitialisation", "INDUCING_KIND", "fit_dkm"]

#: ``ModelSpec.inducing`` of the DKM zoo models: the initialiser below.
INDUCING_KIND = "dkm-gram"
#: Prefix of the network's ``numpyro.param`` sites; SKR noise and Gram-prior factor site prefixes.
NETWORK_PREFIX, SKR_SITE, GRAM_KL_SITE = "dkm", "skr", "gram_kl"


def _layer_site(index: int) -> str:
    return f"layer_{index + 1}"


def flatten_network(params) -> dict[str, np.ndarray]:
    """The network part of :func:`gpzoo.inference.dkm.init_params`'s pytree as named arrays
    (``dkm.inducing_inputs``, ``dkm.layer_1.V``, ..., ``dkm.output.log_scale``); q(u) excluded."""
    flat = {f"{NETWORK_PREFIX}.inducing_inputs": params["inducing_inputs"]}
    for i, layer in enumerate(params["layers"]):
        flat.update({f"{NETWORK_PREFIX}.{_layer_site(i)}.{k}": v for k, v in layer.items()})
    if "head_mix" in params:
        flat[f"{NETWORK_PREFIX}.head_mix"] = params["head_mix"]
    for k in ("log_scale", "log_bias"):
        flat[f"{NETWORK_PREFIX}.output.{k}"] = params["output"][k]
    return {k: np.asarray(v) for k, v in flat.items()}


def unflatten_network(flat: dict, num_layers: int) -> dict:
    """Inverse of :func:`flatten_network` (values may be traced): the pytree :mod:`gpzoo.inference.dkm` reads."""
    def under(prefix):
        return {k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}

    params = {"inducing_inputs": flat[f"{NETWORK_PREFIX}.inducing_inputs"],
              "layers": tuple(under(f"{NETWORK_PREFIX}.{_layer_site(i)}.") for i in range(num_layers)),
              "output": under(f"{NETWORK_PREFIX}.output.")}
    if f"{NETWORK_PREFIX}.head_mix" in flat:
        params["head_mix"] = flat[f"{NETWORK_PREFIX}.head_mix"]
    return params


@dataclasses.dataclass(frozen=True)
class GramInitialisation:
    """The DKM's initial parameters (the NNGP start, :func:`gpzoo.inference.dkm.init_params`), by site name.

    ``values``: the network's params (:func:`flatten_network`) plus q(u)'s ``q_mu [L, P]`` (zeros)
    and ``q_sqrt [1, P, P]`` (chol K_out,ii: q(u) starts at the prior, every KL 0). It plays the
    role of the inducing variables for ``gpzoo.fit`` (``inducing=`` replaces it).
    """

    values: dict[str, Any]

    @property
    def num_inducing(self) -> int:
        return int(np.shape(self.values["q_mu"])[-1])


jax.tree_util.register_pytree_node(GramInitialisation, lambda init: ((init.values,), None),
                                   lambda _, children: GramInitialisation(*children))


@register_initialiser(INDUCING_KIND)
def _init_gram(config, X, num_inducing, key, method):
    """The NNGP start on data X ``[N, D]`` (flattened images for conv): inducing inputs drawn from X."""
    if not isinstance(config, DKMConfig):
        raise InvalidArgumentError("architecture", f"inducing kind {INDUCING_KIND!r} needs a deep kernel machine's DKMConfig "
                                                   f"(the spec's architecture), got {type(config).__name__}")
    params = dkm.init_params(key, config, config.network_inputs(jnp.asarray(X, float_dtype())))
    values = flatten_network(params)
    S = dkm.chol_factor(params["output"]["V"])  # [P, P] = chol K_out,ii
    values["q_mu"] = np.zeros((config.num_outputs, S.shape[0]), S.dtype)
    values["q_sqrt"] = np.asarray(S)[None]
    return GramInitialisation(values)


@dataclasses.dataclass(frozen=True)
class DKMParts:
    """A realised DKM: network params, likelihood, output prior factor Luu ``[1, P, P]``, q(u)."""

    network: dict
    likelihood: Any
    Luu: jax.Array
    jitter: jax.Array
    q_mu: jax.Array | None = None  # [L, P]
    q_sqrt: jax.Array | None = None  # [L, P, P] (one shared factor, broadcast)


class DeepKernelMachine(SVGP):
    """Model family of the ``dkm`` / ``conv-dkm`` zoo entries: the NumPyro program of the module docstring.

    An :class:`~gpzoo.inference.svgp.SVGP` whose inducing prior p(u) = N(0, K_out,ii) comes out of
    the Gram layers (the spec is unwhitened with a full q(u), so SVGP's ``prior``/``posterior``,
    expected log-likelihood and predictive moments apply as they are); the network replaces
    Kuu/Kuf, and ``kl`` adds the Gram layers' terms.
    """

    def __init__(self, spec, inducing: GramInitialisation, num_latent: int):
        if not isinstance(spec.architecture, DKMConfig):
            raise InvalidArgumentError("architecture", f"method 'dkm' needs a DKMConfig as the spec's architecture, got "
                                                       f"{type(spec.architecture).__name__}")
        if not isinstance(inducing, GramInitialisation):
            raise InvalidArgumentError("inducing", f"method 'dkm' needs a GramInitialisation, got {type(inducing).__name__}")
        if spec.architecture.num_outputs != num_latent:
            raise InvalidArgumentError("num_latent", f"the DKM has {spec.architecture.num_outputs} outputs, the likelihood needs "
                                                     f"{num_latent}")
        self.spec, self.inducing, self.num_latent = spec, inducing, num_latent  # SVGP.__init__ factorises a Kuu: not here
        self.hyper_guide = None
        self.config: DKMConfig = spec.architecture
        self.num_groups = 1
        self._checks = None  # the compiled test-mode checks (network_diagnostics)

    # ------------------------------------------------------------------ parameters
    def network_params(self) -> dict:
        """Declare the network's ``numpyro.param`` sites (initial values: the NNGP start) -> the pytree."""
        flat = {name: numpyro.param(name, jnp.asarray(value))
                for name, value in self.inducing.values.items() if name.startswith(NETWORK_PREFIX + ".")}
        return unflatten_network(flat, self.config.num_layers)

    def variational_params(self):
        """q(u)'s ``q_mu [L, P]`` and the shared factor ``q_sqrt [1, P, P]`` (lower Cholesky), broadcast to ``[L, P, P]``."""
        q_mu = numpyro.param("q_mu", jnp.asarray(self.inducing.values["q_mu"]))
        q_sqrt = numpyro.param("q_sqrt", jnp.asarray(self.inducing.values["q_sqrt"]), constraint=constraints.lower_cholesky)
        return q_mu, jnp.broadcast_to(q_sqrt, (self.num_latent,) + q_sqrt.shape[1:])

    def _skr_noise(self):
        """The SKR noise sites E_ℓ ``[P_ℓ, γ_ℓ]`` (model and guide alike), or None without SKR."""
        if not self.config.skr:
            return None
        dtype = jnp.asarray(self.inducing.values["q_mu"]).dtype
        return tuple(numpyro.sample(f"{SKR_SITE}.{_layer_site(i)}", dist.Normal(jnp.zeros(shape, dtype), 1.0).to_event(2))
                     for i, shape in enumerate(dkm.skr_noise_shapes(self.config)))

    # ------------------------------------------------------------------ the network
    def _zero_input(self, network):
        """One all-zero input: enough to run the inducing (ii) blocks, which do not depend on the data."""
        if self.config.architecture == "fc":
            return jnp.zeros((1, network["inducing_inputs"].shape[-1]), network["inducing_inputs"].dtype)
        shape = self.config.image_shape
        return jnp.zeros((1, shape[0], shape[1], shape[2] if len(shape) == 3 else 1), network["inducing_inputs"].dtype)

    def network(self, network, X, noise=None):
        """Run the Gram layers on X ``[B, D]`` (flattened): output kernel blocks, chol K_ii, jitter, aux, ok.

        ``ok`` is False when a Cholesky failed or a Nyström residual is negative beyond rounding.
        """
        G, _, aux, _ = dkm.gram_layers(network, self.config, self.config.network_inputs(X), noise)
        K, L, jitter = dkm.output_kernel(network["output"], self.config, G)  # ii [P,P], ti [B,P], t [B]
        _, aux["checks"]["output"] = dkm.output_checks(self.config, K, L, jax.scipy.linalg.solve_triangular(
            L, K.ti.T, lower=True))
        ok = jnp.all(jnp.stack([c["chol_ok"] & c["residual_ok"] for c in aux["checks"].values()]))
        return K, L, jitter, aux, ok

    def prior_parts(self, noise=None) -> DKMParts:
        network = self.network_params()
        _, L, jitter, _, _ = self.network(network, self._zero_input(network), noise)
        return DKMParts(network, self.spec.likelihood.realise(LIKELIHOOD_SITE), L[None], jitter)

    def parts(self) -> DKMParts:
        """Realise the network (test mode, G̃ = G + λI) and q(u) inside the current NumPyro context."""
        q_mu, q_sqrt = self.variational_params()
        return dataclasses.replace(self.prior_parts(), q_mu=q_mu, q_sqrt=q_sqrt)

    def _moments(self, K, L, ok, q_mu, q_sqrt, structure):
        """q(f) (or p(f | u) with ``q_sqrt`` zero) marginals ``[B, L]``, NaN where the numerics failed."""
        mean, var = conditional(K.ti.T[None], L[None], K.t, q_mu, q_sqrt, structure, False)  # [B, L] x2
        return mean, jnp.where(ok, var, jnp.nan)

    def conditional_given_u(self, parts: DKMParts, X, u):
        """Mean and variance ``[N, L]`` of p(f | u) at X (test-mode network)."""
        K, L, _, _, ok = self.network(parts.network, X)
        return self._moments(K, L, ok, u, jnp.zeros_like(u), "diag")

    def latent_moments(self, parts: DKMParts, X):
        """q(f) marginals at X: mean, var ``[N, L]`` (test-mode network)."""
        K, L, _, _, ok = self.network(parts.network, X)
        return self._moments(K, L, ok, parts.q_mu, parts.q_sqrt, "full")

    def kl(self, parts: DKMParts):
        """Every KL term of the objective (test-mode network): Σ_ℓ ν_ℓ KL_ℓ + w_out KL(q(u) ‖ p(u))."""
        _, _, _, aux, _ = self.network(parts.network, self._zero_input(parts.network))
        gram = sum(self.config.layer_nu(i) * aux["kl"][dkm.layer_name(i)] for i in range(self.config.num_layers))
        return gram + self.config.output_kl_weight * super().kl(parts)

    # ------------------------------------------------------------------ NumPyro program
    def model(self, X, y=None, num_data=None, data_indices=None):
        """The generative program of the module docstring for a minibatch X ``[B, D]`` (y ``[B]`` or None)."""
        network = self.network_params()
        likelihood = self.spec.likelihood.realise(LIKELIHOOD_SITE)
        K, L, _, aux, ok = self.network(network, X, self._skr_noise())
        if y is not None:  # the Gram matrices' tempered prior scores a fit; a prediction draws nothing from it
            for i in range(self.config.num_layers):
                numpyro.factor(f"{GRAM_KL_SITE}.{_layer_site(i)}", -self.config.layer_nu(i) * aux["kl"][dkm.layer_name(i)])
        with self._output_kl_weight():
            u = numpyro.sample(U_SITE, InducingPrior(L[None], self.num_latent, False))  # [L, P]
        batch = X.shape[0]
        infer = {}
        if y is not None:
            def expected_log_lik(q_u, key):  # [B]; the fast ELBO's data term (gpzoo.inference.elbo)
                mean, var = self._moments(K, L, ok, q_u.q_mu, q_u.q_sqrt, q_u.structure)
                return likelihood.variational_expectation(y, mean, var, key=key)

            infer = {EXPECTED_LOG_LIK: expected_log_lik, INDUCING_SITE_KEY: U_SITE, LATENT_SITE_KEY: F_SITE}
        with data_plate(num_data, batch):
            f = numpyro.sample(F_SITE, self._conditional_distribution(K, L, ok, u))  # [B, L]
            numpyro.sample(Y_SITE, likelihood.distribution(f), obs=self._observed(y), infer=infer)

    def guide(self, X, y=None, num_data=None, data_indices=None):
        """The network's params, the SKR noise from its prior, q(u), and f from the model's p(f | u)."""
        network = self.network_params()
        K, L, _, _, ok = self.network(network, X, self._skr_noise())
        q_mu, q_sqrt = self.variational_params()
        with self._output_kl_weight():
            u = numpyro.sample(U_SITE, InducingPosterior(q_mu, q_sqrt, "full"))  # [L, P]
        batch = X.shape[0]
        with data_plate(num_data, batch):
            if y is not None:  # without y the model draws f from the same p(f | u) (SVGP.guide)
                numpyro.sample(F_SITE, self._conditional_distribution(K, L, ok, u))  # [B, L]

    def _output_kl_weight(self):
        """Scales the u site's log densities by w_out = ``output_kl_weight`` (so the bound's KL(q(u) ‖ p(u)) by it)."""
        weight = self.config.output_kl_weight
        return contextlib.nullcontext() if weight == 1.0 else numpyro.handlers.scale(scale=weight)

    def _conditional_distribution(self, K, L, ok, u) -> dist.Distribution:
        """p(f | u) as independent Normals: batch ``[B]``, event ``[L]``."""
        mean, var = self._moments(K, L, ok, u, jnp.zeros_like(u), "diag")  # [B, L] x2
        return dist.Normal(mean, jnp.sqrt(jnp.maximum(var, MIN_CONDITIONAL_VARIANCE))).to_event(1)

    # ------------------------------------------------------------------ fitting hooks
    def jitter_used(self, params) -> jax.Array:
        """The DKM never raises its jitter (a failed Cholesky is a :class:`NumericalError`): ``spec.jitter``.

        Its jitters are relative (``DKMConfig.kernel_jitter``·mean diag K_ii, per layer; the
        model's ``jitter`` site holds the output layer's).
        """
        return jnp.asarray(self.spec.jitter)

    def network_diagnostics(self, params, X) -> dict:
        """Test-mode numerics at constrained ``params`` on X ``[B, D]`` (one compiled program per family)."""
        if self._checks is None:
            self._checks = jax.jit(lambda net, X: self.network(net, X)[3])
        return self._checks(self._network_of(params), jnp.asarray(X))

    def condition_numbers(self, params) -> dict[str, float]:
        """cond(G_ℓ) = (σ_max(V_ℓ)/σ_min(V_ℓ))² of every Gram layer at constrained ``params`` (host SVD)."""
        return dkm.gram_condition_numbers(self._network_of(params))

    def _network_of(self, params) -> dict:
        flat = {k: jnp.asarray(v) for k, v in params.items() if k.startswith(NETWORK_PREFIX + ".")}
        return unflatten_network(flat, self.config.num_layers)


def fit_dkm(spec, X, y, *, family_class, settings: FitSettings) -> FitResult:
    """Fit a DKM by SVI on its program (:func:`gpzoo.inference.svi.fit_svi`), with its diagnostics.

    Adds ``diagnostics["gram_condition"] = {"start": {layer: cond G_ℓ}, "end": {...}}``. When the fit stops on a non-finite objective, the run
    is replayed to that step and the network's checks at its parameters raise a
    :class:`NumericalError` naming the layer, the stage and the step (the original
    ``TrainingError`` when none of them failed).
    """
    try:
        res = fit_svi(spec, X, y, family_class=family_class, settings=settings)
    except TrainingError as error:
        if isinstance(error, NumericalError):
            raise
        _raise_located(spec, X, y, family_class, settings, error)
        raise
    family = res.family
    res.diagnostics["gram_condition"] = {"start": family.condition_numbers(family.inducing.values),
                                         "end": family.condition_numbers(res.params)}
    return res


def _raise_located(spec, X, y, family_class, settings: FitSettings, error: TrainingError) -> None:
    """Replay the failed run to ``error.step`` and raise the first failed network check there, if any."""
    replay = dataclasses.replace(settings, steps=int(error.step), checkpoint_dir=None, resume=False, progress=False)
    try:
        res = fit_svi(spec, X, y, family_class=family_class, settings=replay)
    except TrainingError:
        return
    dkm.check_numerics(res.family.network_diagnostics(res.params, res.X_train), step=int(error.step))
