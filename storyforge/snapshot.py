"""The run's ``.hydra`` snapshot, kept true to the outputs beside it and free of credentials.

Takes: the run's snapshot folder (``RUN/.hydra``). Gives: :func:`committed_snapshot`, a context
manager around the job.

Why: Hydra writes ``config.yaml`` (and ``overrides.yaml``, ``hydra.yaml``) when a job starts. A
rerun into a finished run directory that is killed, or stops on a full disk, would leave a
snapshot of the failed attempt beside outputs an earlier attempt wrote. So the snapshot of
the attempt is set aside as ``*.attempt.yaml`` and the last committed one (``*.committed.yaml``,
copied when a job finishes) is put back in place at once; only when the job finishes is the
attempt's snapshot committed with the outputs it describes. A first run has nothing to put
back, so its snapshot stays as it was written. URL user info (``http://user:pass@host``) and
every registered secret are removed from every snapshot file, since a snapshot is a file
anyone may read or share.

Hydra writes the snapshot as the job starts, before the job can take the run directory's lock
or register its secrets: a run refused by the lock would write into the snapshot of the run
holding it, and a run stopped by a typo would leave a password in clear. So ``run.py`` turns
Hydra's snapshot off (:data:`HYDRA_SNAPSHOT_OFF` on its command line) and the job writes the
same three files into :data:`SNAPSHOT_DIR` (their text as Hydra makes it, see
:func:`storyforge.pipeline.hydra_snapshot`), redacted, from :func:`committed_snapshot`, entered with the lock held and the
secrets registered. A snapshot Hydra wrote itself (``hydra.output_subdir`` set by the user) is
redacted in place.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from storyforge.atomic import write_text_atomic
from storyforge.redaction import redact

__all__ = [
    "HYDRA_SNAPSHOT_OFF",
    "SNAPSHOT_DIR",
    "SNAPSHOT_FILES",
    "committed_snapshot",
    "scrub",
]

log = logging.getLogger(__name__)

SNAPSHOT_FILES = ("config.yaml", "overrides.yaml", "hydra.yaml")

SNAPSHOT_DIR = ".hydra"
"""Where the snapshot goes in the run directory (Hydra's default ``hydra.output_subdir``)."""

HYDRA_SNAPSHOT_OFF = "++hydra.output_subdir=null"
"""The override with which ``run.py`` tells Hydra not to write the snapshot itself (spelt so
that a job can tell it from a user's ``hydra.output_subdir=null``: no snapshot at all)."""


def _side(folder: Path, name: str, kind: str) -> Path:
    return folder / f"{Path(name).stem}.{kind}.yaml"


def scrub(path: Path) -> None:
    """Redact ``path`` in place (atomically), when it holds a secret or URL user info."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return
    clean = redact(text)
    if clean != text:
        write_text_atomic(path, clean)


@contextmanager
def committed_snapshot(
    folder: Path | None, pending: Mapping[str, str] | None = None
) -> Iterator[Path | None]:
    """Run the job with ``folder`` (``RUN/.hydra``) describing the committed outputs throughout.

    ``pending``: this attempt's snapshot files (text by name), to write there; without
    it, the files Hydra wrote there are this attempt's. Yields the file holding this attempt's ``config.yaml`` (to patch, e.g. with pinned inputs).
    On a normal exit the attempt's snapshot becomes the committed one; on any error or kill the
    committed snapshot of the last finished attempt stays in place.
    """
    pending = pending or {}
    if folder is None or not (folder.is_dir() or pending):
        yield None
        return
    for name in SNAPSHOT_FILES:
        scrub(folder / name)
    restored = []
    for name in SNAPSHOT_FILES:
        current, committed = folder / name, _side(folder, name, "committed")
        if name in pending:
            text = redact(pending[name])
            if committed.is_file():
                write_text_atomic(_side(folder, name, "attempt"), text)
                if not current.is_file():
                    write_text_atomic(current, committed.read_text(encoding="utf-8"))
                restored.append(name)
            else:
                write_text_atomic(current, text)
        elif current.is_file() and committed.is_file():
            write_text_atomic(_side(folder, name, "attempt"), current.read_text(encoding="utf-8"))
            write_text_atomic(current, committed.read_text(encoding="utf-8"))
            restored.append(name)
    if restored:
        log.debug("snapshot of the last finished run kept in place until this one finishes")
    config = folder / "config.yaml"
    yield (
        _side(folder, "config.yaml", "attempt")
        if "config.yaml" in restored
        else config
        if config.is_file()
        else None
    )
    for name in SNAPSHOT_FILES:
        current, attempt = folder / name, _side(folder, name, "attempt")
        source = attempt if attempt.is_file() else current
        if not source.is_file():
            continue
        text = source.read_text(encoding="utf-8")
        write_text_atomic(_side(folder, name, "committed"), text)
        write_text_atomic(current, text)
        if attempt.is_file():
            attempt.unlink()
