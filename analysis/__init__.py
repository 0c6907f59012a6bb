"""Evaluation side of gpzoo: what the results mean.

>>> from gpzoo.analysis import to_datatree, compare_elbo, calibration, report, datasets

``to_datatree`` turns a fit into an ArviZ DataTree, ``compare_elbo`` ranks fits by ELBO
(``analysis.compare`` also has PSIS-LOO), ``calibration`` scores predictions, ``report`` writes
an HTML/Markdown/CSV report (``analysis.report.rebuild_report`` regenerates one from disk) and
``datasets`` loads the offline datasets. ``compare`` fits several models (each once per seed,
in this process or on Ray) and returns their comparison (:mod:`gpzoo.analysis.comparison`).

``report`` here is the *function* (its module is ``analysis.report``); it is bound eagerly so the
name means the same whatever was imported first. ``compare`` is the function of
``analysis.comparison``; the ELBO/PSIS-LOO module ``analysis.compare`` stays importable by its
full name (``from gpzoo.analysis.compare import compare_heldout``) without rebinding it. The JAX-heavy ``to_datatree`` and
``compare_elbo`` load on first use, so ``import gpzoo.analysis.datasets`` stays light.

``numpyro`` is imported here, plainly and first: ``arviz_base`` registers a *lazy* ``numpyro``
module (``lazy_loader``), and a first ``import numpyro.distributions`` after ``import arviz``
then executes ``numpyro.distributions`` twice, leaving ``numpyro.distributions.distribution``
unset so that ``numpyro.factor`` fails. A plain ``import numpyro`` loads it properly.
"""

import sys
import types

import numpyro  # noqa: F401 - see below

from gpzoo.analysis import calibration, datasets
from gpzoo.analysis.comparison import compare
from gpzoo.analysis.report import report

__all__ = ["calibration", "compare", "compare_elbo", "datasets", "report", "to_datatree"]


class _Package(types.ModuleType):
    """This package, whose name ``compare`` stays the function when the submodule
    ``analysis.compare`` is first imported (the import system binds a submodule on its parent)."""

    def __setattr__(self, name, value):
        if name == "compare" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

_LAZY = {"to_datatree": "gpzoo.analysis.datatree", "compare_elbo": "gpzoo.analysis.compare"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib  # noqa: PLC0415

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'analysis' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])
