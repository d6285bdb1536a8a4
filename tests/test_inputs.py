"""Input files of a run: absolute in the snapshot, sha256 in the manifest, a changed file refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from storyforge.config.inputs import file_sha256

ROOT = Path(__file__).resolve().parents[1]


def run_py(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python <repo>/run.py ARGS`` started from ``cwd``, as a user in another folder would."""
    return subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_relative_completions_are_pinned_and_a_changed_file_is_refused(tmp_path: Path) -> None:
    """completions=REL is stored absolute with its sha256; reproducing elsewhere works until the file changes."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    first = run_py(work, "task.n_seeds=3", f"hydra.run.dir={tmp_path / 'seeds'}")
    assert first.returncode == 0, first.stderr[-2000:]
    ids = [json.loads(line)["id"] for line in (tmp_path / "seeds" / "prompts.jsonl").read_text().splitlines()]
    completions = work / "c.jsonl"
    completions.write_text("".join(json.dumps({"id": i, "output": "A story."}) + "\n" for i in ids))
    sha = file_sha256(completions)

    run_dir = tmp_path / "run"
    checked = run_py(work, "task.n_seeds=3", "completions=c.jsonl", f"hydra.run.dir={run_dir}")
    assert checked.returncode == 0, checked.stderr[-2000:]
    snapshot = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert snapshot["completions"] == str(completions)
    assert snapshot["inputs"] == {"completions": {"path": str(completions), "sha256": sha}}
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["inputs"] == snapshot["inputs"]
    assert manifest["completions"]["source"]["sha256"] == sha

    again = tmp_path / "again"
    reproduced = run_py(
        elsewhere,
        "--config-path",
        str(run_dir / ".hydra"),
        "--config-name",
        "config",
        f"hydra.run.dir={again}",
    )
    assert reproduced.returncode == 0, reproduced.stderr[-2000:]
    for name in ("manifest.json", "validated.jsonl", "sft.jsonl", "rejects.jsonl"):
        assert (again / name).read_bytes() == (run_dir / name).read_bytes(), name

    completions.write_text(completions.read_text().replace("A story.", "Another story."))
    refused = run_py(
        elsewhere,
        "--config-path",
        str(run_dir / ".hydra"),
        "--config-name",
        "config",
        f"hydra.run.dir={tmp_path / 'refused'}",
    )
    assert refused.returncode != 0
    assert (
        f"error: completions: {completions} changed since the run this config reproduces "
        f"(sha256 {sha} recorded, {file_sha256(completions)} now); "
        "pass allow_changed_inputs=true to run with it anyway"
    ) in refused.stderr
    assert not (tmp_path / "refused" / "manifest.json").exists()

    allowed = run_py(
        elsewhere,
        "--config-path",
        str(run_dir / ".hydra"),
        "--config-name",
        "config",
        "allow_changed_inputs=true",
        f"hydra.run.dir={tmp_path / 'allowed'}",
    )
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert "changed since the run this config reproduces" in allowed.stdout + allowed.stderr
    pinned = json.loads((tmp_path / "allowed" / "manifest.json").read_text())["inputs"]
    assert pinned["completions"]["sha256"] == file_sha256(completions)


def test_relative_dataset_is_resolved_for_research_qa(tmp_path: Path) -> None:
    """dataset=REL (research_qa) is stored absolute in the snapshot with its sha256."""
    shipped = ROOT / "storyforge" / "tasks" / "research_qa" / "data" / "offline_dataset.jsonl"
    (tmp_path / "offline_dataset.jsonl").write_bytes(shipped.read_bytes())
    run_dir = tmp_path / "run"
    proc = run_py(tmp_path, "task=research_qa", "dataset=offline_dataset.jsonl", f"hydra.run.dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    snapshot = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
    assert snapshot["dataset"] == str(tmp_path / "offline_dataset.jsonl")
    assert snapshot["inputs"]["dataset"]["sha256"] == file_sha256(shipped)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["dataset"]["sha256"] == file_sha256(shipped)
    assert manifest["inputs"] == snapshot["inputs"]
