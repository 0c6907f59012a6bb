"""Deep convolutional GPs as a generative NumPyro model with one guide per layer (Dutordoir et al. 2020, §4, eq. 6).

Model (prior :class:`~gpzoo.models.kernels.deep_convolutional.DeepConvolutional`; layer maths
:mod:`gpzoo.inference.conv_layer`)::

    θ = numpyro.param                          (every layer's kernel and inducing patches, likelihood)
    v_ℓ ~ N(0, I)  ℓ = 1..L−1                  whitened inducing outputs of hidden layer ℓ  site "u_ℓ" [C_ℓ, M_ℓ]
    u   ~ p(u)                                  output layer, as in the SVGP                 site "u"   [K, M]
    for n in plate("data", N, subsample B):
        h_nℓ | h_n,ℓ−1, v_ℓ ~ N(crop(h_n,ℓ−1) + A_nℓ v_ℓ, diag(Kff − Qff))                    site "h_ℓ" [B, P_ℓ·C_ℓ]
        f_n | h_n,L−1, u    ~ the SVGP's p(f | u) with the output kernel on h_n,L−1           site "f"   [B, K]
        y_n | f_n           ~ p(y | f_n)                                                       site "y"   [B]

with h_n0 = x_n, A_nℓ = k_g(h^[p], Z_ℓ) Luu⁻ᵀ per patch p (the multi-output layer of eq. 3–5,
inducing patches Z_ℓ shared by the C_ℓ output channels, §4.2), an identity (centre-crop) mean, stride
1 and valid padding (28 → 24 → 20 with 5×5 patches). The guide draws v_ℓ ~ q(v_ℓ) = N(m_ℓ, S_ℓ) for each
layer, u ~ q(u), and every h_ℓ and f from the model's own conditionals, so ``Trace_ELBO`` is the
doubly stochastic bound of eq. 6, Σ_n E_q[log p(y_n | h_n,L)] − Σ_ℓ KL[q(u_ℓ) || p(u_ℓ)], with
the data term scaled N/B under minibatching.

Choices the paper leaves open (ours, stated once here):

* the kernel's ``sampling`` (zoo option ``hidden_sampling``) chooses how hidden outputs are drawn,
  the two schemes of §4.1 and ours:

  - ``"inducing"`` (the default): p(h_ℓ | h_ℓ−1, v_ℓ) keeps only the per-patch variances of
    Kff − Qff, and that is the model the bound is exact for; between-patch correlations through
    q(u_ℓ) are kept. :class:`~gpzoo.inference.elbo.FastELBO`'s data term draws v_ℓ for each image
    separately (h_nℓ = crop + A_nℓ v_nℓ + √(Kff − Qff) ε, a P·M product per image, no P×P
    Cholesky): per image exactly the distribution Trace_ELBO samples, so the expectation is the same;
  - ``"marginal"``, the scheme the paper trains with: each patch and channel is drawn from its own
    marginal of q(h_nℓ | h_n,ℓ−1), N(crop + A m, ‖A_p S‖² + (Kff − Qff)_pp), ignoring every
    between-patch correlation; O(P·M²) per image and channel, no Cholesky. It estimates the data term
    with a bias the paper measures as small (its fig. 10); the model, the KL and Trace_ELBO are
    those of ``"inducing"``;
  - ``"full"``, the paper's model for small images: p(h_ℓ | h_ℓ−1, v_ℓ) has the full covariance
    (Kff − Qff) ⊗ I_C between the P patches, so both the model and the fast estimator (v per image plus
    chol(Kff − Qff) ε, a P×P Cholesky per image, jitter as for Kuu) draw q(h_ℓ | h_ℓ−1) with every
    between-patch covariance;

* the fast data term draws one hidden path per image and step and takes the output layer's
  q(f_n | h_n,L−1) in closed form, with the likelihood's own expectation (quadrature, or Monte Carlo
  for the softmax);
* hidden layers are always whitened; q(v_ℓ) starts at N(0, (:data:`HIDDEN_Q_SQRT_INIT`)² I), so
  training starts near the identity mean plus the prior's residual variance;
* prediction and ``to_datatree`` average :data:`NUM_PREDICT_SAMPLES` hidden paths: class
  probabilities are the Monte Carlo mean over paths, f's moments those of the mixture. The
  DataTree's posterior draws are the output layer's u; the hidden layers enter integrated under
  their q(u_ℓ) (log p(y_n | u) is that of the mixture's moments).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.scipy.linalg import solve_triangular
from numpyro.distributions import constraints
from numpyro.distributions.kl import kl_divergence
from numpyro.infer.autoguide import AutoNormal

from gpzoo.inference.conv_layer import identity_mean, layer_covariances
from gpzoo.inference.elbo import EXPECTED_LOG_LIK, INDUCING_SITE_KEY, LATENT_SITE_KEY
from gpzoo.inference.guides import InducingPosterior, InducingPrior
from gpzoo.inference.inducing import InducingVariables, Kuu, check_inducing, initialise_inducing, register_initialiser
from gpzoo.inference.linalg import cholesky_with_jitter
from gpzoo.inference.svgp import (F_SITE, INDUCING_SITE, KERNEL_SITE, LIKELIHOOD_SITE, MIN_CONDITIONAL_VARIANCE, SVGP, U_SITE, Y_SITE,
                                 Parts, data_plate, has_prior)
from gpzoo.models import draws
from gpzoo.models.errors import InvalidArgumentError
from gpzoo.models.kernels.convolutional import image_dims
from gpzoo.models.kernels.deep_convolutional import DeepConvolutional, layer_output_shape
from gpzoo.models.kernels.tick import TICK
from gpzoo.models.parameters import pytree_dataclass
from gpzoo.models.zoo import ModelSpec

__all__ = ["DeepConvSVGP", "DeepInducing", "DeepParts", "HiddenLayer", "HIDDEN_Q_SQRT_INIT", "NUM_PREDICT_SAMPLES",
           "hidden_sample_site", "hidden_inducing_site"]

#: Initial q(v_ℓ) scale of hidden layers (whitened): S_ℓ = 0.01 I, our choice (module docstring).
HIDDEN_Q_SQRT_INIT = 0.1
#: Hidden-layer paths averaged by ``predict`` and ``to_datatree``.
NUM_PREDICT_SAMPLES = 16


def hidden_inducing_site(layer: int) -> str:
    """Sample site of hidden layer ``layer``'s (1-based) whitened inducing outputs v_ℓ ``[C_ℓ, M_ℓ]``."""
    return f"u_{layer}"


