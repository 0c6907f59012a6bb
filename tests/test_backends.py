"""Comparison fits on the Ray backend give the same results, report and saved models as the sequential one."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gpzoo.analysis.backends import FitOptions, FitTask, FitTaskError, run_fits
from gpzoo.analysis.cli import main
from gpzoo.models.errors import InvalidArgumentError
from conftest import TINY_CLI

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")


def _compare(out, *extra):
    argv = ["compare", "--data", "two-moons", "--models", "svgp-rbf", "--seeds", "0,1", "--out", str(out),
            *TINY_CLI, *extra]
    return main(argv)


def test_unknown_backend_and_misplaced_options_are_refused(tmp_path):
    with pytest.raises(InvalidArgumentError, match="backend"):
        run_fits([], None, None, FitOptions(steps=1, batch_size=None, learning_rate=0.1), backend="dask")
    with pytest.raises(InvalidArgumentError, match="address"):
        run_fits([], None, None, FitOptions(steps=1, batch_size=None, learning_rate=0.1), address="x")


def test_ray_backend_matches_sequential_bit_for_bit(tmp_path):
    pytest.importorskip("ray", reason='Ray is an optional extra: pip install "gpzoo[ray]"')
    assert _compare(tmp_path / "seq") == 0
    assert _compare(tmp_path / "ray", "--backend", "ray", "--cpus-per-fit", "1") == 0
    seq = pd.read_csv(tmp_path / "seq" / "comparison.csv", index_col="model")
    ray_ = pd.read_csv(tmp_path / "ray" / "comparison.csv", index_col="model")
    timing = ["fit_seconds"]
    pd.testing.assert_frame_equal(seq.drop(columns=timing).sort_index(), ray_.drop(columns=timing).sort_index())
    for run in seq.index:
        stem = run.replace(" ", "_")
        a = np.load(tmp_path / "seq" / "models" / stem / "arrays.npz")
        b = np.load(tmp_path / "ray" / "models" / stem / "arrays.npz")
        assert sorted(a.files) == sorted(b.files)
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{run}: {key}")
    assert json.loads((tmp_path / "ray" / "report.json").read_text())["groups"]


def test_a_failing_ray_task_is_named_and_the_others_are_kept(tmp_path):
    pytest.importorskip("ray", reason='Ray is an optional extra: pip install "gpzoo[ray]"')
    from gpzoo.models import zoo  # noqa: PLC0415

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(30, 2)), rng.integers(0, 2, 30).astype(float)
    good = zoo.get("svgp-rbf", input_dim=2, task="binary", num_classes=2, num_inducing=4)
    bad = zoo.get("svgp-rbf", input_dim=3, ard=True, task="binary", num_classes=2, num_inducing=4)  # 3 lengthscales, 2 columns
    tasks = [FitTask(name, spec, 0, tmp_path / name, tmp_path / "ck" / name) for name, spec in (("good", good), ("bad", bad))]
    done = []
    with pytest.raises(FitTaskError, match="bad: HyperparameterError") as failure:
        run_fits(tasks, X, y, FitOptions(steps=3, batch_size=10, learning_rate=0.05), backend="ray",
                 on_done=lambda task: done.append(task.name))
    assert "good" not in str(failure.value).split("failed", 1)[1]
    assert done == ["good"] and (tmp_path / "good" / "model.json").is_file() and not (tmp_path / "bad").exists()


def test_ray_leaves_the_interrupt_handlers_as_it_found_them(tmp_path):
    """After a Ray run, Ctrl-C still raises KeyboardInterrupt in this process (fit's checkpointing relies on it)."""
    import signal  # noqa: PLC0415

    pytest.importorskip("ray", reason='Ray is an optional extra: pip install "gpzoo[ray]"')
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    run_fits([], None, None, FitOptions(steps=1, batch_size=None, learning_rate=0.1), backend="ray")
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask  # SIGINT is not left blocked either
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
