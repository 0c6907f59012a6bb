"""Kernel structure search: the cookbook's grammar searched by marginal likelihood.

A greedy compositional search (Duvenaud, Lloyd, Grosse, Tenenbaum, Ghahramani 2013, §3–4; the
change operators of Lloyd, Duvenaud, Grosse, Tenenbaum, Ghahramani 2014, §3):

1. depth 1 fits every base kernel on every input column;
2. each later depth expands the ``beam`` best structures of the previous depth by every
   production — S → S + B, a summand T → T × B (and S → S × B), B → B′ (replace one base),
   S → CP(S, S), S → CW(S, S), and S → CP(S, B), S → CP(B, S) (a change between the structure and
   a base, as Lloyd et al. 2014's S → CW(S, C)) along each column — reduces every result to its canonical form
   (:func:`gpzoo.models.grammar.canonical`) and fits only the structures not fitted before;
3. the search returns the best structure of all depths.

Each candidate's hyperparameters (and the Gaussian noise variance) are optimised from ``restarts``
initial points by L-BFGS: the restarts' losses and gradients are evaluated together (``vmap``)
in compiled programs keyed by the structure and the data's shapes (compiled once, then reused by
every later search), and each restart's L-BFGS bookkeeping runs on the host. Initial points come
from the data (Duvenaud et al. 2013, §4; Lloyd et al. 2014, §4): lengthscales around the input's
spread, periods at the peaks of the Lomb–Scargle periodogram of y less its linear trend, variances from y's variance, change locations inside
the input range; the first restart is the typical value, the others are random around it. With
``continue_parents=True`` a structure expanded from a parent also continues the parent's fit, as
Duvenaud 2014 (ch. 1, "Scoring kernel families") does: every hyperparameter the parent had, and
the noise, starts at the parent's optimum on one extra restart, and only the newly introduced ones
start at their typical values. A restart stops when its log marginal moves by less than a micro-nat in a step or
1e-4 nats over five steps. A
candidate is scored by the Bayesian information criterion BIC = −2 log p(y | θ̂) + p log N
(Duvenaud et al. 2013, §4; p counts the free hyperparameters and the noise variance; lower is
better), from the exact log marginal likelihood for N ≤ ``exact_max`` and from the collapsed
bound (Titsias 2009, eq. 9) with ``num_inducing`` inputs above; the score used is named in the
result (``score``).

Non-Gaussian data (``likelihood=Bernoulli()`` for labels in {0, 1}, ``Poisson()`` for counts) is
scored by ``"bic-svgp"``: −2 ELBO + p log N with the full-batch SVGP bound
(:func:`gpzoo.inference.exact.svgp_elbo`; Hensman et al. 2015) in place of the log
marginal likelihood, which has no closed form. A whitened q(u) on ``num_inducing`` (default 32)
evenly spaced training inputs is optimised by the same L-BFGS jointly with the hyperparameters,
from q(u) = p(u); p counts the hyperparameters only (q is variational, not a model parameter).
The bound is below the log marginal likelihood, by a gap that differs between structures, so
this BIC is an approximation the way the collapsed one is. The data-driven initial values come
from a latent proxy of y (2y − 1 for labels, log((y + ½)/binsize) for counts); the latent GP has
zero mean, so counts far from ``binsize`` per bin need a C (constant) base or a ``binsize`` near
their mean.

The best structure is an ordinary gpzoo model: :meth:`SearchResult.spec` is a sparse variational
GP with that kernel, initialised at the search's hyperparameters, for :func:`gpzoo.fit` and
:func:`gpzoo.compare`; :meth:`SearchResult.predict` and :meth:`SearchResult.decomposition`
give the exact posterior and its additive components (Duvenaud 2014, eq. 1.17–1.18).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
import zlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
from numpyro import handlers
from numpyro.distributions import constraints
from numpyro.distributions.transforms import biject_to

from gpzoo.inference.exact import collapsed_elbo, exact_log_marginal, svgp_elbo, whitened_moments
from gpzoo.models.errors import DataError, InvalidArgumentError, as_float_array, check_integer, unknown_name_message
from gpzoo.models.kernels.base import Fixed
from gpzoo.models.grammar import (
    BASE_KERNELS, Add, Base, Change, Expression, Mul, canonical, parse, summands, to_kernel)

__all__ = ["SCORES", "Candidate", "SearchResult", "describe", "expand", "heldout_metrics", "search", "verdict", "write_report"]

#: Score names: BIC from the exact log marginal likelihood, from Titsias' collapsed bound, or from the SVGP
#: bound of a non-Gaussian likelihood.
SCORES = ("bic-exact", "bic-collapsed", "bic-svgp")
#: Inducing inputs of the SVGP bound when ``num_inducing`` is not given (the collapsed bound's default is 200).
DEFAULT_SVGP_INDUCING = 32
#: Sites of the variational q(v) of the SVGP score (optimised with the hyperparameters, not counted in BIC's p).
_VARIATIONAL = ("q_mu", "q_sqrt")
DEFAULT_BASES = ("SE", "Per", "Lin", "RQ")
#: From this many points on, the optimiser drops its finished restarts from the batch (see ``_optimise``).
COMPACT_MIN_POINTS = 256
#: A restart stops when its log marginal gained less than STALL_NATS over its last STALL_STEPS steps: at
#: that pace the rest of its budget could not move its BIC by a hundredth of a unit.
STALL_STEPS, STALL_NATS = 5, 1e-4
BACKENDS = ("sequential", "ray")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One fitted structure of the search trace."""

    expression: str
    depth: int
    parent: str | None
    score: float  # BIC (lower is better)
    log_marginal: float  # the exact log marginal likelihood, the collapsed bound, or the SVGP bound
    num_params: int
    restarts: int
    failed_restarts: int
    seconds: float
    hyperparameters: dict  # site name -> value (lists), the best restart's

    def row(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "hyperparameters"}


# ----------------------------------------------------------------------------- productions
def _bases(names: Sequence[str], num_dims: int) -> list[Base]:
    return [Base(name, d) for d in range(num_dims) for name in names]


def _replace_bases(expression: Expression, alternatives: Sequence[str]):
    """Every expression with one base occurrence replaced by another base on the same column."""
    if isinstance(expression, Base):
        for name in alternatives:
            if name != expression.name:
                yield Base(name, expression.dim)
    elif isinstance(expression, (Add, Mul)):
        parts = expression.terms if isinstance(expression, Add) else expression.factors
        for i, part in enumerate(parts):
            for new in _replace_bases(part, alternatives):
                yield type(expression)(parts[:i] + (new,) + parts[i + 1:])
    elif isinstance(expression, Change):
        for new in _replace_bases(expression.first, alternatives):
            yield dataclasses.replace(expression, first=new)
        for new in _replace_bases(expression.second, alternatives):
            yield dataclasses.replace(expression, second=new)


def expand(expression: Expression, names: Sequence[str], num_dims: int, changes: bool = True) -> list[Expression]:
    """The canonical, distinct structures one production away from ``expression`` (module docstring)."""
    bases = _bases(names, num_dims)
    out = []
    terms = summands(expression)
    for b in bases:
        out.append(expression + b)
        out.append(expression * b)
        if len(terms) > 1:
            for i, term in enumerate(terms):
                out.append(Add(terms[:i] + (term * b,) + terms[i + 1:]))
    out.extend(_replace_bases(expression, names))
    if changes:
        for d in range(num_dims):
            out.append(Change("CP", expression, expression, d))
            out.append(Change("CW", expression, expression, d))
            for b in bases:  # a change between the structure and a base, either way round
                out.append(Change("CP", expression, b, d))
                out.append(Change("CP", b, expression, d))
    seen, result = set(), []
    for candidate in out:
        c = canonical(candidate, noise=True)
        if c not in seen and c != expression:
            seen.add(c)
            result.append(c)
    return result


