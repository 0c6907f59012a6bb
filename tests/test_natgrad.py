"""Natural gradients for q(u) in SVI (``fit(..., optimizer="natgrad")``, gpzoo.inference.natgrad)."""

import jax.numpy as jnp
import numpy as np
import pytest

import gpzoo
from gpzoo.inference.exact import collapsed_elbo
from gpzoo.inference.natgrad import WARMUP_END, WARMUP_START, natgrad_warmup
from gpzoo.inference.programs import CompileCounter
from gpzoo.models import likelihoods, zoo
from gpzoo.models.errors import InvalidArgumentError

N, M = 200, 16
#: Within 0.1 nats per 1,000 points of the reference optimum.
TOLERANCE = 0.1 * N / 1000


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-3.0, 3.0, (N, 1))
    return rng, X, 1.5 * np.sin(2.0 * X[:, 0])


def _regression(seed=0):
    rng, X, f = _inputs(seed)
    return X, f / 1.5 + 0.2 * rng.normal(size=N)


def _collapsed(spec, res, X, y):
    Z = jnp.asarray(res.params["inducing.Z"])
    return float(collapsed_elbo(spec.kernel, jnp.asarray(spec.likelihood.noise_variance, Z.dtype), Z, jnp.asarray(X, Z.dtype),
                                 jnp.asarray(y, Z.dtype), jitter=spec.jitter))


@pytest.mark.parametrize("whiten", [True, False])
def test_one_unit_step_on_gaussian_reaches_the_collapsed_bound(whiten):
    """γ = 1, full batch, hyperparameters held (a 1e-12 Adam rate): the ELBO after one step is Titsias' bound."""
    X, y = _regression()
    spec = zoo.get("svgp-rbf", input_dim=1, num_inducing=M, whiten=whiten)
    res = gpzoo.fit(spec, X, y, steps=2, optimizer="natgrad", natgrad_step=1.0, learning_rate=1e-12, progress=False)
    target = _collapsed(spec, res, X, y)
    assert res.objective_history[0] < target - 10.0  # the initial q(u) is far from optimal
    np.testing.assert_allclose(res.objective_history[1:], target, rtol=0, atol=1e-6)
    assert res.params["q_sqrt"].shape == (1, M, M)
    np.testing.assert_array_equal(np.triu(res.params["q_sqrt"][0], 1), 0.0)


def test_one_unit_step_on_gaussian_float32(float32):
    X, y = _regression()
    spec = zoo.get("svgp-rbf", input_dim=1, num_inducing=M)
    res = gpzoo.fit(spec, X, y, steps=2, optimizer="natgrad", learning_rate=1e-12, progress=False)  # default γ = 1
    assert res.params["q_mu"].dtype == np.float32
    target = _collapsed(spec, res, X, y)
    np.testing.assert_allclose(res.objective_history[1], target, rtol=1e-4)


def _first_within(history, target):
    hits = np.flatnonzero(np.asarray(history) >= target - TOLERANCE)
    return int(hits[0]) if hits.size else None


@pytest.mark.filterwarnings("ignore::gpzoo.models.errors.ConvergenceWarning")
@pytest.mark.parametrize("likelihood, adam_steps, natgrad_steps", [("bernoulli", 800, 200), ("poisson", 1500, 500)])
def test_natgrad_reaches_the_adam_optimum_in_fewer_steps(likelihood, adam_steps, natgrad_steps):
    rng, X, f = _inputs(1)
    if likelihood == "bernoulli":
        y = (rng.uniform(size=N) < 1.0 / (1.0 + np.exp(-f))).astype(float)
        spec = zoo.get("svgp-rbf", input_dim=1, task="binary", num_inducing=M)
    else:
        y = rng.poisson(np.exp(f)).astype(float)
        spec = zoo.get("svgp-rbf", input_dim=1, num_inducing=M, likelihood=likelihoods.Poisson())
    adam = gpzoo.fit(spec, X, y, steps=adam_steps, learning_rate=0.05, progress=False)
    natgrad = gpzoo.fit(spec, X, y, steps=natgrad_steps, learning_rate=0.05, optimizer="natgrad", natgrad_step=0.5,
                        progress=False)
    target = adam.objective_history[-1]
    adam_hit, natgrad_hit = _first_within(adam.objective_history, target), _first_within(natgrad.objective_history, target)
    assert natgrad_hit is not None, (natgrad.objective_history[-1], target)
    print(f"{likelihood}: within {TOLERANCE} nats of Adam's {adam_steps}-step ELBO after {natgrad_hit} natgrad steps, "
          f"{adam_hit} Adam steps")
    assert natgrad_hit < adam_hit, (natgrad_hit, adam_hit)
    assert np.all(np.isfinite(natgrad.objective_history))


