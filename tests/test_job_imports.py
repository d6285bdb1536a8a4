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


def _printed(script: str) -> object:
    """What ``script`` prints as JSON, run in a fresh interpreter."""
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(proc.stdout)


def test_the_render_stage_loads_no_library_of_the_later_stages() -> None:
    script = (
        "import importlib, json, sys\n"
        f"for name in {list(RENDER_ONLY)!r}:\n"
        "    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in {list(LATER_STAGES)!r} if m in sys.modules)))\n"
    )
    assert _printed(script) == []


def test_rendering_seeds_loads_neither_pandas_nor_a_later_stage(tmp_path: Path) -> None:
    """The render stage's twins are read by Arrow's JSON reader: no Python value goes through
    ``pa.array`` (which loads pandas, some 40 MiB), even with row groups of 7."""
    script = (
        "import json, sys\n"
        "from hydra import compose, initialize_config_dir\n"
        "from storyforge import tables\n"
        "from storyforge.config import register_configs\n"
        "from storyforge.config.settings import read_settings\n"
        "from storyforge.jobs.tinystories_shards import render_shard\n"
        "tables._BATCH = 7\n"
        "register_configs()\n"
        f"with initialize_config_dir(config_dir={str(ROOT / 'conf')!r}, version_base=None):\n"
        "    cfg = compose('config', overrides=['task.n_seeds=30'])\n"
        f"rendered = render_shard(read_settings(cfg), {str(tmp_path)!r}, 0, 1, whole=True)\n"
        "assert rendered.counts['seeds'] == 30, rendered.counts\n"
        f"print(json.dumps(sorted(m for m in {[*LATER_STAGES, 'pandas']!r} if m in sys.modules)))\n"
    )
    assert _printed(script) == []


def test_a_run_without_dedup_diversity_or_plots_computes_and_loads_none_of_them(tmp_path: Path) -> None:
    """``dedup=none dedup.diversity.enabled=false export.plots=false``: no diversity section,
    and neither MinHash, BLEU nor matplotlib is imported."""
    script = (
        "import json, sys\n"
        "from hydra import compose, initialize_config_dir\n"
        "from storyforge.config import register_configs\n"
        "from storyforge.pipeline import run_in\n"
        "register_configs()\n"
        f"with initialize_config_dir(config_dir={str(ROOT / 'conf')!r}, version_base=None):\n"
        "    cfg = compose('config', overrides=['task.n_seeds=10',\n"
        f"        'completions={ROOT / 'docs/examples/completions.jsonl'}', 'dedup=none',\n"
        "        'dedup.diversity.enabled=false', 'export.plots=false'])\n"
        f"manifest = run_in(cfg, {str(tmp_path / 'run')!r})\n"
        f"loaded = sorted(m for m in {[*LATER_STAGES, 'matplotlib']!r} if m in sys.modules)\n"
        "print(json.dumps([loaded, sorted(manifest['completions'])]))\n"
    )
    loaded, sections = _printed(script)  # type: ignore[misc]
    assert loaded == []
    assert "dedup" in sections and "diversity" not in sections
    summary = json.loads((tmp_path / "run" / "report" / "summary.json").read_text("utf-8"))
    assert "diversity" not in summary


# What a prompts-only run must not load: the libraries of generation, checks, reports, the
# studio and the template store, and the storyforge modules built on them.
NOT_FOR_PROMPTS = (
    *LATER_STAGES,
    "datasets",
    "gguf",
    "jinja2",
    "matplotlib",
    "pandas",
    "psycopg",
    "ray",
    "requests",
    "sqlalchemy",
    "starlette",
    "tokenizers",
    "transformers",
    "uvicorn",
    "xxhash",
    "storyforge.drift.stage",
    "storyforge.providers.runner",
    "storyforge.providers.sending",
    "storyforge.providers.transport",
    "storyforge.store",
    "storyforge.studio",
)


def test_a_prompts_only_run_py_loads_none_of_the_later_stages(tmp_path: Path) -> None:
    """``python run.py task=tinystories`` itself, in a subprocess: every module it imports is
    listed by ``-X importtime``, and none is one of :data:`NOT_FOR_PROMPTS` (or under one)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "run.py", "task=tinystories", "task.n_seeds=20"]
        + [f"hydra.run.dir={tmp_path}"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "prompts.parquet").is_file()
    imported = {
        line.rpartition("|")[2].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "storyforge.jobs.tinystories_shards" in imported  # the list is the run's imports
    assert sorted(m for m in imported if any(m == n or m.startswith(f"{n}.") for n in NOT_FOR_PROMPTS)) == []