def hidden_sample_site(layer: int) -> str:
    """Sample site of hidden layer ``layer``'s (1-based) outputs h_ℓ ``[B, P_ℓ·C_ℓ]``."""
    return f"h_{layer}"


def _hidden_param(layer: int, field: str) -> str:
    return f"hidden.{layer}.{field}"


# ----------------------------------------------------------------------------- inducing variables
@pytree_dataclass
class DeepInducing(InducingVariables):
    """Inducing patches of every layer: ``layers`` (one per hidden layer: ``InducingPatches`` or
    ``InducingPatchesWithLocations`` for TICK) and ``output`` (the output layer's, M = ``num_inducing``)."""

    layers: tuple
    output: Any

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(self.layers))
        if not isinstance(self.output, InducingVariables):
            raise InvalidArgumentError("output", f"expected inducing variables, got {type(self.output).__name__}")
        super().__post_init__()

    @property
    def num_inducing(self) -> int:
        return self.output.num_inducing

    def check_against(self, kernel, X) -> None:
        """Eager checks of user-given deep inducing variables: one set per layer of ``kernel``, each
        checked against its layer's kernel (:func:`~gpzoo.inference.inducing.check_inducing`)."""
        if not isinstance(kernel, DeepConvolutional) or len(self.layers) != len(kernel.layers):
            raise InvalidArgumentError("inducing", f"DeepInducing with {len(self.layers)} hidden sets needs a DeepConvolutional "
                                                   f"kernel with as many hidden layers, got {type(kernel).__name__}")
        for part, layer in zip(self.layers + (self.output,), kernel.layers + (kernel.output,)):
            check_inducing(part, layer, X)


def _patch_kind(kernel) -> str:
    return "patch-locations" if isinstance(kernel, TICK) else "patches"


