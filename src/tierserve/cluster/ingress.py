"""The ingress deployment: the single-process server's FastAPI app (``api/``: auth, tenants, tier
resolution, admission, OpenAI routes, SSE) over a ``RemoteEngine`` instead of a local engine.

It holds no model: the tokenizer, the request limits and the EOS ids come from an engine
replica's ``spec`` when the ingress starts. A background task pulls the fleet board's view
every ``view_period_s`` and hands it to the RemoteEngine whole; with the ingress queue on, it
first pushes the queue's held backlog (signals.py ``held_metrics``), which the board passes on
to the engine replicas for the autoscaler.

Rate limits are split across ingress replicas: with K ingress replicas, each holds every token
bucket (global, per-tenant default, each tenant's own) at rate/K and burst/K. Ray Serve's proxy
spreads HTTP requests over ingress replicas evenly, so the cluster admits about what one bucket
at the full rate would; K = 1 (the default) is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from tokenizers import Tokenizer

from tierserve.admission import AdmissionController
from tierserve.api.settings import ServerSettings
from tierserve.api.state import ServerState
from tierserve.chat.prompt import ChatPrompter
from tierserve.chat.template import load_chat_template
from tierserve.clock import WallClock
from tierserve.cluster.fleet import FleetView
from tierserve.cluster.ingress_queue import IngressQueue
from tierserve.cluster.observe import IngressMetrics
from tierserve.cluster.remote_engine import RemoteEngine
from tierserve.config import AdmissionConfig, BucketConfig
from tierserve.core.limits import RequestLimits
from tierserve.engine.args import EngineArgs
from tierserve.model.tokenizer import ChatTokenizer
from tierserve.server import build_app, tenant_registry

log = logging.getLogger("tierserve.cluster")


class DropResponseHeader:
    """ASGI middleware: responses leave without the header `name`."""

    def __init__(self, app, name: bytes) -> None:
        self.app, self.name = app, name.lower()

    async def __call__(self, scope, receive, send):
        async def without(msg):
            if msg["type"] == "http.response.start":
                headers = [(k, v) for k, v in msg.get("headers", ()) if k.lower() != self.name]
                msg = {**msg, "headers": headers}
            await send(msg)

        return await self.app(scope, receive, without if scope["type"] == "http" else send)


def is_replica_failure(exc: BaseException) -> bool:
    """A stream broke because its replica's process is gone or unreachable."""
    return isinstance(exc, RayActorError | ActorDiedError | ActorUnavailableError)


def split_bucket(b: BucketConfig | None, k: int) -> BucketConfig | None:
    return None if b is None else BucketConfig(b.rate / k, b.burst / k)


def split_admission(cfg: AdmissionConfig, k: int) -> AdmissionConfig:
    """This ingress replica's share of the cluster's rate limits (see the module docstring)."""
    return dataclasses.replace(
        cfg,
        global_bucket=split_bucket(cfg.global_bucket, k),
        tenant_bucket=split_bucket(cfg.tenant_bucket, k),
    )


@serve.ingress()
class Ingress:
    async def __init__(
        self,
        engine: Any,
        board: Any,
        args: EngineArgs,
        settings: ServerSettings,
        ingress_replicas: int = 1,
        view_period_s: float = 0.25,
        ingress_queue: bool = False,
    ) -> None:
        spec = await engine.spec.remote()
        tokenizer = ChatTokenizer(
            Tokenizer.from_str(spec["tokenizer"]),
            spec["chat_template"],
            spec["bos_token"],
            spec["eos_token"],
            spec["add_bos"],
        )
        limits = RequestLimits(
            **{k: tuple(v) if isinstance(v, list) else v for k, v in spec["limits"].items()}
        )
        template = load_chat_template(settings.chat_template) if settings.chat_template else None
        clock = WallClock()
        streaming = engine.options(stream=True)
        self.remote = RemoteEngine(
            lambda payload: streaming.generate.remote(payload),
            limits,
            clock,
            IngressMetrics(lambda: self.remote.view.metrics, self._ingress_queued),
            is_replica_failure,
            queue=IngressQueue() if ingress_queue else None,
        )
        k = max(1, ingress_replicas)
        admission = AdmissionController(
            split_admission(args.admission, k), self.remote, clock, args.priorities
        )
        tenants = tenant_registry(settings)
        for t in tenants.tenants.values():
            if t.bucket is not None:
                admission.set_tenant_bucket(t.name, split_bucket(t.bucket, k))
        self.state = ServerState(
            engine=self.remote,
            tokenizer=tokenizer,
            admission=admission,
            tenants=tenants,
            metrics=self.remote.metrics,
            settings=settings,
            max_model_len=limits.max_model_len,
            eos_token_ids=tuple(spec["eos_token_ids"]),
            chat=ChatPrompter(tokenizer, template),
        )
        self._board = board
        self._period = view_period_s
        self._id = serve.get_replica_context().replica_id.unique_id
        self._slas = args.priorities.ttft_sla_s
        await self._refresh()
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    def _ingress_queued(self, priority) -> int:
        queue = self.remote.queue
        return 0 if queue is None else queue.depth(priority)

    def __serve_build_asgi_app__(self):
        app = build_app(self.state)
        # Serve's proxy sets x-request-id (its own id) on every response: ours would be a
        # second one. The body's `id` stays tierserve's.
        app.add_middleware(DropResponseHeader, name=b"x-request-id")
        return app

    async def _refresh(self) -> None:
        queue = self.remote.queue
        if queue is not None:  # the held backlog, for the engine replicas' autoscaling stats
            await self._board.report_held.remote(self._id, queue.held_metrics(self._slas))
        view = FleetView.from_dict(await self._board.view.remote(), time.monotonic())
        self.remote.set_view(view)
        self.remote.metrics.replicas.set(view.num_replicas)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._period)
            try:
                await self._refresh()
            except Exception as exc:  # the board restarting: keep the last view
                log.warning("fleet board view failed: %r", exc)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._poller.cancel()
