"""Robustness sweep: every zoo model × 20 seeds × float32 and float64 at its default settings.

Each run fits one model (its zoo defaults: kernel, M, jitter, inducing initialisation, q(u); fit's
defaults: Adam at learning rate 0.01, full batch) on a small compatible data set, the 8×8
rectangles of van der Wilk et al. 2017, §3.1 (binary, N = 40, pixel values in [0, 1]; every zoo
model takes grey images), for ``--steps`` steps, then predicts the test set and evaluates the
ELBO. A run is counted as

* ``cholesky_failures``: a factorisation failed even after the jitter retries (``NumericalError``);
* ``diverged``: the NaN guard stopped training (``TrainingError``: a non-finite objective or
  parameters, which is also how a Cholesky that failed inside a compiled step shows);
* ``jitter_escalations``: the fit recorded at least one jitter increase (``diagnostics["jitter_events"]``,
  caught after every step inside the compiled chunks); ``jitter_events`` counts them all;
* ``non_finite``: a finite fit whose final objective, parameters, predictions or ELBO are not finite;
* ``errors``: any other exception (type and message kept in ``failures``).

Goal: 0 Cholesky failures, 0 diverged fits, 0 non-finite results, 0 errors. Writes
``benchmarks/results/robustness_sweep.json``; ``benchmarks/summarise.py`` puts the table on the results page (docs/results.md).

    .venv/bin/python benchmarks/robustness_sweep.py                       # the full sweep
    .venv/bin/python benchmarks/robustness_sweep.py --models svgp-rbf,conv --seeds 2 --out /tmp/sweep.json
    .venv/bin/python benchmarks/robustness_sweep.py --models dkm,conv-dkm --merge   # add models to the JSON
    .venv/bin/python -m pytest benchmarks/robustness_sweep.py -m benchmark -p no:xdist

``--merge`` runs only ``--models`` and merges their counts and failures into the existing ``--out``
(the other models' records are kept; a model run again replaces its old records), then recomputes
``totals``, ``goal_met`` and ``complete``; ``--collect --merge`` with the same arguments merges
the models a cut-short merge had finished in every precision. A run with other ``--steps`` than
the file's protocol or a ``--num-inducing`` override (a model whose default M the data set cannot
supply) is recorded per model (``protocol["deviations"]``), with ``--reason`` saying why.

Shifted and scaled data (``--transforms``): the same fits on the same images with every pixel of
the training and test inputs shifted (``shift``: X + 1e3) or scaled (``scale``: X * 1e3); the
untransformed run (``none``) of the same model, seed and precision, made in the same execution, is
the reference. Each run records its outcome as above (non-finite objective, parameters,
predictions or ELBO; the error type if any), its test accuracy, its drop against the reference
and the gpzoo warnings (subclasses of ``GPZooWarning``, by class name) its fit, predict and ELBO
raised. Image inputs leaving [0, 1] are expected to raise ``ImageRangeWarning`` (the convolutional
kernels check it; a model without a patch kernel may raise nothing), vector inputs far from unit
scale ``DataScaleWarning``. A drop of more than 1 point (0.01) is *unexplained* unless the run
raised one of those two warnings. Per model × precision × transform: runs, non-finite results,
diverged fits, Cholesky failures, other errors, mean accuracy, mean and largest drop, drops over
the tolerance, unexplained drops, the warnings (runs raising each, and one message of each); every
run's record is kept under ``results[dtype]["runs"]``, the range of the training inputs each
transform gives under ``results[dtype]["input_range"]``. Goal: 0 non-finite results, 0 diverged
fits, 0 Cholesky failures, 0 errors and 0 unexplained drops. Writes
``benchmarks/results/shift_scale_sweep.json`` (the default run above and its JSON are unchanged);
``--collect`` works as above, ``--merge`` does not apply.

    .venv/bin/python benchmarks/robustness_sweep.py --transforms none,shift,scale            # the full sweep
    .venv/bin/python benchmarks/robustness_sweep.py --transforms none,shift,scale --models svgp-rbf,conv --seeds 2 --out /tmp/shift_scale.json
    .venv/bin/python benchmarks/robustness_sweep.py --transforms none,shift,scale --collect  # a full sweep cut short
"""

from __future__ import annotations

