"""Fixtures of the drift gate's tests: the tiny model with its tokenizer files, and real exports.

The model is the tests' tiny GGUF (:mod:`tests.support.tiny_gguf`); its tokenizer files
are written from the same vocabulary (:mod:`tests.support.tiny_tokenizer`). The exports
are made by ``run.py`` as a user makes them: two research-QA conditions and a TinyStories run
whose completions pass the checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.tiny_gguf import write_tiny_llama
from tests.support.tiny_tokenizer import write_tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]
FILLERS = ["Quax vem.", "Plif dor.", "Mub zan.", "Krel fip.", "Vosh tam.", "Jibo lun."]


def run_py(*overrides: str) -> None:
    env = {key: value for key, value in os.environ.items() if key != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = str(REPO)
    result = subprocess.run(  # noqa: PLW1510 - the exit status is asserted
        [sys.executable, "run.py", *overrides], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with ``tiny.gguf`` and the matching ``tokenizer.json`` + ``tokenizer_config.json``."""
    folder = tmp_path_factory.mktemp("tiny")
    write_tiny_tokenizer(write_tiny_llama(folder / "tiny.gguf"), folder)
    return folder


@pytest.fixture(scope="session")
def rqa_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two research-QA conditions (closed book and with contexts), exported by ``run.py``."""
    root = tmp_path_factory.mktemp("rqa")
    run_py("task=research_qa", "task.progress=false", f"hydra.run.dir={root / 'instruction_only'}")
    run_py(
        "task=research_qa",
        "model=rag_trained",
        "task.prompt_mode=with_context",
        "task.progress=false",
        f"hydra.run.dir={root / 'rag_trained'}",
    )
    return root


@pytest.fixture(scope="session")
def ts_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TinyStories run's ``sft.jsonl``: seeds by ``run.py``, then completions that pass."""
    root = tmp_path_factory.mktemp("tinystories")
    run_py("task=tinystories", "task.n_seeds=12", f"hydra.run.dir={root / 'seeds'}")
    seeds = [json.loads(line) for line in (root / "seeds" / "prompts_seed.jsonl").read_text().splitlines()]
    lines = []
    for seed in seeds:
        sentences = [f"Zib {phrase}." for phrase in seed["required"]]
        while len(sentences) < seed["min_sentences"]:
            sentences.append(FILLERS[len(sentences) % len(FILLERS)])
        lines.append(json.dumps({"id": seed["id"], "output": " ".join(sentences)}))
    (root / "completions.jsonl").write_text("\n".join(lines) + "\n")
    run_py(
        "task=tinystories",
        "task.n_seeds=12",
        f"completions={root / 'completions.jsonl'}",
        f"hydra.run.dir={root / 'run'}",
    )
    sft = root / "run" / "sft.jsonl"
    assert len(sft.read_text().splitlines()) == 12
    return sft


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The real test model's GGUF, as the set-up caches it (:func:`storyforge.providers.llama_setup.model_path`)."""
    from storyforge.providers.llama_setup import model_path

    path = model_path()
    if not path.is_file():
        pytest.fail(f"the SmolLM2 GGUF is not prepared: {path} (the README's test command prepares it)")
    return path
