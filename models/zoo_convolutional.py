"""Zoo models of the convolutional family (van der Wilk et al. 2017, §3): imported by :mod:`gpzoo.models.zoo` on demand.

Every builder takes the dataset facts (``input_dim``, ``task``, ``num_classes``, ``image_shape``)
and options (``patch_shape``, ``num_inducing``, hyperparameter initial values, ``whiten``,
``q_structure``, ``inducing_init``, ``products`` ("matmul" or "conv"), ``normalisation``). Defaults follow the paper's
setups (3×3 patches, M = 16, training with Adam at 0.01 and minibatches of 100):

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

from gpzoo.models import kernels
from gpzoo.models.errors import InvalidArgumentError, as_int_pair
from gpzoo.models.kernels.convolutional import (
    AdditiveColourConvolutional,
    Convolutional,
    ImageSum,
    MultiChannelConvolutional,
    WeightedConvolutional,
    image_dims,
)
from gpzoo.models.zoo import Common, ModelSpec, register

DEFAULT_PATCH_SHAPE = (3, 3)
DEFAULT_RBF_VARIANCE = 1.0


def _image_shape(image_shape, input_dim) -> tuple[int, ...]:
    """The dataset's image shape; a square grey image is inferred from ``input_dim`` if needed."""
    if image_shape is not None:
        image_dims(image_shape)  # typed error for a malformed shape
        shape = tuple(int(s) for s in image_shape)
        if input_dim is not None and math.prod(shape) != int(input_dim):
            raise InvalidArgumentError("image_shape", f"{shape} has {math.prod(shape)} pixels but input_dim is {input_dim}")
        return shape
    side = math.isqrt(int(input_dim)) if input_dim else 0
    if not input_dim or side * side != int(input_dim):
        raise InvalidArgumentError("image_shape", "convolutional models need image_shape (H, W) or (H, W, C)")
    return (side, side)


def _patch_shape(patch_shape) -> tuple[int, int]:
    return as_int_pair(patch_shape, "patch_shape", 1, "(h, w) of positive ints")


def _base_kernel(patch_dim: int, num_terms: int, normalisation: str, lengthscale, variance) -> kernels.Kernel:
    if lengthscale is None:
        lengthscale = max(1.0, math.sqrt(patch_dim) / 3.0)
    if variance is None:
        variance = float(num_terms) if normalisation == "mean" else 1.0 / num_terms
    return kernels.SquaredExponential(lengthscale=lengthscale, variance=variance)


def _num_patches(shape, patch_shape) -> int:
    H, W, _ = image_dims(shape)
    return max(1, H - patch_shape[0] + 1) * max(1, W - patch_shape[1] + 1)


def _rbf(image_shape, lengthscale, variance) -> kernels.Kernel:
    D = math.prod(image_shape)
    lengthscale = max(1.0, math.sqrt(D) / 2.0) if lengthscale is None else lengthscale
    return kernels.SquaredExponential(lengthscale=lengthscale, variance=DEFAULT_RBF_VARIANCE if variance is None else variance)


def _spec(common: Common, name: str, kernel, shape, inducing, **options) -> ModelSpec:
    return common.spec(name, kernel, inducing=inducing, input_kind="image", image_shape=tuple(shape), options=options)


def _conv(common: Common, *, weighted, colour_patch, patch_shape, lengthscale, variance, products, normalisation):
    """The (weighted) convolutional kernel for ``common``'s images, its image shape and spec options."""
    shape = _image_shape(common.image_shape, common.input_dim)
    patch_shape = _patch_shape(patch_shape)
    C = image_dims(shape)[2]
    channels = "patch" if colour_patch or C == 1 else "separate"
    patch_dim = patch_shape[0] * patch_shape[1] * (C if channels == "patch" else 1)
    num_terms = _num_patches(shape, patch_shape) * (1 if channels == "patch" else C)
    base = _base_kernel(patch_dim, num_terms, normalisation, lengthscale, variance)
    options = dict(channels=channels, products=products, normalisation=normalisation)
    if weighted:
        kernel = WeightedConvolutional.create(base, shape, patch_shape, **options)
    else:
        kernel = Convolutional(base, shape, patch_shape, **options)
    return kernel, shape, {"patch_shape": patch_shape, "channels": channels}


def _register_conv(name, description, *, weighted, colour_patch):
    @register(name, description, num_inducing=16)
    def build(common: Common, patch_shape=DEFAULT_PATCH_SHAPE, lengthscale=None, variance=None, products: str = "matmul",
              normalisation: str = "mean") -> ModelSpec:
        kernel, shape, options = _conv(common, weighted=weighted, colour_patch=colour_patch, patch_shape=patch_shape,
                                       lengthscale=lengthscale, variance=variance, products=products,
                                       normalisation=normalisation)
        return _spec(common, name, kernel, shape, "patches", **options)

    return build


def _register_conv_rbf(name, description, *, weighted):
    @register(name, description, num_inducing=16)
    def build(common: Common, patch_shape=DEFAULT_PATCH_SHAPE, lengthscale=None, variance=None, rbf_lengthscale=None,
              rbf_variance=None, products: str = "matmul", normalisation: str = "mean") -> ModelSpec:
        conv, shape, options = _conv(common, weighted=weighted, colour_patch=False, patch_shape=patch_shape,
                                     lengthscale=lengthscale, variance=variance, products=products,
                                     normalisation=normalisation)
        kernel = ImageSum((conv, _rbf(shape, rbf_lengthscale, rbf_variance)))
        return _spec(common, name, kernel, shape, ("patches", "points"), **options)

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
    def build(common: Common, patch_shape=DEFAULT_PATCH_SHAPE, lengthscale=None, variance=None, products: str = "matmul",
              normalisation: str = "mean") -> ModelSpec:
        shape = _image_shape(common.image_shape, common.input_dim)
        patch_shape = _patch_shape(patch_shape)
        num_terms = _num_patches(shape, patch_shape) * (image_dims(shape)[2] if channel_terms else 1)
        base = _base_kernel(patch_shape[0] * patch_shape[1], num_terms, normalisation, lengthscale, variance)
        kernel = kernel_class.create(base, shape, patch_shape, products=products, normalisation=normalisation)
        return _spec(common, name, kernel, shape, "patches", patch_shape=patch_shape)

    return build


_per_channel_model("additive-colour-conv",
                   "Weighted convolutional GP with an additive-over-channels patch kernel (van der Wilk et al. 2017, eq. 24–25)",
                   AdditiveColourConvolutional, channel_terms=False)
_per_channel_model("multichannel-conv",
                   "Multi-channel convolutional GP, one g_c per channel, C·M inducing outputs (van der Wilk et al. 2017, eq. 22–23)",
                   MultiChannelConvolutional, channel_terms=True, q_structure="block")