# ----------------------------------------------------------------------------- initial points
class _Initial:
    """Data-driven initial hyperparameters for one restart (module docstring)."""

    def __init__(self, stats: dict, rng: np.random.Generator | None, restart: int):
        self.stats, self.rng, self.restart = stats, rng, restart

    def _jitter(self, scale: float) -> float:
        return 1.0 if self.rng is None else float(np.exp(self.rng.normal(0.0, scale)))

    def __call__(self, name: str, dim: int, field: str) -> float:
        s = self.stats
        spread, lo, hi = s["spread"][dim], s["low"][dim], s["high"][dim]
        width = max(hi - lo, 1e-12)
        if field == "variance":
            return s["y_var"] / 2.0 * self._jitter(0.5)
        if field == "lengthscale":
            return (1.0 * self._jitter(0.5)) if name == "Per" else spread / 2.0 * self._jitter(1.0)
        if field == "period":
            periods = s["periods"][dim]
            return periods[self.restart % len(periods)] * self._jitter(0.02)
        if field == "alpha":
            return self._jitter(1.0)
        if field == "offset":
            return s["mean"][dim] + (0.0 if self.rng is None else float(self.rng.normal(0.0, spread)))
        if field == "location":
            return (lo + hi) / 2.0 if self.rng is None else float(self.rng.uniform(lo + 0.1 * width, hi - 0.1 * width))
        if field == "steepness":
            return 20.0 / width * self._jitter(0.5)
        if field == "width":
            return width / 4.0 * self._jitter(0.5)
        raise InvalidArgumentError("field", f"no initial value for {name}.{field}")  # pragma: no cover


def _periodogram_periods(x: np.ndarray, y: np.ndarray, count: int = 4) -> list[float]:
    """The periods of the ``count`` highest peaks of the Lomb–Scargle periodogram of y(x) less its linear trend."""
    from scipy.signal import find_peaks, lombscargle  # noqa: PLC0415

    order = np.argsort(x)
    x, y = x[order], y[order]
    y = y - np.polyval(np.polyfit(x, y, 1), x) if np.ptp(x) > 0 else y - y.mean()  # a trend's leakage hides the peaks
    span = x[-1] - x[0]
    gaps = np.diff(x)
    step = np.median(gaps[gaps > 0]) if np.any(gaps > 0) else span
    if span <= 0 or not np.isfinite(step):
        return [1.0]
    periods = np.geomspace(2.5 * step, span / 2.0, 400) if span / 2.0 > 2.5 * step else np.array([span / 2.0])
    power = lombscargle(x, y, 2.0 * np.pi / periods)
    peaks, _ = find_peaks(power)
    ranked = peaks[np.argsort(power[peaks])[::-1]][:count] if len(peaks) else [int(np.argmax(power))]
    return [float(periods[i]) for i in ranked]


def _latent_proxy(y: np.ndarray, likelihood) -> np.ndarray:
    """What the latent f looks like, for initial values: y itself (Gaussian), 2y − 1 (labels), log((y + ½)/binsize) (counts)."""
    if likelihood is None:
        return y
    if _likelihood_key(likelihood)[0] == "bernoulli":
        return 2.0 * y - 1.0
    return np.log((y + 0.5) / float(likelihood.binsize))


def _data_stats(X: np.ndarray, y: np.ndarray) -> dict:
    return {
        "spread": [float(max(X[:, d].std(), 1e-12)) for d in range(X.shape[1])],
        "low": [float(X[:, d].min()) for d in range(X.shape[1])],
        "high": [float(X[:, d].max()) for d in range(X.shape[1])],
        "mean": [float(X[:, d].mean()) for d in range(X.shape[1])],
        "periods": [_periodogram_periods(X[:, d], y) for d in range(X.shape[1])],
        "y_var": float(y.var()),
    }


# ----------------------------------------------------------------------------- the compiled program
@dataclasses.dataclass(frozen=True)
class _Structure:
    """What a candidate's compiled program depends on besides array values (its static argument):
    the structure, the score and, for ``"bic-svgp"``, the likelihood's description (:func:`_likelihood_key`)."""

    expression: Expression
    score: str
    likelihood: tuple = ()


#: Likelihoods the SVGP score takes: their static fields, the key of the compiled programs
_LIKELIHOOD_FIELDS = {"Bernoulli": ("bernoulli", ("link", "num_gauss_hermite")), "Poisson": ("poisson", ("binsize", "num_gauss_hermite"))}


def _likelihood_key(likelihood) -> tuple:
    """A hashable, value-compared description of a Bernoulli or Poisson likelihood (its static fields)."""
    kind, fields = _LIKELIHOOD_FIELDS[type(likelihood).__name__]
    return (kind, tuple((f, float(getattr(likelihood, f)) if f == "binsize" else getattr(likelihood, f)) for f in fields))


def _likelihood_of(key: tuple):
    from gpzoo.models.likelihoods import Bernoulli, Poisson  # noqa: PLC0415

    return {"bernoulli": Bernoulli, "poisson": Poisson}[key[0]](**dict(key[1]))


def _sites(kernel) -> dict:
    """``{site name: (initial value, constraint)}`` of the kernel's trainable hyperparameters."""
    trace = handlers.trace(lambda: kernel.realise("kernel")).get_trace()
    return {name: (site["value"], site["kwargs"]["constraint"]) for name, site in trace.items() if site["type"] == "param"}


@functools.lru_cache(maxsize=4096)
def _constraints(expression: Expression) -> dict:
    """``{site name: constraint}`` of the expression's kernel (evaluated outside any trace)."""
    with jax.ensure_compile_time_eval():
        return {name: constraint for name, (_, constraint) in _sites(to_kernel(expression)).items()}


def _kernel_at(expression: Expression, constrained: dict):
    """The expression's kernel with hyperparameters ``constrained`` (traced values allowed)."""
    template = to_kernel(expression)
    return handlers.substitute(lambda: template.realise("kernel"), data=constrained)()


def _constrain(expression: Expression, unconstrained: dict) -> tuple[dict, jax.Array | float]:
    values = {name: biject_to(constraint)(unconstrained[name]) for name, constraint in _constraints(expression).items()}
    return values, jnp.exp(unconstrained["noise"]) if "noise" in unconstrained else jnp.nan


def _q_sqrt(unconstrained):
    """The lower-triangular factor of q(v) from its unconstrained entries (``[..., M(M+1)/2]`` -> ``[..., M, M]``)."""
    return biject_to(constraints.lower_cholesky)(unconstrained)


def _log_marginal(structure: _Structure, unconstrained: dict, X, y, Z, noise_floor):
    values, noise = _constrain(structure.expression, unconstrained)
    kernel = _kernel_at(structure.expression, values)
    if structure.score == "bic-svgp":
        return svgp_elbo(kernel, _likelihood_of(structure.likelihood), Z, unconstrained["q_mu"],
                         _q_sqrt(unconstrained["q_sqrt"]), X, y)
    noise = noise + noise_floor
    if structure.score == "bic-exact":
        return exact_log_marginal(kernel, noise, X, y)
    return collapsed_elbo(kernel, noise, Z, X, y)


