"""Budget feasibility: will the fixed part of the layout fit what the slots leave?

Takes: a frozen template model and a global budget (and optionally an estimator). Gives:
:func:`check_budget`, a tuple of :class:`~storyforge.engine.errors.Issue` (code
``budget_feasibility``) that the renderer logs once, before rendering, for each template and
budget it meets, and that ``storyforge render`` prints.

Why: slots are filled first and layout messages, headers and footers get what is left
(reference-semantics §9.2, kept on purpose), so a template whose slots may use the whole
budget can silently lose its system prompt. The fixed part is counted from the literal text
of each block (placeholders count as empty, ``from`` blocks as nothing), which is a lower
bound of what it needs; slots are counted by their ``maxTokens`` ceilings. The check says
so when the fixed part alone is over the budget, and when the slots' ceilings add up to
more than the budget leaves once the fixed part is paid for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from storyforge.engine.budget import default_estimator
from storyforge.engine.errors import Issue, TemplatePath
from storyforge.engine.model import LayoutMessage, LayoutSlot, MessageBlock, Template
from storyforge.engine.nodes import Text

__all__ = ["check_budget", "fixed_blocks"]


def _literal(block: MessageBlock) -> str:
    """The text a block emits whatever the data is (its literal parts), or ``""``."""
    if block.from_ is not None or block.leaf is None:
        return ""
    if block.skip_if_empty_interpolation and block.leaf.has_variables:
        return ""  # skipped when its placeholders are empty: nothing is certain
    parts = getattr(block.leaf, "parts", ())
    return "".join(p.value for p in parts if isinstance(p, Text))


def fixed_blocks(template: Template) -> Iterator[tuple[TemplatePath, str]]:
    """``(path, literal text)`` of every layout message, header and footer, in layout order."""
    for node in template.layout:
        if isinstance(node, LayoutMessage):
            yield node.path, _literal(node)
        elif isinstance(node, LayoutSlot):
            for block in (*node.header, *node.footer):
                yield block.path, _literal(block)


def check_budget(
    template: Template, budget: int | None, estimator: Callable[[str], int] | None = None
) -> tuple[Issue, ...]:
    """Issues when the fixed part of the layout cannot be sure to fit ``budget`` (see module doc)."""
    if budget is None:
        return ()
    estimate = estimator or default_estimator
    costs = [(path, int(estimate(text))) for path, text in fixed_blocks(template) if text]
    fixed = sum(cost for _, cost in costs)
    root = TemplatePath()
    if fixed > budget:
        biggest = ", ".join(f"{path} ({cost})" for path, cost in sorted(costs, key=lambda c: -c[1])[:3])
        return (
            Issue(
                code="budget_feasibility",
                path=root,
                message=(
                    f"the fixed part of the layout (layout messages, headers and footers) needs at least "
                    f"{fixed} tokens, more than the whole {budget}-token budget, so some of it is always "
                    f"dropped; the largest: {biggest}"
                ),
            ),
        )
    ceilings = {
        name: slot.budget.max_tokens if slot.budget is not None else None
        for name, slot in template.slots.items()
    }
    capped = sum(v for v in ceilings.values() if v is not None)
    room = budget - fixed
    if fixed == 0 or capped <= room:
        return ()  # nothing fixed to protect, or the slots' ceilings leave room for it
    uncapped = [name for name, v in ceilings.items() if v is None]
    also = f" (slots without maxTokens, which can take anything: {', '.join(uncapped)})" if uncapped else ""
    over = ", ".join(f"{name} ({v})" for name, v in ceilings.items() if v is not None and v > 0)
    return (
        Issue(
            code="budget_feasibility",
            path=root,
            message=(
                f"the fixed part of the layout does not fit for sure: layout messages, headers and footers "
                f"need at least {fixed} of the {budget} tokens, but slots are filled first and their "
                f"maxTokens add up to {capped}: {over}{also}. Keep the slots' maxTokens to at most "
                f"{room} in all, or a layout message or header can be dropped"
            ),
        ),
    )
