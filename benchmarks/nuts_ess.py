"""NUTS on a zoo model: effective samples per second of the slowest hyperparameter, against GPflow's
SGPMC on the same model and target.

Model (identical in both libraries, float64): ``svgp-rbf`` — a squared-exponential kernel with
priors variance ~ Gamma(2, 1) and lengthscale ~ Gamma(2, 2) (concentration, rate), a Bernoulli
likelihood with the logistic link, zero mean, M inducing inputs fixed at ``linspace(-3, 3, M)``,
jitter 1e-6 on K(Z, Z), whitened inducing outputs v ~ N(0, I), u = L v (Hensman, Matthews,
Filippone & Ghahramani 2015). The target is the hyperparameters jointly with v under
Σ_n E_{p(f_n | u)}[log p(y_n | f_n)] (20-point Gauss–Hermite in both) plus the log priors — gpzoo's
``gpzoo.sample(..., method="whitened-inducing")`` and GPflow's ``SGPMC.log_posterior_density``.
Both samplers work in the same unconstrained coordinates: the GPflow parameters get the
``Exp`` bijector, which is what NumPyro uses for a positive site (GPflow's default is a softplus).

Data (numpy, seed ``--seed``): x ~ U(-3, 3), N points, y ~ Bernoulli(σ(2 sin 1.5x)).

Protocol:

1. Target check: the log density of both targets at a few points of the unconstrained space
   (θ = log lengthscale, log variance ~ N(0, 0.5²), v ~ N(0, I)); ``target_check.max_abs_diff`` says
   whether the two programs sample the same distribution.
2. gpzoo: ``gpzoo.sample`` on a ``FitResult`` holding Z (``fit(steps=0)``, then Z set), NUTS with
   ``--chains`` chains run one after another (``chain_method="sequential"``), ``--warmup`` warmup and
   ``--samples`` kept draws each, target acceptance 0.8, max tree depth 10, NumPyro's warmup
   (dual-averaging step size and a diagonal mass matrix, Stan's windowed scheme). Initial state:
   v = 0, hyperparameters uniform on (-2, 2) in unconstrained space. Wall time of the call;
   compile time as JAX's backend-compile events during it (``CompileCounter``; tracing is not in
   it), sampling time = wall − compile (so it still holds NumPyro's tracing and the call's
   fixed costs: initialisation, the diagnostics and the DataTree with pointwise log-likelihoods).
3. GPflow (``--gpflow-python``: an interpreter with GPflow 2.11, TensorFlow and TensorFlow
   Probability; never a gpzoo dependency; without it the anchor is not run and the file says so),
   in a fresh subprocess fed the same X, y, Z through an .npz: ``gpflow.models.SGPMC`` with
   ``gpflow.optimizers.SamplingHelper``, ``tfp.mcmc.NoUTurnSampler`` (max tree depth 10) in
   ``tfp.mcmc.DualAveragingStepSizeAdaptation`` (target 0.8, adapting over all the warmup
   steps), ``tfp.mcmc.sample_chain`` inside one ``tf.function`` (graph mode, as GPflow's MCMC
   notebook), the same number of chains run one after another, each from v = 0 and
   hyperparameters uniform on (-2, 2) unconstrained. The function is traced once before the
   chains (``get_concrete_function``); its first call also optimises the graph, so its "compile"
   time is the tracing plus the first chain's excess over the median of the others (none with one
   chain), and sampling time is the chains' wall time less that excess. Its draws come back as an
   .npz (no pickle).
4. Both sets of draws are scored here by the same estimators: bulk ESS (``arviz.ess``,
   rank-normalised, Vehtari et al. 2021) and NumPyro's ``effective_sample_size`` of each
   hyperparameter over all chains, split r_hat, post-warmup divergences, leapfrog steps per draw.
   The headline is ESS/s of the slowest hyperparameter (least bulk ESS over sampling seconds),
   and the ratio gpzoo / GPflow of it (> 1: gpzoo gives more effective samples per second).

Differences between the two setups (also in the result file):

* Mass matrix: NumPyro adapts a diagonal mass matrix in its warmup; ``tfp.mcmc.NoUTurnSampler``
  keeps the identity (TFP's adaptive preconditioning lives only in ``tfp.experimental``).
* Step size: NumPyro's dual averaging restarts at each of Stan's warmup windows and ends at the
  averaged step; TFP's ``DualAveragingStepSizeAdaptation`` runs one dual-averaging scheme over the
  whole warmup and keeps its averaged step. Initial step size 1 in both (NumPyro first searches a
  reasonable one).
* Chains: separate random initial points (same scheme, different random streams).
* Execution: JAX/XLA compiled programs against TensorFlow's graph mode on the same CPU cores.
* Fixed costs: gpzoo's timed call also builds its diagnostics and its ArviZ DataTree (pointwise
  log-likelihoods of every draw); GPflow's timing is the bare ``sample_chain`` calls.

Run (one process; the GPflow part starts its own). On 2 shared CPU cores a calibration run (N 200,
M 16, 2 chains × 80 iterations) took 184 s in gpzoo and 16 s in GPflow, so the default settings
(4 chains × 600 iterations) take roughly 20-45 minutes, nearly all of it gpzoo's side::

    .venv/bin/python benchmarks/nuts_ess.py --gpflow-python /path/to/gpflow-venv/bin/python
        [--N 200] [--M 16] [--chains 4] [--warmup 300] [--samples 300] [--seed 0]
        [--out benchmarks/results/nuts_ess.json]

A GPflow environment: ``python -m venv /path/to/gpflow-venv && /path/to/gpflow-venv/bin/pip install
gpflow tensorflow tensorflow-probability tf-keras``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
from _common import machine_info, now, write_json

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "nuts_ess.json"
#: priors as (concentration, rate) of a Gamma, the same in NumPyro and TFP
PRIORS = {"lengthscale": (2.0, 2.0), "variance": (2.0, 1.0)}
HYPERS = ("lengthscale", "variance")
JITTER, TARGET_ACCEPT, MAX_TREE_DEPTH, INIT_RADIUS = 1e-6, 0.8, 10, 2.0
DIFFERENCES = [
    "mass matrix: NumPyro adapts a diagonal mass matrix during warmup (Stan's windows); tfp.mcmc.NoUTurnSampler uses the identity",
    "step size: NumPyro's dual averaging restarts at each warmup window; TFP's DualAveragingStepSizeAdaptation runs once over the whole warmup",
    "initial step size: NumPyro searches a reasonable step from 1; TFP starts at 1",
    "initial points: same scheme (v = 0, unconstrained hyperparameters uniform on (-2, 2)), different random streams",
    "execution: JAX/XLA compiled programs vs TensorFlow graph mode (tf.function, no XLA)",
    "compile time: gpzoo's is JAX backend-compile events (tracing excluded); GPflow's is tracing the tf.function once plus the first chain's excess over the others' median",
    "fixed costs: gpzoo's timed call also builds its diagnostics and ArviZ DataTree (pointwise log-likelihoods of every draw); GPflow's timing is the bare sample_chain calls",
]


def make_data(N: int, M: int, seed: int):
    """x ~ U(-3, 3) [N, 1], y ~ Bernoulli(σ(2 sin 1.5x)) in {0, 1}, Z = linspace(-3, 3, M) [M, 1]."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3.0, 3.0, (N, 1))
    p = 1.0 / (1.0 + np.exp(-2.0 * np.sin(1.5 * X[:, 0])))
    y = (rng.uniform(size=N) < p).astype(np.int64)
    Z = np.linspace(-3.0, 3.0, M)[:, None]
    return X, y, Z