import argparse
import collections
import datetime
import functools
import json
import multiprocessing
import tempfile
import time
import types
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import jax
import numpy as np
import pytest

from _common import machine_info, now, write_json  # noqa: E402

OUT = Path(__file__).parent / "results" / "robustness_sweep.json"
SHIFT_SCALE_OUT = Path(__file__).parent / "results" / "shift_scale_sweep.json"
DATA = {"name": "rectangles", "image_size": 10, "num_train": 100, "num_test": 20}
DTYPES = ("float32", "float64")
NUM_SEEDS = 20
STEPS = 100
ELBO_SAMPLES = 4


def run_one(name: str, data, seed: int, steps: int, num_inducing: dict | None = None, with_accuracy: bool = False) -> dict:
    """Fit, predict and evaluate model ``name`` with seed ``seed``; the outcome as a record (with the test
    accuracy, None unless the predictions are finite, when ``with_accuracy``)."""
    from gpzoo.inference import evaluate_elbo, fit, predict  # noqa: PLC0415 - after the precision is set
    from gpzoo.models import zoo  # noqa: PLC0415
    from gpzoo.models.errors import NumericalError, TrainingError  # noqa: PLC0415

    record = {"model": name, "seed": seed, "outcome": "ok", "jitter_events": 0, "max_jitter": None}
    start = time.perf_counter()
    try:
        overrides = {"num_inducing": num_inducing[name]} if num_inducing and name in num_inducing else {}
        spec = zoo.get(name, image_shape=data.image_shape, task=data.task, input_dim=data.X_train.shape[1], **overrides)
        res = fit(spec, data.X_train, data.y_train, steps=steps, seed=seed, progress=False)
        events = res.diagnostics.get("jitter_events", [])
        record.update(jitter_events=len(events), max_jitter=res.diagnostics.get("max_jitter"),
                      final_objective=res.final_objective)
        pred = predict(res, data.X_test, seed=seed)
        elbo = evaluate_elbo(res, num_samples=ELBO_SAMPLES, seed=seed)
        values = [res.objective_history, *res.params.values(), pred.f_mean, pred.f_var, pred.y_mean, pred.y_var,
                  pred.probs, [elbo.elbo]]
        if not all(v is None or np.all(np.isfinite(np.asarray(v, dtype=float))) for v in values):
            record["outcome"] = "non_finite"
        if with_accuracy:
            record["accuracy"] = accuracy_of(pred.probs, data.y_test)
    except NumericalError as exc:
        record.update(outcome="cholesky_failure", error=f"{type(exc).__name__}: {exc}")
    except TrainingError as exc:  # the NaN guard
        record.update(outcome="diverged", error=f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - counted and reported, the sweep goes on
        record.update(outcome="error", error=f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
    record["seconds"] = time.perf_counter() - start
    return record


def accuracy_of(probs, labels) -> float | None:
    """The fraction of test labels the class probabilities get right (binary: P(y = 1) > 1/2); None
    when there are no probabilities or they are not finite."""
    if probs is None:
        return None
    labels = np.asarray(labels).astype(int)
    p = np.asarray(probs, dtype=np.float64).reshape(len(labels), -1)
    if not np.all(np.isfinite(p)):
        return None
    predicted = (p[:, -1] > 0.5).astype(int) if p.shape[1] == 1 else p.argmax(axis=1)
    return float(np.mean(predicted == labels))



def use_compilation_cache(directory: Path) -> None:
    """Keep XLA executables on disk: the seeds of one model trace to the same programs (data and
    parameters are arguments), so every run after the first skips the XLA compilation."""
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def sweep(models, dtype: str, seeds: int, steps: int, cache: Path | None = None, partial: Path | None = None,
          num_inducing: dict | None = None) -> dict:
    """Every model × ``seeds`` seeds in ``dtype``; per-model counts and the failing records (also
    written to ``partial`` after each model, so a long sweep cut short keeps what it measured)."""
    jax.config.update("jax_enable_x64", dtype == "float64")
    if cache is not None:
        use_compilation_cache(cache)
    from gpzoo.analysis import datasets  # noqa: PLC0415

    data = datasets.load(DATA["name"], seed=0, **{k: v for k, v in DATA.items() if k != "name"})
    per_model, failures = {}, []
    for name in models:
        records = []
        for seed in range(seeds):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                records.append(run_one(name, data, seed, steps, num_inducing))
        jax.clear_caches()  # between models only: a model's runs share compiled programs
        outcomes = collections.Counter(r["outcome"] for r in records)
        per_model[name] = {
            "runs": len(records),
            "cholesky_failures": outcomes["cholesky_failure"],
            "jitter_escalations": sum(r["jitter_events"] > 0 for r in records),
            "jitter_events": sum(r["jitter_events"] for r in records),
            "max_jitter": max((r["max_jitter"] for r in records if r["max_jitter"] is not None), default=None),
            "diverged": outcomes["diverged"],
            "non_finite": outcomes["non_finite"],
            "errors": outcomes["error"],
            "median_seconds": float(np.median([r["seconds"] for r in records])),
        }
        failures += [{"dtype": dtype, **r} for r in records if r["outcome"] != "ok"]
        print(f"{dtype} {name}: {per_model[name]}", flush=True)
        if partial is not None:
            write_json(partial, {"dtype": dtype, "models": per_model, "failures": failures})
    return {"models": per_model, "failures": failures}


#: The data modes of ``--transforms``: what each does to every pixel of the training and test inputs.
SHIFT, SCALE = 1e3, 1e3
TRANSFORMS = {"none": "X", "shift": f"X + {SHIFT:g}", "scale": f"X * {SCALE:g}"}
#: Largest accuracy drop against the untransformed run of the same model, seed and precision (1 point).
ACCURACY_TOLERANCE = 0.01
#: The gpzoo warnings that say a fit's data are off the scale it expects: a drop past the tolerance
#: in a run that raised one of them is explained; any other drop is not.
DATA_WARNINGS = ("ImageRangeWarning", "DataScaleWarning")


def transformed(data, transform: str):
    """``data``'s arrays with ``transform`` applied to every feature of ``X_train`` and ``X_test``
    (in float64, before the fit casts to its precision). Not a ``Dataset``: that one checks images lie in [0, 1]."""
    def apply(X):
        X = np.asarray(X, dtype=np.float64)
        return {"none": X, "shift": X + SHIFT, "scale": X * SCALE}[transform]

    return types.SimpleNamespace(X_train=apply(data.X_train), X_test=apply(data.X_test), y_train=data.y_train,
                                 y_test=data.y_test, image_shape=data.image_shape, task=data.task)


def run_recorded(name: str, data, seed: int, steps: int, num_inducing: dict | None = None) -> dict:
    """``run_one`` with its test accuracy and the gpzoo warnings its fit, predict and ELBO raised
    (class names, each once, sorted; ``warning_messages``: the first message of each)."""
    from gpzoo.models.errors import GPZooWarning  # noqa: PLC0415

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        record = run_one(name, data, seed, steps, num_inducing, with_accuracy=True)
    messages = {}
    for w in caught:
        if issubclass(w.category, GPZooWarning):
            messages.setdefault(w.category.__name__, " ".join(str(w.message).split())[:300])
    record["warnings"] = sorted(messages)
    record["warning_messages"] = messages
    return record


def summarise_transform(records: list[dict], reference: dict[int, dict]) -> dict:
    """Counts, accuracies and drops of one model × precision × transform; ``reference``: the
    untransformed runs of the same model and precision by seed."""
    outcomes = collections.Counter(r["outcome"] for r in records)
    accuracies = [r["accuracy"] for r in records if r.get("accuracy") is not None]
    drops, over, unexplained, messages = [], 0, 0, {}
    for r in records:
        for cls, message in r.get("warning_messages", {}).items():
            messages.setdefault(cls, message)
        ref = reference.get(r["seed"], {}).get("accuracy")
        if r.get("accuracy") is None or ref is None:
            continue
        drop = ref - r["accuracy"]
        r["accuracy_drop"] = drop
        drops.append(drop)
        if drop > ACCURACY_TOLERANCE + 1e-12:
            over += 1
            unexplained += not any(w in DATA_WARNINGS for w in r["warnings"])
    return {
        "runs": len(records),
        "non_finite": outcomes["non_finite"],
        "diverged": outcomes["diverged"],
        "cholesky_failures": outcomes["cholesky_failure"],
        "errors": outcomes["error"],
        "mean_accuracy": float(np.mean(accuracies)) if accuracies else None,
        "mean_accuracy_drop": float(np.mean(drops)) if drops else None,
        "max_accuracy_drop": float(np.max(drops)) if drops else None,
        "drops_over_tolerance": over,
        "unexplained_drops": unexplained,
        "warnings": dict(sorted(collections.Counter(w for r in records for w in r["warnings"]).items())),
        "warning_messages": dict(sorted(messages.items())),
        "median_seconds": float(np.median([r["seconds"] for r in records])),
    }


def shift_scale_sweep(models, dtype: str, seeds: int, steps: int, transforms, cache: Path | None = None,
                      partial: Path | None = None, num_inducing: dict | None = None) -> dict:
    """Every model × ``seeds`` seeds × ``transforms`` in ``dtype``: per model and transform the
    counts and accuracy drops against the ``none`` runs, every run's record, and the range of the
    training inputs each transform gives (written to ``partial`` after each model)."""
    jax.config.update("jax_enable_x64", dtype == "float64")
    if cache is not None:
        use_compilation_cache(cache)
    from gpzoo.analysis import datasets  # noqa: PLC0415

    data = datasets.load(DATA["name"], seed=0, **{k: v for k, v in DATA.items() if k != "name"})
    variants = {t: transformed(data, t) for t in transforms}
    result = {"input_range": {t: [float(v.X_train.min()), float(v.X_train.max())] for t, v in variants.items()},
              "models": {}, "runs": []}
    for name in models:
        records = {t: [{"transform": t, **run_recorded(name, variants[t], seed, steps, num_inducing)} for seed in range(seeds)]
                   for t in transforms}
        jax.clear_caches()  # between models only: a model's runs share compiled programs (the transforms change no shape)
        reference = {r["seed"]: r for r in records["none"]}
        result["models"][name] = {t: summarise_transform(records[t], reference) for t in transforms}
        for t in transforms:
            for r in records[t]:
                r.pop("warning_messages")
                r["seconds"] = round(r["seconds"], 3)
                result["runs"].append({"dtype": dtype, **r})
        print(f"{dtype} {name}: " + "; ".join(
            f"{t}: acc {result['models'][name][t]['mean_accuracy']}, drop {result['models'][name][t]['mean_accuracy_drop']}, "
            f"unexplained {result['models'][name][t]['unexplained_drops']}, warnings {result['models'][name][t]['warnings']}"
            for t in transforms), flush=True)
        if partial is not None:
            write_json(partial, {"dtype": dtype, **result})
    return result


def shift_scale_totals(report: dict) -> None:
    """``totals``, ``goal_met`` and ``complete`` of a ``--transforms`` report, in place."""
    keys = ("runs", "non_finite", "diverged", "cholesky_failures", "errors", "drops_over_tolerance", "unexplained_drops")
    totals = collections.Counter({k: 0 for k in keys})
    per_transform = {}
    for result in report["results"].values():
        for per_model in result["models"].values():
            for t, counts in per_model.items():
                totals.update({k: counts[k] for k in keys})
                per_transform.setdefault(t, collections.Counter({k: 0 for k in keys})).update({k: counts[k] for k in keys})
    report["totals"] = dict(totals)
    report["totals_by_transform"] = {t: dict(c) for t, c in per_transform.items()}
    report["goal_met"] = all(totals[k] == 0 for k in keys if k not in ("runs", "drops_over_tolerance"))
    report["complete"] = not any(result.get("not_run") for result in report["results"].values())


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated zoo models (default: every one)")
    parser.add_argument("--seeds", type=int, default=NUM_SEEDS)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--workers", type=int, default=2, help="processes (one precision each; default 2; 1: all in this process)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"the JSON to write (default {OUT.name}; with --transforms {SHIFT_SCALE_OUT.name})")
    parser.add_argument("--transforms", default=None,
                        help=f"the shifted / scaled data mode: comma-separated of {', '.join(TRANSFORMS)} (none, the reference, "
                             "is required), e.g. none,shift,scale; records accuracies, drops and gpzoo warnings")
    parser.add_argument("--merge", action="store_true",
                        help="run only --models and merge them into the existing --out (its other models are kept)")
    parser.add_argument("--num-inducing", default=None,
                        help="override some models' default M, e.g. deep-conv=64,deep-tick=64 (recorded, with --reason)")
    parser.add_argument("--reason", default=None,
                        help="why --steps differs from the file's protocol or --num-inducing is given (recorded per model)")
    parser.add_argument("--collect", action="store_true",
                        help="write --out from the per-precision partial files of a sweep that was cut short (no fitting)")
    args = parser.parse_args(argv)
    transforms = args.transforms.split(",") if args.transforms else None
    if transforms is not None:
        unknown = [t for t in transforms if t not in TRANSFORMS]
        if unknown or "none" not in transforms or len(set(transforms)) != len(transforms):
            parser.error(f"--transforms takes distinct names of {', '.join(TRANSFORMS)} including none, got {args.transforms!r}")
        if args.merge:
            parser.error("--merge is not available with --transforms")
        transforms = ["none", *(t for t in transforms if t != "none")]  # the reference first
    if args.out is None:
        args.out = OUT if transforms is None else SHIFT_SCALE_OUT
    try:
        args.num_inducing = {k: int(v) for k, v in (item.split("=") for item in args.num_inducing.split(","))} \
            if args.num_inducing else {}
    except ValueError:
        parser.error(f"--num-inducing needs MODEL=M pairs separated by commas, got {args.num_inducing!r}")
    if args.merge:
        if not args.models or not args.out.exists():
            parser.error("--merge needs --models and an existing --out to merge into")
        if (args.steps != json.loads(args.out.read_text())["protocol"]["steps"] or args.num_inducing) and not args.reason:
            parser.error("--merge with --steps other than the file's protocol or with --num-inducing needs --reason")
    from gpzoo.models import zoo  # noqa: PLC0415

    # the deep models (several layers, or Gram-matrix layers) last: they are the slowest to compile
    models = args.models.split(",") if args.models else sorted(zoo.names(), key=lambda n: (n.startswith(("deep", "dkm", "conv-dkm")), n))
    started = time.perf_counter()
    report = {"date": now(), "machine": machine_info(),
              "protocol": {"data": DATA, "seeds": args.seeds, "steps": args.steps, "elbo_samples": ELBO_SAMPLES,
                           "settings": "zoo defaults for each model; fit defaults (Adam, learning rate 0.01, full batch)"},
              "results": {}}
    if transforms is not None:
        report["protocol"].update(
            transforms={t: TRANSFORMS[t] + " (every pixel of the training and test images)" for t in transforms},
            accuracy_tolerance=ACCURACY_TOLERANCE, explaining_warnings=list(DATA_WARNINGS),
            drop="accuracy of the none run of the same model, seed and precision minus this run's; a drop above the "
                 "tolerance is unexplained unless the run raised one of the explaining warnings")
        run_sweep = functools.partial(shift_scale_sweep, transforms=transforms)
    else:
        run_sweep = sweep
    dtypes = args.dtypes.split(",")
    tag = "." + "+".join(models) if args.merge else ""  # merges of different models may run side by side
    partial = {dtype: args.out.with_suffix(f"{tag}.{dtype}.partial.json") for dtype in dtypes}
    with tempfile.TemporaryDirectory(prefix="gpzoo-sweep-xla-") as cache:
        if args.collect:  # a sweep cut short: what its workers had written, the models it did not reach named
            report["results"] = {dtype: json.loads(path.read_text()) for dtype, path in partial.items() if path.exists()}
            for result in report["results"].values():
                result.pop("dtype", None)
                result["not_run"] = [name for name in models if name not in result["models"]]
            report["date"] = max((path.stat().st_mtime for path in partial.values() if path.exists()), default=None)
            report["date"] = now() if report["date"] is None else datetime.datetime.fromtimestamp(
                report["date"], datetime.timezone.utc).isoformat(timespec="seconds")
        elif args.workers > 1:  # one process per precision (spawned: each sets its own JAX precision), one on-disk XLA cache
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=min(args.workers, len(dtypes)), mp_context=context) as pool:
                futures = {dtype: pool.submit(run_sweep, models, dtype, args.seeds, args.steps, cache=Path(cache),
                                              partial=partial[dtype], num_inducing=args.num_inducing)
                           for dtype in dtypes}
                report["results"] = {dtype: future.result() for dtype, future in futures.items()}
        else:  # in this process, one precision after the other (no on-disk cache: this process's JAX stays as it was)
            previous = jax.config.jax_enable_x64
            try:
                report["results"] = {dtype: run_sweep(models, dtype, args.seeds, args.steps, cache=None, partial=partial[dtype],
                                                      num_inducing=args.num_inducing)
                                     for dtype in dtypes}
            finally:
                jax.config.update("jax_enable_x64", previous)
    if not args.collect:
        report["seconds"] = time.perf_counter() - started
    if args.merge:
        if args.collect:  # a merge cut short: only the models every precision finished are merged
            models = [name for name in models if all(name in r["models"] for r in report["results"].values())]
        report = merge_reports(json.loads(args.out.read_text()), report, models, args.steps, args.num_inducing, args.reason)
    if transforms is not None:
        if args.num_inducing:
            report["protocol"]["num_inducing"] = args.num_inducing | {"reason": args.reason}
        report["zoo_models_not_run"] = sorted(set(zoo.names()) - set(models))  # a sweep over some models says which it left out
        shift_scale_totals(report)
        write_json(args.out, report)
        for path in partial.values():
            path.unlink(missing_ok=True)
        print(f"totals {report['totals']}; goal met: {report['goal_met']}; complete: {report['complete']}")
        return report
    totals = collections.Counter()
    for result in report["results"].values():
        for counts in result["models"].values():
            totals.update({k: counts[k] for k in ("runs", "cholesky_failures", "jitter_escalations", "diverged", "non_finite", "errors")})
    report["totals"] = dict(totals)
    report["goal_met"] = totals["cholesky_failures"] == totals["diverged"] == totals["non_finite"] == totals["errors"] == 0
    report["complete"] = not any(result.get("not_run") for result in report["results"].values())
    write_json(args.out, report)
    for path in partial.values():
        path.unlink(missing_ok=True)
    print(f"totals {dict(totals)}; goal met: {report['goal_met']}; complete: {report['complete']}")
    return report


