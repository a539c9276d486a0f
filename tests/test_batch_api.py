"""The Batch API end to end on a real server with the embedded model, through the official
`openai` client: files and batches, OpenAI's shapes and status machine, results keyed by
custom_id, the class its lines run in, tenants apart, cancel and expiry, and bad input."""

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.batch_utils import (
    chat_line,
    client,
    completion_line,
    jsonl,
    metric,
    read_jsonl,
    upload,
    wait_status,
)
from tests.server_utils import running_server, small_engine_args
from tierserve.api.settings import ServerSettings
from tierserve.engine.builder import build_engine

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def built():
    """The engine of the long-lived `server`."""
    return build_engine(small_engine_args(max_num_seqs=16))


@pytest.fixture(scope="module")
def own():
    """A second engine, for servers with their own settings (one at a time, never beside
    `server`: one engine thread per EngineCore)."""
    return build_engine(small_engine_args(max_num_seqs=16))


def batch_settings(tmp: Path, **kw) -> ServerSettings:
    return ServerSettings(batch_db=str(tmp / "batch.db"), files_dir=str(tmp / "files"), **kw)


@pytest.fixture(scope="module")
def server(built, tmp_path_factory):
    with running_server(built, batch_settings(tmp_path_factory.mktemp("batch"))) as (url, st):
        yield url, st


def test_a_chat_batch_completes_with_outputs_keyed_by_custom_id(server):
    url, _ = server
    c = client(url)
    lines = [chat_line(f"q{i}", f"What is {i} plus {i}?") for i in range(8)]
    lines.insert(3, chat_line("bad", "x", max_tokens=4, bogus=1))  # a body the route refuses
    f = upload(c, lines)
    assert f.purpose == "batch" and f.bytes == len(jsonl(lines))
    assert c.files.content(f.id).content == jsonl(lines)
    b = c.batches.create(
        input_file_id=f.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "sums"},
    )
    assert b.status == "validating" and b.metadata == {"job": "sums"}
    b = wait_status(c, b.id)
    assert b.status == "completed", b
    assert (b.request_counts.total, b.request_counts.completed, b.request_counts.failed) == (
        9,
        8,
        1,
    )
    assert b.in_progress_at and b.finalizing_at and b.completed_at
    assert b.expires_at == b.created_at + 86400
    out, err = read_jsonl(c, b.output_file_id), read_jsonl(c, b.error_file_id)
    assert set(out) == {f"q{i}" for i in range(8)} and set(err) == {"bad"}
    # Each output is what the endpoint answers to the same body (greedy), served as batch (P2).
    direct = c.chat.completions.create(model=None, **{k: v for k, v in lines[0]["body"].items()})
    got = out["q0"]["response"]
    assert got["status_code"] == 200 and out["q0"]["error"] is None
    assert got["body"]["choices"][0]["message"] == {
        "role": "assistant",
        "content": direct.choices[0].message.content,
    }
    assert got["body"]["service_tier"] == "flex" and got["request_id"] == got["body"]["id"]
    bad = err["bad"]["response"]
    assert bad["status_code"] == 400
    assert "unknown field 'bogus'" in bad["body"]["error"]["message"]
    # The output file is listed as the tenant's, and its lines follow the input order.
    text = c.files.content(b.output_file_id).text.splitlines()
    assert [json.loads(x)["custom_id"] for x in text] == [f"q{i}" for i in range(8)]
    assert b.output_file_id in {x.id for x in c.files.list()}


def test_a_background_completions_batch_runs_as_p3(server):
    url, _ = server
    c = client(url)
    before = metric(url, "llm_requests_total", priority="P3")
    f = upload(c, [completion_line(f"c{i}", f"Count: {i},") for i in range(5)])
    b = c.batches.create(
        input_file_id=f.id,
        endpoint="/v1/completions",
        completion_window="1h",
        metadata={"tier": "background"},
    )
    b = wait_status(c, b.id)
    assert b.status == "completed" and b.request_counts.completed == 5
    assert b.model_extra["tier"] == "background" and b.expires_at == b.created_at + 3600
    assert metric(url, "llm_requests_total", priority="P3") - before == 5
    out = read_jsonl(c, b.output_file_id)
    assert out["c0"]["response"]["body"]["object"] == "text_completion"


def test_pages_of_batches_and_files(server):
    url, _ = server
    c = client(url, tenant="pager")
    f = upload(c, [completion_line("a", "Hi")])
    ids = [
        c.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h").id
        for _ in range(3)
    ]
    first = c.batches.list(limit=2)
    assert first.has_more and [b.id for b in first.data] == ids[:0:-1]
    assert [b.id for b in first] == ids[::-1]  # iterating fetches the next page
    for i in ids:
        wait_status(c, i)
    files = c.files.list(purpose="batch", order="asc").data
    assert [x.id for x in files] == [f.id]


