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

import itertools
import json
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
from storyforge.studio.errors import StudioError, query_int

if TYPE_CHECKING:
    from storyforge.store import CheckedTemplate

    Renderer = Callable[[CheckedTemplate, Mapping[str, Any], int | None], dict[str, Any]]
from storyforge.runfiles import (
    DUPLICATES,
    MANIFEST,
    PROMPTS,
    SEEDS,
    SUMMARY,
    SWEEP_REPORT,
    SWEEP_SUMMARY,
    VALIDATED,
)
from storyforge.tasks.tinystories.exports import ExportOptions
from storyforge.tasks.tinystories.validate import (
    LABELS,
    MAX_CHARS,
    SeedChecks,
    check_answer,
    finish_problem,
    prompt_texts,
)

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
    "validated.parquet",
    SEEDS,
    "prompts_seed.parquet",
    PROMPTS,
    DUPLICATES,
    MANIFEST,
    SUMMARY,
    ".hydra/config.yaml",
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
    path = folder
    for part in Path(name).parts:
        path = path / part
        if path.is_symlink():
            return True
    return False


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


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


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


def _run_offsets(path: Path) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
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


def _read_line(path: Path, offsets: np.ndarray, row: int) -> Any:
    with path.open("rb") as handle:
        handle.seek(int(offsets[row]))
        raw = handle.read(int(offsets[row + 1] - offsets[row]))
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise StudioError(BadLine.of(exc, row + 1).at(path.name)) from None


def _codes(values: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, list[Any]]:
    """Values as int32 codes whose order is the values' order, and the sorted distinct values
    (null is code -1)."""
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
    codes = np.where(nulls, -1, codes).astype(np.int32)
    return codes, dictionary.take(pa.array(order)).to_pylist()


def _column(table: pa.Table, name: str) -> pa.ChunkedArray | None:
    return table.column(name) if name in table.column_names else None


