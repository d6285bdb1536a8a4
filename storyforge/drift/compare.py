"""One example, two renderings: identical, or the first divergence, classified.

Takes: an :class:`~storyforge.drift.examples.Example`, its training and serving
:class:`~storyforge.drift.sides.Rendering` and the two sides (for BOS/EOS ids and
decoding). Gives: :func:`compare` -> a tuple of :class:`Finding` (empty when the model sees
at serving time exactly what it was trained on), and :data:`KINDS`, what each kind means.

Why classify: "token 17 differs" sends people into a hex dump; "whitespace around a role
marker" or "double BOS" names the fix. The kinds are decided from the ids at the divergence
and from the two texts around it, most specific first; what fits none is ``other``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from storyforge.drift.examples import Example
from storyforge.drift.sides import Rendering, Side

__all__ = ["KINDS", "SPECIAL", "Finding", "compare", "special_tokens"]

KINDS = {
    "template_error": "a side could not render the conversation at all",
    "bos": "extra or missing BOS token (double BOS when rendered text is tokenized with special tokens again)",
    "eos": "the answer ends on a different end-of-turn token than generation stops on, or an extra EOS",
    "generation_prompt": "the generation prompt (the assistant header) is missing or extra",
    "turns_merged": "consecutive turns of one role merged into one",
    "system_dropped": "the system message is not in the serving prompt",
    "system_duplicated": "the system message appears more often when serving",
    "system_merged": "the system message merged into another turn",
    "system_changed": "serving uses another system message",
    "default_system": "a template injects a system prompt the example does not have",
    "whitespace": "whitespace or newlines differ (around a role marker where one is near)",
    "tokenization": "the same text, split into different token ids (the vocabularies differ)",
    "context": "the serving prompt is longer than the serving context (the front would be cut)",
    "other": "the texts differ in a way none of the kinds above describes",
    "special_tokens": "the training tokenizer's BOS/EOS ids or add-BOS flag differ from the serving side's",
}
#: The kind of a finding about the two tokenizers rather than one example.
SPECIAL = "special_tokens"
CONTEXT = 4  # tokens shown on each side of a divergence
_SPECIAL = re.compile(r"<\|[^|<>]{1,40}\|>|<s>|</s>|\[/?INST\]|<start_of_turn>|<end_of_turn>")


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """One way an example drifts on one serving side."""

    example: str
    where: str
    side: str
    kind: str
    detail: str
    index: int | None = None
    training_ids: tuple[int, ...] = ()
    serving_ids: tuple[int, ...] = ()
    training_text: str = ""
    serving_text: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            **asdict(self),
            "training_ids": list(self.training_ids),
            "serving_ids": list(self.serving_ids),
        }

    def format(self) -> str:
        lines = [f"{self.where}: {self.side}: {self.kind}: {self.detail}"]
        if self.index is not None:
            lines.append(f"    at token {self.index}")
            lines.append(f"    training ids {list(self.training_ids)}  {self.training_text}")
            lines.append(f"    serving  ids {list(self.serving_ids)}  {self.serving_text}")
        return "\n".join(lines)


def special_tokens(training: Side, serving: Side, *, where: str) -> Finding | None:
    """A finding when the training tokenizer's special tokens differ from what ``serving``
    uses (each compared only where the serving side knows it): the EOS id, whether a BOS is
    added, and the BOS id when either side adds one. ``where`` names the training tokenizer."""
    problems = []

    def name(side: Side, token: int | None) -> str:
        return "none" if token is None else f"{token} {side.piece(token)!r}"

    if serving.eos_id is not None and training.eos_id != serving.eos_id:
        problems.append(
            f"EOS: training {name(training, training.eos_id)}, serving {name(serving, serving.eos_id)}"
        )
    if serving.add_bos is not None and training.add_bos is not None and training.add_bos != serving.add_bos:
        problems.append(
            f"BOS added: training {'yes' if training.add_bos else 'no'}, serving {'yes' if serving.add_bos else 'no'}"
        )
    adds = bool(training.add_bos) or bool(serving.add_bos)
    if adds and serving.bos_id is not None and training.bos_id != serving.bos_id:
        problems.append(
            f"BOS: training {name(training, training.bos_id)}, serving {name(serving, serving.bos_id)}"
        )
    if not problems:
        return None
    return Finding(
        example="special tokens", where=where, side=serving.name, kind=SPECIAL, detail="; ".join(problems)
    )


def _leading(ids: Sequence[int], token: int | None) -> int:
    count = 0
    while token is not None and count < len(ids) and ids[count] == token:
        count += 1
    return count


def _roles_outside_content(text: str, contents: Sequence[str], word: str) -> int:
    return text.count(word) - sum(c.count(word) for c in contents)


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _near_marker(text: str, position: int) -> bool:
    window = text[max(0, position - 24) : position + 24]
    return bool(_SPECIAL.search(window)) or any(r in window for r in ("system", "user", "assistant"))


def _accepted_tail(tail: Sequence[int], training: Side, serving: Side, example: Example) -> bool:
    """Training tokens after the serving sequence that serving never reaches: whitespace after
    the stop token, or (when the server names no stop token) the end-of-turn and whitespace."""
    if not example.training:
        return not tail
    rest = list(tail)
    if not serving.end_ids and rest and rest[0] in training.end_ids:
        rest = rest[1:]
    return not training.decode(rest).strip()


def compare(
    example: Example,
    trained: Rendering,
    served: Rendering,
    *,
    training: Side,
    serving: Side,
    training_prompts: Callable[[Example], tuple[str, str]],
) -> tuple[Finding, ...]:
    """The findings for ``example`` on ``serving`` (empty when nothing drifts).

    ``training_prompts(example)`` gives the training template's rendering of the prompt turns
    with and without the generation prompt; it is only called to classify a divergence.
    """
    found: list[Finding] = []

    def add(kind: str, detail: str, index: int | None = None) -> None:
        window: dict[str, object] = {}
        if index is not None:
            lo = max(0, index - CONTEXT)
            t_ids, s_ids = trained.ids[lo : index + CONTEXT + 1], served.ids[lo : index + CONTEXT + 1]
            window = {
                "training_ids": tuple(t_ids),
                "serving_ids": tuple(s_ids),
                "training_text": _pieces(training, trained.ids, lo, index),
                "serving_text": _pieces(serving, served.ids, lo, index),
            }
        found.append(
            Finding(
                example=example.id,
                where=example.where,
                side=serving.name,
                kind=kind,
                detail=detail,
                index=index,
                **window,  # type: ignore[arg-type]
            )
        )

    if trained.error or served.error:
        add("template_error", trained.error and f"training: {trained.error}" or f"serving: {served.error}")
        return tuple(found)
    t_ids, s_ids = trained.ids, served.ids
    if serving.n_ctx is not None and len(s_ids) > serving.n_ctx:
        add("context", f"{len(s_ids)} serving tokens, context {serving.n_ctx}: the front would be cut")
    if s_ids == t_ids[: len(s_ids)] and _accepted_tail(t_ids[len(s_ids) :], training, serving, example):
        return tuple(found)
    index = next(
        (i for i, (a, b) in enumerate(zip(t_ids, s_ids, strict=False)) if a != b), min(len(t_ids), len(s_ids))
    )
    kind, detail = _classify(example, trained, served, training, serving, training_prompts, index)
    add(kind, detail, index)
    return tuple(found)


def _classify(
    example: Example,
    trained: Rendering,
    served: Rendering,
    training: Side,
    serving: Side,
    training_prompts: Callable[[Example], tuple[str, str]],
    index: int,
) -> tuple[str, str]:
    t_ids, s_ids = trained.ids, served.ids
    t_bos, s_bos = _leading(t_ids, training.bos_id), _leading(s_ids, serving.bos_id)
    if t_bos != s_bos and index <= max(t_bos, s_bos):
        double = " (double BOS)" if max(t_bos, s_bos) > 1 else ""
        return "bos", f"training starts with {t_bos} BOS token(s), serving with {s_bos}{double}"
    with_gen, without_gen = training_prompts(example)
    answer = example.answer or ""
    s_text = served.text
    if not s_text and s_ids:
        # a side that returns ids only (vLLM's /tokenize): compare texts as the training
        # tokenizer decodes them, on both sides
        encode = getattr(training, "encode", None)
        if encode is not None:
            with_gen, without_gen = (training.decode(ids) for ids in encode([with_gen, without_gen]))
            answer = training.decode(encode([answer])[0]).lstrip() if answer else ""
        ended = example.training and s_ids[-1] in serving.end_ids
        s_text = training.decode(s_ids[:-1] if ended else s_ids)
    t_text = with_gen + answer  # the training text up to the end of the answer
    if example.training and index >= len(s_ids) - 1 and s_text == t_text:
        what = training.piece(t_ids[index]) if index < len(t_ids) else "nothing"
        stop = serving.piece(s_ids[index]) if index < len(s_ids) else "nothing"
        return "eos", f"training ends the answer with {what!r}, serving stops on {stop!r}"
    if not example.training and s_text == t_text and len(s_ids) != len(t_ids):
        return "eos", f"serving adds {len(s_ids) - len(t_ids)} token(s) after the prompt (an EOS)"
    if with_gen != without_gen and s_text in (without_gen + answer, without_gen.rstrip() + answer):
        return "generation_prompt", f"serving has no generation prompt ({with_gen[len(without_gen) :]!r})"
    messages = example.messages
    for first, second in itertools.pairwise(messages):
        if first.role == second.role:
            joined = first.content + "\n\n" + second.content
            if joined in s_text and joined not in t_text:
                return "turns_merged", f"two {first.role} turns served as one, joined by a blank line"
    contents = [m.content for m in messages]
    t_roles = _roles_outside_content(t_text, contents, "system")
    s_roles = _roles_outside_content(s_text, contents, "system")
    systems = [m.content for m in messages if m.role == "system"]
    if systems:
        system = systems[0]
        t_count, s_count = t_text.count(system), s_text.count(system)
        if s_count > t_count:
            return (
                "system_duplicated",
                f"the system message appears {s_count} times when serving, {t_count} in training",
            )
        if s_count < t_count:
            if s_roles >= t_roles > 0:
                return "system_changed", "serving uses another system message than training"
            return "system_dropped", "the system message is missing from the serving prompt"
        firsts = [m.content for m in messages if m.role == "user"][:1]
        if firsts and (system + "\n\n" + firsts[0]) in s_text and (system + "\n\n" + firsts[0]) not in t_text:
            return "system_merged", "the system message is served inside the first user turn"
    if s_roles != t_roles:
        where = "serving" if s_roles > t_roles else "training"
        return "default_system", f"the {where} template adds a system message the example does not have"
    if _squash(s_text) == _squash(t_text):
        position = next((i for i, (a, b) in enumerate(zip(t_text, s_text, strict=False)) if a != b), 0)
        around = " around a role marker" if _near_marker(t_text, position) else ""
        return "whitespace", (
            f"whitespace differs{around}: training {t_text[max(0, position - 12) : position + 12]!r}, "
            f"serving {s_text[max(0, position - 12) : position + 12]!r}"
        )
    if s_text == t_text:
        return "tokenization", "the same text, split into different token ids"
    return "other", "the texts differ"


def _pieces(side: Side, ids: Sequence[int], lo: int, index: int) -> str:
    """``'a' 'b' | 'c' …``: decoded pieces around the divergence, a bar before token ``index``."""
    shown = []
    for position in range(lo, min(len(ids), index + CONTEXT + 1)):
        if position == index:
            shown.append("|")
        shown.append(repr(side.piece(ids[position])))
    if index >= len(ids):
        shown.append("| (end)")
    return " ".join(shown)