def check_points(M: int, seed: int, count: int = 3) -> np.ndarray:
    """``count`` points of the unconstrained space, rows [log lengthscale, log variance, v_1..v_M]."""
    rng = np.random.default_rng(seed + 1000)
    return np.concatenate([0.5 * rng.normal(size=(count, 2)), rng.normal(size=(count, M))], axis=1)


# ----------------------------------------------------------------------------- gpzoo
def _gpzoo_init(X, y, Z):
    import dataclasses  # noqa: PLC0415

    import numpyro.distributions as dist  # noqa: PLC0415

    import gpzoo  # noqa: PLC0415
    from gpzoo.models import zoo  # noqa: PLC0415
    from gpzoo.models.kernels import SquaredExponential  # noqa: PLC0415

    spec = zoo.get("svgp-rbf", input_dim=1, task="binary", num_classes=2, num_inducing=Z.shape[0])
    kernel = SquaredExponential(lengthscale=dist.Gamma(*PRIORS["lengthscale"]), variance=dist.Gamma(*PRIORS["variance"]))
    spec = dataclasses.replace(spec, kernel=kernel, jitter=JITTER)
    assert spec.whiten and spec.likelihood.link == "logit" and spec.likelihood.num_gauss_hermite == 20
    init = gpzoo.fit(spec, X, y, steps=0, progress=False)
    init.params["inducing.Z"] = np.asarray(Z, np.float64).copy()
    return init


