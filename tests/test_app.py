"""The TinyStories Hydra app end to end: outputs, determinism, snapshots, sweeps, bad input."""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from storyforge.config import register_configs
from storyforge.errors import EXIT_CODES, DataError
from storyforge.pipeline import run_in
from storyforge.tasks.tinystories.spec import SEED_FIELDS

ROOT = Path(__file__).resolve().parents[1]
OUTPUTS = ("prompts_seed.jsonl", "prompts.jsonl")


def run_app(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``python run.py ARGS`` from the repository root, as a user runs it."""
    proc = subprocess.run(
        [sys.executable, "run.py", *args], check=False, cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"run.py {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run of the app (40 seeds, a non-default min_sentences) shared by several tests."""
    out = tmp_path_factory.mktemp("run") / "a"
    run_app("task=tinystories", "task.n_seeds=40", "constraints.min_sentences=5", f"hydra.run.dir={out}")
    return out


@pytest.fixture(scope="module")
def hydra_conf() -> Iterator[None]:
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        yield


def compose_cfg(*overrides: str) -> DictConfig:
    return compose("config", overrides=list(overrides))


# -- one run --------------------------------------------------------------------------------------


def test_run_writes_seeds_prompts_rejects_manifest_and_snapshot(first_run: Path) -> None:
    """A run leaves the four outputs and Hydra's .hydra snapshot in its run directory."""
    for name in (
        *OUTPUTS,
        "rejected_seeds.jsonl",
        "manifest.json",
        ".hydra/config.yaml",
        ".hydra/overrides.yaml",
    ):
        assert (first_run / name).is_file(), name
    assert not list(first_run.glob(".*.tmp"))


def test_seed_records_follow_the_schema_and_the_override(first_run: Path) -> None:
    """Seeds carry exactly the schema's fields, unique ids, and the overridden sentence range."""
    seeds = read_jsonl(first_run / "prompts_seed.jsonl")
    assert len(seeds) == 40
    assert all(list(s) == list(SEED_FIELDS) for s in seeds)
    assert len({s["id"] for s in seeds}) == 40
    assert {(s["min_sentences"], s["max_sentences"]) for s in seeds} == {(5, 9)}
    assert {s["split"] for s in seeds} <= {"train", "val"}


def test_prompts_are_chat_messages_ending_with_the_instruction(first_run: Path) -> None:
    """Each prompt is {id, split, messages} whose only turn is the user turn holding the instruction."""
    seeds = read_jsonl(first_run / "prompts_seed.jsonl")
    prompts = read_jsonl(first_run / "prompts.jsonl")
    assert [(p["id"], p["split"]) for p in prompts] == [(s["id"], s["split"]) for s in seeds]
    for prompt, seed in zip(prompts, seeds):
        assert list(prompt) == ["id", "split", "messages"]
        assert prompt["messages"] == [{"role": "user", "content": seed["instruction"]}]
        assert seed["instruction"].startswith("Write a children's story.\n\nConstraints:\n")
        assert f"- Protagonist: {seed['protagonist']}\n" in seed["instruction"]
        assert not seed["instruction"].endswith("\n")


def test_manifest_counts_and_checksums_match_the_files(first_run: Path) -> None:
    """manifest.json counts the records and holds each file's real sha256 and size."""
    manifest = json.loads((first_run / "manifest.json").read_text("utf-8"))
    seeds = read_jsonl(first_run / "prompts_seed.jsonl")
    assert manifest["counts"] == {
        "seeds": 40,
        "train": sum(s["split"] == "train" for s in seeds),
        "val": sum(s["split"] == "val" for s in seeds),
        "rejected": 0,
    }
    for name, entry in manifest["files"].items():
        data = (first_run / name).read_bytes()
        assert entry == {
            "records": data.count(b"\n"),
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    assert manifest["task"] == "tinystories" and manifest["seed_source"] == "generated"
    assert len(manifest["config_sha256"]) == 64


def test_two_runs_give_the_same_bytes(first_run: Path, tmp_path: Path) -> None:
    """Running the same config again writes byte-identical seeds, prompts and manifest."""
    run_app("task=tinystories", "task.n_seeds=40", "constraints.min_sentences=5", f"hydra.run.dir={tmp_path}")
    for name in (*OUTPUTS, "manifest.json"):
        assert (tmp_path / name).read_bytes() == (first_run / name).read_bytes(), name


def test_snapshot_reproduces_the_run(first_run: Path, tmp_path: Path) -> None:
    """`--config-path <run>/.hydra --config-name config` rewrites the same bytes elsewhere."""
    run_app(
        "--config-path", str(first_run / ".hydra"), "--config-name", "config", f"hydra.run.dir={tmp_path}"
    )
    for name in (*OUTPUTS, "manifest.json"):
        assert (tmp_path / name).read_bytes() == (first_run / name).read_bytes(), name


# -- configuration errors at start -----------------------------------------------------------------


def test_bad_config_exits_non_zero_naming_the_key(tmp_path: Path) -> None:
    """A cross-field error stops the app right after composition, before it writes anything."""
    proc = run_app("constraints.min_sentences=10", f"hydra.run.dir={tmp_path}", check=False)
    assert proc.returncode == EXIT_CODES["config"]
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: constraints.min_sentences (10) must be <= constraints.max_sentences (9)"
    )
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "prompts.jsonl").exists()


