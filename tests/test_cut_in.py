"""P0 cut-in (core/cut_in.py): a P0 request that arrives while a step runs gets a step of its
own between two of that step's layers. The stopped step must come out exactly as without the
cut-in, the cut-in must touch none of its requests, and the P0 request's first token must go
out before the stopped step ends: checked on the KV-simulating fake executor (whose tokens are
read back from the KV slots, so any slot the cut-in overwrote changes an output) and, through
the engine thread, on the embedded model."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tests.helpers import make_request
from tests.server_utils import small_engine_args
from tierserve.clock import ManualClock
from tierserve.config import CacheConfig, PartitionConfig, PolicyConfig, SchedulerConfig
from tierserve.engine.async_engine import AsyncEngine
from tierserve.engine.builder import build_engine
from tierserve.engine.core import EngineCore
from tierserve.engine.events import Added
from tierserve.executor.fake import FakeExecutor
from tierserve.priority import Priority
from tierserve.request import EngineRequest, RequestStatus
from tierserve.sampling_params import SamplingParams


def _core(cut_in: bool, max_num_seqs: int = 8) -> EngineCore:
    return EngineCore.build(
        FakeExecutor(64, 4),
        ManualClock(),
        CacheConfig(4, 64),
        SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=256,
            p0_express="exclusive",
            p0_cut_in=cut_in,
            check_invariants=True,
        ),
        PolicyConfig(name="hybrid"),
    )


def _run(cut_in: bool) -> dict:
    """Three P3 requests and a P0 decoding; a second P0 arrives between two layers of the
    next step. Returns every request's output, and what the hook saw."""
    core = _core(cut_in)

    def prompt(n, k):  # the same prompts in both runs (ids differ)
        return [(k * 101 + i * 7 + 3) % 900 for i in range(n)]

    early = [
        make_request(tokens=prompt(24, k), priority=Priority.P3, max_tokens=10) for k in range(3)
    ]
    early.append(make_request(tokens=prompt(12, 3), priority=Priority.P0, max_tokens=10))
    for r in early:
        core.add_request(r)
    while not all(r.num_output_tokens for r in early):  # all decoding (P0 first: express)
        core.step()
    for _ in range(3):  # express steps (cut-ins too) may take a quarter of the engine's time:
        core.step()  # on a clock that stands still, of its steps
    assert all(r.status == RequestStatus.RUNNING for r in early)
    late = make_request(tokens=prompt(20, 4), priority=Priority.P0, max_tokens=6)
    seen: dict = {}

    def hook():
        if seen:
            return
        seen["before"] = [r.num_output_tokens for r in early]
        core.add_request(late)
        changed, stats = core.cut_in()
        seen["changed"] = [r.request_id for r in changed]
        seen["batch"] = None if stats is None else stats.batch_size
        seen["late_tokens"] = late.num_output_tokens
        seen["during"] = [r.num_output_tokens for r in early]
        core.scheduler.check_invariants()

    core.set_layer_hook(hook)
    core.step()
    seen["after_step"] = late.num_output_tokens
    steps = 0
    while core.has_unfinished():
        core.step()
        steps += 1
        assert steps < 100
    core.scheduler.kv.check_invariants()
    assert core.scheduler.kv.usage() == 0.0
    seen["outputs"] = [list(r.output_token_ids) for r in [*early, late]]
    seen["cut_ins"] = core.scheduler.cut_ins
    return seen


def test_a_cut_in_serves_the_new_p0_inside_the_step_and_changes_no_output():
    on, off = _run(cut_in=True), _run(cut_in=False)
    # Token for token the same outputs, the stopped step's and the newcomer's: nothing the cut-in
    # wrote landed in a slot the stopped step uses (the fake reads tokens back from the slots).
    assert on["outputs"] == off["outputs"]
    assert on["cut_ins"] == 1 and off["cut_ins"] == 0
    # Inside the step: the newcomer alone (the running P0 was not scheduled twice) got its first
    # token, and none of the stopped step's requests had moved.
    assert on["batch"] == 1 and on["late_tokens"] == 1 and len(on["changed"]) == 1
    assert on["during"] == on["before"] == off["before"]
    # Without it, the newcomer has no token when the step ends (it gets one in the next).
    assert off["batch"] is None and off["late_tokens"] == 0 and off["after_step"] == 0


