"""Kernel properties that follow from the maths (Duvenaud 2014; van der Wilk et al. 2017, App. D). Runs in float64."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from numpyro import handlers

from gpzoo.models import kernels as kern
from gpzoo.models.errors import DataError, HyperparameterError, ShapeError

SE = kern.SquaredExponential


# ------------------------------------------------------------------------------- inputs
def continuous(rng, n, d=3):
    return rng.normal(size=(n, d))  # [n, d]


def categories(rng, n, num_categories=4):
    return rng.integers(0, num_categories, size=(n, 1)).astype(float)  # [n, 1]


def multi_output(rng, n, num_outputs=3):
    return np.concatenate([rng.normal(size=(n, 2)), rng.integers(0, num_outputs, (n, 1))], axis=1)  # [n, 3]


def amplitude(X):
    """A known positive function a(x) for FunctionScaled (module level: stable identity under jit)."""
    return 2.0 + jnp.sin(X[:, 0])  # [N]


def _inputs(d):
    return lambda rng, n: continuous(rng, n, d)


W3 = np.array([[1.0, 0.5], [0.2, -1.0], [0.3, 0.3]])  # [P=3, rank=2]

# (id, kernel, input maker, expected numpyro.param site names after realise("kernel"))
CASES = [
    ("se-ard", SE(lengthscale=np.array([0.5, 1.0, 2.0]), variance=1.3), continuous,
     {"kernel.lengthscale", "kernel.variance"}),
    ("matern12", kern.Matern12(lengthscale=0.7, variance=0.9), continuous, {"kernel.lengthscale", "kernel.variance"}),
    ("matern32", kern.Matern32(lengthscale=np.array([0.5, 1.0, 2.0])), continuous,
     {"kernel.lengthscale", "kernel.variance"}),
    ("matern52", kern.Matern52(), continuous, {"kernel.lengthscale", "kernel.variance"}),
    ("rq", kern.RationalQuadratic(lengthscale=0.8, alpha=0.5), continuous,
     {"kernel.lengthscale", "kernel.variance", "kernel.alpha"}),
    ("periodic", kern.Periodic(lengthscale=np.array([0.5, 1.0, 2.0]), period=np.array([1.0, 2.0, 3.0])), continuous,
     {"kernel.lengthscale", "kernel.variance", "kernel.period"}),
    ("cosine", kern.Cosine(lengthscale=np.array([1.0, 2.0, 3.0])), continuous,
     {"kernel.lengthscale", "kernel.variance"}),
    ("linear", kern.Linear(variance=np.array([0.5, 1.0, 2.0]), offset=0.3), continuous,
     {"kernel.variance", "kernel.offset"}),
    ("polynomial", kern.Polynomial(degree=3, variance=0.5), continuous, {"kernel.variance", "kernel.offset"}),
    ("constant", kern.Constant(variance=2.0), continuous, {"kernel.variance"}),
    ("white", kern.White(variance=0.5), continuous, {"kernel.variance"}),
    ("changepoint", kern.ChangePoint(SE(), kern.Linear(), location=0.2, steepness=3.0), continuous,
     {"kernel.before.lengthscale", "kernel.before.variance", "kernel.after.variance", "kernel.after.offset",
      "kernel.location", "kernel.steepness"}),
    ("changewindow", kern.ChangeWindow(kern.Periodic(), SE(), location=-0.1, width=1.0, steepness=5.0, dim=1),
     continuous,
     {"kernel.outside.lengthscale", "kernel.outside.variance", "kernel.outside.period", "kernel.inside.lengthscale",
      "kernel.inside.variance", "kernel.location", "kernel.width", "kernel.steepness"}),
    ("function-scaled", kern.FunctionScaled(kern.Matern32(), amplitude), continuous,
     {"kernel.base_kernel.lengthscale", "kernel.base_kernel.variance"}),
    ("categorical", kern.Categorical(4, lengthscale=np.array([0.5, 1.0, 2.0, 3.0])), categories,
     {"kernel.lengthscale", "kernel.variance"}),
    ("coregion", kern.Coregionalization(SE(), W=W3, kappa=np.array([0.1, 0.2, 0.3])), multi_output,
     {"kernel.base_kernel.lengthscale", "kernel.base_kernel.variance", "kernel.W", "kernel.kappa"}),
    ("orbitsum-swap", kern.OrbitSum(SE(), kern.SwapInputs()), _inputs(2),
     {"kernel.base_kernel.lengthscale", "kernel.base_kernel.variance"}),
    ("orbitsum-shift", kern.OrbitSum(SE(lengthscale=np.arange(1.0, 6.0)), kern.CyclicShift(5), normalise=True),
     _inputs(5), {"kernel.base_kernel.lengthscale", "kernel.base_kernel.variance"}),
    ("orbitsum-d4", kern.OrbitSum(kern.Matern52(lengthscale=2.0), kern.ImageSymmetries((3, 3))), _inputs(9),
     {"kernel.base_kernel.lengthscale", "kernel.base_kernel.variance"}),
    ("projection-swap", kern.OrbitProjection(SE(), kern.SwapInputs()), _inputs(2),
     {"kernel.base_kernel.lengthscale", "kernel.base_kernel.variance"}),
    ("projection-reflect", kern.OrbitProjection(kern.Matern32(), kern.Reflection(dims=(1,))), _inputs(2),
     {"kernel.base_kernel.lengthscale", "kernel.base_kernel.variance"}),
    ("projection-flips", kern.OrbitProjection(SE(lengthscale=2.0), kern.ImageSymmetries((2, 3), rotations=False)),
     _inputs(6), {"kernel.base_kernel.lengthscale", "kernel.base_kernel.variance"}),
    ("product-reflect", kern.OrbitProduct(SE(lengthscale=2.0), kern.Reflection()), _inputs(2),
     {"kernel.base_kernel.lengthscale", "kernel.base_kernel.variance"}),
    ("product-shift", kern.OrbitProduct(SE(lengthscale=3.0), kern.CyclicShift(4)), _inputs(4),
     {"kernel.base_kernel.lengthscale", "kernel.base_kernel.variance"}),
]
IDS = [c[0] for c in CASES]
BY_ID = {c[0]: c for c in CASES}
SYMMETRIC = [c[0] for c in CASES if isinstance(c[1], (kern.InvariantKernel, kern.OrbitProjection, kern.OrbitProduct))]
OTHER = kern.Matern32(lengthscale=0.9, variance=0.7)  # partner kernel for the algebra checks

# The per-kernel properties are evaluated under jax.jit with the kernel as an argument, one
# compilation per case (eager evaluation compiles every primitive for every new shape, several
# times slower on 2 cores); test_eager_evaluation_equals_jit... ties the two paths together.
N, M = 8, 5  # sizes of the two input sets of every case


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def two_sets(make, rng):
    return make(rng, N), make(rng, M)


def assert_psd(K):
    assert np.allclose(K, K.T, rtol=1e-10, atol=1e-12), "not symmetric"
    eig = np.linalg.eigvalsh(K)
    assert eig.min() > -1e-8 * max(np.abs(eig).max(), 1e-300), f"min eigenvalue {eig.min()} (max {eig.max()})"


def _facts(k, restricted, X, Y, wide):
    """Everything the per-kernel property tests look at, as one function to compile.

    For the symmetrised kernels it adds, for every group element g: k(g x, y), k(x, g y),
    k(x, g x), k(g x, g x), and K on the orbit of Y for the kernel and its base kernel.
    """
    joint = jnp.concatenate([X, Y])  # [N+M, D]
    leaves, treedef = jax.tree_util.tree_flatten(k)

    def total(leaves):
        K = treedef.unflatten(leaves).K(joint)  # [N+M, N+M]
        return jnp.sum(K), K

    grads, K_joint = jax.grad(total, has_aux=True)([jnp.asarray(v, float) for v in leaves])
    orbit_facts = {}
    if isinstance(k, (kern.InvariantKernel, kern.OrbitProjection, kern.OrbitProduct)):
        group = _group(k)
        orbit_x, orbit_y = group.orbit(X), group.orbit(Y)  # [G, N, D], [G, M, D]
        G, _, D = orbit_y.shape
        points = orbit_y.reshape(G * M, D)  # [G*M, D]
        orbit_facts = dict(
            K_gx_y=jax.vmap(lambda Xg: k.K(Xg, Y))(orbit_x),  # [G, N, M]
            K_x_gy=jax.vmap(lambda Yg: k.K(X, Yg))(orbit_y),  # [G, N, M]
            K_x_gx=jax.vmap(lambda Xg: k.K(X, Xg))(orbit_x),  # [G, N, N]
            K_diag_gx=jax.vmap(k.K_diag)(orbit_x),  # [G, N]
            K_orbit=k.K(points), K_base_orbit=k.base_kernel.K(points),  # [G*M, G*M]
        )
    return dict(
        **orbit_facts,
        K_joint=K_joint, K_diag_joint=k.K_diag(joint), K_xy=k.K(X, Y),  # [N+M, N+M], [N+M], [N, M]
        other_xy=OTHER.K(X, Y), other_diag_x=OTHER.K_diag(X),  # [N, M], [N]
        sum_xy=(k + OTHER).K(X, Y), sum_diag_x=(k + OTHER).K_diag(X),  # [N, M], [N]
        product_xy=(k * OTHER).K(X, Y), product_diag_x=(k * OTHER).K_diag(X),  # [N, M], [N]
        restricted_xx=restricted.K(wide), restricted_diag_x=restricted.K_diag(wide),  # [N, N], [N]
        grads=grads,
    )


# The matrices are tiny: ask XLA for a fast compilation rather than fast code.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
_FACTS = {}


def facts(case_id):
    """Inputs and jitted results of one case (the kernel is a jit argument), computed once."""
    if case_id not in _FACTS:
        _, kernel, make, _ = BY_ID[case_id]
        rng = np.random.default_rng(0)
        X, Y = two_sets(make, rng)  # [N, D], [M, D]
        D = X.shape[1]
        wide = np.concatenate([rng.normal(size=(N, 1)), X, rng.normal(size=(N, 2))], axis=1)  # [N, D+3]
        restricted = dataclasses.replace(kernel, active_dims=tuple(range(1, D + 1)))
        args = (kernel, restricted, X, Y, wide)
        compiled = jax.jit(_facts).lower(*args).compile(compiler_options=FAST_COMPILE)
        results = jax.tree_util.tree_map(np.asarray, compiled(*args))
        K_joint, K_diag_joint = results["K_joint"], results["K_diag_joint"]
        _FACTS[case_id] = dict(X=X, Y=Y, K_xx=K_joint[:N, :N], K_diag_x=K_diag_joint[:N], **results)
    return _FACTS[case_id]


# ------------------------------------------------------------------------------- every kernel
@pytest.mark.parametrize("case", IDS)
def test_kernel_is_psd_and_diag_matches_full(case):
    f = facts(case)
    assert f["K_joint"].shape == (N + M, N + M)
    assert_psd(f["K_joint"])
    np.testing.assert_allclose(f["K_diag_joint"], np.diag(f["K_joint"]), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("case", IDS)
def test_cross_covariance_is_a_block_of_the_joint_matrix(case):
    f = facts(case)
    assert f["K_xy"].shape == (N, M)
    np.testing.assert_allclose(f["K_xy"], f["K_joint"][:N, N:], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("case", IDS)
def test_sum_and_product_act_elementwise(case):
    """Duvenaud 2014, eq. 1.2–1.3."""
    f = facts(case)
    np.testing.assert_allclose(f["sum_xy"], f["K_xy"] + f["other_xy"], rtol=1e-12)
    np.testing.assert_allclose(f["product_xy"], f["K_xy"] * f["other_xy"], rtol=1e-12)
    np.testing.assert_allclose(f["sum_diag_x"], f["K_diag_x"] + f["other_diag_x"], rtol=1e-12)
    np.testing.assert_allclose(f["product_diag_x"], f["K_diag_x"] * f["other_diag_x"], rtol=1e-12)


@pytest.mark.parametrize("case", IDS)
def test_active_dims_ignore_the_other_columns(case):
    """A kernel on columns 1..D of [noise, X, noise, noise] is the kernel on X (Duvenaud 2014, §1.3.3)."""
    f = facts(case)
    np.testing.assert_allclose(f["restricted_xx"], f["K_xx"], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(f["restricted_diag_x"], f["K_diag_x"], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("case", IDS)
def test_hyperparameter_gradients_are_finite_under_jit(case):
    """Hyperparameters are the pytree's leaves; their gradients exist, also at r = 0 (Matérn)."""
    grads = facts(case)["grads"]
    assert grads and all(np.all(np.isfinite(g)) for g in grads)


