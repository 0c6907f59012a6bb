"""One conv model's training step on 1 device against the same step split across 2 devices.

Setting: zoo model ``conv`` on rectangles (28×28, 3×3 patches, M = 16 inducing patches, Bernoulli),
global minibatch B = ``--batch-size`` rows, float32, Adam. The programs are the ones ``fit`` runs:
each is the :class:`~gpzoo.inference.runner.ChunkProgram` that ``fit(spec, X, y, batch_size=B,
devices=...)`` hands to the chunk runner (captured from a 0-step fit), compiled as the runner
compiles it, a ``lax.scan`` of ``--steps`` updates, each followed by the finiteness and jitter
checks, on fit's own minibatch schedule. Three programs:

* ``1 device``: ``devices=None``;
* ``2 devices``: ``devices=2``, the step ``fit`` uses (``DataParallel.svi_update``: ``jax.shard_map``
  of the minibatch ELBO over the rows, one ``pmean`` of the value and gradients, the Adam update
  replicated);
* ``2 devices, sharding constraint``: ``devices=2`` with the step ``fit`` keeps for families whose
  data term draws random numbers per data point (a sharding constraint on the rows inside the
  single-device program; the conv model does not need it, it is forced here for comparison).

Timed interleaved call by call (medians over ``--repeats`` calls; compilation and a warm-up call
excluded), as wall-clock time per step, with this process's CPU time per step alongside.

* ``ratio`` = 2-device step / 1-device step (goal ≤ 0.65), ``ratio_sharding_constraint`` likewise;
* ``cpu_step_s``: CPU time per step (all threads), ``cores_busy`` = CPU / wall, ``cpu_ratio`` =
  2-device CPU / 1-device CPU, ``thread_cpu_step_s``: CPU per step of each thread
  (``/proc/self/task/*/stat`` fields 14-15);
* ``cores_needed_for_goal`` = 2-device CPU per step / (0.65 × 1-device step): the cores the 2-device
  program would have to keep busy to meet the goal (its wall time is at least its CPU time over the
  cores it keeps busy);
* ``collectives``: the all-gathers / all-reduces / ... (count, elements, result shapes) of each
  compiled 2-device program's HLO;
* equality (the goal): ``elbo_grad_max_rel_diff`` / ``elbo_grad_max_rel_diff_float64``, the ELBO and
  gradient of the first minibatch at the initial parameters, ``DataParallel.value_and_grad`` against
  one device, in float32 / float64;
* the parameters after the same ``--steps`` Adam updates of the 1-device and the 2-device program,
  ``max_rel_diff`` (float32) and ``max_rel_diff_float64`` (the programs built in float64), next to
  the control ``max_rel_diff_rows_permuted`` / ``max_rel_diff_float64_rows_permuted``: the 1-device
  program on the same minibatches with their rows in another order, which changes only the order of
  summation. Adam divides by sqrt(v): the inducing patches' gradient at the start
  (``inducing_gradient_max_abs``) is ~1e-15 in float64, zero up to rounding, and ~1e-6 of rounding
  noise in float32, so their steps, of up to the learning rate, follow the rounding: in float64 the
  2-device drift is of the row-reordering control's size; in float32 the split regroups the sums
  that make the noise (reordering the rows on one device does not), so the patches take different
  noise-driven steps, as they would under any other regrouping of the same sums.

On a CPU the devices are forced host devices (``XLA_FLAGS=--xla_force_host_platform_device_count=2``,
set here before JAX is imported); on a GPU machine with one GPU only the 1-device step is timed
and recorded with the device name. The machine's load average at the start and end is recorded,
and ``note`` states, from this run's numbers, why the goal is or is not met.

    .venv/bin/python benchmarks/data_parallel_step.py [--repeats 7] [--steps 10] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import time
from pathlib import Path
from unittest import mock

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from _common import machine_info, now, write_json  # noqa: E402

OUT = Path(__file__).parent / "results" / "data_parallel_step.json"
ONE, TWO, CONSTRAINT = "1 device", "2 devices", "2 devices, sharding constraint"
GOAL = 0.65
COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")


def _thread_ticks() -> dict:
    """CPU ticks (user + system, fields 14-15 of ``/proc/self/task/<tid>/stat``) of each thread of this process."""
    ticks = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # fields 3.. after "pid (comm)"
        ticks[f"{stat[stat.index('(') + 1:stat.rindex(')')]}:{tid}"] = int(fields[11]) + int(fields[12])
    return ticks


def _collectives(hlo: str, op: str) -> dict:
    """The ``op`` instructions of a compiled program's HLO text: how many, the element count of their
    results (a tuple's elements summed) and their result shapes."""
    results = re.findall(rf"^\s*(?:ROOT )?%\S+ = (.+?) {op}(?:-start)?\(", hlo, flags=re.M)
    shapes = [re.sub(r"\{[^}]*\}", "", r) for r in results]
    elements = sum(int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
                   for r in shapes for dims in re.findall(r"[a-z]+\d*\[([\d,]*)\]", r))
    return {"count": len(results), "elements": elements, "shapes": shapes}


def _rel(a, b) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b)) / max(1.0, float(np.max(np.abs(a)))))


