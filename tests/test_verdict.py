"""The report's verdict answers "which model, and how sure?", and every comparison table uses
``az.compare``'s sign for its differences (model − best, 0 for the best).

Generated comparisons: DataTrees holding only pointwise log-likelihoods, no fitting."""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pytest
import xarray as xr

from gpzoo.analysis.compare import Margin, best_margin, compare_heldout, elbo_table, heldout_reversals, seed_reversals
from gpzoo.analysis.report import SEEDS_HINT, comparison_figure, verdict

T = 200  # test points


def _tree(log_lik, *, train: bool = False) -> xr.DataTree:
    """A DataTree with ``predictions_log_likelihood`` ``[chain=1, draw, obs_id]`` (and the same values as
    ``log_likelihood`` with ``train``, so that ``az.compare`` reads the same numbers)."""
    log_lik = np.asarray(log_lik)[None]
    ds = xr.Dataset({"y": (("chain", "draw", "obs_id"), log_lik)})
    groups = {"predictions_log_likelihood": ds}
    if train:
        groups["log_likelihood"] = ds
        groups["posterior"] = xr.Dataset({"mu": (("chain", "draw"), np.zeros(log_lik.shape[:2]))})
    return xr.DataTree.from_dict(groups)


def _trees(offsets: dict[str, float], *, seed: int = 0, draws: int = 40, noise: float = 1e-3, train: bool = False):
    """{name: tree}: every model sees the same per-point difficulty, shifted by its offset per point."""
    rng = np.random.default_rng(seed)
    base = rng.normal(-1.0, 1.0, T)
    return {name: _tree(base[None] + offset + noise * rng.normal(size=(draws, T)), train=train)
            for name, offset in offsets.items()}


def _elbo(values: dict[str, float], se: float = 0.1) -> dict[str, dict]:
    return {name: {"elbo": v, "elbo_se": se, "num_data": 50} for name, v in values.items()}


# ----------------------------------------------------------------------------- one sign convention
def test_heldout_table_has_az_compare_signs():
    """compare_heldout and az.compare, built from the same DataTrees: same order, elpd_diff ≤ 0 with 0 for
    the best, the same differences (the draws hardly vary, so PSIS-LOO equals the plain log density)."""
    trees = _trees({"worse": -0.3, "best": 0.0, "middle": -0.1}, train=True)
    ours = compare_heldout(trees)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = az.compare(trees, round_to="none")
    assert list(ours.index) == list(theirs.index) == ["best", "middle", "worse"]
    for table in (ours, theirs):
        assert table.loc["best", "elpd_diff"] == 0 and table.loc["best", "rank"] == 0
        assert (table["elpd_diff"].drop("best") < 0).all()
    np.testing.assert_allclose(ours["elpd_diff"], theirs["elpd_diff"], atol=0.05)
    np.testing.assert_allclose(ours.loc["worse", "elpd_diff"], -0.3 * T, rtol=1e-3)
    assert np.sign(ours["elpd_diff"]).tolist() == np.sign(theirs["elpd_diff"]).tolist()


def test_elbo_table_has_the_same_sign():
    table = elbo_table(_elbo({"a": -120.0, "b": -100.0}))
    assert table.loc["b", "d_elbo"] == 0 and table.loc["a", "d_elbo"] == -20.0


def test_comparison_figure_puts_the_best_model_on_top_at_the_right():
    """az.plot_compare of compare_heldout: the best model is the top row, at 0, the others to its left
    (the figure's title says "higher is better")."""
    table = compare_heldout(_trees({"worse": -0.3, "best": 0.0}))
    fig = comparison_figure(table, "held-out elpd")
    (ax,) = [a for a in fig.axes if a.get_yticklabels()]
    labels = {t.get_text(): y for t, y in zip(ax.get_yticklabels(), ax.get_yticks())}
    assert labels["best"] > labels["worse"]  # on top
    points = np.concatenate([c.get_offsets() for c in ax.collections if len(c.get_offsets())])
    by_row = {round(float(y)): float(x) for x, y in points}
    assert by_row[round(labels["best"])] == 0 and by_row[round(labels["worse"])] < 0  # best at the right
    assert "higher is better" in ax.get_title()


# ----------------------------------------------------------------------------- the verdict's first sentence
def _first(headline: str) -> str:
    """The verdict's first sentence (it ends at the first '. ' that follows a ';'-separated clause list)."""
    return headline.split(". The ")[0]


def test_clear_winner():
    trees = _trees({"rbf": 0.0, "linear": -0.2})  # 40 nats over 200 points, a tiny paired s.e.
    margin = best_margin(_elbo({"rbf": -10.0, "linear": -30.0}), trees)
    assert (margin.best, margin.runner_up) == ("rbf", "linear") and margin.beyond_test_error
    assert margin.d_elpd == pytest.approx(0.2 * T, rel=1e-3) and margin.d_elbo == 20.0
    reversals = heldout_reversals(elbo_table(_elbo({"rbf": -10.0, "linear": -30.0})), trees)
    headline, items, kind = verdict(margin, reversals, {"rbf": True, "linear": True})
    first = _first(headline)
    assert first.startswith("Best: rbf, ahead of linear by held-out Δelpd 40 ± ")
    assert "ΔELBO 20 ± 0.1414" in first and "larger than the test-point error" in first
    assert "seed spread is unknown" in first and SEEDS_HINT in first and "--seeds" in first
    assert "every model converged" in first and "prefers" not in first
    assert "rank the models in the same order" in headline
    assert kind == "clear" and items == []


