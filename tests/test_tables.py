"""Parquet twins of the TinyStories exports: same rows as the JSONL, fixed schema, empty files load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from storyforge.config import register_configs
from storyforge.config.exports import export_options
from storyforge.pipeline import run_in
from storyforge.tasks.tinystories.outputs import process_completions
from storyforge.tasks.tinystories.tables import SCHEMAS, load_export, parquet_path, write_parquet

datasets = pytest.importorskip("datasets")

ROOT = Path(__file__).resolve().parents[1]
PASS = "Tim found a red ball. He ran to the old tree. They played. Birds sang."
FAIL = "Tim found a blue ball."


def _seed(seed_id: str) -> dict[str, Any]:
    return {
        "id": seed_id,
        "split": "train",
        "protagonist": "a shy turtle named Tim",
        "theme": "kindness",
        "required": ["red ball", "old tree"],
        "banned": ["dragon"],
        "min_sentences": 3,
        "max_sentences": 5,
        "instruction": f"Write a children's story ({seed_id}).",
    }


def _jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), "utf-8")
    return path


def _stage(tmp_path: Path, outputs: list[str]) -> Path:
    """Run the completion stage with one sample per seed; returns the output directory."""
    seeds = [_seed(f"s{i}") for i in range(len(outputs))]
    seeds_file = _jsonl(tmp_path / "prompts_seed.jsonl", seeds)
    completions = _jsonl(
        tmp_path / "completions.jsonl", [{"id": s["id"], "output": o} for s, o in zip(seeds, outputs)]
    )
    out = tmp_path / "out"
    process_completions(export_options({"export": {"plots": False}}), out, seeds_file, None, completions)
    return out


def _features(name: str) -> Any:
    return datasets.Features.from_arrow_schema(SCHEMAS[name])


def _streamed(path: Path) -> Any:
    return datasets.load_dataset("parquet", data_files=str(path), split="train", streaming=True)


@pytest.mark.parametrize(
    ("outputs", "empty", "full"),
    [
        pytest.param([PASS, FAIL], "dpo.jsonl", "sft.jsonl", id="dpo_with_one_sample_per_seed"),
        pytest.param([FAIL, FAIL], "sft.jsonl", "rejects.jsonl", id="sft_when_nothing_passed"),
        pytest.param([PASS, PASS], "rejects.jsonl", "validated.jsonl", id="rejects_when_all_passed"),
    ],
)
def test_an_empty_export_loads_with_its_columns(
    tmp_path: Path, outputs: list[str], empty: str, full: str
) -> None:
    """An export with no rows loads as zero rows with the same columns as a full one."""
    out = _stage(tmp_path, outputs)
    assert (out / empty).read_bytes() == b""
    assert (out / "completion_errors.jsonl").read_bytes() == b""
    for name in (empty, "completion_errors.jsonl"):
        loaded = load_export(out / name)
        assert loaded.num_rows == 0
        assert loaded.features == _features(name)
        streamed = _streamed(parquet_path(out / name))
        assert streamed.features == _features(name)
        assert list(streamed) == []
    # The file that has rows loads the same way through both formats.
    by_json = datasets.load_dataset(
        "json", data_files=str(out / full), split="train", cache_dir=str(tmp_path / "cache")
    )
    by_parquet = datasets.load_dataset(
        "parquet", data_files=str(parquet_path(out / full)), split="train", cache_dir=str(tmp_path / "cache")
    )
    assert by_json.num_rows > 0
    assert by_parquet.to_list() == by_json.to_list()
    assert by_parquet.features == _features(full)


def test_every_export_of_the_stage_has_a_parquet_twin_in_the_summary(tmp_path: Path) -> None:
    """Each JSONL the stage writes has a Parquet file with its rows, recorded in the summary."""
    out = _stage(tmp_path, [PASS, FAIL])
    summary = json.loads((out / "report" / "summary.json").read_text("utf-8"))
    twins = summary["parquet"]
    assert set(twins) == {
        "validated.parquet",
        "sft.parquet",
        "rejects.parquet",
        "dpo.parquet",
        "completion_errors.parquet",
    }
    for name, entry in twins.items():
        rows = (out / name).with_suffix(".jsonl").read_text("utf-8").splitlines()
        assert entry["rows"] == len(rows)
        assert load_export(out / name).to_list() == [json.loads(r) for r in rows]


def test_an_all_null_column_keeps_its_type(tmp_path: Path) -> None:
    """A column that is null in every row (no provider errors) is still a string column."""
    out = _stage(tmp_path, [PASS])
    loaded = load_export(out / "validated.jsonl")
    assert loaded["error"] == [None]
    assert loaded.features["error"] == datasets.Value("string")


def test_clean_seed_run_writes_an_empty_rejected_seeds_that_loads(tmp_path: Path) -> None:
    """A run that rejects nothing still leaves a rejected_seeds table that loads as zero rows."""
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        manifest = run_in(compose("config", overrides=["task.n_seeds=3"]), tmp_path)
    assert (tmp_path / "rejected_seeds.jsonl").read_bytes() == b""
    rejected = load_export(tmp_path / "rejected_seeds.jsonl")
    assert rejected.num_rows == 0
    assert rejected.column_names == ["line", "id", "rule", "message"]
    assert manifest["parquet"]["rejected_seeds.parquet"]["rows"] == 0
    seeds = load_export(tmp_path / "prompts_seed.jsonl")
    assert seeds.num_rows == manifest["parquet"]["prompts_seed.parquet"]["rows"] == 3


def test_a_record_that_drifts_from_its_schema_is_refused(tmp_path: Path) -> None:
    """A writer adding a column without its schema fails loudly, naming the file and line."""
    path = _jsonl(
        tmp_path / "rejected_seeds.jsonl", [{"line": 1, "id": "a", "rule": "x", "message": "m", "z": 1}]
    )
    with pytest.raises(ValueError, match=r"rejected_seeds.jsonl:1: columns .* do not match"):
        write_parquet(path)
    assert not parquet_path(path).exists()


def test_research_qa_exports_have_parquet_twins_and_an_empty_rejected_loads(tmp_path: Path) -> None:
    """A research-QA export of clean records leaves an empty rejected.jsonl whose twin loads as zero rows."""
    from storyforge.config.research_qa import packaged_dataset
    from storyforge.tasks.research_qa.export import SCHEMAS as RQA_SCHEMAS

    lines = packaged_dataset().read_text("utf-8").splitlines()
    clean = [line for line in lines if json.loads(line).get("instruction", "").strip()][:4]
    dataset = tmp_path / "clean.jsonl"
    dataset.write_text("\n".join(clean) + "\n", "utf-8")
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=["task=research_qa", f"dataset={dataset}"])
        manifest = run_in(cfg, tmp_path / "out")
    out = tmp_path / "out"
    assert (out / "rejected.jsonl").read_bytes() == b""
    rejected = load_export(out / "rejected.jsonl")
    assert rejected.num_rows == 0
    assert rejected.features == datasets.Features.from_arrow_schema(RQA_SCHEMAS["rejected.jsonl"])
    for name in ("train.jsonl", "eval.jsonl"):
        rows = [json.loads(r) for r in (out / name).read_text("utf-8").splitlines()]
        assert len(rows) == 4
        assert load_export(out / name).to_list() == rows
        assert manifest["parquet"][parquet_path(out / name).name]["rows"] == 4


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param([], id="seeds_file"),
        pytest.param(["task.system_message='Be kind, \"dear\" \u00e9'"], id="seeds_file_and_a_system_turn"),
    ],
)
def test_the_jobs_twins_are_the_twins_of_its_finished_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: list[str]
) -> None:
    """The twins in the job's manifest (row groups of 7 here) are byte for byte those written
    from its finished files, rejected seeds included."""
    from storyforge import tables
    from storyforge.tasks.tinystories.instruction import render_instruction

    monkeypatch.setattr(tables, "_BATCH", 7)
    seeds = [_seed(f"s{i}") for i in range(30)]
    for seed in seeds:
        seed["instruction"] = render_instruction(seed)
    seeds[4]["theme"] = "no such theme"
    seeds[11]["banned"] = ["red ball"]
    seeds_file = _jsonl(tmp_path / "input.jsonl", seeds)
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        manifest = run_in(
            compose("config", overrides=[f"seeds_path={seeds_file}", *overrides]), tmp_path / "run"
        )
    assert manifest["counts"]["seeds"] == 28 and manifest["counts"]["rejected"] == 2
    for name in ("prompts_seed.jsonl", "prompts.jsonl", "rejected_seeds.jsonl"):
        again = tmp_path / "again" / name
        again.parent.mkdir(exist_ok=True)
        again.write_bytes((tmp_path / "run" / name).read_bytes())
        assert write_parquet(again) == manifest["parquet"][parquet_path(again).name]
        assert parquet_path(again).read_bytes() == parquet_path(tmp_path / "run" / name).read_bytes()


@pytest.mark.parametrize("system", ["", "task.system_message='Be kind, \"dear\" \u00e9'"])
def test_a_generated_runs_twins_are_the_twins_of_its_finished_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, system: str
) -> None:
    """Generated seeds too (row groups of 7)."""
    from storyforge import tables

    monkeypatch.setattr(tables, "_BATCH", 7)
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=["task.n_seeds=40", *([system] if system else [])])
        manifest = run_in(cfg, tmp_path / "run")
    for name in ("prompts_seed.jsonl", "prompts.jsonl"):
        again = tmp_path / "again" / name
        again.parent.mkdir(exist_ok=True)
        again.write_bytes((tmp_path / "run" / name).read_bytes())
        assert write_parquet(again) == manifest["parquet"][parquet_path(again).name]
        assert parquet_path(again).read_bytes() == parquet_path(tmp_path / "run" / name).read_bytes()
