"""Zoo models of the convolutional family (van der Wilk et al. 2017, §3), registered when :mod:`gpzoo.models.zoo` imports this module.

Every builder takes :class:`~gpzoo.models.zoo_core.Common` (dataset facts, ``num_inducing``,
``whiten``, ``q_structure``, ``inducing_init``) and its own options, declared by its signature
(``patch_shape``, hyperparameter initial values, ``products`` ("matmul" or "conv"),
``normalisation``). Defaults follow the paper's setups (3×3 patches, M = 16, training with Adam
at 0.01 and minibatches of 100):

* base kernel: SE on patches, lengthscale max(1, √E / 3) for patches of E values in [0, 1]
  (distances between patches grow like √E); variance T, the number of patch terms in f, under
  the ``"mean"`` normalisation (1/T under ``"sum"``, the same prior). f = (1/T) Σ w g then moves
  by O(1/√T) for a feature seen in one patch and up to O(√T) for one seen everywhere. Measured
  (1000 Adam steps, batch 100): on ``colour-patches`` colour-patch-conv reaches 2.7 % test error
  from variance T = 121 but 39 % from variance 10; on rectangles conv reaches 4.7 % (from T = 676)
  and 4.4 % (from 10) with learned variances 820 and 650, and weighted-conv 0.9 %;
* patch weights 1 (weighted kernels start as the translation-invariant one);
* inducing patches: distinct training patches drawn at random (``inducing_init="kmeans"`` or
  ``"uniform"`` — the paper's choice for rectangles — also work);
* RBF part of conv + RBF: SE on whole images, lengthscale √D / 2, variance 1 — the ELBO decides
  how the variance splits between the parts (van der Wilk et al. 2017, §3.3; see
  :func:`gpzoo.inference.components.component_variances`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Literal

from gpzoo.models import kernels
from gpzoo.models.errors import as_int_pair
from gpzoo.models.kernels.convolutional import (
    AdditiveColourConvolutional,
    Convolutional,
    ImageSum,
    MultiChannelConvolutional,
    WeightedConvolutional,
    image_dims,
)
from gpzoo.models.zoo_core import Common, Lengthscale, ModelSpec, register

DEFAULT_PATCH_SHAPE = (3, 3)
DEFAULT_RBF_VARIANCE = 1.0
NEEDS_IMAGES = "convolutional models need image_shape (H, W) or (H, W, C)"

PatchShape = Annotated[tuple[int, int], "patch height × width, e.g. 5x5"]
BaseLengthscale = Annotated[float | None, "SE lengthscale of the patch function g; none: max(1, √E/3) for patches of E values"]
BaseVariance = Annotated[float | None, "variance of g; none: T (the number of patch terms) under 'mean', 1/T under 'sum'"]
Products = Annotated[Literal["matmul", "conv"] | Callable, "how patch inner products are computed (a patch matmul or a convolution)"]
Normalisation = Annotated[Literal["mean", "sum"], "f = (1/T) Σ_p w_p g(x^[p]) ('mean') or Σ_p w_p g(x^[p]) ('sum')"]
RbfVariance = Annotated[float | None, f"variance of the RBF part on whole images; none: {DEFAULT_RBF_VARIANCE}"]


def checked_patch_shape(patch_shape) -> tuple[int, int]:
    return as_int_pair(patch_shape, "patch_shape", 1, "(h, w) of positive ints")


def patch_base_kernel(patch_dim: int, num_terms: int, normalisation: str, lengthscale, variance) -> kernels.Kernel:
    if lengthscale is None:
        lengthscale = max(1.0, math.sqrt(patch_dim) / 3.0)
    if variance is None:
        variance = float(num_terms) if normalisation == "mean" else 1.0 / num_terms
    return kernels.SquaredExponential(lengthscale=lengthscale, variance=variance)


def count_patches(shape, patch_shape) -> int:
    H, W, _ = image_dims(shape)
    return max(1, H - patch_shape[0] + 1) * max(1, W - patch_shape[1] + 1)


def image_model_spec(common: Common, name: str, kernel, shape, inducing, **options) -> ModelSpec:
    return common.spec(name, kernel, inducing=inducing, input_kind="image", image_shape=tuple(shape), options=options)


def _conv(common: Common, *, weighted, colour_patch, patch_shape, lengthscale, variance, products, normalisation):
    """The (weighted) convolutional kernel for ``common``'s images, its image shape and spec options."""
    shape = common.required_image_shape(NEEDS_IMAGES)
    patch_shape = checked_patch_shape(patch_shape)
    C = image_dims(shape)[2]
    channels = "patch" if colour_patch or C == 1 else "separate"
    patch_dim = patch_shape[0] * patch_shape[1] * (C if channels == "patch" else 1)
    num_terms = count_patches(shape, patch_shape) * (1 if channels == "patch" else C)
    base = patch_base_kernel(patch_dim, num_terms, normalisation, lengthscale, variance)
    options = dict(channels=channels, products=products, normalisation=normalisation)
    if weighted:
        kernel = WeightedConvolutional.create(base, shape, patch_shape, **options)
    else:
        kernel = Convolutional(base, shape, patch_shape, **options)
    return kernel, shape, {"patch_shape": patch_shape, "channels": channels}


