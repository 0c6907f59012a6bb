"""A saved model is one signed manifest: every file checked against its size and SHA-256 before it
is parsed, paths kept inside the folder, array headers and JSON depth bounded, every field checked
against the model it rebuilds; anything else is a ``ModelFileError`` naming the file (and field).
Also: every gpzoo error carries ``.argument``, and checkpoints hold finite, complete traces only."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpzoo.inference import fit, predict
from gpzoo.inference.checkpoint import load_checkpoint, save_checkpoint
from gpzoo.inference.io import MAX_JSON_DEPTH, _file_entry, _manifest_text, load, save
from gpzoo.models import zoo
from gpzoo.models.errors import CheckpointError, GPZooError, ModelFileError, UnverifiedModelWarning

FILES = ("model.json", "arrays.npz", "manifest.json")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """svgp-rbf fitted for 2 steps on 30 two-moons points, saved."""
    from gpzoo.analysis import datasets  # noqa: PLC0415

    ds = datasets.load("two-moons", seed=0, num_train=30)
    res = fit(zoo.get("svgp-rbf", input_dim=2, task="binary", num_inducing=4), ds.X_train, ds.y_train, steps=2, progress=False)
    return res, save(res, tmp_path_factory.mktemp("saved") / "svgp-rbf")


def _copy(source: Path, target: Path) -> Path:
    target.mkdir(parents=True)
    for name in FILES:
        (target / name).write_bytes((source / name).read_bytes())
    return target


def _sign(path: Path, names=("model.json", "arrays.npz"), extra: dict | None = None) -> None:
    """Rewrite ``manifest.json`` over ``names`` as they are now (what anyone can do: no key), plus ``extra`` entries."""
    files = {name: _file_entry((path / name).read_bytes()) for name in names}
    (path / "manifest.json").write_text(_manifest_text({**files, **(extra or {})}))


def _document(path: Path) -> dict:
    return json.loads((path / "model.json").read_text())


def _rewrite(path: Path, document) -> None:
    """Replace ``model.json`` and sign the result (an attacker who also rewrites the manifest)."""
    (path / "model.json").write_text(document if isinstance(document, str) else json.dumps(document))
    _sign(path)


def _refused(path, file=None, *words, field=None) -> ModelFileError:
    """``load(path)`` raises ``ModelFileError`` naming ``file`` (default: the folder) and saying ``words``."""
    with pytest.raises(ModelFileError) as info:
        load(path)
    error = info.value
    expected = str(file if file is not None else path)
    assert error.path == expected, str(error)
    assert error.argument == (expected if field is None else f"{expected}:{field}"), (error.argument, str(error))
    assert all(w in str(error) for w in words), str(error)
    return error


def _npz_members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as zf:
        return {info.filename: zf.read(info) for info in zf.infolist()}


def _write_npz(path: Path, members: dict[str, bytes]) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    path.write_bytes(buffer.getvalue())


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _set_param(path: Path, name: str, value: np.ndarray) -> None:
    """Store ``value`` as the parameter ``name`` (array and its declaration) and sign the result."""
    document = _document(path)
    entry = document["result"]["params"][name]
    members = _npz_members(path / "arrays.npz")
    members[entry["$array"] + ".npy"] = _npy(value)
    _write_npz(path / "arrays.npz", members)
    entry.update(dtype=value.dtype.str, shape=list(value.shape))
    _rewrite(path, document)


# ----------------------------------------------------------------------------- the manifest
def test_the_manifest_lists_every_file_and_signs_itself(saved):
    _, path = saved
    manifest = json.loads((path / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["arrays.npz", "model.json"]
    for name, entry in manifest["files"].items():
        data = (path / name).read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    body = {k: v for k, v in manifest.items() if k != "sha256"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    assert manifest["sha256"] == hashlib.sha256(canonical).hexdigest()
    assert manifest["format"] == "gpzoo-model-manifest" and manifest["manifest_version"] == 1
    assert "arrays_sha256" not in _document(path)


@pytest.mark.parametrize("name", FILES + ("notes/extra.txt",))
def test_a_flipped_byte_anywhere_in_any_file_is_refused(saved, tmp_path, name):
    """Every byte of every file is covered: flips at the ends and at spread positions each give a
    ModelFileError naming the file (a flip in the manifest breaks its JSON, its own hash, or a hash it lists)."""
    _, source = saved
    path = _copy(source, tmp_path / "m")
    if name == "notes/extra.txt":  # any other file the manifest lists is verified too
        (path / "notes").mkdir()
        (path / name).write_bytes(b"notes kept with the model\n" * 8)
        _sign(path, extra={name: _file_entry((path / name).read_bytes())})
    assert load(path).seed == saved[0].seed
    original = (path / name).read_bytes()
    rng = np.random.default_rng(len(name))
    positions = sorted({0, 1, len(original) // 2, len(original) - 2, len(original) - 1,
                        *np.linspace(0, len(original) - 1, 9).astype(int).tolist(),
                        *rng.integers(0, len(original), 6).tolist()})
    for position in positions:
        damaged = bytearray(original)
        damaged[position] ^= 0xFF
        (path / name).write_bytes(bytes(damaged))
        with pytest.raises(ModelFileError) as info:
            load(path)
        assert info.value.path == str(path / name), (position, str(info.value))
        assert info.value.argument.startswith(str(path / name)), (position, info.value.argument)
    (path / name).write_bytes(original[:-1])  # truncated by one byte
    _refused(path, path / name, "does not match" if name != "manifest.json" else "corrupt")
    (path / name).write_bytes(original)
    assert load(path).seed == saved[0].seed


def test_a_manifest_edited_consistently_but_without_its_own_hash_is_refused(saved, tmp_path):
    path = _copy(saved[1], tmp_path / "m")
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "model.json").write_text((path / "model.json").read_text().replace('"seed": ', '"seed":  '))
    manifest["files"]["model.json"] = _file_entry((path / "model.json").read_bytes())
    (path / "manifest.json").write_text(json.dumps(manifest))
    _refused(path, path / "manifest.json", "its own SHA-256", field="sha256")
    del manifest["files"]["arrays.npz"]
    (path / "manifest.json").write_text(_manifest_text(manifest["files"]))
    _refused(path, path / "manifest.json", "does not list arrays.npz", field="files")


def test_version_3_without_its_manifest_is_refused(saved, tmp_path):
    path = _copy(saved[1], tmp_path / "m")
    (path / "manifest.json").unlink()
    _refused(path, path / "manifest.json", "missing")


def test_a_model_saved_before_manifests_loads_with_a_warning_and_resaves_signed(saved, tmp_path):
    res, source = saved
    path = _copy(source, tmp_path / "m")
    document = _document(path)
    document.update(format_version=2, arrays="arrays.npz",
                    arrays_sha256=hashlib.sha256((path / "arrays.npz").read_bytes()).hexdigest())
    (path / "model.json").write_text(json.dumps(document))
    (path / "manifest.json").unlink()
    with pytest.warns(UnverifiedModelWarning, match="unverified"):
        loaded = load(path)
    np.testing.assert_array_equal(predict(loaded, res.X_train[:5]).f_mean, predict(res, res.X_train[:5]).f_mean)
    save(loaded, path, overwrite=True)
    assert (path / "manifest.json").is_file() and _document(path)["format_version"] == 3
    with __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("error")
        load(path)
    # the old layout's arrays entry may not leave the folder either
    for escape in ("../other/arrays.npz", "/etc/passwd", str(path / "arrays.npz")):
        document["arrays"] = escape
        (path / "model.json").write_text(json.dumps(document))
        (path / "manifest.json").unlink(missing_ok=True)
        _refused(path, path / "model.json", "refusing", field="arrays")


def test_a_save_cut_short_leaves_no_model_json_or_a_refused_set(saved, tmp_path, monkeypatch):
    """model.json is written last (the manifest already names its hash), so its presence marks a
    finished save; a save over a model that stops before it leaves files the manifest refuses."""
    import dataclasses  # noqa: PLC0415

    import gpzoo.inference.io as io_module  # noqa: PLC0415

    res, _ = saved
    target = save(res, tmp_path / "m")
    write = io_module.atomic_write

    def cut_short(path, writer):
        if path.name == "model.json":
            raise OSError(28, "No space left on device")
        write(path, writer)

    monkeypatch.setattr(io_module, "atomic_write", cut_short)
    with pytest.raises(ModelFileError, match="No space left"):
        save(dataclasses.replace(res, seed=res.seed + 1), target, overwrite=True)
    with pytest.raises(ModelFileError):
        save(res, tmp_path / "fresh")
    monkeypatch.undo()
    _refused(target, target / "model.json", "does not match manifest.json")
    assert not (tmp_path / "fresh" / "model.json").exists()
    _refused(tmp_path / "fresh", tmp_path / "fresh" / "model.json", "missing")


def test_what_is_not_a_model_folder_is_refused(tmp_path):
    for path in (None, 3, tmp_path / "a\x00b"):
        with pytest.raises(ModelFileError):
            load(path)
    (tmp_path / "file").write_text("x")
    _refused(tmp_path / "file", tmp_path / "file", "not a folder")


# ----------------------------------------------------------------------------- paths
@pytest.mark.parametrize("escape", ["/etc/passwd", "../other/arrays.npz", "notes/../../arrays.npz", "./arrays.npz",
                                    "C:/x.npz", "a\\..\\b"])
def test_paths_that_leave_the_folder_are_refused(saved, tmp_path, escape):
    path = _copy(saved[1], tmp_path / "m")
    _sign(path, extra={escape: _file_entry(b"")})
    _refused(path, path / "manifest.json", "refusing", field=f"files.{escape}")


def test_symbolic_links_are_refused(saved, tmp_path):
    path = _copy(saved[1], tmp_path / "m")
    outside = _copy(saved[1], tmp_path / "outside")
    (path / "arrays.npz").unlink()
    os.symlink(outside / "arrays.npz", path / "arrays.npz")  # same bytes, same hash: still refused
    _refused(path, path / "manifest.json", "symbolic link", field="files.arrays.npz")
    (path / "arrays.npz").unlink()
    (path / "arrays.npz").write_bytes((outside / "arrays.npz").read_bytes())
    os.symlink(outside, path / "linked")  # a symlinked folder on the way to a listed file
    _sign(path, extra={"linked/model.json": _file_entry((outside / "model.json").read_bytes())})
    _refused(path, path / "manifest.json", "symbolic link", field="files.linked/model.json")
    _sign(path)
    (path / "model.json").unlink()
    os.symlink(outside / "model.json", path / "model.json")
    _refused(path, path / "manifest.json", "symbolic link", field="files.model.json")
    os.symlink(outside, tmp_path / "link")  # the model folder itself
    _refused(tmp_path / "link", tmp_path / "link", "symbolic link")


# ----------------------------------------------------------------------------- sizes and depth
def test_a_header_claiming_a_huge_array_is_refused_without_allocating(saved, tmp_path):
    path = _copy(saved[1], tmp_path / "m")
    document = _document(path)
    entry = document["result"]["params"]["q_mu"]
    members = _npz_members(path / "arrays.npz")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (2**40,)})
    members[entry["$array"] + ".npy"] = header.getvalue() + b"\x00" * 64
    _write_npz(path / "arrays.npz", members)
    entry["shape"] = [2**40]  # declared consistently, so only the size bound stands in the way
    _rewrite(path, document)
    tracemalloc.start()
    try:
        _refused(path, path / "arrays.npz", "claims shape", field=entry["$array"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak  # far below the 8 TiB claimed
    # a header that disagrees with what model.json declares
    _set_param(path, "q_mu", np.zeros((1, 5)))
    document = _document(path)
    document["result"]["params"]["q_mu"]["shape"] = [1, 4]
    _rewrite(path, document)
    _refused(path, path / "model.json", "declared with shape", field="result.params.q_mu")


def test_deeply_nested_json_is_refused(saved, tmp_path):
    path = _copy(saved[1], tmp_path / "m")
    _rewrite(path, "[" * 10_000 + "]" * 10_000)
    _refused(path, path / "model.json", "nested")
    document = _document(saved[1])
    document["result"]["diagnostics"] = {"deep": "here"}  # deep inside an otherwise valid document
    _rewrite(path, json.dumps(document).replace('"here"', '{"a": [' * 5_000 + "0" + "]}" * 5_000))
    _refused(path, path / "model.json", "nested")
    (path / "manifest.json").write_text("{" + '"a":[' * 10_000 + "]" * 10_000 + "}")
    _refused(path, path / "manifest.json", "nested")
    # the bound is far above what saved models use
    assert MAX_JSON_DEPTH >= 50


# ----------------------------------------------------------------------------- content, manifest rewritten
def _swap_kernel_class(document):
    document["result"]["spec"]["fields"]["kernel"]["type"] = "gpzoo.models.kernels.stationary.Periodic"


def _kernel_is_a_likelihood(document):
    document["result"]["spec"]["fields"]["kernel"] = {"type": "gpzoo.models.likelihoods.Gaussian", "fields": {}}


def _lengthscale_is_a_likelihood(document):
    fields = document["result"]["spec"]["fields"]["kernel"]["fields"]
    fields["lengthscale"] = {"type": "gpzoo.models.likelihoods.Bernoulli", "fields": {}}


def _likelihood_is_a_kernel(document):
    document["result"]["spec"]["fields"]["likelihood"] = {"type": "gpzoo.models.kernels.stationary.SquaredExponential",
                                                          "fields": {}}


def _inducing_is_a_kernel(document):
    document["result"]["inducing"] = document["result"]["spec"]["fields"]["kernel"]


def _num_latent(document):
    document["result"]["num_latent"] = 3


def _num_data_text(document):
    document["result"]["num_data"] = "many"


def _num_data_negative(document):
    document["result"]["num_data"] = -5


def _x_train_number(document):
    document["result"]["X_train"] = 7


def _params_list(document):
    document["result"]["params"] = [1, 2]


def _dropped_param(document):
    del document["result"]["params"]["q_sqrt"]


def _q_mu_is_q_sqrt(document):
    params = document["result"]["params"]
    params["q_mu"] = params["q_sqrt"]


def _image_shape_text(document):
    document["result"]["spec"]["fields"]["image_shape"] = "6x6"


@pytest.mark.parametrize("change", [_swap_kernel_class, _kernel_is_a_likelihood, _lengthscale_is_a_likelihood,
                                    _likelihood_is_a_kernel, _inducing_is_a_kernel, _num_latent, _num_data_text,
                                    _num_data_negative, _x_train_number, _params_list, _dropped_param,
                                    _q_mu_is_q_sqrt, _image_shape_text])
def test_a_rewritten_model_json_is_still_type_checked(saved, tmp_path, change):
    """Someone who edits model.json and recomputes the manifest gets the content checked: wrong
    classes, types and shapes are refused at loading, naming the field, never at predict."""
    path = _copy(saved[1], tmp_path / "m")
    document = _document(path)
    change(document)
    _rewrite(path, document)
    with pytest.raises(ModelFileError) as info:
        load(path)
    assert info.value.path == str(path / "model.json"), str(info.value)
    assert info.value.argument.startswith(f"{path / 'model.json'}:result"), info.value.argument


@pytest.mark.parametrize(("name", "value"), [("q_mu", np.full((1, 4), np.nan)), ("q_mu", np.zeros((1, 5))),
                                             ("q_mu", np.zeros((2, 4))), ("q_sqrt", np.zeros((4, 4))),
                                             ("q_sqrt", np.where(np.eye(4) > 0, np.inf, 0.0)[None]),
                                             ("kernel.lengthscale", np.array(np.nan))])
def test_parameters_of_the_wrong_shape_or_non_finite_are_refused(saved, tmp_path, name, value):
    path = _copy(saved[1], tmp_path / "m")
    assert saved[0].params["q_mu"].shape == (1, 4) and saved[0].params["q_sqrt"].shape == (1, 4, 4)
    _set_param(path, name, value)
    _refused(path, path / "model.json", name, field=f"result.params.{name}")


# ----------------------------------------------------------------------------- random documents
_LEAVES = st.none() | st.booleans() | st.integers(-3, 2**70) | st.floats(allow_nan=False, allow_infinity=False) \
    | st.text(max_size=8) | st.sampled_from(["gpzoo.models.likelihoods.Gaussian", "subprocess.Popen", "q_mu", "nan"])


def _json_values():
    tagged = st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from([
            "gpzoo.models.kernels.stationary.SquaredExponential", "gpzoo.models.kernels.base.Sum",
            "gpzoo.models.likelihoods.Bernoulli", "gpzoo.inference.inducing.InducingPoints",
            "gpzoo.models.parameters.Fixed", "numpyro.distributions.continuous.LogNormal", "gpzoo.models.zoo_core.ModelSpec",
            "gpzoo.inference.checkpoint.os.system", "builtins.eval"]), "fields": st.dictionaries(st.text(max_size=12), _LEAVES, max_size=3)}),
        st.fixed_dictionaries({"$array": st.sampled_from(["q_mu", "params.q_mu", "X_train", "nope"]),
                               "dtype": st.sampled_from(["<f8", "<f4", "|O", "<i8", 3]),
                               "shape": st.lists(st.integers(-1, 2**41), max_size=3), "jax": st.booleans()}),
        st.fixed_dictionaries({"$scalar": st.sampled_from(["float64", "int32", "O", "V100000000000", "bool"]), "value": _LEAVES}),
        st.fixed_dictionaries({"$float": st.sampled_from(["nan", "inf", "1e999", "x"])}),
        st.fixed_dictionaries({"$tuple": st.lists(_LEAVES, max_size=3)}),
        st.fixed_dictionaries({"$dict": st.lists(st.lists(_LEAVES, max_size=3), max_size=3)}),
        st.fixed_dictionaries({"$ref": st.sampled_from(["gpzoo.models.kernels.stationary.SquaredExponential",
                                                        "gpzoo.__main__.main", "numpyro.distributions.Normal", "os.system"])}),
    )
    return st.recursive(_LEAVES | tagged, lambda children: st.lists(children, max_size=3)
                        | st.dictionaries(st.text(max_size=10), children, max_size=3), max_leaves=8)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_changes_to_model_json_give_only_model_file_errors(saved, data):
    """Any subtree of model.json replaced by random JSON (tags, classes and arrays included) and the
    manifest recomputed: the model loads, or a ModelFileError comes out; never another exception.
    A model that loads predicts finite values at training inputs (or refuses them with a GPZooError)."""
    res, source = saved
    document = _document(source)
    paths = list(_paths(document))
    where = data.draw(st.sampled_from(paths), label="path")
    replacement = data.draw(_json_values(), label="value")
    if where:
        parent = document
        for key in where[:-1]:
            parent = parent[key]
        parent[where[-1]] = replacement
    else:
        document = replacement
    with tempfile.TemporaryDirectory() as folder:
        path = _copy(source, Path(folder) / "m")
        _rewrite(path, json.dumps(document))
        try:
            loaded = load(path)
        except ModelFileError as error:
            assert error.path.startswith(str(path)) and error.argument is not None
            return
        # anything else propagates and fails the test
    try:
        prediction = predict(loaded, res.X_train[:3])
    except GPZooError:
        return
    assert np.all(np.isfinite(prediction.f_mean)) and np.all(np.isfinite(prediction.f_var))


# ----------------------------------------------------------------------------- errors
def _all_error_classes():
    import gpzoo.analysis.backends  # noqa: F401, PLC0415 - modules that define error classes
    import gpzoo.analysis.datasets  # noqa: F401, PLC0415
    import gpzoo.analysis.report  # noqa: F401, PLC0415
    import gpzoo.models.zoo_core  # noqa: F401, PLC0415

    found, todo = set(), [GPZooError]
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_error_class_carries_an_argument():
    from gpzoo.analysis.backends import FitTaskError  # noqa: PLC0415
    from gpzoo.analysis.report import ReportError  # noqa: PLC0415
    from gpzoo.models.errors import (InvalidArgumentError, NumericalError, TrainingError)  # noqa: PLC0415

    classes = _all_error_classes()
    names = {cls.__name__ for cls in classes}
    assert {"CheckpointError", "ModelFileError", "ReportError", "TrainingError", "NumericalError", "FitTaskError",
            "InvalidArgumentError", "UnknownModelError", "UnknownDatasetError"} <= names
    for cls in classes:
        assert hasattr(cls, "argument"), cls
    assert ModelFileError("d/model.json", "bad").argument == "d/model.json"
    assert ModelFileError("d/model.json", "bad", field="result.seed").argument == "d/model.json:result.seed"
    assert CheckpointError("checkpoint in 'd' is corrupt", argument="d/history.npz").argument == "d/history.npz"
    assert CheckpointError("steps: the checkpoint already holds 9 steps").argument == "steps"
    assert CheckpointError("checkpoint_dir 'd' does not exist").argument == "checkpoint_dir"
    assert CheckpointError("something without an argument").argument is None
    assert ReportError("out_dir: cannot write to 'r' (denied)").argument == "out_dir"
    assert TrainingError("the ELBO became nan", step=3, checkpoint="ck").argument == "ck"
    assert TrainingError("the ELBO became nan", step=3).argument is None
    assert NumericalError("failed", layer="layer 1", stage="Cholesky").argument is None
    assert FitTaskError("1 of 2 fit(s) failed").argument is None
    assert InvalidArgumentError("seed", "must be an integer").argument == "seed"
    for cls in classes:  # a raised error of every class answers .argument (a value or None), message-only or not
        try:
            error = cls("x: y")
        except TypeError:
            continue
        assert error.argument in ("x", "y", None) or isinstance(error.argument, str), cls


# ----------------------------------------------------------------------------- checkpoints
def _checkpoint(path, step=4, params=None, history=None):
    return save_checkpoint(path, params=params or {"q_mu": np.ones(2)}, state={"a": np.arange(3.0)},
                           history=history or {"objective": np.linspace(-3, -1, step), "step_size": np.full(step, 0.1)},
                           config={"model": "m", "step": step})


def test_a_non_finite_checkpoint_is_never_written_nor_resumed_from(tmp_path):
    with pytest.raises(CheckpointError) as info:
        _checkpoint(tmp_path / "nan", params={"q_mu": np.array([1.0, np.nan])})
    assert "NaN/inf" in str(info.value) and "good" not in str(info.value)
    assert info.value.argument == f"{tmp_path / 'nan' / 'params.npz'}:q_mu"
    assert not (tmp_path / "nan" / "config.json").exists()
    with pytest.raises(CheckpointError) as info:
        _checkpoint(tmp_path / "nan", history={"objective": np.array([-2.0, np.inf]), "step_size": np.ones(2)}, step=2)
    assert info.value.argument == f"{tmp_path / 'nan' / 'history.npz'}:objective"
    # written by hand (or by an older gpzoo): refused when loading, naming the file
    ck = _checkpoint(tmp_path / "ck")
    np.savez(ck / "params.npz", q_mu=np.array([np.nan, 1.0]), checkpoint_step=np.asarray(4))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(ck)
    assert "not a state to resume from" in str(info.value) and "good" not in str(info.value)
    assert info.value.argument == f"{ck / 'params.npz'}:q_mu"


def test_a_shortened_history_is_refused(tmp_path):
    ck = _checkpoint(tmp_path / "ck", step=6)
    assert load_checkpoint(ck)[3]["objective"].shape == (6,)
    with np.load(ck / "history.npz") as f:
        saved = {k: f[k] for k in f.files}
    np.savez(ck / "history.npz", **{**saved, "objective": saved["objective"][:4]})
    with pytest.raises(CheckpointError, match="shortened") as info:
        load_checkpoint(ck)
    assert info.value.argument == str(ck / "history.npz")
    np.savez(ck / "history.npz", **{k: v for k, v in saved.items() if k != "step_size"})  # a trace dropped
    with pytest.raises(CheckpointError, match="history.npz") as info:
        load_checkpoint(ck)
    assert info.value.argument == str(ck / "history.npz")
    # without the recorded shapes (an older checkpoint) the step count still bounds each trace
    config = json.loads((ck / "config.json").read_text())
    del config["history"]
    (ck / "config.json").write_text(json.dumps(config))
    np.savez(ck / "history.npz", **{**saved, "step_size": saved["step_size"][:5]})
    with pytest.raises(CheckpointError, match="5 entries of 'step_size'") as info:
        load_checkpoint(ck)
    assert info.value.argument == f"{ck / 'history.npz'}:step_size"
    (ck / "history.npz").write_bytes((ck / "params.npz").read_bytes()[:40])  # truncated bytes
    with pytest.raises(CheckpointError, match="corrupt") as info:
        load_checkpoint(ck)
    assert info.value.argument == str(ck / "history.npz")
