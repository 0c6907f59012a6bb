"""Kernel structure search on the statsmodels series: structure found, extrapolation, time.

Protocol (Duvenaud et al. 2013, §5; Duvenaud 2014, ch. 1's Mauna Loa example): each series is split
in time, the first 80 % train and the rest is extrapolated (the data sets ``co2``, ``sunspots``,
``nile``, ``elnino``: x in decades since the first observation, y standardised with the training
mean and sd). The greedy search (``gpzoo.search``: bases SE, Per, Lin, RQ, change points; 5
restarts of 60 L-BFGS iterations per structure) runs to ``--depth``. Its best structure is scored
on the held-out part by RMSE and mean log predictive density of y (in standardised units), next
to fixed structures fitted the same way: SE, SE + Per, and for CO₂ the hand-written kernel of
Rasmussen & Williams 2006, §5.4.3 (SE + SE × Per + RQ; its white-noise term is the likelihood's
noise here).

Differences from the papers: one train/test split per series (Duvenaud et al. 2013 report
extrapolation on several series and folds); BIC from the exact marginal likelihood, as the
papers, but with this project's initialisation (periodogram peaks, data spreads) and L-BFGS
settings; the peer side by side (gallifrey's SMC over structures on the same splits) is
``benchmarks/gallifrey_peer.py``. ``--continue-parents`` adds, for every expanded structure, a
restart continuing its parent's fit (``gpzoo.search(continue_parents=True)``). Timings
are split into XLA compile time (JAX's compile-duration events) and the rest (arithmetic and
Python), with the load average at the start.

Usage: ``.venv/bin/python benchmarks/kernel_search.py [--series co2,nile] [--depth 3]``
Writes ``benchmarks/results/kernel_search.json``.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import os
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)

from _common import compile_seconds, machine_info, merge_results, now  # noqa: E402

from gpzoo.analysis import datasets  # noqa: E402
from gpzoo.models.grammar import canonical, parse  # noqa: E402

search_module = importlib.import_module("gpzoo.analysis.search")
OUT = Path(__file__).parent / "results" / "kernel_search.json"
#: Fixed structures scored beside the search's result (per series; "all" for every series).
REFERENCES = {"all": ["SE", "SE + Per"], "co2": ["SE + SE × Per + RQ"]}


def run_series(name: str, depth: int, restarts: int, steps: int, totals, continue_parents: bool = False) -> dict:
    data = datasets.load(name, seed=0)
    start_compile, start = totals["compile"], time.perf_counter()
    result = search_module.search(data.X_train, data.y_train, depth=depth, restarts=restarts, steps=steps, progress=True,
                                  continue_parents=continue_parents)
    wall = time.perf_counter() - start
    compile_s = totals["compile"] - start_compile
    rows = {"search": {"structure": str(result.expression), "bic": result.best.score,
                       **search_module.heldout_metrics(result, data.X_test, data.y_test)}}
    settings = result.settings
    stats = search_module._data_stats(data.X_train, data.y_train)
    for text in REFERENCES["all"] + REFERENCES.get(name, []):
        expression = canonical(parse(text), noise=True)
        candidate = search_module.evaluate(expression, data.X_train, data.y_train, settings, stats)
        fixed = search_module.SearchResult(trace=(candidate,), score=result.score, X=result.X, y=result.y,
                                           settings=settings)
        rows[text] = {"structure": str(expression), "bic": candidate.score,
                      **search_module.heldout_metrics(fixed, data.X_test, data.y_test)}
    per_depth = collections.defaultdict(list)
    for c in result.trace:
        per_depth[c.depth].append(c.score)
    return {
        "n_train": int(len(data.y_train)), "n_test": int(len(data.y_test)), "depth": depth, "restarts": restarts,
        "steps": steps, "continue_parents": continue_parents, "score": result.score, "structures_fitted": len(result.trace),
        "best_per_depth": {str(d): min(v) for d, v in sorted(per_depth.items())},
        "wall_s": wall, "compile_s": compile_s, "other_s": wall - compile_s,
        "candidates_per_s": len(result.trace) / wall, "rows": rows,
        "components": [{"expression": p["expression"], "description": p["description"]}
                       for p in result.decomposition(data.X_train[:1])],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", default="co2,sunspots,nile")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--restarts", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--continue-parents", action="store_true",
                        help="one more restart per child continuing its parent's fit (gpzoo.search's continue_parents)")
    args = parser.parse_args()
    totals = compile_seconds()
    for name in [s.strip() for s in args.series.split(",") if s.strip()]:
        payload = {"date": now(), "machine": machine_info(), "load_at_start": os.getloadavg()[0], "settings": vars(args).copy(),
                   **run_series(name, args.depth, args.restarts, args.steps, totals, args.continue_parents)}
        merge_results(OUT, name, payload)
        rows = payload["rows"]
        print(f"{name}: {payload['rows']['search']['structure']}  wall {payload['wall_s']:.1f} s "
              f"(compile {payload['compile_s']:.1f} s), {payload['structures_fitted']} structures")
        for label, row in rows.items():
            print(f"  {label:22s} BIC {row['bic']:9.1f}  RMSE {row['rmse']:.3f}  MLPD {row['mean_log_predictive_density']:.3f}")


if __name__ == "__main__":
    main()
