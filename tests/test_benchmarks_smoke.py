"""Benchmarks still run against the library (every script is exercised by a test; the longer
smoke runs are ``-m benchmark`` with the benchmarks themselves)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


@pytest.mark.benchmark
def test_svgp_scaling_quick(tmp_path):
    svgp_scaling = _load("svgp_scaling")
    out = tmp_path / "svgp_scaling.json"
    svgp_scaling.main(["--quick", "--N", "1000", "--M", "8", "--D", "2", "--repeats", "2", "--steps", "5", "--out", str(out)])

    report = json.loads(out.read_text())
    assert {"machine", "protocol", "threshold_ratio", "max_ratio", "all_below_threshold", "results"} <= set(report)
    assert {"cpu_count", "jax", "numpyro"} <= set(report["machine"])
    assert [(r["N"], r["M"], r["D"], r["dtype"]) for r in report["results"]] == [(1000, 8, 2, "float32"), (1000, 8, 2, "float64")]
    for r in report["results"]:
        for key in ("gpzoo_step_s", "reference_step_s", "ratio", "gpzoo_step_cpu_s", "reference_step_cpu_s"):
            assert r[key] > 0, key
        assert len(r["gpzoo_repeats_s"]) == len(r["reference_repeats_s"]) == 2
        assert all(t > 0 for t in r["gpzoo_repeats_s"] + r["reference_repeats_s"])
        assert r["loss_rel_diff"] < 1e-4  # like-for-like: same loss at identical parameters
        assert r["jitter_used"]["initial"] == pytest.approx(1e-6, rel=1e-6)


def test_pg_natgrad_benchmark_tiny(tmp_path):
    pg_natgrad = _load("pg_natgrad")
    out = tmp_path / "pg_natgrad.json"
    pg_natgrad.main(["--N", "150", "--M", "6", "--hyperparameters", "1", "1", "--max-cavi-steps", "40",
                     "--max-adam-steps", "200", "--learning-rates", "0.1", "--repeats", "1", "--out", str(out)])

    report = json.loads(out.read_text())
    assert {"machine", "protocol", "goal_ratio", "speed_ratios", "goal_met", "results"} <= set(report)
    (r,) = report["results"]
    assert (r["N"], r["M"], r["lengthscale"], r["variance"]) == (150, 6, 1.0, 1.0)
    assert r["optimum_converged"] and r["cavi"]["steps_to_target"] >= 1 and r["cavi"]["seconds"] > 0
    assert r["adam"] is not None and r["adam"]["learning_rate"] == 0.1 and r["speed_ratio"] > 0
    assert all(b <= r["optimum_bound"] + 1e-8 for b in r["cavi"]["bounds"])  # nothing beats the optimum


def test_natgrad_benchmark_tiny(tmp_path):
    """The natural-gradient benchmark's core on one tiny case, without the GPJax anchor."""
    natgrad = _load("natgrad")
    out = tmp_path / "natgrad.json"
    report = natgrad.main(["--cases", "svgp-rbf-bernoulli", "--N", "60", "--M", "6", "--steps", "40", "--timing-steps", "10",
                           "--repeats", "1", "--out", str(out)])

    assert json.loads(out.read_text()) == report
    assert {"machine", "protocol", "settings", "goals", "goal_met", "differences_from_gpjax", "results"} <= set(report)
    assert "load_average_start" in report["machine"] and len(report["load_average_end"]) == 3
    r = report["results"]["svgp-rbf-bernoulli"]
    assert (r["N"], r["M"], r["long_run_steps"]) == (60, 6, 40) and r["gpjax"] is None and r["gpjax_note"]
    assert len(r["runs"]) == 4 and all(run["finite"] and run["best_elbo"] <= r["optimum_elbo"] for run in r["runs"])
    for name in ("natgrad", "adam"):
        run = r[name]
        assert run["learning_rate"] in (0.01, 0.05) and run["compilations"] >= 0
        assert math.isfinite(run["seconds_per_step"]) and run["timing"]["whole_fit_per_step_at_K"] > 0
    assert r["natgrad"]["reached"] and r["natgrad"]["steps_to_1nat"] >= 1
    assert r["adam_over_natgrad_steps"] > 0 and math.isfinite(r["natgrad_over_adam_step_s"])
    assert r["goal_met"]["per_step_vs_gpjax"] is None and report["goal_met"]["per_step_vs_gpjax"] is None


