"""The FastAPI application: routes, error mapping, middleware, health/ready/metrics."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import asynccontextmanager
from typing import Protocol

from fastapi import Depends, FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException

from tierserve.api import chat_routes, completion_routes, tokenizer_routes
from tierserve.api.auth import authenticated
from tierserve.api.door import Door, door_class
from tierserve.api.errors import APIError, error_response, retry_after_header, validation_message
from tierserve.api.middleware import BodySizeLimit, InternalErrors
from tierserve.api.openapi import (
    AUTH_RESPONSES,
    HEALTH_RESPONSES,
    METRICS_RESPONSES,
    READY_RESPONSES,
    install_openapi,
)
from tierserve.api.state import ServerState

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}


def _http_error(req: HTTPRequest, exc: HTTPException) -> APIError:
    """Starlette's own errors (no route, wrong method, unreadable body) in OpenAI's shape."""
    where = f"{req.method} {req.url.path}"
    if exc.status_code == 404:
        msg = f"no such route: {where}"
    elif exc.status_code == 405:
        msg = f"method not allowed: {where} (allowed: {(exc.headers or {}).get('Allow', '?')})"
    elif exc.status_code == 400 and isinstance(exc.__cause__, UnicodeDecodeError):
        msg = f"the request body is not valid UTF-8: {exc.__cause__}"
    elif exc.status_code == 400 and isinstance(exc.__cause__, RecursionError):
        msg = "the JSON body is nested too deeply to be read"
    elif exc.status_code == 400 and exc.__cause__ is not None:
        msg = "the request body could not be read as JSON"
    else:
        msg = str(exc.detail)
    return APIError(
        exc.status_code,
        msg,
        code=_HTTP_CODES.get(exc.status_code),
        headers=dict(exc.headers or {}),
    )


class Service(Protocol):
    """A part the server mounts beside the core routes (the Batch API): started and stopped
    with the app; `upload_limits` raises the body limit on its upload paths."""

    upload_limits: dict[str, int]

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


# Adds its routes to the app and returns its service, or None where the settings leave it off.
Mount = Callable[[FastAPI, ServerState], Service | None]


def create_app(state: ServerState, mounts: Sequence[Mount] = ()) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if not state.engine.is_alive():
            state.engine.start()
        for svc in services:  # the Batch API's feeder resumes unfinished batches
            await svc.start()
        yield
        # uvicorn has already waited for (or cut) the open requests: see api/drain.py.
        state.draining = True
        for svc in reversed(services):
            await svc.stop()
        state.engine.shutdown()

    app = FastAPI(title="tierserve", lifespan=lifespan)
    app.state.tierserve = state
    for module in (chat_routes, completion_routes, tokenizer_routes):
        app.include_router(module.router)
    app.include_router(tokenizer_routes.open_router)
    services = [s for s in (mount(app, state) for mount in mounts) if s is not None]

    @app.exception_handler(APIError)
    async def _api_error(_req: HTTPRequest, exc: APIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_req: HTTPRequest, exc: RequestValidationError):
        msg, field = validation_message(exc)
        return error_response(APIError(400, msg, param=field))

    @app.exception_handler(HTTPException)
    async def _starlette_error(req: HTTPRequest, exc: HTTPException):
        return error_response(_http_error(req, exc))

    @app.get("/health", responses=HEALTH_RESPONSES)
    async def health():
        eng = state.engine
        if eng.is_alive():
            return {"status": "ok"}
        why = f"engine stopped: {eng.error!r}" if eng.error is not None else "engine stopped"
        return JSONResponse(
            {"status": "unhealthy", "reason": why},
            status_code=503,
            headers={"Retry-After": retry_after_header(None)},
        )

    @app.get("/ready", responses=READY_RESPONSES)
    async def ready():
        eng = state.engine
        alive = eng.is_alive() and time.monotonic() - eng.heartbeat < 30.0
        if alive and not state.draining:
            return {"status": "ready", "in_flight": eng.num_in_flight()}
        why = "draining" if state.draining else "engine not stepping"
        return JSONResponse(
            {"status": "not ready", "reason": why},
            status_code=503,
            headers={"Retry-After": retry_after_header(None)},
        )

    @app.get("/metrics", responses=METRICS_RESPONSES)
    async def metrics():
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=[Depends(authenticated)], responses=AUTH_RESPONSES)
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

    uploads = {path: n for svc in services for path, n in svc.upload_limits.items()} or None
    # Inside the body limit (what it receives is bounded): the clock starts at the headers,
    # the door sorts before any body is parsed (api/door.py).
    # (an engine in this process only: a cluster ingress's replicas have their own cores)
    busy = getattr(state.engine, "p0_prompts_waiting", None)
    app.add_middleware(
        Door, now=state.engine.clock.now, classify=door_class(state.tenants), busy=busy
    )
    app.add_middleware(BodySizeLimit, limit=state.settings.max_request_bytes, paths=uploads)
    app.add_middleware(InternalErrors)  # outermost of ours: sees what every layer inside raised
    install_openapi(
        app, state.settings.max_request_bytes, state.max_model_len, state.tokenizer.vocab_size
    )
    return app