def error_of(call) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as e:
        call()
    body = e.value.body
    assert set(body) >= {"message", "type", "param", "code"}, body  # OpenAI's error shape
    return e.value


def test_bad_input_gets_a_clear_4xx_in_openai_shape(server):
    url, st = server
    c = client(url, tenant="careless")
    good = [chat_line("a", "hi")]
    broken = jsonl(good) + b'{"custom_id": "b", "method": "POST",\n'
    e = error_of(lambda: c.files.create(file=("x.jsonl", broken), purpose="batch"))
    assert e.status_code == 400 and "line 2: not valid JSON" in e.message
    dup = jsonl([*good, chat_line("z", "x"), chat_line("a", "again")])
    e = error_of(lambda: c.files.create(file=("x.jsonl", dup), purpose="batch"))
    assert "line 3: custom_id 'a' is used twice (first on line 1)" in e.message
    long = jsonl([*good, chat_line("b", "y" * (st.settings.max_request_bytes + 10))])
    e = error_of(lambda: c.files.create(file=("x.jsonl", long), purpose="batch"))
    assert e.status_code == 400 and "line 2: the line is" in e.message
    e = error_of(lambda: c.files.create(file=("x.jsonl", jsonl(good)), purpose="fine-tune"))
    assert e.status_code == 400 and "purpose must be 'batch'" in e.message
    f = upload(c, good)
    e = error_of(
        lambda: c.batches.create(
            input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h"
        )
    )
    assert e.status_code == 400 and "endpoint '/v1/embeddings' is not supported" in e.message
    e = error_of(
        lambda: c.batches.create(
            input_file_id=f.id, endpoint="/v1/completions", completion_window="24h"
        )
    )
    assert "line 1 of" in e.message and "differs from the batch's endpoint" in e.message
    e = error_of(
        lambda: c.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="soon"
        )
    )
    assert e.status_code == 400 and e.body["param"] == "completion_window"
    e = error_of(
        lambda: c.batches.create(
            input_file_id=f.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_body={"priority": 1},
        )
    )
    assert "unknown field 'priority'" in e.message
    b = c.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    b = wait_status(c, b.id)
    e = error_of(lambda: c.batches.cancel(b.id))
    assert e.status_code == 409 and "is completed" in e.message
    e = error_of(lambda: c.batches.retrieve("batch_nope"))
    assert e.status_code == 404
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}  # and the feeder lives on:
    b = c.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert wait_status(c, b.id).status == "completed"