def fit_program(spec, X, y, batch_size: int, devices, sharding_constraint: bool = False):
    """``(program, state, result)``: the ChunkProgram and initial state that ``fit(spec, X, y,
    batch_size=batch_size, devices=devices)`` runs, captured from a 0-step fit (``sharding_constraint``:
    with the step fit keeps for families with per-point random draws)."""
    import gpzoo  # noqa: PLC0415
    from gpzoo.inference import runner, svi  # noqa: PLC0415

    captured, run_chunks = {}, runner.run_chunks

    def capture(program, state, **kwargs):
        captured.update(program=program, state=state)
        return run_chunks(program, state, **kwargs)

    forced = mock.patch.object(svi, "per_point_draws", lambda family: True) if sharding_constraint else contextlib.nullcontext()
    with mock.patch.object(runner, "run_chunks", capture), forced:
        res = gpzoo.fit(spec, X, y, steps=0, batch_size=batch_size, progress=False, devices=devices)
    return captured["program"], captured["state"], res


def chunk_of(program, steps: int):
    """``(compiled-able function, its arguments)``: ``steps`` updates of ``program`` as the chunk runner
    runs them (``lax.scan``; after each update the objective, whether the state is finite, and the jitter)."""
    inputs = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *[program.step_inputs(s) for s in range(steps)])

    def run(state, inputs, constants):
        def body(state, step_inputs):
            new_state, objective = program.update(state, step_inputs, constants)
            finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(new_state)
                                        if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]))
            return new_state, (objective, finite, program.jitter_of(new_state))

        return jax.lax.scan(body, state, inputs)

    return jax.jit(run), (inputs, program.constants)


