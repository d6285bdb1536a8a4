"""Research-QA prompts: a question (and contexts) -> the chat messages of one model and mode.

Takes: a :class:`~storyforge.tasks.research_qa.format.PromptFormat` and a
:class:`PromptRequest` (model type, mode, question, contexts or stored prompt). Gives:
:class:`PromptBuilder` (compiles the format's templates once and renders requests into
:class:`RenderedPrompt`: system and user messages, the contexts shown and dropped, token count,
warnings) and the library functions that keep the seed's names for users migrating:
:func:`system_message`, :func:`build_instruction_only_prompt`, :func:`build_rag_prompt`,
:func:`build_hybrid_rag_prompt` (they use the packaged default prompt format).

Why: every user turn is rendered by the template engine from ``conf/template/rqa_*.yaml``, so
training exports, evaluation requests and the library all produce the same bytes.

Token budget contract: with ``budget`` set, the rendered messages (system and user, each
counted once by the estimator) cost at most ``budget`` tokens. Only whole contexts are
dropped, always from the end, so the ones shown stay numbered 1..k; a prompt that cannot fit
even with one context (or without any, in a mode that has none) is a :class:`DataError`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from storyforge.engine.budget import Estimator, default_estimator
from storyforge.engine.model import thaw
from storyforge.errors import DataError, RenderError, TemplateValidationError
from storyforge.tasks.research_qa.contexts import Context, prepare_contexts
from storyforge.tasks.research_qa.format import (
    CONTEXT_MODES,
    MODES_BY_MODEL_TYPE,
    PROMPT_MODES,
    PromptFormat,
    default_prompt_format,
    normalize_model_type,
)
from storyforge.tasks.research_qa.kind import TASK
from storyforge.tasks.research_qa.validators import find_system_text

if TYPE_CHECKING:
    from storyforge.engine.compiler import CompiledTemplate

__all__ = [
    "PromptBuilder",
    "PromptRequest",
    "RenderedPrompt",
    "build_hybrid_rag_prompt",
    "build_instruction_only_prompt",
    "build_rag_prompt",
    "default_builder",
    "system_message",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptRequest:
    """One prompt to render. ``contexts`` are raw (``rag.contexts``); ``stored_prompt`` is the
    dataset's ``rag.prompt`` (``rag_stored`` only); ``task_id`` labels errors and warnings."""

    model_type: str
    mode: str
    instruction: Any
    contexts: Sequence[Any] | None = None
    stored_prompt: Any = None
    require_citations: bool = True
    extra_instructions: str | None = None
    task_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RenderedPrompt:
    """The messages of one prompt and what went into them."""

    model_type: str
    mode: str
    system: str
    user: str
    contexts_shown: tuple[str, ...] = ()
    contexts_dropped: tuple[str, ...] = ()
    tokens: int = 0
    warnings: tuple[str, ...] = ()
    trace: Any = field(default=None, compare=False, repr=False)

    @property
    def messages(self) -> list[dict[str, str]]:
        """``[{"role": "system", …}, {"role": "user", …}]`` (a fresh list each time)."""
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]


