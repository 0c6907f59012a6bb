"""Programs compiled once per model structure (gpzoo.inference.programs).

A model family's definition is compared by value: two builds of one zoo model are equal, a
change of structure is not, and initial values are array arguments, never part of it. The
method table refuses a family class that lacks the interface, by name. Rows that vary by call run
in a few padded block sizes (predict on 999 and then on 1,001 rows compiles nothing new, and the
padding changes no result). The command line's persistent cache carries compiled programs to the
next run.
"""

import dataclasses
import importlib

import jax
import numpy as np
import pytest

import gpzoo
from gpzoo.inference import predict
from gpzoo.inference.family import FAMILY_MEMBERS
from gpzoo.inference.programs import (BLOCK_SIZES, CompileCounter, cache_dir, definition_of, enable_persistent_cache,
                                      pad_rows, row_blocks)
from gpzoo.inference.svgp import SVGP
from gpzoo.models import kernels, zoo
from gpzoo.models.errors import InvalidArgumentError

fit_module = importlib.import_module("gpzoo.inference.fit")


def _regression(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3, 3, (n, 1))
    return X, np.sin(X[:, 0]) + 0.1 * rng.normal(size=n)


def _family(spec, X, y, seed=0):
    return gpzoo.fit(spec, X, y, steps=0, seed=seed, progress=False).family


def test_definitions_compare_by_structure_not_by_initial_values(precision):
    X, y = _regression(30)
    spec = zoo.get("svgp-rbf", input_dim=1, task="regression", num_inducing=5)
    first, first_leaves = definition_of(_family(spec, X, y))
    again, again_leaves = definition_of(_family(zoo.get("svgp-rbf", input_dim=1, task="regression", num_inducing=5), X, y, 1))
    assert first == again and hash(first) == hash(again)
    # another initial lengthscale and other inducing inputs: the same definition, other leaves
    other_init = spec.replace(kernel=kernels.SquaredExponential(lengthscale=2.5))
    init_def, init_leaves = definition_of(_family(other_init, X, y, 2))
    assert init_def == first
    assert any(not np.array_equal(a, b) for a, b in zip(init_leaves, first_leaves))
    # structure differs: the number of inducing points, the kernel's class, a fixed hyperparameter, whitening
    for changed in (spec.replace(num_inducing=6), spec.replace(kernel=kernels.Matern52()),
                    spec.replace(kernel=kernels.SquaredExponential(variance=kernels.Fixed(1.0))), spec.replace(whiten=False)):
        assert definition_of(_family(changed, X, y))[0] != first, changed


def test_a_fixed_value_is_an_argument_of_the_program(precision):
    """Two fixed variances share one program and give the fits each value implies (no value compiled in)."""
    X, y = _regression(40)
    base = zoo.get("svgp-rbf", input_dim=1, task="regression", num_inducing=5)
    fits = {}
    for value in (0.5, 3.0):
        spec = base.replace(kernel=kernels.SquaredExponential(variance=kernels.Fixed(value)))
        with CompileCounter() as counter:
            fits[value] = predict(gpzoo.fit(spec, X, y, steps=5, progress=False), X[:3])
    assert counter.count == 0  # the second fixed value compiled nothing
    # the prior variance far from the data: predictive variance at an input far away equals it
    for value in (0.5, 3.0):
        spec = base.replace(kernel=kernels.SquaredExponential(variance=kernels.Fixed(value)))
        far = predict(gpzoo.fit(spec, X, y, steps=5, progress=False), np.array([[40.0]]))
        np.testing.assert_allclose(far.f_var[0, 0], value, rtol=1e-3)


def test_the_method_table_refuses_a_family_without_the_interface_by_name():
    class Incomplete:
        def model(self, X, y=None, num_data=None, data_indices=None):
            pass

    with pytest.raises(InvalidArgumentError) as info:
        fit_module.register_method("incomplete", Incomplete)
    assert info.value.argument == "family"
    assert "Incomplete" in str(info.value) and "guide" in str(info.value) and "incomplete" in str(info.value)
    assert "incomplete" not in fit_module.METHODS
    assert all(hasattr(SVGP, name) for name in FAMILY_MEMBERS)
    with pytest.raises(InvalidArgumentError) as info:
        fit_module.register_method("not-a-class", "SVGP")
    assert info.value.argument == "family" and "not-a-class" in str(info.value)


