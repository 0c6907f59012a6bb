"""Deep kernel machines (DKMs) with stochastic kernel regularisation: the network as a pure-JAX program.

Implements Milsom, Anson, Aitchison 2024 (§2-3, Algorithm 1, App. A): fully connected and
convolutional DKMs whose learned quantities are the inducing Gram matrices G^ℓ_ii of every layer,
trained on the DKM objective (their eq. 2; inducing form eq. 27)

    L = Σ_n E_q[log p(y_n | f_n)] − Σ_ℓ ν_ℓ KL(N(0, G^ℓ_ii) ‖ N(0, K^ℓ_ii)) − w_out Σ_c KL(N(μ_c, Σ) ‖ N(0, K^out_ii)).

The intermediate KLs carry ν_ℓ because the deep GP behind a DKM has N_ℓ = N ν_ℓ features per layer
and its prior is tempered by β = 1/N (App. A.1, eq. 12-14); the output-layer KL is not tempered
(w_out = 1, eq. 14/27a) unless ``output_kl_weight`` says otherwise (e.g. 1/C, "per class").
Under minibatching the likelihood sum is scaled by num_data / batch_size. This module computes the
network (the Gram layers, their KL terms, the output kernel); the objective is the bound of the
NumPyro program built on it (:mod:`gpzoo.inference.dkm_family`), which ``gpzoo.fit`` maximises.

One Gram layer ℓ (Algorithm 1):

1. kernel nonlinearity Φ on the previous blocks (arc-cosine or normalised Gaussian, learned scale
   and bias; :mod:`gpzoo.models.kernels.gram`);
2. mixing C^ℓ: a convolution (conv) or a matrix (fully connected, only where widths change);
   this gives K^ℓ = (K_ii, K_ti, diag K_tt);
3. stochastic kernel regularisation (SKR, §3.1, eq. 4): G̃_ii ~ W(G_ii/γ, γ) + λI in training,
   G̃_ii = G_ii + λI at test time (γ = ceil(P/4), λ = 0.1 by default);
4. Nyström prediction (App. A.3, eq. 32): G_ti = K_ti K_ii⁻¹ G̃_ii and
   diag G_tt = diag(K_ti K_ii⁻¹ G̃_ii K_ii⁻¹ K_it) + diag(K_tt − K_ti K_ii⁻¹ K_it), by triangular
   solves against chol(K_ii) (never an inverse);
5. optional batch kernel normalisation and a skip connection (convex combination).

The KL uses G_ii; the next layer uses G̃_ii. G_ii = V Vᵀ with V lower triangular with a positive
(exponentiated) diagonal; at :func:`init_params` every V is the Cholesky factor of the K it sees
on a first, deterministic pass, so G = K in every layer (the NNGP start) and every KL is 0.

Numerics (§3.2): everything runs in the dtype of the inputs (float32 end to end works). A failed
Cholesky or a Nyström residual below −``residual_tol``·K_t is reported, with the layer and the
stage, as a :class:`~gpzoo.models.errors.NumericalError` (never a NaN result): eagerly by
:func:`init_params` / :func:`predict` (:func:`check_numerics`), and by ``gpzoo.fit`` at the
training step where it happens (:func:`gpzoo.inference.dkm_family.fit_dkm`). Small negative
residuals are rounding and are clipped to 0. The condition number of every G_ii is in the
diagnostics (``aux["condition"]``, with ``record_condition``; :func:`gram_condition_numbers` on the host).

Parameters are a plain pytree (dicts and tuples of arrays), so jax.jit takes them as is;
:class:`DKMConfig` holds everything static.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve, solve_triangular

from gpzoo.models import draws
from gpzoo.models.errors import (
    InvalidArgumentError,
    NumericalError,
    ShapeError,
    as_float_array,
    is_concrete,
)
from gpzoo.inference.programs import freeze
from gpzoo.models.dkm import KL_FORMS, DKMConfig, GramLayerSpec
from gpzoo.models.kernels.gram import (
    GRAM_KERNELS,
    GramBlocks,
    batch_kernel_norm,
    conv_mix,
    conv_output_shape,
    convex_combination,
    dense_mix,
    diagonal,
    flatten_mix,
    global_average_pool,
    linear_input_gram,
    patch_input_gram,
)

__all__ = [
    "GramLayerSpec",
    "DKMConfig",
    "KL_FORMS",
    "chol_factor",
    "raw_from_chol",
    "wishart_skr",
    "nystrom",
    "gram_kl",
    "init_params",
    "forward",
    "compiled_forward",
    "predict",
    "check_numerics",
    "gram_condition_numbers",
    "gram_layers",
    "layer_name",
    "output_checks",
    "output_kernel",
    "skr_noise",
    "skr_noise_shapes",
    "wishart_from_noise",
]

def layer_name(index: int) -> str:
    return f"layer {index + 1}"


# --------------------------------------------------------------------------- parameterisation


def chol_factor(raw):
    """Lower-triangular V with positive diagonal from an unconstrained ``raw [P, P]``.

    V = (tril(raw, −1) + diag(exp(diag raw))) / √P, so G = V Vᵀ; the 1/√P keeps the learned
    entries O(1) for the optimiser.
    """
    P = raw.shape[-1]
    below = np.arange(P)[:, None] > np.arange(P)[None, :]  # [P, P] strictly lower
    on = np.eye(P, dtype=bool)  # [P, P]
    # one select, no gather/scatter of the diagonal: exp(raw) on it, raw below, 0 above
    return jnp.where(below, raw, jnp.where(on, jnp.exp(jnp.where(on, raw, 0.0)), 0.0)) / math.sqrt(P)  # [P, P]


def raw_from_chol(L):
    """Inverse of :func:`chol_factor`: the ``raw [P, P]`` whose factor is the Cholesky factor L."""
    P = L.shape[-1]
    scaled = L * math.sqrt(P)  # [P, P]
    return jnp.tril(scaled, -1) + jnp.diag(jnp.log(diagonal(scaled)))


# --------------------------------------------------------------------------- SKR, Nyström, KL


def wishart_skr(key, G_chol, gamma: int, jitter: float, train: bool = True):
    """Stochastic kernel regularisation (Milsom et al. 2024, eq. 4 and §3.1).

    train: G̃ = (1/γ) (V E)(V E)ᵀ + λI with E ``[P, γ]`` standard normal, i.e. a draw of
    W(G/γ, γ) + λI for G = V Vᵀ (V = ``G_chol [P, P]``): mean G + λI, Var(G̃_ij) =
    (G_ij² + G_ii G_jj)/γ, and rank(G̃ − λI) = min(γ, P) (γ < P is allowed, §3.1: the jitter λ
    keeps G̃ positive definite). Test time (``train=False``): G + λI, deterministic.
    """
    P = G_chol.shape[-1]
    if not train:
        return G_chol @ G_chol.T + jitter * jnp.eye(P, dtype=G_chol.dtype)  # [P, P]
    return wishart_from_noise(G_chol, draws.normal(key, (P, gamma), G_chol.dtype), jitter)


def wishart_from_noise(G_chol, noise, jitter: float):
    """G̃ = (1/γ) (V E)(V E)ᵀ + λI for V = ``G_chol [P, P]`` and standard-normal E = ``noise [P, γ]``.

    The SKR draw of :func:`wishart_skr` with its noise given: the generative program
    (:mod:`gpzoo.inference.dkm_family`) samples E as a NumPyro site and hands it in here.
    """
    gamma = noise.shape[-1]
    F = G_chol @ noise  # [P, γ]
    return F @ F.T / gamma + jitter * jnp.eye(G_chol.shape[-1], dtype=G_chol.dtype)  # [P, P]


def skr_noise_shapes(config: DKMConfig) -> tuple[tuple[int, int], ...]:
    """Shape ``(P_ℓ, γ_ℓ)`` of the SKR noise E_ℓ of every Gram layer."""
    return tuple((spec.num_inducing, config.layer_gamma(i)) for i, spec in enumerate(config.layers))


def skr_noise(key, config: DKMConfig, dtype):
    """One standard-normal E_ℓ ``[P_ℓ, γ_ℓ]`` per Gram layer (the keys :func:`wishart_skr` would use)."""
    keys = jax.random.split(key, config.num_layers)
    return tuple(draws.normal(k, shape, dtype) for k, shape in zip(keys, skr_noise_shapes(config)))


def default_residual_tol(dtype) -> float:
    return 10.0 * float(np.sqrt(np.finfo(dtype).eps))


def _moments_forward(K_ii, K_it, k_t, Sigma, mean, shared: bool):
    """Forward of :func:`_nystrom_moments`: outputs and the residuals its VJP reads."""
    L = jnp.linalg.cholesky(K_ii)  # [P, P]
    X = solve_triangular(L, K_it, lower=True)  # [P, N] = L⁻¹ K_it
    W = solve_triangular(L, X, lower=True, trans="T")  # [P, N] = K⁻¹ K_it
    SW = Sigma @ W  # [P, N]
    residual = k_t - jnp.sum(X * X, axis=0)  # [N]
    positive = residual > 0.0  # [N]
    out_t = jnp.sum(W * SW, axis=0) + jnp.where(positive, residual, 0.0)  # [N]
    ratio = residual / jnp.maximum(jnp.abs(k_t), jnp.finfo(k_t.dtype).tiny)  # [N]
    if shared:
        out_ti = SW.T  # [N, P] = K_ti K⁻¹ Σ
        mean_solved, kl_mean = None, jnp.zeros((), K_ii.dtype)
    else:
        out_ti = W.T @ mean  # [N, C]
        m = solve_triangular(L, mean, lower=True)  # [P, C] = L⁻¹ mean
        kl_mean = 0.5 * jnp.sum(m * m)
        mean_solved = solve_triangular(L, m, lower=True, trans="T")  # [P, C] = K⁻¹ mean
    outputs = (out_ti, out_t, kl_mean, jnp.min(ratio), L)
    return outputs, (L, W, SW, positive, Sigma, mean, mean_solved)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _nystrom_moments(K_ii, K_it, k_t, Sigma, mean, shared: bool):
    """Nyström moments with K = K_ii factorised inside, and their VJP in closed form.

    With W = K⁻¹ K_it ``[P, N]`` (two triangular solves against L = chol K_ii, via X = L⁻¹ K_it):

        out_ti = Wᵀ mean ``[N, C]`` (``shared``: mean = Σ, out_ti = (Σ W)ᵀ ``[N, P]``),
        out_t  = diag(Wᵀ Σ W) + max(k_t − ‖X‖², 0) ``[N]``,
        kl_mean = ½ meanᵀ K⁻¹ mean (0 when ``shared``),

    plus the smallest relative residual and L (diagnostics: no gradient flows through them).
    The VJP (cotangents ō_ti, ō_t, c̄; q̄ = ō_t, r̄ = ō_t where the residual is positive):

        W̄ = mean ō_tiᵀ + 2 Σ W diag(q̄),  Z = K⁻¹ W̄,
        K̄_it = Z − 2 W diag(r̄),  K̄_ii = −(Z − W diag(r̄)) Wᵀ − ½ c̄ K⁻¹mean meanᵀK⁻¹,
        Σ̄ = W diag(q̄) Wᵀ (+ W ō_ti when shared),  mean̄ = W ō_ti + c̄ K⁻¹ mean,  k̄_t = r̄.

    It never differentiates through the Cholesky factorisation (autodiff would, with two triangular
    solves and three products per factor) and stacks the two ``[P, N] × [N, P]`` products into one.
    """
    return _moments_forward(K_ii, K_it, k_t, Sigma, mean, shared)[0]


def _nystrom_moments_fwd(K_ii, K_it, k_t, Sigma, mean, shared):
    return _moments_forward(K_ii, K_it, k_t, Sigma, mean, shared)


def _nystrom_moments_bwd(shared, residuals, cotangents):
    L, W, SW, positive, Sigma, mean, mean_solved = residuals
    o_ti, o_t, c_kl = cotangents[:3]
    r = jnp.where(positive, o_t, 0.0)  # [N]
    if shared:
        W_bar = Sigma @ (o_ti.T + 2.0 * W * o_t)  # [P, N]
    else:
        W_bar = mean @ o_ti.T + 2.0 * SW * o_t  # [P, N]
    Z = solve_triangular(L, solve_triangular(L, W_bar, lower=True), lower=True, trans="T")  # [P, N] = K⁻¹ W̄
    Wq = W * o_t  # [P, N]
    P = W.shape[0]
    if shared:  # one [2P, N] × [N, P] product: rows [−K̄_ii; Σ̄ᵀ]
        stacked = jnp.concatenate([Z - W * r, o_ti.T + Wq], axis=0) @ W.T  # [2P, P]
        K_bar, Sigma_bar, mean_bar = -stacked[:P], stacked[P:].T, jnp.zeros_like(mean)
    else:
        stacked = jnp.concatenate([Z - W * r, Wq], axis=0) @ W.T  # [2P, P]
        K_bar = -stacked[:P] - 0.5 * c_kl * (mean_solved @ mean_solved.T)
        Sigma_bar, mean_bar = stacked[P:].T, W @ o_ti + c_kl * mean_solved
    return K_bar, Z - 2.0 * W * r, r, Sigma_bar, mean_bar


_nystrom_moments.defvjp(_nystrom_moments_fwd, _nystrom_moments_bwd)


def nystrom(K_ii, K_ti, K_t, Sigma, mean=None, residual_tol: float | None = None):
    """Nyström prediction (Milsom et al. 2024, eq. 32 / Algorithm 1), K_ii factorised inside, with a
    closed-form VJP (:func:`_nystrom_moments`): triangular solves against L = chol K_ii, never an inverse.

    K_ii ``[P, P]`` (jitter included), K_ti ``[B, *S, P]``, K_t ``[B, *S]``, Sigma ``[P, P]``.

    * ``mean`` None — a Gram layer's step with G̃_ii = Sigma: G_ti = K_ti K⁻¹ G̃ and
      G_t = diag(K_ti K⁻¹ G̃ K⁻¹ K_it) + max(K_t − diag(K_ti K⁻¹ K_it), 0); returns
      ``(GramBlocks(Sigma, G_ti, G_t), checks, L)``.
    * ``mean [P, C]`` — the output GP's marginals f_mean = K_ti K⁻¹ mean ``[B, C]`` and
      f_var = diag(K_ti K⁻¹ Σ K⁻¹ K_it) + max(residual, 0) ``[B]``; returns
      ``((f_mean, f_var, ½ meanᵀK⁻¹mean), checks, L)``.

    ``checks["residual_ok"]`` is False when some residual K_tt·i < −residual_tol · K_t (rounding
    above that is clipped to 0), ``checks["chol_ok"]`` is False when the factorisation failed; ``checks``
    and L carry no gradient.
    """
    shape = K_ti.shape  # [B, *S, P]
    P = shape[-1]
    tol = default_residual_tol(K_ti.dtype) if residual_tol is None else residual_tol
    shared = mean is None
    out_ti, out_t, kl_mean, min_ratio, L = _nystrom_moments(
        K_ii, K_ti.reshape(-1, P).T, K_t.reshape(-1), Sigma, Sigma if shared else mean, shared)
    min_ratio, L = jax.lax.stop_gradient(min_ratio), jax.lax.stop_gradient(L)
    # a failed factorisation is NaN on the whole lower triangle, so its diagonal tells
    checks = {"min_residual": min_ratio, "residual_ok": min_ratio >= -tol, "chol_ok": jnp.all(jnp.isfinite(diagonal(L)))}
    if shared:
        return GramBlocks(Sigma, out_ti.reshape(shape), out_t.reshape(K_t.shape)), checks, L
    return (out_ti, out_t, kl_mean), checks, L


@jax.custom_vjp
def _taylor_frobenius(G_chol, K):
    """¼‖G⁻¹K − I‖²_F for G = V Vᵀ (V = ``G_chol`` lower triangular), with its VJP in closed form.

    With D = G⁻¹K − I and E = G⁻¹D: K̄ = ½ E, Ḡ = −½ E (D + I)ᵀ, V̄ = tril((Ḡ + Ḡᵀ) V) (only V's
    lower triangle is read). Two triangular solves and two products, where autodiff of ``cho_solve``
    takes four solves and three products.
    """
    return _taylor_frobenius_fwd(G_chol, K)[0]


def _taylor_frobenius_fwd(G_chol, K):
    D = cho_solve((G_chol, True), K) - jnp.eye(K.shape[-1], dtype=K.dtype)  # [P, P] = G⁻¹K − I
    return 0.25 * jnp.sum(D * D), (G_chol, D)


def _taylor_frobenius_bwd(residuals, f_bar):
    G_chol, D = residuals
    E = cho_solve((G_chol, True), D)  # [P, P] = G⁻¹D
    G_bar = -0.5 * f_bar * (E @ (D.T + jnp.eye(D.shape[-1], dtype=D.dtype)))  # [P, P]
    return jnp.tril((G_bar + G_bar.T) @ G_chol), 0.5 * f_bar * E


_taylor_frobenius.defvjp(_taylor_frobenius_fwd, _taylor_frobenius_bwd)


@jax.custom_vjp
def _exact_kl(G_chol, K, K_chol):
    """½[tr(K⁻¹G) − P + log|K| − log|G|] for G = V Vᵀ (V = ``G_chol``) and K = L Lᵀ (L = ``K_chol``, a
    factor of K computed elsewhere), with its VJP in closed form.

    tr(K⁻¹G) = ‖L⁻¹V‖²_F and the log-determinants come from the factors' diagonals. With B = K⁻¹V:
    K̄ = ½ (K⁻¹ − B Bᵀ) and V̄ = B − diag(1/V_ii) (only V's lower triangle is read). The gradient
    reaches K through this formula, never through L, so the caller may pass a factor it already has
    (the Nyström step's) and no Cholesky factorisation is differentiated.
    """
    return _exact_kl_fwd(G_chol, K, K_chol)[0]


def _exact_kl_fwd(G_chol, K, K_chol):
    L = K_chol
    A = solve_triangular(L, G_chol, lower=True)  # [P, P] = L⁻¹V
    logdet_K = 2.0 * jnp.sum(jnp.log(diagonal(L)))
    logdet_G = 2.0 * jnp.sum(jnp.log(diagonal(G_chol)))
    return 0.5 * (jnp.sum(A * A) - K.shape[-1] + logdet_K - logdet_G), (G_chol, L, A)


def _exact_kl_bwd(residuals, f_bar):
    G_chol, L, A = residuals
    P = L.shape[-1]
    B = solve_triangular(L, A, lower=True, trans="T")  # [P, P] = K⁻¹V
    K_inv = cho_solve((L, True), jnp.eye(P, dtype=L.dtype))  # [P, P]
    K_bar = 0.5 * f_bar * (K_inv - B @ B.T)
    G_bar = f_bar * (B - jnp.diag(1.0 / diagonal(G_chol)))
    return G_bar, K_bar, jnp.zeros_like(L)


_exact_kl.defvjp(_exact_kl_fwd, _exact_kl_bwd)


def gram_kl(G_chol, K_chol, K, form: str = "taylor_symmetric"):
    """KL(N(0, G) ‖ N(0, K)) for G = V Vᵀ (V = ``G_chol``), K = L Lᵀ (``K_chol``), all ``[P, P]``.
    Only the exact form reads ``K_chol`` (None: it factorises K itself); the Taylor forms read K and
    take ``K_chol=None``. Gradients reach K through K itself, never through ``K_chol``.

    ``"exact"``: ½[tr(K⁻¹G) − P + log|K| − log|G|], tr(K⁻¹G) = ‖L⁻¹V‖²_F, log-determinants
    from the factors' diagonals, with a closed-form VJP (:func:`_exact_kl`).

    The Taylor forms (Milsom et al. 2024, §3.2, eq. 5-8) expand in the eigenvalues λ_i of G⁻¹K
    around 1: KL = ½ Σ_i (1/λ_i − 1 + log λ_i) = ¼ Σ_i (λ_i − 1)² + O((λ − 1)³). The paper's
    eq. 6-7 expand the log-determinant and trace terms without the Gaussian KL's leading ½, so its
    eq. 8 reads ½‖G⁻¹K − I‖²_F, twice the second-order term. ``"milsom_eq8"`` is that expression
    literally (what the paper's ν multiplies); the other two Taylor forms are in KL units (the ¼),
    so they can be compared with the exact KL and share one ν with it.

    * ``"milsom_eq8"`` — the paper's eq. 8 as printed: ½‖G⁻¹K − I‖²_F, twice ``"taylor_frobenius"``
      (so the same ν weighs it twice as much as the KL it approximates).
    * ``"taylor_frobenius"`` — eq. 8's Frobenius form in KL units: ¼‖G⁻¹K − I‖²_F (G⁻¹K by
      ``cho_solve`` on V). ‖A − I‖²_F = Σ(λ_i − 1)² only when A = G⁻¹K is normal, i.e. when G and
      K commute; otherwise it is larger (Schur's inequality), an extra penalty on non-commuting G.
    * ``"taylor_symmetric"`` (the default) — the true second-order term ¼‖V⁻¹ K V⁻ᵀ − I‖²_F:
      V⁻¹KV⁻ᵀ is symmetric with the eigenvalues of G⁻¹K, so this equals ¼ Σ(λ_i − 1)² exactly.
      Same cost (two triangular solves against V) and, like eq. 8, it only ever factorises and
      differentiates through the learned factor V, never through K (the paper's stability reason).

    Measured difference (float64, measured with this function): P = 32 inducing points,
    K = arc-cosine kernel of the Gram matrix X Xᵀ/8 of 32 standard-normal points in 8 dimensions,
    plus 1e-6·I (cond(K) ≈ 1e3); G = L(I + εS)Lᵀ with L = chol(K), S = (E + Eᵀ)/(2√P), E standard
    normal (a symmetric perturbation in K's whitened frame, so G and K do not commute). ε = 0.05:
    exact KL 9.86e-3, symmetric Taylor 9.91e-3 (+0.5 %), Frobenius 0.244 (24.7× the exact KL);
    ε = 0.01: 3.94e-4, 3.94e-4 (−0.01 %), 9.69e-3 (24.6×). With the same S and ε = 0.01 but
    K = Q diag(geomspace(1, 1/c)) Qᵀ (random orthogonal Q), the Frobenius/exact ratio is 1.65×,
    25× and 1.0e3× for c = 1e1, 1e3, 1e5, while the symmetric form stays within 0.01 % of the
    exact KL: the excess of eq. 8 grows with cond(K) (the non-normality of G⁻¹K), not with the
    size of the perturbation, so with the paper's form ν acts as a much stronger, conditioning-
    dependent penalty. The default here is ``"taylor_symmetric"``; ``"milsom_eq8"`` reproduces the
    paper's objective.
    """
    P = K.shape[-1]
    eye = jnp.eye(P, dtype=K.dtype)
    if form == "exact":
        return _exact_kl(G_chol, K, jnp.linalg.cholesky(jax.lax.stop_gradient(K)) if K_chol is None else K_chol)
    if form == "taylor_frobenius":
        return _taylor_frobenius(G_chol, K)  # ¼‖D‖²_F, D = G⁻¹K − I
    if form == "milsom_eq8":
        return 2.0 * _taylor_frobenius(G_chol, K)  # ½‖D‖²_F, the paper's eq. 8 as printed
    if form == "taylor_symmetric":
        A = solve_triangular(G_chol, K, lower=True)  # [P, P] = V⁻¹K
        D = solve_triangular(G_chol, A.T, lower=True) - eye  # [P, P] = V⁻¹KV⁻ᵀ − I
        return 0.25 * jnp.sum(D * D)
    raise InvalidArgumentError("kl", f"must be one of {KL_FORMS}, got {form!r}")


# --------------------------------------------------------------------------- input checks


def _check_inputs(config: DKMConfig, X, y=None):
    """Eager shape/dtype checks naming the argument; skipped under tracing."""
    if not is_concrete(X):
        return
    expected = 2 if config.architecture == "fc" else 4
    arr = as_float_array(X, "X", ndim=expected)
    if arr.shape[0] < 1:
        raise ShapeError("X", "needs at least one row")
    if y is not None and is_concrete(y):
        y_arr = np.asarray(y)
        if y_arr.shape[0] != arr.shape[0]:
            raise ShapeError("y", f"has {y_arr.shape[0]} rows but X has {arr.shape[0]}")
        config.likelihood.validate_targets(y_arr)


# --------------------------------------------------------------------------- the forward program


def _input_gram(params, config: DKMConfig, X) -> GramBlocks:
    if config.architecture == "fc":
        return linear_input_gram(params["inducing_inputs"], X)  # ii [P0,P0], ti [B,P0], t [B]
    return patch_input_gram(params["inducing_inputs"], X)  # ii [P0,P0], ti [B,H,W,P0], t [B,H,W]


def _mix(config: DKMConfig, weights, G: GramBlocks, stride: int) -> GramBlocks:
    scaled = weights / math.sqrt(weights.shape[-2])  # learned entries O(1); C ~ 1/√P_in
    return conv_mix(G, scaled, stride) if config.architecture == "conv" else dense_mix(G, scaled)


def _layer_prior(lp, spec: GramLayerSpec, config: DKMConfig, G_prev: GramBlocks) -> GramBlocks:
    """Φ then mixing: the prior kernel K^ℓ of layer ℓ from the previous blocks."""
    Phi = GRAM_KERNELS[config.kernel](G_prev, jnp.exp(lp["log_scale"]), jnp.exp(lp["log_bias"]))
    if "mix" in lp:
        return _mix(config, lp["mix"], Phi, spec.stride)
    return Phi


def _jittered(K_ii, rel_jitter: float):
    P = K_ii.shape[-1]
    jitter = rel_jitter * jnp.mean(diagonal(K_ii))
    return K_ii + jitter * jnp.eye(P, dtype=K_ii.dtype), jitter


def _cond_from_chol(V):
    s = jnp.linalg.svd(jax.lax.stop_gradient(V), compute_uv=False)  # [P]
    return (s[0] / s[-1]) ** 2


def gram_layers(params, config: DKMConfig, X, noise=None, *, _init: bool = False):
    """The input Gram, every Gram layer and the conv head: the DKM up to its output kernel (traceable).

    ``noise``: the SKR noise E_ℓ of every layer (:func:`skr_noise`; training), or None for the
    test-time G̃_ℓ = G_ℓ + λI. Returns ``(G, blocks, aux, layers)``: the flat Gram blocks the
    output kernel sees, the last Gram layer's blocks (before the head), the diagnostics (per
    layer ``checks``, ``kl``, ``jitter``, ``K_ii`` and, if ``record_condition``, ``condition``),
    and the layer parameters (with every V set to chol K_ii when ``_init``).
    """
    aux = {"checks": {}, "kl": {}, "jitter": {}, "condition": {}, "K_ii": {}}
    new_layers = []
    G = _input_gram(params, config, X)
    history = {-1: G}
    for index, spec in enumerate(config.layers):
        name = layer_name(index)
        lp = dict(params["layers"][index])
        K = _layer_prior(lp, spec, config, G)  # ii [P,P], ti [B,*S,P], t [B,*S]
        K_ii, jitter = _jittered(K.ii, config.kernel_jitter)
        if _init:  # the NNGP start: G_ii = K_ii
            lp["V"] = raw_from_chol(jnp.linalg.cholesky(K_ii))
        V = chol_factor(lp["V"])  # [P, P]
        if noise is None:
            G_tilde = wishart_skr(None, V, config.layer_gamma(index), config.skr_jitter, train=False)  # [P, P]
        else:
            G_tilde = wishart_from_noise(V, noise[index], config.skr_jitter)  # [P, P]
        G, checks, K_chol = nystrom(K_ii, K.ti, K.t, G_tilde, residual_tol=config.residual_tol)
        aux["checks"][name] = checks
        aux["kl"][name] = gram_kl(V, K_chol, K_ii, config.kl)  # the exact form reuses the Nyström step's factor
        aux["jitter"][name] = jitter
        aux["K_ii"][name] = K_ii  # [P, P], the prior covariance of G_ii (jitter included)
        if config.record_condition:
            aux["condition"][name] = _cond_from_chol(V)
        if spec.batch_norm:
            G = batch_kernel_norm(G, lp["bn_log_scale_inducing"], lp["bn_log_scale_data"], config.batch_norm_mode)
        if spec.skip_from is not None:
            shortcut = history[spec.skip_from]
            if "skip_mix" in lp:
                shortcut = _mix(config, lp["skip_mix"], shortcut, _skip_stride(config, index))
            G = convex_combination(G, shortcut, 0.5)
        history[index] = G
        new_layers.append(lp)

    blocks = G
    if config.architecture == "conv":
        if config.head == "gap":
            G, head_checks = global_average_pool(G, config.kernel_jitter * jnp.mean(diagonal(G.ii)))
            aux["checks"]["head"] = {
                "chol_ok": head_checks["chol_ok"],
                "min_residual": head_checks["min_residual"],
                "residual_ok": head_checks["min_residual"] >= -_residual_tol(config, G.ti.dtype),
            }
        else:
            G = flatten_mix(G, params["head_mix"] / math.sqrt(params["head_mix"].shape[-2]))
    return G, blocks, aux, tuple(new_layers)


def _residual_tol(config: DKMConfig, dtype) -> float:
    return default_residual_tol(dtype) if config.residual_tol is None else config.residual_tol


def _output_prior(output_params, config: DKMConfig, G: GramBlocks):
    K = GRAM_KERNELS[config.kernel](G, jnp.exp(output_params["log_scale"]), jnp.exp(output_params["log_bias"]))
    K_ii, jitter = _jittered(K.ii, config.kernel_jitter)
    return GramBlocks(K_ii, K.ti, K.t), jitter


def output_kernel(output_params, config: DKMConfig, G: GramBlocks):
    """The output GP's kernel blocks from the last flat Gram blocks: ``(K, L, jitter)``.

    K = Φ(G) with the output layer's scale and bias (ii ``[P, P]``, ti ``[B, P]``, t ``[B]``);
    L = chol(K_ii + jitter·I) ``[P, P]``, the prior covariance of the output inducing values.
    """
    K, jitter = _output_prior(output_params, config, G)
    return K, jnp.linalg.cholesky(K.ii), jitter


def output_checks(config: DKMConfig, K: GramBlocks, L, X_s):
    """Numerics of the output layer: Cholesky finite, Nyström residual K_t − ‖L⁻¹k_t‖² not too negative."""
    residual = K.t - jnp.sum(X_s * X_s, axis=0)  # [B]
    ratio = residual / jnp.maximum(jnp.abs(K.t), jnp.finfo(K.t.dtype).tiny)  # [B]
    checks = {"chol_ok": jnp.all(jnp.isfinite(L)), "min_residual": jnp.min(ratio),
              "residual_ok": jnp.min(ratio) >= -_residual_tol(config, K.t.dtype)}
    return residual, checks


def forward(params, config: DKMConfig, X, key=None, train: bool = False, *, _init: bool = False):
    """Propagate a batch through every layer. Returns ``(out, aux)`` (traceable, no host checks).

    out: ``f_mean [B, C]`` and ``f_var [B]`` of the output GP (shared across classes) and
    ``blocks`` (the last Gram layer's blocks before the head). aux: per layer ``checks``, ``kl``,
    ``jitter``, ``K_ii`` (the prior covariance the KL compares G_ii with) and, if
    ``record_condition``, ``condition`` = cond(G_ii).
    With ``_init=True`` every V (and Σ of the output layer) is set to chol of the K it sees, and
    the updated parameters are returned in ``out["params"]`` (the NNGP start).
    """
    if train and key is None:
        raise InvalidArgumentError("key", "training mode samples the SKR Wishart noise and needs a PRNG key")
    noise = skr_noise(key, config, X.dtype) if train and config.skr else None
    G, blocks, aux, new_layers = gram_layers(params, config, X, noise, _init=_init)
    out = {"blocks": blocks}
    op = dict(params["output"])
    num_classes = op["mu"].shape[-1]
    K, jitter = _output_prior(op, config, G)  # ii [P,P], ti [B,P], t [B]
    if _init:  # the NNGP start: Σ = K_ii
        op["V"] = raw_from_chol(jnp.linalg.cholesky(K.ii))
    S_chol = chol_factor(op["V"])  # [P, P], Σ = S Sᵀ shared by the classes
    (f_mean, f_var, kl_mean), aux["checks"]["output"], K_chol = nystrom(
        K.ii, K.ti, K.t, S_chol @ S_chol.T, op["mu"], residual_tol=_residual_tol(config, K.t.dtype))
    out["f_mean"], out["f_var"] = f_mean, f_var  # [B, C], [B]
    aux["kl"]["output"] = num_classes * gram_kl(S_chol, K_chol, K.ii, config.kl) + kl_mean
    aux["jitter"]["output"] = jitter
    if _init:
        new = dict(params)
        new["layers"] = new_layers
        new["output"] = op
        out["params"] = new
    return out, aux


def _skip_stride(config: DKMConfig, index: int) -> int:
    """Stride of layer ``index``'s 1×1 skip mix-up: the product of the strides between its source and
    it, since "same" padding maps n to ceil(n/a) and ceil(ceil(n/a)/b) = ceil(n/(ab)), whatever the size's parity."""
    return math.prod(config.layers[j].stride for j in range(config.layers[index].skip_from + 1, index + 1))


# --------------------------------------------------------------------------- initialisation


def init_params(key, config: DKMConfig, X_init):
    """Parameters at the NNGP start: G^ℓ_ii = K^ℓ_ii in every layer, every KL term 0.

    X_init: training inputs (``[N, ν₀]`` or ``[N, H, W, C]``) from which inducing inputs (rows,
    or patches) are drawn; their dtype is the parameters' dtype. Kernel scales start at 1 and
    biases at ``kernel_bias``; mixing weights are standard normal (scaled by 1/√P_in in use);
    output means μ start at 0 and Σ at K^out_ii. The V's are then set by one deterministic
    (test-mode) pass over the inducing points, layer by layer, each to chol(K^ℓ_ii + jitter·I)
    of the K it sees — the same code path as prediction, so G = K holds exactly as used.
    """
    _check_inputs(config, X_init)
    X_init = jnp.asarray(X_init)
    dtype = X_init.dtype
    k_inducing, k_mix, k_skip, k_head = jax.random.split(key, 4)
    P0 = config.input_inducing
    N = X_init.shape[0]
    if config.architecture == "fc":
        rows = jax.random.choice(k_inducing, N, (P0,), replace=N < P0)
        inducing = X_init[rows]  # [P0, ν₀]
        if N < P0:  # duplicated rows would make the input Gram singular
            inducing = inducing + 1e-3 * draws.normal(k_inducing, inducing.shape, dtype)
        spatial = ()
    else:
        kh, kw = config.stem_patch_shape
        H, W = X_init.shape[1:3]
        padded = jnp.pad(X_init, ((0, 0), (kh // 2, kh // 2), (kw // 2, kw // 2), (0, 0)))
        kn, kr, kc = jax.random.split(k_inducing, 3)
        n = jax.random.randint(kn, (P0,), 0, N)
        r = jax.random.randint(kr, (P0,), 0, H)
        c = jax.random.randint(kc, (P0,), 0, W)
        inducing = jax.vmap(lambda i, a, b: jax.lax.dynamic_slice(padded[i], (a, b, 0), (kh, kw, X_init.shape[3])))(n, r, c)
        inducing = inducing + 1e-2 * draws.normal(kn, inducing.shape, dtype)  # [P0, kh, kw, C], distinct
        spatial = (H, W)

    zero = jnp.zeros((), dtype)
    log_bias = jnp.log(jnp.asarray(config.kernel_bias, dtype))
    layers = []
    widths = {-1: P0}
    shapes = {-1: spatial}
    mix_keys = jax.random.split(k_mix, config.num_layers)
    skip_keys = jax.random.split(k_skip, config.num_layers)
    for index, spec in enumerate(config.layers):
        P_in, P = widths[index - 1], spec.num_inducing
        lp = {"log_scale": zero, "log_bias": log_bias, "V": jnp.zeros((P, P), dtype)}
        if config.architecture == "conv":
            kh, kw = spec.filter_shape
            lp["mix"] = draws.normal(mix_keys[index], (kh, kw, P_in, P), dtype)
            shapes[index] = conv_output_shape(shapes[index - 1], spec.filter_shape, spec.stride)
        else:
            if P != P_in:
                lp["mix"] = draws.normal(mix_keys[index], (P_in, P), dtype)
            shapes[index] = ()
        if spec.batch_norm:
            lp["bn_log_scale_inducing"] = zero
            lp["bn_log_scale_data"] = zero
        if spec.skip_from is not None:
            src = spec.skip_from
            if widths[src] != P or shapes[src] != shapes[index]:
                if config.architecture == "conv":
                    lp["skip_mix"] = draws.normal(skip_keys[index], (1, 1, widths[src], P), dtype)
                else:
                    lp["skip_mix"] = draws.normal(skip_keys[index], (widths[src], P), dtype)
        widths[index] = P
        layers.append(lp)

    P_last = widths[config.num_layers - 1]
    params = {"inducing_inputs": inducing, "layers": tuple(layers)}
    P_out = P_last
    if config.architecture == "conv" and config.head == "flatten":
        H_L, W_L = shapes[config.num_layers - 1]
        params["head_mix"] = draws.normal(k_head, (H_L, W_L, P_last, config.head_inducing), dtype)
        P_out = config.head_inducing
    params["output"] = {
        "log_scale": zero,
        "log_bias": log_bias,
        "mu": jnp.zeros((P_out, config.num_outputs), dtype),
        "V": jnp.zeros((P_out, P_out), dtype),
    }
    first_pass = _cached_jit(config, "init", lambda: lambda p, x: forward(p, config, x, train=False, _init=True))
    out, aux = first_pass(params, X_init[:1])
    check_numerics(aux)
    return out["params"]


# --------------------------------------------------------------------------- numerics checks, prediction


def check_numerics(aux, step: int | None = None) -> None:
    """Raise :class:`NumericalError` naming the layer and stage of the first failed check."""
    for layer, checks in aux["checks"].items():
        if not bool(checks["chol_ok"]):
            stage = "Cholesky of the pooled inducing block G_ii" if layer == "head" else "Cholesky of K_ii"
            raise NumericalError("the factorisation failed (matrix not positive definite in this precision)",
                                 layer=layer, stage=stage, step=step)
        if not bool(checks["residual_ok"]):
            raise NumericalError(
                f"negative Nyström residual diag(K_tt − K_ti K_ii⁻¹ K_it): smallest relative value "
                f"{float(checks['min_residual']):.3e}",
                layer=layer, stage="Nyström residual", step=step)


_JIT_CACHE: dict = {}


def _cached_jit(config: DKMConfig, name, make):
    """One compiled program per (config's value, name): eager calls run as one XLA program, not op by
    op, and every config of equal fields (two builds of one zoo model) shares it."""
    key = (freeze(config), name)
    if key not in _JIT_CACHE:
        _JIT_CACHE[key] = jax.jit(make())
    return _JIT_CACHE[key]


def compiled_forward(config: DKMConfig):
    """``jit(forward)`` in test mode for this config, ``(params, X) -> (out, aux)``, compiled once."""
    return _cached_jit(config, "forward", lambda: lambda p, x: forward(p, config, x, train=False))


def _all_concrete(*trees) -> bool:
    return all(is_concrete(leaf) for leaf in jax.tree_util.tree_leaves(trees))


def predict(params, config: DKMConfig, X, key=None):
    """Predictive moments in test mode (G̃ = G + λI, no sampling).

    Returns a dict: ``f_mean [B, C]``, ``f_var [B, C]`` (the output GP's marginals), and, for
    classification likelihoods, ``probs [B, C]`` (Monte Carlo over f for the softmax; ``key``
    optional), otherwise ``y_mean``/``y_var``. Raises typed errors on failed numerics.
    """
    _check_inputs(config, X)
    if _all_concrete(params, X):
        out, aux = compiled_forward(config)(params, jnp.asarray(X))
        check_numerics(aux)
    else:
        out, aux = forward(params, config, X, train=False)
    C = out["f_mean"].shape[-1]
    f_var = jnp.broadcast_to(out["f_var"][:, None], (out["f_var"].shape[0], C))  # [B, C]
    result = {"f_mean": out["f_mean"], "f_var": f_var}
    lik = config.likelihood
    if hasattr(lik, "predict_probs") and lik.task in ("binary", "multiclass"):
        result["probs"] = lik.predict_probs(out["f_mean"], f_var, key)
    else:
        result["y_mean"], result["y_var"] = lik.predict_mean_and_var(out["f_mean"], f_var)
    return result


def gram_condition_numbers(params) -> dict[str, float]:
    """cond(G^ℓ_ii) = (σ_max(V)/σ_min(V))² of every learned Gram matrix (host SVD of the factor)."""
    result = {}
    for i, lp in enumerate(params["layers"]):
        s = np.linalg.svd(np.asarray(chol_factor(lp["V"]), dtype=np.float64), compute_uv=False)
        result[layer_name(i)] = float((s[0] / s[-1]) ** 2)
    return result
