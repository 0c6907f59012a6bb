"""Comparison fits on the Ray backend give the same results, report and saved models as the sequential
one; the run's compilation cache changes no result; the dispatcher keeps a model's fits from compiling twice."""

from __future__ import annotations

import json
import os
import signal

import jax
import numpy as np
import pandas as pd
import pytest

import gpzoo
from gpzoo.analysis import datasets
from gpzoo.analysis.backends import COMPILE_CACHE, Dispatcher, FitOptions, FitTask, FitTaskError, run_fits
from gpzoo.analysis.cli import main
from gpzoo.inference.tasks import compile_cache
from gpzoo.models.errors import InvalidArgumentError
from conftest import TINY_CLI
from conftest import restore_signals as _restore
from conftest import signal_state as _signals

# the backends' own compilation cache is under test here: the suite's is off (conftest)
pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning", "ignore::FutureWarning"),
              pytest.mark.usefixtures("without_suite_compilation_cache")]

RAY_REASON = 'Ray is an optional extra: pip install "gpzoo[ray]"'
TINY = {"steps": 6, "batch_size": 20, "num_train": 40, "num_test": 30, "num_inducing": 5, "num_draws": 30}


@pytest.fixture(scope="module")
def _ray_module():
    ray = pytest.importorskip("ray", reason=RAY_REASON)
    yield ray
    if ray.is_initialized():
        state = _signals()
        ray.shutdown()
        _restore(state)


def _shared_ray(ray):
    if not ray.is_initialized():
        state = _signals()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        _restore(state)
    return ray


@pytest.fixture
def local_ray(_ray_module):
    """One local 2-CPU Ray instance shared by this module's Ray tests (the backend leaves a running
    instance running); this process's signal handlers and mask are restored after its start."""
    return _shared_ray(_ray_module)


def _svgp_tasks(tmp_path, seeds, *, input_dim=2):
    from gpzoo.models import zoo  # noqa: PLC0415

    spec = zoo.get("svgp-rbf", input_dim=input_dim, ard=True, task="binary", num_classes=2, num_inducing=4)
    return [FitTask(f"svgp seed {s}", spec, s, tmp_path / f"svgp_{s}", tmp_path / "ck" / f"svgp_{s}") for s in seeds]


def _xy(n=30):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 2)), rng.integers(0, 2, n).astype(float)


def _compare(out, *extra):
    argv = ["compare", "--data", "two-moons", "--models", "svgp-rbf", "--seeds", "0,1", "--out", str(out),
            *TINY_CLI, *extra]
    return main(argv)


def test_unknown_backend_and_misplaced_options_are_refused(tmp_path):
    with pytest.raises(InvalidArgumentError, match="backend"):
        run_fits([], None, None, FitOptions(steps=1, batch_size=None, learning_rate=0.1), backend="dask")
    with pytest.raises(InvalidArgumentError, match="address"):
        run_fits([], None, None, FitOptions(steps=1, batch_size=None, learning_rate=0.1), address="x")


class _Spec:
    """A stand-in spec: equal when the names are."""

    def __init__(self, name):
        self.name = name

    def __eq__(self, other):
        return isinstance(other, _Spec) and other.name == self.name

    __hash__ = None  # like a ModelSpec with a dict field: unhashable


def _task(model, seed):
    return FitTask(f"{model} seed {seed}", _Spec(model), seed, None, None)


def test_dispatcher_compiles_each_model_once_and_never_idles():
    a0, a1, a2, b0, b1 = _task("a", 0), _task("a", 1), _task("a", 2), _task("b", 0), _task("b", 1)
    queue = Dispatcher([a0, a1, a2, b0, b1])
    first, second = queue.next(), queue.next()
    assert (first, second) == (a0, b0)  # two workers start two different models, not model a twice
    queue.finished(a0)
    assert queue.next() == a1  # model a's programs are compiled: its fits go first
    assert queue.next() == a2
    assert queue.next() == b1  # only b is left, its first fit still running: taken anyway, no worker idles
    assert queue.next() is None and len(queue) == 0


