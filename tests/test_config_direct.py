"""A config node of plain values is checked without OmegaConf's merge, with the same result.

:func:`storyforge.config.common.validate_node` builds a schema of plain fields (``str``,
``int``, ``float``, ``bool``, lists of them, optionally ``None``) directly when every value
already has its field's exact type, and merges anything else. The property pinned here:
whenever the direct way gives an object, OmegaConf's merge gives the same one (same values,
same types), so no input is checked less; and the shipped configs do take the direct way.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from pathlib import Path
from typing import Any

import omegaconf
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf.errors import OmegaConfBaseException

from storyforge.config.common import BudgetConf, RunConf, _built_by_merge, _built_directly, validate_node
from storyforge.config.dedup import DedupConf, DiversityConf
from storyforge.config.drift import DriftConf
from storyforge.config.exports import DpoPairing, ExportConf
from storyforge.config.regenerate import RegenerateConf
from storyforge.config.tinystories import (
    ConstraintsConf,
    PoolsConf,
    RangeConf,
    ThemesConf,
    TinyStoriesTaskConf,
)
from storyforge.errors import ConfigError
from storyforge.sealed import MISSING
from storyforge.tasks.research_qa.settings import ModelConf

CONF = Path(__file__).resolve().parents[1] / "conf"
SCHEMAS = (
    RunConf,
    BudgetConf,
    TinyStoriesTaskConf,
    PoolsConf,
    ThemesConf,
    ConstraintsConf,
    RangeConf,
    DriftConf,
    RegenerateConf,
    DedupConf,
    DiversityConf,
    ExportConf,
)

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(-2, 2, allow_nan=False),
    st.text(max_size=4),
    st.sampled_from(["???", "${seed}", "\\${seed}", "a ${x} b", "true", "1", "1.5"]),
)
_values = st.one_of(_scalars, st.lists(_scalars, max_size=3))


def _typed(value: Any) -> Any:
    """A value with its types spelt out (``1 == 1.0 == True`` would hide a conversion)."""
    if isinstance(value, list):
        return [_typed(item) for item in value]
    return (type(value).__name__, value)


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: _typed(getattr(obj, f.name)) for f in dataclasses.fields(obj)}


_OF_TYPE = {
    str: st.one_of(st.text(max_size=4), st.sampled_from(["???", "${seed}", "a ${x} b", "1", "true"])),
    int: st.integers(-3, 3),
    float: st.floats(-2, 2, allow_nan=False),
    bool: st.booleans(),
}


def _of_type(hint: Any) -> st.SearchStrategy[Any]:
    """Values of a field's own type (mostly plain, some that OmegaConf reads specially)."""
    args = typing.get_args(hint)
    if type(None) in args:
        return st.one_of(st.none(), *(_of_type(arg) for arg in args if arg is not type(None)))
    if typing.get_origin(hint) is list:
        return st.lists(_of_type(args[0]), max_size=3)
    if hint is Any:
        return _scalars
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.one_of(st.sampled_from(list(hint)), st.sampled_from([m.name for m in hint]))
    if dataclasses.is_dataclass(hint):
        return _nodes_of(hint)
    return _OF_TYPE[hint]


def _nodes_of(schema: Any) -> st.SearchStrategy[dict[str, Any]]:
    """A node for ``schema``: some of its keys (sometimes an unknown one), values mostly of
    their field's type, some of any type."""
    hints = typing.get_type_hints(schema)

    @st.composite
    def node(draw: st.DrawFn) -> dict[str, Any]:
        names = [f.name for f in dataclasses.fields(schema)]
        keys = [name for name in names if draw(st.integers(0, 5))] + ["nope"] * (draw(st.integers(0, 9)) == 0)
        return {
            key: draw(_of_type(hints[key]) if key in hints and draw(st.integers(0, 4)) else _values)
            for key in keys
        }

    return node()


@st.composite
def _nodes(draw: st.DrawFn) -> tuple[type, dict[str, Any]]:
    schema = draw(st.sampled_from(SCHEMAS))
    return schema, draw(_nodes_of(schema))


