"""A ``gpzoo.compare`` grid on the sequential backend against the Ray backend with 2 workers.

Setting: rectangles (``--num-train`` training images), models ``svgp-rbf`` and ``conv`` × seeds
0 and 1 (four fits of ``--steps`` Adam steps, B = 50, M = 16, float32), no report (the report
phase runs in the calling process on either backend; only the fits are distributed). Timed,
interleaved run by run (sequential, Ray, sequential without the compilation cache, ...; medians
over ``--repeats``): the wall time of the whole ``gpzoo.compare`` call and, apart, Ray's start
(``ray.init`` with 2 CPUs) and stop (``ray.shutdown``) around it.

* ``speedup`` = sequential wall / (Ray wall + Ray start and stop) (goal ≥ 1.7 with 2 workers on 2 cores);
* ``overhead_per_task_s``: what each Ray task costs beyond its own work. Over the fitting phase of
  the Ray run (``Comparison.fit_seconds``: from the dispatch of the first task until every saved
  fit is read back), the worker slots' time not spent running a task, per task: (workers ×
  fitting phase − Σ each task's run on its actor, fit and save, as ``ray.timeline()`` records it)
  / tasks. It holds the actors' start (process, imports), argument transfer, scheduling, reading
  each result back and any slot left idle. Ray's start and stop are reported apart
  (``ray_start_s``, ``ray_stop_s``). Goal < 1 s. The sequential run's counterpart, (fitting phase −
  Σ fit-and-save time of each task) / tasks, is ``sequential_overhead_per_task_s`` (reading the
  results back); ``actor_slot_time_s`` splits the Ray figure, per repeat (summed over actors,
  times from the start of the ``gpzoo.compare`` call): ``start`` until each actor's first task
  (data preparation, actor start, imports), ``gaps`` between one actor's tasks and ``end`` (an
  actor left without a task while another finishes);
* ``overhead_per_task_old_formula_s`` = (Ray wall + start and stop − sequential wall / workers) ×
  workers / tasks: each task's cost beyond a perfect split of the sequential run, the figure
  reported before the fitting-phase definition; it also counts that two fits at once on 2 cores
  run slower than one (a fit alone uses about 1.4 cores);
* ``compile_cache_gain``: sequential wall without / with the run's compilation cache (every
  backend fits through it: a model's second seed reads its programs back instead of compiling);
* ``identical``: every parameter and ELBO trace of every fit equal, bit for bit, across backends
  and with and without the cache;
* ``ceiling`` (``--ceiling``): the most any backend could gain from running the grid's fits side by
  side, one core each. Each fit runs once in a fresh process with every core and once in a process
  pinned to one core (``os.sched_setaffinity`` before JAX starts, so XLA's thread pool has one
  thread); ``ceiling.speedup`` = Σ fit seconds with every core / (Σ fit seconds on one core /
  workers): the fits' work one after another on every core against a perfectly balanced split over
  ``workers`` single-core workers with no overhead at all. When a fit alone already keeps several
  cores busy (XLA's intra-op threads), this ceiling is below ``workers``. (The grid's other per-task
  work, saving and checkpoints, splits too, so a measured speed-up can land a little above it.)

The machine is shared: the load average at the start and end of the run is recorded beside the numbers.

    .venv/bin/python benchmarks/ray_speedup.py [--repeats 2] [--steps 150] [--quick] [--ceiling]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from _common import machine_info, now, write_json

OUT = Path(__file__).parent / "results" / "ray_speedup.json"
MODELS = ("svgp-rbf", "conv")
SEEDS = (0, 1)
WORKERS = 2
VARIANTS = ("sequential", "ray", "sequential_no_cache")
#: every fit of the grid: minibatch, inducing patches, test images
BATCH_SIZE, NUM_INDUCING, NUM_TEST = 50, 16, 50


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


def _fit_seconds(comparison) -> dict[str, float]:
    return {f"{m} seed {s}": float(comparison.results[m, s].diagnostics["seconds"]) for m in MODELS for s in SEEDS}


def _slot_time(run_events: list[dict], epoch: float) -> dict:
    """Where the actors' time outside their task runs went, summed over actors (``ray.timeline()``
    events, times from ``epoch``, the start of the ``gpzoo.compare`` call): ``start`` until each
    actor's first run (data preparation, actor start, imports), ``gaps`` between consecutive runs
    on one actor (dispatch, argument transfer) and ``end`` from each actor's last run to the last
    run's end anywhere (no task left for it)."""
    runs: dict[str, list[tuple[float, float]]] = {}
    for e in run_events:
        begin = e["ts"] / 1e6 - epoch
        runs.setdefault(e["tid"], []).append((begin, begin + e["dur"] / 1e6))
    last = max(end for spans in runs.values() for _, end in spans)
    spans = [sorted(v) for v in runs.values()]
    return {"first_run_s": sorted(v[0][0] for v in spans), "start": sum(v[0][0] for v in spans),
            "gaps": sum(b[0] - a[1] for v in spans for a, b in zip(v, v[1:])), "end": sum(last - v[-1][1] for v in spans)}


