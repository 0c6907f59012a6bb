"""Convergence, stated: every fit says whether its objective levelled off (FitResult.converged),
warns when it did not (ConvergenceWarning naming the model and the steps it likely needs), and
steps="auto" runs until it does.

The criterion (gpzoo.inference.results.assess_convergence): the median of the last quarter of the
trace against the median of the quarter before, compared with max(3 standard errors of that
difference from the trace's own noise, 1 % of the run's progress).
"""

import warnings

import numpy as np
import pytest

from gpzoo.analysis import cli
from gpzoo.inference import fit, load, save
from gpzoo.inference.checkpoint import load_checkpoint
from gpzoo.inference.programs import CompileCounter
from gpzoo.inference.results import AUTO_MIN_STEPS, CONVERGENCE_MIN_VALUES, assess_convergence, settled
from gpzoo.models import zoo
from gpzoo.models.errors import ConvergenceWarning, InvalidArgumentError

CHUNK = 25  # fit's default chunk_size: where steps="auto" tests the trace


# ----------------------------------------------------------------------------- synthetic traces
def _approach(n, tau=200.0, height=100.0, noise=0.0, seed=0):
    """An exponential approach to a plateau, ``height`` · (1 − exp(−t/τ)), plus Gaussian noise."""
    t = np.arange(n, dtype=float)
    return height * -np.expm1(-t / tau) + noise * np.random.default_rng(seed).normal(size=n)


@pytest.mark.parametrize("noise", [0.0, 1.0])
def test_exponential_approach_is_flagged_before_its_plateau_and_not_after(noise):
    y = _approach(3000, noise=noise)
    for n in (150, 400, 800):  # 0.75τ to 4τ: still rising (by 53, 13 and 1.8 over the last quarter of 800)
        verdict = assess_convergence(y[:n])
        assert verdict.converged is False, (n, verdict)
        assert verdict.steps_needed > n and verdict.further_steps == verdict.steps_needed - n
    assert assess_convergence(y).converged is True  # 15τ: within 3e-5 of the plateau
    # scale-free: the verdict of a·y + b is that of y, its numbers scale with a
    for a, b in ((1e-3, -5e4), (250.0, 3.0)):
        for n in (400, 3000):
            base, scaled = assess_convergence(y[:n]), assess_convergence(a * y[:n] + b)
            assert scaled.converged == base.converged
            assert scaled.tail_improvement == pytest.approx(a * base.tail_improvement, rel=1e-6, abs=1e-9)


def test_steps_needed_of_an_exponential_approach_is_close_to_where_it_levels_off():
    y = _approach(4000)
    levels_off = next(n for n in range(CONVERGENCE_MIN_VALUES, y.size + 1, 10) if assess_convergence(y[:n]).converged)
    assert 1000 < levels_off < 3000
    for n in (200, 400, 800):
        verdict = assess_convergence(y[:n])
        assert not verdict.at_least
        assert 0.75 * levels_off < verdict.steps_needed < 1.25 * levels_off, (n, verdict.steps_needed, levels_off)


@pytest.mark.parametrize("kind", ["gaussian", "student-t2", "outliers"])
def test_pure_noise_has_levelled_off(kind):
    flagged = 0
    for seed in range(50):
        rng = np.random.default_rng(seed)
        if kind == "gaussian":
            y = 7.0 * rng.normal(size=1000) - 300.0
        elif kind == "student-t2":  # heavy tails: infinite variance
            y = rng.standard_t(2, size=1000)
        else:  # a Monte Carlo ELBO with rare wild draws
            y = rng.normal(size=1000)
            y[rng.choice(1000, 20, replace=False)] -= 1e4
        verdict = assess_convergence(y)
        flagged += verdict.converged is not True
        assert verdict.steps_needed is None or verdict.converged is False
    assert flagged == 0


def test_linear_climb_has_not_levelled_off_and_needs_at_least_twice_the_steps():
    rng = np.random.default_rng(0)
    y = 0.01 * np.arange(2000) + rng.normal(size=2000)  # rises 5 over the last quarter, noise 1 per step
    verdict = assess_convergence(y)
    assert verdict.converged is False and verdict.at_least and verdict.steps_needed == 4000
    assert "at least 4,000 steps" in verdict.describe("ELBO")
    assert assess_convergence(-y).converged is True  # a falling trace is not still rising


def test_short_or_non_finite_traces_get_no_verdict():
    assert assess_convergence(np.arange(CONVERGENCE_MIN_VALUES - 1.0)).converged is None
    assert assess_convergence(np.arange(float(CONVERGENCE_MIN_VALUES))).converged is False
    assert assess_convergence([]).converged is None
    y = _approach(100)
    y[50] = np.nan
    verdict = assess_convergence(y)
    assert verdict.converged is None and "too few" in verdict.describe()


def test_a_pause_on_a_plateau_does_not_stop_an_automatic_run():
    # a first rise (τ = 100), a pause from step ~600 (a saddle), then a second rise from step 1125
    t = np.arange(10000.0)
    y = 50 * -np.expm1(-t / 100) + 50 * -np.expm1(-np.clip(t - 1125, 0, None) / 375)
    y += 0.2 * np.random.default_rng(0).normal(size=t.size)
    assert assess_convergence(y[:1125]).converged is True  # while it pauses, no test of the trace can tell
    assert not any(settled(y[:n]) for n in range(CHUNK, 1126, CHUNK))  # the stopping rule waits
    assert settled(y)
    # and never stops before AUTO_MIN_STEPS, however level the start (weighted-conv pauses from step 20 to 60)
    assert not settled(np.zeros(AUTO_MIN_STEPS - 1)) and settled(np.zeros(AUTO_MIN_STEPS))