@settings(max_examples=150, deadline=None)
@given(_nodes())
def test_whatever_is_built_directly_is_what_the_merge_gives(case: tuple[type, dict[str, Any]]) -> None:
    schema, plain = case
    direct = _built_directly(schema, plain)
    if direct is None:
        return
    try:
        merged = _built_by_merge(schema, plain)
    except OmegaConfBaseException as exc:  # pragma: no cover - the failure this test is for
        pytest.fail(f"built directly, but the merge refuses it: {exc}")
    assert type(direct) is type(merged)
    assert _fields(direct) == _fields(merged)


@pytest.mark.parametrize(
    ("schema", "plain"),
    [
        (RunConf, {"seed": True}),  # a bool where an int goes: OmegaConf converts or refuses
        (RunConf, {"seed": "7"}),
        (TinyStoriesTaskConf, {"val_fraction": 1}),  # an int where a float goes
        (TinyStoriesTaskConf, {"id_prefix": 3}),
        (TinyStoriesTaskConf, {"id_prefix": "${seed}"}),
        (ThemesConf, {}),  # names: ??? (missing)
        (ThemesConf, {"names": ["a", "???"]}),
        (ThemesConf, {"names": "a"}),
        (ThemesConf, {"names": ["a"], "extra": 1}),  # an unknown key
        (BudgetConf, {"max_tokens": 1.5}),
        (RegenerateConf, {"feedback": None}),
        (ConstraintsConf, {"required_count": {"min": "2"}}),
        (ConstraintsConf, {"required_count": None}),
        (ConstraintsConf, {"required_count": RangeConf(min=1, max=2)}),
        (DedupConf, {"against": ["earlier.jsonl"]}),  # Any holding a list
        (ExportConf, {"dpo_pairing": "all_pairs"}),  # an enum by name
        (PoolsConf, ["a"]),
    ],
)
def test_values_to_convert_or_refuse_go_through_the_merge(schema: type, plain: Any) -> None:
    assert _built_directly(schema, plain) is None


@pytest.mark.parametrize(
    ("schema", "group", "option"),
    [(PoolsConf, "pools", "default"), (ThemesConf, "themes", "all"), (ThemesConf, "themes", "social")],
)
def test_the_shipped_word_lists_are_built_directly(schema: type, group: str, option: str) -> None:
    plain = yaml.safe_load((CONF / group / f"{option}.yaml").read_text("utf-8"))
    plain = {k: v for k, v in plain.items() if k != "defaults"}
    direct = _built_directly(schema, plain)
    assert direct is not None
    assert _fields(direct) == _fields(_built_by_merge(schema, plain))


def test_a_nested_mapping_is_laid_over_the_default() -> None:
    plain = {"required_count": {"min": 1}, "banned_length": {"max": 9}}
    direct = _built_directly(ConstraintsConf, plain)
    assert direct is not None
    assert direct.required_count == RangeConf(min=1, max=4)
    assert direct.banned_length == RangeConf(min=3, max=9)
    assert _fields(direct) == _fields(_built_by_merge(ConstraintsConf, plain))
    exported = _built_directly(ExportConf, {"dpo_pairing": DpoPairing.all_pairs})
    assert exported is not None and exported.dpo_pairing is DpoPairing.all_pairs


def test_errors_still_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^pools\.nope: unknown key"):
        validate_node(PoolsConf, {"protagonists": ["a"], "objects": ["b"], "banned": [], "nope": 1}, "pools")
    with pytest.raises(ConfigError, match=r"^task\.n_seeds: "):
        validate_node(TinyStoriesTaskConf, {"n_seeds": "many"}, "task")


def test_a_required_value_of_a_task_schema_is_missing_for_omegaconf() -> None:
    """storyforge.sealed.MISSING is OmegaConf's marker: a model left without a name is refused."""
    assert MISSING == omegaconf.MISSING
    with pytest.raises(ConfigError, match=r"^model\.name: .*missing mandatory value: name$"):
        validate_node(ModelConf, {"model_type": "base", "gguf_path": "m.gguf"}, "model")
