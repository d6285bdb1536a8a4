"""A run is a dataset: row provenance, the dataset card, load_dataset(RUN_DIR, name), card and push."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from storyforge.card import CONFIGS, card_text, upload_plan
from storyforge.cli import main as cli_main
from storyforge.ids import content_hash
from storyforge.tasks.tinystories.provenance import CHECKS_VERSION
from tests.support.fake_server import FakeServer
from tests.support.runs import make_run
from tests.support.scripted_stories import FIRST_SEED, instruction_of, is_repair, passing_story

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the tests load local folders only
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
SEEDS = 3
SAMPLES = 2
TEMPLATE = ROOT / "conf" / "template" / "tinystories_instruction.yaml"
JUDGE_TEMPLATE = ROOT / "conf" / "template" / "tinystories_judge_safety.yaml"


def _story_judged(body: Mapping[str, Any]) -> str:
    text = str(body["messages"][-1]["content"])
    return text.split("The story:\n", 1)[1].split("\n\nAnswer with", 1)[0]


def script(body: Mapping[str, Any]) -> str:
    """Sample 0's first attempt breaks the rules; sample 1's first passes them but the judge
    fails it ("grabbed"); every repair passes both."""
    if "response_format" in body:
        if "grabbed" in _story_judged(body):
            return json.dumps({"verdict": "fail", "rule": "violence", "reason": "Zob grabbed"})
        return json.dumps({"verdict": "pass", "rule": "none", "reason": "calm"})
    story = passing_story(instruction_of(list(body["messages"])))
    if is_repair(body):
        return story
    if body.get("seed") == FIRST_SEED:
        return "The end."
    return story.replace("Zob saw", "Zob grabbed", 1)


def _run_py(*overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "run.py", *overrides],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def _provider(url: str, tmp: Path) -> list[str]:
    return [
        "provider=openai",
        f"provider.base_url={url}",
        "provider.model=fake",
        f"provider.seed={FIRST_SEED}",
        f"provider.samples={SAMPLES}",
        "provider.progress=false",
        f"cache.path={tmp / 'cache.sqlite'}",
        "export.plots=false",
        "dedup=none",  # the scripted stories of one seed are the same text
    ]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A provider run over real HTTP with regeneration, a judge and attempt pairs."""
    tmp = tmp_path_factory.mktemp("card")
    run = tmp / "run"
    with FakeServer(script=script) as server:
        proc = _run_py(
            f"task.n_seeds={SEEDS}",
            *_provider(server.base_url, tmp),
            "judge=content_safety",
            "regenerate.max_attempts=2",
            "export.dpo_pairing=attempts",
            "+pricing.models.fake={input: 1.0, cached_input: 0.5, output: 2.0}",
            f"hydra.run.dir={run}",
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    yield run


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines() if line.strip()]


def _load(run: Path, name: str, tmp: Path, **kwargs: Any) -> Any:
    datasets = pytest.importorskip("datasets")
    return datasets.load_dataset(str(run), name, split="train", cache_dir=str(tmp / "hf-cache"), **kwargs)


def test_every_config_of_a_provider_run_loads_with_load_dataset(run_dir: Path, tmp_path: Path) -> None:
    summary = json.loads((run_dir / "report" / "summary.json").read_text("utf-8"))
    rows = summary["exports"]["rows"]
    assert rows["dpo"] == SEEDS and rows["sft"] == 2 * SEEDS  # every config has rows here
    for name in CONFIGS:
        data = _load(run_dir, name, tmp_path)
        assert data.num_rows == rows[name], name
        assert data.column_names[-1] == "provenance"
        jsonl = _lines(run_dir / f"{name}.jsonl")
        assert data.to_list() == jsonl, name  # the Parquet config holds the JSONL's rows


def _answer_in_journal(run: Path, origin: Mapping[str, Any]) -> dict[str, Any]:
    """The journal line the provenance names (by file and request hash), exactly one."""
    found = [r for r in _lines(run / origin["journal"]) if r["request_hash"] == origin["request_hash"]]
    assert len(found) == 1, origin
    return found[0]