def _loss(structure: _Structure, u: dict, X, y, Z, noise_floor):
    """−log p(y | θ) / N for one restart's unconstrained ``u`` (+inf where it is not finite)."""
    value = -_log_marginal(structure, u, X, y, Z, noise_floor) / X.shape[0]
    return jnp.where(jnp.isfinite(value), value, jnp.inf)


@functools.partial(jax.jit, static_argnames=("structure",))
def _batched_loss(structure: _Structure, U: dict, X, y, Z, noise_floor):
    """The loss of every restart (leading axis of ``U``'s leaves) in one program: ``[R]``."""
    return jax.vmap(lambda u: _loss(structure, u, X, y, Z, noise_floor))(U)


@functools.partial(jax.jit, static_argnames=("structure",))
def _batched_loss_and_grad(structure: _Structure, U: dict, X, y, Z, noise_floor):
    """Loss ``[R]`` and gradient (``U``'s structure) of every restart in one program."""
    return jax.vmap(jax.value_and_grad(lambda u: _loss(structure, u, X, y, Z, noise_floor)))(U)


def _flat(U: dict) -> np.ndarray:
    return np.concatenate([np.asarray(U[k], np.float64).reshape(len(U[k]), -1) for k in sorted(U)], axis=1)


def _unflat(flat: np.ndarray, like: dict, dtype) -> dict:
    out, start = {}, 0
    for k in sorted(like):
        shape = like[k].shape[1:]
        size = int(np.prod(shape))
        out[k] = jnp.asarray(flat[:, start:start + size].reshape((len(flat), *shape)), dtype)
        start += size
    return out


def _two_loop(g: np.ndarray, S: list, Y: list) -> np.ndarray:
    """L-BFGS's two-loop recursion (Nocedal & Wright 2006, alg. 7.4): H g for one restart."""
    q, alphas = g.copy(), []
    for s, yv in reversed(list(zip(S, Y))):
        a = (s @ q) / (yv @ s)
        alphas.append(a)
        q -= a * yv
    if S:
        q *= (S[-1] @ Y[-1]) / (Y[-1] @ Y[-1])
    for (s, yv), a in zip(zip(S, Y), reversed(alphas)):
        q += s * (a - (yv @ q) / (yv @ s))
    return q


def _optimise(structure: _Structure, u0: dict, X, y, Z, noise_floor, steps: int, memory: int = 10):
    """L-BFGS with a backtracking (Armijo) line search on every restart at once; returns the final
    unconstrained points and log marginals ``[R]``.

    The restarts' losses and gradients are evaluated together (``vmap``) in one compiled program per
    structure, and their trial points in another; the L-BFGS bookkeeping of each restart (its
    curvature pairs, step lengths and stopping) is its own, on the host, so a restart ends where it
    would end alone (up to the rounding of the batched arithmetic). On ``COMPACT_MIN_POINTS`` points
    or more, once at most half the restarts are still live, only theirs are evaluated, in a batch of
    half the size."""
    dtype = u0[next(iter(u0))].dtype
    U = _flat(u0)
    R = len(U)
    # once at most half the restarts are still moving on a data set this large, evaluate only theirs
    # (a batch of R // 2, padded by repeating one): a second pair of programs, paid for by the rest
    # of the run's arithmetic; smaller data sets keep the one batch, whose calls cost little
    half = R // 2 if X.shape[0] >= COMPACT_MIN_POINTS else 0

    def evaluate(program, V, mask):
        """``program`` on every restart, or, once few are live, on the ``mask``'s (padded to ``half``):
        its outputs flattened to ``[R, ...]`` with NaN for the restarts not evaluated."""
        if np.count_nonzero(live) > half:
            return [np.array(v, np.float64) for v in program(structure, _unflat(V, u0, dtype), X, y, Z, noise_floor)]
        chosen = np.flatnonzero(mask)
        index = np.concatenate([chosen, np.repeat(chosen[:1], half - len(chosen))])
        outs = []
        for v in program(structure, _unflat(V[index], u0, dtype), X, y, Z, noise_floor):
            v = np.asarray(v, np.float64)
            full = np.full((R, *v.shape[1:]), np.nan)
            full[index] = v
            outs.append(full)
        return outs

    def values(V, mask):
        return evaluate(lambda *args: (_batched_loss(*args),), V, mask)[0]

    def values_and_grads(V, mask):
        f, g = evaluate(lambda *args: (lambda fg: (fg[0], _flat(fg[1])))(_batched_loss_and_grad(*args)), V, mask)
        return f, g

    live = np.ones(R, bool)
    f, g = values_and_grads(U, live)
    live = np.isfinite(f) & np.all(np.isfinite(g), axis=1)
    history: list[tuple[list[np.ndarray], list[np.ndarray]]] = [([], []) for _ in range(R)]
    gains: list[list[float]] = [[] for _ in range(R)]  # each restart's last steps' gains in log marginal (nats)
    for _ in range(steps):
        if not live.any():
            break
        d = np.zeros_like(U)
        for r in np.flatnonzero(live):
            S, Yh = history[r]
            d[r] = -_two_loop(g[r], S, Yh) if S else -g[r] / max(1.0, float(np.linalg.norm(g[r])))
            if g[r] @ d[r] >= 0:  # not a descent direction: restart from steepest descent
                history[r] = ([], [])
                d[r] = -g[r] / max(1.0, float(np.linalg.norm(g[r])))
        slope = np.sum(g * d, axis=1)
        t, accepted, trial = np.ones(R), np.zeros(R, bool), U.copy()
        for _ in range(20):
            pending = live & ~accepted
            if not pending.any():
                break
            candidate = U + t[:, None] * d
            ft = values(np.where(pending[:, None], candidate, U), pending)
            ok = pending & np.isfinite(ft) & (ft <= f + 1e-4 * t * slope)
            trial[ok] = candidate[ok]
            accepted |= ok
            t = np.where(accepted, t, 0.5 * t)
        live &= accepted  # a restart whose line search fails has converged (or cannot move)
        if not live.any():
            break
        f_new, g_new = values_and_grads(np.where(live[:, None], trial, U), live)
        for r in np.flatnonzero(live):
            if not (np.isfinite(f_new[r]) and np.all(np.isfinite(g_new[r]))):
                live[r] = False
                continue
            s, yv = trial[r] - U[r], g_new[r] - g[r]
            if s @ yv > 1e-12 * (yv @ yv):
                S, Yh = history[r]
                S.append(s)
                Yh.append(yv)
                del S[:-memory], Yh[:-memory]
            # converged: the log marginal moved by less than a micro-nat in this step or by less than
            # STALL_NATS over the last STALL_STEPS (a crawl that cannot change a BIC), or the gradient vanished
            gains[r].append(abs(f[r] - f_new[r]) * X.shape[0])
            del gains[r][:-STALL_STEPS]
            converged = (gains[r][-1] < 1e-6 or np.max(np.abs(g_new[r])) < 1e-7
                         or (len(gains[r]) == STALL_STEPS and sum(gains[r]) < STALL_NATS))
            U[r], f[r], g[r] = trial[r], f_new[r], g_new[r]
            if converged:
                live[r] = False
    return _unflat(U, u0, dtype), -f * X.shape[0]


