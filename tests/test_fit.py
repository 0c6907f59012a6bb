"""The training loop: checkpoints and resume, the NaN guard, jitter retries, input errors."""

import json
import re
import signal
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gpzoo.inference import fit
from gpzoo.inference.checkpoint import load_checkpoint
from gpzoo.inference.linalg import cholesky_with_jitter
from gpzoo.models import kernels, likelihoods, zoo
from gpzoo.models.errors import CheckpointError, DataError, HyperparameterError, InvalidArgumentError, ShapeError, TrainingError


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (60, 2))
    y = np.sin(X[:, 0]) * np.cos(X[:, 1]) + 0.1 * rng.normal(size=60)
    return X, y


@pytest.fixture(scope="module")
def spec():
    return zoo.get("svgp-rbf", input_dim=2, num_inducing=6)


def _same_params(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_checkpoint_round_trip_and_resume_match_uninterrupted_run(tmp_path, data, spec):
    X, y = data
    kw = dict(batch_size=20, seed=3, progress=False, checkpoint_every=10)
    full = fit(spec, X, y, steps=40, **kw)
    # interrupted run: 20 steps then a resumed run to 40
    fit(spec, X, y, steps=20, checkpoint_dir=tmp_path / "ck", **kw)
    config, params, _, history = load_checkpoint(tmp_path / "ck")
    assert config["step"] == 20 and config["model"] == "svgp-rbf"
    assert history["objective"].shape == (20,)
    resumed = fit(spec, X, y, steps=40, checkpoint_dir=tmp_path / "ck", resume=True, **kw)
    _same_params(full.params, resumed.params)
    np.testing.assert_array_equal(full.objective_history, resumed.objective_history)
    # the files on disk are plain npz/json (no pickle) and hold the final parameters
    _, params, _, _ = load_checkpoint(tmp_path / "ck")
    _same_params(params, resumed.params)
    assert not list((tmp_path / "ck").glob("*.tmp"))


def test_corrupt_or_foreign_checkpoint_raises(tmp_path, data, spec):
    X, y = data
    fit(spec, X, y, steps=5, checkpoint_dir=tmp_path / "ck", progress=False)
    (tmp_path / "ck" / "state.npz").write_bytes(b"not a zip file")
    with pytest.raises(CheckpointError, match="corrupt"):
        fit(spec, X, y, steps=10, checkpoint_dir=tmp_path / "ck", resume=True, progress=False)
    fit(spec, X, y, steps=5, checkpoint_dir=tmp_path / "ck2", progress=False)
    other = zoo.get("svgp-rbf", input_dim=2, num_inducing=7)
    with pytest.raises(CheckpointError, match="does not match"):
        fit(other, X, y, steps=10, checkpoint_dir=tmp_path / "ck2", resume=True, progress=False)
    (tmp_path / "ck2" / "params.npz").unlink()
    with pytest.raises(CheckpointError, match="incomplete"):
        fit(spec, X, y, steps=10, checkpoint_dir=tmp_path / "ck2", resume=True, progress=False)


def test_a_checkpoint_of_another_unconstrained_form_is_refused(tmp_path, data, spec):
    """A checkpoint whose config does not record this gpzoo's unconstrained parameterisation (written
    when q_sqrt's diagonal was exp(x)) is refused by name before its state is read."""
    import json

    X, y = data
    fit(spec, X, y, steps=5, checkpoint_dir=tmp_path / "ck", progress=False)
    config_file = tmp_path / "ck" / "config.json"
    config = json.loads(config_file.read_text())
    del config["unconstrained_form"]
    config_file.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="unconstrained_form .* not recorded in the checkpoint"):
        fit(spec, X, y, steps=10, checkpoint_dir=tmp_path / "ck", resume=True, progress=False)


def _nan_after(step: int) -> optax.GradientTransformation:
    """Adam whose updates turn NaN from optimiser step ``step`` on (a diverging run)."""
    adam = optax.adam(0.01)

    def init(params):
        return (jnp.zeros((), jnp.int32), adam.init(params))

    def update(grads, state, params=None):
        count, inner = state
        updates, inner = adam.update(grads, inner, params)
        poison = jnp.where(count >= step, jnp.nan, 0.0)
        return jax.tree_util.tree_map(lambda u: u + poison, updates), (count + 1, inner)

    return optax.GradientTransformation(init, update)


