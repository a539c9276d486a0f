"""Exact scheduler scenarios on tiny pools, with the KV-simulating fake executor."""

from dataclasses import replace

import pytest

from tests.helpers import make_request
from tierserve.clock import ManualClock
from tierserve.config import CacheConfig, PartitionConfig, PolicyConfig, SchedulerConfig
from tierserve.core.outputs import SchedulerOutput
from tierserve.core.preemption import PreemptionCosts
from tierserve.engine import EngineCore
from tierserve.executor.fake import FakeExecutor
from tierserve.priority import Priority
from tierserve.request import RequestStatus as S

P0, P1, P2, P3 = Priority
NO_PARTS = PartitionConfig(
    p0_floor_min=0, p0_floor_max=0, p0_ceiling=1.0, p1_reserve=0, adaptive=False
)
# Swapping 1 block costs 2 us, recomputing 1 token 1 ms: "auto" swaps.
CHEAP_SWAP = PreemptionCosts(kv_bytes_per_block=1e3, swap_bytes_per_s=1e9, prefill_tokens_per_s=1e3)


def engine(
    num_blocks=16,
    block_size=4,
    cpu=0,
    seqs=8,
    budget=64,
    policy="hybrid",
    parts=NO_PARTS,
    mode="recompute",
    costs=None,
    express=False,
):
    clock = ManualClock()
    ex = FakeExecutor(num_blocks, block_size, cpu, costs=costs)
    eng = EngineCore.build(
        ex,
        clock,
        CacheConfig(block_size, num_blocks, cpu, partitions=parts),
        SchedulerConfig(
            max_num_seqs=seqs,
            max_num_batched_tokens=budget,
            preemption_mode=mode,
            check_invariants=True,
            max_model_len=4096,
            p0_express="exclusive" if express else "off",
        ),
        PolicyConfig(name=policy),
    )
    return eng, clock


def step(eng, clock, dt=0.01):
    changed = eng.step()
    clock.advance(dt)
    return changed


def drain(eng, clock, limit=10_000):
    for _ in range(limit):
        if not eng.has_unfinished():
            return
        step(eng, clock)
    raise AssertionError("engine did not drain")


def test_p0_arrival_preempts_a_running_p3_when_memory_is_full():
    eng, clock = engine(num_blocks=8)
    bg = make_request(28, P3, max_tokens=4)  # 7 of 8 blocks, 8 when done
    eng.add_request(bg)
    step(eng, clock)
    assert bg.status == S.RUNNING and bg.num_output_tokens == 1
    rt = make_request(8, P0, max_tokens=4)  # needs 2 blocks, 1 is free
    eng.add_request(rt)
    changed = step(eng, clock)
    assert rt in changed and rt.num_output_tokens == 1  # first token in this very step
    assert bg.status == S.PREEMPTED and bg.num_computed_tokens == 0
    assert eng.scheduler.preemptions.recompute == 1
    assert eng.scheduler.preemptions.by_victim_class[P3] == 1
    drain(eng, clock)
    assert bg.status == S.FINISHED and bg.num_output_tokens == 4


def test_p0_with_free_seats_but_no_blocks_reclaims_p3_borrowed_blocks_first():
    parts = PartitionConfig(
        p0_floor_min=0, p0_floor_max=0, p0_ceiling=1.0, p1_reserve=4, adaptive=False
    )
    eng, clock = engine(num_blocks=12, parts=parts, seqs=8)
    batch = make_request(29, P2, max_tokens=3)  # 8 blocks: the whole shared region
    bg = make_request(14, P3, max_tokens=3)  # 4 blocks: borrowed from the idle P1 reservation
    eng.add_request(batch)
    eng.add_request(bg)
    step(eng, clock)
    kv = eng.scheduler.kv
    assert kv.stats().partitions.borrowed == 4 and kv.pool.num_free == 0
    rt = make_request(8, P0, max_tokens=2)
    eng.add_request(rt)
    step(eng, clock)
    assert rt.status == S.RUNNING and rt.num_output_tokens == 1
    assert bg.status == S.PREEMPTED  # the borrower went first
    assert batch.status == S.RUNNING  # the shared-region holder was not touched


