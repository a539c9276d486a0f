"""The Batch API when things go wrong, on the fake engine (no model): a read-only database or
a full disk fails the batch, not the server; the feeder spends a budget of its own, not the
interactive clients'; and in cluster mode the feeder's lines survive a dead replica."""

import asyncio
import errno
import io
import json
import time
from types import SimpleNamespace

import httpx
from sqlalchemy import create_engine

from tests.batch_utils import (
    batch_server,
    client,
    completion_line,
    metric,
    upload,
    wait_status,
)
from tests.fake_engine import fake_built, tiny_tokenizer, words
from tests.server_utils import running_server
from tests.test_cluster_parts import Died, FakeStream
from tierserve.admission import AdmissionController
from tierserve.api.settings import ServerSettings
from tierserve.api.state import ServerState
from tierserve.api.tenancy import TenantRegistry
from tierserve.batch.config import BatchConfig
from tierserve.batch.service import BatchService
from tierserve.chat.prompt import ChatPrompter
from tierserve.clock import WallClock
from tierserve.cluster.observe import IngressMetrics
from tierserve.cluster.remote_engine import RemoteEngine
from tierserve.config import AdmissionConfig
from tierserve.core.limits import RequestLimits


def settings(tmp, **kw) -> ServerSettings:
    return ServerSettings(batch_db=str(tmp / "b.db"), files_dir=str(tmp / "files"), **kw)


def slow_lines(n: int, tokens: int = 40) -> list[dict]:
    return [completion_line(f"s{i}", words(5, i + 1), tokens, ignore_eos=True) for i in range(n)]


def start(c, lines):
    f = upload(c, lines)
    return c.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="1h")


BATCH_ROUTES = [
    ("POST", "/v1/files"),
    ("GET", "/v1/files"),
    ("GET", "/v1/files/file-x"),
    ("GET", "/v1/files/file-x/content"),
    ("DELETE", "/v1/files/file-x"),
    ("POST", "/v1/batches"),
    ("GET", "/v1/batches"),
    ("GET", "/v1/batches/batch_x"),
    ("POST", "/v1/batches/batch_x/cancel"),
]


def test_every_batch_route_needs_the_key(tmp_path):
    with running_server(fake_built(), settings(tmp_path, api_key="sk-k")) as (url, _):
        paths = httpx.get(f"{url}/openapi.json").json()["paths"]
        assert {p for p in paths if p.startswith(("/v1/files", "/v1/batches"))} == {
            "/v1/files", "/v1/files/{file_id}", "/v1/files/{file_id}/content",
            "/v1/batches", "/v1/batches/{batch_id}", "/v1/batches/{batch_id}/cancel",
        }  # fmt: skip
        for method, path in BATCH_ROUTES:
            r = httpx.request(method, f"{url}{path}")
            assert r.status_code == 401, (method, path, r.text)
            assert r.json()["error"]["type"] == "authentication_error"
            ok = httpx.request(method, f"{url}{path}", headers={"authorization": "Bearer sk-k"})
            assert ok.status_code != 401, (method, path)


def test_a_read_only_database_fails_the_batch_not_the_server(tmp_path):
    built = fake_built(step_s=0.005)
    with batch_server(built, settings(tmp_path, batch_window=1)) as (url, st, svc):
        c = client(url)
        b = start(c, slow_lines(30))
        deadline = time.monotonic() + 60
        while c.batches.retrieve(b.id).request_counts.completed < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        path = tmp_path / "b.db"
        svc.store.engine = create_engine(f"sqlite:///file:{path}?mode=ro&uri=true")
        b = wait_status(c, b.id, timeout=60)
        assert b.status == "failed"
        assert b.errors.data[0].code == "batch_failed"
        assert "cannot record results" in b.errors.data[0].message
        assert "readonly database" in b.errors.data[0].message
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "w1 w2", "max_tokens": 3})
        assert r.status_code == 200
        deadline = time.monotonic() + 10
        while st.engine.num_in_flight():
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_a_full_disk_fails_the_batch_with_the_reason(tmp_path, monkeypatch):
    with batch_server(fake_built(), settings(tmp_path)) as (url, _, svc):
        c = client(url)

        def full(*_a, **_kw):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(svc.bodies, "write_lines", full)
        b = wait_status(c, start(c, slow_lines(3, 4)).id, timeout=60)
        assert b.status == "failed" and b.failed_at
        assert "No space left on device" in b.errors.data[0].message
        monkeypatch.undo()  # space again: the next batch completes
        b = wait_status(c, start(c, slow_lines(3, 4)).id, timeout=60)
        assert b.status == "completed" and b.request_counts.completed == 3


