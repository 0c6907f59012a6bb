"""The report phase's programs: one pass per chunk of rows gives the pointwise draws, the
predictive moments and the ELBO of a model (inference.posterior.draws_and_summaries), equal to the
separate functions; every program the report runs is compiled once, before its first call
(inference.compilation.AheadOfTime), and the report is the same with or without it; the report
read back from disk (rebuild_report) is the report written in memory."""

from __future__ import annotations

import collections
import logging
import re

import jax
import matplotlib
import numpy as np
import pandas as pd
import pytest
import xarray as xr

from gpzoo.analysis.compare import compare_loo, elbo_estimates, loo_approximate, submit_elbo_programs
from gpzoo.analysis.datatree import datatree_and_elbo, submit_datatree_programs, to_datatree
from gpzoo.analysis.report import rebuild_report, report
from gpzoo.inference.compilation import AheadOfTime
from gpzoo.inference.fit import evaluate_elbo, fit, predict
from gpzoo.inference.io import load, save
from gpzoo.inference.posterior import draws_and_summaries, pointwise_given_u, sample_inducing, summaries_supported
from gpzoo.models import likelihoods, zoo
from gpzoo.models.errors import InvalidArgumentError

matplotlib.use("Agg")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::RuntimeWarning")  # Pareto k

REPORT_PROGRAMS = ("_draw_inducing", "_summary_chunk", "_pointwise_chunk", "_moments", "_mixture_moments", "_ell_and_kl")


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
    """A small binary SVGP fitted once and saved."""
    X, y = _binary(30, 0)
    path = tmp_path_factory.mktemp("fit") / "m"
    save(fit(zoo.get("svgp-rbf", input_dim=1, task="binary", num_inducing=5), X, y, steps=30, progress=False), path)
    return path


@pytest.fixture(scope="module")
def saved_softmax(tmp_path_factory):
    """A 3-class SVGP with a Monte Carlo (softmax) data term: its report takes the separate programs."""
    rng = np.random.default_rng(4)
    X = rng.uniform(-3.0, 3.0, (30, 1))
    y = np.digitize(X[:, 0], [-1.0, 1.0]).astype(np.int64)
    spec = zoo.get("svgp-rbf", input_dim=1, task="multiclass", num_classes=3, num_inducing=5,
                   likelihood=likelihoods.Softmax(num_classes=3, num_mc_samples=8))
    path = tmp_path_factory.mktemp("fit") / "softmax"
    save(fit(spec, X, y, steps=20, progress=False), path)
    return path, rng.uniform(-3.0, 3.0, (12, 1))


@pytest.mark.usefixtures("precision")
def test_every_report_program_compiles_once_ahead_of_its_call(saved):
    X_test, y_test = _binary(15, 1)
    res = load(saved)
    jax.clear_caches()  # none of its programs is compiled yet
    assert summaries_supported(res)  # analytic (probit quadrature) data term, type-II hyperparameters
    with _Compiles() as ahead, AheadOfTime(2) as aot:
        submit_elbo_programs(aot, "m", res, num_samples=4, seed=0)
        submit_datatree_programs(aot, "m", res, X_test, y_test, num_draws=30, seed=0)
        aot.wait("m")
    # one program per padded block shape (30 training and 15 test rows: both in 64-row blocks) for draws,
    # moments and ELBO terms
    assert ahead.report_programs() == {**dict.fromkeys(REPORT_PROGRAMS, 0), "_summary_chunk": 1, "_ell_and_kl": 1}
    with _Compiles() as later:
        dt = to_datatree(res, X_test, y_test, num_draws=30, seed=0)
        estimate = elbo_estimates({"m": res}, num_samples=4, seed=0)["m"]
    assert later.report_programs() == dict.fromkeys(REPORT_PROGRAMS, 0)  # all found compiled
    assert np.isfinite(estimate["elbo"]) and dt["log_likelihood"]["y"].shape == (1, 30, 30)


def test_separate_programs_of_a_monte_carlo_model_compile_ahead_too(saved_softmax):
    path, X_test = saved_softmax
    y_test = np.digitize(X_test[:, 0], [-1.0, 1.0]).astype(np.int64)
    res = load(path)
    jax.clear_caches()  # none of its programs is compiled yet
    assert not summaries_supported(res)  # softmax: Monte Carlo expectations
    with _Compiles() as ahead, AheadOfTime(2) as aot:
        submit_elbo_programs(aot, "m", res, num_samples=3, seed=0)
        submit_datatree_programs(aot, "m", res, X_test, y_test, num_draws=30, seed=0)
        aot.wait("m")
    # 30 training and 12 test rows share one 64-row block shape
    assert ahead.report_programs() == {**dict.fromkeys(REPORT_PROGRAMS, 0), "_draw_inducing": 1, "_pointwise_chunk": 1,
                                       "_moments": 1, "_ell_and_kl": 1}
    with _Compiles() as later:
        dt, elbo = datatree_and_elbo(res, X_test, y_test, num_draws=30, seed=0)
        estimate = evaluate_elbo(res, num_samples=3, seed=0)
    assert later.report_programs() == dict.fromkeys(REPORT_PROGRAMS, 0)
    assert elbo is None and estimate.num_samples == 3 and estimate.stderr > 0  # Monte Carlo: estimated separately
    assert dt["predictions_moments"]["probs"].shape == (12, 3)


