"""The fleet board: what every engine replica last reported, for the ingress.

Replicas push a small load record (from the snapshot their engine thread published) a few
times a second, and their Prometheus text about once a second. The ingress pulls one
``FleetView`` from the board a few times a second and reads only that: admission control's
cluster-wide queue view and ``/metrics`` both come from it.

The ingress pushes its held backlog (``--ingress-queue on``: requests bound to no replica yet);
the board hands the fleet's back to every replica with its report's reply, for the replica's
autoscaling metrics (signals.py).

A replica that stops reporting for ``expire_s`` (killed, crashed, scaled in) drops out of the
view; the requests it had served stay counted (``retired``), so the cluster's cumulative served
counts never go back -- admission's drain-rate meters need them monotonic. Serve gives a
restarted replica a new id, so it starts a new entry at zero.

Plain Python (no Ray): ``cluster/board.py`` wraps it in a Serve deployment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tierserve.admission.ttft import Load
from tierserve.cluster.signals import merge_held
from tierserve.engine.snapshot import EngineSnapshot
from tierserve.priority import NUM_PRIORITIES

EXPIRE_S = 3.0

_Z = (0,) * NUM_PRIORITIES


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica's queue state as the ingress needs it (per-class tuples, P0..P3)."""

    running: tuple[int, ...] = _Z
    waiting: tuple[int, ...] = _Z
    waiting_tokens: tuple[int, ...] = _Z
    served: tuple[int, ...] = _Z  # requests that left the queue for the batch, since start
    served_tokens: tuple[int, ...] = _Z
    max_num_seqs: int = 0
    # The TTFT predictor's inputs (engine/load.py), for the ingress's fleet SLA admission;
    # None unless the replica publishes them (--sla-admission on). Travels pickled, as is.
    ttft: Load | None = None
    # What its next step could still take in (routing/late_binding.py's StepLoad: the ingress
    # queue sends held P2/P3 by it): the step's token budget, prompt tokens its running
    # requests still prefill, KV blocks each class could be charged now, the block size.
    max_step_tokens: int = 0
    prefill_tokens: tuple[int, ...] = _Z
    headroom: tuple[int, ...] = _Z
    block_size: int = 1

    @classmethod
    def of(cls, snap: EngineSnapshot, with_ttft: bool = False) -> ReplicaLoad:
        s = snap.scheduler
        return cls(
            running=snap.running,
            waiting=snap.waiting,
            waiting_tokens=snap.waiting_tokens,
            served=tuple(r for r, _ in snap.served),
            served_tokens=tuple(t for _, t in snap.served),
            max_num_seqs=snap.max_num_seqs,
            ttft=snap.load if with_ttft else None,
            max_step_tokens=s.max_num_batched_tokens,
            prefill_tokens=s.prefill_now,
            headroom=s.headroom,
            block_size=s.block_size,
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ReplicaLoad:
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def _add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(x + y for x, y in zip(a, b, strict=True))


@dataclass
class _Entry:
    load: ReplicaLoad
    seen: float
    metrics: str = ""
    signals: dict[str, float] = field(default_factory=dict)


class FleetBoard:
    """The board's state (one owner: the board deployment's event loop)."""

    def __init__(self, expire_s: float = EXPIRE_S) -> None:
        self.expire_s = expire_s
        self._entries: dict[str, _Entry] = {}
        self._retired = (_Z, _Z)  # served requests and tokens of replicas gone
        self._held: dict[str, tuple[dict[str, float], float]] = {}  # ingress -> (held, seen)

    def report(
        self,
        replica_id: str,
        load: dict[str, Any],
        metrics: str | None,
        now: float,
        signals: dict[str, float] | None = None,
    ) -> None:
        """`signals`: the replica's autoscaling metrics (signals.py), as Serve's autoscaler
        polls them; kept for the view (operators, tests)."""
        e = self._entries.get(replica_id)
        text = metrics if metrics is not None else (e.metrics if e else "")
        self._entries[replica_id] = _Entry(ReplicaLoad.from_dict(load), now, text, signals or {})

    def report_held(self, ingress_id: str, held: dict[str, float], now: float) -> None:
        """An ingress replica's held backlog (signals.py ``held_metrics``)."""
        self._held[ingress_id] = (dict(held), now)

    def held(self, now: float) -> dict[str, float]:
        """The fleet's held backlog: the live ingress replicas' reports merged (one silent for
        ``expire_s`` is gone); every class at zero with none. The engine replicas get it back
        with each report and export it for the autoscaler."""
        for iid in [i for i, (_, seen) in self._held.items() if now - seen > self.expire_s]:
            del self._held[iid]
        return merge_held(h for h, _ in self._held.values())

    def leave(self, replica_id: str) -> None:
        """A replica shutting down (or found dead) leaves; its served counts are kept."""
        e = self._entries.pop(replica_id, None)
        if e is not None:
            reqs, toks = self._retired
            self._retired = (_add(reqs, e.load.served), _add(toks, e.load.served_tokens))

    def view(self, now: float) -> dict[str, Any]:
        for rid in [r for r, e in self._entries.items() if now - e.seen > self.expire_s]:
            self.leave(rid)
        return {
            "replicas": {
                rid: {
                    "load": e.load.to_dict(),
                    "age": now - e.seen,
                    "metrics": e.metrics,
                    "signals": e.signals,
                }
                for rid, e in sorted(self._entries.items())
            },
            "retired": [list(self._retired[0]), list(self._retired[1])],
            "held": self.held(now),
        }


@dataclass(frozen=True)
class FleetView:
    """The cluster as the ingress sees it: sums over live replicas (immutable)."""

    loads: dict[str, ReplicaLoad] = field(default_factory=dict)
    metrics: dict[str, str] = field(default_factory=dict)
    retired: tuple[tuple[int, ...], tuple[int, ...]] = (_Z, _Z)
    # When each replica's load was reported, on the reader's monotonic clock (-inf: unknown).
    reported_at: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any], now: float | None = None) -> FleetView:
        """The board's view read at `now` (the reader's monotonic clock): a report `age`
        seconds old was made at about ``now - age`` (a little earlier: the view travelled)."""
        reps = d.get("replicas", {})
        retired = d.get("retired") or [_Z, _Z]
        at = -float("inf") if now is None else now
        return cls(
            loads={rid: ReplicaLoad.from_dict(r["load"]) for rid, r in reps.items()},
            metrics={rid: r.get("metrics", "") for rid, r in reps.items()},
            retired=(tuple(retired[0]), tuple(retired[1])),
            reported_at={rid: at - r.get("age", 0.0) for rid, r in reps.items()},
        )

    def _sum(self, name: str) -> tuple[int, ...]:
        total = _Z
        for load in self.loads.values():
            total = _add(total, getattr(load, name))
        return total

    @property
    def num_replicas(self) -> int:
        return len(self.loads)

    @property
    def running(self) -> tuple[int, ...]:
        return self._sum("running")

    @property
    def waiting(self) -> tuple[int, ...]:
        return self._sum("waiting")

    @property
    def waiting_tokens(self) -> tuple[int, ...]:
        return self._sum("waiting_tokens")

    @property
    def seats(self) -> int:
        return sum(x.max_num_seqs for x in self.loads.values())

    def served(self, priority: int) -> tuple[int, int]:
        """Cumulative (requests, prompt tokens) of `priority` that left a queue for a batch,
        over every replica that ever reported (monotonic)."""
        reqs = self.retired[0][priority] + self._sum("served")[priority]
        toks = self.retired[1][priority] + self._sum("served_tokens")[priority]
        return reqs, toks
