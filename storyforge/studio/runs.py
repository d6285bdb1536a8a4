"""The studio's run viewer: the runs and sweeps under a folder, as JSON bodies for the page.

Takes: a folder, or several (``storyforge studio --runs DIR...``). Gives: :class:`Runs`, whose
methods return the bodies of the page's run API: the run and sweep directories found under the
folders at start (newest first), one run's answers as a filtered, sorted page, one answer with the
checks drawn on its text beside its prompt, the label and theme summaries, a sweep's report
with its pass-rate grid, and two runs compared answer by answer.

Why this shape: a run can hold millions of answers, so the page never receives them whole.
Each run gets an index once, on first open (:class:`RunIndex`): the light columns of
``validated.parquet`` (its JSONL when the twin is missing), its seeds' split and theme, and
the byte offset of every line of ``validated.jsonl``, all as NumPy arrays. A page is then a
mask, a cached sort order and a slice; an answer's text is one line read at its offset.

Safety: the studio only reads. The folders it may read are the ones listed at start, each
known by its name (its path relative to the folder); a request names a run, never a path,
and only the fixed file names below are opened inside it. Text from runs goes to the page as
JSON strings, which the page inserts as text.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import os
import re
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from storyforge.errors import DataError, StoryforgeError
from storyforge.jsontext import BadLine
from storyforge.runfiles import (
    DUPLICATES,
    HYDRA_CONFIG,
    MANIFEST,
    PROMPTS,
    SEEDS,
    SUMMARY,
    SWEEP_REPORT,
    SWEEP_SUMMARY,
    VALIDATED,
    load_run_file,
)
from storyforge.studio.errors import StudioError, query_int
from storyforge.tables import parquet_path
from storyforge.tasks.tinystories.exports import ExportOptions
from storyforge.tasks.tinystories.validate import (
    LABELS,
    MAX_CHARS,
    SeedChecks,
    check_answer,
    finish_problem,
    prompt_texts,
)

if TYPE_CHECKING:
    from storyforge.store import CheckedTemplate

    Renderer = Callable[[CheckedTemplate, Mapping[str, Any], int | None], dict[str, Any]]

log = logging.getLogger(__name__)

__all__ = ["MAX_PAGE", "RunIndex", "Runs", "answer_checks", "sentence_spans"]

#: The label a dropped near-duplicate carries (as the dedup stage names it).
NEAR_DUPLICATE = "near_duplicate"
#: Largest page of answers one request may ask for.
MAX_PAGE = 500
#: Deepest folder level searched for runs under the folder given at start.
MAX_DEPTH = 4
#: Most run indexes kept in memory at once (least recently used ones are dropped).
MAX_OPEN = 6
#: The page size the page asks for (its first page is read before a run's index is built).
_FIRST_PAGE = 50
#: Most flipped answers one comparison lists.
MAX_FLIPS = 200
#: What a page may be sorted by: the row number, or one of the :class:`RunIndex` columns so named.
_SORTS = (
    "row",
    "id",
    "sample",
    "attempt",
    "passed",
    "labels",
    "chars",
    "sentences",
    "finish_reason",
    "theme",
    "split",
    "judge",
    "cluster",
)
#: What a page may be filtered by.
_FILTERS = ("passed", "label", "split", "theme", "finish_reason", "id")
#: The columns of ``validated`` the table shows (the ones a run has).
_LIGHT = (
    "id",
    "sample",
    "attempt",
    "passed",
    "labels",
    "chars",
    "sentence_count",
    "finish_reason",
    "judge",
    "verdict",
)
#: The seed fields the index keeps: the table's filters and the chart of sentence ranges.
_SEED_COLUMNS = ("id", "split", "theme", "min_sentences", "max_sentences")
#: The Parquet twins of ``validated.jsonl`` and ``prompts_seed.jsonl``.
_TWIN, _SEEDS_TWIN = (parquet_path(Path(name)).name for name in (VALIDATED, SEEDS))
#: The fields of each attempt the answer view lists.
_ATTEMPT_FIELDS = ("row", "attempt", "passed", "labels", "reasons", "output", "chain", "repair_turn")
_CHUNK = 1 << 24
_SENTENCE = re.compile(r"[^.!?]+")
_WORD = re.compile(r"\w+")
_SHINGLE = 5


def _name_of(root: Path, path: Path, label: str | None = None) -> str:
    """A listed folder's name: its path inside ``root`` (``root`` itself: its own name), after
    ``label/`` when several folders are open."""
    rel = path.relative_to(root).as_posix()
    if label is None:
        return rel if rel != "." else path.name
    return label if rel == "." else f"{label}/{rel}"


def _labels(roots: Sequence[Path]) -> dict[str, Path]:
    """Each folder by its label: its last part, or as many last parts as tell them apart."""
    for k in range(1, max(len(root.parts) for root in roots) + 1):
        labels = [PurePosixPath(*root.parts[-k:]).as_posix() for root in roots]
        if len(set(labels)) == len(labels):
            return dict(zip(labels, roots, strict=True))
    raise AssertionError("distinct folders have distinct paths")


def _mtime(path: Path) -> float:
    for name in (MANIFEST, SWEEP_SUMMARY, VALIDATED):
        if (path / name).is_file():
            return (path / name).stat().st_mtime
    return path.stat().st_mtime


def _is_sweep(path: Path) -> bool:
    return (path / SWEEP_SUMMARY).is_file() or (path / "multirun.yaml").is_file()


def _is_run(path: Path) -> bool:
    return (path / VALIDATED).is_file()


#: Every file the viewer may open in a run or sweep folder.
_FILES = (
    VALIDATED,
    _TWIN,
    SEEDS,
    _SEEDS_TWIN,
    PROMPTS,
    DUPLICATES,
    MANIFEST,
    SUMMARY,
    HYDRA_CONFIG,
    SWEEP_SUMMARY,
    SWEEP_REPORT,
)


def read_no_link(path: Path) -> bytes:
    """The bytes of ``path``, refusing (:class:`OSError`) a file that became a symbolic link
    since it was checked."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        return handle.read()


def _through_link(folder: Path, name: str) -> bool:
    """``folder / name`` is reached through a symbolic link (the file, or a folder on its way)."""
    parts = Path(name).parts
    return any(folder.joinpath(*parts[:depth]).is_symlink() for depth in range(1, len(parts) + 1))


def _regular_file(folder: Path, name: str) -> Path | None:
    """``folder / name`` when it is a regular file inside ``folder``, reached without following
    a symbolic link; else None (what the viewer serves or reads from a run or sweep folder)."""
    if Path(name).is_absolute() or ".." in Path(name).parts or _through_link(folder, name):
        return None
    path = folder / name
    return path if path.is_file() else None


def _linked(path: Path) -> str | None:
    """The first file the viewer would open in ``path`` that is a symbolic link, or is reached
    through one (such a folder is not listed: its files could be anywhere), or None."""
    return next((name for name in _FILES if _through_link(path, name)), None)


def _listed(kind: str, folders: Mapping[str, Path], name: str) -> Path:
    """The folder of the run or sweep listed as ``name``; a 404 when there is none, or when a
    link has been made in it since it was listed."""
    path = folders.get(name)
    if path is None:
        raise StudioError(f"no {kind} named {name!r} under the runs folder", status=404)
    if (link := _linked(path)) is not None:
        raise StudioError(f"{kind} {name!r}: its {link} is a symbolic link; it is not read", status=404)
    return path


