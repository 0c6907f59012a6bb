"""Rewrite the documentation's results page, ``docs/results.md``, from ``benchmarks/results/*.json``
(never by hand).

Each results file is rendered by the formatter registered for its stem (``@formatter("name")``,
a function ``dict -> list of Markdown lines``); a file without one gets a generic table of its
top-level numbers, so a new benchmark shows up before anyone writes its formatter. The section
between ``<!-- results:begin -->`` and ``<!-- results:end -->`` is replaced; the output depends
only on the JSON contents (dates are the ones recorded in the files), so running it twice changes
nothing.

``--check`` writes nothing and exits 1 when any of these fails (a test runs it):

* the page is up to date: rendering the results files again would not change it;
* every results file records how it was made (:data:`PROVENANCE_FIELDS`: the command, the
  settings, the device, the library versions, the date and the git commit), as
  ``benchmarks/_common.write_json`` records them under ``"provenance"`` or in the layouts older
  files used; a file of several experiments is checked experiment by experiment;
* a file whose script declares a ``STEP_DESCRIPTION`` (read from the script's source, which is
  not imported) records that same description as its ``step_description``: a file timed with a
  step its script no longer runs is stale;
* the files recorded before results carried their provenance are listed in
  :data:`RECORDED_WITHOUT_PROVENANCE` with what each lacks. Each is accepted with a warning, and
  marked on the page, while it lacks exactly what is listed; the check fails when a listed file
  lacks something else, lacks nothing (a re-run completed it: remove it from the list) or no
  longer exists. So the list may only shrink.

    .venv/bin/python benchmarks/summarise.py            # rewrite docs/results.md
    .venv/bin/python benchmarks/summarise.py --check    # CI-style check
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "results.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"

#: equal-step accuracy runs of gpflow_side_by_side.py (``--evaluate-at``), one file per Bernoulli link
EQUAL_STEPS = ("gpflow_equal_steps_logit", "gpflow_equal_steps_logit_3000", "gpflow_equal_steps_probit-exact",
               "gpflow_equal_steps_probit")
#: the order files appear in; files not listed follow alphabetically.
ORDER = ("reproduce_conv", "reproduce_invariance", "reproduce_tick", "reproduce_tick_e3_marginal", "conv_kernels", "conv_kernels_mnist10", "conv_kernels_mnist10_tick",
         "svgp_scaling", "polya_gamma_throughput",
         "invariance_toy", "gpflow_side_by_side", *EQUAL_STEPS, "pg_natgrad", "natgrad", "nuts_ess", "robustness_sweep", "shift_scale_sweep")
TITLES = {
    "reproduce_conv": "van der Wilk et al. 2017 reproduction: convolutional GPs (`benchmarks/reproduce_conv.py`)",
    "kernel_search": "Kernel structure search on the statsmodels series, extrapolating the last 20 % (`benchmarks/kernel_search.py`)",
    "gallifrey_peer": "Kernel structure search beside gallifrey's SMC structure learning, same splits (`benchmarks/gallifrey_peer.py`)",
    "reproduce_invariance": "van der Wilk et al. 2018 reproduction: learned invariances (`benchmarks/reproduce_invariance.py`)",
    "report_phase": "Report phase against fitting phase of the default `gpzoo compare` (`benchmarks/report_phase.py`)",
    "compile_once": "Compile once, fit many: repeated fits, a first fit against GPJax, the README's main job (`benchmarks/compile_once.py`)",
    "conv_kernels": "Convolutional kernel hot paths against this machine's limits (`benchmarks/conv_kernels.py`)",
    "conv_kernels_mnist10": "Convolutional kernel hot paths, MNIST-10 configuration (`benchmarks/conv_kernels.py --config mnist10`)",
    "conv_kernels_mnist10_tick": "TICK kernel hot paths, MNIST-10 configuration (`benchmarks/conv_kernels.py --config mnist10-tick`)",
    "svgp_scaling": "SVGP step time against a hand-written JAX step (`benchmarks/svgp_scaling.py`)",
    "polya_gamma_throughput": "Pólya–Gamma sampler throughput (`benchmarks/polya_gamma_throughput.py`)",
    "invariance_toy": "Invariant GP on the symmetric toy function, van der Wilk et al. 2018, fig. 2 (`benchmarks/invariance_toy.py`)",
    "gpflow_side_by_side": "gpzoo against GPflow 2.11, weighted conv SVGP (`benchmarks/gpflow_side_by_side.py`)",
    "gpflow_side_by_side_mnist10_timing": "gpzoo against GPflow 2.11, MNIST-10 timing run (`benchmarks/gpflow_side_by_side.py`)",
    "gpflow_equal_steps_logit": "gpzoo against GPflow 2.11 at equal steps, logit link (`benchmarks/gpflow_side_by_side.py --evaluate-at`)",
    "gpflow_equal_steps_logit_3000": "gpzoo against GPflow 2.11 at equal steps up to 3,000, logit link, recorded while gpzoo's q_sqrt diagonal was exp(x) (`benchmarks/gpflow_side_by_side.py --steps 3000 --evaluate-at 300,1000`)",
    "gpflow_equal_steps_probit-exact": "gpzoo against GPflow 2.11 at equal steps, exact probit link in both (`benchmarks/gpflow_side_by_side.py --link probit-exact`)",
    "gpflow_equal_steps_probit": "gpzoo against GPflow 2.11 at equal steps, GPflow's own probit Bernoulli (Φ squeezed into [0.001, 0.999]) against gpzoo's exact probit, recorded while gpzoo's q_sqrt diagonal was exp(x) (`benchmarks/gpflow_side_by_side.py --link probit`)",
    "pg_natgrad": "Pólya–Gamma CAVI / natural gradients against Adam (`benchmarks/pg_natgrad.py`)",
    "natgrad": "Natural gradients on q(u) against Adam, beside GPJax's `fit_natgrads` (`benchmarks/natgrad.py`)",
    "nuts_ess": "NUTS on svgp-rbf: effective samples per second of the slowest hyperparameter, against GPflow's SGPMC (`benchmarks/nuts_ess.py`)",
    "reproduce_tick": "Dutordoir et al. 2020 reproduction, CPU-sized: TICK and deep convolutional GPs (`benchmarks/reproduce_tick.py`)",
    "reproduce_tick_e3_marginal": "Dutordoir et al. 2020, Table 2 (E3) with the paper's per-patch sampling, 4 hidden channels, depths 1–3 at one budget (`benchmarks/reproduce_tick.py --experiment e3 --out …/reproduce_tick_e3_marginal.json`)",
    "deep_conv_step": "2-layer deep TICK GP step against a straightforward JAX step and the machine's bound (`benchmarks/deep_conv_step.py`)",
    "robustness_sweep": "Robustness sweep: every zoo model × seeds × float32/float64 at default settings (`benchmarks/robustness_sweep.py`)",
    "shift_scale_sweep": "Shifted and scaled data: zoo models × seeds × float32/float64 on pixels + 1e3 and × 1e3 against the unshifted run (`benchmarks/robustness_sweep.py --transforms none,shift,scale`)",
    "ray_speedup": "`gpzoo.compare` grid, sequential against Ray with 2 workers (`benchmarks/ray_speedup.py`)",
    "data_parallel_step": "Conv model step on 1 against 2 devices, same global batch (`benchmarks/data_parallel_step.py`)",
    "dkm_sine_toy": "Milsom et al. 2024, §4.2 / fig. 1: cond(G) of a one-layer DKM on the sine toy (`benchmarks/dkm_sine_toy.py`)",
    "reproduce_dkm": "Milsom et al. 2024, Table 3 ablations as the paper names and configures its rows, CPU-sized (`benchmarks/reproduce_dkm.py`)",
    "reproduce_dkm_mnist": "Milsom et al. 2024, Table 3 ablations on MNIST-10 (4,000 / 1,000), mean-pooled to 14×14, the paper's optimizer (`benchmarks/reproduce_dkm.py --data mnist-10 --pool 2 --width 64 --steps 1200`)",
    "reproduce_dkm_mnist_constant_lr": "The same at a constant learning rate (`benchmarks/reproduce_dkm.py --data mnist-10 --pool 2 --width 64 --steps 1200 --optimizer constant`)",
    "reproduce_dkm_mnist_gamma128": "The same, SKR only, at the paper's noise level (γ = 128, its narrowest layer's; `benchmarks/reproduce_dkm.py --data mnist-10 --pool 2 --width 64 --steps 1200 --configs full --skr-gamma 128`)",
    "scan_convolutions": "Convolution gradients inside `gpzoo.fit`'s compiled scan: autodiff's form against `conv2d` (`benchmarks/scan_convolutions.py`)",
    "dkm_step": "DKM training step against a straightforward JAX step, the machine's bound and the authors' code (`benchmarks/dkm_step.py`)",
    "deep_conv_step_h100": "2-layer deep TICK GP step on a GPU (`benchmarks/deep_conv_step.py`)",
    "data_parallel_step_h100": "Conv model step on a GPU (`benchmarks/data_parallel_step.py`)",
    "data_parallel_step_8cores": "Conv model step on 1 against 2 devices, 8 CPU cores (`benchmarks/data_parallel_step.py`)",
    "reproduce_dkm_mnist_2400": "The same for twice as many steps, one seed (`benchmarks/reproduce_dkm.py --data mnist-10 --pool 2 --width 64 --steps 2400 --configs full no_skr --seeds 0`)",
    "reproduce_dkm_mnist_2400_gamma128": "The same for twice as many steps, three seeds, SKR at γ = 128 (`benchmarks/reproduce_dkm.py --data mnist-10 --pool 2 --width 64 --steps 2400 --skr-gamma 128`)",
    "reproduce_dkm_wide": "Milsom et al. 2024, Table 3 ablations at 4× the width (`benchmarks/reproduce_dkm.py --width 64`)",
    "reproduce_dkm_wide_long": "Milsom et al. 2024, Table 3 ablations at 4× the width, 1,200 steps (`benchmarks/reproduce_dkm.py --width 64 --steps 1200`)",
    "deep_conv_step_2cores": "2-layer deep TICK GP step, quiet 2-core run (`benchmarks/deep_conv_step.py`)",
    "conv_kernels_mnist10_2cores": "Convolutional kernel hot paths, MNIST-10, quiet 2-core run (`benchmarks/conv_kernels.py --config mnist10`)",
    "ray_speedup_2cores_quiet": "`gpzoo.compare` grid, sequential against Ray, quiet 2-core run (`benchmarks/ray_speedup.py`)",
    "ray_speedup_8cores": "`gpzoo.compare` grid, sequential against Ray with 2 workers, 8 cores (`benchmarks/ray_speedup.py`)",
    "ray_speedup_8cores_1500": "`gpzoo.compare` grid of 1,500-step fits, sequential against Ray with 2 workers, 8 cores (`benchmarks/ray_speedup.py --steps 1500`)",
    "ray_speedup_2cores_1500": "`gpzoo.compare` grid of 1,500-step fits, sequential against Ray with 2 workers, this 2-core machine, with the ceiling (`benchmarks/ray_speedup.py --steps 1500 --ceiling`)",
}
#: result files that differ from another only in where or at what size they ran
ALIASES = {"reproduce_tick_e3_marginal": "reproduce_tick", "deep_conv_step_h100": "deep_conv_step", "data_parallel_step_h100": "data_parallel_step",
           "data_parallel_step_8cores": "data_parallel_step", "reproduce_dkm_wide": "reproduce_dkm",
           "reproduce_dkm_wide_long": "reproduce_dkm", "reproduce_dkm_mnist": "reproduce_dkm",
           "reproduce_dkm_mnist_constant_lr": "reproduce_dkm", "reproduce_dkm_mnist_gamma128": "reproduce_dkm",
           "reproduce_dkm_mnist_2400": "reproduce_dkm", "reproduce_dkm_mnist_2400_gamma128": "reproduce_dkm", "deep_conv_step_2cores": "deep_conv_step",
           "conv_kernels_mnist10_2cores": "conv_kernels", "conv_kernels_mnist10_tick": "conv_kernels", "ray_speedup_2cores_quiet": "ray_speedup",
           "ray_speedup_8cores": "ray_speedup", "ray_speedup_8cores_1500": "ray_speedup",
           "ray_speedup_2cores_1500": "ray_speedup"}
FORMATTERS: dict[str, Callable[[dict], list[str]]] = {}


def formatter(name: str):
    """Register ``fn(report) -> Markdown lines`` for ``benchmarks/results/<name>.json``."""
    def register(fn):
        FORMATTERS[name] = fn
        return fn

    return register


# ----------------------------------------------------------------------------- cells
def num(value, digits: int = 3) -> str:
    """A compact number: 3 significant digits, thousands as integers, '—' for missing."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.{digits - 1}e}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def pct(value) -> str:
    return "—" if value is None else f"{100 * value:.2f} %"


