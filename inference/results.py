"""What fitting and prediction return: :class:`FitResult`, :class:`Prediction`, :class:`ElboEstimate`.

:meth:`FitResult.summary` is the GPflow-style parameter table (``gpflow.utilities.print_summary``'s
columns: name, class, transform, prior, trainable, shape, dtype, value) of every hyperparameter and
variational parameter; :meth:`FitResult.parameter_info` is the same information as records, which
:func:`gpzoo.analysis.datatree.to_datatree` uses to decide where each parameter goes.
"""

from __future__ import annotations

import dataclasses
import html
from typing import Any

import numpy as np

from gpzoo.models.parameters import Fixed, Parameterised
from gpzoo.models.zoo import ModelSpec

__all__ = ["ElboEstimate", "FitResult", "ParameterInfo", "Prediction"]

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


@dataclasses.dataclass
class FitResult:
    """A fitted model: its spec, the inducing structure, the learned parameters and the traces.

    ``objective_history[t]`` is the objective the fitter maximised (``objective`` names it: the
    ELBO for SVI, the Pólya–Gamma bound for the natural-gradient fitter) at the parameters after
    t steps; ``step_size_history[t]`` the step size of step t (``step_size`` names it: the
    optimiser's learning rate, or the natural-gradient step ρ_t). ``family`` is the model family
    (e.g. :class:`gpzoo.inference.svgp.SVGP`) that holds the NumPyro model and guide.
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

    def header(self) -> str:
        """One line: model, objective (final value) and number of steps."""
        steps = len(self.objective_history)
        return f"{self.spec.name}: {self.objective} {self.final_objective:.6g} after {steps} steps ({self.step_size})"

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
