"""Swap or recompute: the cost model behind the preemption mode.

Swapping a victim moves its KV to host memory and back later: ``2 x bytes / bandwidth``.
Recomputing it re-runs its prefill later: ``tokens / prefill speed``. Swap is chosen when it costs
less than ``swap_cost_ratio`` (default 0.3) of recomputing, since swap also holds host memory and
its transfers share the step. The numbers come from the executor (measured at start-up or
configured), never from constants in the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from tierserve.priority import NUM_PRIORITIES


class PreemptionMode(StrEnum):
    SWAP = "swap"
    RECOMPUTE = "recompute"


@dataclass(frozen=True)
class PreemptionCosts:
    kv_bytes_per_block: float
    swap_bytes_per_s: float  # one direction, host <-> device
    prefill_tokens_per_s: float

    def swap_seconds(self, num_blocks: int) -> float:
        return 2.0 * num_blocks * self.kv_bytes_per_block / self.swap_bytes_per_s

    def recompute_seconds(self, num_tokens: int) -> float:
        return num_tokens / self.prefill_tokens_per_s


def choose_mode(
    policy: str, costs: PreemptionCosts | None, num_blocks: int, num_tokens: int, ratio: float
) -> PreemptionMode:
    """`policy` is the configured preemption_mode: "swap", "recompute" or "auto"."""
    if policy == "swap":
        return PreemptionMode.SWAP
    if policy == "recompute" or costs is None or num_blocks == 0:
        return PreemptionMode.RECOMPUTE
    if costs.swap_seconds(num_blocks) < ratio * costs.recompute_seconds(num_tokens):
        return PreemptionMode.SWAP
    return PreemptionMode.RECOMPUTE


@dataclass
class PreemptionCounts:
    """Preemptions since the start, kept by the scheduler for stats."""

    swap: int = 0
    recompute: int = 0
    swapped_out_blocks: int = 0
    swapped_in_blocks: int = 0
    by_victim_class: list[int] = field(default_factory=lambda: [0] * NUM_PRIORITIES)
    # by_cause[a][v]: victims of class v preempted to make room for a request of class a (a
    # growing running request, or one being admitted: `for_admission` counts those); a request
    # that could not grow and was preempted itself counts as a == v, and in `self_preempted`
    by_cause: list[list[int]] = field(
        default_factory=lambda: [[0] * NUM_PRIORITIES for _ in range(NUM_PRIORITIES)]
    )
    for_admission: int = 0
    self_preempted: int = 0
    victims: int = 0  # distinct requests preempted at least once

    def causes(self) -> dict[str, int]:
        """``{"P1>P2": n, ...}``: preemptions by (class that needed room, victim class)."""
        return {
            f"P{a}>P{v}": n for a, row in enumerate(self.by_cause) for v, n in enumerate(row) if n
        }
