"""The completion stage: validated/sft/rejects/dpo files, pairing policies, problem lines, atomicity."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from storyforge.config.exports import DpoPairing, ExportConf, export_options
from storyforge.errors import ConfigError, DataError
from storyforge.tasks.tinystories.exports import ExportOptions, PairCollector
from storyforge.tasks.tinystories.outputs import process_completions
from storyforge.tasks.tinystories.provenance import CHECKS_VERSION

REPO = Path(__file__).resolve().parents[1]

PASS = "Tim found a red ball. He ran to the old tree. They played. Birds sang."
MISSING = "Tim found a blue ball. He ran to the old tree. They played. Birds sang."
BANNED_AND_SHORT = "A dragon had a red ball by the old tree."
BANNED = "Tim found a red ball. A dragon sat by the old tree. They played."


def seed_record(
    seed_id: str, theme: str = "kindness", split: str = "train", **changes: Any
) -> dict[str, Any]:
    record = {
        "id": seed_id,
        "split": split,
        "protagonist": "a shy turtle named Tim",
        "theme": theme,
        "required": ["red ball", "old tree"],
        "banned": ["dragon"],
        "min_sentences": 3,
        "max_sentences": 5,
        "instruction": f"Write a children's story ({seed_id}).",
    }
    record.update(changes)
    return record


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


class Run:
    """Seeds, prompts and completions written under tmp_path; ``process`` runs the stage."""

    def __init__(self, tmp_path: Path, seeds: list[dict[str, Any]], *, system: str | None = None) -> None:
        self.dir = tmp_path
        self.out = tmp_path / "out"
        self.seeds = write_jsonl(tmp_path / "prompts_seed.jsonl", seeds)
        sys_turn = [{"role": "system", "content": system}] if system else []
        self.prompts = write_jsonl(
            tmp_path / "prompts.jsonl",
            [
                {
                    "id": s["id"],
                    "split": s["split"],
                    "messages": [*sys_turn, {"role": "user", "content": s["instruction"]}],
                }
                for s in seeds
            ],
        )

    def process(self, completions: list[Any], cfg: dict[str, Any] | None = None) -> dict[str, Any]:
        path = write_jsonl(self.dir / "completions.jsonl", completions)
        # Plots are test_report.py's subject; drawing them here would only slow these tests.
        cfg = {**(cfg or {}), "export": {"plots": False, **(cfg or {}).get("export", {})}}
        return process_completions(export_options(cfg), self.out, self.seeds, self.prompts, path)

    def read(self, name: str) -> list[dict[str, Any]]:
        return read_jsonl(self.out / name)


# Seed s1 has passing samples 4 and 2 and failing samples 5, 1, 3 and 0 (empty: label other),
# in scrambled file order; s2 only passes, s3 only fails.
PAIRING_COMPLETIONS = [
    {"id": "s1", "sample": 4, "output": PASS},
    {"id": "s1", "sample": 5, "output": MISSING},
    {"id": "s1", "sample": 3, "output": BANNED},
    {"id": "s1", "sample": 0, "output": ""},
    {"id": "s1", "sample": 2, "output": PASS},
    {"id": "s1", "sample": 1, "output": BANNED_AND_SHORT},
    {"id": "s2", "sample": 0, "output": PASS},
    {"id": "s3", "sample": 0, "output": MISSING},
]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        pytest.param(
            "one_per_seed", [(2, 1, ["contains_banned", "wrong_sentence_count"])], id="one_per_seed"
        ),
        pytest.param(
            "one_per_label",
            [(2, 5, ["missing_required"]), (2, 1, ["contains_banned", "wrong_sentence_count"])],
            id="one_per_label",
        ),
        pytest.param(
            "all_pairs",
            [
                (2, 1, ["contains_banned", "wrong_sentence_count"]),
                (2, 3, ["contains_banned"]),
                (2, 5, ["missing_required"]),
                (4, 1, ["contains_banned", "wrong_sentence_count"]),
                (4, 3, ["contains_banned"]),
                (4, 5, ["missing_required"]),
            ],
            id="all_pairs",
        ),
    ],
)
def test_dpo_pairing_policies(
    tmp_path: Path, policy: str, expected: list[tuple[int, int, list[str]]]
) -> None:
    """Each policy picks the lowest sample numbers deterministically; 'other' samples are never rejected texts."""
    run = Run(tmp_path, [seed_record("s1"), seed_record("s2"), seed_record("s3")])
    summary = run.process(PAIRING_COMPLETIONS, {"export": {"dpo_pairing": policy}})
    rows = run.read("dpo.jsonl")
    assert [(r["chosen_sample"], r["rejected_sample"], r["rejected_labels"]) for r in rows] == expected
    texts = {2: PASS, 4: PASS, 1: BANNED_AND_SHORT, 3: BANNED, 5: MISSING}
    for row in rows:
        assert row["id"] == "s1"
        assert row["prompt"] == [{"role": "user", "content": "Write a children's story (s1)."}]
        assert row["chosen"] == [{"role": "assistant", "content": texts[row["chosen_sample"]]}]
        assert row["rejected"] == [{"role": "assistant", "content": texts[row["rejected_sample"]]}]
    assert summary["exports"] == {
        "dpo_pairing": policy,
        "seeds_with_pairs": 1,
        "rows": {"validated": 8, "sft": 3, "rejects": 5, "dpo": len(expected)},
    }


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("one_per_seed", [(2, 1)]),
        ("one_per_label", [(2, 5), (2, 1)]),
        ("all_pairs", [(2, 1), (2, 3), (2, 5), (4, 1), (4, 3), (4, 5)]),
    ],
)
def test_pairing_ignores_file_order(policy: str, expected: list[tuple[int, int]]) -> None:
    """The pairs chosen depend on sample numbers, not on the order completions arrive in."""
    events: list[tuple[int, tuple[str, ...] | None]] = [
        (4, None),
        (5, ("missing_required",)),
        (2, None),
        (1, ("too_long",)),
        (3, ("too_long",)),
    ]
    for order in (events, events[::-1], events[2:] + events[:2]):
        collector = PairCollector(policy)
        for sample, labels in order:
            if labels is None:
                collector.add_pass("s", sample, offset=sample * 10)
            else:
                collector.add_fail("s", sample, offset=sample * 100, labels=labels)
        pairs = list(collector.pairs(["s"]))
        assert [(p.chosen_sample, p.rejected_sample) for p in pairs] == expected
        assert all(p.chosen_offset == p.chosen_sample * 10 for p in pairs)
        assert all(p.rejected_offset == p.rejected_sample * 100 for p in pairs)


def _origin(chain: str, labels: list[str], finish_reason: str | None = None) -> dict[str, Any]:
    """The provenance of a row made from a completion file read with no run config."""
    return {
        "template": {"id": None, "sha256": None, "revision": None},
        "config_sha256": None,
        "model": None,
        "sampling_sha256": None,
        "attempt": 1,
        "chain": chain,
        "finish_reason": finish_reason,
        "checks": {"version": CHECKS_VERSION, "labels": labels},
        "judge": None,
        "journal": "completions.jsonl",
        "request_hash": None,
    }


def _is_conversational(example: dict[str, Any]) -> bool:
    """TRL's data_utils.is_conversational, restated: the first message of a supported key has role+content."""
    for key in ("prompt", "chosen", "rejected", "completion", "messages"):
        if key in example:
            messages = example[key]
            return (
                isinstance(messages, list)
                and isinstance(messages[0], dict)
                and {"role", "content"} <= set(messages[0])
            )
    return False


