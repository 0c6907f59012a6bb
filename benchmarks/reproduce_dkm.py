"""Milsom, Anson, Aitchison 2024, Table 3 (ablations), CPU-sized: a small convolutional DKM, each of
the paper's ablation rows configured as the paper names it.

The zoo model ``conv-dkm`` fitted with ``gpzoo.fit``, 3 seeds per row, float32. The rows
(:data:`ROWS`; ``--configs`` picks some), each a change to the full method:

* ``full``: SKR on (γ = ceil(P_ℓ/4), λ = 0.1), the Taylor objective of eq. 8, ν = 1e-3;
* ``no_taylor``: the exact KL instead of eq. 8;
* ``no_skr``: SKR off and no jitter (λ = 0);
* ``no_taylor_no_skr``: both;
* ``no_skr_keep_jitter``: SKR off but λ = 0.1 kept (the paper's control for SKR's jitter);
* ``nu0``: ν = 0 (no KL term at all);
* ``short_schedule``: 200 of the 1,200 "epochs": 1/6 of the steps, the learning rate divided by 10
  at 160/200 and 180/200 of them.

Every run records its own settings (SKR, λ, KL form, ν, steps, learning-rate drops), train/test
accuracy, test NLL (mean −log p(y*)), the train–test gap, cond(G_ℓ) at the end, and whether it failed
numerically (``NumericalError``/``TrainingError``, counted per row as the paper's Table 3 does).
The KL form of the Taylor rows is ``--taylor-form``, by default ``milsom_eq8``: eq. 8 as printed,
½‖G⁻¹K − I‖²_F, twice the second-order term of the KL (``taylor_symmetric`` is that term; see
``gpzoo.inference.dkm.gram_kl``). The goal stated for the paper's result: SKR's test accuracy ≥
no-SKR's and its train–test gap smaller, judged only when both rows are finite and above chance
(``benchmarks/_verdict.py``).

CPU-sized, and so not the paper's setting: sklearn's 8×8 digits (1,437 train / 360 test, 10
classes) instead of CIFAR-10; ``depth=2`` (a stride-1 layer of P inducing points, then a stride-2
layer of 2P averaged with the input Gram) instead of the paper's 20 layers of 512/1024/2048
(``--widths`` sets every layer's P, e.g. ``--depth 3 --widths 512 1024 2048`` where memory allows);
``--steps`` Adam steps, batch 64, instead of 1,200 epochs, with the paper's optimizer scaled to the
step count (``--optimizer paper``, the default: β = (0.8, 0.9), lr 0.01 divided by 10 at 2/3 and
11/12 of the steps; ``--optimizer constant`` is gpzoo.fit's Adam at a constant 0.01); a Softmax
likelihood with 16 Monte Carlo samples. Writes ``benchmarks/results/reproduce_dkm.json``.

SKR's noise depends on γ alone: Var(G̃_ii)/G_ii² = 2/γ, so the default γ = ceil(P/4) gives a relative
standard deviation of 0.35 and 0.25 on every diagonal entry at P = 64, 128 (γ = 16, 32) against
0.125 at the paper's narrowest width (P = 512, γ = 128). ``--skr-gamma`` sets γ for the SKR rows.

``--data mnist-10`` runs the same ablation on the MNIST 10-class split (4,000 train / 1,000 test);
``--pool 2`` mean-pools its 28×28 images to 14×14 first (CPU-sized).

The report is rewritten after every finished (row, seed) run, with ``"complete": false`` until the
last, and each run prints one line to stderr: a sweep stopped part-way keeps the runs it finished
(the results page marks such a report as partial). ``--combine`` merges the reports of sweeps run
in separate processes.

    .venv/bin/python benchmarks/reproduce_dkm.py [--steps 1200] [--width 64] [--depth 2] [--seeds 0 1 2]
        [--data digits-8x8] [--pool 1] [--configs full no_skr ...] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np
import optax

jax.config.update("jax_enable_x64", False)

from _common import machine_info, mean_pooled, now, write_json  # noqa: E402
from _verdict import why_unjudgeable  # noqa: E402

from gpzoo.analysis import datasets  # noqa: E402
from gpzoo.inference import fit, predict  # noqa: E402
from gpzoo.models import zoo  # noqa: E402
from gpzoo.models.errors import TrainingError  # noqa: E402
from gpzoo.models.likelihoods import Softmax  # noqa: E402

OUT = Path(__file__).parent / "results" / "reproduce_dkm.json"
#: Milsom et al. 2024, Table 3: each row's name in the paper, what it changes from the full method, and
#: the paper's CIFAR-10 result (test accuracy %, test log-likelihood, failures of 4 seeds; None: failed).
ROWS = {
    "full": ("No ablation / our full method", {}, (94.52, -0.3611, "0/4")),
    "no_taylor": ("No Taylor approximation to objective", {"kl": "exact"}, (94.46, -0.3951, "1/4")),
    "no_skr": ("No SKR", {"skr": False, "skr_jitter": 0.0}, (93.71, -0.4512, "2/4")),
    "no_taylor_no_skr": ("No Taylor + No SKR", {"kl": "exact", "skr": False, "skr_jitter": 0.0}, (93.25, -0.5113, "3/4")),
    "no_skr_keep_jitter": ("No SKR but keep λ = 0.1 jitter", {"skr": False}, (93.46, -0.4762, "3/4")),
    "nu0": ("ν_ℓ = 0 (eq. 2)", {"nu": 0.0}, (None, None, "4/4")),
    "short_schedule": ("200 epochs", {"schedule": "short"}, (93.45, -0.2607, "0/4")),
}
CONFIGS = tuple(ROWS)
#: the learning-rate drops as fractions of the run: epochs 800 and 1100 of 1200; 160 and 180 of 200
DROPS = {"full": (800 / 1200, 1100 / 1200), "short": (160 / 200, 180 / 200)}


def row_settings(name: str, args) -> dict:
    """What row ``name`` runs: SKR on/off, λ, KL form, ν, γ, steps and learning-rate drops (recorded with every run)."""
    settings = dict(skr=True, skr_jitter=0.1, kl=args.taylor_form, nu=args.nu, skr_gamma=args.skr_gamma, schedule="full")
    settings.update(ROWS[name][1])
    settings["steps"] = args.steps if settings["schedule"] == "full" else max(1, round(args.steps * 200 / 1200))
    settings["lr_drop_fractions"] = list(DROPS[settings["schedule"]]) if args.optimizer == "paper" else []
    return settings


def optimizer(kind: str, learning_rate: float, steps: int, drops=DROPS["full"]) -> optax.GradientTransformation | None:
    """``paper``: the paper's Adam (β = (0.8, 0.9)) with its learning rate divided by 10 at the fractions
    ``drops`` of the run (Milsom et al. 2024, §4.1: epochs 800 and 1100 of 1200), scaled to ``steps``;
    ``constant``: gpzoo.fit's default Adam (β = (0.9, 0.999)) at a constant rate (None: fit builds it)."""
    if kind == "constant":
        return None
    schedule = optax.piecewise_constant_schedule(learning_rate, {round(steps * f): 0.1 for f in drops})
    return optax.adam(schedule, b1=0.8, b2=0.9)


