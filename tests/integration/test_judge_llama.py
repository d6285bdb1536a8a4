"""The judge on a real llama.cpp ``llama-server``: the verdict's JSON Schema constrains its grammar.

Generation runs on the scripted loopback server (its stories pass the seed's rules, so every
answer is judged); the judge is the real ``llama-server`` serving the tiny random model the
tests write (``judge.provider`` points at it). Its answers are nonsense, but under
``json_schema`` the server can only produce text of the verdict's shape, and storyforge still
validates each one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from storyforge.config import register_configs
from storyforge.config.judge import judge_settings
from storyforge.pipeline import run_in
from storyforge.tasks.tinystories.judge import Verdict, read_verdict
from tests.support.fake_server import FakeServer
from tests.support.llama_server import LlamaServer
from tests.support.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
from tests.support.scripted_stories import instruction_of, passing_story


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    model = write_tiny_llama(tmp_path_factory.mktemp("model") / "tiny.gguf", seed=3)
    # --no-jinja: this llama.cpp build's Jinja chat path fails to set up any grammar sampler for
    # the tiny model's template ("Failed to initialize samplers"); the legacy chat path serves
    # json_schema as users of ChatML models get it.
    with LlamaServer(model, alias="tiny", context=4096, parallel=2, extra_args=("--no-jinja",)) as server:
        yield server


def test_llama_server_judge_gives_schema_valid_verdicts(tmp_path, llama):
    register_configs()
    n_seeds = 4
    stories = FakeServer(script=lambda body: passing_story(instruction_of(list(body["messages"]))))
    with stories as gen, initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(
            "config",
            overrides=[
                "task=tinystories",
                f"task.n_seeds={n_seeds}",
                "provider=openai",
                f"provider.base_url={gen.base_url}",
                "provider.model=fake",
                "provider.progress=false",
                f"cache.path={tmp_path / 'cache.sqlite'}",
                "export.plots=false",
                "dedup=none",  # the scripted stories of one seed are the same text
                "judge=content_safety",
                "judge.structured_output=llama_cpp",
                f"+judge.provider.base_url={llama.base_url}",
                "+judge.provider.model=tiny",
                "+judge.provider.timeout_s=240",
                "judge.max_tokens=400",
                "+judge.schema.properties.rule.maxLength=12",
                "+judge.schema.properties.reason.maxLength=40",
            ],
        )
        manifest = run_in(cfg, tmp_path / "run")
    judge = manifest["regeneration"]["judge"]
    assert judge["verdicts"]["error"] == 0, judge
    assert judge["verdicts"]["pass"] + judge["verdicts"]["fail"] == n_seeds
    records = [json.loads(line) for line in (tmp_path / "run" / "judgements.jsonl").read_text().splitlines()]
    assert len(records) == n_seeds
    settings = judge_settings(cfg)
    for record in records:  # every verdict the server wrote is valid under the schema, checked again here
        assert isinstance(read_verdict(record["output"], settings.schema), Verdict), record["output"]
    validated = [json.loads(line) for line in (tmp_path / "run" / "validated.jsonl").read_text().splitlines()]
    failed = [r for r in validated if not r["passed"]]
    assert len(failed) == judge["verdicts"]["fail"]
    assert all(r["labels"] == ["other"] and r["reasons"][0].startswith("judge: ") for r in failed)