def yes_no(value) -> str:
    return "—" if value is None else ("**yes**" if value else "no")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def device_of(report: dict) -> str:
    machine = report.get("machine") or report.get("environment") or {}
    devices = machine.get("devices") or machine.get("device")
    if isinstance(devices, list):
        devices = ", ".join(devices)
    kind = machine.get("device_kind")
    named = f"{devices} = {kind}" if devices and kind and kind != "cpu" else devices
    cores = f", {machine['cpus_usable']} of {machine['cpu_count']} CPU cores" if machine.get("cpu_count", 2) != 2 and "cpus_usable" in machine else ""
    return f"{named or 'unrecorded'} (jax {machine.get('jax', '?')}{cores})"


def in_order(names, order) -> list[str]:
    """``names`` with those in ``order`` first, in that order, then the others alphabetically."""
    return sorted(names, key=lambda n: (order.index(n) if n in order else len(order), n))


def provenance(report: dict) -> str:
    return f"Device: {device_of(report)}; date: {report.get('date') or report.get('updated') or 'not recorded'}."


# ----------------------------------------------------------------------------- goal lines
#: classes of the classification data sets the reproductions run on
DATASET_CLASSES = {"rectangles": 2, "mnist-01": 2, "mnist-odd-even": 2, "mnist-rotated": 2, "location-bars": 2, "mnist-10": 10}


def unjudgeable(models: dict, dataset: str, n_test) -> str | None:
    """Why a goal line comparing ``models`` (records with ``test_error`` or ``top1_error``, and ``nll`` or
    ``test_nlpp``) cannot be judged: a model at chance or not finite (``_verdict.why_unjudgeable``); None if it can."""
    from _verdict import why_unjudgeable  # noqa: PLC0415

    classes = next((c for name, c in DATASET_CLASSES.items() if str(dataset).startswith(name)), None)
    if classes is None or not n_test:
        return None  # not a classification table this rule knows
    sides = {}
    for name, r in models.items():
        if r.get("timing_only"):  # a few timed steps, not part of any comparison
            continue
        error = r.get("test_error", r.get("top1_error"))
        sides[f"`{name}`"] = None if error is None else {"test_accuracy": 1.0 - float(error),
                                                        "test_nll": r.get("nll", r.get("test_nlpp"))}
    return why_unjudgeable(sides, classes, int(n_test))


def goal_line(text: str, met, models: dict, dataset: str, n_test, every=None) -> str:
    """``Goal (text): yes/no`` when every compared model is finite and above chance, else why it cannot be judged."""
    reason = unjudgeable(models, dataset, n_test)
    if reason:
        return f"Goal ({text}): cannot be judged: {reason}."
    return f"Goal ({text}): {yes_no(met)}" + (f" on the means; on every seed alone: {yes_no(every)}." if every is not None else ".")


# ----------------------------------------------------------------------------- formatters
CONV_ORDER = ("rectangles", "mnist01", "mnist10")
STEP_NOTE = "s/step is a fit's wall time over its steps, jit compilation included, on the device named."


@formatter("reproduce_conv")
def _reproduce_conv(report: dict) -> list[str]:
    lines = []
    experiments = report.get("experiments", {})
    for name in in_order(experiments, CONV_ORDER):
        exp = experiments[name]
        s = exp["settings"]
        reduced = (" **Reduced run** (fewer steps than the script's full-run default, which the paper does not state, or fewer images;"
                   " not converged).") if s.get("reduced") else ""
        lines += ["", f"**{name}** — {s['dataset']}, {s['num_train']:,} train / {s['num_test']:,} test images, "
                      f"{s['patch_shape'][0]}×{s['patch_shape'][1]} patches, Adam {s['learning_rate']}, batch {s['batch_size']}."
                      f"{reduced} {provenance(exp)}", ""]
        rows = []
        for model, r in exp["models"].items():
            paper = r.get("paper", {})
            paper_m = f" (M={paper['num_inducing']:,})" if "num_inducing" in paper else ""
            goal = r.get("goal")
            rows.append([f"`{model}`", num(r["num_inducing"]), num(r.get("steps", s["steps"])), pct(r["test_error"]),
                         pct(paper.get("error")) + paper_m,
                         num(r["test_nlpp"]), num(paper.get("nlpp")), f"{num(r['elbo'], 5)} ± {num(r['elbo_stderr'])}",
                         num(r["s_per_step"]), f"{goal['text']}: {yes_no(goal['met'])}" if goal else "—", r.get("device", "?")])
        lines += table(["model", "M", "steps", "error", "paper error", "NLPP", "paper NLPP", "ELBO ± s.e.", "s/step", "goal met",
                        "device"], rows)
        if "goal" in exp:
            lines += ["", goal_line(exp["goal"]["text"], exp["goal"]["met"], exp["models"], s["dataset"], s.get("num_test"),
                                    exp["goal"].get("met_every_seed"))]
        figures = [f"`benchmarks/results/{r['figure']}` (`{m}`)" for m, r in exp["models"].items() if r.get("figure")]
        if figures:
            lines += ["", "Learned inducing patches sorted by their inducing output (van der Wilk et al. 2017, fig. 1a): " + ", ".join(figures) + "."]
    return lines + (["", STEP_NOTE] if lines else [])


#: how an invariant binary model's Pólya–Gamma q(ω_n) = PG(1, c_n) gets c_n (records before ``pg_c``: the closed form)
PG_TILTS = {"recognition": "recognition network", "closed-form": "closed form √E[f²]", "free": "free per point", None: "—"}


def _reduced_note(settings: dict) -> str:
    return " **Reduced run** (far fewer steps than the paper's; not converged)." if settings.get("reduced") else ""


def _goal_line(goals: dict, reason: str | None) -> str:
    """The goals as one line ("Goals: a: yes; b: no."), or why they cannot be judged when ``reason`` says so."""
    return f"Goals: cannot be judged: {reason}." if reason else "Goals: " + "; ".join(f"{k}: {yes_no(v)}" for k, v in goals.items()) + "."


def _rotated_lines(exp: dict) -> list[str]:
    """§5.1: learned rotation range on rotated odd-vs-even digits, one table row per (α_true, model)."""
    s = exp["settings"]
    lines = ["", f"**rotated MNIST odd vs even** (van der Wilk et al. 2018, §5.1, fig. 3) — Adam {s['learning_rate']}, batch "
                  f"{s['batch_size']}, M={s['num_inducing']}, {s['num_orbit_samples']} orbit samples, α starts at "
                  f"{num(s['initial_alpha'])}°.{_reduced_note(s)} {provenance(exp)}", ""]
    rows = []
    for run in exp["runs"].values():
        reason = unjudgeable(run["models"], "mnist-rotated", run.get("num_test"))
        goals = f"cannot be judged: {reason}" if reason else "; ".join(f"{k}: {yes_no(v)}" for k, v in run["goals"].items())
        for model, r in run["models"].items():
            rows.append([f"{num(run['alpha_true'])}°", f"`{model}`", num(r["steps"]), num(r.get("alpha_final")) + ("°" if "alpha_final" in r else ""),
                         pct(r["test_error"]), num(r["test_nlpp"]), f"{num(r['elbo'], 5)} ± {num(r['elbo_stderr'])}",
                         num(r["s_per_step"]), goals if model == "invariant-rot" else "", r.get("device", "?"),
                         PG_TILTS[r.get("pg_c") or ("closed-form" if model.startswith("invariant") else None)]])
    lines += table(["α_true", "model", "steps", "learned α", "error", "NLPP", "ELBO ± s.e.", "s/step", "goals met", "device",
                    "PG tilt c"], rows)
    if s.get("figure"):
        lines += ["", f"Learned α over training: `benchmarks/results/{Path(s['figure']).name}`. Paper: α ≈ α_true for "
                      "90°, under-estimated for 180°; invariant beats RBF in error and ELBO."]
    return lines


def _mnist10_lines(exp: dict) -> list[str]:
    """§5.2: ten-class MNIST with the one-hot Gaussian likelihood, against the paper's errors."""
    s = exp["settings"]
    lines = ["", f"**MNIST 10-class, Gaussian likelihood** (van der Wilk et al. 2018, §5.2, fig. 4) — {s['num_train']:,} / "
                  f"{s['num_test']:,} images, {s['likelihood']}, {s['steps']:,} steps, "
                  f"M={s['num_inducing']}.{_reduced_note(s)} {provenance(exp)}", ""]
    rows = [[f"`{m}`", pct(r["test_error"]), pct(r["paper"]["error"]), num(r["test_nlpp"]),
             f"{num(r['elbo'], 5)} ± {num(r['elbo_stderr'])}", num(r["s_per_step"]), r.get("device", "?")]
            for m, r in exp["models"].items()]
    lines += table(["model", "error", "paper error", "NLPP", "ELBO ± s.e.", "s/step", "device"], rows)
    if exp.get("goals"):
        lines += ["", _goal_line(exp["goals"], unjudgeable(exp["models"], s["dataset"], s.get("num_test")))]
    return lines