def _decoding_p3_and_a_p0(core: EngineCore, count: int, prompt_len: int):
    """`count` P3 requests added and decoding (four steps run), and a P0 request not yet
    added; the same prompts every call."""
    bg = [
        make_request(
            tokens=[(k * 31 + i) % 900 for i in range(prompt_len)], priority=3, max_tokens=20
        )
        for k in range(count)
    ]
    for r in bg:
        core.add_request(r)
    for _ in range(4):
        core.step()
    return bg, make_request(tokens=list(range(500, 508)), priority=Priority.P0, max_tokens=3)


def _seat_run(cut_in: bool) -> dict:
    """Every seat taken by P3 requests; a P0 arrives between two layers of a step."""
    core = _core(cut_in, max_num_seqs=3)
    bg, p0 = _decoding_p3_and_a_p0(core, count=3, prompt_len=16)
    counts = core.scheduler.preemptions
    seen: dict = {}

    def hook():
        if not seen:
            core.add_request(p0)
            seen["result"] = core.cut_in()
            seen["running"] = len(core.scheduler.running)
            seen["owed"] = list(core.scheduler.seats_owed)
            seen["preempted"] = counts.swap + counts.recompute
            core.scheduler.check_invariants()

    core.set_layer_hook(hook)
    core.step()
    seen["running_after_step"] = len(core.scheduler.running)
    core.step()
    seen["running_next"] = len(core.scheduler.running)
    seen["preempted_next"] = counts.swap + counts.recompute
    seen["p0_tokens_next"] = p0.num_output_tokens
    while core.has_unfinished():
        core.step()
    seen["outputs"] = [list(r.output_token_ids) for r in [*bg, p0]]
    return seen


def test_a_cut_in_borrows_a_full_batchs_seat_and_the_next_step_preempts_for_it():
    """No free seat: the cut-in seats the P0 beyond max_num_seqs, preempting nobody inside the
    step; the next step preempts one P3 for it (as an express step would have), and every
    output is the one a run without cut-ins gives."""
    on, off = _seat_run(True), _seat_run(False)
    changed, stats = on["result"]
    assert stats is not None and stats.batch_size == 1 and len(changed) == 1
    assert on["running"] == 4 and len(on["owed"]) == 1 and on["preempted"] == 0
    assert on["running_after_step"] == 4
    assert on["running_next"] == 3 and on["preempted_next"] == 1
    assert off["result"] == ([], None) and off["preempted_next"] == 1
    assert on["outputs"] == off["outputs"]


def test_a_p0_that_needs_others_blocks_waits_for_the_next_step():
    """The pool is full: blocks for the P0 would have to come from requests of the step in
    flight. No cut-in runs; the next step preempts for it."""
    flat = PartitionConfig(p0_floor_min=0, p0_floor_max=0, p0_ceiling=1.0, p1_reserve=0)
    core = EngineCore.build(
        FakeExecutor(20, 4),
        ManualClock(),
        CacheConfig(4, 20, partitions=flat),
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, check_invariants=True),
        PolicyConfig(name="hybrid"),
    )
    _, p0 = _decoding_p3_and_a_p0(core, count=2, prompt_len=36)
    assert core.scheduler.kv.pool.num_free == 0
    seen = {}

    def hook():
        if not seen:
            core.add_request(p0)
            seen["result"] = core.cut_in()

    core.set_layer_hook(hook)
    core.step()
    counts = core.scheduler.preemptions
    assert seen["result"] == ([], None) and counts.swap + counts.recompute == 0
    assert p0.status == RequestStatus.WAITING and core.scheduler.cut_ins == 0
    core.step()
    assert p0.num_output_tokens == 1 and counts.swap + counts.recompute == 1


