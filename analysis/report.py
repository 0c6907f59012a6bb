"""Model-comparison reports: HTML (self-contained), Markdown, CSV and PNG figures, rebuildable from disk.

Layout of a report directory::

    report.html        self-contained: every figure embedded as a base64 PNG (and linked to its file)
    report.md          the same tables and figure links in Markdown
    comparison.csv     one row per model: ELBO ranking, PSIS-LOO ranking (+ Pareto k), test metrics
    report.json        what was compared: dataset facts, model order, settings
    figures/*.png      ELBO traces, LOO comparison, calibration / PIT per model, inducing patches
    models/NAME.nc     each model's ArviZ DataTree (``dt.to_netcdf``; see analysis.datatree)
    models/NAME.json   each model's ELBO estimate (with MC standard error), fit facts and parameter table

:func:`report` fits nothing: it turns FitResults into DataTrees and metrics, saves them, then
calls :func:`rebuild_report`, which regenerates every other file from ``models/`` alone — so
``gpzoo report DIR`` reproduces the tables exactly without refitting. The one exception is the
inducing-patch figure of convolutional models, which needs the fitted kernel object: it is
written once by :func:`report` and re-embedded by :func:`rebuild_report`.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import html
import json
import math
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd
import xarray as xr
from tqdm.auto import tqdm

from gpzoo.analysis import calibration
from gpzoo.models.errors import GPZooError, InvalidArgumentError

if TYPE_CHECKING:
    from gpzoo.inference.results import ElboEstimate, FitResult

__all__ = [
    "Page", "ReportError", "check_writable", "comparison_figure", "comparison_table", "data_line", "environment",
    "fit_facts", "heldout_metrics", "hyperparameter_table", "jitter_line", "condition_line", "load_report", "netcdf_engine",
    "metric_notes", "ranking_table", "seeds_table", "settings_line", "unique_file_stems", "verdict",
    "read_datatree", "rebuild_report", "report", "summary_columns", "write_datatree",
]

REPORT_FORMAT = 1
FIGURE_DPI = 90


class ReportError(GPZooError, OSError):
    """The output directory cannot be written, or a report directory is missing or incomplete."""


# ----------------------------------------------------------------------------- files
def netcdf_engine() -> Literal["netcdf4", "h5netcdf"]:
    """``"netcdf4"`` (the netCDF C library) when netCDF4 is importable, else ``"h5netcdf"``.

    Both write the same netCDF-4/HDF5 files. The C library writes a report's DataTree (11 groups,
    22 variables) in about 0.06 s of CPU against 0.4 s for h5netcdf, whose per-variable Python
    overhead dominated; h5netcdf keeps reports working where netCDF4 is not installed.
    """
    try:
        import netCDF4  # noqa: F401, PLC0415 - availability probe only
    except ImportError:
        return "h5netcdf"
    return "netcdf4"


def write_datatree(dt: xr.DataTree, path) -> Path:
    """Save a DataTree with xarray's netCDF writer (written to a temporary name, then renamed)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    dt.to_netcdf(tmp, engine=netcdf_engine())
    os.replace(tmp, path)
    return path


def read_datatree(path) -> xr.DataTree:
    """Load a saved DataTree fully into memory (the file is closed afterwards)."""
    return xr.load_datatree(path, engine=netcdf_engine())


def _prepare_dir(out_dir) -> Path:
    """Create ``out_dir`` (and figures/, models/) and prove it writable, or raise ReportError."""
    out = Path(out_dir)
    for sub in ("", "figures", "models"):  # a link would send the report's files elsewhere
        if (out / sub).is_symlink():
            raise ReportError(f"out_dir: {str(out / sub)!r} is a symbolic link; gpzoo does not write through links")
    try:
        for sub in ("", "figures", "models"):
            (out / sub).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise ReportError(f"out_dir: cannot write to {str(out)!r} ({exc.strerror or exc})") from None
    return out


def check_writable(out_dir) -> Path:
    """Fail fast (before any fitting) when ``out_dir`` cannot be created or written."""
    return _prepare_dir(out_dir)


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in JSON")


def _write_json(path: Path, data) -> None:
    _write_text(path, json.dumps(data, indent=2, default=_json_default, allow_nan=True) + "\n")


def _file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]", "_", name)


def _save_figure(fig, path: Path, *, tight: bool = True) -> Path:
    """PNG of a matplotlib Figure; figures pyplot created (ArviZ's) are closed afterwards.

    ``tight=False`` keeps the figure's own extent (for figures laid out on a fixed grid: trimming
    draws the figure twice).
    """
    fig.savefig(path, dpi=FIGURE_DPI, bbox_inches="tight" if tight else None, metadata={"Software": None})
    if getattr(fig, "number", None) is not None:
        import matplotlib.pyplot as plt  # noqa: PLC0415 - only to release figures ArviZ made with pyplot

        plt.close(fig)
    return path


# ----------------------------------------------------------------------------- report
def _as_estimate(entry: Mapping) -> ElboEstimate:
    """An :func:`~gpzoo.analysis.compare.elbo_entry` dict as the ``ElboEstimate`` it was made from (draws not kept)."""
    from gpzoo.inference.results import ElboEstimate  # noqa: PLC0415 - keeps this module's import light

    return ElboEstimate(elbo=float(entry["elbo"]), stderr=float(entry["elbo_se"]), expected_log_lik=float(entry["expected_log_lik"]),
                        kl=float(entry["kl"]), num_samples=int(entry["num_samples"]), draws=np.empty(0))


