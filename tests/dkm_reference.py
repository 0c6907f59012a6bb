"""The DKM objective written out from the network's own outputs, the reference the DKM tests compare
the fitted NumPyro program (:mod:`gpzoo.inference.dkm_family`) with."""

import jax
import jax.numpy as jnp
import numpy as np

from gpzoo.inference import dkm
from gpzoo.inference.dkm_family import INDUCING_KIND, GramInitialisation, unflatten_network
from gpzoo.inference.inducing import initialise_inducing, register_initialiser

#: Inducing kind of :func:`dead_layer_2`.
DEAD_LAYER_2 = "dkm-gram-dead-layer-2"


@register_initialiser(DEAD_LAYER_2)
def dead_layer_2(config, X, num_inducing, key, method):
    """The NNGP start with layer 2's kernel scale and bias underflowed to 0: its K_ii is the zero matrix."""
    values = dict(initialise_inducing(INDUCING_KIND, config, X, num_inducing, key, method).values)
    values["dkm.layer_2.log_scale"] = values["dkm.layer_2.log_bias"] = np.asarray(-1e3, values["q_mu"].dtype)
    return GramInitialisation(values)


def core_params(params, config):
    """The network pytree of :func:`gpzoo.inference.dkm.forward` from the program's parameters (by site
    name): the output layer's mean is q(u)'s ``q_mu`` and its factor ``q_sqrt``."""
    core = unflatten_network(params, config.num_layers)
    core["output"] = dict(core["output"], mu=params["q_mu"].T, V=dkm.raw_from_chol(params["q_sqrt"][0]))
    return core


def evaluation_objective(core, config, X, y, key=None):
    """Milsom, Anson, Aitchison 2024, eq. 27 in test mode (G̃ = G + λI): Σ_n E_q[log p(y_n | f_n)]
    − Σ_ℓ ν_ℓ KL_ℓ − w_out KL_out, from :func:`gpzoo.inference.dkm.forward`'s marginals and KL terms.
    Returns ``(value, aux)``."""
    out, aux = dkm.forward(core, config, X, train=False)
    f_var = jnp.broadcast_to(out["f_var"][:, None], out["f_mean"].shape)  # [B, C]
    key = jax.random.PRNGKey(0) if key is None else key
    ell = jnp.sum(config.likelihood.variational_expectation(y, out["f_mean"], f_var, key))
    gram = sum(config.layer_nu(i) * aux["kl"][dkm.layer_name(i)] for i in range(config.num_layers))
    return ell - gram - config.output_kl_weight * aux["kl"]["output"], aux
