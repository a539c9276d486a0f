"""Everything a request handler needs, built once per server, and the request preparation that
chat and completions share: authentication, priority, context checks, admission, Requests."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field, replace

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse

from tierserve.admission import AdmissionController
from tierserve.admission.ttft import SLA_DEMOTED
from tierserve.api.errors import APIError, admission_response
from tierserve.api.protocol import _Common
from tierserve.api.settings import ServerSettings
from tierserve.api.tenancy import AuthError, BadPriority, Resolution, TenantRegistry
from tierserve.engine.async_engine import AsyncEngine, EngineDeadError
from tierserve.metrics import Metrics
from tierserve.model.tokenizer import ChatTokenizer
from tierserve.priority import VALID_TIER_NAMES, Priority
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams


@dataclass
class ServerState:
    engine: AsyncEngine
    tokenizer: ChatTokenizer
    admission: AdmissionController
    tenants: TenantRegistry
    metrics: Metrics
    settings: ServerSettings
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    draining: bool = False
    started: float = field(default_factory=time.time)


@dataclass
class Prepared:
    resolution: Resolution
    requests: list[Request]
    headers: dict[str, str]
    request_id: str
    streams: list = field(default_factory=list)


def _sampling(body: _Common, max_tokens: int, eos: tuple[int, ...], seed_offset: int):
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            min_p=body.min_p,
            seed=None if body.seed is None else body.seed + seed_offset,
            stop=tuple(body.stop or ()),
            stop_token_ids=tuple(eos[1:]),
            ignore_eos=body.ignore_eos,
            logprobs=bool(getattr(body, "logprobs", False)),
        )
    except ValueError as exc:
        raise APIError(400, str(exc)) from None


def _requests(state, body, prompt_ids, max_tokens, res, tenant, prefix) -> list[Request]:
    """One engine Request per choice (`n`), sharing an id prefix."""
    now = state.engine.core.clock.now()
    rid = f"{prefix}-{uuid.uuid4().hex[:16]}"
    deadline = now + body.sla_latency_ms / 1000 if body.sla_latency_ms else None
    return [
        Request(
            f"{rid}-{i}",
            list(prompt_ids),
            _sampling(body, max_tokens, state.eos_token_ids, i),
            priority=res.priority,
            tenant=tenant.name,
            arrival_time=now,
            deadline=deadline,
            cache_salt=tenant.cache_salt,
            eos_token_id=state.eos_token_ids[0] if state.eos_token_ids else None,
        )
        for i in range(body.n)
    ]


def prepare(
    state: ServerState,
    http: HTTPRequest,
    body: _Common,
    prompt_ids: list[int],
    max_tokens: int | None,
    prefix: str,
) -> Prepared | JSONResponse:
    """Validate and admit a request; return its engine Requests, or a refusal response."""
    if state.draining:  # 503 with Retry-After: another replica, or this one after a restart
        raise APIError(503, "the server is shutting down", "resource_exhausted")
    if body.model is not None and body.model not in state.settings.served_model_names:
        raise APIError(
            404,
            f"the model {body.model!r} does not exist; served: "
            f"{', '.join(state.settings.served_model_names)}",
            "invalid_request_error",
            "model",
            "model_not_found",
        )
    try:
        tenant = state.tenants.authenticate(
            http.headers.get("authorization"), http.headers.get("x-tenant-id")
        )
    except AuthError as exc:
        raise APIError(401, str(exc), "authentication_error") from None
    try:
        res = state.tenants.resolve(tenant, http.headers.get("x-request-tier"), body.priority)
    except BadPriority as exc:
        raise APIError(
            400,
            f"{exc} (valid tiers: {', '.join(VALID_TIER_NAMES)}; body priority: 0..3)",
            param="priority",
        ) from None
    n_prompt, limit = len(prompt_ids), state.max_model_len
    if n_prompt >= limit:
        raise APIError(
            400,
            f"the prompt has {n_prompt} tokens; the model's context is {limit} "
            "tokens (prompt + completion)",
            param="messages",
        )
    if max_tokens is None:
        max_tokens = min(state.settings.default_max_tokens, limit - n_prompt)
    elif n_prompt + max_tokens > limit:
        raise APIError(
            400,
            f"the model's context is {limit} tokens, but {n_prompt + max_tokens} "
            f"were requested ({n_prompt} in the prompt, {max_tokens} for the "
            "completion)",
            param="max_tokens",
        )
    reqs = _requests(state, body, prompt_ids, max_tokens, res, tenant, prefix)
    limits = state.engine.limits
    try:  # what the scheduler would refuse (KV capacity of the class), refused here with a 400
        limits.check(reqs[0])
    except ValueError as exc:
        raise APIError(400, str(exc)) from None
    # SLA admission may demote a late P1/P2 request of an opted-in tenant to best effort, if
    # best effort's memory can hold it.
    demote_ok = tenant.sla_demote and limits.fits(reqs[0], Priority.P3)
    decision = state.admission.decide(
        res.priority, tenant.name, (n_prompt + max_tokens) * body.n, n_prompt * body.n, demote_ok
    )
    if not decision.admitted:
        state.metrics.on_rejected(decision.code or decision.error_type, res.priority)
        return admission_response(decision)
    if decision.demoted_from is not None:
        state.metrics.on_rejected(SLA_DEMOTED, decision.demoted_from)
        res = replace(res, priority=decision.priority)
        reqs = _requests(state, body, prompt_ids, max_tokens, res, tenant, prefix)
    predicted = decision.predicted_ttft_s
    if predicted is not None and not math.isfinite(predicted):
        predicted = None  # best effort behind a saturating class: no time to promise
    for r in reqs:
        r.predicted_ttft = predicted
        r.end_if_late = tenant.sla_end_early and state.admission.config.sla_admission
    if decision.shed:
        state.engine.shed(
            res.priority,
            "shed: the queue was full and a realtime (P0) request took its place; retry later",
        )
    rid = reqs[0].request_id.rsplit("-", 1)[0]
    headers = {"x-tierserve-priority": res.priority.label.lower(), "x-request-id": rid}
    if res.clamped:
        headers["x-tierserve-priority-clamped"] = "true"
    if decision.demoted_from is not None:  # never silently late: the client is told
        headers["x-tierserve-demoted"] = res.priority.label.lower()
    if predicted is not None:
        headers["x-tierserve-predicted-ttft-ms"] = str(round(1000 * predicted))
    # Submitted in the same event-loop turn as the admission decision, so the next decision
    # already counts these requests.
    try:  # requests submitted before a crash are failed by the engine's crash handler
        streams = [state.engine.submit(r) for r in reqs]
    except EngineDeadError as exc:
        raise APIError(503, str(exc), "server_error") from None
    return Prepared(res, reqs, headers, rid, streams)
