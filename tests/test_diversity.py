"""Diversity figures: each metric on inputs whose value is known, sampling, and attribution."""

from __future__ import annotations

import random
import re
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sacrebleu.metrics.bleu import BLEU

from storyforge.errors import ConfigError
from storyforge.quality.diversity import (
    BottomSample,
    DiversityConf,
    attribution,
    compression_ratio,
    distinct_n,
    diversity_metrics,
    self_bleu,
)
from storyforge.quality.text import normalise, opening, shingles, words


@pytest.mark.parametrize(
    ("texts", "n", "expected"),
    [
        (["a b c", "a b d"], 1, 4 / 6),
        (["a b c", "a b d"], 2, 3 / 4),
        (["a b c", "a b c"], 3, 1 / 2),
        (["a a a a"], 1, 1 / 4),
        (["one"], 2, None),  # no bigram at all
        ([], 1, None),
    ],
)
def test_distinct_n(texts: list[str], n: int, expected: float | None) -> None:
    result = distinct_n([t.split() for t in texts], n)
    assert result == (round(expected, 4) if expected is not None else None)


def test_compression_ratio_is_bytes_over_zlib_size_and_grows_with_repetition() -> None:
    varied = [" ".join(random.Random(i).choices("abcdefghij", k=80)) for i in range(20)]
    joined = "\n".join(varied).encode()
    assert compression_ratio(varied) == round(len(joined) / len(zlib.compress(joined, 6)), 4)
    assert compression_ratio([varied[0]] * 20) > 3 * compression_ratio(varied)  # type: ignore[operator]
    assert compression_ratio([]) is None


def test_self_bleu_equals_sacrebleu_sentence_bleu_against_the_other_drawn_texts() -> None:
    rng = random.Random(5)
    vocab = [
        "the",
        "a",
        "cat",
        "dog",
        "sun",
        "tree",
        "ball",
        "red",
        "happy",
        "ran",
        "played",
        "with",
        "friend",
        "park",
        ",",
        ".",
    ]
    texts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(3, 40))) for _ in range(25)]
    texts[7] = texts[8]  # a repeat: the best and second-best counts matter
    drawn = random.Random(3).sample(texts, 12)
    bleu = BLEU(effective_order=True)
    expected = sum(bleu.sentence_score(h, drawn[:i] + drawn[i + 1 :]).score for i, h in enumerate(drawn)) / 12
    assert self_bleu(texts, sample=12, seed=3) == round(expected, 2)
    assert self_bleu(["same story."] * 5, sample=5, seed=0) == 100.0
    assert self_bleu(["alone"], sample=5, seed=0) is None


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.lists(st.sampled_from(["a", "b", "c", "a b", ".", ","]), max_size=9).map(" ".join),
        min_size=2,
        max_size=8,
    ),
    st.integers(min_value=2, max_value=8),
)
def test_self_bleu_is_sacrebleu_on_repeats_ties_and_equal_lengths(texts: list[str], sample: int) -> None:
    """Few words, so n-grams are shared, counts tie and lengths repeat (the reference length
    picked among equals, the shorter on a tie; the clipping count where texts hold the same most)."""
    drawn = random.Random(0).sample(texts, min(sample, len(texts)))
    bleu = BLEU(effective_order=True)
    scores = [bleu.sentence_score(h, drawn[:i] + drawn[i + 1 :]).score for i, h in enumerate(drawn)]
    assert self_bleu(texts, sample=sample, seed=0) == round(sum(scores) / len(scores), 2)


