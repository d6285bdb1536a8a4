"""Cut-off answers and echoes over real HTTP: they fail with label other, are asked again, and
never reach the exports as passing; every exported row says how its answer ended."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra import compose

from storyforge.pipeline import run_in
from tests.support.fake_server import FakeServer
from tests.support.scripted_stories import FAILED_STORY, instruction_of, is_repair, passing_story

SEEDS = 4
FIRST = 100  # provider.seed: sample s, attempt k is sent with FIRST + s + (k - 1) * samples


def _cfg(server: FakeServer, tmp: Path, samples: int, *extra: str) -> Any:
    return compose(
        "config",
        overrides=[
            "task=tinystories",
            f"task.n_seeds={SEEDS}",
            "provider=openai",
            f"provider.base_url={server.base_url}",
            "provider.model=fake",
            f"provider.seed={FIRST}",
            f"provider.samples={samples}",
            "provider.concurrency=2",
            "provider.progress=false",
            f"cache.path={tmp / 'cache.sqlite'}",
            "export.plots=false",
            "dedup=none",
            *extra,
        ],
    )


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def _cut_off_script(body: Mapping[str, Any]) -> str | tuple[str, str]:
    """Sample 0's first answer passes the rules but stopped at max_tokens; sample 1 fails the
    rules; sample 2 and every repair pass."""
    story = passing_story(instruction_of(list(body["messages"])))
    if is_repair(body):
        return story
    return {FIRST: (story, "length"), FIRST + 1: FAILED_STORY}.get(body["seed"], story)


def test_a_cut_off_answer_fails_and_every_exported_row_has_its_finish_reason(hydra_conf, tmp_path):
    run = tmp_path / "run"
    with FakeServer(script=_cut_off_script) as server:
        manifest = run_in(_cfg(server, tmp_path, 3, "provider.max_tokens=300"), run)
    validated = _lines(run / "validated.jsonl")
    cut = [r for r in validated if r["sample"] == 0]
    assert len(cut) == SEEDS
    for row in cut:
        assert row["passed"] is False and row["finish_reason"] == "length"
        assert row["labels"] == ["other"] and row["reasons"] == ["cut off at max_tokens=300"]
    assert manifest["completions"]["passed"] == SEEDS  # sample 2 only
    sft = _lines(run / "sft.jsonl")
    assert {r["sample"] for r in sft} == {2}
    assert all(r["finish_reason"] == "stop" for r in sft)
    rejects = _lines(run / "rejects.jsonl")
    assert {(r["sample"], r["finish_reason"]) for r in rejects} == {(0, "length"), (1, "stop")}
    dpo = _lines(run / "dpo.jsonl")
    assert len(dpo) == SEEDS  # the cut-off answer (label other) is never the rejected side
    for row in dpo:
        assert (row["chosen_sample"], row["rejected_sample"]) == (2, 1)
        assert (row["chosen_finish_reason"], row["rejected_finish_reason"]) == ("stop", "stop")
    import pyarrow.parquet as pq

    for name in ("validated", "sft", "rejects"):
        assert "finish_reason" in pq.read_schema(run / f"{name}.parquet").names
    assert {"chosen_finish_reason", "rejected_finish_reason"} <= set(
        pq.read_schema(run / "dpo.parquet").names
    )


def test_a_cut_off_answer_is_asked_again_for_a_shorter_complete_story(hydra_conf, tmp_path):
    run = tmp_path / "run"
    with FakeServer(script=_cut_off_script) as server:
        run_in(_cfg(server, tmp_path, 3, "regenerate.max_attempts=2", "provider.max_tokens=300"), run)
        repairs = [r.json for r in server.received if is_repair(r.json)]
    after_cut = [body for body in repairs if body["seed"] == FIRST + 3]  # sample 0, attempt 2
    assert len(after_cut) == SEEDS
    for body in after_cut:
        turn = body["messages"][-1]["content"]
        assert "Your story was cut off before its end. Write a shorter story that is complete." in turn
    sft = _lines(run / "sft.jsonl")
    assert sorted((r["sample"], r["attempt"]) for r in sft) == sorted([(0, 2), (1, 2), (2, 1)] * SEEDS)
    attempts = _lines(run / "attempts.jsonl")
    second = [r for r in attempts if r["attempt"] == 2]
    assert second and all(r["repair_turn"].startswith("Your story does not follow") for r in second)


def _echo_line(story: str, line: str) -> str:
    """A passing story with ``line`` (no sentence end in it) inside its last sentence."""
    return story[:-1] + ", " + line.strip(" .-") + "."


REPAIR_LINE = "write the whole story again so that it follows every constraint"
INSTRUCTION_LINE = "Must include ALL of these exact phrases (case-insensitive match is acceptable):"


def _echo_script(body: Mapping[str, Any]) -> str:
    """Sample 0 fails, then echoes the repair turn, then passes; sample 1 echoes the
    instruction, then passes. Each echo passes the seed's rules."""
    story = passing_story(instruction_of(list(body["messages"])))
    return {
        FIRST: FAILED_STORY,
        FIRST + 2: _echo_line(story, REPAIR_LINE),
        FIRST + 1: _echo_line(story, INSTRUCTION_LINE),
    }.get(body["seed"], story)


