"""What one side renders: the shared shape of the training side and every serving side.

Takes: nothing. Gives: :class:`Rendering` (one example's text and token ids on one side) and
:class:`Side`, the protocol each side implements: render a batch of examples, decode ids
for the report, name its end-of-turn tokens and its context limit.

Why: the comparison (:mod:`storyforge.drift.compare`) and the report do not care which
program produced the tokens, only what the model would see.

The serving shape of a training row is the evaluation prompt, then the answer as the model
would generate it, then the token generation stops on: that is what training taught. Training
text after that stop token (ChatML's newline after ``<|im_end|>``) is never reached when
serving and is not compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from storyforge.drift.examples import Example

__all__ = ["Rendering", "Side"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Rendering:
    """One example on one side: the text the template made and its token ids."""

    text: str
    ids: tuple[int, ...]
    error: str | None = None


class Side(Protocol):
    """A renderer of conversations into token ids (training, or one way of serving)."""

    name: str
    #: ids generation stops on (serving) or ends a turn with (training)
    end_ids: frozenset[int]
    bos_id: int | None
    #: the EOS token's id and whether a BOS is added to a prompt, as far as the side knows them
    #: (compared with the training tokenizer's, :func:`storyforge.drift.compare.special_tokens`)
    eos_id: int | None
    add_bos: bool | None
    #: the context a request must fit in, when the side has one
    n_ctx: int | None

    def render(self, examples: Sequence[Example]) -> list[Rendering]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def piece(self, token_id: int) -> str: ...
