"""The Ray Serve deployment end to end: a local Ray (HTTP on loopback, temp dir, no dashboard), one
ingress and two engine replicas of the embedded model with few seats, driven by the official
`openai` client and by httpx. One cluster, started once: module-scoped, the only module that uses
it, so Ray stops as soon as these tests end instead of idling beside the rest of the suite (the
replica-kill test runs last).
"""

import concurrent.futures
import json
import shutil
import time
import uuid

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server_utils import free_port, small_engine_args
from tierserve.api.settings import ServerSettings
from tierserve.priority import Priority
from tierserve.request import EngineRequest
from tierserve.routing import RouteRequest
from tierserve.sampling_params import SamplingParams

ray = pytest.importorskip("ray")
from ray import serve  # noqa: E402

from tierserve.cluster import wire  # noqa: E402
from tierserve.cluster.launch import APP_NAME, ClusterOptions, deploy, start_ray  # noqa: E402

pytestmark = [pytest.mark.cluster, pytest.mark.model]
MODEL = "SmolLM2-135M-Instruct"
SEATS = 4


@pytest.fixture(scope="module")
def cluster():
    opts = ClusterOptions(replicas=2, replica_cpus=0.5, stats_period_s=0.2)
    temp_dir = start_ray(opts, log_to_driver=False)
    try:
        settings = ServerSettings(port=free_port(), log_level="warning")
        args = small_engine_args(max_num_seqs=SEATS, num_kv_blocks=192, max_num_batched_tokens=512)
        deploy(args, settings, opts)
        yield f"http://127.0.0.1:{settings.port}"
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def board_view() -> dict:
    return serve.get_deployment_handle("Board", APP_NAME).view.remote().result()


def engines_idle() -> bool:
    reps = board_view()["replicas"]
    return all(sum(x["load"]["running"]) + sum(x["load"]["waiting"]) == 0 for x in reps.values())


def wait_for(what, check, timeout=90.0, every=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def samples(url: str, name: str) -> list:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def metric(url: str, name: str, **labels) -> float:
    return sum(
        s.value for s in samples(url, name) if all(s.labels.get(k) == v for k, v in labels.items())
    )


def pinned(replica: str, priority: Priority, max_tokens: int):
    """Stream a request straight to `replica` through the engine deployment's handle (the
    router honours a pin); returns the response generator."""
    prompt = list(range(1000, 1040))
    req = EngineRequest(
        f"fill-{uuid.uuid4().hex[:8]}",
        tuple(prompt),
        SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0),
        priority=priority,
    )
    route = RouteRequest.of(prompt, priority, 16)
    handle = serve.get_deployment_handle("Engine", APP_NAME).options(stream=True)
    return handle.generate.remote(wire.request_payload(req, route, pin=replica))


# -- the OpenAI surface through the ingress ----------------------------------------------------


def test_openai_client_through_the_ingress(cluster):
    c = client(cluster)
    r = c.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=30,
    )
    assert "Paris" in r.choices[0].message.content
    assert r.usage.completion_tokens > 0
    kw = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Name three colours."}],
        temperature=0,
        max_tokens=20,
    )
    whole = c.chat.completions.create(**kw).choices[0].message.content
    chunks = list(
        c.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == whole
    assert chunks[-1].usage.completion_tokens > 0
    assert [m.id for m in c.models.list().data] == [MODEL]
    # the cluster's /metrics: both replicas report, each sample labelled with its replica
    replicas = set(board_view()["replicas"])
    assert len(replicas) == 2
    wait_for("replica metrics", lambda: metric(cluster, "llm_requests_total") >= 3, timeout=15)
    labelled = {s.labels["replica"] for s in samples(cluster, "llm_requests_running")}
    assert labelled == replicas
    assert metric(cluster, "tierserve_routed_requests_total") >= 3


def test_admission_refusal_and_tier_header(cluster):
    c = client(cluster)
    with pytest.raises(openai.BadRequestError, match="context"):
        c.completions.create(model=MODEL, prompt="hi", max_tokens=100_000)
    raw = c.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        extra_headers={"x-request-tier": "realtime"},
    )
    assert raw.headers["x-tierserve-priority"] == "p0"


# -- routing -------------------------------------------------------------------------------------


def test_p0_lands_on_the_replica_full_of_p3(cluster):
    """One replica full of P3 work, the other full of P1: P0 goes where it can start by
    preempting P3. The P3 replica is the one a tie would not pick (the larger id), so stale or
    ignored stats fail the test."""
    low, high = sorted(board_view()["replicas"])
    fills = [pinned(high, Priority.P3, 400) for _ in range(SEATS)]
    fills += [pinned(low, Priority.P1, 400) for _ in range(SEATS)]
    try:
        for g in fills:  # hello, then the first token: every fill request is running
            assert next(g)["kind"] == "hello"
            next(g)

        def full():
            reps = board_view()["replicas"]
            return (
                reps[high]["load"]["running"][Priority.P3] == SEATS
                and reps[low]["load"]["running"][Priority.P1] == SEATS
            )

        wait_for("both replicas full", full)
        time.sleep(2.0)  # ten routing-stats periods: the ingress's router sees them full

        def p0_done(replica):
            return metric(cluster, "llm_requests_total", replica=replica, priority="P0")

        before = {r: p0_done(r) for r in (low, high)}
        routed = metric(
            cluster, "tierserve_routed_requests_total", replica=high, reason="p0-preempt"
        )
        r = client(cluster).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi!"}],
            max_tokens=4,
            extra_headers={"x-request-tier": "realtime"},
        )
        assert r.choices[0].finish_reason in ("stop", "length")
        assert (
            metric(cluster, "tierserve_routed_requests_total", replica=high, reason="p0-preempt")
            == routed + 1
        )
        wait_for(
            "the P0 request counted on the P3 replica",
            lambda: p0_done(high) == before[high] + 1,
            timeout=15,
        )
        assert p0_done(low) == before[low]
    finally:
        for g in fills:
            g.cancel()
        wait_for("the fill requests aborted", engines_idle, timeout=30)


