"""ServiceOrder: how a policy orders waiting work across classes, as plain data.

The TTFT predictor (admission/ttft.py) needs to know whose waiting work is served before a new
request of class ``c``; the policy declares it (``Policy.service_order()``) instead of the
predictor asking which policy runs. Three relations, per class:

* ``before[c]``: classes whose waiting work (and future arrivals) is served before class ``c``'s;
* ``weights[c]``: weight with which class ``c`` shares capacity with every other class it is
  not ordered against (0: it does not share); while both are backlogged, class ``k`` receives
  ``weights[k] / weights[c]`` times the service of ``c`` (GPS);
* ``yields_to[k]``: classes for whose waiting tokens a running prefill chunk of class ``k``
  leaves step budget (``Policy.strict_before``); a running prefill of ``k`` delays a waiting
  request of ``c`` unless ``c`` is in ``yields_to[k]``.

With ``tenant_fair``, the tenants inside a class share its service equally (virtual token
counters, policies/queues.py): a request's tenant backlog, not the whole class queue, is what
stands before it, plus each other tenant's backlog up to the same amount.

A class-blind policy (``class_aware = False``) serves one queue in arrival order: everything
waiting is ahead of a new request.
"""

from __future__ import annotations

from dataclasses import dataclass

from tierserve.priority import NUM_PRIORITIES

_NONE = ((),) * NUM_PRIORITIES


@dataclass(frozen=True)
class ServiceOrder:
    class_aware: bool = True
    before: tuple[tuple[int, ...], ...] = _NONE
    weights: tuple[float, ...] = (0.0,) * NUM_PRIORITIES
    yields_to: tuple[tuple[int, ...], ...] = _NONE
    tenant_fair: bool = False

    def __post_init__(self) -> None:
        for name in ("before", "weights", "yields_to"):
            if len(getattr(self, name)) != NUM_PRIORITIES:
                raise ValueError(f"ServiceOrder.{name} needs one entry per class")
        for c, ahead in enumerate(self.before):
            if c in ahead:
                raise ValueError(f"ServiceOrder: class {c} cannot be served before itself")

    def shares_with(self, c: int, k: int) -> bool:
        """Whether classes `c` and `k` split capacity by weight while both are backlogged."""
        return (
            k != c
            and self.weights[c] > 0
            and self.weights[k] > 0
            and k not in self.before[c]
            and c not in self.before[k]
        )


FLAT_ORDER = ServiceOrder(class_aware=False)


STRICT_BY_CLASS = tuple(tuple(range(c)) for c in range(NUM_PRIORITIES))
