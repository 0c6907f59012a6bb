"""Zoo models with the translation-insensitive convolutional kernel (Dutordoir et al. 2020, §3.2, §5.1).

``tick``: f(x) = Σ_p g(x^[p], ℓ(p)) with unit (fixed) patch weights; ``weighted-tick``: learned
weights w_p, the paper's single-layer TICK-GP. Both take any image shape (grey or colour: a patch is
h×w×C values) and any task / number of classes; inducing variables are patches with locations
(kind ``"patch-locations"``, :mod:`gpzoo.inference.inducing`: random distinct training
patches at the locations they came from, Dutordoir et al. 2020, §5.3).

Defaults are those of the conv models (:mod:`gpzoo.models.zoo_convolutional`: 3×3 patches,
M = 16, SE patch kernel with lengthscale max(1, √E / 3) and variance P under the ``"mean"``
normalisation), plus ``location_lengthscale`` 0.5 on the [0, 1]² location scale: patches half an
image apart keep correlation e^(−1/2) ≈ 0.6. (The paper reports a learned value near (π/2)⁻¹ ≈ 0.64
for k_loc(r) = exp(−r²/ℓ²), which is ≈ 0.45 in our exp(−r²/(2ℓ²)) convention.)
"""

from __future__ import annotations

from typing import Annotated

from gpzoo.models.errors import InvalidArgumentError
from gpzoo.models.kernels.convolutional import image_dims
from gpzoo.models.kernels.tick import TICK
from gpzoo.models.zoo_convolutional import (
    DEFAULT_PATCH_SHAPE,
    NEEDS_IMAGES,
    BaseLengthscale,
    BaseVariance,
    Normalisation,
    PatchShape,
    Products,
    patch_base_kernel,
    count_patches,
    checked_patch_shape,
    image_model_spec,
)
from gpzoo.models.zoo_core import Common, ModelSpec, register

DEFAULT_LOCATION_LENGTHSCALE = 0.5
INDUCING_KIND = "patch-locations"

LocationLengthscale = Annotated[float, "SE lengthscale of k_loc over patch locations in [0, 1]² (row, col); large: translation invariant"]


def _register_tick(name, description, *, weighted):
    @register(name, description, num_inducing=16)
    def build(common: Common, patch_shape: PatchShape = DEFAULT_PATCH_SHAPE, lengthscale: BaseLengthscale = None,
              variance: BaseVariance = None, location_lengthscale: LocationLengthscale = DEFAULT_LOCATION_LENGTHSCALE,
              products: Products = "matmul", normalisation: Normalisation = "mean") -> ModelSpec:
        shape = common.required_image_shape(NEEDS_IMAGES)
        patch_shape = checked_patch_shape(patch_shape)
        if location_lengthscale is None or float(location_lengthscale) <= 0:
            raise InvalidArgumentError("location_lengthscale", f"must be positive, got {location_lengthscale!r}")
        C = image_dims(shape)[2]
        base = patch_base_kernel(patch_shape[0] * patch_shape[1] * C, count_patches(shape, patch_shape), normalisation, lengthscale,
                            variance)
        kernel = TICK.create(base, shape, patch_shape, float(location_lengthscale), weighted=weighted, products=products,
                             normalisation=normalisation)
        return image_model_spec(common, name, kernel, shape, INDUCING_KIND, patch_shape=patch_shape)

    return build


_register_tick("tick", "Translation-insensitive convolutional GP, k_patch × k_loc over patch locations, unit patch weights "
                       "(Dutordoir et al. 2020, §3.2)", weighted=False)
_register_tick("weighted-tick", "Translation-insensitive convolutional GP with learned patch weights, inducing patches with "
                                "locations (Dutordoir et al. 2020, §3.2, §5.1)", weighted=True)
