"""What every benchmark script records and how it writes its JSON.

``machine_info`` says where the numbers came from (device, library versions, BLAS pools, the
load when the run started: this machine is shared and noisy, so every timing is read next to it);
``write_json`` and ``merge_results`` replace a result file atomically, so an interrupted run never
leaves half a file behind.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

import jax


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


def now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_json(path: Path, report: dict) -> None:
    """Write ``report`` to ``path`` through a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=2))
    os.replace(tmp, path)


def merge_results(path: Path, key: str, payload: dict) -> dict:
    """Write ``payload`` under ``experiments[key]`` of the JSON at ``path``, keeping the others.

    The file is read just before writing, so experiments written by another run in the meantime
    are kept.
    """
    path = Path(path)
    report = json.loads(path.read_text()) if path.exists() else {}
    report.setdefault("experiments", {})[key] = payload
    report["updated"] = payload["date"]
    write_json(path, report)
    return report
