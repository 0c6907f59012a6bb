"""A ``gpzoo.compare`` grid on the sequential backend against the Ray backend with 2 workers.

Setting: rectangles (``--num-train`` training images), models ``svgp-rbf`` and ``conv`` × seeds
0 and 1 (four fits of ``--steps`` Adam steps, B = 50, M = 16, float32), no report (the report
phase runs in the calling process on either backend; only the fits are distributed). Timed,
interleaved run by run (sequential, Ray, sequential, Ray, ...; medians over ``--repeats``), the
wall time of the whole ``gpzoo.compare`` call, Ray's start and stop included:

* ``speedup`` = sequential wall / Ray wall (goal ≥ 1.7 with 2 workers on 2 cores);
* ``overhead_per_task_s`` = (Ray wall − sequential wall / workers) × workers / tasks: what each
  task costs beyond a perfect split of the sequential run (a worker's imports, Ray's scheduling,
  the object store, saving and loading the result; goal < 1 s);
* ``identical``: every parameter and ELBO trace of every fit equal, bit for bit, across backends.

The machine is shared: the load average at the start and end of the run is recorded beside the numbers.

    /work/venv/bin/python benchmarks/ray_speedup.py [--repeats 2] [--steps 150] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

from _common import machine_info, now, write_json

OUT = Path(__file__).parent / "results" / "ray_speedup.json"
MODELS = ("svgp-rbf", "conv")
SEEDS = (0, 1)
WORKERS = 2


def _identical(a, b) -> bool:
    if sorted(a.results) != sorted(b.results):
        return False
    for key, res in a.results.items():
        other = b.results[key]
        if sorted(res.params) != sorted(other.params) or not np.array_equal(res.objective_history, other.objective_history):
            return False
        if not all(np.array_equal(v, other.params[k]) for k, v in res.params.items()):
            return False
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--num-train", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 repeat, 10 steps, 60 images")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.steps, args.num_train = 1, 10, 60

    import ray  # noqa: PLC0415 - the optional extra this benchmark is about

    import gpzoo  # noqa: PLC0415

    machine = machine_info()
    settings = {"seeds": list(SEEDS), "steps": args.steps, "batch_size": 50, "num_inducing": 16, "num_train": args.num_train,
                "num_test": 50, "report": False}
    walls = {"sequential": [], "ray": []}
    last = {}
    for _ in range(args.repeats):
        for backend in ("sequential", "ray"):
            extra = {"backend": "ray", "cpus_per_fit": 1} if backend == "ray" else {}
            if backend == "ray":
                ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False, configure_logging=False)
            t0 = time.perf_counter()
            try:
                last[backend] = gpzoo.compare("rectangles", list(MODELS), **settings, **extra)
            finally:
                if backend == "ray":
                    ray.shutdown()
            walls[backend].append(time.perf_counter() - t0)
    # the Ray instance is started outside the timed call so that it has exactly WORKERS CPUs; its start is timed apart
    t0 = time.perf_counter()
    ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.shutdown()
    ray_start_stop_s = time.perf_counter() - t0

    seq, par = statistics.median(walls["sequential"]), statistics.median(walls["ray"]) + ray_start_stop_s
    tasks = len(MODELS) * len(SEEDS)
    speedup = seq / par
    overhead = (par - seq / WORKERS) * WORKERS / tasks
    fit_seconds = {f"{m} seed {s}": float(last["sequential"].results[m, s].diagnostics["seconds"]) for m in MODELS for s in SEEDS}
    report = {
        "date": now(),
        "machine": machine,
        "load_average_end": list(os.getloadavg()),
        "setting": {"data": "rectangles", "models": list(MODELS), "seeds": list(SEEDS), "workers": WORKERS, "tasks": tasks,
                    "steps": args.steps, "batch_size": 50, "num_inducing": 16, "num_train": args.num_train,
                    "dtype": "float32", "repeats": args.repeats, "quick": args.quick},
        "wall_s": {"sequential": walls["sequential"], "ray": walls["ray"], "ray_start_stop": ray_start_stop_s},
        "median_wall_s": {"sequential": seq, "ray_with_start": par},
        "sequential_fit_seconds": fit_seconds,
        "speedup": speedup,
        "overhead_per_task_s": overhead,
        "identical": _identical(last["sequential"], last["ray"]),
        "goals": {"speedup >= 1.7": speedup >= 1.7, "overhead per task < 1 s": overhead < 1.0},
    }
    write_json(args.out, report)
    print(f"sequential {seq:.1f} s, ray {par:.1f} s: speed-up {speedup:.2f}x, overhead {overhead:.2f} s/task, "
          f"identical {report['identical']}, load {report['machine']['load_average_start']} -> {report['load_average_end']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
