"""Kernel structure search: the grammar's canonical form, the search, its decomposition and its report."""

import importlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpzoo.analysis.search import SearchResult, _Settings, evaluate, expand, search, verdict, write_report
from gpzoo.models.errors import InvalidArgumentError
from gpzoo.models.grammar import Add, Base, Change, Mul, canonical, parse, to_kernel

search_module = importlib.import_module("gpzoo.analysis.search")  # the module (gpzoo.analysis.search is the function)


# ----------------------------------------------------------------------------- grammar
@pytest.mark.parametrize("a, b", [
    ("SE × (Per + Lin)", "Lin × SE + SE × Per"),
    ("(SE + Per) + Lin", "Lin + (Per + SE)"),
    ("SE × SE × Per", "Per × SE"),
    ("C × Per + Lin", "Lin + Per"),
    ("WN × SE × Per", "WN"),
    ("Lin × CP(SE, Per)", "CP(Lin × SE, Lin × Per)"),
    ("SE + SE × C", "SE"),
    ("(SE + Lin) × (Per + C)", "SE × Per + SE + Lin × Per + Lin"),
])
def test_equal_structures_have_one_canonical_form(a, b):
    assert canonical(parse(a)) == canonical(parse(b))
    assert canonical(parse(a)).key() == canonical(parse(b)).key()


DISTINCT = ["SE", "Per", "Lin", "RQ", "C", "SE + Per", "SE × Per", "Per × Per", "Lin × Lin", "Lin × Lin × Lin",
            "SE[0] × SE[1]", "SE[0] + SE[1]", "SE[1]", "CP(SE, Per)", "CP(Per, SE)", "CW(SE, Per)", "CP(SE, Per, 1)",
            "Lin + SE", "Lin × SE", "Lin × SE + SE", "WN × Lin", "WN", "SE + WN", "Per + RQ", "Per × RQ"]


def test_different_structures_are_never_merged():
    forms = [canonical(parse(text)) for text in DISTINCT]
    assert len(set(forms)) == len(DISTINCT)


def test_a_bare_white_noise_summand_is_the_likelihood_noise():
    assert canonical(parse("SE + WN"), noise=True) == canonical(parse("SE"))
    assert canonical(parse("SE + WN × Lin"), noise=True) != canonical(parse("SE"))


def _unit_kernel(expression):
    """The kernel of a (not canonical) expression with unit hyperparameters, by the kernel algebra."""
    if isinstance(expression, Base):
        return to_kernel(expression)
    if isinstance(expression, Add):
        out = _unit_kernel(expression.terms[0])
        for t in expression.terms[1:]:
            out = out + _unit_kernel(t)
        return out
    if isinstance(expression, Mul):
        out = _unit_kernel(expression.factors[0])
        for f in expression.factors[1:]:
            out = out * _unit_kernel(f)
        return out
    return to_kernel(Change(expression.kind, canonical(expression.first), canonical(expression.second), expression.dim))


@pytest.mark.parametrize("text", ["SE × (Per + Lin)", "(Lin + Per) × (SE + RQ)", "Lin × CP(SE, Per + Lin)",
                                  "CW(SE, Per) × Lin"])
def test_distributing_and_moving_factors_inside_changes_keeps_the_kernel(text):
    """At unit hyperparameters (every summand's variance 1) distributivity and A × CP(B, C) = CP(A×B, A×C)
    are identities of the covariance, not only of the model family."""
    X = np.linspace(-2, 3, 9)[:, None]
    raw, canon = _unit_kernel(parse(text)), to_kernel(canonical(parse(text)))
    np.testing.assert_allclose(np.asarray(canon.K(X)), np.asarray(raw.K(X)), rtol=1e-12, atol=1e-12)


_LEAVES = st.sampled_from(["SE", "Per", "Lin", "RQ", "C", "SE[1]"])
_EXPRESSIONS = st.recursive(_LEAVES, lambda inner: st.one_of(
    st.tuples(inner, inner).map(lambda p: f"({p[0]} + {p[1]})"),
    st.tuples(inner, inner).map(lambda p: f"({p[0]} × {p[1]})"),
    st.tuples(inner, inner).map(lambda p: f"CP({p[0]}, {p[1]})")), max_leaves=6)


