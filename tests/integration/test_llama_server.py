"""The providers against a real llama.cpp ``llama-server`` serving a tiny model the tests write.

The server is built once from the llama.cpp sources in the llama-cpp-python sdist and cached
under ``~/.cache/storyforge/`` (``storyforge setup-model --server-only``; ``.ci/run``
builds it before the tests). The model is written here with the ``gguf`` package: llama
architecture, two layers, random weights, a small vocabulary and a ChatML chat template, so its
stories are gibberish but every byte of the HTTP exchange is the real server's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storyforge.config.provider import OPENAI_PREFIX_MODES
from storyforge.errors import EXIT_CODES
from tests.support.llama_server import LlamaServer
from tests.support.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("model") / "tiny.gguf", seed=3)


@pytest.fixture(scope="module")
def llama(model: Path) -> Iterator[LlamaServer]:
    with LlamaServer(model, alias="tiny", context=8192, parallel=2) as server:
        yield server


def run_py(run_dir: Path, server: LlamaServer, *overrides: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "run.py",
        "task=tinystories",
        "provider=openai",
        "provider.model=tiny",
        f"provider.base_url={server.base_url}",
        "provider.progress=false",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    env = {key: value for key, value in os.environ.items() if key != "HYDRA_FULL_ERROR"}
    return subprocess.run(  # noqa: PLW1510 - the exit status is asserted
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def records(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "generations.jsonl").read_text().splitlines()]


def last_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


def test_generation_end_to_end(tmp_path, llama):
    """run.py renders, generates 2 samples of 4 prompts on llama-server, validates and exports."""
    run_dir = tmp_path / "run"
    result = run_py(run_dir, llama, "task.n_seeds=4", "provider.samples=2", "provider.max_tokens=24")
    assert result.returncode == 0, result.stderr[-3000:]
    got = records(run_dir)
    assert Counter((r["id"], r["sample"]) for r in got) == {
        (json.loads(line)["id"], s): 1
        for line in (run_dir / "prompts.jsonl").read_text().splitlines()
        for s in (0, 1)
    }
    for record in got:
        assert record.get("error") is None, record
        assert isinstance(record["output"], str)
        assert 0 < record["usage"]["completion_tokens"] <= 24
        assert record["usage"]["prompt_tokens"] > 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["generation"]["errors"] == 0
    validated = (run_dir / "validated.jsonl").read_text().splitlines()
    assert len(validated) == 8


def test_sampling_options_arrive(tmp_path, llama):
    """The seed makes runs repeat; max_tokens caps each answer and ends it with 'length'."""
    runs = {}
    for name, seed in (("a", 11), ("b", 11), ("c", 12)):
        run_dir = tmp_path / name
        # One request at a time and no prompt cache: a batch shared with another request (or a
        # reused cache) changes the float sums, so only the seed may decide the tokens.
        result = run_py(
            run_dir, llama, "task.n_seeds=3", "provider.max_tokens=6", f"provider.seed={seed}",
            "provider.temperature=1.0", "provider.top_p=0.95", "provider.concurrency=1",
            "+provider.extra_body.cache_prompt=false",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = records(run_dir)
    outputs = {name: [r["output"] for r in got] for name, got in runs.items()}
    assert outputs["a"] == outputs["b"]
    assert outputs["a"] != outputs["c"]
    for record in runs["a"]:
        assert record["usage"]["completion_tokens"] <= 6
        if record["usage"]["completion_tokens"] == 6:
            assert record["finish_reason"] == "length"


def test_server_killed_and_restarted_mid_run(tmp_path, model):
    """llama-server dies mid-run and comes back on the same port: every completion exactly once."""
    run_dir = tmp_path / "run"
    with LlamaServer(model, alias="tiny", context=8192, parallel=2) as server:
        proc = subprocess.Popen(
            [
                sys.executable, "run.py", "task=tinystories", "task.n_seeds=24", "provider=openai",
                "provider.model=tiny", f"provider.base_url={server.base_url}", "provider.progress=false",
                "provider.max_tokens=48", "provider.concurrency=2", "provider.max_retries=30",
                "provider.backoff_base_s=0.2", "provider.backoff_max_s=0.5", f"hydra.run.dir={run_dir}",
            ],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        generations = run_dir / "generations.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if generations.exists() and len(generations.read_bytes().splitlines()) >= 4:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run finished before the server could be killed"
        server.stop()  # SIGKILL, as a crash would
        time.sleep(1.0)
        server.start()
        _stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-3000:]
    got = records(run_dir)
    keys = Counter((r["id"], r["sample"]) for r in got)
    assert len(keys) == 24 and set(keys.values()) == {1}
    assert all(r.get("error") is None for r in got)
    assert json.loads((run_dir / "manifest.json").read_text())["generation"]["retries"] > 0


def test_context_overflow_stops_the_run_with_the_servers_words(tmp_path, model):
    """A prompt longer than the slot's context: llama-server answers 400 and the run stops, exit 4."""
    with LlamaServer(model, alias="tiny", context=128, parallel=1) as small:
        result = run_py(tmp_path / "run", small, "task.n_seeds=2")
    assert result.returncode == EXIT_CODES["server"]
    line = last_line(result)
    assert "400" in line and "context" in line, line


