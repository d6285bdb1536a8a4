"""Reading outside JSON as Unicode text only: a string with an unpaired surrogate is a
malformed line, reported where it is read, never a crash where it is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hypothesis import given, settings
from hypothesis import strategies as st

from storyforge.config import register_configs
from storyforge.jsontext import BadLine, loads, read_jsonl
from storyforge.pipeline import run_in

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param('{"a": "\\ud83d\\ude00"}', {"a": "\U0001f600"}, id="a_pair_is_one_character"),
        pytest.param('{"a": "\\uD83D\\uDE00"}', {"a": "\U0001f600"}, id="a_pair_in_capitals"),
        pytest.param('["\\\\ud800"]', ["\\ud800"], id="an_escaped_backslash_is_text"),
        pytest.param('{"a": "\\u00e9\\u4e2d"}', {"a": "\u00e9\u4e2d"}, id="other_escapes"),
        pytest.param(b'{"a": "\\ud83d\\ude00"}', {"a": "\U0001f600"}, id="bytes"),
    ],
)
def test_text_is_read_as_json_reads_it(raw: str | bytes, expected: Any) -> None:
    assert loads(raw) == expected == json.loads(raw)


@pytest.mark.parametrize(
    ("raw", "escape", "column"),
    [
        pytest.param('{"a": "x\\ud800"}', "\\ud800", 9, id="a_lone_high_surrogate"),
        pytest.param('{"a": "\\udc00y"}', "\\udc00", 8, id="a_lone_low_surrogate"),
        pytest.param('{"a": "\\ude00\\ud83d"}', "\\ude00", 8, id="a_pair_the_wrong_way_round"),
        pytest.param('{"\\uDBFF": 1}', "\\udbff", 3, id="in_a_key"),
        pytest.param('{"a": ["ok", {"b": "\\ud800"}]}', "\\ud800", 21, id="nested"),
        pytest.param(b'{"a": "x\\ud800"}', "\\ud800", 9, id="bytes"),
        pytest.param('{"a": "x\ud800"}', "\\ud800", 9, id="a_surrogate_in_leniently_decoded_text"),
    ],
)
def test_an_unpaired_surrogate_is_a_json_error_with_its_column(
    raw: str | bytes, escape: str, column: int
) -> None:
    with pytest.raises(json.JSONDecodeError) as caught:
        loads(raw)
    assert caught.value.msg == f"unpaired surrogate {escape} in a string (not Unicode text)"
    assert caught.value.colno == column


@pytest.mark.parametrize("raw", ["[" * 100_000 + "]" * 100_000, b'{"a":' * 100_000 + b"1" + b"}" * 100_000])
def test_a_document_nested_past_the_readers_reach_is_a_json_error(raw: str | bytes) -> None:
    """json.loads raises RecursionError there, which no reader would take for a bad line."""
    with pytest.raises(json.JSONDecodeError, match="nested too deeply to read"):
        loads(raw)


_text = st.text(alphabet=st.characters(codec=None, blacklist_categories=()), max_size=6)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    if isinstance(value, dict):
        return [s for key, item in value.items() for s in (key, *_strings(item))]
    return []


def _is_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(_json, st.booleans())
def test_any_document_is_read_unless_a_string_is_not_text(value: Any, ascii_only: bool) -> None:
    """Escaped (ensure_ascii) or not, a document loads as json.loads reads it exactly when
    every string in it is Unicode text; otherwise it is a JSONDecodeError."""
    raw = json.dumps(value, ensure_ascii=ascii_only)
    if all(_is_text(s) for s in _strings(value)):
        assert loads(raw) == value
        if ascii_only:
            assert loads(raw.encode()) == value
    else:
        with pytest.raises(json.JSONDecodeError, match="unpaired surrogate"):
            loads(raw)
        if ascii_only:
            with pytest.raises(json.JSONDecodeError, match="unpaired surrogate"):
                loads(raw.encode())


def _run(tmp_path: Path, *overrides: str) -> dict[str, Any]:
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        return run_in(compose("config", overrides=list(overrides)), tmp_path / "run")


def test_seed_lines_not_text_or_nested_too_deeply_are_rejected_by_line_and_the_run_goes_on(
    tmp_path: Path,
) -> None:
    _run(tmp_path, "task.n_seeds=3")
    lines = (tmp_path / "run" / "prompts_seed.jsonl").read_text("utf-8").splitlines()
    bad = json.loads(lines[1])
    bad["protagonist"] = "a cat named \ud800"
    seeds = tmp_path / "seeds.jsonl"
    deep = "[" * 100_000 + "]" * 100_000
    seeds.write_text(f"{lines[0]}\n{json.dumps(bad)}\n{lines[2]}\n{deep}\n", "utf-8")
    manifest = _run(tmp_path, f"seeds_path={seeds}")
    assert manifest["counts"]["seeds"] == 2 and manifest["counts"]["rejected"] == 2
    rejected = [
        json.loads(r) for r in (tmp_path / "run" / "rejected_seeds.jsonl").read_text("utf-8").splitlines()
    ]
    assert [(r["line"], r["rule"]) for r in rejected] == [(2, "invalid_json"), (4, "invalid_json")]
    assert "unpaired surrogate \\ud800" in rejected[0]["message"]
    assert "nested too deeply to read" in rejected[1]["message"]


def test_a_completion_that_is_not_text_is_a_malformed_line_and_the_rest_is_checked(tmp_path: Path) -> None:
    _run(tmp_path, "task.n_seeds=2")
    ids = [
        json.loads(r)["id"] for r in (tmp_path / "run" / "prompts_seed.jsonl").read_text("utf-8").splitlines()
    ]
    completions = tmp_path / "completions.jsonl"
    completions.write_text(
        json.dumps({"id": ids[0], "output": "Tim ran. \ud800 He sat."})
        + "\n"
        + json.dumps({"id": ids[1], "output": "Tim ran home."})
        + "\n",
        "utf-8",
    )
    _run(tmp_path, "task.n_seeds=2", f"completions={completions}")
    run = tmp_path / "run"
    (problem,) = [json.loads(r) for r in (run / "completion_errors.jsonl").read_text("utf-8").splitlines()]
    assert problem["line"] == 1 and problem["kind"] == "malformed"
    assert "unpaired surrogate \\ud800" in problem["message"]
    validated = [json.loads(r) for r in (run / "validated.jsonl").read_text("utf-8").splitlines()]
    assert [v["id"] for v in validated] == [ids[1]]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(
            b'{"a": 1}\n\n  \n[2]\n', [(1, {"a": 1}), (4, [2])], id="blank_lines_skipped_numbers_kept"
        ),
        pytest.param(b'\xef\xbb\xbf{"a": 1}\n', [(1, {"a": 1})], id="a_byte_order_mark_first"),
        pytest.param(b"\xef\xbb\xbf\n1\n", [(2, 1)], id="a_byte_order_mark_alone"),
        pytest.param(
            b'1\n{"a": \n2',
            [(1, 1), (2, "not JSON: Expecting value (column 7)"), (3, 2)],
            id="a_bad_line_then_more",
        ),
        pytest.param(
            b'"caf\xe9"\n"ok"\n', [(1, "not UTF-8 text: byte 5 cannot be decoded"), (2, "ok")], id="not_utf8"
        ),
        pytest.param(
            b'"\xed\xa0\x80"\n', [(1, "not UTF-8 text: byte 2 cannot be decoded")], id="an_encoded_surrogate"
        ),
        pytest.param(
            b"1\n\xef\xbb\xbf2\n",
            [(1, 1), (2, 2)],
            id="a_byte_order_mark_later_too",  # as `cat a.jsonl b.jsonl` leaves it
        ),
        pytest.param(b'"a"\r\n"c\xe2\x80\xa8d"\n', [(1, "a"), (2, "c\u2028d")], id="split_on_newlines_only"),
    ],
)
def test_read_jsonl_gives_each_line_number_with_its_value_or_one_problem(
    tmp_path: Path, data: bytes, expected: list[tuple[int, Any]]
) -> None:
    path = tmp_path / "lines.jsonl"
    path.write_bytes(data)
    got = [(n, v.message if isinstance(v, BadLine) else v) for n, v in read_jsonl(path)]
    assert got == expected


def test_a_bad_line_names_its_file_and_line_and_keeps_duplicate_keys_apart(tmp_path: Path) -> None:
    path = tmp_path / "seeds.jsonl"
    path.write_bytes(b'{"id": "a"}\n{"id": "a", "id": "b"}\n')
    [(_, first), (_, second)] = read_jsonl(path, unique_keys=True)
    assert first == {"id": "a"}
    assert isinstance(second, BadLine)
    assert (
        second.at(path) == f'{path}:2: not JSON: duplicate key "id" (a record names each key once) (column 2)'
    )
    assert [v for _, v in read_jsonl(path)] == [{"id": "a"}, {"id": "b"}]
