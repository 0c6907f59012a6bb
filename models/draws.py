"""Random draws of any shape, from programs that compile as fast as flat draws.

``jax.random`` makes the random bits of a multi-dimensional shape with a program whose XLA compile
time grows with the shape's rank: on this project's CPU, a ``[3, 3, 16, 16]`` standard normal takes
about 3 s to compile (inside ``jit`` too) against 0.16 s for the same 2,304 numbers drawn flat, a
``[1000, 20, 10]`` one 0.9 s against 0.16 s. The values do not depend on the shape the bits are asked
for: a flat draw reshaped is the shaped draw, bit for bit (a test checks this). Every Monte Carlo
draw and random initialisation in gpzoo goes through these two functions.
"""

from __future__ import annotations

import math

import jax

__all__ = ["normal", "uniform"]


def normal(key, shape, dtype=float):
    """``jax.random.normal(key, shape, dtype)``, drawn flat and reshaped (the same values)."""
    shape = tuple(shape)
    return jax.random.normal(key, (math.prod(shape),), dtype).reshape(shape)


def uniform(key, shape, dtype=float, minval=0.0, maxval=1.0):
    """``jax.random.uniform(key, shape, dtype, minval, maxval)``, drawn flat and reshaped (the same values)."""
    shape = tuple(shape)
    return jax.random.uniform(key, (math.prod(shape),), dtype, minval, maxval).reshape(shape)
