"""generate_for_job against a real loopback server: exact-once output under faults, resume, secrets."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import re

import pytest
from provider_support import assert_exactly_once, ollama_cfg, openai_cfg, records, write_prompts

from storyforge.errors import ConfigError, DataError, ProviderError
from storyforge.providers import build_provider, generate_for_job, plan, sending
from storyforge.providers.base import canonical_json
from storyforge.providers.journal import REPLACED_NAME, Appender
from tests.support.fake_server import FakeServer, Fault


def test_every_fault_kind_still_gives_each_sample_exactly_once(server, tmp_path):
    """500, 429+Retry-After, stalls, malformed JSON, cut and dropped connections: all retried, none lost."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 12)
    faults = [
        Fault.http(500),
        Fault.rate_limited("0"),
        Fault.stall(3.0),
        Fault.malformed(),
        Fault.cut(),
        Fault.drop(),
        Fault.http(502),
        Fault.malformed('{"choices": []}'),
    ]
    server.queue_faults(*faults)
    path, stats = generate_for_job(openai_cfg(server, samples=3, seed=100, timeout_s=1.0), tmp_path, prompts)
    recs = assert_exactly_once(path, 12, 3)
    assert all(r["error"] is None for r in recs)
    assert {r["output"] for r in recs if r["id"] == "p004"} == {
        f"reply to: tell p004 seed={100 + k}" for k in range(3)
    }
    assert stats["requests"] == 36 and stats["errors"] == 0 and stats["retries"] == len(faults)
    assert server.request_count == 36 + len(faults)
    assert sum(r["attempts"] for r in recs) == 36 + len(faults)
    assert stats["tokens"] == {
        "prompt": sum(r["usage"]["prompt_tokens"] for r in recs),
        "completion": sum(r["usage"]["completion_tokens"] for r in recs),
    }
    assert {r["split"] for r in recs} == {"train", "val"}


def test_record_fields(server, tmp_path):
    """Each line holds id, split, sample, request_hash, output, finish_reason, usage, latency_s, attempts, error."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 1)
    path, _ = generate_for_job(openai_cfg(server), tmp_path, prompts)
    (rec,) = records(path)
    assert list(rec) == [
        "id",
        "split",
        "sample",
        "request_hash",
        "output",
        "finish_reason",
        "usage",
        "latency_s",
        "attempts",
        "error",
    ]
    assert (
        rec["id"] == "p000" and rec["sample"] == 0 and rec["finish_reason"] == "stop" and rec["error"] is None
    )
    assert re.fullmatch(r"[0-9a-f]{64}", rec["request_hash"]) and rec["latency_s"] >= 0


def test_request_failing_every_try_becomes_an_error_record(server, tmp_path):
    """A request that fails after all retries is written with output null and the error; the rest go on."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 6)
    server.rule = lambda r: Fault.http(500, "GPU fell over") if "p003" in json.dumps(r.json) else None
    path, stats = generate_for_job(openai_cfg(server, samples=2, max_retries=2), tmp_path, prompts)
    recs = assert_exactly_once(path, 6, 2)
    failed = [r for r in recs if r["error"] is not None]
    assert {(r["id"], r["sample"]) for r in failed} == {("p003", 0), ("p003", 1)}
    assert all(r["output"] is None and r["usage"] is None and r["attempts"] == 3 for r in failed)
    assert failed[0]["error"] == "gave up after 3 attempts: HTTP 500: GPU fell over"
    assert stats["errors"] == 2 and stats["retries"] == 4


