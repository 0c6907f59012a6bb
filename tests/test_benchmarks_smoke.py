"""Benchmarks still run against the library (STYLE.md: every script is exercised by a test)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
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
