"""SchedulerStats: the scheduler's state as one frozen record.

``Scheduler.make_stats()`` reads the live state once into plain immutable data. The engine keeps
the record made after each step in its ``StepStats`` (engine/core.py), and the engine thread
makes one for every snapshot it publishes between steps. Whatever is known about the scheduler
outside it comes from this record: the snapshot the event loop reads (engine/snapshot.py), the
router's ``ReplicaStats`` (routing/stats.py), the TTFT predictor's ``Load`` (engine/load.py)
and the simulator's samples. Nobody walks ``scheduler.kv.pool``, the ledger or the policy's
queues.

Cost: O(running + swapped) plus the KV manager's ``stats()``; with ``with_queue``, O(waiting)
more for the predictor's view of the queue (only SLA admission asks for it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tierserve.core.kv.manager import KVStats
from tierserve.core.predictive import PredictedLoad
from tierserve.core.preemption import PreemptionMode
from tierserve.priority import NUM_PRIORITIES, Priority

if TYPE_CHECKING:
    from tierserve.core.scheduler import Scheduler

PREFIX_BLOCKS = 2  # leading blocks of a running request counted in ``prefix_counts``


@dataclass(frozen=True)
class Preemption:
    """One preemption: the victim's submitted class and how its KV was let go."""

    priority: Priority
    mode: PreemptionMode


@dataclass(frozen=True)
class PreemptionTotals:
    swap: int = 0
    recompute: int = 0
    swapped_in_blocks: int = 0
    swapped_out_blocks: int = 0


@dataclass(frozen=True)
class QueueStats:
    """The waiting queue by the class each request waits in now (aging may have promoted it
    there) and by tenant, with the policy's fair-queueing state: the TTFT predictor's input."""

    waiting_tokens: tuple[int, ...]
    promoted_tokens: tuple[int, ...]  # the part promoted there from a less urgent class
    # Per class, tenant-fair policies only: (tenant, own tokens, all tokens), by tenant name.
    tenants: tuple[tuple[tuple[str, int, int], ...], ...]
    tenant_counters: tuple[tuple[tuple[str, float], ...], ...]  # per class, by tenant name
    class_tags: tuple[float, ...] | None
    requests: tuple[int, ...] = (0,) * NUM_PRIORITIES  # waiting requests, by class now
    output_tokens: int = 0  # waiting requests' output to come (max_tokens; predictive_ttft: P50)


@dataclass(frozen=True)
class SchedulerStats:
    time: float  # the scheduler's clock
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    # By submitted class.
    running: tuple[int, ...]
    waiting: tuple[int, ...]
    waiting_tokens: tuple[int, ...]
    prefill_tokens: tuple[int, ...]  # tokens running requests still have to prefill
    served: tuple[tuple[int, int], ...]  # left the queue for the batch: (requests, tokens)
    swapped: int
    # By the class a running request runs in now (the scheduler ranks by it).
    running_now: tuple[int, ...]
    prefill_now: tuple[int, ...]
    # Tokens still to compute: waiting prompts, and running and swapped requests' rest.
    outstanding_tokens: int
    decode_context: int  # running requests' tokens (prompt + output so far), summed
    remaining_output: int  # running requests' output still to come (as output_tokens), summed
    # Hashes of running requests' first PREFIX_BLOCKS computed blocks (all in the prefix
    # cache), with how many running requests hold each, most held first.
    prefix_counts: tuple[tuple[bytes, int], ...]
    kv: KVStats
    headroom: tuple[int, ...]  # blocks each class could be charged now
    preemptions: tuple[Preemption, ...]  # in the last schedule()
    totals: PreemptionTotals  # since the start
    express_steps: int
    queue: QueueStats | None = None  # with_queue only
    predicted: PredictedLoad | None = None  # SchedulerConfig.predictive_routing only

    @property
    def num_running(self) -> int:
        return sum(self.running)

    @property
    def num_waiting(self) -> int:
        return sum(self.waiting)