_SENTINEL = 1000.0  # initial value + call index: tells which (base, column, field) made each site


def _site_fields(expression: Expression) -> list[tuple[str, tuple[str, int, str]]]:
    """``[(site name, (base, column, field))]`` of the expression's hyperparameters, in the order
    :func:`~gpzoo.models.grammar.to_kernel` asks for their initial values."""
    calls: list[tuple[str, int, str]] = []

    def record(name: str, dim: int, field: str) -> float:
        calls.append((name, dim, field))
        return _SENTINEL + len(calls) - 1

    sites = _sites(to_kernel(expression, record))
    order = {name: int(round(float(value) - _SENTINEL)) for name, (value, _) in sites.items()}
    return [(name, calls[i]) for name, i in sorted(order.items(), key=lambda item: item[1])]


def _inherited_pool(parent: Expression, hyperparameters: dict) -> dict[tuple[str, int, str], list[float]]:
    """The parent's fitted values by (base, column, field), in the order its kernel asks for them."""
    pool: dict[tuple[str, int, str], list[float]] = {}
    for site, key in _site_fields(parent):
        value = np.asarray(hyperparameters.get(site, np.nan), np.float64)
        if value.size == 1 and np.isfinite(value):
            pool.setdefault(key, []).append(float(value.reshape(())))
    return pool


class _Inherit:
    """Initial values that continue the parent's fit (Duvenaud 2014, ch. 1, "Scoring kernel families";
    Duvenaud et al. 2013, §3): each hyperparameter the parent had starts at the parent's optimum — the
    k-th request for a (base, column, field) takes the parent's k-th value of it — and only the newly
    introduced ones come from ``fallback`` (typical values on the first restart, random ones after)."""

    def __init__(self, pool: dict, fallback: _Initial):
        self.pool, self.fallback, self.taken = pool, fallback, dict.fromkeys(pool, 0)

    def __call__(self, name: str, dim: int, field: str) -> float:
        key = (name, dim, field)
        values = self.pool.get(key, ())
        if self.taken.get(key, 0) < len(values):
            self.taken[key] += 1
            return values[self.taken[key] - 1]
        return self.fallback(name, dim, field)


def _initial_points(expression: Expression, stats: dict, restarts: int, seed: int, dtype,
                    inherited: tuple[Expression, dict] | None = None, num_variational: int = 0) -> dict:
    """``{site: [R, ...]}`` unconstrained initial values; restart 0 at the typical values, the others
    random around them. With ``inherited`` (the parent's expression and fitted hyperparameters) one
    more restart, the last, continues the parent's fit: the hyperparameters the parent had and the
    noise start at the parent's optimum, the new ones at their typical values. It is one more, not one
    of the ``restarts``: the parent's optimum can be a poor start for the new structure (an SE's short
    lengthscale fitted to a periodic signal is one for the product SE × Per that explains it). With
    ``num_variational`` = M (the SVGP score) every restart's q(v) starts at the prior N(0, I) and there
    is no noise variance."""
    rng = np.random.default_rng([seed, zlib.crc32(expression.key().encode())])
    pool, parent_noise = None, math.nan
    if inherited is not None:
        pool = _inherited_pool(*inherited)
        parent_noise = float(inherited[1].get("noise", math.nan))
    points = []
    for r in range(restarts + (pool is not None)):
        continued = r == restarts
        initial = _Initial(stats, None if r == 0 or continued else rng, r)
        sites = _sites(to_kernel(expression, _Inherit(pool, initial) if continued and pool is not None else initial))
        u = {name: np.asarray(biject_to(c).inv(jnp.asarray(np.asarray(v), dtype))) for name, (v, c) in sites.items()}
        noise = stats["y_var"] * (0.1 if r == 0 or continued else float(np.exp(rng.uniform(np.log(0.01), np.log(0.5)))))
        if continued and math.isfinite(parent_noise) and parent_noise > 0:
            noise = parent_noise
        if num_variational:  # q(v) = p(v) = N(0, I): no noise variance, a likelihood without one
            M = num_variational
            u["q_mu"] = np.zeros(M, dtype)
            u["q_sqrt"] = np.asarray(biject_to(constraints.lower_cholesky).inv(jnp.eye(M, dtype=dtype)))
        else:
            u["noise"] = np.asarray(np.log(noise), dtype)
        points.append(u)
    return {name: jnp.asarray(np.stack([p[name] for p in points]), dtype) for name in points[0]}


def _num_params(u0: dict) -> int:
    """BIC's p: the hyperparameters and the noise variance, not the variational q(v)."""
    return int(sum(np.prod(v.shape[1:]) for k, v in u0.items() if k not in _VARIATIONAL))


@dataclasses.dataclass(frozen=True)
class _Settings:
    restarts: int
    steps: int
    score: str
    num_inducing: int
    seed: int
    likelihood: tuple = ()  # the SVGP score's likelihood (:func:`_likelihood_key`), else empty


def _inducing_inputs(X, num_inducing: int):
    """The bounds' inducing inputs: ``num_inducing`` training inputs evenly spaced through the rows."""
    return X[np.linspace(0, len(X) - 1, min(num_inducing, len(X))).astype(int)]


def evaluate(expression: Expression, X, y, settings: _Settings, stats: dict, depth: int = 0, parent=None,
             parent_hyperparameters: dict | None = None) -> Candidate:
    """Fit one structure from every restart and score the best (a :class:`Candidate`). With the
    ``parent``'s (expression text) fitted ``parent_hyperparameters``, the restarts continue its fit."""
    start = time.perf_counter()
    dtype = jnp.result_type(float)
    Xj, yj = jnp.asarray(X, dtype), jnp.asarray(y, dtype)
    Z = _inducing_inputs(Xj, settings.num_inducing)
    floor = jnp.asarray(stats["y_var"] * (1e-6 if dtype == jnp.float64 else 1e-4), dtype)
    inherited = None
    if parent is not None and parent_hyperparameters:
        inherited = (canonical(parse(parent), noise=True), parent_hyperparameters)
    svgp = settings.score == "bic-svgp"
    u0 = _initial_points(expression, stats, settings.restarts, settings.seed, dtype, inherited, len(Z) if svgp else 0)
    structure = _Structure(expression, settings.score, settings.likelihood)
    u, log_marginals = _optimise(structure, u0, Xj, yj, Z, floor, settings.steps)
    log_marginals = np.asarray(log_marginals, dtype=np.float64)
    finite = np.isfinite(log_marginals)
    N, p = len(y), _num_params(u0)
    if not finite.any():
        return Candidate(expression.key(), depth, parent, math.inf, -math.inf, p, len(log_marginals),
                         len(log_marginals), time.perf_counter() - start, {})
    best = int(np.nanargmax(np.where(finite, log_marginals, -np.inf)))
    values, noise = _constrain(expression, {k: v[best] for k, v in u.items()})
    hyper = {k: np.asarray(v, np.float64).tolist() for k, v in values.items()}
    if svgp:  # the best restart's q(v), for predictions
        hyper["q_mu"] = np.asarray(u["q_mu"][best], np.float64).tolist()
        hyper["q_sqrt"] = np.asarray(_q_sqrt(u["q_sqrt"][best]), np.float64).tolist()
    else:
        hyper["noise"] = float(noise) + float(floor)
    log_marginal = float(log_marginals[best])
    return Candidate(expression.key(), depth, parent, -2.0 * log_marginal + p * math.log(N), log_marginal, p,
                     len(log_marginals), int((~finite).sum()), time.perf_counter() - start, hyper)


