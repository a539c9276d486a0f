"""Everything a request handler needs, built once per server, and the request preparation that
chat and completions share: priority, context checks, admission, Requests."""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field, replace

from fastapi.responses import JSONResponse

from tierserve.admission import AdmissionController
from tierserve.admission.ttft import SLA_DEMOTED
from tierserve.api.caller import Caller
from tierserve.api.errors import APIError, admission_response
from tierserve.api.prompts import PromptBounds
from tierserve.api.protocol import Common
from tierserve.api.sampling import check_token_ids, sampling_params
from tierserve.api.settings import ServerSettings
from tierserve.api.tenancy import BadPriority, Resolution, TenantRegistry
from tierserve.chat.prompt import ChatPrompter
from tierserve.engine.client import EngineClient, EngineDeadError, Stream
from tierserve.grammar import GrammarSpec
from tierserve.metrics import Metrics
from tierserve.model.tokenizer import ChatTokenizer
from tierserve.priority import VALID_TIER_NAMES, Priority
from tierserve.request import EngineRequest


@dataclass
class ServerState:
    engine: EngineClient
    tokenizer: ChatTokenizer
    admission: AdmissionController
    tenants: TenantRegistry
    metrics: Metrics
    settings: ServerSettings
    max_model_len: int
    eos_token_ids: tuple[int, ...]
    chat: ChatPrompter
    draining: bool = False
    started: float = field(default_factory=time.time)
    bounds: PromptBounds | None = None  # derived from the tokenizer and the context
    batch_lines: bool = False  # the Batch API feeder's copy: its requests are batch lines

    def __post_init__(self) -> None:
        if self.bounds is None:
            self.bounds = PromptBounds(self.tokenizer, self.max_model_len)


@dataclass
class Prepared:
    """An admitted request's engine requests (one per choice) and their streams. Read them
    inside ``async with prepared``: its exit cancels every choice that has not ended."""

    resolution: Resolution
    requests: list[EngineRequest]
    headers: dict[str, str]
    request_id: str
    streams: list[Stream] = field(default_factory=list)

    async def __aenter__(self) -> Prepared:
        return self

    async def __aexit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Cancel the choices that have not ended (event loop)."""
        for s in self.streams:
            s.close()


def _requests(
    state, body, prompts, max_tokens, res, tenant, prefix, grammar, now, trace_parent=None
) -> list[EngineRequest]:
    """One EngineRequest per choice: prompt i, choice j is request (and index) i * n + j,
    seeded `seed + j` (so a prompt gets the same choices alone or in a list); `now`: when it
    arrived (its first byte, api/door.py)."""
    rid = f"{prefix}-{uuid.uuid4().hex[:16]}"
    deadline = now + body.sla_latency_ms / 1000 if body.sla_latency_ms else None
    return [
        EngineRequest(
            f"{rid}-{i * body.n + j}",
            tuple(ids),
            _opt_out(sampling_params(body, limit, state.eos_token_ids, j, grammar), tenant),
            priority=res.priority,
            tenant=tenant.name,
            arrival_time=now,
            deadline=deadline,
            cache_salt=tenant.cache_salt,
            eos_token_id=state.eos_token_ids[0] if state.eos_token_ids else None,
            batch_line=state.batch_lines,
            trace_parent=trace_parent,
        )
        for i, (ids, limit) in enumerate(zip(prompts, max_tokens, strict=True))
        for j in range(body.n)
    ]


def _opt_out(params, tenant):
    """A tenant that opted out of speculative decoding (tenants file) never speculates."""
    return params if tenant.speculative else replace(params, speculative=False)


def check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model not in state.settings.served_model_names:
        raise APIError(
            404,
            f"the model {model!r} does not exist; served: "
            f"{', '.join(state.settings.served_model_names)}",
            "invalid_request_error",
            "model",
            "model_not_found",
        )


def _max_tokens(state: ServerState, prompts, max_tokens: int | None, param: str) -> list[int]:
    """Each prompt's completion budget; a 400 naming both numbers when it cannot fit."""
    limit, out = state.max_model_len, []
    for i, ids in enumerate(prompts):
        which = f"prompt {i} has" if len(prompts) > 1 else "prompt has"
        n_prompt = len(ids)
        if n_prompt >= limit:
            raise APIError(
                400,
                f"the {which} {n_prompt} tokens; the model's context is {limit} "
                "tokens (prompt + completion)",
                param=param,
            )
        if max_tokens is None:
            out.append(min(state.settings.default_max_tokens, limit - n_prompt))
        elif n_prompt + max_tokens > limit:
            raise APIError(
                400,
                f"the model's context is {limit} tokens, but {n_prompt + max_tokens} "
                f"were requested ({n_prompt} in the {which.removesuffix(' has')}, "
                f"{max_tokens} for the completion)",
                param="max_tokens",
            )
        else:
            out.append(max_tokens)
    return out


