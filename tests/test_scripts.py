"""Every script and notebook runs against the current library (STYLE: experiment code is exercised)."""

from __future__ import annotations

import json
import os
import re
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
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    outputs = [o for cell in code for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    assert "elpd" in text and "predictions identical" in text
    # every cell that ends in a figure shows it as an image, not as "<Figure size ...>"
    figure_cells = [cell for cell in code if any(k in cell.source for k in ("_figure(", "plot_compare("))]
    assert len(figure_cells) >= 4
    for cell in figure_cells:
        kinds = {kind for o in cell.get("outputs", []) for kind in o.get("data", {})}
        assert "image/png" in kinds, cell.source
    # the models learn at the notebook's sizes: the convolutional model beats the RBF model clearly
    (accuracy_cell,) = [cell for cell in code if "test accuracy" in cell.source]
    shown = accuracy_cell.outputs[0]["data"]["text/plain"]
    accuracy = {name: float(value) for name, value in re.findall(r"^(\S+)\s+([0-9.]+)$", shown, re.M)}
    assert accuracy["conv"] >= 0.85 and accuracy["conv"] - accuracy["svgp-rbf"] >= 0.2, shown
    # the hyperparameter summary is ArviZ's table
    (summary_cell,) = [cell for cell in code if "az.summary" in cell.source]
    assert "kernel_base_kernel_lengthscale" in summary_cell.outputs[0]["data"]["text/plain"]
