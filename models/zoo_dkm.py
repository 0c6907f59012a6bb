"""Zoo models of deep kernel machines (Milsom, Anson, Aitchison 2024), registered when :mod:`gpzoo.models.zoo` imports this module.

* ``dkm`` — a fully connected DKM on tables (or flattened images): ``depth`` Gram layers of
  widths P_ℓ on the linear input Gram of P₀ = ``num_inducing`` inducing inputs.
* ``conv-dkm`` — a convolutional DKM (§2, Algorithm 1, App. A) as a small ResNet-style stack:
  ``depth`` conv Gram layers in two stages, the second starting with a stride-2 mix-up and twice
  as wide (the paper widens each stage, 512/1024/2048); every second layer is averaged with the
  output two layers back (a skip connection, a 1×1 mix-up where the shapes differ), batch kernel
  normalisation after every layer, global average pooling (or a ``flatten`` head) before the
  output GP.

The spec's ``architecture`` is the network (:class:`~gpzoo.models.dkm.DKMConfig`; its ``kernel``
is None), its method ``"dkm"`` (:mod:`gpzoo.inference.dkm_family`: the NumPyro program and its
fitter); :func:`architecture_spec` makes the spec of any other ``DKMConfig``. q(u) of the
output layer is unwhitened with one covariance shared by the outputs, as in the paper: ``whiten`` does
not apply (it is ignored) and a ``q_structure`` other than ``"full"`` is refused by name.

Defaults: the paper's regularisers (§4.1: ν = 1e-3, SKR with γ = ceil(P_ℓ/4), λ = 0.1, Adam with
β = (0.8, 0.9) is ``gpzoo.fit``'s choice to make) and its normalised-Gaussian kernel for
``conv-dkm``; the arc-cosine (ReLU) kernel for ``dkm``, the NNGP of a ReLU network
(a choice: the paper's fully connected experiments are in its predecessor). The KL form defaults
to the symmetric second-order Taylor term (``"taylor_symmetric"``; the paper's eq. 8 as printed,
½‖G⁻¹K − I‖²_F, is ``"milsom_eq8"``, and ``"taylor_frobenius"`` is half of it, in KL units; see
:func:`gpzoo.inference.dkm.gram_kl`). Depth 2 is a CPU-sized
choice, not the paper's (its CIFAR-10 network has 20 layers): for ``conv-dkm`` a stride-1 layer
and a stride-2 layer averaged with the input Gram (through a strided 1×1 mix-up); ``depth=4``
gives two layers per stage with a skip around each pair.
"""

from __future__ import annotations

from typing import Annotated, Literal

from gpzoo.models.dkm import KL_FORMS, DKMConfig, GramLayerSpec
from gpzoo.models.errors import InvalidArgumentError, as_int_pair
from gpzoo.models.zoo_core import Common, ModelSpec, register

Depth = Annotated[int, "number of Gram layers"]
Widths = Annotated[tuple[int, ...] | None, "inducing points P_ℓ per Gram layer, e.g. 16,16; none: the default widths"]
Nu = Annotated[float, "ν, the weight of every Gram layer's KL term (eq. 2); large ν holds G at the NNGP kernel K"]
Skr = Annotated[bool, "stochastic kernel regularisation: train on Wishart draws G̃ ~ W(G/γ, γ) + λI (eq. 4)"]
SkrGamma = Annotated[int | None, "γ, the Wishart's degrees of freedom; none: ceil(P_ℓ/4)"]
SkrJitter = Annotated[float, "λ, added to G̃ in training and to G at test time"]
KlForm = Annotated[Literal["exact", "taylor_symmetric", "taylor_frobenius", "milsom_eq8"],
                   "KL(N(0,G) ‖ N(0,K)) of the Gram layers: exact, or a second-order Taylor form (§3.2)"]
GramKernel = Annotated[Literal["arccos", "normalised_gaussian", "squared_exponential"], "kernel nonlinearity on Gram blocks"]
FilterShape = Annotated[tuple[int, int], "conv mix-up filter (and input patch) height × width, odd, e.g. 3x3"]
Head = Annotated[Literal["gap", "flatten"], "global average pooling, or a learned readout over all locations"]
BatchNorm = Annotated[bool, "batch kernel normalisation after every conv Gram layer"]


def _widths(widths, default: tuple[int, ...], depth: int) -> tuple[int, ...]:
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
        raise InvalidArgumentError("depth", f"must be a positive integer, got {depth!r}")
    if widths is None:
        return default
    widths = tuple(widths)
    if len(widths) != depth or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in widths):
        raise InvalidArgumentError("widths", f"needs {depth} positive integers (one per Gram layer), got {widths!r}")
    return widths


def _regularisers(nu, skr, skr_gamma, skr_jitter, kl, kernel) -> dict:
    # ν, γ and λ are checked (and named) by DKMConfig itself
    for name, value, allowed in (("kl", kl, KL_FORMS),
                                 ("kernel", kernel, ("arccos", "normalised_gaussian", "squared_exponential"))):
        if value not in allowed:
            raise InvalidArgumentError(name, f"must be one of {allowed}, got {value!r}")
    return dict(nu=float(nu), skr=bool(skr), skr_gamma=skr_gamma, skr_jitter=float(skr_jitter), kl=kl, kernel=kernel)


