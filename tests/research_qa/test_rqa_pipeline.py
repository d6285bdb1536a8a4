"""The research-QA job, Modelfiles, drift checks and the six-condition sweep, end to end."""

from __future__ import annotations

import argparse
import copy
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from storyforge.config import register_configs
from storyforge.config.research_qa import compose_prompt_format, packaged_dataset
from storyforge.errors import ConfigError, DataError
from storyforge.pipeline import run_in as run
from storyforge.tasks.research_qa import check as check_cli
from storyforge.tasks.research_qa.contexts import CONTEXT_SEPARATOR
from storyforge.tasks.research_qa.format import (
    default_prompt_format,
    packaged_conf_dir,
    prompt_format_from_mapping,
)
from storyforge.tasks.research_qa.modelfile import read_modelfile

REPO = Path(__file__).resolve().parents[2]
CONF = REPO / "conf"
RESEARCH = "You are a research paper assistant."


GROUPS = frozenset({"model", "prompt_format", "budget", "template", "provider"})


@functools.cache
def _composed(groups: tuple[str, ...]):
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=["task=research_qa", *groups])


def compose_cfg(*overrides: str):
    """The composed config: group choices through Hydra (cached), key=value overrides applied
    on a copy the way Hydra applies them (YAML values; unknown keys fail; '+' adds)."""
    groups = tuple(o for o in overrides if o.split("=", 1)[0] in GROUPS)
    cfg = copy.deepcopy(_composed(groups))
    for override in overrides:
        if override in groups:
            continue
        key, _, value = override.partition("=")
        OmegaConf.update(
            cfg, key.lstrip("+"), yaml.safe_load(value), merge=False, force_add=key.startswith("+")
        )
    return cfg


