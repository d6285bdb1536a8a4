"""The template store: validation before writes, revalidation on load, files, concurrency."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import create_engine, text

from storyforge.errors import StoreError, TemplateValidationError
from storyforge.store import TemplateStore, content_hash, default_url, read_template_file

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "conf" / "template"


def _template(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": "mini_turn",
        "name": "Mini turn writer",
        "task": "turn_generation",
        "version": 1,
        "layout": [
            {"kind": "message", "role": "system", "content": "Write as {{actor.name}}."},
            {"kind": "slot", "name": "history"},
            {"kind": "slot", "name": "a_tie"},
        ],
        "slots": {
            "history": {
                "priority": 0,
                "plan": [
                    {
                        "kind": "forEach",
                        "source": {"source": "turns", "args": {"limit": 3}},
                        "fillDir": "prepend",
                        "map": [{"kind": "message", "role": "user", "content": "{{item.content}}"}],
                    }
                ],
            },
            "a_tie": {"priority": 0, "plan": [{"kind": "message", "role": "user", "content": "go"}]},
        },
    }
    doc.update(changes)
    return doc


@pytest.fixture
def store(store_url: str) -> Any:
    with TemplateStore(store_url) as s:
        yield s


def _sql(db: Path, query: str, *params: Any) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(db)
    try:
        rows = con.execute(query, params).fetchall()
        con.commit()
        return rows
    finally:
        con.close()


def _exec(url: str, query: str, **params: Any) -> None:
    """Run one statement on the store's database behind the store's back (any backend)."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(text(query), params)
    finally:
        engine.dispose()


def test_create_get_load_round_trip(store: TemplateStore) -> None:
    """A created template reads back byte-for-byte in its own key order and compiles on load."""
    record = store.create(_template())
    assert (record.id, record.name, record.task, record.version, record.revision) == (
        "mini_turn",
        "Mini turn writer",
        "turn_generation",
        1,
        1,
    )
    assert record.created_at == record.updated_at
    assert record.created_at.tzinfo is not None
    again = store.get("mini_turn")
    assert again.document() == _template()
    assert list(again.document()["slots"]) == ["history", "a_tie"]  # order is meaning: ties run in order
    assert again.content_hash == content_hash(_template())
    loaded = store.load("mini_turn")
    assert loaded.kind.name == "turn_generation"
    assert loaded.compiled.content_hash  # a compiled, frozen template
    assert loaded.data == _template()


def test_content_hash_depends_on_key_order() -> None:
    """Reordering slots changes the hash, because it changes which equal-priority slot runs first."""
    doc = _template()
    swapped = dict(doc, slots={"a_tie": doc["slots"]["a_tie"], "history": doc["slots"]["history"]})
    assert content_hash(doc) != content_hash(swapped)


def test_create_refuses_a_taken_id(store: TemplateStore) -> None:
    """Creating an id twice is an error that points at update."""
    store.create(_template())
    with pytest.raises(
        StoreError, match=re.escape(f"template 'mini_turn' already exists in {store.display_url}; use update")
    ):
        store.create(_template())


def test_update_bumps_revision_only_on_change(store: TemplateStore) -> None:
    """Update replaces the document and counts revisions; an identical update changes nothing."""
    first = store.create(_template())
    same = store.update(_template())
    assert same.revision == 1
    assert same.updated_at == first.updated_at
    changed = store.update(_template(name="Renamed"))
    assert changed.revision == 2
    assert changed.name == "Renamed"
    assert changed.created_at == first.created_at
    assert changed.updated_at >= first.updated_at


def test_update_and_delete_of_unknown_ids(store: TemplateStore) -> None:
    """Update and delete of a missing id fail with a suggestion of the closest stored id."""
    store.create(_template())
    with pytest.raises(StoreError, match=re.escape("no template 'mini_turm'") + ".*Did you mean 'mini_turn'"):
        store.update(_template(id="mini_turm"))
    with pytest.raises(StoreError, match="no template 'gone'"):
        store.delete("gone")
    store.delete("mini_turn")
    assert store.list() == []


