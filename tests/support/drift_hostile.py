"""Hostile inputs for the drift gate: GGUFs, chat templates, Modelfiles and server answers.

Takes: a folder to write into. Gives: :func:`gguf_bytes` (a GGUF's metadata written field by
field, any field with any type or any declared size, no tensors), :func:`bpe_fields` (the
fields of a tiny byte-level BPE vocabulary), :class:`StandIn` (a loopback HTTP server
standing in for llama-server, with one misbehaviour per path prefix), and :data:`CASES`:
each hostile case with the bound that must stop it and the words of its one-line error.
:func:`prepare` writes a case's files and gives the ``storyforge drift`` arguments.

Why here: the tests (one per case) and ``bench/drift_hostile.py`` (seconds and
peak memory per case, the table in docs/drift.md) run the same cases.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

__all__ = ["CASES", "Case", "StandIn", "bpe_fields", "byte_chars", "gguf_bytes", "prepare"]

# GGUF value types
U32, I32, F32, BOOL, STRING, ARRAY, U64 = 4, 5, 6, 7, 8, 9, 10
_PACK = {U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q"}
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

#: a field: (key, type, value); an array's type is (ARRAY, item type). A value may be
#: :class:`Declared` to claim a size without writing the data.
Field = tuple[str, Any, Any]


@dataclass(frozen=True, slots=True)
class Declared:
    """A string or array that claims ``size`` (bytes or items) and holds nothing after it."""

    size: int


def _string(text: str | bytes) -> bytes:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def _value(kind: Any, value: Any) -> bytes:
    if isinstance(value, Declared):
        if kind == STRING:
            return struct.pack("<Q", value.size)
        return struct.pack("<IQ", kind[1], value.size)
    if kind == STRING:
        return _string(value)
    if isinstance(kind, tuple):
        item = kind[1]
        body = b"".join(_value(item, v) for v in value)
        return struct.pack("<IQ", item, len(value)) + body
    return struct.pack(_PACK[kind], value)


def gguf_bytes(fields: Sequence[Field]) -> bytes:
    """A GGUF (version 3, no tensors) holding ``fields`` as given: types are not checked."""
    out = [b"GGUF", struct.pack("<IQQ", 3, 0, len(fields))]
    for key, kind, value in fields:
        tag = ARRAY if isinstance(kind, tuple) else kind
        out.append(_string(key) + struct.pack("<I", tag) + _value(kind, value))
    return b"".join(out)


def byte_chars() -> list[str]:
    """GPT-2's printable character for each byte value 0-255, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def bpe_fields(
    *,
    pre: str = "smollm",
    words: Sequence[str] = (),
    merges: Sequence[str] = (),
    add_bos: bool = False,
    eos: int = 2,
    template: str = CHATML,
) -> list[Field]:
    """A byte-level BPE vocabulary: ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``
    (control), the 256 byte characters, each merge's result, then ``words`` (whole tokens
    with no merges: llama.cpp takes them only with ``ignore_merges``)."""
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *byte_chars()]
    for merge in merges:
        joined = merge.replace(" ", "")
        if joined not in tokens:
            tokens.append(joined)
    tokens += [w for w in words if w not in tokens]
    types = [3, 3, 3] + [1] * (len(tokens) - 3)
    return [
        ("general.architecture", STRING, "llama"),
        ("llama.context_length", U32, 2048),
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.pre", STRING, pre),
        ("tokenizer.ggml.tokens", (ARRAY, STRING), tokens),
        ("tokenizer.ggml.token_type", (ARRAY, I32), types),
        ("tokenizer.ggml.merges", (ARRAY, STRING), list(merges)),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, eos),
        ("tokenizer.ggml.add_bos_token", BOOL, add_bos),
        ("tokenizer.chat_template", STRING, template),
    ]


def _replace(fields: list[Field], key: str, kind: Any, value: Any) -> list[Field]:
    return [(k, kind, value) if k == key else (k, t, v) for k, t, v in fields]


