"""Statistics from one record (issue 22 item 4): ``Scheduler.make_stats()`` reads the scheduler
into one frozen record; each step's ``StepStats`` carries the one made after it, and its
preemptions and swaps are the step's own, not a difference of counters."""

from __future__ import annotations

import dataclasses

import pytest

from tests.helpers import make_request
from tests.test_scheduler import CHEAP_SWAP, engine, step
from tierserve.core.preemption import PreemptionMode
from tierserve.core.stats import Preemption
from tierserve.priority import Priority

P0, P1, P2, P3 = Priority


def test_the_record_is_the_live_state_read_once_and_frozen():
    eng, clock = engine(num_blocks=16, seqs=2, budget=64)
    a = make_request(10, P1, max_tokens=5)
    b = make_request(6, P3, max_tokens=3)
    c = make_request(9, P2, max_tokens=4)
    for r in (a, b):
        eng.add_request(r)
    step(eng, clock)
    eng.add_request(c)  # no seat left: it waits
    s = eng.scheduler.make_stats(with_queue=True)
    kv = eng.scheduler.kv
    assert (s.running, s.waiting, s.waiting_tokens) == ((0, 1, 0, 1), (0, 0, 1, 0), (0, 0, 9, 0))
    assert s.num_running == 2 and s.num_waiting == 1 and s.swapped == 0
    assert s.kv == kv.stats() and s.headroom == tuple(kv.headroom(p) for p in Priority)
    assert s.served == ((0, 0), (1, 10), (0, 0), (1, 6))
    # c's prompt, then a's and b's sampled token still to compute and their outputs to come
    assert s.outstanding_tokens == 9 + (1 + 4) + (1 + 2)
    assert s.queue is not None and s.queue.waiting_tokens == (0, 0, 9, 0)
    # the predicted engine rate's inputs: a and b hold prompt + 1 sampled token, may emit 4 + 2
    assert (s.decode_context, s.remaining_output) == ((10 + 1) + (6 + 1), 4 + 2)
    assert (s.queue.requests, s.queue.output_tokens) == ((0, 0, 1, 0), 4)
    assert s.time == clock.now() and s.block_size == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.swapped = 3
    assert eng.scheduler.make_stats(with_queue=True) == s  # reading changes nothing


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_step_stats_report_the_step_s_own_preemptions_and_swaps(mode):
    eng, clock = engine(num_blocks=8, cpu=16, mode=mode, costs=CHEAP_SWAP)
    bg = make_request(28, P3, max_tokens=4)  # 7 of 8 blocks
    eng.add_request(bg)
    step(eng, clock)
    first = eng.last_stats
    assert first.preemptions == () and first.swapped_out_blocks == 0
    eng.add_request(make_request(8, P0, max_tokens=4))  # needs 2 blocks, 1 is free
    step(eng, clock)
    stats = eng.last_stats
    assert stats.preemptions == (Preemption(P3, PreemptionMode(mode)),)
    assert stats.swapped_out_blocks == (7 if mode == "swap" else 0)
    after = dataclasses.replace(eng.scheduler.make_stats(), time=clock.now() - 0.01)
    assert stats.scheduler == after  # the record made after the step (the clock moved since)
    assert stats.running == 1 and stats.kv_usage == stats.scheduler.kv.usage
    step(eng, clock)  # the next step preempts nobody: nothing carried over
    assert eng.last_stats.preemptions == ()