@pytest.mark.slow
def test_gpflow_side_by_side_quick(tmp_path):
    """The gpzoo half always runs; the GPflow half only where its venv already exists (no install in tests)."""
    side = _load("gpflow_side_by_side")
    out = tmp_path / "side.json"
    side.main(["--quick", "--no-install", "--configs", "rectangles", "--out", str(out)])

    report = json.loads(out.read_text())
    r = report["results"]["rectangles"]
    assert r["setting"]["steps"] == 8 and r["setting"]["M"] == 6
    assert r["gpzoo"]["timed_steps"] == 4 and r["gpzoo"]["median_step_s"] > 0
    assert 0.0 <= r["gpzoo"]["test_error"] <= 1.0 and r["gpzoo"]["test_nlpp"] > 0 and r["gpzoo"]["peak_rss_mb"] > 0
    if r["gpflow"].get("skipped"):
        assert r["gpflow"]["reason"]
    else:
        assert r["gpflow"]["timed_steps"] == 4 and r["speed_ratio_gpflow_over_gpzoo"] > 0


@pytest.mark.slow
def test_gpflow_side_by_side_evaluates_at_equal_steps(tmp_path):
    """Plain conv with the probit link, evaluated after 4 and after all 8 steps: each checkpoint holds the
    test error, NLPP and full-data ELBO of each framework that ran, and the last equals the final result."""
    side = _load("gpflow_side_by_side")
    out = tmp_path / "equal.json"
    side.main(["--quick", "--no-install", "--configs", "rectangles", "--models", "conv", "--link", "probit",
               "--evaluate-at", "4", "--out", str(out)])
    r = json.loads(out.read_text())["results"]["rectangles/conv"]
    assert (r["setting"]["model"], r["setting"]["link"]) == ("conv", "probit")
    assert [c["steps"] for c in r["checkpoints"]] == [4, 8]
    ran = [k for k in ("gpzoo", "gpflow") if not r[k].get("skipped")]
    for point in r["checkpoints"]:
        for k in ran:
            assert 0.0 <= point[k]["test_error"] <= 1.0 and point[k]["test_nlpp"] > 0 and np.isfinite(point[k]["elbo"])
    assert all(r["checkpoints"][-1][k]["elbo"] == r[k]["elbo"] for k in ran)
    # 4 more Adam steps on the same minibatches change the bound (gpzoo's ELBO is deterministic here: fixed quadrature)
    assert r["checkpoints"][0]["gpzoo"]["elbo"] != r["checkpoints"][1]["gpzoo"]["elbo"]


def test_equal_steps_table_averages_seeds_per_step_count():
    """The summary row of one (config, model, steps) is the mean over seeds with the range, per framework."""
    summarise = _load("summarise")

    def run(seed, errors, model="conv"):
        return {"setting": {"config": "rectangles", "model": model, "seed": seed, "N_test": 1000},
                "checkpoints": [{"steps": steps, "gpzoo": {"test_error": e[0], "test_nlpp": 0.1, "elbo": -50.0},
                                 "gpflow": {"test_error": e[1], "test_nlpp": 0.3, "elbo": -70.0}}
                                for steps, e in zip((100, 300), errors)]}

    report = {"settings": {"link": "logit"}, "results": {"a": run(0, [(0.10, 0.50), (0.02, 0.04)]),
                                                         "b": run(1, [(0.20, 0.50), (0.04, 0.02)]),
                                                         "c": run(0, [(0.10, 0.50), (0.05, 0.50)], "weighted-conv")}}
    lines = summarise.FORMATTERS["gpflow_equal_steps_logit"](report)
    rows = [line for line in lines if line.startswith("| rectangles | conv")]
    assert rows == ["| rectangles | conv | 100 | 2 | 15.00 % (10.00 %–20.00 %) | 50.00 % (50.00 %–50.00 %) | 0.1 | 0.3 | -50 | -70 |",
                    "| rectangles | conv | 300 | 2 | 3.00 % (2.00 %–4.00 %) | 3.00 % (2.00 %–4.00 %) | 0.1 | 0.3 | -50 | -70 |"]
    # a goal line per model at its last step count: judged (with the binomial 2 s.e. of the difference of
    # two 3 % errors over 2 × 1,000 test points, 1.08 %) where both sides beat chance, not where one is at it
    goals = [line for line in lines if line.startswith("Goal")]
    assert goals[0] == ("Goal (rectangles / conv after 300 steps: gpzoo's mean test error at most GPflow's): **yes**; "
                        "within 2 s.e. of the difference (1.08 %): **yes**.")
    assert goals[1].startswith("Goal (rectangles / weighted-conv after 300 steps") and "cannot be judged" in goals[1]