def test_minibatches_and_schedule():
    X, y = _regression()
    spec = zoo.get("svgp-rbf", input_dim=1, num_inducing=M)
    res = gpzoo.fit(spec, X, y, steps=60, batch_size=50, optimizer="natgrad", natgrad_step=natgrad_warmup,
                    learning_rate=0.01, progress=False)
    full = gpzoo.evaluate_elbo(res).elbo
    assert np.isfinite(full) and full > res.objective_history[0] + 100.0
    assert float(natgrad_warmup(0)) == pytest.approx(WARMUP_START)
    assert float(natgrad_warmup(10)) == pytest.approx(WARMUP_END)


def test_second_natgrad_fit_compiles_nothing():
    X, y = _regression()
    spec = zoo.get("svgp-rbf", input_dim=1, num_inducing=M)
    gpzoo.fit(spec, X, y, steps=5, optimizer="natgrad", natgrad_step=0.5, progress=False)
    X2, y2 = _regression(seed=3)
    with CompileCounter() as counter:
        gpzoo.fit(spec, X2, y2, steps=7, seed=1, optimizer="natgrad", natgrad_step=0.8, learning_rate=0.02, progress=False)
    assert counter.count == 0


def test_bad_settings_are_typed_errors():
    X, y = _regression()
    spec = zoo.get("svgp-rbf", input_dim=1, num_inducing=M)
    for gamma in (0.0, 1.5, -0.1, float("nan"), "big", lambda step: 2.0):
        with pytest.raises(InvalidArgumentError) as info:
            gpzoo.fit(spec, X, y, steps=1, optimizer="natgrad", natgrad_step=gamma, progress=False)
        assert info.value.argument == "natgrad_step"
    with pytest.raises(InvalidArgumentError) as info:
        gpzoo.fit(spec, X, y, steps=1, natgrad_step=0.5, progress=False)  # without optimizer="natgrad"
    assert info.value.argument == "natgrad_step"
    with pytest.raises(InvalidArgumentError) as info:
        gpzoo.fit(spec, X, y, steps=1, optimizer="natural", progress=False)
    assert info.value.argument == "optimizer"
    for structure in ("diag", "block"):
        with pytest.raises(InvalidArgumentError, match="q_structure") as info:
            gpzoo.fit(spec.replace(q_structure=structure), X, y, steps=1, optimizer="natgrad", progress=False)
        assert info.value.argument == "optimizer"
    yb = (y > 0).astype(float)
    binary = zoo.get("svgp-rbf", input_dim=1, task="binary", num_inducing=M)
    dkm = zoo.get("dkm", input_dim=1, task="binary", num_inducing=8, depth=2)
    for other in (binary.replace(method="svgp-logistic-pg"), dkm):
        with pytest.raises(InvalidArgumentError, match="not fitted by SVI") as info:
            gpzoo.fit(other, X, yb, steps=1, optimizer="natgrad", progress=False)
        assert info.value.argument == "optimizer"


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name, options, dim", [("invariant-finite", {"image_shape": (4, 4), "num_orbit_samples": 2}, 16),
                                                ("deep-tick", {"image_shape": (6, 6), "num_layers": 2}, 36)])
def test_invariant_and_deep_families_take_natgrad_steps(name, options, dim):
    """invariant-svgp's q(u) and deep-svgp's output-layer q(u) take natural steps (hidden layers: Adam)."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, dim))
    y = (X[:, 0] > 0).astype(float)
    spec = zoo.get(name, task="binary", num_inducing=6, **options)
    assert spec.method in ("invariant-svgp", "deep-svgp")
    res = gpzoo.fit(spec, X, y, steps=10, optimizer="natgrad", natgrad_step=0.3, progress=False)
    assert np.all(np.isfinite(res.objective_history))
    assert res.objective_history[-1] > res.objective_history[0]
