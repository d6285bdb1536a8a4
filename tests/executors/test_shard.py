"""One shard's work without Ray: its seeds are those whose id hashes to it; its journal has one
writer; its validation, merged with the other shards', is the validation of the whole file."""

from __future__ import annotations

import fcntl
import hashlib
import json
import threading
from array import array
from pathlib import Path
from typing import Any

import pytest
from run_support import provider_overrides, run_cfg

from storyforge.atomic import jsonl_line
from storyforge.config.settings import read_settings
from storyforge.errors import DataError
from storyforge.executors import shard_of
from storyforge.jobs.costing import plain_meter
from storyforge.jobs.tinystories_chains import GenerateUnit, run_generate
from storyforge.jobs.tinystories_shards import (
    GENERATIONS,
    LOCK_FILE,
    PROMPTS,
    SEEDS,
    _SeedLines,
    merge_shard_exports,
    render_shard,
    sign_shard,
    validate_shard,
)
from storyforge.quality.dedup import Signatures
from storyforge.tasks.tinystories.dedup_stage import run_quality
from storyforge.tasks.tinystories.outputs import EXPORTS, process_completions, summarize_checks
from tests.support.fake_server import FakeServer

EXPORT_FILES = [f"{name}.{kind}" for name in EXPORTS for kind in ("jsonl", "parquet")]


def test_render_shard_keeps_the_seeds_that_hash_to_it_in_order(hydra_conf: None, tmp_path: Path) -> None:
    """Shard 1 of 3 holds exactly the seeds whose id hashes to 1, with their indexes as positions."""
    plain = read_settings(run_cfg("task.n_seeds=30"))
    rendered = render_shard(plain, str(tmp_path), 1, 3)
    ids = [
        json.loads(line)["id"] for line in (tmp_path / "prompts_seed.jsonl").read_text("utf-8").splitlines()
    ]
    assert ids == [f"ts-{i:06d}" for i in range(30) if shard_of(f"ts-{i:06d}", 3) == 1]
    assert rendered.seeds == [(int(i.removeprefix("ts-")), i) for i in ids]


class _Text(str):
    """A string subclass: orjson is not trusted with it."""


_SEED = {
    "id": "ts-000001",
    "split": "val",
    "protagonist": "a cat named Tom",
    "theme": "kindness",
    "required": ["red ball", "kite"],
    "banned": [],
    "min_sentences": 6,
    "max_sentences": 9,
    "instruction": "Write a children's story.\n- Protagonist: a cat named Tom",
}


@pytest.mark.parametrize("system", [[], [{"role": "system", "content": 'Be kind, "dear" \u00e9\n'}]])
@pytest.mark.parametrize(
    "change",
    [
        pytest.param({}, id="plain"),
        pytest.param(
            {"split": "train", "instruction": '\u00e9\u4e2d\U0001f600 \u2028 \x00 "q" \\'}, id="escapes"
        ),
        pytest.param({"protagonist": _Text("a cat")}, id="a_string_subclass"),
        pytest.param({"id": _Text("ts-2"), "instruction": _Text("x")}, id="subclassed_id_and_instruction"),
        pytest.param({"min_sentences": 2**70}, id="an_integer_past_64_bits"),
        pytest.param({"split": "test"}, id="another_split"),
    ],
)
def test_a_seed_s_two_lines_are_its_records_jsonl_lines(
    system: list[dict[str, str]], change: dict[str, Any]
) -> None:
    """The render loop's encoder writes jsonl_line's bytes for the seed and its prompt record."""
    record = _SEED | change
    prompt = {
        "id": record["id"],
        "split": record["split"],
        "messages": [*system, {"role": "user", "content": record["instruction"]}],
    }
    assert _SeedLines(system).encode(record) == (jsonl_line(record), jsonl_line(prompt))


def test_a_shard_journal_waits_for_the_process_holding_its_lock(hydra_conf: None, tmp_path: Path) -> None:
    """While another process (here: this test) holds the shard lock, generation does not start."""
    with FakeServer() as server:
        plain = read_settings(run_cfg("task.n_seeds=6", *provider_overrides(server.base_url)))
        provider = plain.provider
        assert provider is not None
        render_shard(plain, str(tmp_path), 0, 1)
        result: dict[str, object] = {}
        with (tmp_path / LOCK_FILE).open("wb") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            unit = GenerateUnit(
                settings=plain, dir=tmp_path, meter=plain_meter(provider, plain.pricing), whole=False
            )
            worker = threading.Thread(target=lambda: result.update(run_generate(unit, None).generation or {}))
            worker.start()
            worker.join(timeout=1.0)
            assert worker.is_alive() and server.request_count == 0
            assert not (tmp_path / "generations.jsonl").exists()
        worker.join(timeout=60)
    assert not worker.is_alive() and result["total"] == 6 and server.request_count == 6


