"""Convolution gradients inside ``gpzoo.fit``'s compiled scan: XLA's autodiff form against :func:`conv2d`.

``gpzoo.fit`` runs its steps in a jit-compiled ``lax.scan``. XLA:CPU rewrites autodiff's
convolution gradients into the form its convolution libraries take only in a program's entry
computation; in a scan body it emits them as loop nests. :func:`gpzoo.models.kernels.conv2d.conv2d`
writes its gradients in that form itself. Two measurements, each a ratio within this run:

* ``gradient_step``: one gradient step of the conv DKM's mix-up convolutions at the shapes of
  ``benchmarks/dkm_step.py``'s conv configuration (K_ti ``[64, 16, 16, 64]``, filters
  ``[3, 3, 64, 64]``, stride 1 and 2), jitted alone (the entry computation) and inside a scan of
  ``--scan-length`` steps, with ``lax.conv_general_dilated`` and with ``conv2d``; the median over
  ``--repeats`` of the time per step.
* ``fit``: seconds per step of ``gpzoo.fit`` on the ``conv-dkm`` zoo model (MNIST-10 mean-pooled
  to 14×14, widths 64/128, batch 64, float32), with ``conv2d`` and with the autodiff form put back
  in its place for the run; per step = (time of a long fit − time of a short fit) / extra steps, so
  compiling and set-up cancel (the short fit runs twice first: the second is timed).

Writes ``benchmarks/results/scan_convolutions.json``.

    .venv/bin/python benchmarks/scan_convolutions.py [--repeats 5] [--quick]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

jax.config.update("jax_enable_x64", False)

from _common import machine_info, mean_pooled, now, write_json  # noqa: E402

from gpzoo.analysis import datasets  # noqa: E402
from gpzoo.inference import fit  # noqa: E402
from gpzoo.models import zoo  # noqa: E402
from gpzoo.models.kernels import gram  # noqa: E402
from gpzoo.models.kernels.conv2d import conv2d  # noqa: E402
from gpzoo.models.likelihoods import Softmax  # noqa: E402

OUT = Path(__file__).parent / "results" / "scan_convolutions.json"
PADS = ((1, 1), (1, 1))


def autodiff_conv2d(x, w, stride: int = 1, pads=((0, 0), (0, 0)), precision=None):
    """``conv2d``'s value, with autodiff's gradients (what XLA must canonicalise itself)."""
    return lax.conv_general_dilated(x, w, (stride, stride), pads, dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                    precision=precision)


def gradient_step(conv, stride: int):
    """One SGD step on (K_ti, filters) of sum(sin(conv)): forward, input and filter gradients."""
    def step(carry, _):
        x, w = carry
        gx, gw = jax.grad(lambda a, b: jnp.sum(jnp.sin(conv(a, b, stride, PADS))), argnums=(0, 1))(x, w)
        return (x - 1e-3 * gx, w - 1e-3 * gw), None
    return step


def seconds_per_step(compiled, args, steps_per_call: int, repeats: int) -> float:
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append((time.perf_counter() - t0) / steps_per_call)
    return float(np.median(times))


def measure_gradient_step(args) -> dict:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(64, 16, 16, 64)), jnp.float32)  # K_ti of the conv DKM step
    w = jnp.asarray(rng.normal(size=(3, 3, 64, 64)) / 24, jnp.float32)
    out = {}
    for stride in (1, 2):
        row = {}
        for name, conv in (("autodiff", autodiff_conv2d), ("conv2d", conv2d)):
            step = gradient_step(conv, stride)
            alone = jax.jit(lambda x, w: step((x, w), None)[0]).lower(x, w).compile()
            scanned = jax.jit(lambda x, w: lax.scan(step, (x, w), None, length=args.scan_length)[0]).lower(x, w).compile()
            row[name] = {"alone_s": seconds_per_step(alone, (x, w), 1, args.repeats),
                         "in_scan_s": seconds_per_step(scanned, (x, w), args.scan_length, args.repeats),
                         "loop_emitted_convolutions_in_scan": scanned.as_text().count("wrapped_convolution_computation")}
        row["autodiff_over_conv2d_in_scan"] = row["autodiff"]["in_scan_s"] / row["conv2d"]["in_scan_s"]
        row["conv2d_in_scan_over_alone"] = row["conv2d"]["in_scan_s"] / row["conv2d"]["alone_s"]
        out[f"stride_{stride}"] = row
    return out


def fit_seconds_per_step(spec, X, y, short: int, long: int, chunk: int) -> dict:
    """Per step from a long and a short fit; the short one runs twice and the second is kept, so
    that compilations cached across fits (helpers with the same shapes) are not counted."""
    times = {}
    for steps in (short, short, long):
        t0 = time.perf_counter()
        fit(spec, X, y, steps=steps, batch_size=64, seed=0, progress=False, chunk_size=chunk)
        times[steps] = time.perf_counter() - t0
    return {"fit_s": {str(k): v for k, v in times.items()}, "step_s": (times[long] - times[short]) / (long - short)}


def measure_fit(args) -> dict:
    data = mean_pooled(datasets.load("mnist-10"), 2)
    X = data.X_train  # [N, 196]: 14x14
    spec = zoo.get("conv-dkm", input_dim=196, image_shape=(14, 14), task="multiclass", num_classes=10, num_inducing=64,
                   depth=2, likelihood=Softmax(num_classes=10, num_mc_samples=16))
    steps = (4, 12) if args.quick else (10, 110)
    out = {"model": "conv-dkm, depth 2 (widths 64 / 128, stride-2 stage), 16 MC samples, SKR on, Taylor KL",
           "data": "mnist-10 train (4,000), mean-pooled 2x2 to 14x14", "batch": 64, "dtype": "float32",
           "conv2d": fit_seconds_per_step(spec, X, data.y_train, *steps, chunk=steps[0])}
    previous = gram.conv2d
    gram.conv2d = autodiff_conv2d  # conv_mix reads the module attribute
    try:
        slow = (2, 4) if args.quick else (2, 6)
        out["autodiff"] = fit_seconds_per_step(spec, X, data.y_train, *slow, chunk=slow[0])
    finally:
        gram.conv2d = previous
    out["autodiff_over_conv2d"] = out["autodiff"]["step_s"] / out["conv2d"]["step_s"]
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--scan-length", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and fit steps (smoke test)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.scan_length = 2, 2
    report = {"benchmark": "scan_convolutions", "date": now(), "machine": machine_info(),
              "settings": {k: v for k, v in vars(args).items() if k != "out"},
              "gradient_step": measure_gradient_step(args), "fit": measure_fit(args)}
    write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