def _light_table(run: Path) -> pa.Table:
    """The columns of ``validated`` the table shows, from the Parquet twin or else the JSONL."""
    wanted = _LIGHT
    twin = run / "validated.parquet"
    if twin.is_file():
        try:
            schema = pq.read_schema(twin)
            return pq.read_table(twin, columns=[c for c in wanted if c in schema.names])
        except (OSError, pa.ArrowException):
            pass  # a broken twin: the JSONL is the record
    rows: dict[str, list[Any]] = {c: [] for c in wanted}
    with (run / VALIDATED).open("rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                raise StudioError(BadLine.of(exc, number).at(f"{run.name}/{VALIDATED}")) from None
            if not isinstance(record, dict):
                raise StudioError(f"{run.name}/{VALIDATED}:{number}: not a JSON object")
            for column, values in rows.items():
                values.append(record.get(column))
    present = {c: v for c, v in rows.items() if any(x is not None for x in v) or c in ("id", "passed")}
    return pa.table({c: pa.array(v) for c, v in present.items()})


def _seed_table(run: Path) -> pa.Table | None:
    twin = run / "prompts_seed.parquet"
    try:
        if twin.is_file():
            names = pq.read_schema(twin).names
            return pq.read_table(twin, columns=[c for c in _SEED_COLUMNS if c in names or c == "id"])
    except (OSError, pa.ArrowException, KeyError):
        pass
    path = run / SEEDS
    if not path.is_file():
        return None
    columns: dict[str, list[Any]] = {c: [] for c in _SEED_COLUMNS}
    with path.open("rb") as handle:
        for raw in handle:
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                record = {}
            record = record if isinstance(record, dict) else {}
            for column, values in columns.items():
                value = record.get(column)
                if column.endswith("_sentences"):  # a bound only when it is a whole number
                    value = value if isinstance(value, int) and not isinstance(value, bool) else None
                values.append(value)
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
    with path.open("rb") as handle:
        for raw in handle:
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(record, dict):
                continue
            members = record.get("members")
            if isinstance(members, list):
                for member in members:
                    if (
                        isinstance(member, dict)
                        and isinstance(member.get("id"), str)
                        and "source" not in member
                    ):
                        entry = {**member, "cluster": record.get("cluster"), "size": record.get("size")}
                        entry["is_kept"] = member.get("kept") is True
                        entry["kept"] = record.get("kept")
                        found[(member["id"], _sample_of(member))] = entry
            elif isinstance(record.get("id"), str):
                found[(record["id"], _sample_of(record))] = {**record, "is_kept": False}
    return found


def _sample_of(record: Mapping[str, Any]) -> int:
    sample = record.get("sample", 0)
    return sample if isinstance(sample, int) and not isinstance(sample, bool) else 0


def _cluster_of(record: Mapping[str, Any]) -> str | None:
    for key in ("cluster", "cluster_id"):
        value = record.get(key)
        if value is not None:
            return str(value)
    return None


def _kept_of(record: Mapping[str, Any]) -> tuple[str, int] | None:
    """The (id, sample) of the kept member a near-duplicate record names, in the shapes it may take."""
    for key in ("kept", "duplicate_of", "of", "nearest"):
        value = record.get(key)
        if isinstance(value, Mapping) and isinstance(value.get("id"), str):
            sample = value.get("sample", 0)
            return value["id"], sample if isinstance(sample, int) else 0
        if isinstance(value, str):
            return value, 0
    kept_id = record.get("kept_id")
    if isinstance(kept_id, str):
        sample = record.get("kept_sample", 0)
        return kept_id, sample if isinstance(sample, int) else 0
    return None


@dataclass(slots=True, kw_only=True)
class RunIndex:
    """One run's answers as arrays: built once, then every page is a mask, an order and a slice."""

    path: Path
    n: int
    ids: np.ndarray
    id_values: list[str]
    sample: np.ndarray
    attempt: np.ndarray | None
    passed: np.ndarray
    labels: np.ndarray  # bit i set = the answer carries label_names[i]
    label_names: list[str]
    chars: np.ndarray
    sentences: np.ndarray
    finish: np.ndarray
    finish_values: list[Any]
    split: np.ndarray
    split_values: list[Any]
    theme: np.ndarray
    theme_values: list[Any]
    bounds: np.ndarray  # the code of the seed's "min..max" sentence range
    bounds_values: list[Any]
    seed_row: np.ndarray
    judge: np.ndarray | None
    judge_values: list[Any]
    cluster: np.ndarray | None
    cluster_values: list[Any]
    _offsets: Future[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]]
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
        offsets: Future[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]],
    ) -> RunIndex:
        """The index of the answers in ``table`` (the whole run, or one page of it)."""
        n = table.num_rows
        ids, id_values = _codes(table.column("id").cast(pa.string()))

        def ints(name: str, default: int = 0) -> np.ndarray:
            column = _column(table, name)
            if column is None:
                return np.full(n, default, dtype=np.int64)
            return np.asarray(column.cast(pa.int64()).fill_null(default), dtype=np.int64)

        label_names = list(LABELS)
        bits = np.zeros(n, dtype=np.int64)
        column = _column(table, "labels")
        if column is not None and n:
            flat = pc.list_flatten(column)
            lengths = np.asarray(pc.list_value_length(column).fill_null(0), dtype=np.int64)
            owner = np.repeat(np.arange(n, dtype=np.int64), lengths)
            codes, values = _codes(flat.cast(pa.string()))
            for value in values:
                if value not in label_names:
                    label_names.append(value)
            where = np.asarray([label_names.index(v) for v in values], dtype=np.int64)
            if len(codes):
                np.bitwise_or.at(bits, owner, np.left_shift(1, where[codes]))
        finish_column = _column(table, "finish_reason")
        finish, finish_values = _codes(
            finish_column.cast(pa.string()) if finish_column is not None else pa.nulls(n, pa.string())
        )
        split = theme = bounds = seed_row = np.full(n, -1, dtype=np.int64)
        split_values: list[Any] = []
        theme_values: list[Any] = []
        bounds_values: list[Any] = []
        if seeds is not None and n:
            found = pc.index_in(
                table.column("id").cast(pa.string()), value_set=seeds.column("id").combine_chunks()
            )
            seed_row = np.asarray(found.fill_null(-1), dtype=np.int64)
            seed_split, split_values = _codes(seeds.column("split").cast(pa.string()))
            seed_theme, theme_values = _codes(seeds.column("theme").cast(pa.string()))
            seed_bounds, bounds_values = _codes(_sentence_range(seeds))
            safe = np.maximum(seed_row, 0)
            split = np.where(seed_row >= 0, seed_split[safe] if len(seed_split) else -1, -1)
            theme = np.where(seed_row >= 0, seed_theme[safe] if len(seed_theme) else -1, -1)
            bounds = np.where(seed_row >= 0, seed_bounds[safe] if len(seed_bounds) else -1, -1)
        judge = None
        judge_values: list[Any] = []
        for name in ("judge", "verdict"):
            column = _column(table, name)
            if column is not None:
                if pa.types.is_struct(column.type):
                    continue
                judge, judge_values = _codes(column.cast(pa.string()))
                break
        cluster = None
        cluster_values: list[Any] = []
        if duplicates and n:
            # each member's cluster; a repeat that was dropped also carries the near_duplicate label
            names = [id_values[c] if c >= 0 else None for c in ids.tolist()]
            entries = [
                duplicates.get((i, s)) if i is not None else None
                for i, s in zip(names, ints("sample").tolist(), strict=True)
            ]
            cluster, cluster_values = _codes(
                pa.array([_cluster_of(e) if e is not None else None for e in entries], pa.string())
            )
            dropped = np.asarray([e is not None and not e.get("is_kept") for e in entries], dtype=bool)
            if dropped.any():
                if NEAR_DUPLICATE not in label_names:
                    label_names.append(NEAR_DUPLICATE)
                bits[dropped] |= 1 << label_names.index(NEAR_DUPLICATE)
        attempt = ints("attempt", 0) if "attempt" in table.column_names else None
        return cls(
            path=path,
            n=n,
            ids=ids,
            id_values=id_values,
            sample=ints("sample"),
            attempt=attempt,
            passed=np.asarray(table.column("passed").fill_null(False), dtype=bool)
            if n
            else np.zeros(0, bool),
            labels=bits,
            label_names=label_names,
            chars=ints("chars", -1),
            sentences=ints("sentence_count", -1),
            finish=finish,
            finish_values=finish_values,
            split=split,
            split_values=split_values,
            theme=theme,
            theme_values=theme_values,
            bounds=bounds,
            bounds_values=bounds_values,
            seed_row=seed_row,
            judge=judge,
            judge_values=judge_values,
            cluster=cluster,
            cluster_values=cluster_values,
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
        column = {
            "row": None,
            "id": self.ids,
            "sample": self.sample,
            "attempt": self.attempt,
            "passed": self.passed,
            "labels": self.labels,
            "chars": self.chars,
            "sentences": self.sentences,
            "finish_reason": self.finish,
            "theme": self.theme,
            "split": self.split,
            "judge": self.judge,
            "cluster": self.cluster,
        }[key]
        result = rows if column is None else np.lexsort((rows, column)).astype(np.int64)
        with self._lock:
            self._orders[key] = result
        return result

    def mask(self, filters: Mapping[str, str]) -> np.ndarray | None:
        """Rows kept by ``filters`` (None: every row)."""
        keep: np.ndarray | None = None

        def both(part: np.ndarray) -> None:
            nonlocal keep
            keep = part if keep is None else keep & part

        for key, value in filters.items():
            if key == "passed":
                both(self.passed == (value == "true"))
            elif key == "label":
                if value == "none":
                    both(self.labels == 0)
                elif value in self.label_names:
                    both((self.labels & (1 << self.label_names.index(value))) != 0)
                else:
                    both(np.zeros(self.n, dtype=bool))
            elif key in ("split", "theme", "finish_reason"):
                codes, values = {
                    "split": (self.split, self.split_values),
                    "theme": (self.theme, self.theme_values),
                    "finish_reason": (self.finish, self.finish_values),
                }[key]
                both(codes == values.index(value) if value in values else np.zeros(self.n, dtype=bool))
            elif key == "id":
                code = _find(self.id_values, value)
                both(self.ids == code if code is not None else np.zeros(self.n, dtype=bool))
            else:
                raise StudioError(
                    f"unknown filter {key!r}; known: passed, label, split, theme, finish_reason, id"
                )
        return keep

    def rows(self, selected: np.ndarray) -> list[dict[str, Any]]:
        """The table rows of the answers at ``selected`` (row numbers)."""
        out = []
        for row in selected.tolist():
            bits = int(self.labels[row])
            out.append(
                {
                    "row": row,
                    "id": _value(self.id_values, self.ids[row]),
                    "sample": int(self.sample[row]),
                    "attempt": int(self.attempt[row]) if self.attempt is not None else None,
                    "passed": bool(self.passed[row]),
                    "labels": [name for i, name in enumerate(self.label_names) if bits >> i & 1],
                    "judge": _value(self.judge_values, self.judge[row]) if self.judge is not None else None,
                    "cluster": _value(self.cluster_values, self.cluster[row])
                    if self.cluster is not None
                    else None,
                    "chars": _maybe(self.chars[row]),
                    "sentences": _maybe(self.sentences[row]),
                    "finish_reason": _value(self.finish_values, self.finish[row]),
                    "split": _value(self.split_values, self.split[row]),
                    "theme": _value(self.theme_values, self.theme[row]),
                }
            )
        return out

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
        return {
            "total": total,
            "offset": offset,
            "limit": limit,
            "sort": sort,
            "descending": descending,
            "rows": self.rows(selected),
        }

    def facets(self) -> dict[str, Any]:
        """What the filters can choose from, and whether the optional columns exist."""
        return {
            "labels": self.label_names,
            "splits": [v for v in self.split_values if v is not None],
            "themes": [v for v in self.theme_values if v is not None],
            "finish_reasons": [v for v in self.finish_values if v is not None],
            "has_attempt": self.attempt is not None,
            "has_judge": self.judge is not None,
            "has_cluster": self.cluster is not None,
        }

    def final_rows(self) -> np.ndarray:
        """The row of each answer's last attempt (every row when the run has no attempts)."""
        rows = np.arange(self.n, dtype=np.int64)
        if self.attempt is None or not self.n:
            return rows
        order = np.lexsort((self.attempt, self.sample, self.ids))
        ids, samples = self.ids[order], self.sample[order]
        last = np.ones(len(order), dtype=bool)
        last[:-1] = (ids[1:] != ids[:-1]) | (samples[1:] != samples[:-1])
        return np.sort(order[last])

    def charts(self) -> dict[str, Any]:
        """Counts by label, pass rate by theme and by sentence count, as ``report/summary.json``
        counts them: over each answer's last attempt when the run regenerated answers."""
        rows = self.final_rows()
        bits, passed_rows = self.labels[rows], self.passed[rows]
        labels = {name: int(np.count_nonzero(bits >> i & 1)) for i, name in enumerate(self.label_names)}
        by_theme = _rates(self.theme[rows], self.theme_values, passed_rows)
        by_split = _rates(self.split[rows], self.split_values, passed_rows)
        sentences = self.sentences[rows]
        counted = sentences >= 0
        # by the seed's allowed range, over the answers with text (as report/ counts its bounds)
        by_range = _rates(np.where(counted, self.bounds[rows], -1), self.bounds_values, passed_rows)
        by_range = dict(sorted(by_range.items(), key=lambda item: [int(b) for b in item[0].split("..")]))
        by_sentences: dict[str, dict[str, Any]] = {}
        if np.any(counted):
            values, inverse = np.unique(sentences[counted], return_inverse=True)
            totals = np.bincount(inverse)
            passes = np.bincount(inverse, weights=passed_rows[counted].astype(np.int64))
            for value, total, ok in zip(values.tolist(), totals.tolist(), passes.tolist(), strict=True):
                by_sentences[str(value)] = {
                    "validated": int(total),
                    "passed": int(ok),
                    "pass_rate": round(ok / total, 4) if total else None,
                }
        passed = int(np.count_nonzero(passed_rows))
        return {
            "validated": len(rows),
            "passed": passed,
            "pass_rate": round(passed / len(rows), 4) if len(rows) else None,
            "labels": labels,
            "by_theme": by_theme,
            "by_split": by_split,
            "by_sentences": by_sentences,
            "by_sentence_range": by_range,
        }

    def row_of(self, seed_id: str, sample: int) -> list[int]:
        code = _find(self.id_values, seed_id)
        if code is None:
            return []
        return np.flatnonzero((self.ids == code) & (self.sample == sample)).tolist()


def _find(values: list[Any], value: str) -> int | None:
    """The code of ``value`` in sorted distinct ``values`` (binary search), or None."""
    lo, hi = 0, len(values)
    while lo < hi:
        mid = (lo + hi) // 2
        current = values[mid]
        if current is None or current < value:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < len(values) and values[lo] == value else None


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


def _value(values: list[Any], code: Any) -> Any:
    code = int(code)
    return values[code] if 0 <= code < len(values) else None


def _maybe(value: Any) -> int | None:
    value = int(value)
    return value if value >= 0 else None


def _rates(codes: np.ndarray, values: list[Any], passed: np.ndarray) -> dict[str, dict[str, Any]]:
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
    cuts = {0, len(text)}
    for start, end, _, _ in marks:
        cuts.update((start, end))
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


@dataclass(slots=True, kw_only=True)
class Runs:
    """The run and sweep directories found at start under ``root`` (a folder, or several), and
    their indexes.

    A run or sweep is named by its path inside its folder; with several folders, that path
    comes after the folder's label (its last part, or as many last parts as tell the folders
    apart): ``outputs/2026-05-01/12-00-00``, ``multirun/2026-05-01/12-30-00/0``. A folder
    given twice, or reached from two of them, is listed once."""

    root: Path | Sequence[Path]
    #: The folders open, by label (resolved paths).
    folders: dict[str, Path] = field(init=False)
    _runs: dict[str, Path] = field(init=False, repr=False)
    _sweeps: dict[str, Path] = field(init=False, repr=False)
    _run_names: dict[Path, str] = field(init=False, repr=False)
    _listing: list[dict[str, Any]] = field(init=False, repr=False)
    _open: OrderedDict[str, Future[RunIndex]] = field(init=False, repr=False)
    _first_pages: dict[str, dict[str, Any]] = field(init=False, repr=False)
    _lock: threading.Lock = field(init=False, repr=False)

    def __post_init__(self) -> None:
        roots: list[Path] = []
        for given in [self.root] if isinstance(self.root, Path) else self.root:
            root = given.resolve()
            if not root.is_dir():
                raise DataError(f"--runs {given}: not a directory")
            if root not in roots:
                roots.append(root)
        if not roots:
            raise DataError("--runs: no folder given")
        self.folders = _labels(roots)
        self._runs, self._sweeps, self._run_names = {}, {}, {}
        sweep_names: dict[Path, str] = {}
        listing = []
        for label, root in self.folders.items():
            for folder in _walk(root):
                if folder in self._run_names or folder in sweep_names:
                    continue  # listed from an earlier folder
                name = _name_of(root, folder, label if len(roots) > 1 else None)
                if (_is_sweep(folder) or _is_run(folder)) and (link := _linked(folder)) is not None:
                    log.warning("runs: %s is not listed: its %s is a symbolic link", name, link)
                    continue
                sweep = _is_sweep(folder)
                if sweep:
                    self._sweeps[name] = folder
                    sweep_names[folder] = name
                if _is_run(folder):
                    self._runs[name] = folder
                    self._run_names[folder] = name
                if sweep or _is_run(folder):
                    manifest = _read_json(folder / MANIFEST) if not sweep else None
                    completions = manifest.get("completions") if isinstance(manifest, dict) else None
                    listing.append(
                        {
                            "name": name,
                            "kind": "sweep" if sweep else "run",
                            "modified": _mtime(folder),
                            "in_sweep": sweep_names.get(folder.parent) if folder != root else None,
                            "validated": completions.get("validated")
                            if isinstance(completions, dict)
                            else None,
                            "pass_rate": completions.get("pass_rate")
                            if isinstance(completions, dict)
                            else None,
                        }
                    )
        self._listing = sorted(listing, key=lambda r: (-r["modified"], r["name"]))
        # Arrow sets up its hash kernels on first use (~0.4 s): pay it at start, not on the first open.
        pc.is_in(pa.array([""]), value_set=pa.array([""]))
        self._open = OrderedDict()
        self._lock = threading.Lock()
        self._first_pages = {}

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
        view = None
        if not started and (early := _early_view(path, summary if isinstance(summary, dict) else None)):
            # the page asks for the first page next: read it before the build takes the cores
            first = _early_page(path, 0, _FIRST_PAGE)
            if first is not None:
                with self._lock:
                    self._first_pages[name] = first
            view = early
        index = self.ready(name)
        if index is None and view is None:
            view = _early_view(path, summary if isinstance(summary, dict) else None)
        if index is not None or view is None:  # built, or nothing to open with but the index
            index = self.index(name)
            view = {"answers": index.n, "facets": index.facets(), "charts": index.charts()}
        return {
            "name": name,
            "indexing": index is None,
            **view,
            "report": summary if isinstance(summary, dict) else None,
            "template": manifest.get("template") if isinstance(manifest, dict) else None,
            "max_chars": _max_chars(path),
        }

    def answers(self, name: str, query: Mapping[str, str]) -> dict[str, Any]:
        """One page of the run's answers; ``query`` holds the filters, ``sort``, ``desc``,
        ``offset`` and ``limit``."""
        filters = {
            k: v
            for k, v in query.items()
            if k in ("passed", "label", "split", "theme", "finish_reason", "id") and v != ""
        }
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
        seed = prompt = None
        seed_row = int(index.seed_row[row])
        if seed_row >= 0 and index.seed_offsets is not None and seed_row < len(index.seed_offsets) - 1:
            seed = _read_line(path / SEEDS, index.seed_offsets, seed_row)
        seed = seed if isinstance(seed, dict) else None
        if seed_row >= 0 and index.prompt_offsets is not None and seed_row < len(index.prompt_offsets) - 1:
            prompt = _read_line(path / PROMPTS, index.prompt_offsets, seed_row)
            if not isinstance(prompt, dict) or prompt.get("id") != record.get("id"):
                prompt = None
        max_chars = _max_chars(path)
        rules = _rules(path, max_chars)
        messages = prompt.get("messages") if isinstance(prompt, dict) else None
        asked = tuple(m for m in messages or () if isinstance(m, Mapping))
        attempts: list[dict[str, Any]] = []
        sample_value, id_value = record.get("sample"), record.get("id")
        sample = sample_value if isinstance(sample_value, int) else 0
        seed_id = id_value if isinstance(id_value, str) else ""
        repair: dict[str, Any] | None = None
        if index.attempt is not None:
            chain: list[dict[str, Any]] = []
            for other in index.row_of(seed_id, sample):
                other_record = _read_line(path / VALIDATED, index.offsets, other)
                if isinstance(other_record, dict):
                    stored = other_record.get("repair_turn", other_record.get("repair"))
                    chain.append({**other_record, "row": other, "repair_turn": stored})
            chain.sort(key=_attempt_number)
            if len(chain) > 1:
                repair = _repair_turns(path, seed, chain, max_chars, rules, asked)
            for item in chain:
                attempts.append(
                    {
                        k: item.get(k)
                        for k in (
                            "row",
                            "attempt",
                            "passed",
                            "labels",
                            "reasons",
                            "output",
                            "chain",
                            "repair_turn",
                        )
                    }
                )
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
                finish_reason=finish if isinstance(finish := record.get("finish_reason"), str) else None,
                messages=asked,
                repair_turn=next(
                    (
                        a["repair_turn"]
                        for a in attempts
                        if a["row"] == row and isinstance(a["repair_turn"], str)
                    ),
                    None,
                ),
                rules=rules,
            ),
            "trace": _trace(path, seed, render),
            "attempts": attempts if len(attempts) > 1 else [],
            "repair": repair,
            "duplicate": self._duplicate(index, path, seed_id, sample, record),
            "labels": index.rows(np.asarray([row], dtype=np.int64))[0]["labels"],
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
        other = None
        if kept is not None:
            rows = index.row_of(*kept)
            if rows:
                found = _read_line(path / VALIDATED, index.offsets, rows[0])
                other = found if isinstance(found, dict) else None
        output = record.get("output")
        text = output if isinstance(output, str) else ""
        kept_output = other.get("output") if other else None
        kept_text = kept_output if isinstance(kept_output, str) else ""
        mine, theirs, shared = shared_shingles(text, kept_text)
        return {
            "cluster": _cluster_of(entry),
            "is_kept": False,
            "size": entry.get("size"),
            "match": entry.get("match"),
            "kept": {"id": kept[0], "sample": kept[1]} if kept else None,
            "kept_row": index.row_of(*kept)[0] if kept and index.row_of(*kept) else None,
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
        if not isinstance(report, dict):
            summary = _read_json(path / SWEEP_SUMMARY)
            if not isinstance(summary, dict):
                raise StudioError(
                    f"sweep {name!r} has neither {SWEEP_REPORT} nor {SWEEP_SUMMARY}", status=404
                )
            from storyforge.sweep_report import build_report

            report = build_report(summary)
        jobs = []
        for job in report.get("jobs", []):
            jobs.append({**job, "run": self._run_names.get(path / str(job.get("job")))})
        axes = report.get("axes") or {}
        return {
            "name": name,
            "axes": axes,
            "labels": report.get("labels", []),
            "jobs": jobs,
            "counts": report.get("counts"),
            "plots": [{"title": title, "file": file} for title, file in _other_plots(path, report)],
        }

    def sweep_plot(self, name: str, file: str) -> Path:
        """One of the sweep report's own plots besides the pass rate (a diversity heatmap, say),
        by its file name as the report lists it."""
        path = _listed("sweep", self._sweeps, name)
        report = _read_json(path / SWEEP_REPORT)
        listed = {f for _, f in _other_plots(path, report if isinstance(report, dict) else {})}
        if file not in listed:
            raise StudioError(f"sweep {name!r} lists no plot {file!r}", status=404)
        return path / file

    def compare(self, a: str, b: str, offset: int = 0) -> dict[str, Any]:
        """Two runs answer by answer (same seed id and sample; the last attempt of each):
        counts of each pass/fail pair, and the answers that flipped from pass to fail with why."""
        ia, ib = self.index(a), self.index(b)
        pb = self._run_path(b)
        ta = _last_attempts(ia)
        tb = _last_attempts(ib)
        joined = ta.join(tb, keys=["id", "sample"], join_type="inner", left_suffix="_a", right_suffix="_b")
        joined = joined.sort_by([("id", "ascending"), ("sample", "ascending")])
        pass_a = np.asarray(joined.column("passed_a"), dtype=bool)
        pass_b = np.asarray(joined.column("passed_b"), dtype=bool)
        flips = np.flatnonzero(pass_a & ~pass_b)
        rows_a = np.asarray(joined.column("row_a"), dtype=np.int64)
        rows_b = np.asarray(joined.column("row_b"), dtype=np.int64)
        listed = []
        for i in flips[offset : offset + MAX_FLIPS].tolist():
            rec_b = _read_line(pb / VALIDATED, ib.offsets, int(rows_b[i]))
            rec_b = rec_b if isinstance(rec_b, dict) else {}
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
        labels: dict[str, int] = {}
        for name in ib.label_names:
            bit = 1 << ib.label_names.index(name)
            hit = int(np.count_nonzero(ib.labels[rows_b[flips]] & bit)) if len(flips) else 0
            if hit:
                labels[name] = hit
        return {
            "a": a,
            "b": b,
            "shared": int(joined.num_rows),
            "pass_pass": int(np.count_nonzero(pass_a & pass_b)),
            "pass_fail": len(flips),
            "fail_pass": int(np.count_nonzero(~pass_a & pass_b)),
            "fail_fail": int(np.count_nonzero(~pass_a & ~pass_b)),
            "flip_labels": labels,
            "flips": listed,
            "offset": offset,
        }


_NO_OFFSETS: Future[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]] = Future()
_NO_OFFSETS.set_result((np.zeros(1, dtype=np.int64), None, None))


