"""Modelfiles: parsed the way Ollama parses them, written so SYSTEM round-trips exactly."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storyforge.tasks.research_qa.modelfile import (
    CHATML_TEMPLATE,
    ModelfileError,
    parse_modelfile,
    read_modelfile,
    render_modelfile,
)

param = pytest.param


@pytest.mark.parametrize(
    ("text", "system"),
    [
        param('FROM m\nSYSTEM """You are X."""\n', "You are X.", id="triple-quoted"),
        param('FROM m\nSYSTEM "You are X."\n', "You are X.", id="double-quoted"),
        param("FROM m\nSYSTEM You are X.\n", "You are X.", id="bare"),
        param("FROM m\nSYSTEM    You are X.   \n", "You are X.", id="bare-outer-blanks-trimmed"),
        param('FROM m\nSYSTEM """  You are X.  """\n', "  You are X.  ", id="inner-blanks-kept"),
        param('FROM m\nsystem """You are X."""\n', "You are X.", id="lowercase-command"),
        param('FROM m\nSyStEm """You are X."""\n', "You are X.", id="mixed-case-command"),
        param('FROM m\nSYSTEM """line one\nline two"""\n', "line one\nline two", id="multi-line"),
        param('FROM m\nSYSTEM """\nYou are X.\n"""\n', "\nYou are X.\n", id="multi-line-newlines-kept"),
        param('FROM m\nSYSTEM "first\nsecond"\n', "first\nsecond", id="double-quoted-multi-line"),
        param('FROM m\nSYSTEM """first"""\nSYSTEM """second"""\n', "second", id="last-system-wins"),
        param('FROM m\n# SYSTEM """commented"""\nSYSTEM """real"""\n', "real", id="comment-line"),
        param("FROM m\n   # indented comment\nSYSTEM real\n", "real", id="indented-comment"),
        param("FROM m\nSYSTEM keep # this\n", "keep # this", id="hash-inside-value"),
        param('FROM m\nSYSTEM """# not a comment"""\n', "# not a comment", id="hash-inside-quotes"),
        param('\ufeffFROM m\nSYSTEM """x"""\n', "x", id="bom"),
        param('FROM m\r\nSYSTEM """a\r\nb"""\r\n', "a\r\nb", id="crlf"),
        param('FROM m\nSYSTEM """tab\there"""\n', "tab\there", id="tab-kept"),
        param('FROM m\nSYSTEM """bell\x07dropped"""\n', "belldropped", id="control-dropped"),
        param('FROM m\nSYSTEM """say "hi""""\n', 'say "hi"', id="ends-with-quote"),
        param("FROM m\nPARAMETER stop <|im_end|>\n", None, id="no-system"),
        param('FROM m\nSYSTEM ""\n', "", id="empty-quoted"),
    ],
)
def test_system_as_ollama_reads_it(text, system):
    """The SYSTEM value is the one Ollama would serve."""
    assert parse_modelfile(text).system == system


@pytest.mark.parametrize(
    ("text", "message"),
    [
        param('FROM m\nSYSTEMATIC """x"""\n', "line 2: unknown command 'SYSTEMATIC'", id="systematic"),
        param("FROM m\nSYSTEM: x\n", "line 2: unknown command 'SYSTEM:'", id="colon"),
        param("FROM m\nSYSTEM\n", "line 2: SYSTEM has no value", id="no-value"),
        param(
            'FROM m\nSYSTEM """never closed\n',
            "line 2: unexpected end of file inside a quoted value that starts here",
            id="unclosed",
        ),
        param('SYSTEM """x"""\n', "no FROM line", id="no-from"),
        param(
            "FROM m\nMESSAGE robot hi\n",
            "message role must be one of system, user or assistant, got 'robot'",
            id="bad-role",
        ),
        param(
            "FROM m\nPARAMETER top-p 1\n", "line 2: unexpected '-' in a parameter name", id="bad-parameter"
        ),
    ],
)
def test_files_ollama_refuses(text, message):
    """A Modelfile Ollama would refuse is a ModelfileError naming the line."""
    with pytest.raises(ModelfileError, match=re.escape(message)):
        parse_modelfile(text)


