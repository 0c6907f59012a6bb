"""The deep kernel machine as a zoo model: its NumPyro program is the DKM objective, its fit records
cond(G_ℓ) and names numerical failures, its zoo options build the stated architecture.

(The zoo contract — fit, predict, ELBO, DataTree, Predictive, Trace_ELBO, save/load — runs on
``dkm`` and ``conv-dkm`` in tests/test_contract.py.) Sizes are tiny: each fit compiles once.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dkm_reference import DEAD_LAYER_2, core_params, evaluation_objective
from gpzoo.inference import build_family, dkm, fit
from gpzoo.inference.dkm_family import unflatten_network
from gpzoo.inference.elbo import FastELBO
from gpzoo.inference.inducing import initialise_inducing
from gpzoo.inference.programs import definition_of
from gpzoo.models import kernels, zoo
from gpzoo.models.dkm import DKMConfig
from gpzoo.models.errors import InvalidArgumentError, NumericalError
from gpzoo.models.zoo_dkm import architecture_spec


def _data(n=24, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    return X, (X[:, 0] * X[:, 1] > 0).astype(float)


@pytest.mark.parametrize("output_kl_weight", [1.0, 0.25])
def test_program_bound_is_the_dkm_objective(output_kl_weight):
    """FastELBO of model + guide (what ``gpzoo.fit`` maximises) = the DKM objective (Milsom et al. 2024,
    eq. 27) written out from the network's marginals and KL terms, at the same parameters, with the
    exact KL and no SKR noise (both deterministic: Bernoulli by Gauss–Hermite); the output KL weighted
    by w_out = ``output_kl_weight`` (1: the untempered output layer)."""
    X, y = _data()
    spec = zoo.get("dkm", input_dim=3, task="binary", num_inducing=8, depth=2, nu=0.3, kl="exact", skr=False)
    spec = spec.replace(architecture=dataclasses.replace(spec.architecture, output_kl_weight=output_kl_weight))
    init = initialise_inducing(spec.inducing, spec.covariance_model, X, spec.num_inducing, jax.random.PRNGKey(0))
    family = build_family(spec, init, 1)
    rng = np.random.default_rng(1)  # away from the NNGP start: every KL term non-zero
    params = {k: jnp.asarray(v + (0.1 * rng.normal(size=np.shape(v)) if k.endswith((".V", "q_mu")) else 0.0))
              for k, v in init.values.items()}
    fast = jax.jit(lambda p: -FastELBO().loss(jax.random.PRNGKey(0), p, family.model, family.guide,
                                              jnp.asarray(X), jnp.asarray(y), num_data=len(y)))(params)
    value, aux = evaluation_objective(core_params(params, spec.architecture), spec.architecture, jnp.asarray(X), y)
    np.testing.assert_allclose(float(fast), float(value), rtol=1e-9)
    assert min(float(aux["kl"][name]) for name in ("layer 1", "layer 2", "output")) > 1e-4


def test_a_dkm_spec_holds_its_network_as_architecture_not_kernel():
    """The zoo's DKM specs carry the DKMConfig as ``architecture`` (``kernel`` None); a DKMConfig as a
    kernel, neither field, or both are refused naming the field; architecture_spec fits any config."""
    spec = zoo.get("dkm", input_dim=3, task="binary", num_inducing=8, depth=2)
    config = spec.architecture
    assert spec.kernel is None and isinstance(config, DKMConfig) and spec.covariance_model is config
    with pytest.raises(InvalidArgumentError) as info:
        spec.replace(kernel=config, architecture=None)
    assert info.value.argument == "kernel" and "architecture" in str(info.value)
    with pytest.raises(InvalidArgumentError) as info:
        spec.replace(architecture=None)
    assert info.value.argument == "kernel"
    with pytest.raises(InvalidArgumentError) as info:
        spec.replace(kernel=kernels.SquaredExponential())
    assert info.value.argument == "architecture"
    with pytest.raises(InvalidArgumentError) as info:
        spec.replace(architecture="fc")
    assert info.value.argument == "architecture"
    own = architecture_spec(config)
    assert (own.kernel, own.architecture, own.likelihood, own.method, own.inducing, own.num_inducing) == \
        (None, config, config.likelihood, "dkm", "dkm-gram", 8)
    conv = zoo.get("conv-dkm", image_shape=(6, 6), task="binary", num_inducing=3).architecture
    with pytest.raises(InvalidArgumentError, match="image_shape"):
        architecture_spec(dataclasses.replace(conv, image_shape=None))


def test_equal_dkm_specs_have_equal_family_definitions():
    """The architecture is static structure of the compiled programs: two builds of one zoo model give
    equal (and equally hashed) family definitions, while another ν or another width gives another."""
    X, _ = _data()

    def definition(**options):
        spec = zoo.get("dkm", input_dim=3, task="binary", num_inducing=8, depth=2, **options)
        init = initialise_inducing(spec.inducing, spec.covariance_model, X, spec.num_inducing, jax.random.PRNGKey(0))
        return definition_of(build_family(spec, init, 1))[0]

    first, second = definition(), definition()
    assert first == second and hash(first) == hash(second)
    assert definition(nu=0.5) != first and definition(widths=(8, 6)) != first


@pytest.fixture(scope="module")
def fitted_dkm():
    X, y = _data()
    spec = zoo.get("dkm", input_dim=3, task="binary", num_inducing=8, depth=2)
    return spec, X, y, fit(spec, X, y, steps=10, learning_rate=0.05, seed=0, progress=False)


def test_fit_records_condition_numbers_of_every_gram_layer(fitted_dkm):
    spec, X, _, res = fitted_dkm
    conditions = res.diagnostics["gram_condition"]
    assert set(conditions) == {"start", "end"}
    for moment in conditions.values():
        assert set(moment) == {"layer 1", "layer 2"}
        assert all(np.isfinite(c) and c >= 1.0 for c in moment.values())
    # at the start G_ℓ = K_ℓ (the NNGP start): cond(G_1) is cond of the first layer's K_ii
    network = unflatten_network({k: jnp.asarray(v) for k, v in res.family.inducing.values.items() if k.startswith("dkm.")}, 2)
    K_1 = res.family.network_diagnostics(res.family.inducing.values, X)["K_ii"]["layer 1"]
    np.testing.assert_allclose(conditions["start"]["layer 1"], np.linalg.cond(np.asarray(K_1)), rtol=1e-5)
    assert dkm.gram_condition_numbers(network) == conditions["start"]


def test_failed_cholesky_in_a_fit_names_layer_stage_and_step(fitted_dkm, float32):
    spec, X, y, _ = fitted_dkm
    with pytest.raises(NumericalError, match="layer 2, Cholesky of K_ii, training step 0") as err:
        fit(spec.replace(inducing=DEAD_LAYER_2), X, y, steps=4, seed=0, progress=False)
    assert err.value.layer == "layer 2" and err.value.step == 0


def test_conv_dkm_options_build_a_resnet_style_stack():
    facts = dict(input_dim=64, image_shape=(8, 8), task="multiclass", num_classes=3, num_inducing=4)
    config = zoo.get("conv-dkm", depth=4, nu=0.01, skr_gamma=2, skr_jitter=0.05, kl="taylor_frobenius", **facts).architecture
    assert [layer.num_inducing for layer in config.layers] == [4, 4, 8, 8]
    assert [layer.stride for layer in config.layers] == [1, 1, 2, 1]  # one stride-2 stage
    assert [layer.skip_from for layer in config.layers] == [None, -1, None, 1]  # a skip around every pair
    assert all(layer.batch_norm for layer in config.layers)
    assert (config.nu, config.skr_gamma, config.skr_jitter, config.kl) == (0.01, 2, 0.05, "taylor_frobenius")
    assert config.num_outputs == 3 and config.image_shape == (8, 8) and config.head == "gap"
    fc = zoo.get("dkm", input_dim=5, task="binary", depth=3, widths=(4, 6, 8)).architecture
    assert [layer.num_inducing for layer in fc.layers] == [4, 6, 8] and fc.architecture == "fc"
    assert dataclasses.replace(fc).skr and fc.layer_gamma(2) == 2  # γ = ceil(P/4) by default


@pytest.mark.parametrize("option, value", [("widths", (4, 4)), ("depth", 0), ("nu", -1.0), ("skr_gamma", 0),
                                           ("filter_shape", (2, 2)), ("q_structure", "diag")])
def test_invalid_dkm_options_are_typed_errors_naming_them(option, value):
    facts = dict(input_dim=36, image_shape=(6, 6), task="binary", depth=3)
    with pytest.raises(InvalidArgumentError, match=option):
        zoo.get("conv-dkm", **(facts | {option: value}))


@pytest.mark.parametrize("field, value", [("skr_gamma", 0), ("skr_gamma", (2,)), ("nu", -1.0), ("nu", float("nan")),
                                          ("nu", (1e-3, -1.0)), ("num_outputs", 0), ("kernel_jitter", -1.0),
                                          ("skr_jitter", float("inf")), ("output_kl_weight", -0.5), ("stride", 0)])
def test_dkm_config_refuses_bad_settings_naming_them(field, value):
    """The low-level DKMConfig checks its own settings (not only the zoo's options), naming the field."""
    from gpzoo.models.dkm import DKMConfig, GramLayerSpec
    from gpzoo.models.likelihoods import Bernoulli

    stride = value if field == "stride" else 2
    fields = dict(layers=(GramLayerSpec(4), GramLayerSpec(4, stride=stride)), likelihood=Bernoulli(), num_outputs=1,
                  architecture="conv")
    if field != "stride":
        fields[field] = value
    with pytest.raises(InvalidArgumentError) as info:
        DKMConfig(**fields)
    assert info.value.argument == ("layers[1].stride" if field == "stride" else field)


@pytest.mark.parametrize("shape, fits", [((9, 12), False), ((7, 5, 3), True)])
def test_conv_dkm_skips_across_the_stride_2_stage_on_odd_image_sizes(shape, fits):
    """A skip's 1×1 mix-up strides by the product of the strides it jumps ("same" padding: 9 rows -> 5),
    so odd heights and widths fit; the blocks after every layer have the sizes conv_output_shape gives.
    One shape (odd height and width, 3 channels) is also fitted end to end (two steps, finite objective)."""
    from gpzoo.models.kernels.gram import conv_output_shape

    rng = np.random.default_rng(0)
    n = 12
    X = rng.uniform(size=(n, int(np.prod(shape))))
    y = np.arange(n) % 2
    spec = zoo.get("conv-dkm", image_shape=shape, task="binary", num_inducing=3, depth=4)
    config = spec.architecture
    params = dkm.init_params(jax.random.PRNGKey(0), config, config.network_inputs(jnp.asarray(X)))
    _, blocks, _, _ = dkm.gram_layers(params, config, config.network_inputs(jnp.asarray(X)))
    expected = shape[:2]
    for layer in config.layers:
        expected = conv_output_shape(expected, layer.filter_shape, layer.stride)
    assert blocks.t.shape == (n, *expected) and blocks.ti.shape == (n, *expected, config.layers[-1].num_inducing)
    if not fits:
        return
    res = fit(spec, X, y, steps=2, batch_size=6, seed=0, progress=False)
    assert res.objective_history.shape == (2,) and np.all(np.isfinite(res.objective_history))


@pytest.mark.slow
def test_gpzoo_compare_ranks_a_dkm_with_the_other_zoo_models(tmp_path):
    from gpzoo.analysis.cli import main  # noqa: PLC0415 - the command line, as a user runs it

    main(["compare", "--data", "two-moons", "--models", "dkm,svgp-rbf", "--steps", "10", "--num-inducing", "6",
          "--num-train", "60", "--num-test", "40", "--num-draws", "30", "--out", str(tmp_path / "cmp"), "--quiet"])
    table = (tmp_path / "cmp" / "comparison.csv").read_text()
    assert table.splitlines()[0].startswith("model") and "dkm" in table and "svgp-rbf" in table
    assert (tmp_path / "cmp" / "models" / "dkm").exists()
    # the report states cond(G_ii) of every Gram layer at the start and the end of the fit
    cond = json.loads((tmp_path / "cmp" / "models" / "dkm.json").read_text())["fit"]["gram_condition"]
    assert set(cond["start"]) == set(cond["end"]) == {"layer 1", "layer 2"} and all(v >= 1 for v in cond["end"].values())
    for page in ("report.md", "report.html"):
        text = (tmp_path / "cmp" / page).read_text()
        assert "Condition number of the learned Gram matrices" in text and f"{cond['end']['layer 2']:.2e}" in text