def _mnist_rot_lines(exp: dict) -> list[str]:
    """§5.3: fully rotated ten-class digits, learned and fixed invariances against RBF."""
    s = exp["settings"]
    lines = ["", f"**Fully rotated MNIST, 10 classes** (van der Wilk et al. 2018, §5.3, fig. 5) — every digit rotated by a "
                  f"uniform angle over the full circle, {s['num_train']:,} / {s['num_test']:,} images, {s['likelihood']} "
                  f"({s['likelihood_note']}), {s['steps']:,} steps, M={s['num_inducing']}, {s['num_orbit_samples']} orbit samples, "
                  f"learned α starts at {num(s['initial_alpha'])}°.{_reduced_note(s)} {provenance(exp)}", ""]
    rows = [[f"`{m}`", ("learned " if r["alpha_learned"] else "fixed ") + num(r["alpha_final"]) + "°" if "alpha_final" in r else "",
             pct(r["test_error"]), num(r["test_nlpp"]), f"{num(r['elbo'], 5)} ± {num(r['elbo_stderr'])}",
             num(r.get("noise_variance")), num(r["s_per_step"]), r.get("device", "?")] for m, r in exp["models"].items()]
    lines += table(["model", "α", "error", "NLPP", "ELBO ± s.e.", "noise s²", "s/step", "device"], rows)
    lines += ["", "Paper: " + "; ".join(exp["paper"].values()) + ".", "",  # ten classes, as mnist-10
              _goal_line(exp["goals"], unjudgeable(exp["models"], "mnist-10", s.get("num_test")))]
    return lines


#: reproduce_invariance's experiments in page order, with their formatters
INVARIANCE_EXPERIMENTS = {"rotated": _rotated_lines, "mnist10": _mnist10_lines, "mnist-rot": _mnist_rot_lines}


@formatter("reproduce_invariance")
def _reproduce_invariance(report: dict) -> list[str]:
    experiments = report.get("experiments", {})
    lines = [line for name, lines_of in INVARIANCE_EXPERIMENTS.items() if name in experiments for line in lines_of(experiments[name])]
    return lines + (["", STEP_NOTE] if lines else [])


@formatter("conv_kernels")
def _conv_kernels(report: dict) -> list[str]:
    s = report["setting"]
    over = report["step_over_bound"]
    rows = [[name, num(report["timings"][name]["wall_s"]), num(over["wall_s"][name]), num(report["timings"][name]["cpu_s"]),
             num(over["cpu_s"][name])] for name in over["wall_s"]]
    load = report["machine"].get("loadavg_before"), report["machine"].get("loadavg_after")
    where = (f" Load average (1 min) {num(load[0][0])} at the start, {num(load[1][0])} at the end (2 cores)."
             if all(load) else "")
    if "kff_inner_product_flops" in report["counts"]:
        old = report["step_over_bound_exps_kuf_forward"]["cpu_s"]
        counted = ("the step's exps (Kff pairs, Kuf) and matmul flops (the Kff pairs' inner products, Kuf forward and "
                   "its dZ backward)")
        earlier = (f" Against the count of earlier runs (B·P² exps and the Kuf forward flops only) the ELBO step is at "
                   f"{num(old['elbo_step'])}× (CPU).")
    else:
        counted, earlier = "B·P² exps and the Kuf matmul flops", ""
    return ["", f"B={s['B']}, image {s['image_shape']}, patch {s['patch_shape']}, M={s['M']}, {s['dtype']}; bound = "
                f"{counted} at this machine's rates measured in the same run "
                f"({num(report['bound_s']['wall_s'])} s wall, {num(report['bound_s']['cpu_s'])} s CPU).{earlier}{where} "
                f"{provenance(report)}", ""] + \
        table(["hot path", "wall s", "× bound (wall)", "CPU s", "× bound (CPU)"], rows)


@formatter("svgp_scaling")
def _svgp_scaling(report: dict) -> list[str]:
    rows = [[num(r["N"]), num(r["M"]), num(r["D"]), r["dtype"], num(r["gpzoo_step_s"]), num(r["reference_step_s"]), num(r["ratio"])]
            for r in report["results"]]
    return ["", f"Ratio threshold {num(report['threshold_ratio'])}; all below: {yes_no(report['all_below_threshold'])}. "
                f"{provenance(report)}", ""] + table(["N", "M", "D", "dtype", "gpzoo s/step", "reference s/step", "ratio"], rows)


@formatter("report_phase")
def _report_phase(report: dict) -> list[str]:
    runs = report["runs"]
    with_cpu = all("cpu_ratio" in r for r in runs)
    rows = [[str(i + 1), num(r["fit_s"]), num(r["report_s"]), num(r["ratio"])]
            + ([num(r["fit_cpu_s"]), num(r["report_cpu_s"]), num(r["cpu_ratio"])] if with_cpu else [])
            + [num(r["load_average"][0])] for i, r in enumerate(runs)]
    cpu = (f" Median of the same ratio in CPU time (the process's threads; steadier on a loaded machine): "
           f"{num(report['median_cpu_ratio'])}." if with_cpu and "median_cpu_ratio" in report else "")
    header = ["repeat", "fit (s)", "report (s)", "report / fit"] + \
        (["fit CPU (s)", "report CPU (s)", "CPU report / fit"] if with_cpu else []) + ["load (1 min)"]
    return ["", f"`{' '.join(report['command'])}` in a fresh process per repeat; fit and report phase as the CLI times "
                f"them in the same run. Median report / fit over {len(runs)} repeats: {num(report['median_ratio'])} "
                f"(goal ≤ {num(report['goal_ratio'])}: {yes_no(report['goal_met'])}).{cpu} Measured on a shared 2-core "
                f"machine (load average at the end of each run in the table). Device: {device_of(report)}; date: "
                f"{report.get('created', 'not recorded')}.", ""] + table(header, rows)


@formatter("polya_gamma_throughput")
def _polya_gamma(report: dict) -> list[str]:
    rows = [[num(c["c"]), num(c["ours_draws_per_s"]), num(c["polyagamma_draws_per_s"]), num(c["ratio"])] for c in report["cases"]]
    return ["", f"{num(report['num_draws'])} draws, goal ratio ≥ {num(report['goal_ratio'])}, min ratio "
                f"{num(report['min_ratio'])}. {provenance(report)}", ""] + \
        table(["c", "ours draws/s", "polyagamma draws/s", "ratio"], rows)


@formatter("invariance_toy")
def _invariance_toy(report: dict) -> list[str]:
    rows = [[key, num(r["elbo"], 4), num(r["train_rmse"]), num(r["test_rmse"]), num(r["fit_seconds"])]
            for key, r in report["summary"].items()]
    return ["", provenance(report), ""] + table(["setting / model", "ELBO", "train RMSE", "test RMSE", "fit s"], rows)


@formatter("gpflow_side_by_side")
@formatter("gpflow_side_by_side_mnist10_timing")
def _gpflow_side_by_side(report: dict) -> list[str]:
    rows = []
    for config, r in report["results"].items():
        ours, ref = r.get("gpzoo", {}), r.get("gpflow", {})
        ratio = ref.get("median_step_s") / ours["median_step_s"] if ours.get("median_step_s") and ref.get("median_step_s") else None
        rows.append([config, num(r["setting"].get("steps")), num(ours.get("median_step_s")), num(ref.get("median_step_s")),
                     num(ratio), pct(ours.get("test_error")), pct(ref.get("test_error"))])
    return ["", f"Median seconds per Adam step over {report.get('timed', '?')} timed steps. {provenance(report)}", ""] + \
        table(["config", "steps", "gpzoo s/step", "GPflow s/step", "GPflow / gpzoo", "gpzoo error", "GPflow error"], rows)


def _spread(values: list) -> str:
    """Mean of ``values`` (fractions shown as %), with their range when there are several."""
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    mean = pct(statistics.fmean(values))
    return mean if len(values) == 1 else f"{mean} ({pct(min(values))}–{pct(max(values))})"


def _mean_num(values: list) -> str:
    values = [v for v in values if v is not None]
    return num(statistics.fmean(values)) if values else "—"


def _gpflow_equal_steps(report: dict) -> list[str]:
    """Error, NLPP and full-data ELBO of both frameworks at each evaluated step count, over seeds."""
    groups: dict[tuple, list] = {}
    for r in report["results"].values():
        setting = r["setting"]
        for point in r.get("checkpoints", []):
            groups.setdefault((setting["config"], setting.get("model", "weighted-conv"), point["steps"]), []).append(point)
    rows = []
    for (config, model, steps), points in groups.items():
        side = {k: [p.get(k) or {} for p in points] for k in ("gpzoo", "gpflow")}
        rows.append([config, model, num(steps), num(len(points))]
                    + [_spread([e.get("test_error") for e in side[k]]) for k in ("gpzoo", "gpflow")]
                    + [_mean_num([e.get(m) for e in side[k]]) for m in ("test_nlpp", "elbo") for k in ("gpzoo", "gpflow")])
    lines = []
    n_test = next(iter(report["results"].values()))["setting"].get("N_test") if report["results"] else None
    for config, model in dict.fromkeys((c, m) for c, m, _ in groups):
        last = max(steps for c, m, steps in groups if (c, m) == (config, model))
        points = groups[(config, model, last)]
        means = {k: statistics.fmean(p[k]["test_error"] for p in points) for k in ("gpzoo", "gpflow") if all(k in p for p in points)}
        if len(means) < 2:
            continue
        sides = {k: {"test_error": means[k], "test_nlpp": statistics.fmean(p[k]["test_nlpp"] for p in points)} for k in means}
        # binomial standard error of the difference of the two mean errors (each over len(points) × n_test test points)
        se = math.sqrt(sum(e * (1 - e) for e in means.values()) / (len(points) * n_test)) if n_test else float("nan")
        text = f"{config} / {model} after {last:,} steps: gpzoo's mean test error at most GPflow's"
        line = goal_line(text, means["gpzoo"] <= means["gpflow"], sides, config, n_test)
        if "cannot be judged" not in line:
            line = line[:-1] + f"; within 2 s.e. of the difference ({pct(2 * se)}): {yes_no(means['gpzoo'] <= means['gpflow'] + 2 * se)}."
        lines.append(line)
    settings = report.get("settings") or {}
    likelihoods = {r["setting"].get("gpflow_likelihood") for r in report["results"].values()} - {None}
    intro = (f"Same data, initial inducing patches and hyperparameters, minibatch order and Adam 0.01 in both; Bernoulli "
             f"link {settings.get('link', 'logit')} (GPflow's likelihood: {'; '.join(sorted(likelihoods)) or 'not recorded'}); "
             f"error is the mean over seeds (range). {provenance(report)}")
    return ["", intro, ""] + table(["config", "model", "steps", "seeds", "gpzoo error", "GPflow error", "gpzoo NLPP",
                                    "GPflow NLPP", "gpzoo ELBO", "GPflow ELBO"], rows) + ["", *lines]


for _name in EQUAL_STEPS:
    formatter(_name)(_gpflow_equal_steps)


