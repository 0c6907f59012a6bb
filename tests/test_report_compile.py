"""The report phase's programs: one pass per chunk of rows gives the pointwise draws, the
predictive moments and the ELBO of a model (inference.posterior.draws_and_summaries), equal to the
separate functions; every program the report runs is compiled once per model structure (a second
report of a loaded model compiles none), and the report is the same on fresh and on reused
programs; the report read back from disk (rebuild_report) is the report written in memory."""

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

from gpzoo.analysis.compare import compare_loo, elbo_estimates, loo_approximate
from gpzoo.analysis.datatree import datatree_and_elbo, to_datatree
from gpzoo.analysis.report import rebuild_report, report
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
def test_every_report_program_compiles_once_per_structure(saved):
    X_test, y_test = _binary(15, 1)
    res = load(saved)
    jax.clear_caches()  # none of its programs is compiled yet
    assert summaries_supported(res)  # analytic (probit quadrature) data term, type-II hyperparameters
    with _Compiles() as first:
        dt = to_datatree(res, X_test, y_test, num_draws=30, seed=0)
        estimate = elbo_estimates({"m": res}, num_samples=4, seed=0)["m"]
    # one program per padded block shape (30 training and 15 test rows: both in 64-row blocks) for draws,
    # moments and ELBO terms; the ELBO's own program
    assert first.report_programs() == {**dict.fromkeys(REPORT_PROGRAMS, 0), "_summary_chunk": 1, "_ell_and_kl": 1}
    assert np.isfinite(estimate["elbo"]) and dt["log_likelihood"]["y"].shape == (1, 30, 30)
    X_other, y_other = _binary(20, 2)
    with _Compiles() as again:  # another load of the model, another test set and seed: all found compiled
        to_datatree(load(saved), X_other, y_other, num_draws=30, seed=1)
        elbo_estimates({"m": load(saved)}, num_samples=4, seed=1)
    assert again.report_programs() == dict.fromkeys(REPORT_PROGRAMS, 0)


def test_separate_programs_of_a_monte_carlo_model_compile_once_too(saved_softmax):
    path, X_test = saved_softmax
    y_test = np.digitize(X_test[:, 0], [-1.0, 1.0]).astype(np.int64)
    res = load(path)
    jax.clear_caches()  # none of its programs is compiled yet
    assert not summaries_supported(res)  # softmax: Monte Carlo expectations
    with _Compiles() as first:
        dt, elbo = datatree_and_elbo(res, X_test, y_test, num_draws=30, seed=0)
        estimate = evaluate_elbo(res, num_samples=3, seed=0)
    # 30 training and 12 test rows share one 64-row block shape
    assert first.report_programs() == {**dict.fromkeys(REPORT_PROGRAMS, 0), "_draw_inducing": 1, "_pointwise_chunk": 1,
                                       "_moments": 1, "_ell_and_kl": 1}
    assert elbo is None and estimate.num_samples == 3 and estimate.stderr > 0  # Monte Carlo: estimated separately
    assert dt["predictions_moments"]["probs"].shape == (12, 3)
    with _Compiles() as again:
        datatree_and_elbo(load(path), X_test[:7], y_test[:7], num_draws=30, seed=2)
        evaluate_elbo(load(path), num_samples=3, seed=2)
    assert again.report_programs() == dict.fromkeys(REPORT_PROGRAMS, 0)


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


def test_report_is_the_same_on_fresh_and_on_reused_programs(saved, tmp_path, float32):
    """Bit for bit (float32, the library default): tables, Markdown, HTML, figures and DataTree values
    of a report on freshly compiled programs and of a second one on the same programs; and
    rebuild_report from the files on disk writes the same report as report() did from memory."""
    X_test, y_test = _binary(20, 3)
    outputs = {}
    jax.clear_caches()
    for run in (0, 2):  # 0: programs compiled for this report; 2: the same programs again
        results = {"a": load(saved)}
        out = tmp_path / f"report{run}"
        report(results, out, X_test=X_test, y_test=y_test, num_draws=30, num_elbo_samples=4)
        outputs[run] = _report_files(out)
    assert outputs[0].keys() == outputs[2].keys()
    for name, value in outputs[0].items():
        assert _same_trees(value, outputs[2][name]) if name.suffix == ".nc" else value == outputs[2][name], name
    rebuild_report(tmp_path / "report2")  # reads the DataTrees back from models/*.nc
    rebuilt = _report_files(tmp_path / "report2")
    for name, value in outputs[2].items():
        if name.suffix != ".nc":
            assert rebuilt[name] == value, name