def report(results: Mapping[str, FitResult], out_dir, *, X_test, y_test, dataset=None, num_draws: int = 200,
           num_elbo_samples: int = 32, seed: int = 0, progress: bool = False, groups: Mapping[str, str] | None = None) -> Path:
    """Write the full report of ``results`` (fitted on the same training data) to ``out_dir``.

    ``X_test``/``y_test`` are the held-out points; ``dataset`` (an ``analysis.datasets.Dataset``,
    optional) adds its name, description and full split sizes. ``progress`` shows a progress bar
    over the models (on stderr). ``groups`` maps each entry of ``results`` to a model name when
    entries are the same model fitted with different seeds (``FitResult.seed``): the report then
    also summarises every model over its seeds (mean ± s.d.) and its verdict uses the seed spread.
    Its programs are compiled once per model structure (:mod:`gpzoo.inference.programs`): a second
    report of a model of the same structure compiles nothing. A model with fixed or point-estimated
    hyperparameters and an analytic data term runs one program per chunk of rows for its posterior
    draws, pointwise log-likelihoods, test-set predictive and exact ELBO
    (:func:`gpzoo.analysis.datatree.datatree_and_elbo`); any other model's ELBO is estimated from
    ``num_elbo_samples`` Monte Carlo samples (``evaluate_elbo``). Returns the path of ``report.html``.
    """
    from gpzoo.analysis.compare import (  # noqa: PLC0415 - JAX-heavy
        check_common_training_data, elbo_entry, elbo_estimates, loo_approximate)
    from gpzoo.analysis.datatree import datatree_and_elbo  # noqa: PLC0415
    from gpzoo.inference.posterior import summaries_supported  # noqa: PLC0415

    if not isinstance(results, Mapping) or not results:
        raise InvalidArgumentError("results", "expected a non-empty dict {name: FitResult}")
    if groups is not None and (not isinstance(groups, Mapping) or set(groups) != set(results)):
        raise InvalidArgumentError("groups", "expected a dict {result name: model name} with an entry for every result")
    check_common_training_data(results)
    out = _prepare_dir(out_dir)
    files = unique_file_stems(list(results))
    static_figures, trees, loos = {}, {}, {}
    # models whose ELBO comes out of the DataTree's own pass over the training data (exact, one
    # program per chunk); the others' ELBO is estimated separately (Monte Carlo, sampled hyperparameters)
    separate = {name: res for name, res in results.items() if not summaries_supported(res)}
    with tqdm(total=len(results) + 1, desc="report", unit="model", disable=not progress, leave=False) as bar:
        facts = {}
        for name, res in results.items():
            facts[name] = {"parameters": res.summary().reset_index().to_dict(orient="records")}
            patches = _inducing_patches_figure(res)
            if patches is not None:
                path = _save_figure(patches, out / "figures" / f"patches_{files[name]}.png", tight=False)
                static_figures[name] = [path.name]
        bar.set_postfix_str("ELBO estimates")
        estimates = elbo_estimates(separate, num_samples=num_elbo_samples, seed=seed) if separate else {}
        bar.update()
        for name, res in results.items():
            bar.set_postfix_str(name)
            stem = files[name]
            dt, elbo = datatree_and_elbo(res, X_test, y_test, num_draws=num_draws, seed=seed)
            trees[name] = dt
            if name not in estimates:
                estimates[name] = elbo_entry(elbo, res.num_data)
            # the header quotes the full-data estimate the ranking table shows, not the last step's value
            facts[name]["header"] = res.header(_as_estimate(estimates[name]))
            write_datatree(dt, out / "models" / f"{stem}.nc")
            loos[name] = loo_approximate(dt)
            _write_json(out / "models" / f"{stem}.json", {
                "model": name,
                "spec_name": res.spec.name,
                "description": res.spec.description,
                "task": res.spec.likelihood.task,
                "elbo": estimates[name],
                "fit": fit_facts(res),
                **facts[name],
            })
            bar.update()
    first = next(iter(results.values()))
    info = {
        "format": REPORT_FORMAT,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dataset": _dataset_facts(dataset, first, X_test),
        "models": list(results),
        "files": files,
        "static_figures": static_figures,
        "settings": {"num_draws": num_draws, "num_elbo_samples": num_elbo_samples, "seed": seed},
        "environment": environment(),
    }
    if groups is not None:
        info["groups"] = {name: str(groups[name]) for name in results}
    _write_json(out / "report.json", info)
    return _rebuild(out, trees, loos)



def unique_file_stems(names: list[str]) -> dict[str, str]:
    """``{name: file stem}``: names made file-safe, distinct names never sharing a stem (a suffix
    ``-2``, ``-3``... where two would), compared case-insensitively (for case-insensitive file systems)."""
    stems, taken = {}, set()
    for name in names:
        base = _file_stem(name) or "model"
        stem, k = base, 1
        while stem.lower() in taken:
            k += 1
            stem = f"{base}-{k}"
        taken.add(stem.lower())
        stems[name] = stem
    return stems


def fit_facts(res: FitResult) -> dict:
    """The run settings and outcome of one fit as report.json stores them."""
    history = np.asarray(res.step_size_history, np.float64)
    return {"steps": int(len(res.objective_history)), "batch_size": res.batch_size, "seed": res.seed,
            "learning_rate": float(history[0]) if history.size else math.nan, "step_size_name": res.step_size,
            "seconds": float(res.diagnostics.get("seconds", math.nan)),
            "final_minibatch_elbo": res.final_objective,
            "converged": getattr(res, "converged", None),
            "num_inducing": res.spec.num_inducing,
            "jitter_events": res.diagnostics.get("jitter_events", []),
            **({"gram_condition": res.diagnostics["gram_condition"]} if "gram_condition" in res.diagnostics else {})}


def environment() -> dict:
    """Versions of gpzoo, Python, JAX, NumPyro and ArviZ, and the device the fits ran on."""
    import platform  # noqa: PLC0415
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    import jax  # noqa: PLC0415

    def installed(package):
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    device = jax.devices()[0]
    kind = getattr(device, "device_kind", "") or device.platform
    if device.platform == "cpu":
        kind = f"{_cpu_model() or platform.machine()}, {os.cpu_count()} cores"
    return {"gpzoo": installed("gpzoo"), "python": platform.python_version(), "jax": installed("jax"),
            "numpyro": installed("numpyro"), "arviz": installed("arviz"), "device": f"{device.platform}: {kind}",
            "num_devices": jax.device_count()}