def _story(seed: dict[str, Any], *, passing: bool) -> str:
    """A text that passes the seed's checks, or one that misses its required phrases."""
    sentences = [f"Look, {phrase}." for phrase in seed["required"]] if passing else []
    sentences += ["We sat."] * (seed["min_sentences"] - len(sentences))
    return " ".join(sentences)


def _completion_lines(seeds: list[dict[str, Any]]) -> list[str]:
    """Two samples per seed (some pass, some fail, some are provider errors), and problem lines:
    malformed, blank, an unknown id and duplicates of two seeds (in different shards of two)."""
    lines = []
    for index, seed in enumerate(seeds):
        for sample in range(2):
            record: dict[str, Any] = {"id": seed["id"], "sample": sample}
            if index % 5 == 4 and sample:
                record["error"] = "HTTP 500: the model fell over"
            else:
                record["output"] = _story(seed, passing=(index + sample) % 3 != 0)
            lines.append(json.dumps(record))
    duplicates = [lines[0], lines[4]]
    lines[3:3] = ["{not json", ""]
    lines[9:9] = [json.dumps({"id": "nobody", "output": "Hi."}), *duplicates]
    return lines


def test_shards_checked_apart_and_merged_give_the_files_of_one_check(
    hydra_conf: None, tmp_path: Path
) -> None:
    """A completion file checked whole, and checked in two shards whose files the driver merges:
    the same data sets, Parquet twins, problem lines and report, byte for byte."""
    plain = read_settings(run_cfg("task.n_seeds=12", "export.max_listed_lines=1", "export.plots=false"))
    whole = tmp_path / "whole"
    render_shard(plain, str(whole), 0, 1)
    seeds = [json.loads(line) for line in (whole / SEEDS).read_text("utf-8").splitlines()]
    lines = _completion_lines(seeds)
    journal = whole / GENERATIONS
    journal.write_text("".join(f"{line}\n" for line in lines), "utf-8")
    expected = process_completions(
        plain.export,
        whole,
        whole / SEEDS,
        whole / PROMPTS,
        journal,
        dedup=plain.dedup,
    )
    assert expected["exports"]["rows"]["dpo"] and expected["source"]["blank_lines"] == 1
    problems = {kind: (p["count"], p["more"]) for kind, p in expected["problems"].items()}
    assert problems == {"malformed": (1, 0), "unknown_id": (1, 0), "duplicate": (2, 1), "bad_seed": (0, 0)}

    dirs = [tmp_path / "shards" / f"{k:04d}" for k in range(2)]
    parts: list[list[str]] = [[], []]
    numbers = [array("q"), array("q")]
    for number, line in enumerate(lines, start=1):
        try:
            seed_id = json.loads(line)["id"]
        except ValueError:
            seed_id = None
        k = shard_of(seed_id, 2) if seed_id else 0
        parts[k].append(line)
        numbers[k].append(number)
    positions = []
    signatures = []
    for k, shard_dir in enumerate(dirs):
        rendered = render_shard(plain, str(shard_dir), k, 2)
        (shard_dir / GENERATIONS).write_text("".join(f"{line}\n" for line in parts[k]), "utf-8")
        positions.append([position for position, _ in rendered.seeds])
        signatures.append(sign_shard(plain, str(shard_dir), numbers[k]))
    # The driver's part of the duplicate search: the shards' signatures clustered at once.
    merged = tmp_path / "merged"
    merged.mkdir()
    dedup = plain.dedup
    quality = run_quality(
        merged,
        whole / SEEDS,
        journal,
        None,
        dedup=dedup,
        signatures=Signatures.concat(signatures, dedup.num_perm),
    )
    assert expected["dedup"]["dropped"] == len(quality.dropped) > 0  # the answers repeat
    checked = [
        validate_shard(plain, str(d), str(journal), numbers[k], positions[k], quality.dropped)
        for k, d in enumerate(dirs)
    ]
    rows, parquet = merge_shard_exports(merged, [str(d) for d in dirs], checked)
    sha256 = hashlib.sha256(journal.read_bytes()).hexdigest()
    summary = summarize_checks(
        plain.export,
        merged,
        [part.tally for part in checked],
        source=journal,
        sha256=sha256,
        rows=rows,
        parquet=parquet,
        quality=quality.summary,
    )

    assert summary == expected
    names = sorted(str(p.relative_to(merged)) for p in merged.rglob("*") if p.is_file())
    assert names == sorted([*EXPORT_FILES, "duplicates.jsonl", "report/summary.json", "report/summary.md"])
    for name in names:
        assert (merged / name).read_bytes() == (whole / name).read_bytes(), f"{name} differs"