def gpzoo_log_density(init, points: np.ndarray) -> list[float]:
    """gpzoo's log target (minus NumPyro's potential energy) at unconstrained ``points``."""
    import jax.numpy as jnp  # noqa: PLC0415
    from numpyro.infer.util import potential_energy  # noqa: PLC0415

    from gpzoo.inference.mcmc import _fixed_params, _whitened_model  # noqa: PLC0415

    family = init.family
    args = (family, _fixed_params(init), jnp.asarray(init.X_train), family._observed(jnp.asarray(init.y_train)))
    out = []
    for row in points:
        params = {"kernel.lengthscale": jnp.asarray(row[0]), "kernel.variance": jnp.asarray(row[1]),
                  "v": jnp.asarray(row[2:])[None, :]}
        out.append(-float(potential_energy(_whitened_model, args, {}, params)))
    return out


def run_gpzoo(X, y, Z, *, chains: int, warmup: int, samples: int, seed: int) -> dict:
    import jax  # noqa: PLC0415

    from gpzoo.inference.mcmc import sample  # noqa: PLC0415
    from gpzoo.inference.programs import CompileCounter  # noqa: PLC0415

    init = _gpzoo_init(X, y, Z)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        with CompileCounter() as counter:
            res = sample(init, None, None, num_warmup=warmup, num_samples=samples, num_chains=chains, seed=seed,
                         method="whitened-inducing", target_accept_prob=TARGET_ACCEPT, max_tree_depth=MAX_TREE_DEPTH,
                         chain_method="sequential")
            jax.block_until_ready(res.samples["v"])
        wall = time.perf_counter() - start
    stats = res.datatree["sample_stats"]
    return {
        "draws": {name: np.asarray(res.samples[f"kernel.{name}"], np.float64) for name in HYPERS},
        "wall_s": wall, "compile_s": counter.seconds, "compilations": counter.count,
        "sampling_s": max(wall - counter.seconds, 1e-9),
        "divergences": int(res.diagnostics["divergences"]),
        "step_size": [float(s) for s in res.diagnostics["step_size"]],
        "leapfrogs_per_draw": float(np.asarray(stats["n_steps"]).mean()),
        "warnings": sorted({str(w.message) for w in caught if "SamplerWarning" in type(w.message).__name__}),
        "log_density_at_check_points": gpzoo_log_density(init, check_points(Z.shape[0], seed)),
    }


