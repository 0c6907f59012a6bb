"""Data-parallel training (fit(..., devices=...)): the minibatch split across two JAX devices gives the
single-device ELBO, gradients and fit (and DataParallel.value_and_grad, the shard_map form, the single-device
ELBO and gradients), for an SVGP and a convolutional model, in float32 and float64.

The two devices are forced host (CPU) devices: ``XLA_FLAGS=--xla_force_host_platform_device_count=2``
must be set before JAX is imported, so the checks run in one subprocess (this file run as a script).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

#: Largest relative difference accepted between the 2-device and 1-device values (summation order only).
TOLERANCE = {"float32": 1e-5, "float64": 1e-12}


def _child() -> dict:
    import jax  # noqa: PLC0415 - after XLA_FLAGS
    import optax  # noqa: PLC0415

    import gpzoo  # noqa: PLC0415
    from gpzoo.inference.elbo import FastELBO  # noqa: PLC0415
    from gpzoo.inference.sharding import DataParallel  # noqa: PLC0415
    from gpzoo.models import zoo  # noqa: PLC0415

    assert len(jax.devices()) == 2, jax.devices()
    rng = np.random.default_rng(0)
    images = (rng.uniform(size=(48, 6, 6)) < 0.3).astype(float)
    labels = (images[:, :3].sum((1, 2)) > images[:, 3:].sum((1, 2))).astype(np.int64)
    X_tab = rng.normal(size=(48, 3))
    cases = {
        "svgp-rbf": (zoo.get("svgp-rbf", input_dim=3, task="binary", num_classes=2, num_inducing=5),
                     X_tab, (X_tab[:, 0] > 0).astype(np.int64)),
        "conv": (zoo.get("conv", input_dim=36, image_shape=(6, 6), task="binary", num_classes=2, num_inducing=5),
                 images.reshape(48, 36), labels),
    }
    parallel = DataParallel(tuple(jax.devices()))
    out = {}
    for precision in ("float32", "float64"):
        jax.config.update("jax_enable_x64", precision == "float64")
        for name, (spec, X, y) in cases.items():
            # float64: the default Adam. float32: plain SGD, since Adam divides by sqrt(v): a gradient component
            # near zero changes its step by up to the learning rate under a rounding-level change of the gradient
            optimizer = None if precision == "float64" else optax.sgd(0.01)
            settings = {"steps": 6, "batch_size": 16, "seed": 1, "progress": False, "chunk_size": 6, "optimizer": optimizer}
            one = gpzoo.fit(spec, X, y, **settings)
            two = gpzoo.fit(spec, X, y, **settings, devices=2)
            family, params = one.family, {k: jax.numpy.asarray(v) for k, v in one.params.items()}
            Xb, yb = jax.numpy.asarray(one.X_train[:16]), jax.numpy.asarray(one.y_train[:16])

            def loss(params, Xb, yb, family=family):
                return FastELBO().loss(jax.random.PRNGKey(0), params, family.model, family.guide, Xb, yb, num_data=48)

            value_and_grad = jax.jit(jax.value_and_grad(loss))
            single = value_and_grad(params, Xb, yb)
            sharded_X, sharded_y = jax.device_put((Xb, yb), parallel.rows_sharding)
            compiled = value_and_grad.lower(parallel.replicate(params), sharded_X, sharded_y).compile()
            split = compiled(parallel.replicate(params), sharded_X, sharded_y)
            mapped = jax.jit(parallel.value_and_grad(loss)).lower(parallel.replicate(params), sharded_X, sharded_y).compile()
            shard_map = mapped(parallel.replicate(params), sharded_X, sharded_y)

            def rel(a, b):
                a, b = np.asarray(a, float), np.asarray(b, float)
                return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(a)))))

            out[f"{name} {precision}"] = {
                "elbo": rel(single[0], split[0]),
                "grad": max(rel(single[1][k], split[1][k]) for k in single[1]),
                "params": max(rel(one.params[k], two.params[k]) for k in one.params),
                "history": rel(one.objective_history, two.objective_history),
                "all_reduce": "all-reduce" in compiled.as_text(),
                "shard_map_elbo": rel(single[0], shard_map[0]),
                "shard_map_grad": max(rel(single[1][k], shard_map[1][k]) for k in single[1]),
                "shard_map_collectives": [op for op in ("all-gather", "all-reduce") if f" {op}(" in mapped.as_text()],
                "rows_per_device": sorted({s.data.shape[0] for s in sharded_X.addressable_shards}),
                "fit_devices": two.diagnostics.get("devices"),
                "dtype": str(np.asarray(two.params["q_mu"]).dtype),
            }
    return out


def test_two_devices_give_the_single_device_elbo_gradients_and_fit():
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sorted(results) == ["conv float32", "conv float64", "svgp-rbf float32", "svgp-rbf float64"]
    for case, r in results.items():
        tol = TOLERANCE[case.split()[1]]
        assert r["all_reduce"], f"{case}: the data term was not split across the devices"
        assert r["rows_per_device"] == [8], case
        assert len(r["fit_devices"]) == 2, case
        assert r["dtype"] == case.split()[1], case
        assert r["shard_map_collectives"] == ["all-reduce"], f"{case}: {r['shard_map_collectives']}"
        for key in ("elbo", "grad", "params", "history", "shard_map_elbo", "shard_map_grad"):
            assert r[key] <= tol, f"{case}: {key} differs by {r[key]:.3g} (> {tol})"


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


if __name__ == "__main__":
    print(json.dumps(_child()))


@pytest.mark.benchmark
def test_scale_out_benchmarks_run(tmp_path):
    """benchmarks/data_parallel_step.py and benchmarks/ray_speedup.py in their quick form write their JSON."""
    root = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks")
    for script, keys in (("data_parallel_step", {"step_s", "ratio", "max_rel_diff", "goals"}),
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
        assert report.get("identical", True) and report.get("max_rel_diff", 0.0) <= 1e-4
