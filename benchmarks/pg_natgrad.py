"""Wall time to the optimum of the Pólya–Gamma bound: CAVI / natural gradients against Adam.

Problem: the logistic SVGP ``svgp-logistic-pg`` (SE kernel, whitened full-rank q(u), Bernoulli
logit) on two-moons with N training points and M inducing inputs (k-means, fixed),
hyperparameters held fixed so the optimum of the PG bound (van der Wilk et al. 2018, eq. 23,
:func:`gpzoo.inference.pg_natgrad.pg_bound`) over q(u) and c is well defined. Two settings by default:
(ℓ, σ²) = (0.5, 4), close to the type-II ML values ``fit`` finds on this data (0.58, 5.1), and the
smoother (1, 1). The optimum L* is computed first by full-batch CAVI run to convergence (bound
change < 1e-6 nats).

Timed, all from the prior q(v) = N(0, I), full batch, float64, compile excluded, each a
jit-compiled ``lax.scan`` over its steps (one dispatch):

(a) ``cavi``: CAVI, i.e. :func:`gpzoo.inference.pg_natgrad.natural_update` with ρ = 1 (closed-form c,
    then the optimal q(u); Wenzel et al. 2019) on features (Luu, A = Luu⁻¹Kuf, prior conditional
    variances) computed once at the start of the program — what ``fit_pg_natgrad`` runs when the
    hyperparameters are fixed;
(b) ``adam``: optax Adam on the same bound over (q_mu, unconstrained q_sqrt) with c at its
    closed-form optimum (profiled out: a stronger baseline than also learning c), on the same
    features computed once, for each learning rate of a grid; the fastest to the target is timed.
    Per step it does the same kind of work as (a): two [M, N] products;
(c) ``adam_recomputing``: (b) at its best learning rate, but recomputing the features every step
    (Kuu, its Cholesky, Kuf and the solve), as an SVI step that also trains hyperparameters must;
(d) ``cavi_recomputing``: (a) recomputing the features every step (:func:`natural_step`), the
    previous form of the CAVI step;
(e) ``cavi_anderson``: (a) with Anderson mixing of the CAVI iterates
    (:func:`gpzoo.inference.pg_natgrad.anderson_cavi_update`, ``fit_pg_natgrad(acceleration="anderson")``).

The headline ``speed_ratio`` is the faster Adam, min((b), (c)), over plain CAVI (a), what ``fit``
runs by default; ``speed_ratio_anderson`` is the same over (e); the other ratios are recorded
too. Since (a) and (b) cost about the same per step, the ratio is mostly the ratio of step
counts: CAVI converges linearly, and slowly when the data are nearly separable under the kernel
(large variance: the tilts c_n and q(u) are strongly coupled), so the ratio falls as σ² grows;
Anderson mixing cuts the sweeps most there. The results file records each setting rather than
one number.

For each program the number of steps K to reach L* − 1 nat is read off one recorded run (Adam's
trajectory is the same with cached or recomputed features, so (c) runs (b)'s K); then a
jit-compiled ``lax.scan`` of exactly K steps is timed (median of ``--repeats`` calls after
warm-up; the programs take turns, the first one rotating every repeat). OpenBLAS is pinned to one
thread (``--blas-threads``), as in ``svgp_scaling.py``. Results merge into
``benchmarks/results/pg_natgrad.json`` setting by setting (N, M, dtype, ℓ, σ²), each with the
machine load and date of its run; this machine is shared, so read timings next to the load.

    python benchmarks/pg_natgrad.py [--N 3000] [--M 48] [--out PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import threadpoolctl
from numpyro.distributions import biject_to, constraints

ROOT = Path(__file__).resolve().parents[1]

from _common import machine_info, now, write_json  # noqa: E402
from gpzoo.analysis import datasets  # noqa: E402
from gpzoo.inference.inducing import initialise_inducing  # noqa: E402
from gpzoo.inference.pg_natgrad import (  # noqa: E402
    anderson_cavi_update,
    anderson_init,
    features_bound,
    natural_step,
    natural_update,
    pg_bound,
    pg_features,
)
from gpzoo.inference.svgp import SVGP  # noqa: E402
from gpzoo.models import zoo  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "pg_natgrad.json"
TARGET_GAP = 1.0  # nats below the optimum
CONVERGED_NATS = 1e-6  # last CAVI sweep changes the bound by less: the optimum, for a 1-nat target
GOAL_RATIO = 10.0  # issue 5: PG natural gradients ≥ 10× faster than Adam to the same bound
LEARNING_RATES = (0.01, 0.03, 0.1, 0.2, 0.3, 0.5, 1.0)
HYPERPARAMETERS = ((0.5, 4.0), (1.0, 1.0))  # fixed (lengthscale, variance) settings
WARMUP_CALLS = 2
SETTING_KEYS = ("N", "M", "dtype", "lengthscale", "variance")  # a result replaces an earlier one with these equal


# ----------------------------------------------------------------------------- problem
def problem(N: int, M: int, lengthscale: float, variance: float, seed: int = 0):
    """(family, fixed hyperparameters + Z, X, y) for two-moons with N points and M inducing inputs."""
    moons = datasets.load("two-moons", num_train=N, num_test=1, seed=seed)
    spec = zoo.get("svgp-logistic-pg", input_dim=2, num_inducing=M, lengthscale=lengthscale, variance=variance,
                   learn_hyperparameters=False)
    inducing = initialise_inducing(spec.inducing, spec.kernel, moons.X_train, M, jax.random.PRNGKey(seed), "kmeans")
    family = SVGP(spec, inducing, num_latent=1)
    fixed = {"kernel.lengthscale": jnp.asarray(lengthscale), "kernel.variance": jnp.asarray(variance),
             "inducing.Z": jnp.asarray(inducing.Z)}
    return family, fixed, jnp.asarray(moons.X_train), jnp.asarray(moons.y_train, jnp.float64)


def prior_q(M: int):
    return jnp.zeros((1, M)), jnp.eye(M)[None]


# ----------------------------------------------------------------------------- programs
def cavi_program(family, fixed, X, y, recompute: bool = False):
    """scan of K CAVI steps from q: carries (q_mu, q_sqrt), emits the bound before each step.

    The features are computed once at the start of the program, or every step with ``recompute``.
    """
    N, whiten = X.shape[0], family.spec.whiten

    def run(q, num_steps):
        features = None if recompute else pg_features(family, fixed, X)

        def body(q, _):
            if recompute:
                q_mu, q_sqrt, bound = natural_step(family, {**fixed, "q_mu": q[0], "q_sqrt": q[1]}, X, y, N, 1.0)
            else:
                q_mu, q_sqrt, bound = natural_update(features, y, q[0], q[1], scale=1.0, rho=1.0, whiten=whiten)
            return (q_mu, q_sqrt), bound

        return jax.lax.scan(body, q, None, length=num_steps)

    return run


def anderson_program(family, fixed, X, y):
    """scan of K Anderson-accelerated CAVI sweeps from q, features computed once; emits the bound before each sweep."""
    whiten = family.spec.whiten

    def run(q, num_steps):
        features = pg_features(family, fixed, X)

        def body(carry, _):
            q_mu, q_sqrt, memory, bound = anderson_cavi_update(features, y, *carry, whiten=whiten)
            return (q_mu, q_sqrt, memory), bound

        return jax.lax.scan(body, (*q, anderson_init(X.shape[0])), None, length=num_steps)

    return run


def adam_program(family, fixed, X, y, learning_rate: float, recompute: bool = False):
    """scan of K Adam steps on −bound over (q_mu, raw q_sqrt), c profiled; emits the bound before each step.

    The features are computed once at the start of the program, or every step with ``recompute``.
    """
    to_sqrt = biject_to(constraints.lower_cholesky)
    optimizer = optax.adam(learning_rate)
    whiten = family.spec.whiten

    def loss(raw, features):
        q_mu, q_sqrt = raw["q_mu"], to_sqrt(raw["q_sqrt"])
        if recompute:
            return -pg_bound(family, {**fixed, "q_mu": q_mu, "q_sqrt": q_sqrt}, X, y)
        return -features_bound(features, y, q_mu, q_sqrt, whiten=whiten)

    def init(q):
        raw = {"q_mu": q[0], "q_sqrt": to_sqrt.inv(q[1])}
        return raw, optimizer.init(raw)

    def run(state, num_steps):
        features = None if recompute else pg_features(family, fixed, X)

        def body(state, _):
            raw, opt_state = state
            value, grad = jax.value_and_grad(loss)(raw, features)
            updates, opt_state = optimizer.update(grad, opt_state, raw)
            return (optax.apply_updates(raw, updates), opt_state), -value

        return jax.lax.scan(body, state, None, length=num_steps)

    return run, init


def steps_to_target(bounds: np.ndarray, target: float) -> int | None:
    """Number of updates after which the bound is ≥ target (bounds[t] is the value after t updates)."""
    hits = np.flatnonzero(bounds >= target)
    return int(hits[0]) if hits.size else None


def time_scan(run, state, num_steps: int):
    """(compile seconds, a function timing one call) of a jitted scan of exactly ``num_steps`` steps."""
    t0 = time.perf_counter()
    compiled = jax.jit(lambda s: run(s, num_steps)).lower(state).compile()
    compile_s = time.perf_counter() - t0
    for _ in range(WARMUP_CALLS):
        jax.block_until_ready(compiled(state))

    def call():
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(state))
        return time.perf_counter() - t0

    return compile_s, call


def timed(times: list, steps: int, compile_s: float) -> dict:
    seconds = float(np.median(times))
    return {"steps": steps, "seconds": seconds, "seconds_per_step": seconds / steps, "repeats_s": times, "compile_s": compile_s}


# ----------------------------------------------------------------------------- benchmark
def run_benchmark(N: int, M: int, lengthscale: float, variance: float, max_cavi_steps: int, max_adam_steps: int,
                  learning_rates, repeats: int) -> dict:
    family, fixed, X, y = problem(N, M, lengthscale, variance)
    q0 = prior_q(M)
    load_start = list(os.getloadavg())

    # the optimum: CAVI to convergence (bounds[t] = value after t sweeps)
    cavi = jax.jit(cavi_program(family, fixed, X, y), static_argnums=1)
    q_opt, cavi_bounds = cavi(q0, max_cavi_steps)
    cavi_bounds = np.append(np.asarray(cavi_bounds), float(pg_bound(family, {**fixed, "q_mu": q_opt[0], "q_sqrt": q_opt[1]}, X, y)))
    converged = bool(abs(cavi_bounds[-1] - cavi_bounds[-2]) < CONVERGED_NATS)
    optimum = float(cavi_bounds[-1])
    target = optimum - TARGET_GAP
    cavi_steps = steps_to_target(cavi_bounds, target)
    _, anderson_bounds = jax.jit(anderson_program(family, fixed, X, y), static_argnums=1)(q0, max_cavi_steps)
    anderson_bounds = np.asarray(anderson_bounds)
    anderson_steps = steps_to_target(anderson_bounds, target)

    # Adam: one recorded run per learning rate (features computed once; the trajectory does not depend on it)
    adam_runs = {}
    for lr in learning_rates:
        run, init = adam_program(family, fixed, X, y, lr)
        (raw, _), bounds = jax.jit(run, static_argnums=1)(init(q0), max_adam_steps)
        bounds = np.asarray(bounds)
        adam_runs[lr] = {"learning_rate": lr, "steps_to_target": steps_to_target(bounds, target),
                         "final_bound": float(bounds[-1]), "best_gap": float(optimum - np.nanmax(bounds)),
                         "finite": bool(np.all(np.isfinite(bounds)))}
    reached = [r for r in adam_runs.values() if r["steps_to_target"] is not None and r["finite"]]
    best = min(reached, key=lambda r: r["steps_to_target"]) if reached else None

    # timing: scans of exactly the steps each needs, taking turns
    programs = {"cavi": (cavi_program(family, fixed, X, y), q0, cavi_steps),
                "cavi_recomputing": (cavi_program(family, fixed, X, y, recompute=True), q0, cavi_steps),
                "cavi_anderson": (anderson_program(family, fixed, X, y), q0, anderson_steps)}
    if best is not None:
        for name, recompute in (("adam", False), ("adam_recomputing", True)):
            run, init = adam_program(family, fixed, X, y, best["learning_rate"], recompute=recompute)
            programs[name] = (run, init(q0), best["steps_to_target"])
    calls = {name: time_scan(run, state, steps) for name, (run, state, steps) in programs.items()}
    times = {name: [] for name in programs}
    names = list(programs)
    for r in range(repeats):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(calls[name][1]())
    out = {name: timed(times[name], programs[name][2], calls[name][0]) for name in programs}
    out["cavi"]["bounds"] = cavi_bounds[: max(cavi_steps, 1) + 5].tolist()
    out["cavi_anderson"]["bounds"] = anderson_bounds[: max(anderson_steps, 1) + 5].tolist()
    ratios = {}
    if best is not None:
        out["adam"]["learning_rate"] = best["learning_rate"]
        fastest_adam = min(out["adam"]["seconds"], out["adam_recomputing"]["seconds"])
        ratios = {"speed_ratio": fastest_adam / out["cavi"]["seconds"],
                  "speed_ratio_anderson": fastest_adam / out["cavi_anderson"]["seconds"],
                  "speed_ratio_vs_adam_cached": out["adam"]["seconds"] / out["cavi"]["seconds"],
                  "speed_ratio_vs_adam_recomputing": out["adam_recomputing"]["seconds"] / out["cavi"]["seconds"],
                  "step_ratio": best["steps_to_target"] / cavi_steps,
                  "step_ratio_anderson": best["steps_to_target"] / anderson_steps}
    return {
        "N": N, "M": M, "dtype": "float64", "lengthscale": lengthscale, "variance": variance,
        "date": now(), "load_average_start": load_start,
        "load_average_end": list(os.getloadavg()),
        "optimum_bound": optimum, "optimum_converged": converged, "target_gap_nats": TARGET_GAP,
        "cavi": {"steps_to_target": cavi_steps, **out["cavi"]},
        "cavi_recomputing": out["cavi_recomputing"],
        "cavi_anderson": {"steps_to_target": anderson_steps, **out["cavi_anderson"]},
        "adam": None if best is None else {"steps_to_target": best["steps_to_target"], **out["adam"]},
        "adam_recomputing": None if best is None else out["adam_recomputing"],
        "adam_grid": list(adam_runs.values()),
        "max_adam_steps": max_adam_steps,
        "speed_ratio": ratios.get("speed_ratio"),
        **{k: v for k, v in ratios.items() if k != "speed_ratio"},
    }


def merge(out: Path, results: list[dict], header: dict) -> dict:
    """The report at ``out`` with ``results`` replacing those of the same setting (read just before writing)."""
    previous = json.loads(out.read_text()).get("results", []) if out.exists() else []
    key = lambda r: tuple(r.get(k) for k in SETTING_KEYS)  # noqa: E731
    new_keys = {key(r) for r in results}
    merged = [r for r in previous if key(r) not in new_keys and "date" in r] + results  # undated: an older protocol
    merged.sort(key=lambda r: (r["N"], r["M"], -r["variance"], r["lengthscale"]))
    ratios = [r["speed_ratio"] for r in merged]
    accelerated = [r.get("speed_ratio_anderson") for r in merged]
    return {**header, "speed_ratios": ratios, "goal_met": all(r is not None and r >= GOAL_RATIO for r in ratios),
            "speed_ratios_anderson": accelerated,
            "goal_met_anderson": all(r is not None and r >= GOAL_RATIO for r in accelerated), "results": merged}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--N", type=int, default=3000, help="two-moons training points")
    p.add_argument("--M", type=int, default=48, help="inducing inputs (k-means, fixed)")
    p.add_argument("--hyperparameters", type=float, nargs=2, action="append", metavar=("LENGTHSCALE", "VARIANCE"),
                   help=f"fixed kernel setting, repeatable (default {HYPERPARAMETERS})")
    p.add_argument("--max-cavi-steps", type=int, default=200, help="CAVI sweeps for the optimum")
    p.add_argument("--max-adam-steps", type=int, default=5000, help="Adam steps per learning rate before giving up")
    p.add_argument("--learning-rates", type=float, nargs="+", default=list(LEARNING_RATES))
    p.add_argument("--repeats", type=int, default=5, help="timed calls per program after warm-up")
    p.add_argument("--blas-threads", type=int, default=1,
                   help="OpenBLAS threads (0 leaves them as they are); 1: threads on 2 busy cores slowed the Cholesky ~50x")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if min(args.N, args.M, args.max_cavi_steps, args.max_adam_steps, args.repeats) < 1:
        raise SystemExit("--N, --M, --max-cavi-steps, --max-adam-steps and --repeats must be positive")
    t0 = time.perf_counter()
    x64_before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)  # the protocol is float64 (gpzoo takes its dtype from this flag)
    limit = threadpoolctl.threadpool_limits(args.blas_threads, user_api="blas") if args.blas_threads > 0 else contextlib.nullcontext()
    try:
        with limit:
            machine = machine_info()
            results = []
            for lengthscale, variance in args.hyperparameters or HYPERPARAMETERS:
                results.append(run_benchmark(args.N, args.M, lengthscale, variance, args.max_cavi_steps,
                                             args.max_adam_steps, args.learning_rates, args.repeats))
                summary(results[-1])
    finally:
        jax.config.update("jax_enable_x64", x64_before)
    machine["load_average_end"] = list(os.getloadavg())
    header = {
        "benchmark": "pg_natgrad",
        "description": "wall time from the prior q(u) to within 1 nat of the optimum of the Pólya–Gamma bound of a "
                       "logistic SVGP (two-moons, fixed hyperparameters and Z): full-batch CAVI / natural gradient "
                       "(rho=1, features computed once; plain and with Anderson mixing) against optax Adam on the "
                       "same bound (c profiled), best learning rate of a grid, with the features computed once or "
                       "every step; the ratios are over the faster Adam",
        "date": now(),
        "machine": machine,
        "protocol": {"repeats": args.repeats, "warmup_calls": WARMUP_CALLS, "statistic": "median", "compile_excluded": True,
                     "blas_threads": args.blas_threads or "default", "learning_rates": list(args.learning_rates),
                     "order": "the programs take turns, the first one rotating every repeat",
                     "steps": "each program runs exactly the number of steps it needs to reach the target",
                     "dispatch": "each program is one jit-compiled lax.scan over its steps"},
        "goal_ratio": GOAL_RATIO,
        "wall_s": time.perf_counter() - t0,
    }
    report = merge(args.out, results, header)
    write_json(args.out, report)
    print(f"speed ratios {report['speed_ratios']}, with Anderson mixing {report['speed_ratios_anderson']} "
          f"(goal {GOAL_RATIO}x); wrote {args.out}")
    return report


def summary(r: dict) -> None:
    c, a = r["cavi"], r["adam"]
    print(f"N={r['N']} M={r['M']} lengthscale={r['lengthscale']} variance={r['variance']}: "
          f"optimum {r['optimum_bound']:.3f} (converged {r['optimum_converged']}); load {r['load_average_start']}")
    print(f"  CAVI: {c['steps_to_target']} steps, {1e3 * c['seconds']:.2f} ms "
          f"(recomputing the features every step: {1e3 * r['cavi_recomputing']['seconds']:.2f} ms)")
    print(f"  CAVI + Anderson: {r['cavi_anderson']['steps_to_target']} steps, {1e3 * r['cavi_anderson']['seconds']:.2f} ms")
    if a is None:
        print(f"  Adam: did not reach the target within {r['max_adam_steps']} steps at any learning rate")
    else:
        print(f"  Adam (lr {a['learning_rate']}): {a['steps_to_target']} steps, {1e3 * a['seconds']:.2f} ms "
              f"(recomputing: {1e3 * r['adam_recomputing']['seconds']:.2f} ms); ratio {r['speed_ratio']:.1f}x, "
              f"with Anderson {r['speed_ratio_anderson']:.1f}x", flush=True)


if __name__ == "__main__":
    main()