def test_save_creates_then_updates(store: TemplateStore) -> None:
    """save() reports whether the template was added, updated or left unchanged."""
    assert store.save(_template())[1] == "added"
    assert store.save(_template())[1] == "unchanged"
    record, status = store.save(_template(name="Again"))
    assert status == "updated"
    assert record.revision == 2


def test_invalid_template_reports_every_problem_and_is_not_stored(store: TemplateStore) -> None:
    """Schema, source, argument and structure problems come back together; nothing is written."""
    bad = _template()
    bad["slots"]["history"]["plan"][0]["source"] = {"source": "turnz"}
    bad["slots"]["a_tie"]["plan"][0]["prefix"] = True
    bad["slots"]["a_tie"]["priority"] = -1
    bad["layout"].append({"kind": "slot", "name": "missing"})
    bad["slots"]["extra"] = {
        "priority": 1,
        "plan": [{"kind": "forEach", "source": {"source": "turns", "args": {"limit": 0}}, "map": []}],
    }
    with pytest.raises(TemplateValidationError) as info:
        store.create(bad)
    codes = {str(i.path): i.code for i in info.value.issues}
    assert codes["slots.history.plan[0].source"] == "unknown_source"
    assert codes["slots.a_tie.priority"] == "schema"
    assert codes["slots.extra.plan[0].source.args"] == "bad_args"
    assert any(i.code == "prefix_role" for i in info.value.issues)
    assert any("missing" in i.message for i in info.value.issues)
    assert info.value.template_name == "mini_turn"
    assert store.list() == []


@pytest.mark.parametrize(
    ("changes", "task", "code", "fragment"),
    [
        pytest.param(
            {"task": "turn_generaton"}, None, "unknown_task", "Did you mean 'turn_generation'?", id="typo"
        ),
        pytest.param(
            {}, "writing_assistant", "task_mismatch", 'Task kind must be "writing_assistant"', id="binding"
        ),
    ],
)
def test_task_binding(
    store: TemplateStore, changes: dict[str, Any], task: str | None, code: str, fragment: str
) -> None:
    """A template must be for a known task kind, and for the one the caller expects."""
    with pytest.raises(TemplateValidationError) as info:
        store.create(_template(**changes), task=task)
    assert any(i.code == code and fragment in i.message for i in info.value.issues), info.value
    assert store.list() == []


def test_sqlite_runs_in_wal_mode(tmp_path: Path) -> None:
    """The embedded store switches SQLite to write-ahead logging."""
    db = tmp_path / "nested" / "dir" / "wal.db"
    with TemplateStore(f"sqlite:///{db}") as store:
        store.create(_template())
    assert _sql(db, "PRAGMA journal_mode") == [("wal",)]


def test_in_memory_url_works(tmp_path: Path) -> None:
    """Any SQLAlchemy URL works, including an in-memory SQLite database."""
    with TemplateStore("sqlite://") as store:
        store.create(_template())
        assert [r.id for r in store.list()] == ["mini_turn"]


def test_unreachable_store_hides_the_password() -> None:
    """A store that cannot be opened is a StoreError whose URL has its password masked."""
    with pytest.raises(StoreError) as info:
        TemplateStore("nosuchdialect://user:s3cret@db.example/prompts")
    assert "s3cret" not in str(info.value)
    assert "cannot open template store nosuchdialect://user:***@db.example/prompts" in str(info.value)


def test_database_errors_are_store_errors(tmp_path: Path) -> None:
    """A file that is not a database, or a table dropped under the store, is a StoreError naming the URL."""
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match=re.escape(f"cannot open template store sqlite:///{junk}")):
        TemplateStore(f"sqlite:///{junk}")
    db = tmp_path / "store.db"
    with TemplateStore(f"sqlite:///{db}") as store:
        _sql(db, "DROP TABLE prompt_templates")
        with pytest.raises(
            StoreError, match=re.escape(f"template store sqlite:///{db} failed: no such table")
        ):
            store.list()


