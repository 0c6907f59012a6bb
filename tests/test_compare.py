"""gpzoo.analysis.compare: ELBO and PSIS-LOO rankings, their disagreement, the trace figure."""

from __future__ import annotations

import dataclasses
import html

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
    assert table.loc["linear", "d_elbo"] < -10.0  # clearly worse, far beyond the MC error (0: analytic); az.compare's sign
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
    assert table.loc["a", "d_elbo"] == -20.0 and table.loc["a", "d_elbo_se"] == pytest.approx(5.0)  # model − best
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
    # each table's header quotes the full-data ELBO ± s.e. of the ranking table, not the last step's value
    import json  # noqa: PLC0415

    from gpzoo.analysis.report import _as_estimate  # noqa: PLC0415

    headers = {}
    for name, res in fits.items():
        entry = json.loads((tmp_path / "models" / f"{name}.json").read_text(encoding="utf-8"))
        headers[name] = res.header(_as_estimate(entry["elbo"]))
        assert entry["header"] == headers[name] and html.escape(headers[name]) in first
        assert f"ELBO {entry['elbo']['elbo']:.6g} ± " in headers[name] and "(full data)" in headers[name]
    assert "<h2>Parameters</h2>" in first and "kernel.lengthscale" in first and "q_sqrt" in first
    markdown = (tmp_path / "report.md").read_text(encoding="utf-8")
    assert "## Parameters" in markdown
    # what a reader may not know, explained where it appears: signs, metrics, type-II, p_loo, good_k, PIT
    for term in ("ΔELBO and held-out Δelpd: each model's value minus the best model's", "RMSE: ", "NLL: ",
                 "Type-II (maximum likelihood)", "p_loo: ", "can be negative", "good_k: ", "PIT: "):
        assert term in markdown and html.escape(term) in first, term
    assert "ECE: " not in markdown  # regression: no classification metrics to explain
    headline = markdown.split("**")[1]  # the CLI prints this
    assert headline.startswith("Best: rbf, ahead of linear by held-out Δelpd ") and "--seeds" in headline
    (tmp_path / "report.html").unlink()
    rebuilt = rebuild_report(tmp_path).read_text(encoding="utf-8")
    assert all(rebuilt.count(f"<summary>{html.escape(headers[name])}</summary>") == 1 for name in fits)


def _heldout_tree(log_lik):
    """A DataTree holding only ``predictions_log_likelihood`` ``[chain=1, draw, obs_id]``."""
    import xarray as xr  # noqa: PLC0415

    ds = xr.Dataset({"y": (("chain", "draw", "obs_id"), np.asarray(log_lik)[None])})
    return xr.DataTree.from_dict({"predictions_log_likelihood": ds})


def test_compare_heldout_uses_paired_standard_errors():
    from gpzoo.analysis.compare import compare_heldout, heldout_pointwise, paired_heldout_difference  # noqa: PLC0415

    rng = np.random.default_rng(0)
    shared = rng.normal(-1.0, 1.0, 200)  # per-point difficulty both models see
    a = shared[None] + 0.05 * rng.normal(size=(30, 200)) + 0.02
    b = shared[None] + 0.05 * rng.normal(size=(30, 200))
    trees = {"b": _heldout_tree(b), "a": _heldout_tree(a)}
    table = compare_heldout(trees)
    pa, pb = (np.log(np.mean(np.exp(x), axis=0)) for x in (a, b))
    np.testing.assert_allclose(heldout_pointwise(trees["a"]), pa)
    assert list(table.index) == ["a", "b"] and list(table["rank"]) == [0, 1]
    np.testing.assert_allclose(table.loc["b", "elpd_diff"], pb.sum() - pa.sum())  # model − best, as az.compare
    np.testing.assert_allclose(table.loc["b", "dse"], np.sqrt(200) * np.std(pa - pb, ddof=1))
    # the shared difficulty cancels in the paired SE, not in the unpaired one
    assert table.loc["b", "dse"] < 0.1 * np.hypot(table.loc["a", "se"], table.loc["b", "se"])
    d, se = paired_heldout_difference(trees, "a", "b")
    assert d == pytest.approx(-table.loc["b", "elpd_diff"]) and se == pytest.approx(table.loc["b", "dse"])
    assert table.loc["a", "elpd_diff"] == 0 and table.loc["a", "dse"] == 0


