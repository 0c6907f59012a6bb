"""Data-parallel training (fit(..., devices=...)) on two JAX devices against one device.

* float64: a 20-step fit with the default Adam gives the single-device parameters and ELBO history
  to 1e-9 (relative), for an SVGP and a convolutional model (the shard_map step) and for a softmax
  SVGP, whose Monte Carlo data term draws per data point (the sharding-constraint step);
* float32 (the library default) and float64: the ELBO and its gradient from the shard_map loss
  (``DataParallel.value_and_grad``) equal the single-device values (1e-5 / 1e-12), and so does a
  6-step float32 fit with plain SGD (Adam divides by sqrt(v): a gradient component near zero changes its
  step by up to the learning rate under a rounding-level change of the gradient, so float32 Adam
  fits are compared in float64 only);
* the compiled update that ``fit`` runs (float32) has exactly one all-reduce and no all-gather (nor any
  other collective): the rows are never gathered onto one device.

The two devices are forced host (CPU) devices: ``XLA_FLAGS=--xla_force_host_platform_device_count=2``
must be set before JAX is imported, so the checks run in one subprocess (this file run as a script)
whose results the tests read.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

#: Largest relative difference accepted between the 2-device and 1-device ELBO and gradient (summation order only).
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}
#: Largest relative difference accepted between the parameters of a 20-step float64 Adam fit on 2 devices and on 1.
FIT_TOLERANCE_FLOAT64 = 1e-9
#: Collective operations of XLA's HLO (an async pair ``-start``/``-done`` counts once, by its start).
COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")


def count_collectives(hlo: str) -> dict:
    """How many instructions of each collective op a compiled program's HLO text holds."""
    return {op: len(re.findall(rf"\s{op}(?:-start)?\(", hlo)) for op in COLLECTIVES}


def _rel(a, b) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(a)))))


def _child() -> dict:
    import jax  # noqa: PLC0415 - after XLA_FLAGS
    import optax  # noqa: PLC0415

    import gpzoo  # noqa: PLC0415
    from gpzoo.inference import runner  # noqa: PLC0415
    from gpzoo.inference.elbo import FastELBO  # noqa: PLC0415
    from gpzoo.inference.sharding import DataParallel  # noqa: PLC0415
    from gpzoo.models import zoo  # noqa: PLC0415
    from gpzoo.models.likelihoods import Softmax  # noqa: PLC0415

    assert len(jax.devices()) == 2, jax.devices()
    captured = {}
    run_chunks = runner.run_chunks

    def capture(program, state, **kwargs):  # the step fit runs, kept for its compiled HLO
        captured["program"], captured["state"] = program, state
        return run_chunks(program, state, **kwargs)

    runner.run_chunks = capture
    rng = np.random.default_rng(0)
    images = (rng.uniform(size=(48, 6, 6)) < 0.3).astype(float)
    labels = (images[:, :3].sum((1, 2)) > images[:, 3:].sum((1, 2))).astype(np.int64)
    X_tab = rng.normal(size=(48, 3))
    cases = {
        "svgp-rbf": (zoo.get("svgp-rbf", input_dim=3, task="binary", num_classes=2, num_inducing=5),
                     X_tab, (X_tab[:, 0] > 0).astype(np.int64)),
        "conv": (zoo.get("conv", input_dim=36, image_shape=(6, 6), task="binary", num_classes=2, num_inducing=5),
                 images.reshape(48, 36), labels),
        "softmax": (zoo.get("svgp-rbf", input_dim=3, task="multiclass", num_classes=3, num_inducing=5,
                            likelihood=Softmax(num_classes=3, num_mc_samples=8)), X_tab, np.argmax(X_tab, axis=1)),
    }
    parallel = DataParallel(tuple(jax.devices()))
    out = {}
    for precision in ("float64", "float32"):
        jax.config.update("jax_enable_x64", precision == "float64")
        for name, (spec, X, y) in cases.items():
            if precision == "float32" and name == "softmax":
                continue
            if precision == "float64":
                settings = {"steps": 20, "batch_size": 16, "seed": 1, "progress": False, "chunk_size": 20}
            else:
                settings = {"steps": 6, "batch_size": 16, "seed": 1, "progress": False, "chunk_size": 6,
                            "optimizer": optax.sgd(0.01)}
            one = gpzoo.fit(spec, X, y, **settings)
            two = gpzoo.fit(spec, X, y, **settings, devices=2)
            r = {"params": max(_rel(one.params[k], two.params[k]) for k in one.params),
                 "history": _rel(one.objective_history, two.objective_history),
                 "step": two.diagnostics["data_parallel_step"], "fit_devices": two.diagnostics["devices"],
                 "dtype": str(np.asarray(two.params["q_mu"]).dtype)}
            if precision == "float32":  # the collectives do not depend on the precision
                program, state = captured["program"], captured["state"]
                update = jax.jit(program.step.update).lower(state, program.step_inputs(0), program.constants).compile()
                r["collectives"] = count_collectives(update.as_text())
            if name != "softmax":
                family, params = one.family, {k: jax.numpy.asarray(v) for k, v in one.params.items()}
                Xb, yb = jax.numpy.asarray(one.X_train[:16]), jax.numpy.asarray(one.y_train[:16])

                def loss(params, Xb, yb, family=family):
                    return FastELBO().loss(jax.random.PRNGKey(0), params, family.model, family.guide, Xb, yb, num_data=48)

                single = jax.jit(jax.value_and_grad(loss))(params, Xb, yb)
                split = jax.jit(parallel.value_and_grad(loss))(parallel.replicate(params), Xb, yb)
                r["elbo"] = _rel(single[0], split[0])
                r["grad"] = max(_rel(single[1][k], split[1][k]) for k in single[1])
            out[f"{name} {precision}"] = r
    return out