@settings(max_examples=60, deadline=None)
@given(_EXPRESSIONS, _EXPRESSIONS)
def test_canonical_form_is_idempotent_commutative_and_round_trips_its_text(a, b):
    ea, eb = parse(a), parse(b)
    c = canonical(Add((ea, eb)))
    assert canonical(c) == c
    assert canonical(Add((eb, ea))) == c and canonical(Mul((ea, eb))) == canonical(Mul((eb, ea)))
    assert canonical(parse(c.key())) == c


def test_parse_errors_are_typed():
    for bad in ("", "SE +", "SE × (Per", "Foo + SE", "CP(SE)", "SE[x]", "SE $ Per"):
        with pytest.raises(InvalidArgumentError) as info:
            parse(bad)
        assert info.value.argument in ("expression", "base")


# ----------------------------------------------------------------------------- search
def _series(kind: str, noise: float, n: int = 100, seed: int = 0):
    """y from a known structure on x in [0, 6] (standardised): the generating expression and true period."""
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0.0, 6.0, n))
    if kind == "Lin + Per":
        f, truth, period = 0.6 * x + np.sin(2 * np.pi * x / 1.3), "Lin + Per", 1.3
    elif kind == "Per × SE":
        f, truth, period = np.sin(2 * np.pi * x / 0.9) * np.exp(-((x - 3.0) ** 2) / 4.0) * 2, "Per × SE", 0.9
    else:  # a change from a smooth level to a periodic pattern at x = 3
        w = 1 / (1 + np.exp(-8 * (x - 3.0)))
        f, truth, period = (1 - w) * np.cos(x) + w * np.sin(2 * np.pi * x / 0.8), "CP(SE, Per)", 0.8
    y = f + noise * rng.normal(size=n)
    return x, (y - y.mean()) / y.std(), canonical(parse(truth), noise=True), period


RECOVERY = dict(depth=3, bases=("SE", "Per", "Lin"), restarts=4, steps=40, progress=False)


@pytest.mark.parametrize("noise", [0.05, 0.2])
@pytest.mark.parametrize("kind", ["Lin + Per", "Per × SE", "CP(SE, Per)"])
def test_the_search_recovers_a_generating_structure(kind, noise):
    """The best structure is the generating one or scores within 2 BIC units of it; its periods are within 5 %."""
    x, y, truth, period = _series(kind, noise)
    result = search(x, y, changes=kind.startswith("CP"), **RECOVERY)
    settings_ = result.settings
    generating = evaluate(truth, x[:, None], y, settings_, search_module._data_stats(x[:, None], y))
    assert result.best.score <= generating.score + 2.0, (result.best.expression, result.best.score, generating.score)
    periods = [v for k, v in result.best.hyperparameters.items() if k.endswith("period")]
    assert all(abs(p - period) / period < 0.05 for p in periods), periods
    if kind != "CP(SE, Per)":
        assert periods, f"{result.best.expression} has no periodic part"


def test_a_search_fits_each_canonical_structure_once_and_expands_the_best():
    x, y, _, _ = _series("Lin + Per", 0.1)
    result = search(x, y, depth=2, bases=("SE", "Lin"), restarts=2, steps=15, changes=False, progress=False)
    keys = [c.expression for c in result.trace]
    assert len(keys) == len(set(keys))
    assert all(canonical(parse(k), noise=True).key() == k for k in keys)
    first = [c for c in result.trace if c.depth == 1]
    best_first = min(first, key=lambda c: c.score)
    children = {e.key() for e in expand(canonical(parse(best_first.expression)), ("SE", "Lin"), 1, changes=False)}
    second = {c.expression for c in result.trace if c.depth == 2}
    assert second and second <= children - {c.expression for c in first}
    assert all(c.parent == best_first.expression for c in result.trace if c.depth == 2)
    assert {"SE[0]", "Lin[0]"} == {c.expression for c in first}
    assert result.table()["score"].is_monotonic_increasing


