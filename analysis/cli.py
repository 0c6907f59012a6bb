"""The ``gpzoo`` command: list models and datasets, fit and compare models, (re)build reports.

::

    gpzoo list [--options]                  # models (and each model's options), datasets
    gpzoo fit     --data two-moons --model svgp-rbf --out reports/moons
    gpzoo compare --data rectangles --models svgp-rbf,conv,weighted-conv --out reports/rectangles \
                  --option conv.patch_shape=5x5 --option svgp-rbf.ard=true
    gpzoo report  reports/rectangles        # rebuild every file from the saved DataTrees
    gpzoo predict --model reports/rectangles/models/conv --data rectangles --out conv.csv   # or .nc
    gpzoo predict --model reports/rectangles/models/conv --input my_inputs.csv --out conv.csv   # or .npy, .npz

Thin by design: it loads a dataset, builds specs from the zoo with the dataset's facts and the
``--option MODEL.KEY=VALUE`` values (parsed to the types the model's builder declares, see
``zoo.options``), calls ``inference.fit`` (progress bars) and ``analysis.report.report``, and
prints a summary table. ``fit`` and ``compare`` also save every fitted model to
``OUT/models/NAME/`` (``gpzoo.save``: ``model.json`` + ``arrays.npz``; ``--no-save-models`` skips
it), which ``predict`` reads back (``gpzoo.load``) to write predictions for a dataset's split, or
for the user's own inputs in a ``.npy``/``.npz`` file (``datasets.read_inputs``), as CSV or netCDF.
Every failure is one line on stderr (``gpzoo: error: ...``) and a non-zero exit status:
2 for bad usage (unknown model or dataset, incompatible pair, bad option), 1 for a failure while
running (unwritable directory, diverged fit, broken report directory, or an unexpected error —
``GPZOO_TRACEBACK=1`` shows its traceback).

``fit``, ``compare``, ``report`` and ``predict`` keep the programs they compile in JAX's persistent
compilation cache, ``$XDG_CACHE_HOME/gpzoo/jax`` (``~/.cache/gpzoo/jax``; at most 2 GiB, least
recently used programs evicted), so a second run compiles almost nothing.
``GPZOO_COMPILATION_CACHE=DIR`` puts it elsewhere and ``GPZOO_COMPILATION_CACHE=off`` turns it off;
a cache folder configured in JAX (``jax_compilation_cache_dir``) is used as it is.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import warnings
from pathlib import Path

__all__ = ["main"]

DEFAULT_DATA = "rectangles"
DEFAULT_MODELS = "svgp-rbf,conv,weighted-conv"
#: Defaults sized so that ``gpzoo compare`` with no options (rectangles; svgp-rbf, conv, weighted-conv)
#: finishes in < 5 minutes on 2 CPU cores (measured ≈ 2.5 min on 2 shared, busy cores) while the
#: convolutional models already reach ≈ 95 % test accuracy. Raise them for paper-quality fits.
DEFAULTS = {"steps": 150, "batch_size": 50, "num_inducing": 16, "learning_rate": 0.05, "num_draws": 100,
            "num_train": 500, "num_test": 500}
EXIT_USAGE, EXIT_FAILURE = 2, 1
#: Fewest posterior draws a report accepts (gpzoo.analysis.datatree.MIN_DRAWS; kept here so that
#: `gpzoo --help` stays light, and checked equal by the tests).
MIN_DRAWS = 30
#: Files and folders a report directory holds (what --overwrite replaces; anything else is left alone).
REPORT_ENTRIES = ("report.json", "report.md", "report.html", "comparison.csv", "run.json", "models", "figures", "checkpoints")


class UsageError(Exception):
    """A bad request from the user (exit status 2)."""


# ----------------------------------------------------------------------------- argument parsing
def _int_at_least(minimum: int, kind: str | None = None):
    """An argparse type: an integer >= ``minimum``, described as a ``kind`` integer in errors."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            wanted = f"a {kind} integer" if kind else f"an integer >= {minimum}"
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    return parse


_positive_int = _int_at_least(1, "positive")
_non_negative_int = _int_at_least(0, "non-negative")


def _number_or(word: str, value, text: str, parse, expected: str):
    """An argparse value: ``value`` for the literal ``word``, else ``parse(text)``, refused as ``expected``."""
    if text == word:
        return value
    try:
        return parse(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected {expected} or {word!r}, got {text!r}") from None


def _steps(text: str):
    """An argparse type: a non-negative integer, or ``auto`` (run until the objective levels off)."""
    return _number_or("auto", "auto", text, _non_negative_int, "a non-negative integer")


def _seed_list(text: str) -> list[int]:
    """An argparse type: distinct non-negative integers separated by commas."""
    try:
        seeds = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        seeds = []
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"expected distinct non-negative integers separated by commas, got {text!r}")
    return seeds


