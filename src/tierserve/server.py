"""Build and run the HTTP server: engine thread + admission + tenants + metrics + FastAPI, under
uvicorn. SIGTERM: stop admitting, let in-flight requests finish for a grace period, abort the
rest, exit 0."""

from __future__ import annotations

import logging
import signal
import sys

import uvicorn

from tierserve.admission import AdmissionController
from tierserve.api.app import create_app
from tierserve.api.settings import ServerSettings
from tierserve.api.state import ServerState
from tierserve.api.tenancy import TenantRegistry
from tierserve.engine.args import EngineArgs
from tierserve.engine.async_engine import AsyncEngine
from tierserve.engine.builder import BuiltEngine, build_engine
from tierserve.memory import fix_mmap_threshold
from tierserve.metrics import Metrics
from tierserve.request import Request

log = logging.getLogger("tierserve.server")


def tenant_registry(settings: ServerSettings) -> TenantRegistry:
    if settings.tenants_file:
        return TenantRegistry.from_yaml(settings.tenants_file)
    if settings.api_key:
        return TenantRegistry.single_key(settings.api_key)
    return TenantRegistry.open()


def build_state(
    args: EngineArgs, settings: ServerSettings, built: BuiltEngine | None = None
) -> ServerState:
    built = built or build_engine(args)
    core = built.engine
    sched = core.scheduler
    metrics = Metrics(args.priorities, settings.served_model_names[0])
    tenants = tenant_registry(settings)
    engine = AsyncEngine(core, built.tokenizer)
    # Admission runs on the event loop and reads the engine only through its snapshot.
    admission = AdmissionController(args.admission, engine, core.clock, args.priorities)
    for t in tenants.tenants.values():
        if t.bucket is not None:
            admission.set_tenant_bucket(t.name, t.bucket)

    def on_event(kind: str, req: Request) -> None:
        if kind == "finished":
            metrics.on_finished(req)

    def on_step(stats) -> None:
        metrics.on_step(stats, built.executor.last_swap_seconds)
        for prio, reason in stats.preemptions:
            metrics.on_preempted(prio, reason)

    engine.set_observers(on_event, on_step, metrics.on_snapshot, metrics.on_tokens)
    metrics.on_snapshot(engine.snapshot)  # gauges are right before the first request
    return ServerState(
        engine=engine,
        tokenizer=built.tokenizer,
        admission=admission,
        tenants=tenants,
        metrics=metrics,
        settings=settings,
        max_model_len=sched.config.max_model_len,
        eos_token_ids=built.model_config.eos_token_ids,
    )


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self._state = state

    def handle_exit(self, sig, frame) -> None:
        self._state.draining = True  # new requests get 503 while in-flight ones finish
        super().handle_exit(sig, frame)


def serve(args: EngineArgs, settings: ServerSettings) -> int:
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    if fix_mmap_threshold():
        log.debug("glibc mmap threshold fixed at 4 MiB")
    state = build_state(args, settings)
    mode = state.tenants.mode
    if mode == "open":
        log.warning("single-tenant mode: no tenants file and no API key; anyone may use any tier")
    else:
        log.info("auth mode: %s (%d tenants)", mode, len(state.tenants.tenants))
    app = create_app(state)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=int(settings.shutdown_grace_s),
    )
    # uvicorn drains gracefully on SIGTERM, then re-raises the signal under the handler that was
    # installed before it: make that a clean exit, so a graceful stop exits with status 0.
    signal.signal(signal.SIGTERM, lambda sig, frame: sys.exit(0))
    _Server(config, state).run()
    return 0