def test_dispatcher_puts_a_retried_task_first_and_groups_equal_specs():
    a0, a1, b0 = _task("a", 0), _task("a", 1), _task("b", 0)
    queue = Dispatcher([a0, a1, b0])
    assert queue.next() == a0
    queue.retry(a0)  # a0 failed before a fit of model a finished
    assert queue.next() == b0  # rule 2 (a model nobody started) comes before rule 3
    assert queue.next() == a0 and queue.next() == a1 and queue.next() is None
    # equal specs that are different objects are one model
    c0, c1 = _task("c", 0), _task("c", 1)
    assert c0.spec is not c1.spec
    queue = Dispatcher([c0, c1, _task("d", 0)])
    assert queue.next() == c0 and queue.next().name == "d seed 0"


def test_a_second_seed_compiles_nothing_and_equals_a_fit_compiled_afresh(tmp_path):
    """The second seed's fit runs the first's programs (it compiles nothing) and equals, bit for bit,
    the same fit compiled afresh; the run's cache folder is gone and JAX's cache settings are as they
    were afterwards. In float32, the library's default (the Ray tests below run the cache in float64)."""
    dtype = "float32"
    from gpzoo.inference.fit import fit  # noqa: PLC0415
    from gpzoo.inference.io import load  # noqa: PLC0415
    from gpzoo.inference.programs import CompileCounter  # noqa: PLC0415

    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", dtype == "float64")
    try:
        X, y = _xy()
        tasks = _svgp_tasks(tmp_path, [0, 1])
        done = {}
        with CompileCounter() as counter:
            run_fits(tasks, X, y, FitOptions(steps=4, batch_size=10, learning_rate=0.05),
                     on_done=lambda task: done.update({task.name: counter.count}))
        assert done["svgp seed 0"] > 0 and done["svgp seed 1"] == done["svgp seed 0"]  # seed 1 compiled nothing
        assert not (tmp_path / "ck" / COMPILE_CACHE).exists()  # every task finished: the cache is gone
        assert jax.config.jax_compilation_cache_dir is None
        cached = load(tasks[1].saved)
        jax.clear_caches()  # compiled afresh (no persistent cache is configured here)
        fresh = fit(tasks[1].spec, X, y, steps=4, batch_size=10, seed=1, learning_rate=0.05, progress=False)
        assert str(cached.params["q_mu"].dtype) == dtype
        for name, value in fresh.params.items():
            np.testing.assert_array_equal(value, cached.params[name], err_msg=name)
        np.testing.assert_array_equal(fresh.objective_history, cached.objective_history)
    finally:
        jax.config.update("jax_enable_x64", previous)


def test_a_fit_task_replaces_what_an_interrupted_save_left(tmp_path):
    """A task owns its saved-model folder: a partial model there (a crash mid-save, then --resume)
    is replaced, where gpzoo.save alone refuses a non-empty folder."""
    from gpzoo.inference.io import load  # noqa: PLC0415
    from gpzoo.inference.tasks import fit_task  # noqa: PLC0415

    (task,) = _svgp_tasks(tmp_path, [3])
    task.saved.mkdir(parents=True)
    (task.saved / "arrays.npz").write_bytes(b"partial")
    X, y = _xy()
    assert fit_task(task, X, y, FitOptions(steps=2, batch_size=10, learning_rate=0.05)) == str(task.saved)
    assert load(task.saved).seed == 3


def test_compile_cache_leaves_a_callers_own_cache_alone(tmp_path):
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
    try:
        with compile_cache(tmp_path / "run"):
            assert jax.config.jax_compilation_cache_dir == str(tmp_path / "mine")
        assert not (tmp_path / "run").exists()
    finally:
        jax.config.update("jax_compilation_cache_dir", None)
    with compile_cache(tmp_path / "run", shared=True):
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "run")
        assert jax.config.jax_compilation_cache_max_size > 0  # shared: JAX locks the folder
    assert jax.config.jax_compilation_cache_dir is None and jax.config.jax_compilation_cache_max_size == -1


def test_ray_leaves_the_interrupt_handlers_as_it_found_them(_ray_module):
    """After a Ray run that started its own instance, Ctrl-C still raises KeyboardInterrupt in this
    process (fit's checkpointing relies on it)."""
    ray = _ray_module
    if ray.is_initialized():  # the shared instance: shut it down, the next test starts it again
        state = _signals()
        ray.shutdown()
        _restore(state)
    before, mask = _signals()
    run_fits([], None, None, FitOptions(steps=1, batch_size=None, learning_rate=0.1), backend="ray")
    assert not ray.is_initialized()
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask  # SIGINT is not left blocked either
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)