def test_nan_loss_stops_with_step_and_keeps_last_good_checkpoint(tmp_path, data, spec):
    X, y = data
    with pytest.raises(TrainingError) as info:
        fit(spec, X, y, steps=50, optimizer=_nan_after(12), checkpoint_dir=tmp_path / "ck", progress=False)
    # update 12 writes NaN parameters, so the loss of step 13 is the first non-finite one and
    # the state after 12 updates (whose loss was finite) is the last good checkpoint
    assert info.value.step == 13
    assert "step 13" in str(info.value) and "step 12" in str(info.value)
    config, params, _, history = load_checkpoint(tmp_path / "ck")
    assert config["step"] == 12
    assert all(np.all(np.isfinite(v)) for v in params.values())
    assert np.all(np.isfinite(history["objective"])) and history["objective"].shape == (12,)


def test_cholesky_retries_with_larger_jitter_and_reports_it():
    K = jnp.ones((4, 4)) - 1e-10 * jnp.eye(4)  # eigenvalues -1e-10 (x3): needs jitter > 1e-10
    L, used = cholesky_with_jitter(K, 1e-14)
    assert 1e-10 < float(used) <= 1e-8
    assert np.all(np.isfinite(L))
    np.testing.assert_allclose(L @ L.T, K + float(used) * jnp.eye(4), atol=1e-10)
    L2, used2 = cholesky_with_jitter(jnp.eye(3), 1e-6)
    assert float(used2) == 1e-6


def test_jitter_increase_is_recorded_in_diagnostics():
    X = np.repeat(np.linspace(0, 1, 5)[:, None], 4, axis=0)  # duplicated inputs
    y = np.sin(X[:, 0])
    spec = zoo.get("svgp-rbf", input_dim=1, num_inducing=4).replace(jitter=1e-18)
    from gpzoo.inference.inducing import InducingPoints

    Z = jnp.asarray(np.array([[0.0], [0.0], [0.5], [1.0]]))  # two identical inducing inputs
    res = fit(spec, X, y, steps=5, inducing=InducingPoints(Z), progress=False)
    assert res.diagnostics["jitter_events"], res.diagnostics
    assert res.diagnostics["jitter_events"][0]["jitter"] > 1e-18


@pytest.mark.parametrize(
    "make, error, argument",
    [
        (lambda X, y: (X[:, :, None], y), ShapeError, "X"),
        (lambda X, y: (X, y[:-1]), ShapeError, "y"),
        (lambda X, y: (np.where(np.arange(X.size).reshape(X.shape) == 3, np.nan, X), y), DataError, "X"),
        (lambda X, y: (X, np.where(np.arange(y.size) == 0, np.inf, y)), DataError, "y"),
    ],
)
def test_bad_data_raises_typed_error_naming_argument(data, spec, make, error, argument):
    X, y = make(*data)
    with pytest.raises(error) as info:
        fit(spec, X, y, steps=1, progress=False)
    assert info.value.argument == argument


def test_labels_outside_support_and_bad_options_raise(data):
    X, y = data
    spec = zoo.get("svgp-rbf", input_dim=2, task="binary", num_inducing=4)
    with pytest.raises(DataError) as info:
        fit(spec, X, (y > 0).astype(int) * 2, steps=1, progress=False)
    assert info.value.argument == "y"
    yb = (y > 0).astype(int)
    with pytest.raises(InvalidArgumentError) as info:
        fit(spec.replace(num_inducing=61), X, yb, steps=1, progress=False)
    assert info.value.argument == "num_inducing"
    with pytest.raises(InvalidArgumentError) as info:
        fit(spec, X, yb, steps=1, batch_size=0, progress=False)
    assert info.value.argument == "batch_size"
    with pytest.raises(InvalidArgumentError) as info:
        fit(spec, X, yb, steps=-1, progress=False)
    assert info.value.argument == "steps"
    with pytest.raises(HyperparameterError) as info:
        kernels.SquaredExponential(lengthscale=0.0)
    assert info.value.argument == "SquaredExponential.lengthscale"
    with pytest.raises(HyperparameterError):
        likelihoods.Gaussian(noise_variance=-1.0)
    with pytest.raises(zoo.UnknownModelError, match="svgp-rbf"):
        zoo.get("no-such-model")


