"""Plain data between a policy and the scheduler: the traits a policy declares, the class it
picks, and the settings every policy has.

``PolicyTraits`` is every class rule the scheduler and the engine builder apply, frozen when the
policy is built (``Policy.traits``): the scheduler consults it, never the policy's class or its
attributes, so no class rule lives outside the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tierserve.config import PolicyConfig
from tierserve.policies.order import ServiceOrder
from tierserve.priority import Priority

if TYPE_CHECKING:
    from tierserve.config import SchedulerConfig
    from tierserve.request import Request


def arrival_key(request: Request) -> tuple[float, int]:
    return (request.arrival_time, request.arrival_seq)


@dataclass(frozen=True)
class PolicyTraits:
    """* ``class_aware``: classes are treated differently at all. When False (fcfs), the
      scheduler ranks running requests by arrival only, exempts no class from the long-prefill
      cap, signals no P1 demand to the KV ledger, lets swapped requests back regardless of the
      classes waiting, and the engine builds a flat KV pool (no P0 floor, no P1 reservation).
    * ``p0_strict``: a waiting P0 request is always served first (and gets express steps).
    * ``strict_before[c]``: classes whose waiting tokens a prefill chunk of class ``c`` leaves
      step budget for.
    * ``cap_exempt``: classes whose long prompts may take a whole step's budget.
    * ``tenant_fair``: tenants share each class equally (virtual token counters).
    * ``service_order``: how waiting work is ordered across classes, for the TTFT predictor
      (policies/order.py); ``tests/test_policy_order.py`` checks the choices agree with it.
    """

    class_aware: bool
    p0_strict: bool
    strict_before: tuple[tuple[Priority, ...], ...]
    cap_exempt: frozenset[Priority]
    tenant_fair: bool
    service_order: ServiceOrder

    def rank(self, request: Request) -> tuple:
        """Order of running and swapped requests (who grows first, who comes back first)."""
        if self.class_aware:
            return (request.priority, *arrival_key(request))
        return arrival_key(request)

    def prefill_cap_exempt(self, request: Request) -> bool:
        return request.priority in self.cap_exempt

    def long_prefill_cap(self, request: Request, config: SchedulerConfig) -> int | None:
        """The most prompt tokens `request` computes in one step by the long-prefill rule: a
        prompt over ``long_prefill_threshold`` tokens, of a class not exempt, goes by chunks of
        ``long_prefill_max_tokens``. None: no such cap."""
        if request.num_prompt_tokens > config.long_prefill_threshold and not (
            self.prefill_cap_exempt(request)
        ):
            return config.long_prefill_max_tokens
        return None


@dataclass(frozen=True)
class Pick:
    """The class a ``ClassedPolicy`` serves next; subclasses add what their ``_commit`` needs."""

    priority: int


@dataclass(frozen=True)
class PolicySettings:
    """What every policy is configured with; each policy's config class adds its own."""

    # Output tokens counted in a request's cost when its max_tokens is larger than this.
    max_expected_output_tokens: int

    @classmethod
    def of(cls, config: PolicyConfig) -> PolicySettings:
        """This policy's settings, taken from the flat (validated) ``PolicyConfig``."""
        return cls(config.max_expected_output_tokens)