def test_preempted_request_resumes_ahead_of_later_arrivals_of_its_class():
    eng, clock = engine(num_blocks=8)
    first = make_request(20, P2, max_tokens=6)  # 5 blocks
    eng.add_request(first)
    step(eng, clock)
    rt = make_request(12, P0, max_tokens=3)  # 3 blocks + growth: pushes `first` out
    eng.add_request(rt)
    step(eng, clock)
    assert first.status == S.PREEMPTED
    later = make_request(20, P2, max_tokens=6)
    eng.add_request(later)
    # Until P0 finishes neither P2 fits; then `first` must be admitted before `later`.
    while first.status != S.RUNNING:
        step(eng, clock)
        assert later.status == S.WAITING
    assert later.status == S.WAITING
    drain(eng, clock)
    assert first.finished_time < later.finished_time


def test_long_p2_prompt_is_chunked_and_p0_gets_its_first_token_next_step():
    eng, clock = engine(num_blocks=64, budget=16)
    long_ = make_request(100, P2, max_tokens=2)
    eng.add_request(long_)
    step(eng, clock)
    assert long_.num_computed_tokens == 16 and long_.num_output_tokens == 0
    rt = make_request(8, P0, max_tokens=2)
    eng.add_request(rt)
    step(eng, clock)
    assert rt.num_output_tokens == 1  # within the next step
    assert long_.num_computed_tokens == 24  # it still made progress with the rest
    drain(eng, clock)
    assert long_.num_output_tokens == 2


def test_prompts_over_the_long_threshold_get_a_smaller_per_step_budget():
    clock = ManualClock()
    eng = EngineCore.build(
        FakeExecutor(256, 16),
        clock,
        CacheConfig(16, 256, partitions=NO_PARTS),
        SchedulerConfig(
            max_num_batched_tokens=2048,
            long_prefill_threshold=1000,
            long_prefill_max_tokens=256,
            check_invariants=True,
        ),
    )
    long_, short = make_request(1500, P2, max_tokens=1), make_request(900, P2, max_tokens=1)
    eng.add_request(long_)
    eng.add_request(short)
    eng.step()
    assert long_.num_computed_tokens == 256
    assert short.num_computed_tokens == 900  # under the threshold: not capped


def test_seats_full_p0_takes_the_seat_of_the_lowest_class():
    eng, clock = engine(num_blocks=64, seqs=2)
    a, b = make_request(8, P1, max_tokens=20), make_request(8, P3, max_tokens=20)
    eng.add_request(a)
    eng.add_request(b)
    step(eng, clock)
    rt = make_request(8, P0, max_tokens=2)
    eng.add_request(rt)
    step(eng, clock)
    assert rt.num_output_tokens == 1
    assert b.status == S.PREEMPTED and a.status == S.RUNNING


def test_auto_mode_swaps_when_swap_is_cheap_and_outputs_are_unchanged():
    def run(mode, costs):
        eng, clock = engine(num_blocks=8, cpu=16, mode=mode, costs=costs)
        bg = make_request(tokens=list(range(100, 124)), priority=P3, max_tokens=12)
        eng.add_request(bg)
        step(eng, clock)
        step(eng, clock)
        eng.add_request(make_request(tokens=list(range(500, 512)), priority=P0, max_tokens=3))
        step(eng, clock)
        status = bg.status
        drain(eng, clock)
        return status, list(bg.output_token_ids), eng.scheduler.preemptions

    swapped, out_swap, p_swap = run("auto", CHEAP_SWAP)
    assert swapped == S.SWAPPED and p_swap.swap == 1 and p_swap.swapped_in_blocks > 0
    recomputed, out_rec, p_rec = run("recompute", None)
    assert recomputed == S.PREEMPTED and p_rec.recompute == 1
    assert out_swap == out_rec


def test_swap_falls_back_to_recompute_when_swap_space_is_full():
    eng, clock = engine(num_blocks=8, cpu=2, mode="swap")
    bg = make_request(24, P3, max_tokens=8)  # 6 blocks > 2 swap blocks
    eng.add_request(bg)
    step(eng, clock)
    eng.add_request(make_request(12, P0, max_tokens=3))
    step(eng, clock)
    assert bg.status == S.PREEMPTED
    assert eng.scheduler.preemptions.recompute == 1