def test_every_rows_provenance_leads_to_its_journal_line_and_its_template(run_dir: Path) -> None:
    snapshot = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text("utf-8"))
    template_hash = content_hash(snapshot["template"])
    assert snapshot["template"]["id"] == yaml.safe_load(TEMPLATE.read_text("utf-8"))["id"]
    judge_hash = content_hash(yaml.safe_load(JUDGE_TEMPLATE.read_text("utf-8")))
    seen_journals = set()

    def check(origin: Mapping[str, Any], text: str | None, labels: list[str]) -> None:
        answer = _answer_in_journal(run_dir, origin)
        seen_journals.add(origin["journal"])
        assert answer["output"] == text
        shift = (origin["attempt"] - 1) * SAMPLES  # attempt k's journal numbers its samples on
        assert f"{answer['id']}#{answer['sample'] - shift}" == origin["chain"]
        assert origin["finish_reason"] == answer["finish_reason"] == "stop"
        assert origin["template"] == {
            "id": "tinystories_instruction",
            "sha256": template_hash,
            "revision": None,
        }
        assert origin["model"] == "fake@127.0.0.1"
        assert origin["checks"] == {"version": CHECKS_VERSION, "labels": labels}
        judge = origin["judge"]
        if judge is not None:  # only answers that pass the rules are judged
            assert judge["template_sha256"] == judge_hash
            assert judge["verdict"] == ("fail" if "grabbed" in (text or "") else "pass")

    for row in _lines(run_dir / "validated.jsonl"):
        origin = row["provenance"]
        assert (origin["attempt"], origin["request_hash"]) == (row["attempt"], row["request_hash"])
        check(origin, row["output"], row["labels"])
    for row in _lines(run_dir / "sft.jsonl"):
        check(row["provenance"], row["messages"][-1]["content"], [])
    for row in _lines(run_dir / "rejects.jsonl"):
        check(row["provenance"], row["output"], row["labels"])
    for row in _lines(run_dir / "dpo.jsonl"):
        check(row["provenance"]["chosen"], row["chosen"][0]["content"], [])
        rejected = row["provenance"]["rejected"]
        check(rejected, row["rejected"][0]["content"], rejected["checks"]["labels"])
        assert rejected["attempt"] == row["rejected_attempt"] and rejected["checks"]["labels"]
    assert seen_journals == {"generations.jsonl", "generations.attempt2.jsonl"}
    hashes = {r["provenance"]["config_sha256"] for r in _lines(run_dir / "validated.jsonl")}
    assert len(hashes) == 1 and None not in hashes


def _is_message_list(value: Any, roles: tuple[str, ...]) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and set(m) == {"role", "content"} for m in value)
        and all(m["role"] in roles and isinstance(m["content"], str) for m in value)
    )


def test_sft_and_dpo_rows_are_trl_conversational_with_provenance_beside(
    run_dir: Path, tmp_path: Path
) -> None:
    """TRL's conversational formats: SFT ``messages`` = a list of {role, content} ending with the
    assistant turn; DPO ``prompt`` = the prompt turns, ``chosen``/``rejected`` = one assistant
    turn each. The extra columns (provenance among them) are ones TRL leaves alone."""
    sft = _load(run_dir, "sft", tmp_path)
    for row in sft:
        assert _is_message_list(row["messages"], ("system", "user", "assistant"))
        assert row["messages"][-1]["role"] == "assistant"
        assert row["provenance"]["request_hash"]
    dpo = _load(run_dir, "dpo", tmp_path)
    for row in dpo:
        assert _is_message_list(row["prompt"], ("system", "user"))
        for side in ("chosen", "rejected"):
            assert _is_message_list(row[side], ("assistant",)) and len(row[side]) == 1
            assert row["provenance"][side]["request_hash"]


def _table(card: str, head: str) -> dict[str, list[str]]:
    """The rows of the card's Markdown table whose header row starts with ``| head |``."""
    lines = card.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {head} |"))
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_the_cards_figures_are_the_reports(run_dir: Path) -> None:
    card = (run_dir / "README.md").read_text("utf-8")
    summary = json.loads((run_dir / "report" / "summary.json").read_text("utf-8"))
    manifest = json.loads((run_dir / "manifest.json").read_text("utf-8"))
    front = yaml.safe_load(card.split("---\n", 2)[1])
    assert front["license"] == "other" and front["task_categories"] == ["text-generation"]
    assert [(c["config_name"], c["data_files"][0]["path"]) for c in front["configs"]] == list(CONFIGS.items())
    assert {k: int(v[0]) for k, v in _table(card, "config").items()} == summary["exports"]["rows"]
    attempts = _table(card, "attempt")
    for row in summary["regeneration"]["by_attempt"]:
        requests, passed, rate, interval = attempts[str(row["attempt"])]
        assert (int(requests), int(passed), float(rate)) == (
            row["requests"],
            row["passed_by"],
            row["pass_rate"],
        )
        assert json.loads(interval) == row["interval_95"]
    assert {k: int(v[0]) for k, v in _table(card, "label").items()} == summary["labels"]
    verdicts = manifest["regeneration"]["judge"]["verdicts"]
    assert verdicts["pass"] and verdicts["fail"]
    assert {k: int(v[0]) for k, v in _table(card, "verdict").items()} == verdicts
    diversity = {k: v[0] for k, v in _table(card, "figure").items()}
    assert float(diversity["distinct_2"]) == summary["diversity"]["run"]["distinct_2"]
    match = re.search(r"Pass rate: ([\d.]+) \((\d+) of (\d+) checked", card)
    assert match is not None
    assert (float(match[1]), int(match[2]), int(match[3])) == (
        summary["pass_rate"],
        summary["passed"],
        summary["validated"],
    )
    assert f"Cost: {summary['cost']['total_usd']} USD" in card
    overrides = yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text("utf-8"))
    assert "export.dpo_pairing=attempts" in overrides and "export.dpo_pairing=attempts" in card
    assert "provider.replay=only cache.path=null" in card