def _count_or_all(text: str) -> int | None:
    """An argparse type: a positive integer, or ``all`` (None)."""
    return _number_or("all", None, text, _positive_int, "a positive integer")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line (no usage dump) and raise instead of exiting."""

    def error(self, message):
        raise UsageError(message)


def _add_fit_options(parser, *, data_default):
    parser.add_argument("--data", default=data_default, required=data_default is None,
                        help=f"dataset name (see `gpzoo list`){'' if data_default is None else f'; default {data_default}'}")
    parser.add_argument("--out", required=True, type=Path, help="output directory of the report")
    parser.add_argument("--steps", type=_steps, default=DEFAULTS["steps"],
                        help="optimisation steps per model, or 'auto': until its objective levels off (500 to 10,000) "
                             "(default %(default)s); a model that ends before it levels off is named after the table")
    parser.add_argument("--batch-size", type=_positive_int, default=DEFAULTS["batch_size"],
                        help="minibatch size, capped at the training-set size (default %(default)s)")
    parser.add_argument("--seed", type=_non_negative_int, default=0, help="seed of data generation and fitting (default 0)")
    parser.add_argument("--seeds", type=_seed_list, default=None, metavar="S1,S2,...",
                        help="fit every model once per seed (the data stay those of --seed); the report adds mean ± s.d. "
                             "over seeds and its verdict accounts for the seed spread")
    parser.add_argument("--num-inducing", type=_positive_int, default=DEFAULTS["num_inducing"],
                        help="inducing points / patches per model (default %(default)s)")
    parser.add_argument("--learning-rate", type=_positive_float, default=DEFAULTS["learning_rate"], help="Adam learning rate (default %(default)s)")
    parser.add_argument("--standardise", action="store_true",
                        help="centre and scale the features and regression targets of every fit (predictions, ELBOs "
                             "and held-out densities stay in the data's units)")
    parser.add_argument("--num-train", type=_count_or_all, default=DEFAULTS["num_train"],
                        help="training points: a dataset option where it has one, else a seeded subsample; "
                             "'all' for every point (default %(default)s)")
    parser.add_argument("--num-test", type=_count_or_all, default=DEFAULTS["num_test"],
                        help="test points, as --num-train (default %(default)s)")
    parser.add_argument("--num-draws", type=_int_at_least(MIN_DRAWS), default=DEFAULTS["num_draws"],
                        help=f"posterior draws of u stored per model, at least {MIN_DRAWS} (PSIS-LOO fits a Pareto tail "
                             "to the largest weights; default %(default)s)")
    parser.add_argument("--likelihood", default=None,
                        help="likelihood by name (gaussian, poisson, bernoulli-logit, bernoulli-probit, robustmax, softmax, "
                             "one-hot-gaussian); default: the task's (gaussian, bernoulli-logit, robustmax)")
    parser.add_argument("--option", dest="options", action="append", default=[], metavar="MODEL.KEY=VALUE",
                        help="a model option, e.g. conv.patch_shape=5x5 or svgp-rbf.ard=true (repeatable; "
                             "`gpzoo list --options` shows each model's)")
    parser.add_argument("--data-path", dest="data_paths", action="append", default=[], metavar="[KEY=]PATH",
                        help="file(s) of a local data set: `--data-path x.npz` for local-numpy, `--data-path "
                             "images_path=... --data-path labels_path=...` for local-idx (repeatable)")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted run in OUT: finished models are loaded, an unfinished one resumes "
                             "from its checkpoint (the settings must be the same)")
    parser.add_argument("--overwrite", action="store_true", help="replace a report already in OUT (refused otherwise)")
    parser.add_argument("--checkpoint-every", type=_positive_int, default=None,
                        help="checkpoint each fit every N steps to OUT/checkpoints/NAME (default: every 10 %% of the run)")
    parser.add_argument("--save-models", action=argparse.BooleanOptionalAction, default=True,
                        help="save each fitted model to OUT/models/NAME/ (model.json + arrays.npz) for `gpzoo predict "
                             "--model` and gpzoo.load (default: on)")
    parser.add_argument("--backend", choices=("sequential", "ray"), default="sequential",
                        help="where the fits run: one after another here (default) or as Ray tasks (pip install "
                             "\"gpzoo[ray]\"), on a local Ray instance or the cluster at --address")
    parser.add_argument("--address", default=None, help="address of a running Ray cluster (--backend ray; default: start "
                                                         "a local instance for the run)")
    parser.add_argument("--cpus-per-fit", type=_positive_int, default=1, help="CPUs Ray reserves per fit (default 1)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def _version() -> str:
    from gpzoo import __version__  # noqa: PLC0415 - the package root is light (lazy public names)

    return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpzoo", description="Structured-kernel Gaussian processes: fit, compare, report.")
    parser.add_argument("--version", action="version", version=f"gpzoo {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    list_p = sub.add_parser("list", help="list models and datasets with one-line descriptions")
    list_p.add_argument("--options", action="store_true", help="also list each model's options (type, default, help)")
    fit_p = sub.add_parser("fit", help="fit one model on one dataset and write its report")
    fit_p.add_argument("--model", required=True, help="model name (see `gpzoo list`)")
    _add_fit_options(fit_p, data_default=None)
    cmp_p = sub.add_parser("compare", help="fit several models on one dataset and write a comparison report")
    cmp_p.add_argument("--models", default=DEFAULT_MODELS, help="comma-separated model names (default %(default)s)")
    _add_fit_options(cmp_p, data_default=DEFAULT_DATA)
    rep_p = sub.add_parser("report", help="rebuild a report directory from its saved DataTrees (no refitting)")
    rep_p.add_argument("dir", type=Path, help="a directory written by `gpzoo fit` or `gpzoo compare`")
    pred_p = sub.add_parser("predict", help="predict with a saved model on a dataset's split or your own inputs; "
                                            "write CSV or netCDF")
    pred_p.add_argument("--model", required=True, type=Path,
                        help="a saved model: OUT/models/NAME written by `gpzoo fit`/`compare`, or any gpzoo.save directory")
    pred_p.add_argument("--input", default=None, metavar="FILE",
                        help="a file of your own inputs: X.npy holding [N, D] (images also [N, H, W(, C)]), X.npz "
                             "holding them as X with optional targets y (or as its only array; read without pickle), "
                             "or X.csv with a row per input (optional header; targets in a column named y, or as one "
                             "extra last column); the inputs must match the model's. Without targets the output has "
                             "no target column")
    pred_p.add_argument("--data", default=None,
                        help="instead of --input: a dataset name (see `gpzoo list`), whose --split is predicted")
    pred_p.add_argument("--data-path", dest="data_paths", action="append", default=[], metavar="[KEY=]PATH",
                        help="file(s) of a local data set, as for `gpzoo compare`")
    pred_p.add_argument("--split", choices=("test", "train"), default=None, help="which split of a dataset to predict (default test)")
    pred_p.add_argument("--num-points", type=_count_or_all, default=None,
                        help="points of the split: a dataset option where it has one, else a seeded subsample (default: all)")
    pred_p.add_argument("--seed", type=_non_negative_int, default=None,
                        help="seed of data generation and subsampling (default: the model's fit seed, as `gpzoo fit` used)")
    pred_p.add_argument("--out", required=True, type=Path,
                        help="output file: .csv (a row per point: index, f_mean/f_var per latent, y moments, class "
                             "probabilities, predicted label, target where known) or .nc (the same as an xarray Dataset)")
    search_p = sub.add_parser("search", help="search the kernel grammar (SE, Per, Lin, RQ, +, ×, change points) for a "
                                             "data set's structure (regression, labels or counts); write a report")
    search_p.add_argument("--data", default=None, help="a regression dataset (see `gpzoo list`; e.g. co2, sunspots, nile)")
    search_p.add_argument("--data-path", default=None, type=Path, metavar="FILE",
                          help="your own series instead: FILE.npz holding X [N] or [N, D] and y [N] (optional X_test, "
                               "y_test), or FILE.csv whose last column is y and the others the inputs (a header line is "
                               "skipped)")
    search_p.add_argument("--depth", type=_positive_int, default=3, help="levels of expansion (default 3)")
    search_p.add_argument("--bases", default="SE,Per,Lin,RQ", help="comma-separated base kernels (default %(default)s; "
                                                                  "also C, WN)")
    search_p.add_argument("--beam", type=_positive_int, default=1, help="structures expanded per depth (default 1)")
    search_p.add_argument("--restarts", type=_positive_int, default=5, help="optimiser restarts per structure (default 5)")
    search_p.add_argument("--steps", type=_positive_int, default=60, help="L-BFGS iterations per restart (default 60)")
    search_p.add_argument("--changes", action=argparse.BooleanOptionalAction, default=True,
                          help="include the change-point and change-window productions (default: on)")
    search_p.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the data set and the restarts")
    search_p.add_argument("--continue-parents", action="store_true",
                          help="one more restart per expanded structure, continuing its parent's fit (default: off)")
    search_p.add_argument("--backend", choices=("sequential", "ray"), default="sequential",
                          help="where the candidates of a depth are fitted: here, one after another (default), or on Ray")
    search_p.add_argument("--likelihood", choices=("gaussian", "bernoulli", "poisson"), default="gaussian",
                          help="gaussian noise (default; exact or collapsed BIC), bernoulli for labels 0/1 or poisson for "
                               "counts (BIC from the SVGP bound)")
    search_p.add_argument("--float32", action="store_true",
                          help="compute in float32 (default float64: exact marginal likelihoods need it)")
    search_p.add_argument("--out", required=True, type=Path, help="output folder: report.html, search.json, search.csv, figures/")
    search_p.add_argument("--overwrite", action="store_true", help="replace a report already in OUT (refused otherwise)")
    search_p.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


# ----------------------------------------------------------------------------- commands
#: Largest series file ``gpzoo search --data-path`` reads.
MAX_SERIES_BYTES = 256 * 2**20


def _read_series(path: Path):
    """``(X, y, X_test, y_test)`` from a user's .npz or .csv (read without pickle; size bounded)."""
    import numpy as np  # noqa: PLC0415

    from gpzoo.analysis.datasets import read_csv_table  # noqa: PLC0415
    from gpzoo.models.errors import InvalidArgumentError  # noqa: PLC0415

    if not path.is_file():
        raise UsageError(f"--data-path: no such file {str(path)!r}")
    if path.stat().st_size > MAX_SERIES_BYTES:
        raise UsageError(f"--data-path: {str(path)!r} is larger than {MAX_SERIES_BYTES // 2**20} MiB")
    suffix = path.suffix.lower()
    try:
        if suffix == ".npz":
            with np.load(path, allow_pickle=False) as archive:
                if not {"X", "y"} <= set(archive.files):
                    raise UsageError(f"--data-path: {str(path)!r} must hold arrays X and y (it holds {sorted(archive.files)})")
                arrays = {k: np.asarray(archive[k], dtype=np.float64) for k in ("X", "y", "X_test", "y_test") if k in archive.files}
            return arrays["X"], arrays["y"], arrays.get("X_test"), arrays.get("y_test")
        if suffix == ".csv":
            _, table = read_csv_table(path, argument="--data-path")
            if table.shape[1] < 2:
                raise UsageError(f"--data-path: {str(path)!r} needs at least two columns (inputs, then y)")
            return table[:, :-1], table[:, -1], None, None
    except InvalidArgumentError as exc:
        raise UsageError(str(exc)) from None
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--data-path: cannot read {str(path)!r}: {exc}") from exc
    raise UsageError(f"--data-path: {str(path)!r}: expected a .npz or .csv file")


