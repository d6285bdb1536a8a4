"""The drift gate without a server: the tiny GGUF's template and vocabulary, and Ollama Modelfiles.

Real parts: exports made by ``run.py``, tokenizer files ``transformers`` loads offline, the
GGUF read with the ``gguf`` package. Each planted difference is one a real deployment has
(a template variant, a BOS flag, an Ollama Modelfile) and must be caught and classified.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from storyforge.cli import main as cli_main
from storyforge.config.drift import DriftConf
from storyforge.drift.command import check_exports
from storyforge.drift.compare import SPECIAL
from storyforge.drift.examples import read_examples
from storyforge.drift.report import DriftReport, needed_num_ctx
from storyforge.drift.training import TrainingSide
from storyforge.errors import ConfigError, DataError
from storyforge.tasks.research_qa import system_message
from storyforge.tasks.research_qa.modelfile import CHATML_TEMPLATE, render_modelfile
from tests.support.tiny_gguf import CHATML_TEMPLATE as JINJA_CHATML
from tests.support.tiny_gguf import write_tiny_llama

NO_NEWLINE = JINJA_CHATML.replace("message['role'] + '\\n'", "message['role']")
DEFAULT_SYSTEM = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}" + JINJA_CHATML
)
NO_GENERATION_PROMPT = JINJA_CHATML.split("{% if add_generation_prompt %}")[0]
SKIPS_SYSTEM = JINJA_CHATML.replace(
    "{% for message in messages %}", "{% for message in messages %}{% if message['role'] != 'system' %}"
).replace("{% endfor %}", "{% endif %}{% endfor %}")
SYSTEM_TWICE = (
    "{% if messages[0]['role'] == 'system' %}{{ '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{% endif %}" + JINJA_CHATML
)
SYSTEM_INTO_USER = (
    "{% set ns = namespace(system='') %}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = message['content'] + '\\n\\n' %}"
    "{% elif message['role'] == 'user' %}{{ '<|im_start|>user\\n' + ns.system + message['content'] + '<|im_end|>\\n' }}"
    "{% set ns.system = '' %}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def tokenizer_with(tiny: Path, folder: Path, template: str) -> Path:
    """The tiny tokenizer files with another chat template."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(tiny / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((tiny / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def modelfile(
    folder: Path, gguf: Path, *, system: str, template: str = CHATML_TEMPLATE, num_ctx: int = 4096
) -> Path:
    text = render_modelfile(
        model_type="instruction_only",
        prompt_format="research_qa",
        system=system,
        from_=str(gguf),
        parameters={"temperature": 0.0, "num_ctx": num_ctx, "stop": ["<|im_end|>", "<|im_start|>"]},
        template=template,
    )
    path = folder / f"Modelfile.{abs(hash((system, template, num_ctx)))}"
    path.write_text(text)
    return path


def gate(exports: list[Path], tokenizer: Path, **options: object) -> DriftReport:
    return check_exports(DriftConf(exports=[str(e) for e in exports], tokenizer=str(tokenizer), **options))  # type: ignore[arg-type]


def kinds(report: DriftReport) -> dict[str, int]:
    return {kind: count for side in report.sides for kind, count in side.kinds.items()}


def test_no_drift_on_research_qa_and_tinystories_exports(
    tiny: Path, rqa_export: Path, ts_export: Path, tmp_path: Path
) -> None:
    """The tokenizer files of the served model, its GGUF and generated Modelfiles: every example identical."""
    rqa_modelfile = modelfile(tmp_path, tiny / "tiny.gguf", system=system_message("instruction_only"))
    report = gate(
        [rqa_export / "instruction_only"],
        tiny,
        gguf=str(tiny / "tiny.gguf"),
        modelfiles=[str(rqa_modelfile)],
    )
    n_rqa = len(read_examples([rqa_export / "instruction_only"]).examples)
    assert n_rqa == 22  # 11 training rows, 11 evaluation prompts
    assert report.ok and report.findings == () and report.examples == n_rqa
    assert [(s.examples, s.drifted) for s in report.sides] == [(n_rqa, 0), (n_rqa, 0)]

    rag = gate([rqa_export / "rag_trained"], tiny, gguf=str(tiny / "tiny.gguf"))
    assert rag.ok and rag.findings == () and rag.examples > 0

    plain = modelfile(tmp_path, tiny / "tiny.gguf", system="")  # TinyStories trains without a system message
    stories = gate([ts_export], tiny, gguf=str(tiny / "tiny.gguf"), modelfiles=[str(plain)])
    assert stories.ok and stories.findings == () and stories.examples == 12