def test_batched_restarts_reach_the_restarts_run_one_by_one(precision):
    """The restarts optimised together (one vmapped program) reach the optimum they reach one by one.

    Each restart's L-BFGS bookkeeping is its own, so only the batched arithmetic's rounding differs;
    a restart in a flat region can carry that into another local optimum, so the claim is about the
    search's result, the best restart: equal to 1e-8 in float64. In float32 the Armijo test cannot
    see changes below the loss's resolution and the line searches stall early, at 2 % of each other."""
    x, y, truth, _ = _series("Lin + Per", 0.1)
    X = x[:, None]
    stats = search_module._data_stats(X, y)
    dtype = jnp.result_type(float)
    u0 = search_module._initial_points(truth, stats, 3, 0, dtype)
    structure = search_module._Structure(truth, "bic-exact")
    args = (jnp.asarray(X, dtype), jnp.asarray(y, dtype), jnp.asarray(X[:10], dtype), jnp.asarray(1e-4 * stats["y_var"], dtype))
    _, batched = search_module._optimise(structure, u0, *args, 300)
    alone = np.array([search_module._optimise(structure, {k: v[r:r + 1] for k, v in u0.items()}, *args, 300)[1][0]
                      for r in range(3)])
    batched = np.asarray(batched)
    assert np.all(np.isfinite(batched)) and np.all(np.isfinite(alone))
    np.testing.assert_allclose(alone.max(), batched.max(), rtol=1e-8 if precision == "float64" else 2e-2)


@pytest.mark.parametrize("text", ["Per × SE + SE", "CP(RQ, Per) + Lin", "CW(SE + Per, Lin)", "SE[0] × Lin[1] + RQ[1]"])
def test_every_hyperparameter_site_is_traced_to_its_base_column_and_field(text):
    """The site -> (base, column, field) map behind inherited initial values: every trainable site, each once,
    its field the site's last name part, a product summand's variance its own ("product")."""
    expression = canonical(parse(text), noise=True)
    fields = search_module._site_fields(expression)
    sites = search_module._sites(to_kernel(expression))
    assert sorted(name for name, _ in fields) == sorted(sites)
    for site, (base, column, field) in fields:
        assert site.rsplit(".", 1)[1] == field
        assert column in (0, 1)
        assert base in ("SE", "Per", "Lin", "RQ", "CP", "CW", "product")
    assert sum(1 for _, key in fields if key[0] == "product") == sum(isinstance(t, Mul) for t in search_module.summands(expression))


def test_a_child_structure_gets_one_more_restart_that_continues_its_parents_fit(precision):
    """The restarts of a structure without a parent start as before, and one more continues the parent's fit:
    every hyperparameter the parent had, and the noise, at the parent's fitted value (Duvenaud 2014, ch. 1,
    "Scoring kernel families"), the new base kernel's at its typical values."""
    dtype, rtol = (jnp.float32, 1e-5) if precision == "float32" else (jnp.float64, 1e-12)
    x, y, _, _ = _series("Lin + Per", 0.1)
    X = x[:, None]
    stats = search_module._data_stats(X, y)
    parent = canonical(parse("Per + SE"), noise=True)
    fitted = {site: 0.1 + 0.37 * i for i, (site, _) in enumerate(search_module._site_fields(parent))}
    fitted["noise"] = 0.0123
    child = canonical(parse("Per + SE + Lin"), noise=True)
    u0 = search_module._initial_points(child, stats, 3, 0, dtype, (parent, fitted))
    alone = search_module._initial_points(child, stats, 3, 0, dtype)  # no parent
    constrained = {site: constraint for site, (_, constraint) in search_module._sites(to_kernel(child)).items()}
    by_field = dict(search_module._site_fields(child))
    parent_by_field = {key: fitted[site] for site, key in search_module._site_fields(parent)}
    checked = 0
    for site, values in u0.items():
        assert values.shape[0] == 4
        np.testing.assert_array_equal(values[:3], alone[site])  # the usual restarts, unchanged
        if site == "noise":
            np.testing.assert_allclose(np.exp(values[3]), 0.0123, rtol=rtol)
            continue
        value = float(search_module.biject_to(constrained[site])(values[3]))
        if by_field[site] in parent_by_field:
            np.testing.assert_allclose(value, parent_by_field[by_field[site]], rtol=rtol)
            checked += 1
        else:  # the new Lin's variance and offset start at their typical values (restart 0's)
            assert by_field[site][0] == "Lin"
            np.testing.assert_allclose(values[3], alone[site][0], rtol=rtol)
    assert checked == len(fitted) - 1
    # and the search counts it, when asked: a child's candidate reports restarts + 1
    kwargs = dict(depth=2, bases=("Per", "Lin"), restarts=2, steps=10, changes=False, progress=False)
    result = search(x, y, continue_parents=True, **kwargs)
    assert {c.restarts for c in result.trace if c.depth == 1} == {2}
    assert {c.restarts for c in result.trace if c.depth == 2} == {3}
    assert {c.restarts for c in search(x, y, **kwargs).trace} == {2}  # off by default


