"""`python run.py --help`: the app's own help, listing task kinds, every group option and common overrides."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GROUPS = sorted(
    p.name for p in (ROOT / "conf").iterdir() if p.is_dir() and p.name != "hydra" and list(p.glob("*.yaml"))
)


@pytest.fixture(scope="module")
def help_text() -> str:
    proc = subprocess.run(
        [sys.executable, "run.py", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _group_block(text: str) -> str:
    return text.split("Config groups (GROUP=OPTION):", 1)[1].split("Common overrides:", 1)[0]


@pytest.mark.parametrize("group", GROUPS)
def test_every_option_of_every_group_is_listed(help_text: str, group: str) -> None:
    """Each conf/<group>/<option>.yaml appears under its group, so the help cannot fall behind conf/."""
    block = _group_block(help_text)
    name = "+experiment" if group == "experiment" else group
    match = re.search(rf"^  {re.escape(name)} +(.*(?:\n {{19}}.*)*)", block, re.MULTILINE)
    assert match is not None, f"group {name} is not listed"
    listed = set(re.findall(r"[a-z_]+", match.group(1).split("(")[0]))
    assert {p.stem for p in (ROOT / "conf" / group).glob("*.yaml")} <= listed


def test_help_is_short_and_free_of_schema_entries(help_text: str) -> None:
    """The help lists no base_* schema entries and fits on a screen or two, unlike Hydra's generic dump."""
    assert not re.search(r"(?<![.\w])base_", help_text)
    assert len(help_text.splitlines()) < 60
    for kind in (
        "tinystories",
        "research_qa",
        "turn_generation",
        "chapter_summarization",
        "writing_assistant",
    ):
        assert re.search(rf"^  {kind} ", help_text, re.MULTILINE), kind
    for override in ("task.n_seeds=", "completions=FILE", "provider=openai", "hydra.run.dir=", "-m "):
        assert override in help_text