def hydra_compose(*overrides: str):
    """A full Hydra composition, uncached (for what only Hydra itself can show)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return compose("config", overrides=["task=research_qa", *overrides])


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def fixture_records() -> dict[str, dict]:
    return {r["task_id"]: r for r in read_jsonl(packaged_dataset())}


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    check_cli.add_arguments(parser)
    return check_cli.command(parser.parse_args(list(argv)), compose=compose_prompt_format)


# -- configuration ----------------------------------------------------------------------------


def test_packaged_format_equals_the_hydra_composed_one():
    """The library's YAML reading and Hydra's composition give the same prompt format."""
    composed = prompt_format_from_mapping(OmegaConf.to_container(hydra_compose().prompt_format, resolve=True))
    assert composed == default_prompt_format()
    assert composed.sha256 == default_prompt_format().sha256


def test_yaml_separator_is_the_documented_constant():
    """conf/prompt_format/research_qa.yaml states the separator CONTEXT_SEPARATOR documents."""
    data = yaml.safe_load((packaged_conf_dir() / "prompt_format" / "research_qa.yaml").read_text("utf-8"))
    assert data["context_separator"] == CONTEXT_SEPARATOR == default_prompt_format().context_separator


def test_task_pulls_in_its_template_model_and_format():
    """task=research_qa selects rqa_instruction, the chosen model and the research_qa format."""
    cfg = hydra_compose("model=rag_trained", "task.prompt_mode=with_context")
    assert cfg.task.prompt_mode == "with_context"
    assert (cfg.template.id, cfg.model.model_type, cfg.prompt_format.name) == (
        "rqa_instruction",
        "rag_trained",
        "research_qa",
    )
    assert sorted(cfg.prompt_format.templates) == [
        "hybrid",
        "instruction",
        "rag_standard",
        "rag_stored",
        "rag_trained_no_context",
    ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["model.model_type=finetuned"],
            "model.model_type must be one of base, instruction_only, rag_trained; got 'finetuned'",
        ),
        (
            ["model=base", "task.prompt_mode=hybrid"],
            "task.prompt_mode 'hybrid' is not a condition of model_type 'base'",
        ),
        (
            ["stage=deploy"],
            "stage must be one of export, modelfiles, check, drift, all for task=research_qa; got 'deploy'",
        ),
        (["task.rag_source=cached"], "task.rag_source must be 'generated' or 'stored', got 'cached'"),
        (
            ["+task.estimator._target_=os.system"],
            "task.estimator must be null or a mapping whose _target_ names a callable inside storyforge",
        ),
        (
            ["prompt_format.system_messages.base=' '"],
            "prompt_format.system_messages.base must be a non-empty string",
        ),
    ],
)
def test_config_errors_name_the_key(tmp_path, overrides, message):
    """Bad settings fail before any file is written, naming the key."""
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run(compose_cfg(*overrides), tmp_path)
    assert not any(tmp_path.iterdir())


def test_model_type_is_trimmed_and_case_folded(tmp_path):
    """' RAG_Trained ' in the model config is rag_trained."""
    manifest = run(compose_cfg("model=rag_trained", "model.model_type=' RAG_Trained '"), tmp_path)
    assert manifest["condition"] == "rag_trained__rag_trained_no_context"


# -- export -----------------------------------------------------------------------------------


def test_export_hybrid_condition(tmp_path):
    """The hybrid condition: TRL messages, eval requests with hashes, fallback and rejects reported."""
    manifest = run(compose_cfg("task.prompt_mode=with_context", "task.progress=false"), tmp_path)
    records = fixture_records()
    assert manifest["condition"] == "instruction_only__hybrid"
    assert manifest["counts"] == {
        "records": 12,
        "exported": 11,
        "rejected": 1,
        "fallbacks": 1,
        "contexts_dropped": 0,
        "warnings": 1,
    }
    assert manifest["warnings"] == [
        {
            "task_id": "rqa-0005",
            "message": "record 'rqa-0005': no contexts for the hybrid prompt; rendered in "
            "instruction mode instead",
        }
    ]
    assert read_jsonl(tmp_path / "rejected.jsonl") == [
        {
            "line": 11,
            "task_id": "rqa-0011",
            "rule": "instruction",
            "message": "instruction cannot be empty (found '   ')",
        }
    ]
    train = {r["task_id"]: r for r in read_jsonl(tmp_path / "train.jsonl")}
    evals = {r["task_id"]: r for r in read_jsonl(tmp_path / "eval.jsonl")}
    assert list(train) == list(evals) == [t for t in records if t != "rqa-0011"]
    prenumbered = train["rqa-0003"]
    assert prenumbered["messages"] == [
        {"role": "system", "content": RESEARCH},
        {
            "role": "user",
            "content": "Question: Summarize the main contribution of the paper on low-rank key-value cache "
            "compression.\n\nContext:\n"
            + "\n".join(records["rqa-0003"]["rag"]["contexts"])
            + "\n\nAnswer using "
            "the provided context. Cite sources inline as [#] based on the order of the snippets. If the "
            "answer is not in the context, say you don't know.\n\nAnswer:",
        },
        {"role": "assistant", "content": records["rqa-0003"]["expected_response"].strip()},
    ]
    request = evals["rqa-0004"]
    assert request["contexts"] == [
        "[1] Zero-shot evaluation uses the CAFA-5 held-out set.",
        "[2] We keep only proteins whose first annotation appears after our training data cutoff.",
    ]
    assert request["contexts_dropped"] == []
    assert request["messages"] == train["rqa-0004"]["messages"][:2]
    import hashlib

    assert request["user_sha256"] == hashlib.sha256(request["messages"][1]["content"].encode()).hexdigest()
    assert (
        request["system_sha256"] == manifest["system_sha256"] == hashlib.sha256(RESEARCH.encode()).hexdigest()
    )
    assert evals["rqa-0005"]["prompt_mode"] == "instruction"
    assert evals["rqa-0005"]["messages"][1]["content"] == (
        "Question: What learning-rate schedule was used to pretrain the 1.3B model?\n\nAnswer:"
    )
    assert evals["rqa-0002"]["contexts"][0] == (
        "[1] Section: Results | Page 7\nTable 3 reports ECE on the OOD split: the baseline reaches 8.9% ECE, "
        "while training with the proposed loss reduces it to 3.1%."
    )


def test_export_loads_with_hf_datasets(tmp_path):
    """train.jsonl and eval.jsonl load as they are with datasets.load_dataset('json', ...)."""
    datasets = pytest.importorskip("datasets")
    run(compose_cfg("model=rag_trained", "task.prompt_mode=with_context", "task.progress=false"), tmp_path)
    for name in ("train.jsonl", "eval.jsonl"):
        ds = datasets.load_dataset(
            "json", data_files=str(tmp_path / name), split="train", cache_dir=str(tmp_path / "hf")
        )
        assert len(ds) == 11
        assert [m["role"] for m in ds[0]["messages"]] == (
            ["system", "user", "assistant"] if name == "train.jsonl" else ["system", "user"]
        )


def test_export_is_deterministic(tmp_path):
    """The same config gives the same bytes."""
    first, second = tmp_path / "a", tmp_path / "b"
    run(compose_cfg("model=base", "task.prompt_mode=with_context"), first)
    run(compose_cfg("model=base", "task.prompt_mode=with_context"), second)
    for name in ("train.jsonl", "eval.jsonl", "rejected.jsonl", "manifest.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_rag_stored_sends_the_dataset_prompt_and_warns_on_system_text(tmp_path):
    """rag_stored: the user turn is rag.prompt byte for byte; system text in it is a named warning."""
    # The shipped dataset is clean (the documented `storyforge check` passes on its exports), so
    # this test puts system text into one stored prompt itself.
    records = fixture_records()
    records["rqa-0010"]["rag"]["prompt"] = (
        "You are a scientific research assistant. " + records["rqa-0010"]["rag"]["prompt"]
    )
    dataset = tmp_path / "offline_dataset.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in records.values()), "utf-8")
    manifest = run(
        compose_cfg(
            "model=rag_trained",
            "task.prompt_mode=with_context",
            "task.rag_source=stored",
            f"dataset={dataset}",
        ),
        tmp_path / "out",
    )
    evals = {r["task_id"]: r for r in read_jsonl(tmp_path / "out" / "eval.jsonl")}
    for task_id, request in evals.items():
        if request["prompt_mode"] == "rag_stored":
            assert request["messages"][1]["content"] == records[task_id]["rag"]["prompt"]
    assert evals["rqa-0006"]["messages"][1]["content"].count("[1] [2] We compare") == 1
    assert {
        "task_id": "rqa-0010",
        "message": "record 'rqa-0010': rag.prompt contains system text 'you are a "
        "scientific research assistant'; it is sent unchanged (rag_stored), so the model sees the system "
        "message twice",
    } in manifest["warnings"]
    assert evals["rqa-0005"]["prompt_mode"] == "rag_trained_no_context"


def test_budget_drops_contexts_and_records_them(tmp_path):
    """With budget.max_tokens, whole contexts are dropped from the end and listed in the request."""
    manifest = run(
        compose_cfg("model=base", "task.prompt_mode=with_context", "budget.max_tokens=110"), tmp_path
    )
    records = fixture_records()
    evals = {r["task_id"]: r for r in read_jsonl(tmp_path / "eval.jsonl")}
    assert manifest["counts"]["contexts_dropped"] > 0
    assert manifest["budget"] == {"max_tokens": 110, "estimator": "default"}
    from storyforge.tasks.research_qa import normalize_contexts

    for task_id, request in evals.items():
        assert request["tokens"] <= 110
        if request["prompt_mode"] != "rag_standard":
            continue
        assert request["contexts"] + request["contexts_dropped"] == normalize_contexts(
            records[task_id]["rag"]["contexts"]
        )
        user = request["messages"][1]["content"]
        assert all(c in user for c in request["contexts"])
        assert not any(c in user for c in request["contexts_dropped"])
    assert any(r["contexts_dropped"] for r in evals.values())


BAD_LINES = [
    '{"task_id": "ok-1", "instruction": "Q1?", "expected_response": "A1", "rag": {"contexts": ["c"]}}',
    "{not json",
    "[1, 2]",
    '{"instruction": "Q?", "expected_response": "A"}',
    '{"task_id": "ok-1", "instruction": "Q1 again?", "expected_response": "A"}',
    '{"task_id": "no-answer", "instruction": "Q?", "expected_response": "  "}',
    '{"task_id": "bad-ctx", "instruction": "Q?", "expected_response": "A", "rag": {"contexts": [{"page": 2}]}}',
    '{"task_id": "bad-rag", "instruction": "Q?", "expected_response": "A", "rag": "prompt"}',
    "",
    '{"task_id": "ok-2", "instruction": "Q2?", "expected_response": " A2 ", "rag": {"contexts": ["d", null]}}',
    '{"task_id": "lone", "instruction": "Q\\ud800?", "expected_response": "A"}',
]


def test_bad_records_are_reported_by_id_and_the_rest_goes_on(tmp_path):
    """Each bad record is rejected with its id (or line) and rule; good records are exported."""
    dataset = tmp_path / "offline_dataset.jsonl"
    dataset.write_text("\n".join(BAD_LINES) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    manifest = run(compose_cfg(f"dataset={dataset}", "task.prompt_mode=with_context"), out)
    assert [(r["line"], r["task_id"], r["rule"]) for r in read_jsonl(out / "rejected.jsonl")] == [
        (2, None, "json"),
        (3, None, "json"),
        (4, None, "task_id"),
        (5, "ok-1", "duplicate"),
        (6, "no-answer", "expected_response"),
        (7, "bad-ctx", "prompt"),
        (8, "bad-rag", "rag"),
        (11, None, "json"),
    ]
    rejected = {r["line"]: r["message"] for r in read_jsonl(out / "rejected.jsonl")}
    assert (
        rejected[7] == "record 'bad-ctx': contexts[0] is a chunk mapping without a 'text' string (keys: page)"
    )
    assert rejected[2].startswith("not JSON: ")
    assert rejected[11] == "not JSON: unpaired surrogate \\ud800 in a string (not Unicode text) (column 38)"
    train = read_jsonl(out / "train.jsonl")
    assert [r["task_id"] for r in train] == ["ok-1", "ok-2"]
    assert train[1]["messages"][2] == {"role": "assistant", "content": "A2"}
    assert manifest["counts"]["records"] == 10 and manifest["counts"]["exported"] == 2


def test_a_dataset_line_that_is_not_utf8_is_rejected_and_a_leading_bom_is_ignored(tmp_path):
    """A byte that is not UTF-8 rejects its line only; a byte-order mark (Windows editors)
    does not cost the first record."""
    lines = packaged_dataset().read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"', b'"\xff', 1)
    dataset = tmp_path / "offline_dataset.jsonl"
    dataset.write_bytes(b"\xef\xbb\xbf" + b"".join(lines))
    out = tmp_path / "out"
    manifest = run(compose_cfg(f"dataset={dataset}"), out)
    rejected = read_jsonl(out / "rejected.jsonl")
    assert (rejected[0]["line"], rejected[0]["rule"]) == (3, "json")
    assert rejected[0]["message"] == "not UTF-8 text: byte 3 cannot be decoded"
    assert 1 not in [r["line"] for r in rejected]
    assert manifest["counts"]["records"] == len(lines)


def test_strict_stops_at_the_first_bad_record_and_writes_nothing(tmp_path):
    """strict=true raises on the first bad record and leaves no export files behind."""
    with pytest.raises(
        DataError,
        match=r"record 'rqa-0011' \(line 11\) rejected with strict=true: instruction cannot be empty",
    ):
        run(compose_cfg("strict=true"), tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_missing_dataset(tmp_path):
    """A dataset path that does not exist is a config error (as a missing seeds_path is) saying how to set it."""
    with pytest.raises(ConfigError, match="dataset: no such file .*set dataset=PATH"):
        run(compose_cfg(f"dataset={tmp_path / 'nope.jsonl'}"), tmp_path / "out")


def test_limit_exports_the_first_records(tmp_path):
    """task.limit=N reads only the first N records."""
    manifest = run(compose_cfg("task.limit=3"), tmp_path)
    assert manifest["counts"]["records"] == 3
    assert [r["task_id"] for r in read_jsonl(tmp_path / "eval.jsonl")] == ["rqa-0001", "rqa-0002", "rqa-0003"]


# -- Modelfiles and drift ---------------------------------------------------------------------


@pytest.mark.parametrize("model", ["base", "instruction_only", "rag_trained"])
def test_modelfile_stage(tmp_path, model):
    """stage=modelfiles writes Modelfile.<model_type> whose SYSTEM is the training message; twice = same bytes."""
    cfg = compose_cfg(f"model={model}", "stage=modelfiles", f"task.modelfiles_dir={tmp_path / 'ollama'}")
    run(cfg, tmp_path / "run1")
    path = tmp_path / "ollama" / f"Modelfile.{model}"
    first = path.read_bytes()
    run(cfg, tmp_path / "run2")
    assert path.read_bytes() == first
    parsed = read_modelfile(path)
    assert parsed.system == default_prompt_format().system_message(model)
    assert parsed.model == cfg.model.gguf_path
    assert parsed.parameters() == {
        "temperature": ["0.0"],
        "top_p": ["0.9"],
        "repeat_penalty": ["1.1"],
        "num_ctx": ["4096"],
        "stop": ["<|im_end|>", "<|im_start|>"],
    }
    assert parsed.header["model_type"] == model


CHANGED = "prompt_format.system_messages.instruction_only='You are a careful research paper assistant.'"


def test_drift_stale_modelfile_fails_until_regenerated(tmp_path):
    """Change the system message in config: the stale Modelfile fails the check; regenerating fixes it."""
    ollama = tmp_path / "ollama"
    run(compose_cfg("stage=modelfiles", f"task.modelfiles_dir={ollama}"), tmp_path / "gen")
    modelfile = ollama / "Modelfile.instruction_only"
    check_args = ["stage=check", f"task.check.modelfiles=[{modelfile}]"]
    run(compose_cfg(*check_args), tmp_path / "check1")  # consistent: passes
    with pytest.raises(DataError) as failure:
        run(compose_cfg(*check_args, CHANGED), tmp_path / "check2")
    text = str(failure.value)
    assert f"{modelfile}: [instruction_only] system message mismatch in {modelfile}" in text
    assert "  training:  'You are a careful research paper assistant.'" in text
    assert f"  Modelfile: '{RESEARCH}'" in text
    assert cli("--modelfile", str(modelfile), CHANGED) == 1
    run(compose_cfg("stage=modelfiles", f"task.modelfiles_dir={ollama}", CHANGED), tmp_path / "regen")
    run(compose_cfg(*check_args, CHANGED), tmp_path / "check3")
    assert cli("--modelfile", str(modelfile), CHANGED) == 0


def test_stage_all_checks_its_own_outputs(tmp_path):
    """stage=all exports, writes the Modelfile and checks both in the run directory."""
    result = run(compose_cfg("stage=all", "model=rag_trained", "task.prompt_mode=with_context"), tmp_path)
    assert (tmp_path / "Modelfile.rag_trained").is_file()
    assert result["check"] == {
        "checked": ["prompt_format research_qa", str(tmp_path / "Modelfile.rag_trained"), str(tmp_path)],
        "findings": 0,
    }


def test_cli_checks_exports_and_finds_edits(tmp_path, capsys):
    """storyforge check passes a fresh export and names the file, record and both strings after edits."""
    out = tmp_path / "export"
    run(compose_cfg("task.prompt_mode=with_context"), out)
    assert cli("--artifacts", str(tmp_path)) == 0
    assert "ok: no drift in 2 checked item(s)" in capsys.readouterr().out
    evals = read_jsonl(out / "eval.jsonl")
    evals[0]["messages"][1]["content"] = RESEARCH + " " + evals[0]["messages"][1]["content"]
    (out / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals), encoding="utf-8")
    train = read_jsonl(out / "train.jsonl")
    train[1]["messages"][0]["content"] = "You are a helpful assistant."
    (out / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train), encoding="utf-8")
    assert cli("--artifacts", str(out)) == 1
    err = capsys.readouterr().err
    assert (
        f"{out / 'train.jsonl'}, record 'rqa-0002' (line 2): system message mismatch (instruction_only)\n"
        f"  prompt format: '{RESEARCH}'\n  train.jsonl: 'You are a helpful assistant.'" in err
    )
    assert f"{out / 'eval.jsonl'}, record 'rqa-0001' (line 1): system text duplication" in err
    assert (
        f"{out / 'eval.jsonl'}, record 'rqa-0001' (line 1): user_sha256 does not match the user content"
        in err
    )
    assert (
        f"{out / 'eval.jsonl'}, record 'rqa-0001' (line 1): the user turn differs between train.jsonl and eval.jsonl"
        in err
    )
    assert err.rstrip().endswith("drift: 4 finding(s) in 2 checked item(s)")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        pytest.param("{not json", "not JSON: Expecting property name", id="not-json"),
        pytest.param(
            "[" * 100_000 + "]" * 100_000, "not JSON: arrays or objects nested too deeply", id="deep"
        ),
        pytest.param('"a string"', "expected a JSON object, got str", id="not-an-object"),
        pytest.param('{"task_id": "x", "messages": "hi"}', "messages must be a list of", id="messages-text"),
        pytest.param(
            '{"task_id": "x", "messages": [{"role": "user"}]}', "messages must be a list of", id="no-content"
        ),
    ],
)
def test_cli_reports_an_export_line_it_cannot_read_and_checks_the_rest(tmp_path, capsys, line, message):
    """A hand-edited export line that is not a readable record is a finding of its own, by line;
    the other records are still checked."""
    out = tmp_path / "export"
    run(compose_cfg("task.prompt_mode=with_context"), out)
    train = (out / "train.jsonl").read_text("utf-8").splitlines()
    train[0] = train[0].replace(RESEARCH, "You are a helpful assistant.")
    train.insert(1, line)
    (out / "train.jsonl").write_text("\n".join(train) + "\n", encoding="utf-8")
    assert cli("--artifacts", str(out)) == 1
    err = capsys.readouterr().err
    assert f"{out / 'train.jsonl'}, line 2: {message}" in err
    assert f"{out / 'train.jsonl'}, record 'rqa-0001' (line 1): system message mismatch" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "code", "stream", "text"),
    [
        (["--modelfile", "{hand}"], 1, "err", "cannot tell which model type this Modelfile serves"),
        (["--modelfile", "instruction_only={hand}"], 0, "out", "ok: no drift in 2 checked item(s)"),
        (["--modelfile", "rag_trained={hand}"], 1, "err", "[rag_trained] system message mismatch"),
        (["--artifacts", "{missing}"], 2, "err", "could not run: no such file or folder: --artifacts"),
        (["--modelfile", "{missing}"], 2, "err", "could not run: no such file or folder: --modelfile"),
        (["prompt_format=nope"], 2, "err", "storyforge check: cannot compose the config"),
    ],
)
def test_cli_modelfile_specs(tmp_path, capsys, argv, code, stream, text):
    """A hand-written Modelfile needs MODEL_TYPE=PATH; exit 0 / 1 / 2 = ok / drift / could not run."""
    hand = tmp_path / "Modelfile"
    hand.write_text(f'FROM ./m.gguf\nSYSTEM """{RESEARCH}"""\n', encoding="utf-8")
    args = [a.format(hand=hand, missing=tmp_path / "missing") for a in argv]
    assert cli(*args) == code
    captured = capsys.readouterr()
    assert text in (captured.err if stream == "err" else captured.out)


# -- the six conditions -----------------------------------------------------------------------


@pytest.mark.slow
def test_six_condition_multirun(tmp_path):
    """python run.py -m +experiment=six_conditions runs the six (model_type, prompt_mode) pairs."""
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [
            sys.executable,
            "run.py",
            "-m",
            "+experiment=six_conditions",
            f"hydra.sweep.dir={sweep}",
            "task.limit=4",
            "task.progress=false",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifests = [json.loads(p.read_text("utf-8")) for p in sorted(sweep.glob("*/manifest.json"))]
    assert [m["condition"] for m in manifests] == [
        "base__instruction",
        "base__rag_standard",
        "instruction_only__instruction",
        "instruction_only__hybrid",
        "rag_trained__rag_trained_no_context",
        "rag_trained__rag_standard",
    ]
    fmt = default_prompt_format()
    for job, manifest in zip(sorted(sweep.glob("*/manifest.json")), manifests, strict=True):
        model_type = manifest["model"]["model_type"]
        assert manifest["system_message"] == fmt.system_message(model_type)
        for record in read_jsonl(job.parent / "train.jsonl"):
            assert record["messages"][0]["content"] == fmt.system_message(model_type)
    assert cli("--artifacts", str(sweep)) == 0
    summary = json.loads((sweep / "sweep_summary.json").read_text("utf-8"))
    assert len(summary["jobs"]) == 6
    config = OmegaConf.load(sweep / "0" / ".hydra" / "config.yaml")
    assert config.task.kind == "research_qa"


def test_storyforge_command_runs_the_check(tmp_path, capsys):
    """`storyforge check` (the console command) reaches this check and returns its exit status."""
    from storyforge.cli import main

    hand = tmp_path / "Modelfile"
    hand.write_text('FROM m\nSYSTEM """You are someone else."""\n', encoding="utf-8")
    assert main(["check", "--modelfile", f"base={hand}"]) == 1
    assert "[base] system message mismatch" in capsys.readouterr().err


def test_huge_records_are_rejected_with_their_size_and_the_rest_goes_on(tmp_path):
    """A 5,000-digit number, a 6 MB question and 200,000 contexts: each its record's rejection."""
    good = {"task_id": "ok", "instruction": "Q?", "expected_response": "A."}
    lines = [
        '{"task_id": "n", "instruction": "Q", "expected_response": "A", "x": ' + "9" * 5000 + "}",
        json.dumps({**good, "task_id": "big-q", "instruction": "q" * 6_000_000}),
        json.dumps({**good, "task_id": "many", "rag": {"contexts": ["c"] * 200_000}}),
        json.dumps(good),
    ]
    dataset = tmp_path / "offline_dataset.jsonl"
    dataset.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    manifest = run(compose_cfg(f"dataset={dataset}", "task.prompt_mode=with_context"), out)
    rejected = read_jsonl(out / "rejected.jsonl")
    assert [(r["line"], r["task_id"], r["rule"]) for r in rejected] == [
        (1, None, "json"),
        (2, "big-q", "too_large"),
        (3, "many", "too_large"),
    ]
    assert "a number too long to read" in rejected[0]["message"]
    assert rejected[1]["message"] == "instruction has 6,000,000 characters; a record holds at most 1,000,000"
    assert rejected[2]["message"] == "rag.contexts lists 200,000 contexts; a record holds at most 10,000"
    assert [r["task_id"] for r in read_jsonl(out / "train.jsonl")] == ["ok"]
    assert manifest["counts"]["exported"] == 1
