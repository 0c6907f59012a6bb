import os
import signal

import jax
import pytest

# A suite started in the background by a non-interactive shell (``pytest ... &``) inherits SIGINT
# ignored, and Python then installs no KeyboardInterrupt handler; the tests of Ctrl-C handling need
# the handler every interactive run has, so the workers install it whatever started them.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# exactness tests run in float64; the `precision` fixture runs a test in float32 (the library's default) too
jax.config.update("jax_enable_x64", True)


@pytest.fixture(autouse=True)
def _x64_as_it_was():
    """Every test leaves ``jax_enable_x64`` as it found it: a test that flips the flag, or imports a
    benchmark script that does, would otherwise change the precision of whatever runs next on its worker."""
    previous = jax.config.jax_enable_x64
    yield
    if jax.config.jax_enable_x64 != previous:
        jax.config.update("jax_enable_x64", previous)


def signal_state():
    """This thread's SIGINT / SIGTERM handlers and signal mask."""
    import signal  # noqa: PLC0415

    return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}, signal.pthread_sigmask(signal.SIG_BLOCK, [])


def restore_signals(state) -> None:
    """Install the handlers and mask of :func:`signal_state` again (the handlers at the C level too)."""
    import signal  # noqa: PLC0415

    handlers, mask = state
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)


@pytest.fixture(autouse=True)
def _signals_as_they_were():
    """Every test leaves the SIGINT / SIGTERM handlers and the signal mask as it found them: ``ray.init``
    installs a SIGTERM handler that ``ray.shutdown`` leaves in place, and a test that changes them would
    otherwise change what a later test on its worker sees."""
    import threading  # noqa: PLC0415

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    state = signal_state()
    yield
    restore_signals(state)


#: Memory mappings a test worker may hold before its compiled programs are dropped (Linux's default
#: limit, vm.max_map_count, is 65,530). Each XLA executable on the CPU holds several mappings, and a worker
#: that has compiled the programs of hundreds of tests passes the limit: an mmap then fails and the
#: process dies in whichever test compiles next.
MAX_MAPPINGS = int(os.environ.get("GPZOO_TEST_MAX_MAPPINGS", "30000"))


def _mappings() -> int:
    try:
        with open("/proc/self/maps") as maps:
            return sum(1 for _ in maps)
    except OSError:  # not Linux
        return 0


@pytest.fixture(autouse=True)
def _mappings_bounded():
    """After a test that leaves its worker above :data:`MAX_MAPPINGS` memory mappings, JAX's compiled
    programs are dropped (the persistent cache of the run still serves them to later tests)."""
    yield
    if _mappings() > MAX_MAPPINGS:
        import gc  # noqa: PLC0415

        jax.clear_caches()
        gc.collect()


@pytest.fixture(params=["float32", "float64"])
def precision(request):
    """Run the test body with ``jax_enable_x64`` off (float32, the library default) or on (restored after
    by ``_x64_as_it_was``, an autouse fixture, so set up before this one and torn down after it)."""
    jax.config.update("jax_enable_x64", request.param == "float64")
    return request.param


@pytest.fixture
def float32():
    """Run a test with ``jax_enable_x64`` off (the library's default precision); ``_x64_as_it_was`` restores it."""
    jax.config.update("jax_enable_x64", False)


def _test_run_folder(tmp_path_factory):
    """The temporary folder of this test run, shared by every test worker (a worker's basetemp is in it)."""
    root = tmp_path_factory.getbasetemp()
    return root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root


#: JAX's compilation-cache settings as this process started (its defaults), without a cache folder
CACHE_OFF = {name: getattr(jax.config, name) for name in (
    "jax_persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_entry_size_bytes",
    "jax_compilation_cache_max_size")} | {"jax_compilation_cache_dir": None}


def _cache_settings(settings: dict) -> dict:
    """Apply JAX compilation-cache ``settings``; returns the previous ones."""
    from jax.experimental.compilation_cache import compilation_cache  # noqa: PLC0415

    previous = {name: getattr(jax.config, name) for name in settings}
    for name, value in settings.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()  # JAX opens its cache once per process, on the first compilation after this
    return previous