def test_error_records_are_retried_on_the_next_run(server, tmp_path):
    """A rerun retries recorded errors, keeps each key once, and moves the old error lines aside."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 4)
    server.rule = lambda r: Fault.http(503) if "p001" in json.dumps(r.json) else None
    generate_for_job(openai_cfg(server, max_retries=0), tmp_path, prompts)
    server.rule = None
    before = server.request_count
    path, stats = generate_for_job(openai_cfg(server, max_retries=0), tmp_path, prompts)
    recs = assert_exactly_once(path, 4, 1)
    assert all(r["error"] is None for r in recs)
    assert server.request_count - before == 1 and stats["resumed"] == 3 and stats["requests"] == 1
    aside = records(tmp_path / REPLACED_NAME)
    assert [(r["id"], r["error"] is not None) for r in aside] == [("p001", True)]


def test_non_retryable_error_stops_early_after_writing_what_finished(tmp_path):
    """A 401 mid-run raises ProviderError naming the status and text; finished records are on disk."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 20)
    with FakeServer() as server:
        server.rule = lambda r: Fault.http(401, "Invalid token") if server.request_count > 5 else None
        with pytest.raises(ProviderError) as err:
            generate_for_job(openai_cfg(server, concurrency=1), tmp_path, prompts)
        assert err.value.status == 401
        assert "answered HTTP 401 Unauthorized for prompt 'p005' sample 0: Invalid token" in str(err.value)
        done = records(tmp_path / "generations.jsonl")
        assert [r["id"] for r in done] == [f"p{i:03d}" for i in range(5)]
        server.rule = None
        path, stats = generate_for_job(openai_cfg(server, concurrency=3), tmp_path, prompts)
    assert_exactly_once(path, 20, 1)
    assert stats["resumed"] == 5 and stats["requests"] == 15


def test_rerun_with_the_same_config_sends_nothing(server, tmp_path):
    """Everything done: the rerun makes no request and reports the file's totals."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 5)
    cfg = openai_cfg(server, samples=2)
    _, first = generate_for_job(cfg, tmp_path, prompts)
    count = server.request_count
    path, second = generate_for_job(openai_cfg(server, samples=2, root={"resume": True}), tmp_path, prompts)
    assert server.request_count == count
    assert (second["resumed"], second["requests"], second["tokens"]) == (10, 0, first["tokens"])
    assert_exactly_once(path, 5, 2)


def test_more_samples_later_adds_only_the_new_ones(server, tmp_path):
    """Raising samples from 1 to 3 keeps sample 0 and asks only for samples 1 and 2."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 4)
    generate_for_job(openai_cfg(server, samples=1, seed=5), tmp_path, prompts)
    path, stats = generate_for_job(openai_cfg(server, samples=3, seed=5), tmp_path, prompts)
    assert_exactly_once(path, 4, 3)
    assert stats["resumed"] == 4 and stats["requests"] == 8


def test_torn_last_line_is_cut_before_appending(server, tmp_path):
    """A half-written last line (crash) is truncated and its request made again."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 6)
    path, _ = generate_for_job(openai_cfg(server), tmp_path, prompts)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:4]) + lines[4][: len(lines[4]) // 2])
    path2, stats = generate_for_job(openai_cfg(server), tmp_path, prompts)
    assert_exactly_once(path2, 6, 1)
    assert stats["resumed"] == 4 and stats["requests"] == 2


def test_garbage_inside_the_file_is_reported_not_dropped(server, tmp_path):
    """A bad line that is not the last one is a DataError with file and line number."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 3)
    path, _ = generate_for_job(openai_cfg(server), tmp_path, prompts)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + "{not json\n" + "".join(lines[1:]))
    with pytest.raises(
        DataError,
        match=re.escape(f"{path}:2: not JSON: Expecting property name enclosed in double quotes (column 2)"),
    ):
        generate_for_job(openai_cfg(server), tmp_path, prompts)