class PromptBuilder:
    """Renders :class:`PromptRequest` values with one prompt format's compiled templates."""

    def __init__(
        self,
        prompt_format: PromptFormat,
        *,
        budget: int | None = None,
        estimator: Estimator | None = None,
    ) -> None:
        from storyforge import compile_template

        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ValueError(f"budget must be a positive int or None, got {budget!r}")
        self.format = prompt_format
        self.budget = budget
        self.estimate: Estimator = estimator or default_estimator
        compiled: dict[str, CompiledTemplate] = {}
        for mode in PROMPT_MODES:
            document = thaw(prompt_format.template(mode))
            try:
                compiled[mode] = compile_template(
                    document, task=TASK.name, allowed_sources=TASK.allowed_sources
                )
            except TemplateValidationError as exc:
                raise exc.with_template(
                    document.get("name") or document.get("id"), f"prompt_format.templates.{mode}"
                ) from None
        self._compiled: Mapping[str, CompiledTemplate] = MappingProxyType(compiled)
        self._literal_text = "".join(
            [
                *(text for m in PROMPT_MODES for text in _strings(thaw(prompt_format.template(m)))),
                *prompt_format.all_system_messages(),
                prompt_format.context_separator,
            ]
        )

    # -- public ------------------------------------------------------------------------------

    def render(self, request: PromptRequest) -> RenderedPrompt:
        """Render ``request``; :class:`DataError` (naming the record) for bad input."""
        model_type = normalize_model_type(request.model_type)
        mode = request.mode
        if mode not in PROMPT_MODES:
            raise ValueError(f"unknown prompt mode {mode!r}; modes: {', '.join(PROMPT_MODES)}")
        label = f"record {request.task_id!r}: " if request.task_id is not None else ""
        instruction = request.instruction.strip() if isinstance(request.instruction, str) else None
        if not instruction:
            found = "missing" if request.instruction is None else repr(request.instruction)
            raise DataError(f"{label}instruction cannot be empty (found {found})")
        warnings: list[str] = []
        contexts: tuple[Context, ...] = ()
        stored: str | None = None
        if mode in CONTEXT_MODES:
            try:
                contexts = self._contexts(request.contexts)
            except DataError as exc:
                raise DataError(f"{label}{exc}") from None
        if mode in ("rag_standard", "hybrid") and not contexts:
            raise DataError(
                f"{label}contexts cannot be empty for the {mode} prompt (no non-empty snippet in rag.contexts)"
            )
        if mode == "rag_stored":
            stored = request.stored_prompt
            if not isinstance(stored, str) or not stored.strip():
                raise DataError(f"{label}rag.prompt cannot be empty in rag_stored mode (found {stored!r})")
            found_text = find_system_text(stored, self.format.all_system_messages())
            if found_text:
                warnings.append(
                    f"{label}rag.prompt contains system text {found_text[0]!r}; it is sent unchanged "
                    "(rag_stored), so the model sees the system message twice"
                )
        extra = request.extra_instructions.strip() if isinstance(request.extra_instructions, str) else None
        ctx: dict[str, Any] = {
            "task_id": request.task_id or "",
            "model_type": model_type,
            "prompt_mode": mode,
            "system_message": self.format.system_message(model_type),
            "instruction": instruction,
            "contexts": [],
            "context_separator": self.format.context_separator,
            "stored_prompt": stored,
            "require_citations": bool(request.require_citations),
            "extra_instructions": extra or None,
        }
        if mode == "rag_stored":
            return self._finish(ctx, mode, contexts, (), label, warnings)
        if mode not in ("rag_standard", "hybrid"):
            return self._finish(ctx, mode, (), (), label, warnings)
        return self._fit_contexts(ctx, mode, contexts, label, warnings)

    def render_user(self, request: PromptRequest) -> str:
        return self.render(request).user

    # -- internals ---------------------------------------------------------------------------

    def _contexts(self, raw: Sequence[Any] | None) -> tuple[Context, ...]:
        contexts = prepare_contexts(raw)
        if not self.format.keep_prenumbered:
            contexts = tuple(replace(c, shown=f"[{c.number}] {c.body}") for c in contexts)
        return contexts

    def _fit_contexts(
        self,
        ctx: dict[str, Any],
        mode: str,
        contexts: tuple[Context, ...],
        label: str,
        warnings: list[str],
    ) -> RenderedPrompt:
        full = self._attempt(ctx, contexts)
        if self.budget is None or full[1] <= self.budget:
            return self._finish(ctx, mode, contexts, (), label, warnings, attempt=full)
        # The cost grows with every context added, so the largest prefix that fits is found
        # by bisection over k = 1 .. n - 1.
        low, high, best = 1, len(contexts) - 1, None
        while low <= high:
            middle = (low + high) // 2
            attempt = self._attempt(ctx, contexts[:middle])
            if attempt[1] <= self.budget:
                best, low = (middle, attempt), middle + 1
            else:
                high = middle - 1
        if best is None:
            one = self._attempt(ctx, contexts[:1])[1]
            raise DataError(
                f"{label}the {mode} prompt does not fit the token budget of {self.budget} even with "
                f"one context ({one} tokens); raise budget.max_tokens or shorten the contexts"
            )
        k, attempt = best
        dropped = contexts[k:]
        warnings.append(
            f"{label}dropped {len(dropped)} of {len(contexts)} contexts from the end to fit the token "
            f"budget of {self.budget} ({attempt[1]} tokens with {k})"
        )
        return self._finish(ctx, mode, contexts[:k], dropped, label, warnings, attempt=attempt)

    def _attempt(self, ctx: dict[str, Any], contexts: Sequence[Context]) -> tuple[Any, int]:
        """Render with these contexts; the engine result (data braces restored) and its cost."""
        from storyforge import render

        local = dict(ctx, contexts=[c.shown for c in contexts])
        compiled = self._compiled[str(ctx["prompt_mode"])]
        shield = _BraceShield.for_data(local, self._literal_text)
        local = shield.hide(local)
        result = render(compiled, local, TASK.registry(local), budget=None)
        messages = [dict(m, content=shield.show(m["content"])) for m in result.messages]
        cost = sum(self.estimate(m["content"]) for m in messages)
        return _Rendered(messages, tuple(shield.show(w) for w in result.warnings), result), cost

    def _finish(
        self,
        ctx: dict[str, Any],
        mode: str,
        shown: Sequence[Context],
        dropped: Sequence[Context],
        label: str,
        warnings: list[str],
        attempt: tuple[Any, int] | None = None,
    ) -> RenderedPrompt:
        result, cost = attempt or self._attempt(ctx, () if mode == "rag_stored" else shown)
        if self.budget is not None and cost > self.budget:
            why = (
                "a stored prompt is sent byte for byte, so nothing can be dropped"
                if mode == "rag_stored"
                else "this mode has no contexts to drop"
            )
            raise DataError(
                f"{label}the {mode} prompt needs {cost} tokens, over the budget of {self.budget}; {why}"
            )
        messages = result.messages
        roles = [m["role"] for m in messages]
        if roles != ["system", "user"]:
            raise RenderError(
                f"template for mode {mode!r} must render one system message then one user message; "
                f"it rendered roles {roles}"
            )
        system, user = messages[0]["content"], messages[1]["content"]
        if system != ctx["system_message"]:
            raise RenderError(f"template for mode {mode!r} changed the system message: {system!r}")
        for warning in result.warnings:
            warnings.append(f"{label}{warning}")
        return RenderedPrompt(
            model_type=str(ctx["model_type"]),
            mode=mode,
            system=system,
            user=user,
            contexts_shown=tuple(c.shown for c in shown),
            contexts_dropped=tuple(c.shown for c in dropped),
            tokens=cost,
            warnings=tuple(warnings),
            trace=getattr(result.engine, "trace", None),
        )