# -- a llama-server stand-in -------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        return

    def _send(self, body: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(b'{"default_generation_settings": {"n_ctx": 4096}}')

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        mode, _, endpoint = self.path.strip("/").partition("/")
        if endpoint != "tokenize":
            self._send(b'{"prompt": "x", "content": "x"}')
            return
        if mode == "endless":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"1, " * 20_000
            frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
            try:
                head = b'{"tokens": ['
                self.wfile.write(f"{len(head):x}\r\n".encode() + head + b"\r\n")
                while True:
                    self.wfile.write(frame)
            except OSError:  # the client hung up: the cap worked
                return
        answers = {
            "notjson": b"<html>busy</html>",
            "tokensstring": b'{"tokens": "1 2 3"}',
            "tokensmixed": b'{"tokens": [1, "two", 3]}',
            "list": b"[1, 2, 3]",
            "notokens": b'{"ids": [1, 2]}',
        }
        self._send(answers.get(mode, b'{"tokens": [1]}'))


class StandIn:
    """A loopback llama-server stand-in: ``{url}/{mode}`` misbehaves as ``mode`` says
    (``endless``: an endless ``/tokenize`` body; ``notjson``, ``tokensstring``,
    ``tokensmixed``, ``list``, ``notokens``: malformed ``/tokenize`` answers)."""

    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


# -- the cases ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One hostile input: what it is, the bound that stops it, the words of its error."""

    name: str
    what: str
    bound: str
    expect: str
    #: (folder, stand-in URL) -> the ``storyforge drift`` arguments after the export and --tokenizer
    args: Callable[[Path, str], list[str]]


def _gguf(name: str, fields: list[Field]) -> Callable[[Path, str], list[str]]:
    def make(folder: Path, url: str) -> list[str]:
        path = folder / f"{name}.gguf"
        path.write_bytes(gguf_bytes(fields))
        return ["--gguf", str(path)]

    return make


def _truncated(folder: Path, url: str) -> list[str]:
    path = folder / "truncated.gguf"
    path.write_bytes(gguf_bytes(bpe_fields())[:900])
    return ["--gguf", str(path)]


def _modelfile(name: str, template: str) -> Callable[[Path, str], list[str]]:
    def make(folder: Path, url: str) -> list[str]:
        gguf = folder / "base.gguf"
        gguf.write_bytes(gguf_bytes(bpe_fields()))
        path = folder / f"Modelfile.{name}"
        path.write_text(f'FROM {gguf}\nTEMPLATE """{template}"""\n', encoding="utf-8")
        return ["--modelfile", str(path)]

    return make


def _server(mode: str) -> Callable[[Path, str], list[str]]:
    return lambda folder, url: ["--server", f"{url}/{mode}"]


_BASE = bpe_fields()
_NESTED = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
_DOUBLE = "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
_GO_DOUBLE = '{{ $s := "ab" }}' + "{{ $s = print $s $s }}" * 40 + "{{ $s }}"  # 900 bytes
_GO_NESTED = "{{ range 100000 }}{{ range 100000 }}{{ end }}{{ end }}"

CASES: tuple[Case, ...] = (
    Case(
        name="gguf-long-token",
        what="a GGUF token of 400,000 characters",
        bound="item_bytes (1,024 bytes per array string)",
        expect="tokenizer.ggml.tokens[3] is 400000 bytes long (limit 1024)",
        args=_gguf(
            "long", _replace(_BASE, "tokenizer.ggml.tokens", (ARRAY, STRING), ["a", "b", "c", "x" * 400_000])
        ),
    ),
    Case(
        name="gguf-huge-array",
        what="tokens declared as 2^40 items",
        bound="array_items (4,000,000)",
        expect="tokenizer.ggml.tokens holds 1099511627776 items (limit 4000000)",
        args=_gguf("array", _replace(_BASE, "tokenizer.ggml.tokens", (ARRAY, STRING), Declared(1 << 40))),
    ),
    Case(
        name="gguf-huge-string",
        what="a chat template declared as 2^40 bytes",
        bound="string_bytes (1 MiB)",
        expect="tokenizer.chat_template is 1099511627776 bytes long (limit 1048576)",
        args=_gguf("string", _replace(_BASE, "tokenizer.chat_template", STRING, Declared(1 << 40))),
    ),
    Case(
        name="gguf-truncated",
        what="a GGUF cut inside its metadata",
        bound="reads checked against the file's end",
        expect="the file ends inside its metadata (truncated)",
        args=_truncated,
    ),
    Case(
        name="gguf-bos-string",
        what="bos_token_id written as a string",
        bound="field types",
        expect="tokenizer.ggml.bos_token_id must be an integer, the file holds string",
        args=_gguf("bos", _replace(_BASE, "tokenizer.ggml.bos_token_id", STRING, "1")),
    ),
    Case(
        name="gguf-tokens-ints",
        what="tokens written as an array of int32",
        bound="field types",
        expect="tokenizer.ggml.tokens must be an array of strings, the file holds array of int32",
        args=_gguf("ints", _replace(_BASE, "tokenizer.ggml.tokens", (ARRAY, I32), [1, 2, 3])),
    ),
    Case(
        name="gguf-template-int",
        what="chat_template written as a uint32",
        bound="field types",
        expect="tokenizer.chat_template must be a string, the file holds uint32",
        args=_gguf("tpl", _replace(_BASE, "tokenizer.chat_template", U32, 7)),
    ),
    Case(
        name="gguf-eos-out-of-range",
        what="eos_token_id beyond the vocabulary",
        bound="field ranges",
        expect="tokenizer.ggml.eos_token_id = 999999 is out of range",
        args=_gguf("eos", _replace(_BASE, "tokenizer.ggml.eos_token_id", U32, 999_999)),
    ),
    Case(
        name="jinja-nested-range",
        what="a GGUF chat template with nested range(100000) loops",
        bound="steps (200,000 loop iterations and calls)",
        expect="more than 200000 template steps",
        args=_gguf("nested", _replace(_BASE, "tokenizer.chat_template", STRING, _NESTED)),
    ),
    Case(
        name="jinja-doubling",
        what="a GGUF chat template doubling a string 64 times",
        bound="chars (1 MiB per value and per output)",
        expect="it would build a value of 2097152 items (cap 1048576)",
        args=_gguf("double", _replace(_BASE, "tokenizer.chat_template", STRING, _DOUBLE)),
    ),
    Case(
        name="jinja-multiply",
        what="a GGUF chat template writing 'a' * 10**10",
        bound="chars (checked before the string is built)",
        expect="it would build a value of 10000000000 items",
        args=_gguf("mul", _replace(_BASE, "tokenizer.chat_template", STRING, "{{ 'a' * 10**10 }}")),
    ),
    Case(
        name="go-doubling",
        what="a 900-byte Modelfile TEMPLATE doubling a string 40 times",
        bound="MAX_OUTPUT (1 MiB per value and per output)",
        expect="print would build more than 1048576 characters (limit)",
        args=_modelfile("double", _GO_DOUBLE),
    ),
    Case(
        name="go-nested-range",
        what="a Modelfile TEMPLATE with nested range 100000 loops",
        bound="MAX_STEPS (1,000,000)",
        expect="execution took more than 1000000 steps (limit)",
        args=_modelfile("nested", _GO_NESTED),
    ),
    Case(
        name="server-endless-body",
        what="a llama-server stand-in streaming an endless /tokenize body",
        bound="MAX_ANSWER_BYTES (8 MiB, provider.max_response_bytes)",
        expect="the answer is larger than 8388608 bytes (refused)",
        args=_server("endless"),
    ),
    Case(
        name="server-not-json",
        what="/tokenize answering HTML",
        bound="answer shape",
        expect="answered text that is not JSON",
        args=_server("notjson"),
    ),
    Case(
        name="server-tokens-string",
        what="/tokenize answering tokens as a string",
        bound="answer shape",
        expect="answered malformed JSON: expected 'tokens'",
        args=_server("tokensstring"),
    ),
    Case(
        name="server-tokens-mixed",
        what="/tokenize answering a list with a string in it",
        bound="answer shape",
        expect="'tokens' must be a list of integers",
        args=_server("tokensmixed"),
    ),
    Case(
        name="server-list",
        what="/tokenize answering a JSON list",
        bound="answer shape",
        expect="answered malformed JSON: expected 'tokens'",
        args=_server("list"),
    ),
)


def export_and_tokenizer(folder: Path) -> tuple[Path, Path]:
    """A two-row ``sft.jsonl`` and tokenizer files for the base BPE GGUF (both in ``folder``)."""
    from storyforge.drift.hf_tokenizer import write_tokenizer_files

    folder.mkdir(parents=True, exist_ok=True)
    base = folder / "base.gguf"
    base.write_bytes(gguf_bytes(bpe_fields()))
    tokenizer = write_tokenizer_files(base, folder / "tokenizer")
    export = folder / "sft.jsonl"
    rows = [
        {
            "id": f"s{i}",
            "messages": [
                {"role": "user", "content": f"Tell story {i}."},
                {"role": "assistant", "content": "Once."},
            ],
        }
        for i in range(2)
    ]
    export.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return export, tokenizer


def prepare(case: Case, folder: Path, url: str) -> list[str]:
    """The full ``storyforge drift`` arguments for ``case`` (its files written into ``folder``)."""
    folder.mkdir(parents=True, exist_ok=True)
    export, tokenizer = export_and_tokenizer(folder)
    return [str(export), "--tokenizer", str(tokenizer), *case.args(folder, url)]
