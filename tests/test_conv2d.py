"""``conv2d``: the value and both gradients of ``lax.conv_general_dilated`` (NHWC/HWIO), with
gradients XLA:CPU runs as library convolutions inside a compiled scan (``gpzoo.fit``'s steps)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from gpzoo.models.kernels.conv2d import conv2d

#: (images [N, H, W, I], filter [kh, kw, O], stride, pads): odd and even sizes, strides that do and
#: do not divide the padded size, SAME-like, VALID and one-sided pads, non-square filters
GEOMETRIES = [
    ((3, 9, 12, 4), (3, 3, 5), 1, ((1, 1), (1, 1))),
    ((3, 9, 12, 4), (3, 3, 5), 2, ((1, 1), (1, 1))),
    ((2, 7, 5, 3), (3, 3, 2), 2, ((1, 1), (1, 1))),
    ((2, 8, 8, 3), (5, 3, 4), 1, ((2, 2), (1, 1))),
    ((2, 10, 9, 3), (5, 5, 4), 1, ((0, 0), (0, 0))),
    ((2, 10, 9, 3), (3, 3, 4), 3, ((1, 1), (1, 1))),
    ((2, 6, 6, 2), (1, 1, 3), 2, ((0, 0), (0, 0))),
    ((2, 11, 11, 2), (2, 2, 3), 2, ((0, 1), (0, 1))),
]


def _reference(x, w, stride, pads):
    return lax.conv_general_dilated(x, w, (stride, stride), pads, dimension_numbers=("NHWC", "HWIO", "NHWC"))


@pytest.mark.parametrize("images, filt, stride, pads", GEOMETRIES)
def test_conv2d_value_and_gradients_equal_xla_convolution(precision, images, filt, stride, pads):
    dtype = jnp.float32 if precision == "float32" else jnp.float64
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=images), dtype)
    w = jnp.asarray(rng.normal(size=(*filt[:2], images[-1], filt[2])), dtype)
    ref_out, ref_vjp = jax.vjp(lambda a, b: _reference(a, b, stride, pads), x, w)
    out, vjp = jax.vjp(lambda a, b: conv2d(a, b, stride, pads), x, w)
    ct = jnp.asarray(rng.normal(size=ref_out.shape), dtype)
    tol = 1e-5 if precision == "float32" else 1e-12
    assert out.shape == ref_out.shape and out.dtype == dtype
    for mine, ref in zip((out, *vjp(ct)), (ref_out, *ref_vjp(ct))):
        assert mine.shape == ref.shape and mine.dtype == dtype
        np.testing.assert_allclose(np.asarray(mine), np.asarray(ref), rtol=tol, atol=tol * float(jnp.max(jnp.abs(ref))))


def test_conv2d_gradient_of_gradient_matches_xla_convolution():
    """The VJP is itself made of convolutions, so reverse-over-reverse (a Hessian-vector product) works."""
    rng = np.random.default_rng(1)
    x, w = jnp.asarray(rng.normal(size=(2, 7, 6, 3))), jnp.asarray(rng.normal(size=(3, 3, 3, 4)))
    v = jnp.asarray(rng.normal(size=w.shape))

    def hvp(conv):
        loss = lambda b: jnp.sum(jnp.tanh(conv(x, b)))  # noqa: E731
        return jax.grad(lambda b: jnp.vdot(jax.grad(loss)(b), v))(w)

    np.testing.assert_allclose(hvp(lambda a, b: conv2d(a, b, 2, ((1, 1), (1, 1)))),
                               hvp(lambda a, b: _reference(a, b, 2, ((1, 1), (1, 1)))), rtol=1e-10, atol=1e-10)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's convolution emission is what is checked")
@pytest.mark.parametrize("stride", [1, 2])
def test_conv2d_gradients_inside_a_scan_compile_to_library_convolutions(float32, stride):
    """In a ``lax.scan`` body XLA:CPU does not canonicalise autodiff's convolution gradients and emits
    them as loop nests (``wrapped_convolution`` computations); conv2d's gradients are canonical."""
    x = jnp.ones((4, 8, 8, 16), jnp.float32)
    w = jnp.ones((3, 3, 16, 16), jnp.float32)

    def step(carry, _):
        a, b = carry
        ga, gb = jax.grad(lambda a, b: jnp.sum(jnp.sin(conv2d(a, b, stride, ((1, 1), (1, 1))))), argnums=(0, 1))(a, b)
        return (a - 1e-3 * ga, b - 1e-3 * gb), None

    hlo = jax.jit(lambda a, b: lax.scan(step, (a, b), None, length=3)[0]).lower(x, w).compile().as_text()
    assert hlo.count("convolution(") >= 3  # forward, input and filter gradients
    assert "wrapped_convolution" not in hlo
