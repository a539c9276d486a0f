"""Per-priority partitions of the KV pool, kept as counters (blocks stay fungible).

Regions, which add up to the pool (N blocks)::

    ┌──────────── F ───────────┬──────────── R ────────────┬───────────── S ──────────────┐
    │ P0 hard floor            │ P1 elastic reservation    │ shared: anyone, first come   │
    │ P0 only, never lent      │ lent to borrowers while   │ first served                 │
    │ (adapts to P0 demand)    │ P1 is idle                │                              │
    └──────────────────────────┴───────────────────────────┴──────────────────────────────┘

Only per-class usage ``u[c]`` and the number of borrowed blocks ``b`` are stored; where each
class's blocks sit is derived, each class filling its own region first:

* P0 occupies ``min(u0, F)`` of the floor and overflows into S, never past the ceiling C.
* Borrowed blocks occupy ``b`` of R; P1 occupies ``min(u1, R - b)`` and overflows into S.
* P2 and P3 (minus their borrowed blocks) live in S.

So ``shared_used = (u0 - F)+ + (u1 - (R - b))+ + u2 + u3 - b`` and an allocation is feasible
when it keeps ``shared_used <= S`` and ``u0 <= C``. No allocation by P1..P3 can ever touch the
floor: the floor is simply not in their headroom.
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
        self.borrowed = 0
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

    def shared_used(self, u: list[int] | None = None, b: int | None = None) -> int:
        u = self.used if u is None else u
        b = self.borrowed if b is None else b
        return max(0, u[0] - self.floor) + max(0, u[1] - (self.reserve - b)) + u[2] + u[3] - b

    def _lendable(self, u: list[int], b: int) -> int:
        """Idle part of the P1 reservation that borrowers may take right now."""
        if self.p1_waiting:
            return 0
        return max(0, self.reserve - b - u[1])

    def headroom(self, priority: Priority, u: list[int] | None = None, b: int | None = None) -> int:
        """How many more blocks `priority` could be charged with, given usage (default: now)."""
        u = self.used if u is None else u
        b = self.borrowed if b is None else b
        shared_free = self.shared - self.shared_used(u, b)
        if priority == Priority.P0:
            return max(0, min(self.ceiling - u[0], max(0, self.floor - u[0]) + shared_free))
        if priority == Priority.P1:
            return max(0, max(0, self.reserve - b - u[1]) + shared_free)
        lend = self._lendable(u, b) if priority in self.borrowers else 0
        return max(0, shared_free + lend)

    def plan(self, priority: Priority, n: int) -> int | None:
        """If `priority` can be charged `n` blocks, return how many of them are borrowed;
        otherwise None."""
        if n <= 0:
            return 0
        if self.headroom(priority) < n:
            return None
        if priority in self.borrowers:
            shared_free = self.shared - self.shared_used()
            return max(0, n - max(0, shared_free))
        return 0

    # -- commits -------------------------------------------------------------------------------
    def charge(self, priority: Priority, n: int, borrowed: int = 0) -> None:
        self.used[priority] += n
        self.borrowed += borrowed

    def release(self, priority: Priority, n: int, borrowed: int = 0) -> None:
        self.used[priority] -= n
        self.borrowed -= borrowed
        if self.used[priority] < 0 or self.borrowed < 0:
            raise AssertionError(f"partition counters went negative releasing {n} of {priority}")

    # -- adaptive floor --------------------------------------------------------------------
    def set_floor(self, target: int) -> int:
        """Move the P0 floor toward `target` within [min, max]; growth is limited to space the
        shared region can give up right now (blocks in use are never taken). Returns the floor."""
        target = min(max(target, self.sizes.p0_floor_min), self.sizes.p0_floor_max)
        if target > self.floor:
            shared_free = self.shared - self.shared_used()
            movable = max(0, self.used[0] - self.floor) + max(0, shared_free)
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
            floor_used=min(u[0], self.floor),
            ceiling=self.ceiling,
            reserve=self.reserve,
            reserve_used=b + min(u[1], self.reserve - b),
            shared=self.shared,
            shared_used=self.shared_used(),
            borrowed=b,
            used_by_class=tuple(u),
        )

    def check_invariants(self, recount_used: list[int], recount_borrowed: int) -> None:
        if recount_used != self.used:
            raise AssertionError(f"partition counters {self.used} != recount {recount_used}")
        if recount_borrowed != self.borrowed:
            raise AssertionError(f"borrowed {self.borrowed} != recount {recount_borrowed}")
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
        if self.borrowed > self.reserve:
            raise AssertionError(f"borrowed {self.borrowed} > reservation {self.reserve}")
        if sum(u[1:]) > self.num_blocks - self.floor:
            raise AssertionError("P1..P3 use blocks of the P0 hard floor")
