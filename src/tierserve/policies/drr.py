"""Deficit round robin over the classes, counted in tokens.

Each visit to a backlogged class adds ``weight x quantum`` tokens to its deficit; the class serves
its head while the head's cost (prompt + expected output tokens) fits in the deficit, then the
pointer moves on. A class whose queue empties loses its deficit. A long request therefore costs
more rounds than a short one, and under a permanent backlog each class gets a token share
proportional to its weight.

When a whole round passes with nobody served (all heads cost more than their deficits), the
rounds that would pass idle are added at once, so ``pop_next`` stays O(classes) however small the
quantum is relative to request costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tierserve.config import PolicyConfig
from tierserve.policies.base import ClassedPolicy, SchedulerState
from tierserve.policies.order import ServiceOrder
from tierserve.policies.registry import register_policy
from tierserve.policies.traits import Pick, PolicySettings
from tierserve.priority import NUM_PRIORITIES


@dataclass(frozen=True)
class DRRConfig(PolicySettings):
    weights: tuple[float, ...]  # per class
    quantum_tokens: int  # per unit of weight: a class gets weight x quantum per round

    @classmethod
    def of(cls, config: PolicyConfig) -> DRRConfig:
        return cls(config.max_expected_output_tokens, config.drr_weights, config.drr_quantum_tokens)


@dataclass(frozen=True)
class DRRPick(Pick):
    deficit: tuple[float, ...]  # every class's deficit once this pick is served
    ptr: int


@register_policy("drr")
class DRRPolicy(ClassedPolicy):
    config_class = DRRConfig

    def __init__(self, config: DRRConfig, priorities=None) -> None:
        super().__init__(config, priorities)
        self.quantum = [w * config.quantum_tokens for w in config.weights]
        self.deficit = [0.0] * NUM_PRIORITIES
        self._ptr = 0
        self._fresh = True  # the class under the pointer has not had its quantum this visit

    def _head_cost(self, c: int) -> float:
        req = self.queues[c].peek()
        return 0 if req.request_id in self._charged else self.cost(req)

    def _choose(self, state: SchedulerState) -> DRRPick | None:
        if not any(len(q) for q in self.queues):
            return None
        d = list(self.deficit)
        ptr, fresh = self._ptr, self._fresh
        visits = 0
        while True:
            c = ptr
            if len(self.queues[c]) == 0:
                d[c] = 0.0
            else:
                if fresh:
                    d[c] += self.quantum[c]
                    fresh = False
                if self._head_cost(c) <= d[c]:
                    return DRRPick(c, tuple(d), ptr)
            ptr, fresh = (c + 1) % NUM_PRIORITIES, True
            visits += 1
            if visits % NUM_PRIORITIES == 0:
                # A full round served nobody: skip the idle rounds in one go.
                active = [k for k in range(NUM_PRIORITIES) if len(self.queues[k])]
                rounds = min(
                    math.ceil((self._head_cost(k) - d[k]) / self.quantum[k]) for k in active
                )
                if rounds > 1:
                    for k in active:
                        d[k] += (rounds - 1) * self.quantum[k]

    def service_order(self, weights=None) -> ServiceOrder:
        return super().service_order(tuple(self.config.weights))

    def _commit(self, pick: DRRPick, request, cost: int) -> None:
        c, d = pick.priority, list(pick.deficit)
        d[c] -= cost
        if len(self.queues[c]) == 0:
            d[c] = 0.0
        self.deficit = d
        self._ptr, self._fresh = pick.ptr, False
