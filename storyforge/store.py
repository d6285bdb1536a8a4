"""The template store: validated templates kept as raw JSON in a SQL database.

Takes: template documents (dicts, or files read by :mod:`storyforge.engine.loader`) and a SQLAlchemy
URL (``sqlite:///storyforge.db`` by default; any SQLAlchemy URL, PostgreSQL for a team).
Gives: :class:`TemplateStore` (create, update, save, get, load, list, delete, import and
export) over one table, ``prompt_templates``, and :func:`check_template`, the validation
gate the store and the ``storyforge`` command share.

Why: templates are authored data, so they are checked before they are kept (schema, task
binding, source names and argument values against the task kind, structure) and every
problem is reported at once; an invalid template is never stored. Anything can still edit
the database behind the store's back, so loading parses, re-hashes, revalidates and compiles
again, and names the template and the store row in the error
(``store:sqlite:///storyforge.db#turn_writer``). SQLite runs in WAL mode so readers never
block each other or the writer.

Concurrency (several processes on one store, SQLite or PostgreSQL): every write locks the rows
it changes (``SELECT ... FOR UPDATE``; SQLite takes its write lock up front), so no revision is
ever lost, and each revision is also kept in ``prompt_template_revisions`` under the key
``(id, revision)``. A write that loses a race (two first inserts of one id, a deadlock, a
serialization failure) is retried whole. An import is one transaction: all of it or none of it.
Creating the tables is serialized too (an advisory lock on PostgreSQL, ``BEGIN IMMEDIATE`` on
SQLite), so many processes may open a new store at once.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeVar

from storyforge.extras import require

require("sqlalchemy", extra="store", for_what="the template store")

from sqlalchemy import DateTime, Engine, Integer, String, Text, create_engine, delete, event, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from storyforge.atomic import write_text_atomic
from storyforge.engine.loader import LoadedTemplate, load_template_text
from storyforge.errors import Issue, StoreError, TemplatePath, TemplateValidationError, did_you_mean
from storyforge.ids import compact_json, content_hash, file_stem, normal_id
from storyforge.tasks.base import TaskKind
from storyforge.template_files import (
    DEFAULT_URL,
    MAX_LENGTHS,
    CheckedTemplate,
    check_template,
    default_url,
    dump_template,
    read_template_file,
    template_files,
    with_normal_id,
)

if TYPE_CHECKING:
    from storyforge.engine.compiler import CompiledTemplate

__all__ = [
    "DEFAULT_URL",
    "MAX_LENGTHS",
    "MAX_REVISION",
    "CheckedTemplate",
    "LoadedRecord",
    "TemplateRecord",
    "TemplateStore",
    "check_template",
    "content_hash",
    "default_url",
    "dump_template",
    "read_template_file",
]

_T = TypeVar("_T")

#: Largest revision number a store keeps (a 32-bit INTEGER column on PostgreSQL); a larger one
#: asked for is simply not there (SQLite would overflow binding it).
MAX_REVISION = 2**31 - 1


# --- persistence --------------------------------------------------------------------------


class _Base(DeclarativeBase):
    pass


class _TemplateRow(_Base):
    __tablename__ = "prompt_templates"

    id: Mapped[str] = mapped_column(String(MAX_LENGTHS["id"]), primary_key=True)
    name: Mapped[str] = mapped_column(String(MAX_LENGTHS["name"]))
    task: Mapped[str] = mapped_column(String(MAX_LENGTHS["task"]), index=True)
    version: Mapped[int] = mapped_column(Integer)
    revision: Mapped[int] = mapped_column(Integer, default=1)
    raw: Mapped[str] = mapped_column(Text)
    content_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class _RevisionRow(_Base):
    """Every revision ever stored; the key makes a lost or doubled revision impossible."""

    __tablename__ = "prompt_template_revisions"

    template_id: Mapped[str] = mapped_column(String(MAX_LENGTHS["id"]), primary_key=True)
    revision: Mapped[int] = mapped_column(Integer, primary_key=True)
    raw: Mapped[str] = mapped_column(Text)
    content_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


def _stored(data: Any) -> str:
    """The JSON text a row keeps: compact, with NUL escaped (PostgreSQL text holds no NUL).

    In compact JSON a NUL can only stand inside a string, where ``\\u0000`` means the same.
    """
    return compact_json(data).replace("\x00", "\\u0000")


@dataclass(frozen=True, slots=True, kw_only=True)
class TemplateRecord:
    """One stored template: its columns and its raw document (a fresh copy per read)."""

    id: str
    name: str
    task: str
    version: int
    revision: int
    content_hash: str
    created_at: datetime
    updated_at: datetime
    raw: str

    def document(self) -> Any:
        """The stored JSON parsed into plain data (no validation)."""
        return json.loads(self.raw)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedRecord:
    """A stored template revalidated and compiled, ready to render."""

    record: TemplateRecord
    data: Mapping[str, Any]
    compiled: CompiledTemplate
    kind: TaskKind


def _record(row: _TemplateRow, old: _RevisionRow | None = None) -> TemplateRecord:
    """The current row as a record, or (``old``) an older revision of it, whose name, task and
    version are its own document's."""
    current = TemplateRecord(
        id=row.id,
        name=row.name,
        task=row.task,
        version=row.version,
        revision=row.revision,
        content_hash=row.content_hash,
        created_at=_utc(row.created_at),
        updated_at=_utc(row.updated_at),
        raw=row.raw,
    )
    if old is None:
        return current
    data = json.loads(old.raw)
    columns = data if isinstance(data, Mapping) else {}
    return dataclasses.replace(
        current,
        name=str(columns.get("name", row.name)),
        task=str(columns.get("task", row.task)),
        version=int(columns.get("version", row.version)),
        revision=old.revision,
        content_hash=old.content_hash,
        updated_at=_utc(old.created_at),
        raw=old.raw,
    )


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


