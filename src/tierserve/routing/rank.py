"""The priority-aware routing rule: one pure function from a request and the replicas' stats to
a ranking of the replicas, best first, each with the reason it ranks there.

Every replica gets a *cost* in tokens, lower is better:

* **P0** can start now on a replica when a seat and the blocks for its prompt (after any P0
  already queued there) are free, or can be freed by preempting lower classes, within P0's
  ceiling. Replicas where P0 cannot start now rank after every replica where it can. Its cost
  is what it waits behind or pushes out:

  - the P0 work queued ahead of it (waiting, and prompt tokens running P0 requests still
    prefill);
  - the work it would displace: victims are taken as the scheduler reclaims, lowest class
    first (P3, then P2, then P1), each displaced token weighted by its class
    (``displace_weight``; P3 almost free, P1 full price). A replica full of P3 is nearly free
    for P0; one full of P1 is not;
  - the step in flight: P0 waits for it to end, and a step carrying prefill chunks lasts
    several decode steps. Counted as the lower classes' prompt tokens still to prefill, at
    most one step's token budget (the replica's next step is built for P0).
* **P1..P3**: the work queued at the request's class and above: waiting tokens plus prompt
  tokens running requests still have to prefill, summed over classes ``<= c``. Lower classes'
  work does not count: the replica's policy serves this request before it.
* **Prefix affinity**: replicas whose cost is within ``prefix_margin_tokens`` or
  ``prefix_margin_ratio`` of the best and that hold more of the request's first prompt blocks
  than the best does go first (more matching blocks first), reason ``prefix``. When the best
  already holds the longest prefix, nothing moves.
* **Predicted KV** (when every replica reports its predictor's figures, ``--predictive
  routing``; ``ReplicaStats.predicted_blocks``): a P1..P3 request's cost also counts the KV its
  replica is predicted to run short of: the blocks the requests of its class and above are
  predicted to hold when they end (prompt + P50 output), plus its own prompt's, beyond the
  replica's blocks, in tokens (what would be preempted and computed again). P0's rule is
  unchanged (it preempts lower classes by design).
* **Ties**: the least outstanding tokens in all (with predictions: the tokens predicted still
  to compute, where ``outstanding_tokens`` counts every running request's ``max_tokens``), then
  the replica id, so the ranking does not depend on the order of the stats list.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.routing.types import ReplicaStats, RouteRequest

Choice = tuple[str, str]  # (replica_id, reason)

P0_FREE = "p0-free"  # P0 starts now in free seats and blocks
P0_PREEMPT = "p0-preempt"  # P0 starts now by preempting lower classes
P0_WAIT = "p0-wait"  # P0 cannot start now here
LEAST_QUEUED = "least-queued"  # P1..P3: least work queued at its class and above
PREFIX = "prefix"  # moved ahead for holding the request's first prompt blocks


@dataclass(frozen=True)
class RoutingConfig:
    prefix_margin_tokens: int = 4096
    prefix_margin_ratio: float = 0.25
    # Cost of displacing one token of work of each class (P0 is never displaced for P0).
    displace_weight: tuple[float, ...] = (0.0, 1.0, 0.3, 0.05)

    def __post_init__(self) -> None:
        if self.prefix_margin_tokens < 0 or self.prefix_margin_ratio < 0:
            raise ValueError("prefix margins must not be negative")
        w = self.displace_weight
        if len(w) != NUM_PRIORITIES or any(x < 0 for x in w):
            raise ValueError(f"displace_weight needs {NUM_PRIORITIES} non-negative values: {w}")


DEFAULT_ROUTING = RoutingConfig()


@dataclass(frozen=True)
class _Score:
    can_start: bool
    cost: float
    outstanding: int
    replica_id: str
    reason: str
    match: int

    def key(self) -> tuple:
        return (not self.can_start, self.cost, self.outstanding, self.replica_id)


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def p0_start_cost(req: RouteRequest, s: ReplicaStats, cfg: RoutingConfig) -> tuple[bool, float]:
    """(whether P0 can start now on `s`, tokens of lower-class work it would displace).

    The request needs a seat and blocks for its prompt plus one token, after the P0 requests
    already waiting there. Shortfalls are covered the way the scheduler reclaims: lowest class
    first; a displaced request frees its seat and its share of its class's blocks."""
    bs = s.block_size
    need_blocks = _blocks(req.prompt_tokens + 1, bs) + _blocks(s.waiting_tokens[0], bs)
    if need_blocks > s.p0_room:
        return False, 0.0
    short_blocks = float(max(0, need_blocks - s.headroom[0]))
    short_seats = max(0, 1 + s.waiting[0] - s.free_seats)
    cost = 0.0
    for c in (Priority.P3, Priority.P2, Priority.P1):
        if short_blocks <= 0 and short_seats <= 0:
            break
        held, seats = s.used_blocks[c], s.running[c]
        victims = min(short_seats, seats)
        freed = held * victims / seats if seats else 0.0
        extra = min(max(0.0, short_blocks - freed), held - freed)
        short_seats -= victims
        short_blocks -= freed + extra
        cost += cfg.displace_weight[c] * (freed + extra) * bs
    return short_blocks <= 0 and short_seats <= 0, cost