# ----------------------------------------------------------------------------- fits
@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (100, 1))
    return X, np.sin(2 * X[:, 0]) + 0.1 * rng.normal(size=100)


@pytest.fixture(scope="module")
def spec():
    return zoo.get("svgp-rbf", input_dim=1, num_inducing=8)


def test_a_short_fit_is_flagged_and_warns_naming_the_model(precision, data, spec):
    # full-batch Adam at 0.03 levels off after ~1,200 steps (measured in float32 and float64)
    with pytest.warns(ConvergenceWarning, match=r"svgp-rbf: the ELBO has not levelled off .* it likely needs") as record:
        res = fit(spec, *data, steps=20, learning_rate=0.03, progress=False)
    assert res.converged is False
    warning = [w.message for w in record if isinstance(w.message, ConvergenceWarning)][0]
    assert warning.model == "svgp-rbf" and warning.steps == 20 and warning.steps_needed >= 40
    assert warning.steps_needed == res.convergence.steps_needed
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        assert fit(spec, *data, steps=CONVERGENCE_MIN_VALUES - 1, progress=False).converged is None  # too short: no verdict


def test_a_converged_fit_is_not_flagged_and_does_not_warn(precision, data, spec, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        res = fit(spec, *data, steps=4000, learning_rate=0.05, progress=False)
    assert res.converged is True and res.convergence.steps_needed is None
    # the verdict is a function of the saved history: a loaded fit has the same
    save(res, tmp_path / "model")
    assert load(tmp_path / "model").convergence == res.convergence


def test_auto_stops_where_a_long_run_levels_off_and_compiles_nothing_new(precision, data, spec, tmp_path):
    """'Levels off' is the stopping rule itself (settled: the criterion holds at the end and at three
    quarters of the trace), applied to the long run's trace at every chunk end; an independent
    check follows: the stopped run's ELBO (median of its last 100 steps) is within 0.5 % of the long
    run's progress (median of its last 500 steps less that of its first 500) of the long run's final level."""
    kw = dict(learning_rate=0.05, progress=False, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        long = fit(spec, *data, steps=6000, **kw).objective_history
    levels_off = next(n for n in range(CHUNK, long.size + 1, CHUNK) if settled(long[:n]))
    with CompileCounter() as counter, warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        auto = fit(spec, *data, steps="auto", checkpoint_dir=tmp_path / "ck", **kw)
    assert counter.count == 0  # the chunks of an automatic run are those of a fixed one
    stopped = len(auto.objective_history)
    assert abs(stopped - levels_off) <= 0.1 * levels_off
    np.testing.assert_allclose(auto.objective_history, long[:stopped], rtol=1e-5)
    assert auto.converged is True and auto.diagnostics["steps"] == stopped
    assert auto.diagnostics["auto_steps"] == {"max_steps": 10_000, "stopped": "levelled off"}
    final, progress = np.median(long[-500:]), np.median(long[-500:]) - np.median(long[:500])
    assert abs(np.median(auto.objective_history[-100:]) - final) < 0.005 * progress  # measured: 0.06 and 0.1 of 41
    # the stop is checkpointed, and resuming the finished automatic run changes nothing
    assert load_checkpoint(tmp_path / "ck")[0]["step"] == stopped
    resumed = fit(spec, *data, steps="auto", checkpoint_dir=tmp_path / "ck", resume=True, **kw)
    np.testing.assert_array_equal(resumed.objective_history, auto.objective_history)


def test_auto_stops_at_max_steps_and_warns(data, spec):
    with pytest.warns(ConvergenceWarning, match="svgp-rbf"):
        res = fit(spec, *data, steps="auto", max_steps=60, learning_rate=0.01, progress=False)
    assert len(res.objective_history) == 60 and res.converged is False
    assert res.diagnostics["auto_steps"] == {"max_steps": 60, "stopped": "max_steps"}


@pytest.mark.parametrize("bad", [dict(steps="forever"), dict(steps="auto", max_steps=0), dict(steps=-1)])
def test_bad_step_settings_are_refused_by_name(data, spec, bad):
    with pytest.raises(InvalidArgumentError, match="steps"):
        fit(spec, *data, progress=False, **bad)


# ----------------------------------------------------------------------------- command line
def test_command_line_takes_steps_auto_and_names_unconverged_models(data, spec, capsys):
    parser = cli.build_parser()
    assert parser.parse_args(["compare", "--out", "x", "--steps", "auto"]).steps == "auto"
    assert parser.parse_args(["compare", "--out", "x", "--steps", "30"]).steps == 30
    with pytest.raises(cli.UsageError, match="'auto'"):
        parser.parse_args(["compare", "--out", "x", "--steps", "soon"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        short = fit(spec, *data, steps=30, progress=False)
        done = fit(spec, *data, steps=4000, learning_rate=0.05, progress=False)
    cli._print_unconverged({("svgp-rbf", 0): short, ("svgp-rbf", 1): done}, True, None)
    out = capsys.readouterr().out
    assert "warning: svgp-rbf (seed 0) has not converged" in out and "(seed 1)" not in out
    assert "--steps auto" in out