_WRITE_OPTION = "storyforge_write"


def _sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    # Transactions are begun by _sqlite_begin, not by the sqlite3 module, so a write can
    # take the write lock up front (BEGIN IMMEDIATE) and wait for it under busy_timeout.
    # busy_timeout comes first: switching to WAL takes a lock, and without a timeout a second
    # process opening the same new store fails at once with "database is locked".
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def _sqlite_begin(conn: Any) -> None:
    # A deferred transaction that reads and then writes can fail at once with SQLITE_BUSY
    # when another writer got there first; an immediate one waits for the lock instead.
    immediate = conn.get_execution_options().get(_WRITE_OPTION, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
    return engine


#: Any key; every storyforge process agrees on it, so table creation is done by one at a time.
_CREATE_LOCK_KEY = 0x5354_4F52_5946  # "STORYF"
_WRITE_ATTEMPTS = 8
# SQLSTATEs of a transaction that lost a race and may simply run again (PostgreSQL).
_RETRY_SQLSTATES = {"40001", "40P01", "23505"}


def _create_tables(engine: Engine, writer: Engine) -> None:
    """Create the store's tables when missing, safely when many processes open one store at once."""
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _CREATE_LOCK_KEY})
            _Base.metadata.create_all(conn)
    elif engine.dialect.name == "sqlite":
        with writer.begin() as conn:  # BEGIN IMMEDIATE: one creator at a time, others wait
            _Base.metadata.create_all(conn)
    else:
        _Base.metadata.create_all(engine)


def _lost_race(exc: BaseException) -> bool:
    """True for an error that rerunning the same transaction can cure."""
    if isinstance(exc, IntegrityError):
        return True
    orig = getattr(exc, "orig", None)
    code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return isinstance(exc, DBAPIError) and code in _RETRY_SQLSTATES


