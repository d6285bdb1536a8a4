"""``stage=drift`` and the Modelfile proof inside runs (``run.py`` as a user runs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from storyforge.tasks.research_qa.modelfile import read_modelfile
from tests.support.tiny_gguf import write_tiny_llama

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def run_py(*overrides: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "HYDRA_FULL_ERROR"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(  # noqa: PLW1510 - the exit status is asserted
        [sys.executable, "run.py", *overrides], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


def test_research_qa_stage_all_proves_the_modelfile_and_sizes_num_ctx(tiny: Path, tmp_path: Path) -> None:
    """stage=all with drift.tokenizer: export, a Modelfile proven against it with num_ctx 512, the gate's report."""
    out = tmp_path / "run"
    result = run_py(
        "task=research_qa",
        "stage=all",
        f"drift.tokenizer={tiny}",
        f"drift.gguf={tiny / 'tiny.gguf'}",
        f"model.gguf_path={tiny / 'tiny.gguf'}",
        f"hydra.run.dir={out}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    modelfile = read_modelfile(out / "Modelfile.instruction_only")
    assert modelfile.parameters()["num_ctx"] == ["512"]
    text = (out / "Modelfile.instruction_only").read_text()
    assert "# num_ctx 512: the longest exported example is 400 tokens" in text
    assert "storyforge drift found it identical to the training chat template" in text
    assert "on 22 exported example(s)" in text
    report = json.loads((out / "drift_report.json").read_text())
    assert report["ok"] is True and report["examples"] == 22 and report["findings"] == []


def test_a_modelfile_template_unlike_training_is_refused(
    tiny: Path, rqa_export: Path, tmp_path: Path
) -> None:
    """stage=modelfiles with a TEMPLATE missing the newline after the user marker: exit 3, nothing written."""
    template = (
        "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
        "{{ if .Prompt }}<|im_start|>user{{ .Prompt }}<|im_end|>\n{{ end }}<|im_start|>assistant\n{{ .Response }}<|im_end|>"
    )
    target = tmp_path / "ollama"
    result = run_py(
        "task=research_qa",
        "stage=modelfiles",
        f"drift.tokenizer={tiny}",
        f"drift.gguf={tiny / 'tiny.gguf'}",
        f"drift.exports=[{rqa_export / 'instruction_only'}]",
        f"model.chat_template='{template}'",
        f"task.modelfiles_dir={target}",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert result.returncode == 3, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        f"error: {target / 'Modelfile.instruction_only'} refused (not written): served by Ollama it differs "
        "from the training chat template on 22 of 22 example(s): whitespace 22; the divergence is in the log"
    )
    assert "whitespace differs around a role marker" in (tmp_path / "run" / "run.log").read_text()
    assert not (target / "Modelfile.instruction_only").exists()


def test_num_ctx_beyond_the_gguf_context_warns(tiny: Path, rqa_export: Path, tmp_path: Path) -> None:
    """A model trained for 256 tokens: the Modelfile still gets the 512 the data needs, with a warning."""
    small = write_tiny_llama(tmp_path / "small.gguf", context_length=256)
    out = tmp_path / "run"
    result = run_py(
        "task=research_qa",
        "stage=modelfiles",
        f"drift.tokenizer={tiny}",
        f"drift.exports=[{rqa_export / 'instruction_only'}]",
        f"model.gguf_path={small}",
        f"hydra.run.dir={out}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_modelfile(out / "Modelfile.instruction_only").parameters()["num_ctx"] == ["512"]
    assert (
        f"num_ctx 512 (for a 400-token example) exceeds the 256 tokens {small} was trained for"
        in result.stdout + result.stderr
    )


def test_tinystories_stage_drift(tiny: Path, ts_export: Path, tmp_path: Path) -> None:
    """stage=drift on a TinyStories run: the gate on its sft.jsonl; a drifting tokenizer fails the run (exit 3)."""
    completions = ts_export.parent.parent / "completions.jsonl"
    common = [
        "task=tinystories",
        "task.n_seeds=12",
        f"completions={completions}",
        "stage=drift",
        f"drift.gguf={tiny / 'tiny.gguf'}",
    ]
    ok = run_py(*common, f"drift.tokenizer={tiny}", f"hydra.run.dir={tmp_path / 'ok'}")
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert json.loads((tmp_path / "ok" / "drift_report.json").read_text())["examples"] == 12
    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    (tokenizer / "tokenizer.json").write_text((tiny / "tokenizer.json").read_text())
    config = json.loads((tiny / "tokenizer_config.json").read_text())
    config["chat_template"] = config["chat_template"].replace("message['role'] + '\\n'", "message['role']")
    (tokenizer / "tokenizer_config.json").write_text(json.dumps(config))
    bad = run_py(*common, f"drift.tokenizer={tokenizer}", f"hydra.run.dir={tmp_path / 'bad'}")
    assert bad.returncode == 3
    assert bad.stderr.strip().splitlines()[-1] == (
        "error: drift: 12 of 12 example(s) drift (allowed 0): whitespace 12; the first divergences are in the log, "
        f"all in {tmp_path / 'bad' / 'drift_report.json'}"
    )


@pytest.mark.parametrize("task", ["research_qa", "tinystories"])
def test_stage_drift_needs_a_tokenizer(task: str, tmp_path: Path) -> None:
    """stage=drift without drift.tokenizer is a config error naming the key (exit 2)."""
    result = run_py(f"task={task}", "stage=drift", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: stage=drift needs drift.tokenizer=DIR (the folder of the model's tokenizer files)"
    )
