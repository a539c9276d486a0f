"""Pure ASGI middleware: the body-size limit, and the last line of defence that turns an
unexpected exception into an OpenAI-style JSON 500 with a request id (never plain text)."""

from __future__ import annotations

import logging
import uuid

from tierserve.api.errors import APIError, error_response

log = logging.getLogger("tierserve.api")


class BodySizeLimit:
    """Refuse bodies over `limit` bytes with 413, whether or not the client sent a
    Content-Length.

    A chunked body is counted as it arrives. Once it passes the limit, the application is told
    the client went away (it stops reading), whatever it answers is dropped, and the 413 is sent
    instead: an exception raised inside `receive` would be turned into a 400 by FastAPI's body
    parsing."""

    def __init__(self, app, limit: int, paths: dict[str, int] | None = None) -> None:
        self.app, self.default = app, limit
        self.paths = dict(paths or {})  # a larger limit for these paths (file uploads)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.paths.get(scope.get("path", ""), self.default)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await self._too_large(limit, scope, receive, send)
        seen, over = 0, False

        async def limited():
            nonlocal seen, over
            if over:
                return {"type": "http.disconnect"}
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    over = True
                    return {"type": "http.disconnect"}
            return msg

        async def guarded(msg):
            if not over:
                await send(msg)

        try:
            await self.app(scope, limited, guarded)
        except Exception:
            if not over:
                raise
        if over:
            await self._too_large(limit, scope, receive, send)

    async def _too_large(self, limit, scope, receive, send):
        err = APIError(413, f"request body exceeds {limit} bytes", code="request_too_large")
        err.headers["Connection"] = "close"  # the rest of the body is not read
        await error_response(err)(scope, receive, send)


class InternalErrors:
    """An exception no handler expected becomes a JSON 500 naming a request id, and the
    traceback is logged once with that id. A response already under way cannot change its
    status: then the error is only logged (streams end themselves with an error event)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracking(msg):
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, receive, tracking)
        except Exception:
            rid = f"err-{uuid.uuid4().hex[:16]}"
            log.exception(
                "unhandled error in %s %s (request id %s)", scope["method"], scope["path"], rid
            )
            if started:
                return
            err = APIError(
                500,
                f"internal server error (request id {rid}); the server log has the details",
                "server_error",
                code="internal_error",
                headers={"x-request-id": rid},
            )
            await error_response(err)(scope, receive, send)
