"""A GGUF file's chat template, vocabulary and limits, read with the ``gguf`` package.

Takes: the path of a ``.gguf`` file. Gives: :func:`read_gguf` -> :class:`GGUFInfo` (its
embedded chat template, token list, BOS/EOS ids and flags, and the context length it was
trained for) and :func:`gguf_tokenizer`, a ``tokenizers.Tokenizer`` that splits text as
llama.cpp does for that vocabulary. Only the metadata is read, never the weights.

Why: the GGUF is what llama.cpp and Ollama serve, so its template and vocabulary are the
serving side even when no server is running. SentencePiece-style vocabularies
(``tokenizer.ggml.model = llama``) are rebuilt the way llama.cpp tokenizes them: the text is
split at control tokens, each piece gets the leading ``▁`` and spaces become ``▁``, adjacent
symbols merge by the score of the merged piece, and characters outside the vocabulary fall
back to byte tokens. Other vocabulary kinds are refused with a message naming the kind (the
running-server side checks them instead).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from storyforge.errors import DataError
from storyforge.extras import require

__all__ = ["GGUFInfo", "gguf_tokenizer", "read_gguf"]

_CONTROL, _USER_DEFINED = 3, 4  # gguf.TokenType values
_SPACE = "\u2581"


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

    def token(self, token_id: int | None) -> str | None:
        return self.tokens[token_id] if token_id is not None and 0 <= token_id < len(self.tokens) else None


def _get(fields: Any, key: str, default: Any = None) -> Any:
    field = fields.get(key)
    return default if field is None else field.contents()


@cache
def read_gguf(path: str | Path) -> GGUFInfo:
    """The metadata of the GGUF at ``path``; :class:`DataError` when it is not a GGUF file."""
    require("gguf", extra="drift", for_what="reading a GGUF model file")
    import gguf

    file = Path(path)
    if not file.is_file():
        raise DataError(f"GGUF file not found: {file}")
    try:
        reader = gguf.GGUFReader(str(file))
    except (ValueError, OSError) as exc:
        raise DataError(f"{file}: not a readable GGUF file ({exc})") from None
    fields = reader.fields
    arch = str(_get(fields, "general.architecture", ""))
    tokens = _get(fields, "tokenizer.ggml.tokens")
    if not tokens:
        raise DataError(f"{file}: the GGUF holds no tokenizer.ggml.tokens (no vocabulary)")
    model = str(_get(fields, "tokenizer.ggml.model", ""))
    return GGUFInfo(
        path=str(file),
        architecture=arch,
        context_length=_get(fields, f"{arch}.context_length"),
        tokenizer_model=model,
        tokens=tuple(tokens),
        scores=tuple(_get(fields, "tokenizer.ggml.scores") or [0.0] * len(tokens)),
        token_types=tuple(_get(fields, "tokenizer.ggml.token_type") or [1] * len(tokens)),
        bos_id=_get(fields, "tokenizer.ggml.bos_token_id"),
        eos_id=_get(fields, "tokenizer.ggml.eos_token_id"),
        # llama.cpp's defaults when the key is absent: SentencePiece adds BOS, BPE does not
        add_bos=bool(_get(fields, "tokenizer.ggml.add_bos_token", model == "llama")),
        add_eos=bool(_get(fields, "tokenizer.ggml.add_eos_token", False)),
        add_space_prefix=bool(_get(fields, "tokenizer.ggml.add_space_prefix", model == "llama")),
        chat_template=_get(fields, "tokenizer.chat_template"),
    )


def _spm_merges(
    tokens: Sequence[str], scores: Sequence[float], types: Sequence[int]
) -> list[tuple[str, str]]:
    """Every split ``(a, b)`` of a normal piece into two pieces, best merged score first:
    byte-pair merges that reproduce llama.cpp's highest-score-first bigram merging."""
    index = {t: i for i, t in reversed(list(enumerate(tokens)))}
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
    if info.tokenizer_model != "llama":
        raise DataError(
            f"{info.path}: vocabulary kind {info.tokenizer_model!r} is not rebuilt from the GGUF "
            "(only SentencePiece-style 'llama' vocabularies are); check this model with --server"
        )
    return _spm_tokenizer(info)


@cache
def _spm_tokenizer(info: GGUFInfo) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

    vocab: dict[str, int] = {}
    for i, piece in enumerate(info.tokens):
        vocab.setdefault(piece, i)
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
    tokenizer.add_special_tokens(
        [
            AddedToken(piece, special=True, normalized=False)
            for piece, kind in zip(info.tokens, info.token_types, strict=False)
            if kind in (_CONTROL, _USER_DEFINED)
        ]
    )
    return tokenizer