#: Fields every deep kernel machine's spec sets: unwhitened q(u) with one full covariance (module docstring).
_DKM_FIELDS = dict(inducing="dkm-gram", method="dkm", whiten=False, q_structure="full")


def architecture_spec(config: DKMConfig, name: str = "dkm", **fields) -> ModelSpec:
    """The :class:`ModelSpec` that fits the deep kernel machine ``config`` as it is (``gpzoo.fit(spec, X, y)``).

    Its likelihood is the config's, its number of inducing inputs P₀ the config's, its inputs
    flattened images for a conv config (``config.image_shape`` is then needed) and tables
    otherwise; ``fields`` set the rest (``description``, ``jitter``, ...). For architectures the
    zoo's ``dkm`` and ``conv-dkm`` options do not reach (a Gram layer's jitter, batch-norm mode, ...).
    """
    if not isinstance(config, DKMConfig):
        raise InvalidArgumentError("architecture", f"expected a DKMConfig, got {type(config).__name__}")
    conv = config.architecture == "conv"
    if conv and config.image_shape is None:
        raise InvalidArgumentError("image_shape", "a convolutional DKM fitted on flattened images needs the config's image_shape")
    values = dict(_DKM_FIELDS, num_inducing=config.input_inducing, input_kind="image" if conv else "any",
                  image_shape=tuple(config.image_shape) if conv else None)
    return ModelSpec(name=name, kernel=None, likelihood=config.likelihood, architecture=config, **(values | fields))


def _dkm_spec(common: Common, name: str, config_fields: dict, input_kind: str, image_shape) -> ModelSpec:
    if common.q_structure != "full":  # the output GP's covariance is one full Σ shared by the outputs
        raise InvalidArgumentError("q_structure", f"a deep kernel machine's output layer has one full covariance shared "
                                                  f"by its outputs; got {common.q_structure!r}")
    likelihood = common.resolved_likelihood()
    config = DKMConfig(likelihood=likelihood, num_outputs=likelihood.num_latent(common.num_classes),
                       num_input_inducing=common.num_inducing, image_shape=image_shape, **config_fields)
    return common.spec(name, None, architecture=config, likelihood=likelihood, input_kind=input_kind,
                       image_shape=image_shape, **_DKM_FIELDS)


@register("dkm", "Fully connected deep kernel machine: learned Gram matrices, SKR, Taylor KL (Milsom et al. 2024)",
          num_inducing=32)
def _dkm(common: Common, depth: Depth = 2, widths: Widths = None, nu: Nu = 1e-3, skr: Skr = True,
         skr_gamma: SkrGamma = None, skr_jitter: SkrJitter = 0.1, kl: KlForm = "taylor_symmetric",
         kernel: GramKernel = "arccos") -> ModelSpec:
    widths = _widths(widths, (common.num_inducing,) * depth, depth)
    fields = dict(layers=tuple(GramLayerSpec(w) for w in widths), architecture="fc",
                  **_regularisers(nu, skr, skr_gamma, skr_jitter, kl, kernel))
    return _dkm_spec(common, "dkm", fields, "any", common.given_image_shape())


@register("conv-dkm", "Convolutional deep kernel machine, a small ResNet-style stack with one stride-2 stage, SKR "
                      "(Milsom et al. 2024, Alg. 1)", num_inducing=16)
def _conv_dkm(common: Common, depth: Depth = 2, widths: Widths = None, nu: Nu = 1e-3, skr: Skr = True,
              skr_gamma: SkrGamma = None, skr_jitter: SkrJitter = 0.1, kl: KlForm = "taylor_symmetric",
              kernel: GramKernel = "normalised_gaussian", filter_shape: FilterShape = (3, 3), head: Head = "gap",
              batch_norm: BatchNorm = True) -> ModelSpec:
    shape = common.required_image_shape("conv-dkm needs image_shape (H, W) or (H, W, C)")
    filter_shape = as_int_pair(filter_shape, "filter_shape", 1, "(h, w) of positive odd ints")
    if any(k % 2 == 0 for k in filter_shape):
        raise InvalidArgumentError("filter_shape", f"must be odd (centred zero padding), got {filter_shape}")
    second = depth // 2  # first layer of the stride-2 stage
    P = common.num_inducing
    widths = _widths(widths, tuple(P if i < second or depth == 1 else 2 * P for i in range(depth)), depth)
    layers = tuple(
        GramLayerSpec(w, filter_shape=filter_shape, stride=2 if i == second and depth > 1 else 1, batch_norm=bool(batch_norm),
                      skip_from=i - 2 if i % 2 == 1 else None)
        for i, w in enumerate(widths))
    fields = dict(layers=layers, architecture="conv", stem_patch_shape=filter_shape, head=head,
                  head_inducing=widths[-1] if head == "flatten" else None,
                  **_regularisers(nu, skr, skr_gamma, skr_jitter, kl, kernel))
    return _dkm_spec(common, "conv-dkm", fields, "image", shape)