def test_a_tenant_sees_only_its_own_files_and_batches(server):
    url, _ = server
    alice, bob = client(url, tenant="alice"), client(url, tenant="bob")
    # An open server counts x-tenant-id names it was not configured with under "other"
    # (metrics/recorder.py: no client can grow the series).
    used = metric(url, "llm_tenant_generation_tokens_total", tenant="other")
    f = upload(alice, [chat_line("a", "hi")])
    b = alice.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    for call in (
        lambda: bob.files.retrieve(f.id),
        lambda: bob.files.content(f.id),
        lambda: bob.files.delete(f.id),
        lambda: bob.batches.retrieve(b.id),
        lambda: bob.batches.cancel(b.id),
        lambda: bob.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        assert error_of(call).status_code == 404
    assert [x.id for x in bob.batches.list()] == []
    assert f.id not in {x.id for x in bob.files.list()}
    b = wait_status(alice, b.id)
    assert b.status == "completed"
    # usage is counted for the tenant, as for its interactive requests
    out = read_jsonl(alice, b.output_file_id)["a"]["response"]["body"]["usage"]
    assert (
        metric(url, "llm_tenant_generation_tokens_total", tenant="other") - used
        == (out["completion_tokens"])
    )
    assert error_of(lambda: bob.files.content(b.output_file_id)).status_code == 404
    assert alice.files.delete(f.id).deleted
    assert error_of(lambda: alice.files.retrieve(f.id)).status_code == 404


def test_cancel_keeps_what_completed_and_frees_the_engine(server):
    url, st = server
    c = client(url, tenant="canceller")
    lines = [chat_line(f"l{i}", f"Tell a long story {i}", 60, ignore_eos=True) for i in range(40)]
    b = c.batches.create(
        input_file_id=upload(c, lines).id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 120
    while c.batches.retrieve(b.id).request_counts.completed < 1:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    b = c.batches.cancel(b.id)
    assert b.status in ("cancelling", "cancelled") and b.cancelling_at
    b = wait_status(c, b.id)
    assert b.status == "cancelled" and b.cancelled_at
    out, err = read_jsonl(c, b.output_file_id), read_jsonl(c, b.error_file_id)
    assert len(out) >= 1 and len(out) + len(err) == 40 and not set(out) & set(err)
    assert b.request_counts.completed == len(out) and b.request_counts.failed == len(err)
    assert {x["error"]["code"] for x in err.values()} == {"batch_cancelled"}
    deadline = time.monotonic() + 10
    while st.engine.num_in_flight():  # the lines in flight were aborted
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_batch_past_its_window_expires_with_what_completed(own, tmp_path):
    settings = batch_settings(tmp_path, batch_window=2)
    with running_server(own, settings) as (url, _st):
        c = client(url)
        lines = [chat_line(f"e{i}", f"Story {i}", 40, ignore_eos=True) for i in range(30)]
        b = c.batches.create(
            input_file_id=upload(c, lines).id,
            endpoint="/v1/chat/completions",
            completion_window="4s",
        )
        b = wait_status(c, b.id, timeout=120)
        assert b.status == "expired" and b.expired_at
        out, err = read_jsonl(c, b.output_file_id), read_jsonl(c, b.error_file_id)
        assert len(out) + len(err) == 30 and len(err) > 0
        assert {x["error"]["code"] for x in err.values()} == {"batch_expired"}
        assert all(x["response"]["status_code"] == 200 for x in out.values())
        assert b.request_counts.completed == len(out) and b.request_counts.failed == len(err)


def test_the_feeder_keeps_a_bounded_window(own, tmp_path):
    """Never the whole file in the queue: at most --batch-window lines are in the engine."""
    with running_server(own, batch_settings(tmp_path, batch_window=3)) as (url, st):
        c = client(url)
        lines = [chat_line(f"w{i}", f"Word {i}", 6) for i in range(24)]
        b = c.batches.create(
            input_file_id=upload(c, lines).id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
        peak = 0
        while c.batches.retrieve(b.id).status not in ("completed", "failed"):
            snap = st.engine.snapshot
            peak = max(peak, st.engine.num_in_flight(), snap.running[2] + snap.waiting[2])
            time.sleep(0.02)
        assert 2 <= peak <= 3
        assert c.batches.retrieve(b.id).request_counts.completed == 24


def test_service_tier_maps_to_classes_and_is_echoed(own, tmp_path):
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "tenants:\n"
        "  rt: {keys: [k-rt], max_tier: realtime}\n"
        "  web: {keys: [k-web], max_tier: online, default_tier: online}\n"
    )
    with running_server(own, ServerSettings(tenants_file=str(tenants))) as (url, _):
        msgs = [{"role": "user", "content": "hi"}]
        for key, tier, served, cls in (
            ("k-rt", "priority", "priority", "p0"),
            ("k-rt", "flex", "flex", "p2"),
            ("k-rt", "default", "default", "p1"),
            ("k-rt", "auto", "default", "p1"),
            ("k-web", "priority", "default", "p1"),  # not entitled: clamped
        ):
            raw = client(url, key=key).chat.completions.with_raw_response.create(
                model=None, messages=msgs, max_tokens=2, service_tier=tier
            )
            assert raw.parse().service_tier == served, (key, tier)
            assert raw.headers["x-tierserve-priority"] == cls
        r = httpx.post(
            f"{url}/v1/completions",
            headers={"Authorization": "Bearer k-rt"},
            json={"prompt": "Hi", "max_tokens": 1, "service_tier": "flex", "stream": True},
        )
        assert '"service_tier": "flex"' in r.text
        r = httpx.post(
            f"{url}/v1/completions",
            headers={"Authorization": "Bearer k-rt"},
            json={"prompt": "Hi", "max_tokens": 1, "service_tier": "scale"},
        )
        assert r.status_code == 400 and "service_tier" in r.json()["error"]["message"]


def test_the_example_runs(server):
    url, _ = server
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "batch_example.py"), "--base-url", f"{url}/v1"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "completed: 3 of 3 requests" in proc.stdout


def test_a_line_that_can_never_run_is_its_own_error_not_the_batchs_429(server):
    """issue 46, item 6: max_tokens far past the context made the whole batch a retryable 429
    ("enqueued token limit reached"); the line's cost is capped at the context, the batch runs,
    and that line fails with the endpoint's own 400."""
    url, _ = server
    c = client(url)
    lines = [chat_line("ok", "What is 1 plus 1?"), chat_line("huge", "Hi", max_tokens=10**9)]
    b = c.batches.create(
        input_file_id=upload(c, lines).id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    b = wait_status(c, b.id)
    assert b.status == "completed", b
    out, err = read_jsonl(c, b.output_file_id), read_jsonl(c, b.error_file_id)
    assert set(out) == {"ok"} and set(err) == {"huge"}
    assert err["huge"]["response"]["status_code"] == 400
    assert "context is" in err["huge"]["response"]["body"]["error"]["message"]
