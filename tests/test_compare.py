"""gpzoo.analysis.compare: ELBO and PSIS-LOO rankings, their disagreement, the trace figure."""

from __future__ import annotations

import dataclasses

import arviz as az
import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from gpzoo.analysis.compare import (
    compare_elbo,
    compare_loo,
    elbo_table,
    elbo_traces_figure,
    ranking_disagreements,
)
from gpzoo.analysis.datatree import to_datatree
from gpzoo.inference.fit import fit
from gpzoo.models import kernels, likelihoods, zoo
from gpzoo.models.errors import InvalidArgumentError
from gpzoo.models.zoo import ModelSpec

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _sin(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3.0, 3.0, (n, 1))  # [N, 1]
    return X, np.sin(2.0 * X[:, 0]) + 0.1 * rng.normal(size=n)  # [N]


@pytest.fixture(scope="module")
def fits():
    """A sensible RBF model and a clearly misspecified linear one on the same sine data."""
    X, y = _sin(60, 0)
    rbf = zoo.get("svgp-rbf", input_dim=1, num_inducing=10, lengthscale=0.7)
    linear = ModelSpec(name="linear", kernel=kernels.Linear(variance=1.0),
                       likelihood=likelihoods.Gaussian(noise_variance=0.1), num_inducing=10)
    return {name: fit(spec, X, y, steps=150, learning_rate=0.05, progress=False)
            for name, spec in (("linear", linear), ("rbf", rbf))}


def test_correct_model_ranks_first_by_elbo_and_by_loo(fits):
    table = compare_elbo(fits, num_samples=4)
    assert list(table.index) == ["rbf", "linear"]
    assert table.loc["rbf", "rank"] == 0 and table.loc["rbf", "d_elbo"] == 0.0
    assert table.loc["linear", "d_elbo"] > 10.0  # clearly worse, far beyond the MC error (0: analytic)
    np.testing.assert_allclose(table["elbo_per_datum"], table["elbo"] / 60)
    assert set(table.columns) >= {"elbo", "elbo_se", "d_elbo", "d_elbo_se", "elbo_per_datum"}

    X_test, y_test = _sin(20, 1)
    trees = {name: to_datatree(res, X_test, y_test, num_draws=100) for name, res in fits.items()}
    loo = compare_loo(trees)
    assert list(loo.sort_values("rank").index) == ["rbf", "linear"]
    plain = az.compare(trees)  # ArviZ's own comparison of the saved trees, no arguments (draws of q as posterior draws)
    assert list(plain.index) == ["rbf", "linear"] and plain.loc["linear", "elpd_diff"] < 0
    assert {"pareto_k_max", "num_bad_k", "good_k", "elpd_test"} <= set(loo.columns)
    assert loo.loc["rbf", "elpd_test"] > loo.loc["linear", "elpd_test"]
    assert ranking_disagreements(table, loo) == []


def test_compare_elbo_needs_common_data(fits):
    X, y = _sin(30, 7)
    other = dataclasses.replace(fits["rbf"], X_train=X, y_train=y, num_data=30)  # as if fitted on other data
    with pytest.raises(InvalidArgumentError, match="different data"):
        compare_elbo({"a": fits["rbf"], "b": other})
    table = compare_elbo({"a": fits["rbf"], "b": other}, X, y)  # explicit common data is fine
    assert table["num_data"].tolist() == [30, 30]
    with pytest.raises(InvalidArgumentError, match="results"):
        compare_elbo({})


def test_elbo_table_ranks_and_propagates_errors():
    table = elbo_table({
        "a": {"elbo": -120.0, "elbo_se": 3.0, "num_data": 100},
        "b": {"elbo": -100.0, "elbo_se": 4.0, "num_data": 100},
    })
    assert list(table.index) == ["b", "a"] and table["rank"].tolist() == [0, 1]
    assert table.loc["a", "d_elbo"] == 20.0 and table.loc["a", "d_elbo_se"] == pytest.approx(5.0)
    assert table.loc["b", "elbo_per_datum"] == -1.0


def test_ranking_disagreements_names_both_orders():
    elbo = elbo_table({"conv": {"elbo": -10.0, "elbo_se": 0.1, "num_data": 10},
                       "rbf": {"elbo": -20.0, "elbo_se": 0.1, "num_data": 10}})
    loo = pd.DataFrame({"rank": [0, 1], "elpd": [-5.0, -8.0], "se": [1.0, 1.0], "dse": [0.0, 0.5]},
                       index=pd.Index(["rbf", "conv"], name="model"))
    (message,) = ranking_disagreements(elbo, loo)
    assert "ELBO prefers conv over rbf" in message and "PSIS-LOO prefers rbf over conv" in message
    assert "3.00 ± 0.50" in message
    agree = loo.rename(index={"rbf": "conv", "conv": "rbf"})
    assert ranking_disagreements(elbo, agree) == []


def test_elbo_traces_figure(fits):
    X_test, y_test = _sin(20, 1)
    tree = to_datatree(fits["rbf"], X_test, y_test, num_draws=100)  # the shapes of the test above: no recompilation
    from_tree = elbo_traces_figure({"rbf": tree}).axes[0].get_lines()[0].get_ydata()
    np.testing.assert_allclose(from_tree, fits["rbf"].objective_history / 60)  # the saved trace, per datum
    fig = elbo_traces_figure(fits)
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert [line.get_label() for line in ax.get_lines()] == ["linear", "rbf"]
    assert len(ax.get_lines()[0].get_xdata()) == 150


def test_report_shows_parameter_tables_and_rebuilds_them(fits, tmp_path):
    """The report (HTML and Markdown) shows each model's FitResult.summary() table, also after a rebuild from disk."""
    from gpzoo.analysis.report import rebuild_report, report  # noqa: PLC0415

    X_test, y_test = _sin(20, 1)
    html_path = report(fits, tmp_path, X_test=X_test, y_test=y_test, num_draws=100, num_elbo_samples=4)
    first = html_path.read_text(encoding="utf-8")
    for name, res in fits.items():
        assert res.header() in first
    assert "<h2>Parameters</h2>" in first and "kernel.lengthscale" in first and "q_sqrt" in first
    assert "## Parameters" in (tmp_path / "report.md").read_text(encoding="utf-8")
    (tmp_path / "report.html").unlink()
    assert rebuild_report(tmp_path).read_text(encoding="utf-8").count("<h3>") == len(fits)
