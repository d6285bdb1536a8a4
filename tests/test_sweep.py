"""The sweep summary written at the root of a multirun."""

from __future__ import annotations

import json
from pathlib import Path

from storyforge.sweep import summarize_sweep


def _job(root: Path, name: str, overrides: list[str], counts: dict[str, object] | None) -> None:
    (root / name / ".hydra").mkdir(parents=True)
    (root / name / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides), "utf-8")
    if counts is not None:
        manifest = {"task": "tinystories", "config_sha256": "ab" * 32, "counts": counts}
        (root / name / "manifest.json").write_text(json.dumps(manifest), "utf-8")


def test_summary_lists_jobs_in_number_order_and_keeps_failed_ones(tmp_path: Path) -> None:
    """Jobs sort numerically (2 before 10), nested counts flatten, and a job without manifest shows as missing."""
    _job(tmp_path, "10", ["seed=3"], {"seeds": 5, "completions": {"passed": 4}})
    _job(tmp_path, "2", ["seed=1"], {"seeds": 7})
    _job(tmp_path, "3", ["seed=2"], None)
    (tmp_path / "multirun.yaml").write_text("{}", "utf-8")
    summary = summarize_sweep(tmp_path)
    assert summary["columns"] == ["seeds", "completions.passed"]
    assert [(j["job"], j["status"], j["counts"]) for j in summary["jobs"]] == [
        ("2", "ok", {"seeds": 7}),
        ("3", "missing", {}),
        ("10", "ok", {"seeds": 5, "completions.passed": 4}),
    ]
    assert json.loads((tmp_path / "sweep_summary.json").read_text("utf-8")) == summary
    assert (tmp_path / "sweep_summary.md").read_text("utf-8").splitlines() == [
        "| job | overrides | status | seeds | completions.passed |",
        "|---|---|---|---|---|",
        "| 2 | `seed=1` | ok | 7 |  |",
        "| 3 | `seed=2` | missing |  |  |",
        "| 10 | `seed=3` | ok | 5 | 4 |",
    ]