def test_ray_backend_matches_sequential_bit_for_bit(tmp_path, local_ray):
    assert _compare(tmp_path / "seq") == 0
    assert _compare(tmp_path / "ray", "--backend", "ray", "--cpus-per-fit", "1") == 0
    assert local_ray.is_initialized()  # a running instance is used and left running
    seq = pd.read_csv(tmp_path / "seq" / "comparison.csv", index_col="model")
    ray_ = pd.read_csv(tmp_path / "ray" / "comparison.csv", index_col="model")
    timing = ["fit_seconds"]
    pd.testing.assert_frame_equal(seq.drop(columns=timing).sort_index(), ray_.drop(columns=timing).sort_index())
    for run in seq.index:
        stem = run.replace(" ", "_")
        a = np.load(tmp_path / "seq" / "models" / stem / "arrays.npz")
        b = np.load(tmp_path / "ray" / "models" / stem / "arrays.npz")
        assert sorted(a.files) == sorted(b.files)
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key], err_msg=f"{run}: {key}")
    assert json.loads((tmp_path / "ray" / "report.json").read_text())["groups"]
    assert not (tmp_path / "ray" / "checkpoints").exists()  # checkpoints and compilation cache removed


def test_ray_api_equals_sequential_api_bit_for_bit(tmp_path, local_ray):
    """gpzoo.compare(..., backend="ray"), one model × two seeds: the same fits (every parameter, the
    ELBO trace) and ELBO table on Ray as here."""
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


@pytest.fixture(scope="module")
def troubled_ray_run(tmp_path_factory, _ray_module):
    """One Ray run with troubles: two good svgp fits and one that fails (3 lengthscales, 2 columns)
    on the only actor (2 CPUs per fit), whose worker process is killed after the first fit.
    Returns (the tasks, the FitTaskError raised, what on_done saw: the killed pid, then task names)."""
    import psutil  # noqa: PLC0415 - a dependency of Ray

    _shared_ray(_ray_module)
    tmp_path = tmp_path_factory.mktemp("troubled")
    X, y = _xy()
    good = _svgp_tasks(tmp_path, [0, 1])
    bad = _svgp_tasks(tmp_path / "b", [0], input_dim=3)[0]
    bad = FitTask("bad", bad.spec, 0, tmp_path / "bad", tmp_path / "ck" / "bad")
    done = []

    def kill_the_actor(task):
        if not done:
            actors = [p for p in psutil.process_iter(["cmdline"]) if "FitActor" in " ".join(p.info["cmdline"] or [])]
            assert len(actors) == 1
            os.kill(actors[0].pid, signal.SIGKILL)
            actors[0].wait(timeout=30)
            done.append(actors[0].pid)
        done.append(task.name)

    with pytest.raises(FitTaskError) as failure:
        run_fits([*good, bad], X, y, FitOptions(steps=3, batch_size=10, learning_rate=0.05), backend="ray",
                 cpus_per_fit=2, on_done=kill_the_actor)
    return tmp_path, good, bad, failure.value, done


def test_a_failing_ray_task_is_named_and_the_others_are_kept(troubled_ray_run):
    tmp_path, good, bad, failure, done = troubled_ray_run
    assert str(failure).startswith("1 of 3 fit(s) failed twice on Ray")
    assert "bad: HyperparameterError" in str(failure)
    assert "svgp seed" not in str(failure).split("failed", 1)[1]
    assert done[1:] == ["svgp seed 0", "svgp seed 1"] and not bad.saved.exists()
    assert all((task.saved / "model.json").is_file() for task in good)
    assert (tmp_path / "ck" / COMPILE_CACHE).is_dir()  # the run stopped early: its cache is kept for --resume


def test_a_task_whose_actor_dies_is_retried_on_a_fresh_actor(troubled_ray_run):
    """The worker process of the only actor is killed after its first fit: the next task, sent to
    the dead actor, runs again on a fresh one, and so do the tasks after it (the same run as above)."""
    _, good, _, _, done = troubled_ray_run
    assert isinstance(done[0], int)  # the killed worker's pid: the kill came after the first fit
    assert done[1:] == ["svgp seed 0", "svgp seed 1"]
    assert all((task.saved / "model.json").is_file() for task in good)
