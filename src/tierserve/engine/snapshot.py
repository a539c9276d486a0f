"""EngineSnapshot: what the event loop may know about the engine.

The engine thread builds one after every step, after every batch of commands and on every idle
tick, and publishes it by replacing a single reference; nobody mutates it afterwards. Admission
control, ``/ready``, the gauges and the router read it instead of the scheduler's live dicts, so
no thread ever iterates a structure another thread is changing.

Counters that both sides need (requests submitted vs. taken in) are split by owner: the event
loop counts what it submitted, the snapshot counts what the engine took in, and the difference is
what is still in the command queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tierserve.admission.ttft import Load
from tierserve.core.kv.manager import KVStats
from tierserve.core.stats import SchedulerStats
from tierserve.engine.load import load_of
from tierserve.priority import NUM_PRIORITIES

if TYPE_CHECKING:
    from tierserve.engine.core import EngineCore


@dataclass(frozen=True)
class EngineSnapshot:
    seq: int  # publication number, increasing
    taken_at: float  # engine clock
    num_steps: int
    scheduler: SchedulerStats  # the scheduler's record (core/stats.py)
    intake: tuple[int, ...]  # requests taken off the command queue since start, by class
    intake_tokens: tuple[int, ...]
    sheds: int  # shed commands carried out since start
    load: Load  # the TTFT predictor's inputs (engine/load.py)

    # The scheduler's numbers the event loop reads, by submitted class.
    @property
    def running(self) -> tuple[int, ...]:
        return self.scheduler.running

    @property
    def waiting(self) -> tuple[int, ...]:  # in the scheduler's queue
        return self.scheduler.waiting

    @property
    def waiting_tokens(self) -> tuple[int, ...]:
        return self.scheduler.waiting_tokens

    @property
    def served(self) -> tuple[tuple[int, int], ...]:  # left the queue for the batch: (reqs, tokens)
        return self.scheduler.served

    @property
    def swapped(self) -> int:
        return self.scheduler.swapped

    @property
    def max_num_seqs(self) -> int:
        return self.scheduler.max_num_seqs

    @property
    def kv(self) -> KVStats:
        return self.scheduler.kv

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running


def take_snapshot(
    core: EngineCore,
    seq: int,
    intake: tuple[int, ...] = (0,) * NUM_PRIORITIES,
    intake_tokens: tuple[int, ...] = (0,) * NUM_PRIORITIES,
    sheds: int = 0,
    with_load: bool = True,
) -> EngineSnapshot:
    """The engine's state as plain immutable data: the scheduler's record and the engine's own
    counters. Call on the thread that steps the engine (or before it starts). O(running), plus
    O(waiting) `with_load` (the TTFT predictor's inputs, needed only by SLA admission)."""
    stats = core.scheduler.make_stats(with_queue=with_load)
    return EngineSnapshot(
        seq=seq,
        taken_at=stats.time,
        num_steps=core.num_steps,
        scheduler=stats,
        intake=tuple(intake),
        intake_tokens=tuple(intake_tokens),
        sheds=sheds,
        load=load_of(core, stats) if with_load else Load(),
    )