def test_a_client_leaving_mid_stream_aborts_its_request_on_the_replica(cluster):
    wait_for("idle engines", engines_idle, timeout=30)
    # replica metrics arrive about once a second: the abort count before, once it is steady
    counts = [metric(cluster, "llm_requests_total", finish_reason="abort")]
    for _ in range(20):
        time.sleep(1.5)
        counts.append(metric(cluster, "llm_requests_total", finish_reason="abort"))
        if counts[-1] == counts[-2]:
            break
    aborted = counts[-1]
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 400, "stream": True}
    body["ignore_eos"] = True
    with httpx.stream("POST", f"{cluster}/v1/completions", json=body, timeout=60) as r:
        got = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                got.append(line)
            if len(got) == 3:
                break
    assert len(got) == 3
    wait_for("the replica to abort it", engines_idle, timeout=30)
    wait_for(
        "the abort counted",
        lambda: metric(cluster, "llm_requests_total", finish_reason="abort") == aborted + 1,
        timeout=15,
    )


def test_the_first_token_reaches_each_replica_s_autoscaling_window(cluster):
    """Each replica's class window hears the typed FirstToken event from its engine thread: a
    request streaming past its first token no longer counts as waiting. (The window once
    listened for a "first_token" string nobody sent: every stream counted as waiting, its age
    growing, until it finished.)"""
    wait_for("idle engines", engines_idle, timeout=30)
    replicas = sorted(board_view()["replicas"])
    streams = [pinned(r, Priority.P1, 1000) for r in replicas]
    handle = serve.get_deployment_handle("Engine", APP_NAME)
    try:
        for g in streams:  # hello, then the first token
            assert next(g)["kind"] == "hello"
            assert next(g)["token_ids"]

        def streaming() -> bool:
            reps = board_view()["replicas"]
            return all(reps[r]["load"]["running"][Priority.P1] == 1 for r in replicas)

        def no_p1_waiter() -> bool:
            seen = [handle.record_autoscaling_stats.remote().result() for _ in range(6)]
            return all(m["p1_waiting"] == 0 for m in seen)

        wait_for("both streams running", streaming, timeout=30)
        wait_for("the first tokens heard by the windows", no_p1_waiter, timeout=10)
        assert streaming()  # still streaming: not the Finished event that emptied the window
    finally:
        for g in streams:
            g.cancel()
        wait_for("the streams aborted", engines_idle, timeout=30)


# -- faults (last: it kills a replica) ----------------------------------------------------------


def stream_raw(url: str, n: int, log: dict) -> dict:
    """One streamed completion, read as raw server-sent events."""
    body = {
        "model": MODEL,
        "prompt": f"Count slowly: {n},",
        "max_tokens": 64,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
    }
    out = {"tokens": 0, "error": None, "done": False, "finish": None}
    log[n] = out
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                out["done"] = True
                continue
            obj = json.loads(data)
            if "error" in obj:
                out["error"] = obj["error"]["message"]
                continue
            ch = obj["choices"][0]
            out["tokens"] += 1 if ch["text"] else 0
            out["finish"] = ch["finish_reason"] or out["finish"]
    return out


def test_killing_a_replica_mid_stream_loses_and_hangs_nothing(cluster):
    n = 3 * SEATS  # more than both replicas' seats: some wait in a replica's queue
    log: dict = {}
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(stream_raw, cluster, i, log) for i in range(n)]

        def loaded():  # a replica with every seat taken and requests waiting
            reps = board_view()["replicas"]
            full = [
                r
                for r, x in reps.items()
                if sum(x["load"]["running"]) == SEATS and sum(x["load"]["waiting"]) > 0
            ]
            return full[0] if full else None

        victim = wait_for("a full replica with a queue", loaded)
        time.sleep(0.5)  # its running requests stream their first tokens
        ray.kill(ray.get_actor(f"SERVE_REPLICA::{APP_NAME}#Engine#{victim}", namespace="serve"))
        results = [f.result(timeout=180) for f in futures]  # nothing hangs
    assert all(r["done"] for r in results)  # every stream ended with [DONE]
    failed = [r for r in results if r["error"]]
    assert failed, "the killed replica was streaming"
    for r in failed:
        assert r["tokens"] > 0 and "failed after streaming" in r["error"]
    for r in results:
        if not r["error"]:
            assert r["finish"] == "length"
    assert metric(cluster, "tierserve_replica_failures_total", outcome="retried") >= 1
    assert metric(cluster, "tierserve_replica_failures_total", outcome="ended") == len(failed)
    # Serve replaces the replica; the router uses the new one; nothing is left anywhere
    wait_for("a replacement replica", lambda: len(set(board_view()["replicas"]) - {victim}) == 2)
    r = client(cluster).completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=4)
    assert r.choices[0].finish_reason == "length"

    def idle():
        reps = board_view()["replicas"]
        return all(
            sum(x["load"]["running"]) + sum(x["load"]["waiting"]) == 0 for x in reps.values()
        )

    wait_for("all engines idle", idle, timeout=30)
    assert httpx.get(f"{cluster}/ready", timeout=10).json()["in_flight"] == 0
