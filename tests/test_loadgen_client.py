"""The load generator's client and runner through httpx with a mock transport and a logical
clock: the transport moves the clock as it hands out each chunk, so every recorded time, and
every figure computed from them, is exact."""

import asyncio
import json

import httpx
import pytest

from tierserve.loadgen.client import Endpoint, RequestRecord, build_request, send
from tierserve.loadgen.metrics import itls, run_stats, tpot, ttft
from tierserve.loadgen.runner import Control, Level, Limits, run_level
from tierserve.loadgen.workload import RequestSpec
from tierserve.priority import Priority

EP = Endpoint("http://stub", model="m")


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def sse(obj) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


def content(text: str, api: str = "chat") -> bytes:
    c = {"delta": {"content": text}} if api == "chat" else {"text": text}
    return sse({"choices": [{"index": 0, **c}]})


def scripted(clock: Clock, events: list, status: int = 200, headers=None):
    """A transport answering every request with `events`: (time, bytes) pairs, the clock set
    to `time` as each is handed out; an Exception instance is raised at that point."""

    async def handler(request):
        async def body():
            for t, chunk in events:
                clock.t = t
                if isinstance(chunk, Exception):
                    raise chunk
                yield chunk

        return httpx.Response(status, headers=headers, content=body())

    return httpx.MockTransport(handler)


def spec(prio=1, max_tokens=4, index=0) -> RequestSpec:
    return RequestSpec(index, Priority(prio), "hello there", 2, max_tokens)


def run_one(transport, clock, ep=EP, s=None) -> RequestRecord:
    s = s or spec()
    rec = RequestRecord(s.index, int(s.priority), clock(), s.prompt_tokens, s.max_tokens)

    async def go():
        async with httpx.AsyncClient(transport=transport) as http:
            await send(http, ep, s, rec, clock)

    asyncio.run(go())
    return rec


def test_times_come_from_chunk_arrivals_and_tokens_from_usage():
    clock = Clock()
    role_only = sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    usage = sse({"choices": [], "usage": {"prompt_tokens": 21, "completion_tokens": 5}})
    events = [(0.25, role_only), (0.5, content("a")), (0.75, content("b")),
              (1.25, content("")), (1.25, content("c d")), (1.5, content("e")),
              (1.75, usage), (1.75, sse("[DONE]"))]  # fmt: skip
    r = run_one(scripted(clock, events), clock)
    assert (r.outcome, r.status, r.error) == ("completed", 200, None)
    assert r.chunk_times == [0.5, 0.75, 1.25, 1.5]  # no token in the role or empty chunks
    assert ttft(r) == 0.5 and itls(r) == [0.25, 0.5, 0.25] and r.finish == 1.75
    assert (r.output_tokens, r.prompt_tokens, r.usage_reported) == (5, 21, True)
    assert tpot(r) == (1.75 - 0.5) / 4


def test_without_usage_tokens_are_counted_chunks_completions_api():
    clock = Clock()
    events = [(0.5, content("x", "completions")), (1.0, content("y z", "completions")),
              (1.0, sse("[DONE]"))]  # fmt: skip
    r = run_one(scripted(clock, events), clock, Endpoint("http://stub", api="completions"))
    assert r.outcome == "completed" and r.output_tokens == 2 and not r.usage_reported
    assert r.prompt_tokens == 2  # ours, as the server reported none


def test_request_carries_priority_keys_and_options():
    seen = []

    def handler(request):
        seen.append((request.url.path, dict(request.headers), json.loads(request.content)))
        return httpx.Response(200, content=sse("[DONE]"))

    keys = {0: "k0", None: "kall"}
    for via in ("header", "body", "none"):
        ep = Endpoint("http://stub/", model="m", priority_via=via, api_keys=keys, ignore_eos=True)
        run_one(httpx.MockTransport(handler), Clock(), ep, spec(prio=0))
        run_one(httpx.MockTransport(handler), Clock(), ep, spec(prio=2))
    paths = {p for p, _, _ in seen}
    assert paths == {"/v1/chat/completions"}
    (h0, b0), (h2, b2) = [(h, b) for _, h, b in seen[:2]]
    assert h0["x-request-tier"] == "p0" and h2["x-request-tier"] == "p2" and "priority" not in b0
    assert h0["authorization"] == "Bearer k0" and h2["authorization"] == "Bearer kall"
    assert b0["messages"] == [{"role": "user", "content": "hello there"}]
    assert b0["stream"] and b0["stream_options"] == {"include_usage": True}
    assert b0["ignore_eos"] and b0["model"] == "m" and b0["max_tokens"] == 4
    (h0, b0), (h2, b2) = [(h, b) for _, h, b in seen[2:4]]
    assert (b0["priority"], b2["priority"]) == (0, 2) and "x-request-tier" not in h0
    (h0, b0), _ = [(h, b) for _, h, b in seen[4:6]]
    assert "priority" not in b0 and "x-request-tier" not in h0
    _, body = build_request(Endpoint("http://s", api="completions"), spec())
    assert body["prompt"] == "hello there" and "messages" not in body and "model" not in body