def queued_at_or_above(s: ReplicaStats, priority: Priority) -> int:
    """Tokens queued in classes `priority` and more urgent: waiting, plus prompt tokens running
    requests have yet to prefill."""
    return sum(s.waiting_tokens[c] + s.prefill_tokens[c] for c in range(priority + 1))


def predicted_shortfall(req: RouteRequest, s: ReplicaStats) -> int:
    """Tokens of KV replica `s` is predicted to run short of if `req` joins it: the predicted
    blocks of its class and above, plus its prompt's, beyond the replica's blocks."""
    if s.predicted_blocks is None:
        return 0
    need = sum(s.predicted_blocks[: req.priority + 1]) + _blocks(
        req.prompt_tokens + 1, s.block_size
    )
    return max(0, need - s.num_blocks) * s.block_size


def _score(req: RouteRequest, s: ReplicaStats, cfg: RoutingConfig, predicted: bool) -> _Score:
    match = s.prefix_match(req)
    total = s.predicted_tokens if predicted else s.outstanding_tokens
    if req.priority == Priority.P0:
        ok, displaced = p0_start_cost(req, s, cfg)
        reason = (P0_FREE if displaced == 0 else P0_PREEMPT) if ok else P0_WAIT
        in_flight = min(sum(s.prefill_tokens[1:]), s.max_step_tokens)
        cost = queued_at_or_above(s, Priority.P0) + displaced + in_flight
        return _Score(ok, cost, total, s.replica_id, reason, match)
    cost = queued_at_or_above(s, req.priority)
    if predicted:
        cost += predicted_shortfall(req, s)
    return _Score(True, cost, total, s.replica_id, LEAST_QUEUED, match)


def rank_replicas(
    request: RouteRequest, stats: Sequence[ReplicaStats], config: RoutingConfig = DEFAULT_ROUTING
) -> list[Choice]:
    """Every replica, best first, with the reason for its place (see the module docstring)."""
    if len({s.replica_id for s in stats}) != len(stats):
        raise ValueError(f"duplicate replica ids in {[s.replica_id for s in stats]}")
    predicted = bool(stats) and all(s.predicted for s in stats)
    scores = sorted((_score(request, s, config, predicted) for s in stats), key=_Score.key)
    if not scores:
        return []
    best = scores[0]
    limit = best.cost + max(config.prefix_margin_tokens, config.prefix_margin_ratio * best.cost)
    near = [
        x
        for x in scores
        if x.match > best.match and x.can_start == best.can_start and x.cost <= limit
    ]
    near.sort(key=lambda x: (-x.match, *x.key()))
    lifted = {x.replica_id for x in near}
    return [(x.replica_id, PREFIX) for x in near] + [
        (x.replica_id, x.reason) for x in scores if x.replica_id not in lifted
    ]