@formatter("kernel_search")
def _kernel_search(report: dict) -> list[str]:
    lines = []
    for name, r in report.get("experiments", {}).items():
        lines += ["", f"**{name}** ({r['n_train']} train / {r['n_test']} extrapolated points; depth {r['depth']}, "
                      f"{r['restarts']} restarts × {r['steps']} L-BFGS iterations"
                      f"{', plus one continuing the parent' if r.get('continue_parents') else ''}; {r['structures_fitted']} structures, "
                      f"{num(r['wall_s'])} s wall of which {num(r['compile_s'])} s compiling, load {num(r['load_at_start'])} "
                      f"at the start). {provenance(r)}", ""]
        rows = [[label if label == "search" else f"fixed {label}", f"`{row['structure']}`", num(row["bic"]), num(row["rmse"]),
                 num(row["mean_log_predictive_density"])] for label, row in r["rows"].items()]
        lines += table(["model", "structure", "BIC (train)", "held-out RMSE", "held-out MLPD"], rows)
        lines += ["", "Components found: " + "; ".join(f"`{c['expression']}`: {c['description']}" for c in r["components"])]
    return lines


@formatter("gallifrey_peer")
def _gallifrey_peer(report: dict) -> list[str]:
    lines = []
    for name, r in report.get("experiments", {}).items():
        g, z, cfg = r.get("gallifrey") or {}, r.get("gpzoo") or {}, (r.get("settings") or {}).get("gallifrey") or {}
        lines += ["", f"**{name}** ({r['n_train']} train / {r['n_test']} extrapolated points; gallifrey "
                      f"{num(cfg.get('particles'))} particles, {num(cfg.get('smc_steps'))} SMC rounds, n_mcmc "
                      f"{num(cfg.get('n_mcmc'))}, n_hmc {num(cfg.get('n_hmc'))}; load {num(r['load_average_start'][0])} at the "
                      f"start). {provenance(r)}", ""]
        rows = []
        if g and "error" not in g:
            rows.append(["gallifrey (SMC mixture)", "—", num(g["rmse"]), num(g["mean_log_predictive_density"]),
                         num(g["fit_s"]), num(g["compile_s"]), f"{num(g['effective_particles'])} effective particles"])
        elif r.get("gallifrey_note") or g:
            rows.append(["gallifrey", "—", "—", "—", "—", "—", r.get("gallifrey_note") or "failed (see the JSON)"])
        if z:
            rows.append(["gpzoo search", f"`{z['structure']}`", num(z["rmse"]), num(z["mean_log_predictive_density"]),
                         num(z["wall_s"]), num(z["compile_s"]), f"{num(z['structures_fitted'])} structures"])
        lines += table(["method", "structure", "held-out RMSE", "held-out MLPD", "wall s", "compile s", "note"], rows)
    return lines


@formatter("pg_natgrad")
def _pg_natgrad(report: dict) -> list[str]:
    def steps_s(run):
        return f"{num(run.get('steps_to_target', run.get('steps')))} / {num(run['seconds'] * 1e3)} ms" if run else "—"

    rows = [[f"({num(r['lengthscale'])}, {num(r['variance'])})", num(r["N"]), num(r["M"]), steps_s(r["cavi"]),
             steps_s(r.get("cavi_anderson")), f"{steps_s(r['adam'])} (lr {num(r['adam'].get('learning_rate'))})",
             num(r["speed_ratio"]), num(r.get("speed_ratio_anderson"))]
            for r in report["results"]]
    goal = num(report["goal_ratio"])
    return ["", f"Wall time to within 1 nat of the optimum of the same PG bound, fixed hyperparameters, every program one "
                f"jit-compiled scan (median of {report['protocol']['repeats']}, compile excluded). Adam gets its best learning "
                f"rate from a grid and the same cached features; ratios are Adam time over CAVI time. Goal {goal}×: plain CAVI "
                f"{yes_no(report['goal_met'])}, Anderson-accelerated CAVI {yes_no(report.get('goal_met_anderson'))}. "
                f"{provenance(report)}", ""] + \
        table(["(ℓ, σ²)", "N", "M", "CAVI steps / time", "CAVI + Anderson", "Adam", "ratio", "ratio (Anderson)"], rows)


@formatter("natgrad")
def _natgrad(report: dict) -> list[str]:
    def run(r):
        if not r:
            return "—"
        steps = num(r["steps_to_1nat"]) if r["reached"] else "not reached"
        return f"{steps} × {num(r['seconds_per_step'] * 1e3)} ms (lr {num(r['learning_rate'])})"

    rows = []
    for name, r in report["results"].items():
        gpjax = (r.get("gpjax") or {}).get("natgrad")
        ratio = num(r["adam_over_natgrad_steps"]) + (" (≥)" if r.get("adam_over_natgrad_steps_lower_bound") else "")
        rows.append([name, num(r["N"]), num(r["M"]), num(r["optimum_elbo"]), run(r["natgrad"]), run(r["adam"]), ratio,
                     yes_no(r["goal_met"]["steps"]), run(gpjax), num(r.get("gpzoo_over_gpjax_step_s")),
                     yes_no(r["goal_met"]["per_step_vs_gpjax"])])
    goals, protocol = report["goals"], report["protocol"]
    return ["", f"Full-batch float64 fits from the same start; steps to within {num(report['target_gap_nats'])} nat of the best "
                f"ELBO any long run reached (GPJax: of its own runs' best), best of learning rates "
                f"{', '.join(num(x) for x in protocol['learning_rates'])} for each optimiser; per step: warm fits, "
                f"(least 2K-step fit − least K-step fit) / K over {protocol['repeats']} pairs, compilation excluded. "
                f"Goals: Adam steps / natgrad steps ≥ {num(goals['adam_over_natgrad_steps'])}, gpzoo / GPJax natgrad s/step ≤ "
                f"{num(goals['gpzoo_over_gpjax_step_s'])}. "
                f"Device: {device_of(report)}; date: {report.get('created', 'not recorded')}; {_load(report)}.", ""] + \
        table(["case", "N", "M", "optimum ELBO", "natgrad steps × s/step", "Adam steps × s/step", "Adam / natgrad steps",
               "≥ goal", "GPJax natgrad", "gpzoo / GPJax s/step", "≤ goal"], rows)


@formatter("nuts_ess")
def _nuts_ess(report: dict) -> list[str]:
    settings = report["settings"]
    rows = []
    for name in ("gpzoo", "gpflow"):
        r = report.get(name)
        if not r or "error" in r:
            continue
        hyper = r["hyperparameters"]
        rows.append([name, num(r["sampling_s"]), num(r["compile_s"]), f"{r['slowest']} {num(r['min_ess_bulk'])}",
                     num(r["ess_per_s"]), num(r["ess_per_s_with_compile"]),
                     num(max((h["r_hat"] for h in hyper.values() if h["r_hat"] is not None), default=None)),
                     num(r["divergences"]), num(r["leapfrogs_per_draw"])])
    check = report.get("target_check") or {}
    return ["", f"{settings['chains']} chains × ({settings['warmup']} warmup + {settings['samples']} draws), N "
                f"{settings['N']}, M {settings['M']}, Bernoulli, whitened inducing outputs, float64; bulk ESS (ArviZ) of the "
                f"slowest hyperparameter over sampling seconds (compile excluded; with compile alongside). gpzoo / GPflow "
                f"ESS/s: {num(report.get('ratio_ess_per_s_gpzoo_over_gpflow'))}; targets agree to "
                f"{num(check.get('max_abs_diff'))} nats. Device: {device_of(report)}; date: {report.get('created', 'not recorded')}; "
                f"{_load(report)}.", ""] + \
        table(["library", "sampling s", "compile s", "slowest ESS", "ESS/s", "ESS/s with compile", "max r_hat",
               "divergences", "leapfrogs/draw"], rows)


@formatter("robustness_sweep")
def _robustness_sweep(report: dict) -> list[str]:
    keys = ("cholesky_failures", "diverged", "jitter_escalations", "non_finite", "errors")
    rows = []
    for dtype, result in report["results"].items():
        rows += [[name, dtype, num(c["runs"]), *(num(c[k]) for k in keys), num(c["max_jitter"])] for name, c in result["models"].items()]
    p, totals = report["protocol"], report["totals"]
    data = p["data"]
    lines = ["", f"{p['seeds']} seeds per model and precision, {p['steps']} Adam steps at each model's zoo defaults on "
                f"{data['image_size']}×{data['image_size']} {data['name']} ({data['num_train']} training images), then predict "
                f"and the ELBO. Totals over {num(totals['runs'])} runs: " + ", ".join(f"{k.replace('_', ' ')} {num(totals[k])}" for k in keys)
                + f". Goal (no failure, no non-finite result) met: {yes_no(report['goal_met'])}"
                + ("" if report.get("complete", True) else " in the runs made; the sweep was cut short before "
                   + ", ".join(sorted({m for r in report["results"].values() for m in r.get("not_run", [])})))
                + f". {provenance(report)}"]
    for name, deviation in sorted(p.get("deviations", {}).items()):
        changed = ", ".join(f"{k.replace('_', ' ')} {num(v)}" for k, v in deviation.items() if k != "reason")
        lines.append(f"Deviation from the protocol for {name}: {changed} ({deviation['reason']}).")
    return lines + [""] + \
        table(["model", "dtype", "runs", "Cholesky failures", "diverged", "runs with jitter increases", "non-finite", "errors",
               "max jitter"], rows)


@formatter("shift_scale_sweep")
def _shift_scale_sweep(report: dict) -> list[str]:
    p, totals = report["protocol"], report["totals"]
    data = p["data"]
    rows = []
    for dtype, result in report["results"].items():
        for name, per_transform in result["models"].items():
            rows += [[name, dtype, t, num(c["runs"]), num(c["non_finite"]), num(c["diverged"]), num(c["cholesky_failures"]),
                      num(c["errors"]), pct(c["mean_accuracy"]), pct(c["mean_accuracy_drop"]), pct(c["max_accuracy_drop"]),
                      num(c["drops_over_tolerance"]), num(c["unexplained_drops"]),
                      ", ".join(f"{w} ({num(n)})" for w, n in c["warnings"].items()) or "—"]
                     for t, c in per_transform.items()]
    transforms = ", ".join(f"{t}: {definition.split(' (')[0]}" for t, definition in p["transforms"].items())
    transforms += " on every pixel of the training and test images"
    keys = ("non_finite", "diverged", "cholesky_failures", "errors", "unexplained_drops")
    left_out = report.get("zoo_models_not_run") or []
    lines = ["", f"{p['seeds']} seeds per model, precision and transform ({transforms}), {p['steps']} Adam steps at each "
                 f"model's zoo defaults on {data['image_size']}×{data['image_size']} {data['name']} ({data['num_train']} "
                 f"training, {data['num_test']} test images). The drop is the accuracy of the untransformed run of the same "
                 f"model, seed and precision minus the run's; a drop of more than {pct(p['accuracy_tolerance'])} is "
                 f"unexplained unless the run raised {' or '.join(p['explaining_warnings'])}. Totals over "
                 f"{num(totals['runs'])} runs: " + ", ".join(f"{k.replace('_', ' ')} {num(totals[k])}" for k in keys)
                 + f". Goal (none of these) met: {yes_no(report['goal_met'])}"
                 + (f" for the models run; not run: {', '.join(left_out)}" if left_out else "")
                 + ("" if report.get("complete", True) else "; the sweep was cut short before "
                    + ", ".join(sorted({m for r in report["results"].values() for m in r.get("not_run", [])})))
                 + f". {provenance(report)}", ""]
    return lines + table(["model", "dtype", "data", "runs", "non-finite", "diverged", "Cholesky failures", "errors",
                          "mean accuracy", "mean drop", "largest drop", "drops > tolerance", "unexplained", "gpzoo warnings (runs)"],
                         rows)