def _twin_file(path: Path) -> pq.ParquetFile | None:
    twin = path / "validated.parquet"
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
    total = twin.metadata.num_rows
    start = 0
    groups = []
    for group in range(twin.metadata.num_row_groups):
        rows = twin.metadata.row_group(group).num_rows
        if start + rows > offset and start < offset + limit:
            groups.append(group)
        elif start >= offset + limit:
            break
        start += rows
    body = {"total": total, "offset": offset, "limit": limit, "sort": "row", "descending": False}
    if not groups:  # past the last row
        return {**body, "rows": []}
    first = sum(twin.metadata.row_group(g).num_rows for g in range(groups[0]))
    names = [c for c in _LIGHT if c in twin.schema_arrow.names]
    page = twin.read_row_groups(groups, columns=names).slice(offset - first, limit)
    seeds = _seeds_of(path / "prompts_seed.parquet", page.column("id"))
    index = RunIndex.from_table(path, page, seeds, {}, _NO_OFFSETS)
    rows = index.rows(np.arange(index.n, dtype=np.int64))
    for row in rows:
        row["row"] += offset
    return {
        "total": total,
        "offset": offset,
        "limit": limit,
        "sort": "row",
        "descending": False,
        "rows": rows,
    }


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


def _attempt_number(attempt: Mapping[str, Any]) -> int:
    value = attempt.get("attempt")
    return value if isinstance(value, int) else 0