@pytest.mark.parametrize("case", IDS)
def test_realise_makes_named_param_sites(case):
    _, kernel, _, sites = BY_ID[case]

    with handlers.trace() as trace:
        realised = handlers.seed(lambda: kernel.realise("kernel"), 0)()
    params = {name for name, site in trace.items() if site["type"] == "param"}
    assert params == sites
    # numpyro.param starts at the field's value: the realised kernel is the same pytree and values.
    assert jax.tree_util.tree_structure(realised) == jax.tree_util.tree_structure(kernel)
    for new, old in zip(jax.tree_util.tree_leaves(realised), jax.tree_util.tree_leaves(kernel), strict=True):
        np.testing.assert_allclose(new, old, rtol=1e-12)


@pytest.mark.parametrize("case", ["changewindow", "coregion", "orbitsum-d4", "projection-flips"])
def test_eager_evaluation_equals_jit_with_the_kernel_as_an_argument(case):
    f, kernel = facts(case), BY_ID[case][1]
    np.testing.assert_allclose(kernel.K(f["X"], f["Y"]), f["K_xy"], rtol=1e-10, atol=1e-14)


def test_grad_with_respect_to_a_kernel_object_is_a_kernel_shaped_pytree(rng):
    """Unflattening skips validation: cotangents (here a negative one) are not hyperparameters."""
    X = rng.normal(size=(6, 2))
    kernel = kern.SquaredExponential(lengthscale=0.7, variance=1.3) + kern.Matern32(lengthscale=2.0)

    def total(k):
        return jnp.sum(k.K(X))

    grads = jax.grad(total)(kernel)
    assert type(grads) is type(kernel)
    # every leaf of the gradient equals a central finite difference of the same leaf
    eps = 1e-6
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        bumped = [jax.tree_util.tree_map_with_path(lambda p, v, s=s: v + s * eps if p == path else v, kernel) for s in (1, -1)]
        fd = (total(bumped[0]) - total(bumped[1])) / (2 * eps)
        np.testing.assert_allclose(g, fd, rtol=1e-5, err_msg=jax.tree_util.keystr(path))
    # a tree of negative "lengthscales" rebuilds too (construction would reject it)
    negated = jax.tree_util.tree_map(lambda g: -jnp.abs(g) - 1.0, grads)
    assert all(np.all(np.asarray(v) < 0) for v in jax.tree_util.tree_leaves(negated))


