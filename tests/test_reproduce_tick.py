"""The Dutordoir et al. 2020 benchmark scripts run against the library; E2's data set is what it claims to be.

``--quick`` runs check plumbing and JSON layout only (numbers meaningless) and, at about a minute,
are ``-m benchmark`` like the run of E2 at its real (CPU-sized) settings that checks its goal.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from test_reproduce_smoke import _load


def test_location_bars_differ_only_in_where_the_bar_is():
    """Every image has the same multiset of 3×3 patches (so Σ_p g(x^[p]) cannot tell the classes apart),
    yet the bar's row gives the label; moving the bar to the image border breaks the equality."""
    tick = _load("reproduce_tick")
    X, y = tick.location_bars(60, seed=3)
    assert set(np.unique(y)) == {0, 1} and np.all(X.sum(axis=1) == tick.E2_BAR)
    rows = np.argmax(X.reshape(60, tick.E2_SIZE, tick.E2_SIZE).sum(axis=2), axis=1)
    assert np.all((rows < tick.E2_SIZE // 2) == (y == 0))
    assert tick.same_patch_multisets(X)
    edge = X[:1].reshape(tick.E2_SIZE, tick.E2_SIZE).copy()
    edge = np.roll(edge, -rows[0], axis=0)  # the bar on row 0: fewer windows see it
    assert not tick.same_patch_multisets(np.concatenate([X[:1], edge.reshape(1, -1)]))


@pytest.mark.benchmark
def test_reproduce_tick_and_step_benchmark_quick(tmp_path):
    tick = _load("reproduce_tick")
    out = tmp_path / "tick.json"
    tick.main(["--quick", "--experiment", "e2", "--models", "tick", "--out", str(out)])
    tick.main(["--quick", "--experiment", "e3", "--models", "deep-tick/3", "--out", str(out)])  # 3 layers, marginal sampling
    report = json.loads(out.read_text())["experiments"]
    assert set(report) == {"e2", "e3"} and report["e2"]["settings"]["conv_indistinguishable"]
    record = report["e2"]["models"]["tick"]
    for key in ("steps", "s_per_step", "elbo", "elbo_stderr", "top1_error", "top2_error", "nll", "nll_misclassified"):
        assert key in record, key
    assert set(record["location_lengthscales"]) == {"kernel.location_lengthscale"}
    e3 = report["e3"]
    assert "top1_error" in e3["models"]["deep-tick/3"] and e3["settings"]["reduced"]
    assert (e3["settings"]["hidden_sampling"], e3["settings"]["hidden_channels"]) == ("marginal", 4)

    step = _load("deep_conv_step")
    out = tmp_path / "step.json"
    report = step.main(["--quick", "--out", str(out)])
    assert report["agreement"]["rel_diff"] < 1e-4  # the straightforward step computes the same bound
    assert report["timings"]["gpzoo"]["cpu_s"] > 0 and report["speedup_over_straightforward"]["cpu_s"] > 0
    assert json.loads(out.read_text())["counts"]["exps"] > 0


@pytest.mark.benchmark
def test_e2_conv_is_at_chance_and_tick_separates(tmp_path):
    report = _load("reproduce_tick").main(["--experiment", "e2", "--out", str(tmp_path / "e2.json")])
    assert report["experiments"]["e2"]["goal"]["met"]


def _payload(seed: int, conv: dict, tick: dict, num_train: int = 100) -> dict:
    settings = {"dataset": "mnist-10", "num_train": num_train, "num_test": 50, "num_inducing": 10, "steps": 5,
                "patch_shape": [5, 5], "dtype": "float32", "seed": seed}
    models = {"weighted-conv": dict(conv, steps=5), "weighted-tick": dict(tick, steps=5)}
    payload = {"date": f"2026-01-0{seed + 1}", "machine": {"seed": seed}, "settings": settings, "models": models}
    payload["goal"] = _load("reproduce_tick").goal("e1", models)
    return payload


def test_seeds_combine_into_means_spreads_and_a_goal_judged_on_both():
    """Two seeds' E1 records: the mean and sample s.d. of every averaged metric, each seed's record kept, and the
    goal judged on the means and on every seed alone (here the means favour TICK but seed 1 does not)."""
    tick = _load("reproduce_tick")
    a = _payload(0, {"elbo": -300.0, "top1_error": 0.2, "nll": 0.5}, {"elbo": -200.0, "top1_error": 0.1, "nll": 0.3})
    b = _payload(1, {"elbo": -250.0, "top1_error": 0.2, "nll": 0.5}, {"elbo": -260.0, "top1_error": 0.15, "nll": 0.4})
    combined = tick.combine_seeds("e1", [a, b])
    conv, tk = combined["models"]["weighted-conv"], combined["models"]["weighted-tick"]
    assert conv["elbo"] == pytest.approx(-275.0) and conv["elbo_sd"] == pytest.approx(np.std([-300, -250], ddof=1))
    assert tk["top1_error"] == pytest.approx(0.125) and tk["nll"] == pytest.approx(0.35) and tk["num_seeds"] == 2
    assert combined["settings"]["seeds"] == [0, 1] and set(combined["seeds"]) == {"0", "1"}
    assert combined["seeds"]["1"]["models"]["weighted-tick"]["elbo"] == -260.0
    assert a["goal"]["met"] and not b["goal"]["met"]
    assert combined["goal"]["met"] and combined["goal"]["met_every_seed"] is False
    assert tick.combine_seeds("e1", [a]) is a  # one seed: the record as it is


def test_seeds_of_different_runs_are_refused():
    tick = _load("reproduce_tick")
    record = {"elbo": -1.0, "top1_error": 0.1, "nll": 0.2}
    with pytest.raises(SystemExit, match="num_train"):
        tick.combine_seeds("e1", [_payload(0, record, record), _payload(1, record, record, num_train=200)])
    with pytest.raises(SystemExit, match="seeds repeat"):
        tick.combine_seeds("e1", [_payload(0, record, record), _payload(0, record, record)])


def test_combine_files_merges_per_seed_files_into_the_results(tmp_path):
    tick = _load("reproduce_tick")
    files = []
    for seed, elbo in ((1, -10.0), (0, -20.0)):
        path = tmp_path / f"s{seed}.json"
        record = {"elbo": elbo, "top1_error": 0.1, "nll": 0.2}
        path.write_text(json.dumps({"experiments": {"e1": _payload(seed, record, record)}}))
        files.append(path)
    out = tmp_path / "out.json"
    out.write_text(json.dumps({"experiments": {"e2": {"kept": True}}}))
    report = tick.main(["--combine", *map(str, files), "--out", str(out)])
    assert report["experiments"]["e2"] == {"kept": True}
    assert report["experiments"]["e1"]["settings"]["seeds"] == [0, 1]
    assert report["experiments"]["e1"]["models"]["weighted-conv"]["elbo"] == pytest.approx(-15.0)
