"""One batch line through the same handlers as an HTTP request.

The line's body is validated by the route's own request model, then handed to the route's own
handler (`chat_routes.chat_completions`, `completion_routes.completions`), which runs the
`api/state.py` prepare/admit path and reads the answer from `ServerState.engine`, whether that
is the local AsyncEngine or a cluster's RemoteEngine. The request the handler sees carries the
batch's tenant and class (`x-request-tier`), and says "client disconnected" once the line is
cancelled, so the handler aborts it in the engine and frees its KV blocks, as for a client
that went away. The answer is the HTTP answer: a status and a JSON body.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from types import SimpleNamespace

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.requests import Request as HTTPRequest

from tierserve.api import chat_routes, completion_routes
from tierserve.api.chat_protocol import ChatCompletionRequest
from tierserve.api.errors import APIError, error_response
from tierserve.api.protocol import CompletionRequest
from tierserve.api.state import ServerState
from tierserve.api.tenancy import Tenant
from tierserve.priority import Priority

log = logging.getLogger("tierserve.batch")

ROUTES = {
    "/v1/chat/completions": (ChatCompletionRequest, chat_routes.chat_completions),
    "/v1/completions": (CompletionRequest, completion_routes.completions),
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
    from tierserve.api.app import _validation_message as http_message

    msg, field = http_message(RequestValidationError(exc.errors()))
    return APIError(400, msg, param=field)


def _request(state: ServerState, tenant: Tenant, url: str, tier: Priority, cancelled):
    async def receive():
        if cancelled.is_set():
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": url,
        "raw_path": url.encode(),
        "query_string": b"",
        "headers": [(b"x-request-tier", tier.label.lower().encode())],
        "app": SimpleNamespace(state=SimpleNamespace(tierserve=state)),
        "state": {"tenant": tenant},
        "client": None,
        "server": None,
        "scheme": "http",
        "root_path": "",
    }
    return HTTPRequest(scope, receive)


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
        resp = await handler(req, _request(state, tenant, url, tier, cancelled))
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
