"""The executor interface the engine drives."""

from __future__ import annotations

from typing import Protocol

from tierserve.core.outputs import ExecutorOutput, SchedulerOutput
from tierserve.core.preemption import PreemptionCosts


class ExecutorLost(RuntimeError):
    """The executor can run no further step (a tensor-parallel worker died or hung): the engine
    stops, failing every request, instead of failing one step's and going on."""


class Executor(Protocol):
    def execute(self, output: SchedulerOutput) -> ExecutorOutput:
        """Apply swaps, run one forward pass, sample. May raise: the engine then
        fails the step's requests and keeps serving."""

    def preemption_costs(self) -> PreemptionCosts | None:
        """Swap bandwidth, KV bytes per block and prefill speed, for swap-vs-recompute."""