def test_changed_config_is_refused_by_default(server, tmp_path):
    """Records made with another temperature are stale: the run refuses and says how to proceed."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 3)
    generate_for_job(openai_cfg(server, temperature=1.0), tmp_path, prompts)
    count = server.request_count
    with pytest.raises(ConfigError) as err:
        generate_for_job(openai_cfg(server, temperature=0.2), tmp_path, prompts)
    assert "holds 3 record(s) that do not match this run's config" in str(err.value)
    assert "was made with a different request" in str(err.value)
    assert "provider.on_stale=redo" in str(err.value)
    assert server.request_count == count


def test_changed_config_with_redo_moves_old_records_aside(server, tmp_path):
    """on_stale=redo keeps the old records in generations.replaced.jsonl and regenerates them."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 3)
    old_path, _ = generate_for_job(openai_cfg(server, temperature=1.0), tmp_path, prompts)
    old = records(old_path)
    path, stats = generate_for_job(openai_cfg(server, temperature=0.2, on_stale="redo"), tmp_path, prompts)
    new = assert_exactly_once(path, 3, 1)
    assert {r["request_hash"] for r in new}.isdisjoint({r["request_hash"] for r in old})
    assert records(tmp_path / REPLACED_NAME) == old
    assert stats["requests"] == 3


def test_prompts_dropped_from_the_run_count_as_stale(server, tmp_path):
    """Records for prompt ids no longer in prompts.jsonl are not silently kept."""
    generate_for_job(openai_cfg(server), tmp_path, write_prompts(tmp_path / "prompts.jsonl", 4))
    with pytest.raises(ConfigError, match=re.escape("id 'p003' sample 0 is not in this run's prompts")):
        generate_for_job(openai_cfg(server), tmp_path, write_prompts(tmp_path / "prompts.jsonl", 3))


def test_api_key_never_reaches_files_or_logs(tmp_path, monkeypatch, caplog):
    """With a key in the environment, no written file and no log line contains it, errors included."""
    key = "sk-storyforge-test-4f1c2b9a7e"
    monkeypatch.setenv("SF_TEST_API_KEY", key)
    prompts = write_prompts(tmp_path / "prompts.jsonl", 5)
    caplog.set_level(logging.DEBUG)
    with FakeServer(api_key=key) as server:
        server.rule = lambda r: Fault.http(500, f"bad key {key}") if "p002" in json.dumps(r.json) else None
        path, stats = generate_for_job(
            openai_cfg(server, api_key_env="SF_TEST_API_KEY", max_retries=1), tmp_path, prompts
        )
        assert all(r.headers["authorization"] == f"Bearer {key}" for r in server.received)
    assert stats["errors"] == 1 and "api_key_env" in stats and key not in json.dumps(stats)
    assert "bad key ***" in next(r for r in records(path) if r["error"])["error"]
    for file in tmp_path.rglob("*"):
        if file.is_file():
            assert key.encode() not in file.read_bytes(), file
    assert key not in caplog.text


def test_ollama_run_is_exactly_once_with_token_counts(server, tmp_path):
    """The Ollama backend survives faults too and reports prompt_eval_count/eval_count as usage."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 5)
    server.queue_faults(Fault.http(500), Fault.cut(), Fault.malformed('{"done": true}'))
    path, stats = generate_for_job(
        ollama_cfg(server, samples=2, options={"seed": 1, "temperature": 0.3}), tmp_path, prompts
    )
    recs = assert_exactly_once(path, 5, 2)
    assert {r["output"] for r in recs if r["id"] == "p000"} == {
        "reply to: tell p000 seed=1",
        "reply to: tell p000 seed=2",
    }
    assert all(r["finish_reason"] == "stop" and r["usage"]["completion_tokens"] > 0 for r in recs)
    assert stats["retries"] == 3 and stats["provider"] == "ollama"
    assert server.received[-1].path == "/api/chat" and server.received[-1].json["stream"] is False
    assert server.received[-1].json["options"]["temperature"] == 0.3


def test_prefill_continues_with_the_configured_dialect(server, tmp_path):
    """With continue_final_message the server sees the vLLM flags and returns the continuation."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 3, prefill=True)
    path, _ = generate_for_job(
        openai_cfg(server, prefix_continuation="continue_final_message"), tmp_path, prompts
    )
    recs = assert_exactly_once(path, 3, 1)
    assert all(r["output"].endswith("(continuing)") for r in recs)
    body = server.received[0].json
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
    assert body["messages"][-1] == {"role": "assistant", "content": "Once upon a time"}


