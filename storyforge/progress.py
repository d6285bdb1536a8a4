"""Progress bars on the terminal: the one helper every stage's bar goes through.

Takes: what a stage counts (an iterable, or a total it updates itself), the bar's label and
unit. Gives: :func:`progress_bar`, a tqdm bar on stderr, and :class:`UnitCounts`, each unit's
latest ``(done, errors)`` summed for a bar over several units (in this process, or held by a
Ray actor when the units run elsewhere).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tqdm import tqdm

__all__ = ["UnitCounts", "progress_bar"]


def progress_bar(
    items: Iterable[Any] | None = None,
    *,
    desc: str,
    unit: str,
    total: int | None = None,
    show: bool | None = None,
    **options: Any,
) -> tqdm[Any]:
    """A bar labelled ``desc`` over ``items`` (or up to ``total``), on stderr.

    ``show``: True draws it, False hides it, None draws it only when stderr is a terminal.
    ``options`` go to tqdm as they are (``initial``, ``postfix``, ``dynamic_ncols``, ...).
    """
    return tqdm(
        items, desc=desc, unit=unit, total=total, disable=None if show is None else not show, **options
    )


class UnitCounts:
    """Each unit's latest ``(done, errors)``; :meth:`totals` sums them for one bar."""

    def __init__(self) -> None:
        self._counts: dict[int, tuple[int, int]] = {}

    def report(self, unit: int, done: int, errors: int) -> None:
        self._counts[unit] = (done, errors)

    def totals(self) -> tuple[int, int]:
        return sum(c[0] for c in self._counts.values()), sum(c[1] for c in self._counts.values())
