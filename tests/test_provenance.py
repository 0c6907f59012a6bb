"""Every benchmark result records how it was made, and ``summarise.py --check`` holds the files to it.

``write_json`` adds the provenance (command, date, git commit, machine) to a report that has none;
``--check`` fails on a results file without it, or whose recorded step description is not the
``STEP_DESCRIPTION`` its script now declares, and accepts the files listed in
``RECORDED_WITHOUT_PROVENANCE`` only while they lack exactly what is written there. The benchmark
scripts run here with their measurements stubbed out, so what is checked is what a re-run writes.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_benchmarks_smoke import _load

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def common():
    return _load("_common")


@pytest.fixture
def summarise(monkeypatch):
    module = _load("summarise")
    monkeypatch.setattr(module, "RECORDED_WITHOUT_PROVENANCE", {})  # fixture files only: no accepted gaps
    return module


def complete(**extra) -> dict:
    """A report with every provenance field, as ``write_json`` records it."""
    return {"settings": {"steps": 2}, "speedup": 2.5, **extra,
            "provenance": {"command": ["benchmarks/toy.py", "--steps", "2"], "date": "2026-01-01T00:00:00+00:00",
                           "git_commit": "0" * 40, "machine": {"devices": ["TFRT_CPU_0"], "jax": "0.4.0"}}}


def tree(tmp_path: Path, summarise, files: dict, scripts: dict | None = None) -> list[str]:
    """``benchmarks/results/<stem>.json`` and ``benchmarks/<name>.py`` under ``tmp_path``, with a page
    rendered from them; returns the ``--check`` arguments for that tree."""
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    for stem, report in files.items():
        (results / f"{stem}.json").write_text(json.dumps(report))
    for name, source in (scripts or {}).items():
        (tmp_path / "benchmarks" / f"{name}.py").write_text(source)
    page = tmp_path / "results.md"
    page.write_text(f"# Results\n\n{summarise.BEGIN}\n{summarise.END}\n")
    args = ["--results", str(results), "--page", str(page)]
    assert summarise.main(args) == 0
    return [*args, "--check"]


# ----------------------------------------------------------------------------- write_json
def test_write_json_adds_provenance_with_a_relative_command_and_a_date(common, tmp_path, monkeypatch):
    out = tmp_path / "r.json"
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / "svgp_scaling.py"), "--quick", "--out",
                                      str(BENCHMARKS / "results" / "x.json"), f"--page={ROOT / 'docs' / 'results.md'}"])
    report = {"speedup": 2.5}
    common.write_json(out, report)
    written = json.loads(out.read_text())
    prov = written["provenance"]
    assert written["speedup"] == 2.5 and report["provenance"] == prov
    assert prov["command"] == ["benchmarks/svgp_scaling.py", "--quick", "--out", "benchmarks/results/x.json",
                               "--page=docs/results.md"]
    assert datetime.datetime.fromisoformat(prov["date"]).tzinfo is not None
    assert prov["git_commit"] is None or re.fullmatch(r"[0-9a-f]{40}(-dirty)?", prov["git_commit"])
    assert prov["machine"]["jax"] and prov["machine"]["devices"]
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary file, renamed

    # a script outside the repository is recorded by its name, never by this machine's path, and so
    # are absolute paths outside it among the arguments (e.g. another framework's interpreter)
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "elsewhere.py"), str(tmp_path / "data.csv"),
                                      f"--peer-python={tmp_path / 'venv' / 'bin' / 'python'}", "relative/x.csv"])
    command = common.provenance()["command"]
    assert command[0] == "elsewhere.py" and not os.path.isabs(command[0])
    assert command[1:] == ["<outside the repository>/data.csv", "--peer-python=<outside the repository>/python", "relative/x.csv"]
    assert str(tmp_path) not in json.dumps(command)


def test_write_json_leaves_an_existing_provenance_alone(common, tmp_path):
    mine = {"command": ["benchmarks/other.py"], "date": "2020-01-01T00:00:00+00:00", "git_commit": "abc"}
    common.write_json(tmp_path / "r.json", {"x": 1, "provenance": mine})
    assert json.loads((tmp_path / "r.json").read_text()) == {"x": 1, "provenance": mine}


def test_provenance_takes_settings(common):
    assert common.provenance({"steps": 3})["settings"] == {"steps": 3}
    assert "settings" not in common.provenance()


def test_git_commit_marks_tracked_changes_only(common, tmp_path):
    assert common.git_commit(tmp_path) is None  # not a repository
    if shutil.which("git") is None:
        pytest.skip("no git")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    (tmp_path / "a.txt").write_text("one")
    for args in (["init", "-q"], ["add", "a.txt"], ["commit", "-q", "-m", "one"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (tmp_path / "untracked.txt").write_text("not part of the commit")
    assert common.git_commit(tmp_path) == head
    (tmp_path / "a.txt").write_text("two")
    assert common.git_commit(tmp_path) == f"{head}-dirty"


def test_merge_results_records_each_experiments_provenance(common, tmp_path, monkeypatch):
    out = tmp_path / "merged.json"
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / "reproduce_conv.py"), "--experiment", "a"])
    common.merge_results(out, "a", {"date": "d1", "settings": {}})
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / "reproduce_conv.py"), "--experiment", "b"])
    report = common.merge_results(out, "b", {"date": "d2", "settings": {}})
    experiments = json.loads(out.read_text())["experiments"]
    assert experiments["a"]["provenance"]["command"][-1] == "a"  # the earlier run's, kept
    assert experiments["b"]["provenance"]["command"][-1] == "b"
    assert report["provenance"] == experiments["b"]["provenance"]  # the file's: the latest write's


# ----------------------------------------------------------------------------- the rule
def test_missing_provenance_reads_the_new_and_the_older_layouts(summarise):
    assert summarise.missing_provenance(complete()) == []
    assert summarise.missing_provenance({"speedup": 1}) == list(summarise.PROVENANCE_FIELDS)
    older = {"settings": {"steps": 2}, "created": "2026-01-01", "machine": {"devices": ["cpu:0"], "jax": "0.4"}}
    assert summarise.missing_provenance(older) == ["command", "git commit"]
    assert summarise.missing_provenance({"setting": {"B": 4}, "date": "d", "environment": {"device": "cpu:0"}}) == \
        ["command", "versions", "git commit"]
    assert "settings" in summarise.missing_provenance({"protocol": "a sentence, not settings", "date": "d"})
    block = {"date": "d", "settings": {"steps": 1}, "machine": {"devices": ["cpu:0"], "jax": "0.4"}}
    experiments = {"experiments": {"a": block, "b": dict(block, machine={"devices": ["cpu:0"]})}, "updated": "d"}
    assert summarise.missing_provenance(experiments) == ["command", "versions (b)", "git commit"]
    per_run = {"experiments": {"a": complete(), "b": complete()}, "provenance": complete()["provenance"]}
    assert summarise.missing_provenance(per_run) == []
    assert summarise.missing_provenance(dict(per_run, experiments={"a": complete(), "b": block})) == \
        ["command (b)", "git commit (b)"]


def test_check_fails_on_a_file_without_provenance_and_passes_with_it(summarise, tmp_path, capsys):
    assert summarise.main(tree(tmp_path / "good", summarise, {"toy": complete()})) == 0
    capsys.readouterr()
    check = tree(tmp_path / "bad", summarise, {"toy": complete(), "bare": {"speedup": 2.5, "date": "2026-01-01"}})
    assert summarise.main(check) == 1
    err = capsys.readouterr().err
    assert "bare.json: incomplete provenance: recorded without command, settings, device, versions, git commit" in err
    assert "toy.json" not in err
    page = Path(check[check.index("--page") + 1]).read_text()
    assert "Provenance incomplete: recorded without command, settings, device, versions, git commit; re-run to complete." in page
    assert page.count("Provenance incomplete") == 1


STEP_SCRIPT = '''"""A toy benchmark."""
STEP_DESCRIPTION = ("one Adam step of the toy model "
                    "on a batch of 8")
raise SystemExit("the check must read this script, not import it")
'''


def test_check_fails_on_a_stale_step_description_and_passes_when_equal(summarise, tmp_path, capsys):
    now_runs = "one Adam step of the toy model on a batch of 8"
    same = tree(tmp_path / "same", summarise, {"toy": complete(step_description=now_runs)}, {"toy": STEP_SCRIPT})
    assert summarise.main(same) == 0
    capsys.readouterr()

    stale = tree(tmp_path / "stale", summarise, {"toy": complete(step_description="one L-BFGS step")}, {"toy": STEP_SCRIPT})
    assert summarise.main(stale) == 1
    err = capsys.readouterr().err
    assert "toy.json: stale step description: records the step 'one L-BFGS step'; benchmarks/toy.py now runs" in err

    # a file named otherwise is matched to its script through the command it recorded
    unrecorded = tree(tmp_path / "unrecorded", summarise, {"toy_8cores": complete()}, {"toy": STEP_SCRIPT})
    assert summarise.main(unrecorded) == 1
    assert "toy_8cores.json: stale step description: records no step_description" in capsys.readouterr().err
    page = Path(unrecorded[unrecorded.index("--page") + 1]).read_text()
    assert "recorded without current step description; re-run to complete." in page


def test_an_svgp_scaling_file_of_an_older_step_is_stale_against_its_script(summarise, tmp_path, capsys):
    """A results file of svgp_scaling recorded before the step changed (its description names a
    TraceMeanField_ELBO step, and it records no step description) is stale against the script, which
    runs FastELBO; the same file recording the script's step description is not."""
    current = json.loads((BENCHMARKS / "results" / "svgp_scaling.json").read_text())
    report = {k: v for k, v in current.items() if k != "step_description"} | {
        "description": "seconds per SVI step (svi.update of svgp-rbf, TraceMeanField_ELBO, optax Adam, whitened full-rank "
                       "q(u), Gaussian likelihood) against a hand-written JAX value_and_grad + Adam step"}
    report["provenance"] = complete()["provenance"] | {"command": ["benchmarks/svgp_scaling.py"]}
    declared = summarise.declared_step(BENCHMARKS / "svgp_scaling.py")
    assert "FastELBO" in declared and "TraceMeanField" not in declared
    check = tree(tmp_path / "old", summarise, {"svgp_scaling": report},
                 {"svgp_scaling": (BENCHMARKS / "svgp_scaling.py").read_text()})
    assert summarise.main(check) == 1
    assert "svgp_scaling.json: stale step description: records no step_description (its description:" in capsys.readouterr().err
    check = tree(tmp_path / "new", summarise, {"svgp_scaling": dict(report, step_description=declared)},
                 {"svgp_scaling": (BENCHMARKS / "svgp_scaling.py").read_text()})
    assert summarise.main(check) == 0