def test_echoes_of_the_instruction_and_of_the_repair_turn_are_caught(hydra_conf, tmp_path):
    run = tmp_path / "run"
    with FakeServer(script=_echo_script) as server:
        run_in(_cfg(server, tmp_path, 2, "regenerate.max_attempts=3"), run)
        repairs = {(r.json["seed"]): r.json for r in server.received if is_repair(r.json)}
    seeds = {s["id"]: s for s in _lines(run / "prompts_seed.jsonl")}
    from storyforge.tasks.tinystories import validate_output

    validated = {(r["id"], r["sample"], r["attempt"]): r for r in _lines(run / "validated.jsonl")}
    assert len(validated) == SEEDS * 5  # sample 0: 3 attempts; sample 1: 2
    for seed_id, seed in seeds.items():
        repair_echo = validated[(seed_id, 0, 2)]
        assert validate_output(seed, repair_echo["output"]).passed  # the seed's rules alone pass it
        assert repair_echo["labels"] == ["other"] and not repair_echo["passed"]
        (reason,) = repair_echo["reasons"]
        assert reason.startswith('repeats 11 words of the repair turn: "') and REPAIR_LINE in reason.lower()
        instruction_echo = validated[(seed_id, 1, 1)]
        assert validate_output(seed, instruction_echo["output"]).passed
        assert instruction_echo["labels"] == ["other"]
        assert instruction_echo["reasons"][0].startswith("repeats 12 words of the instruction: ")
        assert validated[(seed_id, 0, 3)]["passed"] and validated[(seed_id, 1, 2)]["passed"]
    # the attempt after an echo is told so
    assert repairs, "no repair conversation was sent"
    after_echo = [body for seed, body in repairs.items() if seed in (FIRST + 3, FIRST + 4)]
    assert after_echo
    for body in after_echo:
        assert (
            "Your answer repeated my request instead of telling a story." in body["messages"][-1]["content"]
        )
    sft = _lines(run / "sft.jsonl")
    assert len(sft) == 2 * SEEDS
    for row in sft:
        text = row["messages"][-1]["content"].lower()
        assert REPAIR_LINE not in text and "exact phrases" not in text


def test_an_echo_server_passes_nothing(hydra_conf, tmp_path):
    """The fake server's echo mode ("reply to: <instruction>") used to pass 8 of 20 seeds."""
    run = tmp_path / "run"
    with FakeServer(replies="echo") as server:
        cfg = compose(
            "config",
            overrides=[
                "task=tinystories",
                "task.n_seeds=20",
                "provider=openai",
                f"provider.base_url={server.base_url}",
                "provider.model=fake",
                "provider.progress=false",
                f"cache.path={tmp_path / 'cache.sqlite'}",
                "export.plots=false",
            ],
        )
        manifest = run_in(cfg, run)
    assert manifest["completions"]["passed"] == 0
    assert not (run / "sft.jsonl").read_text("utf-8").strip()
    rows = _lines(run / "validated.jsonl")
    assert len(rows) == 20 and all("other" in r["labels"] for r in rows)
    assert all(any(reason.startswith("repeats ") for reason in r["reasons"]) for r in rows)


def test_a_rerun_rebuilds_the_repair_turns_its_chains_answered(hydra_conf, tmp_path):
    """Chains rebuilt from the journals keep the repair turn each attempt answered: the echo
    check and attempts.jsonl are the same as in the run that sent them."""
    run = tmp_path / "run"
    names = ("attempts.jsonl", "validated.jsonl", "sft.jsonl")
    with FakeServer(script=_echo_script) as server:
        run_in(_cfg(server, tmp_path, 2, "regenerate.max_attempts=3"), run)
        first = {name: (run / name).read_bytes() for name in names}
        sent = server.request_count
        run_in(_cfg(server, tmp_path, 2, "regenerate.max_attempts=3"), run)
        assert server.request_count == sent  # every attempt read back from its journal
    assert any("repair_turn" in r for r in _lines(run / "attempts.jsonl"))
    for name in names:
        assert (run / name).read_bytes() == first[name], name
