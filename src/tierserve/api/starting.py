"""The port opens at once; the engine loads behind it (issue 42: a first start compiled the
kernels and timed the step plan for minutes with the port closed and nothing logged).

`StartingGate` is the ASGI app uvicorn serves from its first second. While the engine is being
built (on a worker thread: model, kernels, step plan), `/health` and `/ready` answer 503
`{"status": "starting", "stage": ..., "elapsed_s": ...}` and every other path a 503 error
saying the server is starting, each with `Retry-After` (as vLLM's server does while it loads).
Once built, the real application's lifespan starts (the engine thread, the Batch API's feeder)
and every request goes to it. If the build fails, the process exits with the status the
failure gives (2: the settings cannot be served).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

log = logging.getLogger("tierserve.server")


class StartingGate:
    def __init__(self, build: Callable[[Callable[[str], None]], Any]) -> None:
        """`build(stage)`: builds and returns the real ASGI application (a FastAPI app),
        calling `stage(text)` as it goes; it runs on a worker thread."""
        self._build = build
        self.app: Any = None
        self.error: BaseException | None = None
        self.stage = "starting"
        self.started = time.monotonic()
        self.on_failure: Callable[[BaseException], None] | None = None
        self._lifespan: AbstractAsyncContextManager | None = None
        self._task: asyncio.Task | None = None

    def set_stage(self, text: str) -> None:
        """What the start is doing now (any thread: one attribute, read by the event loop)."""
        self.stage = text

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._run_lifespan(receive, send)
        elif self.app is not None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await self._starting(scope, send)

    async def _starting(self, scope, send) -> None:
        elapsed = round(self.elapsed_s, 1)
        if scope.get("path") in ("/health", "/ready"):
            body: dict = {"status": "starting", "stage": self.stage, "elapsed_s": elapsed}
        else:
            body = {
                "error": {
                    "message": f"the server is starting ({self.stage}, {elapsed} s): retry",
                    "type": "server_error",
                    "param": None,
                    "code": "starting",
                }
            }
        payload = json.dumps(body).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"retry-after", b"5"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _run_lifespan(self, receive, send) -> None:
        await receive()  # lifespan.startup: the port opens now; the engine comes after
        self._task = asyncio.create_task(self._start())
        await send({"type": "lifespan.startup.complete"})
        await receive()  # lifespan.shutdown
        if self._lifespan is not None:
            await self._lifespan.__aexit__(None, None, None)
        elif self._task is not None and not self._task.done():
            self._task.cancel()  # (the build thread ends with the process)
        await send({"type": "lifespan.shutdown.complete"})

    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            app = await loop.run_in_executor(None, self._build, self.set_stage)
            lifespan = app.router.lifespan_context(app)
            await lifespan.__aenter__()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the settings cannot be served: say so, and exit
            self.error = exc
            if self.on_failure is not None:
                self.on_failure(exc)
            return
        self._lifespan = lifespan
        self.app = app
        self.stage = "ready"
        log.info("ready in %.1f s", self.elapsed_s)