@pytest.mark.parametrize("num_rows", [1, 63, 64, 65, 511, 512, 513, 999, 1001, 3000])
def test_row_blocks_cover_the_rows_in_few_padded_sizes(num_rows):
    blocks = list(row_blocks(num_rows, 512))
    covered = np.concatenate([np.arange(sl.start, sl.stop) for sl, _ in blocks])
    np.testing.assert_array_equal(covered, np.arange(num_rows))
    for sl, size in blocks:
        assert sl.stop - sl.start <= size <= 512
        assert size == 512 or size in BLOCK_SIZES
    padded = pad_rows(np.arange(5.0)[:, None], 8)
    np.testing.assert_array_equal(padded[:, 0], [0, 1, 2, 3, 4, 4, 4, 4])


def test_predict_on_another_number_of_rows_compiles_nothing_and_padding_changes_nothing(precision):
    X, y = _regression(60)
    res = gpzoo.fit(zoo.get("svgp-rbf", input_dim=1, task="regression", num_inducing=5), X, y, steps=5, progress=False)
    X_new = np.linspace(-4, 4, 1001)[:, None]
    first = predict(res, X_new[:999])
    gpzoo.evaluate_elbo(res, X[:30], y[:30])
    with CompileCounter() as counter:
        second = predict(res, X_new)
        elbo = gpzoo.evaluate_elbo(res, X[:37], y[:37])  # 30 and 37 rows: both in a 64-row block
    assert counter.count == 0
    np.testing.assert_array_equal(first.f_mean, second.f_mean[:999])
    # a point predicted alone, in a block of its own, equals its row in the padded blocks
    one = predict(res, X_new[500:501])
    np.testing.assert_allclose(one.f_mean[0], second.f_mean[500], rtol=1e-5)
    # the ELBO on 37 rows (padded to 64) sums exactly those rows: the same as in one block of 37
    direct = gpzoo.evaluate_elbo(res, X[:37], y[:37], batch_size=37)
    np.testing.assert_allclose(elbo.elbo, direct.elbo, rtol=1e-5)
    # and is not the ELBO of 38 rows
    assert abs(gpzoo.evaluate_elbo(res, X[:38], y[:38]).elbo - elbo.elbo) > 1e-3


