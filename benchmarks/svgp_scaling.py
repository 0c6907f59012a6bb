"""Time per SVI step of the SVGP against N (fixed batch), M and D, with a hand-written JAX reference.

What is timed: the update ``fit`` runs, NumPyro's ``svi.update`` with
gpzoo's ``FastELBO`` and optax Adam, as a jit-compiled ``lax.scan`` of ``--steps`` steps over
precomputed minibatch indices (the minibatch gather is inside the scan), divided by the number of
steps. Compilation and three warm-up calls are excluded; the medians of ``--repeats`` calls are
reported, the two programs alternating call by call so that the load of a shared machine falls on
both alike. OpenBLAS, which runs jaxlib's CPU Cholesky and triangular solves, is limited to one
thread (``--blas-threads``): threaded, on two busy cores, it made the Cholesky gradient at M=256
~50x slower and the timings erratic.

The anchor, measured in the same run, is the same step written by hand in plain JAX: the negative
ELBO of an SVGP with an SE kernel, whitened full-rank q(u), Gaussian likelihood, N/B minibatch
scaling and the analytic KL, over unconstrained parameters (exp for positive hyperparameters,
q_sqrt = tril(raw, -1) + diag(|diag raw|), as gpzoo's q_sqrt transform does), differentiated
with ``jax.value_and_grad`` and stepped by the same optax Adam in the same kind of scan. Both start
from the same parameters; before timing, both losses are evaluated at identical (trained)
parameters and must agree to 1e-4 relative in float32, so the comparison is like for like.

Grid: one factor at a time around a base point (N=1e4, M=64, D=16, B=256): N ∈ {1e3, 1e4, 1e5},
M ∈ {16, 64, 256}, D ∈ {2, 16, 128} in float32, plus the base point in float64. Writes
``benchmarks/results/svgp_scaling.json`` and prints a table. ``--quick`` is a reduced grid for
the smoke test; ``--N/--M/--D`` replace a sweep's values (the middle value is the base).

    python benchmarks/svgp_scaling.py [--quick] [--out PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import threadpoolctl
from jax.scipy.linalg import solve_triangular
from numpyro.infer import SVI

from gpzoo.inference.elbo import FastELBO
from numpyro.optim import optax_to_numpyro

ROOT = Path(__file__).resolve().parents[1]

from _common import machine_info, now, write_json  # noqa: E402
from gpzoo.inference.fit import build_family  # noqa: E402
from gpzoo.inference.inducing import initialise_inducing  # noqa: E402
from gpzoo.models import zoo  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "svgp_scaling.json"
THRESHOLD = 1.5  # gpzoo step / reference step must stay below this (issue text)
LOSS_TOLERANCE = 1e-4  # relative |loss_gpzoo − loss_reference| at identical parameters, float32
LEARNING_RATE = 0.01
LOG_2PI = math.log(2.0 * math.pi)
WARMUP_CALLS = 3  # the first calls after compiling are still slow on this machine
#: what one timed step runs, recorded in the JSON as ``step_description`` (summarise.py --check
#: compares the two, so a result whose step the script no longer runs is reported stale)
STEP_DESCRIPTION = ("one svi.update of svgp-rbf (gpzoo FastELBO: analytic KL, closed-form Gaussian expected log-likelihood; "
                    "optax Adam 0.01; whitened full-rank q(u), q_sqrt optimised on its entries with diagonal |x|, "
                    "Gaussian likelihood; minibatch gathered inside the scan) "
                    "against a hand-written JAX value_and_grad + optax Adam step of the same negative ELBO, both as a "
                    "jitted lax.scan of `steps` steps")

FULL_GRID = {"N": (1_000, 10_000, 100_000), "M": (16, 64, 256), "D": (2, 16, 128)}
QUICK_GRID = {"N": (1_000, 10_000), "M": (16, 64), "D": (2, 16)}


@dataclasses.dataclass(frozen=True)
class Config:
    N: int
    M: int
    D: int
    B: int
    dtype: str  # "float32" or "float64"
    sweeps: tuple[str, ...]  # which one-factor sweeps this point belongs to ("N", "M", "D", "dtype")


def grid(values: dict[str, tuple[int, ...]], batch_size: int, float64: bool) -> list[Config]:
    """One factor at a time around the base point (each sweep's middle value)."""
    base = {k: v[len(v) // 2] for k, v in values.items()}
    points: dict[tuple, set] = {}
    for factor, vals in values.items():
        for value in vals:
            point = {**base, factor: value}
            points.setdefault((point["N"], point["M"], point["D"], "float32"), set()).add(factor)
    if float64:
        points.setdefault((base["N"], base["M"], base["D"], "float64"), set()).add("dtype")
    order = {"N": 0, "M": 1, "D": 2, "dtype": 3}
    configs = [
        Config(N, M, D, min(batch_size, N), dtype, tuple(sorted(sweeps, key=order.get)))
        for (N, M, D, dtype), sweeps in points.items()
    ]
    return sorted(configs, key=lambda c: (c.dtype, min(order[s] for s in c.sweeps), c.N, c.M, c.D))


@contextlib.contextmanager
def precision(dtype: str):
    """Run with ``jax_enable_x64`` matching ``dtype`` (gpzoo takes its float type from it)."""
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", dtype == "float64")
    try:
        yield np.dtype(dtype)
    finally:
        jax.config.update("jax_enable_x64", before)


# ----------------------------------------------------------------------------- data
def make_data(cfg: Config, seed: int = 0):
    """Inputs spread and a target wiggly enough that Kuu stays well conditioned in float32.

    With a smooth target the lengthscale grows during the warm-up and, at D=2, cond(Kuu) reaches
    ~1e7: both float32 losses then differ from the float64 value by ~1e-4 (conditioning, not a
    model mismatch), and the like-for-like check would compare rounding errors.
    """
    rng = np.random.default_rng([seed, cfg.N, cfg.D])
    X = 3.0 * rng.standard_normal((cfg.N, cfg.D))  # [N, D]
    w = 2.0 * rng.standard_normal(cfg.D) / math.sqrt(cfg.D)  # [D]
    y = np.sin(X @ w) + 0.1 * rng.standard_normal(cfg.N)  # [N]
    return X.astype(cfg.dtype), y.astype(cfg.dtype)


def initial_lengthscale(input_dim: int) -> float:
    """ℓ = √(D/2): pairs of inputs are then ~6 lengthscales apart at every D (not e^{-D}-tiny Kuf)."""
    return math.sqrt(input_dim / 2.0)


def batch_indices(cfg: Config, steps: int, seed: int = 1) -> np.ndarray:
    """``[steps, B]`` minibatch indices (without replacement within a step)."""
    rng = np.random.default_rng([seed, cfg.N])
    return np.stack([rng.choice(cfg.N, cfg.B, replace=False) for _ in range(steps)]).astype(np.int32)


# ----------------------------------------------------------------------------- gpzoo
def gpzoo_program(cfg: Config, X, y, seed: int = 0):
    """(svi, initial state, jitter, family) of the zoo's svgp-rbf with whitened full-rank q(u)."""
    spec = zoo.get("svgp-rbf", input_dim=cfg.D, task="regression", num_inducing=cfg.M, lengthscale=initial_lengthscale(cfg.D))
    assert spec.whiten and spec.q_structure == "full"
    key_inducing, key_svi = jax.random.split(jax.random.PRNGKey(seed))
    inducing = initialise_inducing(spec.inducing, spec.kernel, X, cfg.M, key_inducing, spec.inducing_init)
    family = build_family(spec, inducing, num_latent=1)
    svi = SVI(family.model, family.guide, optax_to_numpyro(optax.adam(LEARNING_RATE)), FastELBO())
    init = jax.jit(lambda key, Xb, yb: svi.init(key, Xb, yb, num_data=cfg.N))  # as fit does: eager init is slow
    state = init(key_svi, jnp.asarray(X[: cfg.B]), jnp.asarray(y[: cfg.B]))
    return svi, state, spec.jitter, family


def gpzoo_scan(svi: SVI, num_data: int):
    def run(state, X, y, idx):  # idx [K, B]
        def body(state, batch_idx):
            return svi.update(state, X[batch_idx], y[batch_idx], num_data=num_data)

        return jax.lax.scan(body, state, idx)

    return run


# ----------------------------------------------------------------------------- reference
def se_kernel(A, B, lengthscale, variance):
    """σ² exp(−‖a − b‖² / 2ℓ²), ``[P, Q]`` for A ``[P, D]``, B ``[Q, D]`` (distance by matmul)."""
    As, Bs = A / lengthscale, B / lengthscale
    r2 = jnp.sum(As**2, -1)[:, None] - 2.0 * As @ Bs.T + jnp.sum(Bs**2, -1)[None, :]  # [P, Q]
    return variance * jnp.exp(-0.5 * jnp.maximum(r2, 0.0))


def reference_loss(raw, X, y, num_data: int, jitter: float):
    """Negative ELBO of the whitened SVGP, written out: −(N/B Σ_b E_q[log p(y_b|f_b)] − KL[q(v) || N(0, I)])."""
    lengthscale, variance, noise = jnp.exp(raw["log_lengthscale"]), jnp.exp(raw["log_variance"]), jnp.exp(raw["log_noise"])
    Z, q_mu, q_raw = raw["Z"], raw["q_mu"], raw["q_sqrt_raw"]  # [M, D], [M], [M, M]
    M, B = Z.shape[0], X.shape[0]
    Kuu = se_kernel(Z, Z, lengthscale, variance) + jitter * jnp.eye(M, dtype=Z.dtype)  # [M, M]
    Luu = jnp.linalg.cholesky(Kuu)  # [M, M]
    A = solve_triangular(Luu, se_kernel(Z, X, lengthscale, variance), lower=True)  # [M, B]
    q_sqrt = jnp.tril(q_raw, -1) + jnp.diag(jnp.abs(jnp.diag(q_raw)))  # [M, M]: the factor's own entries, diagonal |x|
    mean = q_mu @ A  # [B]
    var = variance - jnp.sum(A**2, 0) + jnp.sum((q_sqrt.T @ A) ** 2, 0)  # [B]
    ell = -0.5 * (LOG_2PI + jnp.log(noise) + ((y - mean) ** 2 + var) / noise)  # [B]
    kl = 0.5 * (jnp.sum(q_sqrt**2) + jnp.sum(q_mu**2) - M - 2.0 * jnp.sum(jnp.log(jnp.diag(q_sqrt))))
    return -(num_data / B * jnp.sum(ell) - kl)


def reference_params(gpzoo_params) -> dict:
    """The reference's unconstrained parameters equal to gpzoo's constrained ones."""
    q_sqrt = gpzoo_params["q_sqrt"][0]  # [M, M]
    return {
        "log_lengthscale": jnp.log(gpzoo_params["kernel.lengthscale"]),
        "log_variance": jnp.log(gpzoo_params["kernel.variance"]),
        "log_noise": jnp.log(gpzoo_params["likelihood.noise_variance"]),
        "Z": gpzoo_params["inducing.Z"],
        "q_mu": gpzoo_params["q_mu"][0],
        "q_sqrt_raw": q_sqrt,  # the factor itself: its diagonal is positive, so |x| returns it
    }


def reference_scan(num_data: int, jitter: float):
    optimizer = optax.adam(LEARNING_RATE)
    loss_and_grad = jax.value_and_grad(reference_loss)

    def run(state, X, y, idx):  # state: (raw params, optax state); idx [K, B]
        def body(state, batch_idx):
            raw, opt_state = state
            loss, grads = loss_and_grad(raw, X[batch_idx], y[batch_idx], num_data, jitter)
            updates, opt_state = optimizer.update(grads, opt_state, raw)
            return (optax.apply_updates(raw, updates), opt_state), loss

        return jax.lax.scan(body, state, idx)

    return run, optimizer


# ----------------------------------------------------------------------------- timing
def _seconds(compiled, *args) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of one call (CPU time is less hurt by a busy machine)."""
    t0, c0 = time.perf_counter(), time.process_time()
    jax.block_until_ready(compiled(*args))
    return time.perf_counter() - t0, time.process_time() - c0


def _rel(a, b) -> float:
    return float(abs(a - b) / max(abs(b), 1e-30))


def run_config(cfg: Config, steps: int, repeats: int, seed: int = 0) -> dict:
    with precision(cfg.dtype):
        X_np, y_np = make_data(cfg, seed)
        X, y = jnp.asarray(X_np), jnp.asarray(y_np)
        idx = jnp.asarray(batch_indices(cfg, steps))  # [K, B]

        svi, gp_state, jitter, family = gpzoo_program(cfg, X_np, y_np, seed)
        ref_run, optimizer = reference_scan(cfg.N, jitter)
        ref_raw = reference_params(svi.get_params(gp_state))
        ref_state = (ref_raw, optimizer.init(ref_raw))

        t0 = time.perf_counter()
        gp_compiled = jax.jit(gpzoo_scan(svi, cfg.N)).lower(gp_state, X, y, idx).compile()
        gp_compile = time.perf_counter() - t0
        t0 = time.perf_counter()
        ref_compiled = jax.jit(ref_run).lower(ref_state, X, y, idx).compile()
        ref_compile = time.perf_counter() - t0

        # warm-up, and like-for-like checks at identical, trained parameters
        for _ in range(WARMUP_CALLS):
            gp_after, gp_losses = jax.block_until_ready(gp_compiled(gp_state, X, y, idx))
            ref_after, ref_losses = jax.block_until_ready(ref_compiled(ref_state, X, y, idx))
        if not (np.all(np.isfinite(gp_losses)) and np.all(np.isfinite(ref_losses))):
            raise FloatingPointError(f"non-finite loss during the warm-up of {cfg}")
        Xb, yb = X[idx[-1]], y[idx[-1]]
        check = jax.jit(lambda s: (svi.evaluate(s, Xb, yb, num_data=cfg.N),
                                   reference_loss(reference_params(svi.get_params(s)), Xb, yb, cfg.N, jitter),
                                   family.jitter_used(svi.get_params(s))))
        loss_gp, loss_ref, jitter_final = map(float, check(gp_after))
        jitter_initial = float(check(gp_state)[2])
        loss_rel_diff = _rel(loss_gp, loss_ref)
        tolerance = LOSS_TOLERANCE if cfg.dtype == "float32" else 1e-10
        if not loss_rel_diff < tolerance:
            raise AssertionError(f"{cfg}: gpzoo loss {loss_gp} vs reference {loss_ref} (rel. {loss_rel_diff:.2e})")
        # the same K Adam steps from the same start: how far apart the two trajectories end
        trajectory_rel_diff = _rel(float(gp_losses[-1]), float(ref_losses[-1]))

        gp_calls, ref_calls = [], []
        for r in range(repeats):  # alternate which program goes first
            pair = [(gp_calls, gp_compiled, gp_state), (ref_calls, ref_compiled, ref_state)]
            for calls, compiled, state in pair if r % 2 == 0 else pair[::-1]:
                calls.append(_seconds(compiled, state, X, y, idx))

    gp_times, gp_cpu = (np.asarray(c) / steps for c in zip(*gp_calls))
    ref_times, ref_cpu = (np.asarray(c) / steps for c in zip(*ref_calls))
    gp_step, ref_step = float(np.median(gp_times)), float(np.median(ref_times))
    return {
        "N": cfg.N, "M": cfg.M, "D": cfg.D, "B": cfg.B, "dtype": cfg.dtype, "sweeps": list(cfg.sweeps),
        "lengthscale_init": initial_lengthscale(cfg.D),
        "gpzoo_step_s": gp_step,
        "reference_step_s": ref_step,
        "ratio": gp_step / ref_step,
        "ratio_paired_median": float(np.median(gp_times / ref_times)),
        "gpzoo_step_cpu_s": float(np.median(gp_cpu)),
        "reference_step_cpu_s": float(np.median(ref_cpu)),
        "ratio_cpu": float(np.median(gp_cpu) / np.median(ref_cpu)),
        "gpzoo_repeats_s": gp_times.tolist(),
        "reference_repeats_s": ref_times.tolist(),
        "compile_s": {"gpzoo": gp_compile, "reference": ref_compile},
        "loss_gpzoo": loss_gp,
        "loss_reference": loss_ref,
        "loss_rel_diff": loss_rel_diff,
        "trajectory_rel_diff": trajectory_rel_diff,
        "jitter_used": {"initial": jitter_initial, "final": jitter_final},
    }


# ----------------------------------------------------------------------------- report
def table(results: list[dict]) -> str:
    head = (f"{'sweep':<8}{'N':>8}{'M':>6}{'D':>6}{'B':>6}  {'dtype':<8}{'gpzoo ms':>10}{'ref ms':>10}{'ratio':>8}"
            f"{'cpu ratio':>10}{'loss rel':>10}")
    lines = [head, "-" * len(head)]
    for r in results:
        flag = "  <-- ≥ %.1f×" % THRESHOLD if r["ratio"] >= THRESHOLD else ""
        lines.append(
            f"{','.join(r['sweeps']):<8}{r['N']:>8}{r['M']:>6}{r['D']:>6}{r['B']:>6}  {r['dtype']:<8}"
            f"{1e3 * r['gpzoo_step_s']:>10.3f}{1e3 * r['reference_step_s']:>10.3f}{r['ratio']:>8.2f}{r['ratio_cpu']:>10.2f}"
            f"{r['loss_rel_diff']:>10.1e}{flag}"
        )
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="reduced grid, fewer steps and repeats (smoke test)")
    p.add_argument("--N", type=int, nargs="+", help="data sizes of the N sweep (middle value is the base)")
    p.add_argument("--M", type=int, nargs="+", help="inducing sizes of the M sweep")
    p.add_argument("--D", type=int, nargs="+", help="input dimensions of the D sweep")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, help="SVI steps per timed scan (default 50, quick 20)")
    p.add_argument("--repeats", type=int, help="timed calls per program after warm-up (default 9, quick 3)")
    p.add_argument("--blas-threads", type=int, default=1,
                   help="OpenBLAS threads for the LAPACK calls (Cholesky, triangular solves); 0 leaves them as "
                        "they are. Default 1: threaded OpenBLAS on 2 busy cores made the Cholesky gradient ~50x slower")
    p.add_argument("--no-float64", dest="float64", action="store_false", help="skip the float64 base point")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    values = dict(QUICK_GRID if args.quick else FULL_GRID)
    for factor in ("N", "M", "D"):
        if getattr(args, factor):
            values[factor] = tuple(getattr(args, factor))
    steps = args.steps or (20 if args.quick else 50)
    repeats = args.repeats or (3 if args.quick else 9)
    if steps < 1 or repeats < 1:
        raise SystemExit("--steps and --repeats must be positive")
    configs = grid(values, args.batch_size, args.float64)

    t0 = time.perf_counter()
    results = []
    limit = threadpoolctl.threadpool_limits(args.blas_threads, user_api="blas") if args.blas_threads > 0 else contextlib.nullcontext()
    with limit:
        machine = machine_info()
        for cfg in configs:
            results.append(run_config(cfg, steps, repeats))
            r = results[-1]
            print(f"  N={cfg.N} M={cfg.M} D={cfg.D} {cfg.dtype}: gpzoo {1e3 * r['gpzoo_step_s']:.3f} ms, "
                  f"reference {1e3 * r['reference_step_s']:.3f} ms, ratio {r['ratio']:.2f}", flush=True)
    machine["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None

    report = {
        "benchmark": "svgp_scaling",
        "description": "seconds per SVI step (svi.update of svgp-rbf, gpzoo FastELBO, optax Adam, whitened "
                       "full-rank q(u), Gaussian likelihood) against a hand-written JAX value_and_grad + Adam step "
                       "of the same negative ELBO, both as a jitted lax.scan of `steps` steps",
        "step_description": STEP_DESCRIPTION,
        "date": now(),
        "machine": machine,
        "protocol": {
            "steps_per_scan": steps, "repeats": repeats, "warmup_calls": WARMUP_CALLS, "statistic": "median",
            "blas_threads": args.blas_threads or "default",
            "batch_size": args.batch_size, "learning_rate": LEARNING_RATE, "grid": {k: list(v) for k, v in values.items()},
            "compile_excluded": True, "order": "gpzoo and reference alternate, first one swapping every repeat",
            "loss_tolerance_float32": LOSS_TOLERANCE, "quick": args.quick,
        },
        "threshold_ratio": THRESHOLD,
        "max_ratio": max(r["ratio"] for r in results),
        "all_below_threshold": all(r["ratio"] < THRESHOLD for r in results),
        "wall_s": time.perf_counter() - t0,
        "results": results,
    }
    write_json(args.out, report)
    print(table(results))
    print(f"max ratio {report['max_ratio']:.2f} (threshold {THRESHOLD}); wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