def _fitted(expression_text: str, x, y) -> SearchResult:
    expression = canonical(parse(expression_text), noise=True)
    settings_ = _Settings(restarts=2, steps=20, score="bic-exact", num_inducing=10, seed=0)
    candidate = evaluate(expression, x[:, None], y, settings_, search_module._data_stats(x[:, None], y))
    return SearchResult(trace=(candidate,), score="bic-exact", X=x[:, None], y=y, settings=settings_)


def test_the_additive_decomposition_sums_to_the_posterior():  # float64 (the suite's default)
    """Duvenaud 2014, eq. 1.17–1.18: component means sum to the posterior mean; component covariances
    plus cross-covariances sum to the posterior covariance."""
    x, y, _, _ = _series("Lin + Per", 0.1, n=40)
    result = _fitted("Lin + Per × SE + SE", x, y)
    X_new = np.linspace(-1, 7, 25)[:, None]
    parts = result.decomposition(X_new, full_cov=True)
    assert len(parts) == 3
    kernel = result.kernel()
    X = jnp.asarray(result.X)
    A = np.asarray(kernel.K(X)) + result.noise_variance * np.eye(len(x))
    Ks = [np.asarray(k.K(X, jnp.asarray(X_new))) for k in kernel.kernels]
    full_mean, full_var = result.predict(X_new)
    full_cov = np.asarray(kernel.K(jnp.asarray(X_new))) - sum(Ks).T @ np.linalg.solve(A, sum(Ks))
    np.testing.assert_allclose(sum(p["mean"] for p in parts), full_mean, atol=1e-8)
    cross = sum(-Ks[i].T @ np.linalg.solve(A, Ks[j]) for i in range(3) for j in range(3) if i != j)
    np.testing.assert_allclose(sum(p["cov"] for p in parts) + cross, full_cov, atol=1e-8)
    np.testing.assert_allclose(np.diag(full_cov), full_var, atol=1e-8)


def test_a_component_that_is_the_whole_kernel_is_the_posterior():
    x, y, _, _ = _series("Per × SE", 0.1, n=40)
    result = _fitted("Per × SE", x, y)
    X_new = np.linspace(0, 6, 11)
    (part,) = result.decomposition(X_new)
    mean, var = result.predict(X_new)
    np.testing.assert_allclose(part["mean"], mean, atol=1e-10)
    np.testing.assert_allclose(part["var"], var, atol=1e-10)
    assert part["description"].startswith("approximately periodic, period ")


