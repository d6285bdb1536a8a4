"""ParquetTwin: records given with their JSONL lines (built on a worker thread by Arrow's JSON
reader) give the same file, byte for byte, as records alone, or the same error."""

from __future__ import annotations

import hashlib
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storyforge import tables
from storyforge.atomic import AtomicLines, jsonl_line
from storyforge.tables import (
    MESSAGES,
    STRINGS,
    DataFile,
    ParquetTwin,
    TwinnedLines,
    parquet_path,
    write_parquet,
)

SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("n", pa.int64()),
        ("ok", pa.bool_()),
        ("tags", STRINGS),
        ("messages", MESSAGES),
    ]
)


def _record(i: int, **changes: Any) -> dict[str, Any]:
    record = {
        "id": f"r{i}",
        "n": i,
        "ok": i % 2 == 0,
        "tags": ["a", f"t{i}"] if i % 3 else [],
        "messages": [{"role": "user", "content": f'line {i}\nwith "quotes" and \u00e9\u4e2d\U0001f600'}],
    }
    record.update(changes)
    return record


def _twin(path: Path, records: list[dict[str, Any]], *, lines: bool) -> bytes:
    with ParquetTwin(path, SCHEMA) as twin:
        for record in records:
            twin.add(record, line=jsonl_line(record) if lines else None)
    return parquet_path(path).read_bytes()