def test_listed_legacy_files_are_accepted_only_while_they_lack_what_is_listed(summarise, tmp_path, capsys, monkeypatch):
    legacy = {"settings": {"steps": 2}, "date": "2026-01-01", "machine": {"devices": ["cpu:0"], "jax": "0.4"}}
    monkeypatch.setattr(summarise, "RECORDED_WITHOUT_PROVENANCE", {"old": "command, git commit"})
    assert summarise.main(tree(tmp_path / "listed", summarise, {"old": legacy})) == 0
    assert "warning: old.json: recorded without command, git commit" in capsys.readouterr().err

    assert summarise.main(tree(tmp_path / "rerun", summarise, {"old": complete()})) == 1
    assert "old.json: provenance now complete: remove 'old' from RECORDED_WITHOUT_PROVENANCE" in capsys.readouterr().err

    worse = {k: v for k, v in legacy.items() if k != "date"}
    assert summarise.main(tree(tmp_path / "worse", summarise, {"old": worse})) == 1
    assert "old.json: recorded without command, date, git commit, but RECORDED_WITHOUT_PROVENANCE says" in capsys.readouterr().err


def test_the_repository_results_lack_only_what_is_listed():
    summarise = _load("summarise")
    errors, warnings = summarise.provenance_problems(summarise.RESULTS)
    assert errors == []
    assert len(warnings) == len(summarise.RECORDED_WITHOUT_PROVENANCE)
    # the SVGP step timings were re-run with the step the script runs now: complete, and not stale
    assert not any(w.startswith("svgp_scaling.json") for w in warnings)
    recorded = json.loads((summarise.RESULTS / "svgp_scaling.json").read_text())
    assert recorded["step_description"] == summarise.declared_step(BENCHMARKS / "svgp_scaling.py")


