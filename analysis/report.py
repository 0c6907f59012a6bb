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
import datetime
import html
import json
import math
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import xarray as xr

from gpzoo.analysis import calibration
from gpzoo.models.errors import GPZooError, InvalidArgumentError

if TYPE_CHECKING:
    from gpzoo.inference.results import FitResult

__all__ = [
    "ReportError", "check_writable", "comparison_table", "heldout_metrics", "load_report", "netcdf_engine",
    "read_datatree", "rebuild_report", "report", "summary_columns", "write_datatree",
]

REPORT_FORMAT = 1
FIGURE_DPI = 90


class ReportError(GPZooError, OSError):
    """The output directory cannot be written, or a report directory is missing or incomplete."""


# ----------------------------------------------------------------------------- files
def netcdf_engine() -> str:
    """``"h5netcdf"`` when its HDF5 backend (h5py) is importable, else the ``"netcdf4"`` engine.

    Both write the same netCDF-4/HDF5 files; h5netcdf is preferred, netCDF4 keeps reports working
    where h5py is not installed.
    """
    try:
        import h5py  # noqa: F401, PLC0415 - availability probe only
    except ImportError:
        return "netcdf4"
    return "h5netcdf"


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
def report(results: Mapping[str, FitResult], out_dir, *, X_test, y_test, dataset=None, num_draws: int = 200,
           num_elbo_samples: int = 32, seed: int = 0) -> Path:
    """Write the full report of ``results`` (fitted on the same training data) to ``out_dir``.

    ``X_test``/``y_test`` are the held-out points; ``dataset`` (an ``analysis.datasets.Dataset``,
    optional) only adds its name and description. Returns the path of ``report.html``.
    """
    from gpzoo.analysis.compare import elbo_estimates  # noqa: PLC0415 - JAX-heavy; keeps `import gpzoo.analysis` light
    from gpzoo.analysis.datatree import to_datatree  # noqa: PLC0415

    if not isinstance(results, Mapping) or not results:
        raise InvalidArgumentError("results", "expected a non-empty dict {name: FitResult}")
    out = _prepare_dir(out_dir)
    estimates = elbo_estimates(results, num_samples=num_elbo_samples, seed=seed)
    files, static_figures = {}, {}
    for name, res in results.items():
        stem = _file_stem(name)
        files[name] = stem
        dt = to_datatree(res, X_test, y_test, num_draws=num_draws, seed=seed)
        write_datatree(dt, out / "models" / f"{stem}.nc")
        _write_json(out / "models" / f"{stem}.json", {
            "model": name,
            "spec_name": res.spec.name,
            "description": res.spec.description,
            "task": res.spec.likelihood.task,
            "elbo": estimates[name],
            "fit": {"steps": int(len(res.objective_history)), "batch_size": res.batch_size, "seed": res.seed,
                    "seconds": float(res.diagnostics.get("seconds", math.nan)),
                    "final_minibatch_elbo": res.final_objective,
                    "num_inducing": res.spec.num_inducing,
                    "jitter_events": res.diagnostics.get("jitter_events", [])},
            "header": res.header(),
            "parameters": res.summary().reset_index().to_dict(orient="records"),
        })
        patches = _inducing_patches_figure(res)
        if patches is not None:
            path = _save_figure(patches, out / "figures" / f"patches_{stem}.png", tight=False)
            static_figures[name] = [path.name]
    first = next(iter(results.values()))
    info = {
        "format": REPORT_FORMAT,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dataset": _dataset_facts(dataset, first, X_test),
        "models": list(results),
        "files": files,
        "static_figures": static_figures,
        "settings": {"num_draws": num_draws, "num_elbo_samples": num_elbo_samples, "seed": seed},
    }
    _write_json(out / "report.json", info)
    return rebuild_report(out)