@pytest.mark.parametrize(
    ("training_template", "gguf_options", "export", "kind", "detail"),
    [
        pytest.param(
            NO_NEWLINE, {}, "rqa", "whitespace", "around a role marker", id="missing-newline-after-role"
        ),
        pytest.param(
            JINJA_CHATML,
            {"add_bos": True},
            "rqa",
            "bos",
            "training starts with 0 BOS token(s), serving with 1",
            id="extra-bos",
        ),
        pytest.param(
            JINJA_CHATML,
            {"chat_template": DEFAULT_SYSTEM},
            "ts",
            "default_system",
            "serving template",
            id="default-system",
        ),
        pytest.param(
            JINJA_CHATML,
            {"chat_template": NO_GENERATION_PROMPT},
            "rqa",
            "generation_prompt",
            "no generation prompt",
            id="no-generation-prompt",
        ),
        pytest.param(
            JINJA_CHATML,
            {"chat_template": SKIPS_SYSTEM},
            "rqa",
            "system_dropped",
            "missing",
            id="system-dropped",
        ),
        pytest.param(
            JINJA_CHATML,
            {"chat_template": SYSTEM_TWICE},
            "rqa",
            "system_duplicated",
            "2 times",
            id="system-duplicated",
        ),
        pytest.param(
            JINJA_CHATML,
            {"chat_template": SYSTEM_INTO_USER},
            "rqa",
            "system_merged",
            "first user turn",
            id="system-merged",
        ),
    ],
)
def test_planted_template_drift_is_caught_and_classified(
    tiny: Path,
    rqa_export: Path,
    ts_export: Path,
    tmp_path: Path,
    training_template: str,
    gguf_options: dict[str, object],
    export: str,
    kind: str,
    detail: str,
) -> None:
    """A planted template or BOS difference drifts every example, under its own kind."""
    tokenizer = tokenizer_with(tiny, tmp_path / "tok", training_template)
    gguf = write_tiny_llama(tmp_path / "variant.gguf", **gguf_options)  # type: ignore[arg-type]
    path = rqa_export / "instruction_only" if export == "rqa" else ts_export
    n = len(read_examples([path]).examples)
    report = gate([path], tokenizer, gguf=str(gguf))
    assert not report.ok
    special = {"add_bos": "BOS added: training no, serving yes"}.get(next(iter(gguf_options), ""))
    assert kinds(report) == {kind: n, **({SPECIAL: 1} if special else {})}
    assert [f.detail for f in report.special] == ([special] if special else [])
    assert all(detail in f.detail for f in report.findings if f.kind != SPECIAL)
    first = next(f for f in report.findings if f.kind != SPECIAL)
    assert first.index is not None and "|" in first.training_text and "|" in first.serving_text
    assert first.training_ids != first.serving_ids


def test_eos_the_server_stops_on_differs(tiny: Path, rqa_export: Path, tmp_path: Path) -> None:
    """A GGUF whose EOS is </s> never stops where training ended the answer (<|im_end|>): training rows drift as eos."""
    gguf = write_tiny_llama(tmp_path / "eos.gguf", eos_token_id=2)
    examples = read_examples([rqa_export / "instruction_only"]).examples
    report = gate([rqa_export / "instruction_only"], tiny, gguf=str(gguf))
    assert kinds(report) == {"eos": sum(e.training for e in examples), SPECIAL: 1}
    (special,) = report.special
    assert special.detail == "EOS: training 4 '<|im_end|>', serving 2 '</s>'"
    first = next(f for f in report.findings if f.kind == "eos")
    assert "'<|im_end|>'" in first.detail and "'</s>'" in first.detail


