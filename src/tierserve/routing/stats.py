"""``ReplicaStats`` from an engine's scheduler record.

The engine makes the record (``Scheduler.make_stats()``, core/stats.py) on the thread that steps
it; this turns it into what the router reads. Both are immutable plain data that any thread may
read, and nothing here touches the engine.

The prefix summary holds the hash keys of the first ``PREFIX_BLOCKS`` computed blocks of the
running requests (every such block is in the prefix cache), the ``prefix_limit`` most common.
A prefix whose last holder has finished may still sit in the cache, evictable, without being
advertised: the summary errs towards under-claiming.

With ``--predictive routing`` (``SchedulerConfig.predictive_routing``) the record carries the
replica's predicted KV and work (core/predictive.py ``PredictedLoad``), and so does the report.
"""

from __future__ import annotations

from tierserve.core.stats import SchedulerStats
from tierserve.priority import Priority
from tierserve.routing.types import ReplicaStats, hash_key

PREFIX_LIMIT = 64


def replica_stats(
    stats: SchedulerStats, replica_id: str, prefix_limit: int = PREFIX_LIMIT
) -> ReplicaStats:
    part = stats.kv.partitions
    return ReplicaStats(
        replica_id=replica_id,
        block_size=stats.block_size,
        num_blocks=stats.kv.num_blocks,
        free_blocks=stats.kv.num_free,
        partition_free=(
            part.floor - part.floor_used,
            part.reserve - part.reserve_used,
            part.shared - part.shared_used,
        ),
        headroom=stats.headroom,
        used_blocks=tuple(part.used_by_class),
        p0_room=max(0, part.ceiling - part.used_by_class[Priority.P0]),
        waiting=stats.waiting,
        waiting_tokens=stats.waiting_tokens,
        prefill_tokens=stats.prefill_now,
        running=stats.running_now,
        max_seats=stats.max_num_seqs,
        max_step_tokens=stats.max_num_batched_tokens,
        outstanding_tokens=stats.outstanding_tokens,
        prefix_hashes=frozenset(hash_key(h) for h, _ in stats.prefix_counts[:prefix_limit]),
        time=stats.time,
        predicted_blocks=stats.predicted.blocks if stats.predicted else None,
        predicted_tokens=stats.predicted.tokens if stats.predicted else None,
    )