def test_abort_frees_everything_from_every_state():
    eng, clock = engine(num_blocks=8, cpu=16, mode="swap")
    run_ = make_request(16, P3, max_tokens=50)
    eng.add_request(run_)
    step(eng, clock)
    eng.add_request(make_request(16, P0, max_tokens=50))
    step(eng, clock)
    assert run_.status == S.SWAPPED
    waiting = make_request(16, P2, max_tokens=5)
    eng.add_request(waiting)
    for r in (run_, waiting):
        assert eng.abort_request(r.request_id).status == S.ABORTED
    assert eng.abort_request("never-seen") is None
    for rid in list(eng.scheduler.requests):
        eng.abort_request(rid)
    kv = eng.scheduler.kv
    assert kv.pool.num_free == 8 and kv.swap.num_free == 16
    eng.scheduler.check_invariants()


def test_executor_failure_fails_the_step_and_the_engine_keeps_serving():
    eng, clock = engine(num_blocks=32)
    a = make_request(8, P1, max_tokens=4)
    eng.add_request(a)
    eng.executor.raise_next = RuntimeError("device lost")
    step(eng, clock)
    assert a.status == S.FAILED and "device lost" in a.error
    assert eng.scheduler.kv.pool.num_free == 32
    b = make_request(8, P1, max_tokens=4)
    eng.add_request(b)
    drain(eng, clock)
    assert b.status == S.FINISHED and b.num_output_tokens == 4


def test_per_request_failure_fails_only_that_request():
    eng, clock = engine(num_blocks=32)
    a, b = make_request(8, P1, max_tokens=3), make_request(8, P1, max_tokens=3)
    eng.executor.fail_request_ids.add(a.request_id)
    eng.add_request(a)
    eng.add_request(b)
    drain(eng, clock)
    assert a.status == S.FAILED and b.status == S.FINISHED


def test_request_over_the_context_is_refused_with_both_numbers():
    eng, _ = engine()
    with pytest.raises(ValueError, match=r"prompt \(4000 tokens\).*max_tokens \(200\).*4096"):
        eng.add_request(make_request(4000, P1, max_tokens=200))


def test_duplicate_request_id_is_refused():
    eng, _ = engine()
    r = make_request(8, P1)
    eng.add_request(r)
    with pytest.raises(ValueError, match="already in the engine"):
        eng.add_request(r)


def test_p0_express_step_runs_p0_alone_then_everyone_resumes():
    eng, clock = engine(num_blocks=64, express=True)
    bg = [make_request(8, P3, max_tokens=30) for _ in range(3)]
    for r in bg:
        eng.add_request(r)
    step(eng, clock)
    rt = make_request(8, P0, max_tokens=5)
    eng.add_request(rt)
    out_before = [r.num_output_tokens for r in bg]
    step(eng, clock)
    assert rt.num_output_tokens == 1
    assert [r.num_output_tokens for r in bg] == out_before  # they sat this step out
    assert all(r.status == S.RUNNING for r in bg)  # and kept their memory
    step(eng, clock)
    assert [r.num_output_tokens for r in bg] == [n + 1 for n in out_before]
    # Another P0 right away: no second express step within the gap, it joins a normal step.
    rt2 = make_request(8, P0, max_tokens=5)
    eng.add_request(rt2)
    step(eng, clock)
    assert rt2.num_output_tokens == 1
    assert [r.num_output_tokens for r in bg] == [n + 2 for n in out_before]
    assert eng.scheduler.express_steps == 1


def test_express_steps_are_for_policies_that_serve_p0_strictly():
    eng, clock = engine(num_blocks=64, express=True, policy="drr")
    bg = make_request(8, P3, max_tokens=30)
    eng.add_request(bg)
    step(eng, clock)
    eng.add_request(make_request(8, P0, max_tokens=5))
    step(eng, clock)
    assert eng.scheduler.express_steps == 0


# -- every step reports every request that changed (issue 14, item 1) ---------------------------


def test_lone_request_out_of_memory_is_reported_by_the_step_that_ends_it():
    """Alone and out of blocks, a request is finished with `length` inside schedule(); the step
    must still report it even though nothing else was scheduled."""
    eng, clock = engine(num_blocks=4, block_size=4)  # 16 token slots in all
    r = make_request(6, P1, max_tokens=100)
    eng.add_request(r)
    reported = []
    for _ in range(100):
        if not eng.has_unfinished():
            break
        reported += [x.request_id for x in step(eng, clock) if x.is_finished]
    assert r.status == S.FINISHED and r.finish_reason.value == "length"
    assert reported == [r.request_id]
    assert eng.scheduler.kv.pool.num_free == 4