def test_a_shard_checked_again_rewrites_its_files(hydra_conf: None, tmp_path: Path) -> None:
    """A retried validation replaces the shard's files whole: nothing is appended twice."""
    plain = read_settings(run_cfg("task.n_seeds=6", "export.plots=false"))
    rendered = render_shard(plain, str(tmp_path), 0, 1)
    seeds = [json.loads(line) for line in (tmp_path / SEEDS).read_text("utf-8").splitlines()]
    lines = [json.dumps({"id": s["id"], "output": _story(s, passing=True)}) for s in seeds]
    (tmp_path / GENERATIONS).write_text("".join(f"{line}\n" for line in lines), "utf-8")
    positions = [position for position, _ in rendered.seeds]
    numbers = array("q", range(1, len(lines) + 1))
    (tmp_path / "validated.jsonl").write_text('{"stale": true}\n' * 3, "utf-8")
    first = validate_shard(plain, str(tmp_path), str(tmp_path / GENERATIONS), numbers, positions)
    shard_files = [name for name in EXPORT_FILES if name.endswith(".jsonl")]  # a shard has no twins
    written = {name: (tmp_path / name).read_bytes() for name in shard_files}
    again = validate_shard(plain, str(tmp_path), str(tmp_path / GENERATIONS), numbers, positions)
    assert {name: (tmp_path / name).read_bytes() for name in shard_files} == written
    assert first == again and first.keys is not None and list(first.keys["validated"]) == list(numbers)
    assert (tmp_path / "validated.jsonl").read_bytes().count(b"\n") == len(lines)


@pytest.mark.parametrize(
    ("strict", "lines", "counts"),
    [
        pytest.param(False, ["{not json", "", "{not json either"], "3 line(s), 1 blank", id="malformed"),
        pytest.param(True, [], "0 line(s), 0 blank", id="strict-empty"),
    ],
)
def test_shards_with_no_usable_completion_fail_the_whole_file_check_as_one_check_does(
    hydra_conf: None,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    strict: bool,
    lines: list[str],
    counts: str,
) -> None:
    """The "no usable completion" check is a reduction over the shards' figures: shards that
    each found nothing usable warn once (strict=true: fail) in one check's words and counts."""
    plain = read_settings(run_cfg("task.n_seeds=4", "export.plots=false", f"strict={str(strict).lower()}"))
    journal = tmp_path / GENERATIONS
    journal.write_text("".join(f"{line}\n" for line in lines), "utf-8")
    expected = f"completions: {journal} holds no usable completion ({counts}; see completion_errors.jsonl)"
    dirs = [tmp_path / "shards" / f"{k:04d}" for k in range(2)]
    numbers = [array("q", [n for n in range(1, len(lines) + 1) if n % 2 == k]) for k in range(2)]
    checked = []
    for k, shard_dir in enumerate(dirs):
        rendered = render_shard(plain, str(shard_dir), k, 2)
        (shard_dir / GENERATIONS).write_text("".join(f"{lines[n - 1]}\n" for n in numbers[k]), "utf-8")
        positions = [position for position, _ in rendered.seeds]
        checked.append(validate_shard(plain, str(shard_dir), str(journal), numbers[k], positions))
    rows, parquet = merge_shard_exports(tmp_path, dirs, checked)

    def reduce() -> dict[str, Any]:
        return summarize_checks(
            plain.export,
            tmp_path,
            [part.tally for part in checked],
            source=journal,
            sha256=hashlib.sha256(journal.read_bytes()).hexdigest(),
            rows=rows,
            parquet=parquet,
        )

    if strict:
        with pytest.raises(DataError) as raised:
            reduce()
        assert str(raised.value) == f"{expected}; strict=true"
        assert not (tmp_path / "report").exists()
        return
    with caplog.at_level("WARNING"):
        summary = reduce()
    assert [r.getMessage() for r in caplog.records if "no usable" in r.getMessage()] == [expected]
    assert summary["validated"] == 0 and summary["source"]["lines"] == len(lines)
