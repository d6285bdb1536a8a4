"""The ``turn_generation`` task kind: write the next turn of a multi-character story.

Takes: a :class:`TurnGenerationContext` (turn history, character roster, the acting
character, the current intent, summaries of earlier chapters, globals, and the ``model`` the
runner adds). Gives: the registered :data:`TASK` whose sources are ``turns``, ``characters``,
``actor``, ``intent`` (also ``currentIntent``, its name in the original StoryForge),
``chapterSummaries`` and ``globals``; :func:`sample_context`, a deterministic story of any
length for demos, golden tests and benchmarks.

Why: templates name sources, never context fields, so a template written for this task runs
against any context that honours this contract. Each source is one row of a
:class:`~storyforge.engine.sources.SourceTable`: its argument rules (:class:`~storyforge.engine.sources.ArgRule`)
write the ``SourceSpec.args`` text authors read, drive the lint-time check
(``TaskKind.check_args``) and make the handler raise at render time, which the engine turns
into a warning and absent data. The turn, character and summary rule tables and selectors
are shared with the other narrative task kinds.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NotRequired, TypedDict

from storyforge.engine.sources import (
    BOOL,
    INDEX,
    ORDER,
    POSITIVE_INT,
    STR_LIST,
    ArgRule,
    ContextSource,
    SourceTable,
    one_of,
    read_field,
    read_list,
)
from storyforge.tasks.base import register_table_kind

__all__ = [
    "CHARACTER_RULES",
    "RULES",
    "SOURCES",
    "SOURCE_TABLE",
    "SUMMARIES_SOURCE",
    "SUMMARY_RULES",
    "TASK",
    "TURNS_SOURCE",
    "TURN_RULES",
    "ChapterSummary",
    "Character",
    "Intent",
    "ModelInfo",
    "Turn",
    "TurnGenerationContext",
    "TurnGenerationGlobals",
    "make_registry",
    "sample_context",
    "select_characters",
    "select_summaries",
    "select_turns",
]


# --- context contract -------------------------------------------------------------------


class Turn(TypedDict):
    """One turn of the story, as the history lists it (oldest first)."""

    turnNo: int
    chapterNumber: NotRequired[int]
    authorName: str
    authorType: Literal["character", "narrator"]
    content: str


class Character(TypedDict):
    """One character card of the roster."""

    id: str
    name: str
    description: str
    examples: NotRequired[list[str]]


class Intent(TypedDict):
    """What the player asked for this turn (``continue_story``, ``guided_control``, ...)."""

    kind: str
    prompt: NotRequired[str]
    constraint: NotRequired[str]


class ChapterSummary(TypedDict):
    """The summary of one finished chapter."""

    chapterNumber: int
    title: NotRequired[str | None]
    summaryText: str


class ModelInfo(TypedDict):
    """Added by the runner before rendering so templates can branch on the model.

    ``provider`` is the provider config's name (``none``, ``openai``, ``ollama``), ``name``
    the model; ``prefill`` is false when the provider cannot continue an assistant prefix.
    """

    provider: str
    name: str | None
    prefill: NotRequired[bool]


class TurnGenerationGlobals(TypedDict, total=False):
    """Scalars reachable as ``{{globals.x}}`` and, through the globals fallback, as ``{{x}}``.

    ``char`` is the acting character's name and ``user`` the player's character (the
    SillyTavern macro names, so imported cards work unchanged).
    """

    storyTitle: str
    setting: str
    char: str
    user: str
    isNarratorTurn: bool


class TurnGenerationContext(TypedDict):
    """Everything a turn-generation render may read."""

    turns: list[Turn]
    characters: list[Character]
    actor: Character
    currentIntent: NotRequired[Intent | None]
    chapterSummaries: NotRequired[list[ChapterSummary]]
    nextTurnNumber: NotRequired[int]
    globals: TurnGenerationGlobals
    model: NotRequired[ModelInfo]


# --- selectors ----------------------------------------------------------------------------

TURN_RULES: Mapping[str, ArgRule] = {
    "order": ORDER,
    "limit": POSITIVE_INT,
    "start": INDEX,
    "end": INDEX,
    "chapter": POSITIVE_INT,
    "authorType": one_of("character", "narrator"),
}
CHARACTER_RULES: Mapping[str, ArgRule] = {
    "order": ORDER,
    "limit": POSITIVE_INT,
    "ids": STR_LIST,
    "exclude_current": BOOL,
}
SUMMARY_RULES: Mapping[str, ArgRule] = {"order": ORDER, "limit": POSITIVE_INT}


def select_turns(turns: Sequence[Any], args: Mapping[str, Any]) -> list[Any]:
    """Filter, slice, order and limit a chronological turn list.

    Steps, in order: keep ``chapter`` / ``authorType`` matches; keep positions ``start`` to
    ``end`` inclusive (negative positions count from the end); order ``desc`` (default,
    newest first) or ``asc``; keep the first ``limit``.
    """
    items = list(turns)
    if "chapter" in args:
        items = [t for t in items if isinstance(t, Mapping) and t.get("chapterNumber") == args["chapter"]]
    if "authorType" in args:
        items = [t for t in items if isinstance(t, Mapping) and t.get("authorType") == args["authorType"]]
    if "start" in args or "end" in args:
        n = len(items)
        start = int(args.get("start", 0))
        end = int(args.get("end", n - 1))
        lo = start + n if start < 0 else start
        hi = end + n if end < 0 else end
        items = items[max(0, lo) : max(0, min(n, hi + 1))]
    if args.get("order", "desc") == "desc":
        items.reverse()
    if "limit" in args:
        items = items[: args["limit"]]
    return items


def select_characters(
    characters: Sequence[Any], args: Mapping[str, Any], *, current_id: Any = None
) -> list[Any]:
    """Keep ``ids`` (in roster order), drop the actor with ``exclude_current``, order, limit."""
    items = list(characters)
    if "ids" in args:
        wanted = set(args["ids"])
        items = [c for c in items if isinstance(c, Mapping) and c.get("id") in wanted]
    if args.get("exclude_current") and current_id is not None:
        items = [c for c in items if not (isinstance(c, Mapping) and c.get("id") == current_id)]
    if args.get("order", "asc") == "desc":
        items.reverse()
    if "limit" in args:
        items = items[: args["limit"]]
    return items


def _chapter_number(summary: Any) -> float | None:
    if summary.__class__ is dict or isinstance(summary, Mapping):
        number: Any = summary.get("chapterNumber")
        cls = number.__class__
        if cls is int or cls is float or (isinstance(number, int | float) and cls is not bool):
            return float(number)
    return None


def _first(pair: tuple[float, Any]) -> float:
    return pair[0]


def select_summaries(summaries: Sequence[Any], args: Mapping[str, Any]) -> list[Any]:
    """Sort chapter summaries by ``chapterNumber`` (``desc`` by default, newest first), limit.

    Summaries without a number keep their order after the numbered ones.
    """
    numbered: list[tuple[float, Any]] = []
    rest: list[Any] = []
    for summary in summaries:  # each summary's number read once
        number = _chapter_number(summary)
        if number is None:
            rest.append(summary)
        else:
            numbered.append((number, summary))
    numbered.sort(key=_first, reverse=args.get("order", "desc") == "desc")
    items = [summary for _, summary in numbered] + rest
    if "limit" in args:
        items = items[: args["limit"]]
    return items


# --- sources and registry ------------------------------------------------------------------


def _actor_id(ctx: Mapping[str, Any]) -> Any:
    actor = ctx.get("actor")
    return actor.get("id") if isinstance(actor, Mapping) else None


_roster = read_list("characters")


def _characters(ctx: Mapping[str, Any], args: Mapping[str, Any]) -> list[Any]:
    return select_characters(_roster(ctx, args), args, current_id=_actor_id(ctx))


TURNS_SOURCE = ContextSource(
    name="turns",
    returns="list[Turn]",
    rules=TURN_RULES,
    select=read_list("turns", select_turns),
    description="The turn history; newest first unless order is 'asc'.",
)
"""The ``turns`` source; other narrative kinds reuse it with their own description."""

SUMMARIES_SOURCE = ContextSource(
    name="chapterSummaries",
    returns="list[ChapterSummary]",
    rules=SUMMARY_RULES,
    select=read_list("chapterSummaries", select_summaries),
    description="Summaries of earlier chapters; newest first unless order is 'asc'.",
)
"""The ``chapterSummaries`` source; other narrative kinds reuse it with their own description."""

SOURCE_TABLE = SourceTable(
    TURNS_SOURCE,
    ContextSource(
        name="characters",
        returns="list[Character]",
        rules=CHARACTER_RULES,
        select=_characters,
        description="The character roster in roster order; exclude_current drops the actor.",
    ),
    ContextSource(name="actor", returns="Character | None", description="The character writing this turn."),
    ContextSource(
        name="intent",
        returns="Intent | None",
        select=read_field("currentIntent"),
        description="What the player asked for this turn.",
    ),
    ContextSource(
        name="currentIntent",
        returns="Intent | None",
        description="Same as 'intent' (the name used by the original StoryForge).",
    ),
    SUMMARIES_SOURCE,
    ContextSource(name="globals", returns="TurnGenerationGlobals", description="Story-wide scalars."),
)
SOURCES = SOURCE_TABLE.specs
RULES = SOURCE_TABLE.rules
make_registry = SOURCE_TABLE.registry_for
"""The registry for a turn-generation context (handlers read the ctx they are given)."""


TASK = register_table_kind(
    "turn_generation",
    TurnGenerationContext,
    SOURCE_TABLE,
    "Write the next turn of a multi-character story as the acting character.",
)


# --- deterministic sample story ------------------------------------------------------------

_ROSTER: tuple[Character, ...] = (
    {
        "id": "mira",
        "name": "Mira Vance",
        "description": "Captain of the salvage skiff Kestrel. Dry-humoured, reckless with her own "
        "safety and careful with everyone else's. Owes money to the wrong people.",
        "examples": [
            "\"If it's bolted down, it's salvage. If it's moving, it's a problem.\"",
            '"Nobody touches the reactor. Nobody. Tobin, put the wrench down."',
        ],
    },
    {
        "id": "tobin",
        "name": "Tobin Reyes",
        "description": "The Kestrel's engineer. Talks to machines more kindly than to people, "
        "counts everything twice, and keeps a list of every promise Mira has broken.",
        "examples": ['"The coupling is fine. The coupling is never fine. Give me ten minutes."'],
    },
    {
        "id": "ashe",
        "name": "Ashe",
        "description": "An android navigator salvaged from a wreck two years ago. Literal-minded, "
        "curious about human jokes, and missing a block of memory it would rather not discuss.",
        "examples": ['"I have plotted three courses. Two of them end in fire. I recommend the third."'],
    },
)

_PLACES = (
    "the cargo bay",
    "the bridge",
    "the airlock",
    "the galley",
    "the engine room",
    "the observation deck",
)
_THINGS = (
    "a cracked data core",
    "a crate stamped with a navy seal",
    "a flickering distress beacon",
    "a coil of scorched cable",
    "a sealed medical kit",
    "a map etched on brass",
)
_MOODS = ("quietly", "with a grin", "without looking up", "sharply", "after a long pause", "in a low voice")
_NARRATION = (
    "The hull groaned as the Kestrel drifted past {place_a} of the derelict.",
    "Somewhere below, {thing} began to hum.",
    "Warning lights rippled across {place_a} and settled into a steady amber.",
    "The old station's gravity stuttered, and loose bolts rolled toward {place_a}.",
)
_LINES = (
    '"We should check {place_a} before anyone else does," {name} said {mood}.',
    '{name} held up {thing}. "This wasn\'t on the manifest."',
    '"I don\'t like how quiet {place_a} is," {name} muttered {mood}.',
    "{name} wedged {thing} under one arm and headed for {place_b}.",
    '"Give me a reason to trust you," {name} said {mood}, eyes on {place_b}.',
)
_CHAPTER_TURNS = 40


def sample_context(*, turns: int = 200, seed: int = 7, actor: str = "mira") -> TurnGenerationContext:
    """A deterministic salvage-crew story with ``turns`` turns (same arguments, same bytes).

    Chapters are 40 turns long; every finished chapter has a summary. Used by
    ``conf/context/turn_generation_long.json`` and by the budget golden tests.
    """
    if turns < 0:
        raise ValueError(f"turns must be >= 0, got {turns}")
    ids = [c["id"] for c in _ROSTER]
    if actor not in ids:
        raise ValueError(f"actor must be one of {', '.join(ids)}, got {actor!r}")
    rng = random.Random(seed)
    history: list[Turn] = []
    for number in range(1, turns + 1):
        words = {
            "place_a": rng.choice(_PLACES),
            "place_b": rng.choice(_PLACES),
            "thing": rng.choice(_THINGS),
            "mood": rng.choice(_MOODS),
        }
        chapter = (number - 1) // _CHAPTER_TURNS + 1
        author_type: Literal["character", "narrator"]
        if rng.random() < 0.2:
            author, author_type = "Narrator", "narrator"
            content = rng.choice(_NARRATION).format(**words)
        else:
            speaker = rng.choice(_ROSTER)
            author, author_type = speaker["name"], "character"
            content = rng.choice(_LINES).format(name=speaker["name"].split()[0], **words)
        history.append(
            {
                "turnNo": number,
                "chapterNumber": chapter,
                "authorName": author,
                "authorType": author_type,
                "content": content,
            }
        )
    current_chapter = turns // _CHAPTER_TURNS + 1
    summaries: list[ChapterSummary] = [
        {
            "chapterNumber": n,
            "title": f"Chapter {n}",
            "summaryText": f"The crew worked through deck {n} of the derelict station, argued over "
            f"{_THINGS[n % len(_THINGS)]}, and found the next sealed door.",
        }
        for n in range(1, current_chapter)
    ]
    roster = copy.deepcopy(list(_ROSTER))
    actor_card = next(c for c in roster if c["id"] == actor)
    return {
        "turns": history,
        "characters": roster,
        "actor": actor_card,
        "currentIntent": {
            "kind": "guided_control",
            "prompt": f"{actor_card['name']} decides whether to open the sealed door.",
        },
        "chapterSummaries": summaries,
        "nextTurnNumber": turns + 1,
        "globals": {
            "storyTitle": "The Kestrel Salvage",
            "setting": "A derelict research station adrift in the Halcyon belt.",
            "char": actor_card["name"],
            "user": "Tobin Reyes",
            "isNarratorTurn": False,
        },
    }
