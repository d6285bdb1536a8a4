"""A regeneration chain in the run viewer, over real HTTP: every attempt with its labels and the
repair turn it was sent with; and the pass rate by the seed's sentence range.

The runs are made by the real TinyStories job with ``regenerate.max_attempts=2`` against a
scripted loopback server (sample 0's first answer of every seed fails, the repair passes), so
the repair turns the page shows are checked against the requests the server received.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from studio_support import REGENERATED_SEEDS, Running, make_regenerated_run, start_studio, stop_studio

from tests.support.runs import make_run
from tests.support.scripted_stories import instruction_of, is_repair


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("runs")
    bodies = make_regenerated_run(root / "feedback")
    make_regenerated_run(root / "no-feedback", "regenerate.feedback=false")
    make_run(root / "plain", 40, ranges=((3, 5), (6, 9), (2, 12)))  # no attempts: every answer counts
    return root, bodies


@pytest.fixture(scope="module")
def server(
    made: tuple[Path, list[dict[str, Any]]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    db = tmp_path_factory.mktemp("store") / "store.db"
    running, srv, thread = start_studio(f"sqlite:///{db}", runs=made[0])
    try:
        yield running
    finally:
        stop_studio(srv, thread)


def _get(server: Running, path: str) -> Any:
    reply = server.get(path)
    assert reply.status == 200, reply.body[:500]
    return reply.json()


def _answer(server: Running, run: str, row: int) -> dict[str, Any]:
    return dict(_get(server, f"/api/run/answer?name={run}&row={row}"))


def test_every_attempt_shows_its_labels_and_the_repair_turn_the_server_received(
    server: Running, made: tuple[Path, list[dict[str, Any]]]
) -> None:
    root, bodies = made
    records = _jsonl(root / "feedback" / "validated.jsonl")
    seeds = {s["id"]: s for s in _jsonl(root / "feedback" / "prompts_seed.jsonl")}
    # the user turn each repair request ended with, by the seed whose instruction it carries
    sent = {}
    for body in bodies:
        if is_repair(body):
            seed_id = next(
                i for i, s in seeds.items() if s["instruction"] == instruction_of(body["messages"])
            )
            assert body["messages"][-1]["role"] == "user"
            sent[seed_id] = body["messages"][-1]["content"]
    assert len(sent) == REGENERATED_SEEDS
    chains = [(row, r) for row, r in enumerate(records) if r["sample"] == 0]
    assert Counter(r["attempt"] for _, r in chains) == {1: REGENERATED_SEEDS, 2: REGENERATED_SEEDS}
    for row, record in chains:  # either attempt opens the whole chain
        body = _answer(server, "feedback", row)
        assert body["repair"] == {"feedback": True, "source": "rendered", "why": None}
        attempts = body["attempts"]
        mine = sorted(
            (r for r in records if r["id"] == record["id"] and r["sample"] == 0), key=lambda r: r["attempt"]
        )
        assert [(a["attempt"], a["passed"], a["labels"], a["output"]) for a in attempts] == [
            (r["attempt"], r["passed"], r["labels"], r["output"]) for r in mine
        ]
        assert set(attempts[0]["labels"]) == {"wrong_sentence_count", "missing_required"}
        assert attempts[0]["repair_turn"] is None  # the first attempt is the prompt alone
        assert attempts[1]["repair_turn"] == sent[record["id"]]
        seed = seeds[record["id"]]
        assert (
            f"it must have {seed['min_sentences']} to {seed['max_sentences']}." in attempts[1]["repair_turn"]
        )
    # a sample that passed at once has no chain to show
    single = next(row for row, r in enumerate(records) if r["sample"] == 1)
    assert _answer(server, "feedback", single)["attempts"] == []


def test_without_feedback_the_chain_says_the_prompt_was_sent_again(
    server: Running, made: tuple[Path, list[dict[str, Any]]]
) -> None:
    records = _jsonl(made[0] / "no-feedback" / "validated.jsonl")
    row = next(row for row, r in enumerate(records) if r["attempt"] == 2)
    body = _answer(server, "no-feedback", row)
    assert body["repair"]["feedback"] is False and "feedback=false" in body["repair"]["why"]
    assert [a["attempt"] for a in body["attempts"]] == [1, 2]
    assert [a["repair_turn"] for a in body["attempts"]] == [None, None]


@pytest.mark.parametrize("run", ["feedback", "no-feedback", "plain"])
def test_pass_rate_by_sentence_range_is_the_runs_own(
    server: Running, made: tuple[Path, list[dict[str, Any]]], run: str
) -> None:
    """Counted from the run's files here: each chain's last attempt with text, grouped by its
    seed's min..max; the counts are report/'s sentence bounds."""
    folder = made[0] / run
    seeds = {s["id"]: s for s in _jsonl(folder / "prompts_seed.jsonl")}
    last: dict[tuple[str, int], dict[str, Any]] = {}
    for record in _jsonl(folder / "validated.jsonl"):
        key = (record["id"], record["sample"])
        if key not in last or record.get("attempt", 1) > last[key].get("attempt", 1):
            last[key] = record
    expected: dict[str, dict[str, Any]] = {}
    for (seed_id, _), record in last.items():
        if not isinstance(record.get("output"), str):
            continue
        seed = seeds[seed_id]
        row = expected.setdefault(
            f"{seed['min_sentences']}..{seed['max_sentences']}", {"validated": 0, "passed": 0}
        )
        row["validated"] += 1
        row["passed"] += int(record["passed"])
    for row in expected.values():
        row["pass_rate"] = round(row["passed"] / row["validated"], 4)
    _get(server, f"/api/run/answers?name={run}&passed=false")  # a filter waits for the run's index
    info = _get(server, f"/api/run?name={run}")
    assert not info["indexing"]
    by_range = info["charts"]["by_sentence_range"]
    assert by_range == expected
    assert list(by_range) == sorted(by_range, key=lambda k: tuple(int(b) for b in k.split("..")))
    report = json.loads((folder / "report" / "summary.json").read_text("utf-8"))
    assert {k: v["validated"] for k, v in by_range.items()} == report["sentence_counts"]["bounds"]
    if run == "plain":  # its seeds ask for three ranges
        assert list(by_range) == ["2..12", "3..5", "6..9"] and any(
            0 < v["pass_rate"] < 1 for v in by_range.values()
        )