@pytest.fixture(scope="module")
def two_devices() -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(results) == ["conv float32", "conv float64", "softmax float64", "svgp-rbf float32", "svgp-rbf float64"]
    for case, r in results.items():
        assert len(r["fit_devices"]) == 2 and r["dtype"] == case.split()[1], (case, r)
    return results


def test_a_two_device_fit_gives_the_single_device_parameters(two_devices):
    for case, r in two_devices.items():
        tol = FIT_TOLERANCE_FLOAT64 if case.endswith("float64") else TOLERANCE["float32"]
        assert r["step"] == ("sharding constraint" if case.startswith("softmax") else "shard_map"), (case, r["step"])
        for key in ("params", "history"):
            assert r[key] <= tol, f"{case}: {key} differs by {r[key]:.3g} (> {tol})"


def test_the_split_elbo_and_gradients_equal_the_single_device_values(two_devices):
    for case, r in two_devices.items():
        if case.startswith("softmax"):
            continue
        tol = TOLERANCE[case.split()[1]]
        for key in ("elbo", "grad"):
            assert r[key] <= tol, f"{case}: {key} differs by {r[key]:.3g} (> {tol})"


def test_the_data_parallel_step_has_one_all_reduce_and_no_all_gather(two_devices):
    for case, r in two_devices.items():
        if not case.endswith("float32"):
            continue
        expected = {op: int(op == "all-reduce") for op in COLLECTIVES}
        assert r["collectives"] == expected, f"{case}: {r['collectives']}"


def test_collectives_are_counted_in_hlo_text():
    hlo = ("  %all-reduce.1 = (f32[], f32[5]) all-reduce(f32[] %a, f32[5] %b), replica_groups={{0,1}}\n"
           "  %ag = f32[16,36]{1,0} all-gather(f32[8,36]{1,0} %x), dimensions={0}\n"
           "  %ags = (f32[8], f32[16]) all-gather-start(f32[8] %y), dimensions={0}\n"
           "  %agd = f32[16] all-gather-done((f32[8], f32[16]) %ags)\n")
    assert count_collectives(hlo) == {"all-reduce": 1, "all-gather": 2, "all-to-all": 0, "collective-permute": 0,
                                      "reduce-scatter": 0}


