"""MkDocs hooks of the documentation site (``hooks:`` in mkdocs.yml).

* ``on_config``: gpzoo installs ``src/gpzoo`` with ``models/``, ``inference/`` and ``analysis/`` as
  its subpackages (``package-dir`` in pyproject.toml). mkdocstrings reads the sources statically
  (Griffe, without importing JAX), and Griffe finds a package in one folder; so the package is laid
  out once more, as links to the real files, in ``build/docs-api/gpzoo`` (``build/`` is ignored by git).
* ``on_files``: adds the notebooks in ``notebooks/``, which mkdocs-jupyter shows as saved (not
  executed). (``results.md`` is an ordinary page, written from ``benchmarks/results/*.json`` by
  ``benchmarks/summarise.py``.)
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
API_TREE = ROOT / "build" / "docs-api"


def _package_layout():
    """``scripts/package_layout.py``, loaded by path (the docs are built from a checkout, not an install)."""
    spec = importlib.util.spec_from_file_location("_gpzoo_package_layout", ROOT / "scripts" / "package_layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _layout_package() -> None:
    """Write ``build/docs-api/gpzoo`` (links to src/gpzoo's files and the three subpackage folders)."""
    API_TREE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".gpzoo-", dir=API_TREE))
    package = _package_layout().lay_out_package(staging)
    old = API_TREE / "gpzoo"
    if old.exists():
        trash = Path(tempfile.mkdtemp(prefix=".old-", dir=API_TREE))
        try:
            os.replace(old, trash / "gpzoo")
        except OSError:  # another build replaced it at the same moment: theirs is the same
            pass
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.replace(package, old)
    except OSError:
        pass
    shutil.rmtree(staging, ignore_errors=True)


@event_priority(100)  # before mkdocstrings' on_config, which reads the handler's paths
def on_config(config):
    _layout_package()
    return config


@event_priority(100)  # before mkdocs-jupyter's on_files, which converts the notebooks added here
def on_files(files: Files, *, config) -> Files:
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        files.append(File(f"notebooks/{notebook.name}", src_dir=str(ROOT), dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    return files
