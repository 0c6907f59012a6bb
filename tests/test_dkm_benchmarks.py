"""The deep-kernel-machine benchmark scripts still run against the library (tiny settings).

Everything here is ``-m benchmark`` (each run costs tens of seconds even at tiny settings): the
quick §4.2 toy grid, the conv ablation (3 configurations) and the step timing.
"""

from __future__ import annotations

import json

import pytest

from test_benchmarks_smoke import _load


def _report(script: str, args: list[str], tmp_path) -> dict:
    """Run ``benchmarks/<script>.py`` with ``args`` and return the JSON it wrote."""
    out = tmp_path / f"{script}.json"
    _load(script).main([*args, "--out", str(out)])
    return json.loads(out.read_text())


@pytest.mark.benchmark
def test_sine_toy_records_a_condition_trace_per_run(tmp_path):
    report = _report("dkm_sine_toy", ["--quick", "--steps", "20", "--record-every", "10"], tmp_path)
    assert report["settings"]["num_inducing"] == 100 and report["settings"]["dtype"] == "float64"
    runs = [r for sweep in report["results"].values() for r in sweep]
    assert len(runs) == 2 + 3 + 3
    for r in runs:
        assert r["failure"] is None and [s for s, _ in r["condition_trace"]] == [10, 20]
        assert all(c >= 1.0 for _, c in r["condition_trace"]) and 0.0 <= r["train_accuracy"] <= 1.0


@pytest.mark.benchmark
def test_conv_ablation_quick(tmp_path):
    report = _report("reproduce_dkm", ["--quick", "--depth", "2", "--width", "4"], tmp_path)
    assert [r["config"] for r in report["runs"]] == ["full", "no_skr", "no_taylor"]
    for r in report["runs"]:
        assert r["failed"] or 0.0 <= r["test_accuracy"] <= 1.0


@pytest.mark.benchmark
def test_step_benchmark_is_like_for_like(tmp_path):
    report = _report("dkm_step", ["--repeats", "1", "--steps", "1"], tmp_path)
    assert set(report["configs"]) == {"conv", "sine"}
    for name, cfg in report["configs"].items():
        assert cfg["like_for_like"]["loss_rel_diff"] < 2e-3, name  # the same objective (MC softmax noise aside)
        assert cfg["gpzoo"]["step_s"] > 0 and cfg["straightforward"]["step_s"] > 0
        assert cfg["matmul_bound"]["bound_step_s"] > 0 and cfg["gpzoo"]["peak_rss_bytes_own_process"] > 0
        assert "skipped" in cfg["reference"]  # no torch interpreter given
    assert report["configs"]["conv"]["gpzoo"]["float32_clean"]  # no float64 array op in the float32 step
    assert report["configs"]["sine"]["step"]["dtype"] == "float64"


def test_an_interrupted_ablation_keeps_its_finished_runs(tmp_path, monkeypatch, float32):
    """Each finished (configuration, seed) run is written at once: a sweep stopped after its first run
    leaves that run on disk, marked incomplete, and the summary renders it as partial. (The script turns
    x64 off when it loads, as its runs are float32; conftest's autouse fixture restores the flag after.)"""
    module = _load("reproduce_dkm")
    calls = []

    def fake_run(name, data, seed, args):
        if calls:
            raise KeyboardInterrupt
        calls.append(name)
        return {"config": name, "seed": seed, "failed": False, "seconds": 1.0, "train_accuracy": 0.9,
                "test_accuracy": 0.8, "train_nll": 0.3, "test_nll": 0.5, "gap": 0.1, "final_elbo": -1.0,
                "gram_condition_end": {}}

    monkeypatch.setattr(module, "run", fake_run)
    out = tmp_path / "reproduce_dkm.json"
    with pytest.raises(KeyboardInterrupt):
        module.main(["--configs", "full", "no_skr", "--seeds", "0", "1", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["complete"] is False and [(r["config"], r["seed"]) for r in report["runs"]] == [("full", 0)]
    assert report["summary"]["full"]["runs"] == 1 and report["summary"]["no_skr"]["runs"] == 0
    lines = _load("summarise").FORMATTERS["reproduce_dkm"](report)
    assert any("Partial: 1 of 4 planned runs" in line for line in lines)