def test_tie_within_noise():
    rng = np.random.default_rng(3)
    base = rng.normal(-1.0, 1.0, T)
    trees = {"a": _tree(base[None] + 0.3 * rng.normal(size=(1, T))), "b": _tree(base[None] + 0.3 * rng.normal(size=(1, T)))}
    margin = best_margin(_elbo({"a": -10.0, "b": -10.5}), trees)
    assert not margin.beyond_test_error  # pointwise noise 0.3·√2 per point: the sums differ by chance only
    headline, _, kind = verdict(margin, [], {"a": True, "b": True})
    assert f"Best: {margin.best}, ahead of {margin.runner_up}" in _first(headline)
    assert "within the test-point error, so the test set cannot tell them apart" in _first(headline)
    assert kind == "noise"


def _seed_runs(shifts: dict[int, float], noise: float = 0.001):
    """Runs of models a and b with seeds 0, 1, 2...: b − a is ``shift`` per point at each seed."""
    rng = np.random.default_rng(5)
    base = rng.normal(-1.0, 0.5, T)
    trees, groups, seeds, elbo = {}, {}, {}, {}
    for s, shift in shifts.items():
        for model, offset in (("a", 0.0), ("b", shift)):
            run = f"{model} seed {s}"
            trees[run] = _tree((base + offset)[None] + noise * rng.normal(size=(1, T)))
            groups[run], seeds[run] = model, s
            elbo[run] = {"elbo": -10.0 + offset + 0.01 * s, "elbo_se": 0.0, "num_data": 50}
    return trees, groups, seeds, elbo


def test_winner_only_within_the_seed_spread():
    """b is ahead on average, far beyond the test-point error of each seed, but behind at one seed:
    the verdict says the margin is within the seed spread."""
    trees, groups, seeds, elbo = _seed_runs({0: 0.25, 1: -0.15, 2: 0.05})
    margin = best_margin(elbo, trees, groups, seeds)
    assert (margin.best, margin.runner_up, margin.num_seeds, margin.wins) == ("b", "a", 3, 2)
    assert margin.d_elpd == pytest.approx(0.05 * T, rel=0.02)
    assert margin.beyond_test_error and margin.beyond_seed_spread is False
    headline, _, kind = verdict(margin, [], {run: True for run in trees})
    first = _first(headline)
    assert first.startswith("Best: b, ahead of a by held-out Δelpd 9.99")
    assert "mean of 3 seeds" in first and "ahead at 2 of 3" in first
    assert "larger than the test-point error but within the seed spread" in first
    assert "unknown" not in first and kind == "noise"


def test_winner_beyond_the_seed_spread():
    trees, groups, seeds, elbo = _seed_runs({0: 0.2, 1: 0.21, 2: 0.19})
    margin = best_margin(elbo, trees, groups, seeds)
    assert margin.beyond_test_error and margin.beyond_seed_spread
    headline, _, kind = verdict(margin, [], {run: True for run in trees})
    assert "larger than both the test-point error and the seed spread" in _first(headline) and kind == "clear"


def test_seed_reversals_still_read_with_the_margin():
    trees, groups, seeds, elbo = _seed_runs({0: 0.25, 1: -0.15, 2: 0.05})
    import pandas as pd  # noqa: PLC0415

    table = pd.DataFrame({run: {"elbo": e["elbo"] + (5.0 if groups[run] == "a" else 0.0),
                                "elpd_test": float(compare_heldout({run: trees[run]})["elpd"].iloc[0])}
                          for run, e in elbo.items()}).T
    from gpzoo.analysis.compare import seed_summary  # noqa: PLC0415

    reversals = seed_reversals(seed_summary(table, groups), trees, groups, seeds)
    headline, items, kind = verdict(best_margin(elbo, trees, groups, seeds), reversals, {})
    assert "over seeds" in headline and items and kind == "noise"


def test_unconverged_model_is_named():
    trees = _trees({"rbf": 0.0, "linear": -0.2})
    margin = best_margin(_elbo({"rbf": -10.0, "linear": -30.0}), trees)
    headline, _, kind = verdict(margin, [], {"rbf": True, "linear": False})
    assert _first(headline).endswith("; not converged: linear") and kind == "unconverged"
    headline, _, kind = verdict(margin, [], {"rbf": None, "linear": False})
    assert "not converged: linear; convergence unknown for rbf" in _first(headline) and kind == "unconverged"
    headline, _, kind = verdict(margin, [], {"rbf": None, "linear": None})
    assert "convergence was not recorded" in _first(headline) and kind == "clear"


def test_single_model():
    margin = best_margin(_elbo({"only": -10.0}), _trees({"only": 0.0}))
    assert margin.runner_up is None
    headline, _, _ = verdict(margin, [], {"only": True})
    assert headline.startswith("only is the only model (held-out elpd ") and "seed spread is unknown" in headline


def test_margin_properties():
    one = Margin("a", "b", d_elpd=5.0, d_elpd_se=1.0, d_elbo=2.0, d_elbo_se=0.0)
    assert one.beyond_test_error and one.beyond_seed_spread is None
    assert not Margin("a", "b", 1.5, 1.0, 2.0, 0.0).beyond_test_error
    several = Margin("a", "b", 5.0, 1.0, 2.0, 0.0, num_seeds=4, seed_sd=6.0, wins=3)
    assert several.seed_se == pytest.approx(3.0) and several.beyond_seed_spread is False
