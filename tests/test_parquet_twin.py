"""Parquet twins written from the finished JSONL: the rows (or the error) of the records, in row
groups of ``_BATCH``, written atomically; DataFile writes a file and its twin together."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storyforge import tables
from storyforge.atomic import jsonl_line
from storyforge.tables import MESSAGES, STRINGS, DataFile, parquet_path, write_parquet

SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("n", pa.int64()),
        ("ok", pa.bool_()),
        ("tags", STRINGS),
        ("messages", MESSAGES),
    ]
)
BATCH = 3


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


def _by_records(records: list[dict[str, Any]]) -> bytes:
    """The reference: the records converted by ``from_pylist``, BATCH rows per row group, with
    the twins' writer settings."""
    sink = io.BytesIO()
    with pq.ParquetWriter(sink, SCHEMA, compression="zstd", write_statistics=False) as writer:
        for start in range(0, len(records), BATCH):
            writer.write_batch(pa.RecordBatch.from_pylist(records[start : start + BATCH], schema=SCHEMA))
    return sink.getvalue()


def _outcome(make: Any) -> tuple[str, Any]:
    try:
        return "file", make()
    except (pa.ArrowException, ValueError, TypeError, OverflowError) as exc:
        return type(exc).__name__, str(exc)


def _twin_of(path: Path, records: list[dict[str, Any]]) -> bytes:
    path.write_bytes(b"".join(jsonl_line(r) for r in records))
    write_parquet(path, SCHEMA)
    return parquet_path(path).read_bytes()


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row groups of BATCH rows, so a few records cross several group boundaries."""
    monkeypatch.setattr(tables, "_BATCH", BATCH)


@pytest.mark.parametrize("count", [0, 1, 3, 7, 20])
def test_the_twin_holds_the_records_in_row_groups_of_a_batch(
    tmp_path: Path, small_batches: None, count: int
) -> None:
    records = [_record(i) for i in range(count)]
    jsonl = tmp_path / "t.jsonl"
    assert _twin_of(jsonl, records) == _by_records(records)
    assert pq.read_table(parquet_path(jsonl)).to_pylist() == records
    assert pq.read_schema(parquet_path(jsonl)) == SCHEMA
    meta = pq.ParquetFile(parquet_path(jsonl)).metadata
    sizes = [meta.row_group(k).num_rows for k in range(meta.num_row_groups)]
    assert sizes == [BATCH] * (count // BATCH) + ([count % BATCH] if count % BATCH else [])


def test_the_summary_is_the_files(tmp_path: Path, small_batches: None) -> None:
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_bytes(b"".join(jsonl_line(_record(i)) for i in range(5)))
    summary = write_parquet(jsonl, SCHEMA)
    data = parquet_path(jsonl).read_bytes()
    assert summary == {"rows": 5, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


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
    got = _outcome(lambda: _twin_of(tmp_path / "t.jsonl", records))
    assert got == _outcome(lambda: _by_records(records)), name


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
def test_any_records_give_the_file_or_error_of_the_records(records: list[dict[str, Any]]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        saved = tables._BATCH
        tables._BATCH = BATCH
        try:
            got = _outcome(lambda: _twin_of(Path(tmp) / "t.jsonl", records))
        finally:
            tables._BATCH = saved
        assert got == _outcome(lambda: _by_records(records))


def test_a_failed_twin_leaves_the_old_one_and_no_temp_file(tmp_path: Path, small_batches: None) -> None:
    target = parquet_path(tmp_path / "x.jsonl")
    target.write_bytes(b"old twin")
    records = [_record(i) for i in range(9)] + [_record(9, n="nine")] + [_record(i) for i in range(10, 20)]
    with pytest.raises(pa.ArrowInvalid, match="nine"):
        _twin_of(tmp_path / "x.jsonl", records)
    assert target.read_bytes() == b"old twin"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.jsonl", "x.parquet"]


def test_lines_are_read_as_written(tmp_path: Path, small_batches: None) -> None:
    """CRLF and blank lines: the twin is the records'."""
    records = [_record(i) for i in range(8)]
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_bytes(
        b"".join(jsonl_line(r) for r in records[:4])
        + b"\n"
        + b"".join(jsonl_line(r).replace(b"\n", b"\r\n") for r in records[4:])
    )
    assert write_parquet(jsonl, SCHEMA)["rows"] == 8
    assert parquet_path(jsonl).read_bytes() == _by_records(records)


@pytest.mark.parametrize(
    ("line", "record"),
    [
        pytest.param(1, {"id": "a", "n": 1}, id="missing_columns_on_a_batchs_first_line"),
        pytest.param(5, {**_record(4), "z": 1}, id="an_extra_column_anywhere"),
        pytest.param(4, {"n": 3, **_record(3)}, id="columns_out_of_order_on_a_batchs_first_line"),
    ],
)
def test_a_record_whose_keys_drift_is_refused_naming_its_line(
    tmp_path: Path, small_batches: None, line: int, record: dict[str, Any]
) -> None:
    records = [_record(i) for i in range(8)]
    records[line - 1] = record
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_bytes(b"".join(jsonl_line(r) for r in records))
    with pytest.raises(
        ValueError, match=rf"t\.jsonl:{line}: columns \[.*\] do not match the schema of t\.jsonl"
    ):
        write_parquet(jsonl, SCHEMA)
    assert not parquet_path(jsonl).exists()


@pytest.mark.parametrize("count", [0, 1, 10])
@pytest.mark.parametrize(
    "schema",
    [SCHEMA, lambda path: SCHEMA, None],
    ids=["twin", "twin-of-a-schema-read-from-the-file", "no-twin"],
)
def test_data_file_is_the_one_writer_of_a_file_and_its_twin(
    tmp_path: Path, small_batches: None, schema: Any, count: int
) -> None:
    """Records, a line or lines at once: jsonl_line's bytes, that file's summary, and the twin
    write_parquet makes from it (or no twin at all without a schema)."""
    records = [_record(i) for i in range(count)]
    path = tmp_path / "t.jsonl"
    with DataFile(path, schema) as out:
        offsets = [out.write(record) for record in records[:3]]
        if records[3:]:
            out.write_line(jsonl_line(records[3]))
        out.write_lines([jsonl_line(r) for r in records[4:]])
        out.write_lines([])
        if records:
            assert out.read_at(offsets[-1]) == records[min(2, count - 1)]
    data = path.read_bytes()
    assert data == b"".join(jsonl_line(r) for r in records)
    assert out.count == count
    assert out.summary() == {"records": count, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert out.twin_target == parquet_path(path)
    if schema is None:
        assert not parquet_path(path).exists()
        return
    again = tmp_path / "again" / "t.jsonl"
    again.parent.mkdir()
    again.write_bytes(data)
    assert write_parquet(again, SCHEMA) == out.twin_summary()
    assert parquet_path(again).read_bytes() == parquet_path(path).read_bytes() == _by_records(records)


def test_a_data_file_that_fails_leaves_both_files_as_they_were(tmp_path: Path, small_batches: None) -> None:
    jsonl, twin = tmp_path / "t.jsonl", tmp_path / "t.parquet"
    jsonl.write_bytes(b"old lines\n")
    twin.write_bytes(b"old twin")
    with pytest.raises(RuntimeError), DataFile(jsonl, SCHEMA) as out:
        for i in range(12):
            out.write(_record(i))
        raise RuntimeError("the block failed")
    assert jsonl.read_bytes() == b"old lines\n" and twin.read_bytes() == b"old twin"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl", "t.parquet"]