def test_verdict_separates_agreement_noise_and_disagreement():
    from gpzoo.analysis.compare import Reversal, best_margin, heldout_reversals  # noqa: PLC0415
    from gpzoo.analysis.report import verdict  # noqa: PLC0415

    rng = np.random.default_rng(1)
    base = rng.normal(-1.0, 1.0, 300)
    trees = {"a": _heldout_tree(base[None] + 0.2), "b": _heldout_tree(base[None] + 0.001 * rng.normal(size=(1, 300)))}
    elbo = elbo_table({"a": {"elbo": -10.0, "elbo_se": 0.0, "num_data": 5}, "b": {"elbo": -20.0, "elbo_se": 0.0, "num_data": 5}})
    assert heldout_reversals(elbo, trees) == []  # both prefer a
    agree = best_margin({"a": {"elbo": -10.0, "elbo_se": 0.0}, "b": {"elbo": -20.0, "elbo_se": 0.0}}, trees)
    assert verdict(agree, [], {"a": True, "b": True})[2] == "clear"
    flipped = elbo_table({"a": {"elbo": -30.0, "elbo_se": 0.0, "num_data": 5}, "b": {"elbo": -20.0, "elbo_se": 0.0, "num_data": 5}})
    (reversal,) = heldout_reversals(flipped, trees)
    assert (reversal.elbo_prefers, reversal.other) == ("b", "a") and reversal.d_elbo == 10.0
    assert reversal.d_heldout == pytest.approx(0.2 * 300, rel=0.01) and reversal.significant
    margin = best_margin({"a": {"elbo": -30.0, "elbo_se": 0.0}, "b": {"elbo": -20.0, "elbo_se": 0.0}}, trees)
    assert (margin.best, margin.runner_up, margin.d_elbo) == ("a", "b", -10.0)
    headline, items, kind = verdict(margin, [reversal])
    assert kind == "disagree" and "disagree" in headline and items == [reversal.sentence()]
    assert "the ELBO prefers b" in headline
    noise = Reversal("b", "a", 10.0, 0.0, 1.0, 0.8, "held-out elpd")
    assert not noise.significant and verdict(margin, [noise])[2] == "noise"


def test_seed_reversals_count_the_spread_over_seeds():
    from gpzoo.analysis.compare import seed_reversals, seed_summary  # noqa: PLC0415

    rng = np.random.default_rng(2)
    base = rng.normal(-1.0, 0.5, 200)
    # held-out: b beats a by 0.05 per point on average, but by +0.25 or -0.15 depending on the seed
    shifts = {0: 0.25, 1: -0.15, 2: 0.05}
    trees, groups, seeds, rows = {}, {}, {}, {}
    for s, shift in shifts.items():
        for model, offset in (("a", 0.0), ("b", shift)):
            run = f"{model}{s}"
            trees[run] = _heldout_tree((base + offset)[None] + 0.001 * rng.normal(size=(1, 200)))
            groups[run], seeds[run] = model, s
            rows[run] = {"elbo": (-10.0 if model == "a" else -12.0) + 0.1 * s,
                         "elpd_test": float(np.sum(base + offset))}
    table = pd.DataFrame.from_dict(rows, orient="index")
    summary = seed_summary(table, groups)
    assert list(summary.index) == ["a", "b"] and (summary["num_seeds"] == 3).all()
    (reversal,) = seed_reversals(summary, trees, groups, seeds)
    per_seed = np.array([200 * v for v in shifts.values()])
    assert reversal.d_heldout == pytest.approx(per_seed.mean(), rel=0.01)
    assert reversal.d_heldout_se >= per_seed.std(ddof=1) / np.sqrt(3) * 0.99  # the seed spread is part of the error
    assert not reversal.significant  # 10 ± 23 nats: within the spread over seeds
