"""Evaluation side of gpzoo: what the results mean.

>>> from gpzoo.analysis import to_datatree, compare_elbo, calibration, report, datasets

``to_datatree`` turns a fit into an ArviZ DataTree, ``compare_elbo`` ranks fits by ELBO
(``analysis.compare`` also has PSIS-LOO), ``calibration`` scores predictions, ``report`` writes
an HTML/Markdown/CSV report (``analysis.report.rebuild_report`` regenerates one from disk) and
``datasets`` loads the offline datasets. ``compare`` fits several models (each once per seed,
in this process or on Ray) and returns their comparison (:mod:`gpzoo.analysis.comparison`).

Every public name, and every submodule reached as an attribute (``gpzoo.analysis.comparison``),
loads on first use: importing this package imports nothing heavy, so the ``gpzoo`` command
(:mod:`gpzoo.analysis.cli`, whose import runs this file first) answers ``--version`` and
``--help`` without importing JAX, NumPyro or matplotlib, and ``import gpzoo.analysis.datasets``
stays light.

``report`` is the *function* (its module is ``analysis.report``) and ``compare`` the function of
``analysis.comparison``, whatever was imported first: importing the submodules
``analysis.report`` or ``analysis.compare`` (ELBO/PSIS-LOO; ``from gpzoo.analysis.compare import
compare_heldout``) does not rebind these names to the modules.

The modules that import ``arviz_base`` (directly or through ``arviz``/``arviz_plots``) import
``numpyro`` plainly before it: ``arviz_base`` registers a *lazy* ``numpyro`` module
(``lazy_loader``) when NumPyro is not loaded yet, and a first ``import numpyro.distributions``
after that executes ``numpyro.distributions`` twice, leaving
``numpyro.distributions.distribution`` unset so that ``numpyro.factor`` fails.
"""

import sys
import types
from importlib import import_module
from importlib.util import find_spec

__all__ = ["calibration", "compare", "compare_elbo", "datasets", "report", "search", "to_datatree"]

#: Public name -> (module, attribute; None for the module itself), imported on first access.
_LAZY = {
    "calibration": ("gpzoo.analysis.calibration", None),
    "datasets": ("gpzoo.analysis.datasets", None),
    "compare": ("gpzoo.analysis.comparison", "compare"),
    "report": ("gpzoo.analysis.report", "report"),
    "to_datatree": ("gpzoo.analysis.datatree", "to_datatree"),
    "compare_elbo": ("gpzoo.analysis.compare", "compare_elbo"),
    "search": ("gpzoo.analysis.search", "search"),
}
#: Public names that are functions with a submodule of the same name.
_FUNCTIONS = ("compare", "report", "search")


class _Package(types.ModuleType):
    """This package, whose names ``compare`` and ``report`` stay the functions when the submodules
    ``analysis.compare`` and ``analysis.report`` are imported (the import system binds a submodule
    on its parent)."""

    def __setattr__(self, name, value):
        if name in _FUNCTIONS and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str):
    if name in _LAZY:
        module_name, attribute = _LAZY[name]
        module = import_module(module_name)
        value = module if attribute is None else getattr(module, attribute)
        globals()[name] = value
        return value
    if not name.startswith("_") and find_spec(f"{__name__}.{name}") is not None:
        return import_module(f"{__name__}.{name}")  # a submodule: the import binds it here
    raise AttributeError(f"module 'gpzoo.analysis' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_LAZY})