def test_modelfile_with_another_system_is_caught(tiny: Path, rqa_export: Path, tmp_path: Path) -> None:
    """Ollama serves the Modelfile's SYSTEM: another message than training drifts every example."""
    other = modelfile(tmp_path, tiny / "tiny.gguf", system="You are a pirate.")
    path = rqa_export / "instruction_only"
    report = gate([path], tiny, modelfiles=[str(other)])
    assert kinds(report) == {"system_changed": len(read_examples([path]).examples)}
    # the client that sends its own system message is not affected: Ollama uses the client's
    sent = gate([path], tiny, modelfiles=[str(other)], client_system=True)
    assert sent.ok and sent.findings == ()


def test_consecutive_user_turns_merged_by_ollama(tiny: Path, tmp_path: Path) -> None:
    """Two user turns in a row: training renders two turns, Ollama merges them with a blank line."""
    rows = [
        {
            "id": "a",
            "messages": [
                {"role": "user", "content": "once upon a time"},
                {"role": "user", "content": "the cat ran"},
                {"role": "assistant", "content": "the end"},
            ],
        },
        {
            "id": "b",
            "messages": [
                {"role": "user", "content": "a dog"},
                {"role": "assistant", "content": "the dog ran"},
            ],
        },
    ]
    export = tmp_path / "sft.jsonl"
    export.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plain = modelfile(tmp_path, tiny / "tiny.gguf", system="")
    report = gate([export], tiny, modelfiles=[str(plain)])
    assert [(f.example, f.kind) for f in report.findings] == [("a", "turns_merged")]


def test_examples_longer_than_num_ctx_are_reported(tiny: Path, rqa_export: Path, tmp_path: Path) -> None:
    """With PARAMETER num_ctx 256, exactly the examples whose serving prompt is longer are reported."""
    small = modelfile(tmp_path, tiny / "tiny.gguf", system=system_message("instruction_only"), num_ctx=256)
    path = rqa_export / "instruction_only"
    data = read_examples([path])
    training = TrainingSide(tiny)
    lengths = {
        e.id + str(e.training): len(r.ids)
        for e, r in zip(data.examples, training.render(data.examples), strict=True)
    }
    report = gate([path], tiny, modelfiles=[str(small)])
    flagged = sorted(f.where for f in report.findings)
    assert all(f.kind == "context" for f in report.findings)
    expected = sorted(e.where for e in data.examples if lengths[e.id + str(e.training)] > 256)
    assert flagged == expected and 0 < len(expected) < len(data.examples)
    assert "context 256: the front would be cut" in report.findings[0].detail