def test_persistent_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GPZOO_COMPILATION_CACHE", "off")
    assert cache_dir() is None and enable_persistent_cache() is None
    monkeypatch.setenv("GPZOO_COMPILATION_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("GPZOO_COMPILATION_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "gpzoo" / "jax"


def test_a_second_comparison_reads_its_programs_from_the_persistent_cache(without_suite_compilation_cache, monkeypatch,
                                                                          tmp_path):
    """gpzoo.compare turns on the user's cache; run again in a process whose programs are gone (the
    in-memory cache cleared), it compiles almost nothing: its big programs are read back."""
    monkeypatch.setenv("GPZOO_COMPILATION_CACHE", str(tmp_path / "cache"))
    settings = dict(data="rectangles", models="conv", steps=5, num_train=40, num_test=30, num_inducing=6,
                    num_draws=40, batch_size=20)
    runs = []
    for run in range(2):
        jax.clear_caches()
        with CompileCounter() as counter:
            gpzoo.compare(**settings, out=tmp_path / f"run{run}")
        runs.append(counter)
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cache")
    assert any((tmp_path / "cache").iterdir())
    first, second = runs
    assert first.count > 0 and second.cache_hits > 0
    compiled_first = first.seconds
    compiled_second = second.seconds  # includes reading cached executables back
    assert compiled_second < 0.35 * compiled_first, (compiled_first, compiled_second, second.cache_hits, second.count)


def test_quick_and_optimised_builds_trace_one_program_with_the_same_values(precision):
    """A report program's quick build (backend optimisation off) and optimised build compute the same
    values on a convolutional model, and each is shared by a second fit of the model."""
    from gpzoo.inference.posterior import conditional_given_u, sample_inducing  # noqa: PLC0415
    from test_contract import _bars, _spec  # noqa: PLC0415

    X, y = _bars(30, 0)
    res = gpzoo.fit(_spec("conv"), X, y, steps=3, batch_size=10, progress=False)
    draws = sample_inducing(res, 4, jax.random.PRNGKey(0))
    program = importlib.import_module("gpzoo.inference.posterior")._moments_chunk
    args = (res.family, res.params, {}, jax.numpy.asarray(draws.u), jax.numpy.asarray(X[:8]))
    quick, optimised = program.quick(*args), program.optimised(*args)
    rtol = 1e-4 if precision == "float32" else 1e-10
    for a, b in zip(quick, optimised):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=rtol)
    np.testing.assert_allclose(conditional_given_u(res, X[:8], draws)[0], np.asarray(optimised[0]), rtol=rtol, atol=rtol)
    again = gpzoo.fit(_spec("conv"), *_bars(30, 5), steps=4, batch_size=10, seed=2, progress=False)
    with CompileCounter() as counter:
        program.quick(again.family, again.params, {}, jax.numpy.asarray(draws.u), jax.numpy.asarray(X[:8]))
        program.optimised(again.family, again.params, {}, jax.numpy.asarray(draws.u), jax.numpy.asarray(X[:8]))
    assert counter.count == 0


_FRESH_FIT = """
import sys, numpy as np
sys.path.insert(0, {tests!r})
from test_contract import SECOND_FIT, _bars, _spec  # its conftest import turns x64 on: the library default is off
import jax
jax.config.update("jax_enable_x64", False)
from gpzoo.inference import fit
X, y = _bars(40, 7)
res = fit(_spec({name!r}), X, y, **SECOND_FIT)
np.savez({out!r}, objective=res.objective_history, **{{k.replace(".", "__"): v for k, v in res.params.items()}})
"""


@pytest.mark.parametrize("name", ["svgp-rbf", "weighted-conv"])
def test_a_fit_on_warm_programs_equals_a_fit_in_a_fresh_process(name, float32, tmp_path):
    """The same fit run on programs compiled for another fit of the model (other data, seed, learning
    rate, steps) and in a fresh process (nothing cached, persistent cache off) agree bit for bit."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from test_contract import SECOND_FIT, STEPS, _bars, _spec  # noqa: PLC0415

    X, y = _bars(40, 0)
    gpzoo.fit(_spec(name), X, y, steps=STEPS, batch_size=20, seed=3, learning_rate=0.05, progress=False)
    with CompileCounter() as counter:
        warm = gpzoo.fit(_spec(name), *_bars(40, 7), **SECOND_FIT)
    assert counter.count == 0
    out = tmp_path / "fresh.npz"
    code = _FRESH_FIT.format(tests=str(Path(__file__).parent), name=name, out=str(out))
    env = {**__import__("os").environ, "GPZOO_COMPILATION_CACHE": "off", "JAX_ENABLE_X64": "0"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=600)
    fresh = np.load(out)
    np.testing.assert_array_equal(fresh["objective"], warm.objective_history)
    for key, value in warm.params.items():
        np.testing.assert_array_equal(fresh[key.replace(".", "__")], value, err_msg=key)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_unique_rows_equals_numpys_unique_along_rows(dtype):
    from gpzoo.inference.inducing import _unique_rows  # noqa: PLC0415

    rng = np.random.default_rng(0)
    rows = (rng.random((5000, 9)) < 0.3) * rng.integers(0, 3, (5000, 9)) / 2.0
    rows[:7] = -0.0  # equal to 0.0 as numbers, not as bytes
    rows = rows.astype(dtype)
    np.testing.assert_array_equal(_unique_rows(rows), np.unique(rows, axis=0))
    assert _unique_rows(rows).shape[0] < 5000
