"""Strict priority: always the most urgent non-empty class; arrival order inside a class."""

from __future__ import annotations

from dataclasses import dataclass

from tierserve.policies.base import ClassedPolicy, SchedulerState
from tierserve.policies.registry import register_policy
from tierserve.policies.traits import Pick, PolicySettings
from tierserve.priority import Priority


@dataclass(frozen=True)
class StrictConfig(PolicySettings):
    pass


@register_policy("strict")
class StrictPolicy(ClassedPolicy):
    config_class = StrictConfig
    p0_strict = True

    def strict_before(self, priority: Priority) -> tuple[Priority, ...]:
        return tuple(Priority(c) for c in range(int(priority)))

    def _choose(self, state: SchedulerState) -> Pick | None:
        for c, q in enumerate(self.queues):
            if len(q):
                return Pick(c)
        return None
