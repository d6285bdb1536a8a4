"""The names of the files a run writes, relative to its directory, defined once.

Takes: nothing. Gives: one constant per file name. Every module that writes or reads one of
these files takes its name from here (some keep a local alias that is part of their API), and
reads a run's JSON and YAML files with :func:`load_run_file`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = [
    "ATTEMPTS",
    "COMPLETION_ERRORS",
    "DPO",
    "DRIFT_REPORT",
    "DUPLICATES",
    "EVAL",
    "GENERATIONS",
    "GENERATIONS_REPLACED",
    "HYDRA_CONFIG",
    "HYDRA_OVERRIDES",
    "MANIFEST",
    "PROMPTS",
    "REJECTED",
    "REJECTED_SEEDS",
    "REJECTS",
    "REPORT_DIR",
    "SEEDS",
    "SFT",
    "SUMMARY",
    "SWEEP_REPORT",
    "SWEEP_REPORT_MD",
    "SWEEP_SUMMARY",
    "SWEEP_SUMMARY_MD",
    "TRAIN",
    "VALIDATED",
    "load_run_file",
]

# Every run
MANIFEST = "manifest.json"
HYDRA_CONFIG = ".hydra/config.yaml"
HYDRA_OVERRIDES = ".hydra/overrides.yaml"

# TinyStories: seeds -> prompts -> answers (journals) -> data sets -> report
SEEDS = "prompts_seed.jsonl"
PROMPTS = "prompts.jsonl"
REJECTED_SEEDS = "rejected_seeds.jsonl"
GENERATIONS = "generations.jsonl"
GENERATIONS_REPLACED = "generations.replaced.jsonl"
ATTEMPTS = "attempts.jsonl"
VALIDATED = "validated.jsonl"
SFT = "sft.jsonl"
REJECTS = "rejects.jsonl"
DPO = "dpo.jsonl"
COMPLETION_ERRORS = "completion_errors.jsonl"
DUPLICATES = "duplicates.jsonl"
REPORT_DIR = "report"
SUMMARY = f"{REPORT_DIR}/summary.json"
DRIFT_REPORT = "drift_report.json"

# Research QA exports
TRAIN = "train.jsonl"
EVAL = "eval.jsonl"
REJECTED = "rejected.jsonl"

# A sweep's root directory
SWEEP_SUMMARY = "sweep_summary.json"
SWEEP_SUMMARY_MD = "sweep_summary.md"
SWEEP_REPORT = "sweep_report.json"
SWEEP_REPORT_MD = "sweep_report.md"


def load_run_file(path: Path) -> Any:
    """The JSON document in ``path`` (YAML when it ends in ``.yaml``); None when it is missing.
    Raises OSError, ValueError (JSON) or ``yaml.YAMLError`` when it cannot be read."""
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".yaml":
        import yaml

        return yaml.safe_load(text)
    return json.loads(text)
