"""The answer checks past the seed's rules: echoes of the prompt and cut-off answers.

Table-driven cases for the echo rule and the finish reasons, a Hypothesis property that every
run of ``echo_words`` words copied from the instruction or the repair turn into any story is
caught, and the fake server's story mode (over HTTP) checked for false rejections."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storyforge.tasks.tinystories import render_instruction
from storyforge.tasks.tinystories.echo import MAX_WORDS, find_echo
from storyforge.tasks.tinystories.repair import RepairRenderer, repair_context
from storyforge.tasks.tinystories.spec import THEME_SET
from storyforge.tasks.tinystories.validate import (
    ECHO_WORDS,
    SeedChecks,
    check_answer,
    finish_problem,
    prompt_texts,
)
from tests.support.fake_server import FakeServer

WORD = re.compile(r"[^\W_]+")
REPO = Path(__file__).resolve().parents[1]
POOLS = yaml.safe_load((REPO / "conf" / "pools" / "default.yaml").read_text("utf-8"))

SEED: dict[str, Any] = {
    "id": "ts-000001",
    "split": "train",
    "protagonist": "a little girl named Mia",
    "theme": "friendship",
    "required": ["fishing net", "red kite"],
    "banned": ["dragon"],
    "min_sentences": 3,
    "max_sentences": 6,
}
INSTRUCTION = render_instruction(SEED)
CHECKS = SeedChecks.from_seed(SEED)
STORY = (
    "Once upon a time there was a little girl named Mia. Mia found a fishing net by the sea. "
    "She used it to catch her red kite from a tree. Her friend Sam clapped. They went home happy."
)


def _repair_turn(output: str, labels: tuple[str, ...], **found: Any) -> str:
    context = repair_context(SEED, CHECKS, output, labels, attempt=1, **found)
    return RepairRenderer.load(None)(context)


REPAIR = _repair_turn("The end.", ("missing_required", "wrong_sentence_count"))
PROMPTS = prompt_texts(
    [
        {"role": "system", "content": "You write gentle stories for small children."},
        {"role": "user", "content": INSTRUCTION},
    ],
    REPAIR,
)


@pytest.mark.parametrize(
    ("answer", "source", "words"),
    [
        pytest.param(STORY, None, 0, id="a story sharing the protagonist and phrases"),
        pytest.param("reply to: " + INSTRUCTION, "the instruction", 30, id="the whole instruction"),
        pytest.param(
            STORY[:-1] + ", and must include all of these exact phrases.",
            "the instruction",
            7,
            id="seven words are under the rule",
        ),
        pytest.param(
            STORY[:-1] + " and must include all of these exact phrases (case-insensitive match).",
            "the instruction",
            10,
            id="a line of the instruction inside a story",
        ),
        pytest.param(
            "I'll work on that for you. " + REPAIR, "the repair turn", 20, id="the whole repair turn"
        ),
        pytest.param(
            STORY + " Write the whole story again so that it follows every constraint.",
            "the repair turn",
            11,
            id="the repair turn's last line after a story",
        ),
        pytest.param(
            "Your story has 1 sentence; it must have 3 to 6. It does not contain fishing net.",
            "the repair turn",
            10,
            id="the repair turn's findings",
        ),
        pytest.param(
            "You write gentle stories for small children, said Mia.",
            "the system message",
            7,
            id="the system message",
        ),
        pytest.param("FISHING NET, red kite!", None, 0, id="required phrases alone"),
    ],
)
def test_echo_rule(answer: str, source: str | None, words: int) -> None:
    """find_echo reports the longest repeated run and its text; runs under the rule are no echo."""
    echo = find_echo(answer, PROMPTS, words=ECHO_WORDS, phrases=SEED["required"])
    if source is None or words < ECHO_WORDS:
        assert echo is None
        return
    assert echo is not None
    assert echo.source == source
    assert echo.words >= words
    reason = echo.reason(answer)
    assert reason.startswith(f'repeats {echo.words} words of {source}: "')
    quoted = reason.split(': "', 1)[1].rstrip('"')
    assert quoted.split(" ... ")[0] in " ".join(answer.split())


def test_a_long_required_phrase_is_never_an_echo() -> None:
    """A required phrase longer than the rule is asked for, so its words never make an echo."""
    seed = {**SEED, "required": ["a big red boat with a tall white sail on it"]}
    instruction = render_instruction(seed)
    story = "Mia saw a big red boat with a tall white sail on it. It was lovely. She waved. They sailed."
    prompts = prompt_texts([{"role": "user", "content": instruction}])
    assert find_echo(story, prompts, phrases=seed["required"]) is None
    assert find_echo(story, prompts, phrases=()) is not None  # without the mask it would be one


@pytest.mark.parametrize(
    ("finish", "max_tokens", "reason"),
    [
        (None, 512, None),
        ("stop", 512, None),
        ("eos", None, None),
        ("length", 512, "cut off at max_tokens=512"),
        ("length", None, "cut off at the token limit (finish_reason 'length')"),
        ("content_filter", 512, "ended with finish_reason 'content_filter', not a normal stop"),
    ],
)
def test_finish_reasons(finish: str | None, max_tokens: int | None, reason: str | None) -> None:
    """A passing story fails with label other when it did not end with a normal stop."""
    assert finish_problem(finish, max_tokens=max_tokens) == reason
    result = check_answer(CHECKS, STORY, finish_reason=finish, max_tokens=max_tokens)
    if reason is None:
        assert result.passed
    else:
        assert not result.passed
        assert result.labels == ("other",)
        assert result.reasons == (reason,)


def test_failures_keep_their_labels_and_add_other() -> None:
    result = check_answer(CHECKS, "reply to: " + INSTRUCTION, prompts=PROMPTS, finish_reason="length")
    assert result.labels[-1] == "other" and len(result.labels) > 1
    assert result.reasons[-2] == "cut off at the token limit (finish_reason 'length')"
    assert result.reasons[-1].startswith("repeats ")


def test_echo_words_zero_turns_the_check_off() -> None:
    assert check_answer(CHECKS, STORY + " " + REPAIR, prompts=PROMPTS, echo_words=0).labels != ("other",)
    assert find_echo("reply to: " + INSTRUCTION, PROMPTS, words=0) is None


def test_long_inputs_stay_bounded() -> None:
    """Answers and prompts past MAX_WORDS are read up to it; the work stays linear."""
    prompt = " ".join(f"w{i}" for i in range(3 * MAX_WORDS))
    answer = " ".join(f"w{i}" for i in range(MAX_WORDS - 20, 3 * MAX_WORDS))
    echo = find_echo(answer, [("the instruction", prompt)], words=8)
    assert echo is not None and echo.words == 20  # only the first MAX_WORDS of each side count


# -- properties ---------------------------------------------------------------------------------

seeds = st.builds(
    lambda hero, theme, required, banned, low, extra: {
        "id": "ts-000002",
        "split": "train",
        "protagonist": hero,
        "theme": theme,
        "required": required,
        "banned": banned,
        "min_sentences": low,
        "max_sentences": low + extra,
    },
    st.sampled_from(POOLS["protagonists"]),
    st.sampled_from(sorted(THEME_SET)),
    st.lists(st.sampled_from(POOLS["objects"]), min_size=2, max_size=4, unique=True),
    st.lists(st.sampled_from(POOLS["banned"]), max_size=2, unique=True),
    st.integers(3, 6),
    st.integers(0, 3),
)


@settings(max_examples=150, deadline=None)
@given(seed=seeds, data=st.data())
def test_every_copied_run_of_the_instruction_or_repair_turn_is_caught(
    seed: dict[str, Any], data: Any
) -> None:
    """Any run of ECHO_WORDS or more consecutive words of the instruction or of the repair turn,
    put anywhere in a story, is an echo of at least that length, whatever the phrases."""
    checks = SeedChecks.from_seed(seed)
    repair = RepairRenderer.load(None)(
        repair_context(seed, checks, "The end.", ("missing_required", "wrong_sentence_count"), attempt=1)
    )
    prompts = prompt_texts([{"role": "user", "content": render_instruction(seed)}], repair)
    name, text = data.draw(st.sampled_from(prompts))
    words = text.split()
    masked = {w.lower() for phrase in seed["required"] for w in phrase.split()}
    # A run of plain words (no phrase word in it, as the rule masks those), ECHO_WORDS or more.
    runs = [
        (i, j)
        for i in range(len(words))
        for j in range(i + ECHO_WORDS, min(len(words), i + 3 * ECHO_WORDS) + 1)
        if len(WORD.findall(" ".join(words[i:j]))) >= ECHO_WORDS
        and not any(w.lower() in masked for w in WORD.findall(" ".join(words[i:j])))
    ]
    if not runs:
        return
    i, j = data.draw(st.sampled_from(runs))
    copied = " ".join(words[i:j])
    cut = data.draw(st.integers(0, len(STORY)))
    space = STORY.rfind(" ", 0, cut) + 1
    answer = STORY[:space] + copied + " " + STORY[space:]
    echo = find_echo(answer, prompts, phrases=seed["required"])
    assert echo is not None, (name, copied)
    assert echo.words >= len(WORD.findall(copied))


@pytest.fixture(scope="module")
def story_server() -> Iterator[FakeServer]:
    with FakeServer() as server:
        yield server


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=seeds, number=st.integers(0, 2**31))
def test_the_fake_servers_stories_are_never_echoes(
    story_server: FakeServer, seed: dict[str, Any], number: int
) -> None:
    """No false rejection: the story mode's stories (first answers and answers to a repair turn,
    over HTTP) are never echoes of their instruction or repair turn."""
    import http.client

    instruction = render_instruction(seed)
    checks = SeedChecks.from_seed(seed)
    repair = RepairRenderer.load(None)(
        repair_context(seed, checks, "The end.", ("missing_required", "wrong_sentence_count"), attempt=1)
    )
    for messages, turn in (
        ([{"role": "user", "content": instruction}], None),
        (
            [
                {"role": "user", "content": instruction},
                {"role": "assistant", "content": "The end."},
                {"role": "user", "content": repair},
            ],
            repair,
        ),
    ):
        conn = http.client.HTTPConnection("127.0.0.1", story_server.port, timeout=5)
        try:
            body = json.dumps({"model": "m", "seed": number, "messages": messages})
            conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            story = json.loads(conn.getresponse().read())["choices"][0]["message"]["content"]
        finally:
            conn.close()
        prompts = prompt_texts(messages[:1], turn)
        assert find_echo(story, prompts, phrases=seed["required"]) is None, story


@given(st.text(max_size=120) | st.text(alphabet=st.characters(max_codepoint=127), max_size=120))
def test_words_are_the_patterns_words_lowered(text: str) -> None:
    """The ASCII fast path and the general one split as the word pattern does, one for one."""
    from storyforge.tasks.tinystories.echo import _WORD, _words

    assert _words(text) == [w.lower() for w in _WORD.findall(text)]
    assert len(_words(text)) == len(list(_WORD.finditer(text)))


def _windows_one_by_one(
    prompts: tuple[tuple[str, str], ...], phrases: tuple[str, ...], words: int
) -> tuple[dict[int, int], frozenset[str]]:
    """The prompt side as defined: in each prompt, every occurrence of a phrase (phrase by
    phrase, left to right) becomes breaks; every ``words``-word window without a break is a
    run, named by the first prompt holding it; its words are the vocabulary."""
    from storyforge.tasks.tinystories.echo import _BREAK, _words

    runs: dict[int, int] = {}
    vocabulary: set[str] = set()
    masks = [tuple(_words(phrase)) for phrase in phrases if _words(phrase)]
    for index, (_, text) in enumerate(prompts):
        tokens = _words(text)
        for mask in masks:
            for start in range(len(tokens) - len(mask) + 1):
                if tuple(tokens[start : start + len(mask)]) == mask:
                    tokens[start : start + len(mask)] = [_BREAK] * len(mask)
        for start in range(len(tokens) - words + 1):
            window = tuple(tokens[start : start + words])
            if _BREAK not in window:
                runs.setdefault(hash(window), index)
                vocabulary.update(window)
    return runs, frozenset(vocabulary)


_FEW_WORDS = st.lists(st.sampled_from(["a", "b", "c", "Dé", "b-a"]), max_size=14).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["the instruction", "the repair turn"]), _FEW_WORDS), max_size=4),
    st.lists(_FEW_WORDS, max_size=3),
    st.integers(min_value=1, max_value=4),
)
def test_the_prompt_side_is_every_window_read_one_by_one(
    prompts: list[tuple[str, str]], phrases: list[str], words: int
) -> None:
    """Few words, so windows repeat across prompts, phrases overlap and repeat, and breaks
    fall anywhere: the runs and vocabulary are those of a window-by-window reading."""
    from storyforge.tasks.tinystories.echo import _prompt_grams

    grams = _prompt_grams(tuple(prompts), tuple(phrases), words)
    assert (grams.runs, grams.vocabulary) == _windows_one_by_one(tuple(prompts), tuple(phrases), words)
