"""Hostile inputs end as "could not run": exit 2, one line naming the bound, no traceback.

Each case of :data:`tests.support.drift_hostile.CASES` (a GGUF with a 400,000-character
token or a field of the wrong type, a chat template or Modelfile TEMPLATE that loops or
doubles a string, a llama-server stand-in streaming an endless or malformed ``/tokenize``
answer) runs through ``storyforge drift`` as a user runs it. ``bench/drift_hostile.py``
measures the same cases (seconds, peak memory: docs/drift.md).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from storyforge.cli import main as cli_main
from storyforge.drift.jinja import render_chat
from tests.support.drift_hostile import CASES, Case, StandIn, export_and_tokenizer, prepare


@pytest.fixture(scope="module")
def standin() -> Iterator[StandIn]:
    with StandIn() as server:
        yield server


def drift(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], str]:
    code = cli_main(["drift", *args])
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    return code, lines, captured.out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_input_is_refused_with_one_line(
    case: Case, tmp_path: Path, standin: StandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines, out = drift(prepare(case, tmp_path, standin.url), capsys)
    assert code == 2, (lines, out)
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert case.expect in lines[0]
    assert "Traceback" not in lines[0] and out == ""


def test_the_base_files_of_the_cases_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The cases differ from files the gate accepts by the hostile part only."""
    export, tokenizer = export_and_tokenizer(tmp_path)
    code, lines, out = drift(
        [str(export), "--tokenizer", str(tokenizer), "--gguf", str(tmp_path / "base.gguf")], capsys
    )
    assert code == 0, (lines, out)
    assert "drift: ok: 0 of 2 example(s) drift" in out


def test_a_missing_optional_package_is_could_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without jinja2 no example is "drift": the gate says what to install and exits 2."""
    export, tokenizer = export_and_tokenizer(tmp_path)
    monkeypatch.setitem(sys.modules, "jinja2", None)  # as if not installed: find_spec gives None
    code, lines, out = drift(
        [str(export), "--tokenizer", str(tokenizer), "--gguf", str(tmp_path / "base.gguf")], capsys
    )
    assert code == 2 and out == ""
    expected = (
        "error: the drift gate could not run: the Python package 'jinja2' is not installed "
        "(pip install 'storyforge[drift]')"
    )
    assert lines == [expected]


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        pytest.param("", "nothing to check: no examples in", id="empty"),
        pytest.param("\n\n", "nothing to check: no examples in", id="blank-lines"),
        pytest.param('{"messages": []}\n', "1 unreadable line(s)", id="only-unreadable"),
    ],
)
def test_an_export_with_no_examples_is_never_ok(
    content: str, expect: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, tokenizer = export_and_tokenizer(tmp_path)
    empty = tmp_path / "empty" / "sft.jsonl"
    empty.parent.mkdir()
    empty.write_text(content)
    code, lines, out = drift(
        [str(empty), "--tokenizer", str(tokenizer), "--gguf", str(tmp_path / "base.gguf")], capsys
    )
    assert code == 2 and out == ""
    assert len(lines) == 1 and expect in lines[0]


@pytest.mark.parametrize(
    ("template", "expect"),
    [
        pytest.param("{{ 'a' * 10**10 }}", "would build a value of 10000000000", id="multiply"),
        pytest.param("{{ '%99999999999s' % 'a' }}", "would build a value of 99999999999", id="percent-width"),
        pytest.param(
            "{{ '{:>99999999999}'.format('a') }}", "would build a value of 99999999999", id="format-width"
        ),
        pytest.param("{{ 'a'|center(10**10) }}", "would build a value of 10000000000", id="center"),
        pytest.param("{{ 'a'.ljust(10**10) }}", "would build a value of 10000000000", id="ljust"),
        pytest.param(
            "{% set s = 'a' * 1000 %}{{ s|replace('a', s)|replace('a', s) }}",
            "value of 1000000000",
            id="replace",
        ),
        pytest.param(
            "{% set s = 'a' * 1000 %}{{ s.replace('a', s).replace('a', s) }}",
            "value of 1000000000",
            id="str-replace",
        ),
        pytest.param(
            "{% set l = ['a' * 1000] * 1000 %}{{ l|join(l|join) }}", "value of 1001000000", id="join"
        ),
        pytest.param("{{ (10 ** 4000) ** 4000 }}", "would build a value of", id="power"),
        pytest.param(
            "{% set ns = namespace(x=3) %}{% for i in range(64) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
            "would build a value of",
            id="squaring",
        ),
        pytest.param(
            "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
            "the output exceeds 1048576",
            id="output",
        ),
        pytest.param(
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed too deeply", id="recursion"
        ),
    ],
)
def test_jinja_bounds(template: str, expect: str) -> None:
    """Each way a chat template can build a huge value is stopped before the value is built."""
    from storyforge.drift.jinja import TemplateLimitError

    with pytest.raises(TemplateLimitError, match="the render was stopped") as caught:
        render_chat(template, [{"role": "user", "content": "hi"}], generation_prompt=True)
    assert expect in str(caught.value)


@pytest.mark.parametrize(
    "template",
    [
        "{{ '%5s|%-3d' % ('a', 7) }}",
        "{{ ['a', 'b']|join(', ') }}",
        "{{ '{:>4}'.format('a') }}",
        "{% for m in messages %}{{ m['content']|tojson }}{% endfor %}",
        "{% generation %}{{ messages[0]['content'] }}{% endgeneration %}",
    ],
)
def test_bounded_jinja_renders_as_transformers(template: str) -> None:
    """Ordinary templates render exactly as transformers renders them."""
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [{"role": "user", "content": 'say "hi"'}]
    expected, _ = render_jinja_template(
        conversations=[messages], chat_template=template, add_generation_prompt=True, bos_token="<s>"
    )
    assert render_chat(template, messages, generation_prompt=True, bos_token="<s>") == expected[0]


def test_report_json_is_not_written_when_the_gate_cannot_run(
    tmp_path: Path, standin: StandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    case = next(c for c in CASES if c.name == "server-endless-body")
    report = tmp_path / "report.json"
    code, _, _ = drift([*prepare(case, tmp_path, standin.url), "--json", str(report)], capsys)
    assert code == 2 and not report.exists()
