"""Property-based tests (hypothesis) of the public API and the command line: random shapes, dtypes,
NaN/inf placement, label sets and option values.

The property: every call either succeeds with finite results or raises a gpzoo error
(:class:`~gpzoo.models.errors.GPZooError`) whose message names an argument of the call, and the
command line answers a bad argument with its usage/failure exit and one ``gpzoo: error:`` line
naming the flag; never a JAX / NumPy / Python built-in exception. The default suite runs a small,
derandomised budget of examples; ``-m benchmark`` runs the same properties with a larger random one.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import io
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpzoo.analysis.cli import main as cli_main
from gpzoo.inference import evaluate_elbo, fit, predict
from gpzoo.inference.data import validate_data
from gpzoo.inference.runner import FitSettings
from gpzoo.models import zoo
from gpzoo.models.errors import GPZooError, GPZooWarning

#: (default suite, ``-m benchmark``) examples per property: a successful fit compiles, so those get fewer.
BUDGET = {"cheap": (100, 1000), "fit": (6, 100), "predict": (10, 150), "cli": (40, 300)}


def _property(kind: str, strategy_kwargs: dict):
    """Two tests of one property: a derandomised small budget (default suite), a random larger one (benchmark)."""

    def wrap(body):
        quick, large = BUDGET[kind]
        common = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None)
        quick_test = settings(max_examples=quick, derandomize=True, **common)(given(**strategy_kwargs)(body))
        large_test = pytest.mark.benchmark(settings(max_examples=large, **common)(given(**strategy_kwargs)(body)))
        return quick_test, large_test

    return wrap


def names_an_argument(exc: GPZooError, *functions) -> bool:
    """The message names ``exc.argument`` when it has one, else one of the parameters of ``functions``."""
    text = str(exc)
    argument = getattr(exc, "argument", None)
    if argument is not None:
        return argument.split(".")[-1] in text or argument in text
    names = {p for fn in functions for p in inspect.signature(fn).parameters}
    return any(name in text for name in names)


def check_call(call, *functions):
    """Run ``call``; a gpzoo error must name an argument, anything else that escapes fails the property."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", GPZooWarning)
            return call()
    except GPZooError as exc:
        assert names_an_argument(exc, *functions), f"{type(exc).__name__} names no argument: {exc}"
        return None


def _finite(*arrays) -> bool:
    return all(a is None or np.all(np.isfinite(np.asarray(a, dtype=float))) for a in arrays)


# ----------------------------------------------------------------------------- values
#: Values of the wrong kind for almost any option or setting.
ODD = st.sampled_from([None, True, False, 0, -1, 1, 2, 3, 1.5, -0.5, 0.0, float("nan"), float("inf"), -float("inf"),
                       "", "8", "0.01", "adam", "abc", (), (2,), (3, 3), (0, 3), (1, 2, 3), [2, 2], (1.0, -1.0),
                       np.float64(0.5), np.int64(4), np.ones(2), np.zeros((2, 2)), object(), 10**12])
DTYPES = st.sampled_from([np.float64, np.float32, np.int64, np.int32, np.bool_, np.complex64, object, str])