# ------------------------------------------------------------------------------- NumPyro sites
def test_distribution_fields_become_sample_sites():
    kernel = kern.ChangePoint(
        SE(variance=dist.HalfNormal(1.0)),
        kern.Coregionalization(kern.Linear(), W=dist.Normal(0.0, 1.0).expand([3, 2]).to_event(2)),
        location=dist.Normal(0.0, 1.0),
    )
    X = multi_output(np.random.default_rng(1), N)

    def model():
        K = kernel.realise("cp").K(X)  # [N, N]
        numpyro.deterministic("K", K)

    trace = handlers.trace(handlers.seed(model, 3)).get_trace()
    samples = {name for name, site in trace.items() if site["type"] == "sample"}
    params = {name for name, site in trace.items() if site["type"] == "param"}
    assert samples == {"cp.before.variance", "cp.after.W", "cp.location"}
    assert params == {"cp.before.lengthscale", "cp.after.base_kernel.variance", "cp.after.base_kernel.offset",
                      "cp.after.kappa", "cp.steepness"}
    assert trace["cp.after.W"]["value"].shape == (3, 2)
    assert_psd(np.asarray(trace["K"]["value"]))
    with pytest.raises(HyperparameterError, match="location"):
        kernel.K(X)  # a prior has no value outside a model


