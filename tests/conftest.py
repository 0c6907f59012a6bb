import jax
import pytest

# exactness tests run in float64; the `precision` fixture runs a test in float32 (the library's default) too
jax.config.update("jax_enable_x64", True)


@pytest.fixture(params=["float32", "float64"])
def precision(request):
    """Run the test body with ``jax_enable_x64`` off (float32, the library default) or on; restored after."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", request.param == "float64")
    yield request.param
    jax.config.update("jax_enable_x64", previous)


@pytest.fixture
def float32():
    """Run a test with ``jax_enable_x64`` off (the library's default precision), then restore it."""
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", False)
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


#: `gpzoo compare` options that keep a CLI run tiny (seconds per model).
TINY_CLI = ["--steps", "8", "--batch-size", "20", "--num-train", "40", "--num-test", "30", "--num-inducing", "6",
            "--num-draws", "40", "--quiet"]


@pytest.fixture(scope="session")
def compared_report(tmp_path_factory):
    """`gpzoo compare` on 40 rectangles with svgp-rbf and conv: (exit code, report directory, models).
    Shared by the CLI and browser tests (one run per test worker)."""
    from gpzoo.analysis.cli import main  # noqa: PLC0415
    from gpzoo.models import zoo  # noqa: PLC0415

    out = tmp_path_factory.mktemp("report") / "rectangles"
    models = ["svgp-rbf"] + [m for m in ("conv",) if m in zoo.names()]
    code = main(["compare", "--data", "rectangles", "--models", ",".join(models), "--out", str(out), *TINY_CLI])
    return code, out, models