def scheduler_stats(s: Scheduler, with_queue: bool = False) -> SchedulerStats:
    """Read `s` into a SchedulerStats (on the thread that steps it); changes nothing."""
    kv, bs = s.kv, s.kv.block_size
    running, prefill = [0] * NUM_PRIORITIES, [0] * NUM_PRIORITIES
    running_now, prefill_now = [0] * NUM_PRIORITIES, [0] * NUM_PRIORITIES
    outstanding = sum(s.queued_tokens(p) for p in Priority)
    prefixes: Counter[bytes] = Counter()
    context = remaining = 0
    for r in s.running.values():  # one pass, plain arithmetic: once per step
        base, now, done = r.base_priority, r.priority, r.num_computed_tokens
        left = r.num_tokens - done
        running[base] += 1
        running_now[now] += 1
        if left > 1:  # still prefilling (a decoding request has one token to compute)
            prefill[base] += left
            prefill_now[now] += left
        outstanding += left + r.sampling_params.max_tokens - r.num_output_tokens
        context += r.num_tokens
        remaining += s.output_left(r)
        prefixes.update(r.block_hashes[: min(PREFIX_BLOCKS, done // bs)])
    for r in s.swapped.values():
        outstanding += r.num_tokens - r.num_computed_tokens
        outstanding += r.sampling_params.max_tokens - r.num_output_tokens
    p, classes = s.preemptions, list(Priority)
    return SchedulerStats(
        time=s.clock.now(),
        block_size=bs,
        max_num_seqs=s.config.max_num_seqs,
        max_num_batched_tokens=s.config.max_num_batched_tokens,
        running=tuple(running),
        waiting=tuple(s.queue_depth(c) for c in classes),
        waiting_tokens=tuple(s.queued_tokens(c) for c in classes),
        prefill_tokens=tuple(prefill),
        served=tuple(s.dequeued(c) for c in classes),
        swapped=len(s.swapped),
        running_now=tuple(running_now),
        prefill_now=tuple(prefill_now),
        outstanding_tokens=outstanding,
        decode_context=context,
        remaining_output=remaining,
        prefix_counts=tuple(prefixes.most_common()),
        kv=kv.stats(),
        headroom=tuple(kv.headroom(c) for c in classes),
        preemptions=tuple(s.step_preemptions),
        totals=PreemptionTotals(p.swap, p.recompute, p.swapped_in_blocks, p.swapped_out_blocks),
        express_steps=s.express_steps,
        queue=queue_stats(s) if with_queue else None,
        predicted=s.predicted_load() if s.config.predictive_routing else None,
    )


def queue_stats(s: Scheduler) -> QueueStats:
    """The waiting queue as the TTFT predictor sees it. O(waiting)."""
    policy = s.policy
    fair = policy.traits.tenant_fair
    waiting, promoted = [0] * NUM_PRIORITIES, [0] * NUM_PRIORITIES
    requests, outputs = [0] * NUM_PRIORITIES, 0
    by_tenant: list[dict[str, list[int]]] = [{} for _ in range(NUM_PRIORITIES)]
    for r in policy.requests():
        c, n = r.priority, r.num_tokens
        own = n if r.base_priority == c else 0
        waiting[c] += n
        requests[c] += 1
        outputs += s.output_left(r)
        promoted[c] += n - own
        if fair:
            t = by_tenant[c].setdefault(r.tenant, [0, 0])
            t[0] += own
            t[1] += n
    return QueueStats(
        waiting_tokens=tuple(waiting),
        promoted_tokens=tuple(promoted),
        tenants=tuple(
            tuple((t, own, n) for t, (own, n) in sorted(by_tenant[c].items()))
            for c in range(NUM_PRIORITIES)
        ),
        tenant_counters=tuple(
            tuple(sorted(policy.tenant_counters(Priority(c)).items()))
            for c in range(NUM_PRIORITIES)
        ),
        class_tags=policy.class_tags(),
        requests=tuple(requests),
        output_tokens=outputs,
    )
