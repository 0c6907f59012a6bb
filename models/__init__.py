"""Generative side of gpzoo: kernels (priors), likelihoods and the model zoo."""

import sys

import numpyro.distributions as _distributions

# When arviz (arviz_base registers a lazy ``numpyro`` module) is imported before NumPyro, the
# submodule ``numpyro.distributions.distribution`` is loaded but never bound as an attribute of its
# package, and NumPyro's own ``numpyro.factor`` and AutoGuides, which read it as one, fail with
# AttributeError. Bind it (the same module object: its classes are the ones the package exports).
if not hasattr(_distributions, "distribution") and "numpyro.distributions.distribution" in sys.modules:
    _distributions.distribution = sys.modules["numpyro.distributions.distribution"]