def test_no_cut_in_while_the_step_in_flight_prefills_a_p0_prompt():
    """Its first token would wait for the cut-in's prompts: the new P0 waits for the step's
    end (bounded while P0 is about) and is served in the next one."""
    core = _core(cut_in=True)
    _bg, first = _decoding_p3_and_a_p0(core, count=2, prompt_len=12)
    second = make_request(tokens=list(range(600, 610)), priority=Priority.P0, max_tokens=3)
    core.add_request(first)
    seen = {}

    def hook():
        if not seen:
            core.add_request(second)
            seen["result"] = core.cut_in()

    core.set_layer_hook(hook)
    core.step()  # the first P0's prompt is in this step
    assert seen["result"] == ([], None) and core.scheduler.cut_ins == 0
    assert first.num_output_tokens == 1 and second.status == RequestStatus.WAITING
    core.set_layer_hook(None)
    core.step()
    assert second.num_output_tokens == 1


@pytest.fixture(scope="module")
def model_engines():
    """The embedded model, with steps sized by tokens only (so a long prompt is one long step
    that a P0 can arrive in), with and without cut-ins."""
    kw = dict(step_time_fraction=None, p0_step_time_fraction=None, max_num_batched_tokens=2048)
    return {on: build_engine(small_engine_args(p0_cut_in=on, **kw)) for on in (True, False)}


LONG = "The history of the river valley is long. " * 90
SHORT = "Name three colours."


@pytest.mark.parametrize("cut_in", [True, False])
def test_through_the_engine_thread_a_p0_gets_its_first_token_inside_a_long_step(
    model_engines, cut_in
):
    """A P3 request's long prompt is one step; a P0 request submitted once that step runs gets
    its first token before the P3 gets its own (with cut-ins), and both texts are those each
    request gets alone. Without cut-ins, the P0 waits for the long step's end."""
    built = model_engines[cut_in]
    core, tk = built.engine, built.tokenizer
    added = threading.Event()  # the P3 request reached the engine thread: its step follows
    engine = AsyncEngine(core, tk, on_event=lambda e: added.set() if isinstance(e, Added) else None)
    engine.start()
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    bg_ids = tuple(tk.encode(LONG))
    p0_ids = tuple(tk.encode(SHORT))
    assert len(bg_ids) > 700

    async def collect(req, marks):
        text = []
        async for d in engine.generate(req):
            if d.token_ids and req.request_id not in marks:
                marks[req.request_id] = time.perf_counter()
            text.extend(d.token_ids)
        return text

    async def scenario():
        marks: dict[str, float] = {}
        bg = EngineRequest(f"bg-{cut_in}", bg_ids, greedy, priority=Priority.P3)
        p0 = EngineRequest(f"p0-{cut_in}", p0_ids, greedy, priority=Priority.P0)
        bg_task = asyncio.create_task(collect(bg, marks))
        while not added.is_set():
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.05)  # the long step runs (0.5-3 s)
        p0_out = await collect(p0, marks)
        return await bg_task, p0_out, marks

    try:
        bg_out, p0_out, marks = asyncio.run(asyncio.wait_for(scenario(), timeout=120))
        # Each alone, afterwards (no prefix hits: salted apart), for the reference texts.
        alone = {}
        for name, ids, prio in (("bg", bg_ids, Priority.P3), ("p0", p0_ids, Priority.P0)):

            async def one(name=name, ids=ids, prio=prio):
                req = EngineRequest(
                    f"{name}-alone-{cut_in}", ids, greedy, priority=prio, cache_salt="alone"
                )
                return await collect(req, {})

            alone[name] = asyncio.run(asyncio.wait_for(one(), timeout=120))
    finally:
        engine.shutdown()
    assert bg_out == alone["bg"] and p0_out == alone["p0"]
    first_p0, first_bg = marks[f"p0-{cut_in}"], marks[f"bg-{cut_in}"]
    if cut_in:
        assert first_p0 < first_bg and core.scheduler.cut_ins >= 1
    else:
        assert first_bg < first_p0 and core.scheduler.cut_ins == 0
