"""Hot paths of the convolutional GP (seed 000 §3.1, App. A.2) against this machine's limits.

Setting: the paper's rectangles run — a minibatch of B = 100 images of 28×28 from
``analysis.datasets.load("rectangles")``, 3×3 patches (P = 676), M = 16 inducing patches
(distinct training patches), SE base kernel, float32.

Measured in one run, interleaved call by call so that the load of a shared machine falls on all
alike; each number is the median over ``--repeats`` calls of a jit-compiled function (compilation
and a warm-up call excluded), as wall-clock and as process CPU time (all threads):

* ``exp``: ``sum(exp(−x))`` over B·P² float32 elements — the machine's exp throughput;
* ``matmul``: an n×n by n×n float32 product — the machine's matmul throughput (2n³ flops);
* ``kuf_conv`` / ``kuf_matmul``: Kuf ``[1, M, N]`` by the two patch-product strategies, forward
  and forward + backward (gradient w.r.t. Z and the lengthscale, fixed random cotangent); they
  must agree;
* ``kff_fused`` / ``kff_checkpoint`` / ``kff_naive``: the Kff diagonal forward + backward
  (gradient w.r.t. lengthscale and variance) by the custom-VJP symmetric sweep (≈ B·P²/2 exps,
  so it can beat the B·P² bound below, which counts every pair), by row blocks under
  ``jax.checkpoint``, and by plain autodiff of the ``[B, P, P]`` formula; they must agree;
  ``temp_bytes`` is XLA's temporary-buffer size of the compiled function;
* ``elbo_step``: one SVI step of zoo model ``conv`` (Adam 0.01, ``TraceMeanField_ELBO``), as
  ``fit`` runs it — a jit-compiled ``lax.scan`` of ``--steps`` updates, divided by the steps;
  ``elbo_step_naive`` is the same with ``kff_method="naive"``.

The physical bound of a step (DESIGN §6) is B·P²/exp_rate + Kuf_flops/matmul_rate with
Kuf_flops = 2·B·P·M·E (cross term) + 2·B·P·E (patch norms); the step is reported as a multiple
of it (``step_over_bound``, from CPU times and from wall times). Writes
``benchmarks/results/conv_kernels.json``.

    python benchmarks/conv_kernels.py [--repeats 9] [--steps 10] [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import optax
from numpyro.infer import SVI, TraceMeanField_ELBO
from numpyro.optim import optax_to_numpyro

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from analysis import datasets  # noqa: E402
from inference.fit import build_family  # noqa: E402
from inference.inducing import initialise_inducing  # noqa: E402
from models import zoo  # noqa: E402
from models.kernels.convolutional import _se_plan, patch_gram_sum  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "conv_kernels.json"
DTYPE = jnp.float32


def _timed(fn, args):
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start_wall, time.process_time() - start_cpu


def measure(cases: dict, repeats: int) -> dict:
    """Median wall / CPU seconds per case, the cases interleaved call by call."""
    for fn, args in cases.values():  # compile + warm up
        jax.block_until_ready(fn(*args))
        jax.block_until_ready(fn(*args))
    wall = {name: [] for name in cases}
    cpu = {name: [] for name in cases}
    for _ in range(repeats):
        for name, (fn, args) in cases.items():
            w, c = _timed(fn, args)
            wall[name].append(w)
            cpu[name].append(c)
    return {
        name: {"wall_s": float(np.median(wall[name])), "cpu_s": float(np.median(cpu[name])),
               "wall_repeats_s": wall[name], "cpu_repeats_s": cpu[name]}
        for name in cases
    }


def _temp_bytes(fn, args) -> int | None:
    stats = fn.lower(*args).compile().memory_analysis()
    return None if stats is None else int(stats.temp_size_in_bytes)


def build_cases(B: int, image: int, patch: int, M: int, steps: int, matmul_n: int, seed: int = 0):
    """The jit-compiled functions to time, their arguments, and agreement checks."""
    ds = datasets.load("rectangles", seed=seed, image_size=image)
    X_all = np.asarray(ds.X_train, np.float32)  # [N, D]
    y_all = np.asarray(ds.y_train)
    X = jnp.asarray(X_all[:B], DTYPE)  # [B, D]
    shape, patch_shape = (image, image), (patch, patch)

    spec = zoo.get("conv", image_shape=shape, patch_shape=patch_shape, task="binary", num_inducing=M)
    key = jax.random.PRNGKey(seed)
    inducing = initialise_inducing(spec.inducing, spec.kernel, X_all, M, key, spec.inducing_init)
    Z = jnp.asarray(inducing.Z, DTYPE)  # [M, E]
    kernel = spec.kernel
    P, E = kernel.num_patches, kernel.patch_dim

    cot_key, kff_key = jax.random.split(jax.random.PRNGKey(seed + 1))
    kuf_cotangent = jax.random.normal(cot_key, (M, B), DTYPE)  # [M, N]
    kff_cotangent = jax.random.normal(kff_key, (B,), DTYPE)  # [N]

    def kuf(products):
        def value(Z, X, ls):
            k = _with_base(kernel, lengthscale=ls, products=products)
            return k.Kzx(Z, X)  # [1, M, N]

        def grads(Z, X, ls):
            return jax.grad(lambda Z, ls: jnp.sum(value(Z, X, ls)[0] * kuf_cotangent), argnums=(0, 1))(Z, ls)

        return jax.jit(value), jax.jit(grads)

    def kff(method):
        def loss(ls, var, X):
            k = _with_base(kernel, lengthscale=ls, variance=var, kff_method=method)
            return jnp.dot(k.K_diag(X), kff_cotangent)  # a fixed random cotangent per image

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

    ls = jnp.asarray(kernel.base_kernel.lengthscale, DTYPE)
    var = jnp.asarray(kernel.base_kernel.variance, DTYPE)
    kuf_conv, kuf_conv_grad = kuf("conv")
    kuf_matmul, kuf_matmul_grad = kuf("matmul")
    kff_fns = {m: kff(m) for m in ("fused", "checkpoint", "naive")}

    x_exp = jnp.linspace(0.0, 3.0, B * P * P, dtype=DTYPE).reshape(B, P * P)  # [B, P²]
    exp_sum = jax.jit(lambda x: jnp.sum(jnp.exp(-x)))
    a = jax.random.normal(key, (matmul_n, matmul_n), DTYPE)  # [n, n]
    matmul = jax.jit(lambda a: a @ a)

    def elbo_steps(kff_method: str):
        model_spec = spec.replace(kernel=_with_base(kernel, kff_method=kff_method))
        family = build_family(model_spec, inducing, num_latent=1)
        svi = SVI(family.model, family.guide, optax_to_numpyro(optax.adam(0.01)), TraceMeanField_ELBO())
        Xj, yj = jnp.asarray(X_all, DTYPE), jnp.asarray(y_all, DTYPE)
        N = Xj.shape[0]
        state = jax.jit(lambda k: svi.init(k, Xj[:B], yj[:B], num_data=N))(key)
        rng = np.random.default_rng(seed)
        idx = jnp.asarray(np.stack([rng.permutation(N)[:B] for _ in range(steps)]))  # [steps, B]

        @jax.jit
        def run(state, idx):
            def body(state, batch):
                return svi.update(state, Xj[batch], yj[batch], num_data=N)

            return jax.lax.scan(body, state, idx)[1]  # losses [steps]

        return run, (state, idx)

    cases = {
        "exp": (exp_sum, (x_exp,)),
        "matmul": (matmul, (a,)),
        "kuf_conv": (kuf_conv, (Z, X, ls)),
        "kuf_matmul": (kuf_matmul, (Z, X, ls)),
        "kuf_conv_grad": (kuf_conv_grad, (Z, X, ls)),
        "kuf_matmul_grad": (kuf_matmul_grad, (Z, X, ls)),
        "kff_fused": (kff_fns["fused"], (ls, var, X)),
        "kff_checkpoint": (kff_fns["checkpoint"], (ls, var, X)),
        "kff_naive": (kff_fns["naive"], (ls, var, X)),
        "elbo_step": elbo_steps("auto"),
        "elbo_step_naive": elbo_steps("naive"),
    }

    # agreement (float32): the strategies and Kff paths compute the same numbers
    ref_kuf = np.asarray(kuf_conv(Z, X, ls))
    ref_value, ref_grads = kff_fns["naive"](ls, var, X)
    checks = {
        "kuf_conv_vs_matmul_max_rel": float(np.max(np.abs(ref_kuf - np.asarray(kuf_matmul(Z, X, ls)))) / np.max(np.abs(ref_kuf))),
    }
    for m in ("fused", "checkpoint"):
        value, grads = kff_fns[m](ls, var, X)
        checks[f"kff_{m}_vs_naive_value_rel"] = float(abs(value - ref_value) / abs(ref_value))
        checks[f"kff_{m}_vs_naive_grad_rel"] = float(
            max(abs(g - r) / max(abs(r), 1e-30) for g, r in zip(grads, ref_grads))
        )
    temp = {f"kff_{m}": _temp_bytes(kff_fns[m], (ls, var, X)) for m in kff_fns}
    setting = {"B": B, "image_shape": list(shape), "patch_shape": list(patch_shape), "M": M, "P": P, "E": E,
               "dtype": "float32", "kff_se_plan": dict(zip(("blocks", "block", "band_blocks", "images_per_tile"), _se_plan(B, P, None))),
               "steps_per_call": steps,
               "matmul_n": matmul_n, "normalisation": kernel.normalisation}
    return cases, checks, temp, setting


def _with_base(kernel, **changes):
    """The kernel with base-kernel hyperparameters and/or kernel options replaced."""
    import dataclasses  # noqa: PLC0415

    base_fields = {k: v for k, v in changes.items() if k in ("lengthscale", "variance")}
    own = {k: v for k, v in changes.items() if k not in base_fields}
    base = dataclasses.replace(kernel.base_kernel, **base_fields) if base_fields else kernel.base_kernel
    return dataclasses.replace(kernel, base_kernel=base, **own)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--image", type=int, default=28)
    parser.add_argument("--patch", type=int, default=3)
    parser.add_argument("--M", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--matmul-n", type=int, default=1024)
    parser.add_argument("--quick", action="store_true", help="tiny sizes for a smoke test")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.image, args.repeats, args.steps, args.matmul_n = 8, 10, 2, 2, 128

    load_before = os.getloadavg()
    t0 = time.perf_counter()
    cases, checks, temp, setting = build_cases(args.batch, args.image, args.patch, args.M, args.steps, args.matmul_n)
    timings = measure(cases, args.repeats)
    for name in ("elbo_step", "elbo_step_naive"):  # per step
        for key in ("wall_s", "cpu_s"):
            timings[name][key] /= args.steps

    B, P, M, E, n = setting["B"], setting["P"], setting["M"], setting["E"], setting["matmul_n"]
    exp_count = B * P * P
    kuf_flops = 2 * B * P * M * E + 2 * B * P * E
    rates, bound, over = {}, {}, {}
    for clock in ("cpu_s", "wall_s"):
        exp_rate = exp_count / timings["exp"][clock]
        matmul_rate = 2 * n**3 / timings["matmul"][clock]
        rates[clock] = {"exp_per_s": exp_rate, "matmul_flops_per_s": matmul_rate}
        bound[clock] = exp_count / exp_rate + kuf_flops / matmul_rate
        over[clock] = {name: timings[name][clock] / bound[clock]
                       for name in ("elbo_step", "elbo_step_naive", "kff_fused", "kff_checkpoint", "kff_naive")}
    ratios = {
        "kff_naive_over_fused_cpu": timings["kff_naive"]["cpu_s"] / timings["kff_fused"]["cpu_s"],
        "kff_checkpoint_over_fused_cpu": timings["kff_checkpoint"]["cpu_s"] / timings["kff_fused"]["cpu_s"],
        "kuf_matmul_over_conv_cpu": timings["kuf_matmul"]["cpu_s"] / timings["kuf_conv"]["cpu_s"],
        "kuf_matmul_over_conv_grad_cpu": timings["kuf_matmul_grad"]["cpu_s"] / timings["kuf_conv_grad"]["cpu_s"],
        "elbo_step_naive_over_fused_cpu": timings["elbo_step_naive"]["cpu_s"] / timings["elbo_step"]["cpu_s"],
    }
    report = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpu_count": os.cpu_count(),
                    "jax": jax.__version__, "numpyro": numpyro.__version__, "devices": [str(d) for d in jax.devices()],
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "protocol": "medians over repeats of interleaved calls of jit-compiled functions; wall and process CPU time",
        "setting": setting,
        "counts": {"exps_per_step": exp_count, "kuf_flops_per_step": kuf_flops},
        "rates": rates,
        "bound_s": bound,
        "step_over_bound": over,
        "ratios": ratios,
        "kff_temp_bytes": temp,
        "agreement": checks,
        "timings": timings,
        "seconds_total": time.perf_counter() - t0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2))
    tmp.replace(args.out)

    print(f"B={B} P={P} M={M} E={E} float32; load {load_before[0]:.1f} -> {report['machine']['loadavg_after'][0]:.1f}")
    print(f"{'case':<18}{'wall ms':>10}{'cpu ms':>10}")
    for name, t in timings.items():
        print(f"{name:<18}{1e3 * t['wall_s']:>10.2f}{1e3 * t['cpu_s']:>10.2f}")
    print(f"bound (cpu) {1e3 * bound['cpu_s']:.2f} ms; step / bound (cpu) {over['cpu_s']['elbo_step']:.2f}, "
          f"(wall) {over['wall_s']['elbo_step']:.2f}")
    print("ratios:", {k: round(v, 2) for k, v in ratios.items()})
    print("agreement:", checks)
    return report


if __name__ == "__main__":
    main()