@pytest.fixture(scope="session", autouse=True)
def _suite_compilation_cache(tmp_path_factory):
    """JAX's persistent compilation cache in a fresh folder of this run, one per test worker.

    Most of the suite's time is XLA compiling small programs, and tests compile the same ones again
    (the same fit on the same shapes in another test, or after a ``jax.clear_caches``); with the
    cache only the first compiles and the others read the same executable back, so results do not
    change. One folder per worker: a shared one would need JAX's locking, which comes with its
    size limit, and with it a scan of the folder on every write (quadratic over the suite's
    thousands of programs). Tests of gpzoo's own use of the cache turn it off
    (:func:`without_suite_compilation_cache`).
    """
    folder = _test_run_folder(tmp_path_factory) / f"jax-compilation-cache-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    previous = _cache_settings({"jax_compilation_cache_dir": str(folder), "jax_persistent_cache_min_compile_time_secs": 0.0,
                                "jax_persistent_cache_min_entry_size_bytes": 0, "jax_compilation_cache_max_size": -1})
    # the command lines the tests start use their own cache of this run, never the user's
    environment = os.environ.get("GPZOO_COMPILATION_CACHE")
    os.environ["GPZOO_COMPILATION_CACHE"] = str(folder.parent / f"cli-compilation-cache-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}")
    yield folder
    _cache_settings(previous)
    if environment is None:
        os.environ.pop("GPZOO_COMPILATION_CACHE", None)
    else:
        os.environ["GPZOO_COMPILATION_CACHE"] = environment


@pytest.fixture
def without_suite_compilation_cache():
    """JAX's default cache settings (no cache) inside a test of gpzoo's own cache; the suite's after it."""
    previous = _cache_settings(CACHE_OFF)
    yield
    _cache_settings(previous)


#: `gpzoo compare` options that keep a CLI run tiny (seconds per model).
TINY_CLI = ["--steps", "8", "--batch-size", "20", "--num-train", "40", "--num-test", "30", "--num-inducing", "6",
            "--num-draws", "40", "--quiet"]


@pytest.fixture(scope="session")
def compared_report(tmp_path_factory):
    """`gpzoo compare` on 40 rectangles with svgp-rbf and conv: (exit code, report directory, models).
    Shared by the CLI and browser tests: one run per test session, made by the first test worker
    that asks (the others wait for it); each worker gets its own copy of the directory to change."""
    import fcntl  # noqa: PLC0415
    import json  # noqa: PLC0415
    import shutil  # noqa: PLC0415

    from gpzoo.analysis.cli import main  # noqa: PLC0415
    from gpzoo.models import zoo  # noqa: PLC0415

    models = ["svgp-rbf"] + [m for m in ("conv",) if m in zoo.names()]
    shared = _test_run_folder(tmp_path_factory) / "compared-report"
    shared.mkdir(exist_ok=True)
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if not (shared / "exit.json").exists():
            code = main(["compare", "--data", "rectangles", "--models", ",".join(models), "--out", str(shared / "rectangles"),
                         *TINY_CLI])
            (shared / "exit.json").write_text(json.dumps(code))
        code = json.loads((shared / "exit.json").read_text())
    out = tmp_path_factory.mktemp("report") / "rectangles"
    shutil.copytree(shared / "rectangles", out)
    return code, out, models


# ----------------------------------------------------------------------------- order and distribution
#: Modules whose tests take the longest in all (approximate seconds on 2 busy cores), run first so that
#: the suite does not end with one test worker busy alone; the other modules follow in collection order.
SLOW_MODULES = {
    "test_contract.py": 1500, "test_backends.py": 150, "test_convolutional.py": 150, "test_cli.py": 135,
    "test_fit.py": 99, "test_extending.py": 85, "test_scripts.py": 73, "test_generative.py": 32, "test_dkm_numerics.py": 34,
    "test_benchmarks_smoke.py": 60, "test_datatree.py": 50, "test_parallel.py": 110, "test_dkm_fused.py": 55, "test_memmap.py": 30,
    "test_pg_natgrad.py": 30, "test_compare.py": 28, "test_invariant.py": 25, "test_svgp.py": 25, "test_dkm_family.py": 24,
    "test_io.py": 19, "test_report_browser.py": 17, "test_deep_conv.py": 17, "test_docs.py": 60, "test_mcmc.py": 120,
}
#: Modules of independent slow tests (no shared fixture to keep together): handed out one test at a time.
ONE_BY_ONE = ("test_contract.py",)


def pytest_collection_modifyitems(config, items):
    """Modules of :data:`SLOW_MODULES` first, longest first; a module's tests stay together and in order."""
    def cost(item):
        return -SLOW_MODULES.get(item.path.name, 0)

    items[:] = sorted(items, key=cost)  # stable: collection order within a module and among the others


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``-n N`` (``--dist load``) hands out whole modules, in the order above, to the test workers
    (the tests of :data:`ONE_BY_ONE` one at a time).

    Modules share expensive fixtures (fitted models, a Ray instance, the compared report), which a
    worker then sets up once; tests one at a time would set them up on every worker. Other
    ``--dist`` modes are pytest-xdist's own."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadFileScheduling  # noqa: PLC0415 - only under pytest-xdist

    class ModulesWhole(LoadFileScheduling):
        def _split_scope(self, nodeid):
            module = super()._split_scope(nodeid)
            return nodeid if module.endswith(ONE_BY_ONE) else module

    config.option.loadscopereorder = False  # keep the order of pytest_collection_modifyitems
    return ModulesWhole(config, log)