def _cmd_search(args, out) -> int:
    if (args.data is None) == (args.data_path is None):
        raise UsageError("give exactly one of --data NAME and --data-path FILE")
    from gpzoo.analysis.outlock import LOCK_FILES, output_lock  # noqa: PLC0415

    if args.out.exists() and any(p.name not in LOCK_FILES for p in args.out.iterdir()) and not args.overwrite:
        raise UsageError(f"--out {str(args.out)!r} already holds files; pass --overwrite to replace them")
    with output_lock(args.out, argument="--out"):
        return _cmd_search_locked(args, out)


def _cmd_search_locked(args, out) -> int:
    import jax  # noqa: PLC0415

    jax.config.update("jax_enable_x64", not args.float32)
    from gpzoo.analysis import datasets  # noqa: PLC0415
    from gpzoo.analysis.search import search, verdict, write_report  # noqa: PLC0415

    from gpzoo.models.likelihoods import Bernoulli, Poisson  # noqa: PLC0415

    likelihood = {"gaussian": None, "bernoulli": Bernoulli(), "poisson": Poisson()}[args.likelihood]
    task = {"gaussian": "regression", "bernoulli": "binary", "poisson": "count"}[args.likelihood]
    if args.data is not None:
        data = datasets.load(args.data, seed=args.seed)
        if data.task != task:
            raise UsageError(f"--data {args.data!r} is a {data.task} data set; --likelihood {args.likelihood} searches "
                             f"{task} data")
        X, y, X_test, y_test, title = data.X_train, data.y_train, data.X_test, data.y_test, f"Kernel search: {args.data}"
    else:
        X, y, X_test, y_test = _read_series(args.data_path)
        title = f"Kernel search: {args.data_path.name}"
    bases = [b.strip() for b in args.bases.split(",") if b.strip()]
    result = search(X, y, depth=args.depth, bases=bases, beam=args.beam, restarts=args.restarts, steps=args.steps,
                    changes=args.changes, seed=args.seed, backend=args.backend, progress=not args.quiet,
                    continue_parents=args.continue_parents, likelihood=likelihood)
    path = write_report(result, args.out, X_test=X_test, y_test=y_test, title=title)
    print(verdict(result), file=out)
    print(f"report: {path}", file=out)
    return 0

