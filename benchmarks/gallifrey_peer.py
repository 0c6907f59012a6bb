"""Kernel structure search beside a peer: gpzoo's greedy BIC search against gallifrey's SMC over structures.

The peer is ``gallifrey`` 0.1.1 (Boettner 2025, A&A; PyPI ``gallifrey``), a JAX port of AutoGP.jl's
sequential Monte Carlo structure learning for time series (Saad, Patton, Hoffman, Saurous &
Mansinghka 2023). It is never a gpzoo dependency: it runs in its own interpreter
(``--gallifrey-python PY``), in a fresh subprocess fed through an .npz, and answers with one JSON
line and an .npz of per-particle predictive moments (no pickle), as ``nuts_ess.py`` does for GPflow.

Protocol, per series (``co2``, ``sunspots``, ``nile``, ``elnino``):

1. Data: ``gpzoo.analysis.datasets.load(name, seed=0)``, the split of ``kernel_search.py``: the first
   80 % in time train, the rest is extrapolated; x in decades since the first observation, y
   standardised with the training mean and sd. Both methods get exactly the same X_train, y_train
   and are scored at the same X_test, y_test, in these standardised units.
2. gallifrey (subprocess): ``GPModel(key, x, y, num_particles=P, config=GPConfig(max_depth=D))``,
   then ``GPModel.fit_smc(key, annealing_schedule=LinearSchedule.generate(N, S), n_mcmc=M,
   n_hmc=H)``, ``GPModel.update_state(final_state)``; predictions from
   ``GPModel.get_predictive_distributions(x_transform(X_test))`` (one Gaussian per particle,
   observation noise included, ``latent=False``), their marginal means and variances mapped back
   through gallifrey's own ``y_transform.unapply`` / ``unapply_var``, and the final SMC log weights.
   Wall time = model construction + ``fit_smc`` (blocked until ready); compile time = JAX's
   backend-compile and jaxpr-to-MLIR events inside it (``jax.monitoring``), the rest is
   arithmetic and Python. Prediction time is reported separately.
3. Scores (here, in the parent): the predictive at each test point is the particle mixture
   Σ_i w_i N(μ_i, σ_i²) (w = softmax of the log weights). RMSE of its mean Σ w_i μ_i; mean log
   predictive density of the mixture, mean_n log Σ_i w_i N(y_n; μ_in, σ_in²) (logsumexp), which is
   the same quantity that ``gpzoo.analysis.search.heldout_metrics`` reports for gpzoo's single
   Gaussian (``-regression_metrics(...)["nll"]``). Alongside: the moment-matched Gaussian's scores
   through ``gpzoo.analysis.calibration.regression_metrics`` (its MLPD, 95 % coverage, CRPS), so the
   mixture's gain over one Gaussian is visible.
4. gpzoo (``--with-gpzoo``; off by default): ``gpzoo.analysis.search.search`` with
   ``kernel_search.py``'s settings (``--depth`` 3, ``--restarts`` 5, ``--steps`` 60), scored by
   ``heldout_metrics``; wall and compile time as ``kernel_search.py``. A verdict line is printed
   only for series on which both ran.

Differences between the two methods (also in the result file, ``DIFFERENCES``):

* Inference: gallifrey approximates the posterior over structures and parameters with P weighted
  particles (data-annealed SMC: reweight by the marginal-likelihood ratio as points are added,
  resample when the normalised ESS < 0.5, rejuvenate each particle with M structure MH moves
  (subtree-replace / detach-attach) each followed, when accepted, by H HMC steps on the
  parameters); its prediction is the particle mixture. gpzoo runs a greedy search (one beam),
  scores each structure by BIC of the exact marginal likelihood at L-BFGS optima (5 restarts),
  and predicts with the single best structure at its point estimate.
* Grammar: gallifrey's default atoms are Linear, Periodic and RBF (SE) joined by + and ×, as a
  tree of depth ≤ ``max_depth`` (3), atoms drawn with probability 1 and operators 0.5 (relative);
  no RQ, no change points (its library also has Constant, Matern, RQ, White, ... but they are off
  by default and are kept off here). gpzoo's bases are SE, Per, Lin, RQ and the change-point /
  change-window productions, expanded greedily to ``--depth``.
* Priors and parameters: gallifrey puts log-normal(0, 1) priors on positive parameters in its own
  rescaled units and samples them; gpzoo has no priors in the search (maximum likelihood with
  data-adapted initial values).
* Noise: gallifrey samples one homoscedastic noise variance per particle (prior InverseGamma(1, 1)
  in its rescaled units, proposals from InverseGamma(n/2, 1)); gpzoo fits the Gaussian
  likelihood's variance by maximum likelihood. Both predictives include the noise.
* Scaling: gallifrey rescales internally, x linearly onto [0, 1] over the training range (so the
  test inputs lie beyond 1) and y to (y − mean) / (max − min); its predictions are mapped back to
  the standardised units here. gpzoo uses the standardised data as given.
* Mean: zero mean in both (gallifrey's is fixed at 0 in its rescaled units, i.e. the training mean).
* Budget: gallifrey has no library default for the SMC budget (``fit_smc`` requires the schedule,
  n_mcmc and n_hmc); this script's defaults are its README quick start's: 8 particles, a linear
  schedule of 10 SMC steps, n_mcmc 50, n_hmc 10, and ``GPConfig``'s HMC settings (step 0.02, 10
  leapfrog steps, identity mass matrix). gpzoo's budget is its depth, restarts and L-BFGS steps.
* Execution: gallifrey runs its particles with ``jax.pmap``, one particle per XLA host device, so
  the subprocess gets ``--xla_force_host_platform_device_count=P`` (virtual CPU devices sharing
  the machine's cores); gallifrey itself sets ``OMP_NUM_THREADS=1`` and float64. It recompiles its
  rejuvenation step for every SMC round (each round's data size is a new static shape), which
  its compile time shows. gpzoo runs the candidates of one depth one after another
  (``backend="sequential"``).
* Randomness: gallifrey's result depends on ``--seed`` (one run here, no repeats); gpzoo's search
  is deterministic given its seed 0.

Run (one process; the gallifrey part starts its own)::

    .venv/bin/python benchmarks/gallifrey_peer.py --gallifrey-python PY [--series co2,nile] [--with-gpzoo]
        [--particles 8] [--smc-steps 10] [--n-mcmc 50] [--n-hmc 10] [--max-depth 3] [--seed 0]
        [--out benchmarks/results/gallifrey_peer.json]

Cost: gallifrey's time grows steeply with the number of points in a round (a structure move on
all 417 CO₂ points took about 6 s, an HMC leapfrog gradient about 0.5 s, per particle) and compiles
about 17 s per SMC round. Calibration on 2 shared CPU cores (load average 3-4, other work running):
nile (80 points) with 2 particles, 2 rounds, n_mcmc 2, n_hmc 2: 38-46 s fit (32-40 s of it compile);
co2 with 2 particles, 2 rounds, n_mcmc 5, n_hmc 10: 76 s (39 s compile, no move accepted); co2 with
n_mcmc 15, n_hmc 10: 352 s (34 s compile, 4 moves and 40 HMC steps accepted). Extrapolated, the
default budget on co2 is several CPU-hours (roughly 2-6 h of wall time on 2 cores, depending on how
many structure moves are accepted); on nile minutes. ``--n-mcmc`` and ``--particles`` are the knobs
to shrink it; any smaller budget is recorded in the file's settings.

PY is an interpreter of a separate environment: ``python3.12 -m venv /path/to/gallifrey-venv &&
/path/to/gallifrey-venv/bin/pip install gallifrey==0.1.1`` (it brings jax 0.5.3, blackjax 1.3, flax
0.10.6, tensorflow-probability 0.25.0; gallifrey needs Python ≥ 3.10). Without ``--gallifrey-python``
the peer is not run, the file says so and the script exits 0.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import subprocess
import tempfile
import textwrap
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import comma_choices, compile_seconds, machine_info, merge_results, now  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gallifrey_peer.json"
SERIES = ("co2", "sunspots", "nile", "elnino")
#: gallifrey's README quick-start budget (fit_smc has no defaults of its own)
GALLIFREY_DEFAULTS = {"particles": 8, "smc_steps": 10, "n_mcmc": 50, "n_hmc": 10, "max_depth": 3}
#: kernel_search.py's settings for gpzoo's side
GPZOO_DEFAULTS = {"depth": 3, "restarts": 5, "steps": 60}
DIFFERENCES = [
    "inference: gallifrey = data-annealed SMC over structures and parameters (P weighted particles, MH structure moves + HMC), predicting with the particle mixture; gpzoo = greedy search scored by BIC at L-BFGS optima (5 restarts), predicting with the single best structure",
    "grammar: gallifrey default atoms Linear, Periodic, RBF with + and x, tree depth <= max_depth (3); no RQ, no change points. gpzoo: SE, Per, Lin, RQ, +, x, change points/windows, greedy to --depth",
    "priors: gallifrey samples parameters under log-normal(0, 1) priors in its rescaled units; gpzoo's search has no priors (maximum likelihood)",
    "noise: gallifrey samples one noise variance per particle (InverseGamma(1, 1) prior in rescaled units); gpzoo fits it by maximum likelihood; both predictives include it",
    "scaling: gallifrey rescales x onto [0, 1] over the training range and y to (y - mean)/(max - min) internally; predictions are mapped back to the standardised units. gpzoo uses the standardised data as given",
    "budget: gallifrey has no library default budget; defaults here are its README quick start (8 particles, 10 linear SMC steps, n_mcmc 50, n_hmc 10)",
    "execution: gallifrey pmaps particles over P virtual XLA host devices sharing the CPU cores and recompiles each SMC round; gpzoo evaluates candidates sequentially",
    "randomness: one gallifrey run per series at --seed; gpzoo's search is deterministic (seed 0)",
]


# ----------------------------------------------------------------------------- gallifrey, in its own interpreter
_GALLIFREY = textwrap.dedent("""
    import collections, contextlib, importlib.metadata, json, sys, time
    cfg = json.loads(sys.argv[2])
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # gallifrey prints its flag settings on import
        import jax, jax.numpy as jnp, jax.random as jr
        import numpy as np
        import gallifrey
        from gallifrey import GPConfig, GPModel, LinearSchedule
    t_import = time.perf_counter() - t0
    compile_s = collections.Counter()

    def listener(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration" or event.endswith("jaxpr_to_mlir_module_duration"):
            compile_s["s"] += duration
            compile_s["n"] += event == "/jax/core/compile/backend_compile_duration"

    jax.monitoring.register_event_duration_secs_listener(listener)
    data = np.load(sys.argv[1], allow_pickle=False)
    x, y, xt = data["X_train"][:, 0], data["y_train"], data["X_test"][:, 0]
    key = jr.PRNGKey(cfg["seed"])
    key, model_key, smc_key = jr.split(key, 3)
    with contextlib.redirect_stdout(sys.stderr):
        t = time.perf_counter()
        model = GPModel(model_key, x=jnp.asarray(x), y=jnp.asarray(y), num_particles=cfg["particles"],
                        config=GPConfig(max_depth=cfg["max_depth"]))
        schedule = LinearSchedule.generate(len(x), cfg["smc_steps"])
        final, history = model.fit_smc(smc_key, annealing_schedule=schedule, n_mcmc=cfg["n_mcmc"],
                                       n_hmc=cfg["n_hmc"], verbosity=0)
        jax.block_until_ready(final.log_weights)
        fit_s = time.perf_counter() - t
        fit_compile_s, fit_compilations = compile_s["s"], compile_s["n"]
        model = model.update_state(final)
        t = time.perf_counter()
        dists = model.get_predictive_distributions(model.x_transform.apply(jnp.asarray(xt)))
        means = np.stack([np.asarray(model.y_transform.unapply(d.mean())) for d in dists])
        variances = np.stack([np.asarray(model.y_transform.unapply_var(d.variance())) for d in dists])
        predict_s = time.perf_counter() - t
        particles = model.get_particles(final)
    np.savez(sys.argv[3], means=means, variances=variances, log_weights=np.asarray(final.log_weights))
    config = GPConfig(max_depth=cfg["max_depth"])
    print(json.dumps({
        "import_s": t_import, "fit_s": fit_s, "compile_s": fit_compile_s, "compilations": int(fit_compilations),
        "predict_s": predict_s, "schedule": list(schedule),
        "resampled_per_round": [bool(r) for r in np.asarray(history.resampled)],
        "mcmc_accepted_last_round": np.asarray(final.mcmc_accepted).astype(int).tolist(),
        "hmc_accepted_last_round": np.asarray(final.hmc_accepted).astype(int).tolist(),
        "structures": [p.kernel._tree_viz(include_parameters=False) for p in particles],
        "noise_variance": [float(model.y_transform.unapply_var(jnp.asarray(p.noise_variance.value)))
                           for p in particles],
        "x_transform": [float(model.x_transform.slope), float(model.x_transform.intercept)],
        "y_transform": [float(model.y_transform.slope), float(model.y_transform.intercept)],
        "library": {"atoms": [type(a).__name__ for a in config.atoms],
                    "operators": [type(o).__name__ for o in config.operators],
                    "node_probabilities": np.asarray(config.node_probabilities).tolist(),
                    "hmc_config": {k: float(v) for k, v in config.hmc_config.items()}},
        "devices": len(jax.devices()),
        "versions": {name: importlib.metadata.version(dist) for name, dist in (
            ("gallifrey", "gallifrey"), ("jax", "jax"), ("jaxlib", "jaxlib"), ("numpy", "numpy"), ("blackjax", "blackjax"),
            ("flax", "flax"), ("tensorflow_probability", "tensorflow-probability"))},
    }))
""")


def run_gallifrey(python: str, data, cfg: dict) -> tuple[dict, dict | None]:
    """Fit gallifrey in ``python`` on ``data``'s training split: (its JSON report, per-particle predictive
    moments at X_test as ``means``/``variances`` [P, N_test] and ``log_weights`` [P]); on failure
    (an error report, None)."""
    with tempfile.TemporaryDirectory() as tmp:
        inputs, outputs = Path(tmp) / "inputs.npz", Path(tmp) / "outputs.npz"
        np.savez(inputs, X_train=np.asarray(data.X_train, np.float64), y_train=np.asarray(data.y_train, np.float64),
                 X_test=np.asarray(data.X_test, np.float64))
        flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={cfg['particles']}".strip()
        env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"}
        start = time.perf_counter()
        proc = subprocess.run([python, "-c", _GALLIFREY, str(inputs), json.dumps(cfg), str(outputs)],
                              capture_output=True, text=True, check=False, env=env)
        process_s = time.perf_counter() - start
        if proc.returncode != 0:
            return {"error": proc.stderr[-3000:], "returncode": proc.returncode, "process_s": process_s}, None
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        with np.load(outputs, allow_pickle=False) as npz:
            moments = {k: np.asarray(npz[k], np.float64) for k in ("means", "variances", "log_weights")}
    result["process_s"] = process_s
    result["other_s"] = result["fit_s"] - result["compile_s"]
    return result, moments


def mixture_scores(y, means, variances, log_weights) -> dict:
    """RMSE and mean log predictive density of the mixture Σ_i w_i N(means[i], variances[i]) at ``y``,
    plus the moment-matched Gaussian's scores (``regression_metrics``)."""
    from jax.scipy.special import logsumexp  # noqa: PLC0415

    from gpzoo.analysis.calibration import regression_metrics  # noqa: PLC0415

    log_w = np.asarray(log_weights, np.float64) - float(logsumexp(np.asarray(log_weights, np.float64)))
    w = np.exp(log_w)[:, None]  # [P, 1]
    mean = np.sum(w * means, axis=0)
    var = np.sum(w * (variances + means**2), axis=0) - mean**2
    log_pdf = -0.5 * (np.log(2 * np.pi * variances) + (y[None, :] - means) ** 2 / variances)  # [P, N]
    lpd = np.asarray(logsumexp(log_w[:, None] + log_pdf, axis=0))  # [N]
    gauss = regression_metrics(y, mean, var)
    return {"rmse": gauss["rmse"], "mean_log_predictive_density": float(np.mean(lpd)),
            "moment_matched_gaussian": {"mean_log_predictive_density": -gauss["nll"], "coverage_95": gauss["coverage"][0.95],
                                        "crps": gauss["crps"]},
            "weights": np.exp(log_w).tolist(), "effective_particles": float(1.0 / np.sum(np.exp(2 * log_w)))}


