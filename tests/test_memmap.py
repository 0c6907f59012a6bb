"""Data larger than memory: fit and predict on memory-mapped .npy files (gpzoo.inference.open_npy)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gpzoo
from gpzoo.inference import MemmapSource, open_npy
from gpzoo.inference import data as data_module
from gpzoo.inference.linalg import float_dtype
from gpzoo.models import zoo
from gpzoo.models.errors import DataError, InvalidArgumentError, ShapeError

#: The memory-capped child: X on disk is FILE_MB, the child's peak resident memory must stay below
#: its resident memory after `import jax, gpzoo` plus CAP_MARGIN_MB (< FILE_MB: X cannot fit in it).
FILE_MB, CAP_MARGIN_MB = 1024, 600


def _spec(D=3):
    return zoo.get("svgp-rbf", input_dim=D, task="binary", num_classes=2, num_inducing=5)


def test_fit_and_predict_on_a_file_equal_in_memory_bit_for_bit(tmp_path, precision):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(120, 3))
    y = (X[:, 0] + 0.3 * X[:, 1] > 0).astype(np.int64)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    settings = {"steps": 8, "batch_size": 24, "seed": 2, "progress": False, "chunk_size": 4}
    memory = gpzoo.fit(_spec(), X, y, **settings)
    source = open_npy(tmp_path / "X.npy", tmp_path / "y.npy")
    disk = gpzoo.fit(_spec(), source, **settings)
    assert sorted(memory.params) == sorted(disk.params)
    for name, value in memory.params.items():
        np.testing.assert_array_equal(value, disk.params[name], err_msg=name)
    np.testing.assert_array_equal(memory.objective_history, disk.objective_history)
    assert isinstance(disk.X_train, np.ndarray) and disk.X_train.shape == (120, 3)
    a, b = gpzoo.predict(memory, X[:50], batch_size=16), gpzoo.predict(disk, MemmapSource(np.load(tmp_path / "X.npy", mmap_mode="r")[:50]), batch_size=16)
    np.testing.assert_array_equal(a.f_mean, b.f_mean)
    np.testing.assert_array_equal(a.probs, b.probs)
    # a checkpoint written from the file resumes on the same data in memory (same data fingerprint)
    assert data_module.data_fingerprint(source, y) == data_module.data_fingerprint(X.astype(float_dtype()), y)


def test_a_source_is_checked_chunk_by_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(data_module, "CHUNK_BYTES", 3 * 8 * 10)  # 10 rows per chunk
    X = np.random.default_rng(1).normal(size=(95, 3))
    X[91, 2] = np.nan  # in the last chunk
    np.save(tmp_path / "X.npy", X)
    y = np.arange(95) % 2
    source = open_npy(tmp_path / "X.npy")
    assert source.chunk_rows == 10 and len(list(MemmapSource(X[:90]).chunks())) == 9
    seen, read = [], MemmapSource.raw_rows
    monkeypatch.setattr(MemmapSource, "raw_rows", lambda self, index: seen.append(read(self, index)) or seen[-1])
    with pytest.raises(DataError) as error:
        gpzoo.fit(_spec(), source, y, steps=1, progress=False)
    assert error.value.argument == "X"
    assert [len(rows) for rows in seen] == [10] * 9 + [5]  # every chunk read from the file, one at a time
    np.testing.assert_array_equal(np.concatenate(seen), X)
    with pytest.raises(InvalidArgumentError) as error:
        gpzoo.fit(_spec(), source, steps=1, progress=False)  # no targets anywhere
    assert error.value.argument == "y"
    np.save(tmp_path / "X.npy", np.nan_to_num(X))
    with pytest.raises(ShapeError) as error:
        gpzoo.fit(_spec(), open_npy(tmp_path / "X.npy"), y[:-1], steps=1, progress=False)
    assert error.value.argument == "y"
    for bad in (tmp_path / "missing.npy", 3.0):
        with pytest.raises(InvalidArgumentError) as error:
            open_npy(bad)
        assert error.value.argument == "X"
    pg = zoo.get("svgp-logistic-pg", input_dim=3, task="binary", num_classes=2, num_inducing=4)
    with pytest.raises(InvalidArgumentError) as error:
        gpzoo.fit(pg, open_npy(tmp_path / "X.npy"), y, steps=1, progress=False)
    assert error.value.argument == "X"


def _capped_child(directory: str) -> dict:
    """Write X (FILE_MB) to disk without holding it, fit a few minibatch steps on it, predict on a
    slice of it, and report the peak resident memory against the resident memory after the imports."""
    import resource  # noqa: PLC0415

    import jax  # noqa: PLC0415,F401

    import gpzoo  # noqa: PLC0415,F401
    from gpzoo.inference import fit, open_npy, predict  # noqa: PLC0415

    def peak_mb():
        # VmHWM: this process's own peak. getrusage's ru_maxrss starts at the parent's resident size when
        # the parent forked and exec'd us (Linux carries it over exec), i.e. the pytest process's
        try:
            with open("/proc/self/status") as status:
                return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024
        except OSError:
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    baseline = peak_mb()
    D = 64
    N = FILE_MB * 2**20 // (D * 4)
    path = os.path.join(directory, "X.npy")
    X = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(N, D))
    rng = np.random.default_rng(0)
    step = 2**16
    for start in range(0, N, step):
        X[start : start + step] = rng.standard_normal((min(step, N - start), D), dtype=np.float32)
        X.flush()
        X._mmap.madvise(__import__("mmap").MADV_DONTNEED)
    del X
    y = np.random.default_rng(1).integers(0, 2, N)
    np.save(os.path.join(directory, "y.npy"), y)
    del y
    source = open_npy(path, os.path.join(directory, "y.npy"))
    spec = zoo.get("svgp-rbf", input_dim=D, task="binary", num_classes=2, num_inducing=8)
    res = fit(spec, source, steps=4, batch_size=256, progress=False, chunk_size=2)
    few = predict(res, MemmapSource(np.load(path, mmap_mode="r")[:1000]))
    return {"baseline_mb": baseline, "peak_mb": peak_mb(), "file_mb": os.path.getsize(path) / 2**20,
            "finite": bool(np.all(np.isfinite(res.objective_history)) and np.all(np.isfinite(few.f_mean))),
            "steps": len(res.objective_history), "num_data": res.num_data}


def test_fit_on_a_file_larger_than_the_memory_cap(tmp_path):
    """The child's peak resident memory stays under (its memory after importing jax and gpzoo) +
    CAP_MARGIN_MB, while X on disk is FILE_MB > CAP_MARGIN_MB: X was never held in memory."""
    code = f"import sys, json; sys.path.insert(0, {os.path.dirname(__file__)!r}); import test_memmap as t; " \
           f"print(json.dumps(t._capped_child({str(tmp_path)!r})))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["file_mb"] >= FILE_MB - 1 and r["steps"] == 4 and r["finite"], r
    cap = r["baseline_mb"] + CAP_MARGIN_MB
    assert r["file_mb"] > cap, r
    assert r["peak_mb"] < cap, f"peak resident memory {r['peak_mb']:.0f} MB >= cap {cap:.0f} MB (file {r['file_mb']:.0f} MB)"
