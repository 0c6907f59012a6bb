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
    tick.main(["--quick", "--experiment", "e3", "--models", "deep-tick/3", "--out", str(out)])  # a timing run: no ELBO, no prediction
    report = json.loads(out.read_text())["experiments"]
    assert set(report) == {"e2", "e3"} and report["e2"]["settings"]["conv_indistinguishable"]
    record = report["e2"]["models"]["tick"]
    for key in ("steps", "s_per_step", "elbo", "elbo_stderr", "top1_error", "top2_error", "nll", "nll_misclassified"):
        assert key in record, key
    assert set(record["location_lengthscales"]) == {"kernel.location_lengthscale"}
    assert report["e3"]["models"]["deep-tick/3"]["timing_only"] and report["e3"]["settings"]["reduced"]

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
