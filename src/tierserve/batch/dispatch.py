"""One batch line through the same handlers as an HTTP request.

The line's body is validated by the route's own request model, then handed to the route's own
handler (`chat_routes.chat_answer`, `completion_routes.completion_answer`) by a typed call: its
`Caller` (api/caller.py) carries the batch's tenant and class, and says "gone" once the line is
cancelled, so the handler aborts it in the engine and frees its KV blocks, as for a client that
went away. The handler runs the `api/state.py` prepare/admit path and reads the answer from
`ServerState.engine`, whether that is the local AsyncEngine or a cluster's RemoteEngine. The
answer is the HTTP answer: a status and a JSON body.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from tierserve.api import chat_routes, completion_routes
from tierserve.api.caller import Caller
from tierserve.api.chat_protocol import ChatCompletionRequest
from tierserve.api.errors import APIError, error_response, validation_message
from tierserve.api.protocol import CompletionRequest
from tierserve.api.state import ServerState
from tierserve.api.tenancy import Tenant
from tierserve.priority import Priority

log = logging.getLogger("tierserve.batch")

ROUTES = {
    "/v1/chat/completions": (ChatCompletionRequest, chat_routes.chat_answer),
    "/v1/completions": (CompletionRequest, completion_routes.completion_answer),
}
CANCELLED = 499  # as the handlers answer a request whose client went away


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def refused(self) -> bool:
        """Refused for now (rate limit, full queue, shed, draining): run it again later."""
        return self.status in (429, 503)


def _invalid(exc: ValidationError) -> APIError:
    """A 400 worded as the HTTP route words it."""
    msg, field = validation_message(RequestValidationError(exc.errors()))
    return APIError(400, msg, param=field)


def _answer(resp) -> Answer:
    body = json.loads(bytes(resp.body)) if resp.body else {}
    retry = resp.headers.get("retry-after")
    return Answer(resp.status_code, body, float(retry) if retry else None)


async def dispatch(
    state: ServerState,
    tenant: Tenant,
    url: str,
    body: dict,
    tier: Priority,
    deadline_in_s: float | None = None,
    cancelled: asyncio.Event | None = None,
) -> Answer:
    """Run one request of a batch; its HTTP answer. `deadline_in_s`: the line's first token is
    due within this many seconds (its batch's window), unless the body asks for sooner."""
    cancelled = cancelled or asyncio.Event()
    model, handler = ROUTES[url]
    try:
        if body.get("stream"):
            raise APIError(400, "stream is not supported in a batch", param="stream")
        req = model.model_validate_json(json.dumps(body))
        if deadline_in_s is not None:
            ms = max(1.0, 1000 * deadline_in_s)
            if req.sla_latency_ms is None or req.sla_latency_ms > ms:
                req = req.model_copy(update={"sla_latency_ms": ms})
        gone = cancelled

        async def disconnected() -> bool:
            return gone.is_set()

        caller = Caller(tenant, tier.label.lower(), disconnected)
        resp = await handler(state, req, caller)
    except ValidationError as exc:
        resp = error_response(_invalid(exc))
    except APIError as exc:
        resp = error_response(exc)
    except Exception as exc:  # a bug must fail the line, never the feeder
        log.exception("batch line failed in its handler")
        err = APIError(500, f"internal server error: {type(exc).__name__}", "server_error")
        resp = error_response(err)
    if not isinstance(resp, JSONResponse):
        return Answer(500, {"error": {"message": "unexpected streamed answer"}})
    return _answer(resp)