def note_for(report: dict) -> str:
    """Why the goal is or is not met, in this run's numbers."""
    cpu, busy = report["cpu_step_s"], report["cores_busy"]
    cores, load = report["machine"]["cpus_usable"], report["machine"]["load_average_start"][0]
    threads = {name: sum(t > 0.05 * cpu[name] for t in report["thread_cpu_step_s"][name].values()) for name in (ONE, TWO)}
    gathers = report["collectives"][CONSTRAINT]["all-gather"]
    text = (f"The 2-device step is the one fit uses: shard_map of the per-shard ELBO with one all-reduce of "
            f"{report['collectives'][TWO]['all-reduce']['elements']} floats and no all-gather (the sharding-constraint step "
            f"all-gathers {gathers['count']} arrays, {gathers['elements']} elements, per step: {report['ratio_sharding_constraint']:.2f}× "
            f"the 1-device step, {report['cpu_ratio_sharding_constraint']:.2f}× its CPU). "
            f"Goal {'met' if report['ratio'] <= GOAL else 'not met'} on this {cores}-core machine: 2-device / 1-device "
            f"{report['ratio']:.2f}. Splitting the batch removes no work: the 2-device program does {report['cpu_ratio']:.2f}× "
            f"the 1-device CPU per step ({1e3 * cpu[TWO]:.1f} against {1e3 * cpu[ONE]:.1f} ms); it can only be faster by "
            f"keeping more cores busy. The 1-device step ran on {threads[ONE]} thread(s) (the caller and XLA's intra-op pool) and "
            f"kept {busy[ONE]:.2f} cores busy; the 2-device step ({threads[TWO]} thread(s)) kept "
            f"{busy[TWO]:.2f}. To reach {GOAL} it would have to keep {report['cores_needed_for_goal']:.2f} cores busy")
    if report["ratio"] <= GOAL:
        return text + "."
    if report["cores_needed_for_goal"] > cores:
        return text + f", more than the {cores} this machine has: out of reach here whatever the load."
    text += (f" while the 1-device step, run in the same conditions, kept {busy[ONE]:.2f}: with the machine's other "
             f"work (load average {load:.1f} on {cores} cores) neither program gets both cores")
    if threads[ONE] > 1:
        text += (", and with both cores free the 1-device step's intra-op threads can use them too, so two devices on the "
                 f"same cores cannot be 1 / {GOAL} times faster")
    return text + "; the gain needs devices with their own compute (GPUs, hosts)."


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
    devices = jax.devices()
    two = len(devices) >= 2
    builds = {ONE: fit_program(spec, X, y, B, None)}
    if two:
        builds[TWO] = fit_program(spec, X, y, B, 2)
        builds[CONSTRAINT] = fit_program(spec, X, y, B, 2, sharding_constraint=True)
        steps_used = {name: b[2].diagnostics["data_parallel_step"] for name, b in builds.items() if name != ONE}
        assert steps_used == {TWO: "shard_map", CONSTRAINT: "sharding constraint"}, steps_used
    compiled, calls, finals = {}, {}, {}
    for name, (program, state, _) in builds.items():
        run, (inputs, constants) = chunk_of(program, K)
        compiled[name] = run.lower(state, inputs, constants).compile()
        calls[name] = (state, inputs, constants)
        finals[name] = jax.block_until_ready(compiled[name](*calls[name]))  # warm-up
    times, cpu = {name: [] for name in builds}, {name: [] for name in builds}
    thread_s = {name: {} for name in builds}  # per thread: CPU seconds per step, summed over the repeats
    tick = os.sysconf("SC_CLK_TCK")
    for _ in range(args.repeats):
        for name in builds:
            before = _thread_ticks()
            c0, t0 = time.process_time(), time.perf_counter()
            jax.block_until_ready(compiled[name](*calls[name]))
            times[name].append((time.perf_counter() - t0) / K)
            cpu[name].append((time.process_time() - c0) / K)
            for thread, t in _thread_ticks().items():
                thread_s[name][thread] = thread_s[name].get(thread, 0.0) + (t - before.get(thread, 0)) / tick / K
    step = {name: statistics.median(t) for name, t in times.items()}
    cpu_step = {name: statistics.median(t) for name, t in cpu.items()}
    report = {
        "date": now(),
        "machine": machine,
        "load_average_end": list(os.getloadavg()),
        "setting": {"model": "conv", "data": "rectangles", "image_shape": list(ds.image_shape), "patch_shape": [3, 3], "M": 16,
                    "B": B, "N": N, "steps_per_call": K, "repeats": args.repeats, "dtype": str(X.dtype), "optimizer": "adam(0.01)",
                    "quick": args.quick},
        "device": str(devices[0].device_kind),
        "step_s": step,
        "cpu_step_s": cpu_step,
        "cores_busy": {name: cpu_step[name] / step[name] for name in step},
        "thread_cpu_step_s": {name: {th: t / args.repeats for th, t in sorted(ts.items(), key=lambda kv: -kv[1]) if t > 0}
                              for name, ts in thread_s.items()},
        "repeats_s": times,
    }
    if two:
        program, state, res = builds[ONE]
        params = {name: b[0].params_of(finals[name][0]) for name, b in builds.items()}
        diff = max(_rel(params[ONE][k], params[TWO][k]) for k in params[ONE])
        diff_constraint = max(_rel(params[ONE][k], params[CONSTRAINT][k]) for k in params[ONE])
        family, p0 = res.family, program.params_of(state)
        X0, y0 = jnp.asarray(X[program.step_inputs(0)]), jnp.asarray(y[program.step_inputs(0)], jnp.float32)

        def loss0(params, Xb, yb):  # the ELBO and its gradient at the initial parameters, on the first minibatch
            return FastELBO().loss(jax.random.PRNGKey(0), params, family.model, family.guide, Xb, yb, num_data=N)

        parallel = DataParallel(tuple(devices[:2]))
        single = jax.jit(jax.value_and_grad(loss0))(p0, X0, y0)
        split = jax.jit(parallel.value_and_grad(loss0))(parallel.replicate(p0), X0, y0)
        grad_diff = max([_rel(single[0], split[0])] + [_rel(single[1][k], split[1][k]) for k in single[1]])
        z_grad = float(np.max(np.abs(np.asarray(single[1]["inducing.Z"]))))

        # the control: the same 1-device program with each minibatch's rows in another order (summation order only)
        perm = np.random.default_rng(0).permutation(B)
        inputs, constants = calls[ONE][1:]
        permuted = program.params_of(compiled[ONE](calls[ONE][0], inputs[:, perm], constants)[0])
        diff_permuted = max(_rel(params[ONE][k], permuted[k]) for k in params[ONE])

        jax.config.update("jax_enable_x64", True)  # the same programs in float64: the step's exactness at a finer rounding
        X64 = X.astype(np.float64)
        final64 = {}
        for name, devs in ((ONE, None), (TWO, 2)):
            program64, state64, res64 = fit_program(spec, X64, y, B, devs)
            run, (inputs, constants) = chunk_of(program64, K)
            final64[name] = program64.params_of(run(state64, inputs, constants)[0])
            if devs is None:
                final64["permuted"] = program64.params_of(run(state64, inputs[:, perm], constants)[0])
                family, p64 = res64.family, program64.params_of(state64)
                X0, y0 = jnp.asarray(X64[inputs[0]]), jnp.asarray(y[inputs[0]], jnp.float64)
                single = jax.jit(jax.value_and_grad(loss0))(p64, X0, y0)
                split = jax.jit(parallel.value_and_grad(loss0))(parallel.replicate(p64), X0, y0)
                grad_diff64 = max([_rel(single[0], split[0])] + [_rel(single[1][k], split[1][k]) for k in single[1]])
                z_grad64 = float(np.max(np.abs(np.asarray(single[1]["inducing.Z"]))))
        jax.config.update("jax_enable_x64", False)
        diff64 = max(_rel(final64[ONE][k], final64[TWO][k]) for k in final64[ONE])
        diff64_permuted = max(_rel(final64[ONE][k], final64["permuted"][k]) for k in final64[ONE])

        ratio = step[TWO] / step[ONE]
        cpu_ratio = cpu_step[TWO] / cpu_step[ONE]
        report.update({
            "ratio": ratio, "cpu_ratio": cpu_ratio,
            "ratio_sharding_constraint": step[CONSTRAINT] / step[ONE], "cpu_ratio_sharding_constraint": cpu_step[CONSTRAINT] / cpu_step[ONE],
            "cores_needed_for_goal": cpu_step[TWO] / (GOAL * step[ONE]),
            "collectives": {name: {op: _collectives(compiled[name].as_text(), op) for op in COLLECTIVES} for name in (TWO, CONSTRAINT)},
            "elbo_grad_max_rel_diff": grad_diff, "elbo_grad_max_rel_diff_float64": grad_diff64,
            "max_rel_diff": diff, "max_rel_diff_rows_permuted": diff_permuted, "max_rel_diff_sharding_constraint": diff_constraint,
            "max_rel_diff_float64": diff64, "max_rel_diff_float64_rows_permuted": diff64_permuted,
            "inducing_gradient_max_abs": {"float32": z_grad, "float64": z_grad64},
            "loss_max_rel_diff": _rel(finals[ONE][1][0], finals[TWO][1][0]),
            "goals": {f"2-device step <= {GOAL} x 1-device step": ratio <= GOAL,
                      "ELBO and gradients equal (rel. 1e-5 in float32, 1e-12 in float64)": grad_diff <= 1e-5 and grad_diff64 <= 1e-12},
        })
        report["analysis"] = note_for(report)
    write_json(args.out, report)
    print({k: v for k, v in report.items() if k in ("step_s", "cpu_step_s", "cores_busy", "ratio", "cpu_ratio", "ratio_sharding_constraint",
                                                    "cpu_ratio_sharding_constraint", "cores_needed_for_goal", "elbo_grad_max_rel_diff",
                                                    "elbo_grad_max_rel_diff_float64", "max_rel_diff", "max_rel_diff_rows_permuted",
                                                    "max_rel_diff_float64", "max_rel_diff_float64_rows_permuted",
                                                    "inducing_gradient_max_abs", "goals")},
          machine["load_average_start"], report["load_average_end"])
    if "analysis" in report:
        print(report["analysis"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
