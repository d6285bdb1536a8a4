"""stage=batch_export: Batch API input files, their split at the limits, and the round trip via completions=."""

from __future__ import annotations

import json
import random
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from provider_support import REPO

from storyforge.config import register_configs
from storyforge.config.provider import generation_settings
from storyforge.errors import ConfigError
from storyforge.pipeline import run_in
from storyforge.providers.base import content_hash, encode_body
from storyforge.providers.batch_files import export_batch_files
from storyforge.tasks.tinystories.completions import split_custom_id
from tests.support.fake_server import FakeServer


@pytest.fixture(scope="module")
def hydra_conf() -> Iterator[None]:
    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        yield


def _provider(base_url: str) -> list[str]:
    return [
        "provider=openai",
        f"provider.base_url={base_url}",
        "provider.model=fake",
        "provider.seed=11",
        "provider.samples=2",
        "provider.progress=false",
    ]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def _batch_output(inputs: list[dict[str, Any]], base_url: str) -> list[dict[str, Any]]:
    """What the Batch API returns for ``inputs``: each body POSTed to a real server, wrapped per line."""
    out = []
    for n, line in enumerate(inputs):
        request = urllib.request.Request(
            base_url.removesuffix("/v1") + line["url"],
            data=json.dumps(line["body"]).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = json.loads(answer.read())
        out.append(
            {
                "id": f"batch_req_{n}",
                "custom_id": line["custom_id"],
                "response": {"status_code": 200, "request_id": f"req_{n}", "body": body},
                "error": None,
            }
        )
    return out


def test_batch_files_round_trip_through_completions(hydra_conf: None, tmp_path: Path) -> None:
    """Export, answer each line as the Batch API would (shuffled), read back: the live run's answers."""
    with FakeServer() as server:
        live = run_in(
            compose("config", overrides=["task.n_seeds=8", *_provider(server.base_url)]), tmp_path / "live"
        )
        exported = run_in(
            compose(
                "config", overrides=["task.n_seeds=8", *_provider(server.base_url), "stage=batch_export"]
            ),
            tmp_path / "batch",
        )
        inputs = _lines(tmp_path / "batch" / "batch" / "batch_input_0000.jsonl")
        answers = _batch_output(inputs, server.base_url)
    assert exported["batch_export"]["requests"] == 16 and len(exported["batch_export"]["files"]) == 1
    assert not (tmp_path / "batch" / "generations.jsonl").exists()  # nothing was sent live
    generations = _lines(tmp_path / "live" / "generations.jsonl")
    # Same ids, samples and bodies as the live run sends: the request hashes agree.
    assert [(g["id"], g["sample"], g["request_hash"]) for g in generations] == [
        (*split_custom_id(line["custom_id"]), content_hash(encode_body(line["body"]))) for line in inputs
    ]
    assert inputs[1]["custom_id"] == "ts-000000#1"  # the documented <seed id>#<sample>
    assert {line["method"] for line in inputs} == {"POST"} and {line["url"] for line in inputs} == {
        "/v1/chat/completions"
    }

    random.Random(5).shuffle(answers)  # the Batch API does not keep the input order
    output = tmp_path / "batch_output.jsonl"
    output.write_text("".join(json.dumps(a) + "\n" for a in answers), "utf-8")
    back = tmp_path / "back"
    manifest = run_in(compose("config", overrides=["task.n_seeds=8", f"completions={output}"]), back)
    validated = {(v["id"], v["sample"]): v for v in _lines(back / "validated.jsonl")}
    live_validated = {(v["id"], v["sample"]): v for v in _lines(tmp_path / "live" / "validated.jsonl")}
    assert validated.keys() == live_validated.keys() and len(validated) == 16
    for key, record in validated.items():
        # the same verdicts and texts; the provenance says where each came from (a live
        # provider's journal, or a file of answers with no model of its own)
        assert {**record, "line": 0, "provenance": None} == {
            **live_validated[key],
            "line": 0,
            "provenance": None,
        }
        assert (
            record["provenance"]["model"] is None and live_validated[key]["provenance"]["model"] is not None
        )
    assert manifest["completions"]["source"]["formats"] == {"openai_batch": 16}
    assert live["completions"]["passed"] == manifest["completions"]["passed"]


@pytest.mark.parametrize(
    ("max_requests", "max_bytes", "sizes"),
    [
        pytest.param(5, 10**9, [5, 5, 2], id="by-count"),
        pytest.param(50_000, "three-lines", [3, 3, 3, 3], id="by-size"),
    ],
)
def test_batch_files_split_at_the_limits(
    hydra_conf: None, tmp_path: Path, max_requests: int, max_bytes: int | str, sizes: list[int]
) -> None:
    """A file ends before it would pass the request or byte limit; no request is lost or repeated."""
    cfg = compose("config", overrides=["task.n_seeds=6", *_provider("http://127.0.0.1:9/v1")])
    run_in(compose("config", overrides=["task.n_seeds=6"]), tmp_path)
    whole = export_batch_files(generation_settings(cfg), tmp_path / "one", tmp_path / "prompts.jsonl")
    lines = (tmp_path / "one" / "batch" / "batch_input_0000.jsonl").read_bytes().splitlines(keepends=True)
    limit = max(len(line) for line in lines) * 3 if max_bytes == "three-lines" else int(max_bytes)
    summary = export_batch_files(
        generation_settings(cfg),
        tmp_path,
        tmp_path / "prompts.jsonl",
        max_requests=max_requests,
        max_bytes=limit,
    )
    assert [f["records"] for f in summary["files"]] == sizes
    assert all(f["bytes"] <= limit for f in summary["files"])
    parts = sorted((tmp_path / "batch").glob("batch_input_*.jsonl"))
    assert [p.name for p in parts] == [f"batch_input_{k:04d}.jsonl" for k in range(len(sizes))]
    assert b"".join(p.read_bytes() for p in parts) == b"".join(lines)
    assert whole["requests"] == summary["requests"] == 12


def test_batch_export_needs_the_openai_format(hydra_conf: None, tmp_path: Path) -> None:
    """The Batch API format is OpenAI's; an Ollama provider is refused naming the choice to make."""
    cfg = compose(
        "config", overrides=["task.n_seeds=2", "provider=ollama", "provider.model=x", "stage=batch_export"]
    )
    with pytest.raises(ConfigError, match="choose provider=openai"):
        run_in(cfg, tmp_path)