def test_modelfile_template_differing_from_training_is_refused(
    tiny: Path, rqa_export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Modelfile TEMPLATE without the newline after the role: exit 1, the divergence printed."""
    bad = modelfile(
        tmp_path,
        tiny / "tiny.gguf",
        system=system_message("instruction_only"),
        template=CHATML_TEMPLATE.replace("user\n", "user"),
    )
    status = cli_main(
        ["drift", str(rqa_export / "instruction_only"), "--tokenizer", str(tiny), "--modelfile", str(bad)]
    )
    out = capsys.readouterr().out
    assert status == 1
    assert "whitespace: whitespace differs around a role marker" in out
    assert "training ids [" in out and "serving  ids [" in out
    assert f"drift: ollama {bad}: whitespace: 22 example(s)" in out
    assert (
        out.strip().splitlines()[-1]
        == "drift: FAILED: 22 of 22 example(s) drift (allowed 0) on 1 serving side(s)"
    )


def test_exit_status_allow_and_json_report(
    tiny: Path, rqa_export: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """0 without drift, 1 with drift, 0 again when --allow covers it; 2 when the gate cannot run; --json writes the report."""
    path = str(rqa_export / "instruction_only")
    gguf = str(tiny / "tiny.gguf")
    assert cli_main(["drift", path, "--tokenizer", str(tiny), "--gguf", gguf]) == 0
    tokenizer = tokenizer_with(tiny, tmp_path / "tok", NO_NEWLINE)
    report_path = tmp_path / "drift.json"
    assert (
        cli_main(["drift", path, "--tokenizer", str(tokenizer), "--gguf", gguf, "--json", str(report_path)])
        == 1
    )
    saved = json.loads(report_path.read_text())
    assert (
        saved["ok"] is False and saved["drifted"] == 22 and saved["sides"][0]["kinds"] == {"whitespace": 22}
    )
    assert cli_main(["drift", path, "--tokenizer", str(tokenizer), "--gguf", gguf, "--allow", "21"]) == 1
    assert cli_main(["drift", path, "--tokenizer", str(tokenizer), "--gguf", gguf, "--allow", "22"]) == 0
    capsys.readouterr()
    assert cli_main(["drift", path, "--tokenizer", str(tmp_path / "nothing"), "--gguf", gguf]) == 2
    assert "no tokenizer.json or tokenizer_config.json here" in capsys.readouterr().err
    assert cli_main(["drift", path, "--tokenizer", str(tiny)]) == 2
    assert "name at least one serving side" in capsys.readouterr().err


def test_unreadable_lines_are_named_and_the_rest_checked(
    tiny: Path, rqa_export: Path, tmp_path: Path
) -> None:
    """A broken line is listed by file and line; every other example is still checked."""
    lines = (rqa_export / "instruction_only" / "train.jsonl").read_text().splitlines()
    export = tmp_path / "train.jsonl"
    export.write_text("\n".join([lines[0], "{not json", '{"messages": []}', *lines[1:]]) + "\n")
    report = gate([export], tiny, gguf=str(tiny / "tiny.gguf"))
    assert report.ok and report.examples == len(lines)
    assert [u.split(":")[0] for u in report.unreadable] == [f"{export}, line 2", f"{export}, line 3"]


@pytest.mark.parametrize(
    ("tokens", "expected"), [(1, 256), (256, 256), (257, 512), (4096, 4096), (4097, 8192)]
)
def test_needed_num_ctx_is_the_next_power_of_two(tokens: int, expected: int) -> None:
    """num_ctx is rounded up to a power of two (at least 256)."""
    assert needed_num_ctx(tokens) == expected


def vllm_tokenize(tokenizer_dir: Path, *, max_model_len: int = 4096):
    """vLLM's /tokenize and /detokenize semantics (chat messages rendered by transformers with
    add_generation_prompt / continue_final_message, add_special_tokens as sent), for the loopback server."""
    tokenizer = TrainingSide(tokenizer_dir).tokenizer

    def handle(path: str, body: dict[str, object]) -> tuple[int, object]:
        if path == "/detokenize":
            return 200, {"prompt": tokenizer.decode(body["tokens"], skip_special_tokens=False)}
        if body.get("model") != "tiny":
            return 404, {"error": {"message": "The model does not exist."}}
        text = tokenizer.apply_chat_template(
            body["messages"],
            tokenize=False,
            add_generation_prompt=bool(body.get("add_generation_prompt", True)),
            continue_final_message=bool(body.get("continue_final_message", False)),
        )
        ids = tokenizer(text, add_special_tokens=bool(body.get("add_special_tokens", False)))["input_ids"]
        return 200, {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": None}

    return handle


def test_openai_compatible_tokenize_side(tiny: Path, rqa_export: Path, tmp_path: Path) -> None:
    """An OpenAI-compatible /tokenize (vLLM's API over real loopback HTTP): zero drift with the same
    template; a server whose template lacks the newline after the role drifts every example."""
    from tests.support.fake_server import FakeServer

    path = rqa_export / "instruction_only"
    n = len(read_examples([path]).examples)
    with FakeServer(tokenize=vllm_tokenize(tiny)) as same:
        report = gate([path], tiny, openai=same.base_url, openai_model="tiny")
    assert report.ok and report.findings == () and report.sides[0].n_ctx == 4096
    other = tokenizer_with(tiny, tmp_path / "served", NO_NEWLINE)
    with FakeServer(tokenize=vllm_tokenize(other, max_model_len=256)) as served:
        drifted = gate([path], tiny, openai=served.base_url, openai_model="tiny")
    assert kinds(drifted) == {
        "whitespace": n,
        "context": sum(1 for f in drifted.findings if f.kind == "context"),
    }
    assert drifted.drifted == n and drifted.sides[0].n_ctx == 256


def test_modelfile_without_template_uses_the_template_ollama_picks(
    tiny: Path, rqa_export: Path, tmp_path: Path
) -> None:
    """No TEMPLATE: Ollama's chatml template for a ChatML GGUF (no drift); another GGUF template is refused by name."""
    path = rqa_export / "instruction_only"
    system = system_message("instruction_only")
    bare = tmp_path / "Modelfile"
    bare.write_text(f'FROM {tiny / "tiny.gguf"}\nPARAMETER stop "<|im_end|>"\nSYSTEM """{system}"""\n')
    report = gate([path], tiny, modelfiles=[str(bare)])
    assert report.ok and report.findings == ()
    llama2 = write_tiny_llama(
        tmp_path / "inst.gguf",
        chat_template="{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}",
    )
    other = tmp_path / "Modelfile.inst"
    other.write_text(f"FROM {llama2}\n")
    with pytest.raises(
        DataError,
        match=re.escape(
            "no TEMPLATE, and the GGUF's chat template is not one Ollama is known to map here (ChatML)"
        ),
    ):
        gate([path], tiny, modelfiles=[str(other)])
    missing = tmp_path / "Modelfile.missing"
    missing.write_text("FROM ./nowhere.gguf\n")
    with pytest.raises(
        DataError, match=re.escape("FROM ./nowhere.gguf is not a GGUF file here; pass its GGUF with --gguf")
    ):
        gate([path], tiny, modelfiles=[str(missing)])


def test_a_conversation_the_training_template_refuses_is_a_finding(tiny: Path, tmp_path: Path) -> None:
    """A template that raises for one conversation: that example is a template_error, the rest are checked."""
    strict = (
        "{% for message in messages %}{% if message['role'] == 'user' and loop.index0 > 0 "
        "and messages[loop.index0 - 1]['role'] == 'user' %}{{ raise_exception('roles must alternate') }}{% endif %}"
        "{% endfor %}" + JINJA_CHATML
    )
    tokenizer = tokenizer_with(tiny, tmp_path / "tok", strict)
    gguf = write_tiny_llama(tmp_path / "strict.gguf", chat_template=strict)
    rows = [
        {
            "id": "twice",
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "user", "content": "b"},
                {"role": "assistant", "content": "c"},
            ],
        },
        {
            "id": "fine",
            "messages": [
                {"role": "user", "content": "a dog"},
                {"role": "assistant", "content": "the dog ran"},
            ],
        },
    ]
    export = tmp_path / "sft.jsonl"
    export.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = gate([export], tokenizer, gguf=str(gguf))
    assert [(f.example, f.kind) for f in report.findings] == [("twice", "template_error")]
    assert "roles must alternate" in report.findings[0].detail


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"allow": -1}, "drift.allow must be >= 0, got -1"),
        ({"server_prompts": "txt"}, "drift.server_prompts must be chat or text, got 'txt'"),
    ],
    ids=["allow", "server-prompts"],
)
def test_settings_built_in_code_meet_the_groups_rules(
    tiny: Path, rqa_export: Path, options: dict[str, object], message: str
) -> None:
    """check_exports holds settings built in code to the drift group's rules, as a run's config is."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        gate([rqa_export / "instruction_only"], tiny, gguf=str(tiny / "tiny.gguf"), **options)
