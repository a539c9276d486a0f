"""Plain data the router works on: what a replica reports (``ReplicaStats``) and what it knows
about a request before choosing (``RouteRequest``). Both are frozen, torch-free and convert to
and from JSON-able dicts, so a replica can report its stats through Ray Serve's
``record_routing_stats`` and the simulator can compute the same thing from an ``EngineCore``.

Prefix hashes are the KV cache's own chained, tenant-salted block hashes (core/kv/hashing.py),
cut to their first 8 bytes as an int: a request's first prompt blocks hash the same on the
router as in the replica's prefix cache, and two tenants' identical prompts never match.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from tierserve.core.kv.hashing import extend_block_hashes
from tierserve.core.stats import PREFIX_BLOCKS  # leading blocks a request and a replica compare
from tierserve.priority import NUM_PRIORITIES, Priority, parse_priority


def hash_key(block_hash: bytes) -> int:
    """A block hash as a JSON-able int (its first 8 bytes)."""
    return int.from_bytes(block_hash[:8], "big")


def prefix_hashes(
    token_ids: Sequence[int], block_size: int, salt: str | None, blocks: int = PREFIX_BLOCKS
) -> tuple[int, ...]:
    """Hash keys of the first `blocks` full blocks of a prompt, chained and salted exactly as the
    KV cache hashes them."""
    head = list(token_ids[: blocks * block_size])
    return tuple(hash_key(h) for h in extend_block_hashes([], head, block_size, salt))


@dataclass(frozen=True)
class RouteRequest:
    """What the router knows about a request: its class, its prompt length and the hash keys of
    its first prompt blocks (see ``prefix_hashes``)."""

    priority: Priority
    prompt_tokens: int
    prefix_hashes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "priority", parse_priority(self.priority))
        if not isinstance(self.prompt_tokens, int) or self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be a positive integer, got {self.prompt_tokens}")

    @classmethod
    def of(
        cls,
        token_ids: Sequence[int],
        priority: Priority,
        block_size: int,
        salt: str | None = None,
    ) -> RouteRequest:
        return cls(priority, len(token_ids), prefix_hashes(token_ids, block_size, salt))


_PER_CLASS = ("headroom", "used_blocks", "waiting", "waiting_tokens", "prefill_tokens", "running")


@dataclass(frozen=True)
class ReplicaStats:
    """One replica's load as the router sees it. Per-class tuples are indexed by class (P0..P3).

    Blocks are KV cache blocks of ``block_size`` tokens. ``headroom[c]`` is what class ``c`` could
    be charged now without preempting anyone (``KVCacheManager.headroom``); ``used_blocks[c]`` is
    what class ``c`` holds, which a more urgent class may reclaim by preemption, up to its own
    limit (``p0_room`` for P0: its ceiling minus what it holds).
    """

    replica_id: str
    block_size: int
    num_blocks: int
    free_blocks: int  # device blocks held by no request (cached-but-free ones count as free)
    partition_free: tuple[int, int, int]  # unused blocks in (P0 floor, P1 reserve, shared)
    headroom: tuple[int, ...]
    used_blocks: tuple[int, ...]
    p0_room: int
    waiting: tuple[int, ...]  # requests queued, by submitted class
    waiting_tokens: tuple[int, ...]  # their tokens (to prefill again, for preempted ones)
    prefill_tokens: tuple[int, ...]  # prompt tokens running requests have yet to compute
    running: tuple[int, ...]  # requests holding a seat, by current class
    max_seats: int  # max_num_seqs
    max_step_tokens: int  # max_num_batched_tokens: the most a step computes
    outstanding_tokens: int  # waiting tokens + what running/swapped requests still compute
    prefix_hashes: frozenset[int] = frozenset()  # hash keys of cached leading prompt blocks
    time: float = 0.0  # the replica's clock when measured
    # From the replica's length predictor (``--predictive routing``; None: not reported): per
    # class, the KV blocks its running, swapped and waiting requests are predicted to hold when
    # they end (prompt + P50 output), and the tokens all of them are predicted to still compute.
    predicted_blocks: tuple[int, ...] | None = None
    predicted_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in _PER_CLASS:
            v = tuple(getattr(self, name))
            if len(v) != NUM_PRIORITIES or any(not isinstance(x, int) or x < 0 for x in v):
                raise ValueError(
                    f"replica {self.replica_id!r}: {name} must be {NUM_PRIORITIES} non-negative "
                    f"integers (P0..P3), got {getattr(self, name)!r}"
                )
            object.__setattr__(self, name, v)
        if len(self.partition_free) != 3:
            raise ValueError(f"replica {self.replica_id!r}: partition_free needs 3 values")
        object.__setattr__(self, "partition_free", tuple(self.partition_free))
        object.__setattr__(self, "prefix_hashes", frozenset(self.prefix_hashes))
        self._check_predicted()
        if min(self.block_size, self.max_seats, self.max_step_tokens) < 1:
            raise ValueError(
                f"replica {self.replica_id!r}: block_size, max_seats and max_step_tokens must be "
                ">= 1"
            )

    def _check_predicted(self) -> None:
        pb, pt = self.predicted_blocks, self.predicted_tokens
        if (pb is None) != (pt is None):
            raise ValueError(
                f"replica {self.replica_id!r}: predicted_blocks and predicted_tokens come together"
            )
        if pb is None:
            return
        pb = tuple(pb)
        if len(pb) != NUM_PRIORITIES or any(not isinstance(x, int) or x < 0 for x in pb):
            raise ValueError(
                f"replica {self.replica_id!r}: predicted_blocks must be {NUM_PRIORITIES} "
                f"non-negative integers (P0..P3), got {self.predicted_blocks!r}"
            )
        if not isinstance(pt, int) or pt < 0:
            raise ValueError(
                f"replica {self.replica_id!r}: predicted_tokens must be a non-negative integer, "
                f"got {pt!r}"
            )
        object.__setattr__(self, "predicted_blocks", pb)

    @property
    def predicted(self) -> bool:
        """Whether the replica reports what its predictor expects."""
        return self.predicted_blocks is not None

    @property
    def free_seats(self) -> int:
        return max(0, self.max_seats - sum(self.running))

    def prefix_match(self, request: RouteRequest) -> int:
        """How many of the request's leading prompt blocks this replica holds (chained: a later
        block counts only if every earlier one does)."""
        n = 0
        for h in request.prefix_hashes:
            if h not in self.prefix_hashes:
                break
            n += 1
        return n

    # -- JSON-able form ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        d["prefix_hashes"] = sorted(self.prefix_hashes)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReplicaStats:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"replica stats: unknown field(s) {', '.join(unknown)}")
        optional = ("prefix_hashes", "time", "predicted_blocks", "predicted_tokens")
        required = {f.name for f in fields(cls) if f.name not in optional}
        missing = sorted(required - set(d))
        if missing:
            raise ValueError(f"replica stats: missing field(s) {', '.join(missing)}")
        kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        if "prefix_hashes" in kw:
            kw["prefix_hashes"] = frozenset(kw["prefix_hashes"])
        return cls(**kw)
