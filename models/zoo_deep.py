"""Zoo models ``deep-conv`` and ``deep-tick``: deep convolutional GPs (Dutordoir et al. 2020, §3.3, §4, §5.3).

``num_layers`` L (1–3) counts every layer: L − 1 hidden multi-output layers (MOCK for ``deep-conv``,
TICK-MOCK for ``deep-tick``: Dutordoir et al. 2020, eq. 3–4 with eq. 2) with an identity (centre-crop)
mean, stride 1 and valid padding, then the output layer, a weighted convolutional GP (van der Wilk et
al. 2017, eq. 17) or a weighted TICK GP, one latent function per class sharing the inducing patches.
L = 1 is the single-layer ``weighted-conv`` / ``weighted-tick`` model on colour patches. Inference:
method ``"deep-svgp"`` (:mod:`gpzoo.inference.deep_conv`).

Settings the paper's text gives: 5×5 patches at every layer, inducing patches initialised from
random training patches, SE patch kernels, identity mean (§5.3); it used 384 inducing patches per
layer. Ours where its appendices (which we lack) would say (chosen, not the paper's):

* M = 100 per layer by default (CPU-sized); one output channel per hidden layer unless
  ``hidden_channels`` says otherwise (channels beyond the input's get a zero mean);
* a patch side that does not fit (Σ_ℓ (h_ℓ − 1) > H − 1 for valid padding through L layers) is clipped
  to ⌊(H + L − 1) / L⌋ when the patch shape is left at its default; an explicit one that does not
  fit is refused with a typed error;
* hidden patch kernels: SE with lengthscale max(1, √E / 3) (as the conv models) and variance
  ``hidden_variance`` = 0.1 (the hidden outputs perturb pixel values in [0, 1]); the output layer's
  patch kernel as ``weighted-conv``'s (variance P under the "mean" normalisation);
* ``location_lengthscale`` 0.5 for every TICK layer (as ``tick``);
* ``hidden_sampling="inducing"`` by default: each image's hidden outputs drawn through its own draw of
  the inducing outputs, an unbiased estimate of the bound; ``"marginal"`` is the per-patch scheme the
  paper trains with, ``"full"`` keeps every between-patch covariance (§4.1; see
  :mod:`gpzoo.inference.deep_conv`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from gpzoo.models import kernels
from gpzoo.models.errors import InvalidArgumentError, ShapeError
from gpzoo.models.kernels.convolutional import Convolutional, WeightedConvolutional, image_dims
from gpzoo.models.kernels.deep_convolutional import HIDDEN_SAMPLING, DeepConvolutional, layer_output_shape
from gpzoo.models.kernels.tick import TICK
from gpzoo.models.zoo_convolutional import NEEDS_IMAGES, BaseLengthscale, BaseVariance, checked_patch_shape, count_patches, \
    image_model_spec, patch_base_kernel
from gpzoo.models.zoo_core import Common, ModelSpec, register
from gpzoo.models.zoo_tick import DEFAULT_LOCATION_LENGTHSCALE, LocationLengthscale

__all__ = ["DEFAULT_DEEP_PATCH_SHAPE", "MAX_LAYERS", "build_deep_kernel", "layer_patch_shapes"]

DEFAULT_DEEP_PATCH_SHAPE = (5, 5)
DEFAULT_DEEP_INDUCING = 100
DEFAULT_HIDDEN_VARIANCE = 0.1
MAX_LAYERS = 3
METHOD, INDUCING_KIND = "deep-svgp", "deep-patches"

NumLayers = Annotated[int, f"layers in all, 1-{MAX_LAYERS}: num_layers - 1 hidden multi-output layers, then the output layer"]
DeepPatchShape = Annotated[tuple[int, int] | None, "patch height × width of every layer, e.g. 5x5; none: 5x5, clipped so L layers fit"]
PatchSides = Annotated[tuple[int, ...] | None, "square patch side of each layer, first to last (e.g. 5,3); overrides patch_shape"]
HiddenInducing = Annotated[int | tuple[int, ...] | None, "inducing patches of each hidden layer (one value: all); none: num_inducing"]
HiddenChannels = Annotated[int | tuple[int, ...] | None, "output channels of each hidden layer (one value: all); none: 1"]
HiddenVariance = Annotated[float, "initial variance of the hidden layers' patch functions"]
HiddenSampling = Annotated[Literal["inducing", "marginal", "full"],
                           "how hidden outputs are drawn in the bound: per-image inducing draw, per-patch marginals "
                           "(Dutordoir et al. 2020, §4.1), or the full between-patch covariance"]


def _per_hidden(values, num_hidden: int, default: int, argument: str) -> tuple[int, ...]:
    """One positive int per hidden layer from None (the default), one value, or one value per layer."""
    if values is None:
        return (int(default),) * num_hidden
    values = tuple(int(v) for v in (values if isinstance(values, (tuple, list)) else (values,)))
    if len(values) == 1:
        values = values * num_hidden
    if len(values) != num_hidden or any(v < 1 for v in values):
        raise InvalidArgumentError(argument, f"expected one positive int or {num_hidden} (one per hidden layer), got {values}")
    return values


def layer_patch_shapes(image_shape, num_layers: int, patch_shape=None, patch_sides=None) -> tuple[tuple[int, int], ...]:
    """Each layer's patch shape (module docstring: the default is clipped to fit, explicit ones are checked)."""
    H, W, _ = image_dims(image_shape)
    if patch_sides is not None:
        sides = tuple(int(s) for s in (patch_sides if isinstance(patch_sides, (tuple, list)) else (patch_sides,)))
        if len(sides) != num_layers or min(sides) < 1:
            raise InvalidArgumentError("patch_sides", f"expected {num_layers} positive sides (one per layer), got {sides}")
        shapes = tuple((s, s) for s in sides)
        argument = "patch_sides"
    elif patch_shape is not None:
        shapes = (checked_patch_shape(patch_shape),) * num_layers
        argument = "patch_shape"
    else:
        h = min(DEFAULT_DEEP_PATCH_SHAPE[0], (H + num_layers - 1) // num_layers)
        w = min(DEFAULT_DEEP_PATCH_SHAPE[1], (W + num_layers - 1) // num_layers)
        shapes = ((h, w),) * num_layers
        argument = "patch_shape"
    if sum(h - 1 for h, _ in shapes) > H - 1 or sum(w - 1 for _, w in shapes) > W - 1:
        raise ShapeError(argument, f"patches {shapes} do not fit {num_layers} valid-padding layers on {H}×{W} images")
    return shapes


def build_deep_kernel(image_shape, *, tick: bool, num_layers: int, patch_shapes, hidden_inducing, hidden_channels,
                      hidden_variance: float, location_lengthscale: float, lengthscale=None, variance=None,
                      hidden_sampling: str = "inducing") -> DeepConvolutional:
    """The :class:`DeepConvolutional` prior of ``deep-tick`` (``tick``) or ``deep-conv`` (module docstring)."""
    shape = image_dims(image_shape)
    layers = []
    for patch, channels in zip(patch_shapes[:-1], hidden_channels):
        patch_dim = patch[0] * patch[1] * shape[2]
        base = kernels.SquaredExponential(lengthscale=max(1.0, patch_dim**0.5 / 3.0), variance=float(hidden_variance))
        if tick:
            layers.append(TICK.create(base, shape, patch, location_lengthscale, weighted=False))
        else:
            layers.append(Convolutional(base, shape, patch, channels="patch"))
        shape = layer_output_shape(layers[-1], channels)
    patch = patch_shapes[-1]
    base = patch_base_kernel(patch[0] * patch[1] * shape[2], count_patches(shape, patch), "mean", lengthscale, variance)
    if tick:
        output = TICK.create(base, shape, patch, location_lengthscale, weighted=True)
    else:
        output = WeightedConvolutional.create(base, shape, patch, channels="patch")
    return DeepConvolutional(tuple(layers), output, channels=tuple(hidden_channels), num_inducing=tuple(hidden_inducing),
                             sampling=hidden_sampling)


def _register_deep(name, description, *, tick):
    @register(name, description, num_inducing=DEFAULT_DEEP_INDUCING)
    def build(common: Common, num_layers: NumLayers = 2, patch_shape: DeepPatchShape = None, patch_sides: PatchSides = None,
              hidden_num_inducing: HiddenInducing = None, hidden_channels: HiddenChannels = None,
              hidden_variance: HiddenVariance = DEFAULT_HIDDEN_VARIANCE, lengthscale: BaseLengthscale = None,
              variance: BaseVariance = None,
              location_lengthscale: LocationLengthscale = DEFAULT_LOCATION_LENGTHSCALE,
              hidden_sampling: HiddenSampling = "inducing") -> ModelSpec:
        shape = common.required_image_shape(NEEDS_IMAGES)
        if hidden_sampling not in HIDDEN_SAMPLING:
            raise InvalidArgumentError("hidden_sampling", f"must be one of {HIDDEN_SAMPLING}, got {hidden_sampling!r}")
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= MAX_LAYERS:
            raise InvalidArgumentError("num_layers", f"must be an int from 1 to {MAX_LAYERS}, got {num_layers!r}")
        if not float(hidden_variance) > 0:
            raise InvalidArgumentError("hidden_variance", f"must be positive, got {hidden_variance!r}")
        if tick and (location_lengthscale is None or not float(location_lengthscale) > 0):
            raise InvalidArgumentError("location_lengthscale", f"must be positive, got {location_lengthscale!r}")
        num_hidden = num_layers - 1
        patches = layer_patch_shapes(shape, num_layers, patch_shape, patch_sides)
        inducing = _per_hidden(hidden_num_inducing, num_hidden, common.num_inducing, "hidden_num_inducing")
        channels = _per_hidden(hidden_channels, num_hidden, 1, "hidden_channels")
        kernel = build_deep_kernel(shape, tick=tick, num_layers=num_layers, patch_shapes=patches, hidden_inducing=inducing,
                                   hidden_channels=channels, hidden_variance=hidden_variance,
                                   location_lengthscale=float(location_lengthscale), lengthscale=lengthscale, variance=variance,
                                   hidden_sampling=hidden_sampling)
        spec = image_model_spec(common, name, kernel, shape, INDUCING_KIND, num_layers=num_layers, patch_shapes=patches,
                                hidden_num_inducing=inducing, hidden_channels=channels)
        return spec.replace(method=METHOD)

    return build


_register_deep("deep-conv", "Deep convolutional GP: hidden multi-output conv layers with identity mean, weighted conv output "
                            "layer, doubly stochastic VI (Dutordoir et al. 2020, §3.3, §4)", tick=False)
_register_deep("deep-tick", "Deep TICK GP: hidden translation-insensitive multi-output conv layers, weighted TICK output layer "
                            "(Dutordoir et al. 2020, §3.2-§4)", tick=True)
