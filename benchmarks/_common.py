"""What every benchmark script records and how it writes its JSON.

``machine_info`` says where the numbers came from (device, library versions, BLAS pools, the
load when the run started: this machine is shared and noisy, so every timing is read next to it);
``provenance`` adds how the file was made (the command line, the date, the git commit);
``write_json`` and ``merge_results`` replace a result file atomically, so an interrupted run never
leaves half a file behind, and record the provenance of a report that does not carry its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[1]


def machine_info() -> dict:
    """Device, library versions, CPU and BLAS threads, XLA flags and the load average at the start."""
    import numpyro  # noqa: PLC0415 - only the versions are wanted
    import optax  # noqa: PLC0415
    import threadpoolctl  # noqa: PLC0415

    return {
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "numpyro": numpyro.__version__,
        "optax": optax.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "blas_pools": [{k: d[k] for k in ("internal_api", "num_threads", "version")} for d in threadpoolctl.threadpool_info()],
        "load_average_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def comma_choices(parser, text: str, allowed, what: str) -> list[str]:
    """The comma-separated names of ``text``; ``parser.error`` naming any not in ``allowed``."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(names) - set(allowed))
    if unknown:
        parser.error(f"unknown {what}(s) {unknown}; choose among {list(allowed)}")
    return names


def compile_seconds():
    """A counter whose ``"compile"`` entry accumulates XLA compile time from now on (JAX's
    backend-compile and jaxpr-to-MLIR duration events)."""
    import collections  # noqa: PLC0415

    totals = collections.Counter()

    def listener(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration" or event.endswith("jaxpr_to_mlir_module_duration"):
            totals["compile"] += duration

    jax.monitoring.register_event_duration_secs_listener(listener)
    return totals


def now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


#: How a recorded command shows an absolute path outside the repository (its folders are this machine's).
OUTSIDE = "<outside the repository>"


def _relative_to_root(arg: str) -> str:
    """``arg`` relative to the repository root when it is an absolute path inside it; an absolute path
    outside it as :data:`OUTSIDE` and its file name (no folder of this machine); else unchanged."""
    option, equals, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
    if not os.path.isabs(value):
        return arg
    try:
        relative = Path(value).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        relative = f"{OUTSIDE}/{Path(value).name}"
    return f"{option}{equals}{relative}"


def _command() -> list[str]:
    """``sys.argv`` with the script relative to the repository root (its bare name when outside it)."""
    if not sys.argv:
        return []
    script = sys.argv[0]
    if os.path.isabs(script) or os.path.exists(script):
        try:
            script = Path(script).resolve().relative_to(ROOT).as_posix()
        except ValueError:
            script = Path(script).name
    return [script, *(_relative_to_root(arg) for arg in sys.argv[1:])]


def git_commit(root: Path = ROOT) -> str | None:
    """``git rev-parse HEAD`` of ``root``, with ``-dirty`` when tracked files differ from it; None
    without git or outside a repository."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}-dirty" if head and changed else head or None


@functools.cache
def process_start() -> dict:
    """When this process started and the commit its code came from, taken once (at import): a long run
    that writes its report after every finished part keeps recording the code it started with, not
    whatever the checkout holds by then."""
    return {"started": now(), "git_commit": git_commit()}


def provenance(settings: dict | None = None) -> dict:
    """How a result was made: the command line (the script relative to the repository root, never
    an absolute path of this machine), when the run started and the git commit it started from
    (:func:`process_start`), the date of this record, and :func:`machine_info` (device, library
    versions, load); ``settings`` too when given."""
    start = process_start()
    record = {"command": _command(), "date": now(), "started": start["started"], "git_commit": start["git_commit"],
              "machine": machine_info()}
    if settings is not None:
        record["settings"] = settings
    return record


def write_json(path: Path, report: dict) -> None:
    """Write ``report`` to ``path`` through a temporary file and an atomic rename.

    A report without a ``"provenance"`` entry gets one (:func:`provenance`, added to ``report``);
    one that has it keeps it as it is.
    """
    if "provenance" not in report:
        report["provenance"] = provenance()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=2))
    os.replace(tmp, path)


def merge_results(path: Path, key: str, payload: dict) -> dict:
    """Write ``payload`` under ``experiments[key]`` of the JSON at ``path``, keeping the others.

    The file is read just before writing, so experiments written by another run in the meantime
    are kept. ``payload`` gets this run's :func:`provenance` unless it carries its own; the
    file's top-level ``"provenance"`` is the latest write's.
    """
    path = Path(path)
    payload.setdefault("provenance", provenance())
    report = json.loads(path.read_text()) if path.exists() else {}
    report.setdefault("experiments", {})[key] = payload
    report["updated"] = payload["date"]
    report["provenance"] = payload["provenance"]
    write_json(path, report)
    return report


def reproduction_parser(description: str, experiments, *, default: str, out: Path, seed: int, batch_size=None,
                        learning_rate=None) -> argparse.ArgumentParser:
    """The options every paper-reproduction script takes (experiment, models, sizes, seed, ``--quick``, output)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--experiment", choices=[*experiments, "all"], default=default)
    parser.add_argument("--models", nargs="*", help="only these models of the experiment (default: all)")
    parser.add_argument("--steps", type=int, help="Adam steps per model (default: the experiment's)")
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--learning-rate", type=float, default=learning_rate)
    parser.add_argument("--num-inducing", type=int, help="override M of every model")
    parser.add_argument("--max-train", type=int, help="use a fixed random subset of the training images")
    parser.add_argument("--max-test", type=int, help="use a fixed random subset of the test images")
    parser.add_argument("--elbo-samples", type=int, default=8, help="Monte Carlo draws for evaluate_elbo")
    parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--quick", action="store_true", help="tiny smoke-test settings (seconds, meaningless numbers)")
    parser.add_argument("--progress", action="store_true", help="show a progress bar per fit")
    parser.add_argument("--out", type=Path, default=out)
    return parser


def apply_quick(args, *, max_train: int, max_test: int) -> None:
    """``--quick``: a few steps on a few images with a few inducing points (plumbing only; numbers meaningless)."""
    args.steps = args.steps or 2
    args.max_train = args.max_train or max_train
    args.max_test = args.max_test or max_test
    args.num_inducing = args.num_inducing or 4
    args.batch_size = min(args.batch_size or 20, 20)
    args.elbo_samples = min(args.elbo_samples, 2)


def run_and_merge(names, out: Path, run: Callable[[str], dict], combine: Callable[[str, dict | None, dict], dict]) -> dict:
    """Run experiment ``name`` for each of ``names`` and merge ``combine(name, previous, payload)`` into ``out``.

    ``previous`` is what the file holds for that experiment, read only after the run: another run
    may have written in the meantime.
    """
    report = {}
    for name in names:
        payload = run(name)
        previous = json.loads(out.read_text()).get("experiments", {}).get(name) if out.exists() else None
        report = merge_results(out, name, combine(name, previous, payload))
    return report


def mean_pooled(data, pool: int):
    """``data`` (a gpzoo Dataset of grey images) with its images mean-pooled ``pool`` × ``pool``; the
    side must divide by ``pool``. Returns the data set unchanged for ``pool == 1``."""
    if pool == 1:
        return data
    height, width = data.image_shape[:2]
    if height % pool or width % pool:
        raise SystemExit(f"pooling by {pool} does not divide the {height}x{width} images of {data.name}")

    def pooled(X):  # [N, H*W] -> [N, (H/p)*(W/p)]
        return X.reshape(-1, height // pool, pool, width // pool, pool).mean(axis=(2, 4)).reshape(X.shape[0], -1)

    return dataclasses.replace(data, X_train=pooled(data.X_train), X_test=pooled(data.X_test),
                               image_shape=(height // pool, width // pool))


process_start()  # at import: the run's start and the commit it runs
