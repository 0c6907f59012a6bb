"""gpzoo: a model zoo of structured-kernel Gaussian processes on NumPyro and JAX.

The short public face::

    import gpzoo
    spec = gpzoo.zoo.get("weighted-conv", image_shape=(28, 28), task="binary")
    res  = gpzoo.fit(spec, X, y, steps=2000, batch_size=100)
    pred = gpzoo.predict(res, X_test)
    elbo = gpzoo.evaluate_elbo(res)
    cmp  = gpzoo.compare("rectangles", ["svgp-rbf", "conv"], seeds=[0, 1], backend="ray")
    found = gpzoo.search(x, y, depth=3)             # kernel structure search (SE, Per, Lin, RQ, +, ×, CP)
    draws = gpzoo.sample(spec, X, y, num_chains=4)  # NUTS: hyperparameters and whitened inducing outputs

The three subpackages hold the rest: :mod:`gpzoo.models` (kernels, likelihoods, the zoo),
:mod:`gpzoo.inference` (inducing variables, guides, fitting) and :mod:`gpzoo.analysis`
(DataTree export, calibration, comparison, reports, data sets). ``fit``, ``predict`` and the
other JAX-heavy names load on first use, so ``import gpzoo`` and ``gpzoo --version`` stay fast.
"""

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("gpzoo")
except PackageNotFoundError:  # pragma: no cover - running from an uninstalled tree
    __version__ = "0+unknown"

#: Public name -> module that defines it (imported on first access).
_PUBLIC = {
    "zoo": "gpzoo.models.zoo",
    "kernels": "gpzoo.models.kernels",
    "likelihoods": "gpzoo.models.likelihoods",
    "fit": "gpzoo.inference",
    "predict": "gpzoo.inference",
    "evaluate_elbo": "gpzoo.inference",
    "FitResult": "gpzoo.inference",
    "Prediction": "gpzoo.inference",
    "ElboEstimate": "gpzoo.inference",
    "save": "gpzoo.inference",
    "load": "gpzoo.inference",
    "compare": "gpzoo.analysis",
    "to_datatree": "gpzoo.analysis",
    "compare_elbo": "gpzoo.analysis",
    "calibration": "gpzoo.analysis",
    "datasets": "gpzoo.analysis",
    "report": "gpzoo.analysis",
    "search": "gpzoo.analysis",
    "sample": "gpzoo.inference.mcmc",
    "SampleResult": "gpzoo.inference.mcmc",
}
_MODULES = {"zoo", "kernels", "likelihoods"}

__all__ = ["__version__", *sorted(_PUBLIC)]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'gpzoo' has no attribute {name!r}")
    module = import_module(_PUBLIC[name])
    value = module if name in _MODULES else getattr(module, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *_PUBLIC})