def prepare(
    state: ServerState,
    caller: Caller,
    body: Common,
    prompts: list[list[int]],
    max_tokens: int | None,
    prefix: str,
    param: str = "messages",
    grammar: GrammarSpec | None = None,
) -> Prepared | JSONResponse:
    """Validate and admit a request (`n` choices for each of `prompts`); return its engine
    requests, submitted, or a refusal response. Either way (an error too) the caller leaves
    the door: the next request's door work may start."""
    try:
        return _prepare(state, caller, body, prompts, max_tokens, prefix, param, grammar)
    finally:
        caller.leave_door()


def _prepare(state, caller, body, prompts, max_tokens, prefix, param, grammar):
    if state.draining:  # 503 with Retry-After: another replica, or this one after a restart
        raise APIError(503, "the server is shutting down", "resource_exhausted")
    check_model(state, body.model)
    tenant = caller.tenant
    try:
        res = state.tenants.resolve(tenant, caller.tier, body.priority)
    except BadPriority as exc:
        raise APIError(
            400,
            f"{exc} (valid tiers: {', '.join(VALID_TIER_NAMES)}; body priority: 0..3)",
            param="priority",
        ) from None
    check_token_ids(body, state.tokenizer.vocab_size)
    budgets = _max_tokens(state, prompts, max_tokens, param)
    now = state.engine.clock.now()
    arrived = now if caller.arrived is None else min(now, caller.arrived)
    reqs = _requests(
        state, body, prompts, budgets, res, tenant, prefix, grammar, arrived, caller.trace_parent
    )
    limits = state.engine.limits
    try:  # what the scheduler would refuse (KV capacity of the class), refused here with a 400
        for r in reqs[:: body.n]:
            limits.check(r)
    except ValueError as exc:
        raise APIError(400, str(exc)) from None
    # SLA admission may demote a late P1/P2 request of an opted-in tenant to best effort, if
    # best effort's memory can hold it.
    demote_ok = tenant.sla_demote and all(limits.fits(r, Priority.P3) for r in reqs[:: body.n])
    prompt_tokens = sum(len(ids) for ids in prompts) * body.n
    cost = sum(len(ids) + m for ids, m in zip(prompts, budgets, strict=True)) * body.n
    decision = state.admission.decide(
        res.priority, tenant.name, cost, prompt_tokens, demote_ok, waited_s=now - arrived
    )
    if not decision.admitted:
        state.metrics.on_rejected(decision.code or decision.error_type, res.priority)
        return admission_response(decision)
    if decision.demoted_from is not None:
        state.metrics.on_rejected(SLA_DEMOTED, decision.demoted_from)
        res = replace(res, priority=decision.priority)
        reqs = _requests(
            state, body, prompts, budgets, res, tenant, prefix, grammar, arrived,
            caller.trace_parent,
        )  # fmt: skip
    predicted = decision.predicted_ttft_s
    if predicted is not None and not math.isfinite(predicted):
        predicted = None  # best effort behind a saturating class: no time to promise
    end_if_late = tenant.sla_end_early and state.admission.config.sla_admission
    reqs = [replace(r, predicted_ttft=predicted, end_if_late=end_if_late) for r in reqs]
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