def test_exports_load_with_datasets_in_trl_formats(tmp_path: Path) -> None:
    """sft.jsonl and dpo.jsonl load with datasets.load_dataset('json') with the columns and roles TRL expects."""
    datasets = pytest.importorskip("datasets")
    run = Run(
        tmp_path,
        [seed_record("s1"), seed_record("s2", "courage", "val"), seed_record("s3")],
        system="Be kind.",
    )
    completions = [*PAIRING_COMPLETIONS, {"id": "s2", "sample": 1, "output": None, "error": "HTTP 500"}]
    run.process(completions, {"export": {"dpo_pairing": "all_pairs"}})
    cache = tmp_path / "hf-cache"

    sft = datasets.load_dataset(
        "json", data_files=str(run.out / "sft.jsonl"), split="train", cache_dir=str(cache)
    )
    assert set(sft.column_names) == {"id", "sample", "split", "messages", "finish_reason", "provenance"}
    assert sft.num_rows == 3
    for row in sft:
        assert _is_conversational(row)
        assert [m["role"] for m in row["messages"]] == ["system", "user", "assistant"]
        assert row["messages"][-1]["content"] == PASS
    assert sorted(zip(sft["id"], sft["sample"], sft["split"])) == [
        ("s1", 2, "train"),
        ("s1", 4, "train"),
        ("s2", 0, "val"),
    ]

    dpo = datasets.load_dataset(
        "json", data_files=str(run.out / "dpo.jsonl"), split="train", cache_dir=str(cache)
    )
    assert {"prompt", "chosen", "rejected"} <= set(dpo.column_names)
    assert set(dpo.column_names) == {
        "id",
        "split",
        "chosen_sample",
        "rejected_sample",
        "rejected_labels",
        "prompt",
        "chosen",
        "rejected",
        "chosen_finish_reason",
        "rejected_finish_reason",
        "provenance",
    }
    assert dpo.num_rows == 6
    for row in dpo:
        assert _is_conversational(row)
        assert [m["role"] for m in row["prompt"]] == ["system", "user"]
        assert [m["role"] for m in row["chosen"]] == ["assistant"]
        assert [m["role"] for m in row["rejected"]] == ["assistant"]
        assert row["chosen"][0]["content"] != row["rejected"][0]["content"]

    rejects = datasets.load_dataset(
        "json", data_files=str(run.out / "rejects.jsonl"), split="train", cache_dir=str(cache)
    )
    assert rejects.num_rows == 6
    errored = [r for r in rejects if r["error"] is not None]
    assert errored == [
        {
            "id": "s2",
            "sample": 1,
            "split": "val",
            "line": 9,
            "labels": ["other"],
            "reasons": ["provider error: HTTP 500"],
            "sentence_count": 0,
            "output": None,
            "error": "HTTP 500",
            "finish_reason": None,
            "data_labels": [],
            "cluster": None,
            "provenance": _origin("s2#1", ["other"]),
        }
    ]
    validated = datasets.load_dataset(
        "json", data_files=str(run.out / "validated.jsonl"), split="train", cache_dir=str(cache)
    )
    assert validated.num_rows == 9
    assert sum(validated["passed"]) == 3


