"""Throughput of exact PG(1, c) sampling: ``PolyaGamma(1, c).sample`` against ``polyagamma``.

For each c in {0, 1, 5, 20}: draws per second of 1e5 PG(1, c) draws from a jit-compiled,
vectorised ``PolyaGamma(1.0, c).sample(key, (100_000,))`` (c a traced argument; compilation and a
warm-up call excluded; float64, as the reference) and from ``polyagamma.random_polyagamma(1, c,
size=100_000)`` (its default method for h = 1, Devroye's; C, single-threaded). The two are
measured in the same run, interleaved call by call so that the load of a shared machine falls on
both alike; each figure is the median over ``--repeats`` (default 5) calls, as wall-clock draws/s
and as process-CPU draws/s (all threads: XLA may use several, the reference uses one).
``ratio`` = ours / theirs (wall); ``cpu_ratio`` likewise from CPU time. Goal: ratio ≥ 1/3.

Writes ``benchmarks/results/polya_gamma_throughput.json``.

    python benchmarks/polya_gamma_throughput.py [--repeats 5] [--draws 100000] [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import polyagamma  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

from _common import now, write_json  # noqa: E402

from gpzoo.inference.polya_gamma import PolyaGamma  # noqa: E402

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "polya_gamma_throughput.json"
C_VALUES = (0.0, 1.0, 5.0, 20.0)


def _timed(fn):
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start_wall, time.process_time() - start_cpu


def measure(c: float, num_draws: int, repeats: int, seed: int) -> dict:
    """Median wall/CPU seconds of ours and the reference for one c, interleaved call by call."""
    sample = jax.jit(lambda key, c: PolyaGamma(1.0, c).sample(key, (num_draws,)))
    c_arg = jnp.asarray(c, jnp.float64)
    rng = np.random.default_rng(seed)
    keys = jax.random.split(jax.random.key(seed), repeats + 1)
    jax.block_until_ready(sample(keys[0], c_arg))  # compile + warm up
    polyagamma.random_polyagamma(1.0, c, size=num_draws, random_state=rng)
    ours_wall, ours_cpu, ref_wall, ref_cpu = [], [], [], []
    last = None
    for i in range(repeats):
        def ours(key=keys[i + 1]):
            nonlocal last
            last = jax.block_until_ready(sample(key, c_arg))

        w, p = _timed(ours)
        ours_wall.append(w)
        ours_cpu.append(p)
        w, p = _timed(lambda: polyagamma.random_polyagamma(1.0, c, size=num_draws, random_state=rng))
        ref_wall.append(w)
        ref_cpu.append(p)
    draws = np.asarray(last)
    exact_mean = float(PolyaGamma(1.0, c).mean)
    exact_sd = float(np.sqrt(PolyaGamma(1.0, c).variance))
    ours_rate = num_draws / float(np.median(ours_wall))
    ref_rate = num_draws / float(np.median(ref_wall))
    ours_cpu_rate = num_draws / float(np.median(ours_cpu))
    ref_cpu_rate = num_draws / float(np.median(ref_cpu))
    return {
        "c": c,
        "ours_draws_per_s": ours_rate,
        "polyagamma_draws_per_s": ref_rate,
        "ratio": ours_rate / ref_rate,
        "ours_cpu_draws_per_s": ours_cpu_rate,
        "polyagamma_cpu_draws_per_s": ref_cpu_rate,
        "cpu_ratio": ours_cpu_rate / ref_cpu_rate,
        "ours_wall_s": ours_wall,
        "polyagamma_wall_s": ref_wall,
        # sanity: the timed draws are PG(1, c) draws (mean within a few standard errors)
        "sample_mean_z": (float(draws.mean()) - exact_mean) / (exact_sd / np.sqrt(num_draws)),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--draws", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)

    cases = [measure(c, args.draws, args.repeats, args.seed) for c in C_VALUES]
    report = {
        "benchmark": "polya_gamma_throughput",
        "date": now(),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "description": "PG(1, c) draws per second, jit-compiled PolyaGamma.sample vs polyagamma.random_polyagamma",
        "num_draws": args.draws,
        "repeats": args.repeats,
        "statistic": "median over repeats, compile and warm-up excluded, interleaved",
        "dtype": "float64",
        "goal_ratio": 1.0 / 3.0,
        "min_ratio": min(case["ratio"] for case in cases),
        "cases": cases,
        "environment": {
            "python": platform.python_version(),
            "jax": jax.__version__,
            "polyagamma": polyagamma.__version__,
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "load_average_1min": os.getloadavg()[0],
            "device": str(jax.devices()[0]),
        },
    }
    write_json(args.out, report)
    for case in cases:
        print(
            f"c={case['c']:>4}: ours {case['ours_draws_per_s'] / 1e6:6.2f} M/s, polyagamma "
            f"{case['polyagamma_draws_per_s'] / 1e6:6.2f} M/s, ratio {case['ratio']:.2f} (cpu {case['cpu_ratio']:.2f})"
        )
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
