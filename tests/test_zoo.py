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


@pytest.mark.parametrize("task, num_classes", [("binary", 3), ("regression", 3), ("regression", 2)])
def test_num_classes_that_contradict_the_task_are_refused_by_name(task, num_classes):
    with pytest.raises(InvalidArgumentError) as info:
        zoo.get("tick", image_shape=(7, 10), task=task, num_classes=num_classes)
    assert info.value.argument == "num_classes"
    assert zoo.get("tick", image_shape=(7, 10), task="binary", num_classes=2).likelihood.task == "binary"


@pytest.mark.parametrize("option, value", [("lengthscale", -1.0), ("lengthscale", 0.0), ("variance", -2.0)])
def test_out_of_domain_hyperparameter_options_name_the_option(option, value):
    from gpzoo.models.errors import HyperparameterError

    for name in ("tick", "conv", "deep-conv"):
        with pytest.raises(HyperparameterError) as info:
            zoo.get(name, image_shape=(7, 10), task="binary", **{option: value})
        assert info.value.argument == option, name


def test_unknown_model_lists_the_valid_names():
    with pytest.raises(zoo.UnknownModelError, match="svgp-rbf"):
        zoo.option_names("nope")


def test_mistyped_model_name_suggests_the_nearest():
    for typed, nearest in (("svgp-rfb", "svgp-rbf"), ("conv-rbf", "conv+rbf"), ("Weighted_Conv", "weighted-conv")):
        with pytest.raises(zoo.UnknownModelError) as info:
            zoo.get(typed)
        assert str(info.value).startswith(f"unknown model {typed!r}; did you mean {nearest!r}? valid: ")
        assert info.value.argument == "model"
    with pytest.raises(zoo.UnknownModelError) as info:
        zoo.get("qqqq")
    assert "did you mean" not in str(info.value)


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


# ----------------------------------------------------------------------------- declared options
def _own_parameters(name):
    import inspect  # noqa: PLC0415

    from gpzoo.models.zoo_core import REGISTRY  # noqa: PLC0415

    return list(inspect.signature(REGISTRY[name].builder).parameters.values())[1:]


@pytest.mark.parametrize("name", zoo.names())
def test_options_are_the_builder_signature_then_the_common_fields(name):
    import typing  # noqa: PLC0415

    from gpzoo.models.zoo_core import REGISTRY  # noqa: PLC0415

    options = zoo.options(name)
    own = [o for o in options if o.kind == "model"]
    params = _own_parameters(name)
    hints = typing.get_type_hints(REGISTRY[name].builder)  # Annotated[...] stripped
    assert [o.name for o in own] == [p.name for p in params]
    assert [o.default for o in own] == [p.default for p in params]
    assert [o.type for o in own] == [hints[p.name] for p in params]
    assert all(o.help for o in own), [o.name for o in own if not o.help]
    assert [o.name for o in options if o.kind != "model"] == [f.name for f in dataclasses.fields(zoo.Common)]
    assert {o.name for o in options if o.kind == "dataset"} == set(zoo.DATASET_FACTS)


def test_option_defaults_include_the_model_common_defaults():
    by_name = {o.name: o for o in zoo.options("svgp-rbf")}
    assert by_name["num_inducing"].default == 32 and by_name["ard"].default is False
    assert {o.name: o for o in zoo.options("multichannel-conv")}["q_structure"].default == "block"
    assert {o.name: o for o in zoo.options("conv")}["patch_shape"].type == tuple[int, int]


@pytest.mark.parametrize("name, key, text, expected", [
    ("conv", "patch_shape", "5x5", (5, 5)),
    ("conv", "patch_shape", "5,4", (5, 4)),
    ("conv", "patch_shape", "(5, 5)", (5, 5)),
    ("conv", "num_inducing", "8", 8),
    ("conv", "lengthscale", "0.25", 0.25),
    ("conv", "lengthscale", "none", None),
    ("conv", "variance", "None", None),
    ("conv", "products", "conv", "conv"),
    ("conv", "q_structure", "diag", "diag"),
    ("conv", "inducing_init", "kmeans", "kmeans"),
    ("svgp-rbf", "lengthscale", "2", 2.0),
    ("svgp-rbf", "lengthscale", "0.5,1,2", (0.5, 1.0, 2.0)),
    ("invariant-rot", "pg_recognition_hidden", "16,8", (16, 8)),
    ("invariant-finite", "num_orbit_samples", "none", None),
    ("invariant-affine", "lower", "-1,-2,-3,-4,-5,-6", (-1.0, -2.0, -3.0, -4.0, -5.0, -6.0)),
    ("svgp-logistic-pg", "acceleration", "anderson", "anderson"),
])
def test_parse_option_converts_text_to_the_declared_type(name, key, text, expected):
    value = zoo.parse_option(name, key, text)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize("text, expected", [("true", True), ("Yes", True), ("1", True), ("false", False), ("no", False), ("0", False)])
