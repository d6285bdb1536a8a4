"""Completion files: plain JSONL, provider generations.jsonl and OpenAI Batch output, line by line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from storyforge.tasks.tinystories.completions import (
    BATCH,
    JSONL,
    Completion,
    LineProblem,
    parse_completion_line,
    read_completions,
    split_custom_id,
)


def line(record: Any) -> bytes:
    return (json.dumps(record) + "\n").encode()


def batch_ok(custom_id: str, content: Any, finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "batch_req_abc",
        "custom_id": custom_id,
        "response": {
            "status_code": 200,
            "request_id": "req_1",
            "body": {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": finish,
                    }
                ],
            },
        },
        "error": None,
    }


GENERATION = {
    "id": "ts-000003",
    "split": "train",
    "sample": 2,
    "request_hash": "ab" * 32,
    "output": "A story.",
    "finish_reason": "stop",
    "usage": {"prompt_tokens": 10, "completion_tokens": 3},
    "latency_s": 0.12,
    "attempts": 1,
    "error": None,
}

PARSED = [
    pytest.param(
        line({"id": "ts-1", "output": "Hi."}),
        Completion(line=7, id="ts-1", sample=0, output="Hi."),
        id="id-output",
    ),
    pytest.param(
        line({"id": "ts-1", "sample": 4, "output": "Hi."}),
        Completion(line=7, id="ts-1", sample=4, output="Hi."),
        id="id-sample-output",
    ),
    pytest.param(
        line({"id": "ts-1", "sample": None, "output": "Hi."}),
        Completion(line=7, id="ts-1", sample=0, output="Hi."),
        id="null-sample-is-0",
    ),
    pytest.param(
        line(GENERATION),
        Completion(
            line=7, id="ts-000003", sample=2, output="A story.", finish_reason="stop", request_hash="ab" * 32
        ),
        id="generations-record",
    ),
    pytest.param(
        line({**GENERATION, "output": None, "finish_reason": None, "error": "HTTP 503 after 5 attempts"}),
        Completion(
            line=7,
            id="ts-000003",
            sample=2,
            output=None,
            error="HTTP 503 after 5 attempts",
            request_hash="ab" * 32,
        ),
        id="generations-error-record",
    ),
    pytest.param(
        line({"id": "ts-1", "output": None, "error": {"code": "timeout", "message": "read timed out"}}),
        Completion(line=7, id="ts-1", sample=0, output=None, error="timeout: read timed out"),
        id="error-object",
    ),
    pytest.param(
        line({"id": "ts-1", "output": 42}),
        Completion(line=7, id="ts-1", sample=0, output=42),
        id="non-text-output-kept-for-validation",
    ),
    pytest.param(
        line(batch_ok("ts-9#3", "Once.")),
        Completion(line=7, id="ts-9", sample=3, output="Once.", finish_reason="stop", format=BATCH),
        id="batch-with-sample",
    ),
    pytest.param(
        line(batch_ok("ts-9", "Once.", "length")),
        Completion(line=7, id="ts-9", sample=0, output="Once.", finish_reason="length", format=BATCH),
        id="batch-without-sample",
    ),
    pytest.param(
        line(batch_ok("ts#9#x", "Once.")),
        Completion(line=7, id="ts#9#x", sample=0, output="Once.", finish_reason="stop", format=BATCH),
        id="batch-non-numeric-suffix-is-part-of-id",
    ),
    pytest.param(
        line(
            {"id": "b", "custom_id": "ts-9#1", "response": None, "error": {"code": "x", "message": "expired"}}
        ),
        Completion(line=7, id="ts-9", sample=1, output=None, error="x: expired", format=BATCH),
        id="batch-error",
    ),
    pytest.param(
        line(
            {
                "custom_id": "ts-9",
                "response": {"status_code": 429, "body": {"error": {"message": "rate limited"}}},
                "error": None,
            }
        ),
        Completion(line=7, id="ts-9", sample=0, output=None, error="HTTP 429: rate limited", format=BATCH),
        id="batch-non-200",
    ),
    pytest.param(
        line(
            {
                "custom_id": "ts-9",
                "response": {
                    "status_code": 200,
                    "body": {
                        "choices": [
                            {"message": {"content": None, "refusal": "I can't."}, "finish_reason": "stop"}
                        ]
                    },
                },
            }
        ),
        Completion(
            line=7,
            id="ts-9",
            sample=0,
            output=None,
            error="refusal: I can't.",
            finish_reason="stop",
            format=BATCH,
        ),
        id="batch-refusal",
    ),
]


@pytest.mark.parametrize(("raw", "expected"), PARSED)
def test_parse_completion_line(raw: bytes, expected: Completion) -> None:
    """Each accepted shape becomes one Completion with id, sample, output, error and format."""
    assert parse_completion_line(raw, 7) == expected


MALFORMED = [
    pytest.param(
        b"{not json\n",
        "not JSON: Expecting property name enclosed in double quotes (column 2)",
        id="json",
    ),
    pytest.param(b"[1, 2]\n", "expected a JSON object, got list", id="array"),
    pytest.param(b'"text"\n', "expected a JSON object, got str", id="string"),
    pytest.param(
        b'{"id": "a", "output": "caf\xe9"}\n', "not UTF-8 text: byte 27 cannot be decoded", id="utf8"
    ),
    pytest.param(line({"output": "x"}), "'id' must be a non-empty string, got None", id="no-id"),
    pytest.param(line({"id": 5, "output": "x"}), "'id' must be a non-empty string, got 5", id="int-id"),
    pytest.param(line({"id": "", "output": "x"}), "'id' must be a non-empty string, got ''", id="empty-id"),
    pytest.param(
        line({"id": "a", "sample": -1, "output": "x"}),
        "'sample' must be an integer from 0 to 2147483647, got -1",
        id="neg",
    ),
    pytest.param(
        line({"id": "a", "sample": "1", "output": "x"}),
        "'sample' must be an integer from 0 to 2147483647, got '1'",
        id="str",
    ),
    pytest.param(
        line({"id": "a", "sample": True, "output": "x"}),
        "'sample' must be an integer from 0 to 2147483647, got True",
        id="bool",
    ),
    pytest.param(
        line({"id": "a", "text": "x"}),
        "record 'a' has no 'output' (and no 'error'); keys: id, text",
        id="no-output",
    ),
    pytest.param(line({"custom_id": 3}), "'custom_id' must be a non-empty string, got 3", id="custom-id"),
    pytest.param(
        line({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}),
        "'a' is a Batch API request line, not an output line",
        id="batch-request-file",
    ),
    pytest.param(
        line({"custom_id": "a", "response": {"status_code": 200, "body": {"choices": []}}}),
        "'a': response.body.choices[0].message.content is missing",
        id="batch-no-choices",
    ),
    pytest.param(
        line({"custom_id": "a", "response": "ok"}),
        "'a': 'response' must be an object, got str",
        id="batch-resp",
    ),
]


@pytest.mark.parametrize(("raw", "message"), MALFORMED)
def test_malformed_lines(raw: bytes, message: str) -> None:
    """A line that cannot be a completion becomes a 'malformed' problem with its line number and why."""
    problem = parse_completion_line(raw, 12)
    assert isinstance(problem, LineProblem)
    assert (problem.line, problem.kind, problem.message) == (12, "malformed", message)


@pytest.mark.parametrize("raw", [b"\n", b"   \r\n", b""])
def test_blank_lines_are_none(raw: bytes) -> None:
    """A blank line carries no record."""
    assert parse_completion_line(raw, 3) is None


def test_byte_order_mark_on_first_line() -> None:
    """A UTF-8 byte-order mark before the first record is ignored."""
    raw = "\ufeff".encode() + line({"id": "a", "output": "x"})
    assert parse_completion_line(raw, 1) == Completion(line=1, id="a", sample=0, output="x")


@pytest.mark.parametrize(
    ("custom_id", "expected"),
    [
        ("ts-1", ("ts-1", 0)),
        ("ts-1#0", ("ts-1", 0)),
        ("ts-1#12", ("ts-1", 12)),
        ("a#b#3", ("a#b", 3)),
        ("#3", ("#3", 0)),
        ("ts#", ("ts#", 0)),
        ("ts#٣", ("ts#٣", 0)),
    ],
)
def test_split_custom_id(custom_id: str, expected: tuple[str, int]) -> None:
    """custom_id is '<id>' or '<id>#<sample>' with an ASCII-digit sample."""
    assert split_custom_id(custom_id) == expected


def test_read_completions_streams_in_order_with_line_numbers(tmp_path: Path) -> None:
    """read_completions yields one item per line, numbered from 1, and hashes every byte."""
    data = line({"id": "a", "output": "x"}) + b"\n" + b"oops\n" + line(batch_ok("b#1", "y"))
    path = tmp_path / "c.jsonl"
    path.write_bytes(data)
    digest = hashlib.sha256()
    items = list(read_completions(path, digest))
    assert [type(i).__name__ for i in items] == ["Completion", "NoneType", "LineProblem", "Completion"]
    assert [i.line for i in items if i is not None] == [1, 3, 4]
    assert items[3] == Completion(line=4, id="b", sample=1, output="y", finish_reason="stop", format=BATCH)
    assert items[0].format == JSONL
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()


def test_line_problem_record() -> None:
    """A problem turns into the columns of completion_errors.jsonl."""
    problem = LineProblem(line=4, kind="duplicate", message="m", id="a", sample=1)
    assert problem.as_record() == {"line": 4, "kind": "duplicate", "id": "a", "sample": 1, "message": "m"}