# -- in-process runs ------------------------------------------------------------------------------


def test_growing_n_seeds_only_appends(hydra_conf: None, tmp_path: Path) -> None:
    """The first 20 seeds of a 40-seed run are exactly the seeds of a 20-seed run (splits included)."""
    run_in(compose_cfg("task.n_seeds=20"), tmp_path / "small")
    run_in(compose_cfg("task.n_seeds=40"), tmp_path / "big")
    for name in OUTPUTS:
        small = (tmp_path / "small" / name).read_bytes().splitlines()
        big = (tmp_path / "big" / name).read_bytes().splitlines()
        assert big[:20] == small and len(big) == 40


def test_system_message_is_the_first_turn(hydra_conf: None, tmp_path: Path) -> None:
    """With task.system_message set, every prompt starts with that system turn."""
    run_in(compose_cfg("task.n_seeds=5", "task.system_message=Be gentle."), tmp_path)
    for prompt in read_jsonl(tmp_path / "prompts.jsonl"):
        assert [m["role"] for m in prompt["messages"]] == ["system", "user"]
        assert prompt["messages"][0]["content"] == "Be gentle."


def test_loading_a_written_seeds_file_gives_the_same_outputs(hydra_conf: None, tmp_path: Path) -> None:
    """prompts_seed.jsonl fed back through seeds_path passes every check and is rewritten unchanged."""
    run_in(compose_cfg("task.n_seeds=30", "task.system_message=Hi."), tmp_path / "gen")
    manifest = run_in(
        compose_cfg(f"seeds_path={tmp_path / 'gen' / 'prompts_seed.jsonl'}", "task.system_message=Hi."),
        tmp_path / "load",
    )
    assert manifest["seed_source"] == "file" and manifest["counts"]["rejected"] == 0
    for name in OUTPUTS:
        assert (tmp_path / "load" / name).read_bytes() == (tmp_path / "gen" / name).read_bytes()


