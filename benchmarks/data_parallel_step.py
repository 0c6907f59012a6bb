"""One conv model's training step on 1 device against the same step split across 2 devices.

Setting: zoo model ``conv`` on rectangles (28×28, 3×3 patches, M = 16 inducing patches, Bernoulli),
global minibatch B = ``--batch-size`` rows, float32, Adam, the SVI update ``fit`` runs. The two
programs are those of ``fit(..., devices=None)`` and ``fit(..., devices=2)``: the same update,
the second with the minibatch rows sharded over a 2-device mesh (parameters replicated;
``gpzoo.inference.sharding``). Each is a jit-compiled ``lax.scan`` of ``--steps`` updates; timed
interleaved call by call (medians over ``--repeats`` calls, compilation and a warm-up call
excluded), as wall-clock time per step.

* ``ratio`` = 2-device step / 1-device step (goal ≤ 0.65);
* ``max_rel_diff``: the parameters after the same updates on 1 and 2 devices (summation order only).

On a CPU the devices are forced host devices (``XLA_FLAGS=--xla_force_host_platform_device_count=2``,
set here before JAX is imported); on a GPU machine with one GPU only the 1-device step is timed
and recorded with the device name. The machine's load average at the start and end is recorded.

    /work/venv/bin/python benchmarks/data_parallel_step.py [--repeats 7] [--steps 10] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from numpyro.infer import SVI  # noqa: E402
from numpyro.optim import optax_to_numpyro  # noqa: E402

from _common import machine_info, now, write_json  # noqa: E402

OUT = Path(__file__).parent / "results" / "data_parallel_step.json"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 repeats of 2 steps, B = 20")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.steps, args.batch_size = 2, 2, 20

    import gpzoo  # noqa: PLC0415
    from gpzoo.analysis import datasets  # noqa: PLC0415
    from gpzoo.inference.elbo import FastELBO  # noqa: PLC0415
    from gpzoo.inference.sharding import DataParallel  # noqa: PLC0415
    from gpzoo.models import zoo  # noqa: PLC0415

    machine = machine_info()
    B, K = args.batch_size, args.steps
    ds = datasets.load("rectangles", seed=0, num_train=max(400, B))
    X, y = np.asarray(ds.X_train, np.float32), np.asarray(ds.y_train)
    N = X.shape[0]
    spec = zoo.get("conv", input_dim=ds.num_features, image_shape=ds.image_shape, task=ds.task,
                   num_classes=ds.num_classes, num_inducing=16)
    family = gpzoo.fit(spec, X, y, steps=0, batch_size=B, progress=False).family
    svi = SVI(family.model, family.guide, optax_to_numpyro(optax.adam(0.01)), FastELBO())
    rng = np.random.default_rng(0)
    batches = np.stack([rng.choice(N, B, replace=False) for _ in range(K)])  # [K, B]
    Xs, ys = jnp.asarray(X[batches]), jnp.asarray(y[batches], jnp.float32)  # [K, B, D], [K, B]
    state0 = jax.jit(lambda key: svi.init(key, Xs[0], ys[0], num_data=N))(jax.random.PRNGKey(0))

    def program(parallel):
        def run(state, Xs, ys):
            def body(state, batch):
                Xb, yb = batch if parallel is None else parallel.shard_rows(*batch)
                state, loss = svi.update(state, Xb, yb, num_data=N)
                return state, loss

            return jax.lax.scan(body, state, (Xs, ys))

        return jax.jit(run)

    devices = jax.devices()
    candidates = {"1 device": (None, state0)}
    if len(devices) >= 2:
        parallel = DataParallel(tuple(devices[:2]))
        candidates["2 devices"] = (parallel, parallel.replicate(state0))
    compiled = {name: program(p) for name, (p, _) in candidates.items()}
    finals = {}
    for name, (p, state) in candidates.items():  # compile and warm up
        finals[name] = jax.block_until_ready(compiled[name](state, Xs, ys))
    times = {name: [] for name in candidates}
    for _ in range(args.repeats):
        for name, (p, state) in candidates.items():
            t0 = time.perf_counter()
            jax.block_until_ready(compiled[name](state, Xs, ys))
            times[name].append((time.perf_counter() - t0) / K)
    step = {name: statistics.median(t) for name, t in times.items()}
    report = {
        "date": now(),
        "machine": machine,
        "load_average_end": list(os.getloadavg()),
        "setting": {"model": "conv", "data": "rectangles", "image_shape": list(ds.image_shape), "patch_shape": [3, 3], "M": 16,
                    "B": B, "N": N, "steps_per_call": K, "repeats": args.repeats, "dtype": str(Xs.dtype), "quick": args.quick},
        "device": str(devices[0].device_kind),
        "step_s": step,
        "repeats_s": times,
    }
    if "2 devices" in step:
        params = {name: svi.get_params(finals[name][0]) for name in candidates}
        def rel(a, b):
            a, b = np.asarray(a, float), np.asarray(b, float)
            return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(a)))))

        diff = max(rel(params["1 device"][k], params["2 devices"][k]) for k in params["1 device"])
        loss_diff = rel(finals["1 device"][1], finals["2 devices"][1])
        ratio = step["2 devices"] / step["1 device"]
        report.update({"ratio": ratio, "max_rel_diff": diff, "loss_max_rel_diff": loss_diff,
                       "goals": {"2-device step <= 0.65 x 1-device step": ratio <= 0.65, "results equal (rel. 1e-4)": diff <= 1e-4}})
    write_json(args.out, report)
    print({k: v for k, v in report.items() if k in ("step_s", "ratio", "max_rel_diff", "loss_max_rel_diff", "goals")},
          machine["load_average_start"], report["load_average_end"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
