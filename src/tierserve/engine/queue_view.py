"""SnapshotQueueView: admission control's view of the engine, on the server's event loop.

It reads only the engine's published snapshot (engine/snapshot.py) and counters the event loop
owns: requests and tokens submitted, sheds asked for. What was submitted but is not yet counted
in the snapshot's intake is still in the command queue; it waits too, so it is added back. The
admission decision and the submission happen in the same event-loop turn, so a burst is counted
request by request.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from tierserve.admission.ttft import Load
from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.request import EngineRequest

if TYPE_CHECKING:
    from tierserve.engine.snapshot import EngineSnapshot

RECENT = 4096  # submissions remembered per class (more than can be in flight between steps)


class SnapshotQueueView:
    def __init__(self, snapshot: Callable[[], EngineSnapshot]) -> None:
        self._snapshot = snapshot
        self.submitted = [0] * NUM_PRIORITIES
        self.submitted_tokens = [0] * NUM_PRIORITIES
        self.sheds_asked = 0
        # (tenant, prompt tokens) of the latest submissions per class, oldest first: the ones
        # the engine has not taken in yet are the last `submitted - intake` of them.
        self._recent: list[deque[tuple[str, int]]] = [
            deque(maxlen=RECENT) for _ in range(NUM_PRIORITIES)
        ]

    def on_submit(self, request: EngineRequest) -> None:
        c = request.priority
        self.submitted[c] += 1
        self.submitted_tokens[c] += request.num_prompt_tokens
        self._recent[c].append((request.tenant, request.num_prompt_tokens))

    def on_shed(self) -> None:
        self.sheds_asked += 1

    def _pending(self, snap: EngineSnapshot) -> list[int]:
        return [self.submitted[c] - snap.intake[c] for c in range(NUM_PRIORITIES)]

    # -- QueueView ---------------------------------------------------------------------------
    def queue_depth(self, priority: Priority) -> int:
        """Requests of `priority` that will have to wait: queued or just submitted, minus the
        running seats still free for them (a burst into an idle server is not a queue)."""
        snap = self._snapshot()
        pending = self._pending(snap)
        own = snap.waiting[priority] + pending[priority]
        everyone = sum(snap.waiting) + sum(pending)
        free = max(0, snap.max_num_seqs - snap.num_running - (everyone - own))
        return max(0, own - free)

    def prompts_waiting(self, priority: Priority) -> int:
        """Requests of `priority` not yet taken into a step: waiting in the engine (as last
        published) or still in the command queue."""
        snap = self._snapshot()
        return snap.waiting[priority] + self._pending(snap)[priority]

    def queued_tokens(self, priority: Priority) -> int:
        snap = self._snapshot()
        pending = self.submitted_tokens[priority] - snap.intake_tokens[priority]
        return snap.waiting_tokens[priority] + pending

    def can_shed(self, below: Priority) -> bool:
        """Whether a less urgent request than `below` will be waiting when a shed command sent
        now is carried out: the snapshot's waiting ones plus those still in the command queue
        (carried out in order, so they are in the engine's queue by then), minus sheds asked
        for and not yet carried out. Requests arriving together are judged on all of them."""
        snap = self._snapshot()
        pending = self._pending(snap)
        lower = sum(snap.waiting[c] + pending[c] for c in range(int(below) + 1, NUM_PRIORITIES))
        return lower - (self.sheds_asked - snap.sheds) > 0

    def dequeued(self, priority: Priority) -> tuple[int, int]:
        return self._snapshot().served[priority]

    def load(self) -> Load:
        """The TTFT predictor's inputs: the snapshot's, plus what is still in the command
        queue (per class, and per tenant for a tenant-fair policy)."""
        snap = self._snapshot()
        load = snap.load
        for c, n in enumerate(self._pending(snap)):
            if n > 0:
                recent = list(self._recent[c])[-n:]
                for tenant, tokens in recent:
                    load = load.with_waiting(Priority(c), tokens, tenant)
        return load