def write_prefill_prompts(path: Path, n: int) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for i in range(n):
            messages = [
                {"role": "system", "content": "You write stories."},
                {"role": "user", "content": f"Tell story {i}."},
                {"role": "assistant", "content": "Iris Calloway:", "prefix": True},
            ]
            fh.write(json.dumps({"id": f"p{i}", "split": "train", "messages": messages}) + "\n")
    return path


@pytest.mark.parametrize("mode", [m for m in OPENAI_PREFIX_MODES if m != "unsupported"])
def test_prefill_continuation(tmp_path, llama, mode):
    """llama-server continues the prefill in every mode but repeats it in the answer: it is cut and recorded."""
    from storyforge.config.provider import GenerationSettings, OpenAIProviderConf
    from storyforge.providers.runner import generate_for_job

    prompts = write_prefill_prompts(tmp_path / "prompts.jsonl", 3)
    conf = OpenAIProviderConf(
        base_url=llama.base_url, model="tiny", max_tokens=8, seed=5, prefix_continuation=mode, progress=False
    )
    cfg = GenerationSettings(provider=conf.seal())
    path, stats = generate_for_job(cfg, tmp_path / "out", prompts)
    assert stats["errors"] == 0
    got = records(path.parent)
    assert len(got) == 3
    for record in got:
        assert not record["output"].startswith("Iris Calloway:"), (mode, record["output"])
        assert record["output"].strip()
        assert record["prefill_echo_stripped"] is True  # docs/running.md's table says so


def test_prefill_unsupported_mode_is_refused(tmp_path, llama):
    """With prefix_continuation=unsupported a prompt with a prefill is refused, naming the setting."""
    from storyforge.config.provider import GenerationSettings, OpenAIProviderConf
    from storyforge.errors import StoryforgeError
    from storyforge.providers.runner import generate_for_job

    prompts = write_prefill_prompts(tmp_path / "prompts.jsonl", 1)
    conf = OpenAIProviderConf(base_url=llama.base_url, model="tiny", max_tokens=4, progress=False)
    cfg = GenerationSettings(provider=conf.seal(), strict=True)
    with pytest.raises(StoryforgeError, match="prefix_continuation"):
        generate_for_job(cfg, tmp_path / "out", prompts)


@pytest.mark.parametrize(
    ("policy", "code"),
    [("error", EXIT_CODES["server"]), ("warn", 0)],
)
def test_model_mismatch(tmp_path, llama, policy, code):
    """llama-server serves its one model under any name; storyforge notices the answer's model."""
    run_dir = tmp_path / "run"
    result = run_py(
        run_dir, llama, "task.n_seeds=2", "provider.max_tokens=4", "provider.model=gpt-4o",
        f"provider.on_model_mismatch={policy}",
    )  # fmt: skip
    assert result.returncode == code, result.stderr[-3000:]
    if policy == "error":
        line = last_line(result)
        assert "gpt-4o" in line and "tiny" in line
    else:
        assert {r.get("served_model") for r in records(run_dir)} == {"tiny"}
