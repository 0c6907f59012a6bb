"""Hot paths of the convolutional GP (van der Wilk et al. 2017, §3.1, App. A.2) against this machine's limits.

Settings (``--config``), SE base kernel, float32, a minibatch of B = 100 images of 28×28:

* ``rectangles`` (default): the paper's rectangles run, ``analysis.datasets.load("rectangles")``,
  zoo model ``conv`` (binary), 3×3 patches (P = 676), M = 16 inducing patches (distinct training
  patches); writes ``benchmarks/results/conv_kernels.json``;
* ``mnist10``: the configuration of ``gpflow_side_by_side.py``: ``load("mnist-10")``, zoo model
  ``weighted-conv`` (RobustMax, 10 latent GPs sharing the kernel), 5×5 patches (P = 576),
  M = 100; the patch weights are differentiated too; writes
  ``benchmarks/results/conv_kernels_mnist10.json``;
* ``mnist10-tick``: the same with zoo model ``weighted-tick`` (Dutordoir et al. 2020, eq. 2): TICK
  shares the conv kernels' fused sweeps on patches augmented with their location (E + 2 columns;
  Kuf takes the inducing locations Z_loc too); every patch is distinct once located, so there is
  no distinct-patch sweep (``kff_distinct``, ``elbo_step_band_kff`` are left out: the default is
  the band sweep); writes ``benchmarks/results/conv_kernels_mnist10_tick.json``.

Measured in one run, interleaved call by call so that the load of a shared machine falls on all
alike; each number is the median over ``--repeats`` calls of a jit-compiled function (compilation
and a warm-up call excluded), as wall-clock and as process CPU time (all threads):

* ``exp``: ``sum(exp(−x))`` over B·P² float32 elements — the machine's exp throughput;
* ``matmul``: an n×n by n×n float32 product — the machine's matmul throughput (2n³ flops);
* ``kuf_fused`` / ``kuf_conv`` / ``kuf_matmul``: Kuf ``[1, M, N]`` by the fused SE path
  (``kuf_method="fused"``, a custom gradient) and by plain autodiff with the two patch-product
  strategies (``kuf_method="autodiff"``), forward and forward + backward (gradient w.r.t. Z, the
  lengthscale, the variance and — mnist10 — the patch weights, fixed random cotangent); they must
  agree;
* ``kff_distinct`` / ``kff_fused`` / ``kff_checkpoint`` / ``kff_naive``: the Kff diagonal forward +
  backward (gradient w.r.t. lengthscale, variance and — mnist10 — the weights) by the custom-VJP
  sweep over each image's distinct patches (the default on CPU: images with a background repeat
  patches, and its work follows the distinct ones), by the symmetric band sweep (≈ B·P²/2 exps;
  both can beat the B·P² bound below, which counts every pair), by row blocks under
  ``jax.checkpoint``, and by plain autodiff of the ``[B, P, P]`` formula; they must agree;
  ``temp_bytes`` is XLA's temporary-buffer size of the compiled function;
* ``elbo_step``: one SVI step of zoo model ``conv`` (Adam 0.01, gpzoo's ``FastELBO``), as
  ``fit`` runs it — a jit-compiled ``lax.scan`` of ``--steps`` updates, divided by the steps;
  ``elbo_step_naive`` is the same with ``kff_method="naive"``, ``elbo_step_band_kff`` with
  ``kff_method="fused"`` (every pair), ``elbo_step_autodiff_kuf`` with ``kuf_method="autodiff"``.

The physical bound of a step counts the step's dominant work, exps and matmul flops,
forward and backward, at this machine's rates measured in the same run, as ``deep_conv_step.py``
counts the deep TICK step: exps = B·P² (the Kff diagonal, every pair) + B·P·M (Kuf); matmul flops =
2·B·P²·E (the inner products x_p·x_q of the Kff pairs, every pair) + 2·B·P·M·E + 2·B·P·E (Kuf's cross
term and patch norms) + 2·B·P·M·E (the cross term's cotangent for dZ), with E + 2 for TICK. The Kff
pairs need no matmul backward: the patches are data, and the gradients w.r.t. the lengthscales, the
variance and the weights are sums over the pairs' values. The step is reported as a multiple of this
bound (``step_over_bound``, from CPU times and from wall times). ``bound_exps_kuf_forward_s`` and
``step_over_bound_exps_kuf_forward`` keep the count of earlier runs of this benchmark — B·P² exps
and the Kuf forward flops only, without the Kff inner products, the Kuf exps or any backward work —
which understates the step's work most where E is large (5×5 patches: the Kff inner products alone
are 2·B·P²·E = 1.7 GFLOP a step on MNIST-10).

OpenBLAS threads are switched off (``OPENBLAS_NUM_THREADS=1``, set before numpy is imported, as
``gpflow_side_by_side.py`` does for both of its workers): the M×M Cholesky and triangular solves
of the ELBO go to LAPACK, where OpenBLAS's threads took ~8 ms per 100×100 solve instead of 0.1 ms
on this 2-core machine and kept spinning afterwards, slowing the exp anchor measured next.

    python benchmarks/conv_kernels.py [--config rectangles|mnist10|mnist10-tick] [--repeats 9] [--steps 10]
        [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy loads OpenBLAS (module docstring)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import optax  # noqa: E402
from numpyro.infer import SVI  # noqa: E402

from gpzoo.inference.elbo import FastELBO  # noqa: E402
from numpyro.optim import optax_to_numpyro  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

from gpzoo.analysis import datasets  # noqa: E402
from gpzoo.inference.fit import build_family  # noqa: E402
from gpzoo.inference.inducing import initialise_inducing  # noqa: E402
from gpzoo.models import zoo  # noqa: E402
from gpzoo.models.kernels.convolutional import _cross_rows, _se_plan  # noqa: E402

from _common import write_json  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
DTYPE = jnp.float32
#: dataset, zoo model, task, classes, patch side, M, output file
CONFIGS = {
    "rectangles": dict(dataset="rectangles", model="conv", task="binary", num_classes=None, patch=3, M=16,
                       out=RESULTS / "conv_kernels.json"),
    "mnist10": dict(dataset="mnist-10", model="weighted-conv", task="multiclass", num_classes=10, patch=5, M=100,
                    out=RESULTS / "conv_kernels_mnist10.json"),
    "mnist10-tick": dict(dataset="mnist-10", model="weighted-tick", task="multiclass", num_classes=10, patch=5, M=100,
                         out=RESULTS / "conv_kernels_mnist10_tick.json"),
}


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


def build_cases(config: str, B: int, image: int, steps: int, matmul_n: int, seed: int = 0, naive: bool = True):
    """The jit-compiled functions to time, their arguments, and agreement checks."""
    cfg = CONFIGS[config]
    ds = datasets.load(cfg["dataset"], seed=seed, **({"image_size": image} if cfg["dataset"] == "rectangles" else {}))
    X_all = np.asarray(ds.X_train, np.float32)  # [N, D]
    y_all = np.asarray(ds.y_train)
    X = jnp.asarray(X_all[:B], DTYPE)  # [B, D]
    shape, patch_shape, M = tuple(ds.image_shape), (cfg["patch"], cfg["patch"]), cfg["M"]

    options = dict(image_shape=shape, patch_shape=patch_shape, task=cfg["task"], num_inducing=M)
    if cfg["num_classes"]:
        options["num_classes"] = cfg["num_classes"]
    spec = zoo.get(cfg["model"], **options)
    key = jax.random.PRNGKey(seed)
    inducing = initialise_inducing(spec.inducing, spec.kernel, X_all, M, key, spec.inducing_init)
    Z = jnp.asarray(inducing.Z, DTYPE)  # [M, E]
    kernel = spec.kernel
    located = hasattr(kernel, "location_lengthscale")  # TICK: inducing locations, no distinct-patch sweep
    own_inducing = {"Z_loc": jnp.asarray(inducing.Z_loc, DTYPE)} if located else {}  # [M, 2]
    P, E = kernel.num_patches, kernel.patch_dim
    weighted = hasattr(kernel, "weights")
    weights = jnp.asarray(kernel.weights, DTYPE) if weighted else jnp.ones((), DTYPE)  # [P] (unused if not weighted)

    cot_key, kff_key = jax.random.split(jax.random.PRNGKey(seed + 1))
    kuf_cotangent = jax.random.normal(cot_key, (M, B), DTYPE)  # [M, N]
    kff_cotangent = jax.random.normal(kff_key, (B,), DTYPE)  # [N]

    def kernel_with(ls, var, w, **own):
        return _with_base(kernel, lengthscale=ls, variance=var, **({"weights": w} if weighted else {}), **own)

    hyper_args = (0, 1, 2, 3) if weighted else (0, 1, 2)  # Z, ls, var(, weights)

    def kuf(**own):
        def value(Z, X, ls, var, w):
            return kernel_with(ls, var, w, **own).Kzx(Z, X, **own_inducing)  # [1, M, N]

        def grads(Z, X, ls, var, w):
            loss = lambda Z, ls, var, w: jnp.sum(value(Z, X, ls, var, w)[0] * kuf_cotangent)  # noqa: E731
            return jax.grad(loss, argnums=hyper_args)(Z, ls, var, w)

        return jax.jit(value), jax.jit(grads)

    def kff(method):
        def loss(ls, var, w, X):
            return jnp.dot(kernel_with(ls, var, w, kff_method=method).K_diag(X), kff_cotangent)  # a fixed random cotangent per image

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2) if weighted else (0, 1)))

    ls = jnp.asarray(kernel.base_kernel.lengthscale, DTYPE)
    var = jnp.asarray(kernel.base_kernel.variance, DTYPE)
    kuf_fns = {"fused": kuf(kuf_method="fused"), "conv": kuf(kuf_method="autodiff", products="conv"),
               "matmul": kuf(kuf_method="autodiff", products="matmul")}
    kff_methods = ("fused", "checkpoint", "naive") if located else ("distinct", "fused", "checkpoint", "naive")
    kff_fns = {m: kff(m) for m in kff_methods}

    x_exp = jnp.linspace(0.0, 3.0, B * P * P, dtype=DTYPE).reshape(B, P * P)  # [B, P²]
    exp_sum = jax.jit(lambda x: jnp.sum(jnp.exp(-x)))
    a = jax.random.normal(key, (matmul_n, matmul_n), DTYPE)  # [n, n]
    matmul = jax.jit(lambda a: a @ a)

    def elbo_steps(**own):
        model_spec = spec.replace(kernel=_with_base(kernel, **own))
        family = build_family(model_spec, inducing, num_latent=spec.likelihood.num_latent(cfg["num_classes"]))
        svi = SVI(family.model, family.guide, optax_to_numpyro(optax.adam(0.01)), FastELBO())
        Xj = jnp.asarray(X_all, DTYPE)
        yj = jnp.asarray(y_all, DTYPE if cfg["task"] == "binary" else jnp.int32)
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

    kuf_args = (Z, X, ls, var, weights)
    kff_args = (ls, var, weights, X)
    cases = {
        "exp": (exp_sum, (x_exp,)),
        "matmul": (matmul, (a,)),
        **{f"kuf_{m}": (kuf_fns[m][0], kuf_args) for m in kuf_fns},
        **{f"kuf_{m}_grad": (kuf_fns[m][1], kuf_args) for m in kuf_fns},
        **{f"kff_{m}": (kff_fns[m], kff_args) for m in kff_methods if m != "naive"},
        "elbo_step": elbo_steps(),
        **({} if located else {"elbo_step_band_kff": elbo_steps(kff_method="fused")}),
        "elbo_step_autodiff_kuf": elbo_steps(kuf_method="autodiff"),
    }
    if naive:
        cases["kff_naive"] = (kff_fns["naive"], kff_args)
        cases["elbo_step_naive"] = elbo_steps(kff_method="naive")

    # agreement (float32): the Kuf paths and the Kff paths compute the same numbers
    ref_kuf = np.asarray(kuf_fns["conv"][0](*kuf_args))
    ref_kuf_grads = kuf_fns["conv"][1](*kuf_args)
    checks = {}
    for m in ("matmul", "fused"):
        checks[f"kuf_{m}_vs_conv_max_rel"] = float(np.max(np.abs(ref_kuf - np.asarray(kuf_fns[m][0](*kuf_args)))) / np.max(np.abs(ref_kuf)))
        checks[f"kuf_{m}_vs_conv_grad_rel"] = _max_rel(kuf_fns[m][1](*kuf_args), ref_kuf_grads)
    ref = "naive" if naive else "checkpoint"
    ref_value, ref_grads = kff_fns[ref](*kff_args)
    for m in [k for k in kff_methods if k not in (ref, "naive")]:
        value, grads = kff_fns[m](*kff_args)
        checks[f"kff_{m}_vs_{ref}_value_rel"] = float(abs(value - ref_value) / abs(ref_value))
        checks[f"kff_{m}_vs_{ref}_grad_rel"] = _max_rel(grads, ref_grads)
    temp = {f"kff_{m}": _temp_bytes(kff_fns[m], kff_args) for m in kff_methods if naive or m != "naive"}
    temp.update({f"kuf_{m}_grad": _temp_bytes(kuf_fns[m][1], kuf_args) for m in kuf_fns})
    setting = {"config": config, "model": cfg["model"], "B": B, "image_shape": list(shape), "patch_shape": list(patch_shape),
               "M": M, "P": P, "E": E, "num_latent": spec.likelihood.num_latent(cfg["num_classes"]), "dtype": "float32",
               "weights_differentiated": weighted,
               "kff_se_plan": dict(zip(("blocks", "block", "band_blocks", "images_per_tile"), _se_plan(B, P, None))),
               "kff_default": "distinct" if jax.default_backend() == "cpu" and not located else "fused",
               "distinct_patches_per_image": None if located else _distinct_counts(X, kernel),
               "located_patches": located,
               "kuf_chunk_rows": _cross_rows(B, P, M, None), "steps_per_call": steps,
               "matmul_n": matmul_n, "normalisation": kernel.normalisation,
               "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS")}
    return cases, checks, temp, setting


def _distinct_counts(X, kernel) -> dict:
    """Mean and max number of distinct patches per image of the minibatch (the distinct sweep's work)."""
    patches = np.asarray(kernel._stream_patches(X))[0]  # [B, P, E]
    counts = [len(np.unique(p, axis=0)) for p in patches]
    return {"mean": float(np.mean(counts)), "max": int(np.max(counts)), "of": int(patches.shape[1])}


def _max_rel(grads, ref_grads) -> float:
    """Largest relative difference (max |a − b| / max |b|) over the leaves of two gradient tuples."""
    return float(max(np.max(np.abs(np.asarray(g) - np.asarray(r))) / max(float(np.max(np.abs(np.asarray(r)))), 1e-30)
                     for g, r in zip(grads, ref_grads)))


def _with_base(kernel, **changes):
    """The kernel with base-kernel hyperparameters and/or kernel options replaced."""
    import dataclasses  # noqa: PLC0415

    base_fields = {k: v for k, v in changes.items() if k in ("lengthscale", "variance")}
    own = {k: v for k, v in changes.items() if k not in base_fields}
    base = dataclasses.replace(kernel.base_kernel, **base_fields) if base_fields else kernel.base_kernel
    return dataclasses.replace(kernel, base_kernel=base, **own)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=list(CONFIGS), default="rectangles")
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--image", type=int, default=28, help="image side (rectangles only)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--matmul-n", type=int, default=1024)
    parser.add_argument("--no-naive", action="store_true", help="skip the materialised [B, P, P] Kff (slow, memory-hungry)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes for a smoke test")
    parser.add_argument("--out", type=Path, default=None, help="default: the configuration's file in benchmarks/results")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.image, args.repeats, args.steps, args.matmul_n = 8, 10, 2, 2, 128
    out = args.out or CONFIGS[args.config]["out"]

    load_before = os.getloadavg()
    t0 = time.perf_counter()
    cases, checks, temp, setting = build_cases(args.config, args.batch, args.image, args.steps, args.matmul_n, naive=not args.no_naive)
    timings = measure(cases, args.repeats)
    steps = [name for name in timings if name.startswith("elbo_step")]
    for name in steps:  # per step
        for key in ("wall_s", "cpu_s"):
            timings[name][key] /= args.steps

    B, P, M, E, n = setting["B"], setting["P"], setting["M"], setting["E"], setting["matmul_n"]
    E += 2 if setting["located_patches"] else 0  # TICK's sweeps run on patches augmented with their location
    counts = {"kff_exps": B * P * P, "kuf_exps": B * P * M,
              "kff_inner_product_flops": 2 * B * P * P * E,
              "kuf_flops": 2 * B * P * M * E + 2 * B * P * E,
              "kuf_backward_flops": 2 * B * P * M * E}
    exps = counts["kff_exps"] + counts["kuf_exps"]
    flops = counts["kff_inner_product_flops"] + counts["kuf_flops"] + counts["kuf_backward_flops"]
    rates, bound, over, bound_old, over_old = {}, {}, {}, {}, {}
    relative = steps + [name for name in timings if name.startswith("kff_")]
    for clock in ("cpu_s", "wall_s"):
        exp_rate = counts["kff_exps"] / timings["exp"][clock]  # the exp anchor sums B·P² exps
        matmul_rate = 2 * n**3 / timings["matmul"][clock]
        rates[clock] = {"exp_per_s": exp_rate, "matmul_flops_per_s": matmul_rate}
        bound[clock] = exps / exp_rate + flops / matmul_rate
        over[clock] = {name: timings[name][clock] / bound[clock] for name in relative}
        bound_old[clock] = counts["kff_exps"] / exp_rate + counts["kuf_flops"] / matmul_rate
        over_old[clock] = {name: timings[name][clock] / bound_old[clock] for name in relative}
    cpu = {name: t["cpu_s"] for name, t in timings.items()}
    ratios = {
        "kff_checkpoint_over_fused_cpu": cpu["kff_checkpoint"] / cpu["kff_fused"],
        "kuf_matmul_over_fused_grad_cpu": cpu["kuf_matmul_grad"] / cpu["kuf_fused_grad"],
        "kuf_conv_over_fused_grad_cpu": cpu["kuf_conv_grad"] / cpu["kuf_fused_grad"],
        "kuf_matmul_over_conv_cpu": cpu["kuf_matmul"] / cpu["kuf_conv"],
        "elbo_step_autodiff_kuf_over_fused_cpu": cpu["elbo_step_autodiff_kuf"] / cpu["elbo_step"],
    }
    if "kff_distinct" in cpu:
        ratios["kff_fused_over_distinct_cpu"] = cpu["kff_fused"] / cpu["kff_distinct"]
        ratios["elbo_step_band_kff_over_distinct_cpu"] = cpu["elbo_step_band_kff"] / cpu["elbo_step"]
    if "kff_naive" in cpu:
        ratios["kff_naive_over_fused_cpu"] = cpu["kff_naive"] / cpu["kff_fused"]
        ratios["elbo_step_naive_over_fused_cpu"] = cpu["elbo_step_naive"] / cpu["elbo_step"]
    report = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpu_count": os.cpu_count(),
                    "jax": jax.__version__, "numpyro": numpyro.__version__, "devices": [str(d) for d in jax.devices()],
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
        "protocol": "medians over repeats of interleaved calls of jit-compiled functions; wall and process CPU time",
        "setting": setting,
        "counts": counts,
        "rates": rates,
        "bound_s": bound,
        "step_over_bound": over,
        "bound_exps_kuf_forward_s": bound_old,
        "step_over_bound_exps_kuf_forward": over_old,
        "ratios": ratios,
        "temp_bytes": temp,
        "agreement": checks,
        "timings": timings,
        "seconds_total": time.perf_counter() - t0,
    }
    write_json(out, report)

    print(f"{args.config}: B={B} P={P} M={M} E={E} float32; load {load_before[0]:.1f} -> {report['machine']['loadavg_after'][0]:.1f}")
    print(f"{'case':<24}{'wall ms':>10}{'cpu ms':>10}")
    for name, t in timings.items():
        print(f"{name:<24}{1e3 * t['wall_s']:>10.2f}{1e3 * t['cpu_s']:>10.2f}")
    print(f"bound (cpu) {1e3 * bound['cpu_s']:.2f} ms; step / bound (cpu) {over['cpu_s']['elbo_step']:.2f}, "
          f"(wall) {over['wall_s']['elbo_step']:.2f}; against B·P² exps + Kuf forward flops only "
          f"{over_old['cpu_s']['elbo_step']:.2f} (cpu)")
    print("ratios:", {k: round(v, 2) for k, v in ratios.items()})
    print("agreement:", checks)
    return report


if __name__ == "__main__":
    main()
