"""The public API type-checks with mypy.

gpzoo installs ``src/gpzoo`` with ``models/``, ``inference/`` and ``analysis/`` as its subpackages
(``package-dir`` in pyproject.toml), a layout mypy cannot follow from the repository. The test lays
the package out once more in a temporary folder, as links to the real files (scripts/package_layout.py, as
for the documentation), and runs mypy there with the settings of pyproject.toml's ``[tool.mypy]``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the modules checked (their imports are followed for types; errors are reported in these only)
MODULES = (
    "gpzoo",
    "gpzoo.inference.fit", "gpzoo.inference.io", "gpzoo.inference.results", "gpzoo.inference.mcmc",
    "gpzoo.analysis.comparison", "gpzoo.analysis.compare", "gpzoo.analysis.datatree", "gpzoo.analysis.search",
    "gpzoo.analysis.report",
    "gpzoo.models.zoo", "gpzoo.models.zoo_core", "gpzoo.models.errors",
)


def _layout_package(folder: Path) -> None:
    """``folder/gpzoo`` as gpzoo installs (``scripts/package_layout.py``, loaded by path)."""
    spec = importlib.util.spec_from_file_location("_gpzoo_package_layout", ROOT / "scripts" / "package_layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.lay_out_package(folder)


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is not installed (the 'test' extra installs it)")
def test_public_api_type_checks(tmp_path):
    layout = tmp_path / "layout"
    layout.mkdir()
    _layout_package(layout)
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
               "--cache-dir", str(tmp_path / "mypy-cache"), "--show-error-codes"]
    for module in MODULES:
        command += ["-m", module]
    done = subprocess.run(command, cwd=layout, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"mypy found type errors (exit {done.returncode}):\n{done.stdout}{done.stderr}"