def test_robustness_sweep_tiny(tmp_path, float32):
    sweep = _load("robustness_sweep")
    out = tmp_path / "robustness_sweep.json"
    # one seed: every code path of the sweep (fit, predict, ELBO, counts, totals) at one fit's cost (a fit compiles afresh)
    report = sweep.main(["--models", "svgp-rbf", "--seeds", "1", "--steps", "3", "--dtypes", "float32", "--workers", "1",
                         "--out", str(out)])
    assert json.loads(out.read_text()) == report and not list(tmp_path.glob("*.partial.json"))
    counts = report["results"]["float32"]["models"]["svgp-rbf"]
    assert counts["runs"] == 1 and report["totals"]["runs"] == 1 and report["protocol"]["seeds"] == 1
    assert counts["cholesky_failures"] == counts["diverged"] == counts["non_finite"] == counts["errors"] == 0
    assert report["goal_met"]


def test_shift_scale_sweep_tiny(tmp_path, float32):
    sweep = _load("robustness_sweep")
    out = tmp_path / "shift_scale.json"
    # one model, one seed, three data modes: the first fit compiles, the shifted and scaled ones reuse its programs
    report = sweep.main(["--models", "svgp-rbf", "--seeds", "1", "--steps", "3", "--dtypes", "float32", "--workers", "1",
                         "--transforms", "none,shift,scale", "--out", str(out)])
    assert json.loads(out.read_text()) == report and not list(tmp_path.glob("*.partial.json"))
    assert set(report["protocol"]["transforms"]) == {"none", "shift", "scale"} and report["protocol"]["accuracy_tolerance"] == 0.01
    result = report["results"]["float32"]
    # the transforms reached the data the model saw: pixels in [0, 1], [1000, 1001] and [0, 1000]
    assert result["input_range"] == {"none": [0.0, 1.0], "shift": [1000.0, 1001.0], "scale": [0.0, 1000.0]}
    per_transform = result["models"]["svgp-rbf"]
    assert set(per_transform) == {"none", "shift", "scale"}
    for counts in per_transform.values():
        assert counts["runs"] == 1 and counts["non_finite"] == counts["diverged"] == counts["errors"] == 0
        assert 0.0 <= counts["mean_accuracy"] <= 1.0 and isinstance(counts["warnings"], dict)
        assert counts["unexplained_drops"] <= counts["drops_over_tolerance"] <= 1
    assert per_transform["none"]["mean_accuracy_drop"] == 0.0
    assert sorted((r["transform"], r["seed"]) for r in result["runs"]) == [("none", 0), ("scale", 0), ("shift", 0)]
    assert all(isinstance(r["warnings"], list) and r["accuracy"] is not None for r in result["runs"])
    assert report["totals"]["runs"] == 3 and "conv" in report["zoo_models_not_run"]
    assert report["goal_met"] == (report["totals"]["unexplained_drops"] == 0)


def test_shift_scale_helpers():
    """The transforms, the accuracy and the drop bookkeeping, without a fit: a drop past 1 point is
    explained only by a data warning (ImageRangeWarning / DataScaleWarning)."""
    import numpy as np  # noqa: PLC0415

    sweep = _load("robustness_sweep")
    data = sweep.types.SimpleNamespace(X_train=np.full((2, 16), 0.5), X_test=np.zeros((1, 16)), y_train=np.array([0, 1]),
                                       y_test=np.array([1]), image_shape=(4, 4), task="binary")
    assert sweep.transformed(data, "scale").X_train.max() == 500.0 and sweep.transformed(data, "shift").X_test.min() == 1000.0
    assert sweep.transformed(data, "none").X_train.max() == 0.5
    assert sweep.accuracy_of(np.array([[0.2], [0.9]]), np.array([0, 1])) == 1.0
    assert sweep.accuracy_of(np.array([[0.7, 0.3], [0.6, 0.4]]), np.array([0, 1])) == 0.5
    assert sweep.accuracy_of(np.array([[np.nan], [0.9]]), np.array([0, 1])) is None

    def run(seed, accuracy, warnings=(), outcome="ok"):
        return {"seed": seed, "outcome": outcome, "accuracy": accuracy, "warnings": list(warnings), "seconds": 1.0}

    reference = {s: run(s, 0.9) for s in range(4)}
    counts = sweep.summarise_transform([run(0, 0.9), run(1, 0.5, ["ImageRangeWarning"]), run(2, 0.5, ["ConvergenceWarning"]),
                                        run(3, None, outcome="non_finite")], reference)
    assert (counts["runs"], counts["non_finite"], counts["drops_over_tolerance"], counts["unexplained_drops"]) == (4, 1, 2, 1)
    assert counts["mean_accuracy_drop"] == pytest.approx(0.8 / 3) and counts["max_accuracy_drop"] == pytest.approx(0.4)
    assert counts["warnings"] == {"ConvergenceWarning": 1, "ImageRangeWarning": 1}


