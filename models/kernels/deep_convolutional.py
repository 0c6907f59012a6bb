"""The prior of a deep convolutional GP (Dutordoir et al. 2020, §3.3 and §4, eq. 6), as one kernel object.

f(x) = f_L(h_{L−1}), h_ℓ = f_ℓ(h_{ℓ−1}), h_0 = x: L − 1 hidden multi-output convolutional layers
(MOCK, eq. 3–4, or TICK-MOCK with k_loc, eq. 2) map images to images; the last layer is a
single-output convolutional GP (weighted conv, van der Wilk et al. 2017, eq. 17, or TICK) on the last
hidden image, one latent function per class. :class:`DeepConvolutional` holds the layers' kernels
and checks that they chain (each layer's input image is the previous layer's output grid with its
channels); it is a container, not a covariance function: the marginal prior of a deep GP is not
Gaussian, so ``K`` and ``K_diag`` refuse with a typed error. The layer maths is in
:mod:`gpzoo.inference.conv_layer`, the generative model in :mod:`gpzoo.inference.deep_conv`.
"""

from __future__ import annotations

from typing import Any

from gpzoo.models.errors import InvalidArgumentError, ShapeError
from gpzoo.models.kernels.base import Kernel, kernel_class, static
from gpzoo.models.kernels.convolutional import Convolutional, ConvolutionalKernel, image_dims
from gpzoo.models.kernels.tick import TICK, output_grid

__all__ = ["DeepConvolutional", "HIDDEN_SAMPLING", "layer_output_shape"]

#: How a hidden layer's outputs are drawn when the bound is estimated (Dutordoir et al. 2020, §4.1):
#: ``"inducing"`` draws v_ℓ ~ q(v_ℓ) per image and the residual per patch; ``"marginal"`` draws each
#: patch from its own marginal of q(h_ℓ | h_ℓ−1) (no between-patch correlation; the paper's training
#: scheme); ``"full"`` draws from q(h_ℓ | h_ℓ−1) with its full P×P covariance (a Cholesky per image).
HIDDEN_SAMPLING = ("inducing", "marginal", "full")

NO_COVARIANCE = "a deep GP has no closed-form covariance; fit it with gpzoo.fit (method 'deep-svgp')"


def layer_output_shape(kernel: ConvolutionalKernel, channels: int) -> tuple[int, int, int]:
    """(H_out, W_out, C_out): the image a stride-1, valid-padding layer with ``kernel`` and ``channels`` outputs."""
    return output_grid(kernel.image_shape, kernel.patch_shape) + (int(channels),)


@kernel_class
class DeepConvolutional(Kernel):
    """A deep convolutional GP prior: hidden layer kernels ``layers``, then ``output`` (Dutordoir et al. 2020, §4).

    ``layers``: one kernel per hidden layer — :class:`Convolutional` with ``channels="patch"``
    (MOCK) or :class:`TICK` (TICK-MOCK) — built for that layer's input image (H, W, C_in); only
    their patch kernel (and TICK's location kernel) enter the layer. ``channels`` ``[L−1]``: output
    channels of each hidden layer (independent patch-response functions g_c with the same kernel);
    ``num_inducing`` ``[L−1]``: inducing patches of each hidden layer (the size of the approximation,
    kept with the layer structure so the inducing initialiser can read it). ``output``: the
    single-output convolutional or TICK kernel on the last hidden image (or on the input, L = 1).
    ``sampling``: how hidden outputs are drawn when the bound is estimated, one of
    :data:`HIDDEN_SAMPLING` (see :class:`gpzoo.inference.deep_conv.DeepConvSVGP`).
    """

    layers: tuple
    output: Kernel
    channels: tuple = static(())
    num_inducing: tuple = static(())
    sampling: str = static("inducing")

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(self.layers))
        object.__setattr__(self, "channels", tuple(int(c) for c in self.channels))
        object.__setattr__(self, "num_inducing", tuple(int(m) for m in self.num_inducing))
        if not isinstance(self.output, ConvolutionalKernel):
            raise InvalidArgumentError("output", f"the output layer is a convolutional or TICK kernel, got {type(self.output).__name__}")
        if len(self.channels) != len(self.layers) or len(self.num_inducing) != len(self.layers):
            raise ShapeError("channels", f"expected one channel count and one inducing size per hidden layer ({len(self.layers)}), "
                                         f"got channels {self.channels} and num_inducing {self.num_inducing}")
        if self.sampling not in HIDDEN_SAMPLING:
            raise InvalidArgumentError("sampling", f"must be one of {HIDDEN_SAMPLING}, got {self.sampling!r}")
        if any(c < 1 for c in self.channels):
            raise InvalidArgumentError("channels", f"every hidden layer needs at least one channel, got {self.channels}")
        if any(m < 1 for m in self.num_inducing):
            raise InvalidArgumentError("num_inducing", f"every hidden layer needs at least one inducing patch, got {self.num_inducing}")
        shape = None
        for index, (layer, channels) in enumerate(zip(self.layers, self.channels)):
            is_mock = isinstance(layer, Convolutional) and type(layer) is Convolutional and layer.channels == "patch"
            if not (is_mock or isinstance(layer, TICK)):
                raise InvalidArgumentError(f"layers[{index}]", "a hidden layer kernel is Convolutional(channels='patch') or TICK, "
                                                               f"got {type(layer).__name__}")
            if shape is not None and image_dims(layer.image_shape) != shape:
                raise ShapeError(f"layers[{index}]", f"built for images {image_dims(layer.image_shape)} but the layer before "
                                                      f"outputs {shape}")
            shape = layer_output_shape(layer, channels)
        if shape is not None and image_dims(self.output.image_shape) != shape:
            raise ShapeError("output", f"built for images {image_dims(self.output.image_shape)} but the last hidden layer outputs {shape}")
        super().__post_init__()

    @property
    def num_layers(self) -> int:
        """L: hidden layers plus the output layer."""
        return len(self.layers) + 1

    @property
    def image_shape(self) -> tuple[int, ...]:
        """The input images' shape."""
        return (self.layers[0] if self.layers else self.output).image_shape

    @property
    def input_dim(self) -> int:
        return (self.layers[0] if self.layers else self.output).input_dim

    def validate_inputs(self, X) -> None:
        """Eager checks of image rows ``X`` ``[N, H*W*C]`` by the first layer's kernel."""
        (self.layers[0] if self.layers else self.output).validate_inputs(X)

    def _K(self, X, Y):
        raise InvalidArgumentError("kernel", NO_COVARIANCE)

    def _K_diag(self, X):
        raise InvalidArgumentError("kernel", NO_COVARIANCE)

    def _children(self) -> tuple[Any, ...]:
        return self.layers + (self.output,)