def test_card_rewrites_the_same_card_and_push_lists_the_folder(
    run_dir: Path, tmp_path: Path, capsys: Any
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    written = (copy / "README.md").read_text("utf-8")
    (copy / "README.md").unlink()
    assert cli_main(["card", str(copy)]) == 0
    assert (copy / "README.md").read_text("utf-8") == written
    assert capsys.readouterr().out == f"{copy / 'README.md'}\n"
    assert cli_main(["push", str(copy), "--repo", "someone/tiny", "--dry-run"]) == 0
    out = capsys.readouterr().out
    files, message = upload_plan(copy)
    assert out.splitlines()[0] == f"someone/tiny: {message}"
    assert {"README.md", "sft.parquet", "dpo.parquet", "manifest.json", ".hydra/config.yaml"} <= set(files)
    assert not any(name.endswith((".lock", ".sqlite")) for name in files)
    assert message.startswith("storyforge ") and "tinystories run" in message


def test_no_secret_reaches_the_card(tmp_path: Path) -> None:
    """A base URL with user info: the card names the server without it."""
    run = tmp_path / "run"
    with FakeServer(script=script) as server:
        url = server.base_url.replace("http://", "http://alice:s3cret-pw@")
        proc = _run_py("task.n_seeds=2", *_provider(url, tmp_path), f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    card = (run / "README.md").read_text("utf-8")
    assert "s3cret-pw" not in card and "alice" not in card
    assert "127.0.0.1" in card
    assert "s3cret-pw" not in (run / "sft.jsonl").read_text("utf-8")


def test_an_empty_export_still_loads(tmp_path: Path) -> None:
    """Every answer fails: sft and dpo have no rows, and their configs still load (streaming)."""
    completions = tmp_path / "completions.jsonl"
    seeds = [{"id": f"ts-{i:06d}", "output": "The end."} for i in range(2)]
    completions.write_text("".join(json.dumps(s) + "\n" for s in seeds), "utf-8")
    run = tmp_path / "run"
    proc = _run_py(
        "task.n_seeds=2", f"completions={completions}", "export.plots=false", f"hydra.run.dir={run}"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "report" / "summary.json").read_text("utf-8"))
    assert summary["exports"]["rows"] == {"validated": 2, "sft": 0, "rejects": 2, "dpo": 0}
    for name in ("sft", "dpo"):
        data = _load(run, name, tmp_path, streaming=True)
        assert list(data) == []
        assert "provenance" in data.features and set(data.features) == set(
            pq.read_schema(run / CONFIGS[name]).names
        )
    for name in ("rejects", "validated"):
        rows = _load(run, name, tmp_path).to_list()
        assert [r["provenance"]["journal"] for r in rows] == ["completions.jsonl"] * 2
        assert [r["provenance"]["chain"] for r in rows] == ["ts-000000#0", "ts-000001#0"]
    card = (run / "README.md").read_text("utf-8")
    front = yaml.safe_load(card.split("---\n", 2)[1])
    assert [c["config_name"] for c in front["configs"]] == list(CONFIGS)  # the empty ones too
    assert "A config with no rows (`sft`, `dpo`) loads with `streaming=True`" in card


def test_card_writes_a_card_for_a_run_made_before_it(tmp_path: Path) -> None:
    """A run without README.md and without the provenance column gets a card that loads."""
    run = make_run(tmp_path / "old", 4)
    for name in CONFIGS.values():  # the files as they were before provenance
        table = pq.read_table(run / name)
        if "provenance" in table.column_names:
            pq.write_table(table.drop_columns(["provenance"]), run / name)
    (run / "manifest.json").write_text(
        json.dumps({"task": "tinystories", "storyforge_version": "0.0.9", "counts": {}}), "utf-8"
    )
    assert not (run / "README.md").exists()
    assert cli_main(["card", str(run), "--license", "cc-by-4.0"]) == 0
    card = (run / "README.md").read_text("utf-8")
    assert yaml.safe_load(card.split("---\n", 2)[1])["license"] == "cc-by-4.0"
    assert card == card_text(run, license_="cc-by-4.0")
    summary = json.loads((run / "report" / "summary.json").read_text("utf-8"))
    assert {k: int(v[0]) for k, v in _table(card, "config").items()} == summary["exports"]["rows"]
    assert _load(run, "sft", tmp_path).num_rows == summary["exports"]["rows"]["sft"]


def test_a_sweep_gets_one_card_at_its_root_listing_its_jobs(tmp_path: Path) -> None:
    root = tmp_path / "sweep"
    with FakeServer(script=script) as server:
        proc = _run_py(
            "-m", "task.n_seeds=2,3", *_provider(server.base_url, tmp_path), f"hydra.sweep.dir={root}"
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    card = (root / "README.md").read_text("utf-8")
    jobs = _table(card, "job")
    assert list(jobs) == ["[0](0/README.md)", "[1](1/README.md)"]
    assert [cells[0] for cells in jobs.values()] == ["`task.n_seeds=2`", "`task.n_seeds=3`"]
    summary = json.loads((root / "sweep_summary.json").read_text("utf-8"))
    assert [cells[2] for cells in jobs.values()] == [
        str(j["completions"]["pass_rate"]) for j in summary["jobs"]
    ]
    for job in ("0", "1"):
        assert (root / job / "README.md").is_file()


def test_research_qa_rows_lead_back_to_their_dataset_line_and_template(tmp_path: Path) -> None:
    from storyforge.config.research_qa import packaged_dataset
    from storyforge.tasks.research_qa.format import default_prompt_format

    lines = packaged_dataset().read_text("utf-8").splitlines()
    kept = [line for line in lines if json.loads(line).get("instruction", "").strip()][:3]
    dataset = tmp_path / "rqa.jsonl"
    dataset.write_text("\n".join(["{not json", *kept]) + "\n", "utf-8")  # line 1 is rejected
    out = tmp_path / "out"
    proc = _run_py("task=research_qa", f"dataset={dataset}", f"hydra.run.dir={out}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text("utf-8"))
    template = default_prompt_format().template(manifest["prompt_mode"])
    for name in ("train", "eval"):
        rows = _lines(out / f"{name}.jsonl")
        assert pq.read_table(out / f"{name}.parquet").to_pylist() == rows
        for row in rows:
            origin = row["provenance"]
            line = origin["dataset"]["line"]
            assert json.loads(dataset.read_text("utf-8").splitlines()[line - 1])["task_id"] == row["task_id"]
            assert origin["dataset"] == {
                "file": "rqa.jsonl",
                "sha256": manifest["dataset"]["sha256"],
                "line": line,
            }
            assert origin["template"]["sha256"] == content_hash(
                json.loads(json.dumps(template, default=dict))
            )
            assert origin["prompt_format_sha256"] == manifest["prompt_format"]["sha256"]
            assert origin["config_sha256"] == manifest["config_sha256"]
        assert [r["provenance"]["dataset"]["line"] for r in rows] == [2, 3, 4]


def test_card_on_a_sweep_root_writes_every_jobs_card_and_the_sweeps(tmp_path: Path) -> None:
    from tests.support.runs import make_sweep

    root = make_sweep(tmp_path / "sweep", 4, [("constraints.min_sentences", ["3", "4"])])
    report = (root / "sweep_report.md").read_bytes()
    assert cli_main(["card", str(root), "--license", "mit"]) == 0
    assert (root / "sweep_report.md").read_bytes() == report  # the report is the report command's
    jobs = _table((root / "README.md").read_text("utf-8"), "job")
    assert [cells[0] for cells in jobs.values()] == [
        "`constraints.min_sentences=3`",
        "`constraints.min_sentences=4`",
    ]
    for job in ("0", "1"):
        card = (root / job / "README.md").read_text("utf-8")
        assert yaml.safe_load(card.split("---\n", 2)[1])["license"] == "mit"


def test_push_sends_to_the_hub_and_a_refusal_is_one_line(run_dir: Path) -> None:
    """Against a loopback server standing in for the hub (which refuses the repository): the
    dataset repository is asked for by name, and the refusal is one line, exit status 1,
    with no token in it."""
    pytest.importorskip("huggingface_hub")
    with FakeServer() as server:
        env = {
            **os.environ,
            "HF_ENDPOINT": server.base_url.rsplit("/v1", 1)[0],
            "HF_TOKEN": "hf_dummy0secret0token",
            "HF_HUB_OFFLINE": "0",
        }
        proc = subprocess.run(
            [sys.executable, "-m", "storyforge.cli", "push", str(run_dir), "--repo", "someone/tiny"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        created = [r.json for r in server.received if r.path == "/api/repos/create"]
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("error: push to someone/tiny: ") and proc.stderr.count("\n") == 1
    assert "hf_dummy0secret0token" not in proc.stderr
    assert len(created) == 1
    assert (created[0]["name"], created[0]["type"]) == ("tiny", "dataset")