# ----------------------------------------------------------------------------- GPflow, in its own interpreter
_GPFLOW = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    t0 = time.perf_counter()
    import tensorflow as tf
    import tensorflow_probability as tfp
    import gpflow
    t_import = time.perf_counter() - t0
    tfd, tfb = tfp.distributions, tfp.bijectors
    data = np.load(sys.argv[1], allow_pickle=False)
    cfg = json.loads(sys.argv[2])
    X, Y, Z = data["X"], data["y"].astype(np.float64)[:, None], data["Z"]
    f64 = lambda a: tf.constant(a, tf.float64)
    kernel = gpflow.kernels.SquaredExponential()
    kernel.lengthscales = gpflow.Parameter(1.0, transform=tfb.Exp(),
                                           prior=tfd.Gamma(f64(cfg["priors"]["lengthscale"][0]), f64(cfg["priors"]["lengthscale"][1])))
    kernel.variance = gpflow.Parameter(1.0, transform=tfb.Exp(),
                                       prior=tfd.Gamma(f64(cfg["priors"]["variance"][0]), f64(cfg["priors"]["variance"][1])))
    gpflow.config.set_default_jitter(cfg["jitter"])
    likelihood = gpflow.likelihoods.Bernoulli(invlink=tf.sigmoid)
    model = gpflow.models.SGPMC((X, Y), kernel=kernel, likelihood=likelihood, inducing_variable=Z)
    gpflow.set_trainable(model.inducing_variable, False)
    params = [kernel.lengthscales, kernel.variance, model.V]
    helper = gpflow.optimizers.SamplingHelper(model.log_posterior_density, params)

    def unconstrained_state(row):
        return [f64(row[0]), f64(row[1]), f64(np.asarray(row[2:])[:, None])]

    check = [float(helper.target_log_prob_fn(*unconstrained_state(row))) for row in data["check_points"]]

    nuts = tfp.mcmc.NoUTurnSampler(helper.target_log_prob_fn, step_size=f64(1.0), max_tree_depth=cfg["max_tree_depth"])
    kernel_mc = tfp.mcmc.DualAveragingStepSizeAdaptation(nuts, num_adaptation_steps=cfg["warmup"],
                                                         target_accept_prob=f64(cfg["target_accept"]))

    @tf.function
    def run_chain(ell, var, v, seed):
        return tfp.mcmc.sample_chain(
            num_results=cfg["samples"], num_burnin_steps=cfg["warmup"], current_state=[ell, var, v],
            kernel=kernel_mc, seed=seed,
            trace_fn=lambda _, pkr: (pkr.inner_results.has_divergence, pkr.inner_results.leapfrogs_taken,
                                     pkr.new_step_size))

    M = Z.shape[0]
    t = time.perf_counter()
    spec = [tf.TensorSpec([], tf.float64), tf.TensorSpec([], tf.float64), tf.TensorSpec([M, 1], tf.float64),
            tf.TensorSpec([2], tf.int32)]
    run_chain.get_concrete_function(*spec)
    trace_s = time.perf_counter() - t
    rng = np.random.default_rng(cfg["seed"])
    out = {"lengthscale": [], "variance": [], "v": [], "divergences": 0, "leapfrogs": [], "step_size": [], "chain_s": []}
    for chain in range(cfg["chains"]):
        ell0, var0 = rng.uniform(-cfg["init_radius"], cfg["init_radius"], 2)
        t = time.perf_counter()
        (ell, var, v), (div, leap, step) = run_chain(f64(ell0), f64(var0), tf.zeros([M, 1], tf.float64),
                                                     tf.constant([cfg["seed"], chain], tf.int32))
        out["chain_s"].append(time.perf_counter() - t)
        out["lengthscale"].append(np.exp(ell.numpy())); out["variance"].append(np.exp(var.numpy()))
        out["v"].append(v.numpy()[..., 0]); out["divergences"] += int(div.numpy().sum())
        out["leapfrogs"].append(float(leap.numpy().mean())); out["step_size"].append(float(step.numpy()[-1]))
    np.savez(sys.argv[3], lengthscale=np.stack(out["lengthscale"]), variance=np.stack(out["variance"]),
             v=np.stack(out["v"]))
    print(json.dumps({"import_s": t_import, "trace_s": trace_s, "chain_s": out["chain_s"],
                      "divergences": out["divergences"], "leapfrogs_per_draw": float(np.mean(out["leapfrogs"])),
                      "step_size": out["step_size"], "log_density_at_check_points": check,
                      "versions": {"gpflow": gpflow.__version__, "tensorflow": tf.__version__,
                                   "tensorflow_probability": tfp.__version__}}))
