"""Reliability: no silent wrong result, and every bad input gets a typed gpzoo error naming the argument
before any tracing (active_dims and ARD widths, run settings, resume against other data or settings,
ELBO sample counts, pixel ranges, jitter increases inside a compiled chunk)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gpzoo.inference import evaluate_elbo, fit, predict
from gpzoo.inference.inducing import InducingPoints
from gpzoo.inference.runner import ChunkProgram, ClosureStep, run_chunks
from gpzoo.models import kernels, likelihoods, zoo
from gpzoo.models.errors import (
    CheckpointError,
    GPZooError,
    HyperparameterError,
    ImageRangeWarning,
    InvalidArgumentError,
    ShapeError,
)

QUIET = dict(progress=False)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    X = rng.uniform(-2, 2, (24, 2))
    y = np.sin(X[:, 0]) + 0.1 * rng.normal(size=24)
    return X, y


@pytest.fixture(scope="module")
def spec():
    return zoo.get("svgp-rbf", input_dim=2, num_inducing=4)


@pytest.fixture(scope="module")
def fitted(data, spec):
    return fit(spec, *data, steps=2, **QUIET)


# ----------------------------------------------------------------------------- silent wrong results
@pytest.mark.parametrize("active_dims", [[5], [0, 2], [-3]])
def test_active_dims_outside_the_data_width_are_refused_before_fitting(data, spec, active_dims):
    """JAX clamps an out-of-range gather index: [5] on 2 columns would silently use column 1."""
    bad = spec.replace(kernel=kernels.SquaredExponential(active_dims=active_dims))
    with pytest.raises(ShapeError) as info:
        fit(bad, *data, steps=1, **QUIET)
    assert info.value.argument == "active_dims" and "2 input columns" in str(info.value)


def test_ard_lengthscale_of_the_wrong_length_is_refused(data, spec):
    with pytest.raises(HyperparameterError) as info:
        fit(spec.replace(kernel=kernels.SquaredExponential(lengthscale=np.ones(3))), *data, steps=1, **QUIET)
    assert info.value.argument == "SquaredExponential.lengthscale"
    with pytest.raises(InvalidArgumentError) as info:
        zoo.get("svgp-rbf", input_dim=2, lengthscale=(1.0, 2.0, 3.0))
    assert info.value.argument == "lengthscale"
    assert str(info.value) == f"lengthscale: {info.value.message}" and "SquaredExponential" not in info.value.message
    # one value per selected column is right: two active columns of three
    k = kernels.SquaredExponential(lengthscale=np.ones(2), active_dims=[0, 2])
    k.validate_inputs(np.zeros((3, 3)))


@pytest.mark.parametrize("value", [-0.05, 0.0, float("nan"), float("inf"), "0.01", True, None])
def test_learning_rate_must_be_a_positive_finite_number(data, spec, value):
    with pytest.raises(InvalidArgumentError) as info:
        fit(spec, *data, steps=1, learning_rate=value, **QUIET)
    assert info.value.argument == "learning_rate"


@pytest.mark.parametrize("argument, value", [("seed", -1), ("seed", 1.5), ("seed", 2**32), ("optimizer", "adam"),
                                             ("steps", 2.0), ("batch_size", "8"), ("chunk_size", 0),
                                             ("checkpoint_every", 0), ("resume", "yes"), ("progress", 1)])
def test_fit_settings_are_checked_and_named(data, spec, argument, value):
    settings = {"progress": False, argument: value}
    with pytest.raises(InvalidArgumentError) as info:
        fit(spec, *data, **{"steps": 1, **settings})
    assert info.value.argument == argument


def test_resume_refuses_other_data_or_settings_naming_what_differs(tmp_path, data, spec, precision):
    X, y = data
    settings = dict(steps=6, seed=0, learning_rate=0.01, batch_size=12, checkpoint_every=2, checkpoint_dir=tmp_path, **QUIET)
    fit(spec, X, y, **(settings | {"steps": 4}))
    changes = [
        ({"y": y[::-1].copy()}, r"the training data \(X, y\) differ"),  # same shape, other values
        ({"seed": 1}, "seed is 0 in the checkpoint but 1 now"),
        ({"learning_rate": 0.02}, "learning_rate is 0.01 in the checkpoint but 0.02 now"),
        ({"batch_size": 8}, "batch_size is 12 in the checkpoint but 8 now"),
        ({"steps": 2}, "steps: the checkpoint .* already holds 4 steps, more than steps=2"),
    ]
    for change, named in changes:
        run = {"X": X, "y": y} | settings | change
        with pytest.raises(CheckpointError, match=named):
            fit(spec, resume=True, **run)
    # the same data and settings resume (more steps than done are fine)
    assert fit(spec, X, y, resume=True, **settings).objective_history.shape == (6,)


def test_resume_from_a_missing_checkpoint_directory_is_an_error(tmp_path, data, spec):
    with pytest.raises(CheckpointError, match="does not exist"):
        fit(spec, *data, steps=2, checkpoint_dir=tmp_path / "typo", resume=True, **QUIET)
    assert not (tmp_path / "typo").exists()
    (tmp_path / "empty").mkdir()  # an existing empty directory: nothing written yet, a fresh run
    assert fit(spec, *data, steps=2, checkpoint_dir=tmp_path / "empty", resume=True, **QUIET).objective_history.shape == (2,)


def test_zero_byte_checkpoint_file_is_a_checkpoint_error(tmp_path, data, spec):
    fit(spec, *data, steps=2, checkpoint_dir=tmp_path, **QUIET)
    for name in ("config.json", "params.npz", "state.npz", "history.npz"):
        good = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(b"")
        with pytest.raises(CheckpointError, match="corrupt"):
            fit(spec, *data, steps=4, checkpoint_dir=tmp_path, resume=True, **QUIET)
        (tmp_path / name).write_bytes(good)


def test_evaluate_elbo_sample_count_is_checked_on_every_model(fitted):
    for value in (0, -1, 1.5, "4"):
        with pytest.raises(InvalidArgumentError) as info:
            evaluate_elbo(fitted, num_samples=value)
        assert info.value.argument == "num_samples"
    assert evaluate_elbo(fitted, num_samples=1).stderr == 0.0  # analytic: exact, no Monte Carlo error


def test_one_draw_monte_carlo_elbo_reports_no_standard_error(float32):
    rng = np.random.default_rng(2)
    X = rng.normal(size=(18, 2))
    y = np.arange(18) % 3
    spec = zoo.get("svgp-rbf", input_dim=2, task="multiclass", num_classes=3, num_inducing=3,
                   likelihood=likelihoods.Softmax(num_classes=3, num_mc_samples=4))
    res = fit(spec, X, y, steps=1, **QUIET)
    one = evaluate_elbo(res, num_samples=1)
    assert np.isfinite(one.elbo) and np.isnan(one.stderr)
    two = evaluate_elbo(res, num_samples=2)
    assert np.isfinite(two.stderr) and two.stderr > 0


def test_pixel_values_outside_the_unit_range_warn_naming_the_range(float32):
    rng = np.random.default_rng(3)
    X = rng.uniform(0, 255, (6, 16))  # 4x4 images in [0, 255]
    y = rng.normal(size=6)
    spec = zoo.get("conv", image_shape=(4, 4), num_inducing=3)
    with pytest.warns(ImageRangeWarning, match=r"X: image values must lie in \[0, 1\].*found range"):
        fit(spec, X, y, steps=0, **QUIET)


# ----------------------------------------------------------------------------- typed errors naming the argument
@pytest.mark.parametrize("model, facts", [("svgp-rbf", {"input_dim": 2}), ("conv", {"image_shape": (4, 4)})])
@pytest.mark.parametrize("value", [0, -3, "8", 8.0, True])
def test_num_inducing_must_be_a_positive_integer(model, facts, value):
    with pytest.raises(InvalidArgumentError) as info:
        zoo.get(model, num_inducing=value, **facts)
    assert info.value.argument == "num_inducing"


def test_option_values_are_checked_against_their_declared_types():
    for option, value in [("patch_shape", "3x3"), ("patch_shape", (3, 3, 3)), ("lengthscale", "wide"),
                          ("normalisation", "median"), ("whiten", "yes"), ("task", "ranking")]:
        with pytest.raises(InvalidArgumentError) as info:
            zoo.get("conv", image_shape=(6, 6), **{option: value})
        assert info.value.argument == option
    with pytest.raises(GPZooError):  # an unknown model is a gpzoo error (and still a KeyError)
        zoo.get("no-such-model")


def test_inducing_inputs_of_the_wrong_width_are_refused(data, spec):
    for Z in (np.zeros((4, 3)), np.zeros((4,))):
        with pytest.raises(InvalidArgumentError) as info:
            fit(spec, *data, steps=1, inducing=InducingPoints(jnp.asarray(Z)) if Z.ndim == 2 else Z, **QUIET)
        assert info.value.argument == "inducing"
    with pytest.raises(InvalidArgumentError) as info:  # non-finite values: the constructor refuses them, by field
        InducingPoints(jnp.full((4, 2), jnp.nan))
    assert info.value.argument == "InducingPoints.Z"


def test_predict_and_evaluate_elbo_check_their_arguments(fitted, data):
    X, y = data
    with pytest.raises(ShapeError) as info:
        predict(fitted, np.zeros((0, 2)))
    assert info.value.argument == "X_new"
    for call in (lambda: predict(fitted, X, batch_size=0), lambda: evaluate_elbo(fitted, batch_size=0)):
        with pytest.raises(InvalidArgumentError) as info:
            call()
        assert info.value.argument == "batch_size"
    with pytest.raises(InvalidArgumentError) as info:
        predict(fitted, X, seed=-1)
    assert info.value.argument == "seed"
    with pytest.raises(InvalidArgumentError) as info:
        evaluate_elbo(fitted, X)
    assert info.value.argument == "y"


# ----------------------------------------------------------------------------- jitter inside a chunk
def test_jitter_increase_inside_a_chunk_is_recorded_with_its_step(precision):
    """The jitter rises after update 3 and is back after update 5: all inside one chunk of 10 steps."""
    base = 1e-6
    program = ChunkProgram(
        label="toy", objective="ELBO",
        step=ClosureStep(lambda state, inputs, constants: (state + 1.0, -state),
                         lambda state: jnp.where((state >= 3) & (state < 5), 1e-4, base)),
        step_inputs=lambda step: np.zeros(()), rate_at=lambda step: 0.1, params_of=lambda state: {"s": state},
        config={"model": "toy"}, jitter=base,
    )
    diagnostics = {"jitter_events": []}
    run_chunks(program, jnp.zeros(()), steps=10, chunk_size=10, checkpoint_dir=None, checkpoint_every=None, resume=False,
               progress=False, diagnostics=diagnostics)
    assert diagnostics["jitter_events"] == [{"step": 3, "jitter": pytest.approx(1e-4)}]
    assert diagnostics["max_jitter"] == pytest.approx(1e-4) and diagnostics["last_jitter"] == pytest.approx(base)


def test_padded_steps_of_a_chunk_run_no_update(precision):
    """3 steps in a compiled chunk of 10: the update runs 3 times (a host callback counts them), and
    the state and history are those of 3 updates."""
    calls = []

    def update(state, inputs, constants):
        jax.debug.callback(lambda: calls.append(1), ordered=True)
        return state + 1.0, -state

    program = ChunkProgram(label="toy", objective="ELBO", step=ClosureStep(update, lambda state: jnp.asarray(0.0)),
                           step_inputs=lambda step: np.zeros(()),
                           rate_at=lambda step: 0.1, params_of=lambda state: {"s": state}, config={"model": "toy"})
    state, objective, rates = run_chunks(program, jnp.zeros(()), steps=3, chunk_size=10, checkpoint_dir=None,
                                         checkpoint_every=None, resume=False, progress=False, diagnostics={})
    jax.effects_barrier()
    assert len(calls) == 3
    assert float(state) == 3.0 and list(objective) == [0.0, -1.0, -2.0] and len(rates) == 3


def test_a_full_disk_during_a_checkpoint_keeps_the_fit_and_says_where(tmp_path, data, spec, monkeypatch):
    """No space left on the device while a checkpoint is written: fit warns once, naming the folder and
    the cause, stops checkpointing, finishes, and returns the same fit as one without checkpoints; the
    write error itself is a CheckpointError naming the folder."""
    import errno  # noqa: PLC0415

    from gpzoo.inference import checkpoint as checkpoint_module  # noqa: PLC0415
    from gpzoo.models.errors import GPZooWarning  # noqa: PLC0415

    X, y = data
    settings = dict(steps=8, seed=0, learning_rate=0.01, batch_size=12, **QUIET)
    expected = fit(spec, X, y, **settings)
    calls = []

    def full_disk(path, write):
        calls.append(path)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(checkpoint_module, "atomic_write", full_disk)
    with pytest.warns(GPZooWarning, match="No space left on device") as record:
        res = fit(spec, X, y, checkpoint_dir=tmp_path / "ckpt", checkpoint_every=2, **settings)
    assert len([w for w in record if issubclass(w.category, GPZooWarning)]) == 1 and len(calls) == 1
    assert str(tmp_path / "ckpt") in str(record[0].message) and "ENOSPC" in str(record[0].message)
    np.testing.assert_array_equal(res.objective_history, expected.objective_history)
    for key in expected.params:
        np.testing.assert_array_equal(res.params[key], expected.params[key])
    assert "checkpoint_error" in res.diagnostics
    with pytest.raises(CheckpointError) as info:
        checkpoint_module.save_checkpoint(tmp_path / "direct", params={"a": np.zeros(2)}, state=[np.zeros(2)],
                                          history={}, config={"step": 1})
    assert info.value.argument == str(tmp_path / "direct")


def test_a_compilation_cache_that_cannot_be_written_never_fails_a_fit(tmp_path, data, spec, monkeypatch,
                                                                      without_suite_compilation_cache):
    """Every cache write fails with "no space left" (as on a full disk): the fit compiles, runs and
    equals the one without a cache; the failures are warnings."""
    import errno  # noqa: PLC0415

    from jax._src import compilation_cache  # noqa: PLC0415 - the write the full disk would break

    from gpzoo.inference.programs import enable_persistent_cache  # noqa: PLC0415

    X, y = data
    settings = dict(steps=5, seed=0, learning_rate=0.02, **QUIET)
    expected = fit(spec, X, y, **settings)
    jax.clear_caches()
    assert enable_persistent_cache(tmp_path / "cache") == tmp_path / "cache"

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(compilation_cache, "put_executable_and_time", full_disk)
    with pytest.warns(UserWarning, match="No space left on device"):
        res = fit(spec, X, y, **settings)
    np.testing.assert_array_equal(res.objective_history, expected.objective_history)