def test_default_url_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """STORYFORGE_STORE overrides the default SQLite file."""
    monkeypatch.delenv("STORYFORGE_STORE", raising=False)
    assert default_url() == "sqlite:///storyforge.db"
    monkeypatch.setenv("STORYFORGE_STORE", "sqlite:////tmp/other.db")
    assert default_url() == "sqlite:////tmp/other.db"


# --- out-of-band edits --------------------------------------------------------------------


def _edit_raw(url: str, template_id: str, raw: str, *, rehash: bool) -> None:
    if rehash:
        _exec(
            url,
            "UPDATE prompt_templates SET raw=:raw, content_hash=:digest WHERE id=:id",
            raw=raw,
            digest=content_hash(json.loads(raw)),
            id=template_id,
        )
    else:
        _exec(url, "UPDATE prompt_templates SET raw=:raw WHERE id=:id", raw=raw, id=template_id)


def test_out_of_band_edit_is_caught_on_load(store_url: str) -> None:
    """A broken source written straight into the table fails load, naming template, row and problems."""
    with TemplateStore(store_url) as store:
        store.create(_template())
        broken = _template()
        broken["slots"]["history"]["plan"][0]["source"]["source"] = "turnz"
        _edit_raw(store_url, "mini_turn", json.dumps(broken), rehash=False)
        with pytest.raises(TemplateValidationError) as info:
            store.load("mini_turn")
    err = info.value
    shown = store.display_url
    assert err.template_name == "mini_turn"
    assert err.source == f"store:{shown}#mini_turn"
    assert [i.code for i in err.issues] == ["hash_mismatch", "unknown_source"]
    message = str(err)
    assert message.startswith(f"2 problems in template 'mini_turn' (store:{shown}#mini_turn)")
    assert "edited outside storyforge" in message
    assert "slots.history.plan[0].source: unknown source 'turnz'. Did you mean 'turns'?" in message


def test_consistent_but_invalid_edit_is_still_caught(store_url: str) -> None:
    """Even with a matching hash, revalidation on load rejects a template that is no longer valid."""
    with TemplateStore(store_url) as store:
        store.create(_template())
        broken = _template()
        broken["slots"]["history"]["plan"][0]["source"]["args"] = {"limit": 0}
        _edit_raw(store_url, "mini_turn", json.dumps(broken), rehash=True)
        with pytest.raises(TemplateValidationError) as info:
            store.load("mini_turn")
    assert [(str(i.path), i.code) for i in info.value.issues] == [
        ("slots.history.plan[0].source.args", "bad_args")
    ]


def test_hash_mismatch_alone_is_flagged(store_url: str) -> None:
    """A valid edit made without updating the hash is still refused on load."""
    with TemplateStore(store_url) as store:
        store.create(_template())
        _edit_raw(store_url, "mini_turn", json.dumps(_template(name="Sneaky")), rehash=False)
        with pytest.raises(TemplateValidationError) as info:
            store.load("mini_turn")
        assert [i.code for i in info.value.issues] == ["hash_mismatch", "store_mismatch"]
        store.update(_template(name="Sneaky"))  # storing it again through the store repairs it
        assert store.load("mini_turn").record.name == "Sneaky"


