"""Model comparison: full-data ELBO with its Monte Carlo error, and PSIS-LOO of the approximate posterior.

Two rankings of the same fitted models, which need not agree:

* :func:`compare_elbo` — the evidence lower bound (van der Wilk et al. 2017, eq. 5) on the same data, best first,
  with its MC standard error, ΔELBO to the best and ELBO per datum. It ranks how well each model
  *explains* the training data, penalised by KL[q(u) || p(u)].
* :func:`compare_loo` — PSIS-LOO (Vehtari et al. 2017) of the predictive p(y_i | y_-i), estimated
  from draws u_s ~ q(u) importance-weighted towards the target p(u | y) with
  ``az.loo_approximate_posterior`` (Magnusson et al. 2019), ranked by ``az.compare``, with the
  Pareto-k diagnostics of every model. It ranks how well each model *predicts* held-out points.

:func:`ranking_disagreements` says where the two orders differ, so that a report can say so.
The tables are built from plain estimates (:func:`elbo_table`) so a saved report can rebuild
them without refitting.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping

import numpy as np
import pandas as pd
import xarray as xr
from matplotlib.figure import Figure

from gpzoo.analysis.datatree import LOO_VAR_NAME
from gpzoo.analysis.display import new_figure
from gpzoo.inference.fit import evaluate_elbo
from gpzoo.inference.results import FitResult
from gpzoo.models.errors import InvalidArgumentError

__all__ = [
    "check_common_training_data",
    "compare_elbo",
    "compare_loo",
    "elbo_entry",
    "elbo_estimates",
    "elbo_table",
    "elbo_traces_figure",
    "loo_approximate",
    "ranking_disagreements",
    "heldout_elpd",
    "compare_heldout",
    "heldout_pointwise",
    "paired_heldout_difference",
    "Margin",
    "Reversal",
    "best_margin",
    "heldout_reversals",
    "ranking_reversals",
    "seed_reversals",
    "seed_summary",
]


# ----------------------------------------------------------------------------- ELBO
def _check_mapping(items, argument: str, kind) -> dict:
    if not isinstance(items, Mapping) or not items:
        raise InvalidArgumentError(argument, f"expected a non-empty dict {{name: {kind.__name__}}}, got {type(items).__name__}")
    for name, value in items.items():
        if not isinstance(value, kind):
            raise InvalidArgumentError(argument, f"entry {name!r} is a {type(value).__name__}, expected {kind.__name__}")
    return dict(items)


def elbo_estimates(results: Mapping[str, FitResult], X=None, y=None, *, num_samples: int = 32,
                   seed: int = 0) -> dict[str, dict]:
    """``{name: {elbo, elbo_se, expected_log_lik, kl, num_data, num_samples}}`` on the same data.

    Without ``X``/``y`` every model must have been fitted on the same training data (otherwise
    their ELBOs bound different evidences and are not comparable).
    """
    results = _check_mapping(results, "results", FitResult)
    if (X is None) != (y is None):
        raise InvalidArgumentError("X" if X is None else "y", "pass both X and y, or neither (training data)")
    if X is None:
        check_common_training_data(results)
    out = {}
    for name, res in results.items():
        est = evaluate_elbo(res, X, y, num_samples=num_samples, seed=seed)
        out[name] = elbo_entry(est, res.num_data if X is None else int(np.shape(X)[0]))
    return out


def check_common_training_data(results: Mapping[str, FitResult]) -> dict:
    """``results`` checked to be a non-empty dict of FitResults fitted on the same training data (their
    training-data ELBOs bound the same evidence); an InvalidArgumentError naming ``results`` otherwise."""
    results = _check_mapping(results, "results", FitResult)
    first = next(iter(results.values()))
    for name, res in results.items():
        same = res.X_train.shape == first.X_train.shape and np.array_equal(res.X_train, first.X_train) \
            and np.array_equal(res.y_train, first.y_train)
        if not same:
            raise InvalidArgumentError(
                "results", f"model {name!r} was fitted on different data than the others; pass X and y to compare on common data"
            )
    return results


def elbo_entry(est, num_data: int) -> dict:
    """One :func:`elbo_estimates` entry from an ``ElboEstimate`` on ``num_data`` points."""
    return {"elbo": est.elbo, "elbo_se": est.stderr, "expected_log_lik": est.expected_log_lik,
            "kl": est.kl, "num_data": int(num_data), "num_samples": est.num_samples}


def elbo_table(estimates: Mapping[str, Mapping]) -> pd.DataFrame:
    """Ranked ELBO table (best first) from :func:`elbo_estimates`-style entries.

    ``d_elbo`` is each model's ELBO minus the best one's (≤ 0, 0 for the best: the sign of
    ``az.compare``'s ``elpd_diff``) and ``d_elbo_se`` its MC standard error (independent draws per
    model: √(se_best² + se²)).
    """
    if not estimates:
        raise InvalidArgumentError("estimates", "needs at least one model")
    df = pd.DataFrame.from_dict({k: dict(v) for k, v in estimates.items()}, orient="index")
    df.index.name = "model"
    df = df.sort_values("elbo", ascending=False, kind="stable")
    best = df.iloc[0]
    df.insert(0, "rank", np.arange(len(df)))
    df["d_elbo"] = df["elbo"] - best["elbo"]
    df["d_elbo_se"] = np.sqrt(best["elbo_se"] ** 2 + df["elbo_se"] ** 2)
    df.loc[df.index[0], "d_elbo_se"] = 0.0
    df["elbo_per_datum"] = df["elbo"] / df["num_data"]
    columns = ["rank", "elbo", "elbo_se", "d_elbo", "d_elbo_se", "elbo_per_datum", "expected_log_lik", "kl",
               "num_data", "num_samples"]
    return df[[c for c in columns if c in df.columns]]


def compare_elbo(results: Mapping[str, FitResult], X=None, y=None, *, num_samples: int = 32,
                 seed: int = 0) -> pd.DataFrame:
    """Rank fitted models by full-data ELBO (best first) with MC standard errors.

    Columns: ``rank``, ``elbo``, ``elbo_se``, ``d_elbo`` (model − best, ≤ 0), ``d_elbo_se``,
    ``elbo_per_datum``, ``expected_log_lik``, ``kl``, ``num_data``, ``num_samples``.
    """
    return elbo_table(elbo_estimates(results, X, y, num_samples=num_samples, seed=seed))


# ----------------------------------------------------------------------------- PSIS-LOO
def _check_tree(dt, name: str) -> xr.DataTree:
    if not isinstance(dt, xr.DataTree):
        raise InvalidArgumentError("datatrees", f"entry {name!r} is a {type(dt).__name__}, expected an xarray DataTree")
    if "sample_stats" not in dt.children or "log_p" not in dt["sample_stats"].data_vars:
        raise InvalidArgumentError(
            "datatrees", f"entry {name!r} has no sample_stats.log_p (built with include_train=False?); PSIS-LOO needs the training points"
        )
    return dt


def loo_approximate(dt: xr.DataTree, *, var_name: str = LOO_VAR_NAME):
    """PSIS-LOO of the training points, corrected for sampling from q (``az.loo_approximate_posterior``).

    The log weights are log p(u_s, y) − log q(u_s) − log p(y_i | u_s), so the LOO predictive is
    that of the target posterior p(u | y), not of q. Returns ArviZ's ``ELPDDataLOO`` (pointwise,
    with ``pareto_k``). ArviZ's Pareto-k warnings are silenced: the k values are returned.
    """
    from arviz_stats import loo_approximate_posterior

    _check_tree(dt, "dt")
    stats = dt["sample_stats"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return loo_approximate_posterior(dt, stats["log_p"], stats["log_q"], pointwise=True, var_name=var_name)


def heldout_pointwise(dt: xr.DataTree, var_name: str = "y") -> np.ndarray:
    """log mean_s p(y*_n | u_s) of every test point ``[T]`` (from ``predictions_log_likelihood``)."""
    if not isinstance(dt, xr.DataTree) or "predictions_log_likelihood" not in dt.children:
        raise InvalidArgumentError("dt", "expected a DataTree from gpzoo.analysis.to_datatree (with predictions_log_likelihood)")
    log_lik = dt["predictions_log_likelihood"][var_name]  # [chain, draw, obs_id]
    values = np.asarray(log_lik.values, np.float64).reshape(-1, log_lik.shape[-1])  # [S, T]
    m = values.max(axis=0)
    return m + np.log(np.mean(np.exp(values - m), axis=0))


def _sum_se(pointwise: np.ndarray) -> float:
    """Standard error √T·sd of a sum of ``T`` pointwise terms (0 for a single term)."""
    return float(math.sqrt(len(pointwise)) * pointwise.std(ddof=1)) if len(pointwise) > 1 else 0.0


def heldout_elpd(dt: xr.DataTree, var_name: str = "y") -> tuple[float, float]:
    """Held-out elpd Σ_n log mean_s p(y*_n | u_s) of the test points (``predictions_log_likelihood``)
    and its standard error √N·sd."""
    pointwise = heldout_pointwise(dt, var_name)
    return float(pointwise.sum()), _sum_se(pointwise)


def compare_heldout(datatrees: Mapping[str, xr.DataTree]) -> pd.DataFrame:
    """Rank models by held-out elpd on the same test points, best first, in ``az.compare``'s columns.

    ``elpd`` ± ``se`` per model; ``elpd_diff`` = elpd_model − elpd_best (≤ 0, 0 for the best: the
    sign ``az.compare`` gives it) and ``dse`` its *paired* standard error
    √T·sd(elpd_model,n − elpd_best,n) over test points n — the points are shared, so the difference
    is far more precise than √(se_a² + se_b²). ``az.plot_compare`` draws the table with the best
    model on top, at the right ("higher is better").
    """
    datatrees = _check_mapping(datatrees, "datatrees", xr.DataTree)
    pointwise = {name: heldout_pointwise(dt) for name, dt in datatrees.items()}
    sizes = {len(v) for v in pointwise.values()}
    if len(sizes) > 1:
        raise InvalidArgumentError("datatrees", f"models were evaluated on different numbers of test points: {sorted(sizes)}")
    order = sorted(pointwise, key=lambda name: -pointwise[name].sum())
    best = pointwise[order[0]]
    rows = {name: {"rank": rank, "elpd": float(pointwise[name].sum()), "se": _sum_se(pointwise[name]),
                   "elpd_diff": float(pointwise[name].sum() - best.sum()), "dse": _sum_se(pointwise[name] - best)}
            for rank, name in enumerate(order)}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "model"
    return table


def paired_heldout_difference(datatrees: Mapping[str, xr.DataTree], a: str, b: str) -> tuple[float, float]:
    """elpd_a − elpd_b on the shared test points and its paired standard error."""
    diff = heldout_pointwise(datatrees[a]) - heldout_pointwise(datatrees[b])
    return float(diff.sum()), _sum_se(diff)


def compare_loo(datatrees: Mapping[str, xr.DataTree], *, method: str = "stacking", loos: Mapping | None = None) -> pd.DataFrame:
    """Rank models by PSIS-LOO (``az.compare`` on :func:`loo_approximate`), best first.

    ArviZ's columns (``rank``, ``elpd``, ``p``, ``elpd_diff``, ``weight``, ``se``, ``dse``,
    ``warning``, ...) plus the Pareto-k diagnostics (``pareto_k_max``, ``num_bad_k`` = points with
    k above ArviZ's ``good_k`` threshold or not estimable, ``good_k``) and the held-out ``elpd_test`` ± ``elpd_test_se``.
    ``loos``: ``{name: loo_approximate(datatrees[name])}`` already computed for some models (the rest are computed here).
    """
    import arviz as az

    datatrees = _check_mapping(datatrees, "datatrees", xr.DataTree)
    loos = dict(loos or {})
    if not set(loos) <= set(datatrees):
        raise InvalidArgumentError("loos", f"has models that datatrees lacks: {sorted(set(loos) - set(datatrees))}")
    loos = {name: loos[name] if name in loos else loo_approximate(_check_tree(dt, name)) for name, dt in datatrees.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if len(loos) > 1:
            table = az.compare(loos, method=method, round_to="none")
        else:
            (name, loo), = loos.items()
            table = pd.DataFrame({"rank": [0], "elpd": [loo.elpd], "p": [loo.p], "elpd_diff": [0.0], "weight": [1.0],
                                  "se": [loo.se], "dse": [0.0], "warning": [loo.warning], "scale": [loo.scale]},
                                 index=[name])
    table.index.name = "model"
    for name, loo in loos.items():
        k = np.asarray(loo.pareto_k)
        table.loc[name, "pareto_k_max"] = float(np.max(k))
        table.loc[name, "num_bad_k"] = int(np.sum(~(k <= loo.good_k)))  # NaN (failed tail fit) counts as bad
        table.loc[name, "good_k"] = float(loo.good_k)
        table.loc[name, "elpd_test"], table.loc[name, "elpd_test_se"] = heldout_elpd(datatrees[name])
    table["num_bad_k"] = table["num_bad_k"].astype(int)
    table["rank"] = table["rank"].astype(int)
    return table


# ----------------------------------------------------------------------------- disagreement
#: A held-out criterion reverses the ELBO's order of two models "significantly" when it prefers the
#: other model by more than this many (paired) standard errors.
SIGNIFICANT_SE = 2.0


@dataclasses.dataclass(frozen=True)
class Reversal:
    """Two models that the ELBO orders one way and a held-out criterion the other way.

    ``d_elbo`` = ELBO(``elbo_prefers``) − ELBO(``other``) > 0 with its Monte Carlo SE;
    ``d_heldout`` = criterion(``other``) − criterion(``elbo_prefers``) > 0 with its standard error
    (paired over the shared test points for the held-out elpd).
    """

    elbo_prefers: str
    other: str
    d_elbo: float
    d_elbo_se: float
    d_heldout: float
    d_heldout_se: float
    criterion: str

    @property
    def significant(self) -> bool:
        """Whether the criterion prefers ``other`` by more than :data:`SIGNIFICANT_SE` standard errors."""
        return self.d_heldout > SIGNIFICANT_SE * self.d_heldout_se

    def sentence(self) -> str:
        return (f"ELBO prefers {self.elbo_prefers} over {self.other} (ΔELBO {self.d_elbo:.2f} ± {self.d_elbo_se:.2f}) but "
                f"{self.criterion} prefers {self.other} over {self.elbo_prefers} (Δelpd {self.d_heldout:.2f} ± "
                f"{self.d_heldout_se:.2f})")


def ranking_reversals(elbo: pd.DataFrame, other: pd.DataFrame, difference, criterion: str) -> list[Reversal]:
    """Every pair of models that ``elbo`` (:func:`elbo_table`) and ``other`` (a table with ``rank``)
    order differently; ``difference(a, b)`` gives criterion(a) − criterion(b) and its standard error."""
    common = [m for m in elbo.sort_values("rank").index if m in other.index]
    rank = other["rank"]
    found = []
    for i, a in enumerate(common):
        for b in common[i + 1:]:  # ELBO prefers a over b
            if rank[b] < rank[a]:
                d, se = difference(b, a)
                found.append(Reversal(a, b, float(elbo.loc[a, "elbo"] - elbo.loc[b, "elbo"]),
                                      float(math.hypot(elbo.loc[a, "elbo_se"], elbo.loc[b, "elbo_se"])), float(d), float(se),
                                      criterion))
    return found


def heldout_reversals(elbo: pd.DataFrame, datatrees: Mapping[str, xr.DataTree]) -> list[Reversal]:
    """Pairs the ELBO and the held-out elpd (:func:`compare_heldout`) order differently, with paired SEs."""
    return ranking_reversals(elbo, compare_heldout(datatrees), lambda a, b: paired_heldout_difference(datatrees, a, b),
                             "held-out elpd")


def ranking_disagreements(elbo: pd.DataFrame, loo: pd.DataFrame) -> list[str]:
    """Sentences for every pair of models that ELBO and PSIS-LOO order differently (empty: they agree).

    Each sentence gives both differences with their standard errors, so a reader can tell a
    real disagreement from noise (|Δ| within ~2 SE).
    """
    def difference(a, b):
        return float(loo.loc[a, "elpd"] - loo.loc[b, "elpd"]), _pair_dse(loo, a, b)

    return [r.sentence() for r in ranking_reversals(elbo, loo, difference, "PSIS-LOO")]


def _pair_dse(loo: pd.DataFrame, a: str, b: str) -> float:
    """SE of elpd_a − elpd_b: ArviZ's dse when one of them is the top model, else √(se_a² + se_b²)."""
    top = loo.sort_values("rank").index[0]
    if top in (a, b):
        return float(loo.loc[b if top == a else a, "dse"])
    return float(math.hypot(loo.loc[a, "se"], loo.loc[b, "se"]))


# ----------------------------------------------------------------------------- figures
def _trace(value) -> tuple[np.ndarray, int]:
    """(objective per step ``[T]``, number of training points) of a FitResult or a saved DataTree."""
    if isinstance(value, FitResult):
        return np.asarray(value.objective_history, np.float64), value.num_data
    if isinstance(value, xr.DataTree):
        return np.asarray(value["optimization"]["objective"].values, np.float64), int(value.attrs.get("num_train", 1))
    raise InvalidArgumentError("results", f"expected FitResult or DataTree values, got {type(value).__name__}")


def elbo_traces_figure(results: Mapping[str, FitResult | xr.DataTree]) -> Figure:
    """ELBO per datum against the optimisation step, one line per model (FitResults or saved DataTrees).

    The y-range starts at the lowest 5 % quantile over models so the first steps do not flatten
    the curves. Drawn without pyplot (no global state).
    """
    if not isinstance(results, Mapping) or not results:
        raise InvalidArgumentError("results", "expected a non-empty dict {name: FitResult}")
    fig = new_figure(figsize=(7.0, 4.0), layout="constrained")
    ax = fig.subplots()
    lows, highs = [], []
    for name, value in results.items():
        trace, n = _trace(value)
        per_datum = trace / max(n, 1)
        ax.plot(np.arange(1, len(per_datum) + 1), per_datum, label=name, lw=1.2)
        if len(per_datum):
            lows.append(np.quantile(per_datum, 0.05))
            highs.append(per_datum.max())
    if lows:
        lo, hi = min(lows), max(highs)
        pad = 0.05 * (hi - lo if hi > lo else 1.0)
        ax.set_ylim(lo - pad, hi + pad)
    ax.set(xlabel="step", ylabel="ELBO / N (minibatch estimate)", title="Optimisation traces")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return fig


# ----------------------------------------------------------------------------- seeds
#: Columns of a comparison table summarised over seeds (those present).
SEED_COLUMNS = ("elbo", "elpd_test", "test_accuracy", "test_rmse", "test_nll", "test_ece", "test_crps", "fit_seconds")


def seed_summary(table: pd.DataFrame, groups: Mapping[str, str]) -> pd.DataFrame:
    """Mean and standard deviation over seeds of every :data:`SEED_COLUMNS` column, one row per model.

    ``table`` has one row per run (a model fitted with one seed, as :func:`~gpzoo.analysis.report.comparison_table`
    gives it); ``groups`` maps each run to its model. Rows are ordered by mean ELBO, best first;
    ``num_seeds`` counts the runs; a single run has standard deviation NaN.
    """
    missing = [run for run in table.index if run not in groups]
    if missing:
        raise InvalidArgumentError("groups", f"runs {missing} have no model")
    columns = [c for c in SEED_COLUMNS if c in table.columns]
    grouped = table[columns].groupby(pd.Series({run: groups[run] for run in table.index}), sort=False)
    summary = grouped.mean().add_suffix("_mean").join(grouped.std(ddof=1).add_suffix("_sd"))
    summary.insert(0, "num_seeds", grouped.size())
    summary.index.name = "model"
    return summary.sort_values("elbo_mean", ascending=False, kind="stable")


def seed_reversals(summary: pd.DataFrame, datatrees: Mapping[str, xr.DataTree], groups: Mapping[str, str],
                   seeds: Mapping[str, int]) -> list[Reversal]:
    """Pairs of models that mean ELBO and mean held-out elpd (over seeds) order differently.

    The held-out difference of two models is taken seed by seed (runs with the same seed, paired
    over the shared test points) and averaged; its standard error combines the spread over seeds,
    sd(d_s)/√n, with the test-point error of the mean, √(Σ_s se_s²)/n.
    """
    runs = {(groups[run], seeds[run]): run for run in groups}
    elbo = pd.DataFrame({"rank": np.arange(len(summary)), "elbo": summary["elbo_mean"].to_numpy(),
                         "elbo_se": (summary["elbo_sd"].fillna(0.0) / np.sqrt(summary["num_seeds"])).to_numpy()},
                        index=summary.index)
    by_heldout = summary.sort_values("elpd_test_mean", ascending=False, kind="stable")
    heldout = pd.DataFrame({"rank": np.arange(len(by_heldout))}, index=by_heldout.index)

    def difference(a, b):
        shared = sorted(seed for (model, seed) in runs if model == a and (b, seed) in runs)
        if not shared:
            return math.nan, math.nan
        pairs = [paired_heldout_difference(datatrees, runs[(a, s)], runs[(b, s)]) for s in shared]
        d = np.array([p[0] for p in pairs])
        se_points = math.sqrt(sum(p[1] ** 2 for p in pairs)) / len(pairs)
        se_seeds = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else 0.0
        return float(d.mean()), math.hypot(se_points, se_seeds)

    return ranking_reversals(elbo, heldout, difference, "held-out elpd (mean over seeds)")


# ----------------------------------------------------------------------------- the best model's margin
@dataclasses.dataclass(frozen=True)
class Margin:
    """How far the best model by held-out elpd is ahead of the next one, and how sure that is.

    ``d_elpd`` = elpd_test(``best``) − elpd_test(``runner_up``) (≥ 0), the mean over the seeds both were
    fitted with of the difference taken seed by seed on the shared test points; ``d_elpd_se`` its
    test-point error, √(Σ_s se_s²)/n with se_s the paired standard error of seed s. ``seed_sd`` is the
    standard deviation of the per-seed differences over the ``num_seeds`` seeds (NaN for one seed) and
    ``wins`` the number of seeds at which ``best`` is ahead. ``d_elbo`` = ELBO(``best``) − ELBO(``runner_up``)
    (mean over the same seeds; negative when the ELBO prefers the runner-up) ± its Monte Carlo error
    ``d_elbo_se``, and ``elbo_seed_sd`` the standard deviation over seeds of the per-seed ELBO differences.
    ``best_elpd``/``best_elpd_se``: the best model's held-out elpd (mean over its seeds).
    ``runner_up`` is None (and the differences NaN) when there is a single model.
    """

    best: str
    runner_up: str | None
    d_elpd: float
    d_elpd_se: float
    d_elbo: float
    d_elbo_se: float
    num_seeds: int = 1
    seed_sd: float = math.nan
    wins: int = 1
    best_elpd: float = math.nan
    best_elpd_se: float = math.nan
    elbo_seed_sd: float = math.nan

    @property
    def beyond_test_error(self) -> bool:
        """Whether ``d_elpd`` exceeds :data:`SIGNIFICANT_SE` test-point (paired) standard errors."""
        return bool(self.d_elpd > SIGNIFICANT_SE * self.d_elpd_se)

    @property
    def seed_se(self) -> float:
        """Standard error of the mean difference from the spread over seeds, seed_sd/√n (NaN for one seed)."""
        return self.seed_sd / math.sqrt(self.num_seeds) if self.num_seeds > 1 else math.nan

    @property
    def beyond_seed_spread(self) -> bool | None:
        """Whether ``d_elpd`` exceeds :data:`SIGNIFICANT_SE` standard errors of the spread over seeds
        (:attr:`seed_se`); None with one seed (the spread is unknown)."""
        if self.num_seeds < 2 or not math.isfinite(self.seed_sd):
            return None
        return bool(self.d_elpd > SIGNIFICANT_SE * self.seed_se)


def best_margin(elbo: Mapping[str, Mapping], datatrees: Mapping[str, xr.DataTree],
                groups: Mapping[str, str] | None = None, seeds: Mapping[str, int] | None = None) -> Margin:
    """:class:`Margin` of the best model by held-out elpd over the next one.

    ``elbo``: ``{run: {"elbo": ..., "elbo_se": ...}}`` (:func:`elbo_estimates` entries); ``datatrees``:
    ``{run: DataTree}`` with ``predictions_log_likelihood``. ``groups`` (``{run: model}``) and ``seeds``
    (``{run: seed}``) describe runs of one model with several seeds; without them every run is its own
    model fitted once. Models are ranked by their mean held-out elpd over seeds.
    """
    datatrees = _check_mapping(datatrees, "datatrees", xr.DataTree)
    groups = dict(groups) if groups is not None else {run: run for run in datatrees}
    seeds = dict(seeds) if seeds is not None else {run: 0 for run in datatrees}
    missing = [run for run in datatrees if run not in groups or run not in seeds or run not in elbo]
    if missing:
        raise InvalidArgumentError("groups", f"runs {missing} lack a model, a seed or an ELBO")
    heldout = {run: heldout_elpd(dt) for run, dt in datatrees.items()}
    runs: dict[str, dict[int, str]] = {}
    for run in datatrees:
        runs.setdefault(groups[run], {})[seeds[run]] = run
    mean_elpd = {model: float(np.mean([heldout[r][0] for r in by_seed.values()])) for model, by_seed in runs.items()}
    order = sorted(mean_elpd, key=lambda model: -mean_elpd[model])
    best = order[0]
    best_runs = list(runs[best].values())
    best_se = math.sqrt(sum(heldout[r][1] ** 2 for r in best_runs)) / len(best_runs)
    if len(order) == 1:
        return Margin(best, None, math.nan, math.nan, math.nan, math.nan, num_seeds=len(best_runs), wins=len(best_runs),
                      best_elpd=mean_elpd[best], best_elpd_se=best_se)
    other = order[1]
    shared = sorted(set(runs[best]) & set(runs[other]))
    if shared:
        pairs = [(runs[best][s], runs[other][s]) for s in shared]
    else:  # no common seed: pair the runs in seed order (their test points are still shared)
        pairs = list(zip(sorted(runs[best].values()), sorted(runs[other].values())))
    diffs = [paired_heldout_difference(datatrees, a, b) for a, b in pairs]
    d = np.array([p[0] for p in diffs])
    e = np.array([float(elbo[a]["elbo"]) - float(elbo[b]["elbo"]) for a, b in pairs])
    n = len(pairs)
    return Margin(
        best, other, d_elpd=float(d.mean()), d_elpd_se=math.sqrt(sum(p[1] ** 2 for p in diffs)) / n,
        d_elbo=float(e.mean()),
        d_elbo_se=math.sqrt(sum(float(elbo[a]["elbo_se"]) ** 2 + float(elbo[b]["elbo_se"]) ** 2 for a, b in pairs)) / n,
        num_seeds=n, seed_sd=float(d.std(ddof=1)) if n > 1 else math.nan, wins=int(np.sum(d > 0)),
        best_elpd=mean_elpd[best], best_elpd_se=best_se, elbo_seed_sd=float(e.std(ddof=1)) if n > 1 else math.nan)