def _walk(root: Path) -> Iterator[Path]:
    """Folders under ``root`` (itself included) to ``MAX_DEPTH`` levels, hidden ones and links skipped."""
    stack = [(root, 0)]
    while stack:
        folder, depth = stack.pop()
        yield folder
        if depth >= MAX_DEPTH:
            continue
        try:
            children = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            continue
        for entry in children:
            if entry.name.startswith(".") or entry.is_symlink() or not entry.is_dir():
                continue
            stack.append((Path(entry.path), depth + 1))


def _read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is missing, not JSON or not an object."""
    try:
        data = load_run_file(path)
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _line_offsets(path: Path) -> np.ndarray:
    """The byte offset where each line of ``path`` starts (one entry per line, plus the end)."""
    starts = [np.zeros(1, dtype=np.int64)]
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            ends = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10).astype(np.int64)
            starts.append(ends + size + 1)
            size += len(chunk)
    offsets = np.concatenate(starts)
    if offsets[-1] != size:  # a last line without its newline
        offsets = np.append(offsets, size)
    return offsets


#: Where each line of ``validated.jsonl``, of the seeds and of the prompts starts (None: no such file).
_Offsets = tuple[np.ndarray, np.ndarray | None, np.ndarray | None]


def _run_offsets(path: Path) -> _Offsets:
    seeds, prompts = path / SEEDS, path / PROMPTS
    return (
        _line_offsets(path / VALIDATED),
        _line_offsets(seeds) if seeds.is_file() else None,
        _line_offsets(prompts) if prompts.is_file() else None,
    )


#: One worker builds the indexes of runs being opened (one at a time: each uses both cores).
_BUILDS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="run-index")
#: One worker finds the line offsets of runs being opened while their columns are read.
_OFFSETS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="run-offsets")


def _parse(raw: bytes, number: int) -> Any:
    """The JSON value of line ``number`` (its bytes ``raw``), or the :class:`BadLine` it is.
    (orjson, not :func:`storyforge.jsontext.parse_line`: a run's whole JSONL is read 4x faster.)"""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return BadLine.of(exc, number)


def _jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, value or :class:`BadLine`) for every line of ``path``, blank ones included
    (row ``i`` of a run is line ``i + 1``)."""
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            yield number, _parse(raw, number)


def _read_line(path: Path, offsets: np.ndarray, row: int) -> Any:
    with path.open("rb") as handle:
        handle.seek(int(offsets[row]))
        value = _parse(handle.read(int(offsets[row + 1] - offsets[row])), row + 1)
    if isinstance(value, BadLine):
        raise StudioError(value.at(path.name))
    return value


def _read_object(path: Path, offsets: np.ndarray | None, row: int) -> dict[str, Any] | None:
    """Line ``row`` (from 0) of ``path`` when the file has it and it holds a JSON object, else None."""
    if offsets is None or not 0 <= row < len(offsets) - 1:
        return None
    value = _read_line(path, offsets, row)
    return value if isinstance(value, dict) else None


@dataclass(frozen=True, slots=True)
class _Coded:
    """A column as codes into its sorted distinct values (-1: null), so a filter or a sort is
    one comparison of integers."""

    codes: np.ndarray
    values: list[Any]

    @classmethod
    def of(cls, values: pa.Array | pa.ChunkedArray) -> _Coded:
        """Values as int32 codes whose order is the values' order (null is code -1)."""
        encoded = pc.dictionary_encode(values)
        if isinstance(encoded, pa.ChunkedArray):
            encoded = (
                encoded.combine_chunks()
                if encoded.num_chunks
                else pa.array([], pa.dictionary(pa.int32(), values.type))
            )
        dictionary = encoded.dictionary
        order = np.asarray(pc.array_sort_indices(dictionary), dtype=np.int64)
        rank = np.empty(len(order), dtype=np.int32)
        rank[order] = np.arange(len(order), dtype=np.int32)
        indices = encoded.indices.to_numpy(zero_copy_only=False)
        nulls = np.asarray(encoded.indices.is_null(), dtype=bool)
        raw = np.where(nulls, 0, np.nan_to_num(indices, nan=0)).astype(np.int64)
        codes = rank[raw] if len(rank) else np.zeros(len(raw), dtype=np.int32)
        return cls(np.where(nulls, -1, codes).astype(np.int32), dictionary.take(pa.array(order)).to_pylist())

    def take(self, rows: np.ndarray) -> _Coded:
        """The codes at ``rows`` (-1 where a row is -1: none)."""
        found = self.codes[np.maximum(rows, 0)] if len(self.codes) else -1
        return _Coded(np.where(rows >= 0, found, -1), self.values)

    def at(self, row: int) -> Any:
        code = int(self.codes[row])
        return self.values[code] if 0 <= code < len(self.values) else None

    def code(self, value: str) -> int | None:
        """The code of ``value`` (a binary search: the values are sorted), or None."""
        code = bisect.bisect_left(self.values, value)
        return code if code < len(self.values) and self.values[code] == value else None

    def equals(self, value: str) -> np.ndarray:
        code = self.code(value)
        return self.codes == code if code is not None else np.zeros(len(self.codes), dtype=bool)


def _column(table: pa.Table, name: str) -> pa.ChunkedArray | None:
    return table.column(name) if name in table.column_names else None


def _twin_table(twin: Path, columns: Sequence[str]) -> pa.Table | None:
    """The ``columns`` a Parquet twin has (``id`` always); None when it is missing or broken
    (the JSONL is the record)."""
    if not twin.is_file():
        return None
    try:
        names = pq.read_schema(twin).names
        return pq.read_table(twin, columns=[c for c in columns if c in names or c == "id"])
    except (OSError, pa.ArrowException, KeyError):
        return None


def _light_table(run: Path) -> pa.Table:
    """The columns of ``validated`` the table shows, from the Parquet twin or else the JSONL."""
    table = _twin_table(run / _TWIN, _LIGHT)
    if table is not None:
        return table
    rows: dict[str, list[Any]] = {c: [] for c in _LIGHT}
    for number, record in _jsonl(run / VALIDATED):
        if isinstance(record, BadLine):
            raise StudioError(record.at(f"{run.name}/{VALIDATED}"))
        if not isinstance(record, dict):
            raise StudioError(f"{run.name}/{VALIDATED}:{number}: not a JSON object")
        for column, values in rows.items():
            values.append(record.get(column))
    present = {c: v for c, v in rows.items() if any(x is not None for x in v) or c in ("id", "passed")}
    return pa.table({c: pa.array(v) for c, v in present.items()})


def _seed_table(run: Path) -> pa.Table | None:
    table = _twin_table(run / _SEEDS_TWIN, _SEED_COLUMNS)
    if table is not None or not (run / SEEDS).is_file():
        return table
    columns: dict[str, list[Any]] = {c: [] for c in _SEED_COLUMNS}
    for _, record in _jsonl(run / SEEDS):
        record = record if isinstance(record, dict) else {}  # a line of its own all the same
        for column, values in columns.items():
            value = record.get(column)
            values.append(
                _whole(value) if column.endswith("_sentences") else value
            )  # a bound: a whole number
    return pa.table(
        {c: pa.array(v, pa.int64() if c.endswith("_sentences") else pa.string()) for c, v in columns.items()}
    )


def _sentence_range(seeds: pa.Table) -> pa.ChunkedArray:
    """Each seed's allowed sentence range as ``report/`` names it (``"min..max"``; null when a
    bound is missing)."""
    if "min_sentences" not in seeds.column_names or "max_sentences" not in seeds.column_names:
        return pa.chunked_array([pa.nulls(seeds.num_rows, pa.string())])
    low = seeds.column("min_sentences").cast(pa.string())
    high = seeds.column("max_sentences").cast(pa.string())
    return pc.binary_join_element_wise(low, high, "..")