def test_step_description_must_be_a_literal(summarise, tmp_path):
    script = tmp_path / "s.py"
    script.write_text("X = 'a'\nSTEP_DESCRIPTION = X\n")
    with pytest.raises(ValueError):
        summarise.declared_step(script)
    script.write_text("STEP_DESCRIPTION: str = 'a' 'b'\n")
    assert summarise.declared_step(script) == "ab"
    script.write_text("def f():\n    STEP_DESCRIPTION = 'local'\n")
    assert summarise.declared_step(script) is None


def test_a_rerun_of_svgp_scaling_records_complete_provenance(tmp_path, monkeypatch):
    """svgp_scaling.py (the timing itself stubbed out) writes its step description and provenance,
    so its re-run leaves the check nothing to report."""
    svgp_scaling = _load("svgp_scaling")

    def timed(cfg, steps, repeats, seed=0):
        return {"N": cfg.N, "M": cfg.M, "D": cfg.D, "B": cfg.B, "dtype": cfg.dtype, "sweeps": list(cfg.sweeps),
                "gpzoo_step_s": 1e-3, "reference_step_s": 1e-3, "ratio": 1.0, "ratio_cpu": 1.0, "loss_rel_diff": 0.0}

    monkeypatch.setattr(svgp_scaling, "run_config", timed)
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / "svgp_scaling.py"), "--quick"])
    summarise = _load("summarise")
    monkeypatch.setattr(summarise, "RECORDED_WITHOUT_PROVENANCE", {})
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    out = tmp_path / "benchmarks" / "results" / "svgp_scaling.json"
    shutil.copy(BENCHMARKS / "svgp_scaling.py", tmp_path / "benchmarks" / "svgp_scaling.py")
    svgp_scaling.main(["--quick", "--N", "1000", "--M", "8", "--D", "2", "--no-float64", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["step_description"] == svgp_scaling.STEP_DESCRIPTION
    assert report["provenance"]["command"] == ["benchmarks/svgp_scaling.py", "--quick"]
    if report["provenance"]["git_commit"] is not None:  # a checkout without git cannot record its commit
        assert summarise.missing_provenance(report) == []
        assert summarise.provenance_problems(out.parent) == ([], [])
    assert summarise.stale_step(out, report) is None


# ----------------------------------------------------------------------------- the scripts record it
# Each script runs with its measurement stubbed out: what is checked is what it writes, not what it measures.
def _script(monkeypatch, name: str, *argv: str):
    """Benchmark script ``name``, loaded as a module, with ``sys.argv`` as a run of it with ``argv`` would have it."""
    monkeypatch.setattr(sys, "argv", [str(BENCHMARKS / f"{name}.py"), *argv])
    return _load(name)


def _written_with_provenance(out: Path, returned: dict, name: str) -> dict:
    """The report at ``out``: the one the script returned, with this run's provenance (its command
    the script's, relative to the repository) and every field ``--check`` asks for."""
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(returned))
    assert written["provenance"]["command"][0] == f"benchmarks/{name}.py"
    summarise = _load("summarise")
    recorded_commit = written["provenance"]["git_commit"] is not None  # a checkout without git cannot record it
    assert summarise.missing_provenance(written) == ([] if recorded_commit else ["git commit"])
    return written


def test_conv_kernels_writes_through_write_json(tmp_path, monkeypatch):
    conv_kernels = _script(monkeypatch, "conv_kernels", "--quick")
    names = ("exp", "matmul", "elbo_step", "elbo_step_autodiff_kuf", "kff_checkpoint", "kff_fused", "kuf_matmul",
             "kuf_conv", "kuf_matmul_grad", "kuf_conv_grad", "kuf_fused_grad")
    setting = {"B": 2, "P": 4, "M": 3, "E": 9, "matmul_n": 8, "located_patches": False}
    monkeypatch.setattr(conv_kernels, "build_cases", lambda *args, **kwargs: ({}, {"kff": True}, {}, setting))
    monkeypatch.setattr(conv_kernels, "measure", lambda cases, repeats: {n: {"wall_s": 1e-3, "cpu_s": 1e-3} for n in names})
    out = tmp_path / "conv_kernels.json"
    report = conv_kernels.main(["--quick", "--out", str(out)])
    written = _written_with_provenance(out, report, "conv_kernels")
    assert written["setting"] == setting and written["agreement"] == {"kff": True}


def test_gpflow_side_by_side_records_its_settings_machine_and_date(tmp_path, monkeypatch):
    gpflow_side_by_side = _script(monkeypatch, "gpflow_side_by_side", "--quick", "--no-gpflow")
    result = {"gpzoo": {"median_step_s": 1e-3, "test_error": 0.5}, "gpflow": {"skipped": True, "reason": "--no-gpflow"}}
    monkeypatch.setattr(gpflow_side_by_side, "run_config", lambda name, args, python, directory, model, seed: dict(result))
    out = tmp_path / "gpflow_side_by_side.json"
    report = gpflow_side_by_side.main(["--quick", "--no-gpflow", "--configs", "rectangles", "--out", str(out)])
    written = _written_with_provenance(out, report, "gpflow_side_by_side")
    assert written["settings"] == {"configs": "rectangles", "steps": 8, "timed": 4, "warmup": 2, "chunk": 2, "seed": 0,
                                   "seeds": 1, "models": "weighted-conv", "link": "logit", "evaluate_at": [],
                                   "no_install": False, "no_gpflow": True, "quick": True}  # as run, after --quick
    assert written["machine"]["devices"] and written["machine"]["jax"] and written["machine"]["loadavg_after"]
    assert written["results"] == {"rectangles": result}


def test_invariance_toy_records_its_machine_and_date(tmp_path, monkeypatch):
    invariance_toy = _script(monkeypatch, "invariance_toy")
    out = tmp_path / "invariance_toy.json"
    monkeypatch.setattr(invariance_toy, "OUT", out)
    monkeypatch.setattr(invariance_toy.datasets, "load", lambda *args, **kwargs: None)
    monkeypatch.setattr(invariance_toy, "run_one", lambda name, data, seed: {"elbo": -1.0, "train_rmse": 0.1,
                                                                             "test_rmse": 0.2, "fit_seconds": 1.0})
    report = invariance_toy.main()
    written = _written_with_provenance(out, report, "invariance_toy")
    assert written["machine"]["devices"] and datetime.datetime.fromisoformat(written["date"])
    assert written["settings"]["steps"] == invariance_toy.STEPS and len(written["summary"]) == 4


def test_polya_gamma_throughput_records_its_settings(tmp_path, monkeypatch):
    pytest.importorskip("polyagamma")
    polya_gamma_throughput = _script(monkeypatch, "polya_gamma_throughput", "--repeats", "2")
    monkeypatch.setattr(polya_gamma_throughput, "measure", lambda c, draws, repeats, seed: {
        "c": c, "ours_draws_per_s": 2.0, "polyagamma_draws_per_s": 1.0, "ratio": 2.0, "cpu_ratio": 2.0})
    out = tmp_path / "polya_gamma_throughput.json"
    report = polya_gamma_throughput.main(["--repeats", "2", "--draws", "10", "--out", str(out)])
    written = _written_with_provenance(out, report, "polya_gamma_throughput")
    assert written["settings"] == {"repeats": 2, "draws": 10, "seed": 0}
    assert written["num_draws"] == 10 and written["min_ratio"] == 2.0


def test_dkm_step_records_its_settings(tmp_path, monkeypatch):
    dkm_step = _script(monkeypatch, "dkm_step", "--configs", "sine")
    monkeypatch.setattr(dkm_step, "measure", lambda name, args: {"ratios": {"straightforward_over_gpzoo": 3.0}})
    out = tmp_path / "dkm_step.json"
    report = dkm_step.main(["--configs", "sine", "--repeats", "1", "--steps", "2", "--out", str(out)])
    written = _written_with_provenance(out, report, "dkm_step")
    assert written["settings"] == {"repeats": 1, "steps": 2, "configs": ["sine"], "reference_python": None,
                                   "reference_repo": None}
    assert written["configs"] == {"sine": {"ratios": {"straightforward_over_gpzoo": 3.0}}}


def test_kernel_search_records_each_series_settings(tmp_path, monkeypatch):
    kernel_search = _script(monkeypatch, "kernel_search", "--series", "co2,nile", "--depth", "1")
    out = tmp_path / "kernel_search.json"
    monkeypatch.setattr(kernel_search, "OUT", out)
    monkeypatch.setattr(kernel_search, "compile_seconds", collections.Counter)
    row = {"structure": "SE", "bic": 1.0, "rmse": 0.1, "mean_log_predictive_density": -1.0}
    monkeypatch.setattr(kernel_search, "run_series", lambda name, depth, restarts, steps, totals, continue_parents: {
        "rows": {"search": row}, "wall_s": 1.0, "compile_s": 0.5, "structures_fitted": 3})
    kernel_search.main()
    written = json.loads(out.read_text())
    assert set(written["experiments"]) == {"co2", "nile"}
    for experiment in written["experiments"].values():
        assert experiment["settings"] == {"series": "co2,nile", "depth": 1, "restarts": 5, "steps": 60,
                                          "continue_parents": False}
        assert experiment["provenance"]["command"] == ["benchmarks/kernel_search.py", "--series", "co2,nile", "--depth", "1"]
    recorded_commit = written["provenance"]["git_commit"] is not None
    assert _load("summarise").missing_provenance(written) == ([] if recorded_commit else ["git commit"])


def test_report_phase_records_its_settings(tmp_path, monkeypatch):
    report_phase = _script(monkeypatch, "report_phase", "--repeats", "1")
    run = {"models": 3, "fit_s": 2.0, "report_s": 1.0, "ratio": 0.5, "fit_cpu_s": 2.0, "report_cpu_s": 1.0, "cpu_ratio": 0.5,
           "process_wall_s": 4.0, "load_average": [1.0, 1.0, 1.0]}
    monkeypatch.setattr(report_phase, "run_once", lambda extra: dict(run))
    out = tmp_path / "report_phase.json"
    report = report_phase.main(["--repeats", "1", "--out", str(out), "--", "--steps", "3"])
    written = _written_with_provenance(out, report, "report_phase")
    assert written["settings"] == {"repeats": 1, "extra": ["--steps", "3"]}
    assert written["command"][-2:] == ["--steps", "3"] and written["median_ratio"] == 0.5


def test_a_part_rerun_of_compile_once_records_its_own_provenance(tmp_path, monkeypatch):
    compile_once = _script(monkeypatch, "compile_once", "--only", "repeated")
    earlier = {"command": ["benchmarks/compile_once.py"], "date": "2020-01-01T00:00:00+00:00", "git_commit": "0" * 40}
    out = tmp_path / "compile_once.json"
    out.write_text(json.dumps({"first_fit": {"kept": True}, "provenance": earlier}))
    monkeypatch.setattr(compile_once, "repeated", lambda: {"fits": []})
    report = compile_once.main(["--only", "repeated", "--out", str(out)])
    written = _written_with_provenance(out, report, "compile_once")
    assert written["first_fit"] == {"kept": True} and written["repeated"] == {"fits": []}
    assert written["provenance"]["command"] == ["benchmarks/compile_once.py", "--only", "repeated"]
    assert written["provenance"]["date"] != earlier["date"]


def test_a_robustness_sweep_merge_drops_the_earlier_provenance(common, tmp_path, monkeypatch):
    robustness_sweep = _script(monkeypatch, "robustness_sweep", "--models", "b", "--merge")
    protocol = {"data": "rectangles", "seeds": 2, "steps": 10, "elbo_samples": 4}
    earlier = {"command": ["benchmarks/robustness_sweep.py"], "date": "2020-01-01T00:00:00+00:00", "git_commit": "0" * 40}
    old = {"date": "2020-01-01", "machine": {}, "protocol": dict(protocol), "provenance": earlier,
           "results": {"float32": {"models": {"a": {"runs": 2}}, "failures": []}}}
    new = {"date": "2026-01-01", "machine": {}, "seconds": 1.0, "protocol": dict(protocol),
           "results": {"float32": {"models": {"b": {"runs": 2}}, "failures": []}}}
    merged = robustness_sweep.merge_reports(old, new, ["b"], 10, {}, None)
    assert "provenance" not in merged and old["provenance"] == earlier
    assert set(merged["results"]["float32"]["models"]) == {"a", "b"}
    common.write_json(tmp_path / "merged.json", merged)
    assert merged["provenance"]["command"] == ["benchmarks/robustness_sweep.py", "--models", "b", "--merge"]


def test_a_long_run_records_the_commit_it_started_from(common, monkeypatch):
    """The commit and start time are taken once, when the process starts: a checkout that changes while a
    long run writes its report after every part does not change what the report says the run ran."""
    start = common.process_start()
    monkeypatch.setattr(common, "git_commit", lambda root=None: "f" * 40 + "-dirty")
    monkeypatch.setattr(common, "now", lambda: "2099-01-01T00:00:00+00:00")
    record = common.provenance()
    assert (record["git_commit"], record["started"]) == (start["git_commit"], start["started"])
    assert record["date"] == "2099-01-01T00:00:00+00:00"  # the record's own date is the write's
