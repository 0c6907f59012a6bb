"""Saved models (``gpzoo.save`` / ``gpzoo.load``): exact round trips for every zoo model, priors,
float32, refusals with typed errors, and ``gpzoo predict`` writing CSV and netCDF."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import numpyro.distributions as dist
import pandas as pd
import pytest
import xarray as xr

import gpzoo
from gpzoo.analysis.cli import main
from gpzoo.inference import fit, predict
from gpzoo.inference.io import FORMAT_VERSION, load, save
from gpzoo.models import kernels, zoo
from gpzoo.models.errors import InvalidArgumentError, ModelFileError, UnverifiedModelWarning

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

#: Task each model is fitted for (binary unless listed), so the round trips cover every kind of likelihood.
TASKS = {"svgp-rbf": "multiclass", "conv": "regression", "colour-patch-conv": "multiclass", "invariant-finite": "regression"}
NUM_CLASSES = 3


def _tiny_data(name: str, task: str, n: int = 12):
    """``n`` random 6×6 images (6×6×3 for the colour models) with labels for ``task``, and the zoo kwargs."""
    colour = "colour" in name or "multichannel" in name
    shape = (6, 6, 3) if colour else (6, 6)
    rng = np.random.default_rng(len(name))
    X = rng.uniform(size=(n, int(np.prod(shape))))
    score = X[:, : X.shape[1] // 2].mean(1) - X[:, X.shape[1] // 2:].mean(1)
    y = {"regression": score, "binary": (score > np.median(score)).astype(float),
         "multiclass": np.arange(n) % NUM_CLASSES}[task]
    facts = dict(input_dim=X.shape[1], image_shape=shape, task=task, num_inducing=4,
                 num_classes=NUM_CLASSES if task == "multiclass" else None)
    extra = {"num_orbit_samples": 2} if "num_orbit_samples" in zoo.option_names(name) and name != "invariant-finite" else {}
    return X, y, facts | extra


def _assert_same_predictions(a, b, X):
    pa, pb = predict(a, X), predict(b, X)
    for field in ("f_mean", "f_var", "y_mean", "y_var", "probs"):
        va, vb = getattr(pa, field), getattr(pb, field)
        assert (va is None) == (vb is None), field
        if va is not None:
            np.testing.assert_array_equal(va, vb, err_msg=field)
            assert va.dtype == vb.dtype, field


def _assert_same_tree(a, b, where):
    """Equal pytrees: same structure and static fields (treedef), same leaves, dtypes included."""
    leaves_a, tree_a = jax.tree_util.tree_flatten(a)
    leaves_b, tree_b = jax.tree_util.tree_flatten(b)
    assert tree_a == tree_b, where
    for x, y in zip(leaves_a, leaves_b):
        assert type(x) is type(y) and np.asarray(x).dtype == np.asarray(y).dtype, where
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=where)


def _assert_same_result(a, b):
    for field in dataclasses.fields(a.spec):
        va, vb = getattr(a.spec, field.name), getattr(b.spec, field.name)
        if field.name in ("kernel", "architecture", "likelihood"):
            _assert_same_tree(va, vb, field.name)
            assert type(va) is type(vb)
        else:
            assert va == vb and type(va) is type(vb), field.name
    _assert_same_tree(a.inducing, b.inducing, "inducing")
    assert type(a.inducing) is type(b.inducing)
    assert a.params.keys() == b.params.keys()
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], b.params[k], err_msg=k)
        assert a.params[k].dtype == b.params[k].dtype, k
    for field in ("objective_history", "step_size_history", "X_train", "y_train"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    for field in ("num_latent", "num_data", "seed", "batch_size", "objective", "step_size", "diagnostics"):
        assert getattr(a, field) == getattr(b, field), field
    assert type(a.family) is type(b.family)


def _moved(params: dict, seed: int = 0) -> dict:
    """Every parameter moved off its initial value (scaled by 1–1.1, keeping signs and zeros; q_mu shifted)."""
    rng = np.random.default_rng(seed)
    return {k: np.asarray(v * rng.uniform(1.0, 1.1, v.shape) + (rng.normal(size=v.shape) if k == "q_mu" else 0.0)).astype(v.dtype)
            for k, v in params.items()}


# Every zoo model's exact round trip (predictions identical after loading) is part of the zoo
# contract: tests/test_contract.py calls ``assert_round_trips`` for each model.
def assert_round_trips(res, directory, X) -> None:
    """save -> load gives the same result and bit-identical predictions at ``X``."""
    loaded = load(save(res, directory))
    _assert_same_result(res, loaded)
    _assert_same_predictions(res, loaded, X)


def test_prior_hyperparameter_round_trips(tmp_path):
    X, y, kwargs = _tiny_data("svgp-rbf", "regression")
    spec = zoo.get("svgp-rbf", **kwargs)
    spec = spec.replace(kernel=kernels.SquaredExponential(lengthscale=dist.LogNormal(0.0, 1.0), variance=kernels.Fixed(1.5)))
    res = fit(spec, X, y, steps=3, progress=False)
    path = save(res, tmp_path / "prior")
    document = json.loads((path / "model.json").read_text())
    kernel = document["result"]["spec"]["fields"]["kernel"]["fields"]
    assert kernel["lengthscale"]["type"] == "numpyro.distributions.continuous.LogNormal"
    assert kernel["variance"] == {"type": "gpzoo.models.parameters.Fixed", "fields": {"value": 1.5}}
    loaded = load(path / "model.json")  # the file works as well as its directory
    assert isinstance(loaded.spec.kernel.lengthscale, dist.LogNormal)
    _assert_same_result(res, loaded)
    _assert_same_predictions(res, loaded, X[:5])


def test_float32_round_trip(float32, tmp_path):
    X, y, kwargs = _tiny_data("weighted-conv", "binary")
    X = X.astype(np.float32)
    res = fit(zoo.get("weighted-conv", **kwargs), X, y, steps=3, progress=False)
    assert res.params["q_mu"].dtype == np.float32
    loaded = gpzoo.load(gpzoo.save(res, tmp_path / "f32"))
    assert loaded.X_train.dtype == np.float32 and loaded.inducing.Z.dtype == np.float32
    _assert_same_result(res, loaded)
    _assert_same_predictions(res, loaded, X[:5])


# ----------------------------------------------------------------------------- refusals
@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """svgp-rbf fitted for 2 steps on 30 two-moons points, saved."""
    from gpzoo.analysis import datasets  # noqa: PLC0415

    ds = datasets.load("two-moons", seed=0, num_train=30)
    res = fit(zoo.get("svgp-rbf", input_dim=2, task="binary", num_inducing=4), ds.X_train, ds.y_train, steps=2, progress=False)
    return res, save(res, tmp_path_factory.mktemp("saved") / "svgp-rbf")


def _copy(saved_dir, tmp_path):
    target = tmp_path / "copy"
    target.mkdir()
    for name in ("model.json", "arrays.npz", "manifest.json"):
        (target / name).write_bytes((saved_dir / name).read_bytes())
    return target


def _edit(path, change):
    """Change ``model.json`` as someone who also rewrites ``manifest.json`` to match would (so what
    is refused is the content, not the checksum)."""
    document = json.loads((path / "model.json").read_text())
    change(document)
    (path / "model.json").write_text(json.dumps(document))
    resign(path)


def resign(path) -> None:
    """Rewrite ``manifest.json`` over the files of ``path`` as they now are (the manifest is content-addressed, not keyed)."""
    from gpzoo.inference.io import _file_entry, _manifest_text  # noqa: PLC0415

    files = {name: _file_entry((path / name).read_bytes()) for name in ("model.json", "arrays.npz")}
    (path / "manifest.json").write_text(_manifest_text(files))


def as_unsigned(path, version: int, change=None) -> None:
    """Turn the saved model in ``path`` into one of format ``version`` < 3: no manifest, the checksum of
    ``arrays.npz`` in ``model.json``, ``change`` applied to its document."""
    import hashlib  # noqa: PLC0415

    document = json.loads((path / "model.json").read_text())
    if change is not None:
        change(document)
    document.update(format_version=version, arrays="arrays.npz",
                    arrays_sha256=hashlib.sha256((path / "arrays.npz").read_bytes()).hexdigest())
    (path / "model.json").write_text(json.dumps(document))
    (path / "manifest.json").unlink()


def _refused(path, *words, named=None):
    """``load(path)`` raises ``ModelFileError`` naming ``named`` (default ``path``) and saying ``words``."""
    named = str(named or path)
    with pytest.raises(ModelFileError) as info:
        load(path)
    assert named in str(info.value) and info.value.path == named, str(info.value)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_class_outside_the_allow_list_is_refused(saved, tmp_path):
    path = _copy(saved[1], tmp_path)

    def evil(document):
        document["result"]["spec"]["fields"]["kernel"]["type"] = "subprocess.Popen"

    _edit(path, evil)
    _refused(path, "subprocess.Popen", "refusing", named=path / "model.json")
    # an allowed module does not open a door to what it imports
    _edit(path, lambda d: d["result"]["spec"]["fields"]["kernel"].update(type="gpzoo.inference.checkpoint.os.system"))
    _refused(path, "refusing", named=path / "model.json")
    _edit(path, lambda d: d["result"]["spec"]["fields"].update(options={"$ref": "gpzoo.inference.checkpoint.os.system"}))
    _refused(path, "refusing", named=path / "model.json")


def test_newer_format_version_is_refused(saved, tmp_path):
    path = _copy(saved[1], tmp_path)
    _edit(path, lambda d: d.update(format_version=FORMAT_VERSION + 1, gpzoo_version="99.0"))
    _refused(path, "format version", "99.0", "upgrade", named=path / "model.json")


def test_a_version_1_deep_kernel_machine_still_loads(tmp_path):
    """Format version 1 stored a deep kernel machine's DKMConfig as the spec's ``kernel``; such a file
    loads with it as the ``architecture`` (``kernel`` None) and predicts bit for bit as the original."""
    X, y, _ = _tiny_data("dkm", "binary")
    res = fit(zoo.get("dkm", input_dim=X.shape[1], task="binary", num_inducing=4, depth=1), X, y, steps=2, progress=False)
    path = save(res, tmp_path / "dkm")

    def as_version_1(document):
        fields = document["result"]["spec"]["fields"]
        assert fields["kernel"] is None and fields["architecture"]["type"] == "gpzoo.models.dkm.DKMConfig"
        fields["kernel"] = fields.pop("architecture")

    as_unsigned(path, 1, as_version_1)
    with pytest.warns(UnverifiedModelWarning, match="unverified.*overwrite=True"):
        loaded = load(path)
    assert loaded.spec.kernel is None and loaded.spec.architecture.num_layers == 1
    _assert_same_result(res, loaded)
    _assert_same_predictions(res, loaded, X[:5])


def test_missing_arrays_and_zero_byte_files_are_refused(saved, tmp_path):
    path = _copy(saved[1], tmp_path)
    (path / "arrays.npz").unlink()
    _refused(path, "missing", named=path / "arrays.npz")
    (path / "arrays.npz").write_bytes(b"")
    _refused(path, "does not match manifest.json", named=path / "arrays.npz")
    (path / "model.json").write_bytes(b"")
    _refused(path, "does not match manifest.json", named=path / "model.json")
    (path / "manifest.json").unlink()
    _refused(path, "corrupt", named=path / "model.json")
    _refused(tmp_path / "nowhere", "does not exist")
    _refused(tmp_path, "model.json missing")


def test_unsaveable_values_are_refused_when_saving(saved, tmp_path):
    res, _ = saved
    res = dataclasses.replace(res, diagnostics={"callback": lambda x: x})
    with pytest.raises(ModelFileError, match="diagnostics.callback"):
        save(res, tmp_path / "lambda")
    assert not (tmp_path / "lambda" / "model.json").exists()


def test_an_existing_model_is_replaced_only_with_overwrite(saved, tmp_path):
    res, _ = saved
    target = save(res, tmp_path / "model")
    other = dataclasses.replace(res, seed=res.seed + 7)
    with pytest.raises(InvalidArgumentError, match="already holds a saved model; pass overwrite=True") as error:
        save(other, target)
    assert error.value.argument == "path"
    assert load(target).seed == res.seed  # untouched
    assert save(other, target, overwrite=True) == target
    assert load(target).seed == res.seed + 7


def test_a_folder_of_other_files_is_refused_and_an_empty_one_taken(saved, tmp_path):
    res, _ = saved
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(InvalidArgumentError, match="already holds files") as error:
        save(res, tmp_path)
    assert error.value.argument == "path"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # nothing written
    (tmp_path / "empty").mkdir()
    assert load(save(res, tmp_path / "empty")).seed == res.seed
    with pytest.raises(InvalidArgumentError) as error:
        save(res, tmp_path / "new", overwrite="yes")
    assert error.value.argument == "overwrite"


def test_public_names():
    import gpzoo.inference as inference

    assert gpzoo.save is save and gpzoo.load is load and inference.save is save and inference.load is load


# ----------------------------------------------------------------------------- gpzoo predict
def test_cli_predict_writes_csv_and_netcdf(saved, tmp_path, capsys):
    """`gpzoo predict` on a saved model (`gpzoo fit` saving one is tested in test_cli.py)."""
    from gpzoo.analysis import datasets  # noqa: PLC0415

    model = saved[1]
    csv, nc = tmp_path / "pred.csv", tmp_path / "out" / "pred.nc"
    for target in (csv, nc):
        code = main(["predict", "--model", str(model), "--data", "two-moons", "--num-points", "15", "--out", str(target)])
        assert code == 0, capsys.readouterr().err
    table = pd.read_csv(csv)
    assert len(table) == 15 and list(table["index"]) == list(range(15))
    assert {"index", "f_mean", "f_var", "y_mean", "y_var", "prob_0", "prob_1", "label", "y"} <= set(table.columns)
    np.testing.assert_allclose(table[["prob_0", "prob_1"]].sum(axis=1), 1.0)
    ds = xr.load_dataset(nc)
    assert ds.sizes["index"] == 15 and ds["probs"].dims == ("index", "class") and ds.attrs["model"] == "svgp-rbf"
    np.testing.assert_array_equal(ds["f_mean"].values[:, 0], table["f_mean"].values)
    np.testing.assert_array_equal(ds["index"].values, table["index"].values)
    # what the Python API predicts for the same points (two-moons generates --num-points test points)
    test = datasets.load("two-moons", seed=0, num_test=15)
    np.testing.assert_allclose(predict(load(model), test.X_test).f_mean[:, 0], table["f_mean"].values, rtol=1e-12)
    np.testing.assert_array_equal(table["y"].values, test.y_test)
    # the training split, subsampled (two-moons gets num_train=5 from --num-points)
    code = main(["predict", "--model", str(model), "--data", "two-moons", "--split", "train", "--num-points", "5",
                 "--out", str(csv)])
    assert code == 0 and len(pd.read_csv(csv)) == 5