# ----------------------------------------------------------------------------- backends
def _evaluate_all(expressions, X, y, settings, stats, depth, parents, backend: str, done=lambda candidates: None,
                  inherited=None):
    """Fit ``expressions`` (one depth's candidates); ``done(candidates)`` is called as results arrive.
    ``inherited``: each candidate's parent's fitted hyperparameters (or None)."""
    inherited = list(inherited) if inherited is not None else [None] * len(expressions)
    if backend == "sequential":
        out = []
        for e, p, h in zip(expressions, parents, inherited):
            out.append(evaluate(e, X, y, settings, stats, depth, p, h))
            done(out[-1:])
        return out
    import ray  # noqa: PLC0415

    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    x64 = bool(jax.config.jax_enable_x64)

    @ray.remote
    def remote(keys, X, y, settings, stats, depth, parents, inherited):
        jax.config.update("jax_enable_x64", x64)
        return [evaluate(canonical(parse(k)), X, y, settings, stats, depth, p, h)
                for k, p, h in zip(keys, parents, inherited)]

    workers = max(1, int(ray.available_resources().get("CPU", 1)))
    chunks = [list(range(i, len(expressions), workers)) for i in range(workers)]
    X_ref, y_ref = ray.put(X), ray.put(y)
    futures = [remote.remote([expressions[i].key() for i in c], X_ref, y_ref, settings, stats, depth,
                             [parents[i] for i in c], [inherited[i] for i in c]) for c in chunks if c]
    gathered: list[Candidate | None] = [None] * len(expressions)
    for chunk, results in zip([c for c in chunks if c], ray.get(futures)):
        for i, candidate in zip(chunk, results):
            gathered[i] = candidate
        done(results)
    return gathered


# ----------------------------------------------------------------------------- the search
def _check_data(X, y) -> tuple[np.ndarray, np.ndarray]:
    X = as_float_array(X, "X")
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2:
        raise DataError("X", f"must be [N] or [N, D] inputs, got shape {X.shape}")
    y = as_float_array(y, "y")
    if y.ndim != 1 or y.shape[0] != X.shape[0]:
        raise DataError("y", f"must be [N] targets matching X's {X.shape[0]} rows, got shape {y.shape}")
    if not np.all(np.isfinite(X)):
        raise DataError("X", "holds non-finite values (NaN or inf)")
    if not np.all(np.isfinite(y)):
        raise DataError("y", "holds non-finite values (NaN or inf)")
    if X.shape[0] < 3:
        raise DataError("X", f"a structure search needs at least 3 points, got {X.shape[0]}")
    if np.ptp(y) == 0:
        raise DataError("y", "is constant: every structure explains it equally (nothing to search)")
    return X, y


def _check_likelihood(likelihood, y: np.ndarray):
    """None for Gaussian data (``likelihood`` None or a Gaussian), else the Bernoulli / Poisson likelihood
    with ``y`` checked against it."""
    from gpzoo.models.likelihoods import Gaussian, Likelihood  # noqa: PLC0415

    if likelihood is None or isinstance(likelihood, Gaussian):
        return None
    if not isinstance(likelihood, Likelihood) or type(likelihood).__name__ not in _LIKELIHOOD_FIELDS:
        raise InvalidArgumentError("likelihood", "the search takes a Gaussian (None), Bernoulli or Poisson likelihood "
                                                 f"(one latent function), got {likelihood!r}")
    likelihood.validate_targets(y)
    return likelihood


def search(X, y, *, depth: int = 3, bases: Sequence[str] = DEFAULT_BASES, beam: int = 1, restarts: int = 5,
           steps: int = 60, changes: bool = True, exact_max: int = 2000, num_inducing: int | None = None, seed: int = 0,
           backend: str = "sequential", progress: bool = True, continue_parents: bool = False,
           likelihood=None) -> "SearchResult":
    """Greedy compositional kernel search on data ``X`` ``[N, D]`` (or ``[N]``), ``y`` ``[N]``.

    ``depth`` levels of expansion (1: base kernels only); ``bases`` the grammar's base kernels
    (of :data:`gpzoo.models.grammar.BASE_KERNELS`); ``beam`` structures expanded per depth;
    ``restarts`` initial points per structure, optimised by ``steps`` L-BFGS iterations in one
    batched program; ``changes`` adds the change-point and change-window productions. The exact
    marginal likelihood scores N ≤ ``exact_max`` points, the collapsed bound with ``num_inducing``
    (default 200) evenly spaced training inputs scores more. ``likelihood``: None (Gaussian noise, the
    default), ``Bernoulli()`` (labels 0/1) or ``Poisson()`` (counts), the last two scored by the SVGP
    bound with ``num_inducing`` (default 32) inducing inputs (module docstring). ``backend``: ``"sequential"`` or ``"ray"`` (the
    candidates of one depth in parallel; the same results). Inputs and targets are used as given:
    standardise y and put x on a readable scale first (the search's initial values adapt to the
    data's spread, but its descriptions are in x's units). ``continue_parents`` gives every structure
    expanded from a parent one more restart that continues the parent's fit (Duvenaud 2014, ch. 1): it
    finds higher-scoring optima, e.g. BIC −1,866 against −1,824 on the CO₂ benchmark, but it also
    reaches structures that beat the generating one on BIC by fitting the noise (a product of two
    near-sinusoids whose beat mimics an SE envelope, 12 BIC units better than the Per × SE that
    generated 100 points at noise sd 0.2), so it is off by default. See the module docstring.
    """
    X, y = _check_data(X, y)
    depth = check_integer(depth, "depth", minimum=1)
    beam = check_integer(beam, "beam", minimum=1)
    restarts = check_integer(restarts, "restarts", minimum=1)
    steps = check_integer(steps, "steps", minimum=1)
    exact_max = check_integer(exact_max, "exact_max", minimum=1)
    likelihood = _check_likelihood(likelihood, y)
    if num_inducing is None:
        num_inducing = 200 if likelihood is None else DEFAULT_SVGP_INDUCING
    num_inducing = check_integer(num_inducing, "num_inducing", minimum=1)
    seed = check_integer(seed, "seed", minimum=0)
    if isinstance(bases, str) or not isinstance(bases, Sequence) or not bases:
        raise InvalidArgumentError("bases", f"expected a non-empty list of base kernel names, got {bases!r}")
    for name in bases:
        if name not in BASE_KERNELS:
            raise InvalidArgumentError("bases", unknown_name_message("base kernel", name, list(BASE_KERNELS)))
    if not isinstance(continue_parents, bool):
        raise InvalidArgumentError("continue_parents", f"expected True or False, got {continue_parents!r}")
    if backend not in BACKENDS:
        raise InvalidArgumentError("backend", unknown_name_message("backend", backend, list(BACKENDS)))
    if likelihood is not None:
        score, key = "bic-svgp", _likelihood_key(likelihood)
    else:
        score, key = ("bic-exact" if len(y) <= exact_max else "bic-collapsed"), ()
    settings = _Settings(restarts, steps, score, num_inducing, seed, key)
    stats = _data_stats(X, _latent_proxy(y, likelihood))
    fitted: dict[Expression, Candidate] = {}
    frontier: list[tuple[Expression, Candidate | None]] = [(canonical(b, noise=True), None)
                                                           for b in _bases(bases, X.shape[1])]
    best_so_far: list[Candidate] = []
    for level in range(1, depth + 1):
        todo = [(e, p) for e, p in dict(frontier).items() if e not in fitted]
        if not todo:
            break
        bar = _progress(progress, len(todo), f"depth {level}/{depth}")

        def report(candidates, bar=bar):
            best_so_far[:] = [min(best_so_far + list(candidates), key=lambda c: c.score)]
            if bar is not None:
                bar.set_postfix_str(f"best {best_so_far[0].expression} (BIC {best_so_far[0].score:.1f})")
                bar.update(len(candidates))

        done = _evaluate_all([e for e, _ in todo], X, y, settings, stats, level,
                             [None if p is None else p.expression for _, p in todo], backend, report,
                             [None if p is None or not continue_parents else p.hyperparameters for _, p in todo])
        if bar is not None:
            bar.close()
        for (expression, _), candidate in zip(todo, done):
            fitted[expression] = candidate
        best_level = sorted(zip(done, [e for e, _ in todo]), key=lambda pair: pair[0].score)[:beam]
        if level < depth:
            frontier = []
            for candidate, expression in best_level:
                if math.isfinite(candidate.score):
                    frontier.extend((child, candidate) for child in expand(expression, bases, X.shape[1], changes))
    trace = sorted(fitted.values(), key=lambda c: (c.depth, c.score))
    return SearchResult(trace=tuple(trace), score=score, X=X, y=y, settings=settings, likelihood=likelihood)