@pytest.mark.parametrize(
    ("raw", "codes"),
    [
        pytest.param('{"id": "mini_turn", ', ["syntax"], id="truncated-json"),
        pytest.param('{"id": "mini_turn", "id": "x"}', ["duplicate_key"], id="duplicate-key"),
        pytest.param("[]", ["hash_mismatch", "schema"], id="not-a-mapping"),
    ],
)
def test_unparseable_rows_are_reported(store_url: str, raw: str, codes: list[str]) -> None:
    """A row whose JSON does not parse, or is not a template, fails load with the parser's issue."""
    with TemplateStore(store_url) as store:
        store.create(_template())
        _edit_raw(store_url, "mini_turn", raw, rehash=False)
        with pytest.raises(TemplateValidationError) as info:
            store.load("mini_turn")
    found = [i.code for i in info.value.issues]
    assert all(code in found for code in codes), found


def test_column_edit_is_caught(store_url: str) -> None:
    """A task column that disagrees with the document is reported on load."""
    with TemplateStore(store_url) as store:
        store.create(_template())
        _exec(store_url, "UPDATE prompt_templates SET task='writing_assistant' WHERE id='mini_turn'")
        with pytest.raises(TemplateValidationError) as info:
            store.load("mini_turn")
    assert [(str(i.path), i.code) for i in info.value.issues] == [("task", "store_mismatch")]


# --- files ----------------------------------------------------------------------------------


def test_import_conf_templates_and_export_round_trip(store: TemplateStore, tmp_path: Path) -> None:
    """Every conf/template file imports; exporting to JSON and YAML and re-reading keeps the hash."""
    ours = [
        TEMPLATES / f"{name}.yaml"
        for name in (
            "turn_writer",
            "narrator_turn",
            "chapter_summary",
            "chapter_summary_json",
            "writing_rewrite",
            "writing_continue",
        )
    ]
    results = store.import_paths(ours)
    assert [status for _, status in results] == ["added"] * len(ours)
    for record, _ in results:
        for suffix in (".json", ".yaml"):
            target = store.export(record.id, tmp_path / "out" / f"{record.id}{suffix}")
            assert content_hash(read_template_file(target).data) == record.content_hash
    yaml_text = (tmp_path / "out" / "turn_writer.yaml").read_text(encoding="utf-8")
    assert "    content: |-\n      You are co-writing" in yaml_text  # multi-line strings stay readable
    again = store.import_paths(tmp_path / "out")
    assert {status for _, status in again} == {"unchanged"}
    assert {r.revision for r, _ in again} == {1}  # same content: no new revision


def test_import_is_all_or_nothing(store: TemplateStore, tmp_path: Path) -> None:
    """One bad file in a folder stops the import before anything is stored, naming that file."""
    folder = tmp_path / "tpl"
    folder.mkdir()
    (folder / "a_good.json").write_text(json.dumps(_template()), encoding="utf-8")
    bad = _template(id="bad_one")
    bad["slots"]["history"]["plan"][0]["source"]["source"] = "nope"
    (folder / "b_bad.yaml").write_text(yaml.safe_dump(bad), encoding="utf-8")
    with pytest.raises(TemplateValidationError) as info:
        store.import_paths(folder)
    assert "b_bad.yaml" in str(info.value)
    assert store.list() == []


def test_yaml_hydra_defaults_are_not_part_of_the_template(tmp_path: Path) -> None:
    """A Hydra defaults list at the top of a YAML template is dropped on import."""
    path = tmp_path / "with_defaults.yaml"
    path.write_text(
        yaml.safe_dump({"defaults": ["_self_"], **_template()}, sort_keys=False), encoding="utf-8"
    )
    assert read_template_file(path).data == _template()


def test_export_writes_atomically(store: TemplateStore, tmp_path: Path) -> None:
    """Export leaves no temporary files behind and replaces an existing file whole."""
    store.create(_template())
    target = tmp_path / "x.json"
    target.write_text("old", encoding="utf-8")
    store.export("mini_turn", target)
    assert json.loads(target.read_text(encoding="utf-8")) == _template()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".x.json")) == []


# --- concurrency ----------------------------------------------------------------------------


