"""A real instruct model in the loop: SmolLM2-135M-Instruct served by ``provider=llama_cpp``.

The model file is fetched once by the test set-up (``python -m tests.support.setup``, through
:func:`storyforge.providers.llama_setup.ensure_model`) and the llama-server is the cached build,
so nothing is downloaded here. Each run goes through ``python run.py`` as a user's would: the
run starts the server itself, sizes it, and stops it. The seeds are easy ones (common objects as the required
phrases) so that a 135M model passes some of them and fails others.

``-m "not real_model"`` leaves these out locally; CI runs them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from storyforge.config.judge import judge_settings
from storyforge.providers.llama_setup import ensure_model
from storyforge.tasks.tinystories.judge import Verdict, read_verdict

pytestmark = [pytest.mark.integration, pytest.mark.real_model]

REPO = Path(__file__).resolve().parents[2]

#: Easy seeds: two required phrases, everyday things (the 6-9 sentences suit the model's length).
EASY = (
    "constraints.required_count.max=2",
    "pools.objects=[ball,tree,dog,cat,cake,hat,box,bird]",
    "pools.banned=[dragon,castle]",
)


def _lines(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def _run(run_dir: Path, *overrides: str, cache: Path) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "run.py",
        "task=tinystories",
        "provider=llama_cpp",
        f"provider.gguf={ensure_model()}",
        "provider.seed=7",
        "provider.progress=false",
        "provider.timeout_s=240",
        f"cache.path={cache}",
        "export.plots=false",
        *EASY,
        *overrides,
        f"hydra.run.dir={run_dir}",
    ]
    env = {key: value for key, value in os.environ.items() if key != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False
    )


def _port_open(url: str) -> bool:
    host, port = re.search(r"//([^:/]+):(\d+)", url).groups()  # type: ignore[union-attr]
    with socket.socket() as sock:
        return sock.connect_ex((host, int(port))) == 0


@pytest.fixture(scope="module")
def judged_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Three easy seeds, up to two attempts each."""
    root = tmp_path_factory.mktemp("chains")
    proc = _run(
        root / "run",
        "task.n_seeds=3",
        "provider.max_tokens=80",
        "regenerate.max_attempts=2",
        cache=root / "cache.sqlite",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    yield root / "run"


def test_a_tinystories_run_gets_real_text_and_stops_its_server(judged_run: Path) -> None:
    """Every answer is English prose (words, sentences), the run logged the server's command and
    its log, and the server is gone once the run is over."""
    records = _lines(judged_run / "generations.jsonl")
    assert len(records) == 3 and all(r["error"] is None for r in records)
    common = {"the", "a", "and", "was", "he", "she", "to", "they", "it"}
    for record in records:
        words = re.findall(r"[A-Za-z']+", record["output"])
        assert len(words) >= 15, record["output"]
        assert len(common & {w.lower() for w in words}) >= 3, record["output"]
        assert re.search(r"[a-z][.!?]", record["output"]), record["output"]
    assert "served_model" not in records[0]  # --alias: the server answers to provider.model
    log = (judged_run / "run.log").read_text("utf-8")
    started = re.search(r"llama-server: starting (\S+) -m (\S+) --alias (\S+) .*-np 2 -t 1", log)
    assert started is not None, log[-3000:]
    assert started.group(3) == "SmolLM2-135M-Instruct.Q4_1"
    assert f"its log is {judged_run / 'llama-server.log'}" in log
    assert "llama_server: listening on http://127.0.0.1:" in (judged_run / "llama-server.log").read_text(
        "utf-8", "replace"
    )
    url = re.search(r"serving .* at (http://\S+)", log)
    assert url is not None and not _port_open(url.group(1))
    manifest = json.loads((judged_run / "manifest.json").read_text("utf-8"))
    assert manifest["generation"]["provider"] == "llama_cpp"
    assert manifest["generation"]["gguf"] == str(ensure_model())


def test_regeneration_attempts_differ_from_the_first(judged_run: Path) -> None:
    """A chain's second attempt is a new request (a repair conversation, another sampling seed)
    and the model answers it anew: its stories differ from the first ones. (A 135M model now and
    then copies its earlier answer word for word; so not every one need differ.)"""
    first = {r["id"]: r for r in _lines(judged_run / "generations.jsonl")}
    second = _lines(judged_run / "generations.attempt2.jsonl")
    assert second, "no seed needed a second attempt"
    for record in second:
        assert record["error"] is None and record["output"].strip()
        assert record["request_hash"] != first[record["id"]]["request_hash"]
    assert any(r["output"] != first[r["id"]]["output"] for r in second)


def test_the_judge_answers_under_the_json_schema(tmp_path: Path) -> None:
    """The judge is the real model (stories from the scripted loopback server, which pass the
    rules, so each is judged): every verdict the server wrote under the schema is valid."""
    from hydra import compose, initialize_config_dir

    from storyforge.config import register_configs
    from storyforge.pipeline import run_in
    from tests.support.fake_server import FakeServer
    from tests.support.llama_server import LlamaServer
    from tests.support.scripted_stories import instruction_of, passing_story

    register_configs()
    n_seeds = 3
    stories = FakeServer(script=lambda body: passing_story(instruction_of(list(body["messages"]))))
    judge = LlamaServer(ensure_model(), alias="smollm2", context=4096, parallel=2)
    with stories as gen, judge, initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose(
            "config",
            overrides=[
                "task=tinystories",
                f"task.n_seeds={n_seeds}",
                "provider=openai",
                f"provider.base_url={gen.base_url}",
                "provider.model=fake",
                "provider.progress=false",
                "cache.path=null",
                "export.plots=false",
                "judge=content_safety",
                f"+judge.provider.base_url={judge.base_url}",
                "+judge.provider.model=smollm2",
                "+judge.provider.timeout_s=240",
                "judge.max_tokens=96",
                "+judge.schema.properties.rule.maxLength=24",
                "+judge.schema.properties.reason.maxLength=60",
            ],
        )
        manifest = run_in(cfg, tmp_path / "run")
    verdicts = manifest["regeneration"]["judge"]["verdicts"]
    assert verdicts["error"] == 0 and verdicts["pass"] + verdicts["fail"] == n_seeds, verdicts
    schema = judge_settings(cfg).schema
    records = _lines(tmp_path / "run" / "judgements.jsonl")
    assert len(records) == n_seeds
    for record in records:
        assert isinstance(read_verdict(record["output"], schema), Verdict), record["output"]


@pytest.fixture(scope="module")
def cut_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """Four seeds whose answers are cut off at 12 tokens (run directory, response cache)."""
    root = tmp_path_factory.mktemp("cut")
    proc = _run(root / "run", "task.n_seeds=4", "provider.max_tokens=12", cache=root / "cache.sqlite")
    assert proc.returncode == 0, proc.stderr[-4000:]
    yield root / "run", root / "cache.sqlite"


def test_answers_cut_at_max_tokens_are_recorded_and_never_pass(cut_run: tuple[Path, Path]) -> None:
    run, _ = cut_run
    records = _lines(run / "generations.jsonl")
    assert len(records) == 4
    assert {r["finish_reason"] for r in records} == {"length"}
    assert all(r["usage"]["completion_tokens"] == 12 for r in records)
    assert _lines(run / "sft.jsonl") == []
    rejects = _lines(run / "rejects.jsonl")
    assert sorted(r["id"] for r in rejects) == sorted(r["id"] for r in records)


def test_a_replay_with_the_server_stopped_is_byte_identical(
    cut_run: tuple[Path, Path], tmp_path: Path
) -> None:
    """The same command with provider.replay=only starts no server and writes the same files."""
    run, cache = cut_run
    again = tmp_path / "again"
    proc = _run(again, "task.n_seeds=4", "provider.max_tokens=12", "provider.replay=only", cache=cache)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not (again / "llama-server.log").exists()
    for name in ("prompts.jsonl", "generations.jsonl", "validated.jsonl", "rejects.jsonl", "sft.jsonl"):
        assert (again / name).read_bytes() == (run / name).read_bytes(), name


def test_ctrl_c_stops_the_run_and_its_server(tmp_path: Path) -> None:
    """Ctrl-C while the server answers: the run exits 130 and the server is gone with it."""
    import signal
    import time

    run = tmp_path / "run"
    command = [
        sys.executable,
        "run.py",
        "task=tinystories",
        "task.n_seeds=4",
        "provider=llama_cpp",
        f"provider.gguf={ensure_model()}",
        "provider.max_tokens=256",
        "provider.progress=false",
        "cache.path=null",
        *EASY,
        f"hydra.run.dir={run}",
    ]
    env = {key: value for key, value in os.environ.items() if key != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 240  # a guard against hanging, not a timed assertion
        url = None
        while url is None:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the server did not start"
            log = (run / "run.log").read_text("utf-8") if (run / "run.log").exists() else ""
            found = re.search(r"serving .* at (http://\S+)", log)
            url = found.group(1) if found else None
            time.sleep(0.05)
        assert _port_open(url)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert not _port_open(url)
    assert "llama-server: stopped" in (run / "run.log").read_text("utf-8")