@pytest.mark.parametrize(
    "status,headers,outcome,retry",
    [(429, {"retry-after": "7"}, "rejected", 7.0), (503, {}, "rejected", None),
     (404, {}, "failed", None), (500, {}, "failed", None)],
)  # fmt: skip
def test_refusals_and_http_errors(status, headers, outcome, retry):
    clock = Clock()
    body = json.dumps({"error": {"message": "queue full"}}).encode()
    r = run_one(scripted(clock, [(0.25, body)], status, headers), clock)
    assert (r.outcome, r.status, r.retry_after) == (outcome, status, retry)
    assert r.error == f"HTTP {status}: queue full" and r.chunk_times == []


@pytest.mark.parametrize(
    "tail,needle",
    [([(0.75, b"data: {not json\n\n")], "malformed stream: not JSON"),
     ([(0.75, b'{"choices": []}\n')], "malformed stream: expected 'data:' lines"),
     ([(0.75, sse({"error": {"message": "engine died"}}))], "error event in the stream"),
     ([], "truncated stream"),
     ([(0.75, httpx.ReadError("peer closed"))], "stream broken: ReadError")],
)  # fmt: skip
def test_broken_streams_fail_cleanly_and_keep_what_arrived(tail, needle):
    clock = Clock()
    r = run_one(scripted(clock, [(0.5, content("a")), *tail]), clock)
    assert r.outcome == "failed" and r.error.startswith(needle), r.error
    assert r.chunk_times == [0.5] and r.output_tokens == 1 and r.finish is not None


def test_connection_refused_and_total_timeout():
    def refuse(request):
        raise httpx.ConnectError("connection refused")

    r = run_one(httpx.MockTransport(refuse), Clock())
    assert r.outcome == "failed" and r.error.startswith("cannot connect to http://stub/v1/")

    async def slow(request):
        async def body():
            yield content("a")
            await asyncio.sleep(30)

        return httpx.Response(200, content=body())

    ep = Endpoint("http://stub", timeout_s=0.05)
    r = run_one(httpx.MockTransport(slow), Clock(), ep)
    assert r.outcome == "failed" and r.error == "timed out after 0.05 s"


def test_closed_loop_run_end_to_end_with_a_logical_clock():
    """Four requests back to back (one client), the first a warm-up; the server answers each
    class with its own timing. Every figure follows from the script."""
    clock = Clock()
    plan = {1: (0.5, 0.25), 0: (0.25, 0.25), 2: None}  # class -> (TTFT, gap) or refused

    async def handler(request):
        prio = int(request.headers["x-request-tier"][1])
        n = json.loads(request.content)["max_tokens"]
        if plan[prio] is None:
            return httpx.Response(429, headers={"retry-after": "2"}, content=b"{}")
        first, gap = plan[prio]
        start = clock.t
        times = [start + first + i * gap for i in range(n)]
        events = [(t, content("w")) for t in times] + [(times[-1] + gap, sse("[DONE]"))]

        async def body():
            for t, chunk in events:
                clock.t = t
                yield chunk

        return httpx.Response(200, content=body())

    specs = iter([spec(1, 2, 0), spec(0, 3, 1), spec(1, 2, 2), spec(2, 2, 3)])
    limits = Limits(duration_s=None, num_requests=3, warmup_requests=1, backoff=False)

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:

            async def send_fn(s, rec):
                await send(http, EP, s, rec, clock)

            return await run_level(
                Level(concurrency=1), lambda: next(specs), send_fn, limits, Control(), clock
            )

    res = asyncio.run(go())
    # warm-up P1: 0 -> chunks .5 .75, done 1.0; P0: 1.0 -> 1.25 1.5 1.75, done 2.0;
    # P1: 2.0 -> 2.5 2.75, done 3.0; P2 refused at 3.0.
    assert [r.arrival for r in res.records] == [0.0, 1.0, 2.0, 3.0]
    assert [r.measured for r in res.records] == [False, True, True, True]
    assert res.records[1].chunk_times == [1.25, 1.5, 1.75] and res.records[1].finish == 2.0
    assert res.window == (1.0, 3.0)
    s = run_stats(res.records, res.window, (0.25, 0.25, 60.0, None))
    p0, p1, p2 = s["classes"]["P0"], s["classes"]["P1"], s["classes"]["P2"]
    assert p0["ttft_p50_s"] == 0.25 and p0["tpot_p50_s"] == (2.0 - 1.25) / 2
    assert p0["sla_attainment"] == 1.0 and p1["sla_attainment"] == 0.0  # P1's TTFT is 0.5
    assert p2["refusals_by_status"] == {"429": 1} and p2["retry_after_max_s"] == 2.0
    assert s["goodput_requests_per_s"] == 1 / 2  # only P0 met its SLO, over 2 s
    # Tokens in [1, 3]: P0's 3 + P1's 2 (+ prompts of 2 each); the warm-up's ended at 0.75.
    assert s["throughput_tokens_per_s"] == 5 / 2 and s["throughput_total_tokens_per_s"] == 9 / 2
    assert s["completed"] == 2 and s["rejected"] == 1


def test_consecutive_failures_stop_the_run():
    c = Control(max_consecutive_errors=3)
    ok, bad = RequestRecord(0, 1, 0, 1, 1, outcome="completed"), RequestRecord(0, 1, 0, 1, 1)
    bad.outcome, bad.error = "failed", "HTTP 500: boom"
    for r in (bad, bad, ok, bad, bad):
        c.observe(r)
    assert not c.stopped  # a success resets the streak
    c.observe(bad)
    assert c.stopped and c.reason == "3 requests failed in a row; the last one: HTTP 500: boom"
