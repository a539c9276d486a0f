"""What a router has sent to each replica since that replica's last stats report could show it.

Replica stats reach a router one report period late. ``LocalLoad`` remembers the requests this
router sent, for ``hold_s`` (about two report periods, by which time the replica's own report
counts them), and adds them to the reported stats as waiting requests of their class. Counting
a request twice for a moment errs towards spreading a burst; not counting it at all sends the
whole burst to whichever replica looked idlest in the last report. A replica that reports its
predicted KV (``--predictive routing``) gets each such request's prompt blocks added to it.
Plain Python, no Ray.
"""

from __future__ import annotations

import dataclasses
from collections import deque

from tierserve.priority import Priority
from tierserve.routing import ReplicaStats


class LocalLoad:
    def __init__(self, hold_s: float) -> None:
        if hold_s < 0:
            raise ValueError(f"hold_s must not be negative, got {hold_s}")
        self.hold_s = hold_s
        self._sent: dict[str, deque[tuple[float, Priority, int]]] = {}

    def sent(self, replica_id: str, prompt_tokens: int, priority: Priority, now: float) -> None:
        self._sent.setdefault(replica_id, deque()).append((now, Priority(priority), prompt_tokens))

    def forget_except(self, live: set[str]) -> None:
        for rid in [r for r in self._sent if r not in live]:
            del self._sent[rid]

    def adjust(self, stats: ReplicaStats, now: float) -> ReplicaStats:
        q = self._sent.get(stats.replica_id)
        while q and now - q[0][0] > self.hold_s:
            q.popleft()
        if not q:
            return stats
        waiting, tokens = list(stats.waiting), list(stats.waiting_tokens)
        blocks = list(stats.predicted_blocks or (0,) * len(waiting))
        extra = 0
        for _, p, n in q:
            waiting[p] += 1
            tokens[p] += n
            blocks[p] += -(-n // stats.block_size)  # its prompt; its output is not known here
            extra += n
        predicted = {}
        if stats.predicted:
            predicted = {
                "predicted_blocks": tuple(blocks),
                "predicted_tokens": stats.predicted_tokens + extra,
            }
        return dataclasses.replace(
            stats,
            waiting=tuple(waiting),
            waiting_tokens=tuple(tokens),
            outstanding_tokens=stats.outstanding_tokens + extra,
            **predicted,
        )
