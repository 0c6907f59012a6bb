"""The Pólya–Gamma distribution PG(b, c) and the PG-augmented logistic bound (van der Wilk et al. 2018, §4.5).

PG(b, c) is the law of ω = (1/2π²) Σ_{k≥1} g_k / ((k − ½)² + c²/(4π²)), g_k ~ Gamma(b, 1)
(Polson, Scott & Windle 2013, eq. 1). Its Laplace transform is
E[e^{−tω}] = cosh^b(c/2) / cosh^b(√((c²/2 + t)/2)), so PG(b, c) is PG(b, 0) exponentially tilted:
p(ω | b, c) = cosh^b(c/2) e^{−c²ω/2} p(ω | b, 0).

What this module provides, and how (each choice is the reason it is written here rather than taken
from a library: NumPyro has no PG distribution, and the ``polyagamma`` package is NumPy-only):

* ``PolyaGamma(b, c)``: a NumPyro distribution (support ω > 0, batch shape = broadcast of b, c).

  - ``sample`` is jit-compatible and vectorised (no Python loop over draws). b = 1: Devroye's
    exact alternating-series accept–reject for J*(1, c/2) = 4·PG(1, c) (PSW 2013 §4; Devroye
    2009), with the split point t chosen per c for an acceptance rate ≥ 0.928 at every c
    (``_pg1_candidates``); all draws get one candidate in a single vectorised pass, then the few
    rejected ones are redrawn in rounds that serve one rejected lane per block of 16
    (``_complete_rejected``), so the cost is little more than one pass. Integer b: the sum of b
    exact PG(1, c) draws. Non-integer b: exact draws for ⌊b⌋ plus the fractional part
    β = b − ⌊b⌋ from the gamma series truncated at ``GAMMA_SERIES_TERMS`` = 24 terms, the
    remainder Σ_{k>24} replaced by one Gamma variable with the remainder's exact mean and
    variance (``_gamma_series_remainder``). That part is
    approximate: mean and variance exact; the skewness of PG(β, c) is off by < 1e-5 for |c| ≤ 20,
    4e-4 at |c| = 50, 5e-3 at |c| = 100 (β = 0.5; the error scales as β^{-1/2}; it grows with c
    because the series' leading terms flatten).
    The scheme is fixed at construction from the *concrete* value of b; if b is a JAX tracer at
    construction, or ⌊max b⌋ > ``MAX_EXACT_TERMS`` = 32, all of b uses the gamma series. Its
    Gamma draws come from a vectorised Marsaglia–Tsang sampler (``_sample_gamma``), as
    ``jax.random.gamma`` costs ~5 µs per draw on CPU. float64 draws use a SplitMix64 stream
    seeded from the key (``_random_words``, the reason is given there); float32 draws use
    ``jax.random.bits``. Throughput: ``benchmarks/polya_gamma_throughput.py``.
  - ``log_prob`` evaluates, in log space, two exact representations of the PG(b, 0) density and
    keeps the one whose *computed* error estimate is smaller (then tilts by c):
    the small-x alternating series (PSW 2013 p. 6)
        p(x|b,0) = 2^{b−1}/Γ(b) Σ_n (−1)^n Γ(n+b)/Γ(n+1) (2n+b)/√(2πx³) e^{−(2n+b)²/(8x)},
    128 terms, summed as a shifted signed sum whose cancellation factor gives the rounding error;
    and a large-x expansion about the first singularity s₁ = −π²/2 of the Laplace transform
    sech^b(√(s/2)) (the "dual" form; 41 terms in float64):
        p(x|b,0) = (2π)^b x^{b−1} e^{−π²x/2}/Γ(b) · Σ_j h_j(b) x^{−j} + O(e^{−9π²x/2}),
    with h_j(b) = g_j(b) Π_{i<j}(b−1−i) and g_j the Taylor coefficients of
    (2π (s−s₁)/cosh(√(s/2)))^b at s₁ (``_LARGE_X_LOG_SERIES``; it terminates for integer b).
    The small-x series loses ~π²x/2 nats to cancellation, so alone it is useless past x ≈ 7;
    the expansion is accurate to ~1e-14 from x ≈ 1 on. Checked against 100-digit mpmath sums on
    x ∈ [1e-4, 100] (error of log p relative to max(1, |log p|)): float64 < 4e-15 for
    b ∈ [0.1, 3.5], 7e-14 at b = 10, 6e-12 at b = 30, 2e-9 at b = 40, 6e-6 at b = 60 (for
    b ≳ 40 the far right tail has a band where neither form is accurate; the better one is
    returned, and −inf, never NaN, if both fail); float32 (12 expansion terms) < 4e-7 for
    b ≤ 3.5, 2e-5 at b = 10, but 0.2 in the tail at b = 30 — use float64 for large b.
  - ``mean`` = b tanh(c/2)/(2c) (limit b/4), ``variance`` = b (sinh c − c)/(4c³ cosh²(c/2))
    (limit b/24), both stable at c → 0 and for large |c|.
  - ``kl_divergence(PolyaGamma(b, c), PolyaGamma(b, c'))`` is registered in closed form, so
    ``numpyro.infer.TraceMeanField_ELBO`` uses it analytically.

* ``pg_logistic_bound`` and ``optimal_c``: the PG lower bound on E_q(f)[log σ((2y−1)f)]
  (van der Wilk et al. 2018, eq. 22–23) with q(ω) = PG(1, c). How c is chosen in the invariant family (closed
  form or a recognition network, van der Wilk et al. 2018, §4.5) is in :mod:`gpzoo.inference.invariant`.

The exact two-block Gibbs sampler that uses ``PolyaGamma`` (ω | f ~ PG(1, f), PSW 2013 §3.1) for
small-data GP classification is :func:`gpzoo.inference.gibbs.gibbs_gp_classification`.

Dtypes: everything runs in the dtype of its inputs (float32 or float64); the density's series
constants are computed in float64 at import and cast.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import gammaln, ndtri
from numpyro.distributions import Distribution, constraints
from numpyro.distributions.kl import kl_divergence
from numpyro.distributions.util import promote_shapes, validate_sample

from gpzoo.models.errors import DataError, HyperparameterError, InvalidArgumentError, is_concrete

__all__ = [
    "GAMMA_SERIES_TERMS",
    "MAX_EXACT_TERMS",
    "PolyaGamma",
    "optimal_c",
    "pg_logistic_bound",
]

#: Terms of the gamma series kept explicitly for a non-integer shape; the rest is moment-matched.
GAMMA_SERIES_TERMS = 24
#: Largest ⌊b⌋ sampled exactly as a sum of ⌊b⌋ Devroye PG(1, c) draws.
MAX_EXACT_TERMS = 32

_LOG_2 = math.log(2.0)
_LOG_2PI = math.log(2.0 * math.pi)
_PI2 = math.pi**2

# ---------------------------------------------------------------------------------------------
# Closed-form moments and log-normaliser (all even in c; stable at c -> 0 and for large |c|)
# ---------------------------------------------------------------------------------------------


def _log_cosh_half(c):
    """log cosh(c/2) ``[...]``, overflow-free: logaddexp(c/2, −c/2) − log 2."""
    return jnp.logaddexp(0.5 * c, -0.5 * c) - _LOG_2


def pg1_mean(c):
    """E[PG(1, c)] = tanh(c/2)/(2c) ``[...]`` (PSW 2013 §3.1), = 1/4 at c = 0.

    tanh(u)/u has full relative precision for u ≠ 0; only u ≈ 0 needs the Taylor form (and a
    safe argument so the unused branch has a finite gradient).
    """
    u = 0.5 * jnp.abs(c)  # [...]
    small = u < 1e-4
    u_safe = jnp.where(small, 1.0, u)
    ratio = jnp.where(small, 1.0 - u * u / 3.0, jnp.tanh(u_safe) / u_safe)  # tanh(u)/u
    return 0.25 * ratio


def _pg1_variance(c):
    """Var[PG(1, c)] = (sinh c − c)/(4c³ cosh²(c/2)) ``[...]``, = 1/24 at c = 0.

    Written as (2 tanh(c/2) − c sech²(c/2))/(4c³) (using sinh c = 2 sinh(c/2) cosh(c/2)) so it
    never overflows; for |c| < 1, where that difference cancels, the Taylor series
    (sinh c − c)/c³ = Σ_k c^{2k}/(2k+3)! (9 terms: truncation < 1e-19) is used instead.
    """
    a = jnp.abs(c)  # [...]
    small = a < 1.0
    a_big = jnp.where(small, 1.0, a)
    sech2 = 1.0 / jnp.cosh(0.5 * a_big) ** 2
    direct = (2.0 * jnp.tanh(0.5 * a_big) - a_big * sech2) / (4.0 * a_big**3)
    a2 = a * a
    taylor = jnp.zeros_like(a)
    for k in reversed(range(9)):  # Horner in c²
        taylor = taylor * a2 + 1.0 / math.factorial(2 * k + 3)
    taylor = taylor / (4.0 * jnp.cosh(0.5 * a) ** 2)
    return jnp.where(small, taylor, direct)


# ---------------------------------------------------------------------------------------------
# Density of PG(b, 0): small-x alternating series and large-x expansion
# ---------------------------------------------------------------------------------------------

_SMALL_X_TERMS = 128
_LARGE_X_TERMS = 40  # float64; float32 keeps 12 (its terms reach 1e-7 by then for x ≥ 1, and
_LARGE_X_TERMS_F32 = 12  # the factorially growing Π(b−1−i) would overflow float32 by j ≈ 35)
_S1 = -0.5 * _PI2  # first zero of cosh(√(s/2)): s₁ = −2π²(1/2)²


def _large_x_log_series(num_terms: int) -> np.ndarray:
    """ℓ_k, k = 0..J: log v(t) = Σ_k ℓ_k t^k with v(t) = 2π cosh(√((s₁+t)/2)) / t, v(0) = 1.

    Taylor coefficients of cosh(√(s/2)) = Σ_k s^k/(2^k (2k)!) at s₁ are
    a_m = Σ_{k≥m} C(k, m) s₁^{k−m} / (2^k (2k)!) (the terms' sizes fall factorially, so float64
    is enough: ℓ_k agree with a 100-digit mpmath evaluation to 5e-13 relative); a₀ = 0,
    a₁ = 1/(2π). Then v_j = 2π a_{j+1} and the log series follows from v' = v (log v)'.
    |ℓ_k| ~ (4π²)^{−k}: the radius is the distance to the next singularity.
    """
    num_a = num_terms + 2
    a = np.zeros(num_a)
    for m in range(num_a):
        k = np.arange(m, m + 80)
        log_binom = np.array([math.lgamma(i + 1) - math.lgamma(i - m + 1) - math.lgamma(m + 1) for i in k])
        log_fact_2k = np.array([math.lgamma(2 * i + 1) for i in k])
        log_mag = log_binom - log_fact_2k - k * math.log(2.0) + (k - m) * math.log(-_S1)
        a[m] = np.sum(np.exp(log_mag) * (-1.0) ** (k - m))
    v = 2.0 * math.pi * a[1:]  # [J+1], v[0] = 1
    ell = np.zeros(num_terms + 1)
    for n in range(1, num_terms + 1):
        ell[n] = v[n] - sum(k * ell[k] * v[n - k] for k in range(1, n)) / n
    return ell


_LARGE_X_LOG_SERIES = _large_x_log_series(_LARGE_X_TERMS)  # [J+1] float64


def _log_pdf_small_x(x, b):
    """Small-x series for log p(x | b, 0) ``[...]`` and its estimated relative error (log).

    The signed terms are summed after shifting by the largest log-term m: sum = e^m Σ ± e^{t_n−m}.
    The relative rounding error is ≈ eps · Σ|e^{t_n−m}| / |Σ ± e^{t_n−m}|; the truncation error is
    the relative size of the last term. Returns (log_pdf, log_rel_err, valid).
    """
    dtype = x.dtype
    n = jnp.arange(_SMALL_X_TERMS, dtype=dtype)  # [N]
    x_ = x[..., None]  # [..., 1]
    b_ = b[..., None]  # [..., 1]
    u = 2.0 * n + b_  # [..., N]: 2n + b
    log_terms = (
        (b_ - 1.0) * _LOG_2
        - gammaln(b_)
        + gammaln(n + b_)
        - gammaln(n + 1.0)
        + jnp.log(u)
        - 0.5 * _LOG_2PI
        - 1.5 * jnp.log(x_)
        - u * u / (8.0 * x_)
    )  # [..., N]
    signs = jnp.where(n % 2 == 0, 1.0, -1.0).astype(dtype)  # [N]
    m = jnp.max(log_terms, axis=-1)  # [...]
    scaled = jnp.exp(log_terms - m[..., None])  # [..., N], each <= 1
    total = jnp.sum(signs * scaled, axis=-1)  # [...]
    magnitude = jnp.sum(scaled, axis=-1)  # [...]
    valid = total > 0
    total_safe = jnp.where(valid, total, 1.0)
    eps = jnp.finfo(dtype).eps
    rel_err = (eps * magnitude + scaled[..., -1]) / total_safe  # [...]
    log_pdf = m + jnp.log(total_safe)
    return log_pdf, jnp.log(rel_err), valid


def _large_x_coefficients(b, num):
    """h_j(b) = g_j(b) Π_{i<j}(b − 1 − i), j = 0..num ``[..., num+1]``, g = exp(−b log v) as a series.

    g follows from g' = (−b log v)' g:  g_n = (1/n) Σ_{k=1}^n k (−b ℓ_k) g_{n−k}.
    """
    dtype = b.dtype
    ell = jnp.asarray(_LARGE_X_LOG_SERIES[1 : num + 1], dtype)  # [J]: ℓ_1..ℓ_J
    k = jnp.arange(1, num + 1, dtype=dtype)  # [J]
    weights = -b[..., None] * k * ell  # [..., J]: k(−b ℓ_k)
    g0 = jnp.zeros(b.shape + (num + 1,), dtype).at[..., 0].set(1.0)  # [..., J+1]
    k_int = jnp.arange(1, num + 1)  # [J]

    def step(n, g):
        idx = n - k_int  # [J]: n − k
        prev = jnp.take(g, jnp.clip(idx, 0, num), axis=-1)  # [..., J]: g_{n−k}
        prev = jnp.where(idx >= 0, prev, 0.0)
        return g.at[..., n].set(jnp.sum(weights * prev, axis=-1) / n)

    g = lax.fori_loop(1, num + 1, step, g0)  # [..., J+1]
    falling = b[..., None] - 1.0 - jnp.arange(num, dtype=dtype)  # [..., J]: b − 1 − i
    ones = jnp.ones(b.shape + (1,), dtype)
    r = jnp.concatenate([ones, jnp.cumprod(falling, axis=-1)], axis=-1)  # [..., J+1]
    return g * r


def _log_pdf_large_x(x, b):
    """Large-x expansion for log p(x | b, 0) ``[...]`` with its estimated relative error (log).

    Error estimate: rounding (eps Σ|terms|), the last kept term, and the next singularity
    s₂ = −9π²/2, whose contribution relative to s₁'s is taken as 3^b e^{−4π²x}.
    Returns (log_pdf, log_rel_err, valid).
    """
    dtype = x.dtype
    num = _LARGE_X_TERMS if dtype == jnp.float64 else _LARGE_X_TERMS_F32
    h = _large_x_coefficients(b, num)  # [..., J+1]
    j = jnp.arange(num + 1, dtype=dtype)  # [J+1]
    terms = h * jnp.exp(-j * jnp.log(x)[..., None])  # [..., J+1]: h_j x^{−j}
    total = jnp.sum(terms, axis=-1)  # [...]
    valid = jnp.isfinite(total) & (total > 0)
    total_safe = jnp.where(valid, total, 1.0)
    eps = jnp.finfo(dtype).eps
    magnitude = jnp.where(valid, jnp.sum(jnp.abs(terms), axis=-1), 1.0)
    last = jnp.where(valid, jnp.abs(terms[..., -1]), 1.0)
    next_singularity = jnp.exp(jnp.minimum(b * math.log(3.0) - 4.0 * _PI2 * x, 0.0))
    rel_err = (eps * magnitude + last) / total_safe + next_singularity
    log_pdf = _S1 * x + b * _LOG_2PI + (b - 1.0) * jnp.log(x) - gammaln(b) + jnp.log(total_safe)
    return log_pdf, jnp.log(rel_err), valid


@jax.jit
def _log_pdf_pg0(x, b):
    """log p(x | b, 0) ``[...]`` for x > 0: the representation with the smaller error estimate.

    Jitted so eager ``log_prob`` calls reuse one compilation per shape (it contains a loop).
    """
    small, small_err, small_ok = _log_pdf_small_x(x, b)
    large, large_err, large_ok = _log_pdf_large_x(x, b)
    use_small = small_ok & (~large_ok | (small_err <= large_err))
    out = jnp.where(use_small, small, large)
    return jnp.where(small_ok | large_ok, out, -jnp.inf)


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------

# Devroye's sampler for J*(1, z) = 4·PG(1, 2z) (PSW 2013 §4) splits (0, ∞) at t: left of t the
# envelope is a_0 of the small-x series, right of t that of the large-x series. Any t in
# (log 3/π², 4/log 3) ≈ (0.11, 3.64) is valid (there the terms a_n decrease in n, so S ≤ a_0).
# Devroye's t = 0.64 is optimal at z = 0 only; here t depends on z (values from maximising the
# acceptance rate sech(z) / envelope mass, computed offline):
#   z < 0.24: untilted Lévy left proposal, t = 0.64;  z < 0.69: Lévy, t = 0.45;
#   z < 1.41: Lévy, t = 0.30;  z ≥ 1.41: tilted inverse-Gaussian left proposal, t = 2.
# Acceptance ≥ 0.928 for every z (worst near z = 1.4), 0.9993 at z = 0, → 1 as z → ∞.
_LEVY_LEVELS = ((0.24, 0.64), (0.69, 0.45), (1.41, 0.30))  # (upper z, t)
_IG_TRUNC = 2.0
_Z_IG = _LEVY_LEVELS[-1][0]


def _levy_tail(t):
    return 0.5 * math.erfc(1.0 / math.sqrt(2.0 * t))  # Φ(−1/√t)


_GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # SplitMix64 Weyl increment
_MIX_1 = 0xBF58476D1CE4E5B9
_MIX_2 = 0x94D049BB133111EB


def _random_words(key, num_words, n):
    """Random 64-bit words ``[num_words, n]`` (uint64), fully determined by ``key``.

    SplitMix64 (Steele, Lea & Flood 2014) in counter mode: word i is mix(s + (i+1)·γ), with the
    64-bit start s drawn from ``key`` by ``jax.random`` (so vmap over keys and reproducibility
    behave as with any jax.random call). Written here because jax.random's Threefry cost ~60%
    of a Devroye candidate on CPU (measured), and ``lax.rng_bit_generator`` is documented as
    experimental and batches by using only the first key. Needs x64 (uint64).
    """
    start = jax.random.bits(key, (), jnp.uint64)
    counter = jnp.arange(1, num_words * n + 1, dtype=jnp.uint64).reshape(num_words, n)
    x = start + counter * jnp.uint64(_GOLDEN_GAMMA)
    x = (x ^ (x >> 30)) * jnp.uint64(_MIX_1)
    x = (x ^ (x >> 27)) * jnp.uint64(_MIX_2)
    return x ^ (x >> 31)


def _uniforms(key, shape, dtype, num_fine, num_coarse):
    """``num_fine`` + ``num_coarse`` independent uniforms in (0, 1), each ``shape``.

    "Fine" ones carry the dtype's full precision (53 bits from one 64-bit word in float64); they
    feed continuous transforms (logs, quantiles). "Coarse" ones carry 32 bits (two per word in
    float64) and only enter comparisons with probabilities, which they honour to within 2^-33.
    float32: one 32-bit word of ``jax.random.bits`` each (24 bits used).
    """
    n = math.prod(shape)
    if dtype == jnp.float64:
        words = _random_words(key, num_fine + (num_coarse + 1) // 2, n)  # [W, n] uint64
        fine = [((w >> 11).astype(dtype) + 0.5) * 2.0**-53 for w in words[:num_fine]]
        halves = []
        for w in words[num_fine:]:
            halves += [(w >> 32).astype(dtype), (w & jnp.uint64(0xFFFFFFFF)).astype(dtype)]
        coarse = [(h + 0.5) * 2.0**-32 for h in halves[:num_coarse]]
        return [u.reshape(shape) for u in fine + coarse]
    words = jax.random.bits(key, (num_fine + num_coarse, n), jnp.uint32)
    u = ((words >> 8).astype(dtype) + 0.5) * 2.0**-24  # in (0, 1)
    return [row.reshape(shape) for row in u]


def _pg1_params(z):
    """Per-z constants of the Devroye proposal ``[...]`` each (see ``_pg1_candidates``).

    Computed once per distinct c (not per draw): (z, t, K, P(right component), Φ(−1/√t), use_ig).
    """
    use_ig = z >= _Z_IG
    t = jnp.full_like(z, _IG_TRUNC)  # split point t(z)
    levy_tail = jnp.ones_like(z)  # Φ(−1/√t) of the Lévy proposal (unused, 1, for IG)
    for z_upper, t_level in reversed(_LEVY_LEVELS):
        t = jnp.where(z < z_upper, t_level, t)
        levy_tail = jnp.where(z < z_upper, _levy_tail(t_level), levy_tail)
    rate = 0.125 * _PI2 + 0.5 * z * z  # K
    log_mass_right = math.log(0.5 * math.pi) - rate * t - jnp.log(rate)
    log_mass_left = jnp.where(use_ig, _LOG_2 - z, jnp.log(4.0 * levy_tail))
    p_right = jax.nn.sigmoid(log_mass_right - log_mass_left)
    return z, t, rate, p_right, levy_tail, use_ig


def _pg1_candidates(key, params, shape):
    """One Devroye candidate per element for X ~ J*(1, z) = 4·PG(1, 2z) -> (x, accepted), ``shape``.

    ``params`` = ``_pg1_params(z)``, each broadcastable to ``shape``.
    Target (up to cosh z): e^{−z²x/2} S(x), S(x) = Σ_n (−1)^n a_n(x) (PSW 2013 §4). Proposal
    mixture, split at t(z) (see ``_LEVY_LEVELS``):
    * right, x > t: e^{−z²x/2} a_0(x) = (π/2) e^{−Kx}, K = π²/8 + z²/2: x = t + E/K, mass
      (π/2)e^{−Kt}/K;
    * left, x ≤ t, for z < _Z_IG: the untilted a_0(x) = 2·Lévy(x), mass 4Φ(−1/√t), drawn exactly
      by inverting the normal tail (x = 1/N², |N| > 1/√t), the tilt e^{−z²x/2} entering the
      acceptance; for z ≥ _Z_IG: the tilted a_0 = 2e^{−z} IG(x; 1/z, 1) drawn on (0, ∞)
      (Michael–Schucany–Haas), draws beyond t rejected.
    The component is chosen with u_choose, which, rescaled to its interval, is then the uniform of
    the chosen proposal. Accept when V ≤ tilt · S(x)/a_0(x), S/a_0 = Σ_{n≤6} (−1)^n (2n+1)
    w^{n(n+1)/2}, w = e^{−4/x} (left) or e^{−π²x} (right); w ≤ e^{−2} on both sides, so the
    neglected 15w^28 is below 1e−23: the decision is Devroye's exact series decision up to rounding.
    Every element's candidates are independent, so "first accepted candidate" is an exact draw.
    """
    z, t, rate, p_right, levy_tail, use_ig = params
    dtype = z.dtype
    u_choose, u_acc, u_root = _uniforms(key, shape, dtype, num_fine=1, num_coarse=2)  # [*shape] each

    right = u_choose < p_right  # [*shape]
    u_prop = jnp.where(right, u_choose / p_right, (u_choose - p_right) / (1.0 - p_right))
    u_prop = jnp.clip(u_prop, jnp.finfo(dtype).tiny, 1.0)  # the chosen proposal's uniform

    x_right = t - jnp.log(u_prop) / rate  # [*shape]
    # One normal quantile serves both left proposals: Lévy tail (|N| > 1/√t) or IG's N².
    normal = ndtri(u_prop * levy_tail)  # [*shape]
    normal2 = normal * normal
    x_levy = 1.0 / normal2  # in (0, t]
    mu = 1.0 / jnp.where(use_ig, z, 1.0)  # IG mean 1/z
    w_ig = mu * normal2
    x_ig = mu / (1.0 + 0.5 * w_ig + jnp.sqrt(w_ig + 0.25 * w_ig * w_ig))  # smaller root, stable
    x_ig = jnp.where(u_root > mu / (mu + x_ig), mu * mu / x_ig, x_ig)
    x = jnp.where(right, x_right, jnp.where(use_ig, x_ig, x_levy))  # [*shape]

    in_left = x <= t  # (only IG draws can land on the wrong side)
    w = jnp.exp(jnp.where(in_left, -4.0 / x, -_PI2 * x))  # [*shape]
    w2 = w * w
    w3 = w2 * w
    w6 = w3 * w3
    w10 = w6 * w3 * w
    w15 = w10 * w3 * w2
    w21 = w15 * w6
    ratio = 1.0 - 3.0 * w + 5.0 * w3 - 7.0 * w6 + 9.0 * w10 - 11.0 * w15 + 13.0 * w21  # S/a_0
    tilt = jnp.where(right | use_ig, 1.0, jnp.exp(-0.5 * z * z * x))
    accepted = (u_acc <= tilt * ratio) & (right | in_left)  # [*shape]
    return x, accepted


_BLOCK = 16  # lanes per block in the redraw rounds


def _complete_rejected(key, candidates, param, x, accepted):
    """Replace every rejected candidate of ``x`` ``[n]`` by an accepted draw for its own ``param``.

    ``candidates(key, param_m)`` draws one candidate per entry of ``param_m`` ``[m]`` and returns
    (x, accepted) ``[m]``. The n lanes are cut into blocks of 16; each round gives one new
    candidate to the first still-rejected lane of every block (an argmax per block: no
    cumsum/nonzero compaction, which costs more than a candidate pass on CPU and compiles
    slowly), so a round costs ~1/16 of a pass; a round or two is the rule at the acceptance
    rates used here (≥ 0.928). Which lane is served depends only on its block-mates' past
    decisions, never on a lane's own future candidates, so each lane still returns its first
    accepted candidate: the result is an exact draw whenever the candidates are.
    """
    n = param.shape[0]
    blocks = -(-n // _BLOCK)
    pad = blocks * _BLOCK - n
    param_blk = jnp.pad(param, (0, pad), constant_values=1.0).reshape(blocks, _BLOCK)  # [m, B]
    x_blk = jnp.pad(x, (0, pad), constant_values=1.0).reshape(blocks, _BLOCK)  # [m, B]
    ok_blk = jnp.pad(accepted, (0, pad), constant_values=True).reshape(blocks, _BLOCK)  # [m, B]
    lanes = jnp.arange(_BLOCK)  # [B]

    def pending(state):
        return ~jnp.all(state[2])

    def redraw(state):
        loop_key, x_blk, ok_blk = state
        loop_key, sub = jax.random.split(loop_key)
        first = jnp.argmax(~ok_blk, axis=1)  # [m]: first rejected lane (0 if none)
        chosen = lanes[None, :] == first[:, None]  # [m, B] one-hot
        param_chosen = jnp.sum(jnp.where(chosen, param_blk, 0.0), axis=1)  # [m]
        x_new, ok_new = candidates(sub, param_chosen)  # [m], [m]
        x_new, ok_new = lax.optimization_barrier((x_new, ok_new))  # computed once, not per consumer
        fill = chosen & ~ok_blk & ok_new[:, None]  # [m, B]
        return loop_key, jnp.where(fill, x_new[:, None], x_blk), ok_blk | fill

    _, x_blk, _ = lax.while_loop(pending, redraw, (key, x_blk, ok_blk))
    return x_blk.reshape(-1)[:n]


@functools.partial(jax.jit, static_argnums=2)
def _sample_pg1(key, c, num_draws):
    """Exact PG(1, c) draws ``[num_draws, C]`` for ``c`` ``[C]``: Devroye candidates, vectorised.

    The per-c constants are computed once for the C values, then one candidate is drawn for every
    draw in a single pass and the rejected ones are completed by ``_complete_rejected``. Jitted so
    eager ``sample`` calls reuse one compilation per shape (it contains a while-loop).
    """
    shape = (num_draws,) + c.shape
    z = 0.5 * jnp.abs(c)  # [C]
    key_first, key_rest = jax.random.split(key)
    x, accepted = _pg1_candidates(key_first, _pg1_params(z), shape)  # [num_draws, C] each
    # Materialise the pass: otherwise XLA fuses (recomputes) it into each of its consumers.
    x, accepted = lax.optimization_barrier((x, accepted))
    z_all = jnp.broadcast_to(z, shape).reshape(-1)  # [num_draws·C]
    redraw = lambda k, z_m: _pg1_candidates(k, _pg1_params(z_m), z_m.shape)  # noqa: E731
    x = _complete_rejected(key_rest, redraw, z_all, x.reshape(-1), accepted.reshape(-1))
    return 0.25 * x.reshape(shape)  # PG(1, c) = J*(1, c/2) / 4


def _gamma_series_remainder(beta, c, num_terms):
    """Gamma law (shape, scale) ``[...]`` matching the mean and variance of the series remainder.

    R = (1/2π²) Σ_{k>K} g_k/d_k, d_k = (k−½)² + c²/(4π²), g_k ~ Gamma(β): E R = β T₁,
    Var R = β T₂ with T₁ = Σ_{k>K} 1/(2π² d_k) = E[PG(1,c)] − Σ_{k≤K}, T₂ likewise from Var[PG(1,c)].
    Gamma(β T₁²/T₂, T₂/T₁) matches both; its third cumulant 2βT₂²/T₁ differs from the true 2βT₃
    by the skewness errors quoted in the module docstring (computed from these sums for K = 24).
    Also returns 1/(2π² d_k) ``[..., K]``.
    """
    k = jnp.arange(1, num_terms + 1, dtype=c.dtype)  # [K]
    inv_d = 1.0 / (2.0 * _PI2 * ((k - 0.5) ** 2 + (c[..., None] / (2.0 * math.pi)) ** 2))  # [..., K]
    tail_1 = jnp.maximum(pg1_mean(c) - jnp.sum(inv_d, axis=-1), 0.0)  # [...]
    tail_2 = jnp.maximum(_pg1_variance(c) - jnp.sum(inv_d**2, axis=-1), 0.0)  # [...]
    tail_1 = jnp.maximum(tail_1, jnp.finfo(c.dtype).tiny)
    tail_2 = jnp.maximum(tail_2, jnp.finfo(c.dtype).tiny)
    return inv_d, beta * tail_1 * tail_1 / tail_2, tail_2 / tail_1


def _gamma_candidates(key, shape_param):
    """One Marsaglia–Tsang candidate per element for Gamma(a, 1), a = ``shape_param`` ``[n]`` > 0.

    Gamma(a) = Gamma(a + 1) · U^{1/a} (the usual boost, valid for every a > 0), Gamma(a + 1) by
    Marsaglia & Tsang (2000): d = a + 1 − 1/3, v = (1 + N/√(9d))³, accept when
    log V < N²/2 + d − dv + d log v (acceptance ≥ 0.95 since a + 1 ≥ 1). Returns (x, accepted).
    """
    dtype = shape_param.dtype
    u_normal, u_boost, u_acc = _uniforms(key, shape_param.shape, dtype, num_fine=2, num_coarse=1)
    d = shape_param + (1.0 - 1.0 / 3.0)
    normal = ndtri(u_normal)
    v = 1.0 + normal / jnp.sqrt(9.0 * d)
    positive = v > 0
    v3 = jnp.where(positive, v * v * v, 1.0)
    accepted = positive & (jnp.log(u_acc) < 0.5 * normal * normal + d - d * v3 + d * jnp.log(v3))
    x = d * v3 * jnp.exp(jnp.log(u_boost) / shape_param)
    return x, accepted


def _sample_gamma(key, shape_param):
    """Gamma(a, 1) draws ``[n]`` for ``shape_param`` ``[n]`` > 0, vectorised (exact).

    Written here because ``jax.random.gamma`` runs a per-element while-loop that costs ~5 µs
    per draw on CPU (measured); this is one Marsaglia–Tsang pass plus ``_complete_rejected``.
    """
    key_first, key_rest = jax.random.split(key)
    x, accepted = lax.optimization_barrier(_gamma_candidates(key_first, shape_param))
    return _complete_rejected(key_rest, _gamma_candidates, shape_param, x, accepted)


@jax.jit
def _sample_gamma_series(key, beta, c):
    """Approximate PG(β, c) draws ``[...]`` (β ≥ 0; β = 0 gives 0): truncated gamma series.

    ω ≈ Σ_{k≤K} g_k/(2π² d_k) + R, g_k ~ Gamma(β), R ~ the moment-matched Gamma of
    ``_gamma_series_remainder``; K = ``GAMMA_SERIES_TERMS``.
    """
    inv_d, shape, scale = _gamma_series_remainder(beta, c, GAMMA_SERIES_TERMS)  # [..., K], [...], [...]
    positive = beta > 0
    beta_safe = jnp.where(positive, beta, 1.0)
    shapes = jnp.concatenate(
        [jnp.broadcast_to(beta_safe[..., None], inv_d.shape), jnp.where(positive, shape, 1.0)[..., None]], axis=-1
    )  # [..., K+1]: K series terms, then the remainder
    weights = jnp.concatenate([inv_d, scale[..., None]], axis=-1)  # [..., K+1]
    g = _sample_gamma(key, shapes.reshape(-1)).reshape(shapes.shape)  # [..., K+1]
    return jnp.where(positive, jnp.sum(g * weights, axis=-1), 0.0)


# ---------------------------------------------------------------------------------------------
# The distribution
# ---------------------------------------------------------------------------------------------


def _concrete_float(x):
    """``x`` as a float NumPy array, or None when it is a tracer."""
    if not is_concrete(x):
        return None
    try:
        return np.asarray(x, dtype=np.float64)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return None


class PolyaGamma(Distribution):
    """Pólya–Gamma distribution PG(b, c), b > 0, c real (PSW 2013; van der Wilk et al. 2018, §4.5).

    ``b`` and ``c`` broadcast to the batch shape. See the module docstring for the sampling
    scheme (exact for integer b ≤ 32 given as concrete values), the density evaluation and their
    accuracy. Not reparameterisable: ``sample`` carries no gradient to b or c.
    """

    arg_constraints = {"b": constraints.positive, "c": constraints.real}
    support = constraints.positive
    reparametrized_params = []
    pytree_aux_fields = ("_num_exact_terms", "_has_fraction")

    def __init__(self, b=1.0, c=0.0, *, validate_args=None):
        b_np = _concrete_float(b)
        if b_np is not None:
            if np.any(~np.isfinite(b_np)) or np.any(b_np <= 0):
                raise HyperparameterError("b", f"PolyaGamma shape must be positive and finite, got {b_np.tolist()}")
            whole = np.floor(b_np)
            has_fraction = bool(np.any(b_np != whole))
            max_whole = int(np.max(whole)) if b_np.size else 0
            if max_whole <= MAX_EXACT_TERMS:
                self._num_exact_terms, self._has_fraction = max_whole, has_fraction
            else:
                self._num_exact_terms, self._has_fraction = 0, True
        else:
            self._num_exact_terms, self._has_fraction = 0, True
        c_np = _concrete_float(c)
        if c_np is not None and np.any(~np.isfinite(c_np)):
            raise HyperparameterError("c", f"PolyaGamma tilt must be finite, got {c_np.tolist()}")
        self.b, self.c = promote_shapes(b, c)
        batch_shape = lax.broadcast_shapes(jnp.shape(b), jnp.shape(c))
        super().__init__(batch_shape=batch_shape, validate_args=validate_args)

    def _params(self, shape):
        dtype = jnp.result_type(self.b, self.c, float)
        b = jnp.broadcast_to(jnp.asarray(self.b, dtype), shape)
        c = jnp.broadcast_to(jnp.asarray(self.c, dtype), shape)
        return b, c

    def sample(self, key, sample_shape=()):
        sample_shape = tuple(sample_shape)
        shape = sample_shape + self.batch_shape
        b, c = self._params(self.batch_shape)  # [*batch]
        num_samples = math.prod(sample_shape)
        key_exact, key_series = jax.random.split(key)
        out = jnp.zeros(shape, c.dtype)
        fraction = b
        if self._num_exact_terms > 0:
            terms = self._num_exact_terms
            draws = _sample_pg1(key_exact, c.reshape(-1), terms * num_samples)  # [T·S, C]
            draws = draws.reshape((terms,) + shape)  # [T, *sample, *batch]
            keep = jnp.arange(terms, dtype=b.dtype).reshape((terms,) + (1,) * len(shape)) < jnp.floor(b)
            out = out + jnp.sum(jnp.where(keep, draws, 0.0), axis=0)  # [*sample, *batch]
            fraction = b - jnp.floor(b)  # [*batch]
        if self._has_fraction:
            out = out + _sample_gamma_series(key_series, jnp.broadcast_to(fraction, shape), jnp.broadcast_to(c, shape))
        return out

    @validate_sample
    def log_prob(self, value):
        dtype = jnp.result_type(value, self.b, self.c, float)
        shape = lax.broadcast_shapes(jnp.shape(value), self.batch_shape)
        x = jnp.broadcast_to(jnp.asarray(value, dtype), shape)  # [...]
        b, c = self._params(shape)
        positive = x > 0
        x_safe = jnp.where(positive, x, 1.0)
        log_p0 = _log_pdf_pg0(x_safe, b)  # [...]
        log_p = b * _log_cosh_half(c) - 0.5 * c * c * x_safe + log_p0  # tilt, PSW 2013 eq. (2)
        return jnp.where(positive, log_p, -jnp.inf)

    @property
    def mean(self):
        b, c = self._params(self.batch_shape)
        return b * pg1_mean(c)

    @property
    def variance(self):
        b, c = self._params(self.batch_shape)
        return b * _pg1_variance(c)


@kl_divergence.register(PolyaGamma, PolyaGamma)
def _kl_polya_gamma(q, p):
    """KL[PG(b, c) || PG(b, c')] = b log cosh(c/2) − b log cosh(c'/2) − (c² − c'²)/2 · E_q[ω].

    From log q/p = b log cosh(c/2) − b log cosh(c'/2) − (c² − c'²) ω/2 (the tilt, PSW 2013 eq. 2).
    Different b make the KL infinite-or-undefined in this family: a concrete mismatch raises; a
    traced b cannot be checked here.
    """
    b_q, b_p = _concrete_float(q.b), _concrete_float(p.b)
    if b_q is not None and b_p is not None and np.any(np.not_equal(*np.broadcast_arrays(b_q, b_p))):
        raise InvalidArgumentError("b", "KL between Pólya–Gamma laws is implemented only for equal b")
    shape = lax.broadcast_shapes(q.batch_shape, p.batch_shape)
    b, c_q = q._params(shape)  # [...]
    _, c_p = p._params(shape)
    return b * (_log_cosh_half(c_q) - _log_cosh_half(c_p)) - 0.5 * (c_q * c_q - c_p * c_p) * b * pg1_mean(c_q)


# ---------------------------------------------------------------------------------------------
# PG-augmented logistic bound (van der Wilk et al. 2018, eq. 22–23)
# ---------------------------------------------------------------------------------------------


def pg_logistic_bound(y, f_mean, f_second_moment, c):
    """Per-datum lower bound on E_q(f)[log σ((2y−1) f)] with q(ω) = PG(1, c) ``[N]`` (broadcast).

    For y ∈ {0, 1} and κ = y − ½, σ((2y−1)f) = 2^{-1} e^{κf} E_{PG(1,0)}[e^{−ωf²/2}] (van der Wilk et al. 2018
    eq. 22; PSW 2013 Thm 1). Jensen's inequality in ω with q(ω) = PG(1, c) and then E over q(f)
    (van der Wilk et al. 2018, eq. 23) gives
        −log 2 + κ E[f] − E_q[ω] E[f²]/2 − KL[PG(1, c) || PG(1, 0)],
    E_q[ω] = tanh(c/2)/(2c). Substituting the KL, this is, for every c, the Jaakkola–Jordan bound
    log σ(ξ) + ((2y−1)E[f] − ξ)/2 − tanh(ξ/2)/(4ξ) (E[f²] − ξ²) with ξ = c; with the optimal
    c = ``optimal_c(E[f²])`` = √E[f²] the bound equals the standard (optimised) Jaakkola–Jordan
    bound κE[f] − log(2 cosh(c/2)) = κE[f] − c/2 − log(1 + e^{−c}).

    ``y`` holds 0/1 labels (checked when concrete), ``f_mean`` = E_q[f], ``f_second_moment`` =
    E_q[f²] = mean² + var, ``c`` the PG tilt (e.g. from a recognition network, van der Wilk et al. 2018, §4.5).
    """
    y_np = _concrete_float(y)
    if y_np is not None and np.any((y_np != 0) & (y_np != 1)):
        raise DataError("y", "Bernoulli-logit labels must be 0 or 1")
    kappa = jnp.asarray(y) - 0.5  # [N]
    mean_omega = pg1_mean(c)  # [N]: E_q[ω]
    kl = _log_cosh_half(c) - 0.5 * c * c * mean_omega  # [N]: KL[PG(1,c) || PG(1,0)]
    return -_LOG_2 + kappa * f_mean - 0.5 * mean_omega * f_second_moment - kl


def optimal_c(f_second_moment):
    """The c maximising ``pg_logistic_bound``: c = √E_q[f²] ``[N]`` (d bound/dc = 0; JJ's ξ)."""
    return jnp.sqrt(f_second_moment)