def test_commands_parameters_and_messages():
    """Commands keep their order; PARAMETER names keep their case; MESSAGE gets 'role: text'."""
    parsed = parse_modelfile(
        'FROM ./m.gguf\nPARAMETER stop "<|im_end|>"\nPARAMETER stop <|im_start|>\nPARAMETER Temperature 0.2\n'
        'MESSAGE user hello there\nTEMPLATE """{{ .Prompt }}"""\n'
    )
    assert parsed.model == "./m.gguf"
    assert parsed.parameters() == {"stop": ["<|im_end|>", "<|im_start|>"], "Temperature": ["0.2"]}
    assert [(c.keyword, c.name, c.value, c.line) for c in parsed.commands][-2:] == [
        ("message", "message", "user: hello there", 5),
        ("template", "template", "{{ .Prompt }}", 6),
    ]


PARAMS = {
    "temperature": 0.0,
    "top_p": 0.9,
    "repeat_penalty": 1.1,
    "num_ctx": 4096,
    "stop": ["<|im_end|>", "<|im_start|>"],
}


def test_render_modelfile_exact_bytes():
    """The generated Modelfile, byte for byte."""
    text = render_modelfile(
        model_type="instruction_only",
        prompt_format="research_qa",
        system="You are a research paper assistant.",
        from_="./m.gguf",
        parameters=PARAMS,
    )
    assert text == (
        "# storyforge: model_type=instruction_only prompt_format=research_qa\n"
        "# Generated from the prompt format; edit conf/, then regenerate with\n"
        "#   python run.py task=research_qa stage=modelfiles model=instruction_only\n"
        "FROM ./m.gguf\n"
        f'TEMPLATE """{CHATML_TEMPLATE}"""\n'
        "PARAMETER temperature 0.0\n"
        "PARAMETER top_p 0.9\n"
        "PARAMETER repeat_penalty 1.1\n"
        "PARAMETER num_ctx 4096\n"
        'PARAMETER stop "<|im_end|>"\n'
        'PARAMETER stop "<|im_start|>"\n'
        'SYSTEM """You are a research paper assistant."""\n'
    )
    parsed = parse_modelfile(text)
    assert parsed.header == {"model_type": "instruction_only", "prompt_format": "research_qa"}
    assert parsed.parameters()["stop"] == ["<|im_end|>", "<|im_start|>"]
    assert [c.value for c in parsed.commands if c.name == "template"] == [CHATML_TEMPLATE]


@pytest.mark.parametrize(
    ("system", "message"),
    [
        param('Say """this"""', 'contains """', id="triple-quote"),
        param("zero\u200bwidth", "characters Ollama drops (U+200B)", id="format-char"),
        param("nbsp\u00a0here", "characters Ollama drops (U+00A0)", id="nbsp"),
    ],
)
def test_render_refuses_what_cannot_round_trip(system, message):
    """A system message a Modelfile cannot carry unchanged is refused, not silently altered."""
    with pytest.raises(ModelfileError, match=re.escape(message)):
        render_modelfile(model_type="base", prompt_format="f", system=system, from_="m", parameters={})


printable = st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"))
system_text = st.text(st.one_of(printable, st.sampled_from(' \t\n"')), min_size=1, max_size=60).filter(
    lambda s: '"""' not in s
)


@given(system_text)
def test_any_representable_system_message_round_trips(system):
    """Whatever render_modelfile accepts parses back to exactly the same SYSTEM."""
    text = render_modelfile(model_type="base", prompt_format="f", system=system, from_="m", parameters=PARAMS)
    assert parse_modelfile(text).system == system


def test_read_modelfile_errors(tmp_path):
    """A missing file or non-UTF-8 bytes are ModelfileErrors naming the file."""
    with pytest.raises(ModelfileError, match="Modelfile not found"):
        read_modelfile(tmp_path / "nope")
    bad = tmp_path / "Modelfile"
    bad.write_bytes(b"FROM m\nSYSTEM \xff\n")
    with pytest.raises(ModelfileError, match=re.escape(f"{bad}: not UTF-8 text")):
        read_modelfile(bad)


modelfile_text = st.lists(
    st.one_of(
        st.sampled_from(
            ['"', '"""', "#", "\n", "\r", " ", "\t", "FROM m\n", "SYSTEM ", "PARAMETER ", "MESSAGE "]
        ),
        st.characters(blacklist_categories=("Cs",)),
    ),
    max_size=40,
).map("".join)


@given(modelfile_text)
def test_any_text_parses_or_raises_modelfile_error(text):
    """Arbitrary text either parses (with a FROM) or raises ModelfileError, never anything else."""
    try:
        parsed = parse_modelfile(text)
    except ModelfileError:
        return
    assert any(c.name == "model" for c in parsed.commands)
