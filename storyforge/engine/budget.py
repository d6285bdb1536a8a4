"""Token budgets: estimators and the nested global / slot / node budget scopes of one render.

Contract: a render never emits more than ``budget`` tokens in total, as counted by its
estimator over every emitted message (layout messages, headers, footers, slot messages and
separators, each once, before same-role squashing), and nothing emitted while a slot or node
``maxTokens`` scope is open costs more than that scope has left; a message that does not fit
is skipped whole, never truncated.

Takes: a global ceiling (``None`` = unlimited) and an estimator ``str -> int``. Gives:
:class:`BudgetManager` (the accounting of one render, exactly the reference's default
manager: ``has_any`` looks only at the global budget; ``fits`` checks the global budget and
every open local scope; ``spend`` charges all of them) and estimators:
:func:`default_estimator` (``ceil(UTF-16 code units / 4)``, the reference's rule),
:func:`tiktoken_estimator` and :func:`hf_tokenizer_estimator` (exact counts from tokenizer
files already on disk; storyforge never downloads a tokenizer).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from storyforge.engine.errors import ConfigError

__all__ = [
    "BudgetManager",
    "Estimator",
    "default_estimator",
    "hf_tokenizer_estimator",
    "tiktoken_estimator",
]

Estimator = Callable[[str], int]
"""Token cost of one message text; must be >= 0, and 0 only for text that costs nothing."""


def default_estimator(text: str) -> int:
    """``ceil(L / 4)`` where ``L`` is the length in UTF-16 code units (an emoji counts 2)."""
    if text.isascii():
        return (len(text) + 3) >> 2
    return ((len(text.encode("utf-16-le", "surrogatepass")) >> 1) + 3) >> 2


class BudgetManager:
    """Token accounting of one render: a global ceiling plus a stack of local scopes.

    ``max_tokens=None`` means no global ceiling. A local scope (slot or node ``maxTokens``)
    starts fresh when opened and is dropped when closed, so sibling scopes never affect each
    other, while everything still draws on the global budget.
    """

    __slots__ = ("consumed", "estimate", "max_tokens", "scopes")

    def __init__(self, max_tokens: int | None = None, estimator: Estimator | None = None) -> None:
        if (
            max_tokens is not None
            and max_tokens.__class__ is not int
            and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int))
        ):
            raise TypeError(f"budget must be an int or None, got {max_tokens!r}")
        self.max_tokens: int | None = max_tokens
        self.consumed = 0
        self.scopes: list[int] = []
        self.estimate: Estimator = estimator or default_estimator

    # -- queries -----------------------------------------------------------------------------
    def has_any(self) -> bool:
        """True while the *global* budget has anything left (always, when unlimited)."""
        return self.max_tokens is None or self.consumed < self.max_tokens

    @property
    def remaining(self) -> int | None:
        """Global tokens left, or ``None`` when unlimited."""
        return None if self.max_tokens is None else max(0, self.max_tokens - self.consumed)

    def fits(self, cost: int) -> bool:
        """Whether a text costing ``cost`` fits the global budget and every open local scope."""
        if cost <= 0:
            return self.max_tokens is None or self.consumed < self.max_tokens
        if self.max_tokens is not None and self.consumed + cost > self.max_tokens:
            return False
        for left in self.scopes:
            if cost > left:
                return False
        return True

    def room(self) -> int:
        """The most one more text may cost now: what the global budget and every open local
        scope have left (the smallest of them)."""
        room = self.max_tokens - self.consumed if self.max_tokens is not None else 1 << 62
        for left in self.scopes:
            room = min(room, left)
        return room

    # -- updates -----------------------------------------------------------------------------
    def spend(self, cost: int) -> None:
        """Charge ``cost`` to the global budget and to every open local scope (floored at 0)."""
        if cost <= 0:
            return
        self.consumed += cost
        scopes = self.scopes
        for i in range(len(scopes)):
            left = scopes[i] - cost
            scopes[i] = max(0, left)

    def push(self, max_tokens: int) -> None:
        """Open a fresh local scope with ``max_tokens`` (pair with :meth:`pop`)."""
        self.scopes.append(max_tokens)

    def pop(self) -> None:
        self.scopes.pop()


# -- token-accurate estimators from local files ----------------------------------------------

_R50K_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
_CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
_O200K_PATTERN = "|".join(  # noqa: FLY002 - one alternative per line, as tiktoken writes it
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
TIKTOKEN_PATTERNS: dict[str, str] = {
    "r50k_base": _R50K_PATTERN,
    "p50k_base": _R50K_PATTERN,
    "cl100k_base": _CL100K_PATTERN,
    "o200k_base": _O200K_PATTERN,
}
"""Pre-tokenisation patterns of the public tiktoken encodings, keyed by encoding name."""


def tiktoken_estimator(path_or_name: str | Path, *, pattern: str | None = None) -> Estimator:
    """Exact token counts from a local tiktoken BPE file (``<encoding>.tiktoken``).

    ``path_or_name`` is the path of the file; a bare encoding name (``cl100k_base``) is
    accepted when ``<name>.tiktoken`` exists in the current directory. The split pattern is
    ``pattern``, else the one of the encoding named by the file stem, else cl100k's.
    Nothing is ever downloaded.
    """
    try:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
    except ImportError as exc:
        raise ConfigError(
            "tiktoken_estimator needs the optional 'tiktoken' package: pip install 'storyforge[tiktoken]'"
        ) from exc
    path = Path(path_or_name)
    if not path.is_file() and path.suffix != ".tiktoken":
        path = path.with_name(path.name + ".tiktoken")
    if "://" in str(path_or_name) or not path.is_file():
        raise ConfigError(
            f"tiktoken BPE file not found: {str(path_or_name)!r}. storyforge only reads local "
            "tokenizer files; pass the path of a '<encoding>.tiktoken' file"
        )
    ranks = load_tiktoken_bpe(str(path))
    stem = path.name.removesuffix(".tiktoken")
    encoding = tiktoken.Encoding(
        name=f"storyforge-local-{stem}",
        pat_str=pattern or TIKTOKEN_PATTERNS.get(stem, _CL100K_PATTERN),
        mergeable_ranks=ranks,
        special_tokens={},
    )
    encode = encoding.encode_ordinary

    def estimate(text: str) -> int:
        return len(encode(text)) if text else 0

    return estimate


def hf_tokenizer_estimator(path: str | Path) -> Estimator:
    """Exact token counts from a local Hugging Face ``tokenizer.json`` (or a folder holding one).

    Special tokens are not added: the count is the message text alone. Nothing is downloaded.
    """
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise ConfigError(
            "hf_tokenizer_estimator needs the optional 'tokenizers' package: "
            "pip install 'storyforge[tokenizers]'"
        ) from exc
    file = Path(path)
    if file.is_dir():
        file = file / "tokenizer.json"
    if not file.is_file():
        raise ConfigError(
            f"tokenizer file not found: {str(path)!r}. storyforge only reads a local 'tokenizer.json' "
            "(a file, or a folder containing one)"
        )
    tokenizer: Any = Tokenizer.from_file(str(file))

    def estimate(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids) if text else 0

    return estimate