def _cpu_model() -> str:
    """The CPU's model name where the OS tells it (Linux), else ""."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def _dataset_facts(dataset, res: FitResult, X_test) -> dict:
    facts = {"name": getattr(dataset, "name", "") or "", "description": getattr(dataset, "description", "") or "",
             "task": res.spec.likelihood.task, "num_train": int(res.num_data), "num_test": int(np.shape(X_test)[0]),
             "num_features": int(res.X_train.shape[1])}
    if dataset is not None:
        facts["num_train_available"] = int(len(dataset.y_train))
        facts["num_test_available"] = int(len(dataset.y_test))
    shape = getattr(dataset, "image_shape", None) or res.spec.image_shape
    facts["image_shape"] = list(shape) if shape else None
    return facts


def _inducing_patches_figure(res: FitResult):
    """``analysis.figures.inducing_patches_figure(res)`` for models with inducing patches, if that exists."""
    kinds = res.spec.inducing if isinstance(res.spec.inducing, tuple) else (res.spec.inducing,)
    if not any("patch" in str(kind) for kind in kinds):
        return None
    try:
        from gpzoo.analysis import figures  # noqa: PLC0415 - optional module, written separately
    except ModuleNotFoundError as exc:
        if exc.name != "gpzoo.analysis.figures":
            raise
        return None
    draw = getattr(figures, "inducing_patches_figure", None)
    if draw is None:
        return None
    try:
        return draw(res)
    except (InvalidArgumentError, NotImplementedError):  # no patch figure for this variant
        return None


# ----------------------------------------------------------------------------- rebuild
def _fail(path: Path, what: str) -> ReportError:
    return ReportError(f"out_dir: {str(path)!r} is not a valid gpzoo report file: {what}")


def _require(mapping, key: str, kind, path: Path, where: str = ""):
    """``mapping[key]`` checked to be a ``kind``; a ReportError naming the key otherwise."""
    label = f"{where}{key}"
    if not isinstance(mapping, dict) or key not in mapping:
        raise _fail(path, f"missing key {label!r}")
    value = mapping[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _fail(path, f"{label!r} should be {names}, got {type(value).__name__}")
    return value


def _plain_file(directory: Path, name, path: Path, key: str) -> Path:
    """``directory / name`` for a bare file name; names with a directory part, ``..`` or an absolute
    path are refused (a report never reads outside its own folder)."""
    if not isinstance(name, str) or not name or name in (".", "..") or Path(name).name != name or "\\" in name:
        raise _fail(path, f"{key} entry {name!r} is not a plain file name inside the report directory")
    for link in (directory, directory / name):
        if link.is_symlink():  # it could point anywhere: a report reads only its own files
            raise _fail(path, f"{key}: {str(link)!r} is a symbolic link; a report reads only files inside its folder")
    return directory / name


def load_report(out_dir, *, trees: Mapping[str, xr.DataTree] | None = None) -> tuple[dict, dict[str, xr.DataTree], dict[str, dict]]:
    """(report.json, {name: DataTree}, {name: metrics}) of a report directory.

    Every entry is checked before use: missing keys and wrong types are a :class:`ReportError`
    naming the key, and file entries must be plain names inside the directory, none of them (nor its
    folder) a symbolic link. ``trees`` (the
    DataTrees of every model, as just written to ``models/``) are used instead of reading them back.
    """
    out = Path(out_dir)
    info_path = out / "report.json"
    if info_path.is_symlink():
        raise ReportError(f"out_dir: {str(info_path)!r} is a symbolic link; a report reads only files inside its folder")
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportError(f"out_dir: {str(out)!r} is not a gpzoo report directory (no report.json)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"out_dir: cannot read {str(info_path)!r} ({exc})") from None
    if not isinstance(info, dict):
        raise _fail(info_path, f"expected a JSON object, got {type(info).__name__}")
    models = _require(info, "models", list, info_path)
    files = _require(info, "files", dict, info_path)
    dataset = _require(info, "dataset", dict, info_path)
    for key, kind in (("task", str), ("num_train", int), ("num_test", int), ("num_features", int)):
        _require(dataset, key, kind, info_path, "dataset.")
    if not models:
        raise _fail(info_path, "'models' is empty")
    for name, figures in _require(info, "static_figures", dict, info_path).items() if "static_figures" in info else ():
        for file in figures if isinstance(figures, list) else [figures]:
            _plain_file(out / "figures", file, info_path, f"static_figures[{name!r}]")
    loaded, metrics = {}, {}
    for name in models:
        if not isinstance(name, str):
            raise _fail(info_path, f"model names should be strings, got {name!r}")
        stem = _require(files, name, str, info_path, "files.")
        nc = _plain_file(out / "models", f"{stem}.nc", info_path, f"files[{name!r}]")
        meta_path = _plain_file(out / "models", f"{stem}.json", info_path, f"files[{name!r}]")
        try:
            loaded[name] = read_datatree(nc) if trees is None else trees[name]
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
            raise ReportError(f"out_dir: model {name!r} is missing or unreadable in {str(out / 'models')!r} ({exc})") from None
        elbo = _require(meta, "elbo", dict, meta_path)
        for key in ("elbo", "elbo_se", "num_data"):
            _require(elbo, key, (int, float), meta_path, "elbo.")
        fit = _require(meta, "fit", dict, meta_path)
        for key in ("steps", "seconds"):
            _require(fit, key, (int, float), meta_path, "fit.")
        metrics[name] = meta
    return info, loaded, metrics


def rebuild_report(out_dir) -> Path:
    """Regenerate comparison.csv, the figures, report.md and report.html from ``out_dir/models``."""
    return _rebuild(Path(out_dir))


def _rebuild(out: Path, trees: Mapping[str, xr.DataTree] | None = None, loos: Mapping | None = None) -> Path:
    """:func:`rebuild_report`; ``trees`` are the DataTrees just written to ``out/models`` (not read back),
    ``loos`` their PSIS-LOO results (``compare.loo_approximate``) where already computed."""
    from gpzoo.analysis.compare import (  # noqa: PLC0415
        best_margin, compare_heldout, compare_loo, elbo_table, heldout_reversals, seed_reversals, seed_summary)

    info, trees, metrics = load_report(out, trees=trees)
    _prepare_dir(out)
    elbo = elbo_table({name: m["elbo"] for name, m in metrics.items()})
    loo = compare_loo(trees, loos=loos)
    heldout = compare_heldout(trees)
    test = {name: heldout_metrics(dt) for name, dt in trees.items()}
    table = comparison_table(elbo, loo, test, metrics, heldout)
    table.to_csv(out / "comparison.csv", float_format="%.10g")
    seeds, reversals = None, heldout_reversals(elbo, trees)
    groups = info.get("groups")
    run_seeds = {name: int(m["fit"].get("seed") or 0) for name, m in metrics.items()}
    if isinstance(groups, dict) and set(groups) == set(trees) and len(set(groups.values())) < len(groups):
        seeds = seed_summary(table, groups)
        seeds.to_csv(out / "seeds.csv", float_format="%.10g")
        reversals = seed_reversals(seeds, trees, groups, run_seeds)
        margin = best_margin({name: m["elbo"] for name, m in metrics.items()}, trees, groups, run_seeds)
    else:
        margin = best_margin({name: m["elbo"] for name, m in metrics.items()}, trees)
    converged = {name: m["fit"].get("converged") for name, m in metrics.items()}
    page = Page(info=info, table=table, reversals=reversals, seeds=seeds, margin=margin, converged=converged,
                loo=_loo_diagnostic(loo, elbo, {name: int(dt.attrs.get("num_train", 0)) for name, dt in trees.items()}),
                figures=_write_figures(out, info, trees, loo, heldout), parameters=_parameter_tables(metrics),
                hyperparameters=hyperparameter_table(metrics), metrics=metrics)
    _write_text(out / "report.md", _markdown(page))
    _write_text(out / "report.html", _html(page, out))
    return out / "report.html"


def _test_moments(dt: xr.DataTree) -> xr.Dataset:
    """The test-set predictive moments (group ``predictions_moments``), as the group's Dataset view."""
    group = dt["predictions_moments"]
    assert isinstance(group, xr.DataTree)  # a group, not a variable
    return group.dataset