def _progress(show: bool, total: int, description: str):
    """A progress bar over one depth's candidates (structures fitted / total, best so far), or None."""
    if not show:
        return None
    from tqdm.auto import tqdm  # noqa: PLC0415

    return tqdm(total=total, desc=description, unit="structure", leave=False)


# ----------------------------------------------------------------------------- results
@dataclasses.dataclass(frozen=True)
class SearchResult:
    """The search trace and its best structure (see :func:`search`)."""

    trace: tuple[Candidate, ...]
    score: str
    X: np.ndarray
    y: np.ndarray
    settings: _Settings
    likelihood: Any = None  # None: Gaussian noise; else the Bernoulli / Poisson likelihood of the SVGP score

    @property
    def best(self) -> Candidate:
        return min(self.trace, key=lambda c: c.score)

    @property
    def expression(self) -> Expression:
        """The best structure (canonical)."""
        return canonical(parse(self.best.expression), noise=True)

    def table(self):
        """The trace as a pandas DataFrame, one row per fitted structure, best first."""
        import pandas as pd  # noqa: PLC0415

        return pd.DataFrame([c.row() for c in self.trace]).sort_values("score").reset_index(drop=True)

    def kernel(self, candidate: Candidate | None = None):
        """The fitted kernel of ``candidate`` (default the best), with concrete hyperparameters."""
        candidate = candidate or self.best
        expression = canonical(parse(candidate.expression), noise=True)
        values = {k: jnp.asarray(v) for k, v in candidate.hyperparameters.items() if k not in ("noise", *_VARIATIONAL)}
        return _kernel_at(expression, values)

    @property
    def noise_variance(self) -> float:
        """The Gaussian noise variance of the best structure (0.0 for a non-Gaussian likelihood, which has none)."""
        return float(self.best.hyperparameters.get("noise", 0.0))

    def _variational(self):
        """The SVGP score's inducing inputs Z ``[M, D]`` and the best structure's q(v): mean ``[M]``, factor ``[M, M]``."""
        X = jnp.asarray(self.X)
        h = self.best.hyperparameters
        return _inducing_inputs(X, self.settings.num_inducing), jnp.asarray(h["q_mu"], X.dtype), jnp.asarray(h["q_sqrt"], X.dtype)

    def _solve(self):
        kernel = self.kernel()
        X, y = jnp.asarray(self.X), jnp.asarray(self.y)
        K = kernel.K(X) + self.noise_variance * jnp.eye(len(y), dtype=X.dtype)
        return kernel, jax.scipy.linalg.cho_factor(K, lower=True), X, y

    def predict(self, X_new):
        """Mean and variance of f at ``X_new`` ``[N*, D]`` under the best structure: the exact posterior for
        Gaussian noise, q(f) of the fitted SVGP otherwise."""
        X_new = self._check_new(X_new)
        if self.likelihood is not None:
            Z, q_mu, q_sqrt = self._variational()
            mean, var = whitened_moments(self.kernel(), Z, q_mu, q_sqrt, X_new)
            return np.asarray(mean), np.asarray(var)
        kernel, factor, X, y = self._solve()
        Ks = kernel.K(X, X_new)  # [N, N*]
        mean = Ks.T @ jax.scipy.linalg.cho_solve(factor, y)
        var = kernel.K_diag(X_new) - jnp.sum(Ks * jax.scipy.linalg.cho_solve(factor, Ks), axis=0)
        return np.asarray(mean), np.asarray(var)

    def predictive(self, X_new):
        """Mean and standard deviation ``[N*]`` of y* at ``X_new``: f's posterior plus the noise, or the
        Bernoulli / Poisson predictive moments under q(f)."""
        mean, var = self.predict(X_new)
        if self.likelihood is None:
            return mean, np.sqrt(np.maximum(var + self.noise_variance, 0.0))
        y_mean, y_var = self.likelihood.predict_mean_and_var(jnp.asarray(mean)[:, None], jnp.asarray(var)[:, None])
        return np.asarray(y_mean)[:, 0], np.sqrt(np.maximum(np.asarray(y_var)[:, 0], 0.0))

    def _check_new(self, X_new):
        X_new = as_float_array(X_new, "X_new")
        X_new = X_new[:, None] if X_new.ndim == 1 else X_new
        if X_new.ndim != 2 or X_new.shape[1] != self.X.shape[1]:
            raise DataError("X_new", f"must have {self.X.shape[1]} input columns, got shape {X_new.shape}")
        return jnp.asarray(X_new, jnp.asarray(self.X).dtype)

    def decomposition(self, X_new, full_cov: bool = False) -> list[dict]:
        """The additive components of the best structure at ``X_new`` (Duvenaud 2014, eq. 1.17–1.18).

        For f = Σ_i f_i with f_i ~ GP(0, k_i) and y = f + ε, each component's posterior is
        mean_i = K_i(X*, X) (K + σ²I)⁻¹ y and cov_i = K_i(X*, X*) − K_i(X*, X) (K + σ²I)⁻¹ K_i(X, X*).
        Returns one dict per summand: ``expression``, ``description``, ``mean`` ``[N*]`` and ``var``
        ``[N*]`` (``cov`` ``[N*, N*]`` too with ``full_cov``). The means sum to the full posterior
        mean; the covariances plus the cross-covariances −K_i(X*, X)(K + σ²I)⁻¹K_j(X, X*) sum to the
        full covariance. For a non-Gaussian likelihood each component is f_i's q through the inducing
        outputs, q(f_i) = ∫ p(f_i | u) q(u) du (u = f(Z) is the sum's): with B_i = Luu⁻¹ K_i(Z, X*),
        mean_i = B_iᵀ m and cov_i = K_i(X*, X*) − B_iᵀB_i + B_iᵀ S Sᵀ B_i; the means again sum to q(f)'s.
        """
        X_new = self._check_new(X_new)
        if self.likelihood is not None:
            return self._svgp_decomposition(X_new, full_cov)
        kernel, factor, X, y = self._solve()
        parts = kernel.kernels if isinstance(self.expression, Add) else (kernel,)
        alpha = jax.scipy.linalg.cho_solve(factor, y)
        out = []
        for expression, part in zip(summands(self.expression), parts):
            Ks = part.K(X, X_new)  # [N, N*]
            solved = jax.scipy.linalg.cho_solve(factor, Ks)
            entry: dict[str, Any] = {"expression": str(expression), "description": describe(expression, part),
                     "mean": np.asarray(Ks.T @ alpha)}
            if full_cov:
                entry["cov"] = np.asarray(part.K(X_new) - Ks.T @ solved)
                entry["var"] = np.diag(entry["cov"]).copy()
            else:
                entry["var"] = np.asarray(part.K_diag(X_new) - jnp.sum(Ks * solved, axis=0))
            out.append(entry)
        return out

    def _svgp_decomposition(self, X_new, full_cov: bool) -> list[dict]:
        kernel = self.kernel()
        Z, q_mu, q_sqrt = self._variational()
        parts = kernel.kernels if isinstance(self.expression, Add) else (kernel,)
        out = []
        for expression, part in zip(summands(self.expression), parts):
            mean, cov = whitened_moments(kernel, Z, q_mu, q_sqrt, X_new, component=part, full_cov=full_cov)
            entry: dict[str, Any] = {"expression": str(expression), "description": describe(expression, part),
                                     "mean": np.asarray(mean)}
            if full_cov:
                entry["cov"] = np.asarray(cov)
                entry["var"] = np.diag(entry["cov"]).copy()
            else:
                entry["var"] = np.asarray(cov)
            out.append(entry)
        return out

    def spec(self, num_inducing: int | None = None):
        """The best structure as a gpzoo :class:`~gpzoo.models.zoo_core.ModelSpec` (sparse variational GP, the
        search's likelihood: Gaussian at the fitted noise, or its Bernoulli / Poisson) initialised at the search's
        hyperparameters, for :func:`gpzoo.fit` / :func:`gpzoo.compare`."""
        from gpzoo.models.likelihoods import Gaussian  # noqa: PLC0415
        from gpzoo.models.zoo_core import ModelSpec  # noqa: PLC0415

        M = min(len(self.y), 64) if num_inducing is None else check_integer(num_inducing, "num_inducing", minimum=1)
        # the fitted values in the template's pytree, keeping its fixed unit variances fixed
        is_fixed = lambda v: isinstance(v, Fixed)  # noqa: E731
        template, treedef = jax.tree.flatten(to_kernel(self.expression), is_leaf=is_fixed)
        fitted = jax.tree.leaves(self.kernel())
        leaves = [t if is_fixed(t) else np.asarray(f, np.float64) for t, f in zip(template, fitted, strict=True)]
        # call-arg: pytree_dataclass is opaque to mypy (no dataclass_transform), so it sees no fields
        return ModelSpec(name="searched", kernel=jax.tree.unflatten(treedef, leaves),
                         likelihood=self.likelihood if self.likelihood is not None else Gaussian(noise_variance=self.noise_variance),  # type: ignore[call-arg]
                         num_inducing=M,
                         description=f"structure found by kernel search: {self.best.expression}")

    def to_json(self) -> dict:
        """A JSON-ready summary: the score used, settings, best structure and the whole trace."""
        settings = dataclasses.asdict(self.settings)
        settings["likelihood"] = "Gaussian" if self.likelihood is None else repr(self.likelihood)
        return {"score": self.score, "settings": settings,
                "best": dataclasses.asdict(self.best), "trace": [dataclasses.asdict(c) for c in self.trace]}