def _cmd_list(args, out) -> int:
    from gpzoo.analysis import datasets  # noqa: PLC0415 - deferred: keeps `gpzoo --help` fast
    from gpzoo.models import zoo  # noqa: PLC0415

    for title, items in (("Models", zoo.describe()), ("Datasets", datasets.describe())):
        print(f"{title}:", file=out)
        width = max(len(n) for n in items)
        for name, text in items.items():
            print(f"  {name:<{width}}  {text}", file=out)
            if args.options and title == "Models":
                _print_options([o for o in zoo.options(name) if o.kind == "model" or _model_default(o)], out)
    if args.options:
        print("Options of every model (defaults above where a model has its own; --num-inducing sets num_inducing "
              "for every model, dataset facts come from --data):", file=out)
        shared = [o for o in zoo.options(zoo.names()[0]) if o.kind == "common" and o.name not in _OWN_FLAGS]
        _print_options([dataclasses.replace(o, default=getattr(zoo.Common(), o.name)) for o in shared], out)
    return 0


#: Common options the CLI sets with a flag of its own (--likelihood), not with --option.
_OWN_FLAGS = ("likelihood",)


def _model_default(option) -> bool:
    """A Common option whose default this model sets (e.g. num_inducing=32)."""
    from gpzoo.models import zoo  # noqa: PLC0415

    return (option.kind == "common" and option.name != "num_inducing"  # the CLI always gives --num-inducing
            and option.default != getattr(zoo.Common(), option.name))


def _print_options(options, out) -> None:
    for option in options:
        print(f"      {option.name}: {option.type_name} = {option.default!r}  {option.help}", file=out)


def _unknown_name(kind: str, name: str, valid) -> str:
    """``unknown KIND 'NAME'; did you mean ...? valid: ...`` (gpzoo.models.errors.unknown_name_message)."""
    from gpzoo.models.errors import unknown_name_message  # noqa: PLC0415

    return unknown_name_message(kind, name, valid)


def _dataset(name: str, seed: int, sizes: dict, paths: dict | None = None):
    """Dataset ``name`` generated with ``seed``, passing the ``sizes`` (num_train, num_test) its loader
    takes and the ``paths`` of a local data set."""
    from gpzoo.analysis import datasets  # noqa: PLC0415

    if name not in datasets.names():
        raise UsageError(_unknown_name("dataset", name, datasets.names()))
    options = datasets.dataset_options(name)
    chosen = {k: n for k, n in sizes.items() if k in options and n is not None}
    return datasets.load(name, seed=seed, **chosen, **(paths or {}))


def _subset(X, y, n, rng):
    """A seeded subsample of ``n`` rows (all when None or more than there are): X, y and the row indices, in order."""
    from gpzoo.analysis.comparison import subset  # noqa: PLC0415

    return subset(X, y, n, rng)


