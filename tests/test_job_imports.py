"""A run that only renders prompts loads only what rendering needs.

``python run.py task=tinystories`` imports the job, its config schema and the modules of
every stage; the libraries of the later stages (MinHash and the scipy under it, BLEU, the
HTTP client) are imported where they are used, so a render-only run does not pay their
start-up time and memory (some 60 MiB; see docs/engine.md). Checked in a fresh interpreter
after importing what ``run.py`` and the render stage import; the stages that use those
libraries are tested with them in their own files (tests/test_dedup.py, test_diversity.py,
providers/).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LATER_STAGES = ("aiohttp", "datasketch", "sacrebleu", "scipy")

RENDER_ONLY = (
    "storyforge.config",
    "storyforge.config.hydra_errors",
    "storyforge.pipeline",
    "storyforge.jobs.tinystories",
    "storyforge.jobs.tinystories_shards",
    "storyforge.quality.dedup",
    "storyforge.quality.diversity",
    "storyforge.providers.cost",
)


def test_the_render_stage_loads_no_library_of_the_later_stages() -> None:
    script = (
        "import importlib, json, sys\n"
        f"for name in {list(RENDER_ONLY)!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in {list(LATER_STAGES)!r} if m in sys.modules)))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(proc.stdout) == []