OPTIMIZERS = {"paper": "Adam, betas (0.8, 0.9), learning rate divided by 10 at 2/3 and 11/12 of the steps "
                       "(the paper's epochs 800 and 1100 of 1200; the short schedule at 4/5 and 9/10)",
              "constant": "Adam (gpzoo.fit default betas 0.9/0.999), constant learning rate"}


def run(name: str, data, seed: int, args) -> dict:
    shape = data.image_shape
    row = row_settings(name, args)
    size = dict(num_inducing=args.widths[0], widths=tuple(args.widths), depth=len(args.widths)) if args.widths else \
        dict(num_inducing=args.width, depth=args.depth)
    spec = zoo.get("conv-dkm", input_dim=int(np.prod(shape)), image_shape=shape, task="multiclass", num_classes=10,
                   likelihood=Softmax(num_classes=10, num_mc_samples=args.mc_samples), **size,
                   **{k: row[k] for k in ("skr", "skr_jitter", "kl", "nu", "skr_gamma")})
    t0 = time.perf_counter()
    try:
        res = fit(spec, data.X_train, data.y_train, steps=row["steps"], batch_size=args.batch_size, seed=seed,
                  learning_rate=args.learning_rate,
                  optimizer=optimizer(args.optimizer, args.learning_rate, row["steps"], DROPS[row["schedule"]]),
                  progress=False)
    except TrainingError as exc:  # NumericalError is one: counted as a failure, as in the paper's Table 3
        return {"config": name, "seed": seed, "settings": row, "failed": True, "error": f"{type(exc).__name__}: {exc}",
                "seconds": time.perf_counter() - t0}
    seconds = time.perf_counter() - t0

    def scores(X, y):
        probs = predict(res, X, seed=seed).probs  # [N, 10]
        accuracy = float(np.mean(probs.argmax(axis=1) == y))
        nll = float(-np.mean(np.log(np.maximum(probs[np.arange(len(y)), y.astype(int)], 1e-12))))
        return accuracy, nll, bool(np.all(np.isfinite(probs)))

    train_acc, train_nll, train_finite = scores(data.X_train, data.y_train)
    test_acc, test_nll, test_finite = scores(data.X_test, data.y_test)
    return {"config": name, "seed": seed, "settings": row, "failed": not (train_finite and test_finite), "seconds": seconds,
            "train_accuracy": train_acc, "test_accuracy": test_acc, "train_nll": train_nll, "test_nll": test_nll,
            "gap": train_acc - test_acc, "final_elbo": res.final_objective,
            "gram_condition_end": res.diagnostics["gram_condition"]["end"]}


