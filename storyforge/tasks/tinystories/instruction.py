"""The canonical TinyStories instruction, rendered by the engine from a template.

Takes: a seed record (``protagonist``, ``theme``, ``required``, ``banned``,
``min_sentences``, ``max_sentences``) and a ``tinystories`` template (by default the packaged
``conf/template/tinystories_instruction.yaml``). Gives: :class:`InstructionRenderer` (compile
once, render per seed; optional token budget) and :func:`render_instruction` (the canonical
text under the packaged template). Why: the instruction's wording is data the seed
specification fixes, so it lives in a template the engine renders, never in Python string
formatting; phrase lines come out as ``  - phrase``, an empty banned list as ``  NONE``, and
the text has no trailing newline.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Self

from storyforge.errors import DataError, RenderError
from storyforge.tasks.base import TaskKind
from storyforge.tasks.tinystories.kind import TASK

__all__ = [
    "InstructionRenderer",
    "KindRenderer",
    "one_user_turn",
    "packaged_template_path",
    "render_instruction",
]

TEMPLATE_FILE = "template/tinystories_instruction.yaml"
_BUDGET_REASONS = frozenset({"over_budget", "out_of_budget"})


def packaged_template_path(file: str = TEMPLATE_FILE) -> Path:
    """Where a packaged template (by default the canonical one) lives: ``storyforge/_conf/``
    in a wheel, ``<repo>/conf/`` in a checkout."""
    package = Path(__file__).resolve().parents[2]
    for root in (package / "_conf", package.parent / "conf"):
        path = root / file
        if path.is_file():
            return path
    raise FileNotFoundError(f"{file} is neither in {package / '_conf'} nor in {package.parent / 'conf'}")


def one_user_turn(result: Any, name: str) -> str:
    """The text of a render that must give exactly one user message and no warnings."""
    if result.warnings:
        raise DataError(f"template {name!r}: " + "; ".join(result.warnings))
    messages = result.messages
    if len(messages) != 1 or messages[0]["role"] != "user":
        roles = ", ".join(m["role"] for m in messages) or "nothing"
        raise RenderError(f"template {name!r} must render exactly one user message, got {roles}")
    content: str = messages[0]["content"]
    return content


class KindRenderer:
    """A template compiled for one task kind (``KIND``), loaded from a file or the packaged
    default (``DEFAULT_FILE`` under ``conf/``); subclasses say what a render gives."""

    __slots__ = ("_compiled", "_registry", "_render", "name")

    KIND: ClassVar[TaskKind]
    DEFAULT_FILE: ClassVar[str]

    def __init__(self, template: Any) -> None:
        from storyforge import compile_template, render

        self._compiled = compile_template(
            template, task=self.KIND.name, allowed_sources=self.KIND.allowed_sources
        )
        self._render = render
        self._registry = self.KIND.registry({})
        self.name: str = self._compiled.id

    @classmethod
    def load(cls, path: Path | None = None) -> Self:
        """The template at ``path`` (default: the packaged one); errors name file and line."""
        from storyforge.engine.loader import load_template

        return cls(load_template(path or packaged_template_path(cls.DEFAULT_FILE)))


class InstructionRenderer(KindRenderer):
    """A compiled ``tinystories`` template; calling it renders one seed's instruction.

    ``template`` is a template dict, or a :class:`storyforge.engine.loader.LoadedTemplate` (so
    compile errors can name ``file:line``). With ``max_tokens`` set, a seed whose instruction
    does not fit whole raises :class:`DataError`, as does a render that produced warnings:
    an instruction is never silently shortened.
    """

    __slots__ = ("_max_tokens",)
    KIND = TASK
    DEFAULT_FILE = TEMPLATE_FILE

    def __init__(self, template: Any, *, max_tokens: int | None = None) -> None:
        super().__init__(template)
        self._max_tokens = max_tokens

    def __call__(self, seed: Mapping[str, Any]) -> str:
        result = self._render(self._compiled, seed, self._registry, self._max_tokens)
        if self._max_tokens is not None:  # before the warnings, which also report the cut parts
            cut = [e for e in result.trace.skipped if e.reason in _BUDGET_REASONS]
            if cut:
                raise DataError(
                    f"the instruction does not fit budget.max_tokens={self._max_tokens}: "
                    f"{len(cut)} part(s) left out, first at {cut[0].path}"
                )
        return one_user_turn(result, self.name)


@cache
def _canonical() -> InstructionRenderer:
    return InstructionRenderer.load()


def render_instruction(seed: Mapping[str, Any]) -> str:
    """The seed's instruction under the packaged canonical template."""
    return _canonical()(seed)