@pytest.mark.parametrize("change, kwargs, argument", [
    ("y", {}, "y"), ("constant", {}, "y"), ("one", {}, "X"), ("depth", {"depth": 0}, "depth"),
    ("bases", {"bases": ("SE", "Fourier")}, "bases"), ("backend", {"backend": "dask"}, "backend"),
    ("restarts", {"restarts": 0}, "restarts"), ("continue", {"continue_parents": "yes"}, "continue_parents"),
])
def test_bad_input_gets_a_typed_error_naming_the_argument(change, kwargs, argument):
    x, y = np.linspace(0, 1, 10), np.sin(np.linspace(0, 1, 10))
    if change == "y":
        y = y.copy()
        y[3] = np.nan
    elif change == "constant":
        y = np.ones(10)
    elif change == "one":
        x, y = x[:1], y[:1]
    with pytest.raises(InvalidArgumentError) as info:
        search(x, y, progress=False, **kwargs)
    assert info.value.argument == argument


def test_the_best_structure_is_an_ordinary_gpzoo_model(tmp_path):
    from gpzoo.inference import fit, load, predict, save

    x, y, _, _ = _series("Lin + Per", 0.1, n=40)
    result = _fitted("Lin + Per", x, y)
    spec = result.spec(num_inducing=12)
    res = fit(spec, x[:, None], y, steps=5, seed=0, progress=False)
    pred = predict(load(save(res, tmp_path / "model")), np.linspace(0, 6, 7)[:, None])
    assert np.all(np.isfinite(pred.f_mean)) and pred.f_mean.shape == (7, 1)
    # the spec starts at the search's hyperparameters: its kernel equals the searched one before fitting
    np.testing.assert_allclose(np.asarray(spec.kernel.K(jnp.asarray(x[:5, None]))),
                               np.asarray(result.kernel().K(jnp.asarray(x[:5, None]))), rtol=1e-6)


def test_the_report_opens_with_the_verdict_and_the_cli_writes_it(tmp_path):
    from gpzoo.analysis.cli import main

    x, y, _, _ = _series("Lin + Per", 0.1, n=40)
    np.savetxt(tmp_path / "series.csv", np.column_stack([x, y]), delimiter=",", header="x,y", comments="")
    out = tmp_path / "out"
    status = main(["search", "--data-path", str(tmp_path / "series.csv"), "--depth", "1", "--bases", "Lin,Per",
                   "--restarts", "2", "--steps", "10", "--out", str(out), "--quiet"])
    assert status == 0
    summary = json.loads((out / "search.json").read_text())
    html = (out / "report.html").read_text()
    first = html.split('<p class="verdict">')[1].split("</p>")[0]
    best = min(summary["trace"], key=lambda c: c["score"])
    assert first.startswith(f"{str(canonical(parse(best['expression'])))} fits best")
    assert {c["expression"] for c in summary["trace"]} == {"Lin[0]", "Per[0]"}
    assert (out / "figures" / "components.png").stat().st_size > 0
    # a second run into the same folder is refused without --overwrite
    assert main(["search", "--data-path", str(tmp_path / "series.csv"), "--depth", "1", "--out", str(out), "--quiet"]) == 2
    # --continue-parents reaches the search: each depth-2 structure has its parent-continuing restart
    assert main(["search", "--data-path", str(tmp_path / "series.csv"), "--depth", "2", "--bases", "Lin,Per", "--restarts",
                 "2", "--steps", "5", "--no-changes", "--continue-parents", "--out", str(out), "--overwrite", "--quiet"]) == 0
    trace = json.loads((out / "search.json").read_text())["trace"]
    assert {c["restarts"] for c in trace if c["depth"] == 2} == {3}


def test_verdict_names_the_winner_and_the_evidence():
    x, y, _, _ = _series("Lin + Per", 0.1, n=40)
    a, b = _fitted("Lin + Per", x, y), _fitted("SE", x, y)
    both = SearchResult(trace=a.trace + b.trace, score="bic-exact", X=a.X, y=a.y, settings=a.settings)
    text = verdict(both)
    delta = b.best.score - a.best.score
    assert text.startswith("Lin + Per fits best") and f"{delta:.1f} lower than the runner-up SE" in text
    assert delta > 10 and "very strong evidence" in text