""")


def run_gpflow(python: str, X, y, Z, *, chains: int, warmup: int, samples: int, seed: int) -> dict:
    cfg = {"chains": chains, "warmup": warmup, "samples": samples, "seed": seed, "priors": PRIORS, "jitter": JITTER,
           "max_tree_depth": MAX_TREE_DEPTH, "target_accept": TARGET_ACCEPT, "init_radius": INIT_RADIUS}
    with tempfile.TemporaryDirectory() as tmp:
        inputs, draws = Path(tmp) / "inputs.npz", Path(tmp) / "draws.npz"
        np.savez(inputs, X=X, y=y, Z=Z, check_points=check_points(Z.shape[0], seed))
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
        start = time.perf_counter()
        proc = subprocess.run([python, "-c", _GPFLOW, str(inputs), json.dumps(cfg), str(draws)], capture_output=True,
                              text=True, check=False, env=env)
        process_s = time.perf_counter() - start
        if proc.returncode != 0:
            return {"error": proc.stderr[-3000:], "returncode": proc.returncode}
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        with np.load(draws, allow_pickle=False) as npz:
            result["draws"] = {name: np.asarray(npz[name], np.float64) for name in HYPERS}
    chain_s = result["chain_s"]
    # the first call of the traced graph also optimises it (Grappler): its excess over the other chains' median
    excess = max(0.0, chain_s[0] - float(np.median(chain_s[1:]))) if len(chain_s) > 1 else 0.0
    result["process_s"] = process_s
    result["first_call_excess_s"] = excess
    result["compile_s"] = result["trace_s"] + excess
    result["wall_s"] = result["trace_s"] + float(sum(chain_s))
    result["sampling_s"] = max(result["wall_s"] - result["compile_s"], 1e-9)
    return result


# ----------------------------------------------------------------------------- scoring
def score(run: dict) -> dict:
    """Bulk ESS (ArviZ) and NumPyro's ESS and split r_hat of each hyperparameter; the slowest's ESS/s."""
    import arviz as az  # noqa: PLC0415
    from numpyro.diagnostics import effective_sample_size, split_gelman_rubin  # noqa: PLC0415

    per = {}
    for name, draws in run.pop("draws").items():  # [chains, draws]
        per[name] = {
            "ess_bulk": float(az.ess(draws, method="bulk")),
            "ess_numpyro": float(effective_sample_size(draws[..., None])[0]),
            "r_hat": float(split_gelman_rubin(draws[..., None])[0]) if draws.shape[0] > 1 else None,
            "mean": float(draws.mean()), "sd": float(draws.std()),
        }
    slowest = min(per, key=lambda k: per[k]["ess_bulk"])
    ess = per[slowest]["ess_bulk"]
    return {**run, "hyperparameters": per, "slowest": slowest, "min_ess_bulk": ess,
            "ess_per_s": ess / run["sampling_s"], "ess_per_s_with_compile": ess / run["wall_s"],
            "finite": all(np.isfinite(v["ess_bulk"]) for v in per.values())}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--N", type=int, default=200)
    p.add_argument("--M", type=int, default=16)
    p.add_argument("--chains", type=int, default=4)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--samples", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpflow-python", help="an interpreter with GPflow installed (the anchor; not run without it)")
    p.add_argument("--skip-gpzoo", action="store_true", help="run only the GPflow side (checking its environment)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)

    import jax  # noqa: PLC0415

    x64_before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        X, y, Z = make_data(args.N, args.M, args.seed)
        settings = {"model": "svgp-rbf", "likelihood": "Bernoulli, logistic link, 20-point Gauss-Hermite",
                    "N": args.N, "M": args.M, "chains": args.chains, "warmup": args.warmup, "samples": args.samples,
                    "seed": args.seed, "dtype": "float64", "priors_gamma_concentration_rate": PRIORS,
                    "jitter": JITTER, "target_accept_prob": TARGET_ACCEPT, "max_tree_depth": MAX_TREE_DEPTH,
                    "chain_method": "sequential (both)", "Z": "linspace(-3, 3, M)",
                    "data": "x ~ U(-3, 3), y ~ Bernoulli(sigmoid(2 sin 1.5x)), numpy default_rng(seed)",
                    "init": f"v = 0, unconstrained hyperparameters uniform on (-{INIT_RADIUS}, {INIT_RADIUS})",
                    "ess": "arviz.ess(method='bulk') per hyperparameter over all chains (numpyro's alongside)"}
        report = {"benchmark": "nuts_ess", "created": now(), "machine": machine_info(), "settings": settings,
                  "differences_from_gpflow": DIFFERENCES}
        report["gpzoo"] = None if args.skip_gpzoo else score(run_gpzoo(X, y, Z, chains=args.chains, warmup=args.warmup,
                                                                       samples=args.samples, seed=args.seed))
        report["load_average_after_gpzoo"] = list(os.getloadavg())
        gpflow = None
        if args.gpflow_python:
            gpflow = run_gpflow(args.gpflow_python, X, y, Z, chains=args.chains, warmup=args.warmup,
                                samples=args.samples, seed=args.seed)
            if "error" not in gpflow:
                gpflow = score(gpflow)
        report["gpflow"] = gpflow
        report["gpflow_note"] = None if args.gpflow_python else "no --gpflow-python given: the GPflow anchor was not run"
        ours = report["gpzoo"]
        ok = bool(ours and gpflow and "error" not in gpflow)
        if ok:
            a, b = ours["log_density_at_check_points"], gpflow["log_density_at_check_points"]
            report["target_check"] = {"gpzoo": a, "gpflow": b, "max_abs_diff": float(np.max(np.abs(np.subtract(a, b))))}
        report["ratio_ess_per_s_gpzoo_over_gpflow"] = ours["ess_per_s"] / gpflow["ess_per_s"] if ok else None
        report["ratio_ess_per_s_with_compile_gpzoo_over_gpflow"] = (
            ours["ess_per_s_with_compile"] / gpflow["ess_per_s_with_compile"] if ok else None)
        report["load_average_end"] = list(os.getloadavg())
    finally:
        jax.config.update("jax_enable_x64", x64_before)
    write_json(args.out, report)
    return report


if __name__ == "__main__":
    rep = main()
    print(json.dumps({k: rep[k] for k in ("ratio_ess_per_s_gpzoo_over_gpflow", "target_check") if k in rep}, indent=2))
