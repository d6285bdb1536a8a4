"""Go text/template, the subset Ollama's TEMPLATE uses: parse, execute, fields, cut after .Response."""

from __future__ import annotations

import re
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storyforge.drift.gotemplate import GoTemplateError, parse
from storyforge.drift.ollama import OLLAMA_CHATML
from storyforge.tasks.research_qa.modelfile import CHATML_TEMPLATE

MESSAGES = [{"Role": "system", "Content": "s"}, {"Role": "user", "Content": "u"}]
DATA: dict[str, Any] = {"System": "S", "Prompt": "P", "Response": "", "Messages": MESSAGES, "Count": 2}


def raises(message: str) -> AbstractContextManager[Any]:
    return pytest.raises(GoTemplateError, match=re.escape(message))


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        pytest.param("plain text", "plain text", id="text"),
        pytest.param("{{ .System }}|{{ .Prompt }}", "S|P", id="fields"),
        pytest.param("a  {{- .System -}}  b", "aSb", id="trim-both"),
        pytest.param("a\n{{- .System }}\nb", "aS\nb", id="trim-left"),
        pytest.param("{{/* a comment */}}x", "x", id="comment"),
        pytest.param("{{ if .Response }}R{{ else }}no{{ end }}", "no", id="if-else-empty-string"),
        pytest.param("{{ if .Missing }}R{{ else if .System }}S!{{ else }}no{{ end }}", "S!", id="else-if"),
        pytest.param(
            "{{ range .Messages }}[{{ .Role }}:{{ .Content }}]{{ end }}", "[system:s][user:u]", id="range"
        ),
        pytest.param(
            "{{ range $i, $m := .Messages }}{{ $i }}{{ $m.Role }}{{ $.System }}{{ end }}",
            "0systemS1userS",
            id="range-vars-root",
        ),
        pytest.param("{{ range .Nothing }}x{{ else }}empty{{ end }}", "empty", id="range-else"),
        pytest.param(
            "{{ range $i, $_ := .Messages }}{{ $last := eq (len (slice $.Messages $i)) 1 }}{{ if $last }}last{{ end }}{{ end }}",
            "last",
            id="last-message-idiom",
        ),
        pytest.param('{{ if and .System (eq .Prompt "P") }}yes{{ end }}', "yes", id="and-eq"),
        pytest.param('{{ if or .Response (ne .Prompt "P") }}yes{{ else }}no{{ end }}', "no", id="or-ne"),
        pytest.param("{{ if not .Response }}none{{ end }}", "none", id="not"),
        pytest.param("{{ eq .Count 1 2 }}", "true", id="eq-any-of"),
        pytest.param("{{ with .System }}<{{ . }}>{{ end }}", "<S>", id="with"),
        pytest.param("{{ $x := .System }}{{ $x = .Prompt }}{{ $x }}", "P", id="assign"),
        pytest.param('{{ print "a" 1 true }}', "a1true", id="print"),
        pytest.param("{{ .System | print }}", "S", id="pipe"),
        pytest.param("{{ index .Messages 1 }}", "{'Role': 'user', 'Content': 'u'}", id="index"),
        pytest.param("{{ .Missing }}", "<no value>", id="missing-field"),
        pytest.param('{{ "a\\tb" }}{{ `raw\\n` }}', "a\tbraw\\n", id="string-literals"),
    ],
)
def test_execute(template: str, expected: str) -> None:
    """Each construct renders as Go's text/template renders it."""
    assert parse(template).execute(DATA) == expected


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        pytest.param("{{ if .System }}x", raises("a block is not closed with {{ end }}"), id="unclosed"),
        pytest.param(
            "x{{ end }}", raises("TEMPLATE line 1: {{ end }} without an open block"), id="stray-end"
        ),
        pytest.param(
            "a\n{{ json .System }}",
            raises("TEMPLATE line 2: function 'json' is not known"),
            id="unknown-function",
        ),
        pytest.param(
            "{{ $nope }}", raises("TEMPLATE line 1: undefined variable $nope"), id="undefined-variable"
        ),
        pytest.param("{{ .System .Prompt }}", raises("only a function can take arguments"), id="arguments"),
        pytest.param("{{ ~ }}", raises("unexpected '~' in an action"), id="bad-character"),
        pytest.param("{{ if .System }}ok{{ end }}", nullcontext(), id="fine"),
    ],
)
def test_errors_name_the_line(template: str, expected: AbstractContextManager[Any]) -> None:
    """Templates outside the subset are refused with the line named, at parse or execution time."""
    with expected:
        parse(template).execute(DATA)


def test_fields_and_cut_after_response() -> None:
    """fields() is Ollama's Vars(); cut_after keeps the tree up to the first .Response."""
    legacy = parse(CHATML_TEMPLATE)
    assert legacy.fields() == {"System", "Prompt", "Response"}
    assert parse(OLLAMA_CHATML).fields() == {"Messages", "Role", "Content"}
    cut = legacy.cut_after("Response")
    assert (
        cut.execute({"System": "", "Prompt": "P", "Response": "R"})
        == "<|im_start|>user\nP<|im_end|>\n<|im_start|>assistant\nR"
    )
    nested = parse("{{ if .Prompt }}a{{ .Response }}b{{ end }}c")
    assert nested.cut_after("Response").execute({"Prompt": "p", "Response": "R"}) == "aR"


PIECES = [
    "{{",
    "}}",
    "{{-",
    "-}}",
    " ",
    ".",
    "$",
    "x",
    "if",
    "else",
    "end",
    "range",
    "eq",
    "(",
    ")",
    '"',
    "|",
    ":=",
    "1",
    "\n",
]


@given(st.lists(st.sampled_from(PIECES), max_size=40).map("".join) | st.text(max_size=40))
def test_any_text_parses_or_is_refused_cleanly(text: str) -> None:
    """Any string parses and executes, or raises GoTemplateError; never another exception."""
    try:
        parse(text).execute(DATA)
    except GoTemplateError:
        pass


def test_nesting_is_bounded() -> None:
    """Blocks nested past the limit are refused instead of exhausting the stack."""
    with raises("blocks nested deeper than 100"):
        parse("{{ if .System }}" * 500 + "{{ end }}" * 500)
