"""Ollama Modelfiles: parse them the way Ollama does, and write them from the prompt format.

Takes: Modelfile text (or a path), or a model's settings plus the system message of its
model type. Gives: :func:`parse_modelfile` -> :class:`Modelfile` (its commands in order, with
``.system`` = the SYSTEM value Ollama would use) and :func:`render_modelfile`, which writes a
Modelfile whose SYSTEM is the training system message byte for byte; the same inputs always
give the same bytes.

Why: the system message an Ollama model serves comes from its Modelfile, which is easy to
edit by hand and so drifts from the message the model was trained with. Parsing follows
Ollama's own state machine (``parser/parser.go``), so the value checked is the value served:

- command names are case-insensitive and must be one of Ollama's commands (``SYSTEMATIC`` is
  an error, not a SYSTEM); PARAMETER names keep their case;
- a value runs to the end of the line unless it opens a ``"`` or ``\"\"\"`` quote that is not
  closed yet, in which case it runs on over newlines; the outer whitespace of a value is
  trimmed, then one level of quotes is removed; nothing inside quotes is trimmed;
- ``#`` starts a comment only where a command could start (line start, after blanks);
- characters Go's ``strconv.IsPrint`` rejects are dropped, except tabs and line breaks;
- when SYSTEM appears more than once, the last one wins; a file without FROM is an error.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storyforge.errors import DataError

__all__ = [
    "CHATML_TEMPLATE",
    "Modelfile",
    "ModelfileCommand",
    "ModelfileError",
    "modelfile_header",
    "parse_modelfile",
    "read_modelfile",
    "render_modelfile",
]

COMMANDS = (
    "from",
    "license",
    "template",
    "system",
    "adapter",
    "draft",
    "renderer",
    "parser",
    "parameter",
    "message",
    "requires",
)
"""Ollama's Modelfile commands (matched case-insensitively), in the order its errors list them."""
MESSAGE_ROLES = frozenset({"system", "user", "assistant"})

CHATML_TEMPLATE = (
    "{{ if .System }}<|im_start|>system\n"
    "{{ .System }}<|im_end|>\n"
    "{{ end }}{{ if .Prompt }}<|im_start|>user\n"
    "{{ .Prompt }}<|im_end|>\n"
    "{{ end }}<|im_start|>assistant\n"
    "{{ .Response }}<|im_end|>"
)
"""Ollama's ChatML template (Qwen 2.5 style), the chat format TRL's SFT exports train with."""

HEADER_KEY = "storyforge:"


class ModelfileError(DataError):
    """A Modelfile Ollama would refuse; names the file and the line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelfileCommand:
    """One command: ``keyword`` (``from``, ``parameter``, ``system``, … in lower case), ``name``
    as Ollama stores it (``model`` for FROM, a PARAMETER's own name for parameters, the
    keyword otherwise), its unquoted ``value`` and the line it starts on."""

    keyword: str
    name: str
    value: str
    line: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Modelfile:
    """A parsed Modelfile: its commands in order and the ``# storyforge:`` header, if any."""

    commands: tuple[ModelfileCommand, ...]
    header: Mapping[str, str]
    source: str = "<text>"

    @property
    def system(self) -> str | None:
        """The SYSTEM value Ollama serves (the last SYSTEM wins), or ``None`` when absent."""
        values = [c.value for c in self.commands if c.name == "system"]
        return values[-1] if values else None

    @property
    def system_count(self) -> int:
        return sum(1 for c in self.commands if c.name == "system")

    @property
    def model(self) -> str:
        return next(c.value for c in self.commands if c.name == "model")

    def parameters(self) -> dict[str, list[str]]:
        """PARAMETER values by name, in file order (``stop`` may repeat)."""
        out: dict[str, list[str]] = {}
        for c in self.commands:
            if c.keyword == "parameter":
                out.setdefault(c.name, []).append(c.value)
        return out


# -- parsing ------------------------------------------------------------------------------------

_NIL, _NAME, _VALUE, _PARAMETER, _MESSAGE, _COMMENT = range(6)


def _is_space(ch: str) -> bool:
    return ch in " \t"


def _is_newline(ch: str) -> bool:
    return ch in "\r\n"