@pytest.mark.parametrize("make_cfg", [openai_cfg, ollama_cfg], ids=["openai", "ollama"])
def test_unsupported_prefill_fails_before_any_request(server, tmp_path, make_cfg):
    """A prefill with prefix_continuation=unsupported stops the run before a single request."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 3, prefill=True)
    with pytest.raises(ConfigError, match=re.escape("prompt 'p000' ends with an assistant prefill")):
        generate_for_job(make_cfg(server), tmp_path, prompts)
    assert server.request_count == 0
    assert not (tmp_path / "generations.jsonl").exists()


def test_server_rejecting_the_dialect_is_a_clear_provider_error(tmp_path):
    """A server that does not know the prefix field answers 400; the run stops with its words."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 2, prefill=True)
    with FakeServer(prefix_dialects=()) as server, pytest.raises(ProviderError) as err:
        generate_for_job(
            openai_cfg(server, prefix_continuation="prefix_field", concurrency=1), tmp_path, prompts
        )
    assert err.value.status == 400
    assert str(err.value).endswith("Extra inputs are not permitted (prefix)")


def test_bad_prompt_records_are_reported_by_id_and_skipped(server, tmp_path, caplog):
    """A malformed prompt is skipped with a warning naming it; strict=true stops instead."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 3)
    with prompts.open("a") as fh:
        fh.write('{"id": "p900", "messages": [{"role": "robot", "content": "x"}]}\n')
        fh.write('{"id": "p001", "messages": []}\n')
        fh.write("not json\n")
    path, stats = generate_for_job(openai_cfg(server), tmp_path, prompts)
    assert_exactly_once(path, 3, 1)
    assert stats["skipped_prompts"] == 3
    assert "prompt 'p900': messages[0].role must be system, user or assistant, got 'robot'" in caplog.text
    assert "prompt id 'p001' appears twice" in caplog.text
    strict = openai_cfg(server, root={"strict": True})
    with pytest.raises(DataError, match=re.escape("3 bad prompt record(s)")):
        generate_for_job(strict, tmp_path / "strict", prompts)


def test_progress_bar_shows_done_total_and_errors(server, tmp_path, capsys):
    """The tqdm bar reports done/total and the error count in its postfix."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 3)
    server.rule = lambda r: Fault.http(500) if "p001" in json.dumps(r.json) else None
    generate_for_job(openai_cfg(server, progress=True, max_retries=1), tmp_path, prompts)
    err = capsys.readouterr().err
    assert "generate m" in err and "3/3" in err
    assert "errors=1" in err and "retries=1" in err


def test_manifest_description_has_no_credentials_in_the_url(tmp_path):
    """User info and query strings in base_url never reach the stats written to the manifest."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 1)
    with FakeServer() as server:
        port = server.port
        cfg = openai_cfg(server, base_url=f"http://user:hunter2@127.0.0.1:{port}/v1")
        _, stats = generate_for_job(cfg, tmp_path, prompts)
    assert stats["url"] == f"http://127.0.0.1:{port}/v1/chat/completions"
    assert "hunter2" not in json.dumps(stats)


def test_generations_load_with_hf_datasets(server, tmp_path):
    """generations.jsonl, error records included, loads as it is with datasets' json loader."""
    import datasets  # a dev dependency; imported here because it is slow to load

    prompts = write_prompts(tmp_path / "prompts.jsonl", 4)
    server.rule = lambda r: Fault.http(500) if "p002" in json.dumps(r.json) else None
    path, _ = generate_for_job(openai_cfg(server, samples=2, max_retries=0), tmp_path, prompts)
    table = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))
    assert table.num_rows == 8
    assert set(table.column_names) == set(records(path)[0])
    rows = sorted(table, key=lambda r: (r["id"], r["sample"]))
    assert [r["output"] is None for r in rows] == [False] * 4 + [True] * 2 + [False] * 2
    assert rows[0]["usage"]["completion_tokens"] > 0 and rows[4]["usage"] is None