# ----------------------------------------------------------------------------- descriptions
def _value(kernel, field: str) -> float:
    return float(np.asarray(getattr(kernel.resolved(), field)).reshape(-1)[0])


def _factor_kernels(expression: Expression, kernel) -> list[tuple[Base, object]]:
    # a summand of a canonical expression is a base kernel or a product of base kernels
    if isinstance(expression, Mul):
        pairs: list[tuple[Base, object]] = []
        for factor, part in zip(expression.factors, kernel.kernel.kernels):
            assert isinstance(factor, Base)
            pairs.append((factor, part))
        return pairs
    assert isinstance(expression, Base)
    return [(expression, kernel)]


def describe(expression: Expression, kernel) -> str:
    """A one-line plain-language description of one summand from its fitted hyperparameters
    (in the inputs' units), in the manner of the Automatic Statistician (Lloyd et al. 2014, §5)."""
    if isinstance(expression, Change):
        where = f"{_value(kernel, 'location'):.4g}"
        if expression.kind == "CP":
            return (f"changes around x = {where} from [{_describe_sum(expression.first, kernel.before)}] "
                    f"to [{_describe_sum(expression.second, kernel.after)}]")
        return (f"inside a window of width {_value(kernel, 'width'):.3g} around x = {where}: "
                f"[{_describe_sum(expression.second, kernel.inside)}]; elsewhere "
                f"[{_describe_sum(expression.first, kernel.outside)}]")
    factors = _factor_kernels(expression, kernel)
    names = [f.name for f, _ in factors]
    if "WN" in names:
        return "white noise" + (" with linearly growing amplitude" if "Lin" in names else "")
    words = []
    periodic = [(f, k) for f, k in factors if f.name == "Per"]
    smooth = [(f, k) for f, k in factors if f.name in ("SE", "RQ")]
    linear = names.count("Lin")
    if periodic:
        period = ", ".join(f"{_value(k, 'period'):.3g}" for _, k in periodic)
        if smooth:
            words.append(f"approximately periodic, period {period}, changing over {_value(smooth[0][1], 'lengthscale'):.3g}")
        else:
            words.append(f"periodic, period {period}")
    elif smooth:
        kind = "smooth with many length scales around" if smooth[0][0].name == "RQ" else "smooth, lengthscale"
        words.append(f"{kind} {_value(smooth[0][1], 'lengthscale'):.3g}")
    if linear:
        if periodic or smooth:
            words.append("with linearly growing amplitude" if linear == 1 else f"with amplitude growing as x^{linear}")
        else:
            words.append("linear trend" if linear == 1 else f"polynomial trend of degree {linear}")
    if not words:
        words.append("constant offset")
    return ", ".join(words)


def _describe_sum(expression: Expression, kernel) -> str:
    parts = kernel.kernels if isinstance(expression, Add) else (kernel,)
    return "; ".join(describe(e, k) for e, k in zip(summands(expression), parts))


# ----------------------------------------------------------------------------- report
def _evidence(delta: float) -> str:
    """Kass & Raftery 1995, §3.2: the BIC difference as evidence (2 log Bayes factor ≈ −ΔBIC)."""
    if delta > 10:
        return "very strong"
    if delta > 6:
        return "strong"
    if delta > 2:
        return "positive"
    return "weak"


