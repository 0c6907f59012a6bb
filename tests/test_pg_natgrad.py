"""Pólya–Gamma natural gradients for the logistic SVGP (inference.pg_natgrad, Wenzel et al. 2019).

The maths stated as tests: the CAVI fixed point is the optimum of the PG bound (van der Wilk et al. 2018, eq. 23)
that Adam reaches on the same bound; CAVI never decreases the bound; minibatched natural
gradients with Robbins–Monro steps reach the same optimum; the zoo model fits two-moons. The
fit runs on the shared chunk runner (checkpoints, resume, NaN guard) and, with fixed
hyperparameters, on features computed once: both are checked against step-by-step references.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import optax
import pytest
from numpyro.distributions import biject_to, constraints

from gpzoo.analysis import datasets
from gpzoo.inference import evaluate_elbo, fit, predict
from gpzoo.inference.checkpoint import load_checkpoint
from gpzoo.inference.pg_natgrad import fit_pg_natgrad, natural_step, pg_bound, robbins_monro
from gpzoo.models import zoo
from gpzoo.models.errors import CheckpointError, DataError, InvalidArgumentError, TrainingError


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(1)
    X = rng.uniform(-3, 3, (60, 2))  # [N, D]
    y = (np.sin(X[:, 0]) + 0.5 * X[:, 1] + 0.3 * rng.normal(size=60) > 0).astype(float)  # [N]
    return X, y


@pytest.fixture(scope="module", params=[True, False], ids=["whitened", "unwhitened"])
def cavi(request, data):
    """Full-batch ρ = 1 coordinate ascent at fixed hyperparameters, run to convergence."""
    X, y = data
    spec = zoo.get("svgp-logistic-pg", input_dim=2, num_inducing=8, lengthscale=1.5,
                   learn_hyperparameters=False, whiten=request.param)
    return fit(spec, X, y, steps=30, progress=False)


def _q_moments(res):
    """Mean ``[M]`` and covariance ``[M, M]`` of q(u) (unwhitened, so whitened and not compare)."""
    params, family = res.params, res.family
    with numpyro.handlers.substitute(data=params), numpyro.handlers.seed(rng_seed=0):
        Luu = family.parts().Luu[0]
    mean, sqrt = params["q_mu"][0], params["q_sqrt"][0]
    if res.spec.whiten:
        mean, sqrt = Luu @ mean, Luu @ sqrt
    return np.asarray(mean), np.asarray(sqrt @ sqrt.T)


def test_cavi_increases_the_bound_monotonically_and_converges_fast(cavi):
    bounds = cavi.objective_history
    assert np.all(np.diff(bounds) >= -1e-9 * np.abs(bounds[1:]))  # coordinate ascent
    assert bounds[-1] - bounds[0] > 1.0
    assert abs(bounds[10] - bounds[-1]) < 1e-4  # ~10 sweeps reach the fixed point
    # the recorded value is the library's PG bound (optimal c) at the returned parameters' predecessor
    X, y = cavi.X_train, cavi.y_train
    at_end = float(pg_bound(cavi.family, cavi.params, jnp.asarray(X), jnp.asarray(y)))
    assert at_end == pytest.approx(bounds[-1], abs=1e-8)
    # the exact ELBO (Gauss–Hermite) is at least the PG bound, which is a lower bound on it
    assert evaluate_elbo(cavi).elbo >= at_end - 1e-8


def test_cavi_fixed_point_is_the_adam_optimum_of_the_same_bound(cavi):
    """Adam on (q_mu, q_sqrt, c) of the same PG bound reaches the CAVI fixed point."""
    X, y = jnp.asarray(cavi.X_train), jnp.asarray(cavi.y_train)
    family, params = cavi.family, cavi.params
    to_sqrt = biject_to(constraints.lower_cholesky)
    M = params["q_mu"].shape[1]
    raw0 = {"q_mu": jnp.zeros((1, M)), "q_sqrt": to_sqrt.inv(jnp.eye(M)[None]), "log_c": jnp.zeros(X.shape[0])}

    def loss(raw):
        p = {**params, "q_mu": raw["q_mu"], "q_sqrt": to_sqrt(raw["q_sqrt"])}
        return -pg_bound(family, p, X, y, c=jnp.exp(raw["log_c"]))

    steps = 2000
    opt = optax.adam(optax.exponential_decay(0.05, steps, 0.01))

    @jax.jit
    def run(raw):
        def body(carry, _):
            raw, state = carry
            value, grad = jax.value_and_grad(loss)(raw)
            updates, state = opt.update(grad, state, raw)
            return (optax.apply_updates(raw, updates), state), value

        (raw, _), values = jax.lax.scan(body, (raw, opt.init(raw)), None, length=steps)
        return raw, values

    raw, _ = run(raw0)
    adam = {**params, "q_mu": np.asarray(raw["q_mu"]), "q_sqrt": np.asarray(to_sqrt(raw["q_sqrt"]))}
    adam_bound = -float(loss(raw))
    cavi_bound = float(pg_bound(family, params, X, y))
    assert adam_bound <= cavi_bound + 1e-8  # the CAVI fixed point is the maximum
    assert adam_bound == pytest.approx(cavi_bound, abs=1e-7)  # observed: agree to ~1e-14
    mean_c, cov_c = _q_moments(cavi)
    mean_a, cov_a = _q_moments(dataclasses.replace(cavi, params=adam))
    np.testing.assert_allclose(mean_a, mean_c, atol=1e-5)  # |mean| ~ 1, entries of cov ≤ 0.5; the bound is
    np.testing.assert_allclose(cov_a, cov_c, atol=1e-4)  # flat in some directions of S: observed ≤ 7e-6


def test_minibatch_natural_gradient_reaches_the_full_batch_optimum(data, cavi):
    if not cavi.spec.whiten:
        pytest.skip("one parameterisation is enough: the step is the same in both")
    X, y = data
    res = fit_pg_natgrad(cavi.spec, X, y, steps=300, batch_size=15, step_size=robbins_monro(tau=1.0, kappa=0.6),
                         inducing=cavi.inducing, progress=False)
    assert res.step_size_history[0] == 1.0 and res.step_size_history[-1] == pytest.approx(300**-0.6)
    full = float(pg_bound(res.family, res.params, jnp.asarray(X), jnp.asarray(y)))
    optimum = cavi.final_objective
    assert full <= optimum + 1e-8
    assert optimum - full < 1e-3  # nats, on a bound of −34 (observed 1.3e-4)


def test_zoo_model_fits_two_moons_and_predicts():
    moons = datasets.load("two-moons", num_train=200, num_test=200, seed=0)
    spec = zoo.get("svgp-logistic-pg", input_dim=2, task="binary", num_inducing=12)
    assert spec.method == "svgp-logistic-pg" and spec.whiten
    res = fit(spec, moons.X_train, moons.y_train, steps=60, progress=False)
    assert res.diagnostics["trained_hyperparameters"] == ["inducing.Z", "kernel.lengthscale", "kernel.variance"]
    assert not np.allclose(res.params["kernel.lengthscale"], 1.0)  # Adam moved the hyperparameters
    pred = predict(res, moons.X_test)
    assert np.mean((pred.probs[:, 1] > 0.5) == moons.y_test) >= 0.9
    elbo = evaluate_elbo(res)
    assert np.isfinite(elbo.elbo) and elbo.elbo >= res.final_objective - 1.0
    assert set(res.params) == {"inducing.Z", "kernel.lengthscale", "kernel.variance", "q_mu", "q_sqrt"}


def test_bad_labels_and_specs_raise_typed_errors(data):
    X, y = data
    spec = zoo.get("svgp-logistic-pg", input_dim=2, num_inducing=4)
    with pytest.raises(DataError) as info:
        fit(spec, X, 2 * y - 1, steps=1, progress=False)
    assert info.value.argument == "y"
    with pytest.raises(InvalidArgumentError) as info:
        zoo.get("svgp-logistic-pg", input_dim=2, task="regression")
    assert info.value.argument == "likelihood"
    with pytest.raises(InvalidArgumentError) as info:
        fit_pg_natgrad(zoo.get("svgp-rbf", input_dim=2, num_inducing=4), X, y, steps=1)
    assert info.value.argument == "likelihood"
    with pytest.raises(InvalidArgumentError) as info:
        fit_pg_natgrad(spec, X, y, steps=1, step_size=1.5)
    assert info.value.argument == "step_size"
    with pytest.raises(InvalidArgumentError) as info:
        robbins_monro(kappa=0.4)
    assert info.value.argument == "kappa"
    with pytest.raises(InvalidArgumentError) as info:
        fit(spec, X, y, steps=1, resume=True, progress=False)
    assert info.value.argument == "resume"


# ----------------------------------------------------------------------------- the shared chunk runner
@pytest.mark.parametrize("trained", [False, True], ids=["fixed-full-batch", "trained-minibatch"])
def test_checkpointed_resume_reproduces_the_uninterrupted_run(tmp_path, data, trained):
    """Fewer steps with checkpoints, then resume to the full count: bit-identical to one run (ρ_t, batches, Adam state)."""
    X, y = data
    spec = zoo.get("svgp-logistic-pg", input_dim=2, num_inducing=6, learn_hyperparameters=trained)
    kw = dict(batch_size=20 if trained else None, seed=2, progress=False, checkpoint_every=4, chunk_size=3)
    full = fit(spec, X, y, steps=14, **kw)
    fit(spec, X, y, steps=9, checkpoint_dir=tmp_path / "ck", **kw)
    config, _, _, history = load_checkpoint(tmp_path / "ck")
    assert config["step"] == 9 and config["method"] == "svgp-logistic-pg" and history["objective"].shape == (9,)
    resumed = fit(spec, X, y, steps=14, checkpoint_dir=tmp_path / "ck", resume=True, **kw)
    assert full.params.keys() == resumed.params.keys()
    for name in full.params:
        np.testing.assert_array_equal(full.params[name], resumed.params[name], err_msg=name)
    np.testing.assert_array_equal(full.objective_history, resumed.objective_history)
    np.testing.assert_array_equal(full.step_size_history, resumed.step_size_history)
    if trained:
        assert not np.allclose(resumed.params["kernel.lengthscale"], 1.0)
        assert not np.allclose(resumed.step_size_history, 1.0)  # Robbins–Monro ρ_t carried across the resume
    # an SVI checkpoint of the same model name is refused
    svi_spec = zoo.get("svgp-rbf", input_dim=2, task="binary", num_inducing=6).replace(name="svgp-logistic-pg")
    with pytest.raises(CheckpointError, match="method"):
        fit(svi_spec, X, y, steps=20, checkpoint_dir=tmp_path / "ck", resume=True, progress=False)


def test_nan_guard_stops_the_pg_path_at_the_first_bad_step(tmp_path, data):
    """A step size that turns NaN at step 7 poisons q(u) after 8 steps: stop at step 8, checkpoint 7."""
    X, y = data
    spec = zoo.get("svgp-logistic-pg", input_dim=2, num_inducing=6, learn_hyperparameters=False)
    with pytest.raises(TrainingError) as info:
        fit_pg_natgrad(spec, X, y, steps=20, step_size=lambda t: 1.0 if t < 7 else float("nan"), chunk_size=5,
                       checkpoint_dir=tmp_path / "ck", progress=False)
    assert info.value.step == 8 and "step 8" in str(info.value) and "step 7" in str(info.value)
    config, params, _, history = load_checkpoint(tmp_path / "ck")
    assert config["step"] == 7 and history["objective"].shape == (7,)
    assert all(np.all(np.isfinite(v)) for v in params.values()) and np.all(np.isfinite(history["objective"]))


# ----------------------------------------------------------------------------- the fixed-feature fast path
def test_fast_path_equals_natural_steps_on_recomputed_features(data, monkeypatch):
    """Features computed once (cached, all N; or per batch when M·N is over the cache limit) give the same fit
    as ``natural_step``, which recomputes Kuu, its Cholesky and Kuf at every step."""
    import gpzoo.inference.pg_natgrad as pg

    X, y = data
    spec = zoo.get("svgp-logistic-pg", input_dim=2, num_inducing=6, learn_hyperparameters=False, whiten=False)
    rho = robbins_monro()
    res = fit_pg_natgrad(spec, X, y, steps=12, batch_size=15, step_size=rho, seed=4, progress=False)
    from gpzoo.inference.data import BatchSchedule

    params = {k: jnp.asarray(v) for k, v in res.params.items()}
    params["q_mu"], params["q_sqrt"] = jnp.zeros((1, 6)), res.family._init_unwhitened_sqrt()  # the prior
    batches, Xj, yj = BatchSchedule(60, 15, 4), jnp.asarray(X), jnp.asarray(y)
    bounds = []
    for t in range(12):
        idx = batches(t)
        q_mu, q_sqrt, bound = pg.natural_step(res.family, params, Xj[idx], yj[idx], 60, rho(t))
        params = {**params, "q_mu": q_mu, "q_sqrt": q_sqrt}
        bounds.append(float(bound))
    np.testing.assert_allclose(res.params["q_mu"], params["q_mu"], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(res.params["q_sqrt"], params["q_sqrt"], rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(res.objective_history, bounds, rtol=1e-10)
    monkeypatch.setattr(pg, "FEATURE_CACHE_ELEMENTS", 0)
    uncached = fit_pg_natgrad(spec, X, y, steps=12, batch_size=15, step_size=rho, seed=4, progress=False)
    np.testing.assert_allclose(uncached.params["q_sqrt"], res.params["q_sqrt"], rtol=1e-9, atol=1e-10)


def test_shared_feature_gradient_equals_the_gradient_of_the_bound(data):
    """With hyperparameters trained, the Adam step uses the gradient pulled back through the features the
    natural step used (one evaluation); it equals jax.grad of pg_bound at the new q(u)."""
    X, y = data
    spec = zoo.get("svgp-logistic-pg", input_dim=2, num_inducing=6)
    res = fit_pg_natgrad(spec, X, y, steps=3, learning_rate=0.05, progress=False)
    family = res.family
    sites = ("kernel.lengthscale", "kernel.variance", "inducing.Z")
    to_unc = {n: biject_to(constraints.positive if n.startswith("kernel") else constraints.real) for n in sites}
    params = {n: jnp.asarray(v) for n, v in res.params.items()}
    params["inducing.Z"] = jnp.asarray(res.inducing.Z)
    params["kernel.lengthscale"], params["kernel.variance"] = jnp.asarray(1.0), jnp.asarray(1.0)
    params["q_mu"], params["q_sqrt"] = jnp.zeros((1, 6)), jnp.eye(6)[None]
    hyper = {n: to_unc[n].inv(params[n]) for n in sites}
    opt = optax.adam(0.05)
    opt_state = opt.init(hyper)
    Xj, yj = jnp.asarray(X), jnp.asarray(y)
    for _ in range(3):
        current = {**params, **{n: to_unc[n](v) for n, v in hyper.items()}}
        q_mu, q_sqrt, _ = natural_step(family, current, Xj, yj, 60, 1.0)

        def loss(h):
            return -pg_bound(family, {**current, **{n: to_unc[n](v) for n, v in h.items()}, "q_mu": q_mu, "q_sqrt": q_sqrt}, Xj, yj)

        updates, opt_state = opt.update(jax.grad(loss)(hyper), opt_state, hyper)
        hyper = optax.apply_updates(hyper, updates)
        params = {**params, "q_mu": q_mu, "q_sqrt": q_sqrt}
    for n in sites:
        np.testing.assert_allclose(res.params[n], to_unc[n](hyper[n]), rtol=1e-9, atol=1e-12, err_msg=n)
    np.testing.assert_allclose(res.params["q_sqrt"], params["q_sqrt"], rtol=1e-9, atol=1e-12)


def test_anderson_accelerated_cavi_reaches_the_cavi_fixed_point_in_fewer_sweeps(data, cavi):
    """Anderson mixing on the CAVI map θ ← G(θ): same optimum, fewer sweeps; a rejected extrapolation is followed
    by the plain CAVI step from the best iterate, so the bound never falls below its running maximum twice in a row."""
    X, y = data
    res = fit_pg_natgrad(cavi.spec, X, y, steps=30, inducing=cavi.inducing, acceleration="anderson", progress=False)
    assert res.diagnostics["acceleration"] == "anderson"
    bounds, plain = res.objective_history, cavi.objective_history
    optimum = float(pg_bound(cavi.family, cavi.params, jnp.asarray(X), jnp.asarray(y)))
    assert float(pg_bound(res.family, res.params, jnp.asarray(X), jnp.asarray(y))) == pytest.approx(optimum, abs=1e-8)
    mean_a, cov_a = _q_moments(res)
    mean_c, cov_c = _q_moments(cavi)
    np.testing.assert_allclose(mean_a, mean_c, atol=1e-5)
    np.testing.assert_allclose(cov_a, cov_c, atol=1e-5)
    sweeps = lambda h: int(np.argmax(h >= optimum - 1e-7))  # noqa: E731  (this easy problem: 4 against 6)
    assert sweeps(bounds) < sweeps(plain)
    best = np.maximum.accumulate(bounds)
    for t in np.flatnonzero(bounds[1:-1] < best[:-2] - 1e-9) + 1:  # a rejected iterate at t
        assert bounds[t + 1] >= best[t - 1] - 1e-9


def test_anderson_acceleration_refuses_settings_it_does_not_cover(data):
    X, y = data
    fixed = zoo.get("svgp-logistic-pg", input_dim=2, num_inducing=4, learn_hyperparameters=False)
    for spec, kw in [(fixed, {"batch_size": 20}), (fixed, {"step_size": 0.5}),
                     (zoo.get("svgp-logistic-pg", input_dim=2, num_inducing=4), {}), (fixed, {"acceleration": "nesterov"})]:
        with pytest.raises(InvalidArgumentError) as info:
            fit_pg_natgrad(spec, X, y, steps=1, **{"acceleration": "anderson", **kw})
        assert info.value.argument == "acceleration"


def test_zoo_option_selects_anderson_acceleration(data):
    X, y = data
    spec = zoo.get("svgp-logistic-pg", input_dim=2, num_inducing=4, learn_hyperparameters=False, acceleration="anderson")
    assert spec.options["acceleration"] == "anderson"
    assert fit(spec, X, y, steps=3, progress=False).diagnostics["acceleration"] == "anderson"
    with pytest.raises(InvalidArgumentError) as info:
        zoo.get("svgp-logistic-pg", input_dim=2, acceleration="nesterov")
    assert info.value.argument == "acceleration"
