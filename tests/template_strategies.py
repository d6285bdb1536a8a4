"""The template strategies, where the tests have always imported them from; they live in
:mod:`storyforge.testing.template_strategies` so the benchmarks can draw from them too."""

from storyforge.testing.template_strategies import (
    BUDGETS,
    CONTEXTS,
    NO_BUDGETS,
    REGISTRY,
    places,
    plan_nodes,
    templates,
)

__all__ = ["BUDGETS", "CONTEXTS", "NO_BUDGETS", "REGISTRY", "places", "plan_nodes", "templates"]
