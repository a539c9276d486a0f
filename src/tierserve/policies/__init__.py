"""Scheduling policies, found by name: fcfs, strict, drr, wfq, hybrid (the default)."""

from tierserve.config import PolicyConfig, PriorityConfig
from tierserve.policies import drr, fcfs, strict, wfq  # noqa: F401  (registers the policies)
from tierserve.policies.base import Policy, SchedulerState, VictimCandidate
from tierserve.policies.registry import POLICIES, PolicyRegistry, register_policy


def create_policy(config: PolicyConfig, priorities: PriorityConfig | None = None) -> Policy:
    return POLICIES.create(config, priorities)


__all__ = [
    "POLICIES",
    "Policy",
    "PolicyRegistry",
    "SchedulerState",
    "VictimCandidate",
    "create_policy",
    "register_policy",
]
