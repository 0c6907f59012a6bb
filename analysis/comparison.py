"""``gpzoo.compare``: fit several zoo models (each once per seed) on one data set and compare them.

The Python face of ``gpzoo compare`` (the command is a thin layer over the same code)::

    import gpzoo
    cmp = gpzoo.compare("two-moons", ["svgp-rbf", "svgp-logistic-pg"], seeds=[0, 1], steps=200,
                        backend="ray", out="reports/moons")
    cmp.table                      # the comparison table (pandas DataFrame, one row per fit)
    cmp.results["svgp-rbf", 1]     # the FitResult of (model, seed)
    cmp.report_path                # reports/moons/report.html (None without ``out``)

Every (model, seed) fit is a :class:`~gpzoo.analysis.backends.FitTask` run by a backend
(``"sequential"`` in this process, or ``"ray"``); each is saved as soon as it is finished and read
back, so the results are the same, bit for bit, whichever backend ran them. With ``out`` the
report, the saved models and the run record (``run.json``, what ``resume=True`` checks) are kept
there; without it they are written to a temporary directory that is removed afterwards.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from gpzoo.models.errors import InvalidArgumentError, check_flag, check_integer, check_real, check_seed, unknown_name_message

__all__ = ["Comparison", "FitsInterrupted", "compare"]

# the defaults are those of `gpzoo compare` (defined with the command, whose --help stays light)
from gpzoo.analysis.cli import DEFAULTS, MIN_DRAWS, REPORT_ENTRIES  # noqa: E402


class FitsInterrupted(KeyboardInterrupt):
    """Ctrl-C while a comparison was fitting: ``finished`` names the fits saved in ``models_dir``."""

    def __init__(self, finished: list[str], models_dir: Path):
        self.finished, self.models_dir = finished, models_dir
        super().__init__(f"interrupted; finished fits are saved in {models_dir} ({', '.join(finished) or 'none'})")


@dataclasses.dataclass(frozen=True)
class Comparison:
    """What :func:`compare` returns.

    ``results``: ``{(model, seed): FitResult}``; ``table``: the comparison table (pandas
    DataFrame indexed by run name: the model's name for a single seed, ``"MODEL seed S"`` for
    several) with ELBO, held-out and PSIS-LOO metrics, also written as ``comparison.csv``;
    ``runs``: ``{run name: (model, seed)}``; ``report_path``: ``report.html`` when ``out`` was
    given, else None; ``fit_seconds`` / ``report_seconds``: wall time of the fits and of the report;
    ``fit_cpu_seconds`` / ``report_cpu_seconds``: this process's CPU time (all its threads) in each
    (on a shared machine a steadier measure of their cost than wall time; Ray actors' CPU is not in it).
    """

    results: dict[tuple[str, int], object]
    table: object
    runs: dict[str, tuple[str, int]]
    report_path: Path | None
    fit_seconds: float
    report_seconds: float
    fit_cpu_seconds: float = 0.0
    report_cpu_seconds: float = 0.0

    def __getitem__(self, key):
        """``cmp["svgp-rbf", 0]`` or, with one seed, ``cmp["svgp-rbf"]``: that fit's FitResult."""
        if isinstance(key, str):
            matches = [k for k in self.results if k[0] == key]
            if len(matches) != 1:
                raise KeyError(f"{key!r} names {len(matches)} fits; index by (model, seed)")
            key = matches[0]
        return self.results[key]


# ----------------------------------------------------------------------------- shared with the CLI
def subset(X, y, n, rng):
    """A seeded subsample of ``n`` rows (all when None or more than there are): X, y and the row indices, in order."""
    idx = np.arange(len(y)) if n is None or n >= len(y) else np.sort(rng.choice(len(y), n, replace=False))
    return np.asarray(X)[idx], np.asarray(y)[idx], idx


def run_names(model_names: Sequence[str], seeds: Sequence[int]) -> dict[str, tuple[str, int]]:
    """``{run name: (model, seed)}``: the model's name alone for a single seed, else ``"MODEL seed S"``."""
    if len(seeds) == 1:
        return {name: (name, seeds[0]) for name in model_names}
    return {f"{name} seed {seed}": (name, seed) for name in model_names for seed in seeds}


def prepare_output(out: Path, run: dict, *, resume: bool, overwrite: bool, flag: Callable[[str], str],
                   error: Callable[[str, str], Exception]) -> dict:
    """Refuse to mix runs in ``out``: an existing report needs ``overwrite`` (which removes the
    report's own files, nothing else) or ``resume`` (which needs the same settings). Returns the run
    record to write (with ``resume``, the models of the earlier run first).

    ``flag(name)`` spells a setting in messages (``--resume`` on the command line, ``resume=True``
    in Python); ``error(argument, message)`` builds the exception raised.
    """
    if resume and overwrite:
        raise error("overwrite", f"{flag('resume')} and {flag('overwrite')} contradict each other: choose one")
    present = [e for e in REPORT_ENTRIES if (out / e).exists()]
    if resume:
        record = out / "run.json"
        if not record.is_file():
            raise error("resume", f"{flag('resume')}: {str(out)!r} holds no run to continue (no run.json); start it "
                                  f"without {flag('resume')}")
        try:
            before = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise error("resume", f"{flag('resume')}: cannot read {str(record)!r} ({exc})") from None
        if not isinstance(before, dict):
            raise error("resume", f"{flag('resume')}: {str(record)!r} is not a run record")
        differ = [k for k in run if k not in ("models", "options") and before.get(k) != run[k]]
        differ += [f"{name} options" for name in run["models"]
                   if name in before.get("models", []) and before.get("options", {}).get(name) != run["options"][name]]
        if differ:
            raise error("resume", f"{flag('resume')}: the run in {str(out)!r} used different settings ({', '.join(differ)}); "
                                  f"rerun with those settings, or start afresh with {flag('overwrite')}")
        run = {**run, "models": list(dict.fromkeys([*before.get("models", []), *run["models"]]))}
    elif present and not overwrite:
        raise error("out", f"{flag('out')} {str(out)!r} already holds a gpzoo report ({', '.join(present)}); pass "
                           f"{flag('overwrite')} to replace it or {flag('resume')} to continue it")
    elif present:
        for entry in present:
            path = out / entry
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return run


def write_run_record(out: Path, run: dict) -> None:
    """``out/run.json`` (written to a temporary name, then renamed)."""
    tmp = out / ".run.json.tmp"
    tmp.write_text(json.dumps(run, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, out / "run.json")


def fit_and_report(*, dataset, X_train, y_train, X_test, y_test, specs: Mapping[str, object],
                   runs: Mapping[str, tuple[str, int]], grouped: bool, out: Path, resume: bool, steps: int | str,
                   batch_size: int, learning_rate: float, checkpoint_every: int | None, num_draws: int, data_seed: int,
                   backend: str, backend_options: dict, save_models: bool, progress: bool,
                   log: Callable[[str], None] | None, with_report: bool = True, standardise: bool = False) -> Comparison:
    """Fit every run (``{run name: (model, seed)}`` of ``specs``) on ``backend``, read the saved fits
    back and write the report to ``out`` (prepared and checked writable by the caller).

    Fits already saved in ``out/models`` are loaded instead of refitted when ``resume``. ``log``
    receives the progress messages (None: silent); ``progress`` shows progress bars.
    Raises :class:`FitsInterrupted` on Ctrl-C (finished fits stay saved). ``with_report=False``
    writes no report: the table is then the ELBO ranking alone (:func:`gpzoo.analysis.compare_elbo`).
    ``standardise``: every fit standardises its data (``gpzoo.fit(..., standardise=True)``).
    """
    from gpzoo.analysis.backends import FitOptions, FitTask, run_fits  # noqa: PLC0415
    from gpzoo.analysis.report import report, unique_file_stems  # noqa: PLC0415
    from gpzoo.inference.io import load  # noqa: PLC0415

    batch_size = min(batch_size, len(y_train))
    stems = unique_file_stems(list(runs))
    tasks, finished = [], []
    for name, (model, seed) in runs.items():
        task = FitTask(name, specs[model], seed, out / "models" / stems[name], out / "checkpoints" / stems[name])
        if resume and (task.saved / "model.json").is_file():
            finished.append(name)
            if log:
                log(f"{name}: finished in the interrupted run, loaded from {task.saved}")
        else:
            tasks.append(task)
    from gpzoo.inference.programs import persistent_cache  # noqa: PLC0415

    cache = persistent_cache()  # the user's cache of compiled programs (GPZOO_COMPILATION_CACHE=off: none)
    options = FitOptions(steps=steps, batch_size=batch_size, learning_rate=learning_rate,
                         checkpoint_every=checkpoint_every, resume=resume, progress=progress and backend == "sequential",
                         compile_cache=cache, keep_compile_cache=cache is not None, standardise=standardise)

    def done(task):
        finished.append(task.name)
        if log and backend != "sequential":
            log(f"{task.name}: fitted ({len(finished)}/{len(runs)})")

    t0, c0 = time.perf_counter(), time.process_time()
    try:
        run_fits(tasks, X_train, y_train, options, backend=backend, on_done=done, **backend_options)
    except KeyboardInterrupt:
        raise FitsInterrupted(list(finished), out / "models") from None
    loaded = {name: load(out / "models" / stems[name]) for name in runs}
    fit_seconds, fit_cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    checkpoint_root = out / "checkpoints"
    if checkpoint_root.is_dir() and not any(checkpoint_root.iterdir()):
        checkpoint_root.rmdir()
    if not with_report:
        from gpzoo.analysis.compare import compare_elbo  # noqa: PLC0415 - JAX-heavy

        table = compare_elbo(loaded)
        table.index.name = "model"
        return Comparison(results={runs[name]: res for name, res in loaded.items()}, table=table, runs=dict(runs),
                          report_path=None, fit_seconds=fit_seconds, report_seconds=0.0, fit_cpu_seconds=fit_cpu_seconds)
    if log:
        log(f"fitted {len(loaded)} model(s) in {fit_seconds:.1f} s; writing the report (posterior draws, held-out "
            f"and PSIS-LOO checks, figures) to {out}")
    t1, c1 = time.perf_counter(), time.process_time()
    path = report(loaded, out, X_test=X_test, y_test=y_test, dataset=dataset, num_draws=num_draws, seed=data_seed,
                  progress=progress, groups={name: model for name, (model, _) in runs.items()} if grouped else None)
    report_seconds, report_cpu_seconds = time.perf_counter() - t1, time.process_time() - c1
    if not save_models:
        for name in loaded:
            shutil.rmtree(out / "models" / stems[name], ignore_errors=True)
    import pandas as pd  # noqa: PLC0415

    table = pd.read_csv(path.parent / "comparison.csv", index_col="model")
    return Comparison(results={runs[name]: res for name, res in loaded.items()}, table=table, runs=dict(runs),
                      report_path=path, fit_seconds=fit_seconds, report_seconds=report_seconds,
                      fit_cpu_seconds=fit_cpu_seconds, report_cpu_seconds=report_cpu_seconds)


# ----------------------------------------------------------------------------- the Python API
def _api_flag(name: str) -> str:
    return name if name == "out" else f"{name}=True"


def _non_empty_list(value, argument: str, expected: str, one: str) -> list:
    """``value`` as a list; an ``InvalidArgumentError`` naming ``argument`` if it is not iterable or empty."""
    try:
        value = list(value)
    except TypeError:
        raise InvalidArgumentError(argument, f"expected {expected}, got {value!r}") from None
    if not value:
        raise InvalidArgumentError(argument, f"give at least one {one}")
    return value


def _model_list(models) -> list:
    if isinstance(models, str):
        models = [m.strip() for m in models.split(",") if m.strip()]
    return _non_empty_list(models, "models", "model names (or ModelSpecs)", "model")


def _seed_list(seeds) -> list[int]:
    if isinstance(seeds, (int, np.integer)) and not isinstance(seeds, bool):
        seeds = [seeds]
    seeds = _non_empty_list(seeds, "seeds", "a sequence of non-negative integers", "seed")
    for seed in seeds:
        check_seed(seed, "seeds")
    seeds = [int(s) for s in seeds]
    if len(set(seeds)) != len(seeds):
        raise InvalidArgumentError("seeds", f"seeds must be distinct, got {seeds}")
    return seeds


def _load_dataset(data, data_seed: int, num_train, num_test, data_paths):
    """(dataset, X_train, y_train, X_test, y_test) from a data-set name or a ``datasets.Dataset``."""
    from gpzoo.analysis import datasets  # noqa: PLC0415

    if isinstance(data, str):
        if data not in datasets.names():
            raise InvalidArgumentError("data", unknown_name_message("dataset", data, datasets.names()))
        options = datasets.dataset_options(data)
        paths = dict(data_paths or {})
        for key in paths:
            if key not in options or not key.endswith("path"):
                raise InvalidArgumentError("data_paths", f"dataset {data!r} has no file option {key!r}")
        missing = [k for k, v in options.items() if v is datasets.REQUIRED and k not in paths]
        if missing:
            raise InvalidArgumentError("data_paths", f"dataset {data!r} reads local files: give {', '.join(missing)}")
        num_train = DEFAULTS["num_train"] if num_train == "default" else num_train
        num_test = DEFAULTS["num_test"] if num_test == "default" else num_test
        sizes = {k: n for k, n in {"num_train": num_train, "num_test": num_test}.items() if k in options and n is not None}
        ds = datasets.load(data, seed=data_seed, **sizes, **paths)
    elif isinstance(data, datasets.Dataset):
        if data_paths:
            raise InvalidArgumentError("data_paths", "applies to a data set given by name only")
        ds = data
        num_train = None if num_train == "default" else num_train
        num_test = None if num_test == "default" else num_test
    else:
        raise InvalidArgumentError("data", f"expected a data-set name (gpzoo.datasets.names()) or a "
                                           f"gpzoo.datasets.Dataset, got {type(data).__name__}")
    rng = np.random.default_rng(data_seed)
    X_train, y_train, _ = subset(ds.X_train, ds.y_train, num_train, rng)
    X_test, y_test, _ = subset(ds.X_test, ds.y_test, num_test, rng)
    return ds, X_train, y_train, X_test, y_test


def _build_specs(models: list, ds, num_inducing: int, likelihood, options: Mapping[str, Mapping]) -> dict:
    """``{name: ModelSpec}``: names built by the zoo with the data set's facts, specs taken as given."""
    from gpzoo.models import zoo  # noqa: PLC0415

    given = {"input_dim": ds.num_features, "task": ds.task, "num_classes": ds.num_classes,
             "image_shape": ds.image_shape, "num_inducing": num_inducing}
    if likelihood is not None:
        given["likelihood"] = (zoo.likelihood_from_name(likelihood, ds.task, ds.num_classes)
                               if isinstance(likelihood, str) else likelihood)
    specs = {}
    for model in models:
        if isinstance(model, zoo.ModelSpec):
            name, spec = model.name, model
            if name in options:
                raise InvalidArgumentError("options", f"model {name!r} is given as a ModelSpec: set its options there")
        elif isinstance(model, str):
            if model not in zoo.names():
                raise InvalidArgumentError("models", unknown_name_message("model", model, zoo.names()))
            chosen = dict(options.get(model, {}))
            try:
                name, spec = model, zoo.get(model, **(given | chosen))
            except InvalidArgumentError as exc:
                if ds.image_shape is None and exc.argument in ("image_shape", "patch_shape") and exc.argument not in chosen:
                    raise InvalidArgumentError("models", f"model {model!r} needs image data but dataset {ds.name!r} is "
                                                         "tabular (no image_shape)") from None
                if exc.argument in chosen:
                    raise InvalidArgumentError("options", f"{model}.{exc}") from None
                raise
        else:
            raise InvalidArgumentError("models", f"expected model names or ModelSpecs, got {model!r}")
        if name in specs:
            raise InvalidArgumentError("models", f"lists model {name!r} twice")
        if spec.input_kind == "image" and ds.image_shape is None:
            raise InvalidArgumentError("models", f"model {name!r} needs image data but dataset {ds.name!r} is tabular")
        if spec.input_kind == "tabular" and ds.image_shape is not None:
            raise InvalidArgumentError("models", f"model {name!r} is for tabular data but dataset {ds.name!r} holds "
                                                 f"images {ds.image_shape}")
        specs[name] = spec
    unknown = sorted(set(options) - set(specs))
    if unknown:
        raise InvalidArgumentError("options", f"names model {unknown[0]!r}, which is not among the models compared")
    return specs


def _optional_count(value, name: str):
    if value is None or value == "default":
        return value
    return check_integer(value, name, minimum=1)


def compare(data="rectangles", models=("svgp-rbf", "conv", "weighted-conv"), *, seeds=(0,),
            steps: int | str = int(DEFAULTS["steps"]), batch_size: int = int(DEFAULTS["batch_size"]),
            learning_rate: float = DEFAULTS["learning_rate"], num_inducing: int = int(DEFAULTS["num_inducing"]),
            likelihood=None, options: Mapping[str, Mapping] | None = None, num_train="default", num_test="default",
            data_seed: int = 0, data_paths: Mapping[str, str] | None = None, num_draws: int = int(DEFAULTS["num_draws"]),
            backend: str = "sequential", address: str | None = None, cpus_per_fit: int = 1, out=None,
            overwrite: bool = False, resume: bool = False, checkpoint_every: int | None = None,
            save_models: bool = True, progress: bool = False, report: bool = True, standardise: bool = False) -> Comparison:
    """Fit every model of ``models`` once per seed of ``seeds`` on ``data`` and compare them.

    ``data``: a data-set name (``gpzoo.datasets.names()``; generated with ``data_seed``, files of a
    local one in ``data_paths``) or a ``gpzoo.datasets.Dataset`` (your own arrays). ``num_train`` /
    ``num_test``: a seeded subsample of each split (None: all rows; by default 500 each for a
    named data set, as ``gpzoo compare``, and all rows of a Dataset). ``models``: zoo names (a list
    or a comma-separated string; built with the data set's facts, ``num_inducing``, ``likelihood``
    and ``options[name]``, e.g. ``{"conv": {"patch_shape": (5, 5)}}``) or ``ModelSpec`` objects.
    ``steps`` (a count, or ``"auto"``: until the objective levels off), ``batch_size`` (capped at
    the training-set size) and ``learning_rate`` are the :func:`gpzoo.fit` settings of every fit; ``num_draws`` posterior draws per fit go to the report.

    ``backend``: ``"sequential"`` (in this process) or ``"ray"`` (each fit a Ray task on a local
    instance, or the cluster at ``address``; ``cpus_per_fit`` CPUs each). ``out``: a directory
    kept with the report (``report.html``, ``comparison.csv``), the saved models (unless
    ``save_models=False``) and ``run.json``; an existing report there needs ``overwrite=True`` or
    ``resume=True`` (continues a stopped run with the same settings, refitting only what is
    missing). Without ``out`` everything is written to a temporary directory and removed.
    ``report=False`` skips the report (its posterior draws, PSIS-LOO and figures): ``table`` is then
    the ELBO ranking alone. ``standardise=True``: every fit centres and scales the features and
    regression targets (``gpzoo.fit(..., standardise=True)``; predictions, ELBOs and held-out
    densities stay in the data's units). Every argument is checked (a typed gpzoo error naming it) before anything is fitted.
    """
    from gpzoo.analysis.backends import BACKENDS  # noqa: PLC0415

    models = _model_list(models)
    seeds = _seed_list(seeds)
    if steps != "auto":  # "auto": every fit runs until its objective levels off (gpzoo.fit)
        check_integer(steps, "steps", minimum=0)
    check_integer(batch_size, "batch_size", minimum=1)
    check_real(learning_rate, "learning_rate", positive=True)
    check_integer(num_inducing, "num_inducing", minimum=1)
    num_train, num_test = _optional_count(num_train, "num_train"), _optional_count(num_test, "num_test")
    check_seed(data_seed, "data_seed")
    check_integer(num_draws, "num_draws", minimum=MIN_DRAWS)
    if backend not in BACKENDS:
        raise InvalidArgumentError("backend", f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    check_integer(cpus_per_fit, "cpus_per_fit", minimum=1)
    if backend == "sequential" and (address is not None or cpus_per_fit != 1):
        raise InvalidArgumentError("address" if address is not None else "cpus_per_fit", "is an option of the ray backend only")
    if address is not None and not isinstance(address, str):
        raise InvalidArgumentError("address", f"expected a Ray address string, got {address!r}")
    for name, value in (("overwrite", overwrite), ("resume", resume), ("save_models", save_models), ("progress", progress),
                        ("report", report), ("standardise", standardise)):
        check_flag(value, name)
    if checkpoint_every is not None:
        check_integer(checkpoint_every, "checkpoint_every", minimum=1)
    if out is not None and not isinstance(out, (str, os.PathLike)):
        raise InvalidArgumentError("out", f"expected a directory path or None, got {out!r}")
    if out is None and (resume or overwrite):
        raise InvalidArgumentError("resume" if resume else "overwrite", "needs out (the directory of the earlier run)")
    options = dict(options or {})
    if not all(isinstance(v, Mapping) for v in options.values()):
        raise InvalidArgumentError("options", "expected {model name: {option: value}}")

    ds, X_train, y_train, X_test, y_test = _load_dataset(data, data_seed, num_train, num_test, data_paths)
    specs = _build_specs(models, ds, num_inducing, likelihood, options)
    from gpzoo.inference.data import data_fingerprint  # noqa: PLC0415

    run = {"data": ds.name if not isinstance(data, str) else data, "data_paths": dict(data_paths or {}),
           "data_fingerprint": data_fingerprint(X_train, y_train), "seed": data_seed, "seeds": seeds, "steps": steps,
           "batch_size": batch_size, "num_inducing": num_inducing, "learning_rate": float(learning_rate),
           "num_train": num_train, "num_test": num_test,
           "likelihood": likelihood if likelihood is None or isinstance(likelihood, str) else repr(likelihood),
           "num_draws": num_draws,
           "options": {name: {k: list(v) if isinstance(v, tuple) else v for k, v in dict(options.get(name, {})).items()}
                       for name in specs},
           "models": list(specs)}
    if standardise:  # recorded only when set, so that runs recorded without it still resume
        run["standardise"] = True
    backend_options = {} if backend == "sequential" else {"address": address, "cpus_per_fit": cpus_per_fit}
    log = (lambda text: print(text, file=sys.stderr, flush=True)) if progress else None

    def run_in(directory: Path, keep: bool) -> Comparison:
        from gpzoo.analysis.report import check_writable  # noqa: PLC0415

        record = prepare_output(directory, run, resume=resume, overwrite=overwrite, flag=_api_flag,
                                error=InvalidArgumentError)
        check_writable(directory)
        write_run_record(directory, record)
        result = fit_and_report(dataset=ds, X_train=X_train, y_train=y_train, X_test=X_test, y_test=y_test,
                                specs=specs, runs=run_names(list(specs), seeds), grouped=len(seeds) > 1, out=directory,
                                resume=resume, steps=steps, batch_size=batch_size, learning_rate=float(learning_rate),
                                checkpoint_every=checkpoint_every, num_draws=num_draws, data_seed=data_seed,
                                backend=backend, backend_options=backend_options, save_models=save_models or not keep,
                                progress=progress, log=log, with_report=report, standardise=standardise)
        return result if keep else dataclasses.replace(result, report_path=None)

    if out is not None:
        from gpzoo.analysis.outlock import output_lock  # noqa: PLC0415

        with output_lock(out, argument="out"):  # one writer per folder: a second run is refused, naming this one
            return run_in(Path(out), keep=True)
    with tempfile.TemporaryDirectory(prefix="gpzoo-compare-") as directory:
        return run_in(Path(directory), keep=False)