@given(st.lists(st.sampled_from(["a", "b", "c", "."]), max_size=12).map(" ".join))
def test_the_ngram_counts_are_sacrebleus(line: str) -> None:
    from sacrebleu.metrics.helpers import extract_all_word_ngrams

    from storyforge.quality.diversity import _ngrams

    assert _ngrams(line) == extract_all_word_ngrams(line, 1, 4)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sample": 0}, "dedup.diversity.sample and group_sample must be >= 1, got 0, 1000"),
        ({"bleu_sample": 1}, "dedup.diversity.bleu_sample must be in 2..1000, got 1"),
        ({"top_ngrams": -1}, "dedup.diversity.top_openings must be >= 1 and top_ngrams >= 0"),
    ],
)
def test_settings_built_in_code_meet_the_groups_rules(change: dict[str, int], message: str) -> None:
    """The figures refuse settings built in code that a run's config could not hold."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        diversity_metrics(["the cat sat", "the dog ran"], DiversityConf(**change))


def test_metrics_of_a_repetitive_set() -> None:
    texts = [
        "Once upon a time, there was a little cat. The cat ran.",
        "Once upon a time, there was a little dog. The dog sat.",
        "Once upon a time there was a big tree.",
        "Tom had a ball. He liked the ball.",
    ]
    figures = diversity_metrics(texts, DiversityConf(top_openings=1, top_ngrams=2))
    assert figures["top_openings"] == [{"opening": "once upon a time there", "count": 3}]
    assert figures["top_openings_share"] == 0.75
    assert figures["repeated_4grams"] == [
        {"ngram": "a time there was", "texts": 3, "share": 0.75},
        {"ngram": "once upon a time", "texts": 3, "share": 0.75},
    ]
    assert figures["texts"] == 4


@pytest.mark.parametrize(
    ("text", "normalised", "tokens"),
    [
        ("  Hello,\tWORLD!  ", "hello, world!", ["hello", "world"]),
        ("It's Tom’s ball", "it's tom’s ball", ["it's", "tom’s", "ball"]),
        ("ﬁne Straße", "fine strasse", ["fine", "strasse"]),  # NFKC ligature, casefold ß
    ],
)
def test_normalisation(text: str, normalised: str, tokens: list[str]) -> None:
    assert normalise(text) == normalised
    assert words(text) == tokens


def test_shingles_and_openings() -> None:
    tokens = ["a", "b", "c", "d", "e", "f"]
    assert shingles(tokens, 5) == ["a b c d e", "b c d e f"]
    assert shingles(["a", "b"], 5) == ["a b"]
    assert shingles([], 5) == []
    assert shingles(["a", "b", "a", "b", "a", "b"], 2) == ["a b", "b a"]
    assert opening(tokens) == "a b c d e"


@settings(max_examples=30, deadline=None)
@given(
    items=st.lists(st.tuples(st.text(min_size=1, max_size=4), st.integers(0, 3)), unique=True, max_size=30),
    size=st.integers(1, 8),
    parts=st.integers(1, 4),
    order=st.randoms(use_true_random=False),
)
def test_bottom_sample_is_the_same_whatever_the_order_and_partition(
    items: list[tuple[str, int]], size: int, parts: int, order: random.Random
) -> None:
    whole = BottomSample(size)
    for key in items:
        whole.add(key, f"text {key}")
    shuffled = items[:]
    order.shuffle(shuffled)
    pieces = [BottomSample(size) for _ in range(parts)]
    for index, key in enumerate(shuffled):
        pieces[index % parts].add(key, f"text {key}")
    merged = pieces[0]
    for piece in pieces[1:]:
        merged.merge(piece)
    assert merged.texts() == whole.texts()
    assert merged.count == whole.count == len(items)


def test_attribution_ranks_values_by_duplicate_rate() -> None:
    fields = {
        "s1": {"theme": "kindness", "required_count": "2"},
        "s2": {"theme": "kindness", "required_count": "4"},
        "s3": {"theme": "courage", "required_count": "4"},
    }
    outputs = [("s1", False), ("s1", True), ("s2", True), ("s3", False), ("s3", False), ("unknown", True)]
    assert attribution(outputs, fields) == {
        "required_count": [
            {"value": "2", "outputs": 2, "duplicates": 1, "rate": 0.5},
            {"value": "4", "outputs": 3, "duplicates": 1, "rate": 0.3333},
        ],
        "theme": [
            {"value": "kindness", "outputs": 3, "duplicates": 2, "rate": 0.6667},
            {"value": "courage", "outputs": 2, "duplicates": 0, "rate": 0.0},
        ],
    }
    assert len(attribution(outputs, fields, top=1)["theme"]) == 1


@pytest.mark.parametrize(
    ("openings", "share"),
    [
        pytest.param([f"Story {i} starts here today." for i in range(20)], 0.0, id="all-differ"),
        pytest.param(["Once upon a time there was."] * 20, 1.0, id="all-same"),
        pytest.param(
            ["Once upon a time there was."] * 5 + [f"Story {i} a b c." for i in range(15)], 0.25, id="some"
        ),
    ],
)
def test_the_openings_share_counts_only_shared_openings(openings: list[str], share: float) -> None:
    """20 different openings with top_openings=20 are 0%, not 100%: a share means repetition."""
    figures = diversity_metrics(openings, DiversityConf(top_openings=20, top_ngrams=0))
    assert figures["top_openings_share"] == share
