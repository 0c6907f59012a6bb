"""gpzoo.compare: the Python face of `gpzoo compare` (same fits, same report, Ray or sequential)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import gpzoo
from gpzoo.analysis import datasets
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


def test_existing_report_needs_overwrite_or_resume(tmp_path):
    (tmp_path / "report.json").write_text("{}")
    with pytest.raises(InvalidArgumentError, match="overwrite=True") as error:
        gpzoo.compare("two-moons", "svgp-rbf", out=tmp_path, **TINY)
    assert error.value.argument == "out"


def test_ray_api_equals_sequential_api_bit_for_bit(tmp_path):
    """One model × two seeds: the same fits (every parameter, the ELBO trace) and ELBO table on Ray as here."""
    pytest.importorskip("ray", reason='Ray is an optional extra: pip install "gpzoo[ray]"')
    data = datasets.load("two-moons", seed=3)
    kwargs = {"seeds": [0, 1], "data_seed": 3, "report": False, **TINY}
    seq = gpzoo.compare(data, ["svgp-rbf"], out=tmp_path / "seq", **kwargs)
    ray_ = gpzoo.compare(data, "svgp-rbf", backend="ray", cpus_per_fit=1, **kwargs)
    assert sorted(seq.results) == sorted(ray_.results) == [("svgp-rbf", 0), ("svgp-rbf", 1)]
    for key, res in seq.results.items():
        other = ray_.results[key]
        assert res.seed == other.seed == key[1]
        assert sorted(res.params) == sorted(other.params)
        for name, value in res.params.items():
            np.testing.assert_array_equal(value, other.params[name], err_msg=f"{key}: {name}")
        np.testing.assert_array_equal(res.objective_history, other.objective_history)
    assert not np.array_equal(seq.results["svgp-rbf", 0].params["q_mu"], seq.results["svgp-rbf", 1].params["q_mu"])
    pd.testing.assert_frame_equal(seq.table.sort_index(), ray_.table.sort_index())
    assert sorted(seq.table.index) == ["svgp-rbf seed 0", "svgp-rbf seed 1"]
    assert seq.report_path is None and (tmp_path / "seq" / "models" / "svgp-rbf_seed_1" / "model.json").is_file()
    assert seq["svgp-rbf", 1] is seq.results["svgp-rbf", 1]
    # resuming the finished run refits nothing: it reads the same fits back
    again = gpzoo.compare(data, ["svgp-rbf"], out=tmp_path / "seq", resume=True, **kwargs)
    for key, res in seq.results.items():
        np.testing.assert_array_equal(res.params["q_mu"], again.results[key].params["q_mu"])