def verdict(result: SearchResult) -> str:
    """One sentence: the winning structure and how sure the search is of it."""
    ranked = sorted(result.trace, key=lambda c: c.score)
    best = ranked[0]
    name = str(canonical(parse(best.expression), noise=True))
    if len(ranked) == 1:
        return f"{name} is the only structure fitted ({result.score} {best.score:.1f})."
    second = ranked[1]
    delta = second.score - best.score
    other = str(canonical(parse(second.expression), noise=True))
    return (f"{name} fits best: its BIC ({result.score}) is {delta:.1f} lower than the runner-up {other}'s, "
            f"{_evidence(delta)} evidence by Kass & Raftery's scale.")


def _figures(result: SearchResult, folder, X_test=None, y_test=None) -> dict[str, str]:
    import matplotlib.pyplot as plt  # noqa: PLC0415

    folder.mkdir(parents=True, exist_ok=True)
    X = result.X
    names = {}
    if X.shape[1] == 1:
        lo, hi = X[:, 0].min(), X[:, 0].max()
        if X_test is not None:
            lo, hi = min(lo, np.min(X_test)), max(hi, np.max(X_test))
        pad = 0.05 * (hi - lo)
        grid = np.linspace(lo - pad, hi + pad, 400)[:, None]
        mean, sd = result.predictive(grid)
        fig, ax = plt.subplots(figsize=(8, 3.2))
        ax.plot(X[:, 0], result.y, ".", ms=3, color="k", label="training data")
        if X_test is not None and y_test is not None:
            ax.plot(np.ravel(X_test), y_test, ".", ms=3, color="tab:red", label="held-out data")
        ax.plot(grid[:, 0], mean, color="tab:blue", label="posterior mean" if result.likelihood is None else "predictive mean of y")
        ax.fill_between(grid[:, 0], mean - 2 * sd, mean + 2 * sd, color="tab:blue", alpha=0.2, label="± 2 sd (y)")
        ax.set_xlabel("x")
        ax.legend(fontsize=7, loc="best")
        ax.set_title(str(result.expression) + ("" if result.likelihood is None else f" ({type(result.likelihood).__name__})"))
        fig.tight_layout()
        fig.savefig(folder / "fit.png", dpi=110)
        plt.close(fig)
        names["fit"] = "fit.png"
        parts = result.decomposition(grid)
        fig, axes = plt.subplots(len(parts), 1, figsize=(8, 2.2 * len(parts)), squeeze=False)
        for ax, part in zip(axes[:, 0], parts):
            sd = np.sqrt(np.maximum(part["var"], 0.0))
            ax.plot(grid[:, 0], part["mean"], color="tab:green")
            ax.fill_between(grid[:, 0], part["mean"] - 2 * sd, part["mean"] + 2 * sd, color="tab:green", alpha=0.2)
            ax.set_title(f"{part['expression']}: {part['description']}" + ("" if result.likelihood is None else " (latent f)"),
                         fontsize=8)
        fig.tight_layout()
        fig.savefig(folder / "components.png", dpi=110)
        plt.close(fig)
        names["components"] = "components.png"
    depths = sorted({c.depth for c in result.trace})
    best_per_depth = [min(c.score for c in result.trace if c.depth == d) for d in depths]
    fig, ax = plt.subplots(figsize=(5, 3))
    for c in result.trace:
        ax.plot(c.depth, c.score, "o", color="0.7", ms=3)
    ax.plot(depths, best_per_depth, "-o", color="tab:blue", label="best at depth")
    ax.set_xlabel("depth")
    ax.set_ylabel(f"BIC ({result.score}; lower is better)")
    ax.set_xticks(depths)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(folder / "scores.png", dpi=110)
    plt.close(fig)
    names["scores"] = "scores.png"
    return names


def _score_text(result: SearchResult) -> str:
    if result.likelihood is None:
        return "BIC = −2 log p(y | θ̂) + p log N"
    return (f"{type(result.likelihood).__name__} likelihood: BIC = −2 ELBO + p log N, the SVGP bound with "
            f"{result.settings.num_inducing} inducing inputs in place of log p(y | θ̂)")


def heldout_metrics(result: SearchResult, X_test, y_test) -> dict:
    """RMSE and mean log predictive density of y at held-out points under the best structure
    (:func:`gpzoo.analysis.calibration.regression_metrics` of the Gaussian predictive; for a Bernoulli or
    Poisson likelihood its own predictive density and the RMSE of its predictive mean)."""
    from gpzoo.analysis.calibration import regression_metrics  # noqa: PLC0415

    if result.likelihood is not None:
        y_test = result.likelihood.validate_targets(as_float_array(y_test, "y_test"))
        mean, var = (jnp.asarray(v)[:, None] for v in result.predict(X_test))
        y_mean = np.asarray(result.likelihood.predict_mean_and_var(mean, var)[0])[:, 0]
        log_density = np.asarray(result.likelihood.predict_log_density(jnp.asarray(y_test, mean.dtype), mean, var))
        return {"rmse": float(np.sqrt(np.mean((y_mean - y_test) ** 2))), "mean_log_predictive_density": float(log_density.mean())}
    mean, var = result.predict(X_test)
    scores = regression_metrics(as_float_array(y_test, "y_test"), mean, var + result.noise_variance)
    return {"rmse": scores["rmse"], "mean_log_predictive_density": -scores["nll"]}


def write_report(result: SearchResult, out_dir, *, X_test=None, y_test=None, title: str = "Kernel structure search"):
    """Write ``search.json``, ``search.csv``, figures and ``report.html`` to ``out_dir``; returns the HTML path.

    The report opens with :func:`verdict`, then shows the data with the posterior mean ± 2 sd and its
    extrapolation to the held-out inputs, the additive components (each with its description), the
    best score per depth, and the whole trace."""
    import html  # noqa: PLC0415
    import json  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figures = _figures(result, out / "figures", X_test, y_test)
    summary = result.to_json()
    if X_test is not None and y_test is not None:
        summary["heldout"] = heldout_metrics(result, X_test, y_test)
    summary["verdict"] = verdict(result)
    (out / "search.json").write_text(json.dumps(summary, indent=1, allow_nan=True))
    table = result.table()
    table.to_csv(out / "search.csv", index=False)
    components = []
    if result.X.shape[1] == 1:
        components = [(p["expression"], p["description"]) for p in result.decomposition(result.X[:1])]
    rows = "".join(f"<li><b>{html.escape(e)}</b>: {html.escape(d)}</li>" for e, d in components)
    heldout = ""
    if "heldout" in summary:
        h = summary["heldout"]
        heldout = (f"<p>Held-out: RMSE {h['rmse']:.4g}, mean log predictive density "
                   f"{h['mean_log_predictive_density']:.4g}.</p>")
    images = "".join(f'<figure><img src="figures/{html.escape(f)}" alt="{html.escape(k)}"></figure>' for k, f in figures.items())
    page = f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}}img{{max-width:100%}}
table{{border-collapse:collapse;font-size:0.85rem}}td,th{{border:1px solid #ccc;padding:2px 6px}}</style></head><body>
<h1>{html.escape(title)}</h1>
<p class="verdict">{html.escape(summary['verdict'])}</p>
<p>Scored by {html.escape(result.score)} ({html.escape(_score_text(result))}; {len(result.trace)} structures fitted,
{result.settings.restarts} restarts each).</p>
{heldout}
<h2>Components</h2><ul>{rows}</ul>
{images}
<h2>Search trace</h2>
{table.to_html(index=False, float_format=lambda v: f"{v:.4g}")}
</body></html>"""
    path = out / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