@pytest.fixture
def bad_seeds(first_run: Path, tmp_path: Path) -> Path:
    """The first run's first 8 seeds with four kinds of damage, a broken line and a repeated id."""
    seeds = read_jsonl(first_run / "prompts_seed.jsonl")[:8]
    seeds[1]["banned"] = [seeds[1]["required"][0][:3]]  # part of a required phrase
    seeds[3]["theme"] = "bravery"
    seeds[5]["instruction"] = seeds[5]["instruction"].replace("Theme:", "Topic:")
    lines = [json.dumps(s) for s in seeds]
    lines.insert(6, '{"id": "ts-x", ')
    lines.append(json.dumps(seeds[0]))
    path = tmp_path / "bad_seeds.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_bad_seed_records_are_reported_and_the_run_goes_on(
    hydra_conf: None, bad_seeds: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each bad record is reported by id (or line) and rule, in the file and the log; good ones are kept."""
    with caplog.at_level(logging.WARNING, logger="storyforge.jobs.tinystories"):
        manifest = run_in(compose_cfg(f"seeds_path={bad_seeds}"), tmp_path / "out")
    rejected = read_jsonl(tmp_path / "out" / "rejected_seeds.jsonl")
    assert [(r["line"], r["id"], r["rule"]) for r in rejected] == [
        (2, "ts-000001", "unsatisfiable"),
        (4, "ts-000003", "schema"),
        (6, "ts-000005", "instruction_mismatch"),
        (7, None, "invalid_json"),
        (10, "ts-000000", "duplicate_id"),
    ]
    assert rejected[2]["message"].startswith("instruction differs from the canonical rendering at line 5:")
    kept = [s["id"] for s in read_jsonl(tmp_path / "out" / "prompts_seed.jsonl")]
    assert kept == ["ts-000000", "ts-000002", "ts-000004", "ts-000006", "ts-000007"]
    assert manifest["counts"]["rejected"] == 5 and manifest["counts"]["seeds"] == 5
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for row in rejected:
        assert f"{row['rule']}:" in logged
    assert "seed 'ts-000003' (line 4): schema: theme: 'bravery' is not one of" in logged


def test_strict_mode_stops_after_writing_the_report(
    hydra_conf: None, bad_seeds: Path, tmp_path: Path
) -> None:
    """With strict=true bad records raise DataError; the report is written, the prompt files are not."""
    out = tmp_path / "strict"
    with pytest.raises(DataError, match=r"^5 seed record\(s\) rejected with strict=true"):
        run_in(compose_cfg(f"seeds_path={bad_seeds}", "strict=true"), out)
    assert len(read_jsonl(out / "rejected_seeds.jsonl")) == 5
    assert not (out / "prompts.jsonl").exists() and not (out / "prompts_seed.jsonl").exists()
    assert not list(out.glob(".*.tmp"))


def test_strict_mode_exits_non_zero_from_the_command_line(bad_seeds: Path, tmp_path: Path) -> None:
    """`python run.py seeds_path=... strict=true` exits non-zero on bad records."""
    proc = run_app(f"seeds_path={bad_seeds}", "strict=true", f"hydra.run.dir={tmp_path / 'cli'}", check=False)
    assert proc.returncode == EXIT_CODES["data"]
    assert (
        proc.stderr.strip().splitlines()[-1].startswith("error: 5 seed record(s) rejected with strict=true")
    )


def test_instructions_over_the_token_budget_are_rejected(hydra_conf: None, tmp_path: Path) -> None:
    """A budget too small for the instruction rejects the seed rather than shortening its text."""
    manifest = run_in(compose_cfg("task.n_seeds=3", "budget.max_tokens=100"), tmp_path)
    rejected = read_jsonl(tmp_path / "rejected_seeds.jsonl")
    assert [r["rule"] for r in rejected] == ["render"] * 3
    assert rejected[0]["message"].startswith("the instruction does not fit budget.max_tokens=100")
    assert manifest["counts"]["seeds"] == 0


def test_completions_file_is_checked_and_merged_into_the_manifest(hydra_conf: None, tmp_path: Path) -> None:
    """With `completions=<file>` the completions are validated and their summary lands in the manifest."""
    run_in(compose_cfg("task.n_seeds=4"), tmp_path / "gen")
    seeds = read_jsonl(tmp_path / "gen" / "prompts_seed.jsonl")
    completions = tmp_path / "completions.jsonl"
    completions.write_text(
        "\n".join(json.dumps({"id": s["id"], "output": "A short story."}) for s in seeds) + "\n",
        encoding="utf-8",
    )
    manifest = run_in(compose_cfg("task.n_seeds=4", f"completions={completions}"), tmp_path / "out")
    assert isinstance(manifest["completions"], dict) and manifest["completions"]
    on_disk = json.loads((tmp_path / "out" / "manifest.json").read_text("utf-8"))
    assert on_disk["completions"] == manifest["completions"]


def test_provider_run_generates_over_loopback_and_records_stats(hydra_conf: None, tmp_path: Path) -> None:
    """With a provider configured, prompts go to a real loopback server and the stats reach the manifest."""
    from tests.support.fake_server import FakeServer

    with FakeServer() as server:
        cfg = compose_cfg(
            "task.n_seeds=3", "provider=openai", f"provider.base_url={server.base_url}", "provider.model=fake"
        )
        manifest = run_in(cfg, tmp_path)
    assert "generation" in manifest and "completions" in manifest
    assert len(read_jsonl(tmp_path / "generations.jsonl")) == 3


# -- sweeps ---------------------------------------------------------------------------------------


def test_parallel_multirun_gives_one_job_per_setting_and_a_summary(first_run: Path, tmp_path: Path) -> None:
    """A joblib sweep runs one job per setting, each honouring its override, and writes the summary."""
    root = tmp_path / "sweep"
    run_app(
        "-m",
        "hydra/launcher=joblib",
        "hydra.launcher.n_jobs=2",
        "task=tinystories",
        "task.n_seeds=20",
        "constraints.min_sentences=4,5",
        f"hydra.sweep.dir={root}",
    )
    for job_dir, low in (("0", 4), ("1", 5)):
        seeds = read_jsonl(root / job_dir / "prompts_seed.jsonl")
        assert {s["min_sentences"] for s in seeds} == {low}
    # Job 1 has the first run's settings with fewer seeds, so its outputs are a prefix of it.
    for name in OUTPUTS:
        first = (first_run / name).read_bytes().splitlines()[:20]
        assert (root / "1" / name).read_bytes().splitlines() == first
    summary = json.loads((root / "sweep_summary.json").read_text("utf-8"))
    assert summary["columns"] == ["seeds", "train", "val", "rejected"]
    assert [(j["job"], j["overrides"][-1], j["status"], j["counts"]["seeds"]) for j in summary["jobs"]] == [
        ("0", "constraints.min_sentences=4", "ok", 20),
        ("1", "constraints.min_sentences=5", "ok", 20),
    ]
    md = (root / "sweep_summary.md").read_text("utf-8").splitlines()
    assert md[0] == "| job | overrides | status | seeds | train | val | rejected |"
    assert md[2].startswith(
        "| 0 | `task=tinystories` `task.n_seeds=20` `constraints.min_sentences=4` | ok | 20 |"
    )
    assert len(md) == 4
