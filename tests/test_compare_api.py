"""gpzoo.compare: the Python face of `gpzoo compare` (same fits, same report, Ray or sequential)."""

from __future__ import annotations

import pytest

import gpzoo
from gpzoo.models.errors import InvalidArgumentError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning")

TINY = {"steps": 6, "batch_size": 20, "num_train": 40, "num_test": 30, "num_inducing": 5, "num_draws": 30}


def test_compare_is_exported_at_the_top_and_in_analysis():
    import gpzoo.analysis  # noqa: PLC0415
    from gpzoo.analysis.compare import compare_elbo  # noqa: PLC0415,F401 - the ELBO module does not rebind the name

    assert gpzoo.compare is gpzoo.analysis.compare
    assert callable(gpzoo.compare) and gpzoo.compare.__module__ == "gpzoo.analysis.comparison"


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"models": []}, "models"),
    ({"seeds": [0, 0]}, "seeds"),
    ({"seeds": [-1]}, "seeds"),
    ({"steps": 1.5}, "steps"),
    ({"steps": "Auto"}, "steps"),
    ({"batch_size": 0}, "batch_size"),
    ({"learning_rate": -0.1}, "learning_rate"),
    ({"backend": "dask"}, "backend"),
    ({"address": "127.0.0.1:6379"}, "address"),  # an option of the ray backend only
    ({"cpus_per_fit": 0, "backend": "ray"}, "cpus_per_fit"),
    ({"num_draws": 3}, "num_draws"),
    ({"resume": True}, "resume"),  # resume needs out
    ({"data": 3.0}, "data"),
    ({"data": "no-such-data"}, "data"),
    ({"models": "svgp-rbf,nope"}, "models"),
    ({"options": {"conv": {"patch_shape": (3, 3)}}}, "options"),  # conv is not compared
    ({"models": ["svgp-rbf", "svgp-rbf"]}, "models"),
    ({"models": ["conv"]}, "models"),  # an image model on a tabular data set
    ({"progress": 1}, "progress"),
])
def test_bad_arguments_are_typed_errors_naming_them(kwargs, named, monkeypatch):
    import importlib  # noqa: PLC0415

    fitted = []
    monkeypatch.setattr(importlib.import_module("gpzoo.inference.fit"), "fit", lambda *a, **k: fitted.append(a))
    call = {"data": "two-moons", "models": ["svgp-rbf"], **TINY} | kwargs
    with pytest.raises(InvalidArgumentError) as error:
        gpzoo.compare(call.pop("data"), call.pop("models"), **call)
    assert error.value.argument == named
    assert not fitted


def test_mistyped_names_suggest_the_nearest():
    with pytest.raises(InvalidArgumentError, match=r"unknown model 'svgp-rfb'; did you mean 'svgp-rbf'\?") as error:
        gpzoo.compare("two-moons", ["svgp-rfb"], **TINY)
    assert error.value.argument == "models"
    with pytest.raises(InvalidArgumentError, match=r"unknown dataset 'two_moons'; did you mean 'two-moons'\?") as error:
        gpzoo.compare("two_moons", ["svgp-rbf"], **TINY)
    assert error.value.argument == "data"


def test_existing_report_needs_overwrite_or_resume(tmp_path):
    (tmp_path / "report.json").write_text("{}")
    with pytest.raises(InvalidArgumentError, match="overwrite=True") as error:
        gpzoo.compare("two-moons", "svgp-rbf", out=tmp_path, **TINY)
    assert error.value.argument == "out"


# gpzoo.compare(..., backend="ray") against the sequential backend: tests/test_backends.py (one shared Ray instance)


def test_steps_auto_runs_every_fit_until_it_levels_off():
    """``steps="auto"`` is passed to every fit: each runs until its objective levels off (at least the
    auto rule's minimum of 500 steps) and reports itself converged."""
    cmp = gpzoo.compare("two-moons", ["svgp-rbf"], steps="auto", num_train=100, num_test=100, report=False,
                        progress=False)
    res = cmp.results["svgp-rbf", 0]
    assert res.converged is True and len(res.objective_history) >= 500


def test_a_second_writer_on_the_same_out_is_refused_naming_the_first(tmp_path):
    """While one process holds an output folder (as a running compare does), gpzoo.compare and the CLI
    on that folder raise OutputLockedError naming the holder's process, and write nothing; once it
    has finished, the folder is free again."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from gpzoo.analysis.cli import main  # noqa: PLC0415
    from gpzoo.analysis.outlock import OutputLockedError, output_lock  # noqa: PLC0415

    out = tmp_path / "report"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom gpzoo.analysis.outlock import output_lock\n"
         f"with output_lock({str(out)!r}):\n    print('held', flush=True)\n    sys.stdin.readline()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputLockedError) as info:
            gpzoo.compare("two-moons", ["svgp-rbf"], out=out, **TINY)
        assert info.value.argument == "out" and f"process {holder.pid}" in str(info.value)
        assert main(["compare", "--data", "two-moons", "--models", "svgp-rbf", "--out", str(out), "--quiet"]) != 0
        assert sorted(p.name for p in out.iterdir()) == [".gpzoo.lock", ".gpzoo.lock.json"]  # nothing else written
    finally:
        holder.communicate("\n", timeout=60)
    with output_lock(out):  # released with its process
        pass


def test_an_output_folder_that_is_a_symbolic_link_is_refused(tmp_path):
    from gpzoo.analysis.outlock import OutputPathError, output_lock  # noqa: PLC0415

    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(OutputPathError) as info:
        with output_lock(tmp_path / "link"):
            pass
    assert info.value.argument == "out" and "symbolic link" in str(info.value)
    assert list((tmp_path / "elsewhere").iterdir()) == []
