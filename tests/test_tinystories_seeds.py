"""TinyStories prompt seeds: generation, satisfiability, the seed schema and loaded-file audits."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storyforge.tasks.base import get_task_kind
from storyforge.tasks.tinystories.seed_validation import (
    Rejection,
    SeedValidator,
    packaged_seed_schema,
    satisfiability_problem,
)
from storyforge.tasks.tinystories.seeds import SeedGenerator, audit_seeds, read_seed_lines, split_for
from storyforge.tasks.tinystories.spec import (
    SEED_FIELDS,
    SPEC_CONSTRAINTS,
    THEME_SET,
    IntRange,
    SeedConstraints,
)

ROOT = Path(__file__).resolve().parents[1]
POOLS = yaml.safe_load((ROOT / "conf/pools/default.yaml").read_text("utf-8"))


def make_generator(
    seed: int = 1234, constraints: SeedConstraints = SPEC_CONSTRAINTS, **kw: Any
) -> SeedGenerator:
    args: dict[str, Any] = {
        "seed": seed,
        "themes": THEME_SET,
        "constraints": constraints,
        "protagonists": POOLS["protagonists"],
        "objects": POOLS["objects"],
        "banned": POOLS["banned"],
    }
    args.update(kw)
    return SeedGenerator(**args)


def good_record(**changes: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": "ts-000001",
        "split": "train",
        "protagonist": "a shy turtle named Tim",
        "theme": "courage",
        "required": ["red ball", "blue kite"],
        "banned": ["suddenly"],
        "min_sentences": 6,
        "max_sentences": 9,
        "instruction": "Write a children's story.",
    }
    record.update(changes)
    return record


# -- the task kind ------------------------------------------------------------------------------


def test_task_kind_is_registered_with_the_seed_fields_as_sources() -> None:
    """Importing the package registers `tinystories` with one source per seed field."""
    kind = get_task_kind("tinystories")
    assert kind.allowed_sources == (
        "protagonist",
        "theme",
        "required",
        "banned",
        "min_sentences",
        "max_sentences",
    )
    seed = good_record()
    registry = kind.registry(seed)
    assert {name: registry[name](seed, None) for name in kind.allowed_sources} == {
        name: seed[name] for name in kind.allowed_sources
    }


# -- generation ---------------------------------------------------------------------------------


def test_generation_is_deterministic_and_records_are_independent() -> None:
    """Record i depends only on (seed, i): two generators agree, and order of calls does not matter."""
    a, b = make_generator(), make_generator()
    forward = [a.record(i) for i in range(200)]
    backward = [b.record(i) for i in reversed(range(200))][::-1]
    assert forward == backward
    assert [r["id"] for r in forward] == [f"ts-{i:06d}" for i in range(200)]


def test_a_different_seed_gives_different_records() -> None:
    """Changing the RNG seed changes the drawn content (ids stay the same)."""
    a = [make_generator(seed=1).record(i) for i in range(50)]
    b = [make_generator(seed=2).record(i) for i in range(50)]
    assert [r["id"] for r in a] == [r["id"] for r in b]
    assert sum(x != y for x, y in zip(a, b)) > 40


def test_split_is_stable_per_id_and_near_val_fraction() -> None:
    """The split comes from the id alone, so it survives growing n_seeds, and val is ~val_fraction."""
    ids = [f"ts-{i:06d}" for i in range(20000)]
    val = sum(split_for(i, 0.1) == "val" for i in ids)
    assert 0.09 * len(ids) < val < 0.11 * len(ids)
    assert all(split_for(i, 0.0) == "train" for i in ids[:500])
    assert all(split_for(i, 1.0) == "val" for i in ids[:500])
    gen = make_generator(val_fraction=0.3)
    assert [gen.record(i)["split"] for i in range(100)] == [split_for(f"ts-{i:06d}", 0.3) for i in range(100)]


def test_generated_records_meet_the_spec_over_many_seeds() -> None:
    """Thousands of generated seeds pass the full validator, use every theme and vary counts."""
    gen = make_generator()
    validator = SeedValidator(SPEC_CONSTRAINTS)
    themes, required_counts, banned_counts = set(), set(), set()
    for i in range(3000):
        record = gen.record(i)
        record["instruction"] = "x"
        assert list(record) == list(SEED_FIELDS)
        assert validator.check(record) is None, record
        themes.add(record["theme"])
        required_counts.add(len(record["required"]))
        banned_counts.add(len(record["banned"]))
    assert themes == set(THEME_SET)
    assert required_counts == {2, 3, 4}
    assert banned_counts == {0, 1, 2}


_word = st.text(alphabet="abcdefgh", min_size=1, max_size=6)
_phrase = st.lists(_word, min_size=1, max_size=3).map(" ".join).filter(lambda p: 3 <= len(p) <= 20)


@st.composite
def generator_setups(draw: st.DrawFn) -> tuple[SeedGenerator, SeedConstraints]:
    """Small random pools over a tiny alphabet, so substring collisions are frequent."""
    req_min = draw(st.integers(2, 4))
    ban_max = draw(st.integers(0, 2))
    constraints = SeedConstraints(
        required_count=IntRange(min=req_min, max=draw(st.integers(req_min, 4))),
        banned_count=IntRange(min=0, max=ban_max),
    )
    objects = draw(st.lists(_phrase, min_size=4, max_size=12, unique_by=str.lower))
    banned = draw(st.lists(_phrase, min_size=max(ban_max, 1), max_size=8, unique_by=str.lower))
    protagonists = draw(st.lists(_phrase, min_size=1, max_size=4, unique_by=str.lower))
    gen = SeedGenerator(
        seed=draw(st.integers(0, 2**31)),
        themes=THEME_SET,
        constraints=constraints,
        protagonists=protagonists,
        objects=objects,
        banned=banned,
    )
    return gen, constraints


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generator_setups(), st.integers(0, 10_000))
def test_generator_never_produces_an_unsatisfiable_seed(
    setup: tuple[SeedGenerator, SeedConstraints], index: int
) -> None:
    """Whatever the pools, a generated seed has no banned/required/protagonist overlap or repeat."""
    gen, constraints = setup
    record = gen.record(index)
    assert satisfiability_problem(record["protagonist"], record["required"], record["banned"]) is None
    assert len(record["required"]) in constraints.required_count
    assert len(record["banned"]) in constraints.banned_count
    assert gen.record(index) == record


_OBJECTS: list[str] = POOLS["objects"]
_BANNED: list[str] = POOLS["banned"]


@pytest.mark.parametrize(
    ("changes", "validator", "count", "valid"),
    [
        pytest.param({}, SPEC_CONSTRAINTS, 1_000_000, True, id="the_packaged_pools"),
        pytest.param({"themes": ("friendship", "bravery")}, SPEC_CONSTRAINTS, 10, False, id="unknown_theme"),
        pytest.param(
            {"protagonists": [*POOLS["protagonists"], "a cat. named Tom"]},
            SPEC_CONSTRAINTS,
            10,
            False,
            id="punctuation_in_a_protagonist",
        ),
        pytest.param({"objects": [*_OBJECTS, "x" * 41]}, SPEC_CONSTRAINTS, 10, False, id="long_object"),
        pytest.param({"banned": [*_BANNED, "ab"]}, SPEC_CONSTRAINTS, 10, False, id="short_banned_phrase"),
        pytest.param(
            {"objects": [*_OBJECTS, _OBJECTS[0].upper()]}, SPEC_CONSTRAINTS, 10, False, id="objects_repeat"
        ),
        pytest.param(
            {"banned": ["thunder", "Thunder", "mud puddle"]}, SPEC_CONSTRAINTS, 10, False, id="banned_repeat"
        ),
        pytest.param({"id_prefix": "a" * 121}, SPEC_CONSTRAINTS, 1_000_000, True, id="ids_up_to_128_chars"),
        pytest.param(
            {"id_prefix": "a" * 121}, SPEC_CONSTRAINTS, 10_000_001, False, id="an_id_past_128_chars"
        ),
        pytest.param(
            {"constraints": SeedConstraints(min_sentences=9, max_sentences=6)},
            SeedConstraints(min_sentences=9, max_sentences=6),
            10,
            False,
            id="sentence_range",
        ),
        pytest.param(
            {}, SeedConstraints(required_count=IntRange(min=2, max=3)), 10, False, id="narrower_validator"
        ),
        pytest.param(
            {"constraints": SeedConstraints(banned_count=IntRange(min=0, max=0))},
            SeedConstraints(banned_count=IntRange(min=0, max=0)),
            10,
            True,
            id="nothing_banned",
        ),
    ],
)
def test_a_generator_is_always_valid_only_when_its_pools_make_every_record_valid(
    changes: dict[str, Any], validator: SeedConstraints, count: int, valid: bool
) -> None:
    """always_valid answers from the pools, the ids and the constraints, checked once; where it
    says no, some record the generator can draw breaks a rule (here: among the first 3,000)."""
    gen = make_generator(**changes)
    check = SeedValidator(validator)
    assert gen.always_valid(check, count) is valid
    if not valid and count <= 10:
        records = (gen.record(i) | {"instruction": "x"} for i in range(3000))
        assert any(check.check(record) is not None for record in records)


_loose_phrase = st.one_of(_phrase, _phrase.map(str.upper), st.sampled_from(["a.b", "ok ", "zz", "x" * 41]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    objects=st.lists(_loose_phrase, min_size=4, max_size=10),
    banned=st.lists(_loose_phrase, min_size=2, max_size=6),
    protagonists=st.lists(_loose_phrase, min_size=1, max_size=3),
    seed=st.integers(0, 2**31),
)
def test_every_record_of_an_always_valid_generator_passes_the_validator(
    objects: list[str], banned: list[str], protagonists: list[str], seed: int
) -> None:
    """Pools with repeats, punctuation and bad lengths: whenever always_valid says yes, each
    record passes the full check (so a job may skip it)."""
    gen = make_generator(seed=seed, objects=objects, banned=banned, protagonists=protagonists)
    validator = SeedValidator(SPEC_CONSTRAINTS)
    if gen.always_valid(validator, 200):
        for i in range(200):
            assert validator.check(gen.record(i) | {"instruction": "x"}) is None


def test_banned_phrases_avoid_the_protagonist_they_are_part_of() -> None:
    """'dragon' is never banned for the dragonfly, nor 'robot' for the robot, across many draws."""
    gen = make_generator(protagonists=["a friendly dragonfly named Zed", "a helpful robot named Bolt"])
    for i in range(2000):
        record = gen.record(i)
        prot = record["protagonist"].lower()
        assert not any(b.lower() in prot for b in record["banned"]), record


def test_required_banned_minimum_that_pools_cannot_meet_is_a_config_error() -> None:
    """When every banned phrase clashes with the protagonist, generation stops with a clear error."""
    from storyforge.errors import ConfigError

    gen = make_generator(
        constraints=SeedConstraints(banned_count=IntRange(min=1, max=1)),
        protagonists=["a dragon named Ruby"],
        banned=["dragon", "ruby"],
    )
    with pytest.raises(ConfigError, match=r"pools\.banned has no 1 phrases compatible with protagonist"):
        gen.record(0)


# -- record validation ----------------------------------------------------------------------------


REJECTIONS = [
    pytest.param(
        good_record(split="test"), "schema", "split: 'test' is not one of ['train', 'val']", id="split"
    ),
    pytest.param(good_record(theme="bravery"), "schema", "theme: 'bravery' is not one of", id="theme"),
    pytest.param(
        good_record(required=["red ball"]), "schema", "required: ['red ball'] is too short", id="one_required"
    ),
    pytest.param(
        good_record(required=["ab", "red ball"]),
        "schema",
        "required[0]: 'ab' is too short",
        id="short_phrase",
    ),
    pytest.param(
        good_record(banned=["a", "b", "c"]),
        "schema",
        "banned: ['a', 'b', 'c'] is too long",
        id="three_banned",
    ),
    pytest.param(
        good_record(required=["red ball.", "kite"]),
        "schema",
        "required[0]: 'red ball.' is not a phrase without line breaks, sentence punctuation",
        id="punctuation",
    ),
    pytest.param(
        good_record(required=["red ball\n", "kite"]),
        "schema",
        "required[0]: 'red ball\\n' is not a phrase",
        id="newline",
    ),
    pytest.param(
        good_record(min_sentences=6.0), "schema", "min_sentences: 6.0 is not of type 'integer'", id="float"
    ),
    pytest.param(
        good_record(min_sentences=True), "schema", "min_sentences: True is not of type 'integer'", id="bool"
    ),
    pytest.param(
        good_record(max_sentences=0), "schema", "max_sentences: 0 is less than the minimum of 1", id="zero"
    ),
    pytest.param(
        good_record(requried=["x"]),
        "schema",
        "Additional properties are not allowed ('requried' was unexpected)",
        id="typo",
    ),
    pytest.param(
        {k: v for k, v in good_record().items() if k != "banned"},
        "schema",
        "'banned' is a required property",
        id="missing",
    ),
    pytest.param(good_record(id="bad id"), "schema", "id: 'bad id' is not an id of letters", id="id_pattern"),
    pytest.param(
        good_record(min_sentences=9, max_sentences=6),
        "sentence_range",
        "min_sentences (9) must be <= max_sentences (6)",
        id="min_gt_max",
    ),
    pytest.param(
        good_record(required=["red ball", "Red Ball"]),
        "duplicate_phrase",
        "phrase 'Red Ball' appears twice (also as 'red ball')",
        id="dup_required",
    ),
    pytest.param(
        good_record(banned=["Red Ball"]),
        "duplicate_phrase",
        "phrase 'Red Ball' appears twice",
        id="dup_across",
    ),
    pytest.param(
        good_record(banned=["ball"]),
        "unsatisfiable",
        "banned phrase 'ball' is part of required phrase 'red ball'",
        id="banned_in_required",
    ),
    pytest.param(
        good_record(banned=["big red ball"]),
        "unsatisfiable",
        "required phrase 'red ball' is part of banned phrase 'big red ball'",
        id="required_in_banned",
    ),
    pytest.param(
        good_record(banned=["TURTLE"]),
        "unsatisfiable",
        "banned phrase 'TURTLE' is part of the protagonist 'a shy turtle named Tim'",
        id="banned_in_protagonist",
    ),
    pytest.param(
        "not an object", "schema", "record: 'not an object' is not of type 'object'", id="not_object"
    ),
]


@pytest.mark.parametrize(("record", "rule", "message"), REJECTIONS)
def test_validator_rejects_with_rule_and_message(record: object, rule: str, message: str) -> None:
    """Each broken rule is reported with its rule name and a message that names the field."""
    rejection = SeedValidator(SPEC_CONSTRAINTS).check(record, line=7)
    assert rejection is not None
    assert (rejection.rule, rejection.line) == (rule, 7)
    assert message in rejection.message


def test_validator_accepts_a_good_record() -> None:
    """A record that follows every rule passes (no rejection)."""
    assert SeedValidator(SPEC_CONSTRAINTS).check(good_record()) is None
    assert SeedValidator(SPEC_CONSTRAINTS).check(good_record(banned=[])) is None


def test_configured_constraints_narrow_the_schema() -> None:
    """With required_count 3..4, a two-phrase seed is refused by both the fast check and jsonschema."""
    validator = SeedValidator(SeedConstraints(required_count=IntRange(min=3, max=4)))
    record = good_record()
    assert not validator.matches_schema(record)
    assert validator.schema_errors(record) == ["required: ['red ball', 'blue kite'] is too short"]
    assert packaged_seed_schema()["properties"]["required"]["minItems"] == 2


_PHRASES = ["red ball", "kite", "blue kite", "ab", "x.", "", " kite", "a" * 41, "tea\tcup", "toy\n"]
_ANY = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 15), st.text(max_size=8), st.lists(st.integers(), max_size=2)
)
_FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "id": st.one_of(st.sampled_from(["ts-1", "a", "A.b:c_d-9", "bad id", "", "-x", "x" * 129, "ts\n"]), _ANY),
    "split": st.one_of(st.sampled_from(["train", "val", "test", "Train"]), _ANY),
    "protagonist": st.one_of(st.sampled_from(["a dog", "Pip", "", " a dog", "Mr. Fox", "x" * 121]), _ANY),
    "theme": st.one_of(st.sampled_from([*THEME_SET, "bravery", "Kindness"]), _ANY),
    "required": st.one_of(st.lists(st.sampled_from(_PHRASES), max_size=5), _ANY),
    "banned": st.one_of(st.lists(st.sampled_from(_PHRASES), max_size=3), _ANY),
    "min_sentences": st.one_of(st.integers(-1, 12), st.floats(0, 9), _ANY),
    "max_sentences": st.one_of(st.integers(-1, 12), st.floats(0, 9), _ANY),
    "instruction": st.one_of(st.sampled_from(["", "x", "Write a story."]), _ANY),
    "extra": _ANY,
}


def _mutations() -> st.SearchStrategy[dict[str, Any]]:
    """A few fields replaced by plausible or broken values (so both verdicts are common)."""
    keys = st.sets(st.sampled_from(sorted(_FIELD_VALUES)), max_size=3)
    return keys.flatmap(lambda ks: st.fixed_dictionaries({k: _FIELD_VALUES[k] for k in sorted(ks)}))


@settings(max_examples=300, deadline=None)
@given(_mutations(), st.sets(st.sampled_from(SEED_FIELDS), max_size=1))
def test_fast_check_agrees_with_jsonschema(changes: dict[str, Any], dropped: set[str]) -> None:
    """The compiled check and jsonschema accept exactly the same records."""
    validator = SeedValidator(
        SeedConstraints(required_count=IntRange(min=2, max=3), banned_length=IntRange(min=3, max=12))
    )
    record = {k: v for k, v in good_record(**changes).items() if k not in dropped}
    assert validator.matches_schema(record) == (validator.schema_errors(record) == [])


# -- loaded files -------------------------------------------------------------------------------


def _fake_render(seed: dict[str, Any]) -> str:
    return "instruction for " + seed["protagonist"]


def test_audit_reports_bad_lines_by_id_or_line_and_keeps_the_rest(tmp_path: Path) -> None:
    """Bad JSON, schema breaks, duplicates and wrong instructions are rejected; good records flow on."""
    good = good_record(instruction=_fake_render(good_record()))
    lines = [
        json.dumps(good),
        "{not json",
        "",
        json.dumps(good_record(id="ts-2", banned=["ball"], instruction="x")),
        json.dumps(good),
        json.dumps(good_record(id="ts-3", instruction="something else")),
        json.dumps(
            {**good_record(id="ts-4"), "instruction": _fake_render(good_record()), "theme": "kindness"}
        ),
    ]
    path = tmp_path / "seeds.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = list(audit_seeds(read_seed_lines(path), SeedValidator(SPEC_CONSTRAINTS), _fake_render))
    rejected = [(r.line, r.id, r.rule) for r in out if isinstance(r, Rejection)]
    kept = [r["id"] for r in out if not isinstance(r, Rejection)]
    assert rejected == [
        (2, None, "invalid_json"),
        (4, "ts-2", "unsatisfiable"),
        (5, "ts-000001", "duplicate_id"),
        (6, "ts-3", "instruction_mismatch"),
    ]
    assert kept == ["ts-000001", "ts-4"]
    mismatch = next(r for r in out if isinstance(r, Rejection) and r.rule == "instruction_mismatch")
    assert mismatch.message == (
        "instruction differs from the canonical rendering at line 1: "
        "expected 'instruction for a shy turtle named Tim', got 'something else'"
    )


def test_audit_puts_fields_in_schema_order(tmp_path: Path) -> None:
    """A loaded record is written back with its keys in the schema's order."""
    record = good_record(instruction=_fake_render(good_record()))
    shuffled = dict(reversed(list(record.items())))
    path = tmp_path / "seeds.jsonl"
    path.write_text(json.dumps(shuffled) + "\n", encoding="utf-8")
    (out,) = audit_seeds(read_seed_lines(path), SeedValidator(SPEC_CONSTRAINTS), _fake_render)
    assert isinstance(out, dict) and list(out) == list(SEED_FIELDS)


def test_rejection_row_shape() -> None:
    """rejected_seeds.jsonl rows carry line, id, rule and message."""
    r = Rejection(rule="schema", message="m", id="ts-1", line=3)
    assert r.as_record() == {"line": 3, "id": "ts-1", "rule": "schema", "message": "m"}
    assert str(r) == "seed 'ts-1' (line 3): schema: m"
    assert copy.copy(r) == r