# ------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "build, argument",
    [
        (lambda: kern.Matern32(lengthscale=-1.0), "Matern32.lengthscale"),
        (lambda: kern.Matern12(variance=0.0), "Matern12.variance"),
        (lambda: kern.RationalQuadratic(alpha=0.0), "RationalQuadratic.alpha"),
        (lambda: kern.Periodic(period=np.array([1.0, -2.0])), "Periodic.period"),
        (lambda: kern.Cosine(lengthscale=-3.0), "Cosine.lengthscale"),
        (lambda: kern.Linear(variance=np.array([1.0, -1.0])), "Linear.variance"),
        (lambda: kern.Polynomial(degree=0), "Polynomial.degree"),
        (lambda: kern.Polynomial(offset=-1.0), "Polynomial.offset"),
        (lambda: kern.Constant(variance=-1.0), "Constant.variance"),
        (lambda: kern.White(variance=0.0), "White.variance"),
        (lambda: kern.ChangePoint(SE(), SE(), steepness=0.0), "ChangePoint.steepness"),
        (lambda: kern.ChangePoint(SE(), "se"), "ChangePoint.after"),
        (lambda: kern.ChangeWindow(SE(), SE(), width=-1.0), "ChangeWindow.width"),
        (lambda: kern.FunctionScaled(SE(), function=3.0), "FunctionScaled.function"),
        (lambda: kern.Categorical(3, lengthscale=np.ones(2)), "Categorical.lengthscale"),
        (lambda: kern.Categorical(0), "Categorical.num_categories"),
        (lambda: kern.Coregionalization(SE(), W=W3, kappa=0.0), "Coregionalization.kappa"),
        (lambda: kern.Coregionalization(SE(), W=np.ones(3)), "Coregionalization.W"),
        (lambda: kern.OrbitSum(SE(), group="swap"), "OrbitSum.group"),
        (lambda: kern.OrbitProduct(SE(lengthscale=-1.0), kern.Reflection()), "SquaredExponential.lengthscale"),
        (lambda: kern.ImageSymmetries((2, 3)), "image_shape"),
    ],
)
def test_invalid_hyperparameters_raise_naming_the_field(build, argument):
    with pytest.raises((HyperparameterError, ShapeError)) as info:
        build()
    assert info.value.argument == argument


