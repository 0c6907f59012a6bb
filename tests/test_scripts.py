"""Every script and notebook runs against the current library (STYLE: experiment code is exercised)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _env() -> dict:
    """The repository first on the path, so scripts see this checkout's packages."""
    return {**os.environ, "MPLBACKEND": "Agg",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}


def test_compare_rectangles_script_quick(tmp_path):
    out = tmp_path / "rect"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "compare_rectangles.py"), "--quick", "--out", str(out)],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "elbo" in proc.stdout and (out / "report.html").is_file() and (out / "comparison.csv").is_file()


def test_explore_notebook_executes(tmp_path, monkeypatch):
    """Executed with nbclient in a kernel running *this* interpreter (a kernelspec written for the
    test), so the notebook sees the tests' environment whatever "python3" resolves to."""
    spec_dir = tmp_path / "kernels" / "gpzoo-test"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "gpzoo test", "language": "python",
    }))
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(p for p in (str(tmp_path), os.environ.get("JUPYTER_PATH")) if p))
    for key, value in _env().items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(REPO / "notebooks" / "explore.ipynb", as_version=4)
    NotebookClient(nb, timeout=240, kernel_name="gpzoo-test", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "accuracy" in text and "elpd" in text
