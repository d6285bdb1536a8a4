"""The judge against a scripted loopback server: structured verdicts, labels, regeneration, retries, stage=judge."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hydra import compose

from storyforge.config.judge import judge_settings
from storyforge.errors import ConfigError
from storyforge.pipeline import run_in
from storyforge.providers.structured import structured_fields
from tests.support.fake_server import FakeServer
from tests.support.scripted_stories import instruction_of, is_repair, passing_story

SEEDS = 4
SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["pass", "fail"]},
        "rule": {"type": "string"},
        "reason": {"type": "string"},
    },
    "required": ["verdict", "rule", "reason"],
    "additionalProperties": False,
}


def is_judge(body: Mapping[str, Any]) -> bool:
    return "response_format" in body or "json_schema" in body


def story_of(body: Mapping[str, Any]) -> str:
    text = str(body["messages"][-1]["content"])
    return text.split("The story:\n", 1)[1].split("\n\nAnswer with", 1)[0]


def script(body: Mapping[str, Any]) -> str:
    """Stories pass the rules; the judge fails one without "gently", which a repair adds."""
    if is_judge(body):
        if "gently" in story_of(body):
            return json.dumps({"verdict": "pass", "rule": "none", "reason": "kind and calm"})
        return json.dumps({"verdict": "fail", "rule": "violence", "reason": "Zob saw a fight"})
    story = passing_story(instruction_of(list(body["messages"])))
    return story.replace("Zob saw", "Zob gently saw", 1) if is_repair(body) else story


def _cfg(url: str, tmp: Path, *extra: str) -> Any:
    return compose(
        "config",
        overrides=[
            "task=tinystories",
            f"task.n_seeds={SEEDS}",
            "provider=openai",
            f"provider.base_url={url}",
            "provider.model=fake",
            "provider.seed=100",
            "provider.concurrency=2",
            "provider.progress=false",
            f"cache.path={tmp / 'cache.sqlite'}",
            "export.plots=false",
            "dedup=none",  # the scripted stories of one seed are the same text
            "judge=content_safety",
            "+pricing.models.fake={input: 1.0, cached_input: 0.5, output: 2.0}",
            *extra,
        ],
    )


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def test_a_failed_verdict_is_label_other_with_the_judges_rule_and_reason(hydra_conf, tmp_path):
    run = tmp_path / "run"
    with FakeServer(script=script) as server:
        manifest = run_in(_cfg(server.base_url, tmp_path), run)
        judged = [r.json for r in server.received if is_judge(r.json)]
    assert len(judged) == SEEDS
    for body in judged:  # the schema goes to the server in OpenAI's native form
        assert body["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True},
        }
        assert body["max_tokens"] == 256 and body["seed"] == 0
    validated = _lines(run / "validated.jsonl")
    assert {(r["passed"], tuple(r["labels"])) for r in validated} == {(False, ("other",))}
    assert {tuple(r["reasons"]) for r in validated} == {("judge: violence: Zob saw a fight",)}
    assert manifest["completions"]["pass_rate"] == 0.0
    assert manifest["regeneration"]["judge"]["verdicts"] == {"pass": 0, "fail": SEEDS, "error": 0}
    assert manifest["cost"]["this_run"]["stages"]["judge"]["requests"] == SEEDS


def test_a_judge_failure_feeds_regeneration_and_the_repair_turn_names_it(hydra_conf, tmp_path):
    run = tmp_path / "run"
    with FakeServer(script=script) as server:
        manifest = run_in(_cfg(server.base_url, tmp_path, "regenerate.max_attempts=2"), run)
        repairs = [r.json for r in server.received if is_repair(r.json) and not is_judge(r.json)]
    assert len(repairs) == SEEDS
    assert all(
        "A reviewer found that it breaks the rule (violence): Zob saw a fight"
        in body["messages"][-1]["content"]
        for body in repairs
    )
    assert manifest["completions"]["pass_rate"] == 1.0
    rates = [row["pass_rate"] for row in manifest["completions"]["regeneration"]["by_attempt"]]
    assert rates == [0.0, 1.0]
    assert manifest["completions"]["regeneration"]["transitions"]["other"]["pass"] == SEEDS
    sft = _lines(run / "sft.jsonl")
    assert all("gently" in row["messages"][-1]["content"] for row in sft) and len(sft) == SEEDS


def test_an_invalid_verdict_is_retried_then_recorded_as_a_judge_error(hydra_conf, tmp_path):
    """First try: not JSON; with retries=1 the second try (next seed) is valid; with 0 it is an error."""

    def flaky(body: Mapping[str, Any]) -> str:
        if is_judge(body) and body["seed"] == 0:
            return '{"verdict": "maybe"'
        if is_judge(body):
            return json.dumps({"verdict": "pass", "rule": "none", "reason": "fine"})
        return passing_story(instruction_of(list(body["messages"])))

    with FakeServer(script=flaky) as server:
        retried = run_in(
            _cfg(server.base_url, tmp_path, "judge.retries=1", "cache.path=null"), tmp_path / "a"
        )
        errored = run_in(  # every answer a judge error: allowed here by the error limit
            _cfg(
                server.base_url,
                tmp_path,
                "judge.retries=0",
                "cache.path=null",
                "provider.max_error_rate=1",
            ),
            tmp_path / "b",
        )
    assert retried["regeneration"]["judge"]["verdicts"] == {"pass": SEEDS, "fail": 0, "error": 0}
    assert retried["completions"]["pass_rate"] == 1.0
    assert errored["regeneration"]["judge"]["verdicts"] == {"pass": 0, "fail": 0, "error": SEEDS}
    reasons = {tuple(r["reasons"]) for r in _lines(tmp_path / "b" / "validated.jsonl")}
    assert len(reasons) == 1 and next(iter(reasons))[0].startswith(
        "judge error: no valid verdict after 1 request(s): not JSON"
    )


def test_stage_judge_adds_a_judge_to_a_finished_run_without_resending_generation(hydra_conf, tmp_path):
    run = tmp_path / "run"
    with FakeServer(script=script) as server:
        run_in(_cfg(server.base_url, tmp_path, "judge=none", "cache.path=null"), run)
        generated = server.request_count
        assert not (run / "judgements.jsonl").exists()
        run_in(_cfg(server.base_url, tmp_path, "stage=judge", "cache.path=null"), run)
        sent = [r.json for r in server.received[generated:]]
    assert len(sent) == SEEDS and all(is_judge(body) for body in sent)
    assert len(_lines(run / "judgements.jsonl")) == SEEDS
    assert {tuple(r["labels"]) for r in _lines(run / "validated.jsonl")} == {("other",)}


def test_stage_judge_refuses_an_unfinished_run(hydra_conf, tmp_path):
    with FakeServer(script=script) as server:
        with pytest.raises(ConfigError, match="stage=judge: 4 of 4 request"):
            run_in(_cfg(server.base_url, tmp_path, "stage=judge"), tmp_path / "run")
        assert server.request_count == 0


def test_replay_rebuilds_judged_runs_with_no_server(hydra_conf, tmp_path):
    with FakeServer(script=script) as server:
        run_in(_cfg(server.base_url, tmp_path, "regenerate.max_attempts=2"), tmp_path / "a")
        url = server.base_url
    run_in(_cfg(url, tmp_path, "regenerate.max_attempts=2", "provider.replay=only"), tmp_path / "b")
    for name in ("validated.jsonl", "sft.jsonl", "rejects.jsonl", "report/summary.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


@pytest.mark.parametrize(
    ("dialect", "provider", "expected"),
    [
        (
            "auto",
            "openai",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True},
                }
            },
        ),
        ("auto", "ollama", {"format": SCHEMA}),
        ("llama_cpp", "openai", {"json_schema": SCHEMA}),
        ("ollama", "ollama", {"format": SCHEMA}),
    ],
)
def test_the_schema_in_each_servers_native_form(dialect, provider, expected):
    assert structured_fields(dialect, provider, SCHEMA) == expected


@pytest.mark.parametrize(
    ("node", "message"),
    [
        (
            {"name": "x", "schema": {"type": "object", "properties": {"ok": {}}}},
            "must have a 'verdict' property",
        ),
        ({"name": "x", "schema": {"type": 7, "properties": {"verdict": {}}}}, "not a valid JSON Schema"),
        ({"name": "x", "schema": SCHEMA, "retries": -1}, "judge.retries must be 0..10"),
        (
            {"name": "x", "schema": SCHEMA, "structured_output": "xml"},
            "judge.structured_output must be one of",
        ),
        ({"name": "x", "schema": SCHEMA, "modle": "m"}, "judge.modle: not a judge key"),
    ],
)
def test_bad_judge_settings_name_the_key(node, message):
    from omegaconf import OmegaConf

    with pytest.raises(ConfigError, match=message):
        judge_settings(OmegaConf.create({"judge": node}))


def test_unknown_judge_provider_keys_fail_before_anything_is_written(hydra_conf, tmp_path):
    with FakeServer(script=script) as server:
        with pytest.raises(
            ConfigError, match=r"judge\.provider\.modle: unknown key\. Did you mean judge\.provider\.model\?"
        ):
            run_in(_cfg(server.base_url, tmp_path, "+judge.provider.modle=x"), tmp_path / "run")
        assert server.request_count == 0
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_copied_run_directory_replays_from_its_journals_alone(tmp_path):
    """Regeneration and judge included: copy the run elsewhere, drop its exports, replay its
    snapshot with no server and no cache file: the same files."""
    import os
    import shutil
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])),
    }
    run, copy = tmp_path / "run", tmp_path / "elsewhere" / "run"
    with FakeServer(script=script) as server:
        args = [
            "task=tinystories",
            f"task.n_seeds={SEEDS}",
            "provider=openai",
            f"provider.base_url={server.base_url}",
            "provider.model=fake",
            "provider.seed=100",
            "provider.progress=false",
            "judge=content_safety",
            "regenerate.max_attempts=2",
            "+pricing.models.fake={input: 1.0, cached_input: 0.5, output: 2.0}",
            f"hydra.run.dir={run}",
        ]
        subprocess.run([sys.executable, "run.py", *args], cwd=repo, env=env, check=True, capture_output=True)
    shutil.copytree(run, copy)
    kept = (
        "validated.jsonl",
        "sft.jsonl",
        "rejects.jsonl",
        "dpo.jsonl",
        "attempts.jsonl",
        "report/summary.json",
    )
    for name in kept:
        (copy / name).unlink()
    replay = [
        sys.executable,
        "run.py",
        "--config-path",
        str(copy / ".hydra"),
        "--config-name",
        "config",
        "provider.replay=only",
        "cache.path=null",
        f"hydra.run.dir={copy}",
    ]
    proc = subprocess.run(replay, cwd=repo, env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in kept:
        assert (copy / name).read_bytes() == (run / name).read_bytes(), name
    stages = json.loads((copy / "manifest.json").read_text())["cost"]["this_run"]["stages"]
    assert {stage: row["requests"] for stage, row in stages.items()} == dict.fromkeys(stages, 0)


def test_judge_margin_pairs_the_best_rated_answer_with_a_judged_failure(hydra_conf, tmp_path):
    """Sample 1's story is calm (score 0.9), sample 0's is not (0.25): one pair per seed, margin 0.65."""

    def rated(body: Mapping[str, Any]) -> str:
        if is_judge(body):
            calm = "gently" in story_of(body)
            verdict = {"verdict": "pass", "rule": "none", "reason": "calm", "score": 0.9}
            return json.dumps(
                verdict
                if calm
                else {"verdict": "fail", "rule": "violence", "reason": "a fight", "score": 0.25}
            )
        story = passing_story(instruction_of(list(body["messages"])))
        return story.replace("Zob saw", "Zob gently saw", 1) if body["seed"] == 101 else story

    run = tmp_path / "run"
    with FakeServer(script=rated) as server:
        cfg = _cfg(
            server.base_url,
            tmp_path,
            "provider.samples=2",
            "export.dpo_pairing=judge_margin",
            "+judge.schema.properties.score={type: number}",
        )
        manifest = run_in(cfg, run)
    dpo = _lines(run / "dpo.jsonl")
    assert [(r["chosen_sample"], r["rejected_sample"], r["margin"]) for r in dpo] == [(1, 0, 0.65)] * SEEDS
    assert all(r["rejected_labels"] == ["other"] and "gently" in r["chosen"][0]["content"] for r in dpo)
    assert manifest["completions"]["exports"]["seeds_with_pairs"] == SEEDS
    import pyarrow.parquet as pq

    assert pq.read_table(run / "dpo.parquet").column("margin").to_pylist() == [0.65] * SEEDS