@formatter("dkm_sine_toy")
def _dkm_sine_toy(report: dict) -> list[str]:
    if report.get("partial"):
        return ["", "(a run cut short: partial results only)"]
    settings, checks = report["settings"], report.get("checks", {})
    record = settings["record_every"]
    rows = []
    for sweep, label in (("gamma", "SKR γ (ν = 0)"), ("nu_taylor", "ν, Taylor KL"), ("nu_exact", "ν, exact KL")):
        for run in report["results"][sweep]:
            trace = run["condition_trace"]
            early = next((c for s, c in trace if s >= checks.get("early_step", record)), None)
            value = run["gamma"] if sweep == "gamma" else run["nu"]
            rows.append([label, value if isinstance(value, str) else num(value), num(trace[0][1] if trace else None),
                         num(early), num(run["final_condition"]), num(run["train_accuracy"]),
                         run["failure"] or ""])
    below = checks.get("taylor_below_exact_for_small_nu", {})
    return ["", f"cond(G) of the learned Gram matrix (P = {settings['num_inducing']}, {settings['kernel']} kernel, "
                f"{settings['dtype']}, full batch, {settings['steps']} Adam steps at lr 0.01; the paper ran 2,000 epochs), after "
                f"{record} steps, at step {checks.get('early_step')} and at the end. Paper's orderings: Taylor below exact for small ν "
                f"{sum(below.values())}/{len(below)}; ν = 0 the worst conditioned {yes_no(checks.get('nu0_is_worst_conditioned'))}; "
                f"smaller γ gives smaller cond(G) early {yes_no(checks.get('skr_lowers_condition_early'))}. "
                f"cond(G) beyond ~1e16 is numerically singular in float64. {provenance(report)}", ""] + \
        table(["sweep", "value", f"cond after {record}", "cond early", "cond at end", "train accuracy", "failure"], rows)


#: Milsom et al. 2024, Table 3's rows in its order, with the names the paper gives them
DKM_ROWS = {"full": "No ablation / our full method", "no_taylor": "No Taylor approximation to objective", "no_skr": "No SKR",
            "no_taylor_no_skr": "No Taylor + No SKR", "no_skr_keep_jitter": "No SKR but keep λ = 0.1 jitter",
            "nu0": "ν_ℓ = 0 (eq. 2)", "short_schedule": "200 epochs"}


#: the three rows of files recorded before each run carried its settings: what each changed
_LEGACY_DKM_ROWS = {"full": dict(skr=True), "no_skr": dict(skr=False), "no_taylor": dict(skr=True, kl="exact")}


def _dkm_row_changes(name: str, run_settings: dict | None, settings: dict) -> str:
    """What a row ran, from the settings recorded with its runs (files from before they were recorded: the
    file's own settings, which every row shared but for SKR and the KL form)."""
    r = run_settings
    if r is None:
        paper = str(settings.get("optimizer", "")).startswith("Adam, betas (0.8, 0.9)")
        r = dict(skr_gamma=settings.get("skr_gamma"), skr_jitter=0.1, kl=settings.get("taylor_form", "taylor_symmetric"),
                 nu=settings["nu"], steps=settings["steps"], lr_drop_fractions=[800 / 1200, 1100 / 1200] if paper else [])
        r.update(_LEGACY_DKM_ROWS.get(name, {}))
    lam = f"SKR γ = {r['skr_gamma'] or 'ceil(P/4)'}, λ = {num(r['skr_jitter'])}" if r["skr"] else \
        f"no SKR, λ = {num(r['skr_jitter'])}"
    drops = ", ".join(f"{round(f * r['steps'])}" for f in r.get("lr_drop_fractions", []))
    return f"{lam}; KL {r['kl']}; ν = {num(r['nu'])}; {r['steps']} steps" + (f", lr ÷10 at {drops}" if drops else "")


def _dkm_n_test(settings: dict) -> int | None:
    """Test points: recorded, or read from the data description ("... (1437 train / 360 test, ...)") of older files."""
    if settings.get("n_test"):
        return int(settings["n_test"])
    import re  # noqa: PLC0415

    match = re.search(r"/ (\d+) test", settings.get("data", ""))
    return int(match.group(1)) if match else None


@formatter("reproduce_dkm")
def _reproduce_dkm(report: dict) -> list[str]:
    from _verdict import why_unjudgeable  # noqa: PLC0415

    summary, settings = report["summary"], report["settings"]
    per_row = {r["config"]: r.get("settings") for r in report["runs"]}
    legacy = not any(per_row.values())  # runs recorded before each carried its row's settings
    rows = []
    for name in DKM_ROWS:
        stats = summary.get(name)
        if not stats or not stats["runs"]:  # a file of some rows only
            continue

        def cell(key):
            value = stats.get(key)
            return "—" if value is None else f"{pct(value['mean'])} ± {pct(value['sem'])}" if key != "test_nll" else \
                f"{num(value['mean'])} ± {num(value['sem'])}"
        paper_name = DKM_ROWS[name]
        if legacy and name == "no_skr":  # SKR off with the default λ = 0.1 kept
            paper_name = "No SKR but keep λ = 0.1 jitter (recorded as no_skr)"
        rows.append([f"`{name}`", paper_name, _dkm_row_changes(name, per_row.get(name), settings), f"{stats['failures']}/{stats['runs']}",
                     cell("train_accuracy"), cell("test_accuracy"), cell("gap"), cell("test_nll")])
    partial = "" if report.get("complete", True) else (  # a sweep interrupted between runs
        f" **Partial: {len(report['runs'])} of {len(settings['seeds']) * len(settings['configs'])} planned runs** "
        "(the sweep stopped early).")
    other = next((n for n in ("no_skr", "no_skr_keep_jitter") if (summary.get(n) or {}).get("runs")), None)
    sides = {n: {k: summary[n][k]["mean"] for k in ("test_accuracy", "test_nll") if k in summary[n]} or None
             for n in ("full", other) if n and (summary.get(n) or {}).get("runs")}
    n_test = _dkm_n_test(settings)
    if len(sides) < 2:
        goals = "Goals: cannot be judged (the file lacks the full method or a no-SKR row)."
    elif reason := (why_unjudgeable(sides, 10, n_test) if n_test else "the number of test points is not recorded"):
        goals = f"Goals (SKR against `{other}`): cannot be judged: {reason}."
    else:
        full, rest = summary["full"], summary[other]
        goals = (f"Goals (SKR against `{other}`): SKR test accuracy ≥ no-SKR "
                 f"{yes_no(full['test_accuracy']['mean'] >= rest['test_accuracy']['mean'])}; SKR gap smaller "
                 f"{yes_no(full['gap']['mean'] < rest['gap']['mean'])}.")
    widths = settings.get("widths") or [settings["width"], 2 * settings["width"]]
    return ["", f"{settings['data']}, depth {len(widths) if settings.get('widths') else settings['depth']}, widths "
                f"{'/'.join(str(w) for w in widths)}, batch {settings['batch_size']}, optimizer: "
                f"{settings.get('optimizer', 'Adam (0.9, 0.999), constant learning rate')}, KL form of the Taylor rows "
                f"{settings.get('taylor_form', 'taylor_symmetric')}, float32, seeds {settings['seeds']} (mean ± s.e. over "
                f"the runs that finished; failures are numerical errors, as the paper counts them).{partial} {goals} "
                f"{provenance(report)}", ""] + \
        table(["row", "the paper's row", "what it runs", "failures", "train accuracy", "test accuracy", "train − test",
               "test NLL"], rows)


@formatter("dkm_step")
def _dkm_step(report: dict) -> list[str]:
    if "configs" not in report:  # the first layout: the conv step only
        return _dkm_step_config("conv", report, report)
    lines = ["", f"Median of {report.get('repeats')} interleaved repeats of {report.get('steps_per_repeat')} steps each; load average "
             f"{num(report['machine']['load_average_start'][0])} at the start, "
             f"{num(report['machine'].get('load_average_end', [None])[0])} at the end (2 shared cores)."]
    for name, cfg in report["configs"].items():
        lines += _dkm_step_config(name, cfg, report)
    return lines


def _dkm_step_config(name: str, cfg: dict, report: dict) -> list[str]:
    step, ratios, goals, ref = cfg["step"], cfg["ratios"], cfg["goals"], cfg.get("reference", {})
    mib = lambda b: num(b / 2**20) if b else "—"  # noqa: E731
    rows = [[name_, num(cfg[name_]["step_s"] * 1e3), num(cfg[name_]["compile_s"]), mib(cfg[name_]["peak_bytes_xla"]),
             mib(cfg[name_].get("peak_rss_bytes_own_process"))] for name_ in ("gpzoo", "straightforward")]
    rows.append(["matmul bound", num(cfg["matmul_bound"]["bound_step_s"] * 1e3), "—", "—", "—"])
    floor = cfg.get("xla_conv_floor")
    floor_text = ""
    if floor:
        rows.append(["XLA's convolutions alone", num(floor["step_s"] * 1e3), "—", "—", "—"])
        budget = floor.get("share_of_3x_reference_budget")
        floor_text = (f" XLA's own convolutions of the step (per Gram layer the forward K_ti and its input and filter "
                      f"gradients), timed alone, take {num(floor['share_of_gpzoo_step'] * 100)} % of gpzoo's step and run "
                      f"{num(floor['over_matmul_rate'])}× slower than the matmul rate"
                      + (f"; alone they use {num(budget * 100)} % of the time a 3× lead over the authors' code allows."
                         if budget is not None else "."))
    if "step_s_1_thread" in ref:
        rows.append(["authors' PyTorch, 2 threads", num(ref["step_s_2_threads"] * 1e3), "—", "—", mib(ref["peak_rss_bytes"])])
        rows.append(["authors' PyTorch, 1 thread", num(ref["step_s_1_thread"] * 1e3), "—", "—", mib(ref["peak_rss_bytes"])])
        ref_text = (f" Authors' code (torch {ref['torch']}, run here) / gpzoo {num(ratios['reference_over_gpzoo'])}× against its "
                    f"faster thread setting, {num(ratios['reference_2_threads_over_gpzoo'])}× against 2 threads (goal ≥ 3×: "
                    f"{yes_no(goals.get('at_least_3x_faster_than_reference'))}); peak RSS gpzoo / authors' "
                    f"{num(ratios['gpzoo_rss_over_reference_rss'])} (goal ≤ 1: {yes_no(goals.get('no_more_memory_than_reference'))}).")
    else:
        ref_text = f" The authors' code was not run; its earlier time on this machine was {num(ref.get('quoted_in_issue_s'))} s/step."
    shape = (f"{step['images']} images, batch {step['batch']}" if "images" in step
             else f"{step['num_train']} points, full batch")
    clean = cfg["gpzoo"].get("float32_clean")
    dtype_note = f" (no float64 array op in the compiled step: {yes_no(clean)})" if clean is not None and step["dtype"] == "float32" else ""
    return ["", f"**{name}** — {shape}, Gram layers {step['gram_layers']}, {step['dtype']}{dtype_note}. "
                f"Straightforward / gpzoo {num(ratios['straightforward_over_gpzoo'])}× (goal ≥ 3×: "
                f"{yes_no(goals['at_least_3x_faster_than_straightforward'])}); gpzoo / bound "
                f"{num(ratios['gpzoo_over_bound'])}× (goal ≤ 3×: {yes_no(goals['within_3x_of_matmul_bound'])}); "
                f"objectives agree to {num(cfg['like_for_like']['loss_rel_diff'])} (relative).{ref_text}{floor_text} "
                f"{provenance(report)}", ""] + \
        table(["program", "step (ms)", "compile (s)", "XLA peak (MiB)", "peak RSS (MiB)"], rows)


