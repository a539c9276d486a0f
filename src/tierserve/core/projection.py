"""The running requests' KV blocks over the coming steps, as the reservation projects them
(core/predictive.py, ``SchedulerConfig.predictive_reserve``). Torch-free.

Model: every step, each running request emits one token. A projected request with ``L``
tokens now, predicted to end in ``e`` steps, holds ``ceil((L + t) / bs)`` blocks at step
``0 <= t <= e`` and none after: at its end it frees all of them, prompt included. (A request
that outran its P50 is given an end by its survival median, core/predictive.py.) A request
with no predicted end (it has no prediction) is not projected: it keeps what it holds, plus
the blocks its tokens not yet computed need, over any horizon (``fixed``).

Per class, the change at step ``t`` from what it holds now is::

    D(t) = fixed + sum over projected requests with e >= t of ceil((L + t) / bs) - their held

Between two ends every term is non-decreasing, so over ``[0, H]`` the peak of any
non-decreasing function of the ``D``s is at an end or at ``H``. ``peak`` walks the ends in
order: O(n) a check once they are sorted (once a scheduler step; an admitted request is
inserted in O(n)). The sum of ceilings is bounded from above by
``floor(sum(L + t + bs - 1) / bs)``: never too few, and fewer than one block per projected
request too many (about half a block each on average: ~15 of 400 blocks with 30 running).
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tierserve.priority import NUM_PRIORITIES

if TYPE_CHECKING:
    from collections.abc import Sequence


def ceil_blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


@dataclass(frozen=True)
class Candidate:
    """A waiting request as the projection sees it: ``tokens`` now, ``final`` at its predicted
    end (prompt + P90 output), ``cached`` blocks found in the prefix cache, ``delay`` steps
    before its output starts (its prefill)."""

    tokens: int
    final: int
    cached: int = 0
    delay: int = 0


def _contended(change: int, room: int | None) -> int:
    """How much of a class's `change` in blocks comes out of (negative: goes back to) the
    checked class's room, `room` being its own room (``PartitionLedger.own_room``): growth
    fills the free own room first; frees give back only blocks held beyond it."""
    if room is None:
        return change
    return max(0, change - room) if room >= 0 else max(room, change)


class Projection:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self._ends: list[tuple[int, int, int]] = []  # (steps to its end, class, tokens now)
        self._count = [0] * NUM_PRIORITIES  # projected requests, per class
        self._sum = [0] * NUM_PRIORITIES  # per class: sum of (tokens now + bs - 1)
        self._base = [0] * NUM_PRIORITIES  # per class: fixed - what projected requests hold

    def add(self, cls: int, tokens: int, held: int, end: int | None) -> None:
        """A running request of class `cls` with `tokens` tokens, holding `held` blocks, predicted
        to end in `end` steps (None: unknown; it keeps what it holds and what its tokens need)."""
        bs = self.block_size
        if end is None:
            self._base[cls] += max(0, ceil_blocks(tokens, bs) - held)
            return
        insort(self._ends, (end, cls, tokens))
        self._count[cls] += 1
        self._sum[cls] += tokens + bs - 1
        self._base[cls] -= held

    def peak(self, cls: int, rooms: Sequence[int | None], cand: Candidate) -> int:
        """The most blocks, beyond what they hold now, that the projected requests of classes
        up to `cls` and `cand` take from `cls`'s room at any step of `cand`'s predicted life
        (``rooms[k]``: class k's own room, ``_contended``)."""
        bs = self.block_size
        horizon = cand.delay + max(0, cand.final - cand.tokens)
        count, total = self._count[: cls + 1], self._sum[: cls + 1]
        ends = self._ends
        times = [e for e, k, _ in ends if k <= cls and e < horizon]
        best, j, last = -(1 << 62), 0, -1
        for t in (*times, horizon):
            if t == last:
                continue
            last = t
            while j < len(ends) and ends[j][0] < t:  # ended before t: all freed
                _, k, tokens = ends[j]
                j += 1
                if k <= cls:
                    count[k] -= 1
                    total[k] -= tokens + bs - 1
            used = ceil_blocks(min(cand.tokens + t, cand.final), bs) - cand.cached
            for k in range(cls + 1):
                change = self._base[k] + (total[k] + count[k] * t) // bs
                used += _contended(change, rooms[k])
            best = max(best, used)
        return best