def _one_fit(model: str, seed: int, steps: int, num_train: int, one_core: bool) -> float:
    """Seconds of one ``fit`` of the grid's (model, seed) in this process (``--one-fit``); with ``one_core``
    the process is pinned to its first allowed core before JAX starts."""
    if one_core:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    from gpzoo.analysis import datasets  # noqa: PLC0415 - JAX starts here, after the pinning
    from gpzoo.inference import fit  # noqa: PLC0415
    from gpzoo.models import zoo  # noqa: PLC0415

    data = datasets.load("rectangles", num_train=num_train, num_test=NUM_TEST)
    spec = zoo.get(model, input_dim=data.num_features, task="binary", num_classes=2, image_shape=data.image_shape,
                   num_inducing=NUM_INDUCING)
    t0 = time.perf_counter()
    fit(spec, data.X_train, data.y_train, steps=steps, batch_size=BATCH_SIZE, seed=seed, progress=False)
    return time.perf_counter() - t0


def _ceiling(steps: int, num_train: int) -> dict:
    """Each fit of the grid in a fresh process with every core, then pinned to one core (see ``ceiling``)."""
    seconds = {"all_cores": {}, "one_core": {}}
    for model in MODELS:
        for seed in SEEDS:
            for where in seconds:
                cmd = [sys.executable, __file__, "--one-fit", model, str(seed), str(steps), str(num_train)]
                if where == "one_core":
                    cmd.append("--one-core")
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                seconds[where][f"{model} seed {seed}"] = json.loads(out.strip().splitlines()[-1])["seconds"]
    total = {where: sum(values.values()) for where, values in seconds.items()}
    return {"fit_seconds": seconds, "total_s": total, "cores": len(os.sched_getaffinity(0)),
            "speedup": total["all_cores"] / (total["one_core"] / WORKERS),
            "second_core_gain": total["one_core"] / total["all_cores"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--num-train", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 repeat, 10 steps, 60 images")
    parser.add_argument("--ceiling", action="store_true", help="also time each fit alone on every core and on one core")
    parser.add_argument("--one-fit", nargs=4, metavar=("MODEL", "SEED", "STEPS", "NUM_TRAIN"), help=argparse.SUPPRESS)
    parser.add_argument("--one-core", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.one_fit:
        model, seed, steps, num_train = args.one_fit
        print(json.dumps({"seconds": _one_fit(model, int(seed), int(steps), int(num_train), args.one_core)}))
        return 0
    if args.quick:
        args.repeats, args.steps, args.num_train = 1, 10, 60

    import jax  # noqa: PLC0415
    import ray  # noqa: PLC0415 - the optional extra this benchmark is about

    import gpzoo  # noqa: PLC0415

    from gpzoo.analysis import backends  # noqa: PLC0415

    task_seconds = []  # each sequential task's fit and save, timed around the backend's fit_task
    fit_task = backends.fit_task

    def timed_fit_task(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fit_task(*args, **kwargs)
        finally:
            task_seconds.append(time.perf_counter() - t0)

    backends.fit_task = timed_fit_task
    machine = machine_info()
    settings = {"seeds": list(SEEDS), "steps": args.steps, "batch_size": BATCH_SIZE, "num_inducing": NUM_INDUCING,
                "num_train": args.num_train, "num_test": NUM_TEST, "report": False}
    walls = {name: [] for name in VARIANTS}
    phases = {name: [] for name in VARIANTS}  # Comparison.fit_seconds: dispatch to every fit read back
    fit_sums = {name: [] for name in VARIANTS}  # Σ each task's fit and save (Ray: its actor's run, from ray.timeline)
    slot_times = []
    starts, stops = [], []
    runs = {}
    for _ in range(args.repeats):
        for variant in VARIANTS:
            extra = {"backend": "ray", "cpus_per_fit": 1} if variant == "ray" else {}
            if variant == "ray":  # started here so that it has exactly WORKERS CPUs (the backend leaves it running)
                t0 = time.perf_counter()
                ray.init(num_cpus=WORKERS, include_dashboard=False, log_to_driver=False, configure_logging=False)
                starts.append(time.perf_counter() - t0)
            jax.config.update("jax_enable_compilation_cache", variant != "sequential_no_cache")
            task_seconds.clear()
            epoch, t0 = time.time(), time.perf_counter()
            try:
                runs[variant] = gpzoo.compare("rectangles", list(MODELS), **settings, **extra)
                walls[variant].append(time.perf_counter() - t0)
                if variant == "ray":
                    time.sleep(2.0)  # the workers report their task events to Ray's control store about once a second
                    events = [e for e in ray.timeline() if e.get("ph") == "X"]
                    run_events = [e for e in events if e.get("cat") == "task::FitActor.run"]
                    if len(run_events) != len(MODELS) * len(SEEDS):
                        raise RuntimeError(f"ray.timeline() holds {len(run_events)} task runs")
                    task_seconds.extend(e["dur"] / 1e6 for e in run_events)
                    slot_times.append(_slot_time(run_events, epoch))
            finally:
                jax.config.update("jax_enable_compilation_cache", True)
                if variant == "ray":
                    t1 = time.perf_counter()
                    ray.shutdown()
                    stops.append(time.perf_counter() - t1)
            phases[variant].append(runs[variant].fit_seconds)
            fit_sums[variant].append(sum(task_seconds))

    tasks = len(MODELS) * len(SEEDS)
    median = {name: statistics.median(values) for name, values in walls.items()}
    start_s, stop_s = statistics.median(starts), statistics.median(stops)
    seq, par = median["sequential"], median["ray"] + start_s + stop_s
    speedup = seq / par
    slot_idle = [(WORKERS * p - f) / tasks for p, f in zip(phases["ray"], fit_sums["ray"])]
    seq_idle = [(p - f) / tasks for p, f in zip(phases["sequential"], fit_sums["sequential"])]
    overhead = statistics.median(slot_idle)
    old = (par - seq / WORKERS) * WORKERS / tasks
    report = {
        "date": now(),
        "machine": machine,
        "load_average_end": list(os.getloadavg()),
        "setting": {"data": "rectangles", "models": list(MODELS), "seeds": list(SEEDS), "workers": WORKERS, "tasks": tasks,
                    "steps": args.steps, "batch_size": BATCH_SIZE, "num_inducing": NUM_INDUCING, "num_train": args.num_train,
                    "dtype": "float32", "repeats": args.repeats, "quick": args.quick},
        "wall_s": {**walls, "ray_start": starts, "ray_stop": stops},
        "fitting_phase_s": phases,
        "sum_of_task_seconds": fit_sums,
        "median_wall_s": {"sequential": seq, "ray": median["ray"], "ray_with_start": par,
                          "sequential_no_cache": median["sequential_no_cache"]},
        "actor_slot_time_s": slot_times,
        "ray_start_s": start_s,
        "ray_stop_s": stop_s,
        "training_loop_seconds": {variant: _fit_seconds(runs[variant]) for variant in VARIANTS},
        "speedup": speedup,
        "speedup_without_ray_start": seq / median["ray"],
        "overhead_per_task_s": overhead,
        "overhead_per_task_runs_s": slot_idle,
        "sequential_overhead_per_task_s": statistics.median(seq_idle),
        "overhead_per_task_old_formula_s": old,
        "compile_cache_gain": median["sequential_no_cache"] / seq,
        "identical": _identical(runs["sequential"], runs["ray"]) and _identical(runs["sequential"], runs["sequential_no_cache"]),
        "goals": {"speedup >= 1.7": speedup >= 1.7, "overhead per task < 1 s": overhead < 1.0},
    }
    if args.ceiling:
        report["ceiling"] = _ceiling(args.steps, args.num_train)
        report["load_average_end"] = list(os.getloadavg())
    write_json(args.out, report)
    print(f"sequential {seq:.1f} s (no cache {median['sequential_no_cache']:.1f} s), ray {median['ray']:.1f} s + start "
          f"{start_s:.1f} s + stop {stop_s:.1f} s: speed-up {speedup:.2f}x ({seq / median['ray']:.2f}x without start/stop), "
          f"overhead {overhead:.2f} s/task (old formula {old:.2f}), identical {report['identical']}, "
          f"load {report['machine']['load_average_start']} -> {report['load_average_end']}")
    if args.ceiling:
        c = report["ceiling"]
        print(f"ceiling: all cores {c['total_s']['all_cores']:.1f} s, one core {c['total_s']['one_core']:.1f} s: at most "
              f"{c['speedup']:.2f}x with {WORKERS} single-core workers")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