def test_concurrent_thread_readers_and_a_writer(store_url: str) -> None:
    """Threads loading while another thread updates always see a whole, valid version."""
    versions = [_template(name=f"v{i}") for i in range(6)]
    with TemplateStore(store_url) as store:
        store.create(versions[0])

        def reader() -> list[str]:
            return [store.load("mini_turn").record.content_hash for _ in range(15)]

        with ThreadPoolExecutor(max_workers=6) as pool:
            futures = [pool.submit(reader) for _ in range(6)]
            for v in versions[1:]:
                store.update(v)
            seen = [h for f in futures for h in f.result()]  # a reader's exception is raised here
        assert store.get("mini_turn").revision == 6
    assert len(seen) == 90
    assert set(seen) <= {content_hash(v) for v in versions}


def test_concurrent_thread_writers(store_url: str) -> None:
    """Writers in several threads all succeed: each locks what it changes and waits its turn."""
    with TemplateStore(store_url) as store:
        store.create(_template(id="shared"))

        def writer(n: int) -> None:
            for i in range(4):
                store.create(_template(id=f"t{n}_{i}"))
                store.update(_template(id="shared", name=f"writer {n} pass {i}"))

        with ThreadPoolExecutor(max_workers=4) as pool:
            for future in [pool.submit(writer, n) for n in range(4)]:
                future.result()
        assert len(store.list()) == 17
        assert store.get("shared").revision == 17


READER = textwrap.dedent(
    """
    import sys
    from storyforge.store import TemplateStore
    with TemplateStore(sys.argv[1]) as store:
        for _ in range(int(sys.argv[2])):
            for record in store.list():
                print(store.load(record.id).record.content_hash)
    """
)


def test_concurrent_process_readers(store_url: str) -> None:
    """Processes read the same store while this one keeps writing; none fails or sees a torn row."""
    url = store_url
    versions = [_template(name=f"v{i}") for i in range(5)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    writes = 0
    with TemplateStore(url) as store:
        store.create(versions[0])
        store.create(_template(id="second"))
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", READER, url, "10"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(2)
        ]
        while any(p.poll() is None for p in procs):  # keep writing until every reader is done
            writes += 1
            store.update(versions[writes % len(versions)])
            time.sleep(0.002)
        outputs = [p.communicate(timeout=120) for p in procs]
    assert writes > 1
    allowed = {content_hash(v) for v in versions} | {content_hash(_template(id="second"))}
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        lines = out.split()
        assert len(lines) == 20
        assert set(lines) <= allowed


# --- several processes on one store (SQLite and PostgreSQL) ---------------------------------

# Each process waits until the same moment before it starts, so their writes really overlap.
UPDATER = textwrap.dedent(
    """
    import json, sys, time
    from storyforge.store import TemplateStore
    url, worker, passes, start_at, doc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), json.loads(sys.argv[5])
    with TemplateStore(url) as store:
        time.sleep(max(0.0, start_at - time.time()))
        for i in range(passes):
            doc["name"] = f"worker {worker} pass {i}"
            print(store.update(doc).revision)
    """
)
OPENER = textwrap.dedent(
    """
    import sys, time
    from storyforge.store import TemplateStore
    time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
    with TemplateStore(sys.argv[1]) as store:
        print(len(store.list()))
    """
)


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _run_all(commands: list[list[str]]) -> list[tuple[int, str, str]]:
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
        for cmd in commands
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        results.append((proc.returncode, out, err))
    return results


def test_concurrent_process_updates_lose_no_revision(store_url: str) -> None:
    """8 processes x 10 updates of one template: revision 81 at the end, every revision kept once."""
    with TemplateStore(store_url) as store:
        store.create(_template())
    start_at = str(time.time() + 3.0)
    results = _run_all(
        [
            [sys.executable, "-c", UPDATER, store_url, str(w), "10", start_at, json.dumps(_template())]
            for w in range(8)
        ]
    )
    for code, _out, err in results:
        assert code == 0, err
    seen = sorted(int(line) for _code, out, _err in results for line in out.split())
    assert seen == list(range(2, 82))  # each update got its own revision, none twice
    with TemplateStore(store_url) as store:
        assert store.get("mini_turn").revision == 81
        history = store.revisions("mini_turn")
        assert [r.revision for r in history] == list(range(1, 82))
        assert len({r.name for r in history[1:]}) == 80
        assert history[-1].raw == store.get("mini_turn").raw