@formatter("scan_convolutions")
def _scan_convolutions(report: dict) -> list[str]:
    grad, fitted = report["gradient_step"], report["fit"]
    rows = []
    for key, row in grad.items():
        for name in ("autodiff", "conv2d"):
            rows.append([f"{key.replace('_', ' ')}, {name}", num(row[name]["alone_s"] * 1e3), num(row[name]["in_scan_s"] * 1e3),
                         str(row[name]["loop_emitted_convolutions_in_scan"])])
    return ["", f"One gradient step of the conv DKM's mix-up convolutions (K_ti [64, 16, 16, 64], filters [3, 3, 64, 64], "
                f"float32), jitted alone and inside a scan of {report['settings']['scan_length']} steps; median of "
                f"{report['settings']['repeats']} (ms per step). In the scan, autodiff's form / conv2d: "
                + ", ".join(f"{num(row['autodiff_over_conv2d_in_scan'])}× ({key.replace('_', ' ')})" for key, row in grad.items())
                + f". `gpzoo.fit` of {fitted['model']} on {fitted['data']}, batch {fitted['batch']}: "
                f"{num(fitted['conv2d']['step_s'] * 1e3)} ms per step with conv2d, {num(fitted['autodiff']['step_s'] * 1e3)} ms with "
                f"autodiff's form ({num(fitted['autodiff_over_conv2d'])}×). {provenance(report)}", ""] + \
        table(["convolution", "alone (ms)", "in a scan (ms)", "loop-emitted convolutions in the scan"], rows)


TICK_ORDER = ("e2", "e1", "e3")


@formatter("reproduce_tick")
def _reproduce_tick(report: dict) -> list[str]:
    lines = []
    experiments = report.get("experiments", {})
    for name in in_order(experiments, TICK_ORDER):
        exp = experiments[name]
        s = exp["settings"]
        extra = " Every image has the same multiset of patches (checked)." if s.get("conv_indistinguishable") else ""
        if s.get("hidden_sampling"):
            extra += (f" Hidden layers: {s['hidden_channels']} channels, outputs drawn by the {s['hidden_sampling']!r} "
                      f"scheme{' (per patch, the paper’s training scheme, §4.1)' if s['hidden_sampling'] == 'marginal' else ''}.")
        seeds = s.get("seeds")
        spread = (f" Mean over seeds {', '.join(map(str, seeds))}; ELBO ± its s.d. across seeds; every seed's own numbers are "
                  f"in the JSON." if seeds else f" Seed {s.get('seed')}; ELBO ± its Monte Carlo s.e.")
        lines += ["", f"**{name.upper()}** — {s['dataset']}, {s['num_train']:,} train / {s['num_test']:,} test images, "
                      f"{s['patch_shape'][0]}×{s['patch_shape'][1]} patches, M = {s['num_inducing']}, Adam {s['learning_rate']}, "
                      f"batch {s['batch_size']}. **CPU-sized**: {s['cpu_sized']}; the paper: {s['paper_setting']}.{extra}{spread} "
                      f"{provenance(exp)}", ""]
        rows = []
        for model, r in exp["models"].items():
            if r.get("timing_only"):
                rows.append([f"`{model}`", num(r["steps"]), "timing run", "", "", "", "", "", "", num(r["s_per_step"]), ""])
                continue
            paper = r.get("paper") or {}
            scales = ", ".join(num(v) for v in r.get("location_lengthscales", {}).values()) or "—"
            rows.append([f"`{model}`", num(r["steps"]), pct(r["top1_error"]), pct(r.get("top2_error")), pct(r.get("top3_error")),
                         num(r["nll"]), num(r["nll_misclassified"]), pct(paper.get("top1_error")),
                         f"{num(r['elbo'], 5)} ± {num(r['elbo_sd'] if seeds else r['elbo_stderr'])}", num(r["s_per_step"]), scales])
        lines += table(["model", "steps", "top-1", "top-2", "top-3", "NLL", "NLL misses", "paper top-1", "ELBO ± s.e.", "s/step",
                        "location ℓ"], rows)
        if "goal" in exp:  # E2's goal asks for conv at chance: its line is the goal itself
            models = {} if name == "e2" else exp["models"]
            lines += ["", goal_line(exp["goal"]["text"], exp["goal"]["met"], models, s["dataset"], s.get("num_test"),
                                    exp["goal"].get("met_every_seed"))]
    return lines + (["", STEP_NOTE] if lines else [])


@formatter("deep_conv_step")
def _deep_conv_step(report: dict) -> list[str]:
    s, t = report["setting"], report["timings"]
    over, speed = report["step_over_bound"], report["speedup_over_straightforward"]
    forward = report.get("step_over_forward_bound")
    rows = [[clock.replace("_s", ""), num(1e3 * t["gpzoo"][clock]), num(1e3 * t["straightforward"][clock]), num(speed[clock]),
             num(1e3 * report["bound_s"][clock]), num(over[clock]["gpzoo"]), num(over[clock]["straightforward"]),
             num(forward[clock]["gpzoo"]) if forward else "—"]
            for clock in ("cpu_s", "wall_s")]
    counted = ("forward and backward exps and matmul flops" if forward else
               "forward exps and matmul flops only (a lower bound)")
    goals = ", ".join(f"{k}: {yes_no(v)}" for k, v in report["goals"].items() if v is not None) or "not judged"
    temp = report["temp_bytes"]
    return ["", f"`{s['model']}`, {s['num_layers']} layers, {s['image_shape'][0]}×{s['image_shape'][1]} images, "
                f"{s['patch_shape'][0]}×{s['patch_shape'][1]} patches, M = {s['M']} per layer, B = {s['B']}, {s['dtype']}; "
                f"medians per step (ms). Bound: {counted} at rates measured in the same run. "
                f"XLA temporaries: gpzoo {num(temp['gpzoo'] / 2**20)} MiB, straightforward {num(temp['straightforward'] / 2**20)} MiB; "
                f"peak RSS {num(s.get('peak_rss_gpzoo_only_mb'))} MB with gpzoo's step alone, {num(report['peak_rss_mb'])} MB "
                f"with both; the two bounds agree to {num(report['agreement']['rel_diff'])}. "
                f"Goals: {goals}. {provenance(report)}", ""] + \
        table(["clock", "gpzoo", "straightforward", "speedup", "bound", "gpzoo / bound", "straightforward / bound",
               "gpzoo / forward-only bound"], rows)


def _load(report: dict) -> str:
    start, end = report["machine"].get("load_average_start"), report.get("load_average_end")
    return f"load average (1 min) {num(start[0] if start else None)} at the start, {num(end[0] if end else None)} at the end"


@formatter("ray_speedup")
def _ray_speedup(report: dict) -> list[str]:
    s, wall = report["setting"], report["median_wall_s"]
    goals = ", ".join(f"{k}: {yes_no(v)}" for k, v in report["goals"].items())
    if "ray_start_s" not in report:  # the first layout: Ray's start and stop inside the Ray wall time
        rows = [["sequential", num(wall["sequential"]), "1"],
                [f"Ray, {s['workers']} workers (start/stop included)", num(wall["ray_with_start"]), num(report["speedup"])]]
        return ["", f"Models {', '.join(s['models'])} × seeds {', '.join(map(str, s['seeds']))} on rectangles "
                    f"({s['num_train']} images, {s['steps']} steps, B = {s['batch_size']}, M = {s['num_inducing']}, {s['dtype']}), "
                    f"no report; median wall time of the whole `gpzoo.compare` call over {s['repeats']} interleaved repeats. "
                    f"Overhead per task {num(report['overhead_per_task_s'])} s; results identical across backends: "
                    f"{yes_no(report['identical'])}. Goals: {goals}. Measured on a shared machine ({_load(report)}). "
                    f"{provenance(report)}", ""] + table(["backend", "wall (s)", "speed-up"], rows)
    seq = wall["sequential"]
    slots = report.get("actor_slot_time_s") or []
    firsts = [t for repeat in slots for t in repeat.get("first_run_s", [])]
    ends = [repeat["end"] for repeat in slots if "end" in repeat]
    split = (f", most of it each actor's start and import of gpzoo and JAX (first task {num(min(firsts))}–{num(max(firsts))} s "
             f"after the call starts) and actors idle while another finishes ({num(min(ends))}–{num(max(ends))} s in all)"
             if firsts and ends else "")
    runs = ", ".join(num(v) for v in report.get("overhead_per_task_runs_s", []))
    rows = [["sequential", num(seq), "1"]]
    if "sequential_no_cache" in wall:
        rows.append(["sequential, no compilation cache", num(wall["sequential_no_cache"]), num(seq / wall["sequential_no_cache"])])
    rows += [[f"Ray, {s['workers']} workers", num(wall["ray"]), num(report["speedup_without_ray_start"])],
             [f"Ray, {s['workers']} workers (start/stop included)", num(wall["ray_with_start"]), num(report["speedup"])]]
    cache = (f"; both backends fit through the run's compilation cache (a model's second seed reads its programs back: the "
             f"sequential run takes {num(wall['sequential_no_cache'])} s without it, {num(report['compile_cache_gain'])}× its time with it)"
             if "sequential_no_cache" in wall else "")
    return ["", f"Models {', '.join(s['models'])} × seeds {', '.join(map(str, s['seeds']))} on rectangles "
                f"({s['num_train']} images, {s['steps']} steps, B = {s['batch_size']}, M = {s['num_inducing']}, {s['dtype']}), "
                f"no report; median wall time of the whole `gpzoo.compare` call over {s['repeats']} interleaved repeats{cache}. "
                f"Overhead per task {num(report['overhead_per_task_s'])} s: the {s['workers']} actors' time outside their task "
                f"runs over the fitting phase, per task (per repeat {runs} s){split}; Ray's start "
                f"({num(report['ray_start_s'])} s) and stop ({num(report['ray_stop_s'])} s) apart. The earlier definition, "
                f"(Ray wall + start/stop − sequential wall / {s['workers']}) × {s['workers']} / {s['tasks']}, gives "
                f"{num(report['overhead_per_task_old_formula_s'])} s. Results identical across backends and with or without the "
                f"cache: {yes_no(report['identical'])}. Goals: {goals}. Measured with {_load(report)}. {provenance(report)}"
            ] + _ray_ceiling(report) + [""] + table(["backend", "wall (s)", "speed-up"], rows)


