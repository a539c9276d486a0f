"""``ReplicaStats`` from a live engine.

Contract: call it on the thread that steps the engine, between steps (it reads the scheduler's
and the KV manager's live state); what it returns is immutable plain data that any thread may
read. Cost: O(1) for the queues and partitions (the scheduler keeps per-class counters) plus one
pass over the running and swapped requests, so once per step is cheap. It reads only public
attributes and changes nothing.

The prefix summary holds the hash keys of the first ``PREFIX_BLOCKS`` computed blocks of the
running requests (every such block is in the prefix cache), the ``prefix_limit`` most common.
A prefix whose last holder has finished may still sit in the cache, evictable, without being
advertised: the summary errs towards under-claiming.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.routing.types import PREFIX_BLOCKS, ReplicaStats, hash_key

if TYPE_CHECKING:
    from tierserve.engine.core import EngineCore

PREFIX_LIMIT = 64


def replica_stats(
    core: EngineCore, replica_id: str, prefix_limit: int = PREFIX_LIMIT
) -> ReplicaStats:
    sched = core.scheduler
    kv = sched.kv
    bs = kv.block_size
    part = kv.ledger.usage()
    running = [0] * NUM_PRIORITIES
    prefill = [0] * NUM_PRIORITIES
    outstanding = sum(sched.queued_tokens(p) for p in Priority)
    prefixes: Counter[int] = Counter()
    # One pass, plain arithmetic: this runs once per engine step.
    for r in sched.running.values():
        p, known, done = r.priority, r.num_tokens, r.num_computed_tokens
        running[p] += 1
        if known - done > 1:  # a decoding request has one: the token it just sampled
            prefill[p] += known - done
        outstanding += known - done + r.sampling_params.max_tokens - len(r.output_token_ids)
        hashes = r.block_hashes
        for i in range(min(PREFIX_BLOCKS, done // bs, len(hashes))):
            prefixes[hash_key(hashes[i])] += 1
    for r in sched.swapped.values():
        outstanding += r.num_tokens - r.num_computed_tokens
        outstanding += r.sampling_params.max_tokens - len(r.output_token_ids)
    return ReplicaStats(
        replica_id=replica_id,
        block_size=bs,
        num_blocks=kv.pool.num_blocks,
        free_blocks=kv.pool.num_free,
        partition_free=(
            part.floor - part.floor_used,
            part.reserve - part.reserve_used,
            part.shared - part.shared_used,
        ),
        headroom=tuple(kv.headroom(p) for p in Priority),
        used_blocks=tuple(part.used_by_class),
        p0_room=max(0, part.ceiling - part.used_by_class[Priority.P0]),
        waiting=tuple(sched.queue_depth(p) for p in Priority),
        waiting_tokens=tuple(sched.queued_tokens(p) for p in Priority),
        prefill_tokens=tuple(prefill),
        running=tuple(running),
        max_seats=sched.config.max_num_seqs,
        max_step_tokens=sched.config.max_num_batched_tokens,
        outstanding_tokens=outstanding,
        prefix_hashes=frozenset(h for h, _ in prefixes.most_common(prefix_limit)),
        time=core.clock.now(),
    )