def merge_reports(old: dict, new: dict, models: list[str], steps: int, num_inducing: dict, reason: str | None) -> dict:
    """``old`` with the per-model counts and failures of ``models`` taken from ``new`` (one report).

    Models of ``old`` not in ``models`` keep their records; ``not_run`` loses the models now run;
    a step count other than ``old``'s protocol or an M override is recorded per model with its reason. The date
    becomes the merge's, the machine and the run time of each part are kept under ``merged_runs``;
    ``old``'s ``"provenance"`` is dropped, so the file records the merge's.
    """
    merged = json.loads(json.dumps(old))
    merged.pop("provenance", None)  # the earlier run's: write_json records the merge's
    protocol = merged["protocol"]
    for key in ("data", "seeds", "elbo_samples"):
        if protocol[key] != new["protocol"][key]:
            raise SystemExit(f"--merge: {key} {new['protocol'][key]!r} differs from the file's {protocol[key]!r}")
    if (steps != protocol["steps"] or num_inducing) and not reason:
        raise SystemExit("--merge with --steps other than the file's protocol or with --num-inducing needs --reason")
    for name in models:
        deviation = {k: v for k, v in (("steps", steps if steps != protocol["steps"] else None),
                                        ("num_inducing", num_inducing.get(name))) if v is not None}
        if deviation:
            protocol.setdefault("deviations", {})[name] = deviation | {"reason": reason}
        else:
            protocol.get("deviations", {}).pop(name, None)
    for dtype, result in new["results"].items():
        target = merged["results"].setdefault(dtype, {"models": {}, "failures": []})
        target["models"].update({name: result["models"][name] for name in models if name in result["models"]})
        target["models"] = dict(sorted(target["models"].items()))
        target["failures"] = [f for f in target["failures"] if f["model"] not in models] + \
            [f for f in result["failures"] if f["model"] in models]
        target["not_run"] = [name for name in target.get("not_run", []) if name not in target["models"]]
    merged.setdefault("merged_runs", []).append({"date": new["date"], "models": models, "dtypes": sorted(new["results"]),
                                                 "seconds": new.get("seconds"), "machine": new["machine"]})
    merged["date"] = new["date"]
    return merged


@pytest.mark.benchmark
def test_robustness_sweep():
    """The full sweep (about 15 minutes on 2 CPU cores); fails unless every run is finite and factorises."""
    report = main([])
    assert report["goal_met"], report["totals"]


if __name__ == "__main__":
    main()