def _ray_ceiling(report: dict) -> list[str]:
    """The ``ceiling`` paragraph of a ray_speedup report (``--ceiling``), or nothing."""
    c = report.get("ceiling")
    if not c:
        return []
    workers = report["setting"]["workers"]
    return ["", f"Ceiling: each of the {report['setting']['tasks']} fits alone in a fresh process took "
                f"{num(c['total_s']['all_cores'])} s in all with the machine's {c['cores']} cores and "
                f"{num(c['total_s']['one_core'])} s pinned to one core ({num(c['second_core_gain'])}× slower: XLA's "
                f"intra-op threads already use the other core). {workers} single-core workers, perfectly balanced and "
                f"with no overhead at all, would therefore do the fits' work **{num(c['speedup'])}×** faster than one "
                f"after another on all cores: the speed-up a backend can reach on this machine (the grid's other "
                f"per-task work, saving and checkpoints, splits as well, so a measured speed-up can land a little "
                f"above it; here {num(report['speedup_without_ray_start'])}× without Ray's start and stop, "
                f"{num(report['speedup'])}× with them)."]


@formatter("data_parallel_step")
def _data_parallel_step(report: dict) -> list[str]:
    s, step, cpu = report["setting"], report["step_s"], report.get("cpu_step_s", {})
    busy = report.get("cores_busy", {})
    rows = [[name, num(1e3 * t), num(1e3 * cpu[name]) if name in cpu else "—", num(busy.get(name))] for name, t in step.items()]
    lines = ["", f"`{s['model']}` on {s['data']} ({s['image_shape'][0]}×{s['image_shape'][1]}, "
                 f"{s['patch_shape'][0]}×{s['patch_shape'][1]} patches, M = {s['M']}), global batch B = {s['B']}, {s['dtype']}; "
                 f"median ms per step over {s['repeats']} interleaved calls of {s['steps_per_call']} steps, device "
                 f"{report['device']}."]
    if "ratio" in report:
        goals = ", ".join(f"{k}: {yes_no(v)}" for k, v in report["goals"].items())
        lines[-1] += f" 2-device / 1-device: {num(report['ratio'])}"
        if "cpu_ratio" in report:
            lines[-1] += f" (CPU per step {num(report['cpu_ratio'])})"
        if "elbo_grad_max_rel_diff" in report:
            lines[-1] += (f"; ELBO and gradients differ from one device's by {num(report['elbo_grad_max_rel_diff'])} in "
                          f"{s['dtype']} and {num(report['elbo_grad_max_rel_diff_float64'])} in float64 (relative); the "
                          f"parameters after the same Adam updates by {num(report['max_rel_diff'])} in {s['dtype']} and "
                          f"{num(report['max_rel_diff_float64'])} in float64, where reordering the rows on one device moves them by "
                          f"{num(report['max_rel_diff_rows_permuted'])} and {num(report['max_rel_diff_float64_rows_permuted'])} (Adam's "
                          "sqrt(v) turns rounding into steps where a gradient is zero up to rounding: the inducing patches', "
                          f"{num(report['inducing_gradient_max_abs']['float32'])} in {s['dtype']} and "
                          f"{num(report['inducing_gradient_max_abs']['float64'])} in float64)")
        else:
            lines[-1] += f"; parameters after the same updates differ by {num(report['max_rel_diff'])} (relative)"
        lines[-1] += f". Goals: {goals}."
    lines[-1] += f" Measured on a shared machine ({_load(report)}). {provenance(report)}"
    if isinstance(report.get("analysis"), str):
        lines += ["", report["analysis"]]
    if not cpu:  # runs that recorded wall time only
        return lines + [""] + table(["program", "step (ms)"], [row[:2] for row in rows])
    return lines + [""] + table(["program", "step (ms)", "CPU per step (ms)", "cores busy"], rows)


FORMATTERS["conv_kernels_mnist10"] = FORMATTERS["conv_kernels"]


@formatter("compile_once")
def _compile_once(report: dict) -> list[str]:
    goals, settings = report["goals"], report["settings"]
    lines = [""]
    if "repeated" in report:
        rows = []
        for name, r in report["repeated"].items():
            fits = r["fits"]
            rows.append([name, num(fits[0]["seconds"]), f"{fits[0]['compilations']}",
                         ", ".join(num(f["seconds"]) for f in fits[1:]), ", ".join(str(c) for c in r["repeat_compilations"]),
                         num(r["arithmetic_s"]), ", ".join(num(x) for x in r["repeat_over_arithmetic"]), yes_no(r["goal_met"])])
        svgp, conv = settings["svgp-rbf"], settings["conv"]
        lines += [f"Five fits in one process, each with another seed (svgp-rbf: 1-D regression, N = {svgp['num_data']}, "
                  f"M = {svgp['num_inducing']}, {svgp['steps']} full-batch steps; conv: rectangles, {conv['num_train']} images, "
                  f"M = {conv['num_inducing']}, {conv['steps']} steps, batch {conv['batch_size']}). Arithmetic: the time of as many more "
                  f"steps in the compiled programs (a warm fit of twice the steps less a warm fit). Goal: each repeat costs ≤ "
                  f"{num(goals['repeat_over_arithmetic'])}× its arithmetic.", ""]
        lines += table(["model", "1st fit (s)", "its compilations", "2nd–5th fit (s)", "their compilations", "arithmetic (s)",
                        "repeat / arithmetic", "goal met"], rows) + [""]
    first = report.get("first_fit")
    if first:
        rows = [[k, num(v["import_s"]), num(v["fit_s"]), f"{v['compilations']}", num(v["compile_s"]), pct(v["compile_share"]),
                 num(v["final_objective"]), num(v["load"])] for k, v in first.items() if isinstance(v, dict)]
        verdict = (f" gpzoo / GPJax first fit: {num(first['gpzoo_over_gpjax_fit_s'])} (goal ≤ 1: {yes_no(first['goal_met'])})."
                   if first.get("gpjax") else f" {first.get('note', '')}")
        anchor = f"GPJax {first['gpjax']['gpjax']}" if first.get("gpjax") else "GPJax"
        lines += [f"First fit of that svgp-rbf in a fresh process (no persistent cache), against {anchor} fitting the same SVGP "
                  f"(same data, M, steps, Adam, learning rate, whitened q(u); its own initial values, so its final objective "
                  f"is its own) in a fresh process of its own.{verdict}", ""]
        lines += table(["library", "import (s)", "first fit (s)", "compilations", "compile (s)", "compile share",
                        "final objective", "load"], rows) + [""]
    job = report.get("main_job")
    if job:
        names = {"before": "before (previous version, its run-local cache)", "after_no_cache": "after, persistent cache off",
                 "after_cold": "after, empty persistent cache", "after_warm": "after, cache warm (second run)"}
        rows = [[label, num(job[k]["command_s"]), num(job[k]["fit_s"]), num(job[k]["report_s"]), num(job[k]["load"])]
                for k, label in names.items() if k in job]
        met = job["goal_met"]
        lines += [f"`{' '.join(settings['main_job'])}`, each run a fresh process. Goals: under {num(goals['main_job_cold_s'])} s "
                  f"({yes_no(met['cold'])}), under {num(goals['main_job_warm_s'])} s with the cache warm ({yes_no(met['warm'])}).", ""]
        lines += table(["run", "command (s)", "fit phase (s)", "report phase (s)", "load (1 min)"], rows) + [""]
    aot = report.get("ahead_of_time")
    if aot:
        rows = [[str(i + 1), num(r["workers_0_s"]), num(r["workers_2_s"]), num(r["load"])] for i, r in enumerate(aot["repeats"])]
        version = f" (measured with {aot['version']}, the version that still had them)" if aot.get("version") else ""
        lines += [f"The report phase of that job's three models with the persistent cache warm, each repeat a fresh process: "
                  f"compiling its programs ahead of their first call on 2 threads against none{version}. Median saving "
                  f"{pct(aot['saving'])} (kept if ≥ 10 %: {yes_no(aot['keep'])}).", ""]
        lines += table(["repeat", "no compile threads (s)", "2 compile threads (s)", "load (1 min)"], rows) + [""]
    return lines + [f"Device: {device_of(report)}; date: {report.get('created', 'not recorded')}; load average "
                    f"{num(report['machine']['load_average_start'][0])} at the start, {num(report['load_average_end'][0])} at the end."]


def generic(report: dict) -> list[str]:
    """Fallback: the top-level numbers (and those one level down) as a key/value table."""
    rows = []
    for key, value in report.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) or isinstance(value, bool):
            rows.append([f"`{key}`", num(value)])
        elif isinstance(value, dict):
            rows += [[f"`{key}.{k}`", num(v)] for k, v in value.items() if isinstance(v, (int, float))]
    rows = rows[:20]
    return ["", provenance(report), ""] + (table(["quantity", "value"], rows) if rows else ["(no top-level numbers)"])


# ----------------------------------------------------------------------------- the results page
def render(results_dir: Path = RESULTS) -> str:
    """The Markdown that goes between the markers, from every ``*.json`` in ``results_dir``; a file
    with incomplete provenance (:func:`provenance_gaps`) says so under its title."""
    files = sorted(results_dir.glob("*.json"), key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER else len(ORDER), p.stem))
    lines = []
    for path in files:
        gaps = []
        try:
            report = json.loads(path.read_text())
            gaps = provenance_gaps(path, report)
            body = FORMATTERS.get(ALIASES.get(path.stem, path.stem), generic)(report)
            if isinstance(report.get("note"), str):
                body = ["", report["note"], *body]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:  # a malformed file must not hide the rest
            body = ["", f"(could not summarise: {type(exc).__name__}: {exc})"]
        incomplete = ["", f"Provenance incomplete: recorded without {', '.join(gaps)}; re-run to complete."] if gaps else []
        lines += ["", f"## {TITLES.get(path.stem, path.stem.replace('_', ' '))}", *incomplete, *body]
    return "\n".join(lines).strip("\n")


def updated_page(text: str, section: str) -> str:
    start, stop = text.find(BEGIN), text.find(END)
    if start < 0 or stop < start:
        raise SystemExit(f"the results page has no {BEGIN} ... {END} markers")
    return text[: start + len(BEGIN)] + "\n" + section + "\n" + text[stop:]


