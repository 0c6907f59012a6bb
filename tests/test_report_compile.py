"""The report phase's ahead-of-time compilation (inference.compilation.AheadOfTime): every program
the report runs is compiled once, before its first call, and the report is the same with or
without it; the report read back from disk (rebuild_report) is the report written in memory."""

from __future__ import annotations

import collections
import logging
import re

import jax
import matplotlib
import numpy as np
import pytest
import xarray as xr

from gpzoo.analysis.compare import elbo_estimates, submit_elbo_programs
from gpzoo.analysis.datatree import submit_datatree_programs, to_datatree
from gpzoo.analysis.report import rebuild_report, report
from gpzoo.inference.compilation import AheadOfTime
from gpzoo.inference.fit import fit
from gpzoo.inference.io import load, save
from gpzoo.models import zoo
from gpzoo.models.errors import InvalidArgumentError

matplotlib.use("Agg")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")  # Pareto k

REPORT_PROGRAMS = ("_draw_inducing", "_pointwise_chunk", "_moments", "_ell_and_kl")


def _binary(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3.0, 3.0, (n, 1))
    return X, (rng.uniform(size=n) < 1 / (1 + np.exp(-3 * X[:, 0]))).astype(np.int64)


class _Compiles(logging.Handler):
    """Counts XLA compilations by program name while installed (``jax.log_compiles``)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.counts = collections.Counter()

    def emit(self, record):
        found = re.search(r"Finished XLA compilation of jit\((\w+)\)", record.getMessage())
        if found:
            self.counts[found.group(1)] += 1

    def __enter__(self):
        self._logger = logging.getLogger("jax._src.dispatch")
        self._level = self._logger.level
        self._logger.addHandler(self)
        self._logger.setLevel(logging.DEBUG)
        self._log = jax.log_compiles(True)
        self._log.__enter__()
        return self

    def __exit__(self, *exc):
        self._log.__exit__(*exc)
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)
        return False

    def report_programs(self) -> dict[str, int]:
        return {name: self.counts[name] for name in REPORT_PROGRAMS}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A small binary SVGP fitted once and saved; every ``load`` of it is a fresh family with no compiled program."""
    X, y = _binary(30, 0)
    path = tmp_path_factory.mktemp("fit") / "m"
    save(fit(zoo.get("svgp-rbf", input_dim=1, task="binary", num_inducing=5), X, y, steps=30, progress=False), path)
    return path


@pytest.mark.usefixtures("precision")
def test_every_report_program_compiles_once_ahead_of_its_call(saved):
    X_test, y_test = _binary(15, 1)
    res = load(saved)  # a fresh family: none of its programs is compiled yet
    with _Compiles() as ahead, AheadOfTime(2) as aot:
        submit_elbo_programs(aot, "m", res, num_samples=4, seed=0)
        submit_datatree_programs(aot, "m", res, X_test, y_test, num_draws=30, seed=0)
        aot.wait("m")
    # pointwise: 30 training and 15 test rows are two chunk shapes
    assert ahead.report_programs() == {"_draw_inducing": 1, "_pointwise_chunk": 2, "_moments": 1, "_ell_and_kl": 1}
    with _Compiles() as later:
        dt = to_datatree(res, X_test, y_test, num_draws=30, seed=0)
        estimate = elbo_estimates({"m": res}, num_samples=4, seed=0)["m"]
    assert later.report_programs() == dict.fromkeys(REPORT_PROGRAMS, 0)  # all found compiled
    assert np.isfinite(estimate["elbo"]) and dt["log_likelihood"]["y"].shape == (1, 30, 30)


def test_a_program_that_does_not_lower_is_left_to_its_first_call():
    broken = jax.jit(lambda x: x.undefined_attribute)
    with AheadOfTime(1) as aot:
        aot.submit("t", broken, np.zeros(3))  # no error here ...
        aot.wait("t")
    with pytest.raises(AttributeError, match="undefined_attribute"):  # ... but where the program is called
        broken(np.zeros(3))
    with _Compiles() as compiles, AheadOfTime(0) as off:  # workers=0: nothing is compiled ahead
        off.submit("t", jax.jit(lambda x: x + 1), np.zeros(3))
        off.wait("t")
    assert compiles.counts["<lambda>"] == 0


def _report_files(out):
    """Every file of a report directory but report.json, with the creation times blanked."""
    files = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file() and p.name != "report.json"):
        if path.suffix == ".nc":
            files[path.relative_to(out)] = xr.open_datatree(path).load()
        else:
            text = path.read_bytes()
            files[path.relative_to(out)] = re.sub(rb"created [0-9T:+-]+", b"created", text)
    return files


def _same_trees(a: xr.DataTree, b: xr.DataTree) -> bool:
    return all(a[g].to_dataset().equals(b[g].to_dataset()) for g in a.groups) and set(a.groups) == set(b.groups)


def test_report_is_the_same_with_and_without_ahead_of_time_compilation(saved, tmp_path, float32):
    """Bit for bit (float32, the library default): tables, Markdown, HTML, figures and DataTree values;
    and rebuild_report from the files on disk writes the same report as report() did from memory."""
    X_test, y_test = _binary(20, 3)
    outputs = {}
    for workers in (0, 2):
        results = {"a": load(saved)}  # fresh families: each report compiles its own programs
        out = tmp_path / f"report{workers}"
        report(results, out, X_test=X_test, y_test=y_test, num_draws=30, num_elbo_samples=4, compile_workers=workers)
        outputs[workers] = _report_files(out)
    assert outputs[0].keys() == outputs[2].keys()
    for name, value in outputs[0].items():
        assert _same_trees(value, outputs[2][name]) if name.suffix == ".nc" else value == outputs[2][name], name
    rebuild_report(tmp_path / "report2")  # reads the DataTrees back from models/*.nc
    rebuilt = _report_files(tmp_path / "report2")
    for name, value in outputs[2].items():
        if name.suffix != ".nc":
            assert rebuilt[name] == value, name


def test_report_checks_compile_workers(tmp_path):
    with pytest.raises(InvalidArgumentError, match="compile_workers"):
        report({"a": object()}, tmp_path, X_test=np.zeros((2, 1)), y_test=np.zeros(2), compile_workers=-1)


def test_idle_compile_workers_follows_the_load_average(monkeypatch):
    import os  # noqa: PLC0415

    from gpzoo.inference import compilation  # noqa: PLC0415

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    for load, expected in ((0.1, 1), (0.0, 2), (0.9, 1), (1.2, 0), (11.0, 0)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert compilation.idle_compile_workers() == expected, load
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert compilation.idle_compile_workers(most=1) == 1

    def unavailable():
        raise OSError("no load average")

    monkeypatch.setattr(os, "getloadavg", unavailable)
    assert compilation.idle_compile_workers() == 0