# ----------------------------------------------------------------------------- gpzoo's side
def run_gpzoo(data, *, depth: int, restarts: int, steps: int, totals) -> dict:
    """``gpzoo.analysis.search.search`` with kernel_search.py's settings, scored by ``heldout_metrics``."""
    search_module = importlib.import_module("gpzoo.analysis.search")
    start_compile, start = totals["compile"], time.perf_counter()
    result = search_module.search(data.X_train, data.y_train, depth=depth, restarts=restarts, steps=steps, progress=False)
    wall = time.perf_counter() - start
    compile_s = totals["compile"] - start_compile
    return {"structure": str(result.expression), "bic": result.best.score, "structures_fitted": len(result.trace),
            "noise_variance": float(result.noise_variance), "wall_s": wall, "compile_s": compile_s,
            "other_s": wall - compile_s, **search_module.heldout_metrics(result, data.X_test, data.y_test)}


# ----------------------------------------------------------------------------- main
def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gallifrey-python", help="an interpreter with gallifrey installed (the peer; not run without it)")
    p.add_argument("--series", default="co2,nile", help=f"comma list of {', '.join(SERIES)}")
    p.add_argument("--particles", type=int, default=GALLIFREY_DEFAULTS["particles"], help="SMC particles (8)")
    p.add_argument("--smc-steps", type=int, default=GALLIFREY_DEFAULTS["smc_steps"],
                   help="rounds of the linear data-annealing schedule (10)")
    p.add_argument("--n-mcmc", type=int, default=GALLIFREY_DEFAULTS["n_mcmc"], help="structure MH moves per particle per round (50)")
    p.add_argument("--n-hmc", type=int, default=GALLIFREY_DEFAULTS["n_hmc"], help="HMC steps after each accepted structure move (10)")
    p.add_argument("--max-depth", type=int, default=GALLIFREY_DEFAULTS["max_depth"], help="gallifrey's kernel tree depth (3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--with-gpzoo", action="store_true", help="also run gpzoo's search on the same split")
    p.add_argument("--depth", type=int, default=GPZOO_DEFAULTS["depth"], help="gpzoo search depth (3)")
    p.add_argument("--restarts", type=int, default=GPZOO_DEFAULTS["restarts"])
    p.add_argument("--steps", type=int, default=GPZOO_DEFAULTS["steps"])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    names = comma_choices(p, args.series, SERIES, "series")

    from gpzoo.analysis import datasets  # noqa: PLC0415

    cfg = {"particles": args.particles, "smc_steps": args.smc_steps, "n_mcmc": args.n_mcmc, "n_hmc": args.n_hmc,
           "max_depth": args.max_depth, "seed": args.seed}
    note = None if args.gallifrey_python else "no --gallifrey-python given: the gallifrey peer was not run"
    if note:
        print(note)
    totals = compile_seconds()
    previous = json.loads(args.out.read_text()).get("experiments", {}) if args.out.exists() else {}
    report = {}
    for name in names:
        data = datasets.load(name, seed=0)
        load_start = list(os.getloadavg())
        payload = {"date": now(), "machine": machine_info(), "load_average_start": load_start,
                   "n_train": int(len(data.y_train)), "n_test": int(len(data.y_test)),
                   "settings": {
                       "gallifrey": {**cfg, "schedule": "LinearSchedule",
                                     "n_mcmc_meaning": "structure moves per particle per SMC round",
                                     "n_hmc_meaning": "HMC steps after each accepted structure move",
                                     "defaults_from": "gallifrey README quick start (fit_smc has no defaults)"},
                       "gpzoo": ({"depth": args.depth, "restarts": args.restarts, "steps": args.steps,
                                  "backend": "sequential"} if args.with_gpzoo else None),
                       "data": ("gpzoo.analysis.datasets.load(name, seed=0): first 80% train, x in decades, "
                                "y standardised with the training mean and sd")},
                   "differences": DIFFERENCES, "gallifrey": None, "gallifrey_note": note, "gpzoo": None}
        if args.gallifrey_python:
            result, moments = run_gallifrey(args.gallifrey_python, data, cfg)
            if moments is None:
                payload["gallifrey"] = result
                print(f"{name}: gallifrey failed (rc {result['returncode']}):\n{result['error']}")
            else:
                payload["versions"] = result.pop("versions")
                payload["gallifrey"] = {**result, **mixture_scores(np.asarray(data.y_test, np.float64), **moments)}
                g = payload["gallifrey"]
                print(f"{name}: gallifrey fit {g['fit_s']:.1f} s (compile {g['compile_s']:.1f} s, {g['compilations']} "
                      f"programs), process {g['process_s']:.1f} s; RMSE {g['rmse']:.3f}  MLPD {g['mean_log_predictive_density']:.3f}"
                      f"  (moment-matched {g['moment_matched_gaussian']['mean_log_predictive_density']:.3f}), "
                      f"effective particles {g['effective_particles']:.1f}/{args.particles}")
        if args.with_gpzoo:
            payload["gpzoo"] = run_gpzoo(data, depth=args.depth, restarts=args.restarts, steps=args.steps, totals=totals)
            z = payload["gpzoo"]
            print(f"{name}: gpzoo {z['structure']}  wall {z['wall_s']:.1f} s (compile {z['compile_s']:.1f} s); "
                  f"RMSE {z['rmse']:.3f}  MLPD {z['mean_log_predictive_density']:.3f}")
        g, z = payload["gallifrey"], payload["gpzoo"]
        if g and z and "error" not in g:
            print(f"verdict {name}: RMSE gpzoo {z['rmse']:.3f} vs gallifrey {g['rmse']:.3f}; MLPD gpzoo "
                  f"{z['mean_log_predictive_density']:.3f} vs gallifrey {g['mean_log_predictive_density']:.3f} (higher is better); "
                  f"wall gpzoo {z['wall_s']:.0f} s vs gallifrey {g['fit_s']:.0f} s, load {load_start[0]:.2f}")
        payload["load_average_end"] = list(os.getloadavg())
        if not args.gallifrey_python and not args.with_gpzoo and (previous.get(name) or {}).get("gallifrey"):
            print(f"{name}: {args.out.name} already holds a gallifrey result; left as it is")
            continue
        report = merge_results(args.out, name, payload)
    return report


if __name__ == "__main__":
    main()
    raise SystemExit(0)
