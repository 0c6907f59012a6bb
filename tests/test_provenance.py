"""Every benchmark result records how it was made, and ``summarise.py --check`` holds the files to it.

``write_json`` adds the provenance (command, date, git commit, machine) to a report that has none;
``--check`` fails on a results file without it, or whose recorded step description is not the
``STEP_DESCRIPTION`` its script now declares, and accepts the files listed in
``RECORDED_WITHOUT_PROVENANCE`` only while they lack exactly what is written there.
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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

    # a script outside the repository is recorded by its name, never by this machine's path
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "elsewhere.py"), str(tmp_path / "data.csv")])
    command = common.provenance()["command"]
    assert command[0] == "elsewhere.py" and not os.path.isabs(command[0])


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


def test_svgp_scaling_json_is_stale_against_its_script(summarise, tmp_path, capsys):
    """The recorded svgp_scaling.json describes a TraceMeanField_ELBO step; the script now runs FastELBO."""
    report = json.loads((BENCHMARKS / "results" / "svgp_scaling.json").read_text())
    report["provenance"] = complete()["provenance"] | {"command": ["benchmarks/svgp_scaling.py"]}
    declared = summarise.declared_step(BENCHMARKS / "svgp_scaling.py")
    assert "FastELBO" in declared and "TraceMeanField" in report["description"]
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
    assert "svgp_scaling.json: recorded without command, date, git commit, current step description" in \
        next(w for w in warnings if "svgp_scaling" in w)


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