def test_the_ray_backend_gives_the_sequential_results_bit_for_bit():
    pytest.importorskip("ray")
    import ray

    x, y, _, _ = _series("Lin + Per", 0.1, n=40)
    kwargs = dict(depth=2, bases=("SE", "Lin"), restarts=2, steps=10, changes=False, progress=False)
    here = search(x, y, **kwargs)
    try:
        there = search(x, y, backend="ray", **kwargs)
    finally:
        ray.shutdown()
    assert [c.expression for c in here.trace] == [c.expression for c in there.trace]
    for a, b in zip(here.trace, there.trace):
        assert (a.score, a.log_marginal, a.hyperparameters, a.parent) == (b.score, b.log_marginal, b.hyperparameters, b.parent)


def test_progress_counts_the_structures_of_each_depth_and_names_the_best_so_far(capsys):
    x, y, _, _ = _series("Lin + Per", 0.1, n=40)
    result = search(x, y, depth=1, bases=("SE", "Lin"), restarts=1, steps=3, progress=True)
    err = capsys.readouterr().err
    assert "depth 1/1" in err and "2/2" in err
    assert f"best {result.best.expression}" in err


def test_a_float32_search_finds_the_period(float32):
    """The library's default precision: the search runs in float32 and finds Lin + Per's period."""
    x, y, _, period = _series("Lin + Per", 0.05)
    result = search(x, y, depth=2, bases=("Per", "Lin"), restarts=3, steps=40, changes=False, progress=False)
    assert all(np.isfinite(c.score) for c in result.trace)
    periods = [v for k, v in result.best.hyperparameters.items() if k.endswith("period")]
    assert periods and all(abs(p - period) / period < 0.05 for p in periods), (result.best.expression, periods)


def test_a_second_search_of_the_same_shapes_compiles_nothing():
    """Programs are keyed by structure and shapes: another series of the same length, another seed
    and other restarts' starting points reuse every compiled program."""
    from gpzoo.inference.programs import CompileCounter

    kwargs = dict(depth=2, bases=("SE", "Lin"), restarts=2, steps=10, changes=False, progress=False)
    x, y, _, _ = _series("Lin + Per", 0.1, n=40)
    first = search(x, y, **kwargs)
    x2, y2, _, _ = _series("Lin + Per", 0.2, n=40, seed=5)
    with CompileCounter() as counter:
        second = search(x2, y2, seed=3, **kwargs)
    assert {c.expression for c in first.trace} >= {c.expression for c in second.trace}
    assert counter.count == 0, f"the second search compiled {counter.count} programs"


def test_dropping_finished_restarts_from_the_batch_keeps_the_optimum(monkeypatch):
    """On COMPACT_MIN_POINTS points or more, restarts that have stopped leave the batch once half have; the live
    ones reach what the full batch reaches (float64, up to the batch's rounding)."""
    x, y, truth, _ = _series("Lin + Per", 0.1, n=search_module.COMPACT_MIN_POINTS)
    X = x[:, None]
    stats = search_module._data_stats(X, y)
    u0 = search_module._initial_points(truth, stats, 4, 0, jnp.float64)
    structure = search_module._Structure(truth, "bic-exact")
    args = (jnp.asarray(X), jnp.asarray(y), jnp.asarray(X[:10]), jnp.asarray(1e-6 * stats["y_var"]))
    sizes = []
    real = search_module._batched_loss_and_grad

    def counting(structure, U, *rest):
        sizes.append(len(next(iter(U.values()))))
        return real(structure, U, *rest)

    monkeypatch.setattr(search_module, "_batched_loss_and_grad", counting)
    _, compacted = search_module._optimise(structure, u0, *args, 200)
    assert 2 in sizes and sizes[0] == 4  # it did drop to half the batch
    monkeypatch.setattr(search_module, "COMPACT_MIN_POINTS", 10**9)
    _, full = search_module._optimise(structure, u0, *args, 200)
    np.testing.assert_allclose(np.nanmax(compacted), np.nanmax(full), rtol=1e-8)


# ----------------------------------------------------------------------------- non-Gaussian data
def _labels(n=240, period=1.7, seed=0):
    """Labels 0/1 drawn through a logistic link from a periodic latent 2.5 sin(2πx / period)."""
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0, 10, n))
    f = 2.5 * np.sin(2 * np.pi * x / period)
    return x, (rng.uniform(size=n) < 1 / (1 + np.exp(-f))).astype(float)


