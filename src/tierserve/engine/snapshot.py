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
from tierserve.engine.load import measure_load
from tierserve.priority import NUM_PRIORITIES

if TYPE_CHECKING:
    from tierserve.engine.core import EngineCore


@dataclass(frozen=True)
class EngineSnapshot:
    seq: int  # publication number, increasing
    taken_at: float  # engine clock
    num_steps: int
    max_num_seqs: int
    running: tuple[int, ...]  # by submitted class
    waiting: tuple[int, ...]  # in the scheduler's queue, by submitted class
    waiting_tokens: tuple[int, ...]
    swapped: int
    served: tuple[tuple[int, int], ...]  # left the queue for the batch since start: (reqs, tokens)
    intake: tuple[int, ...]  # requests taken off the command queue since start, by class
    intake_tokens: tuple[int, ...]
    sheds: int  # shed commands carried out since start
    kv: KVStats
    load: Load  # the TTFT predictor's inputs (engine/load.py)

    @property
    def num_running(self) -> int:
        return sum(self.running)


def take_snapshot(
    core: EngineCore,
    seq: int,
    intake: tuple[int, ...] = (0,) * NUM_PRIORITIES,
    intake_tokens: tuple[int, ...] = (0,) * NUM_PRIORITIES,
    sheds: int = 0,
    with_load: bool = True,
) -> EngineSnapshot:
    """Read the engine's state into plain immutable data. Call on the thread that steps the
    engine (or before it starts). O(running + classes), plus O(waiting) `with_load` (the TTFT
    predictor's inputs, needed only by SLA admission)."""
    s = core.scheduler
    running = [0] * NUM_PRIORITIES
    for r in s.running.values():
        running[r.base_priority] += 1
    classes = range(NUM_PRIORITIES)
    return EngineSnapshot(
        seq=seq,
        taken_at=core.clock.now(),
        num_steps=core.num_steps,
        max_num_seqs=s.config.max_num_seqs,
        running=tuple(running),
        waiting=tuple(s.queue_depth(c) for c in classes),
        waiting_tokens=tuple(s.queued_tokens(c) for c in classes),
        swapped=len(s.swapped),
        served=tuple(s.dequeued(c) for c in classes),
        intake=tuple(intake),
        intake_tokens=tuple(intake_tokens),
        sheds=sheds,
        kv=s.kv.stats(),
        load=measure_load(core) if with_load else Load(),
    )
