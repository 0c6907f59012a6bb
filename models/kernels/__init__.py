"""Kernel algebra and structured kernels. Every kernel is an immutable JAX pytree."""

from models.kernels.base import Fixed, Kernel, Product, Scaled, Sum, hyper, kernel_class, static, sum_kernels
from models.kernels.stationary import RBF, SquaredExponential, Stationary, scaled_sqdist

__all__ = [
    "Fixed",
    "Kernel",
    "Product",
    "RBF",
    "Scaled",
    "SquaredExponential",
    "Stationary",
    "Sum",
    "hyper",
    "kernel_class",
    "scaled_sqdist",
    "static",
    "sum_kernels",
]
