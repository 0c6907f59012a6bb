"""q(u): the variational distribution of the inducing outputs, its KL and the shared conditional.

Shapes: L latent functions, G inducing groups of M outputs each (see :mod:`gpzoo.inference.inducing`),
so u is ``[L, G·M]``. The covariance S of each latent function has one of three structures:

* ``"full"``  — ``q_sqrt`` ``[L, GM, GM]`` lower triangular (full rank over all groups);
* ``"block"`` — ``q_sqrt`` ``[L, G, M, M]``: independent groups (mean-field across conv / RBF
  parts, van der Wilk et al. 2017, App. C);
* ``"diag"``  — ``q_sqrt`` ``[L, GM]`` positive standard deviations (mean field).

Whitened (u = Luu v, p(v) = N(0, I)) and unwhitened (p(u) = N(0, Kuu)) parameterisations give
the same ELBO for equivalent q (tests). The KL is analytic and registered with NumPyro's
multipledispatch ``kl_divergence`` so that ``TraceMeanField_ELBO`` uses it; no matrix larger than
one M×M block is factorised.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpyro
import numpyro.distributions as dist
from jax.scipy.linalg import solve_triangular
from numpyro.distributions import biject_to, constraints, transforms
from numpyro.distributions.kl import kl_divergence
from numpyro.distributions.util import matrix_to_tril_vec, vec_to_tril_matrix

from gpzoo.inference.linalg import block_solve
from gpzoo.models import draws

__all__ = [
    "COVARIANCE_STRUCTURES",
    "Q_SQRT",
    "UNCONSTRAINED_FORM",
    "InducingPosterior",
    "InducingPrior",
    "blockdiag_matvec",
    "blockdiag_solve",
    "conditional",
    "sqrt_dense",
    "sqrt_diag",
    "sqrt_times",
    "variational_params",
]

COVARIANCE_STRUCTURES = ("full", "block", "diag")
LOG_2PI = math.log(2.0 * math.pi)


# ----------------------------------------------------------------------------- q_sqrt's parameterisation
class LinearDiagonalCholeskyTransform(transforms.LowerCholeskyTransform):
    """Unconstrained ``[..., M(M+1)/2]`` -> lower-triangular ``[..., M, M]`` whose diagonal is ``|x|``.

    NumPyro's :class:`~numpyro.distributions.transforms.LowerCholeskyTransform` puts ``exp(x)`` on the
    diagonal. An optimiser's step then moves a standard deviation of q(v) by a fixed *fraction*, so
    shrinking it from its start at 1 to the 0.05–0.5 of a fitted q(v) takes hundreds of Adam steps at
    learning rate 0.01; on the diagonal itself, as GPflow's ``FillTriangular`` parameterises q_sqrt, the
    same fit climbs faster (``benchmarks/gpflow_side_by_side.py`` runs both parameterisations' fits
    beside GPflow from one start). ``|x|`` keeps the factor's diagonal non-negative, so the KL's
    log-determinant is that of S = q_sqrt q_sqrtᵀ either way.
    """

    def __call__(self, x):
        n = (math.isqrt(1 + 8 * x.shape[-1]) - 1) // 2  # x holds M(M+1)/2 entries
        below = vec_to_tril_matrix(x[..., :-n], diagonal=-1)
        return below + jnp.expand_dims(jnp.abs(x[..., -n:]), axis=-1) * jnp.identity(n, dtype=x.dtype)

    def _inverse(self, y):
        below = matrix_to_tril_vec(y, diagonal=-1)
        return jnp.concatenate([below, jnp.diagonal(y, axis1=-2, axis2=-1)], axis=-1)

    def log_abs_det_jacobian(self, x, y, intermediates=None):
        return jnp.zeros(x.shape[:-1], x.dtype)  # |x| and the copied entries have unit slope

    def __eq__(self, other):
        return isinstance(other, LinearDiagonalCholeskyTransform)


class _LinearDiagonalCholesky(type(constraints.lower_cholesky)):  # type: ignore[misc]
    """The lower-Cholesky constraint, optimised through :class:`LinearDiagonalCholeskyTransform`."""

    def __repr__(self) -> str:
        return repr(constraints.lower_cholesky)  # the same set of factors; parameter tables name the transform apart


#: The constraint of every SVGP family's ``q_sqrt`` (full and block structures): lower triangular with a
#: non-negative diagonal, its unconstrained form the entries themselves (:class:`LinearDiagonalCholeskyTransform`).
Q_SQRT = _LinearDiagonalCholesky()
biject_to.register(_LinearDiagonalCholesky)(lambda constraint: LinearDiagonalCholeskyTransform())
#: The unconstrained form of the parameters this gpzoo optimises, as a checkpoint records it (a checkpoint
#: written when q_sqrt's diagonal was exp(x) holds raw values this transform would misread).
UNCONSTRAINED_FORM = "q_sqrt entries, diagonal |x|"


# ----------------------------------------------------------------------------- q(u) helpers
def sqrt_times(q_sqrt, structure, B):
    """``S^{1/2}ᵀ B`` per latent: B ``[GM, K]`` -> ``[L, GM, K]`` (block: grouped, diag: scaled)."""
    if structure == "full":
        return jnp.einsum("lji,jk->lik", q_sqrt, B)  # [L, GM, K]
    if structure == "block":
        L_, G, M, _ = q_sqrt.shape
        Bg = B.reshape(G, M, -1)  # [G, M, K]
        return jnp.einsum("lgji,gjk->lgik", q_sqrt, Bg).reshape(L_, G * M, -1)  # [L, GM, K]
    return q_sqrt[:, :, None] * B[None]  # [L, GM, K]


def sqrt_diag(q_sqrt, structure):
    """Diagonal of S^{1/2}, ``[L, GM]`` (log |S| = 2 Σ log of it)."""
    if structure == "full":
        return jnp.diagonal(q_sqrt, axis1=-2, axis2=-1)
    if structure == "block":
        return jnp.diagonal(q_sqrt, axis1=-2, axis2=-1).reshape(q_sqrt.shape[0], -1)
    return q_sqrt


def sqrt_dense(q_sqrt, structure):
    """S^{1/2} as dense lower-triangular ``[L, GM, GM]`` (sampling and log-density only)."""
    if structure == "full":
        return q_sqrt
    if structure == "block":
        L_, G, M, _ = q_sqrt.shape
        eye_g = jnp.eye(G, dtype=q_sqrt.dtype)
        return jnp.einsum("gh,lgij->lgihj", eye_g, q_sqrt).reshape(L_, G * M, G * M)
    return jax.vmap(jnp.diag)(q_sqrt)


def variational_params(num_latent: int, num_groups: int, num_inducing: int, structure: str, init_sqrt=None, dtype=None):
    """Declare ``q_mu`` ``[L, GM]`` and ``q_sqrt`` as NumPyro params (shared by model and guide).

    ``init_sqrt`` (``[G, M, M]``, e.g. chol Kuu for the unwhitened parameterisation) sets the
    initial S^{1/2} of every latent function; the default is the identity (S = I).
    """
    if structure not in COVARIANCE_STRUCTURES:
        raise ValueError(f"q_structure must be one of {COVARIANCE_STRUCTURES}, got {structure!r}")
    L_, G, M = num_latent, num_groups, num_inducing
    dtype = dtype or jnp.result_type(float)
    q_mu = numpyro.param("q_mu", lambda key: jnp.zeros((L_, G * M), dtype))

    def init(key):
        blocks = jnp.broadcast_to(jnp.eye(M, dtype=dtype), (G, M, M)) if init_sqrt is None else init_sqrt
        blocks = jnp.broadcast_to(blocks, (L_, G, M, M))
        if structure == "block":
            return blocks
        dense = sqrt_dense(blocks, "block")
        return dense if structure == "full" else jnp.diagonal(dense, axis1=-2, axis2=-1)

    constraint = constraints.positive if structure == "diag" else Q_SQRT
    q_sqrt = numpyro.param("q_sqrt", init, constraint=constraint)
    return q_mu, q_sqrt


# ----------------------------------------------------------------------------- distributions
class InducingPosterior(dist.Distribution):
    """q(u) (or q(v) when whitened): independent Gaussians per latent function, event ``[L, GM]``."""

    arg_constraints = {"q_mu": constraints.real}
    support = constraints.real
    reparametrized_params = ["q_mu", "q_sqrt"]

    def __init__(self, q_mu, q_sqrt, structure: str = "full", *, validate_args=None):
        self.q_mu, self.q_sqrt, self.structure = q_mu, q_sqrt, structure
        super().__init__(batch_shape=(), event_shape=q_mu.shape, validate_args=validate_args)

    def sample(self, key, sample_shape=()):
        eps = draws.normal(key, sample_shape + self.q_mu.shape, self.q_mu.dtype)  # [..., L, GM]
        chol = sqrt_dense(self.q_sqrt, self.structure)  # [L, GM, GM]
        return self.q_mu + jnp.einsum("lij,...lj->...li", chol, eps)

    def log_prob(self, value):
        chol = sqrt_dense(self.q_sqrt, self.structure)  # [L, GM, GM]
        diff = jnp.moveaxis(value - self.q_mu, -2, 0)[..., None]  # [L, ..., GM, 1]
        chol_b = chol.reshape(chol.shape[:1] + (1,) * (diff.ndim - 3) + chol.shape[1:])
        white = solve_triangular(chol_b, diff, lower=True)[..., 0]  # [L, ..., GM]
        half_logdet = jnp.sum(jnp.log(sqrt_diag(self.q_sqrt, self.structure)))
        n = self.q_mu.size
        return -0.5 * jnp.sum(white**2, axis=(0, -1)) - half_logdet - 0.5 * n * LOG_2PI

    def tree_flatten(self):
        return (self.q_mu, self.q_sqrt), self.structure

    @classmethod
    def tree_unflatten(cls, aux, params):
        return cls(*params, structure=aux)


class InducingPrior(dist.Distribution):
    """p(u) = N(0, blockdiag Kuu) per latent function, or p(v) = N(0, I) when whitened."""

    arg_constraints = {}
    support = constraints.real

    def __init__(self, Luu, num_latent: int, whiten: bool, *, validate_args=None):
        self.Luu, self.num_latent, self.whiten = Luu, num_latent, whiten  # Luu [G, M, M]
        G, M, _ = Luu.shape
        super().__init__(batch_shape=(), event_shape=(num_latent, G * M), validate_args=validate_args)

    def sample(self, key, sample_shape=()):
        eps = draws.normal(key, sample_shape + self.event_shape, self.Luu.dtype)
        if self.whiten:
            return eps
        return blockdiag_matvec(self.Luu, eps)

    def log_prob(self, value):
        G, M, _ = self.Luu.shape
        if self.whiten:
            white, half_logdet = value, 0.0
        else:
            white = blockdiag_solve(self.Luu, value)
            half_logdet = self.num_latent * jnp.sum(jnp.log(jnp.diagonal(self.Luu, axis1=-2, axis2=-1)))
        return -0.5 * jnp.sum(white**2, axis=(-2, -1)) - half_logdet - 0.5 * self.num_latent * G * M * LOG_2PI

    def tree_flatten(self):
        return (self.Luu,), (self.num_latent, self.whiten)

    @classmethod
    def tree_unflatten(cls, aux, params):
        return cls(params[0], *aux)


def blockdiag_matvec(Luu, v):
    """``blockdiag(Luu) v`` for v ``[..., L, GM]``."""
    G, M, _ = Luu.shape
    vg = v.reshape(v.shape[:-1] + (G, M))  # [..., L, G, M]
    return jnp.einsum("gij,...gj->...gi", Luu, vg).reshape(v.shape)


def blockdiag_solve(Luu, v):
    """``blockdiag(Luu)^{-1} v`` for v ``[..., L, GM]``."""
    G, M, _ = Luu.shape
    vg = jnp.moveaxis(v.reshape(v.shape[:-1] + (G, M)), -2, 0)[..., None]  # [G, ..., L, M, 1]
    Lb = Luu.reshape((G,) + (1,) * (vg.ndim - 3) + (M, M))
    out = solve_triangular(Lb, vg, lower=True)[..., 0]  # [G, ..., L, M]
    return jnp.moveaxis(out, 0, -2).reshape(v.shape)


@kl_divergence.register(InducingPosterior, InducingPrior)
def _kl_inducing(q, p):
    """KL[q(u) || p(u)], analytic (van der Wilk et al. 2017, eq. 5's KL term), summed over latent functions."""
    L_, GM = q.q_mu.shape
    logdet_q = 2.0 * jnp.sum(jnp.log(sqrt_diag(q.q_sqrt, q.structure)))
    if p.whiten:
        trace = jnp.sum(q.q_sqrt**2)  # tr S = ||S^{1/2}||_F^2 for every structure
        maha = jnp.sum(q.q_mu**2)
        logdet_p = 0.0
    else:
        G, M, _ = p.Luu.shape
        # tr(Kuu^{-1} S) = || blockdiag(Luu)^{-1} S^{1/2} ||_F^2, block by block
        if q.structure == "diag":
            cols = jax.vmap(jnp.diag)(q.q_sqrt)  # [L, GM, GM] (diag only: cheap to form per block below)
            trace = jnp.sum(blockdiag_solve(p.Luu, jnp.swapaxes(cols, -1, -2)) ** 2)
        elif q.structure == "block":
            trace = jnp.sum(block_solve(p.Luu[None], q.q_sqrt) ** 2)
        else:
            trace = jnp.sum(blockdiag_solve(p.Luu, jnp.swapaxes(q.q_sqrt, -1, -2)) ** 2)
        maha = jnp.sum(blockdiag_solve(p.Luu, q.q_mu) ** 2)
        logdet_p = 2.0 * L_ * jnp.sum(jnp.log(jnp.diagonal(p.Luu, axis1=-2, axis2=-1)))
    return 0.5 * (trace + maha - L_ * GM + logdet_p - logdet_q)


# ----------------------------------------------------------------------------- conditional
def conditional(Kuf, Luu, Kff_diag, q_mu, q_sqrt, structure: str, whiten: bool):
    """Marginals of q(f_n) = ∫ p(f_n | u) q(u) du (van der Wilk et al. 2017, eq. 6), shared by every family.

    Kuf ``[G, M, N]``, Luu ``[G, M, M]`` (chol of Kuu + jitter), Kff_diag ``[N]``,
    q_mu ``[L, GM]``. Returns mean, var ``[N, L]``.
    """
    G, M, N = Kuf.shape
    A = block_solve(Luu, Kuf)  # [G, M, N]  Luu^{-1} Kuf
    prior_var = Kff_diag - jnp.sum(A**2, axis=(0, 1))  # [N]  diag(Kff - Qff)
    B = A if whiten else block_solve(Luu, A, transpose=True)  # [G, M, N]  (Kuu^{-1} Kuf unwhitened)
    B = B.reshape(G * M, N)  # [GM, N]
    mean = (q_mu @ B).T  # [N, L]
    SB = sqrt_times(q_sqrt, structure, B)  # [L, GM, N]
    var = prior_var[:, None] + jnp.sum(SB**2, axis=1).T  # [N, L]
    return mean, var
