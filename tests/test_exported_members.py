"""The public API: `storyforge.__all__` lists exactly what the package exports, and it works."""

from __future__ import annotations

import storyforge

EXPECTED = {
    "Answer",
    "CompiledTemplate",
    "ConfigError",
    "DataError",
    "Issue",
    "MISSING",
    "ProviderError",
    "RenderError",
    "RenderLimitError",
    "RenderResult",
    "SourceRegistry",
    "SourceSpec",
    "StoryforgeError",
    "TaskTemplate",
    "TemplatePath",
    "TemplateValidationError",
    "compile_template",
    "content_hash",
    "generate",
    "load_template",
    "render",
}


def test_all_is_the_documented_api() -> None:
    """__all__ holds exactly the documented names (update both together)."""
    assert set(storyforge.__all__) == EXPECTED
    assert len(storyforge.__all__) == len(set(storyforge.__all__))


def test_every_exported_name_exists_and_is_public() -> None:
    """Every name in __all__ is importable from the package and defined in a storyforge module."""
    for name in storyforge.__all__:
        member = getattr(storyforge, name)
        assert getattr(member, "__module__", "").startswith("storyforge."), name


def test_no_public_name_is_left_out_of_all() -> None:
    """Public classes and functions imported into the package are all listed in __all__."""
    public = {
        name
        for name, value in vars(storyforge).items()
        if not name.startswith("_")
        and callable(value)
        and getattr(value, "__module__", "").startswith("storyforge")
    }
    assert public <= set(storyforge.__all__), public - set(storyforge.__all__)


def test_quick_start_from_the_docstring() -> None:
    """The README-level example works through the package root alone."""
    template = {
        "id": "hello",
        "name": "Hello",
        "task": "turn_generation",
        "version": 1,
        "layout": [
            {"kind": "message", "role": "system", "content": "Be brief."},
            {"kind": "slot", "name": "turns"},
        ],
        "slots": {
            "turns": {
                "priority": 0,
                "plan": [
                    {
                        "kind": "forEach",
                        "source": {"source": "turns"},
                        "map": [{"kind": "message", "role": "user", "content": "{{item}}"}],
                    }
                ],
            }
        },
    }
    compiled = storyforge.compile_template(
        template, task="turn_generation", allowed_sources=["turns", "characters"]
    )
    registry = storyforge.SourceRegistry({"turns": lambda ctx, args: ctx["turns"]})
    result = storyforge.render(compiled, {"turns": ["hi", "there"]}, registry, budget=4096)
    assert result.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi\nthere"},
    ]
    assert result.warnings == []
    assert [s.name for s in result.trace.slots] == ["turns"]
