"""Priority classes: P0 realtime, P1 online, P2 batch, P3 background.

Lower number = more urgent, as in vLLM's integer ``priority``. The class table (names, TTFT SLAs)
is data in :class:`tierserve.config.PriorityConfig`; this module only names the classes and parses
what clients send.
"""

from __future__ import annotations

from enum import IntEnum


class Priority(IntEnum):
    P0 = 0
    P1 = 1
    P2 = 2
    P3 = 3

    @property
    def tier(self) -> str:
        return TIER_NAMES[self]

    @property
    def label(self) -> str:
        return f"P{int(self)}"


ALL_PRIORITIES: tuple[Priority, ...] = tuple(Priority)
NUM_PRIORITIES = len(ALL_PRIORITIES)
TIER_NAMES = {
    Priority.P0: "realtime",
    Priority.P1: "online",
    Priority.P2: "batch",
    Priority.P3: "background",
}
_BY_NAME = {name: p for p, name in TIER_NAMES.items()} | {p.label.lower(): p for p in Priority}
VALID_TIER_NAMES = tuple(TIER_NAMES.values()) + tuple(p.label.lower() for p in Priority)


def parse_priority(value: object) -> Priority:
    """Parse a tier name (``realtime``..``background``), ``p0``..``p3`` or an integer 0..3.

    Raises ``ValueError`` naming the valid values.
    """
    if isinstance(value, Priority):
        return value
    if isinstance(value, bool):
        raise ValueError(f"invalid priority {value!r}: expected an integer 0..3")
    if isinstance(value, int):
        if 0 <= value < NUM_PRIORITIES:
            return Priority(value)
        raise ValueError(
            f"invalid priority {value}: expected an integer 0..{NUM_PRIORITIES - 1} "
            "(0 = most urgent)"
        )
    if isinstance(value, str):
        key = value.strip().lower()
        if key in _BY_NAME:
            return _BY_NAME[key]
        if key.isdigit():
            return parse_priority(int(key))
        raise ValueError(f"invalid tier {value!r}: expected one of {', '.join(VALID_TIER_NAMES)}")
    raise ValueError(f"invalid priority {value!r}: expected a tier name or an integer 0..3")