def test_concurrent_imports_into_an_empty_store_all_succeed(store_url: str) -> None:
    """8 concurrent 'storyforge --store URL templates import conf/template' leave a complete store."""
    expected = sorted(read_template_file(p).data["id"] for p in TEMPLATES.iterdir() if p.suffix == ".yaml")
    cmd = [
        sys.executable,
        "-m",
        "storyforge.cli",
        "--store",
        store_url,
        "templates",
        "import",
        str(TEMPLATES),
    ]
    results = _run_all([cmd] * 8)
    for code, _out, err in results:
        assert code == 0, err
    statuses = [line.split()[0] for _code, out, _err in results for line in out.splitlines()]
    assert statuses.count("added") == len(expected)  # each template added by exactly one import
    assert set(statuses) == {"added", "unchanged"}
    with TemplateStore(store_url) as store:
        records = store.list()
        assert [r.id for r in records] == expected
        assert {r.revision for r in records} == {1}


def test_concurrent_first_opens_create_the_tables_once(store_url: str) -> None:
    """Many processes opening a store that has no tables yet all succeed."""
    start_at = str(time.time() + 3.0)
    results = _run_all([[sys.executable, "-c", OPENER, store_url, start_at]] * 8)
    for code, out, err in results:
        assert (code, out.strip()) == (0, "0"), err


def test_revisions_are_kept_and_readable(store: TemplateStore) -> None:
    """Every stored revision can be read back; an unknown revision names the ones kept."""
    store.create(_template())
    store.update(_template(name="second"))
    store.update(_template(name="second"))  # unchanged: no new revision
    store.update(_template(name="third"))
    assert [(r.revision, r.name) for r in store.revisions("mini_turn")] == [
        (1, "Mini turn writer"),
        (2, "second"),
        (3, "third"),
    ]
    assert store.get("mini_turn", revision=2).document() == _template(name="second")
    with pytest.raises(StoreError, match=r"has no revision 7 .*\(kept: 1, 2, 3\)"):
        store.get("mini_turn", revision=7)
    store.delete("mini_turn")
    store.create(_template())
    assert [r.revision for r in store.revisions("mini_turn")] == [1]


@pytest.mark.parametrize(
    ("change", "path", "limit"),
    [
        pytest.param({"id": "t" * 201}, "id", 200, id="id"),
        pytest.param({"name": "n" * 501}, "name", 500, id="name"),
    ],
)
def test_overlong_columns_are_template_errors(
    store: TemplateStore, change: dict[str, str], path: str, limit: int
) -> None:
    """Values longer than the store's columns are refused with the template path, on every database."""
    with pytest.raises(TemplateValidationError) as info:
        store.create(_template(**change))
    assert [(str(i.path), i.code) for i in info.value.issues] == [(path, "too_long")]
    assert f"at most {limit}" in str(info.value)
    assert store.list() == []
    store.create(_template(**{path: change[path][:limit]}))  # the limit itself fits
    assert len(store.list()) == 1


@pytest.mark.parametrize("before", [True, False], ids=["store-first", "store-after"])
def test_store_option_before_or_after_the_subcommand(store_url: str, before: bool) -> None:
    """--store works before 'templates' and after the action alike."""
    with TemplateStore(store_url) as store:
        store.create(_template())
    args = (
        ["--store", store_url, "templates", "list"] if before else ["templates", "list", "--store", store_url]
    )
    done = subprocess.run(
        [sys.executable, "-m", "storyforge.cli", *args],
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "mini_turn" in done.stdout
