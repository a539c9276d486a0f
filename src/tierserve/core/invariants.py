"""Scheduler invariants, checked every step in tests (and on demand in production):
budget respected, seats respected, every scheduled token has a slot, every request in exactly one
queue with a matching status and KV state, and the KV manager's own invariants."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tierserve.request import RequestStatus as S

if TYPE_CHECKING:
    from tierserve.core.outputs import SchedulerOutput
    from tierserve.core.scheduler import Scheduler


def _fail(msg: str) -> None:
    raise AssertionError(msg)


def check_scheduler(s: Scheduler, out: SchedulerOutput | None = None) -> None:
    cfg, kv = s.config, s.kv
    running, swapped = set(s.running), set(s.swapped)
    waiting_reqs = s.policy.requests()
    waiting = {r.request_id for r in waiting_reqs}
    if len(waiting) != len(waiting_reqs) or len(waiting) != len(s.policy):
        _fail("a request is queued twice in the policy")
    if running & swapped or running & waiting or swapped & waiting:
        _fail("a request is in two queues")
    if running | swapped | waiting != set(s.requests):
        _fail("a request is lost or a finished one lingers in a queue")
    owed = len(s.seats_owed)  # seats a cut-in took, repaid at the next step's start
    if len(running) > cfg.max_num_seqs + owed:
        _fail(f"{len(running)} running > max_num_seqs {cfg.max_num_seqs} (+{owed} owed)")
    for rid in running:
        r = s.requests[rid]
        if r.status != S.RUNNING or not kv.holds(rid):
            _fail(f"running {r} has status {r.status} / holds blocks {kv.holds(rid)}")
    for rid in swapped:
        if s.requests[rid].status != S.SWAPPED or not kv.is_swapped(rid):
            _fail(f"swapped {s.requests[rid]} not in swap space")
    for r in waiting_reqs:
        if r.status not in (S.WAITING, S.PREEMPTED) or kv.holds(r.request_id):
            _fail(f"waiting {r} has status {r.status} or holds blocks")
        if not s.limits.fits(r):
            _fail(f"waiting {r} can never fit its class's KV capacity: it would block the queue")
    if sum(s._waiting_count) != len(waiting):
        _fail("waiting counters do not match the queue")
    if out is not None:
        total = sum(out.num_scheduled_tokens.values())
        if total != out.total_num_scheduled_tokens:
            _fail("total_num_scheduled_tokens is not the sum")
        if total > cfg.max_num_batched_tokens:
            _fail(f"scheduled {total} tokens > budget {cfg.max_num_batched_tokens}")
        for rid, n in out.num_scheduled_tokens.items():
            r = s.requests.get(rid)
            if r is None or rid not in running or n <= 0:
                _fail(f"scheduled {rid} ({n} tokens) is not a running request")
            slots = len(kv.block_ids(rid)) * kv.block_size
            if slots < r.num_computed_tokens + n:
                _fail(f"{rid}: {slots} slots for {r.num_computed_tokens + n} tokens")
            drafts = len(out.spec_token_ids.get(rid, ()))
            if drafts and r.num_tokens - r.num_computed_tokens != 1:
                _fail(f"{rid}: drafts for a request that is not decoding")
            if r.num_computed_tokens + n > r.num_tokens + drafts:
                _fail(f"{rid}: scheduled past its known tokens")
            if math.ceil((r.num_computed_tokens + n) / kv.block_size) > len(kv.block_ids(rid)):
                _fail(f"{rid}: missing blocks")
    kv.check_invariants()
