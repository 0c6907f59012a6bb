"""The zoo registry: shared options (``Common``), per-model defaults and option validation."""

from __future__ import annotations

import dataclasses

import pytest

from gpzoo.models import zoo
from gpzoo.models.errors import InvalidArgumentError

COMMON = {f.name for f in dataclasses.fields(zoo.Common)}


def test_every_model_takes_the_common_facts_and_options():
    for name in zoo.names():
        assert COMMON <= set(zoo.option_names(name)), name


def test_family_defaults_apply_where_the_caller_is_silent():
    rect = dict(input_dim=784, task="binary", image_shape=(28, 28))
    assert zoo.get("conv", **rect).num_inducing == 16
    assert zoo.get("invariant-rot", **rect).num_inducing == 32
    assert zoo.get("svgp-rbf", input_dim=2).num_inducing == 32
    assert zoo.get("conv", num_inducing=5, **rect).num_inducing == 5
    assert zoo.get("multichannel-conv", input_dim=48, task="binary", image_shape=(4, 4, 3)).q_structure == "block"


def test_common_spec_fills_the_task_likelihood_and_lets_fields_override():
    from gpzoo.models import kernels, likelihoods

    common = zoo.Common(task="binary", num_inducing=7, q_structure="diag")
    spec = common.spec("m", kernels.SquaredExponential(), q_structure="full", method="x")
    assert isinstance(spec.likelihood, likelihoods.Bernoulli)
    assert (spec.num_inducing, spec.q_structure, spec.method) == (7, "full", "x")


def test_unknown_options_raise_naming_the_option():
    with pytest.raises(InvalidArgumentError) as info:
        zoo.get("conv", input_dim=784, image_shape=(28, 28), bogus=1)
    assert info.value.argument == "bogus" and "patch_shape" in str(info.value)
    with pytest.raises(InvalidArgumentError) as info:
        zoo.register("never-registered", "x", num_inducng=3)
    assert info.value.argument == "num_inducng"
    assert "never-registered" not in zoo.names()


def test_unknown_model_lists_the_valid_names():
    with pytest.raises(zoo.UnknownModelError, match="svgp-rbf"):
        zoo.option_names("nope")


def test_invariant_models_pass_the_pg_tilt_choice_to_the_family():
    import numpy as np

    from gpzoo.inference import fit

    rect = dict(input_dim=16, image_shape=(4, 4), num_inducing=4, num_orbit_samples=2)
    spec = zoo.get("invariant-rot", task="binary", pg_c="recognition", pg_recognition_hidden=(8,), **rect)
    assert spec.options["pg_c"] == "recognition" and spec.options["pg_recognition_hidden"] == (8,)
    assert "pg_c" not in zoo.get("invariant-rot", task="binary", **rect).options
    X = np.random.default_rng(0).uniform(size=(12, 16))
    with pytest.raises(InvalidArgumentError) as info:  # a Gaussian likelihood has no PG bound to tilt
        fit(zoo.get("invariant-rot", task="regression", pg_c="recognition", **rect), X, X[:, 0], steps=1, progress=False)
    assert info.value.argument == "pg_c"


@pytest.mark.parametrize("name", sorted(zoo.LIKELIHOOD_NAMES))
def test_likelihoods_by_name_serve_their_task(name):
    task = zoo.LIKELIHOOD_NAMES[name]
    lik = zoo.likelihood_from_name(name, task, num_classes=4 if task == "multiclass" else None)
    assert lik.task == ("binary" if name.startswith("bernoulli") else "count" if name == "poisson" else task)
    assert lik.num_latent(4 if task == "multiclass" else None) == (4 if task == "multiclass" else 1)
    other = "regression" if task != "regression" else "binary"
    with pytest.raises(InvalidArgumentError) as info:
        zoo.likelihood_from_name(name, other, num_classes=4)
    assert info.value.argument == "likelihood"
