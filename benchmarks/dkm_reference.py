"""Time the authors' PyTorch DKM (Milsom, Anson, Aitchison 2024; github.com/edwardmilsom/skr_cdkm) on the
configurations of ``benchmarks/dkm_step.py``.

Run by ``dkm_step.py --reference-python PY --reference-repo PATH`` in a separate interpreter that has
torch (gpzoo never imports torch). PATH is a local checkout of that repository; this script imports its
``dkm`` package from ``PATH/dkm_most_experiments`` and builds the models from its public classes, the
way its training scripts do (``resdkm20.py`` for the conv model, ``sine_dataset_condition_curves`` for
the toy). Nothing of the repository is copied here.

* ``conv``: ConvF2G on 64 learned 3×3 inducing patches, then twice [normalised-Gaussian kernel,
  ConvMixup (3×3; stride 1, then 2), GramLayer (P = 64, SKR with ``ncol_div = 4``, i.e. γ = 16,
  λ = 0.1 built in, Taylor objective), GramBatchNorm (global)], NystromGAP, kernel, batch norm, and
  the Output layer (10 classes, 1,000 Monte Carlo samples, tempered, Taylor objective); images
  ``[64, 3, 16, 16]``, float32.
* ``sine``: F2G on 100 learned inducing inputs (2-D), squared-exponential kernel, one GramLayer
  (P = 100, no SKR, Taylor objective), kernel, Output (2 classes, 100 Monte Carlo samples); 256
  training points, full batch, float64.

One step is the scripts' own: forward, objective (expected log-likelihood + KL / num_data),
``zero_grad``, ``backward``, ``Adam(lr 0.01, betas (0.8, 0.9)).step()``. Prints one JSON line:
seconds per step of every repeat, and the process's peak resident set size.

    PY benchmarks/dkm_reference.py --repo PATH --config conv [--threads 2] [--repeats 5] [--steps 10]
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time


def build(config: str, repo: str):
    sys.path.insert(0, f"{repo}/dkm_most_experiments")
    import torch
    from torch import nn

    from dkm import dkm  # the authors' package (namespace dkm/, module dkm/dkm)

    gen = torch.Generator().manual_seed(0)
    if config == "conv":
        torch.set_default_dtype(torch.float32)
        X = torch.rand(64, 3, 16, 16, generator=gen)
        Y = torch.randint(0, 10, (64,), generator=gen)
        x_ind = torch.rand(64, 3, 3, 3, generator=gen)  # [P, C, kh, kw], as the scripts' patches
        bn = ("global", "global", "global", "global")
        model = nn.Sequential(
            dkm.Input(x_ind, learned=True), dkm.ConvF2G(),
            dkm.NormalizedGaussianKernel(), dkm.ConvMixup(64, 64, filter_size=3, stride=1),
            dkm.GramLayer(64, 1e-3, ncol_div=4, taylor_objective=True), dkm.GramBatchNorm(*bn),
            dkm.NormalizedGaussianKernel(), dkm.ConvMixup(64, 64, filter_size=3, stride=2),
            dkm.GramLayer(64, 1e-3, ncol_div=4, taylor_objective=True), dkm.GramBatchNorm(*bn),
            dkm.NystromGAP(), dkm.NormalizedGaussianKernel(), dkm.GramBatchNorm(*bn),
            dkm.Output(64, 10, mc_samples=1000, taylor_objective=True, do_tempering=True),
        )
    elif config == "sine":
        torch.set_default_dtype(torch.float64)
        x = torch.randn(356, 2, generator=gen)
        X, x_ind = x[100:], x[:100]
        Y = torch.randint(0, 2, (256,), generator=gen)
        model = nn.Sequential(
            dkm.Input(x_ind, learned=True), dkm.F2G(), dkm.SqExpKernel(),
            dkm.GramLayer(100, 1e-3, ncol_div=0, taylor_objective=True), dkm.SqExpKernel(),
            dkm.Output(100, 2, mc_samples=100, taylor_objective=True),
        )
    else:
        raise SystemExit(f"unknown config {config!r}")
    model.train()
    model(X)  # the scripts' initialising forward pass (sets every V to chol K)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.8, 0.9))
    num_data = X.shape[0]

    def step():
        pred = model(X)
        obj = dkm.categorical_expectedloglikelihood(pred, Y.long()) + dkm.norm_kl_reg(model, num_data)
        opt.zero_grad()
        (-obj).backward()
        opt.step()
        return float(obj)

    return torch, step


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (``VmHWM``: not inherited from the parent across fork + exec)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True)
    parser.add_argument("--config", choices=("conv", "sine"), required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    torch, step = build(args.config, args.repo)
    torch.set_num_threads(args.threads)
    objective = step()  # warm-up
    repeats = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            objective = step()
        repeats.append((time.perf_counter() - t0) / args.steps)
    print(json.dumps({"config": args.config, "repeats_s": repeats, "peak_rss_bytes": peak_rss_bytes(),
                      "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "finite_objective": math.isfinite(objective)}))


if __name__ == "__main__":
    main()