def test_a_step_whose_only_news_is_a_preemption_reaches_the_executor():
    """EngineCore.step hands the executor every output that carries news, even with no tokens
    to run, so it forgets a preempted request's state."""
    eng, clock = engine(num_blocks=8, block_size=4)
    bg = make_request(12, P3, max_tokens=8)
    eng.add_request(bg)
    step(eng, clock)
    assert bg.request_id in eng.executor.states
    only_news = SchedulerOutput(step_id=99, preempted_req_ids={bg.request_id})
    eng.scheduler.schedule = lambda: only_news
    eng.step()
    assert bg.request_id not in eng.executor.states


def test_a_request_that_outgrows_its_class_capacity_finishes_instead_of_blocking_the_queue():
    """Found by the soak: a P0 request grew to P0's ceiling while a P3 request ran beside it. It
    could not grow, no victim could help (the ceiling, not free space, was the limit), so it was
    preempted and requeued needing more blocks than P0 may ever hold: at the head of the queue
    forever, blocking everyone. It has all the memory its class can get: it ends with length."""
    parts = PartitionConfig(p0_floor_min=1, p0_floor_max=1, p0_ceiling=9, p1_reserve=0)
    eng, clock = engine(num_blocks=16, block_size=4, parts=parts)
    p0 = make_request(30, P0, max_tokens=50)  # 8 of P0's 9 blocks at once
    bg = make_request(8, P3, max_tokens=40)
    eng.add_request(bg)
    eng.add_request(p0)
    drain(eng, clock)
    assert p0.finish_reason.value == "length" and p0.num_computed_tokens == 36  # 9 blocks x 4
    assert bg.finish_reason.value == "length" and bg.num_output_tokens == 40
    assert eng.scheduler.kv.pool.num_free == 16


def test_aging_never_promotes_a_request_into_a_class_that_cannot_hold_it():
    """wfq promotes up to P0; a P1 prompt larger than P0's ceiling must stay in P1 (promoted, it
    would wait at the head of P0 forever)."""
    parts = PartitionConfig(p0_floor_min=1, p0_floor_max=1, p0_ceiling=4, p1_reserve=0)
    eng, clock = engine(num_blocks=16, block_size=4, parts=parts, policy="wfq", seqs=1)
    hog = make_request(8, P1, max_tokens=40)  # holds the only seat for a while
    big = make_request(30, P1, max_tokens=2)  # 8 blocks: fits P1, not P0's 4
    eng.add_request(hog)
    step(eng, clock)
    eng.add_request(big)
    for _ in range(4000):
        if not eng.has_unfinished():
            break
        step(eng, clock, dt=1.0)  # the hog runs ~40 s: past P1's 30 s aging threshold
    assert big.status == S.FINISHED and big.priority == P1
    assert hog.status == S.FINISHED


def test_a_waiting_p0_prompt_is_not_split_by_decodes_ranked_after_a_capped_prefill():
    """A lower-class prefill chunk leaves budget for the P0 tokens waiting; the decodes of
    requests ranked after that chunk must not eat into it (found by the SLA work: the P0 prompt
    was split and took an extra step)."""
    eng, clock = engine(num_blocks=256, block_size=4, budget=64, seqs=16)
    cfg = eng.scheduler.config
    eng.scheduler.config = replace(cfg, long_prefill_threshold=100, long_prefill_max_tokens=32)
    long = make_request(400, P3, max_tokens=4)  # prefilled 32 tokens a step
    eng.add_request(long)
    step(eng, clock)
    decoders = [make_request(4, P3, max_tokens=50) for _ in range(4)]
    for r in decoders:
        eng.add_request(r)
    step(eng, clock)
    step(eng, clock)
    assert all(r.num_output_tokens >= 1 for r in decoders)
    assert long.num_computed_tokens < long.num_prompt_tokens  # still prefilling
    p0 = make_request(40, P0, max_tokens=2)
    eng.add_request(p0)
    out = {}
    real = eng.scheduler.schedule

    def spy():
        o = real()
        out.update(o.num_scheduled_tokens)
        return o

    eng.scheduler.schedule = spy
    step(eng, clock)
    assert out[p0.request_id] == 40  # the whole prompt in one step
    assert all(out[r.request_id] == 1 for r in decoders)
