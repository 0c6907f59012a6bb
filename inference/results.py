"""What fitting and prediction return: :class:`FitResult`, :class:`Prediction`, :class:`ElboEstimate`.

:func:`assess_convergence` judges whether an objective trace has levelled off (the criterion is in
its docstring); :attr:`FitResult.convergence` and :attr:`FitResult.converged` apply it to a fit's
``objective_history``, so a saved and loaded fit carries its verdict without storing it.

:meth:`FitResult.summary` is the GPflow-style parameter table (``gpflow.utilities.print_summary``'s
columns: name, class, transform, prior, trainable, shape, dtype, value) of every hyperparameter and
variational parameter; :meth:`FitResult.parameter_info` is the same information as records, which
:func:`gpzoo.analysis.datatree.to_datatree` uses to decide where each parameter goes.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import math
from typing import Any

import numpy as np

from gpzoo.inference.scaling import Standardisation
from gpzoo.models.parameters import Fixed, Parameterised
from gpzoo.models.zoo import ModelSpec

__all__ = ["AUTO_MIN_STEPS", "CONVERGENCE_MIN_VALUES", "Convergence", "ElboEstimate", "FitResult", "ParameterInfo", "Prediction",
           "assess_convergence", "settled"]

#: Roles of a parameter (:attr:`ParameterInfo.role`).
TYPE_II, SAMPLED, FIXED, VARIATIONAL = "type-II", "sampled", "fixed", "variational"
#: Top-level site prefixes of the model's hyperparameters (kernel, likelihood); ``inducing.*``
#: (inducing inputs Z) are variational parameters of q(u) (Titsias 2009), not model hyperparameters.
HYPER_PREFIXES = ("kernel.", "likelihood.")
#: Suffixes NumPyro's ``AutoNormal`` gives the parameters of q(θ) for a sampled site θ.
_AUTO_SUFFIXES = ("_auto_loc", "_auto_scale")


@dataclasses.dataclass(frozen=True)
class ParameterInfo:
    """One row of :meth:`FitResult.summary`.

    ``name`` is the NumPyro site (``kernel.lengthscale``); ``owner`` the class holding it
    (``SquaredExponential``, ``InducingPosterior`` for q(u), ``AutoNormal`` for q(θ));
    ``role`` one of ``"type-II"`` (hyperparameter point estimate, ``numpyro.param``),
    ``"sampled"`` (hyperparameter with a prior, drawn from q(θ)), ``"fixed"`` (``Fixed``, never
    trained) or ``"variational"`` (q(u), inducing inputs, q(θ) and any other fitted parameter);
    ``value`` the constrained value (for a sampled one: the median of q(θ)).
    """

    name: str
    owner: str
    role: str
    constraint: str
    transform: str
    prior: str
    trainable: bool
    value: np.ndarray

    @property
    def is_hyperparameter(self) -> bool:
        return self.role in (TYPE_II, SAMPLED, FIXED)


# ----------------------------------------------------------------------------- convergence
#: Fewest recorded objective values :func:`assess_convergence` judges; a shorter trace gets no verdict (``None``).
CONVERGENCE_MIN_VALUES = 20
#: Share of the trace that forms its tail window (at least :data:`CONVERGENCE_MIN_WINDOW` values).
CONVERGENCE_TAIL = 0.25
CONVERGENCE_MIN_WINDOW = 10
#: Blocks the tail is cut into to see noise that is correlated from step to step (batch medians).
CONVERGENCE_BLOCKS = 10
#: Standard errors of noise the tail's rise may reach and still count as level (one-sided).
CONVERGENCE_Z = 3.0
#: Share of the run's own progress the tail's rise may reach and still count as level.
CONVERGENCE_RTOL = 0.01
#: Fewest steps a ``fit(steps="auto")`` run takes before it may stop (:func:`settled`): a
#: weighted-conv fit on rectangles sits on a plateau from step 20 to 60 before it climbs.
AUTO_MIN_STEPS = 500
#: Longest run the steps-needed estimate extrapolates to, in multiples of the steps run.
_EXTRAPOLATE_MAX = 100.0
_MAD_TO_SD = 1.4826  # σ of a Gaussian over its median absolute deviation
_MEDIAN_SE = math.sqrt(math.pi / 2)  # SE of a median of m Gaussian values, in units of σ/√m


@dataclasses.dataclass(frozen=True)
class Convergence:
    """The verdict of :func:`assess_convergence` on an objective trace, with the numbers behind it.

    ``converged``: True when the trace has levelled off, False when it is still rising, None when
    it is too short to judge (fewer than :data:`CONVERGENCE_MIN_VALUES` values; then the numbers
    are NaN). ``values``: the trace's length (one value per step); ``window``: the tail window
    (the last ``window`` values); ``tail_improvement``: the gain of the tail window's median over
    the median of the ``window`` values before it;
    ``noise``: the per-value noise scale (from step-to-step differences); ``standard_error``: that
    of ``tail_improvement``; ``progress``: the run's rise from its first window to its tail;
    ``threshold``: the rise above which the trace counts as still rising. ``steps_needed``: when
    not converged, the estimated total number of steps after which it would count as levelled off
    (``at_least``: a lower bound, for a trace whose rise is not slowing down); None otherwise.
    """

    converged: bool | None
    values: int
    window: int
    tail_improvement: float
    noise: float
    standard_error: float
    progress: float
    threshold: float
    steps_needed: int | None = None
    at_least: bool = False

    @property
    def further_steps(self) -> int | None:
        """``steps_needed`` less the steps run (None when converged or too short to judge)."""
        return None if self.steps_needed is None else max(self.steps_needed - self.values, 0)

    def needs(self) -> str:
        """``"about 2,400 steps"`` or ``"at least 600 steps"`` (empty when no more are needed)."""
        if self.steps_needed is None:
            return ""
        return f"{'at least' if self.at_least else 'about'} {self.steps_needed:,} steps"

    def describe(self, objective: str = "objective") -> str:
        """One sentence: the verdict and the numbers behind it."""
        if self.converged is None:
            return (f"{self.values} {objective} value(s) are too few to judge convergence "
                    f"(at least {CONVERGENCE_MIN_VALUES} are needed)")
        numbers = (f"after {self.values:,} steps, its last {self.window:,} gained {self.tail_improvement:.3g} over the "
                   f"{self.window:,} before; noise {self.noise:.3g} per step, threshold {self.threshold:.3g}")
        if self.converged:
            return f"the {objective} has levelled off ({numbers})"
        return f"the {objective} has not levelled off ({numbers}); it likely needs {self.needs()}"


def _mad_sd(x: np.ndarray) -> float:
    return _MAD_TO_SD * float(np.median(np.abs(x - np.median(x))))


@functools.lru_cache(maxsize=None)
def _quadratic_hat(k: int) -> np.ndarray:
    """The ``[k, k]`` matrix that maps k equally spaced values to their least-squares quadratic."""
    design = np.vander(np.linspace(-1.0, 1.0, k), min(3, k))
    return design @ np.linalg.pinv(design)


def _detrended(x: np.ndarray) -> np.ndarray:
    """``x`` less its least-squares line (what is left of a sequence once its steady change is removed)."""
    t = np.arange(x.size, dtype=float)
    t -= t.mean()
    return x - x.mean() - t * (float(t @ (x - x.mean())) / float(t @ t))


def assess_convergence(history, *, z: float = CONVERGENCE_Z, rtol: float = CONVERGENCE_RTOL,
                       estimate: bool = True) -> Convergence:
    """Whether the objective trace ``history`` (maximised; one value per step) has levelled off.

    With n values, the tail window is the last w = max(10, ⌈n/4⌉) values, and the window before it the w before those:

    * tail improvement Δ: the median of the tail window less the median of the window before it —
      how much the last quarter of the run gained over the quarter before (medians: a few wild
      minibatch or Monte Carlo values do not move it);
    * noise σ: 1.4826 · MAD / √6 of the second differences y[t+1] − 2 y[t] + y[t−1] over both
      windows, the per-step noise (a trend, even a curving one, barely moves second differences);
    * standard error of Δ: √2 times that of a window's median, the larger of 1.2533 · s / √w with s =
      max(σ, 1.4826 · MAD of the tail less its least-squares line) and the scatter of the medians of
      10 blocks of the tail about a quadratic over √10 (batch medians: noise correlated from step to
      step, such as parameters wandering about their optimum, which step-to-step differences miss);
    * progress P: the tail's median less the median of the first w values, how far the run has come
      (medians, so that a fast initial transient does not dominate).

    The trace has levelled off when Δ ≤ max(``z`` · s.e., ``rtol`` · P): its tail gained no more than
    noise explains (a one-sided test: with z = 3, about 0.1 % false alarms on a level trace with
    independent Gaussian noise), or less than ``rtol`` (1 %) of the run's own progress — the test
    that decides for an exact, noise-free objective (full-batch, closed-form ELBO), whose noise scale
    is about zero. A falling tail counts as level. Every quantity scales with the objective, so the
    verdict is the same for a·y + b (a > 0): the test is scale-free. Fewer than
    :data:`CONVERGENCE_MIN_VALUES` values (or non-finite ones) give no verdict (``converged=None``).

    Steps needed, for a trace still rising: Δ₀, the same gain one window earlier. When 0 < Δ < Δ₀
    the rise is slowing down and is extrapolated as an exponential approach to a limit (the gain
    per window shrinking by Δ/Δ₀), with the standard error shrinking as 1/√window and the progress
    growing by the extrapolated gain, to the first length (in 5 % increments, up to 100 n) at which
    the criterion would hold. This is a rough guide: a rise that is not slowing down, an
    extrapolation that meets the criterion within 2 n, or none that meets it, give the lower bound
    2 n (``at_least``); and fits that slow down in phases (q(u) first, then the hyperparameters)
    need more than the extrapolation of their latest phase.

    A trace that pauses on a plateau before rising again (a saddle: e.g. while the noise variance
    shrinks before the lengthscale moves) looks level while it pauses; no test of the trace alone
    can tell the two apart. ``estimate=False`` skips the steps-needed estimate (``steps_needed`` None).
    """
    y = np.asarray(history, dtype=float).ravel()
    n = int(y.size)
    if n < CONVERGENCE_MIN_VALUES or not np.all(np.isfinite(y)):
        nan = float("nan")
        return Convergence(None, n, 0, nan, nan, nan, nan, nan)
    w = max(CONVERGENCE_MIN_WINDOW, math.ceil(CONVERGENCE_TAIL * n))
    tail, before = y[n - w:], y[n - 2 * w:n - w]
    rise = float(np.median(tail) - np.median(before))
    noise = _mad_sd(np.diff(y[n - 2 * w:], 2)) / math.sqrt(6.0)
    spread = max(noise, _mad_sd(_detrended(tail)))
    # batch medians: the tail in blocks; their scatter about a smooth curve includes noise correlated over a block
    k = min(CONVERGENCE_BLOCKS, w)
    blocks = np.median(tail[w - k * (w // k):].reshape(k, w // k), axis=1)
    scatter = _mad_sd(blocks - _quadratic_hat(k) @ blocks)
    stderr = math.sqrt(2.0) * max(_MEDIAN_SE * spread / math.sqrt(w), scatter / math.sqrt(blocks.size))
    progress = float(np.median(tail) - np.median(y[:w]))
    threshold = max(z * stderr, rtol * max(progress, 0.0))
    converged = bool(rise <= threshold)
    steps_needed, at_least = ((None, False) if converged or not estimate
                              else _steps_needed(y, w, rise, stderr, progress, z, rtol))
    return Convergence(converged, n, w, rise, noise, stderr, progress, threshold, steps_needed, at_least)


def settled(history) -> bool:
    """The stopping rule of ``fit(steps="auto")``: the trace holds at least :data:`AUTO_MIN_STEPS`
    values, has levelled off (:func:`assess_convergence`) at its end, and had already at three
    quarters of its length.

    The second verdict asks the objective to have stayed level over the last ~60 % of the run
    (the earlier verdict compares [3n/8, 9n/16) with [9n/16, 3n/4)), and the minimum length keeps
    the windows long, so that a pause on a plateau (a saddle, which any test of the trace alone
    mistakes for the end; early in a fit, e.g. before the kernel's lengthscale moves, they are
    common) stops nothing. A function of the history alone: a resumed run stops where the
    uninterrupted one does.
    """
    y = np.asarray(history, dtype=float).ravel()
    return y.size >= AUTO_MIN_STEPS and bool(assess_convergence(y, estimate=False).converged) and bool(
        assess_convergence(y[:(3 * y.size) // 4], estimate=False).converged)


def _steps_needed(y: np.ndarray, w: int, rise: float, stderr: float, progress: float, z: float,
                  rtol: float) -> tuple[int, bool]:
    """(estimated total steps at which the criterion would hold, whether that is a lower bound)."""
    n = y.size
    earlier = (float(np.median(y[n - 2 * w:n - w]) - np.median(y[n - 3 * w:n - 2 * w])) if n >= 3 * w
               else float("nan"))
    if not (0.0 < rise < earlier):
        return 2 * n, True  # not slowing down (or too short to tell): at least as many steps again
    total = _extrapolated(n, w, rise, earlier, stderr, progress, z, rtol)
    return (2 * n, True) if total is None or total < 2 * n else (total, False)


def _extrapolated(n: int, w: int, rise: float, earlier: float, stderr: float, progress: float, z: float,
                  rtol: float) -> int | None:
    """The first length (5 % increments, up to 100 n) at which an exponential approach fitted to the
    last two rises between windows meets the criterion; None if none does."""
    decay = -math.log(rise / earlier) / w  # the level approaches its limit as -exp(-decay · t), t from step n

    def mean(start: float, width: int) -> float:  # mean level over [start, start + width), up to a common scale
        return -math.exp(-decay * start) * -math.expm1(-decay * width) / (decay * width)

    scale = rise / (mean(-w, w) - mean(-2 * w, w))
    length = float(n)
    while length < _EXTRAPOLATE_MAX * n:
        length *= 1.05
        total = math.ceil(length)
        w2 = max(CONVERGENCE_MIN_WINDOW, math.ceil(CONVERGENCE_TAIL * total))
        last = mean(total - n - w2, w2)
        rise2 = scale * (last - mean(total - n - 2 * w2, w2))
        progress2 = progress + scale * (last - mean(-w, w))
        if rise2 <= max(z * stderr * math.sqrt(w / w2), rtol * max(progress2, 0.0)):
            return total
    return None


@dataclasses.dataclass
class FitResult:
    """A fitted model: its spec, the inducing structure, the learned parameters and the traces.

    ``objective_history[t]`` is the objective the fitter maximised (``objective`` names it: the
    ELBO for SVI, the Pólya–Gamma bound for the natural-gradient fitter) at the parameters after
    t steps; ``step_size_history[t]`` the step size of step t (``step_size`` names it: the
    optimiser's learning rate, or the natural-gradient step ρ_t). ``family`` is the model family
    (e.g. :class:`gpzoo.inference.svgp.SVGP`) that holds the NumPyro model and guide.
    :attr:`converged` says whether the objective had levelled off by the last step (None: too few
    steps to judge) and :attr:`convergence` gives the numbers behind it (:func:`assess_convergence`).
    ``standardisation`` is the map ``fit(standardise=True)`` applied to the data
    (:class:`~gpzoo.inference.scaling.Standardisation`; None: none): ``X_train`` / ``y_train`` and
    the parameters are then in standardised units, ``objective_history`` in those of the data as passed.
    """

    spec: ModelSpec
    inducing: Any
    num_latent: int
    params: dict[str, np.ndarray]
    objective_history: np.ndarray
    step_size_history: np.ndarray
    diagnostics: dict[str, Any]
    num_data: int
    X_train: np.ndarray
    y_train: np.ndarray
    family: Any = dataclasses.field(repr=False, compare=False)
    seed: int = 0
    batch_size: int | None = None
    objective: str = "ELBO"
    step_size: str = "learning rate"
    standardisation: Standardisation | None = None

    @property
    def convergence(self) -> Convergence:
        """Whether ``objective_history`` has levelled off, and the numbers behind the verdict
        (:func:`assess_convergence`); computed from the history on each access, so a loaded fit has it too."""
        return assess_convergence(self.objective_history)

    @property
    def converged(self) -> bool | None:
        """True when the objective has levelled off, False when it was still rising at the last
        step, None when the trace is too short to judge (:attr:`convergence`)."""
        return self.convergence.converged

    @property
    def final_objective(self) -> float:
        """The last entry of ``objective_history`` (NaN for a fit of zero steps)."""
        return float(self.objective_history[-1]) if len(self.objective_history) else float("nan")

    def hyperparameters(self) -> dict[str, np.ndarray]:
        """Type-II point estimates of kernel/likelihood hyperparameters (constrained)."""
        return {k: v for k, v in self.params.items() if k.startswith(("kernel.", "likelihood."))}

    # ----------------------------------------------------------------- parameter table
    def parameter_info(self) -> list[ParameterInfo]:
        """Every hyperparameter (kernel, likelihood: type-II, sampled or fixed) and every fitted
        parameter in ``params``, in the order: hyperparameters, then variational parameters.

        Owners and priors come from the spec's objects (walked as ``Parameterised.realise`` names
        their sites); constraints from the ``numpyro.param`` sites the family itself declares
        (``family.parts()`` and the hyper guide, traced once), so they are never restated here.
        """
        sites = _declared_sites(self)
        rows: list[ParameterInfo] = []
        seen: set[str] = set()
        objects = (("kernel", self.spec.kernel), ("likelihood", self.spec.likelihood), ("inducing", self.inducing))
        for prefix, obj in objects:
            for name, owner, value in _walk(obj, prefix):
                seen.add(name)
                if isinstance(value, Fixed):
                    rows.append(_row(name, owner, FIXED, None, "", False, np.asarray(value.value)))
                elif _is_distribution(value):
                    median = _sampled_median(self.params, name, value)
                    rows.append(_row(name, owner, SAMPLED, value.support, _prior_text(value), True, median))
                elif name in self.params:
                    role = TYPE_II if name.startswith(HYPER_PREFIXES) else VARIATIONAL
                    rows.append(_row(name, owner, role, sites.get(name), "", True, self.params[name]))
        family_name = type(self.family).__name__ if self.family is not None else ""
        for name, value in self.params.items():
            if name in seen:
                continue
            if name in ("q_mu", "q_sqrt"):
                owner = "InducingPosterior"
            elif name.endswith(_AUTO_SUFFIXES):
                owner = "AutoNormal"
            else:
                owner = family_name
            rows.append(_row(name, owner, VARIATIONAL, sites.get(name), "", True, value))
        order = {TYPE_II: 0, SAMPLED: 0, FIXED: 0, VARIATIONAL: 1}
        return sorted(rows, key=lambda r: order[r.role])  # stable: spec order within each role

    def summary(self):
        """GPflow-style table (a pandas DataFrame indexed by ``name``) of every parameter.

        Columns: ``class`` (owner), ``role`` (type-II / sampled / fixed / variational),
        ``constraint``, ``transform`` (NumPyro's ``biject_to`` of the constraint, e.g. ``Exp``),
        ``prior``, ``trainable``, ``shape``, ``dtype`` and ``value`` (text; arrays shortened).
        """
        import pandas as pd  # noqa: PLC0415 - only needed for the table

        rows = [{"name": r.name, "class": r.owner, "role": r.role, "constraint": r.constraint,
                 "transform": r.transform, "prior": r.prior, "trainable": r.trainable,
                 "shape": tuple(int(n) for n in r.value.shape), "dtype": str(r.value.dtype),
                 "value": _short(r.value)} for r in self.parameter_info()]
        columns = ["name", "class", "role", "constraint", "transform", "prior", "trainable", "shape", "dtype", "value"]
        return pd.DataFrame(rows, columns=columns).set_index("name")

    def header(self, estimate: ElboEstimate | None = None) -> str:
        """One line: the model, its objective, the steps run and the last step size.

        Without ``estimate`` the objective is the trace's last value, which for a minibatch fit is
        a one-batch estimate (said so); with an :class:`ElboEstimate` (``evaluate_elbo``) it is that
        full-data estimate ± its Monte Carlo s.e., the value a comparison's ranking table shows.
        """
        steps = len(self.objective_history)
        if estimate is not None:
            value = f"{self.objective} {estimate.elbo:.6g} ± {estimate.stderr:.2g} (full data)"
        elif self.batch_size is not None and self.batch_size < self.num_data:
            value = f"{self.objective} {self.final_objective:.6g} (last step, one minibatch of {self.batch_size})"
        else:
            value = f"{self.objective} {self.final_objective:.6g}"
        rate = f", last {self.step_size} {float(self.step_size_history[-1]):.3g}" if len(self.step_size_history) else ""
        return f"{self.spec.name}: {value} after {steps} steps{rate}"

    def _repr_html_(self) -> str:
        table = self.summary().to_html(escape=True, border=0)
        return f"<p><strong>{html.escape(self.header())}</strong></p>\n{table}"


@dataclasses.dataclass
class Prediction:
    """q(f*) marginals ``[N, L]``, predictive moments of y, class probabilities, optional samples."""

    f_mean: np.ndarray
    f_var: np.ndarray
    y_mean: np.ndarray
    y_var: np.ndarray
    probs: np.ndarray | None = None
    f_samples: np.ndarray | None = None


@dataclasses.dataclass
class ElboEstimate:
    """Full-data ELBO with its Monte Carlo standard error (0 when every term is analytic)."""

    elbo: float
    stderr: float
    expected_log_lik: float
    kl: float
    num_samples: int
    draws: np.ndarray


# ----------------------------------------------------------------------------- parameter table helpers
def _is_distribution(value) -> bool:
    from numpyro.distributions import Distribution  # noqa: PLC0415 - keeps this module light

    return isinstance(value, Distribution)


def _walk(obj, prefix: str):
    """(site name, owner class name, field value) of every hyperparameter field of a
    ``Parameterised`` tree, named as :meth:`Parameterised.realise` names its sites."""
    if not isinstance(obj, Parameterised):
        return
    for f in dataclasses.fields(obj):
        if f.metadata.get("static"):
            continue
        value = getattr(obj, f.name)
        site = f"{prefix}.{f.name}"
        if isinstance(value, Parameterised):
            yield from _walk(value, site)
        elif isinstance(value, tuple) and value and all(isinstance(v, Parameterised) for v in value):
            for i, child in enumerate(value):
                yield from _walk(child, f"{site}.{i}")
        elif isinstance(value, Fixed) or _is_distribution(value) or "constraint" in f.metadata:
            yield site, type(obj).__name__, value


def _declared_sites(res: FitResult) -> dict:
    """Constraint of every ``numpyro.param`` site declared by ``family.parts()`` and the hyper guide."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    from numpyro.distributions import constraints  # noqa: PLC0415
    from numpyro.handlers import seed, substitute, trace  # noqa: PLC0415

    family = res.family
    out = {}
    programs = []
    if hasattr(family, "parts"):
        programs.append(lambda: family.parts())
    guide = getattr(family, "hyper_guide", None)
    if guide is not None:
        X1, y1 = jnp.asarray(res.X_train[:1]), jnp.asarray(res.y_train[:1])
        programs.append(lambda: guide(X1, y1, res.num_data))
    for program in programs:
        def declared(program=program):
            tr = trace(seed(substitute(program, data=res.params), rng_seed=0)).get_trace()
            out.update({name: site["kwargs"].get("constraint", constraints.real) for name, site in tr.items() if site["type"] == "param"})
            return 0

        jax.eval_shape(declared)  # traced only (abstract values): nothing is computed or compiled
    return out


def _row(name, owner, role, constraint, prior, trainable, value) -> ParameterInfo:
    return ParameterInfo(name=name, owner=owner, role=role, constraint=_constraint_text(constraint),
                         transform=_transform_text(constraint), prior=prior, trainable=trainable,
                         value=np.asarray(value))


def _constraint_text(constraint) -> str:
    if constraint is None:
        return ""
    text = repr(constraint).replace("(lower_bound=0.0)", "")
    return text[:-2] if text.endswith("()") else text


def _transform_text(constraint) -> str:
    if constraint is None:
        return ""
    from numpyro.distributions import biject_to  # noqa: PLC0415

    return type(biject_to(constraint)).__name__.removesuffix("Transform")


def _prior_text(prior) -> str:
    """``LogNormal(loc=0, scale=0.5)`` from a NumPyro distribution's parameters."""
    args = ", ".join(f"{k}={_short(getattr(prior, k))}" for k in prior.arg_constraints if hasattr(prior, k))
    return f"{type(prior).__name__}({args})"


def _sampled_median(params, name: str, prior) -> np.ndarray:
    """Median of q(θ) = AutoNormal: the constrained image of its location (NaN without one)."""
    from numpyro.distributions import biject_to  # noqa: PLC0415

    loc = params.get(f"{name}{_AUTO_SUFFIXES[0]}")
    if loc is None:
        return np.asarray(np.nan)
    return np.asarray(biject_to(prior.support)(loc))


def _short(value, max_items: int = 4) -> str:
    """A value as short text: scalars to 4 significant digits; arrays of more than ``max_items`` entries
    as their first and last two (flattened)."""
    a = np.asarray(value)
    if a.ndim == 0:
        return f"{a.item():.4g}" if a.dtype.kind in "fc" else str(a.item())
    if a.ndim > 1 and a.size > max_items:
        a = a.ravel()  # the shape has its own column: show the first and last entries only
    text = np.array2string(a, threshold=max_items, edgeitems=2, separator=", ", max_line_width=10**6,
                           formatter={"float_kind": lambda x: f"{x:.4g}"})
    return " ".join(text.split())
