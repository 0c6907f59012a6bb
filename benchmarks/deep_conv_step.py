"""One training step of a 2-layer deep TICK GP (Dutordoir et al. 2020, §4) against a straightforward JAX step and this machine's bound.

Setting: zoo model ``deep-tick`` with ``num_layers=2`` on MNIST-10 images
(28×28 → 24×24 → 20×20 with 5×5 patches), M = 100 inducing patches per layer, one hidden channel,
minibatch B = 64, RobustMax over 10 classes, float32, Adam. Timed, interleaved call by call (medians
over ``--repeats`` calls of a jit-compiled ``lax.scan`` of ``--steps`` updates, divided by the steps;
compilation and a warm-up call excluded), as wall-clock and process CPU time:

* ``gpzoo``: the SVI update ``fit`` runs (gpzoo's ``FastELBO`` on :class:`~gpzoo.inference.deep_conv.DeepConvSVGP`);
* ``straightforward``: the same bound written in this file the direct way — patches gathered,
  Kuf of both layers by an ``[B, P, M, E]`` broadcast of differences, the output layer's Kff diagonal
  from the dense ``[B, P, P]`` Gram of each image, dense triangular solves for every conditional,
  the same per-image hidden draws (same keys) — differentiated by plain autodiff, Adam by optax;
* ``exp`` and ``matmul``: this machine's exp throughput (``sum(exp(−x))`` over 10⁷ floats) and
  matmul throughput (n×n by n×n), measured in the same run.

The bound counts the step's dominant work, forward and backward, at the rates measured in the same
run (bound = exps / exp rate + matmul flops / matmul rate). Forward: exps = B·P₁·M (hidden Kuf) +
B·P₂·M (output Kuf) + B·P₂² (output Kff diagonal, every pair) and matmul flops = 2·B·P₁·M·E +
B·P₁·M² (hidden Kuf cross term and Luu⁻¹ Kuf) + 2·B·P₂·M·(E+2) + 2·B·P₂²·(E+2) (output Kuf and Kff
cross terms on location-augmented patches). Backward (reverse mode; an exp's derivative reuses its
value, so no exps are added): the hidden cross term's data patches are constants, so only dZ₁
(2·B·P₁·M·E); the triangular solve's cotangent and dLuu (2·B·P₁·M²); both operands of the output
Kuf depend on the parameters (4·B·P₂·M·(E+2)); the output Gram of the hidden draws is symmetric, one
matmul gives its cotangent (2·B·P₂²·(E+2)). ``bound_s`` and ``step_over_bound`` use forward +
backward (the step's work); ``forward_bound_s`` and ``step_over_forward_bound`` keep the forward-only
lower bound. Both steps' bounds agree (``agreement``: the two programs' ELBOs at the
same parameters and keys). Peak memory: XLA's temporary buffers of each compiled step, the process's
peak resident set after gpzoo's step has compiled and run (``peak_rss_gpzoo_only_mb``, before the
straightforward step is built) and at the end (both steps).

    .venv/bin/python benchmarks/deep_conv_step.py [--repeats 7] [--steps 5] [--quick]
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as conv_kernels.py: LAPACK's threads slow M×M solves here

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import optax  # noqa: E402
from jax.scipy.linalg import solve_triangular  # noqa: E402
from numpyro.infer import SVI  # noqa: E402
from numpyro.optim import optax_to_numpyro  # noqa: E402

from _common import machine_info, now, write_json  # noqa: E402
from conv_kernels import measure  # noqa: E402

OUT = Path(__file__).parent / "results" / "deep_conv_step.json"
JITTER = 1e-6
LEARNING_RATE = 0.01


def _positive(x):
    return jnp.exp(x)


def _lower(x):
    """A square matrix's strict lower part plus an exp'd diagonal (a Cholesky factor), ``[..., M, M]``."""
    return jnp.tril(x, -1) + jnp.exp(jnp.diagonal(x, axis1=-2, axis2=-1))[..., None] * jnp.eye(x.shape[-1], dtype=x.dtype)


def _unlower(L):
    return jnp.tril(L, -1) + jnp.log(jnp.diagonal(L, axis1=-2, axis2=-1))[..., None] * jnp.eye(L.shape[-1], dtype=L.dtype)


def straightforward_elbo(likelihood, image: int, patch: int, num_data: int):
    """The deep TICK bound (2 layers) written directly; returns ``elbo(params, X, y, key)`` on constrained params."""
    H1 = image - patch + 1  # hidden grid
    H2 = H1 - patch + 1  # output grid
    top = (patch - 1) // 2

    def patches_of(images, side):  # images [B, H, W] -> [B, P, E] by a gather of explicit indices
        out = side - patch + 1
        r = np.arange(out)[:, None, None, None] + np.arange(patch)[None, None, :, None]  # [out, 1, h, 1]
        c = np.arange(out)[None, :, None, None] + np.arange(patch)[None, None, None, :]  # [1, out, 1, w]
        return images[:, r, c].reshape(images.shape[0], out * out, patch * patch)

    def grid(out):
        t = np.arange(out) / (out - 1)
        return jnp.asarray(np.stack(np.meshgrid(t, t, indexing="ij"), -1).reshape(-1, 2), jnp.float32)  # [P, 2]

    def se(a, b, ls):  # exp(−½‖(a − b)/ℓ‖²) by broadcasting [..., M, E] differences
        return jnp.exp(-0.5 * jnp.sum(((a[..., :, None, :] - b) / ls) ** 2, axis=-1))

    def kl_white(q_mu, q_sqrt):  # Σ_c KL[N(m_c, S_c) || N(0, I)]
        return 0.5 * (jnp.sum(q_sqrt**2) + jnp.sum(q_mu**2) - q_mu.size
                      - 2.0 * jnp.sum(jnp.log(jnp.diagonal(q_sqrt, axis1=-2, axis2=-1))))

    loc1, loc2 = grid(H1), grid(H2)

    def elbo(p, X, y, key):
        B = X.shape[0]
        images = X.reshape(B, image, image)
        key_h, key_y = jax.random.split(key)
        _, key_v, key_e = jax.random.split(key_h, 3)
        # hidden layer: TICK-MOCK, identity mean, per-image v ~ q(v)
        x1 = patches_of(images, image)  # [B, P1, E]
        M = p["Z1"].shape[0]
        Kzz1 = p["var1"] * se(p["Z1"], p["Z1"], p["ls1"]) * se(p["Zl1"], p["Zl1"], p["lls1"])  # [M, M]
        L1 = jnp.linalg.cholesky(Kzz1 + JITTER * jnp.eye(M))
        Kfu1 = p["var1"] * se(x1, p["Z1"], p["ls1"]) * se(loc1, p["Zl1"], p["lls1"])[None]  # [B, P1, M]
        A1 = solve_triangular(L1, Kfu1.reshape(-1, M).T, lower=True).T.reshape(B, -1, M)  # [B, P1, M]
        resid = jnp.maximum(p["var1"] - jnp.sum(A1**2, -1), 1e-12)  # [B, P1]
        eps_v = jax.random.normal(key_v, (B, 1, M))
        v = p["q_mu1"][None] + jnp.einsum("cij,bcj->bci", p["q_sqrt1"], eps_v)  # [B, 1, M]
        eps = jax.random.normal(key_e, (B, H1 * H1, 1))
        crop = images[:, top:top + H1, top:top + H1].reshape(B, -1, 1)  # [B, P1, 1]
        h = crop + jnp.einsum("bpm,bcm->bpc", A1, v) + jnp.sqrt(resid)[..., None] * eps  # [B, P1, 1]
        # output layer: weighted TICK (mean normalisation), one latent function per class
        x2 = patches_of(h.reshape(B, H1, H1), H1)  # [B, P2, E]
        P2 = x2.shape[1]
        w = p["w2"] / P2  # [P2]
        Kzz2 = p["var2"] * se(p["Z2"], p["Z2"], p["ls2"]) * se(p["Zl2"], p["Zl2"], p["lls2"])
        L2 = jnp.linalg.cholesky(Kzz2 + JITTER * jnp.eye(M))
        Kpu = p["var2"] * se(x2, p["Z2"], p["ls2"]) * se(loc2, p["Zl2"], p["lls2"])[None]  # [B, P2, M]
        Kuf2 = jnp.einsum("p,bpm->mb", w, Kpu)  # [M, B]
        sq = jnp.sum(x2**2, -1)  # [B, P2]
        gram = jnp.exp(-0.5 * jnp.maximum(sq[:, :, None] + sq[:, None, :] - 2 * jnp.einsum("bpe,bqe->bpq", x2, x2), 0.0)
                       / p["ls2"] ** 2)  # [B, P2, P2] dense
        Kff = p["var2"] * jnp.einsum("p,bpq,q->b", w, gram * se(loc2, loc2, p["lls2"])[None], w)  # [B]
        A2 = solve_triangular(L2, Kuf2, lower=True)  # [M, B]
        mean = (p["q_mu2"] @ A2).T  # [B, K]
        var = (Kff - jnp.sum(A2**2, 0))[:, None] + jnp.sum(jnp.einsum("kji,jb->kib", p["q_sqrt2"], A2) ** 2, axis=1).T  # [B, K]
        ell = likelihood.variational_expectation(y, mean, var, key=key_y)  # [B]
        kl = kl_white(p["q_mu1"], p["q_sqrt1"]) + kl_white(p["q_mu2"], p["q_sqrt2"])
        return num_data / B * jnp.sum(ell) - kl

    return elbo


#: gpzoo's param names -> the straightforward step's.
NAMES = {"kernel.layers.0.base_kernel.lengthscale": "ls1", "kernel.layers.0.base_kernel.variance": "var1",
         "kernel.layers.0.location_lengthscale": "lls1", "kernel.output.base_kernel.lengthscale": "ls2",
         "kernel.output.base_kernel.variance": "var2", "kernel.output.location_lengthscale": "lls2", "kernel.output.weights": "w2",
         "inducing.layers.0.Z": "Z1", "inducing.layers.0.Z_loc": "Zl1", "inducing.output.Z": "Z2", "inducing.output.Z_loc": "Zl2",
         "hidden.1.q_mu": "q_mu1", "hidden.1.q_sqrt": "q_sqrt1", "q_mu": "q_mu2", "q_sqrt": "q_sqrt2"}
POSITIVE = ("ls1", "var1", "lls1", "ls2", "var2", "lls2")


def build(args):
    from gpzoo.analysis import datasets  # noqa: PLC0415
    from gpzoo.inference.elbo import FastELBO  # noqa: PLC0415
    from gpzoo.inference.fit import build_family  # noqa: PLC0415
    from gpzoo.inference.inducing import initialise_inducing  # noqa: PLC0415
    from gpzoo.models import zoo  # noqa: PLC0415

    ds = datasets.load("mnist-10", seed=0)
    X_all = np.asarray(ds.X_train, np.float32)
    y_all = np.asarray(ds.y_train)
    image = ds.image_shape[0]
    if args.image < image:  # --quick: a crop keeps the code paths, shrinks the work
        off = (image - args.image) // 2
        X_all = X_all.reshape(-1, image, image)[:, off:off + args.image, off:off + args.image].reshape(len(X_all), -1)
        image = args.image
    spec = zoo.get("deep-tick", image_shape=(image, image), task="multiclass", num_classes=10, num_inducing=args.M,
                   num_layers=2, patch_shape=(args.patch, args.patch))
    key = jax.random.PRNGKey(0)
    inducing = initialise_inducing(spec.inducing, spec.kernel, X_all, args.M, key, spec.inducing_init)
    family = build_family(spec, inducing, num_latent=10)
    N, B = X_all.shape[0], args.batch
    Xj, yj = jnp.asarray(X_all), jnp.asarray(y_all, jnp.int32)
    rng = np.random.default_rng(0)
    idx = jnp.asarray(np.stack([rng.permutation(N)[:B] for _ in range(args.steps)]))  # [steps, B]

    svi = SVI(family.model, family.guide, optax_to_numpyro(optax.adam(LEARNING_RATE)), FastELBO())
    state = jax.jit(lambda k: svi.init(k, Xj[:B], yj[:B], num_data=N))(key)
    params = {k: jnp.asarray(v) for k, v in svi.get_params(state).items()}

    @jax.jit
    def gpzoo_steps(state, idx):
        return jax.lax.scan(lambda s, b: svi.update(s, Xj[b], yj[b], num_data=N), state, idx)[1]

    jax.block_until_ready(gpzoo_steps(state, idx))  # compiled and run before anything of the straightforward step exists
    peak_rss_gpzoo_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    likelihood = spec.likelihood
    elbo = straightforward_elbo(likelihood, image, args.patch, N)
    ref = {NAMES[k]: v for k, v in params.items() if k in NAMES}
    unconstrained = {k: (jnp.log(v) if k in POSITIVE else _unlower(v) if "q_sqrt" in k else v) for k, v in ref.items()}
    optimizer = optax.adam(LEARNING_RATE)

    def constrain(u):
        return {k: (_positive(v) if k in POSITIVE else _lower(v) if "q_sqrt" in k else v) for k, v in u.items()}

    @jax.jit
    def straightforward_steps(carry, idx):
        def body(carry, batch):
            u, opt, key = carry
            key, sub = jax.random.split(key)
            loss, grads = jax.value_and_grad(lambda u: -elbo(constrain(u), Xj[batch], yj[batch], sub))(u)
            updates, opt = optimizer.update(grads, opt, u)
            return (optax.apply_updates(u, updates), opt, key), loss

        return jax.lax.scan(body, carry, idx)[1]

    carry = (unconstrained, optimizer.init(unconstrained), jax.random.PRNGKey(1))

    # agreement: the two bounds at the same parameters, minibatch and key
    @jax.jit
    def gpzoo_elbo(params, X, y, key):
        with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
            parts = family.parts()
            return N / X.shape[0] * jnp.sum(family.expected_log_lik(parts, X, y, key)) - family.kl(parts)

    batch, k = idx[0], jax.random.PRNGKey(7)
    # q means moved off zero (at q_mu = 0 RobustMax's expectation is the same for every input)
    moved = dict(params, q_mu=jax.random.normal(jax.random.PRNGKey(8), params["q_mu"].shape),
                 **{"hidden.1.q_mu": 0.3 * jax.random.normal(jax.random.PRNGKey(9), params["hidden.1.q_mu"].shape)})
    a = float(gpzoo_elbo(moved, Xj[batch], yj[batch], k))
    b = float(jax.jit(elbo)({NAMES[name]: v for name, v in moved.items() if name in NAMES}, Xj[batch], yj[batch], k))
    agreement = {"gpzoo_elbo": a, "straightforward_elbo": b, "rel_diff": abs(a - b) / abs(b)}

    x_exp = jnp.linspace(0.0, 3.0, args.exp_count, dtype=jnp.float32)
    mat = jax.random.normal(key, (args.matmul_n, args.matmul_n), jnp.float32)
    cases = {"exp": (jax.jit(lambda x: jnp.sum(jnp.exp(-x))), (x_exp,)), "matmul": (jax.jit(lambda a: a @ a), (mat,)),
             "gpzoo": (gpzoo_steps, (state, idx)), "straightforward": (straightforward_steps, (carry, idx))}
    temp = {}
    for name in ("gpzoo", "straightforward"):
        stats = cases[name][0].lower(*cases[name][1]).compile().memory_analysis()
        temp[name] = None if stats is None else int(stats.temp_size_in_bytes)
    P1, P2, E, M = (image - args.patch + 1) ** 2, (image - 2 * args.patch + 2) ** 2, args.patch**2, args.M
    counts = {"exps": B * P1 * M + B * P2 * M + B * P2 * P2,
              "matmul_flops": 2 * B * P1 * M * E + B * P1 * M * M + 2 * B * P2 * M * (E + 2) + 2 * B * P2 * P2 * (E + 2),
              "backward_matmul_flops": 2 * B * P1 * M * E + 2 * B * P1 * M * M + 4 * B * P2 * M * (E + 2) + 2 * B * P2 * P2 * (E + 2)}
    setting = {"model": "deep-tick", "num_layers": 2, "image_shape": [image, image], "patch_shape": [args.patch, args.patch],
               "M": M, "B": B, "P_hidden": P1, "P_output": P2, "E": E, "hidden_channels": 1, "num_classes": 10,
               "likelihood": type(likelihood).__name__, "dtype": "float32", "steps_per_call": args.steps,
               "exp_count": args.exp_count, "matmul_n": args.matmul_n, "optimizer": f"adam({LEARNING_RATE})",
               "peak_rss_gpzoo_only_mb": peak_rss_gpzoo_mb}
    return cases, counts, agreement, temp, setting


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--M", type=int, default=100)
    parser.add_argument("--patch", type=int, default=5)
    parser.add_argument("--image", type=int, default=28, help="centre crop of the MNIST images (smaller: --quick)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--exp-count", type=int, default=10_000_000)
    parser.add_argument("--matmul-n", type=int, default=1024)
    parser.add_argument("--quick", action="store_true", help="tiny sizes for a smoke test (numbers meaningless)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.M, args.patch, args.image, args.repeats, args.steps = 4, 8, 3, 10, 2, 2
        args.exp_count, args.matmul_n = 100_000, 128
    machine = machine_info()
    t0 = time.perf_counter()
    cases, counts, agreement, temp, setting = build(args)
    timings = measure(cases, args.repeats)
    for name in ("gpzoo", "straightforward"):
        for clock in ("wall_s", "cpu_s"):
            timings[name][clock] /= args.steps
    rates, bound, over, forward, over_forward = {}, {}, {}, {}, {}
    for clock in ("cpu_s", "wall_s"):
        exp_rate = args.exp_count / timings["exp"][clock]
        matmul_rate = 2 * args.matmul_n**3 / timings["matmul"][clock]
        rates[clock] = {"exp_per_s": exp_rate, "matmul_flops_per_s": matmul_rate}
        forward[clock] = counts["exps"] / exp_rate + counts["matmul_flops"] / matmul_rate
        bound[clock] = forward[clock] + counts["backward_matmul_flops"] / matmul_rate
        over[clock] = {name: timings[name][clock] / bound[clock] for name in ("gpzoo", "straightforward")}
        over_forward[clock] = {name: timings[name][clock] / forward[clock] for name in ("gpzoo", "straightforward")}
    report = {
        "date": now(),
        "machine": {**machine, "load_average_end": list(os.getloadavg())},
        "protocol": "medians over repeats of interleaved calls of jit-compiled lax.scan loops of SVI/Adam steps, per step; "
                    "wall and process CPU time; the bound counts the step's dominant exps and matmul flops, forward and "
                    "backward (forward_bound_s: the forward pass alone)",
        "setting": setting,
        "counts": counts,
        "rates": rates,
        "bound_s": bound,
        "step_over_bound": over,
        "forward_bound_s": forward,
        "step_over_forward_bound": over_forward,
        "speedup_over_straightforward": {clock: timings["straightforward"][clock] / timings["gpzoo"][clock] for clock in ("cpu_s", "wall_s")},
        "goals": {"speedup >= 3": None, "within 3x of bound": None, "under 2 GB": None},
        "temp_bytes": temp,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # both steps
        "agreement": agreement,
        "timings": timings,
        "seconds_total": time.perf_counter() - t0,
    }
    speed = report["speedup_over_straightforward"]["cpu_s"]
    report["goals"] = {"speedup >= 3 (cpu)": bool(speed >= 3), "within 3x of bound (cpu)": bool(over["cpu_s"]["gpzoo"] <= 3),
                       "under 2 GB (gpzoo: process peak RSS before the straightforward step exists)":
                           bool(setting["peak_rss_gpzoo_only_mb"] < 2048)}
    write_json(args.out, report)
    print(f"deep-tick 2 layers B={args.batch} M={args.M}: gpzoo {1e3 * timings['gpzoo']['cpu_s']:.1f} ms cpu "
          f"({1e3 * timings['gpzoo']['wall_s']:.1f} wall), straightforward {1e3 * timings['straightforward']['cpu_s']:.1f} ms cpu; "
          f"speedup {speed:.2f}; bound {1e3 * bound['cpu_s']:.1f} ms, gpzoo / bound {over['cpu_s']['gpzoo']:.2f}; "
          f"peak RSS {report['peak_rss_mb']:.0f} MB; agreement {agreement['rel_diff']:.2e}")
    return report


if __name__ == "__main__":
    main()