def test_progress_bar_and_history(data, spec, capsys):
    X, y = data
    res = fit(spec, X, y, steps=30, progress=True, learning_rate=optax.linear_schedule(0.05, 0.01, 30))
    err = capsys.readouterr().err
    assert "fit svgp-rbf" in err
    assert res.objective_history.shape == (30,) and res.step_size_history.shape == (30,)
    np.testing.assert_allclose(res.step_size_history[[0, -1]], [0.05, 0.05 - 0.04 * 29 / 30])
    json.dumps(res.diagnostics)  # diagnostics are plain JSON-able values


def test_nan_parameters_after_the_last_step_are_caught(tmp_path, data, spec):
    """The final update writes NaN parameters (no later loss shows it): the state check stops the fit."""
    X, y = data
    with pytest.raises(TrainingError) as info:
        fit(spec, X, y, steps=13, optimizer=_nan_after(12), checkpoint_dir=tmp_path / "ck", progress=False)
    assert info.value.step == 13 and "parameters became non-finite" in str(info.value)
    config, params, _, _ = load_checkpoint(tmp_path / "ck")
    assert config["step"] == 12 and all(np.all(np.isfinite(v)) for v in params.values())


class _InterruptingBar:
    """A stand-in progress bar that sends this process SIGINT (Ctrl-C) at its ``after``-th update."""

    def __init__(self, after, *args, **kwargs):
        self.after, self.updates = after, 0

    def update(self, n):
        self.updates += 1
        if self.updates == self.after:
            signal.raise_signal(signal.SIGINT)

    def set_postfix(self, *args, **kwargs):
        pass

    def close(self):
        pass


def test_ctrl_c_checkpoints_the_last_completed_chunk_and_resume_reproduces(tmp_path, data, spec, monkeypatch):
    X, y = data
    kw = dict(batch_size=20, seed=5, progress=False, checkpoint_every=100, chunk_size=6)
    full = fit(spec, X, y, steps=30, **kw)
    runner_module = sys.modules["gpzoo.inference.runner"]
    monkeypatch.setattr(runner_module, "tqdm", lambda *a, **k: _InterruptingBar(2, *a, **k))
    with pytest.raises(KeyboardInterrupt):
        fit(spec, X, y, steps=30, checkpoint_dir=tmp_path / "ck", **kw)
    config, _, _, history = load_checkpoint(tmp_path / "ck")
    assert config["step"] == 12 and history["objective"].shape == (12,)  # two chunks of 6 were complete
    monkeypatch.undo()
    resumed = fit(spec, X, y, steps=30, checkpoint_dir=tmp_path / "ck", resume=True, **kw)
    _same_params(full.params, resumed.params)
    np.testing.assert_array_equal(full.objective_history, resumed.objective_history)


def test_progress_bar_says_compiling_and_leaves_the_first_chunk_out_of_its_eta(data, spec, monkeypatch):
    """The bar says "compiling" until the first chunk returns, then shows the objective; its rate
    (hence its ETA) comes from the later chunks: a first chunk slowed by 1 s, as by compilation,
    does not slow the rate the bar ends with."""
    import io  # noqa: PLC0415
    import time  # noqa: PLC0415

    from tqdm import tqdm as plain_tqdm  # noqa: PLC0415

    X, y = data
    runner_module = sys.modules["gpzoo.inference.runner"]
    bars, postfixes = [], []

    class Bar(plain_tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, file=io.StringIO(), **kwargs)
            bars.append(self)

        def close(self):
            self.final = self.format_dict
            super().close()

    run_chunk = runner_module._run_chunk

    def slow_first_chunk(*args):
        postfixes.append(str(bars[-1].postfix))  # what the bar says while this chunk runs
        if len(postfixes) == 1:
            time.sleep(1.0)
        return run_chunk(*args)

    monkeypatch.setattr(runner_module, "tqdm", Bar)
    monkeypatch.setattr(runner_module, "_run_chunk", slow_first_chunk)
    fit(spec, X, y, steps=30, chunk_size=10, checkpoint_every=10, batch_size=20, progress=True)  # 3 chunks of 10
    assert postfixes[0] == "compiling" and len(postfixes) == 3
    assert all("compiling" not in text and "=" in text for text in postfixes[1:])  # the objective, e.g. elbo=-41.2
    final = bars[-1].final
    assert final["n"] == 30 and final["initial"] == 10  # timed from the end of the first chunk
    rate = final["rate"] or (final["n"] - final["initial"]) / final["elapsed"]
    assert rate > 30.0, rate  # the 30 steps took over 1 s: a rate timing the first chunk is below 30 steps/s