def _is_alpha(ch: str) -> bool:
    return ("a" <= ch <= "z") or ("A" <= ch <= "Z")


def _is_print(ch: str) -> bool:
    """Go's ``strconv.IsPrint``: letters, marks, numbers, punctuation, symbols, ASCII space."""
    return ch == " " or unicodedata.category(ch)[0] in "LMNPS"


def _unquote(text: str) -> tuple[str, bool]:
    if text.startswith('"""'):
        if len(text) >= 6 and text.endswith('"""'):
            return text[3:-3], True
        return "", False
    if text.startswith('"'):
        if len(text) >= 2 and text.endswith('"'):
            return text[1:-1], True
        return "", False
    return text, True


def parse_modelfile(text: str, *, source: str = "<text>") -> Modelfile:
    """Parse Modelfile text as Ollama does; :class:`ModelfileError` names the line on failure."""
    text = text.removeprefix("\ufeff")
    commands: list[ModelfileCommand] = []
    state = _NIL
    buf: list[str] = []
    keyword = name = role = ""
    line = cmd_line = 1

    here = 1

    def fail(message: str) -> ModelfileError:
        return ModelfileError(f"{source}, line {here}: {message}")

    for ch in text:
        here = line
        if ch == "\n":
            line += 1
        # -- the next state for this character (parseRuneForState) --
        keep: str | None = ch
        if state == _NIL:
            if ch == "#":
                nxt, keep = _COMMENT, None
            elif _is_space(ch) or _is_newline(ch):
                nxt, keep = _NIL, None
            else:
                nxt = _NAME
        elif state == _NAME:
            if _is_alpha(ch):
                nxt = _NAME
            elif _is_space(ch):
                nxt, keep = _VALUE, None
            elif _is_newline(ch) and "".join(buf).lower() in COMMANDS:
                raise fail(f"{''.join(buf)} has no value (the value goes on the same line)")
            else:
                raise fail(_invalid_command("".join(buf) + ch.strip()))
        elif state == _VALUE:
            nxt = _NIL if _is_newline(ch) or _is_space(ch) else _VALUE
        elif state in (_PARAMETER, _MESSAGE):
            if _is_alpha(ch) or (state == _PARAMETER and (ch.isdigit() and ch.isascii() or ch == "_")):
                nxt = state
            elif _is_space(ch):
                nxt, keep = _VALUE, None
            else:
                what = "parameter name" if state == _PARAMETER else "message role"
                raise fail(f"unexpected {ch!r} in a {what}")
        else:  # comment
            nxt, keep = (_NIL, None) if _is_newline(ch) else (_COMMENT, None)

        # -- the transition (ParseFile) --
        if nxt != state:
            word = "".join(buf)
            if state == _NIL:
                cmd_line = here
            elif state == _NAME:
                keyword = word.lower()
                if keyword not in COMMANDS:
                    raise fail(_invalid_command(word))
                name = "model" if keyword == "from" else keyword
                if keyword == "parameter":
                    nxt = _PARAMETER
                elif keyword == "message":
                    nxt = _MESSAGE
            elif state == _PARAMETER:
                name = word
            elif state == _MESSAGE:
                if word not in MESSAGE_ROLES:
                    raise fail(f"message role must be one of system, user or assistant, got {word!r}")
                role = word
            elif state == _VALUE:
                value, ok = _unquote(word.strip())
                if not ok or _is_space(ch):
                    buf.append(ch)  # still inside the value (open quote, or a blank)
                    continue
                if role:
                    value, role = f"{role}: {value}", ""
                commands.append(ModelfileCommand(keyword=keyword, name=name, value=value, line=cmd_line))
            buf = []
            state = nxt
        if keep is not None and _is_print(keep):
            buf.append(keep)

    if state == _VALUE:
        value, ok = _unquote("".join(buf).strip())
        if not ok:
            here = cmd_line
            raise fail(
                "unexpected end of file inside a quoted value that starts here (a closing quote is missing)"
            )
        if role:
            value = f"{role}: {value}"
        commands.append(ModelfileCommand(keyword=keyword, name=name, value=value, line=cmd_line))
    elif state not in (_NIL, _COMMENT):
        raise fail("unexpected end of file after a command name (its value is missing)")
    if not any(c.name == "model" for c in commands):
        raise ModelfileError(f"{source}: no FROM line (Ollama needs one to create a model)")
    return Modelfile(commands=tuple(commands), header=_read_header(text), source=source)