@pytest.mark.parametrize("precision", ["float32", "float64"], indirect=True)
def test_the_svgp_bound_at_the_optimal_q_is_the_collapsed_bound(precision):
    """For Gaussian noise the SVGP bound with q(v) optimal (Titsias 2009) equals the collapsed bound: the
    bound the search uses for non-Gaussian data, checked where both have closed forms."""
    from gpzoo.inference.exact import collapsed_elbo, optimal_q, svgp_elbo
    from gpzoo.models import kernels
    from gpzoo.models.likelihoods import Gaussian

    dtype = jnp.float64 if precision == "float64" else jnp.float32
    rng = np.random.default_rng(1)
    X = jnp.asarray(rng.uniform(0, 5, (60, 1)), dtype)
    y = jnp.asarray(np.sin(np.asarray(X[:, 0])) + 0.1 * rng.normal(size=60), dtype)
    kernel = kernels.SquaredExponential(lengthscale=0.8, variance=1.2) * kernels.Periodic(period=2.5, lengthscale=1.0)
    Z = X[::5]
    q_mu, q_sqrt = optimal_q(kernel, 0.05, Z, X, y)
    bound = svgp_elbo(kernel, Gaussian(noise_variance=0.05), Z, q_mu[0], q_sqrt[0], X, y)
    assert bound.dtype == dtype
    np.testing.assert_allclose(float(bound), float(collapsed_elbo(kernel, 0.05, Z, X, y)),
                               rtol=1e-9 if precision == "float64" else 2e-4)
    worse = svgp_elbo(kernel, Gaussian(noise_variance=0.05), Z, 0.9 * q_mu[0], q_sqrt[0], X, y)
    assert float(worse) < float(bound)  # the optimum is the optimum


def test_a_bernoulli_search_finds_the_period_of_the_latent():
    """Labels from a periodic latent: the SVGP-scored search prefers Per and recovers its period within 5 %;
    BIC's p counts the hyperparameters only; the components' means sum to q(f)'s mean."""
    from gpzoo.models.likelihoods import Bernoulli

    x, y = _labels()
    result = search(x, y, depth=1, bases=["SE", "Per", "Lin"], likelihood=Bernoulli(), restarts=3, progress=False)
    assert result.score == "bic-svgp" and result.expression == parse("Per")
    assert abs(result.best.hyperparameters["kernel.period"] - 1.7) < 0.05 * 1.7
    assert {c.expression: c.num_params for c in result.trace} == {"SE[0]": 2, "Per[0]": 3, "Lin[0]": 2}
    best = result.best
    assert best.score == pytest.approx(-2 * best.log_marginal + 3 * np.log(len(y)))
    grid = np.linspace(0, 10, 9)
    mean, var = result.predict(grid)
    parts = result.decomposition(grid)
    np.testing.assert_allclose(sum(p["mean"] for p in parts), mean, rtol=1e-8, atol=1e-10)
    assert np.all(var > 0)
    scores = search_module.heldout_metrics(result, *_labels(seed=1))
    assert scores["mean_log_predictive_density"] > np.log(0.5)  # better than a coin on held-out labels


