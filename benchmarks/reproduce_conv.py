"""van der Wilk et al. 2017, §3 (convolutional GPs): rectangles, MNIST 0-vs-1 and MNIST 10-class, against the paper.

Three experiments, each selectable with ``--experiment``:

* ``rectangles`` (van der Wilk et al. 2017, §3.1–3.2): 3×3 patches, M = 16, Adam 0.01, minibatches of 100;
  conv (paper 1.4 % error, NLPP 0.055; goal ≤ 2 %), weighted-conv (paper 0 %, 0.005; goal
  ≤ 0.5 %) and an RBF SVGP baseline (paper 5.0 %, 0.258 with 1,200 inducing points and BFGS;
  rectangles has 1,181 distinct training images here, so the default is M = 1,000, recorded).
* ``mnist01`` (§3.1 "zeros vs ones"): weighted-conv, 5×5 patches, M = 50 (paper 0.3 %; goal ≤ 0.5 %).
* ``mnist10`` (§3.2–3.3, Table 1) on the fixed 4,000 / 1,000 split, 5×5 patches, the same M for
  RBF, conv, weighted-conv and weighted-conv+rbf (the paper used M = 750 on full MNIST); goal:
  weighted < RBF and weighted+RBF ≤ weighted in test error.

Per model the JSON records steps, wall time, s/step, the last minibatch ELBO, the full-data ELBO
(``evaluate_elbo``, with its Monte Carlo s.e.), test error and mean negative log predictive
probability (NLPP), the paper's numbers and whether the goal was met, with the device that
produced them (s/step is the fit's wall time over its steps, jit compilation included). Results
merge into ``benchmarks/results/reproduce_conv.json`` experiment by experiment, and model by model
within an experiment run again with the same settings, so partial runs accumulate. Runs shorter than the paper's (fewer steps, a subset of
the data) say so under ``settings``; their numbers are not converged reproductions.

    .venv/bin/python benchmarks/reproduce_conv.py --experiment rectangles --steps 2000
    .venv/bin/python benchmarks/reproduce_conv.py --quick --out /tmp/reproduce_conv.json
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import numpy as np

from _common import apply_quick, machine_info, now, reproduction_parser, run_and_merge  # noqa: E402

OUT = Path(__file__).parent / "results" / "reproduce_conv.json"
SEED = 0
BATCH_SIZE = 100
LEARNING_RATE = 0.01

#: experiment -> dataset, patch shape, default steps and the models with their paper numbers / goals.
#: A goal is ``(description, max_error)`` for a per-model threshold; mnist10's goal compares models.
EXPERIMENTS = {
    "rectangles": {
        "dataset": "rectangles",
        "patch_shape": (3, 3),
        "steps": 2000,
        "models": {
            "conv": {"num_inducing": 16, "inducing_init": "uniform", "paper": {"error": 0.014, "nlpp": 0.055},
                     "goal": ("test error <= 2%", 0.02)},
            "weighted-conv": {"num_inducing": 16, "inducing_init": "uniform", "paper": {"error": 0.0, "nlpp": 0.005},
                              "goal": ("test error <= 0.5%", 0.005)},
            "svgp-rbf": {"num_inducing": 1000, "paper": {"error": 0.050, "nlpp": 0.258, "num_inducing": 1200,
                                                         "optimiser": "BFGS"}},
        },
    },
    "mnist01": {
        "dataset": "mnist-01",
        "patch_shape": (5, 5),
        "steps": 2000,
        "models": {
            "weighted-conv": {"num_inducing": 50, "inducing_init": "random", "paper": {"error": 0.003},
                              "goal": ("test error <= 0.5%", 0.005)},
        },
    },
    "mnist10": {
        "dataset": "mnist-10",
        "patch_shape": (5, 5),
        "steps": 5000,
        "models": {  # paper: Table 1, full MNIST (60,000 training images), M = 750
            "svgp-rbf": {"num_inducing": 100, "paper": {"error": 0.0190, "nlpp": 0.068, "num_inducing": 750}},
            "conv": {"num_inducing": 100, "paper": {"error": 0.0208, "nlpp": 0.077, "num_inducing": 750}},
            "weighted-conv": {"num_inducing": 100, "paper": {"error": 0.0122, "nlpp": 0.048, "num_inducing": 750}},
            "weighted-conv+rbf": {"num_inducing": 100, "paper": {"error": 0.0117, "nlpp": 0.039, "num_inducing": 750}},
        },
        "goal": "weighted-conv error < svgp-rbf error and weighted-conv+rbf error <= weighted-conv error",
    },
}


# ----------------------------------------------------------------------------- shared helpers
def subsample(X, y, limit: int | None, seed: int):
    """The first ``limit`` rows of a fixed random permutation (all rows when ``limit`` is None)."""
    if limit is None or limit >= X.shape[0]:
        return np.asarray(X), np.asarray(y)
    index = np.sort(np.random.default_rng(seed).permutation(X.shape[0])[:limit])
    return np.asarray(X)[index], np.asarray(y)[index]


def classification_scores(probs, labels) -> dict:
    """Test error (argmax) and mean negative log predictive probability of the true label."""
    probs = np.asarray(probs, dtype=np.float64)  # [N, C]
    labels = np.asarray(labels).astype(int)  # [N]
    picked = np.clip(probs[np.arange(labels.size), labels], 1e-300, None)
    return {"test_error": float(np.mean(probs.argmax(1) != labels)), "test_nlpp": float(-np.mean(np.log(picked)))}


def fit_and_score(spec, X_train, y_train, *, steps: int, batch_size: int, seed: int, learning_rate: float,
                  elbo_samples: int, progress: bool, **fit_options):
    """Fit, then time it, estimate the full-data ELBO and return ``(record, FitResult)``."""
    from gpzoo.inference import evaluate_elbo, fit  # noqa: PLC0415 - keeps `--help` fast

    batch_size = min(batch_size, X_train.shape[0])
    t0 = time.perf_counter()
    res = fit(spec, X_train, y_train, steps=steps, batch_size=batch_size, seed=seed, learning_rate=learning_rate,
              progress=progress, **fit_options)
    wall = time.perf_counter() - t0
    elbo = evaluate_elbo(res, num_samples=elbo_samples)
    record = {
        "steps": steps,
        "batch_size": batch_size,
        "num_inducing": spec.num_inducing,
        "wall_s": wall,
        "s_per_step": res.diagnostics["seconds"] / max(steps, 1),
        "final_minibatch_elbo": res.final_objective,
        "elbo": elbo.elbo,
        "elbo_stderr": elbo.stderr,
        "elbo_samples": elbo.num_samples,
        "jitter_events": len(res.diagnostics["jitter_events"]),
    }
    return record, res


# ----------------------------------------------------------------------------- experiments
def run_experiment(name: str, args) -> dict:
    from gpzoo.analysis import datasets  # noqa: PLC0415
    from gpzoo.inference import predict  # noqa: PLC0415
    from gpzoo.models import zoo  # noqa: PLC0415

    config = EXPERIMENTS[name]
    data = datasets.load(config["dataset"], seed=args.seed)
    X_train, y_train = subsample(data.X_train, data.y_train, args.max_train, args.seed)
    X_test, y_test = subsample(data.X_test, data.y_test, args.max_test, args.seed + 1)
    steps = args.steps or config["steps"]
    models = [m for m in config["models"] if not args.models or m in args.models]
    results = {}
    for model in models:
        options = config["models"][model]
        num_inducing = min(args.num_inducing or options["num_inducing"], X_train.shape[0])
        if model == "svgp-rbf" and args.rbf_inducing:
            num_inducing = min(args.rbf_inducing, X_train.shape[0])
        zoo_options = dict(image_shape=data.image_shape, task=data.task, num_classes=data.num_classes,
                           num_inducing=num_inducing)
        if model != "svgp-rbf":
            zoo_options["patch_shape"] = config["patch_shape"]
        if "inducing_init" in options:
            zoo_options["inducing_init"] = options["inducing_init"]
        spec = zoo.get(model, **zoo_options)
        print(f"[{name}] {model}: M={num_inducing}, {steps} steps on {X_train.shape[0]} images", flush=True)
        record, res = fit_and_score(spec, X_train, y_train, steps=steps, batch_size=args.batch_size, seed=args.seed,
                                    learning_rate=args.learning_rate, elbo_samples=args.elbo_samples,
                                    progress=args.progress)
        record.update(classification_scores(predict(res, X_test).probs, y_test))
        record["inducing_init"] = spec.inducing_init
        record["paper"] = options["paper"]
        if "goal" in options:
            text, threshold = options["goal"]
            record["goal"] = {"text": text, "met": bool(record["test_error"] <= threshold)}
        record["device"] = jax.devices()[0].device_kind
        if model in ("conv", "weighted-conv") and name == "rectangles":
            record["figure"] = save_inducing_patches(res, args.out.parent / f"{name}_{model}_inducing_patches.png")
        results[model] = record
        print(f"    error {record['test_error']:.4f}  nlpp {record['test_nlpp']:.4f}  elbo {record['elbo']:.2f} "
              f"± {record['elbo_stderr']:.2f}  {record['s_per_step']:.3f} s/step", flush=True)

    payload = {
        "date": now(),
        "machine": machine_info(),
        "settings": {
            "dataset": config["dataset"], "dataset_description": data.description, "patch_shape": list(config["patch_shape"]),
            "steps": steps,
            "paper_steps": config["steps"], "batch_size": args.batch_size, "learning_rate": args.learning_rate,
            "optimizer": "adam", "seed": args.seed, "num_train": int(X_train.shape[0]), "num_test": int(X_test.shape[0]),
            "full_num_train": int(data.X_train.shape[0]), "full_num_test": int(data.X_test.shape[0]),
            "reduced": bool(steps < config["steps"] or X_train.shape[0] < data.X_train.shape[0]
                            or X_test.shape[0] < data.X_test.shape[0]),
            "dtype": "float64" if jax.config.jax_enable_x64 else "float32",
        },
        "models": results,
    }
    return with_goal(name, payload)


def save_inducing_patches(res, path: Path) -> str:
    """The learned inducing patches sorted by their inducing output (van der Wilk et al. 2017, fig. 1a), as a PNG."""
    from gpzoo.analysis.figures import inducing_patches_figure  # noqa: PLC0415

    path.parent.mkdir(parents=True, exist_ok=True)
    inducing_patches_figure(res).savefig(path, dpi=100)
    return path.name


def with_goal(name: str, payload: dict) -> dict:
    """Add the experiment-level goal (mnist10: comparisons between models) when all its models ran."""
    config, results = EXPERIMENTS[name], payload["models"]
    if "goal" in config and {"svgp-rbf", "weighted-conv", "weighted-conv+rbf"} <= set(results):
        err = {m: r["test_error"] for m, r in results.items()}
        payload["goal"] = {"text": config["goal"],
                           "met": bool(err["weighted-conv"] < err["svgp-rbf"] and err["weighted-conv+rbf"] <= err["weighted-conv"])}
    return payload


def combine(name: str, old: dict | None, new: dict) -> dict:
    """Keep the models of an earlier run of ``name`` that this one did not redo, if the settings match.

    Steps may differ between models (each record keeps its own ``steps``); the merged run is
    marked reduced when any of its models is.
    """
    def same(settings):
        return {k: v for k, v in settings.items() if k not in ("steps", "reduced")}

    if old and same(old.get("settings", {})) == same(new["settings"]):
        new["models"] = {**old["models"], **new["models"]}
        new["models"] = {m: new["models"][m] for m in EXPERIMENTS[name]["models"] if m in new["models"]}
        s = new["settings"]
        s["reduced"] = bool(s["reduced"] or any(r["steps"] < s["paper_steps"] for r in new["models"].values()))
        new = with_goal(name, new)
    return new


def parse_args(argv=None):
    parser = reproduction_parser(__doc__.split("\n")[0], EXPERIMENTS, default="all", out=OUT, seed=SEED, batch_size=BATCH_SIZE,
                                 learning_rate=LEARNING_RATE)
    parser.add_argument("--rbf-inducing", type=int, help="override M of the RBF baseline")
    args = parser.parse_args(argv)
    if args.quick:
        apply_quick(args, max_train=60, max_test=40)
        args.rbf_inducing = args.rbf_inducing or 8
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    names = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    return run_and_merge(names, args.out, lambda name: run_experiment(name, args), combine)


if __name__ == "__main__":
    main()
    print(f"wrote {parse_args().out}")
