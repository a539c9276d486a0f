"""What travels between the ingress and an engine replica: plain, picklable dicts.

A request goes out as a *payload* (``request_payload``): the frozen ``EngineRequest``'s fields,
its deadline relative to its arrival and the time it has already waited (clocks differ between
processes: the replica rebases both on its own, so time spent at the ingress -- held by the
ingress queue, or on a first try at a replica that died -- still counts against its SLA and in
its class's wait signals), and a ``route`` dict that
the request router reads: the ``RouteRequest`` computed at the ingress, replicas to avoid (a
retry after a replica died), an optional pin, and -- written by the router itself -- the
ranking it chose from, so the replica can report why it was picked.

A response comes back as *chunks*: first one ``hello`` naming the replica and the reason it was
chosen, then one ``delta`` per ``StreamDelta``, the last one finished.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tierserve.engine.events import ErrorKind, StreamDelta
from tierserve.grammar import GrammarSpec
from tierserve.priority import Priority
from tierserve.request import EngineRequest
from tierserve.routing import RouteRequest
from tierserve.sampling_params import SamplingParams

HELLO = "hello"
DELTA = "delta"
PINNED = "pinned"  # reason: the request named its replica
UNRANKED = "unranked"  # reason: the replica was not in the router's ranking (no stats yet)


_CONVERTED = ("sampling_params", "arrival_time", "deadline")  # not sent as they are


def request_payload(
    req: EngineRequest,
    route: RouteRequest,
    avoid: tuple[str, ...] = (),
    pin: str | None = None,
    now: float | None = None,
    prefer: tuple[str, ...] = (),
) -> dict[str, Any]:
    """`req` as plain data: every field, except that the sampling parameters go as their
    constructor arguments, the deadline relative to the arrival, and the arrival as the time
    waited by `now` (the sender's clock, the one of `req.arrival_time`; None: not waited)."""
    out: dict[str, Any] = {
        f.name: getattr(req, f.name) for f in dataclasses.fields(req) if f.name not in _CONVERTED
    }
    return out | {
        "prompt_token_ids": list(req.prompt_token_ids),
        "priority": int(req.priority),
        "sampling": sampling_payload(req.sampling_params),
        "deadline_in_s": None if req.deadline is None else req.deadline - req.arrival_time,
        "waited_s": 0.0 if now is None else max(0.0, now - req.arrival_time),
        "route": {
            "priority": int(route.priority),
            "prompt_tokens": route.prompt_tokens,
            "prefix_hashes": list(route.prefix_hashes),
            "avoid": list(avoid),
            "pin": pin,
            "prefer": list(prefer),
        },
    }


def sampling_payload(sp: SamplingParams) -> dict[str, Any]:
    """`sp`'s constructor arguments as plain data (derived fields are recomputed on arrival)."""
    out = {f.name: getattr(sp, f.name) for f in dataclasses.fields(sp) if f.init}
    if sp.grammar is not None:
        out["grammar"] = dataclasses.asdict(sp.grammar)
    return out


def sampling_from_payload(d: dict[str, Any]) -> SamplingParams:
    sp = dict(d)
    for key in ("stop", "stop_token_ids"):
        sp[key] = tuple(sp[key])
    sp["logit_bias"] = tuple((int(t), float(b)) for t, b in sp.get("logit_bias") or ())
    if sp.get("grammar") is not None:
        sp["grammar"] = GrammarSpec(**sp["grammar"])
    return SamplingParams(**sp)


def request_from_payload(p: dict[str, Any], now: float) -> EngineRequest:
    """The EngineRequest on the replica, whose clock reads `now`: it arrived as long before as
    it had waited when it was sent."""
    deadline = p["deadline_in_s"]
    arrival = now - float(p.get("waited_s") or 0.0)
    kw = {f.name: p[f.name] for f in dataclasses.fields(EngineRequest) if f.name not in _CONVERTED}
    return EngineRequest(
        **kw,
        sampling_params=sampling_from_payload(p["sampling"]),
        arrival_time=arrival,
        deadline=None if deadline is None else arrival + deadline,
    )


def route_of(p: dict[str, Any]) -> tuple[RouteRequest, frozenset[str], str | None]:
    """(the RouteRequest, replica ids to avoid, pinned replica id) of a payload."""
    r = p["route"]
    req = RouteRequest(Priority(r["priority"]), r["prompt_tokens"], tuple(r["prefix_hashes"]))
    return req, frozenset(r.get("avoid") or ()), r.get("pin")


def prefer_of(p: dict[str, Any]) -> tuple[str, ...]:
    """The replicas the ingress saw room in when it released the request (late binding)."""
    return tuple(p["route"].get("prefer") or ())


def annotate(p: dict[str, Any], ranking: list[tuple[str, str]]) -> None:
    """The router records its ranking (replica id, reason), best first, in the payload."""
    p["route"]["ranking"] = [list(x) for x in ranking]


def chosen_reason(p: dict[str, Any], replica_id: str) -> tuple[str, int]:
    """(reason, rank) for the replica that received the payload: the reason the router gave
    it and its place in the ranking (0 = the router's first choice; a later place means Ray
    Serve passed over better-ranked replicas, e.g. at their max_ongoing_requests)."""
    for i, (rid, reason) in enumerate(p["route"].get("ranking") or ()):
        if rid == replica_id:
            return reason, i
    return UNRANKED, -1


def hello(replica_id: str, reason: str, rank: int) -> dict[str, Any]:
    return {"kind": HELLO, "replica": replica_id, "reason": reason, "rank": rank}


def delta_chunk(d: StreamDelta) -> dict[str, Any]:
    return {"kind": DELTA, **dataclasses.asdict(d)}


def chunk_delta(c: dict[str, Any]) -> StreamDelta:
    fields = {k: v for k, v in c.items() if k != "kind"}
    if fields.get("error_kind") is not None:
        fields["error_kind"] = ErrorKind(fields["error_kind"])
    return StreamDelta(**fields)
