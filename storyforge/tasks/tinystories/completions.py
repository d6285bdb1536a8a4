"""Reading model completions for TinyStories seeds, one record (or one problem) per line.

Takes: a completion file in one of three shapes, told apart line by line:

* JSONL with ``id`` and ``output`` (sample 0), or ``id``, ``sample`` and ``output``;
* the ``generations.jsonl`` a provider run writes (the same plus ``request_hash``,
  ``finish_reason``, ``usage``, ``latency_s``), where a failed request has ``error`` set and
  ``output`` null;
* an OpenAI Batch API output file: ``custom_id`` (``<id>`` or ``<id>#<sample>``) and
  ``response.body.choices[0].message.content``, or ``error`` / a non-200 ``response``.

Gives: :func:`read_completions`, a stream of :class:`Completion` and :class:`LineProblem`
values in file order. It exists so the validation stage sees one shape whatever produced the
file, and so a bad line becomes a reported problem with its line number instead of an
exception that loses the rest of the file. Blank lines carry no record and are skipped (the
caller counts them). Seed ids, duplicates and unknown ids are the caller's business.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from storyforge import jsontext

__all__ = [
    "BATCH",
    "JSONL",
    "Completion",
    "LineProblem",
    "parse_completion_line",
    "read_completions",
    "split_custom_id",
]

JSONL: Final = "jsonl"
BATCH: Final = "openai_batch"


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """One model answer for sample ``sample`` of seed ``id``.

    ``output`` is the text, or whatever non-text value the file held (``None`` for a failed
    request, whose ``error`` then says why). ``line`` is 1-based in the completion file.
    """

    line: int
    id: str
    sample: int
    output: object
    error: str | None = None
    finish_reason: str | None = None
    format: str = JSONL
    # Regeneration (``attempts.jsonl``): which attempt of its chain this is (None: no chain),
    # whether it is the chain's last, and the hash of the request that got it.
    attempt: int | None = None
    final: bool = True
    request_hash: str | None = None
    # The judge's verdict record ({"verdict", "rule", "reason"} or {"error"}), when judged.
    judge: Mapping[str, Any] | None = None
    # The repair turn this attempt answered (regenerate.feedback=true), for the echo check.
    repair_turn: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LineProblem:
    """A line that could not be used: ``kind`` is a stable name, ``message`` a sentence.

    Kinds: ``malformed`` (here), ``unknown_id``, ``duplicate``, ``bad_seed`` (the caller's).
    """

    line: int
    kind: str
    message: str
    id: str | None = None
    sample: int | None = None

    def as_record(self) -> dict[str, Any]:
        """JSON-ready columns for ``completion_errors.jsonl``."""
        return {
            "line": self.line,
            "kind": self.kind,
            "id": self.id,
            "sample": self.sample,
            "message": self.message,
        }


#: Largest sample number a completion line may carry (a 32-bit column in the exports).
MAX_SAMPLE = 2**31 - 1


class _Malformed(Exception):
    """Raised inside the parser; becomes a ``malformed`` :class:`LineProblem`."""


def split_custom_id(custom_id: str) -> tuple[str, int]:
    """``"s-001#3"`` -> ``("s-001", 3)``; without a numeric ``#`` suffix the sample is 0."""
    base, sep, tail = custom_id.rpartition("#")
    if sep and base and tail.isascii() and tail.isdigit():
        return base, int(tail)
    return custom_id, 0


def _text(value: object) -> str:
    """An error value as one line of text (a string, or ``message`` of an error object)."""
    if isinstance(value, Mapping):
        message = value.get("message")
        code = value.get("code")
        if isinstance(message, str):
            return f"{code}: {message}" if code else message
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return str(value)


def _sample(record: Mapping[str, Any]) -> int:
    sample = record.get("sample", 0)
    if sample is None:
        return 0
    if not isinstance(sample, int) or isinstance(sample, bool) or not 0 <= sample <= MAX_SAMPLE:
        shown = (
            sample
            if not isinstance(sample, int) or abs(sample) < 10**24
            else f"a {len(str(abs(sample)))}-digit number"
        )
        raise _Malformed(f"'sample' must be an integer from 0 to {MAX_SAMPLE}, got {shown!r}")
    return sample


def _chain(record: Mapping[str, Any]) -> dict[str, Any]:
    """The regeneration fields of an ``attempts.jsonl`` record (none for other files)."""
    if "attempt" not in record:
        request_hash = record.get("request_hash")  # a provider's journal: where the answer is
        return {"request_hash": request_hash} if isinstance(request_hash, str) else {}
    attempt = record["attempt"]
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise _Malformed(f"'attempt' must be a positive integer, got {attempt!r}")
    final = record.get("final", True)
    request_hash = record.get("request_hash")
    judge = record.get("judge")
    repair_turn = record.get("repair_turn")
    return {
        "attempt": attempt,
        "final": final if isinstance(final, bool) else True,
        "request_hash": request_hash if isinstance(request_hash, str) else None,
        "judge": judge if isinstance(judge, dict) else None,
        "repair_turn": repair_turn if isinstance(repair_turn, str) else None,
    }


def _from_jsonl(record: Mapping[str, Any], line: int) -> Completion:
    seed_id = record.get("id")
    if not isinstance(seed_id, str) or not seed_id:
        raise _Malformed(f"'id' must be a non-empty string, got {seed_id!r}")
    sample = _sample(record)
    finish = record.get("finish_reason")
    finish_reason = finish if isinstance(finish, str) else None
    error = record.get("error")
    chain = _chain(record)
    if error is None and "output" not in record:
        keys = ", ".join(sorted(map(str, record))) or "none"
        raise _Malformed(f"record {seed_id!r} has no 'output' (and no 'error'); keys: {keys}")
    return Completion(
        line=line,
        id=seed_id,
        sample=sample,
        output=record.get("output"),
        error=None if error is None else _text(error),
        finish_reason=finish_reason,
        **chain,
    )


def _from_batch(record: Mapping[str, Any], line: int) -> Completion:
    custom_id = record.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _Malformed(f"'custom_id' must be a non-empty string, got {custom_id!r}")
    seed_id, sample = split_custom_id(custom_id)
    answer = functools.partial(Completion, line=line, id=seed_id, sample=sample, format=BATCH)
    response = record.get("response")
    if response is None:
        if "body" in record and "url" in record:
            raise _Malformed(f"{custom_id!r} is a Batch API request line, not an output line")
        error = record.get("error")
        return answer(output=None, error=_text(error) if error is not None else "no response")
    if not isinstance(response, Mapping):
        raise _Malformed(f"{custom_id!r}: 'response' must be an object, got {type(response).__name__}")
    body = response.get("body")
    status = response.get("status_code")
    if status != 200 or not isinstance(body, Mapping) or body.get("error") is not None:
        detail = body.get("error") if isinstance(body, Mapping) else body
        return answer(
            output=None, error=f"HTTP {status}: {_text(detail)}" if detail is not None else f"HTTP {status}"
        )
    try:
        choice = body["choices"][0]
        message = choice["message"]
        content = message["content"]
    except (KeyError, IndexError, TypeError):
        raise _Malformed(f"{custom_id!r}: response.body.choices[0].message.content is missing") from None
    finish = choice.get("finish_reason") if isinstance(choice, Mapping) else None
    finish_reason = finish if isinstance(finish, str) else None
    error = None
    if content is None:
        refusal = message.get("refusal") if isinstance(message, Mapping) else None
        error = f"refusal: {refusal}" if refusal else f"no message content (finish_reason {finish_reason})"
    return answer(output=content, error=error, finish_reason=finish_reason)


def parse_completion_line(raw: bytes, line: int) -> Completion | LineProblem | None:
    """One line of a completion file; ``None`` for a blank line."""
    if jsontext.blank(raw, line):
        return None
    record = jsontext.parse_line(raw, line, unique_keys=True)
    if isinstance(record, jsontext.BadLine):
        return LineProblem(line=line, kind="malformed", message=record.message)
    if not isinstance(record, dict):
        return LineProblem(
            line=line, kind="malformed", message=f"expected a JSON object, got {type(record).__name__}"
        )
    try:
        if "custom_id" in record:
            return _from_batch(record, line)
        return _from_jsonl(record, line)
    except _Malformed as exc:
        seed_id = record.get("id") if isinstance(record.get("id"), str) else None
        return LineProblem(line=line, kind="malformed", message=str(exc), id=seed_id)


def read_completions(
    path: Path, digest: Any = None, numbers: Iterable[int] | None = None
) -> Iterator[Completion | LineProblem | None]:
    """Stream the file's lines as completions, problems, or ``None`` (blank line), in order.

    ``digest`` (a ``hashlib`` object), when given, is updated with every byte read. The line
    numbers given to records and problems are 1, 2, ... or, when given, ``numbers`` (one per
    line: a shard's journal reports the lines its records have in the run's merged file). A
    missing or unreadable file raises ``OSError`` on the first ``next()``.
    """
    with open(path, "rb") as fh:
        lines = enumerate(fh, start=1) if numbers is None else zip(numbers, fh, strict=True)
        for number, raw in lines:
            if digest is not None:
                digest.update(raw)
            yield parse_completion_line(raw, number)
