"""The ``gpzoo`` command end to end on tiny data, the report files, and one-line errors."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpzoo.analysis import datasets
from gpzoo.analysis.cli import main
from gpzoo.models import zoo

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
REPO = Path(__file__).resolve().parents[1]
from conftest import TINY_CLI as TINY


class _Links(HTMLParser):
    """Collects <a href> targets and <img src> values."""

    def __init__(self):
        super().__init__()
        self.hrefs, self.images = [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a":
            self.hrefs.append(attrs.get("href"))
        elif tag == "img":
            self.images.append(attrs.get("src"))


def _run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def compared(compared_report):
    return compared_report


def test_list(capsys):
    code, out, _ = _run(["list"], capsys)
    assert code == 0
    for name in [*zoo.names(), *datasets.names()]:
        assert name in out
    assert "Models:" in out and "Datasets:" in out


def test_compare_writes_every_file(compared):
    code, out, models = compared
    assert code == 0
    for name in ("report.html", "report.md", "comparison.csv", "report.json", "figures/elbo_traces.png"):
        assert (out / name).is_file(), name
    for model in models:
        assert (out / "models" / f"{model}.nc").is_file() and (out / "models" / f"{model}.json").is_file()
        assert (out / "figures" / f"pava_{model}.png").is_file()  # rectangles is binary
    if len(models) > 1:
        assert (out / "figures" / "compare_loo.png").is_file()
    table = pd.read_csv(out / "comparison.csv", index_col="model")
    assert sorted(table.index) == sorted(models)
    assert {"elbo", "elbo_se", "d_elbo", "elpd_loo", "pareto_k_max", "test_accuracy"} <= set(table.columns)
    assert "PSIS-LOO" in (out / "report.md").read_text()


def test_html_is_self_contained_and_references_every_figure(compared):
    _, out, _ = compared
    parser = _Links()
    parser.feed((out / "report.html").read_text(encoding="utf-8"))
    parser.close()
    pngs = sorted(p.relative_to(out).as_posix() for p in (out / "figures").glob("*.png"))
    assert pngs and sorted(h for h in parser.hrefs if h.endswith(".png")) == pngs
    embedded = {base64.b64decode(src.split(",", 1)[1]) for src in parser.images}
    assert all(src.startswith("data:image/png;base64,") for src in parser.images)
    assert embedded == {(out / p).read_bytes() for p in pngs}


def test_version(capsys):
    import gpzoo  # noqa: PLC0415

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.strip() == f"gpzoo {gpzoo.__version__}"


def _gpzoo_command() -> list[str]:
    """The installed ``gpzoo`` console script (``python -m gpzoo.analysis.cli`` where there is none)."""
    script = Path(sys.executable).with_name("gpzoo")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "gpzoo.analysis.cli"]


@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_version_and_help_do_not_import_jax_numpyro_or_matplotlib(flag):
    """``gpzoo --version`` and ``gpzoo --help`` answer from the standard library: Python's import
    log of the real command lists no JAX, NumPyro, matplotlib (nor NumPy) module."""
    from importlib.metadata import version  # noqa: PLC0415

    env = {**os.environ, "PYTHONPROFILEIMPORTTIME": "1", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([*_gpzoo_command(), flag], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "gpzoo.analysis.cli" in imported  # the log is read right: the command's own module is in it
    heavy = sorted(m for m in imported if m.split(".")[0] in ("jax", "jaxlib", "numpyro", "matplotlib", "numpy"))
    assert not heavy, f"gpzoo {flag} imported {heavy[:10]}"
    if flag == "--version":
        assert proc.stdout.strip() == f"gpzoo {version('gpzoo')}"
    else:
        assert all(command in proc.stdout for command in ("list", "fit", "compare", "report", "predict"))


def test_report_states_data_settings_and_versions(compared):
    import json  # noqa: PLC0415
    from importlib.metadata import version  # noqa: PLC0415

    _, out, models = compared
    info = json.loads((out / "report.json").read_text(encoding="utf-8"))
    env = info["environment"]
    assert {env[k] for k in ("gpzoo", "jax", "numpyro", "arviz")} == {version(k) for k in ("gpzoo", "jax", "numpyro", "arviz")}
    assert env["device"].startswith("cpu")
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "rectangles, binary classification: 40 training and 30 test points, 784 input features (28×28 images)." in md
    assert "Settings: 8 steps, batch size 20, learning rate 0.05, M = 6 inducing variables, seed 0" in md
    assert f"gpzoo {env['gpzoo']}, JAX {env['jax']}, NumPyro {env['numpyro']}, ArviZ {env['arviz']}" in md


def test_report_rebuilds_the_same_tables(compared, capsys):
    _, out, models = compared
    before = (out / "comparison.csv").read_text()
    (out / "comparison.csv").unlink()
    (out / "report.html").unlink()
    code, printed, err = _run(["report", str(out)], capsys)
    assert code == 0, err
    assert (out / "comparison.csv").read_text() == before
    assert (out / "report.html").is_file()
    assert all(m in printed for m in models)


def test_report_refuses_symbolic_links_inside_its_folder(compared, tmp_path, capsys):
    """gpzoo report DIR reads and writes only DIR's own files: a figures/ folder or a model file that
    is a symbolic link (to anywhere) is refused with one line naming it, and nothing is written there."""
    import shutil  # noqa: PLC0415

    _, out, models = compared
    outside = tmp_path / "outside"
    outside.mkdir()
    figures = tmp_path / "figures-copy"
    shutil.copytree(out / "figures", figures)
    shutil.rmtree(out / "figures")
    (out / "figures").symlink_to(outside, target_is_directory=True)
    line = _error(["report", str(out)], capsys, 1)
    assert "symbolic link" in line and "figures" in line
    assert list(outside.iterdir()) == []
    (out / "figures").unlink()
    shutil.copytree(figures, out / "figures")
    model_file = next((out / "models").glob("*.nc"))
    shutil.move(model_file, outside / model_file.name)
    model_file.symlink_to(outside / model_file.name)
    line = _error(["report", str(out)], capsys, 1)
    assert "symbolic link" in line and model_file.name in line
    model_file.unlink()
    shutil.move(outside / model_file.name, model_file)
    assert _run(["report", str(out)], capsys)[0] == 0  # the folder as it was rebuilds


def _error(argv, capsys, code):
    status, out, err = _run(argv, capsys)
    assert status == code
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpzoo: error:"), err
    return lines[0]


def test_unknown_model_and_dataset_list_valid_names(tmp_path, capsys):
    line = _error(["compare", "--data", "two-moons", "--models", "svgp-rbf,nope", "--out", str(tmp_path)], capsys, 2)
    assert "'nope'" in line and all(name in line for name in zoo.names())
    line = _error(["fit", "--data", "nope", "--model", "svgp-rbf", "--out", str(tmp_path)], capsys, 2)
    assert "'nope'" in line and all(name in line for name in datasets.names())
    _error(["fit", "--data", "two-moons", "--out", str(tmp_path)], capsys, 2)  # --model missing
    _error(["compare", "--steps", "-3", "--out", str(tmp_path)], capsys, 2)
    assert not any(tmp_path.iterdir())  # nothing written before the inputs are checked


def test_mistyped_model_and_dataset_names_suggest_the_nearest(tmp_path, capsys):
    line = _error(["compare", "--models", "svgp-rfb", "--out", str(tmp_path)], capsys, 2)
    assert "unknown model 'svgp-rfb'; did you mean 'svgp-rbf'? valid: " in line
    line = _error(["fit", "--data", "rectangle", "--model", "conv", "--out", str(tmp_path)], capsys, 2)
    assert "unknown dataset 'rectangle'; did you mean 'rectangles'? valid: " in line
    line = _error(["predict", "--data", "two_moons", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "p.csv")], capsys, 2)
    assert "did you mean 'two-moons'?" in line
    line = _error(["compare", "--models", "qqqq", "--out", str(tmp_path)], capsys, 2)
    assert "did you mean" not in line and "unknown model 'qqqq'; valid: " in line  # nothing close: no guess
    assert not any(tmp_path.iterdir())


def test_unwritable_output_directory(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    line = _error(["fit", "--data", "two-moons", "--model", "svgp-rbf", "--out", str(blocker / "out"), *TINY], capsys, 1)
    assert "cannot write" in line


@pytest.mark.skipif("conv" not in zoo.names(), reason="no convolutional model registered")
def test_conv_model_on_tabular_data(tmp_path, capsys):
    line = _error(["compare", "--data", "two-moons", "--models", "svgp-rbf,conv", "--out", str(tmp_path)], capsys, 2)
    assert "needs image data" in line and "two-moons" in line


def test_console_script_entry_point(tmp_path):
    """The installed `gpzoo` script (pyproject: analysis.cli:main) runs and reports errors the same way."""
    script = Path(sys.executable).with_name("gpzoo")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "gpzoo.analysis.cli"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([*command, "compare", "--models", "nope", "--out", str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("gpzoo: error: unknown model 'nope'")


def test_likelihood_option_sets_every_model_likelihood(tmp_path, capsys):
    """`--likelihood one-hot-gaussian` on a 10-class dataset fits and reports with that likelihood."""
    out = tmp_path / "digits"
    code, _, err = _run(["compare", "--data", "digits-8x8", "--models", "svgp-rbf", "--likelihood", "one-hot-gaussian",
                         "--out", str(out), *TINY], capsys)
    assert code == 0, err
    from gpzoo.analysis.report import read_datatree  # noqa: PLC0415

    tree = read_datatree(out / "models" / "svgp-rbf.nc")
    assert tree.attrs["likelihood"] == "OneHotGaussian"
    assert tree["predictions"]["y"].shape[-1] == 30  # class labels of the 30 test digits


def test_likelihood_option_refuses_names_and_tasks_that_do_not_fit(tmp_path, capsys):
    line = _error(["compare", "--data", "digits-8x8", "--models", "svgp-rbf", "--likelihood", "gaussian", "--out", str(tmp_path)],
                  capsys, 2)
    assert "--likelihood" in line and "regression" in line and "one-hot-gaussian" in line
    line = _error(["compare", "--data", "two-moons", "--likelihood", "nope", "--out", str(tmp_path)], capsys, 2)
    assert "'nope'" in line and "bernoulli-logit" in line
    assert not any(tmp_path.iterdir())


# ----------------------------------------------------------------------------- --option MODEL.KEY=VALUE
class _StopAfterFitting(Exception):
    """Raised by the stubbed report: the specs have reached fit, nothing more is needed."""


@pytest.fixture
def fitted_specs(monkeypatch):
    """The specs `gpzoo` hands to fit (fit and report stubbed: no optimisation runs)."""
    import importlib  # noqa: PLC0415 - the packages re-export functions named like these modules

    specs = {}

    def fake_fit(spec, *args, **kwargs):
        specs[spec.name] = spec

    def fake_report(*args, **kwargs):
        raise _StopAfterFitting

    monkeypatch.setattr(importlib.import_module("gpzoo.inference.fit"), "fit", fake_fit)
    monkeypatch.setattr(importlib.import_module("gpzoo.analysis.report"), "report", fake_report)
    monkeypatch.setattr(importlib.import_module("gpzoo.inference.io"), "save", lambda *args, **kwargs: None)
    monkeypatch.setattr(importlib.import_module("gpzoo.inference.io"), "load", lambda *args, **kwargs: None)
    monkeypatch.delenv("GPZOO_TRACEBACK", raising=False)
    return specs


def test_options_reach_the_specs(tmp_path, capsys, fitted_specs):
    argv = ["compare", "--data", "rectangles", "--models", "conv,svgp-rbf", "--option", "conv.patch_shape=5x5",
            "--option", "svgp-rbf.ard=true", "--option", "svgp-rbf.num_inducing=7", "--out", str(tmp_path / "r"), *TINY]
    code, _, err = _run(argv, capsys)
    assert code == 1 and "_StopAfterFitting" in err  # the stubbed report stopped the run after fitting
    assert fitted_specs["conv"].kernel.patch_shape == (5, 5) and fitted_specs["conv"].options["patch_shape"] == (5, 5)
    assert fitted_specs["svgp-rbf"].kernel.lengthscale.shape == (28 * 28,)
    assert (fitted_specs["svgp-rbf"].num_inducing, fitted_specs["conv"].num_inducing) == (7, 6)  # --num-inducing 6 elsewhere
    code, _, _ = _run(["fit", "--data", "two-moons", "--model", "svgp-rbf", "--option", "svgp-rbf.lengthscale=0.5,2",
                       "--out", str(tmp_path / "m"), *TINY], capsys)
    assert code == 1 and list(fitted_specs["svgp-rbf"].kernel.lengthscale) == [0.5, 2.0]


@pytest.mark.parametrize("option, named", [
    ("conv.patch_shape=5y5", "patch_shape"),         # bad value
    ("conv.bogus=1", "bogus"),                       # unknown key
    ("svgp-rbf.ard=true", "svgp-rbf"),               # model not in --models
    ("conv.image_shape=4x4", "image_shape"),         # a dataset fact
    ("conv.likelihood=gaussian", "likelihood"),      # has its own flag
    ("conv.patch_shape=40x40", "patch_shape"),       # parses, but does not fit the images
    ("conv", "MODEL.KEY=VALUE"),                     # malformed
])
def test_bad_options_are_usage_errors_before_any_fitting(option, named, tmp_path, capsys, fitted_specs):
    line = _error(["compare", "--data", "rectangles", "--models", "conv", "--option", option, "--out", str(tmp_path), *TINY],
                  capsys, 2)
    assert "--option" in line and named in line
    assert not fitted_specs and not any(tmp_path.iterdir())


def test_image_model_with_options_on_tabular_data_says_it_needs_images(tmp_path, capsys, fitted_specs):
    line = _error(["fit", "--data", "two-moons", "--model", "conv", "--option", "conv.patch_shape=5x5", "--out", str(tmp_path)],
                  capsys, 2)
    assert "needs image data" in line and "two-moons" in line and not fitted_specs


def test_list_options_shows_each_model_declared_options(capsys):
    code, out, _ = _run(["list", "--options"], capsys)
    assert code == 0
    conv = out.split("\n  conv ", 1)[1].split("\n  conv+rbf", 1)[0]
    assert "patch_shape: tuple[int, int] = (3, 3)" in conv and "normalisation: 'mean' | 'sum' = 'mean'" in conv
    assert "q_structure: 'full' | 'block' | 'diag' = 'block'" in out.split("\n  multichannel-conv ", 1)[1].split("\n  svgp", 1)[0]
    assert "Options of every model" in out and "whiten: bool = True" in out


# ----------------------------------------------------------------------------- saved models, gpzoo predict
def test_compare_saves_every_model_and_predict_reads_it(compared, tmp_path, capsys):
    _, out, models = compared
    for model in models:
        assert (out / "models" / model / "model.json").is_file() and (out / "models" / model / "arrays.npz").is_file()
    code, printed, err = _run(["predict", "--model", str(out / "models" / models[-1]), "--data", "rectangles",
                               "--num-points", "7", "--out", str(tmp_path / "p.csv")], capsys)
    assert code == 0, err
    assert len(pd.read_csv(tmp_path / "p.csv")) == 7 and "7 test point(s)" in printed


def test_predict_errors_are_one_line(compared, tmp_path, capsys):
    _, out, models = compared
    model = str(out / "models" / "svgp-rbf")
    line = _error(["predict", "--model", model, "--data", "rectangles", "--out", str(tmp_path / "p.txt")], capsys, 2)
    assert ".csv" in line and ".nc" in line
    line = _error(["predict", "--model", model, "--data", "two-moons", "--out", str(tmp_path / "p.csv")], capsys, 2)
    assert "784 features" in line and "two-moons" in line
    line = _error(["predict", "--model", str(tmp_path / "none"), "--data", "rectangles", "--out", str(tmp_path / "p.csv")],
                  capsys, 1)
    assert str(tmp_path / "none") in line and "does not exist" in line
    _error(["predict", "--data", "rectangles", "--out", str(tmp_path / "p.csv")], capsys, 2)  # --model missing
    assert not any(tmp_path.iterdir())


def test_predict_on_the_users_own_inputs(compared, tmp_path, capsys):
    """`--input FILE.npy` / `.npz` / `.csv`: predictions at the file's inputs, the same as the Python API's;
    a target column only where the file has targets y."""
    from gpzoo.inference import load, predict  # noqa: PLC0415

    _, out, models = compared
    svgp, conv = (out / "models" / name for name in ("svgp-rbf", "conv"))
    rng = np.random.default_rng(5)
    X = rng.uniform(0.0, 1.0, (5, 784))
    np.save(tmp_path / "X.npy", X)
    code, printed, err = _run(["predict", "--model", str(svgp), "--input", str(tmp_path / "X.npy"),
                               "--out", str(tmp_path / "p.csv")], capsys)
    assert code == 0, err
    table = pd.read_csv(tmp_path / "p.csv")
    assert list(table["index"]) == list(range(5)) and "y" not in table.columns and "no target column" in printed
    np.testing.assert_allclose(table["f_mean"].values, predict(load(svgp), X).f_mean[:, 0], rtol=1e-12)
    # an image model, images [N, 28, 28] as bytes (scaled by 1/255 as the data sets' are), with targets
    images, y = rng.integers(0, 256, (4, 28, 28), dtype=np.uint8), np.array([0, 1, 1, 0])
    np.savez(tmp_path / "images.npz", X=images, y=y)
    code, _, err = _run(["predict", "--model", str(conv), "--input", str(tmp_path / "images.npz"),
                         "--out", str(tmp_path / "images.nc")], capsys)
    assert code == 0, err
    import xarray as xr  # noqa: PLC0415

    ds = xr.load_dataset(tmp_path / "images.nc")
    np.testing.assert_array_equal(ds["y"].values, y)
    assert ds.attrs["inputs"] == str(tmp_path / "images.npz") and "dataset" not in ds.attrs
    np.testing.assert_allclose(ds["f_mean"].values, predict(load(conv), images.reshape(4, -1) / 255.0).f_mean, rtol=1e-12)
    # an archive whose only array holds the inputs, whatever its name
    np.savez(tmp_path / "only.npz", inputs=X[:2])
    code, _, err = _run(["predict", "--model", str(svgp), "--data", str(tmp_path / "only.npz"),
                         "--out", str(tmp_path / "only.csv")], capsys)
    assert code == 0, err
    assert len(pd.read_csv(tmp_path / "only.csv")) == 2
    # CSV rows, without targets, with a header line, and with targets as a y column or an extra last column
    expected = predict(load(svgp), X).f_mean[:, 0]
    np.savetxt(tmp_path / "rows.csv", X, delimiter=",")
    np.savetxt(tmp_path / "named.csv", X, delimiter=",", header=",".join(f"x{i}" for i in range(784)), comments="")
    targets = np.array([0.0, 1.0, 1.0, 0.0, 1.0])
    np.savetxt(tmp_path / "last.csv", np.column_stack([X, targets]), delimiter=",")
    np.savetxt(tmp_path / "ycol.csv", np.column_stack([targets, X]), delimiter=",",
               header=",".join(["y"] + [f"x{i}" for i in range(784)]), comments="")
    for name, has_y in (("rows.csv", False), ("named.csv", False), ("last.csv", True), ("ycol.csv", True)):
        code, printed, err = _run(["predict", "--model", str(svgp), "--input", str(tmp_path / name),
                                   "--out", str(tmp_path / f"pred-{name}")], capsys)
        assert code == 0, (name, err)
        table = pd.read_csv(tmp_path / f"pred-{name}")
        np.testing.assert_allclose(table["f_mean"].values, expected, rtol=1e-12, err_msg=name)
        assert ("y" in table.columns) is has_y and ("no target column" in printed) is (not has_y), name
        if has_y:
            np.testing.assert_array_equal(table["y"].values, targets)
    # a file given as --data, as earlier versions took it, is still read as inputs
    code, _, err = _run(["predict", "--model", str(svgp), "--data", str(tmp_path / "X.npy"),
                         "--out", str(tmp_path / "old.csv")], capsys)
    assert code == 0, err
    np.testing.assert_allclose(pd.read_csv(tmp_path / "old.csv")["f_mean"].values, expected, rtol=1e-12)




def test_predict_refuses_bad_input_files_in_one_line(compared, tmp_path, capsys):
    _, out, _ = compared
    model = str(out / "models" / "svgp-rbf")
    files = tmp_path / "files"
    files.mkdir()
    np.save(files / "narrow.npy", np.zeros((3, 2)))
    np.save(files / "objects.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    np.save(files / "nan.npy", np.full((2, 784), np.nan))
    np.save(files / "text.npy", np.array([["a"] * 784]))
    np.savez(files / "two.npz", a=np.zeros((2, 784)), b=np.zeros(2))
    np.savez(files / "labels.npz", X=np.zeros((2, 784)), y=np.zeros(3))
    (files / "broken.npz").write_bytes(b"not a zip archive")
    expected = {"narrow.npy": "[N, 784]", "objects.npy": "Python objects", "nan.npy": "NaN", "text.npy": "real numbers",
                "two.npz": "expected the inputs as X", "labels.npz": "expected 2 labels", "broken.npz": "is not a NumPy",
                "missing.npy": "no such file", "ragged.csv": "different numbers of columns", "words.csv": "not a number",
                "wide.csv": "[N, 784]", "inf.csv": "NaN/inf", "x.txt": "expected a .npy, .npz, .csv file"}
    (files / "ragged.csv").write_text("1,2,3\n4,5\n")
    (files / "words.csv").write_text("a,b\n1,x\n")
    np.savetxt(files / "wide.csv", np.zeros((2, 790)), delimiter=",")
    (files / "inf.csv").write_text(",".join(["inf"] * 784) + "\n")
    (files / "x.txt").write_text("1,2\n")
    for name, words in expected.items():
        line = _error(["predict", "--model", model, "--input", str(files / name), "--out", str(tmp_path / "p.csv")], capsys, 2)
        assert "--input" in line and words in line, (name, line)
    line = _error(["predict", "--model", model, "--input", str(files / "narrow.npy"), "--data", "rectangles",
                   "--out", str(tmp_path / "p.csv")], capsys, 2)
    assert "exactly one of --input" in line
    line = _error(["predict", "--model", model, "--input", str(files / "narrow.npy"), "--split", "train",
                   "--out", str(tmp_path / "p.csv")], capsys, 2)
    assert "--split applies to a dataset" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["files"]  # nothing written


def test_save_models_is_on_unless_turned_off(tmp_path):
    from gpzoo.analysis.cli import build_parser  # noqa: PLC0415

    base = ["--data", "two-moons", "--out", str(tmp_path)]
    assert build_parser().parse_args(["fit", "--model", "svgp-rbf", *base]).save_models
    assert not build_parser().parse_args(["compare", "--no-save-models", *base]).save_models


@pytest.mark.parametrize("corrupt, named", [
    (lambda info: info.pop("dataset"), "'dataset'"),
    (lambda info: info["dataset"].update(num_train="many"), "'dataset.num_train'"),
    (lambda info: info.update(models="svgp-rbf"), "'models'"),
    (lambda info: info["files"].pop(info["models"][0]), "files."),
    (lambda info: info["files"].update({info["models"][0]: "../../outside"}), "not a plain file name"),
    (lambda info: info["files"].update({info["models"][0]: "/etc/passwd"}), "not a plain file name"),
    (lambda info: info.update(static_figures={"x": ["../secret.png"]}), "not a plain file name"),
])
def test_report_refuses_a_broken_or_escaping_report_json(compared, tmp_path, capsys, corrupt, named):
    import json  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    _, out, _ = compared
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    info = json.loads((copy / "report.json").read_text(encoding="utf-8"))
    corrupt(info)
    (copy / "report.json").write_text(json.dumps(info), encoding="utf-8")
    line = _error(["report", str(copy)], capsys, 1)
    assert named in line and "report.json" in line


def test_model_names_never_share_a_report_file():
    from gpzoo.analysis.report import unique_file_stems  # noqa: PLC0415

    stems = unique_file_stems(["a/b", "a_b", "A_B", "a b", "ok"])
    assert len(set(s.lower() for s in stems.values())) == 5
    assert stems["ok"] == "ok" and stems["a/b"] == "a_b" and all("/" not in s for s in stems.values())


# ----------------------------------------------------------------------------- runs that are kept and continued
def test_num_draws_below_the_psis_minimum_is_refused_before_fitting(tmp_path, capsys):
    from gpzoo.analysis import cli, datatree  # noqa: PLC0415

    assert cli.MIN_DRAWS == datatree.MIN_DRAWS
    line = _error(["compare", "--data", "two-moons", "--models", "svgp-rbf", "--num-draws", "5", "--out", str(tmp_path / "o")],
                  capsys, 2)
    assert "--num-draws" in line and ">= 30" in line
    assert not (tmp_path / "o").exists()


def test_existing_report_needs_overwrite_which_removes_only_report_files(compared, tmp_path, capsys):
    import shutil  # noqa: PLC0415

    _, out, models = compared
    target = tmp_path / "again"
    shutil.copytree(out, target)
    (target / "figures" / "stale_figure.png").write_bytes(b"old")
    (target / "notes.txt").write_text("mine")
    argv = ["compare", "--data", "rectangles", "--models", "svgp-rbf", "--out", str(target), *TINY]
    line = _error(argv, capsys, 2)
    assert "--overwrite" in line and "--resume" in line
    assert main(argv + ["--overwrite"]) == 0
    capsys.readouterr()
    assert (target / "notes.txt").read_text() == "mine"
    assert not (target / "figures" / "stale_figure.png").exists()
    assert pd.read_csv(target / "comparison.csv", index_col="model").index.tolist() == ["svgp-rbf"]
    assert not (target / "models" / "conv.nc").exists()


def test_an_interrupted_compare_keeps_finished_fits_and_resumes(tmp_path, capsys, monkeypatch):
    import importlib  # noqa: PLC0415 - the package re-exports a function named like the module

    fit_module = importlib.import_module("gpzoo.inference.fit")
    real_fit, calls = fit_module.fit, []

    def interrupted_on_second(spec, *args, **kwargs):
        calls.append((spec.name, kwargs))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_fit(spec, *args, **kwargs)

    monkeypatch.setattr(fit_module, "fit", interrupted_on_second)
    out = tmp_path / "run"
    argv = ["compare", "--data", "two-moons", "--models", "svgp-rbf,svgp-logistic-pg", "--out", str(out),
            "--checkpoint-every", "3", *TINY]
    status, _, err = _run(argv, capsys)
    assert status == 130 and "--resume" in err and "svgp-rbf" in err
    first = argv[4].split(",")[0]
    assert (out / "models" / first / "model.json").is_file()  # kept although the run stopped
    assert calls[0][1]["checkpoint_every"] == 3 and calls[0][1]["checkpoint_dir"] == out / "checkpoints" / first
    assert not (out / "report.html").exists()

    monkeypatch.setattr(fit_module, "fit", lambda spec, *a, **k: calls.append((spec.name, k)) or real_fit(spec, *a, **k))
    status, printed, err = _run(argv + ["--resume", "--steps", "9"], capsys)  # a different setting: refused by name
    assert status == 2 and "(steps)" in err
    status, printed, err = _run(argv + ["--resume"], capsys)
    assert status == 0, err
    assert [name for name, _ in calls[2:]] == [argv[4].split(",")[1]]  # the finished model was not refitted
    assert calls[2][1]["resume"] is True
    assert pd.read_csv(out / "comparison.csv", index_col="model").index.size == 2


def test_local_numpy_data_through_data_path(tmp_path, capsys):
    rng = np.random.default_rng(0)
    path = tmp_path / "bars.npz"
    images = (rng.random((50, 6, 6)) * 40).astype(np.uint8)
    labels = rng.integers(0, 2, 50)
    for n in range(50):
        images[n, 2, 1:5] = 255 if labels[n] else images[n, 2, 1:5]
        images[n, 1:5, 2] = images[n, 1:5, 2] if labels[n] else 255
    np.savez(path, x_train=images[:35], y_train=labels[:35], x_test=images[35:], y_test=labels[35:])
    line = _error(["compare", "--data", "local-numpy", "--models", "conv", "--out", str(tmp_path / "r")], capsys, 2)
    assert "--data-path" in line
    line = _error(["compare", "--data", "two-moons", "--data-path", str(path), "--out", str(tmp_path / "r")], capsys, 2)
    assert "reads no files" in line
    code, printed, err = _run(["compare", "--data", "local-numpy", "--data-path", str(path), "--models", "conv",
                               "--option", "conv.patch_shape=3x3", "--out", str(tmp_path / "r"), *TINY[:2], "--num-inducing", "4",
                               "--num-draws", "30", "--quiet"], capsys)
    assert code == 0, err
    assert "35 training and 15 test points" in (tmp_path / "r" / "report.md").read_text(encoding="utf-8")


def test_seeds_fit_every_model_per_seed_and_summarise(tmp_path, capsys):
    import json  # noqa: PLC0415

    out = tmp_path / "seeds"
    code, printed, err = _run(["compare", "--data", "two-moons", "--models", "svgp-rbf,svgp-logistic-pg", "--seeds", "0,1",
                               "--out", str(out), *TINY], capsys)
    assert code == 0, err
    runs = pd.read_csv(out / "comparison.csv", index_col="model")
    assert sorted(runs.index) == sorted(f"{m} seed {s}" for m in ("svgp-rbf", "svgp-logistic-pg") for s in (0, 1))
    seeds = {m: json.loads((out / "models" / f"{m.replace(' ', '_')}.json").read_text())["fit"]["seed"] for m in runs.index}
    assert all(seeds[name] == int(name.rsplit(" ", 1)[1]) for name in runs.index)
    summary = pd.read_csv(out / "seeds.csv", index_col="model")
    assert sorted(summary.index) == ["svgp-logistic-pg", "svgp-rbf"] and (summary["num_seeds"] == 2).all()
    for model in summary.index:
        mine = runs.loc[[f"{model} seed 0", f"{model} seed 1"], "elbo"]
        assert summary.loc[model, "elbo_mean"] == pytest.approx(mine.mean())
        assert summary.loc[model, "elbo_sd"] == pytest.approx(mine.std(ddof=1))
    md = (out / "report.md").read_text(encoding="utf-8")
    assert "Across seeds" in md and "seeds 0, 1" in md
    line = _error(["compare", "--seeds", "1,1", "--out", str(tmp_path / "x")], capsys, 2)
    assert "--seeds" in line


def test_comparison_has_the_table_one_metrics(compared):
    _, out, _ = compared
    table = pd.read_csv(out / "comparison.csv", index_col="model")
    assert {"test_top1_error", "test_top2_error", "test_nll_misclassified"} <= set(table.columns)
    np.testing.assert_allclose(table["test_top1_error"], 1 - table["test_accuracy"], atol=1e-12)
    assert (table["test_top2_error"] == 0).all()  # two classes: the label is always among the top two


def test_predict_checks_the_data_set_before_loading_the_model(tmp_path, capsys):
    line = _error(["predict", "--model", str(tmp_path / "no-such-model"), "--data", "nope", "--out", str(tmp_path / "p.csv")],
                  capsys, 2)
    assert "'nope'" in line  # not the missing model


def test_learning_rate_must_be_finite(tmp_path, capsys):
    line = _error(["compare", "--learning-rate", "1e400", "--out", str(tmp_path / "o")], capsys, 2)
    assert "--learning-rate" in line and "finite" in line


def test_compare_and_report_in_float32(tmp_path, capsys, float32):
    """The library's default precision end to end: fits, DataTrees, held-out comparison and verdict."""
    out = tmp_path / "f32"
    code, _, err = _run(["compare", "--data", "two-moons", "--models", "svgp-rbf,svgp-logistic-pg", "--out", str(out), *TINY],
                        capsys)
    assert code == 0, err
    table = pd.read_csv(out / "comparison.csv", index_col="model")
    assert np.isfinite(table[["elbo", "elpd_test", "d_elpd_test", "d_elpd_test_se", "test_nll"]].to_numpy()).all()
    assert "float32" in (out / "models" / "svgp-rbf" / "model.json").read_text(encoding="utf-8")
