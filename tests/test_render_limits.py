"""Render limits: counted while the render grows, and raised as a :class:`RenderLimitError`
naming the limit and the node path."""

from __future__ import annotations

import pickle
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from storyforge import RenderError, RenderLimitError, SourceRegistry, compile_template, render
from storyforge.engine import assembler, renderer, runtime
from storyforge.engine.compiler import clear_cache
from storyforge.engine.errors import TemplatePath
from tests.support.template_strategies import BUDGETS, CONTEXTS, REGISTRY, templates


def _doc(layout: list[Any], slots: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": "l", "name": "limits", "task": "x", "version": 1, "layout": layout, "slots": slots or {}}


def _msg(content: str) -> dict[str, Any]:
    return {"kind": "message", "role": "user", "content": content}


@pytest.fixture
def small_limits(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """MAX_RENDER_ITEMS = 3 and MAX_OUTPUT_CHARS = 40 for templates compiled from now on."""
    monkeypatch.setattr(renderer, "MAX_RENDER_ITEMS", 3)
    monkeypatch.setattr(renderer, "MAX_OUTPUT_CHARS", 40)
    monkeypatch.setattr(assembler, "MAX_OUTPUT_CHARS", 40)
    clear_cache()
    yield
    clear_cache()


def _ending(compiled: Any, ctx: Any, budget: int | None) -> Any:
    try:
        result = render(compiled, ctx, REGISTRY, budget=budget)
    except RenderLimitError as exc:
        return ("limit", exc.limit, exc.path, str(exc))
    return ("done", result.messages, result.warnings)


def _ends_cleanly(template: dict[str, Any], ctx: Any, budget: int | None) -> None:
    clear_cache()
    ending = _ending(compile_template(template), ctx, budget)
    assert ending[0] == "done" or ending[1] in ("MAX_RENDER_ITEMS", "MAX_OUTPUT_CHARS", "MAX_RENDER_CHARS")


_LONG_CONTEXTS = st.fixed_dictionaries(
    {"xs": st.lists(st.text(max_size=30), max_size=12), "name": st.text(max_size=10)}
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(template=templates(budgets=BUDGETS), ctx=st.one_of(CONTEXTS, _LONG_CONTEXTS))
@example(  # one slot shown four times: its texts are counted once and placed four times
    template=_doc(
        [
            {"kind": "slot", "name": "a"},
            {"kind": "slot", "name": "a"},
            {"kind": "slot", "name": "a", "footer": [_msg("{{item}}")]},
            {"kind": "slot", "name": "a"},
        ],
        {"a": {"priority": 0, "plan": [{"kind": "message", "role": "system", "content": "static text"}]}},
    ),
    ctx={"xs": [], "name": ""},
)
def test_random_templates_end_in_messages_or_a_limit(
    small_limits: None, template: dict[str, Any], ctx: Any
) -> None:
    """With small limits, a random template ends in messages or a RenderLimitError naming a
    limit, never another error. No global budget; slot and node budgets, when the template
    sets them, still count."""
    _ends_cleanly(template, ctx, None)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    template=templates(budgets=BUDGETS), ctx=st.one_of(CONTEXTS, _LONG_CONTEXTS), budget=st.integers(0, 200)
)
def test_budgeted_random_templates_end_in_messages_or_a_limit(
    small_limits: None, template: dict[str, Any], ctx: Any, budget: int
) -> None:
    """The same with a global budget, slot and node budgets."""
    _ends_cleanly(template, ctx, budget)


def test_small_limits_are_reached_by_the_property_templates(small_limits: None) -> None:
    """The limits above are within reach of the random templates (the properties test something)."""
    loop = {"kind": "forEach", "source": {"source": "xs"}, "map": [_msg("{{item}}")]}
    doc = _doc([{"kind": "slot", "name": "s"}], {"s": {"priority": 0, "plan": [loop]}})
    ending = _ending(compile_template(doc), {"xs": ["a"] * 4}, None)
    assert ending[:3] == ("limit", "MAX_RENDER_ITEMS", TemplatePath(("slots", "s", "plan", 0)))
    ending = _ending(compile_template(doc), {"xs": ["b" * 30] * 2}, None)
    assert ending[:3] == ("limit", "MAX_OUTPUT_CHARS", TemplatePath(("slots", "s", "plan", 0, "map", 0)))


def test_limit_error_names_path_and_limit_and_survives_pickling() -> None:
    """str() starts with the node path; .limit and .path survive a pickle round trip."""
    doc = _doc([_msg("ok"), _msg("{{a}}{{a}}")])
    with pytest.raises(RenderLimitError) as caught:
        render(compile_template(doc), {"a": "x" * 600_000})
    error = caught.value
    assert isinstance(error, RenderError)
    assert (error.limit, str(error.path)) == ("MAX_RENDER_CHARS", "layout[1]")
    assert str(error).startswith(
        "layout[1]: a template string rendered to more than MAX_RENDER_CHARS=1,000,000"
    )
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), again.limit, again.path, str(again)) == (
        RenderLimitError,
        error.limit,
        error.path,
        str(error),
    )