def _data_paths(name: str, texts: list[str]) -> dict[str, str]:
    """``{loader option: path}`` from ``--data-path [KEY=]PATH`` for dataset ``name``; a bare PATH
    fills the loader's only required path option."""
    from gpzoo.analysis import datasets  # noqa: PLC0415

    if not texts:
        return {}
    if name not in datasets.names():
        raise UsageError(_unknown_name("dataset", name, datasets.names()))
    options = datasets.dataset_options(name)
    path_options = [k for k in options if k.endswith("path")]
    if not path_options:
        raise UsageError(f"--data-path: dataset {name!r} is generated or embedded and reads no files")
    required = [k for k in path_options if options[k] is datasets.REQUIRED]
    chosen: dict[str, str] = {}
    for text in texts:
        key, sep, value = text.partition("=")
        if not sep:
            if len(required) != 1:
                raise UsageError(f"--data-path {text!r}: dataset {name!r} reads several files; give each as KEY=PATH "
                                 f"with KEY one of {', '.join(path_options)}")
            key, value = required[0], text
        if key not in path_options:
            raise UsageError(f"--data-path {text!r}: dataset {name!r} has no file option {key!r}; options: {', '.join(path_options)}")
        if key in chosen:
            raise UsageError(f"--data-path: {key} is given twice")
        if not Path(value).exists():
            raise UsageError(f"--data-path {text!r}: no such file {value!r}")
        chosen[key] = value
    return chosen


def _check_data_paths(name: str, paths: dict[str, str]) -> None:
    """A local data set without its files is a usage error naming the missing ``--data-path``."""
    from gpzoo.analysis import datasets  # noqa: PLC0415

    if name not in datasets.names():
        raise UsageError(_unknown_name("dataset", name, datasets.names()))
    missing = [k for k, v in datasets.dataset_options(name).items() if v is datasets.REQUIRED and k not in paths]
    if len(missing) == 1:
        raise UsageError(f"dataset {name!r} reads a local file: pass --data-path PATH (its option {missing[0]})")
    if missing:
        raise UsageError(f"dataset {name!r} reads local files: pass " + " ".join(f"--data-path {k}=PATH" for k in missing))


def _load_data(args):
    """The dataset, with train/test subsampled to --num-train/--num-test (loader options when it has them)."""
    paths = _data_paths(args.data, args.data_paths)
    _check_data_paths(args.data, paths)
    import numpy as np  # noqa: PLC0415 - deferred, as every heavy import here: `gpzoo --help` stays light

    ds = _dataset(args.data, args.seed, {"num_train": args.num_train, "num_test": args.num_test}, paths)
    rng = np.random.default_rng(args.seed)
    X_train, y_train, _ = _subset(ds.X_train, ds.y_train, args.num_train, rng)
    X_test, y_test, _ = _subset(ds.X_test, ds.y_test, args.num_test, rng)
    return ds, X_train, y_train, X_test, y_test


def _likelihood(name: str | None, ds):
    """The ``--likelihood`` for dataset ``ds`` (None: each model's default for the task)."""
    from gpzoo.models import zoo  # noqa: PLC0415
    from gpzoo.models.errors import InvalidArgumentError  # noqa: PLC0415

    if name is None:
        return None
    try:
        return zoo.likelihood_from_name(name, ds.task, ds.num_classes)
    except InvalidArgumentError as exc:
        raise UsageError(f"--likelihood: {exc}") from None


def _model_options(texts: list[str], model_names: list[str]) -> dict[str, dict[str, object]]:
    """``{model: {key: value}}`` from ``--option MODEL.KEY=VALUE`` texts, each value parsed to the
    type the model's builder declares (``zoo.parse_option``); a usage error names the bad option."""
    from gpzoo.models import zoo  # noqa: PLC0415
    from gpzoo.models.errors import InvalidArgumentError  # noqa: PLC0415

    chosen: dict[str, dict[str, object]] = {name: {} for name in model_names}
    for text in texts:
        target, sep, value = text.partition("=")
        model, dot, key = target.rpartition(".")
        if not (sep and dot and model and key):
            raise UsageError(f"--option {text!r}: expected MODEL.KEY=VALUE, e.g. conv.patch_shape=5x5")
        if model not in chosen:
            raise UsageError(f"--option {text}: model {model!r} is not among the models fitted ({', '.join(model_names)})")
        if key in zoo.DATASET_FACTS or key in _OWN_FLAGS:
            raise UsageError(f"--option {text}: {key} is set by --{'data' if key in zoo.DATASET_FACTS else key}")
        settable = [o.name for o in zoo.options(model) if o.kind != "dataset" and o.name not in _OWN_FLAGS]
        if key not in settable:
            raise UsageError(f"--option {text}: model {model!r} takes no option {key!r}; options: {', '.join(settable)}")
        try:
            parsed = zoo.parse_option(model, key, value)
        except InvalidArgumentError as exc:
            raise UsageError(f"--option {text}: {exc}") from None
        if key in chosen[model]:
            raise UsageError(f"--option {text}: {model}.{key} is given twice")
        chosen[model][key] = parsed
    return chosen


