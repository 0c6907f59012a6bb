"""van der Wilk et al. 2018, fig. 2: a function symmetric under swapping x1, x2, fitted by an invariant and a plain SVGP.

Two settings: training inputs over the whole box (``train_region="full"``, as in fig. 2: points
on one half inform the function on the other, and the ELBO should prefer the invariant model),
and over one fundamental domain only (x2 >= x1, ``"fundamental"``): there only the invariant
model can predict the other half, but no training point tests that, so the ELBO need not tell
the models apart (van der Wilk et al. 2018, eq. 5's chunk argument). Test inputs always cover the whole box. Writes ``benchmarks/results/invariance_toy.json``.

    .venv/bin/python benchmarks/invariance_toy.py
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import jax
import numpy as np

jax.config.update("jax_enable_x64", True)

from _common import machine_info, now, write_json  # noqa: E402

from gpzoo.analysis import datasets  # noqa: E402
from gpzoo.inference import evaluate_elbo, fit, predict  # noqa: E402
from gpzoo.models import zoo  # noqa: E402

OUT = Path(__file__).parent / "results" / "invariance_toy.json"
SETTINGS = dict(num_train=100, num_test=1000, noise_std=0.1, symmetry="swap")
REGIONS = ("full", "fundamental")
NUM_INDUCING, STEPS, LEARNING_RATE, SEEDS = 24, 800, 0.03, (0,)


def run_one(name: str, data, seed: int) -> dict:
    spec = zoo.get(name, input_dim=2, num_inducing=NUM_INDUCING)
    t0 = time.perf_counter()
    res = fit(spec, data.X_train, data.y_train, steps=STEPS, learning_rate=LEARNING_RATE, seed=seed, progress=False)
    seconds = time.perf_counter() - t0
    elbo = evaluate_elbo(res)
    rmse = lambda X, y: float(np.sqrt(np.mean((predict(res, X).f_mean[:, 0] - y) ** 2)))  # noqa: E731
    return {"elbo": elbo.elbo, "elbo_stderr": elbo.stderr, "train_rmse": rmse(data.X_train, data.y_train),
            "test_rmse": rmse(data.X_test, data.y_test), "fit_seconds": seconds,
            "noise_variance": float(res.params["likelihood.noise_variance"])}


def main() -> dict:
    results = {"date": now(), "machine": machine_info(),
               "settings": {**SETTINGS, "num_inducing": NUM_INDUCING, "steps": STEPS, "learning_rate": LEARNING_RATE,
                            "regions": list(REGIONS), "optimizer": "adam, full batch", "dtype": "float64", "seeds": list(SEEDS)},
               "runs": {}}
    for region in REGIONS:
        runs = results["runs"][f"train_region={region}"] = {"invariant-finite (swap)": [], "svgp-rbf": []}
        for seed in SEEDS:
            data = datasets.load("symmetric-toy", seed=seed, train_region=region, **SETTINGS)
            runs["invariant-finite (swap)"].append(run_one("invariant-finite", data, seed))
            runs["svgp-rbf"].append(run_one("svgp-rbf", data, seed))
    results["summary"] = {
        f"{region} / {name}": {key: float(np.mean([r[key] for r in runs])) for key in ("elbo", "train_rmse", "test_rmse", "fit_seconds")}
        for region, models in results["runs"].items() for name, runs in models.items()
    }
    write_json(OUT, results)
    return results


if __name__ == "__main__":
    print(json.dumps(main()["summary"], indent=2))