def pooled_note(data, pool: int) -> str:
    return "" if pool == 1 else f", mean-pooled {pool}x{pool} to {data.image_shape[0]}x{data.image_shape[1]}"


def summarise(runs: list[dict], n_test: int | None = None) -> dict:
    """Per row: runs, failures and mean ± s.e. over the finished runs; the goal lines when both rows they
    compare are finite and above chance on ``n_test`` points (otherwise the reason, under ``goal_unjudged``)."""
    out: dict = {}
    for name in CONFIGS:
        ok = [r for r in runs if r["config"] == name and not r["failed"]]
        stats = {"runs": sum(r["config"] == name for r in runs), "failures": sum(r["config"] == name and r["failed"] for r in runs)}
        for key in ("test_accuracy", "test_nll", "train_accuracy", "gap"):
            values = np.array([r[key] for r in ok])
            if len(values):
                stats[key] = {"mean": float(values.mean()),
                              "sem": float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else None}
        out[name] = stats
    full, other = out["full"], next((out[n] for n in ("no_skr", "no_skr_keep_jitter") if out[n]["runs"]), None)
    if other is None or not full["runs"]:
        return out
    sides = {name: {k: stats[k]["mean"] for k in ("test_accuracy", "test_nll") if k in stats} or None
             for name, stats in (("full", full), ("no SKR", other))}
    reason = why_unjudgeable(sides, 10, n_test) if n_test else "the number of test points is not recorded"
    if reason:
        out["goal_unjudged"] = reason
    else:
        out["goal_skr_test_accuracy_at_least_no_skr"] = full["test_accuracy"]["mean"] >= other["test_accuracy"]["mean"]
        out["goal_skr_gap_smaller"] = full["gap"]["mean"] < other["gap"]["mean"]
    return out


#: settings that may differ between the files ``--combine`` merges (each process ran some of them)
SPLIT_SETTINGS = ("seeds", "configs", "combine")