def _peak(fn: Any) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("{{ xs | join(sep) }}", id="join"),
        pytest.param("{{ xs | bullets(sep) }}", id="bullets"),
        pytest.param("{{ xs | numbered(sep) }}", id="numbered"),
    ],
)
def test_list_filters_refuse_before_building(content: str) -> None:
    """1,000 items around a 100,000-character separator (100 MB of text) are refused before
    anything that size is built: the render's peak memory stays a few MB."""
    compiled = compile_template(_doc([_msg(content)]))
    ctx = {"xs": list(range(1000)), "sep": "s" * 100_000}

    def attempt() -> None:
        with pytest.raises(RenderLimitError, match="MAX_RENDER_CHARS"):
            render(compiled, ctx)

    assert _peak(attempt) < 5 * 1024 * 1024


def test_data_expansion_is_counted_as_it_grows() -> None:
    """A data string of 100,000 placeholders, each expanding to 1,000 characters (100 MB),
    stops as soon as it passes MAX_RENDER_CHARS."""
    compiled = compile_template(_doc([_msg("{{a}}")]))
    ctx = {"a": "{{b}}" * 100_000, "b": "x" * 1000}

    def attempt() -> None:
        with pytest.raises(RenderLimitError, match="MAX_RENDER_CHARS"):
            render(compiled, ctx)

    assert _peak(attempt) < 8 * 1024 * 1024


def test_json_of_repeated_values_is_bounded() -> None:
    """A list that repeats one long text is refused while it is written as JSON."""
    value = ["t" * 1_000_000] * 40
    with pytest.raises(RenderLimitError, match="MAX_OUTPUT_CHARS") as caught:
        runtime.to_json(value)
    assert caught.value.limit == "MAX_OUTPUT_CHARS"


def test_loops_under_the_item_limit_render() -> None:
    """250,000 items (the limit itself) still render."""
    loop = {"kind": "forEach", "source": {"source": "xs"}, "map": [_msg("{{item}}")]}
    doc = _doc([{"kind": "slot", "name": "s"}], {"s": {"priority": 0, "plan": [loop]}})
    registry = SourceRegistry({"xs": lambda ctx, args: ctx["xs"]})
    compiled = compile_template(doc)
    result = render(compiled, {"xs": ["i"] * runtime.MAX_RENDER_ITEMS}, registry)
    assert len(result.messages[0]["content"]) == 2 * runtime.MAX_RENDER_ITEMS - 1
    with pytest.raises(RenderLimitError, match="MAX_RENDER_ITEMS=250,000"):
        render(compiled, {"xs": ["i"] * (runtime.MAX_RENDER_ITEMS + 1)}, registry)


def test_notes_from_outside_a_render_do_not_reach_the_next_one() -> None:
    """A value written as JSON outside any render (its warning has no render to go to) leaves
    nothing behind for the next render in the thread."""
    deep: Any = 1
    for _ in range(runtime.MAX_JSON_DEPTH + 1):
        deep = [deep]
    assert runtime.to_json(deep) == ""
    assert render(compile_template(_doc([_msg("{{a}}")])), {"a": "x"}).warnings == []
