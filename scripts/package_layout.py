"""Lay gpzoo out as it installs, for tools that read the sources without installing them.

gpzoo installs ``src/gpzoo`` as the package ``gpzoo`` with ``models/``, ``inference/`` and
``analysis/`` as its subpackages (``package-dir`` in pyproject.toml). Tools that find a package in
one folder (Griffe for the API pages, mypy for the type check) read a folder ``gpzoo/`` made of
links to those files, which :func:`lay_out_package` writes (copies where links are unavailable).
Used by ``docs/hooks.py`` and ``tests/test_typing.py``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: subpackage -> folder, as in pyproject.toml's package-dir
SUBPACKAGES = {"models": "models", "inference": "inference", "analysis": "analysis"}


def _link(target: Path, link: Path) -> None:
    try:
        link.symlink_to(target, target_is_directory=target.is_dir())
    except OSError:  # no symlinks (some Windows setups): copy instead
        if target.is_dir():
            shutil.copytree(target, link, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(target, link)


def lay_out_package(folder: Path) -> Path:
    """Write ``folder/gpzoo`` (links to src/gpzoo's files and the three subpackage folders); returns it."""
    package = Path(folder) / "gpzoo"
    package.mkdir()
    for path in (ROOT / "src" / "gpzoo").iterdir():
        if path.name != "__pycache__":
            _link(path, package / path.name)
    for name, source in SUBPACKAGES.items():
        _link(ROOT / source, package / name)
    return package