@register_initialiser("deep-patches")
def _init_deep_patches(kernel, X, num_inducing, key, method):
    """Every layer's inducing patches from data (Dutordoir et al. 2020, §5.3: random training patches): layer
    ℓ's from the training images passed through the identity means of the layers before it (our choice)."""
    if not isinstance(kernel, DeepConvolutional):
        raise InvalidArgumentError("inducing", f"'deep-patches' needs a DeepConvolutional kernel, got {type(kernel).__name__}")
    X = np.asarray(X)
    kernel.validate_inputs(X)
    N = X.shape[0]
    keys = jax.random.split(key, kernel.num_layers)
    images = X.reshape((N,) + image_dims(kernel.image_shape))  # [N, H, W, C]
    layers = []
    for index, (layer, channels, M) in enumerate(zip(kernel.layers, kernel.channels, kernel.num_inducing)):
        layers.append(initialise_inducing(_patch_kind(layer), layer, images.reshape(N, -1), M, keys[index], method))
        out_shape = layer_output_shape(layer, channels)
        images = np.asarray(identity_mean(images, layer.patch_shape, channels)).reshape((N,) + out_shape)  # [N, H', W', C']
    output = initialise_inducing(_patch_kind(kernel.output), kernel.output, images.reshape(N, -1), num_inducing, keys[-1], method)
    return DeepInducing(tuple(layers), output)


# ----------------------------------------------------------------------------- realised layers
@dataclasses.dataclass(frozen=True)
class HiddenLayer:
    """One realised hidden layer: kernel, inducing patches, chol Kuu ``[M, M]``, channels and q(v) (whitened)."""

    kernel: Any
    inducing: Any
    Luu: jax.Array  # [M, M]
    channels: int
    q_mu: jax.Array  # [C, M]
    q_sqrt: jax.Array  # [C, M, M]

    def prior(self) -> InducingPrior:
        return InducingPrior(self.Luu[None], self.channels, whiten=True)  # event [C, M]

    def posterior(self) -> InducingPosterior:
        return InducingPosterior(self.q_mu, self.q_sqrt, "full")  # event [C, M]

    def moments(self, images, full_cov: bool = False):
        """A ``[B, P, M]`` (rows Luu⁻¹ k_u(h^[p])), the identity mean ``[B, P, C]`` and diag(Kff − Qff) ``[B, P]``
        (``full_cov``: Kff − Qff ``[B, P, P]``, between patches of one image)."""
        _, Kfu, Kff = layer_covariances(images, self.kernel, self.inducing, full_cov=full_cov)  # [B, P, M], [B, P(, P)]
        B, P, M = Kfu.shape
        A = solve_triangular(self.Luu, Kfu.reshape(B * P, M).T, lower=True).T.reshape(B, P, M)  # [B, P, M]
        mean = identity_mean(images, self.kernel.patch_shape, self.channels)  # [B, P, C]
        if full_cov:
            return A, mean, Kff - jnp.einsum("bpm,bqm->bpq", A, A)  # [B, P, P]
        residual = jnp.maximum(Kff - jnp.sum(A**2, axis=-1), MIN_CONDITIONAL_VARIANCE)  # [B, P]
        return A, mean, residual

    def as_images(self, values):
        """Layer outputs ``[B, P, C]`` (or rows ``[B, P·C]``) as the next layer's images ``[B, H', W', C]``."""
        return values.reshape((values.shape[0],) + layer_output_shape(self.kernel, self.channels))


@dataclasses.dataclass(frozen=True)
class DeepParts(Parts):
    """:class:`~gpzoo.inference.svgp.Parts` of the output layer plus the realised hidden layers (first first)."""

    hidden: tuple = ()


def _key(key):
    """The given key, else NumPyro's (inside a seeded program), else a fixed one (eager calls)."""
    if key is not None:
        return key
    key = numpyro.prng_key()
    return jax.random.PRNGKey(0) if key is None else key


