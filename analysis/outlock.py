"""One writer per output folder.

``gpzoo fit``, ``gpzoo compare``, ``gpzoo search`` and ``gpzoo.compare(out=...)`` hold
:func:`output_lock` on their output folder while they write it: a second run on the same folder
gets :class:`OutputLockedError` naming the run that holds it (process id, host, start time,
command), instead of two runs interleaving their files and leaving a run record that contradicts
the saved models. The lock is an operating-system file lock (the ``filelock`` package) on
``OUT/.gpzoo.lock``, so it is released when its process ends, however it ends; the holder's
description sits beside it in ``OUT/.gpzoo.lock.json``. Neither file is followed through a symbolic
link.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from gpzoo.models.errors import GPZooError

__all__ = ["LOCK_FILES", "OutputLockedError", "OutputPathError", "output_lock"]

#: The lock and its holder's description, inside the output folder (ignored when a folder is checked for content).
LOCK_FILES = (".gpzoo.lock", ".gpzoo.lock.json")


class OutputLockedError(GPZooError, OSError):
    """Another gpzoo run is writing the output folder. ``argument`` names the folder's argument,
    ``path`` the folder and ``holder`` what the other run recorded about itself (may be empty)."""

    def __init__(self, argument: str, path: Path, holder: dict):
        self.argument, self.path, self.holder = argument, str(path), holder
        who = (f"process {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}"
               + (f": {holder['command']}" if holder.get("command") else "")) if holder else "another process"
        super().__init__(f"{argument}: {str(path)!r} is being written by another gpzoo run ({who}); wait for it to "
                         "finish, or choose another folder")


class OutputPathError(GPZooError, OSError):
    """An output folder gpzoo refuses to write: a symbolic link, or one inside it where gpzoo writes.
    ``argument`` names the folder's argument."""

    def __init__(self, argument: str, message: str):
        self.argument = argument
        super().__init__(f"{argument}: {message}")


def _refuse_links(path: Path, argument: str) -> None:
    for candidate in (path, *(path / name for name in LOCK_FILES)):
        if candidate.is_symlink():
            raise OutputPathError(argument, f"{str(candidate)!r} is a symbolic link: gpzoo does not write through links")


@contextlib.contextmanager
def output_lock(out, *, argument: str = "out") -> Iterator[Path]:
    """Hold the output folder ``out`` (created if missing) for this run; yields it as a ``Path``.

    Raises :class:`OutputLockedError` at once when another run holds it, and
    :class:`OutputPathError` for a folder or lock file that is a symbolic link."""
    path = Path(out)
    _refuse_links(path, argument)
    try:
        path.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path / LOCK_FILES[0]), timeout=0)
        lock.acquire()
    except Timeout:
        raise OutputLockedError(argument, path, _holder(path)) from None
    except OSError as exc:
        raise OutputPathError(argument, f"cannot write {str(path)!r} ({exc.strerror or exc})") from None
    try:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv),
                "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        (path / LOCK_FILES[1]).write_text(json.dumps(info), encoding="utf-8")
        yield path
    finally:
        with contextlib.suppress(OSError):
            (path / LOCK_FILES[1]).unlink()
        lock.release()


def _holder(path: Path) -> dict:
    """What the run holding ``path`` recorded about itself (empty when unreadable or still being written)."""
    try:
        info = json.loads((path / LOCK_FILES[1]).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}