def _duplicates(run: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """``duplicates.jsonl`` as (id, sample) -> its entry, when the run has one.

    Two shapes are read: one line per cluster (``cluster``, ``size``, ``kept``: the kept
    member's id and sample, ``members``: each with ``id``, ``sample``, ``kept`` true for the
    kept one, ``match``, ``jaccard``, ``shared_shingles``), as the dedup stage writes it, and
    one line per repeated answer (``id``, ``sample``, ``cluster``, ``kept``). Members from an
    earlier data set (no ``id`` of this run) are skipped."""
    path = run / DUPLICATES
    found: dict[tuple[str, int], dict[str, Any]] = {}
    if not path.is_file():
        return found
    for _, record in _jsonl(path):
        if not isinstance(record, dict):
            continue
        members = record.get("members")
        if isinstance(members, list):
            for member in members:
                if isinstance(member, dict) and isinstance(member.get("id"), str) and "source" not in member:
                    entry = {**member, "cluster": record.get("cluster"), "size": record.get("size")}
                    entry["is_kept"] = member.get("kept") is True
                    entry["kept"] = record.get("kept")
                    found[(member["id"], _sample_of(member))] = entry
        elif isinstance(record.get("id"), str):
            found[(record["id"], _sample_of(record))] = {**record, "is_kept": False}
    return found


def _sample_of(record: Mapping[str, Any], key: str = "sample") -> int:
    return _whole(record.get(key)) or 0


def _whole(value: Any) -> int | None:
    """``value`` when it is a whole number (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _cluster_of(record: Mapping[str, Any]) -> str | None:
    value = next((record[key] for key in ("cluster", "cluster_id") if record.get(key) is not None), None)
    return None if value is None else str(value)


def _kept_of(record: Mapping[str, Any]) -> tuple[str, int] | None:
    """The (id, sample) of the kept member a near-duplicate record names, in the shapes it may take."""
    for key in ("kept", "duplicate_of", "of", "nearest"):
        value = record.get(key)
        if isinstance(value, Mapping) and isinstance(value.get("id"), str):
            return value["id"], _sample_of(value)
        if isinstance(value, str):
            return value, 0
    kept_id = record.get("kept_id")
    return (kept_id, _sample_of(record, "kept_sample")) if isinstance(kept_id, str) else None


@dataclass(slots=True, kw_only=True)
class RunIndex:
    """One run's answers as arrays: built once, then every page is a mask, an order and a slice.

    The columns the page sorts by are named as its sort keys (:data:`_SORTS`)."""

    path: Path
    n: int
    id: _Coded
    sample: np.ndarray
    attempt: np.ndarray | None
    passed: np.ndarray
    labels: np.ndarray  # bit i set = the answer carries label_names[i]
    label_names: list[str]
    chars: np.ndarray
    sentences: np.ndarray
    finish_reason: _Coded
    split: _Coded  # this and the next two: the answer's seed's
    theme: _Coded
    bounds: _Coded  # the seed's "min..max" sentence range
    seed_row: np.ndarray
    judge: _Coded | None
    cluster: _Coded | None
    _offsets: Future[_Offsets]
    duplicates: dict[tuple[str, int], dict[str, Any]]
    _orders: dict[str, np.ndarray] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def build(cls, path: Path) -> RunIndex:
        """Read the run's light columns, its seeds' split and theme and its line offsets."""
        offsets = _OFFSETS.submit(_run_offsets, path)  # read meanwhile; needed only to open an answer
        return cls.from_table(path, _light_table(path), _seed_table(path), _duplicates(path), offsets)

    @classmethod
    def from_table(
        cls,
        path: Path,
        table: pa.Table,
        seeds: pa.Table | None,
        duplicates: dict[tuple[str, int], dict[str, Any]],
        offsets: Future[_Offsets],
    ) -> RunIndex:
        """The index of the answers in ``table`` (the whole run, or one page of it)."""
        n = table.num_rows
        ids = _Coded.of(table.column("id").cast(pa.string()))

        def ints(name: str, default: int = 0) -> np.ndarray:
            column = _column(table, name)
            if column is None:
                return np.full(n, default, dtype=np.int64)
            return np.asarray(column.cast(pa.int64()).fill_null(default), dtype=np.int64)

        label_names = list(LABELS)
        bits = np.zeros(n, dtype=np.int64)
        column = _column(table, "labels")
        if column is not None and n:
            lengths = np.asarray(pc.list_value_length(column).fill_null(0), dtype=np.int64)
            owner = np.repeat(np.arange(n, dtype=np.int64), lengths)
            flat = _Coded.of(pc.list_flatten(column).cast(pa.string()))
            label_names += [value for value in flat.values if value not in label_names]
            where = np.asarray([label_names.index(v) for v in flat.values], dtype=np.int64)
            if len(flat.codes):
                np.bitwise_or.at(bits, owner, np.left_shift(1, where[flat.codes]))
        finish = _column(table, "finish_reason")
        seed_row = np.full(n, -1, dtype=np.int64)
        split = theme = bounds = _Coded(seed_row, [])
        if seeds is not None and n:
            found = pc.index_in(
                table.column("id").cast(pa.string()), value_set=seeds.column("id").combine_chunks()
            )
            seed_row = np.asarray(found.fill_null(-1), dtype=np.int64)
            split, theme, bounds = (
                _Coded.of(values).take(seed_row)
                for values in (
                    seeds.column("split").cast(pa.string()),
                    seeds.column("theme").cast(pa.string()),
                    _sentence_range(seeds),
                )
            )
        judges = (_column(table, name) for name in ("judge", "verdict"))
        judge = next((j for j in judges if j is not None and not pa.types.is_struct(j.type)), None)
        cluster = None
        if duplicates and n:
            # each member's cluster; a repeat that was dropped also carries the near_duplicate label
            entries = [duplicates.get((ids.at(row), s)) for row, s in enumerate(ints("sample").tolist())]
            cluster = _Coded.of(
                pa.array([_cluster_of(e) if e is not None else None for e in entries], pa.string())
            )
            dropped = np.asarray([e is not None and not e.get("is_kept") for e in entries], dtype=bool)
            if dropped.any():
                if NEAR_DUPLICATE not in label_names:
                    label_names.append(NEAR_DUPLICATE)
                bits[dropped] |= 1 << label_names.index(NEAR_DUPLICATE)
        return cls(
            path=path,
            n=n,
            id=ids,
            sample=ints("sample"),
            attempt=ints("attempt", 0) if "attempt" in table.column_names else None,
            passed=np.asarray(table.column("passed").fill_null(False), dtype=bool)
            if n
            else np.zeros(0, bool),
            labels=bits,
            label_names=label_names,
            chars=ints("chars", -1),
            sentences=ints("sentence_count", -1),
            finish_reason=_Coded.of(
                finish.cast(pa.string()) if finish is not None else pa.nulls(n, pa.string())
            ),
            split=split,
            theme=theme,
            bounds=bounds,
            seed_row=seed_row,
            judge=_Coded.of(judge.cast(pa.string())) if judge is not None else None,
            cluster=cluster,
            _offsets=offsets,
            duplicates=duplicates,
        )

    @property
    def offsets(self) -> np.ndarray:
        """Where each line of ``validated.jsonl`` starts (and the end)."""
        offsets = self._offsets.result()[0]
        if len(offsets) - 1 != self.n:
            raise StudioError(
                f"{self.path.name}: validated.parquet has {self.n} rows but {VALIDATED} has {len(offsets) - 1} lines"
            )
        return offsets

    @property
    def seed_offsets(self) -> np.ndarray | None:
        return self._offsets.result()[1]

    @property
    def prompt_offsets(self) -> np.ndarray | None:
        return self._offsets.result()[2]

    # -- pages ---------------------------------------------------------------------------------

    def order(self, key: str) -> np.ndarray:
        """Row numbers sorted by ``key`` (ties by row number), computed once per key."""
        with self._lock:
            cached = self._orders.get(key)
        if cached is not None:
            return cached
        rows = np.arange(self.n, dtype=np.int64)
        column = None if key == "row" else getattr(self, key)
        if isinstance(column, _Coded):
            column = column.codes
        result = rows if column is None else np.lexsort((rows, column)).astype(np.int64)
        with self._lock:
            self._orders[key] = result
        return result

    def mask(self, filters: Mapping[str, str]) -> np.ndarray | None:
        """Rows kept by ``filters`` (None: every row)."""
        keep: np.ndarray | None = None
        for key, value in filters.items():
            if key == "passed":
                part = self.passed == (value == "true")
            elif key == "label" and value == "none":
                part = self.labels == 0
            elif key == "label":
                bit = 1 << self.label_names.index(value) if value in self.label_names else 0
                part = (self.labels & bit) != 0
            elif key in _FILTERS:  # split, theme, finish_reason, id
                part = getattr(self, key).equals(value)
            else:
                raise StudioError(f"unknown filter {key!r}; known: {', '.join(_FILTERS)}")
            keep = part if keep is None else keep & part
        return keep

    def label_list(self, row: int) -> list[str]:
        bits = int(self.labels[row])
        return [name for i, name in enumerate(self.label_names) if bits >> i & 1]

    def rows(self, selected: np.ndarray) -> list[dict[str, Any]]:
        """The table rows of the answers at ``selected`` (row numbers)."""
        return [
            {
                "row": row,
                "id": self.id.at(row),
                "sample": int(self.sample[row]),
                "attempt": int(self.attempt[row]) if self.attempt is not None else None,
                "passed": bool(self.passed[row]),
                "labels": self.label_list(row),
                "judge": self.judge.at(row) if self.judge is not None else None,
                "cluster": self.cluster.at(row) if self.cluster is not None else None,
                "chars": _maybe(self.chars[row]),
                "sentences": _maybe(self.sentences[row]),
                "finish_reason": self.finish_reason.at(row),
                "split": self.split.at(row),
                "theme": self.theme.at(row),
            }
            for row in selected.tolist()
        ]

    def page(
        self, filters: Mapping[str, str], sort: str, descending: bool, offset: int, limit: int
    ) -> dict[str, Any]:
        """One page of answers: ``limit`` rows from ``offset`` of the filtered, sorted table."""
        if sort not in _SORTS:
            raise StudioError(f"cannot sort by {sort!r}; known: {', '.join(_SORTS)}")
        if not 1 <= limit <= MAX_PAGE:
            raise StudioError(f"limit: expected 1 to {MAX_PAGE}, got {limit}")
        if offset < 0:
            raise StudioError(f"offset: expected 0 or more, got {offset}")
        order = self.order(sort)
        if descending:
            order = order[::-1]
        keep = self.mask(filters)
        if keep is None:
            total = self.n
            selected = order[offset : offset + limit]
        else:
            total = int(np.count_nonzero(keep))
            selected = _nth_kept(order, keep, offset, limit)
        return _page(total, offset, limit, sort, descending, self.rows(selected))

    def facets(self) -> dict[str, Any]:
        """What the filters can choose from, and whether the optional columns exist."""
        return {
            "labels": self.label_names,
            "splits": self.split.values,
            "themes": self.theme.values,
            "finish_reasons": self.finish_reason.values,
            "has_attempt": self.attempt is not None,
            "has_judge": self.judge is not None,
            "has_cluster": self.cluster is not None,
        }

    def final_rows(self) -> np.ndarray:
        """The row of each answer's last attempt (every row when the run has no attempts)."""
        rows = np.arange(self.n, dtype=np.int64)
        if self.attempt is None or not self.n:
            return rows
        order = np.lexsort((self.attempt, self.sample, self.id.codes))
        ids, samples = self.id.codes[order], self.sample[order]
        last = np.ones(len(order), dtype=bool)
        last[:-1] = (ids[1:] != ids[:-1]) | (samples[1:] != samples[:-1])
        return np.sort(order[last])

    def charts(self) -> dict[str, Any]:
        """Counts by label, pass rate by theme and by sentence count, as ``report/summary.json``
        counts them: over each answer's last attempt when the run regenerated answers."""
        rows = self.final_rows()
        bits, passed_rows = self.labels[rows], self.passed[rows]
        sentences = self.sentences[rows]
        counted = sentences >= 0
        # by the seed's allowed range, over the answers with text (as report/ counts its bounds)
        by_range = _rates(np.where(counted, self.bounds.codes[rows], -1), self.bounds.values, passed_rows)
        values, inverse = np.unique(sentences[counted], return_inverse=True)
        passed = int(np.count_nonzero(passed_rows))
        return {
            "validated": len(rows),
            "passed": passed,
            "pass_rate": round(passed / len(rows), 4) if len(rows) else None,
            "labels": {name: int(np.count_nonzero(bits >> i & 1)) for i, name in enumerate(self.label_names)},
            "by_theme": _rates(self.theme.codes[rows], self.theme.values, passed_rows),
            "by_split": _rates(self.split.codes[rows], self.split.values, passed_rows),
            "by_sentences": _rates(inverse.reshape(-1), values.tolist(), passed_rows[counted]),
            "by_sentence_range": dict(sorted(by_range.items(), key=lambda item: _bounds_key(item[0]))),
        }

    def row_of(self, seed_id: str, sample: int) -> list[int]:
        code = self.id.code(seed_id)
        if code is None:
            return []
        return np.flatnonzero((self.id.codes == code) & (self.sample == sample)).tolist()


def _bounds_key(bounds: str) -> list[int]:
    return [int(b) for b in bounds.split("..")]


def _page(
    total: int, offset: int, limit: int, sort: str, descending: bool, rows: list[Any]
) -> dict[str, Any]:
    """The body of a page of answers."""
    return {
        "total": total,
        "offset": offset,
        "limit": limit,
        "sort": sort,
        "descending": descending,
        "rows": rows,
    }


def _nth_kept(order: np.ndarray, keep: np.ndarray, offset: int, limit: int) -> np.ndarray:
    """Rows ``offset .. offset+limit`` of ``order`` among those ``keep`` marks, scanning in blocks."""
    found: list[np.ndarray] = []
    skipped = 0
    need = limit
    block = 1 << 16
    for start in range(0, len(order), block):
        part = order[start : start + block]
        hits = part[keep[part]]
        if skipped + len(hits) <= offset:
            skipped += len(hits)
            continue
        begin = max(0, offset - skipped)
        skipped = offset
        taken = hits[begin : begin + need]
        found.append(taken)
        need -= len(taken)
        if need <= 0:
            break
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def _maybe(value: Any) -> int | None:
    value = int(value)
    return value if value >= 0 else None


def _rates(codes: np.ndarray, values: list[Any], passed: np.ndarray) -> dict[str, dict[str, Any]]:
    """Per value with answers (in the values' order): how many were validated, passed, the rate."""
    out: dict[str, dict[str, Any]] = {}
    if not len(values):
        return out
    known = codes >= 0
    totals = np.bincount(codes[known], minlength=len(values))
    passes = np.bincount(codes[known], weights=passed[known].astype(np.int64), minlength=len(values))
    for i, value in enumerate(values):
        if value is None or not totals[i]:
            continue
        total, ok = int(totals[i]), int(passes[i])
        out[str(value)] = {"validated": total, "passed": ok, "pass_rate": round(ok / total, 4)}
    return out


# -- the checks drawn on one answer ------------------------------------------------------------


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence the specification counts: the pieces of
    ``re.split(r"[.!?]+", text)`` that are non-empty after ``strip()``, leading and trailing
    space trimmed."""
    spans = []
    for match in _SENTENCE.finditer(text):
        piece = match.group()
        if piece.strip():
            start = match.start() + (len(piece) - len(piece.lstrip()))
            end = match.end() - (len(piece) - len(piece.rstrip()))
            spans.append((start, end))
    return spans


def _phrase_spans(text: str, phrase: str) -> list[tuple[int, int]] | None:
    """Where ``phrase`` occurs in ``text`` as the validator compares (``lower()`` of both);
    None when lowering changes the text's length, so positions cannot be mapped back."""
    low, needle = text.lower(), phrase.lower()
    if len(low) != len(text) or not needle:
        return None
    spans = []
    start = low.find(needle)
    while start >= 0:
        spans.append((start, start + len(needle)))
        start = low.find(needle, start + len(needle))
    return spans


def _segments(text: str, marks: Sequence[tuple[int, int, str, Any]]) -> list[dict[str, Any]]:
    """``text`` cut at every mark boundary: each piece with the sentence it is in and its marks."""
    cuts = {0, len(text)} | {cut for start, end, _, _ in marks for cut in (start, end)}
    points = sorted(c for c in cuts if 0 <= c <= len(text))
    # One sweep along the text: the marks that have started and not ended (a sentence, and at
    # most one occurrence of each phrase), so the cost grows with the pieces, not pieces x marks.
    order = sorted(range(len(marks)), key=lambda i: marks[i][0])
    active: list[int] = []
    next_mark = 0
    pieces = []
    for start, end in itertools.pairwise(points):
        if start == end:
            continue
        while next_mark < len(order) and marks[order[next_mark]][0] <= start:
            active.append(order[next_mark])
            next_mark += 1
        active = sorted(i for i in active if marks[i][1] >= end)  # in the marks' own order
        piece: dict[str, Any] = {"text": text[start:end], "sentence": None, "marks": []}
        for i in active:
            _, _, kind, value = marks[i]
            if kind == "sentence":
                piece["sentence"] = value
            else:
                piece["marks"].append(kind)
        pieces.append(piece)
    return pieces


def answer_checks(
    seed: Mapping[str, Any] | None,
    output: Any,
    *,
    max_chars: int = MAX_CHARS,
    finish_reason: str | None = None,
    messages: Sequence[Mapping[str, Any]] = (),
    repair_turn: str | None = None,
    rules: ExportOptions | None = None,
) -> dict[str, Any]:
    """The specification's checks drawn on one output: numbered sentences, each required
    phrase found (where) or missing, each banned phrase found, the length against the cap,
    whether it was cut off (``cut_off``: why, or None), and the validator's own verdict (the
    project's checks, with the answer's ``finish_reason`` and the ``messages`` and
    ``repair_turn`` it answered, so the two cannot disagree)."""
    rules = rules or ExportOptions(max_chars=max_chars)
    cut_off = finish_problem(finish_reason, max_tokens=rules.max_tokens)
    if not isinstance(output, str):
        return {
            "text": None,
            "segments": [],
            "sentences": 0,
            "required": [],
            "banned": [],
            "verdict": None,
            "cut_off": cut_off,
        }
    spans = sentence_spans(output)
    marks: list[tuple[int, int, str, Any]] = [(s, e, "sentence", i + 1) for i, (s, e) in enumerate(spans)]
    required_rows: list[dict[str, Any]] = []
    banned_rows: list[dict[str, Any]] = []
    for key, rows in (("required", required_rows), ("banned", banned_rows)):
        phrases = seed.get(key) if isinstance(seed, Mapping) else None
        for phrase in phrases if isinstance(phrases, list) else []:
            if not isinstance(phrase, str):
                continue
            found = _phrase_spans(output, phrase)
            present = phrase.lower() in output.lower()
            rows.append({"phrase": phrase, "found": present, "at": [s for s, _ in found or []]})
            marks.extend((s, e, key, phrase) for s, e in found or [])
    verdict = None
    bounds = None
    if isinstance(seed, Mapping):
        try:
            result = check_answer(
                SeedChecks.from_seed(seed, max_chars=max_chars),
                output,
                finish_reason=finish_reason,
                prompts=prompt_texts(messages, repair_turn),
                echo_words=rules.echo_words,
                max_tokens=rules.max_tokens,
            )
            verdict = result.as_record()
            bounds = [seed.get("min_sentences"), seed.get("max_sentences")]
        except DataError as exc:  # a seed the validator refuses: say so, draw the rest
            verdict = {"error": str(exc)}
    return {
        "text": output,
        "segments": _segments(output, marks),
        "sentences": len(spans),
        "bounds": bounds,
        "required": required_rows,
        "banned": banned_rows,
        "chars": len(output),
        "max_chars": max_chars,
        "verdict": verdict,
        "cut_off": cut_off,
    }


def _words(text: str) -> list[tuple[int, int, str]]:
    return [(m.start(), m.end(), m.group().lower()) for m in _WORD.finditer(text)]


def shared_shingles(
    a: str, b: str, size: int = _SHINGLE
) -> tuple[list[tuple[int, int]], list[tuple[int, int]], int]:
    """Word ``size``-grams two texts share: the character spans they cover in each, and how many."""
    wa, wb = _words(a), _words(b)

    def grams(words: list[tuple[int, int, str]]) -> dict[tuple[str, ...], list[int]]:
        out: dict[tuple[str, ...], list[int]] = {}
        for i in range(len(words) - size + 1):
            out.setdefault(tuple(w for _, _, w in words[i : i + size]), []).append(i)
        return out

    ga, gb = grams(wa), grams(wb)
    shared = ga.keys() & gb.keys()

    def cover(
        words: list[tuple[int, int, str]], grams_at: dict[tuple[str, ...], list[int]]
    ) -> list[tuple[int, int]]:
        hit = np.zeros(len(words), dtype=bool)
        for gram in shared:
            for i in grams_at[gram]:
                hit[i : i + size] = True
        spans: list[tuple[int, int]] = []
        for i in np.flatnonzero(hit).tolist():
            start, end, _ = words[i]
            if spans and hit[i - 1] and i > 0:
                spans[-1] = (spans[-1][0], end)
            else:
                spans.append((start, end))
        return spans

    return cover(wa, ga), cover(wb, gb), len(shared)


# -- the folder of runs ------------------------------------------------------------------------


class Runs:
    """The run and sweep directories found at start under ``root`` (a folder, or several), and
    their indexes.

    A run or sweep is named by its path inside its folder; with several folders, that path
    comes after the folder's label (its last part, or as many last parts as tell the folders
    apart): ``outputs/2026-05-01/12-00-00``, ``multirun/2026-05-01/12-30-00/0``. A folder
    given twice, or reached from two of them, is listed once."""

    def __init__(self, root: Path | Sequence[Path]) -> None:
        roots: list[Path] = []
        for given in [root] if isinstance(root, Path) else root:
            root = given.resolve()
            if not root.is_dir():
                raise DataError(f"--runs {given}: not a directory")
            if root not in roots:
                roots.append(root)
        if not roots:
            raise DataError("--runs: no folder given")
        #: The folders open, by label (resolved paths).
        self.folders = _labels(roots)
        self._runs: dict[str, Path] = {}
        self._sweeps: dict[str, Path] = {}
        self._run_names: dict[Path, str] = {}
        sweep_names: dict[Path, str] = {}
        listing: list[dict[str, Any]] = []
        for label, root in self.folders.items():
            for folder in _walk(root):
                sweep, run = _is_sweep(folder), _is_run(folder)
                if folder in self._run_names or folder in sweep_names or not (sweep or run):
                    continue  # listed from an earlier folder, or neither a run nor a sweep
                name = _name_of(root, folder, label if len(roots) > 1 else None)
                if (link := _linked(folder)) is not None:
                    log.warning("runs: %s is not listed: its %s is a symbolic link", name, link)
                    continue
                if sweep:
                    self._sweeps[name] = folder
                    sweep_names[folder] = name
                if run:
                    self._runs[name] = folder
                    self._run_names[folder] = name
                manifest = None if sweep else _read_json(folder / MANIFEST)
                completions = manifest.get("completions") if manifest else None
                figures = completions if isinstance(completions, dict) else {}
                listing.append(
                    {
                        "name": name,
                        "kind": "sweep" if sweep else "run",
                        "modified": _mtime(folder),
                        "in_sweep": sweep_names.get(folder.parent) if folder != root else None,
                        "validated": figures.get("validated"),
                        "pass_rate": figures.get("pass_rate"),
                    }
                )
        self._listing = sorted(listing, key=lambda r: (-r["modified"], r["name"]))
        # Arrow sets up its hash kernels on first use (~0.4 s): pay it at start, not on the first open.
        pc.is_in(pa.array([""]), value_set=pa.array([""]))
        self._open: OrderedDict[str, Future[RunIndex]] = OrderedDict()
        self._lock = threading.Lock()
        self._first_pages: dict[str, dict[str, Any]] = {}

    # -- listing and indexes -------------------------------------------------------------------

    def listing(self) -> list[dict[str, Any]]:
        """Every run and sweep found at start, newest first."""
        return list(self._listing)

    def _run_path(self, name: str) -> Path:
        return _listed("run", self._runs, name)

    def _build(self, name: str) -> Future[RunIndex]:
        """The run's index being built (on the build worker, one run at a time) or built."""
        path = self._run_path(name)
        with self._lock:
            future = self._open.get(name)
            if future is not None and future.done():
                self._first_pages.pop(name, None)
            if future is None or (future.done() and future.exception() is not None):
                future = _BUILDS.submit(RunIndex.build, path)
                self._open[name] = future
            self._open.move_to_end(name)
            while len(self._open) > MAX_OPEN:
                self._open.popitem(last=False)
            return future

    def index(self, name: str) -> RunIndex:
        """The run's index, built on first use (waits for a build under way)."""
        return self._build(name).result()

    def ready(self, name: str) -> RunIndex | None:
        """The run's index if it is built; else None (and its build is started)."""
        future = self._build(name)
        return future.result() if future.done() else None

    # -- one run ---------------------------------------------------------------------------------

    def run(self, name: str) -> dict[str, Any]:
        """What the run view opens with: counts, filter choices, charts and the report's figures.

        While the run's index is being built (a large run's first open) the figures come from
        the run's own report and ``indexing`` is true: the page asks again until it is false."""
        path = self._run_path(name)
        summary = _read_json(path / SUMMARY)
        manifest = _read_json(path / MANIFEST)
        with self._lock:
            started = name in self._open
        view = None if started else _early_view(path, summary)
        # the page asks for the first page next: read it before the build takes the cores
        if view is not None:
            first = _early_page(path, 0, _FIRST_PAGE)
            if first is not None:
                with self._lock:
                    self._first_pages[name] = first
        index = self.ready(name)
        if index is None and started:
            view = _early_view(path, summary)
        if index is not None or view is None:  # built, or nothing to open with but the index
            index = self.index(name)
            view = {"answers": index.n, "facets": index.facets(), "charts": index.charts()}
        return {
            "name": name,
            "indexing": index is None,
            **view,
            "report": summary,
            "template": manifest.get("template") if manifest else None,
            "max_chars": _max_chars(_config(path)),
        }

    def answers(self, name: str, query: Mapping[str, str]) -> dict[str, Any]:
        """One page of the run's answers; ``query`` holds the filters, ``sort``, ``desc``,
        ``offset`` and ``limit``."""
        filters = {k: v for k, v in query.items() if k in _FILTERS and v != ""}
        sort, descending = query.get("sort", "row") or "row", query.get("desc") == "true"
        offset, limit = query_int(query, "offset", 0), query_int(query, "limit", 50)
        index = self.ready(name)
        if index is None and not filters and sort == "row" and not descending and 1 <= limit <= MAX_PAGE:
            with self._lock:
                first = self._first_pages.get(name)
            if first is not None and offset == 0 and limit == _FIRST_PAGE:
                return first
            early = _early_page(self._run_path(name), offset, limit)
            if early is not None:  # the index is still being built: the rows in file order
                return early
        return self.index(name).page(filters, sort, descending, offset, limit)

    def answer(self, name: str, row: int, render: Renderer | None = None) -> dict[str, Any]:
        """One answer beside its prompt: the record, the seed, the messages, the checks on
        the text, the render trace (when ``render`` is given: the studio's renderer), other
        attempts of the same sample and a near-duplicate."""
        index = self.index(name)
        path = self._run_path(name)
        if not 0 <= row < index.n:
            raise StudioError(f"run {name!r} has answers 0 to {index.n - 1}, not {row}", status=404)
        record = _read_line(path / VALIDATED, index.offsets, row)
        if not isinstance(record, dict):
            raise StudioError(f"{VALIDATED} line {row + 1}: not a JSON object")
        seed_row = int(index.seed_row[row])
        seed = _read_object(path / SEEDS, index.seed_offsets, seed_row)
        prompt = _read_object(path / PROMPTS, index.prompt_offsets, seed_row)
        messages = prompt.get("messages") if prompt and prompt.get("id") == record.get("id") else None
        asked = tuple(m for m in messages or () if isinstance(m, Mapping))
        config = _config(path)
        max_chars = _max_chars(config)
        rules = _rules(config, max_chars)
        seed_id, sample = _text(record.get("id")), _sample_of(record)
        chain: list[dict[str, Any]] = []
        for other in index.row_of(seed_id, sample) if index.attempt is not None else ():
            if (found := _read_object(path / VALIDATED, index.offsets, other)) is not None:
                stored = found.get("repair_turn", found.get("repair"))
                chain.append({**found, "row": other, "repair_turn": stored})
        chain.sort(key=lambda item: _whole(item.get("attempt")) or 0)
        repair = _repair_turns(path, config, seed, chain, max_chars, rules, asked) if len(chain) > 1 else None
        turn = next((item["repair_turn"] for item in chain if item["row"] == row), None)
        finish = record.get("finish_reason")
        return {
            "run": name,
            "row": row,
            "record": record,
            "seed": seed,
            "messages": messages,
            "checks": answer_checks(
                seed,
                record.get("output"),
                max_chars=max_chars,
                finish_reason=finish if isinstance(finish, str) else None,
                messages=asked,
                repair_turn=turn if isinstance(turn, str) else None,
                rules=rules,
            ),
            "trace": _trace(config, seed, render),
            "attempts": [{k: item.get(k) for k in _ATTEMPT_FIELDS} for item in chain]
            if len(chain) > 1
            else [],
            "repair": repair,
            "duplicate": self._duplicate(index, path, seed_id, sample, record),
            "labels": index.label_list(row),
        }

    def _duplicate(
        self, index: RunIndex, path: Path, seed_id: str, sample: int, record: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        entry = index.duplicates.get((seed_id, sample))
        if entry is None:
            return None
        if entry.get("is_kept"):
            return {"cluster": _cluster_of(entry), "is_kept": True, "size": entry.get("size")}
        kept = _kept_of(entry)
        kept_rows = index.row_of(*kept) if kept is not None else []
        other = _read_object(path / VALIDATED, index.offsets, kept_rows[0]) if kept_rows else None
        text, kept_text = _text(record.get("output")), _text(other.get("output") if other else None)
        mine, theirs, shared = shared_shingles(text, kept_text)
        return {
            "cluster": _cluster_of(entry),
            "is_kept": False,
            "size": entry.get("size"),
            "match": entry.get("match"),
            "kept": {"id": kept[0], "sample": kept[1]} if kept else None,
            "kept_row": kept_rows[0] if kept_rows else None,
            "shared": shared,
            "similarity": entry.get("similarity", entry.get("jaccard")),
            "text": _segments(text, [(s, e, "shared", None) for s, e in mine]),
            "kept_text": _segments(kept_text, [(s, e, "shared", None) for s, e in theirs]),
        }

    # -- sweeps ---------------------------------------------------------------------------------

    def sweep(self, name: str) -> dict[str, Any]:
        """A sweep's report: axes, jobs (each with its run's name when it has one), the
        pass-rate grid over two axes, and the diversity heatmaps' names when they exist."""
        path = _listed("sweep", self._sweeps, name)
        report = _read_json(path / SWEEP_REPORT)
        if report is None:
            summary = _read_json(path / SWEEP_SUMMARY)
            if summary is None:
                raise StudioError(
                    f"sweep {name!r} has neither {SWEEP_REPORT} nor {SWEEP_SUMMARY}", status=404
                )
            from storyforge.sweep_report import build_report

            report = build_report(summary)
        return {
            "name": name,
            "axes": report.get("axes") or {},
            "labels": report.get("labels", []),
            "jobs": [
                {**job, "run": self._run_names.get(path / str(job.get("job")))}
                for job in report.get("jobs", [])
            ],
            "counts": report.get("counts"),
            "plots": [{"title": title, "file": file} for title, file in _other_plots(path, report)],
        }

    def sweep_plot(self, name: str, file: str) -> Path:
        """One of the sweep report's own plots besides the pass rate (a diversity heatmap, say),
        by its file name as the report lists it."""
        path = _listed("sweep", self._sweeps, name)
        if file not in {f for _, f in _other_plots(path, _read_json(path / SWEEP_REPORT) or {})}:
            raise StudioError(f"sweep {name!r} lists no plot {file!r}", status=404)
        return path / file

    def compare(self, a: str, b: str, offset: int = 0) -> dict[str, Any]:
        """Two runs answer by answer (same seed id and sample; the last attempt of each):
        counts of each pass/fail pair, and the answers that flipped from pass to fail with why."""
        ia, ib = self.index(a), self.index(b)
        pb = self._run_path(b)
        joined = _last_attempts(ia).join(
            _last_attempts(ib), keys=["id", "sample"], join_type="inner", left_suffix="_a", right_suffix="_b"
        )
        joined = joined.sort_by([("id", "ascending"), ("sample", "ascending")])
        pass_a = np.asarray(joined.column("passed_a"), dtype=bool)
        pass_b = np.asarray(joined.column("passed_b"), dtype=bool)
        flips = np.flatnonzero(pass_a & ~pass_b)
        rows_a = np.asarray(joined.column("row_a"), dtype=np.int64)
        rows_b = np.asarray(joined.column("row_b"), dtype=np.int64)
        listed = []
        for i in flips[offset : offset + MAX_FLIPS].tolist():
            rec_b = _read_object(pb / VALIDATED, ib.offsets, int(rows_b[i])) or {}
            listed.append(
                {
                    "id": rec_b.get("id"),
                    "sample": rec_b.get("sample"),
                    "row_a": int(rows_a[i]),
                    "row_b": int(rows_b[i]),
                    "labels": rec_b.get("labels"),
                    "reasons": rec_b.get("reasons"),
                }
            )
        flipped = ib.labels[rows_b[flips]]
        return {
            "a": a,
            "b": b,
            "shared": int(joined.num_rows),
            "pass_pass": int(np.count_nonzero(pass_a & pass_b)),
            "pass_fail": len(flips),
            "fail_pass": int(np.count_nonzero(~pass_a & pass_b)),
            "fail_fail": int(np.count_nonzero(~pass_a & ~pass_b)),
            "flip_labels": {
                name: hit
                for i, name in enumerate(ib.label_names)
                if (hit := int(np.count_nonzero(flipped >> i & 1)))
            },
            "flips": listed,
            "offset": offset,
        }


_NO_OFFSETS: Future[_Offsets] = Future()
_NO_OFFSETS.set_result((np.zeros(1, dtype=np.int64), None, None))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _twin_file(path: Path) -> pq.ParquetFile | None:
    twin = path / _TWIN
    if not twin.is_file() or (path / DUPLICATES).is_file():
        return None
    try:
        return pq.ParquetFile(twin)
    except (OSError, pa.ArrowException):
        return None


def _early_view(path: Path, summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Counts, filter choices and charts from the run's report and its twin's metadata, for the
    first open of a run whose index is still being built (None: the run has no such files)."""
    twin = _twin_file(path)
    if twin is None or summary is None:
        return None
    names = twin.schema_arrow.names
    labels = list(LABELS) + [k for k in summary.get("labels", {}) if k not in LABELS]
    by_theme = summary.get("by_theme") or {}
    by_split = summary.get("by_split") or {}
    return {
        "answers": twin.metadata.num_rows,
        "facets": {
            "labels": labels,
            "splits": sorted(by_split),
            "themes": sorted(by_theme),
            "finish_reasons": sorted(summary.get("finish_reasons") or {}),
            "has_attempt": "attempt" in names,
            "has_judge": "judge" in names or "verdict" in names,
            "has_cluster": False,
        },
        "charts": {
            "validated": summary.get("validated"),
            "passed": summary.get("passed"),
            "pass_rate": summary.get("pass_rate"),
            "labels": {k: summary.get("labels", {}).get(k, 0) for k in labels},
            "by_theme": by_theme,
            "by_split": by_split,
            "by_sentences": {},
            "by_sentence_range": {},
        },
    }


def _seeds_of(twin: Path, ids: pa.ChunkedArray) -> pa.Table | None:
    """The seeds (id, split, theme) of ``ids`` from the seeds' twin, read row group by row
    group until all are found (a run's answers follow its seeds' order, so an early page's
    seeds are in the first groups); a group whose id statistics rule them out is skipped."""
    wanted = {i for i in ids.to_pylist() if isinstance(i, str)}
    if not twin.is_file() or not wanted:
        return None
    value_set = pa.array(sorted(wanted), pa.string())
    parts = []
    try:
        seeds = pq.ParquetFile(twin)
        column = seeds.schema_arrow.get_field_index("id")
        for group in range(seeds.metadata.num_row_groups):
            stats = seeds.metadata.row_group(group).column(column).statistics
            if (
                stats is not None
                and stats.has_min_max
                and not any(stats.min <= i <= stats.max for i in wanted)
            ):
                continue
            part = seeds.read_row_group(group, columns=["id", "split", "theme"])
            part = part.filter(pc.is_in(part.column("id"), value_set=value_set))
            parts.append(part)
            wanted -= set(part.column("id").to_pylist())
            if not wanted:
                break
    except (OSError, pa.ArrowException, KeyError):
        return None
    return pa.concat_tables(parts) if parts else None


def _early_page(path: Path, offset: int, limit: int) -> dict[str, Any] | None:
    """Rows ``offset .. offset+limit`` in file order, read from the twin's row groups alone,
    with their seeds' split and theme (None when the run has no twin to read them from)."""
    twin = _twin_file(path)
    if twin is None:
        return None
    sizes = [twin.metadata.row_group(g).num_rows for g in range(twin.metadata.num_row_groups)]
    starts = list(itertools.accumulate(sizes, initial=0))
    groups = [g for g, size in enumerate(sizes) if starts[g] + size > offset and starts[g] < offset + limit]
    if not groups:  # past the last row
        return _page(twin.metadata.num_rows, offset, limit, "row", False, [])
    names = [c for c in _LIGHT if c in twin.schema_arrow.names]
    page = twin.read_row_groups(groups, columns=names).slice(offset - starts[groups[0]], limit)
    seeds = _seeds_of(path / _SEEDS_TWIN, page.column("id"))
    index = RunIndex.from_table(path, page, seeds, {}, _NO_OFFSETS)
    rows = index.rows(np.arange(index.n, dtype=np.int64))
    for row in rows:
        row["row"] += offset
    return _page(twin.metadata.num_rows, offset, limit, "row", False, rows)


def _other_plots(path: Path, report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(title, file) of each PNG the sweep report lists besides the pass-rate ones, when the
    file is there: a plain name in the sweep folder, never a path."""
    found = []
    for plot in report.get("plots") or []:
        if not isinstance(plot, Mapping):
            continue
        title, file = plot.get("title"), plot.get("file")
        if not isinstance(file, str) or not isinstance(title, str) or title.startswith("pass rate"):
            continue
        if "/" in file or "\\" in file or file.startswith(".") or not file.endswith(".png"):
            continue
        if _regular_file(path, file) is not None:  # checked again each time it is served
            found.append((title, file))
    return found


def _last_attempts(index: RunIndex) -> pa.Table:
    """(id, sample) -> the row and verdict of its last attempt, as an Arrow table."""
    rows = index.final_rows()
    return pa.table(
        {
            "id": pa.array(index.id.codes[rows]),
            "sample": pa.array(index.sample[rows]),
            "row": pa.array(rows),
            "passed": pa.array(index.passed[rows]),
        }
    )


def _config(path: Path) -> Mapping[str, Any]:
    """The run's config snapshot (``.hydra/config.yaml``); empty when it has none it can read."""
    try:
        data = load_run_file(path / HYDRA_CONFIG)
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, Mapping) else {}


def _max_chars(config: Mapping[str, Any]) -> int:
    constraints = config.get("constraints")
    value = _whole(constraints.get("max_chars")) if isinstance(constraints, Mapping) else None
    return value if value is not None and value > 0 else MAX_CHARS


def _rules(config: Mapping[str, Any], max_chars: int) -> ExportOptions:
    """The answer checks' settings of the run (its config snapshot), else the defaults."""
    from storyforge.config.exports import export_options

    provider = config.get("provider")
    cap = _whole(provider.get("max_tokens")) if isinstance(provider, Mapping) else None
    try:
        return export_options(
            {"constraints": config.get("constraints") or {}},
            max_tokens=cap if cap is not None and cap > 0 else None,
        )
    except StoryforgeError:
        return ExportOptions(max_chars=max_chars)


def _trace(
    config: Mapping[str, Any], seed: Mapping[str, Any] | None, render: Renderer | None
) -> dict[str, Any]:
    """The render trace of the seed's instruction under the run's own template (its
    ``.hydra/config.yaml`` snapshot), or why there is none."""
    template = config.get("template")
    if seed is None:
        return {"available": False, "why": "the seed of this answer is not in the run's prompts_seed.jsonl"}
    if not isinstance(template, Mapping) or render is None:
        return {"available": False, "why": "the run has no template snapshot (.hydra/config.yaml)"}
    from storyforge.store import check_template

    try:
        checked = check_template(dict(template), require_known_task=True)
        rendered = render(checked, seed, None)
    except (StoryforgeError, StudioError, ValueError, TypeError) as exc:  # say why, show the rest
        return {"available": False, "why": f"the run's template does not render here: {exc}"}
    content = rendered["messages"][-1]["content"] if rendered["messages"] else None
    return {
        "available": True,
        "matches": content == seed.get("instruction"),
        "slots": rendered["slots"],
        "layout": rendered["layout"],
    }


def _repair_turns(
    path: Path,
    config: Mapping[str, Any],
    seed: Mapping[str, Any] | None,
    chain: list[dict[str, Any]],
    max_chars: int,
    rules: ExportOptions | None = None,
    messages: tuple[Mapping[str, Any], ...] = (),
) -> dict[str, Any]:
    """Give each attempt after the first of ``chain`` (its records, in attempt order) the
    ``repair_turn`` it was sent with: the one the run stored, else the one the regeneration job
    renders from the run's repair template and the attempt before's failures (None without
    feedback). How the run asked again is read from its manifest's ``regeneration`` figures
    and its config snapshot's ``regenerate`` node. Says whether feedback was on and, when a
    turn cannot be rendered, why."""
    from storyforge.config.regenerate import regenerate_settings
    from storyforge.jobs.regenerate import repair_turn
    from storyforge.tasks.tinystories.repair import RepairRenderer

    def said(feedback: bool | None, source: str | None = None, why: str | None = None) -> dict[str, Any]:
        return {"feedback": feedback, "source": source, "why": why}

    if all(isinstance(item.get("repair_turn"), str) for item in chain[1:]):
        return said(True, "stored")
    figures = (_read_json(path / MANIFEST) or {}).get("regeneration")
    figures = figures if isinstance(figures, dict) else {}
    try:
        settings = regenerate_settings(config) if "regenerate" in config else None
        feedback = figures.get("feedback", settings.feedback if settings is not None else None)
        if feedback is None:
            return said(None, why="neither the manifest nor a config snapshot says how the run asked again")
        if feedback is False:
            return said(False, why="regenerate.feedback=false: the prompt was sent again")
        if seed is None:
            raise DataError("the seed of this answer is not in the run's prompts_seed.jsonl")
        renderer = RepairRenderer.load(settings.template_file if settings is not None else None)
        name = figures.get("template")
        if isinstance(name, str) and name != renderer.name:
            raise DataError(f"the run's repair template {name!r} is not here (only {renderer.name!r} is)")
        for before, item in itertools.pairwise(chain):
            if not isinstance(item.get("repair_turn"), str):
                judge = before.get("judge")
                item["repair_turn"] = repair_turn(
                    seed,
                    before,
                    renderer,
                    max_chars=max_chars,
                    verdict=judge if isinstance(judge, dict) else None,
                    rules=rules,
                    messages=messages,
                )
    except (StoryforgeError, ValueError, TypeError) as exc:  # say why, show the attempts
        return said(True, why=f"the repair turn does not render here: {exc}")
    return said(True, "rendered")
