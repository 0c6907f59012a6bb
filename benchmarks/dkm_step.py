"""Per-step time and memory of a convolutional DKM training step (float32): gpzoo vs a straightforward JAX version vs the matmul bound.

The step (the issue's "smallest conv DKM" of Milsom et al. 2024's reference implementation):
64 learned 3×3 inducing patches on 16×16×3 images, batch 64, two Gram layers of width 64 (the
second after a stride-2 mix-up), normalised-Gaussian kernel, batch kernel normalisation per
image, global average pooling, an output GP over 10 classes with a 1,000-sample Monte Carlo
softmax, ν = 1e-3, SKR on (γ = 16, λ = 0.1), the paper's Taylor KL (eq. 8). One step = objective,
gradient and an Adam update, jitted.

* ``gpzoo``: :func:`gpzoo.inference.dkm.train_dkm`'s compiled step (triangular solves, fused
  convolutions via ``lax.conv_general_dilated``).
* ``straightforward``: the same objective written here the plain way — explicit inverses
  (``jnp.linalg.inv``) for every K⁻¹/G⁻¹, convolutions as explicit patch extraction (im2col by
  slicing) and matmuls, ``jax.grad``, optax Adam, jitted. Its value at the same parameters (test
  mode) is checked against gpzoo's (``loss_rel_diff``).
* ``matmul bound``: the step's FLOPs (XLA's cost analysis of gpzoo's compiled step) divided by
  this machine's measured float32 matmul rate (a 1024³ ``jnp.dot``, best of several).

Both steps run with OpenBLAS single-threaded (as ``gpzoo.fit`` does). Peak memory is XLA's memory analysis of each compiled step (arguments + outputs + temporaries).
The authors' PyTorch implementation is not run here (torch is not installed in this project's
environment); the JSON says so, next to the issue's figures for it. Writes
``benchmarks/results/dkm_step.json``.

    /work/venv/bin/python benchmarks/dkm_step.py [--repeats 5] [--steps 10]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import threadpoolctl

jax.config.update("jax_enable_x64", False)

from _common import machine_info, now, write_json  # noqa: E402

from gpzoo.inference import dkm  # noqa: E402
from gpzoo.models.dkm import DKMConfig, GramLayerSpec  # noqa: E402
from gpzoo.models.kernels.gram import GramBlocks, batch_kernel_norm, normalised_gaussian_kernel  # noqa: E402
from gpzoo.models.likelihoods import Softmax  # noqa: E402

OUT = Path(__file__).parent / "results" / "dkm_step.json"
IMAGE, BATCH, WIDTH, CLASSES, MC = (16, 16, 3), 64, 64, 10, 1000


def config() -> DKMConfig:
    layers = (GramLayerSpec(WIDTH, (3, 3), 1, batch_norm=True), GramLayerSpec(WIDTH, (3, 3), 2, batch_norm=True))
    return DKMConfig(layers=layers, likelihood=Softmax(num_classes=CLASSES, num_mc_samples=MC), num_outputs=CLASSES,
                     architecture="conv", num_input_inducing=WIDTH, kernel="normalised_gaussian", nu=1e-3, skr=True,
                     skr_gamma=WIDTH // 4, skr_jitter=0.1, kl="taylor_frobenius", batch_norm_mode="image")


# --------------------------------------------------------------------------- the straightforward version
def _patches(x, stride: int):
    """im2col with zero padding: x ``[B, H, W, F]`` -> ``[B, H', W', 9·F]`` by slicing (3×3 window)."""
    B, H, W, F = x.shape
    padded = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    Ho, Wo = (H - 1) // stride + 1, (W - 1) // stride + 1
    cols = [padded[:, dy:dy + stride * (Ho - 1) + 1:stride, dx:dx + stride * (Wo - 1) + 1:stride, :]
            for dy in range(3) for dx in range(3)]
    return jnp.concatenate(cols, axis=-1)  # [B, H', W', 9F]


def _nystrom_inv(K, G_tilde):
    K_inv = jnp.linalg.inv(K.ii)  # [P, P]
    A = K.ti @ K_inv  # [B, *S, P]
    return GramBlocks(G_tilde, A @ G_tilde, K.t - jnp.sum(A * K.ti, -1) + jnp.sum((A @ G_tilde) * A, -1))


def straightforward_objective(params, cfg: DKMConfig, X, y, noise, num_data):
    """The DKM objective (Milsom et al. 2024, eq. 27) with inverses and im2col; ``noise`` None: test mode."""
    Z = params["inducing_inputs"]  # [P0, 3, 3, C]
    P0, nu0 = Z.shape[0], math.prod(Z.shape[1:])
    Zf = Z.reshape(P0, nu0)
    px = _patches(X, 1)  # [B, H, W, 9C] (same window order as Z's reshape: dy, dx, c)
    G = GramBlocks(Zf @ Zf.T / nu0, px @ Zf.T / nu0, jnp.sum(px * px, -1) / nu0)
    kl_total = 0.0
    for i, (spec, lp) in enumerate(zip(cfg.layers, params["layers"])):
        Phi = normalised_gaussian_kernel(G, jnp.exp(lp["log_scale"]), jnp.exp(lp["log_bias"]))
        C = lp["mix"] / math.sqrt(lp["mix"].shape[-2])  # [3, 3, P_in, P]
        Cf = C.reshape(9 * C.shape[2], C.shape[3])  # [9 P_in, P]
        K_ii = sum(C[a, b].T @ Phi.ii @ C[a, b] for a in range(3) for b in range(3)) / 9.0
        K_ii = K_ii + cfg.kernel_jitter * jnp.mean(jnp.diagonal(K_ii)) * jnp.eye(K_ii.shape[0])
        K_ti = _patches(Phi.ti, spec.stride) @ Cf / 9.0  # [B, H', W', P]
        K_t = jnp.sum(_patches(Phi.t[..., None], spec.stride), -1) / 9.0  # [B, H', W']
        V = dkm.chol_factor(lp["V"])
        G_ii = V @ V.T
        eye = jnp.eye(G_ii.shape[0])
        G_tilde = G_ii + cfg.skr_jitter * eye if noise is None else (V @ noise[i]) @ (V @ noise[i]).T / noise[i].shape[1] + cfg.skr_jitter * eye
        D = jnp.linalg.inv(G_ii) @ K_ii - eye
        kl_total = kl_total + cfg.layer_nu(i) * 0.25 * jnp.sum(D * D)
        G = _nystrom_inv(GramBlocks(K_ii, K_ti, K_t), G_tilde)
        G = batch_kernel_norm(G, lp["bn_log_scale_inducing"], lp["bn_log_scale_data"], cfg.batch_norm_mode)
    B, S, P = G.ti.shape[0], G.t.shape[1] * G.t.shape[2], G.ii.shape[0]
    G_inv = jnp.linalg.inv(G.ii + cfg.kernel_jitter * jnp.mean(jnp.diagonal(G.ii)) * jnp.eye(P))
    g_bar = jnp.mean(G.ti.reshape(B, S, P), 1)  # [B, P]
    ti = G.ti.reshape(B, S, P)
    residual = G.t.reshape(B, S) - jnp.einsum("bsp,pq,bsq->bs", ti, G_inv, ti)
    G = GramBlocks(G.ii, g_bar, jnp.einsum("bp,pq,bq->b", g_bar, G_inv, g_bar) + jnp.sum(jnp.maximum(residual, 0), 1) / S**2)
    op = params["output"]
    K = normalised_gaussian_kernel(G, jnp.exp(op["log_scale"]), jnp.exp(op["log_bias"]))
    K_ii = K.ii + cfg.kernel_jitter * jnp.mean(jnp.diagonal(K.ii)) * jnp.eye(P)
    K_inv = jnp.linalg.inv(K_ii)
    A = K.ti @ K_inv  # [B, P]
    S_chol = dkm.chol_factor(op["V"])
    Sigma = S_chol @ S_chol.T
    f_mean = A @ op["mu"]  # [B, C]
    f_var = jnp.maximum(K.t - jnp.sum(A * K.ti, -1), 0.0) + jnp.sum((A @ Sigma) * A, -1)  # [B]
    num_classes = op["mu"].shape[1]
    D = jnp.linalg.inv(Sigma) @ K_ii - jnp.eye(P)
    kl_out = num_classes * 0.25 * jnp.sum(D * D) + 0.5 * jnp.sum(op["mu"] * (K_inv @ op["mu"]))
    f_var = jnp.broadcast_to(f_var[:, None], f_mean.shape)
    ell = jnp.sum(cfg.likelihood.variational_expectation(y, f_mean, f_var, jax.random.PRNGKey(7)))
    return ell * num_data / B - kl_total - cfg.output_kl_weight * kl_out


def straightforward_step(cfg: DKMConfig, num_data: int):
    adam = optax.scale_by_adam(b1=0.8, b2=0.9)

    @jax.jit
    def step(params, state, key, X, y):
        noise = dkm.skr_noise(key, cfg, X.dtype)
        loss, grads = jax.value_and_grad(lambda p: -straightforward_objective(p, cfg, X, y, noise, num_data) / num_data)(params)
        updates, state = adam.update(grads, state, params)
        return jax.tree_util.tree_map(lambda a, u: a - 1e-2 * u, params, updates), state, loss

    return adam, step


# --------------------------------------------------------------------------- measurement
def _time(fn, repeats: int, steps: int) -> list[float]:
    """Seconds per step of ``fn(i)`` (which returns something to block on), best-of style list over repeats."""
    per_step = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(steps):
            out = fn(i)
        jax.block_until_ready(out)
        per_step.append((time.perf_counter() - t0) / steps)
    return per_step


def matmul_rate(repeats: int = 5, n: int = 1024) -> float:
    """Measured float32 matmul FLOP/s of this machine (2n³ FLOPs per ``jnp.dot``, best of ``repeats``)."""
    a = jnp.ones((n, n), jnp.float32)
    dot = jax.jit(jnp.dot)
    jax.block_until_ready(dot(a, a))
    best = min(_time(lambda i: dot(a, a), repeats, 3))
    return 2.0 * n**3 / best


def _memory(compiled) -> int | None:
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    return int(analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes)


def main(argv=None) -> dict:
    with threadpoolctl.threadpool_limits(1, user_api="blas"):  # as gpzoo.fit: BLAS threads slow LAPACK calls down
        return _main(argv)


def _main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    cfg = config()
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.uniform(size=(BATCH, *IMAGE)), jnp.float32)
    y = jnp.asarray(rng.integers(0, CLASSES, BATCH))
    params = dkm.init_params(jax.random.PRNGKey(0), cfg, X)
    params = jax.tree_util.tree_map(lambda a: jnp.array(a, jnp.float32), params)
    params["output"]["mu"] = 0.1 * jax.random.normal(jax.random.PRNGKey(1), params["output"]["mu"].shape)

    # like-for-like: the same objective at the same parameters (test mode: no SKR draw)
    core_value = float(dkm.objective(params, cfg, X, y, BATCH, None, train=False)[0])
    plain_value = float(jax.jit(lambda p: straightforward_objective(p, cfg, X, y, None, BATCH))(params))

    adam, gpzoo_step = dkm.compiled_train_step(cfg, BATCH, BATCH, 0.8, 0.9)
    nu, lr = jnp.asarray([cfg.layer_nu(i) for i in range(cfg.num_layers)], jnp.float32), jnp.asarray(1e-2, jnp.float32)
    state = adam.init(params)
    keys = jax.random.split(jax.random.PRNGKey(2), args.steps)
    gz_args = (params, state, keys[0], X, y, nu, lr)
    t0 = time.perf_counter()
    gz_compiled = gpzoo_step.lower(*gz_args).compile()
    gz_compile = time.perf_counter() - t0
    plain_adam, plain_step = straightforward_step(cfg, BATCH)
    pl_state = plain_adam.init(params)
    t0 = time.perf_counter()
    pl_compiled = plain_step.lower(params, pl_state, keys[0], X, y).compile()
    pl_compile = time.perf_counter() - t0

    gz_times = _time(lambda i: gz_compiled(params, state, keys[i], X, y, nu, lr)[2], args.repeats, args.steps)
    pl_times = _time(lambda i: pl_compiled(params, pl_state, keys[i], X, y)[2], args.repeats, args.steps)
    flops = float(gz_compiled.cost_analysis().get("flops", float("nan"))) if gz_compiled.cost_analysis() else float("nan")
    rate = matmul_rate()
    gz_best, pl_best = min(gz_times), min(pl_times)
    report = {
        "benchmark": "dkm_step", "date": now(), "machine": machine_info(),
        "step": {"images": list(IMAGE), "batch": BATCH, "inducing_patches": WIDTH, "gram_layers": [WIDTH, WIDTH],
                 "second_layer_stride": 2, "kernel": "normalised_gaussian", "batch_norm": "image", "head": "gap",
                 "classes": CLASSES, "mc_samples": MC, "nu": 1e-3, "skr_gamma": WIDTH // 4, "skr_jitter": 0.1,
                 "kl": "taylor_frobenius (eq. 8)", "dtype": "float32", "optimizer": "Adam(0.8, 0.9), lr 0.01"},
        "like_for_like": {"gpzoo_objective": core_value, "straightforward_objective": plain_value,
                          "loss_rel_diff": abs(core_value - plain_value) / abs(core_value)},
        "gpzoo": {"step_s": gz_best, "repeats_s": gz_times, "compile_s": gz_compile, "peak_bytes_xla": _memory(gz_compiled)},
        "straightforward": {"step_s": pl_best, "repeats_s": pl_times, "compile_s": pl_compile,
                            "peak_bytes_xla": _memory(pl_compiled)},
        "matmul_bound": {"step_flops_xla": flops, "matmul_flops_per_s": rate, "bound_step_s": flops / rate},
        "ratios": {"straightforward_over_gpzoo": pl_best / gz_best, "gpzoo_over_bound": gz_best / (flops / rate)},
        "goals": {"at_least_3x_faster_than_straightforward": pl_best / gz_best >= 3.0,
                  "within_3x_of_matmul_bound": gz_best / (flops / rate) <= 3.0},
        "reference": {"skipped": "the authors' PyTorch code (edwardmilsom/skr_cdkm) is not run by this script (torch is "
                                 "not installed here); the issue quotes 0.205 s/step and 1.08 GB peak RSS for it on this machine"},
    }
    write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
