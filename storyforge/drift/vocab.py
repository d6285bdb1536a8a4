"""A GGUF file's chat template, vocabulary and limits, read within bounds.

Takes: the path of a ``.gguf`` file. Gives: :func:`read_gguf` -> :class:`GGUFInfo` (its
embedded chat template, token list, merges, BOS/EOS ids and flags, and the context length it
was trained for) and :func:`gguf_tokenizer`, a ``tokenizers.Tokenizer`` that splits text as
llama.cpp does for that vocabulary. Only the metadata is read, never the weights.

Why: the GGUF is what llama.cpp and Ollama serve, so its template and vocabulary are the
serving side even when no server is running. A GGUF is also input from elsewhere: the
metadata is read here field by field (not with ``gguf.GGUFReader``, which indexes every
field and tensor first), each field the gate uses must have its documented type, and sizes
are capped (:data:`LIMITS`) before anything is allocated, so a hostile file is refused with
one line naming the field instead of taking minutes or gigabytes.

Two vocabulary kinds are rebuilt:

- SentencePiece-style (``tokenizer.ggml.model = llama``) as llama.cpp tokenizes them: the
  text is split at control tokens, each piece gets the leading ``▁`` and spaces become
  ``▁``, adjacent symbols merge by the score of the merged piece, and characters outside the
  vocabulary fall back to byte tokens;
- byte-level BPE (``gpt2``): the GGUF's ``tokenizer.ggml.merges`` in rank order, the text
  split by the pre-tokenizer regexes llama.cpp uses for ``tokenizer.ggml.pre``
  (:data:`BPE_PRE`), bytes mapped to GPT-2's printable characters.

Other kinds, and ``pre`` values not in the table, are refused with a message naming them
(the running-server side checks such models instead).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, BinaryIO

from storyforge.errors import DataError

__all__ = ["BPE_PRE", "LIMITS", "GGUFInfo", "GGUFVocabulary", "gguf_tokenizer", "read_gguf"]

_CONTROL, _USER_DEFINED = 3, 4  # gguf.TokenType values
_SPACE = "\u2581"

#: Caps on GGUF metadata: a field beyond one is refused before it is read.
LIMITS = {
    "fields": 100_000,  # key/value pairs in the header
    "key_bytes": 1024,  # one key
    "string_bytes": 1 << 20,  # one string value (a chat template: typically 1-20 KB)
    "array_items": 4_000_000,  # one array (vocabularies: 32k-262k tokens, merges up to ~500k)
    "item_bytes": 1024,  # one string in an array (a token, a merge)
    "metadata_bytes": 64 << 20,  # all metadata together (SmolLM2: about 1 MB; Llama 3: about 8 MB)
}

_GENERAL_GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_LLAMA3 = (
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_QWEN2 = (
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
)
_DEFAULT = ("[\\p{P}\\$\\+<=>\\^~\\|]+", _GENERAL_GPT2, "\\p{N}+", "[0-9][0-9][0-9]")
_SMOLLM = ("\\p{N}", _GENERAL_GPT2)
#: ``tokenizer.ggml.pre`` -> (the regexes llama.cpp splits text with, in order; ignore_merges):
#: llama.cpp's ``llama-vocab.cpp`` for these values. A word the vocabulary holds whole is one
#: token without merging when ignore_merges is set (Llama 3).
BPE_PRE: dict[str, tuple[tuple[str, ...], bool]] = {
    "default": (_DEFAULT, False),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3"), ((_LLAMA3,), True)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell"), (_SMOLLM, False)),
    **dict.fromkeys(("gpt-2", "phi-2", "mpt", "olmo"), ((_GENERAL_GPT2,), False)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2"), ((_QWEN2,), False)),
    **dict.fromkeys(("dbrx", "smaug-bpe"), ((_LLAMA3,), False)),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class GGUFInfo:
    path: str
    architecture: str
    context_length: int | None
    tokenizer_model: str
    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    token_types: tuple[int, ...]
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    chat_template: str | None
    merges: tuple[str, ...] = ()
    pre: str = "default"
    unk_id: int | None = None
    pad_id: int | None = None

    def token(self, token_id: int | None) -> str | None:
        return self.tokens[token_id] if token_id is not None and 0 <= token_id < len(self.tokens) else None


# -- the metadata, read field by field ----------------------------------------------------------

_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_TYPE_NAMES = {
    0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32",
    7: "bool", 8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64",
}  # fmt: skip
_INTS = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
_FLOATS = frozenset({6, 12})


class _Reader:
    """Sequential reads of a GGUF header with every size checked against :data:`LIMITS`."""

    def __init__(self, handle: BinaryIO, name: str) -> None:
        self.handle = handle
        self.name = name
        self.total = 0

    def fail(self, message: str) -> DataError:
        return DataError(f"{self.name}: {message}")

    def take(self, size: int) -> bytes:
        self.total += size
        if self.total > LIMITS["metadata_bytes"]:
            raise self.fail(f"the metadata is larger than {LIMITS['metadata_bytes']} bytes (limit)")
        data = self.handle.read(size)
        if len(data) != size:
            raise self.fail("the file ends inside its metadata (truncated)")
        return data

    def scalar(self, kind: int) -> Any:
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self, what: str, limit: int) -> str:
        size = self.scalar(10)
        if size > limit:
            raise self.fail(f"{what} is {size} bytes long (limit {limit})")
        try:
            return self.take(size).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None

    def value(self, key: str, kind: int) -> tuple[int, Any]:
        """``(element type for arrays, else the type; the value)``."""
        if kind in _SCALARS:
            return kind, self.scalar(kind)
        if kind == _STRING:
            return kind, self.string(key, LIMITS["string_bytes"])
        if kind != _ARRAY:
            raise self.fail(f"{key} has an unknown value type {kind}")
        item = self.scalar(4)
        count = self.scalar(10)
        if count > LIMITS["array_items"]:
            raise self.fail(f"{key} holds {count} items (limit {LIMITS['array_items']})")
        if item == _STRING:
            limit = LIMITS["item_bytes"]
            return _ARRAY * 16 + item, tuple(self.string(f"{key}[{i}]", limit) for i in range(count))
        if item in _SCALARS:
            fmt = _SCALARS[item]
            data = self.take(struct.calcsize(fmt) * count)
            return _ARRAY * 16 + item, struct.unpack(f"<{count}{fmt[1]}", data)
        raise self.fail(f"{key} is an array of {_TYPE_NAMES.get(item, item)} (not read)")


def _metadata(file: Path) -> dict[str, tuple[int, Any]]:
    with file.open("rb") as handle:
        reader = _Reader(handle, str(file))
        if handle.read(4) != b"GGUF":
            raise DataError(f"{file}: not a GGUF file (no GGUF magic)")
        version = reader.scalar(4)
        if version not in (2, 3):
            raise DataError(f"{file}: GGUF version {version} is not read (2 and 3 are)")
        reader.scalar(10)  # tensors: never read
        count = reader.scalar(10)
        if count > LIMITS["fields"]:
            raise DataError(f"{file}: {count} metadata fields (limit {LIMITS['fields']})")
        fields: dict[str, tuple[int, Any]] = {}
        for _ in range(count):
            key = reader.string("a metadata key", LIMITS["key_bytes"])
            fields[key] = reader.value(key, reader.scalar(4))
        return fields


class _Fields:
    """Typed access to the metadata: a field the gate uses with another type is refused."""

    def __init__(self, file: Path, fields: dict[str, tuple[int, Any]]) -> None:
        self.file = file
        self.fields = fields

    def _wrong(self, key: str, want: str) -> DataError:
        kind, _ = self.fields[key]
        have = f"array of {_TYPE_NAMES[kind - _ARRAY * 16]}" if kind >= _ARRAY * 16 else _TYPE_NAMES[kind]
        return DataError(f"{self.file}: metadata field {key} must be {want}, the file holds {have}")

    def text(self, key: str, default: str | None = None) -> str | None:
        if key not in self.fields:
            return default
        kind, value = self.fields[key]
        if kind != _STRING:
            raise self._wrong(key, "a string")
        return str(value)

    def integer(self, key: str, *, below: int | None = None) -> int | None:
        if key not in self.fields:
            return None
        kind, value = self.fields[key]
        if kind not in _INTS:
            raise self._wrong(key, "an integer")
        if value < 0 or (below is not None and value >= below):
            raise DataError(f"{self.file}: metadata field {key} = {value} is out of range (0 to {below})")
        return int(value)

    def flag(self, key: str, default: bool) -> bool:
        if key not in self.fields:
            return default
        kind, value = self.fields[key]
        if kind != 7:
            raise self._wrong(key, "a bool")
        return bool(value)

    def array(self, key: str, items: frozenset[int], want: str, length: int | None) -> tuple[Any, ...]:
        if key not in self.fields:
            return ()
        kind, value = self.fields[key]
        if kind < _ARRAY * 16 or kind - _ARRAY * 16 not in items:
            raise self._wrong(key, f"an array of {want}")
        if length is not None and len(value) != length:
            raise DataError(f"{self.file}: {key} holds {len(value)} items for {length} tokens")
        return tuple(value)


@cache
def read_gguf(path: str | Path) -> GGUFInfo:
    """The metadata of the GGUF at ``path``; :class:`DataError` (one line naming the field)
    when it is not a GGUF file, a field has another type, or a size exceeds :data:`LIMITS`."""
    file = Path(path)
    if not file.is_file():
        raise DataError(f"GGUF file not found: {file}")
    fields = _Fields(file, _metadata(file))
    arch = fields.text("general.architecture", "") or ""
    tokens = fields.array("tokenizer.ggml.tokens", frozenset({_STRING}), "strings", None)
    if not tokens:
        raise DataError(f"{file}: the GGUF holds no tokenizer.ggml.tokens (no vocabulary)")
    n = len(tokens)
    model = fields.text("tokenizer.ggml.model", "") or ""
    scores = fields.array("tokenizer.ggml.scores", _FLOATS, "floats", n) or (0.0,) * n
    types = fields.array("tokenizer.ggml.token_type", _INTS, "integers", n) or (1,) * n
    return GGUFInfo(
        path=str(file),
        architecture=arch,
        context_length=fields.integer(f"{arch}.context_length"),
        tokenizer_model=model,
        tokens=tokens,
        scores=tuple(float(s) for s in scores),
        token_types=tuple(int(t) for t in types),
        bos_id=fields.integer("tokenizer.ggml.bos_token_id", below=n),
        eos_id=fields.integer("tokenizer.ggml.eos_token_id", below=n),
        # llama.cpp's defaults when the key is absent: SentencePiece adds BOS, BPE does not
        add_bos=fields.flag("tokenizer.ggml.add_bos_token", model == "llama"),
        add_eos=fields.flag("tokenizer.ggml.add_eos_token", False),
        add_space_prefix=fields.flag("tokenizer.ggml.add_space_prefix", model == "llama"),
        chat_template=fields.text("tokenizer.chat_template"),
        merges=fields.array("tokenizer.ggml.merges", frozenset({_STRING}), "strings", None),
        pre=fields.text("tokenizer.ggml.pre", "default") or "default",
        unk_id=fields.integer("tokenizer.ggml.unknown_token_id", below=n),
        pad_id=fields.integer("tokenizer.ggml.padding_token_id", below=n),
    )


def _first_ids(tokens: Sequence[str]) -> dict[str, int]:
    """Each piece's first id (a vocabulary may list a piece twice)."""
    ids: dict[str, int] = {}
    for i, piece in enumerate(tokens):
        ids.setdefault(piece, i)
    return ids


