"""Shared pieces of the executor tests: composing run configs and comparing two run directories."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from hydra import compose
from omegaconf import DictConfig

from tests.support.fake_server import Fault, Received, Rule

REPO = Path(__file__).resolve().parents[2]

# What legitimately differs between two runs of the same config, and nothing else:
#   the journals (generations*.jsonl, judgements*.jsonl) and attempts.jsonl: each record's
#     latency_s (a measurement of this run);
#   hence the sha256 of the completion file the checks read (generations.jsonl, or
#     attempts.jsonl with regeneration or a judge) quoted in report/summary.json,
#     report/summary.md and the manifest's completions.source.sha256 (each must equal the
#     sha256 of its own run's file);
#   manifest.json: every wall_time_s (a timing) and executor (which executor ran).
_LATENCY = re.compile(rb'"latency_s":[-+0-9.eE]+')
UNCOMPARED = ("run.log", ".hydra/", "shards/")


def run_cfg(*overrides: str) -> DictConfig:
    """The composed root config (Hydra must be initialised by the caller)."""
    return compose("config", overrides=list(overrides))


def provider_overrides(base_url: str, *, samples: int = 1, concurrency: int = 2) -> list[str]:
    return [
        "provider=openai",
        f"provider.base_url={base_url}",
        "provider.model=fake",
        "provider.seed=7",
        f"provider.samples={samples}",
        f"provider.concurrency={concurrency}",
        "provider.backoff_base_s=0.01",
        "provider.backoff_max_s=0.05",
        # Each run asks the server itself (no response cache), so a local run and a Ray run of
        # the same requests in one test are compared like for like, cache hits included.
        "cache.path=null",
    ]


def varied_answers(*, errors: bool) -> Rule:
    """A FakeServer rule that gives a run every kind of outcome, decided by the request alone.

    By a hash of the prompt and the request's seed: a two-sentence answer without the required
    phrases (a rejected text, so seeds with a passing sample get DPO pairs), an empty answer
    (label ``other``), with ``errors`` an HTTP 500 (a provider error record once retries are
    spent), else the server's made-up story (most of which pass).
    """

    def rule(received: Received) -> Fault | None:
        body = received.json
        prompt = body["messages"][-1]["content"]
        pick = hashlib.sha256(f"{prompt}|{body.get('seed')}".encode()).digest()[0] % 8
        if pick in (0, 1):
            return _answer(body, "A cat sat. It slept.")
        if pick == 2:
            return _answer(body, None)
        if pick == 3 and errors:
            return Fault.http(500, "the model fell over")
        return None

    return rule


def _answer(body: dict[str, Any], content: str | None) -> Fault:
    """A 200 answer with ``content`` as its one choice."""
    answer = {
        "id": "chatcmpl-varied",
        "object": "chat.completion",
        "model": body["model"],
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }
    return Fault(kind="status", status=200, body=json.dumps(answer))


def run_files(root: Path) -> list[str]:
    """Every file of a run, relative to its directory, except logs, snapshots and shard directories."""
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    return [n for n in names if not n.startswith(UNCOMPARED) and n != "run.log"]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _without_generation_hash(data: bytes, sha: str) -> bytes:
    return data.replace(sha.encode(), b"<sha256>").replace(sha[:16].encode(), b"<sha256>")


_CARD_COMMAND = re.compile(rb"^\| command \| .* \|$", re.MULTILINE)


def assert_same_run(local: Path, other: Path, *, resumed: bool = False) -> None:
    """``other`` holds exactly ``local``'s files, byte for byte, up to the differences listed above.

    With ``resumed`` (``other`` was finished by a rerun), the manifests' ``generation`` and
    ``regeneration`` entries and ``cost.this_run`` are not compared: they count what each run sent.
    """
    assert run_files(local) == run_files(other)
    source = _source(local)
    local_sha, other_sha = _sha(local / source), _sha(other / source)
    for name in run_files(local):
        a, b = (local / name).read_bytes(), (other / name).read_bytes()
        if name.endswith(".jsonl"):
            a, b = _LATENCY.sub(b'"latency_s":0', a), _LATENCY.sub(b'"latency_s":0', b)
        if name in ("report/summary.json", "report/summary.md"):
            a, b = _without_generation_hash(a, local_sha), _without_generation_hash(b, other_sha)
        elif name == "manifest.json":
            a, b = _comparable_manifest(a, local_sha, resumed), _comparable_manifest(b, other_sha, resumed)
        elif name == "README.md":  # the dataset card names the command a run was started with
            a, b = _CARD_COMMAND.sub(b"| command | |", a), _CARD_COMMAND.sub(b"| command | |", b)
        assert a == b, f"{name} differs"


def _source(run: Path) -> str:
    """The completion file the run's checks read (generations.jsonl when there are none)."""
    manifest = json.loads((run / "manifest.json").read_bytes())
    return str(manifest.get("completions", {}).get("source", {}).get("file", "generations.jsonl"))


def _without_timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k != "wall_time_s"}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def _comparable_manifest(data: bytes, sha: str, resumed: bool) -> bytes:
    manifest = _without_timings(json.loads(data))
    manifest.pop("executor", None)
    if resumed:  # what each run sent (and spent) differs; what the data cost does not
        manifest.pop("generation")
        manifest.pop("regeneration", None)
        manifest.get("cost", {}).pop("this_run", None)
    source = manifest.get("completions", {}).get("source", {})
    if source:
        assert source["sha256"] == sha
        source["sha256"] = "<sha256>"
    return json.dumps(manifest, indent=2).encode()


def assert_exactly_once(path: Path, prompts: Path, samples: int) -> list[dict[str, Any]]:
    """Each (prompt id, sample) of ``prompts`` is in ``path`` once, and nothing else is."""
    records = [json.loads(line) for line in path.read_bytes().splitlines()]
    counts = Counter((r["id"], r["sample"]) for r in records)
    ids = [json.loads(line)["id"] for line in prompts.read_bytes().splitlines()]
    assert set(counts) == {(i, k) for i in ids for k in range(samples)}
    assert max(counts.values()) == 1, [key for key, n in counts.items() if n > 1]
    return records
