"""OpenAI-style error responses: every error the server answers has the body
``{"error": {"message", "type", "param", "code"}}`` (429/503 add their queue fields)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from tierserve.admission import Decision
from tierserve.admission.sla import retry_after_seconds


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
