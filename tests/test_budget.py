"""Token estimators and the budget manager (reference-semantics.md §8)."""

from __future__ import annotations

import base64
import math

import pytest

from storyforge.engine.budget import (
    BudgetManager,
    default_estimator,
    hf_tokenizer_estimator,
    tiktoken_estimator,
)
from storyforge.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        pytest.param("", 0, id="empty"),
        pytest.param("a", 1, id="one-char"),
        pytest.param("abcd", 1, id="exactly-four"),
        pytest.param("abcde", 2, id="five-rounds-up"),
        pytest.param("x" * 400, 100, id="long-ascii"),
        pytest.param("é", 1, id="bmp-accent-one-unit"),
        pytest.param("😀", 1, id="emoji-two-units"),
        pytest.param("😀😀😀", 2, id="three-emoji-six-units"),
        pytest.param("ab😀", 1, id="mixed-four-units"),
        pytest.param("abc😀", 2, id="mixed-five-units"),
        pytest.param("日本語です", 2, id="cjk-five-units"),
    ],
)
def test_default_estimator_counts_utf16_units(text: str, tokens: int) -> None:
    """The default estimate is ceil(UTF-16 code units / 4); astral characters count twice."""
    assert default_estimator(text) == tokens
    assert default_estimator(text) == math.ceil(len(text.encode("utf-16-le")) / 2 / 4)


def test_has_any_unlimited_is_always_true() -> None:
    """With no global ceiling there is always budget left, however much was spent."""
    bm = BudgetManager(None)
    bm.spend(bm.estimate("x" * 10_000))
    assert bm.has_any()
    assert bm.fits(bm.estimate("y" * 100_000))


@pytest.mark.parametrize(
    ("max_tokens", "spent", "text", "fits"),
    [
        pytest.param(10, 0, "", True, id="empty-fits-while-budget-left"),
        pytest.param(10, 10, "", False, id="empty-does-not-fit-when-exhausted"),
        pytest.param(0, 0, "", False, id="zero-budget-rejects-even-empty"),
        pytest.param(2, 0, "abcdefgh", True, id="exact-limit-fits"),
        pytest.param(2, 0, "abcdefghi", False, id="one-over-does-not-fit"),
        pytest.param(5, 3, "abcdefgh", True, id="fits-in-the-rest"),
        pytest.param(5, 4, "abcdefgh", False, id="does-not-fit-the-rest"),
    ],
)
def test_can_fit_global(max_tokens: int, spent: int, text: str, fits: bool) -> None:
    """fits checks consumed + cost <= max; a zero cost fits exactly when budget is left."""
    bm = BudgetManager(max_tokens)
    bm.spend(spent)
    assert bm.fits(bm.estimate(text)) is fits


def test_zero_global_budget_has_nothing() -> None:
    """A global budget of 0 means has_any() is false from the start."""
    assert not BudgetManager(0).has_any()


def test_local_scope_limits_and_is_charged() -> None:
    """A local scope caps each text and is charged along with the global budget."""
    bm = BudgetManager(100)
    bm.push(5)
    assert bm.fits(bm.estimate("x" * 20))  # 5 tokens
    assert not bm.fits(bm.estimate("x" * 21))  # 6 tokens
    bm.spend(bm.estimate("x" * 12))  # 3 tokens
    assert bm.scopes == [2]
    assert not bm.fits(bm.estimate("x" * 12))
    assert bm.fits(bm.estimate("x" * 8))
    bm.pop()
    assert bm.scopes == []
    assert bm.consumed == 3


def test_nested_scopes_all_checked_and_all_charged() -> None:
    """Every open scope must have room, outermost to innermost, and all are charged."""
    bm = BudgetManager(None)
    bm.push(10)
    bm.push(4)
    assert bm.fits(bm.estimate("x" * 16))
    assert not bm.fits(bm.estimate("x" * 17))
    bm.spend(bm.estimate("x" * 12))
    assert bm.scopes == [7, 1]
    bm.pop()
    bm.pop()
    assert bm.scopes == []