def combine(paths, out: Path) -> dict:
    """One report from the runs of several result files that differ only in their seeds / configurations."""
    reports = [json.loads(Path(path).read_text()) for path in paths]
    fixed = [{k: v for k, v in r["settings"].items() if k not in SPLIT_SETTINGS} for r in reports]
    if any(f != fixed[0] for f in fixed[1:]):
        raise SystemExit("--combine: the files were run with different settings")
    runs = [run for r in reports for run in r["runs"]]
    pairs = [(run["config"], run["seed"]) for run in runs]
    if len(set(pairs)) != len(pairs):
        raise SystemExit("--combine: a (configuration, seed) run appears twice")
    report = dict(reports[0], date=max(r["date"] for r in reports), runs=runs,
                  summary=summarise(runs, reports[0]["settings"].get("n_test")),
                  complete=all(r.get("complete", True) for r in reports),
                  total_seconds=sum(r["total_seconds"] for r in reports),
                  settings=dict(reports[0]["settings"], seeds=sorted({run["seed"] for run in runs}),
                                configs=[c for c in CONFIGS if any(run["config"] == c for run in runs)],
                                combined_from_processes=len(reports)))
    write_json(out, report)
    return report


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1200, help="steps of every row but short_schedule (1/6 of them)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--width", type=int, default=64, help="P of the first stage (the second has 2P)")
    parser.add_argument("--widths", type=int, nargs="+", default=None,
                        help="P of every Gram layer (sets the depth; e.g. the paper's 512 1024 2048 on a GPU)")
    parser.add_argument("--nu", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--learning-rate", type=float, default=0.01)
    parser.add_argument("--optimizer", default="paper", choices=tuple(OPTIMIZERS),
                        help="paper: Adam (0.8, 0.9) with the paper's two learning-rate drops; constant: gpzoo.fit's Adam")
    parser.add_argument("--mc-samples", type=int, default=16)
    parser.add_argument("--taylor-form", default="milsom_eq8", choices=("milsom_eq8", "taylor_symmetric", "taylor_frobenius"),
                        help="the KL form of the Taylor rows (milsom_eq8: the paper's eq. 8 as printed)")
    parser.add_argument("--skr-gamma", type=int, default=None, help="γ of the SKR configurations (default: ceil(P/4))")
    parser.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS), help="only these configurations")
    parser.add_argument("--combine", type=Path, nargs="+", metavar="FILE",
                        help="merge the runs of result files written by separate processes (same settings) into --out")
    parser.add_argument("--data", default="digits-8x8", choices=("digits-8x8", "mnist-10"),
                        help="digits-8x8 (sklearn, 1,437 / 360) or mnist-10 (4,000 / 1,000, a seeded MNIST split)")
    parser.add_argument("--pool", type=int, default=1, help="mean-pool the images by this factor on each side (mnist-10: 2 gives 14x14)")
    parser.add_argument("--quick", action="store_true", help="one seed, few steps (smoke test)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.combine:
        return combine(args.combine, args.out)
    if args.quick:
        args.seeds, args.steps = args.seeds[:1], min(args.steps, 5)
    data = mean_pooled(datasets.load(args.data), args.pool)
    started = time.perf_counter()
    plan = [(name, seed) for name in args.configs for seed in args.seeds]
    runs: list[dict] = []
    for name, seed in plan:  # each finished run is on disk at once: an interrupted sweep keeps what it ran
        runs.append(run(name, data, seed, args))
        report = _report(args, data, runs, started, complete=len(runs) == len(plan))
        write_json(args.out, report)
        r = runs[-1]
        outcome = "failed" if r["failed"] else f"test accuracy {r['test_accuracy']:.3f}"
        print(f"[{len(runs)}/{len(plan)}] {name} seed {seed}: {outcome} ({r['seconds']:.0f} s)", file=sys.stderr, flush=True)
    return report


def _report(args, data, runs: list[dict], started: float, complete: bool) -> dict:
    return {
        "benchmark": "reproduce_dkm", "paper": "Milsom, Anson, Aitchison 2024, Table 3 (ablations), CPU-sized",
        "date": now(), "machine": machine_info(), "total_seconds": time.perf_counter() - started,
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "combine")} | {
            "data": f"{args.data}{pooled_note(data, args.pool)} ({len(data.y_train)} train / {len(data.y_test)} test, 10 classes)",
            "dtype": "float32", "n_test": len(data.y_test), "n_train": len(data.y_train),
            "rows": {name: {"paper_name": ROWS[name][0], "changes": ROWS[name][1],
                            "paper_cifar10": dict(zip(("test_accuracy_pct", "test_log_likelihood", "failures"), ROWS[name][2]))}
                     for name in args.configs},
            "model": "conv-dkm (gpzoo zoo), normalised-Gaussian kernel, batch kernel norm, skips, GAP head",
            "optimizer": OPTIMIZERS[args.optimizer]},
        "chosen_here": "CPU-sized stand-in for the paper's CIFAR-10 ResNet-20 DKM: data, depth, widths, steps "
                       "and MC samples are ours (see the module docstring)"
                       + ("" if args.optimizer == "paper" else "; so is the optimizer (constant learning rate)"),
        "complete": complete, "runs": runs, "summary": summarise(runs, len(data.y_test)),
    }


if __name__ == "__main__":
    main()