def test_parse_option_reads_booleans(text, expected):
    assert zoo.parse_option("svgp-rbf", "ard", text) is expected


@pytest.mark.parametrize("name, key, text", [
    ("conv", "patch_shape", "5"), ("conv", "patch_shape", "5x5x5"), ("conv", "patch_shape", "5y5"),
    ("conv", "num_inducing", "1.5"), ("conv", "lengthscale", "short"), ("svgp-rbf", "ard", "maybe"),
    ("conv", "products", "fft"), ("invariant-finite", "group", "rotations"), ("conv", "likelihood", "gaussian"),
    ("conv", "ard", "true"),
])
def test_parse_option_rejects_bad_text_naming_the_option(name, key, text):
    with pytest.raises(InvalidArgumentError) as info:
        zoo.parse_option(name, key, text)
    assert info.value.argument == key and key in str(info.value)


def test_register_refuses_builders_that_do_not_declare_their_options():
    def no_common(input_dim: int = 1):
        raise AssertionError

    def untyped(common, patch_shape=(3, 3)):
        raise AssertionError

    def no_default(common, patch_shape: tuple[int, int]):
        raise AssertionError

    def var_keyword(common, **options):
        raise AssertionError

    def shadows_common(common, num_inducing: int = 3):
        raise AssertionError

    for builder in (no_common, untyped, no_default, var_keyword, shadows_common):
        with pytest.raises(TypeError, match="never-registered"):
            zoo.register("never-registered", "x")(builder)
    assert "never-registered" not in zoo.names()


# ----------------------------------------------------------------------------- Common helpers
def test_common_image_shape_is_given_or_a_square_checked_against_input_dim():
    assert zoo.Common(input_dim=784).required_image_shape("needs images") == (28, 28)
    assert zoo.Common(input_dim=48, image_shape=[4, 4, 3]).required_image_shape("needs images") == (4, 4, 3)
    assert zoo.Common(input_dim=784).given_image_shape() is None
    with pytest.raises(InvalidArgumentError, match="needs images") as info:
        zoo.Common(input_dim=30).required_image_shape("needs images")
    assert info.value.argument == "image_shape"
    with pytest.raises(InvalidArgumentError, match="16 pixels but input_dim is 64"):
        zoo.Common(input_dim=64, image_shape=(4, 4)).given_image_shape()


def test_common_default_lengthscale_and_ard():
    assert zoo.Common(input_dim=784).lengthscale(image_shape=(28, 28)) == 14.0  # √D / 2 on images
    assert zoo.Common(input_dim=2).lengthscale() == 1.0  # tables
    assert zoo.Common(input_dim=2).lengthscale(0.3) == 0.3
    ard = zoo.Common(input_dim=3).lengthscale(0.3, ard=True)
    assert ard.shape == (3,) and (ard == 0.3).all()
    with pytest.raises(InvalidArgumentError) as info:
        zoo.Common().lengthscale(ard=True)
    assert info.value.argument == "input_dim"
    assert zoo.get("svgp-rbf", input_dim=784, image_shape=(28, 28)).kernel.lengthscale == 14.0
    assert zoo.get("conv+rbf", input_dim=784).kernel.kernels[1].lengthscale == 14.0
    assert zoo.get("invariant-rot", image_shape=(8, 8), task="binary").kernel.base_kernel.lengthscale == 4.0


@pytest.mark.parametrize("jitter", [-1.0, 0.0, float("nan"), "1e-6", True, 1e39])
def test_a_spec_refuses_a_jitter_that_is_not_a_positive_finite_number(jitter, float32):
    """jitter is refused by name when negative, zero, not finite, not a real number, or infinite in
    the model's precision (1e39 in float32) — before anything is traced."""
    from gpzoo.models.errors import InvalidArgumentError  # noqa: PLC0415

    spec = zoo.get("svgp-rbf", input_dim=1)
    with pytest.raises(InvalidArgumentError) as info:
        spec.replace(jitter=jitter)
    assert info.value.argument == "jitter"
    assert spec.replace(jitter=1e-4).jitter == 1e-4
