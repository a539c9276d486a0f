"""Reclaim order: whom to preempt when a class needs blocks. Pure functions over the ledger and
the holders' block tables; nothing is touched (the scheduler decides what to do).

Order: lowest class first; inside a class, holders of borrowed blocks (blocks lent from the P1
reservation) first; then the cheapest to lose (fewest tokens to recompute or swap). A holder's
usefulness is measured, not guessed: the headroom the asking class would gain if that holder's
exclusively held blocks were freed (shared prefix blocks free nothing; blocks in a region the
asking class cannot use gain it nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tierserve.core.kv.partitions import PartitionLedger
from tierserve.priority import NUM_PRIORITIES, Priority

if TYPE_CHECKING:
    from tierserve.core.kv.manager import _Held


@dataclass(frozen=True)
class Victim:
    """A request holding device blocks, as seen by reclaim ordering."""

    request_id: str
    priority: Priority
    num_blocks: int
    num_tokens: int
    exclusive_blocks: int  # freed if this request alone lets go
    borrowed_blocks: int
    borrowed_by_class: tuple[int, ...]
    useful_blocks: int  # headroom the asking class gains if this request alone lets go
    exclusive_by_class: tuple[int, ...]


def _minus(a: list[int], b: tuple[int, ...] | list[int]) -> list[int]:
    return [x - y for x, y in zip(a, b, strict=True)]


def reclaim_order(
    ledger: PartitionLedger, held: dict[str, _Held], for_priority: Priority, ids: list[str]
) -> list[Victim]:
    base = ledger.headroom(for_priority)
    out = []
    for rid in ids:
        h = held.get(rid)
        if h is None:
            continue
        by_class = [0] * NUM_PRIORITIES
        b_by_class = [0] * NUM_PRIORITIES
        for blk in h.blocks:
            if blk.ref_cnt == 1:
                by_class[blk.charge] += 1
                b_by_class[blk.charge] += blk.borrowed
        gain = (
            ledger.headroom(
                for_priority, _minus(ledger.used, by_class), _minus(ledger.borrowed_by, b_by_class)
            )
            - base
        )
        out.append(
            Victim(
                rid,
                h.priority,
                len(h.blocks),
                h.num_tokens,
                sum(by_class),
                sum(b_by_class),
                tuple(b_by_class),
                gain,
                tuple(by_class),
            )
        )
    out.sort(key=lambda v: (-v.priority, v.borrowed_blocks == 0, v.num_tokens))
    return out


def reclaim_for(
    ledger: PartitionLedger, order: list[Victim], priority: Priority, num_blocks: int
) -> list[str]:
    """The shortest prefix of helpful, strictly lower-class victims in `order` after which
    `priority` could be charged `num_blocks`; empty if even all of them would not do."""
    u, b = list(ledger.used), list(ledger.borrowed_by)
    h = ledger.headroom(priority)
    chosen = []
    for v in order:
        if v.priority <= priority:
            continue
        u2, b2 = _minus(u, v.exclusive_by_class), _minus(b, v.borrowed_by_class)
        h2 = ledger.headroom(priority, u2, b2)
        if h2 > h:
            chosen.append(v.request_id)
            u, b, h = u2, b2, h2
            if h >= num_blocks:
                return chosen
    return []
