"""The deep-kernel-machine benchmark scripts still run against the library (tiny settings).

The runs are ``-m benchmark`` (each costs tens of seconds even at tiny settings): the quick §4.2
toy grid, the conv ablation (Table 3's seven rows) and the step timing. The ablation rows'
configurations and the goal-line rule are checked without running anything.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

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
    module = _load("reproduce_dkm")
    report = _report("reproduce_dkm", ["--quick", "--depth", "2", "--width", "4"], tmp_path)
    assert [r["config"] for r in report["runs"]] == list(module.CONFIGS)
    for r in report["runs"]:
        assert r["failed"] or 0.0 <= r["test_accuracy"] <= 1.0
        assert r["settings"] == module.row_settings(r["config"], _recorded_args(module, report))
    assert report["settings"]["n_test"] == 360 and "goal_unjudged" in report["summary"]  # 5 steps: at chance


def _recorded_args(module, report) -> argparse.Namespace:
    """The command-line arguments a report records (its optimizer by description)."""
    settings = dict(report["settings"])
    settings["optimizer"] = next(k for k, text in module.OPTIMIZERS.items() if text == settings["optimizer"])
    return argparse.Namespace(**settings)


def _paper_args(**overrides):
    return argparse.Namespace(**({"taylor_form": "milsom_eq8", "nu": 1e-3, "skr_gamma": None, "steps": 1200,
                                  "optimizer": "paper"} | overrides))


def test_each_ablation_row_runs_what_the_paper_names_it():
    """Milsom et al. 2024, Table 3: the row's SKR switch, jitter λ, KL form, ν and schedule."""
    rows = {name: _load("reproduce_dkm").row_settings(name, _paper_args()) for name in _load("reproduce_dkm").CONFIGS}
    full = rows["full"]
    assert (full["skr"], full["skr_jitter"], full["kl"], full["nu"], full["steps"]) == (True, 0.1, "milsom_eq8", 1e-3, 1200)
    assert full["lr_drop_fractions"] == [800 / 1200, 1100 / 1200]
    expected_changes = {"no_taylor": {"kl": "exact"}, "no_skr": {"skr": False, "skr_jitter": 0.0},
                        "no_taylor_no_skr": {"kl": "exact", "skr": False, "skr_jitter": 0.0},
                        "no_skr_keep_jitter": {"skr": False}, "nu0": {"nu": 0.0},
                        "short_schedule": {"schedule": "short", "steps": 200, "lr_drop_fractions": [0.8, 0.9]}}
    for name, changes in expected_changes.items():
        differing = {k: v for k, v in rows[name].items() if full[k] != v}
        assert differing == changes, name
    assert _load("reproduce_dkm").row_settings("full", _paper_args(optimizer="constant"))["lr_drop_fractions"] == []


def test_the_recorded_ablation_ran_each_row_as_named():
    """The committed Table 3 run: every run's recorded settings are its row's, at the file's settings."""
    module = _load("reproduce_dkm")
    report = json.loads((Path(module.__file__).parent / "results" / "reproduce_dkm.json").read_text())
    assert {r["config"] for r in report["runs"]} == set(module.CONFIGS) and len(report["settings"]["seeds"]) >= 3
    for r in report["runs"]:
        assert r["settings"] == module.row_settings(r["config"], _recorded_args(module, report)), r["config"]


def _stats(accuracy, gap=0.02, nll=0.5):
    return {"runs": 3, "failures": 0, "test_accuracy": {"mean": accuracy, "sem": 0.01}, "gap": {"mean": gap, "sem": 0.01},
            "train_accuracy": {"mean": accuracy + gap, "sem": 0.01}, "test_nll": {"mean": nll, "sem": 0.01}}


@pytest.mark.parametrize("full_accuracy, judged", [(0.104, False), (0.80, True)])
def test_a_goal_line_is_printed_only_when_both_sides_are_above_chance(full_accuracy, judged):
    """10.4 % on 360 points of 10 classes is chance: the line says why it cannot be judged instead of a yes."""
    summary = {"full": _stats(full_accuracy, gap=0.001), "no_skr": _stats(0.81, gap=0.05)}
    report = {"summary": summary, "runs": [{"config": "full"}, {"config": "no_skr"}], "settings": {
        "data": "digits-8x8 (1437 train / 360 test, 10 classes)", "depth": 2, "width": 16, "batch_size": 64, "nu": 1e-3,
        "steps": 300, "seeds": [0, 1, 2], "configs": ["full", "no_skr"]}}
    text = "\n".join(_load("summarise").FORMATTERS["reproduce_dkm"](report))
    assert ("cannot be judged" in text) is not judged and ("SKR gap smaller **yes**" in text) is judged
    if not judged:
        assert "full is at chance (10.4 %" in text
    module = _load("reproduce_dkm")
    runs = [{"config": name, "seed": seed, "failed": False, "test_accuracy": acc, "test_nll": 0.5, "train_accuracy": acc,
             "gap": 0.0} for name, acc in (("full", full_accuracy), ("no_skr", 0.81)) for seed in range(3)]
    assert ("goal_unjudged" in module.summarise(runs, 360)) is not judged
    assert ("goal_skr_gap_smaller" in module.summarise(runs, 360)) is judged


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

