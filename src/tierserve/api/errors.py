"""OpenAI-style error responses: every error the server answers has the body
``{"error": {"message", "type", "param", "code"}}`` (429/503 add their queue fields)."""

from __future__ import annotations

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from tierserve.admission import Decision
from tierserve.admission.sla import retry_after_seconds
from tierserve.admission.ttft import SLA_UNREACHABLE
from tierserve.engine.events import ErrorKind


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = (
            status,
            message,
            kind,
            param,
            code,
        )
        self.retry_after_s = retry_after_s
        self.headers = dict(headers or {})


# How a request the engine ended with an error is answered: (HTTP status of a non-streamed
# request, OpenAI error type, code). A 503 also says when to retry. The one place a kind becomes
# a status; tests/test_engine_events.py checks that every kind is here.
ENGINE_ERRORS: dict[ErrorKind, tuple[int, str, str | None]] = {
    ErrorKind.INVALID: (400, "invalid_request_error", None),
    ErrorKind.SHED: (503, "resource_exhausted", None),
    ErrorKind.SLA_UNREACHABLE: (503, "resource_exhausted", SLA_UNREACHABLE),
    ErrorKind.SHUTDOWN: (503, "server_error", None),
    ErrorKind.ENGINE: (500, "server_error", None),
    ErrorKind.REPLICA_LOST: (500, "server_error", None),
}


def engine_error(kind: ErrorKind | None, message: str, retry_after_s: float | None) -> APIError:
    """The APIError of a request the engine ended with an error of `kind` (None: ENGINE)."""
    status, typ, code = ENGINE_ERRORS[kind or ErrorKind.ENGINE]
    return APIError(status, message, typ, code=code, retry_after_s=retry_after_s)


def error_response(err: APIError) -> JSONResponse:
    body = {
        "error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.code}
    }
    headers = dict(err.headers)
    if err.retry_after_s is not None or err.status == 503:  # a 503 always says when to retry
        headers["Retry-After"] = retry_after_header(err.retry_after_s)
    return JSONResponse(body, status_code=err.status, headers=headers)


def retry_after_header(seconds: float | None) -> str:
    return str(retry_after_seconds(seconds))


def admission_response(d: Decision) -> JSONResponse:
    """503 (capacity) or 429 (rate limit) with Retry-After, or 400 for a request that could
    never pass the rate limit."""
    if d.status == 400:
        return error_response(APIError(400, d.reason, "invalid_request_error"))
    body = {
        "error": {
            "type": d.error_type,
            "message": d.reason,
            "param": None,
            "code": d.code,
            "retry_after": d.retry_after_s,
            "current_queue_depth": d.queue_depth,
            "priority": d.priority.label.lower(),
        }
    }
    headers = {"Retry-After": retry_after_header(d.retry_after_s)}
    return JSONResponse(body, status_code=d.status, headers=headers)


def validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    """A request body's first validation error as (message, field), worded for the client."""
    errs = exc.errors()
    if not errs:
        return "invalid request", None
    e = errs[0]
    if e.get("type") == "json_invalid":
        return f"malformed JSON body: {e.get('ctx', {}).get('error', e.get('msg'))}", None
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    field = ".".join(loc) or None
    msg = e.get("msg", "invalid value").removeprefix("Value error, ")
    if e.get("type") == "missing":
        if field is None:  # the body itself
            return "missing request body: send a JSON object (content-type: application/json)", None
        return f"missing required field '{field}'", field
    if e.get("type") == "extra_forbidden":
        return f"unknown field '{field}': not part of this API (see docs/api.md)", field
    if field is None:
        return f"invalid request: {msg}", None
    return f"invalid value for '{field}': {msg}", field
