"""2-D convolution (NHWC images, HWIO filters) whose gradients XLA:CPU runs as library convolutions.

XLA:CPU hands a convolution to its convolution libraries (YNNPACK, XNNPACK, Eigen) only in the
canonical form: NHWC input, HWIO kernel, NHWC output, no window reversal. Autodiff's gradients
of a convolution are not in that form (the filter gradient contracts over the batch, the input
gradient reads a transposed, reversed kernel), and XLA rewrites them into it with its
convolution-canonicalisation pass, which only visits the program's entry computation. Inside a
``lax.scan`` or ``while`` body, where ``gpzoo.fit`` runs its steps, the gradients stay as
written and XLA emits them as plain loop nests: a gradient step of a [64, 16, 16, 64] × [3, 3, 64, 64]
convolution ran 53× slower inside a scan than this function's on a 2-core CPU
(``benchmarks/scan_convolutions.py``).

:func:`conv2d` has the same value as ``lax.conv_general_dilated`` with these dimension numbers
and a VJP that writes both gradients in the canonical form with explicit transposes, so the
libraries run them wherever the step is compiled:

* input gradient: the cotangent, dilated by the stride, convolved with the spatially reversed
  kernel whose input and output channels are swapped ``[kh, kw, O, I]``;
* filter gradient: the padded input with its channels as the batch ``[I, H, W, N]`` convolved
  with the cotangent as a ``[H', W', N, O]`` kernel (dilated by the stride), which gives
  ``[I, kh, kw, O]``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["conv2d"]

_NHWC = ("NHWC", "HWIO", "NHWC")


def _forward(x, w, stride: int, pads, precision):
    return lax.conv_general_dilated(x, w, (stride, stride), pads, dimension_numbers=_NHWC, precision=precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def conv2d(x, w, stride: int = 1, pads=((0, 0), (0, 0)), precision=None):
    """Cross-correlation of images ``x [N, H, W, I]`` with filters ``w [kh, kw, I, O]``.

    ``stride`` (both spatial axes) and ``pads`` ``((lo_h, hi_h), (lo_w, hi_w))`` of zeros, as
    ``lax.conv_general_dilated(x, w, (stride, stride), pads, dimension_numbers=("NHWC", "HWIO",
    "NHWC"))``; returns ``[N, H', W', O]`` with H' = (H + lo_h + hi_h − kh) // stride + 1. The
    gradients are convolutions in the canonical form (module docstring). Reverse mode only: a
    custom VJP has no forward-mode rule (``jax.jvp`` / ``jax.jacfwd`` through it raise).
    """
    return _forward(x, w, stride, pads, precision)


def _conv2d_fwd(x, w, stride, pads, precision):
    return _forward(x, w, stride, pads, precision), (x, w)


def _input_gradient(ct, w, x_shape, stride: int, pads, precision):
    """∂/∂x: the cotangent ``[N, H', W', O]`` dilated by the stride, convolved with the reversed,
    channel-swapped kernel ``[kh, kw, O, I]``; padded so that the result is ``[N, H, W, I]``."""
    kernel = jnp.flip(w, (0, 1)).transpose(0, 1, 3, 2)  # [kh, kw, O, I]
    spatial = []
    for n, k, (lo, _), n_out in zip(x_shape[1:3], w.shape[:2], pads, ct.shape[1:3]):
        spatial.append((k - 1 - lo, n + lo - (n_out - 1) * stride - 1))
    return lax.conv_general_dilated(ct, kernel, (1, 1), spatial, lhs_dilation=(stride, stride), dimension_numbers=_NHWC,
                                    precision=precision)


def _filter_gradient(ct, x, w_shape, stride: int, pads, precision):
    """∂/∂w: the zero-padded input with its channels as the batch ``[I, Hp, Wp, N]`` convolved with
    the cotangent as a kernel ``[H', W', N, O]`` (dilated by the stride) -> ``[kh, kw, I, O]``."""
    (kh, kw), (n_out_h, n_out_w) = w_shape[:2], ct.shape[1:3]
    padded = jnp.pad(x, ((0, 0), *pads, (0, 0)))
    # rows past the last window the forward read are never used (strides that do not divide evenly)
    padded = padded[:, : (n_out_h - 1) * stride + kh, : (n_out_w - 1) * stride + kw]
    lhs = padded.transpose(3, 1, 2, 0)  # [I, Hp, Wp, N]
    rhs = ct.transpose(1, 2, 0, 3)  # [H', W', N, O]
    out = lax.conv_general_dilated(lhs, rhs, (1, 1), ((0, 0), (0, 0)), rhs_dilation=(stride, stride),
                                   dimension_numbers=_NHWC, precision=precision)  # [I, kh, kw, O]
    return out.transpose(1, 2, 0, 3)


def _conv2d_bwd(stride, pads, precision, residuals, ct):
    x, w = residuals
    return (_input_gradient(ct, w, x.shape, stride, pads, precision).astype(x.dtype),
            _filter_gradient(ct, x, w.shape, stride, pads, precision).astype(w.dtype))


conv2d.defvjp(_conv2d_fwd, _conv2d_bwd)