def _register_conv(name, description, *, weighted, colour_patch):
    @register(name, description, num_inducing=16)
    def build(common: Common, patch_shape: PatchShape = DEFAULT_PATCH_SHAPE, lengthscale: BaseLengthscale = None,
              variance: BaseVariance = None, products: Products = "matmul", normalisation: Normalisation = "mean") -> ModelSpec:
        kernel, shape, options = _conv(common, weighted=weighted, colour_patch=colour_patch, patch_shape=patch_shape,
                                       lengthscale=lengthscale, variance=variance, products=products,
                                       normalisation=normalisation)
        return image_model_spec(common, name, kernel, shape, "patches", **options)

    return build


def _register_conv_rbf(name, description, *, weighted):
    @register(name, description, num_inducing=16)
    def build(common: Common, patch_shape: PatchShape = DEFAULT_PATCH_SHAPE, lengthscale: BaseLengthscale = None,
              variance: BaseVariance = None, rbf_lengthscale: Lengthscale = None, rbf_variance: RbfVariance = None,
              products: Products = "matmul", normalisation: Normalisation = "mean") -> ModelSpec:
        conv, shape, options = _conv(common, weighted=weighted, colour_patch=False, patch_shape=patch_shape,
                                     lengthscale=lengthscale, variance=variance, products=products,
                                     normalisation=normalisation)
        rbf = kernels.SquaredExponential(lengthscale=common.lengthscale(rbf_lengthscale, image_shape=shape),
                                         variance=DEFAULT_RBF_VARIANCE if rbf_variance is None else rbf_variance)
        return image_model_spec(common, name, ImageSum((conv, rbf)), shape, ("patches", "points"), **options)

    return build


_register_conv("conv", "Translation-invariant convolutional GP f(x) = Σ_p g(x^[p]), inducing patches (van der Wilk et al. 2017, §3.1)",
               weighted=False, colour_patch=False)
_register_conv("weighted-conv", "Weighted convolutional GP f(x) = Σ_p w_p g(x^[p]) with learned weights (van der Wilk et al. 2017, §3.2)",
               weighted=True, colour_patch=False)
_register_conv("colour-patch-conv", "Weighted convolutional GP on w×h×C colour patches (van der Wilk et al. 2017, §3.4)",
               weighted=True, colour_patch=True)
_register_conv_rbf("conv+rbf", "Convolutional + RBF GP, separate inducing patches and points (van der Wilk et al. 2017, §3.3)", weighted=False)
_register_conv_rbf("weighted-conv+rbf", "Weighted convolutional + RBF GP, separate inducing patches and points (van der Wilk et al. 2017, §3.3)",
                   weighted=True)


def _per_channel_model(name, description, kernel_class, *, channel_terms: bool, **common_defaults):
    """Models whose patches are single-channel (w×h) with one term per patch (× C with ``channel_terms``)."""

    @register(name, description, num_inducing=16, **common_defaults)
    def build(common: Common, patch_shape: PatchShape = DEFAULT_PATCH_SHAPE, lengthscale: BaseLengthscale = None,
              variance: BaseVariance = None, products: Products = "matmul", normalisation: Normalisation = "mean") -> ModelSpec:
        shape = common.required_image_shape(NEEDS_IMAGES)
        patch_shape = checked_patch_shape(patch_shape)
        num_terms = count_patches(shape, patch_shape) * (image_dims(shape)[2] if channel_terms else 1)
        base = patch_base_kernel(patch_shape[0] * patch_shape[1], num_terms, normalisation, lengthscale, variance)
        kernel = kernel_class.create(base, shape, patch_shape, products=products, normalisation=normalisation)
        return image_model_spec(common, name, kernel, shape, "patches", patch_shape=patch_shape)

    return build


_per_channel_model("additive-colour-conv",
                   "Weighted convolutional GP with an additive-over-channels patch kernel (van der Wilk et al. 2017, eq. 24–25)",
                   AdditiveColourConvolutional, channel_terms=False)
_per_channel_model("multichannel-conv",
                   "Multi-channel convolutional GP, one g_c per channel, C·M inducing outputs (van der Wilk et al. 2017, eq. 22–23)",
                   MultiChannelConvolutional, channel_terms=True, q_structure="block")