@st.composite
def arrays(draw, rows=st.integers(0, 7), columns=st.integers(0, 4)):
    """Arrays of random rank (1–3), size, dtype, with NaN/inf at random places."""
    ndim = draw(st.sampled_from([2, 2, 2, 1, 3]))
    shape = tuple(draw(rows) if i == 0 else draw(columns) for i in range(ndim))
    values = np.asarray(draw(st.lists(st.floats(-3, 3, allow_nan=False), min_size=int(np.prod(shape)),
                                      max_size=int(np.prod(shape))))).reshape(shape)
    if values.size and draw(st.booleans()):
        values.flat[draw(st.integers(0, values.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    dtype = draw(DTYPES)
    with np.errstate(invalid="ignore", over="ignore"):
        return values.astype(dtype) if dtype not in (object, str) else values.astype(dtype)


@st.composite
def labels(draw, size):
    """Targets for ``size`` rows: real values, a label set drawn at random (possibly outside the task's), or junk."""
    kind = draw(st.sampled_from(["real", "labels", "labels", "junk"]))
    if kind == "real":
        return np.asarray(draw(st.lists(st.floats(-5, 5), min_size=size, max_size=size)))
    if kind == "labels":
        classes = draw(st.lists(st.integers(-2, 5), min_size=1, max_size=4, unique=True))
        return np.asarray(draw(st.lists(st.sampled_from(classes), min_size=size, max_size=size)))
    return draw(st.sampled_from([None, "y", np.zeros((size, 2)), np.full(size, np.nan), [0.5] * size, np.zeros(size + 1)]))


# ----------------------------------------------------------------------------- zoo.get
@st.composite
def zoo_calls(draw):
    """A model name (sometimes unknown), dataset facts and a few options with random, often odd, values."""
    name = draw(st.sampled_from(zoo.names() + ["no-such-model"]))
    keys = [o.name for o in zoo.options(name)] if name in zoo.names() else ["input_dim"]
    given = {}
    facts = draw(st.sampled_from([{"input_dim": 16}, {"image_shape": (4, 4)}, {"image_shape": (4, 4, 3)}, {"input_dim": 2}, {}]))
    given.update(facts)
    for key in draw(st.lists(st.sampled_from(keys + ["not_an_option"]), max_size=3)):
        given[key] = draw(ODD)
    return name, given


def _zoo_get(call):
    name, given = call
    spec = check_call(lambda: zoo.get(name, **given), zoo.get, *_builder_functions(name))
    if spec is not None:
        assert isinstance(spec, zoo.ModelSpec) and spec.num_inducing >= 1


@functools.cache
def _builder_functions(name):
    from gpzoo.models.zoo_core import REGISTRY, Common

    return (REGISTRY[name].builder, Common) if name in REGISTRY else ()


test_zoo_get_succeeds_or_names_the_option, test_zoo_get_succeeds_or_names_the_option_large = _property(
    "cheap", {"call": zoo_calls()})(_zoo_get)


# ----------------------------------------------------------------------------- data validation
@pytest.fixture(scope="module")
def specs():
    return {task: zoo.get("svgp-rbf", input_dim=2, num_inducing=2, task=task, **({"num_classes": 3} if task == "multiclass" else {}))
            for task in ("regression", "binary", "multiclass")}


@st.composite
def datasets(draw):
    X = draw(arrays())
    y = draw(labels(X.shape[0] if X.ndim else 0))
    return draw(st.sampled_from(["regression", "binary", "multiclass"])), X, y


def _validate(specs, case):
    task, X, y = case
    out = check_call(lambda: validate_data(specs[task], X, y), validate_data)
    if out is not None:
        Xv, yv = out
        assert Xv.ndim == 2 and Xv.shape[0] == np.shape(yv)[0] > 0 and _finite(Xv, yv)


test_data_validation_returns_finite_arrays_or_names_x_or_y, test_data_validation_large = _property(
    "cheap", {"case": datasets()})(_validate)


# ----------------------------------------------------------------------------- fit settings
SETTINGS = st.dictionaries(st.sampled_from(["steps", "batch_size", "seed", "learning_rate", "optimizer", "checkpoint_every",
                                            "chunk_size", "resume", "progress", "no_such_setting"]), ODD, max_size=3)


def _settings(run):
    built = check_call(lambda: FitSettings.from_keywords(run), FitSettings)
    if built is not None:
        check_call(lambda: built.batch_size_for(10), FitSettings)


test_fit_settings_are_valid_or_named, test_fit_settings_large = _property("cheap", {"run": SETTINGS})(_settings)


# ----------------------------------------------------------------------------- fit, predict, evaluate_elbo end to end
@pytest.fixture(scope="module")
def fitted(specs):
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (8, 2))
    return fit(specs["binary"], X, (X[:, 0] > 0).astype(int), steps=2, progress=False)


@st.composite
def fit_calls(draw):
    """Mostly well-formed small data sets with one random fault (or none), and a random setting."""
    task = draw(st.sampled_from(["regression", "binary", "multiclass"]))
    n = draw(st.integers(3, 8))
    X = np.asarray(draw(st.lists(st.floats(-2, 2), min_size=2 * n, max_size=2 * n))).reshape(n, 2)
    y = np.arange(n) % (2 if task == "binary" else 3) if task != "regression" else np.linspace(-1, 1, n)
    fault = draw(st.sampled_from(["none", "nan-X", "inf-y", "labels", "rows", "setting", "setting"]))
    run = {}
    if fault == "nan-X":
        X[draw(st.integers(0, n - 1)), draw(st.integers(0, 1))] = np.nan
    elif fault == "inf-y":
        y = y.astype(float)
        y[draw(st.integers(0, n - 1))] = np.inf
    elif fault == "labels":
        y = y + draw(st.sampled_from([-1, 3, 0.5]))
    elif fault == "rows":
        y = y[:-1]
    elif fault == "setting":
        run = draw(SETTINGS)
    return task, X, y, run


def _fit(specs, case):
    task, X, y, run = case
    run = {"steps": 2, "progress": False} | run
    res = check_call(lambda: fit(specs[task], X, y, **run), fit, FitSettings)
    if res is not None:
        assert _finite(res.objective_history, *res.params.values())


test_fit_succeeds_finitely_or_names_the_argument, test_fit_large = _property("fit", {"case": fit_calls()})(_fit)


@st.composite
def predict_calls(draw):
    X_new = draw(st.one_of(arrays(rows=st.integers(0, 5), columns=st.integers(1, 3)),
                           st.sampled_from([np.zeros((3, 2)), np.ones((1, 2))])))
    options = draw(st.dictionaries(st.sampled_from(["num_samples", "seed", "batch_size", "num_hyper_samples"]), ODD, max_size=2))
    return X_new, options


def _predict(fitted, case):
    X_new, options = case
    pred = check_call(lambda: predict(fitted, X_new, **options), predict)
    if pred is not None:
        assert pred.f_mean.shape[0] == np.shape(X_new)[0]
        assert _finite(pred.f_mean, pred.f_var, pred.y_mean, pred.y_var, pred.probs, pred.f_samples)


test_predict_succeeds_finitely_or_names_the_argument, test_predict_large = _property("predict", {"case": predict_calls()})(_predict)


@st.composite
def elbo_calls(draw):
    options = draw(st.dictionaries(st.sampled_from(["num_samples", "seed", "batch_size"]), ODD, max_size=2))
    data = draw(st.sampled_from(["training", "X only", "y only", "other"]))
    return data, options


def _elbo(fitted, case):
    data, options = case
    X, y = fitted.X_train, fitted.y_train
    given = {"training": {}, "X only": {"X": X}, "y only": {"y": y}, "other": {"X": X[:4] * 0.5, "y": y[:4]}}[data]
    est = check_call(lambda: evaluate_elbo(fitted, **given, **options), evaluate_elbo)
    if est is not None:
        assert np.isfinite(est.elbo) and (np.isfinite(est.stderr) or est.num_samples == 1)


test_evaluate_elbo_succeeds_finitely_or_names_the_argument, test_evaluate_elbo_large = _property(
    "predict", {"case": elbo_calls()})(_elbo)


# ----------------------------------------------------------------------------- the command line
#: Flags of `gpzoo fit` / `gpzoo compare` / `gpzoo predict` and values no flag accepts as given.
FLAGS = ["--steps", "--batch-size", "--seed", "--num-inducing", "--learning-rate", "--num-train", "--num-test", "--num-draws",
         "--likelihood", "--option", "--data", "--model", "--models", "--split", "--num-points"]
BAD_VALUES = ["abc", "", "-1", "nan", "1e400", "-0.5", "1.5x", "none", "x=y", "svgp-rbf.num_inducing=zero"]


@st.composite
def cli_calls(draw):
    command = draw(st.sampled_from(["fit", "compare", "predict", "report", "list", "nonsense"]))
    flag, value = draw(st.sampled_from(FLAGS)), draw(st.sampled_from(BAD_VALUES))
    return command, flag, value


def _cli(tmp_path_factory, case):
    command, flag, value = case
    out = tmp_path_factory.mktemp("cli")
    base = {"fit": ["--model", "svgp-rbf", "--data", "rectangles", "--num-train", "8", "--num-test", "4", "--steps", "1"],
            "compare": ["--models", "svgp-rbf", "--data", "rectangles", "--num-train", "8", "--num-test", "4", "--steps", "1"],
            "predict": ["--model", str(out / "missing-model"), "--data", "rectangles"],
            "report": [str(out / "missing-report")], "list": [], "nonsense": []}[command]
    quiet = ["--quiet"] if command in ("fit", "compare") else []
    argv = [command, *base, flag, value, "--out", str(out / ("o.csv" if command == "predict" else "o")), *quiet]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        status = cli_main(argv)
    message = stderr.getvalue()
    assert status in (1, 2), (argv, status, message)
    assert message.startswith("gpzoo: error:") and "unexpected" not in message, (argv, message)
    # the flag, its API name, an unknown command, the token argparse could not place, or the missing
    # model / report the predict / report commands were given on purpose (another bad argument)
    named = (flag, flag.lstrip("-").replace("-", "_"), command) + ((value,) if len(value) > 1 else ())
    named += tuple(arg for arg in base if "missing-" in arg)
    assert any(name in message for name in named), (argv, message)


test_cli_bad_arguments_exit_with_one_error_line, test_cli_large = _property("cli", {"case": cli_calls()})(_cli)


# ----------------------------------------------------------------------------- kernel and likelihood constructors
def _constructors():
    from gpzoo.models import kernels, likelihoods  # noqa: PLC0415
    from gpzoo.models.kernels.invariant import LocalDeformation, RotationAugmentation  # noqa: PLC0415

    return {
        "SquaredExponential": (kernels.SquaredExponential, ("lengthscale", "variance")),
        "Matern32": (kernels.Matern32, ("lengthscale", "variance")),
        "RationalQuadratic": (kernels.RationalQuadratic, ("lengthscale", "variance", "alpha")),
        "Periodic": (kernels.Periodic, ("lengthscale", "variance", "period")),
        "Cosine": (kernels.Cosine, ("lengthscale", "variance")),
        "Gaussian": (likelihoods.Gaussian, ("noise_variance",)),
        "Poisson": (likelihoods.Poisson, ("binsize",)),
        "RotationAugmentation": (functools.partial(RotationAugmentation, (4, 4)), ("max_angle",)),
        "LocalDeformation": (functools.partial(LocalDeformation, (4, 4)), ("max_angle", "displacement")),
    }


#: Values no positive hyperparameter accepts, in float32 (the library's default precision): strings, complex
#: numbers, values past float32's range, values that round to 0 in it, non-positive, non-finite and boolean values.
BAD_HYPERPARAMETERS = st.sampled_from(["1.0", "abc", b"1", 1 + 2j, np.complex64(1.0), [1.0, 2j], 1e39, np.float64(-1e39),
                                       [1.0, 1e39], 1e-50, -1, -0.5, 0, 0.0, [1.0, -1.0], float("nan"), float("inf"),
                                       True, object(), np.array(["1.0"])])


@st.composite
def constructor_calls(draw):
    name = draw(st.sampled_from(sorted(_constructors())))
    field = draw(st.sampled_from(_constructors()[name][1]))
    return name, field, draw(BAD_HYPERPARAMETERS)


def _constructor(case):
    """Construction in float32 with one bad hyperparameter raises a gpzoo error that names the field."""
    import jax  # noqa: PLC0415

    from gpzoo.models.errors import InvalidArgumentError  # noqa: PLC0415

    name, field, value = case
    jax.config.update("jax_enable_x64", False)  # the autouse fixture of conftest.py restores the flag
    constructor = _constructors()[name][0]
    with pytest.raises(InvalidArgumentError) as info:
        constructor(**{field: value})
    assert info.value.argument.split(".")[-1] == field and field in str(info.value), (case, info.value)


test_constructors_refuse_bad_hyperparameters_by_name, test_constructors_large = _property(
    "cheap", {"case": constructor_calls()})(_constructor)