def test_devices_argument_is_checked_before_tracing():
    from gpzoo import fit  # noqa: PLC0415
    from gpzoo.models import zoo  # noqa: PLC0415
    from gpzoo.models.errors import InvalidArgumentError  # noqa: PLC0415

    X, y = np.random.default_rng(0).normal(size=(20, 2)), np.arange(20) % 2
    spec = zoo.get("svgp-rbf", input_dim=2, task="binary", num_classes=2, num_inducing=4)
    for devices in (0, 99, "cpu", [], [object()]):
        with pytest.raises(InvalidArgumentError) as error:
            fit(spec, X, y, steps=1, devices=devices, progress=False)
        assert error.value.argument == "devices"
    pg = zoo.get("svgp-logistic-pg", input_dim=2, task="binary", num_classes=2, num_inducing=4)
    with pytest.raises(InvalidArgumentError, match="does not split minibatches") as error:
        fit(pg, X, y, steps=1, devices=1, progress=False)
    assert error.value.argument == "devices"


def test_a_model_with_mutable_state_is_refused_by_name_before_tracing():
    import jax  # noqa: PLC0415
    from numpyro.infer.svi import SVIState  # noqa: PLC0415

    from gpzoo.inference.sharding import DataParallel  # noqa: PLC0415
    from gpzoo.models.errors import InvalidArgumentError  # noqa: PLC0415

    parallel = DataParallel(tuple(jax.devices()[:1]))
    key = jax.random.PRNGKey(0)
    parallel.check_no_mutable_state(SVIState(None, None, key))  # nothing mutable: accepted
    parallel.check_no_mutable_state(SVIState(None, {}, key))
    with pytest.raises(InvalidArgumentError, match="mutable state") as error:
        parallel.check_no_mutable_state(SVIState(None, {"running_mean": np.zeros(3)}, key))
    assert error.value.argument == "devices"


def test_families_with_per_point_draws_keep_the_sharding_constraint_step():
    from gpzoo.inference.fit import build_family  # noqa: PLC0415
    from gpzoo.inference.inducing import inducing_for  # noqa: PLC0415
    from gpzoo.inference.sharding import per_point_draws  # noqa: PLC0415
    from gpzoo.models import zoo  # noqa: PLC0415
    from gpzoo.models.likelihoods import Softmax  # noqa: PLC0415
    import jax  # noqa: PLC0415

    images = np.random.default_rng(0).uniform(size=(12, 36))
    common = {"input_dim": 36, "image_shape": (6, 6), "num_inducing": 4}
    expected = {("svgp-rbf", "binary"): False, ("svgp-rbf", "softmax"): True, ("conv", "binary"): False,
                ("invariant-rot", "binary"): False, ("deep-conv", "binary"): True}
    for (name, task), draws in expected.items():
        options = ({"task": "binary", "num_classes": 2} if task == "binary" else
                   {"task": "multiclass", "num_classes": 3, "likelihood": Softmax(num_classes=3)})
        spec = zoo.get(name, **common, **options)
        inducing = inducing_for(spec, images, jax.random.PRNGKey(0), None)
        assert per_point_draws(build_family(spec, inducing, 2 if task == "binary" else 3)) is draws, (name, task)


if __name__ == "__main__":
    print(json.dumps(_child()))


@pytest.mark.benchmark
def test_scale_out_benchmarks_run(tmp_path):
    """benchmarks/data_parallel_step.py and benchmarks/ray_speedup.py in their quick form write their JSON."""
    root = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")
    for script, keys in (("data_parallel_step", {"step_s", "ratio", "elbo_grad_max_rel_diff", "elbo_grad_max_rel_diff_float64", "goals"}),
                         ("ray_speedup", {"speedup", "overhead_per_task_s", "identical", "goals"})):
        if script == "ray_speedup":
            pytest.importorskip("ray", reason='Ray is an optional extra: pip install "gpzoo[ray]"')
        out = tmp_path / f"{script}.json"
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        proc = subprocess.run([sys.executable, f"{script}.py", "--quick", "--out", str(out)], cwd=root, env=env,
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = json.loads(out.read_text())
        assert keys <= set(report) and report["machine"]["load_average_start"] is not None
        assert report.get("identical", True)
        if script == "data_parallel_step":
            assert report["collectives"]["2 devices"]["all-reduce"]["count"] == 1, report["collectives"]
            assert report["collectives"]["2 devices"]["all-gather"]["count"] == 0, report["collectives"]
            assert report["elbo_grad_max_rel_diff"] <= TOLERANCE["float32"]
            assert report["elbo_grad_max_rel_diff_float64"] <= TOLERANCE["float64"]