@pytest.mark.benchmark
def test_scan_convolutions_quick(tmp_path):
    """The scan benchmark's conv2d gradients compile without loop-emitted convolutions; autodiff's do not."""
    bench = _load("scan_convolutions")
    out = tmp_path / "scan_convolutions.json"
    bench.main(["--quick", "--out", str(out)])
    report = json.loads(out.read_text())
    for row in report["gradient_step"].values():
        assert row["conv2d"]["loop_emitted_convolutions_in_scan"] == 0
        assert row["autodiff"]["loop_emitted_convolutions_in_scan"] > 0
        assert row["autodiff_over_conv2d_in_scan"] > 1.0
    assert report["fit"]["conv2d"]["step_s"] > 0 and report["fit"]["autodiff_over_conv2d"] > 1.0


def test_nuts_ess_benchmark_tiny(tmp_path):
    """The NUTS ESS/s benchmark's gpzoo side on a tiny case, without the GPflow anchor."""
    bench = _load("nuts_ess")
    out = tmp_path / "nuts_ess.json"
    report = bench.main(["--N", "30", "--M", "4", "--chains", "1", "--warmup", "20", "--samples", "20", "--out", str(out)])

    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert {"machine", "settings", "differences_from_gpflow", "gpzoo", "gpflow", "load_average_end"} <= set(report)
    assert report["gpflow"] is None and report["gpflow_note"] and report["ratio_ess_per_s_gpzoo_over_gpflow"] is None
    assert (report["settings"]["N"], report["settings"]["M"], report["settings"]["chains"]) == (30, 4, 1)
    r = report["gpzoo"]
    assert set(r["hyperparameters"]) == {"lengthscale", "variance"} and r["slowest"] in r["hyperparameters"]
    assert all(math.isfinite(h["ess_bulk"]) and h["ess_bulk"] > 0 for h in r["hyperparameters"].values())
    assert r["finite"] and math.isfinite(r["ess_per_s"]) and r["ess_per_s"] > 0
    assert r["wall_s"] >= r["sampling_s"] > 0 and r["divergences"] >= 0 and len(r["log_density_at_check_points"]) == 3


def test_gallifrey_peer_mixture_scores_and_the_run_without_the_peer(tmp_path):
    """The peer's particle mixture is scored as a mixture: one particle (or identical ones) gives the Gaussian's log
    density; two particles the log of their weighted average. Without ``--gallifrey-python`` the script says so in
    its result and the results page shows that note."""
    from scipy.stats import norm

    peer = _load("gallifrey_peer")
    y = np.array([0.3, -1.2, 2.0])
    mean, var = np.array([0.0, -1.0, 1.5]), np.array([0.5, 0.2, 1.0])
    one = peer.mixture_scores(y, mean[None], var[None], np.array([0.0]))
    np.testing.assert_allclose(one["mean_log_predictive_density"], norm.logpdf(y, mean, np.sqrt(var)).mean(), rtol=1e-12)
    twice = peer.mixture_scores(y, np.stack([mean, mean]), np.stack([var, var]), np.array([-3.0, -3.0]))
    np.testing.assert_allclose(twice["mean_log_predictive_density"], one["mean_log_predictive_density"], rtol=1e-12)
    assert twice["effective_particles"] == pytest.approx(2.0)
    other = mean + 1.0
    mixed = peer.mixture_scores(y, np.stack([mean, other]), np.stack([var, var]), np.log([0.25, 0.75]))
    expected = np.log(0.25 * norm.pdf(y, mean, np.sqrt(var)) + 0.75 * norm.pdf(y, other, np.sqrt(var))).mean()
    np.testing.assert_allclose(mixed["mean_log_predictive_density"], expected, rtol=1e-12)
    np.testing.assert_allclose(mixed["rmse"], np.sqrt(np.mean((0.25 * mean + 0.75 * other - y) ** 2)), rtol=1e-12)

    out = tmp_path / "gallifrey_peer.json"
    peer.main(["--series", "nile", "--out", str(out)])
    run = json.loads(out.read_text())["experiments"]["nile"]
    assert run["gallifrey"] is None and "not run" in run["gallifrey_note"] and run["gpzoo"] is None
    assert run["n_train"] == 80 and run["differences"]
    summarise = _load("summarise")
    page = summarise.render(tmp_path)
    assert "gallifrey_peer.py" in page and "not run" in page


@pytest.mark.benchmark
def test_kernel_search_benchmark_tiny(tmp_path, monkeypatch):
    kernel_search = _load("kernel_search")
    monkeypatch.setattr(kernel_search, "OUT", tmp_path / "kernel_search.json")
    row = kernel_search.run_series("nile", depth=1, restarts=1, steps=3, totals=kernel_search.compile_seconds())
    assert row["structures_fitted"] == 4 and row["depth"] == 1 and row["wall_s"] >= row["compile_s"] >= 0
    assert {"search", "SE", "SE + Per"} <= set(row["rows"])
    assert all(math.isfinite(r["bic"]) and r["rmse"] > 0 for r in row["rows"].values())