@pytest.mark.usefixtures("precision")
def test_one_pass_equals_sample_pointwise_predict_and_evaluate_elbo(saved):
    """draws_and_summaries computes what sample_inducing, pointwise_given_u, predict and evaluate_elbo
    compute separately (same keys: the same replicates; values to rounding, as XLA fuses the one
    program differently)."""
    X_test, y_test = _binary(300, 5)  # 300 rows: two chunks, the second padded
    res = load(saved)
    tight = 1e-12 if jax.config.jax_enable_x64 else 2e-5
    key_u, key, key_train = jax.random.PRNGKey(2), jax.random.PRNGKey(3), jax.random.PRNGKey(5)
    key_moments = jax.random.split(jax.random.PRNGKey(0), 3)[2]  # predict(res, X, seed=0)'s
    draws, (found, on_train) = draws_and_summaries(res, 40, key_u, [(X_test, y_test, key), (res.X_train, res.y_train, key_train)],
                                                   key_moments)
    alone = sample_inducing(res, 40, key_u)
    for name in ("u", "log_q", "log_prior"):
        np.testing.assert_allclose(getattr(draws, name), getattr(alone, name), rtol=tight, atol=tight, err_msg=name)
    pointwise = pointwise_given_u(res, X_test, y_test, draws, key)
    np.testing.assert_allclose(found.pointwise.log_lik, pointwise.log_lik, rtol=tight, atol=tight)
    np.testing.assert_array_equal(found.pointwise.y_rep, pointwise.y_rep)
    pred = predict(res, X_test, seed=0, batch_size=256)  # the same chunks and keys as the one pass
    for name in ("f_mean", "f_var", "y_mean", "y_var", "probs"):
        np.testing.assert_allclose(getattr(found, name), getattr(pred, name), rtol=tight, atol=tight, err_msg=name)
    elbo = evaluate_elbo(res)
    assert elbo.stderr == 0.0 and elbo.num_samples == 1
    assert on_train.expected_log_lik == pytest.approx(elbo.expected_log_lik, rel=tight)
    assert on_train.kl == pytest.approx(elbo.kl, rel=tight)
    dt, estimate = datatree_and_elbo(res, X_test, y_test, num_draws=40, seed=0)
    assert estimate.elbo == pytest.approx(elbo.elbo, rel=tight) and estimate.stderr == 0.0
    assert _same_trees(to_datatree(res, X_test, y_test, num_draws=40, seed=0), dt)
    # PSIS-LOO computed ahead (as report() does, model by model) ranks as computed in compare_loo
    pd.testing.assert_frame_equal(compare_loo({"m": dt, "n": dt}, loos={"m": loo_approximate(dt)}),
                                  compare_loo({"m": dt, "n": dt}))
    with pytest.raises(InvalidArgumentError, match="loos"):
        compare_loo({"m": dt}, loos={"other": loo_approximate(dt)})
    assert datatree_and_elbo(res, X_test, y_test, num_draws=40, include_train=False)[1] is None  # no training pass


def test_one_pass_refuses_a_monte_carlo_model(saved_softmax):
    path, X_test = saved_softmax
    res = load(path)
    with pytest.raises(InvalidArgumentError, match="res"):
        draws_and_summaries(res, 25, jax.random.PRNGKey(0), [(X_test, np.zeros(12, np.int64), jax.random.PRNGKey(1))],
                            jax.random.PRNGKey(2))


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
        results = {"a": load(saved)}
        jax.clear_caches()  # each report compiles its own programs
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


def test_idle_compile_workers_counts_idle_cores_now(monkeypatch):
    """Workers = idle cores (sampled now) less the calling thread's; the load average only where the
    CPU counters cannot be read (it still counts this process's fits that have just finished)."""
    import os  # noqa: PLC0415

    from gpzoo.inference import compilation  # noqa: PLC0415

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.7, 1.7, 1.7))  # right after a minute of fitting
    for idle, expected in ((2.0, 1), (1.8, 1), (1.7, 0), (0.3, 0), (0.0, 0), (7.5, 1)):
        monkeypatch.setattr(compilation, "idle_cores", lambda interval=0.1, idle=idle: idle)
        assert compilation.idle_compile_workers() == expected, idle
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setattr(compilation, "idle_cores", lambda interval=0.1: 8.0)
    assert compilation.idle_compile_workers() == 2 and compilation.idle_compile_workers(most=5) == 5
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(compilation, "idle_cores", lambda interval=0.1: None)  # no /proc/stat: the load average
    for load, expected in ((0.1, 1), (0.0, 2), (0.9, 1), (1.2, 0), (11.0, 0)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        assert compilation.idle_compile_workers() == expected, load

    def unavailable():
        raise OSError("no load average")

    monkeypatch.setattr(os, "getloadavg", unavailable)
    assert compilation.idle_compile_workers() == 0


def test_idle_cores_reads_the_cpu_counters(monkeypatch):
    from gpzoo.inference import compilation  # noqa: PLC0415

    samples = iter([(100, 1000, 2), (160, 1100, 2)])  # 60 of 100 ticks busy over 2 CPUs: 0.8 idle
    monkeypatch.setattr(compilation, "_cpu_times", lambda: next(samples))
    assert compilation.idle_cores(0.0) == pytest.approx(0.8)
    monkeypatch.undo()
    found = compilation._cpu_times()
    if found is None:
        pytest.skip("no /proc/stat on this platform")
    busy, total, cpus = found
    assert 0 <= busy <= total and cpus >= 1
    assert 0.0 <= compilation.idle_cores(0.05) <= cpus
