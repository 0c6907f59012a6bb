"""Data far from unit scale: the typed warning, and ``fit(standardise=True)`` with its change of variables."""

import warnings

import numpy as np
import pytest

import gpzoo
from gpzoo.analysis.datatree import to_datatree
from gpzoo.inference.data import open_npy
from gpzoo.inference.fit import evaluate_elbo, fit, predict
from gpzoo.inference.scaling import Standardisation, scale_problems
from gpzoo.models import zoo
from gpzoo.models.errors import DataScaleWarning, InvalidArgumentError

N = 60


def _regression(seed=0, n=N):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, (n, 2))
    y = np.sin(1.5 * X[:, 0]) + 0.3 * X[:, 1] + 0.1 * rng.normal(size=n)
    return X, y


def _moons(n=80, seed=0):
    from sklearn.datasets import make_moons

    X, y = make_moons(n, noise=0.15, random_state=seed)
    return (X - X.mean(0)) / X.std(0), y


def _scale_warnings(spec, X, y, kind=DataScaleWarning, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = fit(spec, X, y, steps=3, progress=False, **kwargs)
    return res, [w.message for w in caught if isinstance(w.message, kind)]


@pytest.mark.parametrize("transform, argument", [
    (lambda X, y: (X, y * 1e6), "y"),
    (lambda X, y: (X, y + 1e6), "y"),
    (lambda X, y: (X * 1e4, y), "X"),
    (lambda X, y: (X * 1e-5, y), "X"),
])
def test_regression_data_far_from_unit_scale_warn_naming_the_argument(transform, argument):
    X, y = _regression()
    _, found = _scale_warnings(zoo.get("svgp-rbf", input_dim=2), *transform(X, y))
    assert [w.argument for w in found] == [argument]
    assert "standardise=True" in str(found[0])


def test_standardised_data_and_images_in_the_unit_range_do_not_warn():
    X, y = _regression()
    _, found = _scale_warnings(zoo.get("svgp-rbf", input_dim=2), (X - X.mean(0)) / X.std(0), (y - y.mean()) / y.std())
    assert found == []
    _, found = _scale_warnings(zoo.get("svgp-rbf", input_dim=2), X, y)  # uniform on [-3, 3] is unit scale
    assert found == []
    images = np.random.default_rng(0).uniform(0, 1, (20, 36))
    images[:, 0] = 0.0
    images[:3, 1] = 1e-4  # a pixel that is almost always 0 is not a feature far from unit scale
    for name in ("conv", "svgp-rbf"):
        spec = zoo.get(name, input_dim=36, image_shape=(6, 6), num_inducing=4, task="binary")
        assert scale_problems(spec, images, np.arange(20) % 2) == []


def test_images_far_from_the_unit_range_warn_under_every_kernel():
    """Pixels times 1,000: a vector kernel's model warns (DataScaleWarning, all pixels together),
    a patch kernel's model warns that its images leave [0, 1] (ImageRangeWarning)."""
    from gpzoo.models.errors import ImageRangeWarning

    images = np.random.default_rng(0).uniform(0, 1, (40, 36)) * 1e3
    labels = np.arange(40) % 2
    spec = zoo.get("svgp-rbf", input_dim=36, image_shape=(6, 6), num_inducing=4, task="binary")
    _, found = _scale_warnings(spec, images, labels)
    assert [w.argument for w in found] == ["X"] and "pixel values" in str(found[0])
    std = Standardisation.of(spec, images, labels)
    assert np.ptp(std.x_shift) == 0 and np.ptp(std.x_scale) == 0  # one map for every pixel
    np.testing.assert_allclose(std.inputs(images).std(), 1.0)
    conv = zoo.get("conv", image_shape=(6, 6), num_inducing=4, task="binary")
    _, found = _scale_warnings(conv, images, labels, kind=Warning)
    assert {type(w) for w in found if isinstance(w, (ImageRangeWarning, DataScaleWarning))} == {ImageRangeWarning}
    std = Standardisation.of(conv, images, labels)
    assert std.x_shift is None  # a patch kernel's pixels stay as given


def test_classification_checks_features_not_labels():
    X, y = _moons()
    spec = zoo.get("svgp-rbf", input_dim=2, task="binary")
    _, found = _scale_warnings(spec, X * 1e4, y)
    assert [w.argument for w in found] == ["X"]
    _, found = _scale_warnings(spec, X, y)
    assert found == []


def test_the_offset_check_depends_on_the_precision():
    """A column at 1e6 +- 1 keeps about one digit of its spread in float32 and all of it in float64."""
    X, y = _regression()
    spec = zoo.get("svgp-rbf", input_dim=2)
    shifted = X + np.array([1e6, 0.0])
    float32 = scale_problems(spec, shifted, y, dtype=np.float32)
    assert len(float32) == 1 and float32[0][0] == "X" and "feature column 0 is offset" in float32[0][1]
    assert scale_problems(spec, shifted, y, dtype=np.float64) == []


@pytest.mark.parametrize("a, b", [(1e6, 1e6), (1e-4, -3.0)])
def test_standardise_makes_the_fit_independent_of_the_units(precision, a, b):
    """Fitting (c X + d, a y + b) with standardise=True is the fit of (X, y) with standardise=True:
    predictions map by y -> a y + b, predictive variances by a^2, and every log density of y,
    the objective trace and the ELBO differ by exactly -N log a (the change of variables)."""
    X, y = _regression()
    spec = zoo.get("svgp-rbf", input_dim=2)
    c, d = np.array([1e4, 1e-3]), np.array([5e4, -7.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataScaleWarning)  # standardise=True checks nothing it then fixes
        plain = fit(spec, X, y, steps=40, progress=False, standardise=True)
        scaled = fit(spec, X * c + d, a * y + b, steps=40, progress=False, standardise=True)
    rtol = 2e-3 if precision == "float32" else 1e-5  # inducing points start from a float32 k-means
    for name, value in plain.params.items():
        np.testing.assert_allclose(scaled.params[name], value, rtol=rtol, atol=rtol, err_msg=name)
    np.testing.assert_allclose(scaled.objective_history, plain.objective_history - N * np.log(a), rtol=rtol, atol=rtol * N)
    X_new = np.random.default_rng(1).uniform(-3, 3, (17, 2))
    p_plain, p_scaled = predict(plain, X_new), predict(scaled, X_new * c + d)
    np.testing.assert_allclose(p_scaled.y_mean, a * p_plain.y_mean + b, rtol=rtol, atol=rtol * a)
    np.testing.assert_allclose(p_scaled.f_var, a ** 2 * p_plain.f_var, rtol=rtol * 5)
    np.testing.assert_allclose(p_scaled.y_var, a ** 2 * p_plain.y_var, rtol=rtol * 5)
    e_plain, e_scaled = evaluate_elbo(plain), evaluate_elbo(scaled)
    np.testing.assert_allclose(e_scaled.elbo, e_plain.elbo - N * np.log(a), rtol=rtol, atol=rtol * N)
    # the training data passed again in original units are the training data
    np.testing.assert_allclose(evaluate_elbo(scaled, X * c + d, a * y + b).elbo, e_scaled.elbo, rtol=1e-6)
    # a standardised fit's predictions are those of the model on standardised data, mapped back
    std = scaled.standardisation
    assert std is not None and std.y_scale == pytest.approx(a * y.std())
    np.testing.assert_allclose(std.inputs(X_new * c + d), (X_new - X.mean(0)) / X.std(0), atol=1e-6)


def test_standardise_recovers_a_fit_that_unscaled_data_ruin(float32):
    """y in the millions with a mean far from 0: the unscaled fit is useless, the standardised one
    reaches the error of the fit on unit-scale data."""
    X, y = _regression(n=120)
    X_test, y_test = _regression(seed=5, n=200)
    spec = zoo.get("svgp-rbf", input_dim=2)
    a, b = 1e6, 3e6

    def rmse(res, transform):
        return float(np.sqrt(np.mean((predict(res, X_test).y_mean[:, 0] - transform(y_test)) ** 2)))

    reference = rmse(fit(spec, X, y, steps=300, progress=False), lambda t: t)
    with pytest.warns(DataScaleWarning):
        unscaled = rmse(fit(spec, X, a * y + b, steps=300, progress=False), lambda t: a * t + b) / a
    standardised = rmse(fit(spec, X, a * y + b, steps=300, progress=False, standardise=True), lambda t: a * t + b) / a
    assert standardised < 1.2 * reference + 0.01
    assert unscaled > 5 * reference


def test_the_datatree_reports_original_units():
    X, y = _regression()
    X_test, y_test = _regression(seed=3, n=25)
    spec = zoo.get("svgp-rbf", input_dim=2)
    a, b = 200.0, 50.0
    plain = fit(spec, X, y, steps=30, progress=False, standardise=True)
    scaled = fit(spec, X, a * y + b, steps=30, progress=False, standardise=True)
    dt_plain, dt_scaled = to_datatree(plain, X_test, y_test, num_draws=100), to_datatree(scaled, X_test, a * y_test + b, num_draws=100)
    np.testing.assert_allclose(dt_scaled["predictions_log_likelihood"]["y"].values,
                               dt_plain["predictions_log_likelihood"]["y"].values - np.log(a), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dt_scaled["log_likelihood"]["y"].values, dt_plain["log_likelihood"]["y"].values - np.log(a),
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(dt_scaled["observed_data"]["y"].values, a * y + b, rtol=1e-9)
    np.testing.assert_allclose(dt_scaled["predictions_observed_data"]["y"].values, a * y_test + b)
    np.testing.assert_allclose(dt_scaled["constant_data"]["X"].values, X, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dt_scaled["predictions"]["y"].values, a * dt_plain["predictions"]["y"].values + b, rtol=1e-6)
    assert dt_scaled.attrs["standardised"] == 1 and dt_plain.attrs["standardised"] == 1


def test_standardise_round_trips_through_save_and_load(tmp_path, precision):
    X, y = _regression()
    res = fit(zoo.get("svgp-rbf", input_dim=2), X * 1e3 + 10.0, y * 1e5, steps=20, progress=False, standardise=True)
    loaded = gpzoo.load(gpzoo.save(res, tmp_path / "model"))
    assert loaded.standardisation is not None
    np.testing.assert_array_equal(loaded.standardisation.x_shift, res.standardisation.x_shift)
    assert loaded.standardisation.y_scale == res.standardisation.y_scale
    X_new = X[:9] * 1e3 + 10.0
    np.testing.assert_array_equal(predict(loaded, X_new).y_mean, predict(res, X_new).y_mean)
    # and a memory-mapped prediction set maps its rows the same way
    np.save(tmp_path / "X_new.npy", X_new)
    np.testing.assert_array_equal(predict(loaded, open_npy(tmp_path / "X_new.npy")).y_mean, predict(res, X_new).y_mean)


def test_classification_and_images_standardise_only_what_has_a_scale():
    X, y = _moons()
    res = fit(zoo.get("svgp-rbf", input_dim=2, task="binary"), X * 1e4 + 1e4, y, steps=5, progress=False,
              standardise=True)
    assert res.standardisation.y_shift is None and res.standardisation.x_shift is not None
    np.testing.assert_array_equal(res.y_train, y)
    images = np.random.default_rng(0).uniform(0, 1, (30, 36))
    std = Standardisation.of(zoo.get("conv", image_shape=(6, 6), num_inducing=4, task="binary"), images, np.arange(30) % 2)
    assert std.x_shift is None and std.y_shift is None  # pixels stay in [0, 1], labels are labels


def test_standardise_refuses_what_it_cannot_apply(tmp_path):
    X, y = _regression()
    spec = zoo.get("svgp-rbf", input_dim=2)
    with pytest.raises(InvalidArgumentError) as info:
        fit(spec, X, y, steps=2, progress=False, standardise="yes")
    assert info.value.argument == "standardise"
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    with pytest.raises(InvalidArgumentError) as info:
        fit(spec, open_npy(tmp_path / "X.npy", tmp_path / "y.npy"), steps=2, progress=False, standardise=True)
    assert info.value.argument == "standardise"
    with pytest.raises(InvalidArgumentError) as info:
        Standardisation(np.zeros(2), np.array([1.0, -1.0]))
    assert info.value.argument == "x_scale"


def test_a_non_finite_start_names_its_cause_not_the_learning_rate(float32):
    """A non-finite objective at step 0 (or a non-finite first update) comes from the data or the
    starting point: the error names the hyperparameter or the data's scale, and no learning rate."""
    from gpzoo.models import kernels
    from gpzoo.models.errors import TrainingError

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(60, 1)), np.sin(rng.normal(size=60))
    spec = zoo.get("svgp-rbf", input_dim=1, num_inducing=8)
    cases = [(spec.replace(kernel=kernels.RBF(variance=1e30)), y, 0, "kernel.variance = 1e+30"),
             (spec.replace(kernel=kernels.RBF(lengthscale=1e-30)), y, 1, "kernel.lengthscale = 1e-30"),
             (spec, y * 1e30, 0, "far from unit scale")]
    for case, targets, step, named in cases:
        with pytest.raises(TrainingError) as info, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fit(case, X, targets, steps=3, progress=False)
        message = str(info.value)
        assert info.value.step == step and named in message and "learning rate plays no part" in message, message
        assert "smaller learning_rate" not in message
        assert any(isinstance(w.message, DataScaleWarning) for w in caught) == (targets is not y)


def test_compare_standardises_every_fit_and_records_it(tmp_path):
    """``gpzoo.compare(..., standardise=True)`` (``gpzoo compare --standardise``): every fit keeps its
    standardisation, the ranking's ELBOs are those of the data as given, and the run records it."""
    import json

    from gpzoo.analysis.cli import _run_record, build_parser
    from gpzoo.analysis.datasets import Dataset

    X, y = _regression(n=80)
    X_test, y_test = _regression(seed=4, n=30)
    a, b = 1e5, 2e5
    data = Dataset("unscaled", X * 1e3, a * y + b, X_test * 1e3, a * y_test + b, task="regression")
    result = gpzoo.compare(data, models=["svgp-rbf"], steps=30, num_inducing=8, report=False, standardise=True,
                           out=tmp_path / "run")
    (fitted,) = result.results.values()
    assert fitted.standardisation is not None and fitted.standardisation.y_scale == pytest.approx(a * y.std())
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record.get("settings", record)["standardise"] is True
    # the table ranks ELBOs of the targets as given: the standardised fit's ELBO minus N log sd(y)
    assert float(result.table["elbo"].iloc[0]) == pytest.approx(evaluate_elbo(fitted).elbo, rel=1e-6)
    assert evaluate_elbo(fitted).elbo < -len(y) * np.log(a * y.std()) + 100
    args = build_parser().parse_args(["compare", "--data", "co2", "--models", "svgp-rbf", "--standardise",
                                      "--out", str(tmp_path / "cli")])
    assert args.standardise is True and _run_record(args, ["svgp-rbf"], {"svgp-rbf": {}}, {})["standardise"] is True
    args = build_parser().parse_args(["compare", "--data", "co2", "--models", "svgp-rbf", "--out", str(tmp_path / "cli")])
    assert "standardise" not in _run_record(args, ["svgp-rbf"], {"svgp-rbf": {}}, {})


def test_a_saved_standardisation_is_checked_on_loading(tmp_path):
    """A model file whose standardisation does not fit its data (wrong width, a zero scale) is
    refused by name, however it got there (the manifest is re-signed here as a writer would)."""
    import json

    from gpzoo.inference.io import ARRAYS_FILE, MANIFEST_FILE, MODEL_FILE, _file_entry, _manifest_text, _sha256
    from gpzoo.models.errors import ModelFileError

    X, y = _regression()
    res = fit(zoo.get("svgp-rbf", input_dim=2), X, y, steps=5, progress=False, standardise=True)
    for field, value in (("x_shift", [0.0, 0.0, 0.0]), ("x_scale", [1.0, 0.0]), ("y_scale", -1.0)):
        folder = gpzoo.save(res, tmp_path / field)
        document = json.loads((folder / MODEL_FILE).read_text())
        fields = document["result"]["standardisation"]["fields"]
        if isinstance(value, list):
            arrays = dict(np.load(folder / ARRAYS_FILE))
            arrays[fields[field]["$array"]] = np.asarray(value)
            fields[field]["shape"] = [len(value)]
            np.savez(folder / ARRAYS_FILE, **arrays)
        else:
            fields[field] = value
        model_bytes = json.dumps(document).encode()
        (folder / MODEL_FILE).write_bytes(model_bytes)
        files = {MODEL_FILE: _file_entry(model_bytes), ARRAYS_FILE: {"sha256": _sha256(folder / ARRAYS_FILE),
                                                                    "size": (folder / ARRAYS_FILE).stat().st_size}}
        (folder / MANIFEST_FILE).write_text(_manifest_text(files))
        with pytest.raises(ModelFileError) as info:
            gpzoo.load(folder)
        assert "standardisation" in str(info.value.argument) + str(info.value), (field, str(info.value))


@pytest.mark.parametrize("name", ["invariant-rot", "invariant-affine", "invariant-deform"])
def test_warped_image_orbits_warn_on_pixels_off_a_zero_background(name):
    """The sampled-orbit models resample images filling 0 outside the frame: pixels shifted to 1e3
    make that fill an edge (their accuracy falls to chance), and they say so (ImageRangeWarning);
    pixels in [0, 1] do not warn, and standardise leaves such pixels as they are."""
    from gpzoo.models.errors import ImageRangeWarning

    images = np.random.default_rng(0).uniform(0, 1, (10, 36))
    spec = zoo.get(name, image_shape=(6, 6), num_inducing=4, task="binary")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec.covariance_model.validate_inputs(images)
        assert scale_problems(spec, images + 1e3, np.arange(10) % 2) == []  # the kernel's own warning covers it
    assert not any(issubclass(w.category, ImageRangeWarning) for w in caught)
    with pytest.warns(ImageRangeWarning, match="background of 0"):
        spec.covariance_model.validate_inputs(images + 1e3)
    assert Standardisation.of(spec, images + 1e3, np.arange(10) % 2).x_shift is None


def test_a_second_standardised_fit_and_its_predict_compile_nothing(precision):
    """Standardisation happens in NumPy before and after the compiled programs: a second standardised
    fit of the same structure on other data (other units, seed, steps) and its predict on another
    number of rows run the programs the first compiled."""
    from gpzoo.inference.programs import CompileCounter

    X, y = _regression()
    spec = zoo.get("svgp-rbf", input_dim=2)
    predict(fit(spec, X, y, steps=20, progress=False, standardise=True), X[:13])
    X2, y2 = _regression(seed=9)
    with CompileCounter() as counter:
        res = fit(zoo.get("svgp-rbf", input_dim=2), X2 * 50.0 + 3.0, y2 * 1e4, steps=27, seed=4, progress=False,
                  standardise=True)
        pred = predict(res, X2[:21] * 50.0 + 3.0)
    assert counter.count == 0, f"the second standardised fit and predict compiled {counter.count} programs"
    assert np.all(np.isfinite(pred.y_mean))
