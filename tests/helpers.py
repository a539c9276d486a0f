"""Test helpers. Request ids are generated and checked for uniqueness: a test that passes only
because two requests share an id proves nothing (see vLLM's priority-preemption test history)."""

from __future__ import annotations

import itertools
import zlib

from tierserve.priority import Priority
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams

_ids = itertools.count()
_seen: set[str] = set()


def new_id(prefix: str = "req") -> str:
    rid = f"{prefix}-{next(_ids)}"
    assert rid not in _seen, f"duplicate request id {rid}"
    _seen.add(rid)
    return rid


def make_request(
    num_tokens: int = 16,
    priority: Priority | int = Priority.P1,
    *,
    tokens: list[int] | None = None,
    max_tokens: int = 16,
    arrival: float = 0.0,
    tenant: str = "default",
    salt: str | None = None,
    deadline: float | None = None,
    ignore_eos: bool = True,
    request_id: str | None = None,
) -> Request:
    rid = request_id or new_id()
    if tokens is None:
        # Distinct per request (no accidental prefix sharing); pass `tokens` to share on purpose.
        # crc32, not hash(): str hashes are salted per process, and a test must not depend on
        # which process runs it.
        base = zlib.crc32(rid.encode()) % 50_000
        tokens = [(base + i * 7 + 3) % 50_000 for i in range(num_tokens)]
    return Request(
        request_id=rid,
        prompt_token_ids=list(tokens),
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos),
        priority=Priority(priority),
        tenant=tenant,
        arrival_time=arrival,
        cache_salt=salt,
        deadline=deadline,
    )