def read_modelfile(path: str | Path) -> Modelfile:
    """Parse the Modelfile at ``path`` (UTF-8, a leading BOM ignored)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelfileError(f"Modelfile not found: {file}") from None
    except UnicodeDecodeError as exc:
        raise ModelfileError(f"{file}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_modelfile(text, source=str(file))


def _invalid_command(word: str) -> str:
    return f"unknown command {word!r}; a command must be one of {', '.join(map(str.upper, COMMANDS))}"


def _read_header(text: str) -> dict[str, str]:
    """``# storyforge: model_type=rag_trained prompt_format=research_qa`` -> a mapping."""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") and stripped[1:].strip().startswith(HEADER_KEY):
            fields = stripped[1:].strip()[len(HEADER_KEY) :].split()
            return dict(f.split("=", 1) for f in fields if "=" in f)
    return {}


# -- writing ------------------------------------------------------------------------------------


def modelfile_header(model_type: str, prompt_format: str) -> str:
    """The comment line that states which model type and prompt format a Modelfile serves."""
    return f"# {HEADER_KEY} model_type={model_type} prompt_format={prompt_format}"


def render_modelfile(
    *,
    model_type: str,
    prompt_format: str,
    system: str,
    from_: str,
    parameters: Mapping[str, Any],
    template: str = CHATML_TEMPLATE,
    notes: Sequence[str] = (),
) -> str:
    """A Modelfile whose SYSTEM parses back to ``system`` exactly.

    ``parameters`` maps names to a value or a list of values (``stop``); they are written in
    the order given. ``notes`` become comment lines after the header (one line each). Raises :class:`ModelfileError` for a value a Modelfile cannot carry
    unchanged (a ``\"\"\"`` inside, or a character Ollama drops).
    """
    lines = [
        modelfile_header(model_type, prompt_format),
        "# Generated from the prompt format; edit conf/, then regenerate with",
        "#   python run.py task=research_qa stage=modelfiles model=" + model_type,
        *(f"# {' '.join(note.split())}" for note in notes),
        f"FROM {_single_line('FROM', from_)}",
        f"TEMPLATE {_quote('TEMPLATE', template)}",
    ]
    for key, value in parameters.items():
        values: Sequence[Any] = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if v is None:
                continue
            lines.append(f"PARAMETER {key} {_param_value(key, v)}")
    lines.append(f"SYSTEM {_quote('SYSTEM', system)}")
    text = "\n".join(lines) + "\n"
    parsed = parse_modelfile(text)
    if parsed.system != system:  # the guarantee this module exists for
        raise ModelfileError(f"SYSTEM would not round-trip: wrote {system!r}, reads {parsed.system!r}")
    return text


def _param_value(key: str, value: Any) -> str:
    """Numbers and booleans bare; strings in double quotes (``PARAMETER stop "<|im_end|>"``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    text = str(value)
    if '"' in text or any(_is_newline(ch) for ch in text) or not text:
        return _quote(f"PARAMETER {key}", text)
    _quote(f"PARAMETER {key}", text)  # same character checks
    return f'"{text}"'


def _single_line(what: str, value: str) -> str:
    if not value.strip() or any(_is_newline(ch) for ch in value) or value != value.strip():
        raise ModelfileError(f"{what} value must be one non-empty line without outer blanks, got {value!r}")
    return value


def _quote(what: str, value: str) -> str:
    """Triple-quote ``value`` (Ollama's multi-line form), refusing what cannot survive parsing."""
    if '"""' in value:
        raise ModelfileError(f'{what} value contains """, which cannot be written in a Modelfile: {value!r}')
    bad = sorted({ch for ch in value if not (_is_print(ch) or ch in "\t\r\n")})
    if bad:
        names = ", ".join(f"U+{ord(ch):04X}" for ch in bad)
        raise ModelfileError(f"{what} value contains characters Ollama drops ({names}): {value!r}")
    return f'"""{value}"""'