def _spm_merges(
    tokens: Sequence[str], scores: Sequence[float], types: Sequence[int]
) -> list[tuple[str, str]]:
    """Every split ``(a, b)`` of a normal piece into two pieces, best merged score first:
    byte-pair merges that reproduce llama.cpp's highest-score-first bigram merging."""
    index = _first_ids(tokens)
    ranked: list[tuple[float, int, tuple[str, str]]] = []
    for i, piece in enumerate(tokens):
        if types[i] in (_CONTROL, _USER_DEFINED) or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in index and right in index:
                ranked.append((-scores[i], i, (left, right)))
    ranked.sort()
    return [pair for _, _, pair in ranked]


def gguf_tokenizer(info: GGUFInfo) -> Any:
    """A ``tokenizers.Tokenizer`` splitting text as llama.cpp does for this vocabulary (special
    tokens parsed; BOS/EOS are added by the caller per :attr:`GGUFInfo.add_bos`)."""
    if info.tokenizer_model == "llama":
        return _spm_tokenizer(info)
    if info.tokenizer_model == "gpt2":
        if info.pre not in BPE_PRE:
            raise DataError(
                f"{info.path}: byte-level BPE pre-tokenizer {info.pre!r} is not rebuilt from the GGUF "
                f"(known: {', '.join(sorted(BPE_PRE))}); check this model with --server"
            )
        return _bpe_tokenizer(info)
    raise DataError(
        f"{info.path}: vocabulary kind {info.tokenizer_model!r} is not rebuilt from the GGUF "
        "(SentencePiece 'llama' and byte-level BPE 'gpt2' are); check this model with --server"
    )