def _dataset_facts(dataset, res: FitResult, X_test) -> dict:
    facts = {"name": getattr(dataset, "name", "") or "", "description": getattr(dataset, "description", "") or "",
             "task": res.spec.likelihood.task, "num_train": int(res.num_data), "num_test": int(np.shape(X_test)[0]),
             "num_features": int(res.X_train.shape[1])}
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
def load_report(out_dir) -> tuple[dict, dict[str, xr.DataTree], dict[str, dict]]:
    """(report.json, {name: DataTree}, {name: metrics}) of a report directory."""
    out = Path(out_dir)
    try:
        info = json.loads((out / "report.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportError(f"out_dir: {str(out)!r} is not a gpzoo report directory (no report.json)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportError(f"out_dir: cannot read {str(out / 'report.json')!r} ({exc})") from None
    trees, metrics = {}, {}
    for name in info["models"]:
        stem = info["files"][name]
        try:
            trees[name] = read_datatree(out / "models" / f"{stem}.nc")
            metrics[name] = json.loads((out / "models" / f"{stem}.json").read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, ValueError) as exc:
            raise ReportError(f"out_dir: model {name!r} is missing or unreadable in {str(out / 'models')!r} ({exc})") from None
    return info, trees, metrics


def rebuild_report(out_dir) -> Path:
    """Regenerate comparison.csv, the figures, report.md and report.html from ``out_dir/models``."""
    from gpzoo.analysis.compare import compare_loo, elbo_table, ranking_disagreements  # noqa: PLC0415 - JAX-heavy

    out = Path(out_dir)
    info, trees, metrics = load_report(out)
    _prepare_dir(out)
    elbo = elbo_table({name: m["elbo"] for name, m in metrics.items()})
    loo = compare_loo(trees)
    test = {name: heldout_metrics(dt) for name, dt in trees.items()}
    disagreements = ranking_disagreements(elbo, loo)
    warnings_ = _loo_reliability(loo, {name: int(dt.attrs.get("num_train", 0)) for name, dt in trees.items()})
    table = comparison_table(elbo, loo, test, metrics)
    table.to_csv(out / "comparison.csv", float_format="%.10g")

    figures = _write_figures(out, info, trees, loo)
    parameters = _parameter_tables(metrics)
    _write_text(out / "report.md", _markdown(info, table, disagreements, warnings_, figures, parameters))
    _write_text(out / "report.html", _html(info, table, disagreements, warnings_, figures, out, parameters))
    return out / "report.html"


def _class_probs(moments: xr.DataTree) -> np.ndarray:
    """Test-set class probabilities ``[T, C]``, rows renormalised: quadrature-based likelihoods
    (RobustMax) sum to one only up to their quadrature error (~1e-3), beyond calibration's tolerance."""
    probs = np.clip(moments["probs"].values, 0.0, None)  # [T, C]
    return probs / probs.sum(axis=1, keepdims=True)


def heldout_metrics(dt: xr.DataTree) -> dict[str, float]:
    """Held-out scores from a model's DataTree (``analysis.calibration`` on its test-set predictive moments)."""
    task = dt.attrs.get("task", "regression")
    moments = dt["predictions_moments"]
    y = dt["predictions_observed_data"]["y"].values
    scores: dict[str, float] = {}
    if "probs" in moments.data_vars:
        result = calibration.classification_metrics(_class_probs(moments), y)
        for key in ("accuracy", "nll", "ece", "brier"):
            scores[key] = result[key]
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


def comparison_table(elbo: pd.DataFrame, loo: pd.DataFrame, test: Mapping[str, Mapping], metrics: Mapping[str, Mapping]) -> pd.DataFrame:
    """One row per model in ELBO order: ELBO columns, PSIS-LOO columns (``loo_`` prefix), test metrics."""
    table = elbo.rename(columns={"rank": "rank_elbo"}).drop(columns=["num_samples"], errors="ignore")
    loo_cols = {"rank": "rank_loo", "elpd": "elpd_loo", "se": "elpd_loo_se", "p": "p_loo", "elpd_diff": "d_elpd_loo",
                "dse": "d_elpd_loo_se", "weight": "loo_weight", "pareto_k_max": "pareto_k_max", "num_bad_k": "num_bad_k",
                "good_k": "good_k", "elpd_test": "elpd_test", "elpd_test_se": "elpd_test_se"}
    table = table.join(loo[list(loo_cols)].rename(columns=loo_cols))
    tests = pd.DataFrame.from_dict({k: dict(v) for k, v in test.items()}, orient="index").add_prefix("test_")
    table = table.join(tests)
    table["fit_seconds"] = [metrics[m]["fit"]["seconds"] for m in table.index]
    table["steps"] = [metrics[m]["fit"]["steps"] for m in table.index]
    table.index.name = "model"
    return table


# ----------------------------------------------------------------------------- figures
def _write_figures(out: Path, info: dict, trees: Mapping[str, xr.DataTree], loo: pd.DataFrame) -> list[dict]:
    """Draw and save every figure; returns [{file, title, model}] in report order."""
    from gpzoo.analysis.compare import elbo_traces_figure  # noqa: PLC0415 - JAX-heavy

    figures_dir = out / "figures"
    written = []

    def add(fig, stem: str, title: str, model: str | None = None):
        path = _save_figure(fig, figures_dir / f"{stem}.png")
        written.append({"file": f"figures/{path.name}", "title": title, "model": model})

    add(elbo_traces_figure(trees), "elbo_traces", "ELBO per datum during optimisation")
    if len(loo) > 1:
        import arviz_plots  # noqa: PLC0415 - heavy, only for figures

        collection = arviz_plots.plot_compare(loo, backend="matplotlib")
        add(collection.get_viz("figure"), "compare_loo", "PSIS-LOO comparison (az.plot_compare)")
    for name, dt in trees.items():
        stem = info["files"][name]
        for fig, kind, title in _model_figures(dt):
            add(fig, f"{kind}_{stem}", f"{name}: {title}", name)
        for file in info.get("static_figures", {}).get(name, []):
            if (figures_dir / file).exists():
                written.append({"file": f"figures/{file}", "title": f"{name}: inducing patches", "model": name})
    return written


def _model_figures(dt: xr.DataTree):
    """(figure, kind, title) for the held-out calibration of one model, chosen by its task."""
    from gpzoo.analysis.datatree import heldout_view  # noqa: PLC0415 - JAX-heavy

    task = dt.attrs.get("task", "regression")
    moments = dt["predictions_moments"]
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


# ----------------------------------------------------------------------------- writers
_SUMMARY_COLUMNS = ["rank_elbo", "elbo", "elbo_se", "d_elbo", "elbo_per_datum", "rank_loo", "elpd_loo", "elpd_loo_se",
                    "d_elpd_loo", "p_loo", "pareto_k_max", "num_bad_k", "elpd_test"]


def summary_columns(table: pd.DataFrame) -> list[str]:
    """The columns a printed summary shows: rankings, Pareto k, and the main test metrics."""
    tests = [c for c in ("test_accuracy", "test_nll", "test_ece", "test_rmse") if c in table.columns]
    return [c for c in _SUMMARY_COLUMNS if c in table.columns] + tests + ["fit_seconds"]


def _fmt(value) -> str:
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return "–"
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.4e}"
    return str(value)


def _markdown_table(table: pd.DataFrame) -> str:
    header = ["model", *table.columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, row in table.iterrows():
        lines.append("| " + " | ".join([str(name), *(_fmt(v) for v in row.values)]) + " |")
    return "\n".join(lines)


def _loo_reliability(loo: pd.DataFrame, num_train: Mapping[str, int]) -> str:
    """A sentence naming the models whose PSIS-LOO has points with Pareto k above ``good_k`` ("" if none)."""
    flagged = [f"{name} ({int(row['num_bad_k'])} of {num_train.get(name) or '?'} points with k > {row['good_k']:.2f})"
               for name, row in loo.sort_values("rank").iterrows() if row["num_bad_k"] > 0]
    if not flagged:
        return ""
    return ("PSIS-LOO is unreliable for " + ", ".join(flagged)
            + "; compare elpd_test (held-out log predictive density) as well.")


def _verdict(disagreements: list[str]) -> str:
    if not disagreements:
        return "ELBO and PSIS-LOO rank the models in the same order."
    return "ELBO and PSIS-LOO disagree on the ranking: " + "; ".join(disagreements) + "."


def _dataset_line(info: dict) -> str:
    d = info["dataset"]
    name = d.get("name") or "(unnamed data)"
    shape = f", images {tuple(d['image_shape'])}" if d.get("image_shape") else ""
    text = f"{name}: {d['task']}, {d['num_train']} training / {d['num_test']} test points, {d['num_features']} features{shape}"
    return text + (f". {d['description']}" if d.get("description") else "")


_NOTES = (
    "ELBO: full-data evidence lower bound (van der Wilk et al. 2017, eq. 5) ± Monte Carlo standard error (0 when analytic); "
    "d_elbo is the gap to the best model. PSIS-LOO: leave-one-out elpd of the training points from "
    "draws u ~ q(u) importance-weighted to p(u | y) (az.loo_approximate_posterior); Pareto k above good_k "
    "marks unreliable points; many high k are usual for sparse GPs, because q(u) maximises the ELBO, "
    "whose per-point terms E log p(y|f) are tighter than the target's log E p(y|f), so q is narrower than "
    "p(u | y) — then trust elpd_test, the held-out log predictive density, more. test_*: metrics of the "
    "analytic predictive on the test set."
)


def _parameter_tables(metrics: Mapping[str, Mapping]) -> dict[str, tuple[str, pd.DataFrame]]:
    """{model: (header line, FitResult.summary() table)} saved by :func:`report` (absent in older reports)."""
    tables = {}
    for name, m in metrics.items():
        if m.get("parameters"):
            df = pd.DataFrame.from_records(m["parameters"]).set_index("name")
            df["shape"] = [str(tuple(s)) for s in df["shape"]]
            tables[name] = (m.get("header", name), df)
    return tables


def _markdown(info: dict, table: pd.DataFrame, disagreements: list[str], loo_warning: str, figures: list[dict],
              parameters: Mapping[str, tuple[str, pd.DataFrame]] | None = None) -> str:
    parts = [
        f"# gpzoo model comparison — {info['dataset'].get('name') or 'report'}",
        "",
        f"Data: {_dataset_line(info)}",
        "",
        f"**{_verdict(disagreements)}**",
        "",
        *([loo_warning, ""] if loo_warning else []),
        "## Summary",
        "",
        _markdown_table(table[summary_columns(table)]),
        "",
        _NOTES,
        "",
        "Full table: [comparison.csv](comparison.csv).",
        "",
    ]
    if parameters:
        parts += ["## Parameters", ""]
        for header, df in parameters.values():
            parts += [f"**{header}**", "", _markdown_table(df), ""]
    parts += ["## Figures", ""]
    for fig in figures:
        parts += [f"### {fig['title']}", "", f"![{fig['title']}]({fig['file']})", ""]
    return "\n".join(parts)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.5em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.verdict { padding: 0.6em 1em; background: #eef5ff; border-left: 4px solid #3b7dd8; }
.verdict.disagree { background: #fff4e5; border-left-color: #e08a00; }
figure { display: inline-block; margin: 0.5em; vertical-align: top; }
figure img { max-width: 520px; border: 1px solid #ddd; }
figcaption { font-size: 0.85em; max-width: 520px; }
""".strip()


def _html(info: dict, table: pd.DataFrame, disagreements: list[str], loo_warning: str, figures: list[dict], out: Path,
          parameters: Mapping[str, tuple[str, pd.DataFrame]] | None = None) -> str:
    title = f"gpzoo model comparison — {info['dataset'].get('name') or 'report'}"
    summary = table[summary_columns(table)].map(_fmt).to_html(escape=True, border=0)
    full = table.map(_fmt).to_html(escape=True, border=0)
    verdict_class = "verdict disagree" if disagreements else "verdict"
    items = ""
    if disagreements:
        items = "<ul>" + "".join(f"<li>{html.escape(d)}</li>" for d in disagreements) + "</ul>"
    figure_html = []
    for fig in figures:
        data = base64.b64encode((out / fig["file"]).read_bytes()).decode("ascii")
        caption = html.escape(fig["title"])
        figure_html.append(
            f'<figure><a href="{html.escape(fig["file"])}"><img src="data:image/png;base64,{data}" alt="{caption}"></a>'
            f"<figcaption>{caption}</figcaption></figure>"
        )
    settings = html.escape(json.dumps(info.get("settings", {})))
    parameter_html = "".join(f"<h3>{html.escape(header)}</h3>\n{df.to_html(escape=True, border=0)}"
                             for header, df in (parameters or {}).values())
    if parameter_html:
        parameter_html = "<h2>Parameters</h2>\n<p>Every hyperparameter and variational parameter (FitResult.summary()).</p>\n" + parameter_html
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>
{_CSS}
</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p>Data: {html.escape(_dataset_line(info))}</p>
<p>Settings: {settings}; created {html.escape(info.get('created', ''))}.</p>
<div class="{verdict_class}"><strong>{html.escape(_verdict(disagreements) if not disagreements else 'ELBO and PSIS-LOO disagree on the ranking.')}</strong>{items}</div>
{f'<p>{html.escape(loo_warning)}</p>' if loo_warning else ''}
<h2>Summary</h2>
{summary}
<p>{html.escape(_NOTES)}</p>
<h2>Full comparison</h2>
<p>Also in <a href="comparison.csv">comparison.csv</a>.</p>
{full}
{parameter_html}
<h2>Figures</h2>
{''.join(figure_html)}
</body>
</html>
"""
