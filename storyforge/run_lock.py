"""One run per run directory: an OS lock held while a run writes into its directory.

Takes: a run directory. Gives: :func:`hold_run_dir`, a context manager that takes an exclusive
``flock`` on a lock file in it (``.hydra/run.lock`` for a Hydra run, beside the snapshot, else
``.run.lock``) and writes who holds it into that file: pid, host, start time and the program's
name (never its arguments). A second run into the same directory either stops at once with a
:class:`~storyforge.errors.ConfigError` naming the holder, or (``wait=true``) waits until the
holder is done. Why an OS lock and not a marker file: the kernel releases it when the holder
exits in any way, ``kill -9`` included, so no stale lock is ever left to clean up; two runs
into one directory would otherwise send every request twice and write each record twice.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from storyforge.errors import ConfigError

__all__ = ["LOCK_NAME", "hold_run_dir"]

LOCK_NAME = ".run.lock"

log = logging.getLogger(__name__)


def _holder(fd: int) -> str:
    """Who holds the lock, from what the holder wrote into the file."""
    try:
        raw = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        info = json.loads(raw)
        return f"pid {info['pid']} on {info['host']} since {info['started']} ({info['command']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (it has not said which yet)"


@contextmanager
def hold_run_dir(run_dir: Path, *, wait: bool = False, lock_name: str = LOCK_NAME) -> Iterator[None]:
    """Hold ``run_dir``'s lock (the file ``lock_name`` in it) for the ``with`` block; refuse (or
    wait) when another run holds it."""
    lock_path = run_dir / lock_name
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            if not wait:
                raise ConfigError(
                    f"run directory {run_dir} is in use by {holder}; wait for that run (add wait=true "
                    "to wait for it) or choose another hydra.run.dir"
                ) from None
            log.warning("run directory %s is in use by %s; waiting for it to finish", run_dir, holder)
            fcntl.flock(fd, fcntl.LOCK_EX)
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            # the program only: the overrides could hold a URL with credentials
            "command": Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python",
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode("utf-8"), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # the directory's files do not depend on who ran last
    finally:
        os.close(fd)  # releases the lock