def test_unconstrained_hyperparameters_accept_negative_values():
    assert kern.ChangePoint(SE(), SE(), location=-3.0).location == -3.0
    assert kern.Linear(offset=-1.0).offset == -1.0
    assert kern.Coregionalization(SE(), W=-W3).W.shape == (3, 2)


def test_bad_inputs_raise_typed_errors(rng):
    with pytest.raises(DataError) as info:
        kern.Categorical(3).K(np.array([[0.0], [3.0]]))
    assert info.value.argument == "X"
    with pytest.raises(DataError):
        kern.Coregionalization(SE(), W=W3).K(np.array([[0.1, 0.2, 1.5]]))
    with pytest.raises(ShapeError):
        kern.Categorical(3).K(np.zeros((4, 2)))
    with pytest.raises(ShapeError):
        kern.OrbitSum(SE(), kern.CyclicShift(5)).K(continuous(rng, N, 4))
    with pytest.raises(ShapeError):
        kern.FunctionScaled(SE(), function=lambda X: X).K(continuous(rng, N, 2))


# ------------------------------------------------------------------------------- closed forms
def _pairwise(X, Y):
    return X[:, None, :] - Y[None, :, :]  # [N, M, D] (test reference only)


def test_stationary_kernels_match_their_closed_forms(rng):
    X, Y = two_sets(continuous, rng)
    ell = np.array([0.5, 1.0, 2.0])
    r = np.sqrt(np.sum((_pairwise(X, Y) / ell) ** 2, -1))  # [N, M]
    np.testing.assert_allclose(kern.Matern12(lengthscale=ell).K(X, Y), np.exp(-r), rtol=1e-10)
    np.testing.assert_allclose(kern.Matern32(lengthscale=ell).K(X, Y), (1 + np.sqrt(3) * r) * np.exp(-np.sqrt(3) * r),
                               rtol=1e-10)
    np.testing.assert_allclose(kern.Matern52(lengthscale=ell).K(X, Y),
                               (1 + np.sqrt(5) * r + 5 * r**2 / 3) * np.exp(-np.sqrt(5) * r), rtol=1e-10)
    np.testing.assert_allclose(kern.RationalQuadratic(lengthscale=ell, alpha=0.7).K(X, Y),
                               (1 + r**2 / 1.4) ** -0.7, rtol=1e-10)
    # RQ is a scale mixture of SEs that tends to SE as alpha -> infinity.
    np.testing.assert_allclose(kern.RationalQuadratic(lengthscale=ell, alpha=1e9).K(X, Y), np.exp(-0.5 * r**2),
                               rtol=1e-5)
    period = np.array([1.0, 2.0, 3.0])
    sines = np.sin(np.pi * _pairwise(X, Y) / period) / ell  # [N, M, D]
    np.testing.assert_allclose(kern.Periodic(lengthscale=ell, period=period, variance=2.0).K(X, Y),
                               2.0 * np.exp(-2.0 * np.sum(sines**2, -1)), rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(kern.Cosine(lengthscale=ell).K(X, Y),
                               np.cos(2 * np.pi * np.sum(_pairwise(X, Y) / ell, -1)), rtol=1e-9, atol=1e-12)


def test_periodic_kernel_is_invariant_to_shifts_by_the_period(rng):
    """Duvenaud 2014, eq. 1.40: f(x) = f(x + τ), so k(x + τ, y) = k(x, y)."""
    X, Y = two_sets(_inputs(2), rng)
    k = kern.Periodic(lengthscale=0.6, period=np.array([0.7, 1.9]))
    np.testing.assert_allclose(k.K(X + np.array([0.7, -3 * 1.9]), Y), k.K(X, Y), rtol=1e-9, atol=1e-12)


def test_dot_product_kernels(rng):
    X, Y = two_sets(continuous, rng)
    v, c = np.array([0.5, 1.0, 2.0]), np.array([0.1, -0.2, 0.3])
    np.testing.assert_allclose(kern.Linear(variance=v, offset=c).K(X, Y), ((X - c) * v) @ (Y - c).T, rtol=1e-12)
    # A polynomial kernel is a product of `degree` (linear + constant) kernels (Duvenaud 2014, §1.3.2).
    factor = kern.Linear(variance=0.5) + kern.Constant(variance=1.5)
    np.testing.assert_allclose(kern.Polynomial(degree=3, variance=0.5, offset=1.5).K(X, Y),
                               (factor * factor * factor).K(X, Y), rtol=1e-12)
    np.testing.assert_allclose(kern.Constant(variance=2.0).K(X, Y), np.full((N, M), 2.0))
    np.testing.assert_allclose(kern.White(variance=0.5).K(X), 0.5 * np.eye(N))
    np.testing.assert_allclose(kern.White(variance=0.5).K(X, Y), np.zeros((N, M)))
    np.testing.assert_allclose(kern.White(variance=0.5).K(X, X[::-1]), 0.5 * np.eye(N)[::-1])


def test_categorical_kernel_is_se_ard_on_one_hot_codes():
    """Duvenaud 2014, eq. 1.51: k(i, j) = σ² exp(−(1/ℓ_i² + 1/ℓ_j²)/2) for i ≠ j, σ² for i = j."""
    ell = np.array([0.5, 1.0, 2.0])
    codes = np.array([[0.0], [1.0], [2.0], [1.0]])
    K = np.asarray(kern.Categorical(3, lengthscale=ell, variance=1.7).K(codes))  # [4, 4]
    i = codes[:, 0].astype(int)
    expected = 1.7 * np.exp(-0.5 * (1 / ell[i][:, None] ** 2 + 1 / ell[i][None, :] ** 2))  # [4, 4]
    expected[i[:, None] == i[None, :]] = 1.7
    np.testing.assert_allclose(K, expected, rtol=1e-12)


def test_coregionalization_is_b_times_k(rng):
    """Duvenaud 2014, eq. 1.52 with B = W Wᵀ + diag(κ)."""
    kappa = np.array([0.1, 0.2, 0.3])
    base = kern.Matern52(lengthscale=0.8)
    k = kern.Coregionalization(base, W=W3, kappa=kappa)
    X, Y = two_sets(multi_output, rng)
    B = W3 @ W3.T + np.diag(kappa)  # [3, 3]
    np.testing.assert_allclose(k.coregionalization_matrix(), B, rtol=1e-12)
    ix, iy = X[:, -1].astype(int), Y[:, -1].astype(int)
    expected = B[np.ix_(ix, iy)] * np.asarray(base.K(X[:, :2], Y[:, :2]))  # [N, M]
    np.testing.assert_allclose(k.K(X, Y), expected, rtol=1e-12)
    # The output index may live in any column.
    first = kern.Coregionalization(base, W=W3, kappa=kappa, output_column=0)
    np.testing.assert_allclose(first.K(np.roll(X, 1, axis=1), np.roll(Y, 1, axis=1)), expected, rtol=1e-12)


def test_changepoint_switches_between_kernels(rng):
    """Duvenaud 2014, eq. 1.19: far before the change k = k_before, far after it k = k_after."""
    before, after = SE(lengthscale=0.5), kern.Periodic(period=0.3)
    cp = kern.ChangePoint(before, after, location=1.0, steepness=2.0)
    left = continuous(rng, M, 1) - 30.0  # [M, 1]
    right = continuous(rng, M, 1) + 30.0  # [M, 1]
    np.testing.assert_allclose(cp.K(left), before.K(left), atol=1e-20)
    np.testing.assert_allclose(cp.K(right), after.K(right), atol=1e-20)
    np.testing.assert_allclose(cp.K(left, right), np.zeros((M, M)), atol=1e-20)
    np.testing.assert_allclose(cp.weight(np.array([[1.0]])), [0.5])  # the change sits at `location`
    # A change-window: `inside` governs the window, `outside` everything far from it.
    window = kern.ChangeWindow(before, after, location=2.0, width=4.0, steepness=50.0)
    centre = 2.0 + 0.5 * continuous(rng, M, 1)
    far = np.concatenate([left, right])  # [2M, 1]
    np.testing.assert_allclose(window.K(centre), after.K(centre), atol=1e-12)
    np.testing.assert_allclose(window.K(far), before.K(far), atol=1e-20)


def test_function_scaled_is_a_outer_k(rng):
    """Duvenaud 2014, eq. 1.21: a(x) k(x, y) a(y)."""
    X, Y = two_sets(continuous, rng)
    base = kern.Matern32()
    expected = np.asarray(amplitude(X))[:, None] * base.K(X, Y) * np.asarray(amplitude(Y))[None, :]  # [N, M]
    np.testing.assert_allclose(kern.FunctionScaled(base, amplitude).K(X, Y), expected, rtol=1e-12)


def test_additive_kernel_over_active_dims(rng):
    """Duvenaud 2014, eq. 1.8: k1(x1, x1') + k2(x2, x2')."""
    X = continuous(rng, N, 2)
    k = SE(active_dims=[0]) + kern.Periodic(active_dims=[1])
    np.testing.assert_allclose(k.K(X), SE().K(X[:, :1]) + kern.Periodic().K(X[:, 1:]), rtol=1e-12)


# ------------------------------------------------------------------------------- groups
GROUPS = [
    kern.SwapInputs(),
    kern.SwapInputs(num_features=4, first=3, second=1),
    kern.Reflection(),
    kern.Reflection(dims=(0, 2)),
    kern.CyclicShift(5),
    kern.ImageSymmetries((3, 3)),
    kern.ImageSymmetries((3, 3), flips=False),
    kern.ImageSymmetries((2, 3), rotations=False),
]
GROUP_DIMS = [2, 4, 3, 3, 5, 9, 9, 6]
GROUP_ORDERS = [2, 2, 2, 2, 5, 8, 4, 4]


@pytest.mark.parametrize("group, D, order", list(zip(GROUPS, GROUP_DIMS, GROUP_ORDERS)), ids=[repr(g) for g in GROUPS])
def test_groups_orbits_are_closed_and_canonical_is_orbit_invariant(group, D, order, rng):
    X = continuous(rng, N, D)
    orbit = np.asarray(group.orbit(X))  # [G, N, D]
    assert orbit.shape == (order, N, D) and group.order == order
    np.testing.assert_array_equal(orbit[0], X)  # identity first
    canonical = np.asarray(group.canonical(X))  # [N, D]
    for g in range(order):
        # Closure: the orbit of g(x) is the orbit of x (as a set of rows, so compare sorted).
        moved = np.asarray(group.orbit(orbit[g]))  # [G, N, D]
        np.testing.assert_array_equal(np.sort(moved, axis=0), np.sort(orbit, axis=0))
        assert len({tuple(r) for r in moved[:, 0]}) == order  # G distinct elements (generic x)
        np.testing.assert_array_equal(group.canonical(orbit[g]), canonical)
    # The representative is a member of each orbit.
    assert np.all(np.any(np.all(orbit == canonical[None], axis=-1), axis=0))


def test_swap_and_reflection_fundamental_domains():
    """Duvenaud 2014: A_swap(x1, x2) = [min, max] (after eq. 1.38); reflection about 0 maps to |x|."""
    X = np.array([[2.0, 1.0], [-1.0, 3.0], [0.5, 0.5]])
    np.testing.assert_array_equal(kern.SwapInputs().canonical(X), np.sort(X, axis=1))
    x = np.array([[-2.0], [0.0], [1.5]])
    np.testing.assert_array_equal(kern.Reflection().canonical(x), np.abs(x))


def test_image_symmetries_rotate_and_flip_images():
    image = np.arange(9.0).reshape(3, 3)
    orbit = np.asarray(kern.ImageSymmetries((3, 3)).orbit(image.reshape(1, 9)))[:, 0].reshape(-1, 3, 3)  # [8, 3, 3]
    expected = [np.rot90(image, k) for k in range(4)] + [np.rot90(np.fliplr(image), k) for k in range(4)]
    np.testing.assert_array_equal(orbit, np.stack(expected))


# ------------------------------------------------------------------------------- invariant kernels
def _group(k):
    """The finite group of a symmetrised kernel (OrbitSum builds an InvariantKernel over its orbit)."""
    return k.orbit.group if isinstance(k, kern.InvariantKernel) else k.group


@pytest.mark.parametrize("case", SYMMETRIC)
def test_symmetrised_kernels_are_argumentwise_invariant(case):
    """Duvenaud 2014, eq. 1.34 / van der Wilk et al. 2017, eq. D.28: k(x, y) = k(g x, g' y) for every g, g'."""
    f = o = facts(case)
    G = _group(BY_ID[case][1]).order
    np.testing.assert_allclose(o["K_gx_y"], np.broadcast_to(f["K_xy"], (G, N, M)), rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(o["K_x_gy"], np.broadcast_to(f["K_xy"], (G, N, M)), rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(o["K_x_gx"], np.broadcast_to(f["K_xx"], (G, N, N)), rtol=1e-9, atol=1e-14)
    np.testing.assert_allclose(o["K_diag_gx"], np.broadcast_to(f["K_diag_x"], (G, N)), rtol=1e-9, atol=1e-14)


def _prior_samples(K, G, num_samples=4):
    """Samples f ~ N(0, K) ``[G, M, S]`` at the G·M orbit points (Cholesky with a tiny jitter)."""
    scale = np.max(np.diag(K))
    L = np.linalg.cholesky(K + 1e-10 * scale * np.eye(len(K)))  # [G*M, G*M]
    z = np.random.default_rng(5).normal(size=(len(K), num_samples))  # [G*M, S]
    return (L @ z).reshape(G, -1, num_samples), np.sqrt(scale)


@pytest.mark.parametrize("case", SYMMETRIC)
def test_prior_samples_are_invariant(case):
    """f(x) = f(g x) for every g (Duvenaud 2014, eq. 1.31), for all three recipes of §1.7.1."""
    o, G = facts(case), _group(BY_ID[case][1]).order
    f, scale = _prior_samples(o["K_orbit"], G)  # [G, M, S]
    assert np.abs(f).max() > 0.1 * scale  # the samples are not trivially zero
    np.testing.assert_allclose(f, np.broadcast_to(f[:1], f.shape), atol=1e-3 * scale)
    # The same test fails for the base kernel: it does not know the symmetry.
    f_base, scale_base = _prior_samples(o["K_base_orbit"], G)
    assert np.abs(f_base - f_base[:1]).max() > 0.1 * scale_base


def test_orbit_sum_is_the_double_sum_and_normalises(rng):
    """Duvenaud 2014, eq. 1.35 term by term; ``normalise`` divides by G²."""
    group, base = kern.CyclicShift(4), SE(lengthscale=np.array([1.0, 2.0, 0.5, 1.5]))
    X, Y = two_sets(_inputs(4), rng)
    ox, oy = group.orbit(X), group.orbit(Y)  # [4, N, 4], [4, M, 4]
    expected = sum(base.K(ox[g], oy[h]) for g in range(4) for h in range(4))  # [N, M]
    np.testing.assert_allclose(kern.OrbitSum(base, group).K(X, Y), expected, rtol=1e-12)
    np.testing.assert_allclose(kern.OrbitSum(base, group, normalise=True).K(X, Y), expected / 16, rtol=1e-12)


def test_orbit_sum_doubles_the_variance_on_the_symmetry_axis():
    """Duvenaud 2014, §1.7.1: with G_swap the marginal variance is doubled near x1 = x2."""
    k = kern.OrbitSum(SE(lengthscale=0.5), kern.SwapInputs())
    on_axis, off_axis = np.array([[0.3, 0.3]]), np.array([[-3.0, 3.0]])
    np.testing.assert_allclose(k.K_diag(on_axis), [4.0])
    np.testing.assert_allclose(k.K_diag(off_axis), [2.0])


def test_orbit_product_of_se_is_se_of_orbit_sums(rng):
    """Π_g Π_g' SE(g x, g' y) = SE(Σ_g g x, Σ_g g y) h(x) h(y) for permutations: why eq. 1.39 is PSD here."""
    group, ell = kern.CyclicShift(4), 3.0
    X, Y = two_sets(_inputs(4), rng)
    sx, sy = np.asarray(group.orbit(X)).sum(0), np.asarray(group.orbit(Y)).sum(0)  # [N, 4], [M, 4]

    def h(Z, s):
        return np.exp(-0.5 * (16 * np.sum(Z**2, -1) - np.sum(s**2, -1)) / ell**2)  # [N]

    expected = np.asarray(SE(lengthscale=ell).K(sx, sy)) * h(X, sx)[:, None] * h(Y, sy)[None, :]  # [N, M]
    np.testing.assert_allclose(kern.OrbitProduct(SE(lengthscale=ell), group).K(X, Y), expected, rtol=1e-9)


def _shapes(jaxpr):
    for eqn in jaxpr.eqns:
        yield from (v.aval.shape for v in eqn.outvars)
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                yield from _shapes(inner)


@pytest.mark.parametrize("recipe", [kern.OrbitSum, kern.OrbitProduct])
def test_orbit_kernel_diagonal_never_forms_the_n_by_n_matrix(recipe, rng):
    num_data = 11
    k = recipe(SE(), kern.CyclicShift(3))
    X = continuous(rng, num_data, 3)
    shapes = list(_shapes(jax.make_jaxpr(k.K_diag)(X).jaxpr))
    assert shapes and not any(shape.count(num_data) >= 2 for shape in shapes)
    assert any(shape.count(num_data) >= 2 for shape in _shapes(jax.make_jaxpr(k.K)(X).jaxpr))  # the check can fail


def test_combinators_validate_inputs_through_their_parts():
    """Sum, Product and Scaled ask every part; a conv part rejects images of the wrong size."""
    from gpzoo.models.errors import ShapeError
    from gpzoo.models.kernels.convolutional import Convolutional

    conv = Convolutional(kern.SquaredExponential(), (4, 4), (2, 2))
    good, bad = np.zeros((3, 16)), np.zeros((3, 15))
    for kernel in (conv + kern.SquaredExponential(), kern.Linear() * conv, conv.scaled(2.0), (conv + kern.White()) * kern.Linear()):
        kernel.validate_inputs(good)
        with pytest.raises(ShapeError) as info:
            kernel.validate_inputs(bad)
        assert info.value.argument == "X"
    kern.SquaredExponential().validate_inputs(bad)  # plain kernels accept any columns