def test_svgp_components_are_each_summands_q():
    """For a sum S₁ + S₂ each component's q(f_i) = ∫ p(f_i | u) q(u) du, written out with explicit inverses;
    the two means sum to q(f)'s."""
    from gpzoo.models.likelihoods import Poisson

    rng = np.random.default_rng(2)
    x = np.sort(rng.uniform(0, 10, 80))
    y = rng.poisson(np.exp(0.8 * np.sin(x) + 0.1 * x)).astype(float)
    settings = _Settings(restarts=1, steps=15, score="bic-svgp", num_inducing=10, seed=0,
                         likelihood=search_module._likelihood_key(Poisson()))
    stats = search_module._data_stats(x[:, None], search_module._latent_proxy(y, Poisson()))
    candidate = evaluate(canonical(parse("SE + Lin"), noise=True), x[:, None], y, settings, stats)
    result = SearchResult(trace=(candidate,), score="bic-svgp", X=x[:, None], y=y, settings=settings, likelihood=Poisson())
    X_new = jnp.asarray(np.linspace(-1, 11, 6)[:, None])
    kernel = result.kernel()
    Z, m, S = result._variational()
    Kuu_inv = np.linalg.inv(np.asarray(kernel.K(Z)) + 1e-6 * np.eye(len(Z)))
    Luu = np.linalg.cholesky(np.asarray(kernel.K(Z)) + 1e-6 * np.eye(len(Z)))
    u_mean, u_cov = Luu @ np.asarray(m), Luu @ np.asarray(S) @ np.asarray(S).T @ Luu.T
    parts = result.decomposition(X_new, full_cov=True)
    for part, k in zip(parts, kernel.kernels):
        Kxu = np.asarray(k.K(X_new, Z))
        np.testing.assert_allclose(part["mean"], Kxu @ Kuu_inv @ u_mean, rtol=1e-6, atol=1e-8)
        cov = np.asarray(k.K(X_new)) - Kxu @ Kuu_inv @ Kxu.T + Kxu @ Kuu_inv @ u_cov @ Kuu_inv @ Kxu.T
        np.testing.assert_allclose(part["cov"], cov, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(parts[0]["mean"] + parts[1]["mean"], result.predict(X_new)[0], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("likelihood, y, argument", [
    ("softmax", None, "likelihood"), ("bernoulli", "counts", "y"), ("poisson", "negative", "y")])
def test_a_likelihood_the_search_cannot_score_or_targets_it_cannot_take_are_refused(likelihood, y, argument):
    from gpzoo.models.likelihoods import Bernoulli, Poisson, Softmax

    x = np.linspace(0, 1, 12)
    targets = {None: np.arange(12) % 2, "counts": np.arange(12.0), "negative": -np.ones(12)}[y].astype(float)
    lik = {"softmax": Softmax(num_classes=3), "bernoulli": Bernoulli(), "poisson": Poisson()}[likelihood]
    with pytest.raises(InvalidArgumentError) as info:  # DataError for the targets is one
        search(x, targets, likelihood=lik, progress=False)
    assert info.value.argument == argument


def test_the_cli_searches_labels_with_the_bernoulli_likelihood(tmp_path):
    from gpzoo.analysis.cli import main

    x, y = _labels(n=80)
    np.savetxt(tmp_path / "labels.csv", np.column_stack([x, y]), delimiter=",", header="x,y", comments="")
    out = tmp_path / "out"
    assert main(["search", "--data-path", str(tmp_path / "labels.csv"), "--likelihood", "bernoulli", "--depth", "1",
                 "--bases", "SE,Per", "--restarts", "2", "--steps", "10", "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "search.json").read_text())
    assert summary["score"] == "bic-svgp" and summary["settings"]["likelihood"].startswith("Bernoulli")
    assert "−2 ELBO + p log N" in (out / "report.html").read_text() and (out / "figures" / "fit.png").stat().st_size > 0


def test_a_second_bernoulli_search_of_the_same_shapes_compiles_nothing(float32):
    """The likelihood is part of the SVGP score's program key by value: other labels, inputs and seed on the same
    shapes reuse every program (float32, the library default)."""
    from gpzoo.inference.programs import CompileCounter
    from gpzoo.models.likelihoods import Bernoulli

    x, y = _labels(n=60)
    first = search(x, y, depth=1, bases=["SE", "Per"], likelihood=Bernoulli(), restarts=2, steps=8, progress=False)
    assert first.score == "bic-svgp" and np.isfinite(first.best.score)
    with CompileCounter() as counter:
        search(x + 0.5, _labels(n=60, seed=3)[1], depth=1, bases=["SE", "Per"], likelihood=Bernoulli(), restarts=2,
               steps=8, seed=2, progress=False)
    assert counter.count == 0