def _build_spec(name: str, ds, num_inducing: int, likelihood=None, options=None):
    """zoo.get(name, ...) with the dataset's facts (input_dim, task, num_classes, image_shape),
    num_inducing, the likelihood when one is given and the model's ``--option`` values."""
    from gpzoo.models import zoo  # noqa: PLC0415
    from gpzoo.models.errors import InvalidArgumentError  # noqa: PLC0415

    if name not in zoo.names():
        raise UsageError(_unknown_name("model", name, zoo.names()))
    options = options or {}
    given = {"input_dim": ds.num_features, "task": ds.task, "num_classes": ds.num_classes,
             "image_shape": ds.image_shape, "num_inducing": num_inducing}
    if likelihood is not None:
        given["likelihood"] = likelihood
    incompatible = f"model {name!r} needs image data but dataset {ds.name!r} is tabular (no image_shape)"
    try:
        spec = zoo.get(name, **(given | options))
    except InvalidArgumentError as exc:
        if ds.image_shape is None and exc.argument in ("image_shape", "patch_shape"):
            raise UsageError(incompatible) from None
        if exc.argument in options:
            raise UsageError(f"--option {name}.{exc.argument}: {exc}") from None
        raise UsageError(f"model {name!r} cannot be built for dataset {ds.name!r}: {exc}") from None
    if spec.input_kind == "image" and ds.image_shape is None:
        raise UsageError(incompatible)
    if spec.input_kind == "tabular" and ds.image_shape is not None:
        raise UsageError(f"model {name!r} is for tabular data but dataset {ds.name!r} holds images {ds.image_shape}")
    return spec


def _run_record(args, model_names: list[str], options: dict, paths: dict) -> dict:
    """Everything that determines the fits of a run (what --resume must find unchanged), as JSON."""
    return {"data": args.data, "data_paths": paths, "seed": args.seed, "seeds": _fit_seeds(args), "steps": args.steps, "batch_size": args.batch_size,
            "num_inducing": args.num_inducing, "learning_rate": args.learning_rate, "num_train": args.num_train,
            "num_test": args.num_test, "likelihood": args.likelihood, "num_draws": args.num_draws,
            "options": {name: {k: _jsonable(v) for k, v in options[name].items()} for name in model_names},
            "models": model_names} | ({"standardise": True} if getattr(args, "standardise", False) else {})


def _fit_seeds(args) -> list[int]:
    return list(args.seeds) if args.seeds else [args.seed]


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


def _prepare_output(args, run: dict) -> dict:
    """Refuse to mix runs in ``--out``: an existing report needs ``--overwrite`` (which removes the
    report's own files, nothing else) or ``--resume`` (which needs the same settings)."""
    from gpzoo.analysis.comparison import prepare_output  # noqa: PLC0415

    return prepare_output(args.out, run, resume=args.resume, overwrite=args.overwrite, flag=lambda name: f"--{name}",
                          error=lambda argument, message: UsageError(message))


class Interrupted(Exception):
    """Ctrl-C during `gpzoo fit`/`compare`: what was kept and how to continue."""


def _fit_and_report(args, model_names: list[str], out) -> int:
    from gpzoo.analysis.outlock import output_lock  # noqa: PLC0415
    from gpzoo.models import zoo  # noqa: PLC0415

    if len(set(model_names)) != len(model_names):
        raise UsageError(f"--models lists a model twice: {','.join(model_names)}")
    unknown = [name for name in model_names if name not in zoo.names()]
    if unknown:
        raise UsageError(_unknown_name("model", unknown[0], zoo.names()))
    options = _model_options(args.options, model_names)
    ds, X_train, y_train, X_test, y_test = _load_data(args)
    likelihood = _likelihood(args.likelihood, ds)
    specs = {name: _build_spec(name, ds, args.num_inducing, likelihood, options[name])  # all checked before fitting
             for name in model_names}
    with output_lock(args.out, argument="--out"):  # one writer per --out (a second run is refused, naming this one)
        return _fit_and_report_locked(args, model_names, options, ds, likelihood, specs, X_train, y_train, X_test,
                                      y_test, out)


def _fit_and_report_locked(args, model_names, options, ds, likelihood, specs, X_train, y_train, X_test, y_test,
                           out) -> int:
    from gpzoo.analysis.comparison import FitsInterrupted, fit_and_report, run_names, write_run_record  # noqa: PLC0415
    from gpzoo.analysis.report import check_writable, summary_columns  # noqa: PLC0415
    from gpzoo.models.errors import ConvergenceWarning  # noqa: PLC0415

    run = _prepare_output(args, _run_record(args, model_names, options, _data_paths(args.data, args.data_paths)))
    check_writable(args.out)
    write_run_record(args.out, run)
    backend_options = {} if args.backend == "sequential" else {"address": args.address, "cpus_per_fit": args.cpus_per_fit}
    try:
        with warnings.catch_warnings():  # said once, below the table, for fits in this process or any other
            warnings.simplefilter("ignore", ConvergenceWarning)
            result = fit_and_report(
                dataset=ds, X_train=X_train, y_train=y_train, X_test=X_test, y_test=y_test, specs=specs,
                runs=run_names(model_names, _fit_seeds(args)), grouped=bool(args.seeds), out=args.out, resume=args.resume,
                steps=args.steps, batch_size=args.batch_size, learning_rate=args.learning_rate,
                checkpoint_every=args.checkpoint_every, num_draws=args.num_draws, data_seed=args.seed, backend=args.backend,
                backend_options=backend_options, save_models=args.save_models, progress=not args.quiet,
                standardise=getattr(args, "standardise", False),
                log=None if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True)))
    except FitsInterrupted as exc:
        raise Interrupted(f"interrupted; finished fits are saved in {exc.models_dir} ({', '.join(exc.finished) or 'none'}) "
                          "and a running one has a checkpoint: rerun the same command with --resume to continue") from None
    path = result.report_path
    _print_summary(path.parent, out, summary_columns)
    _print_unconverged(result.results, len(_fit_seeds(args)) > 1, out)
    print(f"fitted {len(result.results)} model(s) in {result.fit_seconds:.1f} s, report in {result.report_seconds:.1f} s "
          f"(CPU time {result.fit_cpu_seconds:.1f} s and {result.report_cpu_seconds:.1f} s); report: {path}", file=out)
    if args.save_models:
        print(f"saved models: {args.out / 'models'}/NAME (gpzoo predict --model ...)", file=out)
    return 0