def _class_probs(moments: xr.Dataset) -> np.ndarray:
    """Test-set class probabilities ``[T, C]``, rows renormalised: quadrature-based likelihoods
    (RobustMax) sum to one only up to their quadrature error (~1e-3), beyond calibration's tolerance."""
    probs = np.clip(moments["probs"].values, 0.0, None)  # [T, C]
    return probs / probs.sum(axis=1, keepdims=True)


def heldout_metrics(dt: xr.DataTree) -> dict[str, float]:
    """Held-out scores from a model's DataTree (``analysis.calibration`` on its test-set predictive moments)."""
    task = dt.attrs.get("task", "regression")
    moments = _test_moments(dt)
    y = dt["predictions_observed_data"]["y"].values
    scores: dict[str, float] = {}
    if "probs" in moments.data_vars:
        result = calibration.classification_metrics(_class_probs(moments), y)
        for key in ("accuracy", "nll", "ece", "brier", "nll_misclassified"):
            scores[key] = result[key]
        scores.update({k: v for k, v in result.items() if k.startswith("top") and k.endswith("_error")})  # Table 1 of
        # Dutordoir et al. 2020: top-k errors, NLL on all points and on the misclassified ones
    elif task == "regression":
        result = calibration.regression_metrics(y, moments["y_mean"].values[:, 0], moments["y_var"].values[:, 0])
        scores.update(rmse=result["rmse"], nll=result["nll"], crps=result["crps"])
        for level, value in result.get("coverage", {}).items():
            scores[f"coverage_{round(100 * float(level))}"] = value
    else:
        draws = dt["predictions"]["y"].values  # [chain, draw, T]
        scores["crps"] = float(calibration.crps_from_draws(y, draws))
        scores["rmse"] = float(np.sqrt(np.mean((moments["y_mean"].values[:, 0] - y) ** 2)))
    return {k: float(v) for k, v in scores.items()}


