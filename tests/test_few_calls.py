"""Programs built to run a few times trace the Kff paths that compile fastest, with the same values."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpzoo.inference.compilation import adaptive_jit
from gpzoo.models.kernels import SquaredExponential
from gpzoo.models.kernels.convolutional import Convolutional, few_calls


def _images(n=5, side=8, seed=0, dtype=jnp.float64):
    """Images with a constant background (so the distinct-patch sweep is taken on the CPU)."""
    rng = np.random.default_rng(seed)
    X = np.zeros((n, side, side))
    X[:, 2:5, 3:6] = rng.uniform(size=(n, 3, 3))
    return jnp.asarray(X.reshape(n, -1), dtype)


def _sweep_ops(kernel, X) -> tuple[int, float]:
    """(sort operations in the traced program, its value) of K_diag in a program traced now (a new
    function each time, so no trace is reused; the kernel's own nested program is cached)."""
    lowered = jax.jit(lambda X: kernel.K_diag(X)).lower(X)
    return lowered.as_text().count("stablehlo.sort"), lowered.compile()(X)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the distinct-patch sweep is the CPU default")
@pytest.mark.parametrize("dtype,rtol", [(jnp.float64, 1e-12), (jnp.float32, 1e-5)])
def test_few_calls_traces_the_band_sweep_with_the_same_values(dtype, rtol):
    kernel = Convolutional(SquaredExponential(lengthscale=0.7, variance=1.3), (8, 8), (3, 3))
    X = _images(dtype=dtype)
    sorts_default, value_default = _sweep_ops(kernel, X)
    with few_calls():
        sorts_few, value_few = _sweep_ops(kernel, X)
    _, value_after = _sweep_ops(kernel, X)  # the context is left as it was found
    assert sorts_default >= 1 and sorts_few == 0  # distinct sweep sorts the patches; the band sweep does not
    np.testing.assert_allclose(np.asarray(value_few), np.asarray(value_default), rtol=rtol)
    np.testing.assert_array_equal(np.asarray(value_after), np.asarray(value_default))


def test_quick_builds_are_traced_for_few_calls_and_optimised_ones_are_not():
    kernel = Convolutional(SquaredExponential(), (8, 8), (3, 3))
    X = _images()

    @adaptive_jit
    def sorts(X):
        return kernel.K_diag(X)

    quick = sorts.quick.lower(X).as_text().count("stablehlo.sort")
    optimised = sorts.optimised.lower(X).as_text().count("stablehlo.sort")
    assert quick == 0
    assert optimised == (1 if jax.default_backend() == "cpu" else 0)
    np.testing.assert_allclose(np.asarray(sorts.quick(X)), np.asarray(sorts(X)), rtol=1e-12)