@dataclass(frozen=True, slots=True)
class _Rendered:
    messages: list[dict[str, Any]]
    warnings: tuple[str, ...]
    engine: Any


@dataclass(frozen=True, slots=True)
class _BraceShield:
    """Keeps record data literal through the render.

    The engine expands a string value that contains ``{{`` as a template (reference semantics
    §5.5). A question or snippet may well contain ``{{`` (LaTeX, Go or Jinja templates), and it
    must reach the model unchanged, so ``{`` in data strings is swapped for a private-use
    character that occurs nowhere in the data or the templates, and swapped back afterwards.
    """

    mark: str | None

    @classmethod
    def for_data(cls, ctx: Mapping[str, Any], literal_text: str) -> _BraceShield:
        data = "".join(_strings(ctx))
        if "{{" not in data:
            return cls(None)
        for code in range(0xE000, 0xF900):
            mark = chr(code)
            if mark not in data and mark not in literal_text:
                return cls(mark)
        raise DataError("record text uses every private-use character; its braces cannot be shielded")

    def hide(self, value: Any) -> Any:
        if self.mark is None:
            return value
        if isinstance(value, str):
            return value.replace("{", self.mark)
        if isinstance(value, Mapping):
            return {k: self.hide(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.hide(v) for v in value]
        return value

    def show(self, text: str) -> str:
        return text if self.mark is None else text.replace(self.mark, "{")


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


# -- the library API (packaged default prompt format) -------------------------------------------


@functools.cache
def default_builder() -> PromptBuilder:
    """A builder for the packaged ``research_qa`` prompt format, without a token budget."""
    return PromptBuilder(default_prompt_format())


def system_message(model_type: str) -> str:
    """The system message of ``model_type`` (base, instruction_only or rag_trained)."""
    return default_prompt_format().system_message(model_type)


def build_instruction_only_prompt(instruction: str, model_type: str = "instruction_only") -> str:
    """The user turn without contexts for ``model_type``.

    ``Question: {instruction}\\n\\nAnswer:`` for base and instruction_only; rag_trained models
    get the no-context wording that tells them not to cite.
    """
    model_type = normalize_model_type(model_type)
    mode = MODES_BY_MODEL_TYPE[model_type][0]
    return default_builder().render_user(
        PromptRequest(model_type=model_type, mode=mode, instruction=instruction)
    )


def build_rag_prompt(
    instruction: str,
    contexts: Sequence[Any],
    require_citations: bool = True,
    extra_instructions: str | None = None,
) -> str:
    """The standard RAG user turn: instructions, numbered contexts, question, ``Answer:``."""
    return default_builder().render_user(
        PromptRequest(
            model_type="rag_trained",
            mode="rag_standard",
            instruction=instruction,
            contexts=contexts,
            require_citations=require_citations,
            extra_instructions=extra_instructions,
        )
    )


def build_hybrid_rag_prompt(instruction: str, contexts: Sequence[Any]) -> str:
    """The hybrid user turn (instruction-only model with contexts, the seed's Condition 4)."""
    return default_builder().render_user(
        PromptRequest(
            model_type="instruction_only", mode="hybrid", instruction=instruction, contexts=contexts
        )
    )