def test_empty_prompts_give_an_empty_file(server, tmp_path):
    """No prompts: no request, and generations.jsonl exists (empty) for the steps that read it."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("")
    path, stats = generate_for_job(openai_cfg(server), tmp_path, prompts)
    assert path.read_bytes() == b"" and server.request_count == 0
    assert (stats["total"], stats["requests"], stats["prompts"]) == (0, 0, 0)


def test_big_run_reads_prompts_again_instead_of_keeping_bodies(server, tmp_path, monkeypatch):
    """Past PLAN_KEEP_BYTES the plan keeps no bodies and sending encodes them again, to the same file."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", 8)
    provider = build_provider(openai_cfg(server, samples=2, seed=3).provider)
    kept = plan.plan_requests(provider, prompts, 2)
    assert kept.items is not None and len(kept.items) == 16
    monkeypatch.setattr(plan, "PLAN_KEEP_BYTES", 1000)
    streamed = plan.plan_requests(provider, prompts, 2)
    assert streamed.items is None and streamed.expected == kept.expected
    generate_for_job(openai_cfg(server, samples=2, seed=3), tmp_path / "a", prompts)
    recs = assert_exactly_once(tmp_path / "a" / "generations.jsonl", 8, 2)
    assert {r["request_hash"] for r in recs} == set(kept.expected.values())
    assert sorted(canonical_json(r.json) for r in server.received) == sorted(
        item.content.decode() for item in kept.items
    )


@pytest.mark.parametrize("prompts_count", [48, 96])
def test_requests_are_let_go_once_sent(server, tmp_path, prompts_count):
    """A pass holds its planned requests only until they are sent: when the server sees the
    pass's middle request, half of them are gone; at its last, no more are alive than the
    workers hold, however many requests the pass had."""
    prompts = write_prompts(tmp_path / "prompts.jsonl", prompts_count)
    concurrency = 4
    alive: dict[int, int] = {}

    def count(received: object) -> None:
        if server.request_count in (prompts_count // 2, prompts_count):
            gc.collect()  # what earlier tests left in reference cycles is not alive
            alive[server.request_count] = sum(isinstance(o, plan.WorkItem) for o in gc.get_objects())

    server.rule = count
    generate_for_job(openai_cfg(server, concurrency=concurrency), tmp_path, prompts)
    assert_exactly_once(tmp_path / "generations.jsonl", prompts_count, 1)
    assert alive[prompts_count // 2] <= prompts_count // 2 + 2 * concurrency, alive
    assert alive[prompts_count] <= 2 * concurrency, alive


def test_journal_groups_answers_of_one_window_into_one_write(tmp_path):
    """Lines added during an fsync window wait for it and go out together; close writes them at once."""
    writes: list[list[bytes]] = []

    class CountingAppender(Appender):
        def write(self, lines: list[bytes]) -> None:
            writes.append(list(lines))
            super().write(lines)

    async def go() -> None:
        writer = sending._BatchWriter([tmp_path / "g.jsonl"], window=60.0, opener=CountingAppender)
        writer.add(b"a\n")
        for _ in range(1000):
            if writes:
                break
            await asyncio.sleep(0.005)
        writer.add(b"b\n")
        writer.add(b"c\n")
        await asyncio.sleep(0.05)
        assert writes == [[b"a\n"]]  # b and c wait for the window
        await asyncio.wait_for(writer.close(), timeout=10)

    asyncio.run(go())
    assert writes == [[b"a\n"], [b"b\n", b"c\n"]]
    assert (tmp_path / "g.jsonl").read_bytes() == b"a\nb\nc\n"
