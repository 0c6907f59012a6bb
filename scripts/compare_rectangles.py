"""Compare an RBF SVGP with convolutional GPs on the rectangles task (van der Wilk et al. 2017, §3.1), via the public API.

    python scripts/compare_rectangles.py --out reports/rectangles-script
    python scripts/compare_rectangles.py --quick --out /tmp/rect     # tiny settings (tests)

Fits every model on the same data, prints the ELBO table (``compare_elbo``) and writes the full
report (DataTrees, PSIS-LOO, calibration figures) with ``report``. Models the zoo does not have
yet are skipped with a note.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpyro  # noqa: F401 - before arviz (see analysis/__init__.py)

from gpzoo.analysis import compare_elbo, datasets, report
from gpzoo.inference import fit
from gpzoo.models import zoo

MODELS = ("svgp-rbf", "conv", "weighted-conv")
FULL = {"num_train": 1200, "num_test": 1000, "steps": 2000, "batch_size": 100, "num_inducing": 16, "num_draws": 200}
QUICK = {"num_train": 40, "num_test": 30, "steps": 5, "batch_size": 20, "num_inducing": 6, "num_draws": 30}


def run(out: Path, settings: dict, seed: int = 0, progress: bool = True) -> Path:
    ds = datasets.load("rectangles", seed=seed, num_train=settings["num_train"], num_test=settings["num_test"])
    facts = dict(input_dim=ds.num_features, task=ds.task, num_classes=ds.num_classes, image_shape=ds.image_shape,
                 num_inducing=settings["num_inducing"])
    names = [name for name in MODELS if name in zoo.names()]
    for name in sorted(set(MODELS) - set(names)):
        print(f"note: model {name!r} is not in the zoo yet; skipped")
    results = {
        name: fit(zoo.get(name, **facts), ds.X_train, ds.y_train, steps=settings["steps"],
                  batch_size=settings["batch_size"], seed=seed, progress=progress)
        for name in names
    }
    print(compare_elbo(results, num_samples=8)[["elbo", "elbo_se", "d_elbo", "elbo_per_datum"]].to_string())
    return report(results, out, X_test=ds.X_test, y_test=ds.y_test, dataset=ds, num_draws=settings["num_draws"], seed=seed)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("reports/rectangles-script"))
    parser.add_argument("--quick", action="store_true", help="tiny data and few steps (seconds, for tests)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = run(args.out, QUICK if args.quick else FULL, seed=args.seed, progress=not args.quick)
    print(f"report: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