def _print_summary(out_dir: Path, out, summary_columns) -> None:
    import pandas as pd  # noqa: PLC0415

    table = pd.read_csv(out_dir / "comparison.csv", index_col="model")
    with pd.option_context("display.width", 200, "display.max_columns", 30, "display.float_format", "{:.4g}".format):
        print(table[summary_columns(table)].to_string(), file=out)
    markdown = (out_dir / "report.md").read_text(encoding="utf-8")
    print(markdown.split("**")[1], file=out)  # the ELBO-vs-LOO verdict
    for line in markdown.splitlines():
        if line.startswith(("PSIS-LOO is unreliable", "Jitter was raised")):
            print(line, file=out)


def _print_unconverged(results: dict, with_seed: bool, out) -> None:
    """A warning line for every fit (``{(model, seed): FitResult}``) whose objective had not levelled off."""
    for (model, seed), res in results.items():
        convergence = getattr(res, "convergence", None)
        if convergence is None or convergence.converged is not False:
            continue
        name = f"{model} (seed {seed})" if with_seed else model
        print(f"warning: {name} has not converged: {convergence.describe(res.objective)} in total "
              "(raise --steps, or --steps auto)", file=out)


def _cmd_fit(args, out) -> int:
    return _fit_and_report(args, [args.model], out)


def _cmd_compare(args, out) -> int:
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    if not names:
        raise UsageError("--models: give at least one model name")
    return _fit_and_report(args, names, out)


def _cmd_report(args, out) -> int:
    from gpzoo.analysis.report import rebuild_report, summary_columns  # noqa: PLC0415

    path = rebuild_report(args.dir)
    _print_summary(path.parent, out, summary_columns)
    print(f"report: {path}", file=out)
    return 0


#: Output formats of ``gpzoo predict`` by file suffix.
PREDICTION_FORMATS = (".csv", ".nc")
#: CSV column prefix of a prediction variable with one column per class / latent / output.
_COLUMN_PREFIX = {"probs": "prob"}


def _cmd_predict(args, out) -> int:
    import numpy as np  # noqa: PLC0415

    from gpzoo.inference.fit import predict  # noqa: PLC0415
    from gpzoo.inference.io import load  # noqa: PLC0415

    suffix = args.out.suffix.lower()
    if suffix not in PREDICTION_FORMATS:
        raise UsageError(f"--out {str(args.out)!r}: the suffix picks the format, one of {', '.join(PREDICTION_FORMATS)}")
    if (args.data is None) == (args.input is None):
        raise UsageError("give exactly one of --input FILE (your own inputs) and --data NAME (a dataset's split)")
    if args.input is None and Path(args.data).suffix.lower() in INPUT_SUFFIXES:
        args.input, args.data = args.data, None  # a file given as --data, as earlier versions took it
    if args.input is not None:
        return _predict_inputs(args, out)
    split = args.split or "test"
    paths = _data_paths(args.data, args.data_paths)  # the data set's name and files are checked before the model loads
    _check_data_paths(args.data, paths)
    res = load(args.model)
    seed = res.seed if args.seed is None else args.seed
    ds = _dataset(args.data, seed, {f"num_{split}": args.num_points}, paths)
    X, y, index = _subset(getattr(ds, f"X_{split}"), getattr(ds, f"y_{split}"), args.num_points,
                          np.random.default_rng(seed))
    if X.shape[1:] != res.X_train.shape[1:]:
        raise UsageError(f"model {str(args.model)!r} takes inputs of {res.X_train.shape[1]} features but dataset "
                         f"{args.data!r} has {X.shape[1]}")
    table = _prediction_dataset(predict(res, X), index, y, attrs={
        "model": res.spec.name, "model_path": str(args.model), "dataset": args.data, "split": split, "seed": seed})
    _write_predictions(table, args.out)
    print(f"predictions of {res.spec.name} for {len(index)} {split} point(s) of {args.data}: {args.out}", file=out)
    return 0


#: Suffixes of an ``--input`` file of the user's own inputs (gpzoo.analysis.datasets.INPUT_SUFFIXES).
INPUT_SUFFIXES = (".npy", ".npz", ".csv")