def _special_tokens(info: GGUFInfo) -> list[Any]:
    from tokenizers import AddedToken

    return [
        AddedToken(piece, special=True, normalized=False)
        for piece, kind in zip(info.tokens, info.token_types, strict=False)
        if kind in (_CONTROL, _USER_DEFINED)
    ]


@cache
def _bpe_tokenizer(info: GGUFInfo) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = _first_ids(info.tokens)
    merges: list[tuple[str, str]] = []
    for rank, merge in enumerate(info.merges):
        left, space, right = merge.partition(" ")
        if not space or not left or not right:
            raise DataError(f"{info.path}: tokenizer.ggml.merges[{rank}] is not two pieces: {merge!r}")
        merges.append((left, right))
    regexes, ignore_merges = BPE_PRE[info.pre]
    model = models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges)
    tokenizer = Tokenizer(model)
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(_special_tokens(info))
    return tokenizer


@cache
def _spm_tokenizer(info: GGUFInfo) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = _first_ids(info.tokens)
    unk = next((t for t, kind in zip(info.tokens, info.token_types, strict=False) if kind == 2), None)
    model = models.BPE(
        vocab=vocab,
        merges=_spm_merges(info.tokens, info.scores, info.token_types),
        unk_token=unk,
        byte_fallback=True,
        fuse_unk=True,
    )
    tokenizer = Tokenizer(model)
    steps: list[Any] = [normalizers.Replace(" ", _SPACE)]
    if info.add_space_prefix:
        steps.insert(0, normalizers.Prepend(_SPACE))
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens(_special_tokens(info))
    return tokenizer


class GGUFVocabulary:
    """What a serving side takes from a GGUF: its tokenizer, BOS/EOS and the ``decode``/``piece``
    of :class:`~storyforge.drift.sides.Side`."""

    def __init__(self, info: GGUFInfo) -> None:
        self.info = info
        self.tokenizer = gguf_tokenizer(info)
        self.bos_id = info.bos_id
        self.eos_id = info.eos_id
        self.add_bos: bool | None = info.add_bos

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def piece(self, token_id: int) -> str:
        return self.info.token(token_id) or f"<{token_id}>"
