"""Per-priority partitions of the KV pool, kept as counters (blocks stay fungible).

Regions, which add up to the pool (N blocks)::

    ┌──────────── F ───────────┬──────────── R ────────────┬───────────── S ──────────────┐
    │ P0 hard floor            │ P1 elastic reservation    │ shared: anyone, first come   │
    │ P0 only, never lent      │ lent to borrowers while   │ first served                 │
    │ (adapts to P0 demand)    │ P1 is idle                │                              │
    └──────────────────────────┴───────────────────────────┴──────────────────────────────┘

Only per-class usage ``u[c]`` and per-class *borrowed* counts ``b[c]`` (blocks a class other
than P1 holds inside R) are stored; where the rest sits is derived, each class filling its own
region first:

* P0 fills its floor, then S, then free space in R (the reservation protects P1 from *lower*
  classes only); never past its ceiling C in all.
* Borrowed blocks occupy ``b = sum(b[c])`` of R; P1 occupies ``min(u1, R - b)`` and overflows
  into S.
* P2 and P3 live in S; borrowers (P3 by default) may also take R's idle space while P1 is not
  waiting. Their borrowed blocks are the first reclaimed when P1 (or P0) needs room.

So ``shared_used = (u0 - b0 - F)+ + (u1 - (R - b))+ + u2 + u3 - b2 - b3`` and an allocation is
feasible when it keeps ``shared_used <= S``, ``b + min(u1, R - b) <= R`` and ``u0 <= C``. No
allocation by P1..P3 can ever touch the floor: the floor is simply not in their headroom.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tierserve.config import PartitionConfig, PartitionSizes
from tierserve.priority import NUM_PRIORITIES, Priority


@dataclass(frozen=True)
class PartitionUsage:
    floor: int
    floor_used: int
    ceiling: int
    reserve: int
    reserve_used: int
    shared: int
    shared_used: int
    borrowed: int
    used_by_class: tuple[int, ...]


class PartitionLedger:
    def __init__(self, sizes: PartitionSizes, config: PartitionConfig) -> None:
        self.sizes = sizes
        self.config = config
        self.num_blocks = sizes.num_blocks
        self.ceiling = sizes.p0_ceiling
        self.reserve = sizes.p1_reserve
        self.floor = sizes.p0_floor_max
        self.used = [0] * NUM_PRIORITIES
        self.borrowed_by = [0] * NUM_PRIORITIES  # blocks held inside R by classes other than P1
        self.borrowers = frozenset(Priority(p) for p in config.borrowers)
        # P1 has demand when it is waiting for memory; the scheduler tells us.
        self.p1_waiting = False
        # Adaptive floor state.
        self._window_start: float | None = None
        self._window_peak = 0
        self._ewma: float | None = None

    # -- derived quantities ------------------------------------------------------------------
    @property
    def shared(self) -> int:
        return self.num_blocks - self.floor - self.reserve

    @property
    def borrowed(self) -> int:
        return sum(self.borrowed_by)

    def shared_used(self, u: list[int] | None = None, b: list[int] | None = None) -> int:
        u = self.used if u is None else u
        b = self.borrowed_by if b is None else b
        return (
            max(0, u[0] - b[0] - self.floor)
            + max(0, u[1] - (self.reserve - sum(b)))
            + u[2]
            - b[2]
            + u[3]
            - b[3]
        )

    def _reserve_free(self, u: list[int], b: list[int]) -> int:
        return max(0, self.reserve - sum(b) - u[1])

    def _room(self, priority: Priority, u: list[int], b: list[int]) -> tuple[int, int]:
        """(blocks `priority` may take outside R, blocks it may take inside R as a borrower)."""
        shared_free = max(0, self.shared - self.shared_used(u, b))
        if priority == Priority.P0:
            own = max(0, self.floor - max(0, u[0] - b[0]))
            return own + shared_free, self._reserve_free(u, b)
        if priority == Priority.P1:
            return self._reserve_free(u, b) + shared_free, 0
        lend = 0
        if priority in self.borrowers and not self.p1_waiting:
            lend = self._reserve_free(u, b)
        return shared_free, lend

    def own_room(self, priority: Priority, other: Priority) -> int | None:
        """`priority`'s own room as `other` sees it: the free blocks it grows into before it
        reaches any block `other` could take (P0's free floor; P1's free reservation unless
        `other` may take it too: P0, or a borrower while P1 is not waiting); when negative, how
        many of its blocks lie beyond that room, in `other`'s region (the first it gives back
        when it frees). None when it has no room apart (P2, P3, `other` itself, or P1's
        reservation open to `other`): every block it takes or frees counts for `other`."""
        u, b = self.used, self.borrowed_by
        if priority == other:
            return None
        if priority == Priority.P0:
            return self.floor - (u[0] - b[0])
        if priority == Priority.P1 and not self._may_borrow(other):
            return self.reserve - sum(b) - u[1]
        return None

    def _may_borrow(self, priority: Priority) -> bool:
        """Whether `priority` may take the reservation's free space now."""
        return priority == Priority.P0 or (priority in self.borrowers and not self.p1_waiting)

    def headroom(
        self, priority: Priority, u: list[int] | None = None, b: list[int] | None = None
    ) -> int:
        """How many more blocks `priority` could be charged with, given usage (default: now)."""
        u = self.used if u is None else u
        b = self.borrowed_by if b is None else b
        outside, inside = self._room(priority, u, b)
        room = outside + inside
        if priority == Priority.P0:
            room = min(room, self.ceiling - u[0])
        return max(0, room)

    def plan(self, priority: Priority, n: int) -> int | None:
        """If `priority` can be charged `n` blocks, return how many of them are borrowed (held
        inside the P1 reservation); otherwise None."""
        if n <= 0:
            return 0
        if self.headroom(priority) < n:
            return None
        outside, _ = self._room(priority, self.used, self.borrowed_by)
        return max(0, n - outside)

    def capacity(self, priority: Priority) -> int:
        """The most blocks `priority` could ever hold: everyone else gone, floor at its min."""
        s = self.sizes
        shared = s.num_blocks - s.p0_floor_min - s.p1_reserve
        if priority == Priority.P0:
            return s.p0_ceiling
        if priority == Priority.P1:
            return shared + s.p1_reserve
        return shared + (s.p1_reserve if priority in self.borrowers else 0)

    # -- commits -------------------------------------------------------------------------------
    def charge(self, priority: Priority, n: int, borrowed: int = 0) -> None:
        self.used[priority] += n
        self.borrowed_by[priority] += borrowed

    def release(self, priority: Priority, n: int, borrowed: int = 0) -> None:
        self.used[priority] -= n
        self.borrowed_by[priority] -= borrowed
        if self.used[priority] < 0 or self.borrowed_by[priority] < 0:
            raise AssertionError(f"partition counters went negative releasing {n} of {priority}")

    # -- adaptive floor --------------------------------------------------------------------
    def set_floor(self, target: int) -> int:
        """Move the P0 floor toward `target` within [min, max]; growth is limited to space the
        shared region can give up right now (blocks in use are never taken). Returns the floor."""
        target = min(max(target, self.sizes.p0_floor_min), self.sizes.p0_floor_max)
        if target > self.floor:
            shared_free = self.shared - self.shared_used()
            p0_over = max(0, self.used[0] - self.borrowed_by[0] - self.floor)
            movable = p0_over + max(0, shared_free)
            target = min(target, self.floor + movable)
        self.floor = target
        return self.floor

    def observe(self, now: float) -> None:
        """Feed the clock once per step: tracks the peak P0 usage per window and sets the floor
        to an EWMA of those peaks times a headroom factor."""
        if not self.config.adaptive:
            return
        if self._window_start is None:
            self._window_start = now
        self._window_peak = max(self._window_peak, self.used[0])
        if now - self._window_start < self.config.window_s:
            return
        a = self.config.ewma_alpha
        peak = self._window_peak
        self._ewma = peak if self._ewma is None else a * peak + (1 - a) * self._ewma
        self.set_floor(math.ceil(self._ewma * self.config.headroom))
        self._window_start = now
        self._window_peak = self.used[0]

    # -- reporting and checks --------------------------------------------------------------
    def usage(self) -> PartitionUsage:
        u, b = self.used, self.borrowed
        return PartitionUsage(
            floor=self.floor,
            floor_used=min(u[0] - self.borrowed_by[0], self.floor),
            ceiling=self.ceiling,
            reserve=self.reserve,
            reserve_used=b + min(u[1], self.reserve - b),
            shared=self.shared,
            shared_used=self.shared_used(),
            borrowed=b,
            used_by_class=tuple(u),
        )

    def check_invariants(self, recount_used: list[int], recount_borrowed: list[int]) -> None:
        if recount_used != self.used:
            raise AssertionError(f"partition counters {self.used} != recount {recount_used}")
        if recount_borrowed != self.borrowed_by:
            raise AssertionError(f"borrowed {self.borrowed_by} != recount {recount_borrowed}")
        if self.borrowed_by[1] != 0:
            raise AssertionError("P1 blocks marked borrowed from its own reservation")
        u = self.used
        s = self.sizes
        if not (s.p0_floor_min <= self.floor <= s.p0_floor_max):
            raise AssertionError(f"floor {self.floor} outside [{s.p0_floor_min}, {s.p0_floor_max}]")
        if u[0] > self.ceiling:
            raise AssertionError(f"P0 uses {u[0]} blocks, past its ceiling {self.ceiling}")
        if self.shared_used() > self.shared:
            raise AssertionError(
                f"shared region over capacity: {self.shared_used()} > {self.shared}"
            )
        if self.borrowed + min(u[1], self.reserve - self.borrowed) > self.reserve:
            raise AssertionError(f"reservation over capacity: borrowed {self.borrowed}")
        if sum(u[1:]) > self.num_blocks - self.floor:
            raise AssertionError("P1..P3 use blocks of the P0 hard floor")