def test_the_feeder_spends_its_own_token_budget(tmp_path):
    """The tenant's rate limit applies to its batch lines, from a bucket of the feeder's: a
    batch that drains it leaves the tenant's interactive requests their whole budget."""
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text("tenants:\n  t: {keys: [k], rate_limit: {tokens_per_s: 10, burst: 100}}\n")
    with running_server(fake_built(), settings(tmp_path, tenants_file=str(tenants))) as (url, _):
        c = client(url, key="k")
        lines = [completion_line(f"r{i}", words(5, i + 1), 25) for i in range(5)]  # 30 tokens each
        b = wait_status(c, start(c, lines).id, timeout=120)
        assert b.status == "completed" and b.request_counts.completed == 5
        refused = metric(url, "llm_batch_lines_total", outcome="refused")
        assert refused >= 1  # 150 tokens > the burst of 100: the feeder waited for refills
        for _ in range(3):  # 90 tokens of the interactive budget, untouched by the batch
            r = httpx.post(
                f"{url}/v1/completions",
                headers={"Authorization": "Bearer k"},
                json={"prompt": words(5), "max_tokens": 25},
            )
            assert r.status_code == 200, r.text


# -- cluster mode: the feeder at the ingress, over a RemoteEngine ---------------------------------


def ingress_state(tmp, streams) -> ServerState:
    """What the cluster ingress builds (cluster/ingress.py), with replicas faked."""
    queue = streams  # consumed as replicas are asked
    m = IngressMetrics(dict)
    tk = tiny_tokenizer()
    remote = RemoteEngine(
        lambda payload: queue.pop(0),
        RequestLimits(2048, 16, (100, 100, 100, 100)),
        WallClock(),
        m,
        lambda e: isinstance(e, Died),
    )
    return ServerState(
        engine=remote,
        tokenizer=tk,
        admission=AdmissionController(AdmissionConfig(), remote, WallClock()),
        tenants=TenantRegistry.open(),
        metrics=m,
        settings=settings(tmp),
        max_model_len=2048,
        eos_token_ids=(tk.eos_token_id,) if hasattr(tk, "eos_token_id") else (999,),
        chat=ChatPrompter(tk, None),
    )


def test_the_ingress_feeder_retries_the_lines_of_a_dead_replica(tmp_path):
    # Line 1's replica dies after a token (the RemoteEngine cannot retry that one), then its
    # retry dies before any token (the RemoteEngine retries it elsewhere); line 2 runs once.
    streams = [FakeStream("a", 2, Died()), FakeStream("b", 0, Died()), FakeStream("c", 3)]
    streams.append(FakeStream("c", 3))
    state = ingress_state(tmp_path, streams)
    cfg = BatchConfig(db_url=str(tmp_path / "b.db"), files_dir=str(tmp_path / "f"),
                      max_in_flight=1, max_in_flight_per_batch=1)  # fmt: skip

    async def main():
        svc = BatchService(state, cfg)
        await svc.start()
        tenant = state.tenants.authenticate(None, None)
        lines = [completion_line(f"c{i}", "w1 w2", 3) for i in range(2)]
        data = io.BytesIO("".join(json.dumps(x) + "\n" for x in lines).encode())
        f = await svc.upload(tenant, "in.jsonl", "batch", data)
        body = SimpleNamespace(input_file_id=f["id"], endpoint="/v1/completions",
                               completion_window="1h", metadata=None)  # fmt: skip
        b = await svc.create(tenant, body)
        for _ in range(300):
            b = await svc.batch(tenant, b["id"])
            if b["status"] == "completed":
                break
            await asyncio.sleep(0.05)
        out = svc.bodies.read(f"{b['output_file_id']}.jsonl").decode().splitlines()
        await svc.stop()
        return b, out

    b, out = asyncio.run(main())
    assert b["status"] == "completed" and b["request_counts"] == {
        "total": 2, "completed": 2, "failed": 0
    }  # fmt: skip
    assert not streams  # four streams opened: two for the dead replicas, one per line

    texts = {json.loads(x)["custom_id"]: json.loads(x)["response"]["body"] for x in out}
    assert {k: v["choices"][0]["text"] for k, v in texts.items()} == {
        "c0": "t0t1t2",
        "c1": "t0t1t2",
    }
    assert state.metrics.failures.labels("retried")._value.get() == 1
    assert state.metrics.failures.labels("ended")._value.get() == 1
