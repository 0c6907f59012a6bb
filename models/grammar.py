"""The kernel cookbook's grammar: structure expressions, their canonical form, and the kernels they name.

An expression is built from base kernels, one per input dimension — ``SE`` (squared exponential),
``Per`` (periodic), ``Lin`` (linear), ``RQ`` (rational quadratic), ``C`` (constant) and ``WN``
(white noise) — with ``+``, ``×`` and the change-point / change-window operators ``CP(A, B)`` and
``CW(A, B)`` (Duvenaud 2014, §1.3–1.5, eq. 1.19–1.20; Lloyd et al. 2014, §3). ``parse("SE × (Per + Lin)")``
reads the chapter's notation (``*`` for ``×``, ``SE[1]`` for a base on input column 1, ``CP(A, B, 0)``
for a change along column 0); ``str`` writes it back.

:func:`canonical` maps every expression to one representative of its equivalence class, so that a
structure search fits each structure once (Duvenaud et al. 2013, §3; Lloyd et al. 2014, §3):

* products distribute over sums, and a factor multiplying a change operator moves inside it
  (A × CP(B, C) = CP(A × B, A × C), exactly, because the switch weights multiply each branch);
* sums and products are commutative and associative: terms and factors are sorted, and a term
  that appears twice is kept once (K + K is K with a larger variance);
* a product of squared exponentials on one dimension is one squared exponential (its lengthscale
  is free); a constant factor is absorbed by the product's variance (C × K = K); white noise
  times a stationary kernel is white noise;
* with ``noise=True`` (a Gaussian likelihood, whose noise variance is already white noise) a bare
  ``WN`` summand is dropped.

Nothing else is merged: two expressions with different canonical forms may still define
overlapping model families (e.g. an RQ with a large α is nearly an SE), but never the same one by
the rules above. :func:`to_kernel` builds the gpzoo kernel of an expression with one variance per
summand (the factors of a product have their variances fixed at 1, so the count of free
hyperparameters that BIC charges for is not inflated by redundant scales).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping

from gpzoo.models.errors import InvalidArgumentError, unknown_name_message
from gpzoo.models.kernels.base import Fixed, Kernel, Product, Scaled, Sum
from gpzoo.models.kernels.combinators import ChangePoint, ChangeWindow
from gpzoo.models.kernels.dot_product import Constant, Linear, White
from gpzoo.models.kernels.stationary import Periodic, RationalQuadratic, SquaredExponential

__all__ = ["BASE_KERNELS", "Add", "Base", "Change", "Expression", "Mul", "canonical", "parse", "summands", "to_kernel"]

#: The base kernels of the grammar and what each describes.
BASE_KERNELS = {
    "SE": "squared exponential: smooth functions",
    "Per": "periodic: repeating structure",
    "Lin": "linear: linear trends",
    "RQ": "rational quadratic: smooth with many length scales",
    "C": "constant: an offset",
    "WN": "white noise: independent noise",
}
#: Base kernels whose variance k(x, x) does not depend on x (white noise absorbs them).
STATIONARY = frozenset({"SE", "Per", "RQ", "C"})


class Expression:
    """A structure expression (immutable, hashable, ordered by its canonical text)."""

    def key(self) -> str:
        """The unambiguous text of this expression (dimensions always written)."""
        return self.text(dims=True)

    def text(self, dims: bool = False) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def __str__(self) -> str:
        return self.text(dims=self.max_dim() > 0)

    def max_dim(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def __lt__(self, other: "Expression") -> bool:
        return self.key() < other.key()

    def __add__(self, other: "Expression") -> "Expression":
        return Add((self, other))

    def __mul__(self, other: "Expression") -> "Expression":
        return Mul((self, other))


@dataclasses.dataclass(frozen=True, eq=True)
class Base(Expression):
    """A base kernel ``name`` on input column ``dim``."""

    name: str
    dim: int = 0

    def __post_init__(self):
        if self.name not in BASE_KERNELS:
            raise InvalidArgumentError("base", unknown_name_message("base kernel", self.name, list(BASE_KERNELS)))
        if isinstance(self.dim, bool) or not isinstance(self.dim, int) or self.dim < 0:
            raise InvalidArgumentError("dim", f"must be a non-negative integer, got {self.dim!r}")

    def text(self, dims: bool = False) -> str:
        return f"{self.name}[{self.dim}]" if dims else self.name

    def max_dim(self) -> int:
        return self.dim


def _wrap(expression: Expression, dims: bool, inside: type) -> str:
    text = expression.text(dims)
    return f"({text})" if isinstance(expression, Add) and inside is Mul else text


@dataclasses.dataclass(frozen=True, eq=True)
class Add(Expression):
    """A sum of two or more expressions."""

    terms: tuple[Expression, ...]

    def text(self, dims: bool = False) -> str:
        return " + ".join(t.text(dims) for t in self.terms)

    def max_dim(self) -> int:
        return max(t.max_dim() for t in self.terms)


@dataclasses.dataclass(frozen=True, eq=True)
class Mul(Expression):
    """A product of two or more expressions."""

    factors: tuple[Expression, ...]

    def text(self, dims: bool = False) -> str:
        return " × ".join(_wrap(f, dims, Mul) for f in self.factors)

    def max_dim(self) -> int:
        return max(f.max_dim() for f in self.factors)


@dataclasses.dataclass(frozen=True, eq=True)
class Change(Expression):
    """``CP(first, second)`` (change-point: ``first`` before, ``second`` after) or ``CW(first, second)``
    (change-window: ``first`` outside, ``second`` inside) along input column ``dim``."""

    kind: str
    first: Expression
    second: Expression
    dim: int = 0

    def __post_init__(self):
        if self.kind not in ("CP", "CW"):
            raise InvalidArgumentError("kind", f"must be 'CP' or 'CW', got {self.kind!r}")

    def text(self, dims: bool = False) -> str:
        where = f", {self.dim}" if dims else ""
        return f"{self.kind}({self.first.text(dims)}, {self.second.text(dims)}{where})"

    def max_dim(self) -> int:
        return max(self.dim, self.first.max_dim(), self.second.max_dim())


# ----------------------------------------------------------------------------- canonical form
# A canonical expression is a sum of "terms"; a term is a product of base kernels (a sorted tuple
# of Base) or a Change whose branches are canonical. While distributing, a term is a pair
# (base factors, change factors); the change factors move inside the change operators at the end.

def _terms(expression: Expression) -> list:
    """The expression as a list of (bases, changes) products (distributed, not yet simplified)."""
    if isinstance(expression, Base):
        return [((expression,), ())]
    if isinstance(expression, Add):
        return [t for part in expression.terms for t in _terms(part)]
    if isinstance(expression, Mul):
        terms = [((), ())]
        for factor in expression.factors:
            terms = [(a[0] + b[0], a[1] + b[1]) for a in terms for b in _terms(factor)]
        return terms
    if isinstance(expression, Change):
        return [((), (Change(expression.kind, canonical(expression.first), canonical(expression.second), expression.dim),))]
    raise InvalidArgumentError("expression", f"expected a structure expression, got {type(expression).__name__}")


def _resolve(term):
    """A (bases, changes) product as a term: bases alone, or every other factor moved inside the
    first change operator (by canonical text, so the result does not depend on the factors' order):
    A × CP(B, C) = CP(A × B, A × C)."""
    bases, changes = term
    if not changes:
        return _simplify_product(bases)
    first, *others = sorted(changes)
    rest = [*bases, *others]
    if not rest:
        return first
    outside = rest[0] if len(rest) == 1 else Mul(tuple(rest))
    return Change(first.kind, canonical(Mul((outside, first.first))), canonical(Mul((outside, first.second))), first.dim)


def _term_expression(term) -> Expression:
    if isinstance(term, Change):
        return term
    return term[0] if len(term) == 1 else Mul(tuple(term))


def _simplify_product(factors: tuple[Base, ...]) -> tuple[Base, ...]:
    factors = sorted(factors)
    noise_dims = [f for f in factors if f.name == "WN"]
    if noise_dims:  # WN × stationary = WN; WN × WN = WN
        others = [f for f in factors if f.name not in STATIONARY and f.name != "WN"]
        return tuple(sorted([Base("WN", min(f.dim for f in noise_dims))] + others))
    kept, se_dims = [], set()
    for f in factors:
        if f.name == "SE":
            if f.dim in se_dims:
                continue  # SE × SE on one dimension is an SE
            se_dims.add(f.dim)
        kept.append(f)
    without_constants = [f for f in kept if f.name != "C"]
    if without_constants:
        kept = without_constants  # C × K = K (the product's variance absorbs the constant)
    else:
        kept = [min(kept)]
    return tuple(kept)


def canonical(expression: Expression, noise: bool = False) -> Expression:
    """The canonical representative of ``expression`` (module docstring): equal structures map to equal values."""
    simplified = {_resolve(term) for term in _terms(expression)}
    if noise and len(simplified) > 1:
        simplified = {t for t in simplified if isinstance(t, Change) or t[0].name != "WN" or len(t) > 1}
    expressions = sorted(_term_expression(t) for t in simplified)
    return expressions[0] if len(expressions) == 1 else Add(tuple(expressions))


def summands(expression: Expression) -> tuple[Expression, ...]:
    """The additive components of a canonical expression (itself when it is not a sum)."""
    return expression.terms if isinstance(expression, Add) else (expression,)


# ----------------------------------------------------------------------------- parsing
_TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z]+)|(?P<int>\d+)|(?P<op>[+*×()\[\],]))")


def parse(text: str) -> Expression:
    """Read an expression in the chapter's notation, e.g. ``"Lin + SE × Per"``, ``"CP(SE, Per)"``,
    ``"SE[0] × SE[1]"`` (see the module docstring). Not simplified: pass it to :func:`canonical`."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgumentError("expression", f"expected a non-empty expression string, got {text!r}")
    tokens, position = [], 0
    while position < len(text):
        if text[position:].strip() == "":
            break
        match = _TOKEN.match(text, position)
        if match is None:
            raise InvalidArgumentError("expression", f"cannot read {text!r} at character {position}: {text[position:]!r}")
        tokens.append(next((kind, value) for kind, value in match.groupdict().items() if value is not None))
        position = match.end()
    parser = _Parser(tokens, text)
    result = parser.sum()
    if parser.position != len(tokens):
        raise InvalidArgumentError("expression", f"unexpected {tokens[parser.position][1]!r} in {text!r}")
    return result


class _Parser:
    def __init__(self, tokens, text):
        self.tokens, self.text, self.position = tokens, text, 0

    def peek(self):
        return self.tokens[self.position][1] if self.position < len(self.tokens) else None

    def take(self, expected=None):
        if self.position >= len(self.tokens):
            raise InvalidArgumentError("expression", f"{self.text!r} ends early" + (f": expected {expected!r}" if expected else ""))
        kind, value = self.tokens[self.position]
        if expected is not None and value != expected:
            raise InvalidArgumentError("expression", f"expected {expected!r} in {self.text!r}, found {value!r}")
        self.position += 1
        return kind, value

    def sum(self):
        terms = [self.product()]
        while self.peek() == "+":
            self.take()
            terms.append(self.product())
        return terms[0] if len(terms) == 1 else Add(tuple(terms))

    def product(self):
        factors = [self.factor()]
        while self.peek() in ("*", "×"):
            self.take()
            factors.append(self.factor())
        return factors[0] if len(factors) == 1 else Mul(tuple(factors))

    def integer(self):
        kind, value = self.take()
        if kind != "int":
            raise InvalidArgumentError("expression", f"expected an input column number in {self.text!r}, found {value!r}")
        return int(value)

    def factor(self):
        kind, value = self.take()
        if value == "(":
            inner = self.sum()
            self.take(")")
            return inner
        if kind != "name":
            raise InvalidArgumentError("expression", f"expected a kernel name or '(' in {self.text!r}, found {value!r}")
        if value in ("CP", "CW"):
            self.take("(")
            first = self.sum()
            self.take(",")
            second = self.sum()
            dim = 0
            if self.peek() == ",":
                self.take()
                dim = self.integer()
            self.take(")")
            return Change(value, first, second, dim)
        dim = 0
        if self.peek() == "[":
            self.take()
            dim = self.integer()
            self.take("]")
        return Base(value, dim)


# ----------------------------------------------------------------------------- kernels
#: ``initial(name, dim, field)`` -> the initial value of hyperparameter ``field`` of base ``name`` on ``dim``.
Initial = Callable[[str, int, str], float]


def _default_initial(name: str, dim: int, field: str) -> float:
    return {"offset": 0.0, "location": 0.0}.get(field, 1.0)


def _base_kernel(base: Base, initial: Initial, variance) -> Kernel:
    dims = (base.dim,)
    value = lambda field: initial(base.name, base.dim, field)  # noqa: E731
    if base.name == "SE":
        return SquaredExponential(lengthscale=value("lengthscale"), variance=variance, active_dims=dims)
    if base.name == "Per":
        return Periodic(lengthscale=value("lengthscale"), period=value("period"), variance=variance, active_dims=dims)
    if base.name == "RQ":
        return RationalQuadratic(lengthscale=value("lengthscale"), alpha=value("alpha"), variance=variance, active_dims=dims)
    if base.name == "Lin":
        return Linear(variance=variance, offset=value("offset"), active_dims=dims)
    if base.name == "C":
        return Constant(variance=variance)
    return White(variance=variance, active_dims=dims)


def _term_kernel(term: Expression, initial: Initial) -> Kernel:
    if isinstance(term, Change):
        first, second = to_kernel(term.first, initial), to_kernel(term.second, initial)
        where = lambda field: initial(term.kind, term.dim, field)  # noqa: E731
        if term.kind == "CP":
            return ChangePoint(first, second, location=where("location"), steepness=where("steepness"), dim=term.dim)
        return ChangeWindow(first, second, location=where("location"), width=where("width"),
                            steepness=where("steepness"), dim=term.dim)
    factors = term.factors if isinstance(term, Mul) else (term,)
    if len(factors) == 1:
        return _base_kernel(factors[0], initial, initial(factors[0].name, factors[0].dim, "variance"))
    unit = Fixed(1.0)
    product = Product(tuple(_base_kernel(f, initial, unit) for f in factors))
    return Scaled(product, initial("product", factors[0].dim, "variance"))


def to_kernel(expression: Expression, initial: Initial | Mapping | None = None) -> Kernel:
    """The gpzoo kernel of a canonical ``expression``: one trainable variance per summand, the
    factors of a product scaled by it (their own variances fixed at 1). ``initial(name, dim, field)``
    gives each hyperparameter's initial value (default: 1, offsets and locations 0)."""
    if initial is None:
        initial = _default_initial
    terms = [_term_kernel(t, initial) for t in summands(expression)]
    return terms[0] if len(terms) == 1 else Sum(tuple(terms))