def comparison_table(elbo: pd.DataFrame, loo: pd.DataFrame, test: Mapping[str, Mapping], metrics: Mapping[str, Mapping],
                     heldout: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per model in ELBO order: ELBO columns, held-out elpd (``*_test``, paired ``d_elpd_test_se``),
    PSIS-LOO columns (``loo``), test metrics (``test_``), fit time and steps."""
    table = elbo.rename(columns={"rank": "rank_elbo"}).drop(columns=["num_samples"], errors="ignore")
    if heldout is not None:
        table = table.join(heldout[["rank", "elpd", "se", "elpd_diff", "dse"]].rename(columns={
            "rank": "rank_test", "elpd": "elpd_test", "se": "elpd_test_se", "elpd_diff": "d_elpd_test", "dse": "d_elpd_test_se"}))
    loo_cols = {"rank": "rank_loo", "elpd": "elpd_loo", "se": "elpd_loo_se", "p": "p_loo", "elpd_diff": "d_elpd_loo",
                "dse": "d_elpd_loo_se", "weight": "loo_weight", "pareto_k_max": "pareto_k_max", "num_bad_k": "num_bad_k",
                "good_k": "good_k"}
    if heldout is None:
        loo_cols |= {"elpd_test": "elpd_test", "elpd_test_se": "elpd_test_se"}
    table = table.join(loo[[c for c in loo_cols if c in loo.columns]].rename(columns=loo_cols))
    tests = pd.DataFrame.from_dict({k: dict(v) for k, v in test.items()}, orient="index").add_prefix("test_")
    table = table.join(tests)
    table["fit_seconds"] = [metrics[m]["fit"]["seconds"] for m in table.index]
    table["steps"] = [metrics[m]["fit"]["steps"] for m in table.index]
    table.index.name = "model"
    return table


def hyperparameter_table(metrics: Mapping[str, Mapping]) -> pd.DataFrame:
    """Long table (model, hyperparameter, role, value) of every model's kernel and likelihood
    hyperparameters: type-II estimates, medians of sampled ones, and fixed values."""
    rows = []
    for model, m in metrics.items():
        for p in m.get("parameters") or []:
            if p.get("role") in ("type-II", "sampled", "fixed"):
                rows.append({"model": model, "hyperparameter": p["name"], "role": p["role"], "value": p.get("value", "")})
    return pd.DataFrame(rows, columns=["model", "hyperparameter", "role", "value"])


# ----------------------------------------------------------------------------- figures
def _write_figures(out: Path, info: dict, trees: Mapping[str, xr.DataTree], loo: pd.DataFrame,
                   heldout: pd.DataFrame) -> list[dict]:
    """Draw and save every figure; returns [{file, title, model, section}] in report order."""
    from gpzoo.analysis.compare import elbo_traces_figure  # noqa: PLC0415 - JAX-heavy

    figures_dir = out / "figures"
    written = []

    def add(fig, stem: str, title: str, model: str | None = None, section: str = "figures"):
        path = _save_figure(fig, figures_dir / f"{stem}.png")
        written.append({"file": f"figures/{path.name}", "title": title, "model": model, "section": section})

    if len(heldout) > 1:
        add(comparison_figure(heldout, "held-out elpd (test points)"), "compare_heldout",
            "Held-out elpd relative to the best model, ± paired standard error (az.plot_compare)", section="ranking")
    add(elbo_traces_figure(trees), "elbo_traces", "ELBO per datum during optimisation", section="ranking")
    if len(loo) > 1:
        add(comparison_figure(loo, "PSIS-LOO elpd (training points)"), "compare_loo",
            "PSIS-LOO comparison (az.plot_compare); see the Pareto k diagnostics", section="loo")
    for name, dt in trees.items():
        stem = info["files"][name]
        for fig, kind, title in _model_figures(dt):
            add(fig, f"{kind}_{stem}", f"{name}: {title}", name)
        for file in info.get("static_figures", {}).get(name, []):
            if (figures_dir / file).exists():
                written.append({"file": f"figures/{file}", "title": f"{name}: inducing patches", "model": name,
                                "section": "figures"})
    return written


def comparison_figure(table: pd.DataFrame, label: str):
    """``az.plot_compare`` of an ``az.compare``-style table, sized so its text stays legible at 100 %."""
    import arviz_plots  # noqa: PLC0415 - heavy, only for figures

    height = 1.0 + 0.45 * len(table)
    collection = arviz_plots.plot_compare(table, backend="matplotlib", figure_kwargs={"figsize": (6.0, height)})
    fig = collection.get_viz("figure")
    for ax in fig.axes:
        ax.set_xlabel(f"Δ {label}", fontsize=10)
        ax.tick_params(labelsize=10)
    return fig


def _model_figures(dt: xr.DataTree):
    """(figure, kind, title) for the held-out calibration of one model, chosen by its task."""
    from gpzoo.analysis.datatree import heldout_view  # noqa: PLC0415 - JAX-heavy

    task = dt.attrs.get("task", "regression")
    moments = _test_moments(dt)
    y = dt["predictions_observed_data"]["y"].values
    heldout = heldout_view(dt)  # test-set draws and targets under ArviZ's in-sample group names
    if task == "binary":
        yield calibration.pav_calibration_figure(heldout, var_name="y"), "pava", "PAV calibration on the test set (az.plot_ppc_pava)"
    if "probs" in moments.data_vars:
        yield calibration.reliability_figure(_class_probs(moments), y), "reliability", "reliability diagram (test set)"
    elif task == "regression":
        mean, var = moments["y_mean"].values[:, 0], moments["y_var"].values[:, 0]
        yield calibration.pit_figure(y, mean, var), "pit", "PIT of the predictive on the test set"
    else:
        yield calibration.ppc_pit_figure(heldout, var_name="y"), "pit", "posterior-predictive PIT on the test set (az.plot_ppc_pit)"


# ----------------------------------------------------------------------------- page content
@dataclasses.dataclass
class Page:
    """Everything the Markdown and HTML pages show, computed once."""

    info: dict
    table: pd.DataFrame
    reversals: list
    loo: dict
    figures: list[dict]
    parameters: dict
    hyperparameters: pd.DataFrame
    metrics: Mapping[str, Mapping]
    seeds: pd.DataFrame | None = None
    margin: object = None
    converged: Mapping[str, bool | None] = dataclasses.field(default_factory=dict)

    @property
    def title(self) -> str:
        return f"gpzoo model comparison — {self.info['dataset'].get('name') or 'report'}"


#: Columns of the ranking table (CSV names); a printed summary shows the same.
_RANKING = {"elbo": "ELBO ± s.e.", "d_elbo": "ΔELBO", "d_elpd_test": "held-out Δelpd ± s.e.", "test_accuracy": "accuracy",
            "test_rmse": "RMSE", "test_nll": "NLL", "test_ece": "ECE", "test_crps": "CRPS", "fit_seconds": "fit time (s)"}


def summary_columns(table: pd.DataFrame) -> list[str]:
    """The columns of the ranking table, as ``comparison.csv`` names them (the CLI prints these)."""
    columns = ["elbo", "elbo_se", "d_elbo", "d_elpd_test", "d_elpd_test_se"]
    metrics = [c for c in ("test_accuracy", "test_rmse", "test_nll", "test_ece") if c in table.columns]
    if "test_crps" in table.columns and "test_nll" not in table.columns:
        metrics.append("test_crps")
    return [c for c in columns if c in table.columns] + metrics + ["fit_seconds"]


def ranking_table(table: pd.DataFrame) -> pd.DataFrame:
    """The first-screen table: one row per model (ELBO order), few columns, values as text."""
    rows = {}
    for name, row in table.iterrows():
        cells = {}
        for column in summary_columns(table):
            if column.endswith("_se") or column not in _RANKING:
                continue
            value = row[column]
            if column == "elbo":
                cells[_RANKING[column]] = f"{_fmt(value)} ± {_fmt(row['elbo_se'])}"
            elif column == "d_elpd_test":
                cells[_RANKING[column]] = f"{_fmt(value)} ± {_fmt(row['d_elpd_test_se'])}"
            elif column == "fit_seconds":
                cells[_RANKING[column]] = f"{value:.1f}" if np.isfinite(value) else "–"
            else:
                cells[_RANKING[column]] = _fmt(value)
        rows[name] = cells
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "model"
    return out


#: Columns of the across-seeds table: summary column stem -> heading.
_SEED_HEADINGS = {"elbo": "ELBO", "elpd_test": "held-out elpd", "test_accuracy": "accuracy", "test_rmse": "RMSE",
                  "test_nll": "NLL", "test_ece": "ECE", "test_crps": "CRPS", "fit_seconds": "fit time (s)"}


def seeds_table(seeds: pd.DataFrame) -> pd.DataFrame:
    """The across-seeds table: one row per model (mean-ELBO order), each metric as mean ± s.d. over seeds."""
    rows = {}
    for name, row in seeds.iterrows():
        cells = {"seeds": str(int(row["num_seeds"]))}
        for stem, heading in _SEED_HEADINGS.items():
            if f"{stem}_mean" in seeds.columns:
                cells[f"{heading} (mean ± s.d.)"] = f"{_fmt(row[f'{stem}_mean'])} ± {_fmt(row[f'{stem}_sd'])}"
        rows[name] = cells
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "model"
    return out


def _fmt(value) -> str:
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return "–"
        if value == 0:
            return "0"
        return f"{value:.4g}" if abs(float(value)) < 1e5 else f"{value:.4e}"
    return str(value)


#: How a reader measures the seed spread when a report has one seed per model.
SEEDS_HINT = "measure it with --seeds 0,1,2, or seeds=[0, 1, 2] in gpzoo.compare"


def _convergence_clause(converged: Mapping[str, bool | None]) -> str:
    """Which runs did not converge (``False``) and which are unknown (``None``: not recorded)."""
    failed = [name for name, c in converged.items() if c is False]
    unknown = [name for name, c in converged.items() if c is None]
    if not converged or len(unknown) == len(converged):
        return "convergence was not recorded"
    parts = []
    if failed:
        parts.append("not converged: " + ", ".join(failed))
    if unknown:
        parts.append("convergence unknown for " + ", ".join(unknown))
    return "; ".join(parts) if parts else "every model converged"


def _margin_sentence(margin, converged: Mapping[str, bool | None]) -> str:
    """The verdict's first sentence: the best model, its margin over the next and how sure that is."""
    one_seed = margin.num_seeds < 2
    seeds = f"the seed spread is unknown with one seed per model: {SEEDS_HINT}" if one_seed else ""
    if margin.runner_up is None:
        head = (f"{margin.best} is the only model (held-out elpd {_fmt(margin.best_elpd)} ± "
                f"{_fmt(margin.best_elpd_se)})")
        return "; ".join(part for part in (head, seeds, _convergence_clause(converged)) if part) + "."
    lead = (f"Best: {margin.best}, ahead of {margin.runner_up} by held-out Δelpd {_fmt(margin.d_elpd)} ± "
            f"{_fmt(margin.d_elpd_se)} (paired s.e.)")
    if one_seed:
        lead += f" and ΔELBO {_fmt(margin.d_elbo)} ± {_fmt(margin.d_elbo_se)}"
    else:
        lead += (f", mean of {margin.num_seeds} seeds (s.d. {_fmt(margin.seed_sd)} over seeds, ahead at {margin.wins} of "
                 f"{margin.num_seeds}), and ΔELBO {_fmt(margin.d_elbo)} ± {_fmt(margin.d_elbo_se)} (s.d. "
                 f"{_fmt(margin.elbo_seed_sd)} over seeds)")
    if margin.d_elbo < 0:
        lead += f" (the ELBO prefers {margin.runner_up})"
    test, spread = margin.beyond_test_error, margin.beyond_seed_spread
    if spread is None:
        judgement = ("larger than the test-point error" if test else
                     "within the test-point error, so the test set cannot tell them apart") + "; " + seeds
    elif test and spread:
        judgement = "larger than both the test-point error and the seed spread"
    elif test:
        judgement = "larger than the test-point error but within the seed spread, so other seeds could reverse it"
    elif spread:
        judgement = "within the test-point error (though beyond the seed spread), so the test set cannot tell them apart"
    else:
        judgement = "within both the test-point error and the seed spread, so they cannot be told apart"
    return f"{lead}: {judgement}; {_convergence_clause(converged)}."


def _ranking_sentence(reversals) -> tuple[str, list[str], str]:
    """(sentence, one sentence per reversal, kind ``agree``/``noise``/``disagree``) of the ELBO-vs-held-out check."""
    if not reversals:
        return "The ELBO and the held-out elpd rank the models in the same order.", [], "agree"
    significant = [r for r in reversals if r.significant]
    if "seeds" in reversals[0].criterion:
        if not significant:
            return ("The mean ELBO and the mean held-out elpd over seeds order some models differently, each time "
                    "within two standard errors (seed spread and test points): those models cannot be told apart.",
                    [r.sentence() for r in reversals], "noise")
        return ("The mean ELBO and the mean held-out elpd over seeds disagree: the held-out data prefer a model the "
                "ELBO ranks lower by more than two standard errors (seed spread and test points).",
                [r.sentence() for r in significant], "disagree")
    if not significant:
        return ("The ELBO and the held-out elpd order some models differently, each time within two paired standard "
                "errors: the test set cannot tell those models apart.", [r.sentence() for r in reversals], "noise")
    return ("The ELBO and the held-out elpd disagree on the ranking: the held-out data prefer a model the ELBO ranks "
            "lower by more than two paired standard errors.", [r.sentence() for r in significant], "disagree")


def verdict(margin, reversals=(), converged: Mapping[str, bool | None] | None = None) -> tuple[str, list[str], str]:
    """(headline, one sentence per ELBO-vs-held-out reversal, kind) answering "which model, and how sure?".

    ``margin``: :class:`~gpzoo.analysis.compare.Margin` of the best model by held-out elpd;
    ``reversals``: :func:`~gpzoo.analysis.compare.heldout_reversals` or ``seed_reversals``;
    ``converged``: ``{run: FitResult.converged}`` (None: not recorded). The headline's first sentence
    names the best model, its margin over the next (held-out Δelpd ± paired s.e., ΔELBO, and the
    spread over seeds when there are several), whether that margin is larger than the test-point error
    (2 paired s.e.) and than the seed spread (2 s.d./√n over seeds), and which runs did not converge;
    its second says whether the ELBO and the held-out elpd rank the models alike. ``kind``:
    ``unconverged`` (a run did not converge), ``disagree`` (a reversal beyond two s.e.), ``noise``
    (the margin or a reversal is within the noise) or ``clear``.
    """
    converged = dict(converged or {})
    ranking, items, ranking_kind = _ranking_sentence(list(reversals))
    headline = f"{_margin_sentence(margin, converged)} {ranking}"
    within = margin.runner_up is not None and not (margin.beyond_test_error and margin.beyond_seed_spread is not False)
    if any(c is False for c in converged.values()):
        kind = "unconverged"
    elif ranking_kind == "disagree":
        kind = "disagree"
    elif within or ranking_kind == "noise":
        kind = "noise"
    else:
        kind = "clear"
    return headline, items, kind


def _loo_diagnostic(loo: pd.DataFrame, elbo: pd.DataFrame, num_train: Mapping[str, int]) -> dict:
    """PSIS-LOO as a diagnostic: a table, which models it is reliable for, and a ranking claim only
    where every model's Pareto k is below ArviZ's threshold."""
    from gpzoo.analysis.compare import ranking_disagreements  # noqa: PLC0415

    flagged = [f"{name} ({int(row['num_bad_k'])} of {num_train.get(name) or '?'} points with k > {row['good_k']:.2f})"
               for name, row in loo.sort_values("rank").iterrows() if row["num_bad_k"] > 0]
    shown = pd.DataFrame({
        "elpd_loo ± s.e.": [f"{_fmt(r['elpd'])} ± {_fmt(r['se'])}" for _, r in loo.iterrows()],
        "p_loo": [_fmt(r["p"]) for _, r in loo.iterrows()],
        "max Pareto k": [_fmt(r["pareto_k_max"]) for _, r in loo.iterrows()],
        "points with k > good_k": [str(int(r["num_bad_k"])) for _, r in loo.iterrows()],
    }, index=loo.index)
    if flagged:
        sentence = ("PSIS-LOO is unreliable for " + ", ".join(flagged) + ", so it claims no ranking; "
                    "the held-out elpd above is the predictive check.")
    elif len(loo) > 1:
        disagreements = ranking_disagreements(elbo, loo)
        sentence = ("Pareto k is below the threshold for every point of every model. "
                    + ("PSIS-LOO ranks the models as the ELBO does." if not disagreements
                       else "PSIS-LOO orders models differently from the ELBO: " + "; ".join(disagreements) + "."))
    else:
        sentence = "Pareto k is below the threshold for every point."
    return {"table": shown, "sentence": sentence, "reliable": not flagged}


def _parameter_tables(metrics: Mapping[str, Mapping]) -> dict[str, tuple[str, pd.DataFrame]]:
    """{model: (header line, FitResult.summary() table)} saved by :func:`report` (absent in older reports)."""
    tables = {}
    for name, m in metrics.items():
        if m.get("parameters"):
            df = pd.DataFrame.from_records(m["parameters"]).set_index("name")
            df["shape"] = [str(tuple(s)) for s in df["shape"]]
            tables[name] = (m.get("header", name), df)
    return tables


def _common(values) -> str:
    """One value shared by every model, or "per model"."""
    distinct = {(_fmt(v) if isinstance(v, float) else str(v)) for v in values}
    return distinct.pop() if len(distinct) == 1 else "per model"


def data_line(info: dict) -> str:
    """The data actually used: name, task, training/test points (of how many available), inputs."""
    d = info["dataset"]
    name = d.get("name") or "(unnamed data)"
    task = {"binary": "binary classification", "multiclass": "multi-class classification"}.get(d["task"], d["task"])

    def used(key):
        available = d.get(f"{key}_available")
        count = f"{d[key]:,}"
        return f"{count} of {available:,}" if available and available != d[key] else count

    shape = f" ({'×'.join(str(n) for n in d['image_shape'])} images)" if d.get("image_shape") else ""
    return (f"{name}, {task}: {used('num_train')} training and {used('num_test')} test points, "
            f"{d['num_features']:,} input features{shape}.")


def settings_line(info: dict, metrics: Mapping[str, Mapping]) -> str:
    """Optimisation and report settings, stated once when every model shares them."""
    fits = [m["fit"] for m in metrics.values()]
    s = info.get("settings", {})
    parts = [f"{_common(f['steps'] for f in fits)} steps",
             f"batch size {_common(f.get('batch_size') for f in fits)}",
             f"learning rate {_common(f.get('learning_rate', math.nan) for f in fits)}",
             f"M = {_common(f.get('num_inducing') for f in fits)} inducing variables",
             _seeds_text(sorted({f.get("seed") for f in fits if f.get("seed") is not None}))]
    if s:
        parts.append(f"{s.get('num_draws', '?')} posterior draws per model, ELBO from {s.get('num_elbo_samples', '?')} "
                     "Monte Carlo samples where it is not analytic")
    return "Settings: " + ", ".join(parts) + "."


def _seeds_text(seeds: list) -> str:
    return f"seed {seeds[0]}" if len(seeds) == 1 else "seeds " + ", ".join(str(s) for s in seeds)


def environment_line(info: dict) -> str:
    env = info.get("environment")
    if not env:
        return f"Created {info.get('created', '')}."
    return (f"gpzoo {env.get('gpzoo')}, JAX {env.get('jax')}, NumPyro {env.get('numpyro')}, ArviZ {env.get('arviz')}, "
            f"Python {env.get('python')}; device {env.get('device')}; created {info.get('created', '')}.")


def jitter_line(metrics: Mapping[str, Mapping]) -> str:
    """A sentence naming the models whose Cholesky factorisations needed more jitter than their spec's
    during fitting (how often, and the largest), or "" when none did."""
    found = []
    for name, m in metrics.items():
        events = m.get("fit", {}).get("jitter_events") or []
        if events:
            largest = max(float(e.get("jitter", math.nan)) for e in events)
            found.append(f"{name} ({len(events)} time{'s' if len(events) > 1 else ''}, up to {largest:.0e})")
    if not found:
        return ""
    return ("Jitter was raised during fitting for " + ", ".join(found)
            + ": the kernel matrices were near-singular at those steps; the fit went on with the larger jitter.")


def condition_line(metrics: Mapping[str, Mapping]) -> str:
    """A sentence giving, for the models that learn Gram matrices (deep kernel machines), the condition
    number of every layer's G_ii at the start and the end of the fit, or "" when no model does."""
    found = []
    for name, m in metrics.items():
        cond = m.get("fit", {}).get("gram_condition") or {}
        start, end = cond.get("start") or {}, cond.get("end") or {}
        if end:
            layers = ", ".join(f"{layer} {_sci(start.get(layer))} → {_sci(value)}" for layer, value in end.items())
            found.append(f"{name}: {layers}")
    if not found:
        return ""
    return "Condition number of the learned Gram matrices G_ii (start → end of the fit): " + "; ".join(found) + "."


def _sci(value) -> str:
    return "?" if value is None or not math.isfinite(float(value)) else f"{float(value):.2e}"


_NOTES = (
    "ELBO: full-data evidence lower bound (van der Wilk et al. 2017, eq. 5) ± its Monte Carlo standard error "
    "(0 when analytic). ΔELBO and held-out Δelpd: each model's value minus the best model's (≤ 0, 0 for the best; "
    "the sign of ArviZ's az.compare), the held-out elpd summed over the test points, ± the paired standard error "
    "of that difference. A margin is larger than the test-point error when it exceeds 2 paired standard errors, "
    "and larger than the seed spread when it exceeds 2 s.d./√n of its n per-seed values."
)

#: One line per test metric of comparison.csv (``test_`` + key) the report may show.
_METRIC_NOTES = {
    "accuracy": "Accuracy: share of test points whose most probable class is the true one.",
    "rmse": "RMSE: root mean squared error of the predictive mean.",
    "nll": "NLL: mean negative log predictive density of the test points (lower is better).",
    "ece": "ECE: expected calibration error, the gap between confidence and accuracy averaged over confidence bins "
           "(0: calibrated).",
    "crps": "CRPS: continuous ranked probability score, the predictive's mean absolute error against the "
            "observation (lower is better).",
    "brier": "Brier: mean squared error of the predicted class probabilities.",
}


def metric_notes(table: pd.DataFrame) -> str:
    """One line per test metric in ``table`` (comparison.csv's columns), saying what it measures."""
    return " ".join(note for key, note in _METRIC_NOTES.items() if f"test_{key}" in table.columns)


_FIGURE_NOTES = (
    "PIT: probability integral transform, the predictive CDF at each test observation; uniform when the "
    "predictive is calibrated. PAV: pool-adjacent-violators (isotonic) calibration curve; on the diagonal when "
    "the predicted probabilities are calibrated. Reliability diagram: accuracy against confidence per bin."
)

_TYPE_II_NOTE = ("Type-II (maximum likelihood): a hyperparameter set to the value that maximises the ELBO, a bound "
                 "on the marginal likelihood, instead of being integrated over; sampled ones have a prior and a "
                 "variational posterior (median shown); fixed ones were not learned.")

_LOO_NOTES = (
    "p_loo: effective number of parameters, the in-sample log predictive density minus elpd_loo. Here the draws "
    "come from the approximate posterior q and are reweighted towards p(u | y) only in elpd_loo, so p_loo can "
    "be negative: that is not an error, and not a parameter count.",
    "good_k: ArviZ's Pareto k threshold, min(1 − 1/log10(S), 0.7) for S draws; a point with k above it has an "
    "unreliable importance-sampling estimate of its leave-one-out density.",
)


def _markdown_table(table: pd.DataFrame, index: str = "model") -> str:
    header = [index, *table.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, row in table.iterrows():
        lines.append("| " + " | ".join([str(name), *(_fmt(v) for v in row.values)]) + " |")
    return "\n".join(lines)


def _markdown(page: Page) -> str:
    headline, items, _ = verdict(page.margin, page.reversals, page.converged)
    parts = [f"# {page.title}", "", data_line(page.info), "", settings_line(page.info, page.metrics), "",
             environment_line(page.info), "", "## Ranking", "", f"**{headline}**", ""]
    parts += [f"- {item}" for item in items] + ([""] if items else [])
    if page.seeds is not None:
        parts += ["Across seeds (every column in [seeds.csv](seeds.csv)):", "", _markdown_table(seeds_table(page.seeds)), "",
                  "Every run:", ""]
    parts += [_markdown_table(ranking_table(page.table)), ""]
    jitter, condition = jitter_line(page.metrics), condition_line(page.metrics)
    parts += ([jitter, ""] if jitter else []) + ([condition, ""] if condition else []) + [_NOTES, "", metric_notes(page.table), ""]
    if not page.hyperparameters.empty:
        parts += ["## Hyperparameters", "", _TYPE_II_NOTE, "", _markdown_table(page.hyperparameters.set_index("model")), ""]
    parts += ["## Diagnostic: PSIS-LOO", "", page.loo["sentence"], "", _markdown_table(page.loo["table"]), ""]
    parts += [note for line in _LOO_NOTES for note in (line, "")]
    parts += ["## Figures", "", _FIGURE_NOTES, ""]
    for fig in page.figures:
        parts += [f"### {fig['title']}", "", f"![{fig['title']}]({fig['file']})", ""]
    parts += ["## All metrics", "", "Every column, one row per model: [comparison.csv](comparison.csv).", ""]
    if page.parameters:
        parts += ["## Parameters", ""]
        for header, df in page.parameters.values():
            parts += [f"**{header}**", "", _markdown_table(df, "name"), ""]
    return "\n".join(parts)


_CSS = """
* { box-sizing: border-box; }
body { font-family: system-ui, sans-serif; margin: 0 auto; padding: 1.2em; max-width: 1200px; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; margin: 0.2em 0 0.4em; }
h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.meta { margin: 0.15em 0; color: #444; font-size: 0.92em; }
table { border-collapse: collapse; font-size: 0.88em; max-width: 100%; margin: 0.5em 0; }
table.fixed { table-layout: fixed; width: 100%; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; overflow-wrap: anywhere; }
th:first-child, td:first-child, table.text th, table.text td { text-align: left; }
thead th { background: #f4f6f8; }
.verdict { padding: 0.6em 1em; margin: 0.6em 0; background: #eef7ee; border-left: 4px solid #3a9a3a; }
.verdict.noise { background: #eef5ff; border-left-color: #3b7dd8; }
.verdict.disagree, .verdict.unconverged { background: #fff4e5; border-left-color: #e08a00; }
.verdict ul { margin: 0.4em 0 0; }
.notes { font-size: 0.85em; color: #555; }
.jitter { padding: 0.4em 0.8em; background: #fff8e1; border-left: 4px solid #e0a800; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 460px), 1fr)); gap: 1em; align-items: start; }
figure { margin: 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #ddd; }
figcaption { font-size: 0.85em; color: #444; }
details { margin: 0.8em 0; }
summary { cursor: pointer; font-weight: 600; }
""".strip()


def _table_html(df: pd.DataFrame, *, fixed: bool = False, text: bool = False) -> str:
    """An HTML table with the index as its first column (one header row); ``fixed`` spreads it over
    the page width (long cells wrap), ``text`` left-aligns every cell."""
    classes = [c for c, on in (("fixed", fixed), ("text", text)) if on]
    if df.index.name is not None or not isinstance(df.index, pd.RangeIndex):
        df = df.reset_index(names=df.index.name or "")
    return df.to_html(escape=True, border=0, classes=classes, index=False)


def _figures_html(figures: list[dict], out: Path) -> str:
    items = []
    for fig in figures:
        data = base64.b64encode((out / fig["file"]).read_bytes()).decode("ascii")
        caption = html.escape(fig["title"])
        items.append(f'<figure><a href="{html.escape(fig["file"])}"><img src="data:image/png;base64,{data}" alt="{caption}"></a>'
                     f"<figcaption>{caption}</figcaption></figure>")
    return f'<div class="grid">{"".join(items)}</div>' if items else ""


def _seeds_html(seeds: pd.DataFrame | None) -> str:
    if seeds is None:
        return ""
    return ('<p class="notes">Across seeds (every column in <a href="seeds.csv">seeds.csv</a>):</p>\n'
            + _table_html(seeds_table(seeds)) + '\n<p class="notes">Every run:</p>\n')


def _html(page: Page, out: Path) -> str:
    headline, items, kind = verdict(page.margin, page.reversals, page.converged)
    jitter, condition = jitter_line(page.metrics), condition_line(page.metrics)
    reversal_list = "<ul>" + "".join(f"<li>{html.escape(i)}</li>" for i in items) + "</ul>" if items else ""
    by_section = {section: [f for f in page.figures if f.get("section", "figures") == section]
                  for section in ("ranking", "loo", "figures")}
    hyper = ""
    if not page.hyperparameters.empty:
        hyper = ("<h2>Hyperparameters</h2>\n<p class=\"notes\">Kernel and likelihood hyperparameters: type-II point "
                 f"estimates, medians of sampled ones, fixed values. {html.escape(_TYPE_II_NOTE)}</p>\n"
                 + _table_html(page.hyperparameters, text=True))
    full = page.table.T.map(_fmt)
    full.columns.name = None
    parameters = "".join(f"<details><summary>{html.escape(header)}</summary>\n{_table_html(df, fixed=True, text=True)}</details>\n"
                         for header, df in page.parameters.values())
    if parameters:
        parameters = ("<h2>Parameters</h2>\n<p class=\"notes\">Every hyperparameter and variational parameter "
                      "(FitResult.summary()).</p>\n" + parameters)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(page.title)}</title>
<style>
{_CSS}
</style>
</head>
<body>
<h1>{html.escape(page.title)}</h1>
<p class="meta">{html.escape(data_line(page.info))}</p>
<p class="meta">{html.escape(settings_line(page.info, page.metrics))}</p>
<p class="meta">{html.escape(environment_line(page.info))}</p>
<h2>Ranking</h2>
<div class="verdict {kind}"><strong>{html.escape(headline)}</strong>{reversal_list}</div>
{_seeds_html(page.seeds)}{_table_html(ranking_table(page.table))}
{f'<p class="jitter">{html.escape(jitter)}</p>' if jitter else ''}
{f'<p class="notes">{html.escape(condition)}</p>' if condition else ''}
<p class="notes">{html.escape(_NOTES)}</p>
<p class="notes">{html.escape(metric_notes(page.table))}</p>
{hyper}
{_figures_html(by_section["ranking"], out)}
<h2>Diagnostic: PSIS-LOO</h2>
<p>{html.escape(page.loo["sentence"])}</p>
{_table_html(page.loo["table"])}
{"".join(f'<p class="notes">{html.escape(line)}</p>' for line in _LOO_NOTES)}
{_figures_html(by_section["loo"], out)}
<h2>Calibration and inducing patches</h2>
<p class="notes">{html.escape(_FIGURE_NOTES)}</p>
{_figures_html(by_section["figures"], out)}
<h2>All metrics</h2>
<details><summary>Every column of <a href="comparison.csv">comparison.csv</a>, one column per model</summary>
{_table_html(full, fixed=True)}
</details>
{parameters}
</body>
</html>
"""