def test_validated_sft_and_rejects_rows(tmp_path: Path) -> None:
    """validated.jsonl holds every completion's verdict; sft the passing chats; rejects the failures with reasons."""
    run = Run(tmp_path, [seed_record("s1")])
    run.process(
        [
            {"id": "s1", "output": PASS},
            {"id": "s1", "sample": 1, "output": BANNED_AND_SHORT, "finish_reason": "length"},
        ]
    )
    assert run.read("validated.jsonl") == [
        {
            "id": "s1",
            "sample": 0,
            "line": 1,
            "passed": True,
            "labels": [],
            "reasons": [],
            "sentence_count": 4,
            "chars": len(PASS),
            "finish_reason": None,
            "output": PASS,
            "error": None,
            "provenance": _origin("s1#0", []),
        },
        {
            "id": "s1",
            "sample": 1,
            "line": 2,
            "passed": False,
            "labels": ["contains_banned", "wrong_sentence_count", "other"],
            "reasons": [
                "contains banned phrase 'dragon'",
                "1 sentence, expected 3 to 5",
                "cut off at the token limit (finish_reason 'length')",
            ],
            "sentence_count": 1,
            "chars": len(BANNED_AND_SHORT),
            "finish_reason": "length",
            "output": BANNED_AND_SHORT,
            "error": None,
            "provenance": _origin("s1#1", ["contains_banned", "wrong_sentence_count", "other"], "length"),
        },
    ]
    assert run.read("sft.jsonl") == [
        {
            "id": "s1",
            "sample": 0,
            "split": "train",
            "messages": [
                {"role": "user", "content": "Write a children's story (s1)."},
                {"role": "assistant", "content": PASS},
            ],
            "finish_reason": None,
            "provenance": _origin("s1#0", []),
        }
    ]
    assert run.read("rejects.jsonl") == [
        {
            "id": "s1",
            "sample": 1,
            "split": "train",
            "line": 2,
            "labels": ["contains_banned", "wrong_sentence_count", "other"],
            "reasons": [
                "contains banned phrase 'dragon'",
                "1 sentence, expected 3 to 5",
                "cut off at the token limit (finish_reason 'length')",
            ],
            "sentence_count": 1,
            "output": BANNED_AND_SHORT,
            "error": None,
            "finish_reason": "length",
            "data_labels": [],
            "cluster": None,
            "provenance": _origin("s1#1", ["contains_banned", "wrong_sentence_count", "other"], "length"),
        }
    ]