# ----------------------------------------------------------------------------- the family
class DeepConvSVGP(SVGP):
    """The deep convolutional GP's model and guide (module docstring); the output layer is an :class:`SVGP`."""

    num_predict_samples = NUM_PREDICT_SAMPLES

    def __init__(self, spec: ModelSpec, inducing: InducingVariables, num_latent: int):
        if not isinstance(spec.kernel, DeepConvolutional):
            raise InvalidArgumentError("spec", f"method 'deep-svgp' needs a DeepConvolutional kernel, got {type(spec.kernel).__name__}")
        if not isinstance(inducing, DeepInducing) or len(inducing.layers) != len(spec.kernel.layers):
            raise InvalidArgumentError("inducing", f"expected DeepInducing with {len(spec.kernel.layers)} hidden layers")
        self.spec, self.inducing, self.num_latent = spec, inducing, num_latent
        self.num_groups = 1
        self.num_hidden = len(spec.kernel.layers)
        hidden_sites = [s for layer in range(1, self.num_hidden + 1) for s in (hidden_inducing_site(layer), hidden_sample_site(layer))]
        hyper_model = numpyro.handlers.block(self.model, hide=[U_SITE, F_SITE, *hidden_sites])
        self.hyper_guide = AutoNormal(hyper_model) if has_prior(spec) else None

    # ------------------------------------------------------------------ realised model
    def _hidden_q(self, index: int, M: int, channels: int):
        dtype = jnp.result_type(float)
        q_mu = numpyro.param(_hidden_param(index, "q_mu"), lambda key: jnp.zeros((channels, M), dtype))
        q_sqrt = numpyro.param(_hidden_param(index, "q_sqrt"),
                               lambda key: jnp.broadcast_to(HIDDEN_Q_SQRT_INIT * jnp.eye(M, dtype=dtype), (channels, M, M)),
                               constraint=constraints.lower_cholesky)
        return q_mu, q_sqrt

    def prior_parts(self) -> DeepParts:
        """Every layer's hyperparameters and chol Kuu, and the hidden layers' q(v_ℓ) (the output layer
        conditions on them); the output layer's q(u) is left to :meth:`parts`."""
        spec = self.spec
        deep = spec.kernel.realise(KERNEL_SITE)
        likelihood = spec.likelihood.realise(LIKELIHOOD_SITE)
        inducing = self.inducing.realise(INDUCING_SITE)
        Luu, jitter = cholesky_with_jitter(Kuu(inducing.output, deep.output), spec.jitter)  # [1, M, M]
        hidden = []
        for index, (kernel, patches, channels) in enumerate(zip(deep.layers, inducing.layers, deep.channels), start=1):
            L_layer, jitter_layer = cholesky_with_jitter(Kuu(patches, kernel)[0], spec.jitter)  # [M, M]
            jitter = jnp.maximum(jitter, jitter_layer)
            q_mu, q_sqrt = self._hidden_q(index, patches.num_inducing, channels)
            hidden.append(HiddenLayer(kernel, patches, L_layer, channels, q_mu, q_sqrt))
        return DeepParts(deep.output, likelihood, inducing.output, Luu, jitter, hidden=tuple(hidden))

    def jitter_used(self, params) -> jax.Array:
        """The largest jitter any layer's Kuu Cholesky needs at constrained ``params`` (scalar)."""
        with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
            return self.prior_parts().jitter

    def _init_unwhitened_sqrt(self):
        if has_prior(self.spec):
            return None
        K = Kuu(self.inducing.output.resolved(), self.spec.kernel.output.resolved())  # [1, M, M]
        return cholesky_with_jitter(K, self.spec.jitter)[0]

    # ------------------------------------------------------------------ hidden layers
    def propagate(self, parts: DeepParts, X, key):
        """One draw of h_L−1 per image ``[B, D_L−1]`` from q, by the kernel's ``sampling`` scheme (class docstring)."""
        images = X.reshape((X.shape[0],) + image_dims(self.spec.kernel.image_shape))  # [B, H, W, C]
        for layer in parts.hidden:
            key, key_v, key_e = jax.random.split(key, 3)
            images = layer.as_images(self.hidden_draw(layer, images, key_v, key_e))  # [B, H', W', C]
        return images.reshape(images.shape[0], -1)  # [B, D_L−1]

    def hidden_draw(self, layer: HiddenLayer, images, key_v, key_e):
        """One draw of a hidden layer's outputs ``[B, P, C]`` given its input images ``[B, H, W, C_in]``.

        ``"inducing"``: v ~ q(v) per image, h = mean + A v + √diag(Kff − Qff) ε; ``"marginal"``: each
        patch from its own marginal, h_pc = mean_pc + A_p m_c + √(‖A_p S_c‖² + (Kff − Qff)_pp) ε_pc;
        ``"full"``: v per image and the residual with its full covariance, h = mean + A v + chol(Kff − Qff) ε
        (jitter as the model's Kuu), which is q(h_ℓ | h_ℓ−1) with every between-patch covariance.
        """
        scheme = self.spec.kernel.sampling
        A, mean, residual = layer.moments(images, full_cov=scheme == "full")  # [B, P, M], [B, P, C], [B, P(, P)]
        eps = draws.normal(key_e, mean.shape, A.dtype)  # [B, P, C]
        if scheme == "marginal":
            AS = jnp.einsum("bpm,cmk->bpck", A, layer.q_sqrt)  # [B, P, C, M]
            var = jnp.sum(AS * AS, axis=-1) + residual[..., None]  # [B, P, C]
            return mean + jnp.einsum("bpm,cm->bpc", A, layer.q_mu) + jnp.sqrt(var) * eps
        eps_v = draws.normal(key_v, (A.shape[0],) + layer.q_mu.shape, A.dtype)  # [B, C, M]
        v = layer.q_mu[None] + jnp.einsum("cij,bcj->bci", layer.q_sqrt, eps_v)  # [B, C, M]
        h = mean + jnp.einsum("bpm,bcm->bpc", A, v)  # [B, P, C]
        if scheme == "full":
            L, _ = cholesky_with_jitter(residual, self.spec.jitter)  # [B, P, P]
            return h + jnp.einsum("bpq,bqc->bpc", L, eps)
        return h + jnp.sqrt(residual)[..., None] * eps

    def _hidden_latent(self, layer: HiddenLayer, images, v) -> dist.Distribution:
        """p(h_ℓ | h_ℓ−1, v_ℓ), batch ``[B]``, event ``[P·C]`` (patch-major): independent Normals per patch
        and channel with variances diag(Kff − Qff), or, for ``sampling="full"``, Normal with covariance
        (Kff − Qff) ⊗ I_C (channels independent, every between-patch covariance kept)."""
        full = self.spec.kernel.sampling == "full"
        A, mean, residual = layer.moments(images, full_cov=full)  # [B, P, M], [B, P, C], [B, P(, P)]
        mean = mean + jnp.einsum("bpm,cm->bpc", A, v)  # [B, P, C]
        B = mean.shape[0]
        if full:
            L, _ = cholesky_with_jitter(residual, self.spec.jitter)  # [B, P, P]
            scale_tril = jax.vmap(lambda l: jnp.kron(l, jnp.eye(layer.channels, dtype=l.dtype)))(L)  # [B, P·C, P·C]
            return dist.MultivariateNormal(mean.reshape(B, -1), scale_tril=scale_tril)
        scale = jnp.broadcast_to(jnp.sqrt(residual)[..., None], mean.shape)  # [B, P, C]
        return dist.Normal(mean.reshape(B, -1), scale.reshape(B, -1)).to_event(1)

    def _hidden_sites(self, parts: DeepParts, X, v_hidden):
        """Sample h_1 .. h_L−1 from their conditionals under the current plate; returns h_L−1 as rows ``[B, D]``."""
        images = X.reshape((X.shape[0],) + image_dims(self.spec.kernel.image_shape))  # [B, H, W, C]
        for index, (layer, v) in enumerate(zip(parts.hidden, v_hidden), start=1):
            h = numpyro.sample(hidden_sample_site(index), self._hidden_latent(layer, images, v))  # [B, P·C]
            images = layer.as_images(h)
        return images.reshape(images.shape[0], -1)

    # ------------------------------------------------------------------ output layer
    def output_conditional(self, parts: Parts, h, u):
        """p(f | h_L−1, u): the SVGP conditional with the output kernel, mean and var ``[B, K]``."""
        return SVGP.conditional_given_u(self, parts, h, u)

    def output_moments(self, parts: Parts, h):
        """q(f | h_L−1) marginals ``[B, K]`` (output layer's q(u) integrated in closed form)."""
        return SVGP.latent_moments(self, parts, h)

    def _latent(self, parts: Parts, h, u) -> dist.Distribution:
        mean, var = self.output_conditional(parts, h, u)  # [B, K] x2
        return dist.Normal(mean, jnp.sqrt(jnp.maximum(var, MIN_CONDITIONAL_VARIANCE))).to_event(1)

    def _paths(self, parts: DeepParts, X, key, moments):
        """``moments(h)`` for :attr:`num_predict_samples` hidden paths (one when there are no hidden layers): ``[S, ...]``."""
        if not parts.hidden:
            return jax.tree_util.tree_map(lambda a: a[None], moments(X))
        keys = jax.random.split(key, self.num_predict_samples)
        return jax.lax.map(lambda k: moments(self.propagate(parts, X, k)), keys)

    @staticmethod
    def _mixture(mean, var):
        """Moments ``[B, K]`` of the equal-weight mixture of Gaussians with means/vars ``[S, B, K]``."""
        return mean.mean(0), var.mean(0) + mean.var(0)

    def conditional_given_u(self, parts: DeepParts, X, u):
        """Moments ``[B, K]`` of p(f | u) with the hidden layers integrated under q (mixture over paths)."""
        return self._mixture(*self._paths(parts, X, _key(None), lambda h: self.output_conditional(parts, h, u)))

    def latent_moments(self, parts: DeepParts, X):
        """Moments ``[B, K]`` of q(f) at images X (mixture over hidden paths)."""
        return self._mixture(*self._paths(parts, X, _key(None), lambda h: self.output_moments(parts, h)))

    def predictive_moments(self, parts: DeepParts, X, key):
        """q(f*) moments, y* moments and class probabilities, each a Monte Carlo average over hidden paths."""
        likelihood = parts.likelihood
        classify = likelihood.task in ("binary", "multiclass")
        key_paths, key_probs = jax.random.split(key)

        def one(h):
            mean, var = self.output_moments(parts, h)  # [B, K]
            y_mean, y_var = likelihood.predict_mean_and_var(mean, var)
            probs = likelihood.predict_probs(mean, var, key=key_probs) if classify else None
            return mean, var, y_mean, y_var, probs

        mean, var, y_mean, y_var, probs = self._paths(parts, X, key_paths, one)  # [S, B, ...]
        mean, var = self._mixture(mean, var)
        y_mean, y_var = self._mixture(y_mean, y_var)
        return mean, var, y_mean, y_var, None if probs is None else probs.mean(0)

    @property
    def stochastic_expectation(self) -> bool:
        return self.num_hidden > 0 or super().stochastic_expectation

    def expected_log_lik(self, parts: DeepParts, X, y, key=None):
        """E_q[log p(y_n | h_n,L)] ``[B]``: one hidden path per image, the output layer in closed form (module docstring)."""
        key_h, key_y = jax.random.split(_key(key))
        h = self.propagate(parts, X, key_h) if parts.hidden else X  # [B, D_L−1]
        mean, var = self.output_moments(parts, h)  # [B, K]
        return parts.likelihood.variational_expectation(y, mean, var, key=key_y)

    def kl(self, parts: DeepParts):
        """Σ_ℓ KL[q(u_ℓ) || p(u_ℓ)] over every layer, each analytic (eq. 6)."""
        total = super().kl(parts)
        for layer in parts.hidden:
            total = total + kl_divergence(layer.posterior(), layer.prior())
        return total

    # ------------------------------------------------------------------ NumPyro program
    def model(self, X, y=None, num_data=None, data_indices=None):
        """The generative program of the module docstring for a minibatch X ``[B, D]`` (y ``[B]`` or None)."""
        parts = self.prior_parts()
        v_hidden = [numpyro.sample(hidden_inducing_site(i), layer.prior()) for i, layer in enumerate(parts.hidden, start=1)]
        u = numpyro.sample(U_SITE, self.prior(parts))  # [K, M]
        batch = X.shape[0]
        infer = {}
        if y is not None:
            def expected_log_lik(q_u, key):  # [B]; the fast ELBO's data term (gpzoo.inference.elbo)
                return self.expected_log_lik(parts.with_posterior(q_u), X, y, key)

            latent = tuple(hidden_sample_site(i) for i in range(1, self.num_hidden + 1)) + (F_SITE,)
            infer = {EXPECTED_LOG_LIK: expected_log_lik, INDUCING_SITE_KEY: U_SITE, LATENT_SITE_KEY: latent}
        with data_plate(num_data, batch):
            h = self._hidden_sites(parts, X, v_hidden)  # [B, D_L−1]
            f = numpyro.sample(F_SITE, self._latent(parts, h, u))  # [B, K]
            numpyro.sample(Y_SITE, parts.likelihood.distribution(f), obs=self._observed(y), infer=infer)

    def guide(self, X, y=None, num_data=None, data_indices=None):
        """q(θ) (sampled hyperparameters, if any), q(v_ℓ) per hidden layer, q(u), and every h_ℓ and f
        from the model's own conditionals."""
        hyper = self.hyper_guide(X, y, num_data) if self.hyper_guide is not None else {}
        with numpyro.handlers.block(hide_fn=lambda site: site["type"] == "sample"), numpyro.handlers.substitute(data=hyper):
            parts = self.prior_parts()
        v_hidden = [numpyro.sample(hidden_inducing_site(i), layer.posterior()) for i, layer in enumerate(parts.hidden, start=1)]
        q_mu, q_sqrt = self.variational_params()
        u = numpyro.sample(U_SITE, InducingPosterior(q_mu, q_sqrt, self.spec.q_structure))  # [K, M]
        batch = X.shape[0]
        with data_plate(num_data, batch):
            h = self._hidden_sites(parts, X, v_hidden)
            if y is not None:  # without y the model draws f from the same conditional (SVGP.guide)
                numpyro.sample(F_SITE, self._latent(parts, h, u))