def test_ctrl_c_during_a_checkpoint_write_waits_for_the_write(tmp_path, monkeypatch):
    """SIGINT while the first of four files is written: all four are written, then KeyboardInterrupt."""
    import gpzoo.inference.checkpoint as ck

    write = ck.atomic_write
    calls = []

    def interrupted_write(path, fn):
        calls.append(path.name)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)
        write(path, fn)

    monkeypatch.setattr(ck, "atomic_write", interrupted_write)
    state = {"a": np.arange(3.0)}
    with pytest.raises(KeyboardInterrupt):
        ck.save_checkpoint(tmp_path, params={"p": np.ones(2)}, state=state, history={"elbo": np.zeros(4)},
                           config={"model": "m", "step": 4})
    assert calls == ["params.npz", "state.npz", "history.npz", "config.json"]
    config, params, restored, _ = ck.load_checkpoint(tmp_path, state_template=state)
    assert config["step"] == 4 and np.array_equal(restored["a"], state["a"]) and set(params) == {"p"}


def test_checkpoint_files_from_different_steps_are_refused(tmp_path):
    """A set mixed by a write cut short (e.g. a killed process) is detected, not resumed from."""
    from gpzoo.inference.checkpoint import save_checkpoint

    for step in (4, 8):
        save_checkpoint(tmp_path / str(step), params={"p": np.full(2, step)}, state={"a": np.arange(3.0) * step},
                        history={"elbo": np.zeros(step)}, config={"model": "m", "step": step})
    (tmp_path / "8" / "state.npz").write_bytes((tmp_path / "4" / "state.npz").read_bytes())
    with pytest.raises(CheckpointError, match="inconsistent"):
        load_checkpoint(tmp_path / "8")


def test_cholesky_with_jitter_factorises_once_and_differentiates_as_cholesky(precision):
    """The jitter search's factor is the result (no second factorisation at the jitter found), and value,
    gradient and a Hessian-vector product equal those of jnp.linalg.cholesky(K + jitter I)."""
    dtype, rtol = (jnp.float32, 2e-4) if precision == "float32" else (jnp.float64, 1e-10)
    rng = np.random.default_rng(0)
    A = rng.normal(size=(2, 6, 6))
    K = jnp.asarray(A @ np.swapaxes(A, -1, -2) / 6 + 0.5 * np.eye(6), dtype)  # [2, 6, 6], a batch of two
    W = jnp.asarray(rng.normal(size=(2, 6, 6)), dtype)
    V = jnp.asarray(rng.normal(size=(2, 6, 6)), dtype)

    def loss(factor):
        return lambda K: jnp.sum(W * factor(K)) + jnp.sum(jnp.log(jnp.diagonal(factor(K), axis1=-2, axis2=-1)))

    ours = loss(lambda K: cholesky_with_jitter(K, 1e-3)[0])
    plain = loss(lambda K: jnp.linalg.cholesky(K + 1e-3 * jnp.eye(6, dtype=dtype)))
    np.testing.assert_allclose(ours(K), plain(K), rtol=rtol)
    np.testing.assert_allclose(jax.grad(ours)(K), jax.grad(plain)(K), rtol=rtol, atol=rtol)
    hvp = [jax.jvp(jax.grad(f), (K,), (V,))[1] for f in (ours, plain)]
    np.testing.assert_allclose(hvp[0], hvp[1], rtol=10 * rtol, atol=10 * rtol)
    # the factorisations in the compiled gradient: the search's first one and its retry body's (run only
    # when the first fails), no third at the jitter found
    hlo = jax.jit(jax.grad(ours)).lower(K).compile().as_text()
    assert len(re.findall(r'custom_call_target="[^"]*potrf', hlo)) == 2