def test_problem_lines_are_counted_and_reported(tmp_path: Path) -> None:
    """Unknown ids, duplicates, malformed lines and invalid seeds are reported by line; nothing is dropped silently."""
    seeds = [seed_record("s1"), seed_record("s2"), seed_record("bad", min_sentences=9, max_sentences=2)]
    run = Run(tmp_path, seeds)
    summary = run.process(
        [
            {"id": "s1", "output": PASS},
            {"id": "nope", "output": PASS},
            {"id": "s1", "sample": 0, "output": MISSING},
            "{broken",
            "",
            {"id": "bad", "output": PASS},
            {"id": "s2", "output": PASS},
            [1],
        ]
    )
    errors = run.read("completion_errors.jsonl")
    assert [(e["line"], e["kind"], e["id"]) for e in errors] == [
        (2, "unknown_id", "nope"),
        (3, "duplicate", "s1"),
        (4, "malformed", None),
        (6, "bad_seed", "bad"),
        (8, "malformed", None),
    ]
    assert errors[0]["message"] == "no seed with id 'nope' in prompts_seed.jsonl"
    assert errors[1]["message"] == "id 's1' sample 0 already read at line 1"
    assert errors[3]["message"] == (
        "seed 'bad' is invalid (prompts_seed.jsonl line 3: seed 'bad': min_sentences 9 is greater than max_sentences 2)"
    )
    assert summary["problems"] == {
        "malformed": {"count": 2, "lines": [4, 8], "more": 0},
        "unknown_id": {"count": 1, "lines": [2], "more": 0},
        "duplicate": {"count": 1, "lines": [3], "more": 0},
        "bad_seed": {"count": 1, "lines": [6], "more": 0},
    }
    assert summary["seed_problems"] == [
        {
            "file": "prompts_seed.jsonl",
            "line": 3,
            "id": "bad",
            "message": "seed 'bad': min_sentences 9 is greater than max_sentences 2",
        }
    ]
    source = summary["source"]
    assert (source["lines"], source["blank_lines"]) == (8, 1)
    # every line is accounted for: validated + problems + blank
    assert (
        summary["validated"] + sum(p["count"] for p in summary["problems"].values()) + source["blank_lines"]
        == 8
    )
    assert [(r["id"], r["sample"]) for r in run.read("validated.jsonl")] == [("s1", 0), ("s2", 0)]
    report = json.loads((run.out / "report" / "summary.json").read_text())
    assert report["problems"] == summary["problems"]


def test_listed_lines_are_capped(tmp_path: Path) -> None:
    """summary.json lists at most max_listed_lines per kind and counts the rest; the errors file has them all."""
    run = Run(tmp_path, [seed_record("s1")])
    summary = run.process(["x"] * 5, {"export": {"max_listed_lines": 2}})
    assert summary["problems"]["malformed"] == {"count": 5, "lines": [1, 2], "more": 3}
    assert len(run.read("completion_errors.jsonl")) == 5


def test_strict_stops_at_first_bad_line_and_writes_nothing(tmp_path: Path) -> None:
    """With strict=true the first bad line raises DataError naming file and line; no output file is left."""
    run = Run(tmp_path, [seed_record("s1")])
    with pytest.raises(DataError, match=r"completions\.jsonl:2: unknown_id: no seed with id 'x'"):
        run.process([{"id": "s1", "output": PASS}, {"id": "x", "output": PASS}], {"strict": True})
    assert list(run.out.iterdir()) == []


def test_strict_refuses_a_bad_seed(tmp_path: Path) -> None:
    """With strict=true an invalid seed record stops the stage, naming the seed file and line."""
    run = Run(tmp_path, [seed_record("s1"), seed_record("s2", required="red ball")])
    with pytest.raises(
        DataError, match=r"prompts_seed\.jsonl:2: seed 's2': 'required' must be a list of strings"
    ):
        run.process([{"id": "s1", "output": PASS}], {"strict": True})


def test_failure_keeps_previous_outputs(tmp_path: Path) -> None:
    """A run that fails half-way leaves the previous files as they were and no temp files."""
    run = Run(tmp_path, [seed_record("s1")])
    run.process([{"id": "s1", "output": PASS}])
    before = {p.name: p.read_bytes() for p in run.out.iterdir() if p.is_file()}
    with pytest.raises(DataError):
        run.process([{"id": "s1", "output": MISSING}, "garbage"], {"strict": True})
    after = {p.name: p.read_bytes() for p in run.out.iterdir() if p.is_file()}
    assert after == before
    assert not [p for p in run.out.rglob("*") if p.name.endswith(".tmp")]


