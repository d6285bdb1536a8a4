"""Template ids as names: the same id rule in the store (SQLite and PostgreSQL), the command and the export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from storyforge.errors import StoreError, TemplateValidationError
from storyforge.ids import file_stem, id_problem, normal_id
from storyforge.store import TemplateStore, content_hash

ROOT = Path(__file__).resolve().parents[1]


def _template(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": "mini",
        "name": "Mini",
        "task": "turn_generation",
        "version": 1,
        "layout": [{"kind": "message", "role": "system", "content": "Write as {{actor.name}}."}],
        "slots": {},
    }
    doc.update(changes)
    return doc


@pytest.fixture
def store(store_url: str) -> Any:
    with TemplateStore(store_url) as s:
        yield s


UNSAFE = [
    pytest.param("../conf/config", "path separator", id="parent-path"),
    pytest.param("/abs/x", "path separator", id="absolute"),
    pytest.param("a\\b", "path separator", id="backslash"),
    pytest.param("C:evil", "path separator", id="drive"),
    pytest.param("..", "names a folder", id="dotdot"),
    pytest.param(".", "names a folder", id="dot"),
    pytest.param("a\x00b", "U+0000", id="nul"),
    pytest.param("a\nb", "U+000A", id="newline"),
    pytest.param("a\x1bb", "U+001B", id="escape"),
    pytest.param("a\u2028b", "U+2028", id="line-separator"),
    pytest.param("a\x85b", "U+0085", id="next-line"),
    pytest.param(" a", "starts or ends with a space", id="leading-space"),
    pytest.param("", "empty", id="empty"),
]


@pytest.mark.parametrize(("bad", "reason"), UNSAFE)
def test_unsafe_ids_are_refused_on_every_database(store: TemplateStore, bad: str, reason: str) -> None:
    """An id that is a path, a folder or holds a control character is a template error; nothing is stored."""
    with pytest.raises(TemplateValidationError) as info:
        store.create(_template(id=bad))
    assert any(i.code == "unsafe_id" and reason in i.message for i in info.value.issues), info.value
    assert store.list() == []


def test_nfc_and_nfd_ids_are_one_template(store: TemplateStore) -> None:
    """`é` typed as one code point or as e + accent is the same template, kept in NFC and found either way."""
    nfc, nfd = "caf\u00e9", "cafe\u0301"
    first = store.create(_template(id=nfd))
    assert first.id == nfc
    assert store.get(nfd).id == nfc and store.get(nfc).id == nfc
    assert store.save(_template(id=nfc))[1] == "unchanged"
    with pytest.raises(StoreError, match="already exists"):
        store.create(_template(id=nfc))
    assert [r.id for r in store.list()] == [nfc]
    assert store.load(nfd).data["id"] == nfc  # the document says the id the row says
    store.delete(nfd)
    assert store.list() == []


def test_nul_in_name_is_refused_the_same_on_both_databases(store: TemplateStore) -> None:
    """PostgreSQL holds no NUL in text; the store refuses it in the name everywhere, and a NUL id lookup is unknown."""
    with pytest.raises(TemplateValidationError, match="name holds a NUL"):
        store.create(_template(name="a\x00b"))
    with pytest.raises(StoreError, match="no template"):
        store.get("a\x00b")


def test_nul_inside_content_is_kept_on_both_databases(store: TemplateStore) -> None:
    """A NUL inside message text (valid JSON data) is stored escaped and reads back as itself."""
    doc = _template(layout=[{"kind": "message", "role": "system", "content": "a\x00b {{actor.name}}"}])
    record = store.create(doc)
    assert store.get("mini").document() == doc
    assert record.content_hash == content_hash(doc)
    assert store.load("mini").data == doc


@pytest.mark.parametrize("revision", [10**30, 2**63, -(2**63) - 1, 0, -1])
def test_a_huge_revision_number_is_an_unknown_revision(store: TemplateStore, revision: int) -> None:
    """A revision past any integer column is 'no revision', never an overflow."""
    store.create(_template())
    store.update(_template(name="Mini 2"))
    with pytest.raises(StoreError, match=r"has no revision .*\(kept: 1, 2\)"):
        store.get("mini", revision=revision)


def _plant(url: str, template_id: str) -> None:
    """Write a row with an unsafe id behind the store's back (as an older storyforge could)."""
    doc = _template(id=template_id)
    raw = json.dumps(doc, separators=(",", ":"))
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO prompt_templates (id, name, task, version, revision, raw, content_hash,"
                    " created_at, updated_at) VALUES (:id, 'x', 'turn_generation', 1, 1, :raw, :h,"
                    " CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                ),
                {"id": template_id, "raw": raw, "h": content_hash(doc)},
            )
    finally:
        engine.dispose()


def test_export_all_never_writes_outside_its_folder(store_url: str, tmp_path: Path) -> None:
    """Rows with path-like ids (planted behind the store) export into the folder under encoded names."""
    with TemplateStore(store_url) as store:
        store.create(_template(id="good"))
    for bad in ("../planted", "/tmp/abs_planted", "..", "sub/dir/x"):
        _plant(store_url, bad)
    out = tmp_path / "work" / "export"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "storyforge.cli",
            "templates",
            "--store",
            store_url,
            "export",
            "--all",
            str(out),
        ],
        capture_output=True,
        check=False,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    written = sorted(p.name for p in out.iterdir())
    assert written == sorted(
        ["good.json", "..%2Fplanted.json", "%2Ftmp%2Fabs_planted.json", "%...json", "sub%2Fdir%2Fx.json"]
    )
    assert not (tmp_path / "work" / "planted.json").exists()
    assert sorted(p.name for p in (tmp_path / "work").rglob("*") if p.is_file()) == written
    assert all(out in Path(line).parents for line in done.stdout.splitlines())


def test_the_command_refuses_an_unsafe_id_in_a_file(tmp_path: Path) -> None:
    """`storyforge templates add` of a file whose id is a path fails in a few lines, with no traceback."""
    file = tmp_path / "t.json"
    file.write_text(json.dumps(_template(id="../conf/config")), encoding="utf-8")
    store = f"sqlite:///{tmp_path / 's.db'}"
    done = subprocess.run(
        [sys.executable, "-m", "storyforge.cli", "templates", "--store", store, "add", str(file)],
        capture_output=True,
        check=False,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert "ids become file names" in done.stderr


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=12))
def test_any_id_is_refused_or_a_plain_file_name(value: str) -> None:
    """Every id the rule accepts, and the stem of every id at all, is one plain file name in its folder."""
    for stem in (file_stem(value), *([normal_id(value)] if id_problem(normal_id(value)) is None else [])):
        assert stem not in ("", ".", "..")
        assert "/" not in stem and "\\" not in stem and "\x00" not in stem
        assert Path("folder", stem + ".json").parent == Path("folder")
        assert unicodedata.normalize("NFC", stem) == stem
