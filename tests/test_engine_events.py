"""The engine boundary (issue 22 items 1-3): one EngineClient protocol for the local and the
remote engine, typed events heard through the real engine thread, error kinds mapped to HTTP in
one table, frozen requests across the thread, and streams whose readers free their request's KV
as soon as they leave. Runs the real stack over the fake executor: no model needed. (EndedLate:
tests/test_sla_server.py counts it through the server; the Ray replica's FirstToken:
tests/test_cluster.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import inspect
import time

import httpx
import pytest

from tests.fake_engine import SlowFakeExecutor, fake_built, tiny_tokenizer, words
from tests.server_utils import running_server
from tierserve.api.errors import ENGINE_ERRORS
from tierserve.clock import ManualClock
from tierserve.cluster import wire
from tierserve.cluster.observe import IngressMetrics
from tierserve.cluster.remote_engine import RemoteEngine
from tierserve.core.limits import RequestLimits
from tierserve.engine.async_engine import AsyncEngine
from tierserve.engine.client import EngineClient
from tierserve.engine.events import (
    Added,
    ErrorKind,
    Finished,
    FirstToken,
    RequestInfo,
    Tokens,
)
from tierserve.priority import Priority
from tierserve.request import EngineRequest
from tierserve.sampling_params import SamplingParams


def req(rid: str, n_prompt: int = 6, max_tokens: int = 5, **kw) -> EngineRequest:
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return EngineRequest(rid, tuple(range(1, n_prompt + 1)), sp, **kw)


def run_engine(engine: AsyncEngine, main, timeout: float = 20.0):
    engine.start()
    try:
        return asyncio.run(asyncio.wait_for(main(), timeout))
    finally:
        engine.shutdown()


# -- one protocol, two engines -------------------------------------------------------------------


def _remote(open_stream=None) -> RemoteEngine:
    return RemoteEngine(
        open_stream or (lambda payload: None),
        RequestLimits(4096, 4, (100, 100, 100, 100)),
        ManualClock(),
        IngressMetrics(dict),
        lambda exc: False,
    )


@pytest.mark.parametrize("make", ["local", "remote"])
def test_both_engines_implement_every_member_of_the_engine_client(make):
    """api/ calls only EngineClient's members; each must exist, with the protocol's parameters
    (the remote engine once lacked `fail`, `in_flight_ids` and `error`: a drain or a /health
    on a cluster ingress raised AttributeError)."""
    eng = AsyncEngine(fake_built().engine, tiny_tokenizer()) if make == "local" else _remote()
    assert isinstance(eng, EngineClient)
    for name, member in inspect.getmembers(EngineClient):
        if name.startswith("_") or not callable(member):
            continue
        want = list(inspect.signature(member).parameters)[1:]
        assert list(inspect.signature(getattr(eng, name)).parameters) == want, name
    for name in EngineClient.__annotations__:
        assert hasattr(eng, name), name
    assert eng.clock.now() >= 0  # no `core.clock` shim: the client's own clock


def test_every_error_kind_has_its_http_answer():
    assert set(ENGINE_ERRORS) == set(ErrorKind)
    assert ENGINE_ERRORS[ErrorKind.INVALID][0] == 400 and ENGINE_ERRORS[ErrorKind.SHED][0] == 503


def test_a_live_request_is_refused_at_the_thread_boundary():
    from tierserve.request import Request

    engine = AsyncEngine(fake_built().engine, tiny_tokenizer())

    async def main():
        with pytest.raises(TypeError, match="EngineRequest"):
            engine.submit(Request("live", [1, 2, 3]))

    run_engine(engine, main)


# -- typed events through the engine thread -----------------------------------------------------


def test_observers_hear_typed_events_from_the_engine_thread():
    """Added, FirstToken, Tokens and Finished, in that order, each with a frozen snapshot of
    the request, emitted by the engine thread itself (the class autoscaler once waited for a
    "first_token" string that nobody sent)."""
    engine = AsyncEngine(fake_built().engine, tiny_tokenizer())
    heard: list = []
    engine.set_observers(heard.append, None)

    async def main():
        async with engine.submit(req("a", max_tokens=5, priority=Priority.P2)) as s:
            return [d async for d in s.deltas()]

    deltas = run_engine(engine, main)
    kinds = [type(e) for e in heard]
    assert kinds[0] is Added and kinds[1] is FirstToken and kinds[-1] is Finished
    assert set(kinds[2:-1]) == {Tokens}
    first = heard[1]
    assert first.request.num_output_tokens >= 1 and first.ttft >= 0
    assert first.at >= first.request.first_token_time >= first.request.arrival_time
    assert 1 + sum(e.n for e in heard if isinstance(e, Tokens)) == 5
    done = heard[-1].request
    assert isinstance(done, RequestInfo) and done.priority == Priority.P2
    assert (done.finish_reason, done.num_output_tokens) == ("length", 5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        done.num_output_tokens = 0
    assert deltas[-1].finished and deltas[-1].error_kind is None


def test_errors_carry_their_kind_to_the_stream():
    built = fake_built()
    engine = AsyncEngine(built.engine, tiny_tokenizer())
    built.executor.fail_request_ids.add("broken")
    heard: list = []
    engine.set_observers(heard.append, None)

    async def last(stream):
        async with stream:
            return [d async for d in stream.deltas()][-1]

    async def main():
        too_long = engine.submit(req("too-long", n_prompt=4000, max_tokens=200))
        broken = engine.submit(req("broken"))
        slow = engine.submit(req("slow", max_tokens=200))
        await slow.queue.get()  # running
        engine.fail("slow", ErrorKind.SHUTDOWN, "grace period over")
        return await last(too_long), await last(broken), await last(slow)

    invalid, failed, cut = run_engine(engine, main)
    assert (invalid.error_kind, invalid.finish_reason) == (ErrorKind.INVALID, "error")
    assert "context" in invalid.error
    assert failed.error_kind == ErrorKind.ENGINE and "injected" in failed.error
    assert (cut.error_kind, cut.error) == (ErrorKind.SHUTDOWN, "grace period over")
    ended = {e.request.request_id: e.request for e in heard if isinstance(e, Finished)}
    assert ended["slow"].finish_reason == "error" and "too-long" not in ended  # never added


# -- a reader that leaves frees the request's KV at once, on both engines ---------------------


def _replica_over(engine: AsyncEngine):
    """open_stream for a RemoteEngine whose 'replica' is `engine`, in this process, doing what
    EngineReplica.generate does (without Ray)."""

    class Chunks:
        def __init__(self, payload):
            self.payload = payload

        async def __aiter__(self):
            stream = engine.submit(wire.request_from_payload(self.payload, engine.clock.now()))
            async with stream:
                yield wire.hello("local", "pinned", 0)
                async for d in stream.deltas():
                    yield wire.delta_chunk(d)

        def cancel(self):
            pass  # Ray's cancel reaches the replica's task; here the task is cancelled itself

    return Chunks


def _idle(engine: AsyncEngine) -> bool:
    snap = engine.snapshot
    return snap.num_running == 0 and sum(snap.waiting) == 0 and snap.kv.num_free == 64


@pytest.mark.parametrize("through", ["local", "remote"])
def test_a_reader_leaving_mid_stream_frees_the_kv_at_once(through):
    """The reader takes one delta and leaves its `async with` while still holding the
    suspended generator (nothing for a garbage collector to find, and it is off): the request
    is aborted and its blocks freed within a few steps, not when max_tokens would have ended it
    (1000 steps of 10 ms)."""
    built = fake_built(num_blocks=64, block_size=4, step_s=0.01)
    local = AsyncEngine(built.engine, tiny_tokenizer())
    client = local if through == "local" else _remote(_replica_over(local))

    async def main():
        async with client.submit(req("leaver", max_tokens=1000)) as stream:
            held = stream.deltas()
            first = await held.__anext__()
        left = time.monotonic()
        while not _idle(local):
            await asyncio.sleep(0.01)
        freed = time.monotonic() - left
        last = await asyncio.wait_for(stream.queue.get(), 5)
        while not last.finished:
            last = await asyncio.wait_for(stream.queue.get(), 5)
        return first, freed, last, held

    gc.disable()
    try:
        first, freed, last, _held = run_engine(local, main)
    finally:
        gc.enable()
    assert first.token_ids and not first.finished
    assert freed < 1.0, f"KV freed {freed:.2f} s after the reader left"
    assert last.finish_reason == "abort"
    assert client.num_in_flight() == 0


def test_a_failed_choice_cancels_the_others_of_a_streamed_request():
    """n = 2, choice 0 fails: the server-sent error event ends the response, and choice 1 --
    still generating, 400 tokens to go -- is aborted at once (a `break` out of the merged
    choices once left it running until the generator was collected)."""

    class FailChoiceZero(SlowFakeExecutor):
        def execute(self, out):
            self.fail_request_ids = {r for r in out.num_scheduled_tokens if r.endswith("-0")}
            return super().execute(out)

    ex = FailChoiceZero(64, 4, step_s=0.01)
    built = fake_built(num_blocks=64, block_size=4, executor=ex)
    with running_server(built) as (url, state):
        body = {"prompt": words(6), "max_tokens": 400, "n": 2, "stream": True, "ignore_eos": True}
        gc.disable()
        try:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as r:
                lines = [x for x in r.iter_lines() if x.startswith("data: ")]
            ended = time.monotonic()
            while state.engine.snapshot.num_running and time.monotonic() - ended < 5:
                time.sleep(0.01)
            freed = time.monotonic() - ended
        finally:
            gc.enable()
        assert '"error"' in lines[-2] and lines[-1] == "data: [DONE]"
        assert freed < 1.0 and state.engine.snapshot.kv.num_free == 64


def test_the_remote_engine_fails_and_aborts_like_the_local_one():
    """fail (the drain at the grace deadline) ends a remote stream with its kind and cancels
    the replica's generator; a stream closed before its task ever ran still gets its one
    terminal delta and leaves nothing counted."""
    built = fake_built(num_blocks=64, block_size=4, step_s=0.01)
    local = AsyncEngine(built.engine, tiny_tokenizer())
    client = _remote(_replica_over(local))

    async def main():
        long = client.submit(req("long", max_tokens=1000))
        first = await long.queue.get()
        client.fail("long", ErrorKind.SHUTDOWN, "grace period over")
        async with long:
            cut = [d async for d in long.deltas()][-1]
        early = client.submit(req("early"))
        early.close()  # before its pump task has run at all
        async with early:
            gone = [d async for d in early.deltas()]
        while not _idle(local):
            await asyncio.sleep(0.01)
        return first, cut, gone

    first, cut, gone = run_engine(local, main)
    assert first.token_ids
    assert (cut.finish_reason, cut.error_kind, cut.error) == (
        "error",
        ErrorKind.SHUTDOWN,
        "grace period over",
    )
    assert len(gone) == 1 and gone[0].finish_reason == "abort"
    assert client.num_in_flight() == 0 and client.in_flight_ids() == []
    assert client.queued_tokens(Priority.P1) == 0  # the unacknowledged count let go