def test_rerun_gives_identical_bytes(tmp_path: Path) -> None:
    """Processing the same inputs twice writes the same bytes (no clock, no paths, no randomness)."""
    run = Run(tmp_path, [seed_record("s1"), seed_record("s2"), seed_record("s3")])
    run.process(PAIRING_COMPLETIONS, {"export": {"plots": False}})
    first = {p.relative_to(run.out): p.read_bytes() for p in run.out.rglob("*") if p.is_file()}
    run.process(PAIRING_COMPLETIONS, {"export": {"plots": False}})
    second = {p.relative_to(run.out): p.read_bytes() for p in run.out.rglob("*") if p.is_file()}
    assert first == second
    assert not [p for p in run.out.rglob("*") if p.name.endswith(".tmp")]


def test_prompt_falls_back_to_instruction(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A seed missing from prompts.jsonl is exported with its instruction as the user turn, with a warning."""
    run = Run(tmp_path, [seed_record("s1")])
    run.prompts.write_text("")
    with caplog.at_level(logging.WARNING):
        summary = run.process([{"id": "s1", "output": PASS}])
    assert summary["prompts_from_instruction"] == 1
    assert run.read("sft.jsonl")[0]["messages"][0] == {
        "role": "user",
        "content": "Write a children's story (s1).",
    }
    assert "1 of 1 seeds have no prompt" in caplog.text


def test_batch_output_file(tmp_path: Path) -> None:
    """An OpenAI Batch API output file is validated with samples taken from custom_id."""
    run = Run(tmp_path, [seed_record("s1")])

    def batch(custom_id: str, content: str) -> dict[str, Any]:
        body = {"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}
        return {
            "id": "batch_req_1",
            "custom_id": custom_id,
            "response": {"status_code": 200, "body": body},
            "error": None,
        }

    summary = run.process([batch("s1#0", PASS), batch("s1#1", MISSING)])
    assert summary["source"]["formats"] == {"openai_batch": 2}
    assert [(r["sample"], r["passed"]) for r in run.read("validated.jsonl")] == [(0, True), (1, False)]
    assert len(run.read("dpo.jsonl")) == 1


def test_missing_completions_file(tmp_path: Path) -> None:
    """A completions path that does not exist is a DataError naming it and the config key."""
    run = Run(tmp_path, [seed_record("s1")])
    with pytest.raises(
        DataError, match=r"completions file .*nothing\.jsonl does not exist \(config key: completions\)"
    ):
        process_completions(export_options(None), run.out, run.seeds, run.prompts, tmp_path / "nothing.jsonl")


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        pytest.param(
            {"export": {"dpo_pairing": "best"}},
            "export.dpo_pairing: Invalid value 'best', expected one of [one_per_seed, one_per_label, all_pairs, attempts, judge_margin]",
            id="pairing",
        ),
        pytest.param(
            {"export": {"dpo_pairng": "all_pairs"}},
            "export.dpo_pairng: unknown key. Did you mean export.dpo_pairing?",
            id="typo",
        ),
        pytest.param(
            {"export": {"max_listed_lines": -1}}, "export.max_listed_lines must be >= 0, got -1", id="listed"
        ),
        pytest.param(
            {"constraints": {"max_chars": 0}},
            "constraints.max_chars must be a positive integer, got 0",
            id="max-chars",
        ),
    ],
)
def test_bad_export_options(cfg: dict[str, Any], message: str) -> None:
    """A bad option is a ConfigError naming the key and what is allowed."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        export_options(cfg)


def test_export_options_defaults_and_overrides() -> None:
    """Defaults follow the seed spec; constraints.max_chars sets the checks' cap."""
    assert export_options(None) == ExportOptions(
        conf=ExportConf(dpo_pairing=DpoPairing.one_per_seed, plots=True, max_listed_lines=100),
        max_chars=2000,
        strict=False,
    )
    options = export_options(
        {"export": {"dpo_pairing": "all_pairs"}, "constraints": {"max_chars": 60}, "strict": True}
    )
    assert (options.conf.dpo_pairing, options.max_chars, options.strict) == (DpoPairing.all_pairs, 60, True)


def test_max_chars_reaches_the_checks(tmp_path: Path) -> None:
    """constraints.max_chars from the config is the cap process_completions applies."""
    run = Run(tmp_path, [seed_record("s1")])
    run.process([{"id": "s1", "output": PASS}], {"constraints": {"max_chars": 40}})
    assert run.read("validated.jsonl")[0]["labels"] == ["too_long"]


# ---------------------------------------------------------------------------------------------
# End to end through the Hydra entry point.


def _run_py(*overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    return subprocess.run(
        [sys.executable, str(REPO / "run.py"), *overrides],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _story(seed: dict[str, Any], *, drop_required: bool = False, extra: int = 0) -> str:
    required = seed["required"][1:] if drop_required else seed["required"]
    # Made-up filler words cannot collide with the English banned-phrase pool.
    sentences = [f"Zib {phrase}." for phrase in required]
    fillers = ["Quax vem.", "Plif dor.", "Mub zan.", "Krel fip.", "Vosh tam.", "Jibo lun."]
    while len(sentences) < seed["min_sentences"]:
        sentences.append(fillers[len(sentences) % len(fillers)])
    sentences += ["Norb sil."] * extra
    text = " ".join(sentences)
    assert not any(b.lower() in text.lower() for b in seed["banned"]), "filler collides with a banned phrase"
    return text


@pytest.mark.slow
def test_run_py_end_to_end(tmp_path: Path) -> None:
    """`run.py task=tinystories completions=FILE` validates the file and writes every export and the manifest."""
    first = _run_py("task=tinystories", "task.n_seeds=20", f"hydra.run.dir={tmp_path / 'seeds'}")
    assert first.returncode == 0, first.stderr[-3000:]
    seeds = read_jsonl(tmp_path / "seeds" / "prompts_seed.jsonl")
    assert len(seeds) == 20
    completions: list[Any] = []
    expected: dict[tuple[str, int], list[str]] = {}
    for i, seed in enumerate(seeds):
        completions.append({"id": seed["id"], "sample": 0, "output": _story(seed)})
        expected[(seed["id"], 0)] = []
        if i % 2 == 0:
            completions.append({"id": seed["id"], "sample": 1, "output": _story(seed, drop_required=True)})
            expected[(seed["id"], 1)] = ["missing_required"]
        if i % 5 == 0:
            extra = seed["max_sentences"] - seed["min_sentences"] + 1
            completions.append({"id": seed["id"], "sample": 2, "output": _story(seed, extra=extra)})
            expected[(seed["id"], 2)] = ["wrong_sentence_count"]
    completions.append({"id": "ts-unknown", "output": "x"})
    path = write_jsonl(tmp_path / "completions.jsonl", completions)

    out = tmp_path / "checked"
    second = _run_py("task=tinystories", "task.n_seeds=20", f"completions={path}", f"hydra.run.dir={out}")
    assert second.returncode == 0, second.stderr[-3000:]
    validated = read_jsonl(out / "validated.jsonl")
    assert {(r["id"], r["sample"]): r["labels"] for r in validated} == expected
    n_fail = sum(1 for v in expected.values() if v)
    assert len(read_jsonl(out / "sft.jsonl")) == 20
    assert len(read_jsonl(out / "rejects.jsonl")) == n_fail
    seeds_with_failure = {seed_id for (seed_id, _), labels in expected.items() if labels}
    dpo = read_jsonl(out / "dpo.jsonl")  # one_per_seed: one pair per seed with a failure
    assert [(r["id"], r["chosen_sample"]) for r in dpo] == [
        (s["id"], 0) for s in seeds if s["id"] in seeds_with_failure
    ]
    assert [e["kind"] for e in read_jsonl(out / "completion_errors.jsonl")] == ["unknown_id"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["completions"]["passed"] == 20
    assert manifest["completions"]["failed"] == n_fail
    assert manifest["completions"]["problems"]["unknown_id"]["lines"] == [len(completions)]
    for name in (
        "summary.json",
        "summary.md",
        "pass_rate_by_theme.png",
        "label_counts.png",
        "sentence_counts.png",
    ):
        assert (out / "report" / name).stat().st_size > 0
    log_text = (out / "run.log").read_text()
    assert re.search(
        rf"validated +{len(expected)}\npassed +20 \({100 * 20 / len(expected):.1f}%\)\n", log_text
    )
