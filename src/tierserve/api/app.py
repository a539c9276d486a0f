"""The FastAPI application: routes, error mapping, body-size limit, health/ready/metrics."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from tierserve.api.errors import APIError, error_response
from tierserve.api.openai_routes import router
from tierserve.api.state import ServerState


class BodySizeLimit:
    """Pure ASGI middleware: refuse bodies over `limit` bytes with 413, whether or not the
    client sent a Content-Length."""

    def __init__(self, app, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await self._too_large(send)
        seen = 0

        async def limited():
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return msg

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._too_large(send)

    async def _too_large(self, send):
        resp = error_response(
            APIError(413, f"request body exceeds {self.limit} bytes", code="request_too_large")
        )
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": resp.body})


class _TooLarge(Exception):
    pass


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errs = exc.errors()
    if not errs:
        return "invalid request", None
    e = errs[0]
    if e.get("type") == "json_invalid":
        return f"malformed JSON body: {e.get('ctx', {}).get('error', e.get('msg'))}", None
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    field = ".".join(loc) or None
    msg = e.get("msg", "invalid value")
    if e.get("type") == "missing":
        return f"missing required field '{field}'", field
    return f"invalid value for '{field}': {msg}", field


def create_app(state: ServerState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if not state.engine.is_alive():
            state.engine.start()
        yield
        state.draining = True
        deadline = time.monotonic() + state.settings.shutdown_grace_s
        while state.engine.num_in_flight() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        state.engine.shutdown()

    app = FastAPI(title="tierserve", lifespan=lifespan)
    app.state.tierserve = state
    app.include_router(router)

    @app.exception_handler(APIError)
    async def _api_error(_req: HTTPRequest, exc: APIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: HTTPRequest, exc: RequestValidationError):
        msg, field = _validation_message(exc)
        return error_response(APIError(400, msg, param=field))

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        eng = state.engine
        alive = eng.is_alive() and time.monotonic() - eng.heartbeat < 30.0
        if alive and not state.draining:
            return {"status": "ready", "in_flight": eng.num_in_flight()}
        why = "draining" if state.draining else "engine not stepping"
        return JSONResponse({"status": "not ready", "reason": why}, status_code=503)

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        created = int(state.started)
        data = [
            {
                "id": n,
                "object": "model",
                "created": created,
                "owned_by": "tierserve",
                "max_model_len": state.max_model_len,
            }
            for n in state.settings.served_model_names
        ]
        return {"object": "list", "data": data}

    app.add_middleware(BodySizeLimit, limit=state.settings.max_request_bytes)
    return app