def _outcome(root: Path, records: list[dict[str, Any]], *, lines: bool) -> tuple[str, Any]:
    """The twin's bytes, or its error, for ``records`` written under ``root/<mode>/t.jsonl``."""
    path = root / ("lines" if lines else "records") / "t.jsonl"
    path.parent.mkdir(exist_ok=True)
    try:
        return "file", _twin(path, records, lines=lines)
    except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
        return type(exc).__name__, str(exc).replace(str(path.parent), "<dir>")


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row groups of 3 rows whose lines go to the worker 2 at a time, and one waiting batch or
    chunk, so a few records cross many group and chunk boundaries and the writer waits for
    the worker."""
    monkeypatch.setattr(tables, "_BATCH", 3)
    monkeypatch.setattr(tables, "_CHUNK", 2)
    monkeypatch.setattr(tables, "_PENDING", 1)


@pytest.mark.parametrize("count", [0, 1, 3, 7, 20])
def test_lines_give_the_file_records_give(tmp_path: Path, small_batches: None, count: int) -> None:
    records = [_record(i) for i in range(count)]
    by_records = _twin(tmp_path / "a.jsonl", records, lines=False)
    by_lines = _twin(tmp_path / "b.jsonl", records, lines=True)
    assert by_lines == by_records
    assert pq.read_table(tmp_path / "b.parquet").to_pylist() == records


@pytest.mark.parametrize("cuts", [[], [1], [2, 2], [5, 1, 0, 6], [20]])
def test_lines_alone_give_the_files_records_give(
    tmp_path: Path, small_batches: None, cuts: list[int]
) -> None:
    """Lines handed over in runs of any length (across chunk and row group boundaries) give
    the JSONL file and twin that writing their records one by one gives."""
    records = [_record(i) for i in range(sum(cuts))]
    _twinned(tmp_path / "a" / "t.jsonl", records, parent=True)
    with TwinnedLines(tmp_path / "b.jsonl", SCHEMA) as out:
        start = 0
        for size in cuts:
            out.write_lines([jsonl_line(r) for r in records[start : start + size]])
            start += size
    assert (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "a" / "t.jsonl").read_bytes()
    assert (tmp_path / "b.parquet").read_bytes() == (tmp_path / "a" / "t.parquet").read_bytes()
    assert out.count == len(records) and out.twin_summary()["rows"] == len(records)
    plain = DataFile(tmp_path / "c.jsonl")
    with plain:
        plain.write_lines([jsonl_line(r) for r in records])
        plain.write_lines([])
    assert (tmp_path / "c.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert plain.count == len(records)


def test_lines_alone_and_records_without_lines_do_not_mix(tmp_path: Path) -> None:
    with (
        pytest.raises(ValueError, match="both with and without"),
        ParquetTwin(tmp_path / "t.jsonl", SCHEMA) as twin,
    ):
        twin.add(_record(0))
        twin.add_lines([jsonl_line(_record(1))])


IDS = pa.schema([("id", pa.string()), ("n", pa.int64())])


def _ids(table: pa.Table) -> pa.Table:
    return table.select(["id", "n"])


def _half(table: pa.Table) -> pa.Table:
    return _ids(table).slice(0, table.num_rows // 2)


@pytest.mark.parametrize(
    ("derive", "extra", "source_first"),
    [
        pytest.param(_ids, 0, False, id="the_follower_closes_first"),
        pytest.param(_ids, 0, True, id="the_source_closes_first"),
        pytest.param(_half, 0, True, id="a_derivation_of_the_wrong_length_is_not_used"),
        pytest.param(_ids, 4, True, id="more_rows_than_the_source"),
    ],
)
def test_a_twin_whose_rows_come_from_another_is_the_twin_of_its_lines(
    tmp_path: Path, small_batches: None, derive: Any, extra: int, source_first: bool
) -> None:
    """A follower's row groups are made from the source's (or, where they cannot be, parsed
    from its own lines): its file is the one write_parquet makes from its JSONL either way."""
    records = [_record(i) for i in range(11)]
    rows = [{"id": r["id"], "n": r["n"]} for r in [*records, *(_record(100 + i) for i in range(extra))]]
    source = DataFile(tmp_path / "s.jsonl", SCHEMA, inline=True)
    follower = DataFile(tmp_path / "f.jsonl", IDS, inline=True, rows_from=(source, derive))
    with ExitStack() as stack:  # the last entered is the first to close
        for out in (follower, source) if source_first else (source, follower):
            stack.enter_context(out)
        for i, record in enumerate(records):
            source.write(record)
            follower.write(rows[i])
        for row in rows[len(records) :]:
            follower.write(row)
    again = tmp_path / "again" / "f.jsonl"
    again.parent.mkdir()
    again.write_bytes((tmp_path / "f.jsonl").read_bytes())
    assert write_parquet(again, IDS) == follower.twin_summary()
    assert parquet_path(again).read_bytes() == (tmp_path / "f.parquet").read_bytes()


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("a float for an integer", {"n": 1.0}),
        ("a string for an integer", {"n": "1"}),
        ("a boolean for an integer", {"n": True}),
        ("an integer past 64 bits", {"n": 2**70}),
        ("a number for a string", {"id": 5}),
        ("a string for a list", {"tags": "a"}),
        ("a message with an extra key", {"messages": [{"role": "user", "content": "x", "name": "y"}]}),
        ("a message without content", {"messages": [{"role": "user"}]}),
        ("nulls everywhere", {"id": None, "n": None, "ok": None, "tags": None, "messages": None}),
        ("a null inside a list", {"tags": ["a", None]}),
    ],
)
def test_a_batch_the_json_reader_refuses_gets_the_records_outcome(
    tmp_path: Path, small_batches: None, name: str, change: dict[str, Any]
) -> None:
    """Arrow's JSON reader is stricter than from_pylist; whatever it refuses is converted from
    the records, so the file (or the error) is the records' own."""
    records = [_record(0), _record(1, **change), _record(2), _record(3)]
    assert _outcome(tmp_path, records, lines=True) == _outcome(tmp_path, records, lines=False), name


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.text(max_size=8),
    st.lists(st.one_of(st.none(), st.text(max_size=5), st.integers(-5, 5)), max_size=3),
    st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["user", "system"]),
                "content": st.one_of(st.none(), st.text(max_size=5)),
            }
        ),
        max_size=2,
    ),
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(*[_values] * len(SCHEMA.names)).map(lambda values: dict(zip(SCHEMA.names, values))),
        max_size=8,
    )
)
def test_any_records_give_the_same_file_or_error_with_their_lines(records: list[dict[str, Any]]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        saved = tables._BATCH, tables._CHUNK
        tables._BATCH, tables._CHUNK = 3, 2
        try:
            assert _outcome(Path(tmp), records, lines=True) == _outcome(Path(tmp), records, lines=False)
        finally:
            tables._BATCH, tables._CHUNK = saved


def test_a_worker_error_fails_the_block_and_writes_nothing(tmp_path: Path, small_batches: None) -> None:
    target = parquet_path(tmp_path / "x.jsonl")
    target.write_bytes(b"old twin")
    records = [_record(i) for i in range(9)] + [_record(9, n="nine")] + [_record(i) for i in range(10, 20)]
    before = threading.active_count()
    with pytest.raises(pa.ArrowInvalid, match="nine"):
        _twin(tmp_path / "x.jsonl", records, lines=True)
    assert target.read_bytes() == b"old twin"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.parquet"]  # no temp file left
    assert threading.active_count() == before  # the worker is gone


def test_an_error_in_the_block_drops_pending_batches(tmp_path: Path, small_batches: None) -> None:
    before = threading.active_count()
    with (
        pytest.raises(RuntimeError, match="writer failed"),
        ParquetTwin(tmp_path / "x.jsonl", SCHEMA) as twin,
    ):
        for i in range(10):
            record = _record(i)
            twin.add(record, line=jsonl_line(record))
        raise RuntimeError("writer failed")
    assert list(tmp_path.iterdir()) == []
    assert threading.active_count() == before


def test_records_with_and_without_lines_do_not_mix(tmp_path: Path) -> None:
    with (
        pytest.raises(ValueError, match="both with and without"),
        ParquetTwin(tmp_path / "x.jsonl", SCHEMA) as twin,
    ):
        twin.add(_record(0), line=jsonl_line(_record(0)))
        twin.add(_record(1))
    assert list(tmp_path.iterdir()) == []


def test_write_parquet_reads_lines_as_written(tmp_path: Path, small_batches: None) -> None:
    """The twin of a finished JSONL file (lines handed over as read, CRLF and blank lines
    included) is the twin built from its records."""
    records = [_record(i) for i in range(8)]
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_bytes(
        b"".join(jsonl_line(r) for r in records[:4])
        + b"\n"
        + b"".join(jsonl_line(r).replace(b"\n", b"\r\n") for r in records[4:])
    )
    summary = write_parquet(jsonl, SCHEMA)
    assert summary["rows"] == 8
    assert parquet_path(jsonl).read_bytes() == _twin(tmp_path / "y.jsonl", records, lines=False)


def _twinned(path: Path, records: list[dict[str, Any]], *, parent: bool = False) -> TwinnedLines:
    if parent:
        path.parent.mkdir(parents=True)
    with TwinnedLines(path, SCHEMA) as out:
        for record in records:
            out.write(record)
    return out


@pytest.mark.parametrize("count", [0, 1, 3, 10])
def test_twinned_lines_write_the_jsonl_and_its_twin(tmp_path: Path, small_batches: None, count: int) -> None:
    """The JSONL file has jsonl_line's bytes, its summary is that file's, and the twin is the
    one write_parquet writes from it."""
    records = [_record(i) for i in range(count)]
    out = _twinned(tmp_path / "t.jsonl", records)
    data = (tmp_path / "t.jsonl").read_bytes()
    assert data == b"".join(jsonl_line(r) for r in records)
    assert out.count == count
    assert out.summary() == {"records": count, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    again = tmp_path / "again" / "t.jsonl"
    again.parent.mkdir()
    again.write_bytes(data)
    assert write_parquet(again, SCHEMA) == out.twin_summary()
    assert parquet_path(again).read_bytes() == parquet_path(tmp_path / "t.jsonl").read_bytes()


@pytest.mark.parametrize(
    ("fail", "error"),
    [
        pytest.param("block", RuntimeError, id="an_error_in_the_block"),
        pytest.param("worker", pa.ArrowInvalid, id="a_batch_that_cannot_be_converted"),
    ],
)
def test_twinned_lines_that_fail_leave_both_files_as_they_were(
    tmp_path: Path, small_batches: None, fail: str, error: type[Exception]
) -> None:
    jsonl, twin = tmp_path / "t.jsonl", tmp_path / "t.parquet"
    jsonl.write_bytes(b"old lines\n")
    twin.write_bytes(b"old twin")
    before = threading.active_count()
    with pytest.raises(error), TwinnedLines(jsonl, SCHEMA) as out:
        for i in range(12):
            out.write(_record(i, n="x") if fail == "worker" and i == 7 else _record(i))
        if fail == "block":
            raise RuntimeError("the block failed")
    assert jsonl.read_bytes() == b"old lines\n" and twin.read_bytes() == b"old twin"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl", "t.parquet"]
    assert threading.active_count() == before


def test_twinned_lines_refuse_a_record_whose_keys_drift(tmp_path: Path) -> None:
    with (
        pytest.raises(ValueError, match=r"columns \['id', 'n'\] do not match"),
        TwinnedLines(tmp_path / "t.jsonl", SCHEMA) as out,
    ):
        out.write({"id": "a", "n": 1})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("count", [0, 1, 10])
@pytest.mark.parametrize(
    ("schema", "inline"),
    [(SCHEMA, False), (SCHEMA, True), (None, False), (None, True)],
    ids=["twin-at-commit", "twin-inline", "no-twin", "no-twin-inline"],
)
def test_data_file_is_the_one_writer_of_a_file_and_its_twin(
    tmp_path: Path, small_batches: None, schema: pa.Schema | None, inline: bool, count: int
) -> None:
    """Every way of writing a data file gives jsonl_line's bytes, that file's summary, and the
    twin write_parquet makes from it (or no twin at all without a schema)."""
    records = [_record(i) for i in range(count)]
    path = tmp_path / "t.jsonl"
    with DataFile(path, schema, inline=inline) as out:
        offsets = [out.write(record) for record in records]
        if not inline and records:
            assert out.read_at(offsets[-1]) == records[-1]
    data = path.read_bytes()
    assert data == b"".join(jsonl_line(r) for r in records)
    assert out.count == count
    assert out.summary() == {"records": count, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    if schema is None:
        assert not parquet_path(path).exists()
        return
    again = tmp_path / "again" / "t.jsonl"
    again.parent.mkdir()
    again.write_bytes(data)
    assert write_parquet(again, SCHEMA) == out.twin_summary()
    assert parquet_path(again).read_bytes() == parquet_path(path).read_bytes()
    assert out.twin_target == parquet_path(path)


@pytest.mark.parametrize("inline", [False, True], ids=["twin-at-commit", "twin-inline"])
def test_a_data_file_that_fails_leaves_both_files_as_they_were(
    tmp_path: Path, small_batches: None, inline: bool
) -> None:
    jsonl, twin = tmp_path / "t.jsonl", tmp_path / "t.parquet"
    jsonl.write_bytes(b"old lines\n")
    twin.write_bytes(b"old twin")
    with pytest.raises(RuntimeError), DataFile(jsonl, SCHEMA, inline=inline) as out:
        for i in range(12):
            out.write(_record(i))
        raise RuntimeError("the block failed")
    assert jsonl.read_bytes() == b"old lines\n" and twin.read_bytes() == b"old twin"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl", "t.parquet"]


@pytest.mark.parametrize(
    ("batch", "chunk"), [(6, 2), (6, 4), (4, 8)], ids=["chunks-fill-groups", "uneven", "chunk-over-group"]
)
def test_row_groups_do_not_depend_on_how_lines_reach_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: int, chunk: int
) -> None:
    """Whatever the chunk size, each row group holds _BATCH rows (the last one the rest), as
    when the records are converted in batches, so the twin's bytes are the same."""
    monkeypatch.setattr(tables, "_BATCH", batch)
    monkeypatch.setattr(tables, "_CHUNK", chunk)
    records = [_record(i) for i in range(15)]
    by_lines = _twin(tmp_path / "a.jsonl", records, lines=True)
    assert by_lines == _twin(tmp_path / "b.jsonl", records, lines=False)
    meta = pq.ParquetFile(tmp_path / "a.parquet").metadata
    sizes = [meta.row_group(k).num_rows for k in range(meta.num_row_groups)]
    assert sizes == [batch] * (15 // batch) + ([15 % batch] if 15 % batch else [])


def test_the_worker_is_never_more_than_a_few_chunks_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory a twin holds is bounded: the lines handed over but not yet in the JSONL file
    are never more than _PENDING chunks and the one being handed over, however slow the worker."""
    monkeypatch.setattr(tables, "_BATCH", 8)
    monkeypatch.setattr(tables, "_CHUNK", 2)
    monkeypatch.setattr(tables, "_PENDING", 2)
    behind: list[int] = []

    class SlowLines(AtomicLines):
        def write_lines(self, data: bytes, count: int) -> int:
            time.sleep(0.002)  # a worker slower than the writer, so the queue fills
            behind.append(twin.rows - self.count)
            return super().write_lines(data, count)

    path = tmp_path / "t.jsonl"
    lines = SlowLines(path)
    twin = ParquetTwin(path, SCHEMA, sink=lines)
    records = [_record(i) for i in range(40)]
    with twin:
        for record in records:
            twin.add(record, line=jsonl_line(record))
    lines.commit()
    assert path.read_bytes() == b"".join(jsonl_line(r) for r in records)
    # The chunk being written and the one waiting (_PENDING = 2), and the one the writer holds
    # while it waits to hand it over.
    assert len(behind) == 20 and max(behind) <= (2 + 1) * 2


def test_twins_open_together_share_one_worker_and_a_failing_one_spares_the_others(
    tmp_path: Path, small_batches: None
) -> None:
    """Every twin open in the process is built by one worker thread, gone when the last twin
    closes; a twin whose rows cannot be converted fails alone, and the others are whole."""
    before = threading.active_count()
    records = [_record(i) for i in range(10)]
    written: list[dict[str, Any]] = []
    with TwinnedLines(tmp_path / "a.jsonl", SCHEMA) as a:
        with pytest.raises(pa.ArrowInvalid), TwinnedLines(tmp_path / "b.jsonl", SCHEMA) as b:
            for i, record in enumerate(records):
                a.write(record)
                written.append(record)
                b.write(_record(i, n="x") if i == 4 else record)
                assert threading.active_count() <= before + 1
        for record in records:
            a.write(record)
            written.append(record)
    assert threading.active_count() == before
    data = (tmp_path / "a.jsonl").read_bytes()
    assert data == b"".join(jsonl_line(r) for r in written)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "a.parquet"]
    again = tmp_path / "again" / "a.jsonl"
    again.parent.mkdir()
    again.write_bytes(data)
    assert write_parquet(again, SCHEMA) == a.twin_summary()


def test_the_worker_gets_the_interpreter_lock_sooner_while_twins_are_open(
    tmp_path: Path, small_batches: None
) -> None:
    """While the worker runs, a thread waits at most _SWITCH_INTERVAL for the interpreter lock
    (Python's own interval otherwise); the interval the process had is back afterwards."""
    before = sys.getswitchinterval()
    seen: list[float] = []
    with TwinnedLines(tmp_path / "t.jsonl", SCHEMA) as out:
        for i in range(5):  # past a chunk: the worker has started
            out.write(_record(i))
        seen.append(sys.getswitchinterval())
    assert seen == [min(before, tables._SWITCH_INTERVAL)]
    assert sys.getswitchinterval() == before


@pytest.mark.parametrize(
    "order",
    [
        [],
        [0, 0, 0, 0, 0, 0, 0],
        [1, 0, 2, 1, 0, 2, 2, 2, 1, 0, 0, 1, 2],
        [2, 2, 2, 2, 2, 2, 0, 1, 1, 1, 1, 1, 1, 0, 0],
        [0, 1] * 10,
    ],
    ids=["empty", "one-source", "interleaved", "runs-across-groups", "alternating"],
)
def test_a_merged_twin_is_the_twin_of_the_merged_lines(
    tmp_path: Path, small_batches: None, order: list[int]
) -> None:
    """Merging the sources' twins row group by row group (rows of 3 here, so each group takes
    rows from several sources and each source's rows span several groups) gives the bytes and
    summary of the twin written from the merged JSONL itself."""
    sources = [tmp_path / f"s{k}.jsonl" for k in range(3)]
    mine: list[list[dict[str, Any]]] = [[] for _ in sources]
    merged: list[dict[str, Any]] = []
    for i, k in enumerate(order):
        record = _record(i, id=f"s{k}-{len(mine[k])}")
        mine[k].append(record)
        merged.append(record)
    for source, records in zip(sources, mine, strict=True):
        source.write_bytes(b"".join(jsonl_line(r) for r in records))
        write_parquet(source, SCHEMA)
    expected_dir, got_dir = tmp_path / "expected", tmp_path / "got"
    for d in (expected_dir, got_dir):
        d.mkdir()
        (d / "m.jsonl").write_bytes(b"".join(jsonl_line(r) for r in merged))
    expected = write_parquet(expected_dir / "m.jsonl", SCHEMA)
    got = tables.merge_parquet(got_dir / "m.jsonl", sources, order, SCHEMA)
    assert got == expected
    assert (got_dir / "m.parquet").read_bytes() == (expected_dir / "m.parquet").read_bytes()
    assert pq.read_table(got_dir / "m.parquet").to_pylist() == merged


def test_a_merge_order_asking_more_rows_than_a_twin_has_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "s.jsonl"
    source.write_bytes(jsonl_line(_record(0)))
    write_parquet(source, SCHEMA)
    with pytest.raises(ValueError, match="fewer rows than the merge order takes"):
        tables.merge_parquet(tmp_path / "m.jsonl", [source], [0, 0], SCHEMA)
    assert not (tmp_path / "m.parquet").exists()