def _last_attempts(index: RunIndex) -> pa.Table:
    """(id, sample) -> the row and verdict of its last attempt, as an Arrow table."""
    rows = index.final_rows()
    return pa.table(
        {
            "id": pa.array(index.ids[rows]),
            "sample": pa.array(index.sample[rows]),
            "row": pa.array(rows),
            "passed": pa.array(index.passed[rows]),
        }
    )


def _config(path: Path) -> Mapping[str, Any] | None:
    snapshot = path / ".hydra" / "config.yaml"
    if not snapshot.is_file():
        return None
    try:
        data = yaml.safe_load(snapshot.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, Mapping) else None


def _max_chars(path: Path) -> int:
    config = _config(path)
    constraints = config.get("constraints") if config else None
    value = constraints.get("max_chars") if isinstance(constraints, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else MAX_CHARS


def _rules(path: Path, max_chars: int) -> ExportOptions:
    """The answer checks' settings of the run (its config snapshot), else the defaults."""
    from storyforge.config.exports import export_options

    config = _config(path)
    provider = config.get("provider") if config else None
    cap = provider.get("max_tokens") if isinstance(provider, Mapping) else None
    try:
        return export_options(
            {"constraints": (config or {}).get("constraints") or {}},
            max_tokens=cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None,
        )
    except StoryforgeError:
        return ExportOptions(max_chars=max_chars)


def _trace(path: Path, seed: Mapping[str, Any] | None, render: Renderer | None) -> dict[str, Any]:
    """The render trace of the seed's instruction under the run's own template (its
    ``.hydra/config.yaml`` snapshot), or why there is none."""
    config = _config(path)
    template = config.get("template") if config else None
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

    if all(isinstance(item.get("repair_turn"), str) for item in chain[1:]):
        return {"feedback": True, "source": "stored", "why": None}
    manifest = _read_json(path / MANIFEST)
    figures = manifest.get("regeneration") if isinstance(manifest, dict) else None
    figures = figures if isinstance(figures, dict) else {}
    config = _config(path)
    try:
        settings = regenerate_settings(config) if config is not None and "regenerate" in config else None
        feedback = figures.get("feedback", settings.feedback if settings is not None else None)
        if feedback is None:
            why = "neither the manifest nor a config snapshot says how the run asked again"
            return {"feedback": None, "source": None, "why": why}
        if feedback is False:
            return {
                "feedback": False,
                "source": None,
                "why": "regenerate.feedback=false: the prompt was sent again",
            }
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
        return {"feedback": True, "source": None, "why": f"the repair turn does not render here: {exc}"}
    return {"feedback": True, "source": "rendered", "why": None}