class TemplateStore:
    """Validated prompt templates in one SQL table.

    ``TemplateStore("sqlite:///storyforge.db")`` creates the table when missing. Use it as a
    context manager (or call :meth:`close`) to release the connection pool.
    """

    def __init__(self, url: str | None = None) -> None:
        self._url = url or default_url()
        try:
            self._engine = _make_engine(self._url)
            self._writer = self._engine.execution_options(**{_WRITE_OPTION: True})
            _create_tables(self._engine, self._writer)
        except Exception as exc:  # a bad URL or an unreachable server, reported with the URL
            raise StoreError(f"cannot open template store {self.display_url}: {exc}") from exc

    @property
    def display_url(self) -> str:
        """The store URL with any password hidden."""
        try:
            return make_url(self._url).render_as_string(hide_password=True)
        except (ArgumentError, ValueError):
            return "<invalid URL>"

    def source_of(self, template_id: str) -> str:
        """Where a stored template comes from, as errors name it: ``store:<url>#<id>``."""
        return f"store:{self.display_url}#{template_id}"

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _reading(self) -> Iterator[Session]:
        """A read-only session; database errors become :class:`StoreError`."""
        try:
            with Session(self._engine) as session:
                yield session
        except SQLAlchemyError as exc:
            raise self._store_error(exc) from exc

    def _transaction(self, work: Callable[[Session], _T]) -> _T:
        """Run ``work`` in one write transaction, again from the start when it lost a race.

        A race is two first inserts of one id, a deadlock or a serialization failure; the
        rerun sees the winner's rows. Errors ``work`` raises itself (:class:`StoreError`)
        are not retried.
        """
        for attempt in range(_WRITE_ATTEMPTS):
            try:
                with Session(self._writer) as session, session.begin():
                    return work(session)
            except SQLAlchemyError as exc:
                if attempt + 1 < _WRITE_ATTEMPTS and _lost_race(exc):
                    time.sleep(random.uniform(0.0, 0.01 * 2**attempt))
                    continue
                raise self._store_error(exc) from exc
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _store_error(self, exc: SQLAlchemyError) -> StoreError:
        reason = getattr(exc, "orig", None) or exc
        if isinstance(exc, IntegrityError):
            return StoreError(f"conflicting write in {self.display_url}: {reason}")
        return StoreError(f"template store {self.display_url} failed: {reason}")

    # -- writing ---------------------------------------------------------------------------

    def create(
        self, template: Mapping[str, Any] | LoadedTemplate, *, task: str | None = None
    ) -> TemplateRecord:
        """Validate and store a new template; its id must not be taken."""
        return self._write(template, task=task, mode="create")[0]

    def update(
        self, template: Mapping[str, Any] | LoadedTemplate, *, task: str | None = None
    ) -> TemplateRecord:
        """Validate and replace a stored template with the same id (no new revision if unchanged)."""
        return self._write(template, task=task, mode="update")[0]

    def update_status(
        self, template: Mapping[str, Any] | LoadedTemplate, *, task: str | None = None
    ) -> tuple[TemplateRecord, str]:
        """:meth:`update`, with the status ``updated`` or ``unchanged`` (same content: same revision)."""
        return self._write(template, task=task, mode="update")

    def save(
        self, template: Mapping[str, Any] | LoadedTemplate, *, task: str | None = None
    ) -> tuple[TemplateRecord, str]:
        """Create or update; the status is ``added``, ``updated`` or ``unchanged``."""
        return self._write(template, task=task, mode="save")

    def _write(
        self, template: Mapping[str, Any] | LoadedTemplate, *, task: str | None, mode: str
    ) -> tuple[TemplateRecord, str]:
        data = with_normal_id(check_template(template, task=task, require_known_task=True).data)
        return self._transaction(lambda session: self._put(session, data, mode))

    def _put(self, session: Session, data: Mapping[str, Any], mode: str) -> tuple[TemplateRecord, str]:
        """Insert or update one checked template inside a write transaction, row locked."""
        raw = _stored(data)
        digest = content_hash(data)
        now = datetime.now(UTC)
        template_id = str(data["id"])
        row = session.get(_TemplateRow, template_id, with_for_update=True, populate_existing=True)
        if row is None:
            if mode == "update":
                raise StoreError(self._missing(template_id, session))
            row = _TemplateRow(id=template_id, revision=0, created_at=now)
            session.add(row)
            status = "added"
        elif mode == "create":
            raise StoreError(
                f"template {template_id!r} already exists in {self.display_url}; use update to replace it"
            )
        else:
            status = "updated" if row.content_hash != digest or row.raw != raw else "unchanged"
        if status != "unchanged":
            row.name = str(data["name"])
            row.task = str(data["task"])
            row.version = int(data["version"])
            row.revision = row.revision + 1
            row.raw = raw
            row.content_hash = digest
            row.updated_at = now
            session.add(
                _RevisionRow(
                    template_id=template_id,
                    revision=row.revision,
                    raw=raw,
                    content_hash=digest,
                    created_at=now,
                )
            )
        session.flush()
        return _record(row), status

    def delete(self, template_id: str) -> None:
        """Remove a stored template; an unknown id is an error."""
        template_id = self._lookup_id(template_id)

        def work(session: Session) -> None:
            session.delete(self._row(session, template_id, with_for_update=True))
            session.execute(delete(_RevisionRow).where(_RevisionRow.template_id == template_id))

        self._transaction(work)

    # -- reading ---------------------------------------------------------------------------

    def get(self, template_id: str, *, revision: int | None = None) -> TemplateRecord:
        """The stored record as it is (no validation); an older one with ``revision``."""
        template_id = self._lookup_id(template_id)
        with self._reading() as session:
            row = self._row(session, template_id)
            if revision is None or revision == row.revision:
                return _record(row)
            in_range = isinstance(revision, int) and 1 <= revision <= MAX_REVISION
            old = session.get(_RevisionRow, (template_id, revision)) if in_range else None
            if old is None:
                kept = [r.revision for r in self._revision_rows(session, template_id)]
                shown = revision if in_range or abs(revision) < 10**20 else "past the largest kept"
                raise StoreError(
                    f"template {template_id!r} has no revision {shown} in {self.display_url} "
                    f"(kept: {', '.join(map(str, kept)) or 'none'})"
                )
            return _record(row, old)

    def revisions(self, template_id: str) -> builtins.list[TemplateRecord]:
        """Every kept revision of a template, oldest first (the current one last)."""
        template_id = self._lookup_id(template_id)
        with self._reading() as session:
            row = self._row(session, template_id)
            records = [_record(row, old) for old in self._revision_rows(session, template_id)]
            if not records or records[-1].revision != row.revision:  # a store from before revisions were kept
                records.append(_record(row))
            return records

    @staticmethod
    def _revision_rows(session: Session, template_id: str) -> builtins.list[_RevisionRow]:
        query = (
            select(_RevisionRow)
            .where(_RevisionRow.template_id == template_id)
            .order_by(_RevisionRow.revision)
        )
        return builtins.list(session.scalars(query))

    def list(self, *, task: str | None = None) -> list[TemplateRecord]:
        """Every stored template (optionally of one task kind), sorted by id."""
        query = select(_TemplateRow).order_by(_TemplateRow.id)
        if task is not None:
            query = query.where(_TemplateRow.task == task)
        with self._reading() as session:
            return [_record(row) for row in session.scalars(query)]

    def load(self, template_id: str, *, task: str | None = None) -> LoadedRecord:
        """Rehydrate, re-hash, revalidate and compile a stored template.

        Raises :class:`TemplateValidationError` naming the template and
        ``store:<url>#<id>`` when the row no longer holds a valid template: JSON that does
        not parse, a hash that does not match (the raw JSON was edited outside the store),
        columns that disagree with the document, or any authoring problem.
        """
        record = self.get(template_id)
        source = self.source_of(template_id)
        issues: builtins.list[Issue] = [*self.integrity_issues(record)]
        data: Any = None
        try:
            loaded = load_template_text(record.raw, format="json", source=source)
            data = loaded.data
        except TemplateValidationError as exc:
            issues.extend(exc.issues)
        checked: CheckedTemplate | None = None
        if data is not None:
            issues.extend(_column_issues(record, data))
            try:
                checked = check_template(data, task=task, require_known_task=True)
            except TemplateValidationError as exc:
                issues.extend(exc.issues)
        if issues or checked is None or checked.kind is None:
            raise TemplateValidationError(
                issues or [Issue(code="store", path=TemplatePath(), message="the stored template is empty")]
            ).with_template(record.id, source=source)
        return LoadedRecord(record=record, data=checked.data, compiled=checked.compiled, kind=checked.kind)

    def integrity_issues(self, record: TemplateRecord) -> builtins.list[Issue]:
        """A hash mismatch between the stored JSON and its recorded content hash, if any."""
        try:
            data = json.loads(record.raw)
        except ValueError:
            return []  # reported by the parser with its line and column
        digest = content_hash(data)
        if digest == record.content_hash:
            return []
        return [
            Issue(
                code="hash_mismatch",
                path=TemplatePath(),
                message=f"the stored JSON does not match its content hash (recorded "
                f"{record.content_hash[:12]}, found {digest[:12]}): it was edited outside "
                f"storyforge. Check it with 'storyforge templates show {record.id}', then store "
                "it again with 'storyforge templates update'",
            )
        ]

    def _lookup_id(self, template_id: str) -> str:
        """The id as the store keeps it (NFC); one no store can hold is unknown at once.

        A NUL would make PostgreSQL fail the query where SQLite finds nothing: both say "no template".
        """
        normal = normal_id(template_id)
        if "\x00" in normal:
            raise StoreError(f"no template {normal!r} in {self.display_url}.")
        return normal

    def _row(self, session: Session, template_id: str, **options: Any) -> _TemplateRow:
        """The current row of ``template_id``; a StoreError naming the closest id when there is none."""
        row = session.get(_TemplateRow, template_id, **options)
        if row is None:
            raise StoreError(self._missing(template_id, session))
        return row

    def _missing(self, template_id: str, session: Session) -> str:
        ids = list(session.scalars(select(_TemplateRow.id).order_by(_TemplateRow.id)))
        hint = did_you_mean(template_id, ids)
        return f"no template {template_id!r} in {self.display_url}.{hint}"

    # -- files -----------------------------------------------------------------------------

    def import_paths(
        self, paths: str | Path | Sequence[str | Path], *, task: str | None = None
    ) -> builtins.list[tuple[TemplateRecord, str]]:
        """Create or update every template in the given files and folders (all or nothing).

        Files are ``.json`` (StoryForge JSON) or ``.yaml``/``.yml`` (``conf/template``);
        a Hydra ``defaults`` list at the top of a YAML file is not part of the template
        and is left out. All files are checked before any is stored, and every problem
        of every file is raised together. Returns each record with its :meth:`save` status.
        """
        items = [paths] if isinstance(paths, str | Path) else list(paths)
        files = [file for item in items for file in template_files(Path(item))]
        checked: list[Mapping[str, Any]] = []
        problems: list[TemplateValidationError] = []
        for file in files:
            try:
                checked.append(with_normal_id(check_template(read_template_file(file), task=task).data))
            except TemplateValidationError as exc:
                problems.append(exc)
        if problems:
            raise _combine(problems)
        # One transaction for the whole import; rows are locked in id order so concurrent
        # imports of the same folder wait for each other instead of deadlocking.
        order = sorted(range(len(checked)), key=lambda k: str(checked[k]["id"]))

        def work(session: Session) -> builtins.list[tuple[TemplateRecord, str]]:
            done = {k: self._put(session, checked[k], "save") for k in order}
            return [done[k] for k in range(len(checked))]

        return self._transaction(work)

    def export(self, template_id: str, path: str | Path) -> Path:
        """Write a stored template to ``path`` (JSON, or YAML for ``.yaml``/``.yml``), atomically."""
        record = self.get(template_id)
        target = Path(path)
        fmt = "yaml" if target.suffix.lower() in (".yaml", ".yml") else "json"
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(target, dump_template(record.document(), fmt))
        return target

    def export_folder(
        self, folder: str | Path, *, fmt: str = "json", task: str | None = None
    ) -> builtins.list[Path]:
        """Write every stored template (of one task kind) into ``folder``, one file per id.

        The file name is :func:`storyforge.ids.file_stem` of the id, so no id, however it got
        into the store, names a file outside ``folder``; two ids that would share a file are an
        error before anything is written.
        """
        root = Path(folder)
        suffix = ".yaml" if fmt == "yaml" else ".json"
        records = self.list(task=task)
        targets: dict[str, str] = {}
        for record in records:
            name = file_stem(record.id) + suffix
            if name in targets:
                raise StoreError(
                    f"templates {targets[name]!r} and {record.id!r} would both be written to {root / name}"
                )
            targets[name] = record.id
        written = []
        for name, template_id in targets.items():
            target = root / name
            if target.parent != root or Path(name).name != name:  # file_stem never allows it
                raise StoreError(f"refusing to write template {template_id!r} outside {root}")
            written.append(self.export(template_id, target))
        return written


def _column_issues(record: TemplateRecord, data: Any) -> list[Issue]:
    if not isinstance(data, Mapping):
        return []
    issues: list[Issue] = []
    for column, value in (("id", record.id), ("name", record.name), ("task", record.task)):
        found = data.get(column)
        if isinstance(found, str) and found != value:
            issues.append(
                Issue(
                    code="store_mismatch",
                    path=TemplatePath((column,)),
                    message=f"the document says {column} {found!r} but the store row says {value!r}",
                )
            )
    return issues


def _combine(errors: Sequence[TemplateValidationError]) -> TemplateValidationError:
    if len(errors) == 1:
        return errors[0]
    issues = [
        dataclasses.replace(issue, message=f"{err.source or err.template_name}: {issue.message}")
        for err in errors
        for issue in err.issues
    ]
    return TemplateValidationError(issues, source=f"{len(errors)} files")
