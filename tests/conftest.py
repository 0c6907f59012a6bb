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