def _predict_inputs(args, out) -> int:
    """``gpzoo predict --input FILE.npy|FILE.npz|FILE.csv``: predictions at the user's own inputs,
    which are read without pickle and checked against the model's (datasets.read_inputs); the
    targets are written where the file has them."""
    import numpy as np  # noqa: PLC0415

    from gpzoo.analysis.datasets import read_inputs  # noqa: PLC0415
    from gpzoo.inference.fit import predict  # noqa: PLC0415
    from gpzoo.inference.io import load  # noqa: PLC0415
    from gpzoo.models.errors import InvalidArgumentError  # noqa: PLC0415

    for flag, value in (("--data-path", args.data_paths), ("--split", args.split), ("--num-points", args.num_points),
                        ("--seed", args.seed)):
        if value not in (None, []):
            raise UsageError(f"{flag} applies to a dataset, not to a file of inputs (--input {args.input!r})")
    if Path(args.input).suffix.lower() not in INPUT_SUFFIXES:
        raise UsageError(f"--input {args.input!r}: expected a {', '.join(INPUT_SUFFIXES)} file of inputs")
    if not Path(args.input).is_file():
        raise UsageError(f"--input {args.input!r}: no such file (a file of inputs: .npy, .npz with X and optional y, "
                         "or .csv)")
    res = load(args.model)
    try:
        X, y = read_inputs(args.input, res.X_train.shape[1], res.spec.image_shape, argument="--input")
    except InvalidArgumentError as exc:
        raise UsageError(str(exc)) from None
    table = _prediction_dataset(predict(res, X), np.arange(X.shape[0]), y, attrs={
        "model": res.spec.name, "model_path": str(args.model), "inputs": args.input})
    _write_predictions(table, args.out)
    note = "" if y is not None else " (the file has no targets y: no target column)"
    print(f"predictions of {res.spec.name} for {X.shape[0]} input(s) in {args.input}{note}: {args.out}", file=out)
    return 0


def _prediction_dataset(pred, index, y, attrs):
    """The predictions as an xarray Dataset on the split's row ``index``: q(f) moments ``[N, L]``, y
    moments ``[N, K]``, class probabilities ``[N, C]`` and the predicted label where the task has classes,
    and the targets ``y`` unless they are None (inputs without labels)."""
    import numpy as np  # noqa: PLC0415
    import xarray as xr  # noqa: PLC0415

    data = {"f_mean": (("index", "latent"), pred.f_mean), "f_var": (("index", "latent"), pred.f_var),
            "y_mean": (("index", "output"), pred.y_mean), "y_var": (("index", "output"), pred.y_var)}
    if pred.probs is not None:
        data["probs"] = (("index", "class"), pred.probs)
        data["label"] = ("index", np.argmax(pred.probs, axis=1))
    if y is not None:  # the targets, where they are known
        data["y"] = ("index", np.asarray(y))
    return xr.Dataset(data, coords={"index": np.asarray(index)}, attrs=attrs)


def _write_predictions(table, path: Path) -> None:
    """``table`` as netCDF (``.nc``) or as CSV, one row per point, ``NAME_k`` columns for the k-th
    latent/output/class (just ``NAME`` when there is one); written to a temporary name, then renamed."""
    import pandas as pd  # noqa: PLC0415

    from gpzoo.analysis.report import netcdf_engine  # noqa: PLC0415

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    if path.suffix.lower() == ".nc":
        table.to_netcdf(tmp, engine=netcdf_engine())
    else:
        columns = {"index": table["index"].values}
        for name, var in table.data_vars.items():
            values = var.values.reshape(len(columns["index"]), -1)  # [N, K]
            prefix = _COLUMN_PREFIX.get(name, name)
            single = var.ndim == 1 or (values.shape[1] == 1 and name not in _COLUMN_PREFIX)
            columns |= {name: values[:, 0]} if single else {f"{prefix}_{k}": values[:, k] for k in range(values.shape[1])}
        pd.DataFrame(columns).to_csv(tmp, index=False)
    os.replace(tmp, path)


_COMMANDS = {"list": _cmd_list, "fit": _cmd_fit, "compare": _cmd_compare, "report": _cmd_report, "predict": _cmd_predict,
             "search": _cmd_search}
#: Commands that compile programs: they use the persistent compilation cache.
_COMPILING = ("fit", "compare", "report", "predict", "search")


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def main(argv=None) -> int:
    """Entry point of the ``gpzoo`` console script; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(f"gpzoo: error: {_one_line(exc)} (see gpzoo --help)", file=sys.stderr)
        return EXIT_USAGE
    import matplotlib  # noqa: PLC0415 - figures are written to files: no display needed

    matplotlib.use("Agg")
    from gpzoo.analysis.datasets import UnknownDatasetError  # noqa: PLC0415
    from gpzoo.models.errors import GPZooError  # noqa: PLC0415
    from gpzoo.models.zoo import UnknownModelError  # noqa: PLC0415

    try:
        if args.command in _COMPILING:
            from gpzoo.inference.programs import persistent_cache  # noqa: PLC0415 - JAX-heavy

            persistent_cache()  # compiled programs are kept for the next run (GPZOO_COMPILATION_CACHE=off: not)
        return _COMMANDS[args.command](args, sys.stdout)
    except (UsageError, UnknownModelError, UnknownDatasetError) as exc:
        print(f"gpzoo: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except (GPZooError, OSError) as exc:
        print(f"gpzoo: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_FAILURE
    except Interrupted as exc:
        print(f"gpzoo: {_one_line(exc)}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("gpzoo: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug: still one line, the traceback on request
        if os.environ.get("GPZOO_TRACEBACK"):
            raise
        print(f"gpzoo: error: unexpected {type(exc).__name__}: {_one_line(exc)} "
              "(set GPZOO_TRACEBACK=1 for the traceback)", file=sys.stderr)
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