def test_local_scope_never_goes_below_zero() -> None:
    """Charging more than a scope has left floors it at zero."""
    bm = BudgetManager(None)
    bm.push(2)
    bm.spend(5)
    assert bm.scopes == [0]
    assert not bm.fits(bm.estimate("x"))
    assert bm.fits(bm.estimate(""))  # zero cost only looks at the global budget


def test_has_any_ignores_local_scopes() -> None:
    """has_any() looks only at the global budget, even when a local scope is exhausted."""
    bm = BudgetManager(100)
    bm.push(1)
    bm.spend(bm.estimate("abcd"))
    assert bm.scopes == [0]
    assert bm.has_any()


def test_sibling_scopes_start_fresh() -> None:
    """A scope opened after another one closed starts with its full allowance."""
    bm = BudgetManager(100)
    bm.push(3)
    bm.spend(bm.estimate("x" * 12))
    bm.pop()
    bm.push(3)
    assert bm.fits(bm.estimate("x" * 12))
    assert bm.consumed == 3


def test_global_budget_bounds_local_scopes() -> None:
    """A local allowance larger than the global rest still cannot exceed the global budget."""
    bm = BudgetManager(4)
    bm.spend(bm.estimate("x" * 12))
    bm.push(50)
    assert not bm.fits(bm.estimate("x" * 8))
    assert bm.fits(bm.estimate("x" * 4))


def test_budget_rejects_non_integers() -> None:
    """The global budget must be an int or None (not a bool)."""
    with pytest.raises(TypeError):
        BudgetManager(True)
    with pytest.raises(TypeError):
        BudgetManager(2.5)  # type: ignore[arg-type]


def test_custom_estimator_is_used() -> None:
    """An injected estimator replaces the default everywhere."""
    bm = BudgetManager(3, estimator=lambda text: len(text.split()))
    assert bm.fits(bm.estimate("one two three"))
    assert not bm.fits(bm.estimate("one two three four"))


# -- local tokenizer files ---------------------------------------------------------------------


def _write_tiny_bpe(path) -> None:  # type: ignore[no-untyped-def]
    ranks = [bytes([i]) for i in range(256)] + [b"he", b"ll", b"hell", b"hello"]
    path.write_text("".join(f"{base64.b64encode(tok).decode()} {rank}\n" for rank, tok in enumerate(ranks)))


def test_tiktoken_estimator_reads_a_local_bpe_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A local .tiktoken file gives exact BPE counts (merges apply, nothing is downloaded)."""
    bpe = tmp_path / "tiny.tiktoken"
    _write_tiny_bpe(bpe)
    estimate = tiktoken_estimator(bpe)
    assert estimate("") == 0
    assert estimate("hello") == 1
    assert estimate("help") == 3  # "he" "l" "p"
    assert estimate("hello hello") == 3  # "hello", then " hello" -> " " + "hello"


def test_tiktoken_estimator_by_name_in_cwd(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A bare encoding name resolves to <name>.tiktoken in the working directory."""
    _write_tiny_bpe(tmp_path / "cl100k_base.tiktoken")
    monkeypatch.chdir(tmp_path)
    assert tiktoken_estimator("cl100k_base")("hello") == 1


@pytest.mark.parametrize(
    "where",
    [
        pytest.param("missing.tiktoken", id="missing-file"),
        pytest.param("o200k_base", id="name-without-local-file"),
        pytest.param("https://example.invalid/cl100k_base.tiktoken", id="url-refused"),
    ],
)
def test_tiktoken_estimator_never_downloads(where: str, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Anything but an existing local file is a clear ConfigError."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="local"):
        tiktoken_estimator(where)


def test_hf_tokenizer_estimator_reads_local_tokenizer_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A local tokenizer.json (file or folder) counts tokens without special tokens."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = Tokenizer(WordLevel({"[UNK]": 0, "the": 1, "cat": 2, "sat": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    for where in (tmp_path, tmp_path / "tokenizer.json"):
        estimate = hf_tokenizer_estimator(where)
        assert estimate("the cat sat") == 3
        assert estimate("the dog") == 2
        assert estimate("") == 0


def test_hf_tokenizer_estimator_missing_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A folder without tokenizer.json is a clear ConfigError."""
    with pytest.raises(ConfigError, match="tokenizer.json"):
        hf_tokenizer_estimator(tmp_path)