# ----------------------------------------------------------------------------- provenance
#: what every results file records about how it was made, in the order they are named
PROVENANCE_FIELDS = ("command", "settings", "device", "versions", "date", "git commit")
#: the key under which a results file records its script's ``STEP_DESCRIPTION``
STEP_KEY = "step_description"
#: how :func:`provenance_gaps` names a step description the file lacks or that its script no longer runs
STALE_STEP = "current step description"

#: results files written before every file carried its provenance, and what each lacks (as
#: :func:`provenance_gaps` words it). They cannot be re-run at will, so ``--check`` accepts them
#: with a warning; it fails when one becomes complete (remove it here) or lacks something other
#: than what is written here (say what it now lacks): the list only shrinks.
RECORDED_WITHOUT_PROVENANCE: dict[str, str] = {
    "compile_once": "command, git commit",
    "conv_kernels": "command, git commit",
    "conv_kernels_mnist10": "command, git commit",
    "conv_kernels_mnist10_2cores": "command, date, git commit",
    "conv_kernels_mnist10_tick": "command, git commit",
    "data_parallel_step": "command, git commit",
    "data_parallel_step_8cores": "command, git commit",
    "data_parallel_step_h100": "command, git commit",
    "deep_conv_step": "command, git commit",
    "deep_conv_step_2cores": "command, git commit",
    "deep_conv_step_h100": "command, git commit",
    "dkm_sine_toy": "command, git commit",
    "dkm_step": "command, settings, git commit",
    "gpflow_side_by_side": "command, settings, device, versions, date, git commit",
    "gpflow_side_by_side_mnist10_timing": "command, settings, device, versions, date, git commit",
    "nuts_ess": "command, git commit",
    "pg_natgrad": "command, git commit",
    "polya_gamma_throughput": "command, settings, date, git commit",
    "ray_speedup": "command, git commit",
    "ray_speedup_2cores_1500": "command, git commit",
    "ray_speedup_2cores_quiet": "command, git commit",
    "ray_speedup_8cores": "command, git commit",
    "ray_speedup_8cores_1500": "command, git commit",
    "report_phase": "command, settings, git commit",
    "reproduce_conv": "command, git commit",
    "reproduce_dkm_mnist": "command, git commit",
    "reproduce_dkm_mnist_2400": "command, git commit",
    "reproduce_dkm_mnist_2400_gamma128": "command, git commit",
    "reproduce_dkm_mnist_constant_lr": "command, git commit",
    "reproduce_dkm_mnist_gamma128": "command, git commit",
    "reproduce_dkm_wide": "command, git commit",
    "reproduce_dkm_wide_long": "command, git commit",
    "reproduce_tick": "command, git commit",
    "robustness_sweep": "command, git commit",
    "scan_convolutions": "command, git commit",
    "shift_scale_sweep": "command, git commit",
}


def _present_fields(record: dict) -> set[str]:
    """The :data:`PROVENANCE_FIELDS` that ``record`` holds, under its ``"provenance"`` object or in
    the layouts results were written in before it: settings as ``settings``, ``setting`` or a
    ``protocol`` object; the date as ``date`` or ``created``; device (``devices`` or ``device``) and
    versions (``jax``) in ``machine`` or ``environment``. The command and the git commit exist only
    under ``"provenance"`` (an older top-level ``command`` is the command a benchmark timed)."""
    prov = record.get("provenance") if isinstance(record.get("provenance"), dict) else {}
    machines = [m for m in (prov.get("machine"), record.get("machine"), record.get("environment")) if isinstance(m, dict)]
    settings = (prov.get("settings"), record.get("settings"), record.get("setting"), record.get("protocol"))
    found = {
        "command": bool(prov.get("command")),
        "settings": any(isinstance(s, dict) and s for s in settings),
        "device": any(m.get("devices") or m.get("device") for m in machines),
        "versions": any(m.get("jax") for m in machines),
        "date": bool(prov.get("date") or record.get("date") or record.get("created")),
        "git commit": bool(prov.get("git_commit")),
    }
    return {field for field, ok in found.items() if ok}


def missing_provenance(report) -> list[str]:
    """The :data:`PROVENANCE_FIELDS` that ``report`` lacks, in that order; empty when it has them all.

    A file of several experiments (``"experiments"``, as ``merge_results`` writes them) is judged
    experiment by experiment, each the record of a run of its own; a field that some experiments
    lack but not all is named with them, as in ``"versions (mnist01)"``.
    """
    if not isinstance(report, dict):
        return list(PROVENANCE_FIELDS)
    experiments = report.get("experiments")
    if isinstance(experiments, dict) and experiments:
        records = {name: block if isinstance(block, dict) else {} for name, block in experiments.items()}
    else:
        records = {"": report}
    present = {name: _present_fields(record) for name, record in records.items()}
    missing = []
    for field in PROVENANCE_FIELDS:
        without = [name for name, fields in present.items() if field not in fields]
        if without:
            missing.append(field if len(without) == len(records) else f"{field} ({', '.join(sorted(without))})")
    return missing


def script_of(path: Path, report) -> Path | None:
    """The script that writes results file ``path``, looked up in the folder above the results
    folder: the one its provenance's command names, else ``<stem>.py``, the script of the stem it
    is an alias of, or the script its title names; None when there is none."""
    import re  # noqa: PLC0415

    scripts = path.resolve().parent.parent
    records = [report] if isinstance(report, dict) else []
    if records and isinstance(report.get("experiments"), dict):
        records += [block for block in report["experiments"].values() if isinstance(block, dict)]
    names = []
    for record in records:
        command = record.get("provenance", {}).get("command") if isinstance(record.get("provenance"), dict) else None
        if isinstance(command, list) and command and str(command[0]).endswith(".py"):
            names.append(Path(str(command[0])).name)
    names += [f"{path.stem}.py", f"{ALIASES.get(path.stem, path.stem)}.py"]
    names += re.findall(r"benchmarks/(\w+\.py)", TITLES.get(path.stem, ""))
    return next((scripts / name for name in names if (scripts / name).is_file()), None)


def declared_step(script: Path) -> str | None:
    """The module-level ``STEP_DESCRIPTION`` string of ``script``, read from its source with ``ast``
    (the script is not imported); None when it defines none. ``ValueError`` when it is not a
    string literal."""
    import ast  # noqa: PLC0415

    declared = None
    for node in ast.parse(script.read_text(encoding="utf-8"), filename=str(script)).body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if any(isinstance(target, ast.Name) and target.id == "STEP_DESCRIPTION" for target in targets):
            declared = ast.literal_eval(node.value)
            if not isinstance(declared, str):
                raise ValueError(f"STEP_DESCRIPTION of {script.name} is not a string")
    return declared


def stale_step(path: Path, report) -> str | None:
    """Why the step description results file ``path`` records is not the ``STEP_DESCRIPTION`` its
    script now declares; None when they are the same or the script declares none. A file of
    several experiments records it at the top or in every experiment."""
    script = script_of(path, report)
    if script is None:
        return None
    shown = f"{script.parent.name}/{script.name}"
    try:
        declared = declared_step(script)
    except (SyntaxError, ValueError) as exc:
        return f"the STEP_DESCRIPTION of {shown} cannot be read ({exc})"
    if declared is None:
        return None
    report = report if isinstance(report, dict) else {}
    experiments = report.get("experiments")
    if STEP_KEY not in report and isinstance(experiments, dict) and experiments:
        recorded = [block.get(STEP_KEY) if isinstance(block, dict) else None for block in experiments.values()]
    else:
        recorded = [report.get(STEP_KEY)]
    wrong = next((r for r in recorded if r != declared), declared)
    if wrong == declared:
        return None
    if wrong is None:
        older = f" (its description: {report['description']!r})" if isinstance(report.get("description"), str) else ""
        return f"records no {STEP_KEY}{older}; {shown} now runs {declared!r}"
    return f"records the step {wrong!r}; {shown} now runs {declared!r}"


def provenance_gaps(path: Path, report) -> list[str]:
    """What results file ``path`` lacks: :func:`missing_provenance`, and :data:`STALE_STEP` when its
    script declares a ``STEP_DESCRIPTION`` that the file does not record (:func:`stale_step`)."""
    return missing_provenance(report) + ([STALE_STEP] if stale_step(path, report) else [])


def provenance_problems(results_dir: Path) -> tuple[list[str], list[str]]:
    """``(errors, warnings)`` of ``--check`` for the results files in ``results_dir``, one line each.

    Errors: a file that cannot be read, or lacks provenance, or records a step description its
    script no longer runs, unless :data:`RECORDED_WITHOUT_PROVENANCE` lists it as lacking exactly
    that; a listed file that now lacks something else or nothing; for the repository's own results
    folder, a listed file that does not exist. Warnings: each listed file, with what it lacks.
    """
    listed = RECORDED_WITHOUT_PROVENANCE
    errors, warnings, stems = [], [], set()
    for path in sorted(results_dir.glob("*.json")):
        stems.add(path.stem)
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            errors.append(f"{path.name}: cannot be read, so records no provenance ({type(exc).__name__}: {exc})")
            continue
        missing, stale = missing_provenance(report), stale_step(path, report)
        gaps = ", ".join(missing + ([STALE_STEP] if stale else []))
        detail = f" ({stale})" if stale else ""
        if path.stem not in listed:
            if missing:
                errors.append(f"{path.name}: incomplete provenance: recorded without {', '.join(missing)}")
            if stale:
                errors.append(f"{path.name}: stale step description: {stale}")
        elif not gaps:
            errors.append(f"{path.name}: provenance now complete: remove {path.stem!r} from RECORDED_WITHOUT_PROVENANCE")
        elif gaps != listed[path.stem]:
            errors.append(f"{path.name}: recorded without {gaps}{detail}, but RECORDED_WITHOUT_PROVENANCE says "
                          f"{listed[path.stem]!r}: write what it lacks now")
        else:
            warnings.append(f"warning: {path.name}: recorded without {gaps}{detail}; accepted as recorded before "
                            "results carried their provenance, re-run to complete")
    if results_dir.resolve() == RESULTS.resolve():
        errors += [f"RECORDED_WITHOUT_PROVENANCE lists {stem!r}, which has no results file: remove it"
                   for stem in sorted(set(listed) - stems)]
    return errors, warnings


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--page", type=Path, default=PAGE, help="the Markdown page to update (default docs/results.md)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if the page's tables are out of date, or a results file lacks its provenance or records "
                             "a step description its script no longer declares (RECORDED_WITHOUT_PROVENANCE: accepted, "
                             "with a warning); write nothing")
    args = parser.parse_args(argv)
    text = args.page.read_text(encoding="utf-8")
    new = updated_page(text, render(args.results))
    if args.check:
        errors, warnings = provenance_problems(args.results)
        if new != text:
            errors.insert(0, f"{args.page}: the results tables are out of date; run benchmarks/summarise.py")
        for line in warnings + errors:
            print(line, file=sys.stderr)
        return 1 if errors else 0
    if new != text:
        args.page.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
