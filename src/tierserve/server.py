"""Build and run the HTTP server: engine thread + admission + tenants + metrics + FastAPI, under
uvicorn.

SIGTERM (or Ctrl-C): stop admitting (new connections are refused, a request that slips in gets
503 with Retry-After), let in-flight requests finish for the grace period, then end the rest
with an error (see api/drain.py). Exit status: 0 after a clean drain, EXIT_REQUESTS_CUT when
requests had to be ended."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from functools import partial

import uvicorn

from tierserve.admission import AdmissionController
from tierserve.api.app import create_app
from tierserve.api.connection import guarded_protocol
from tierserve.api.drain import FLUSH_S, drain
from tierserve.api.settings import ServerSettings
from tierserve.api.starting import StartingGate
from tierserve.api.state import ServerState
from tierserve.api.tenancy import TenantRegistry, tenant_registry
from tierserve.batch.routes import mount_batch
from tierserve.chat.prompt import ChatPrompter
from tierserve.chat.template import load_chat_template
from tierserve.engine.args import EngineArgs
from tierserve.engine.async_engine import AsyncEngine
from tierserve.engine.builder import (
    BuiltEngine,
    build_engine_off_main,
    engine_thread_start,
    save_predictor,
)
from tierserve.engine.core import StepStats
from tierserve.engine.load import LateRequestCheck
from tierserve.executor.base import ExecutorLost
from tierserve.executor.draft_loader import BadDraftModel
from tierserve.host.memory import fix_mmap_threshold, freeze_heap
from tierserve.host.threads import ThreadChoice, choose_threads
from tierserve.metrics import Metrics
from tierserve.metrics.tracing import RequestTracer, TracingUnavailable, check
from tierserve.model.loader import ModelNotFound
from tierserve.model.registry import UnsupportedArchitecture
from tierserve.model.sharding import ShardingError

log = logging.getLogger("tierserve.server")

EXIT_REQUESTS_CUT = 3  # the grace period ended with requests still running
EXIT_BAD_SETTINGS = 2  # as for every settings error found before the model loads
EXIT_ENGINE_LOST = 1  # a tensor-parallel worker died or hung: restart the whole server


def build_app(state: ServerState):
    """The HTTP app: the core API, plus the Batch API (/v1/files, /v1/batches) where the
    settings name its database."""
    return create_app(state, mounts=[mount_batch])


def build_state(
    args: EngineArgs,
    settings: ServerSettings,
    built: BuiltEngine | None = None,
    tenants: TenantRegistry | None = None,
    on_stage=None,
) -> ServerState:
    tenants = tenant_registry(settings) if tenants is None else tenants
    if built is None:  # (off the main thread: the engine thread's team stays alone)
        built = build_engine_off_main(args, on_stage=on_stage or (lambda _text: None))
    core = built.engine
    sched = core.scheduler
    metrics = Metrics(args.priorities, settings.served_model_names[0], tenants.tenants)
    engine = AsyncEngine(core, built.tokenizer)
    engine.publish_load = args.admission.sla_admission  # only SLA admission reads it
    # Admission runs on the event loop and reads the engine only through its snapshot.
    admission = AdmissionController(args.admission, engine.view, core.clock, args.priorities)
    for t in tenants.tenants.values():
        if t.bucket is not None:
            admission.set_tenant_bucket(t.name, t.bucket)

    def on_step(stats: StepStats) -> None:
        metrics.on_step(stats, built.executor.last_swap_seconds)

    on_event = metrics.on_event
    on_stop = partial(save_predictor, built)
    close = getattr(built.executor, "close", None)  # (tensor-parallel workers)
    if close is not None:
        on_stop = _both(on_stop, close)
    if settings.otlp_traces_endpoint:  # one span per request (metrics/tracing.py)
        tracer = RequestTracer(
            settings.otlp_traces_endpoint, settings.served_model_names[0], core.clock
        )
        on_event, on_stop = _both(on_event, tracer.on_event), _both(on_stop, tracer.shutdown)
        log.info("request tracing: one span per request to %s (OTLP/HTTP)", tracer.url)
    engine.set_observers(on_event, on_step, metrics.on_snapshot)
    engine.on_thread_start = partial(engine_thread_start, built.torch_threads)
    engine.on_thread_stop = on_stop
    adm = args.admission
    if adm.sla_admission:  # the re-check of waiting requests, on the engine thread
        engine.recheck = LateRequestCheck(args.priorities, adm.sla_margin, adm.sla_recheck_s)
    metrics.on_snapshot(engine.snapshot)  # gauges are right before the first request
    template = load_chat_template(settings.chat_template) if settings.chat_template else None
    return ServerState(
        engine=engine,
        tokenizer=built.tokenizer,
        admission=admission,
        tenants=tenants,
        metrics=metrics,
        settings=settings,
        max_model_len=sched.config.max_model_len,
        eos_token_ids=built.model_config.eos_token_ids,
        chat=ChatPrompter(built.tokenizer, template),
    )


def _both(first, second):
    """A callback calling `first`, then `second`, with the same arguments."""

    def call(*a):
        first(*a)
        second(*a)

    return call


def startup_line(state: ServerState, args: EngineArgs, threads: ThreadChoice) -> str:
    """What is being served, in one line: model, architecture, dtype, context, KV cache,
    threads."""
    core = state.engine.core
    cache = core.scheduler.kv.config
    executor = core.executor
    model = getattr(executor, "model", None)
    dtype = str(getattr(model, "dtype", "?")).removeprefix("torch.")
    arch = getattr(getattr(model, "config", None), "architecture", "?")
    source = args.model or "the embedded model"
    return (
        f"serving {state.settings.served_model_names[0]} ({source}): architecture {arch}, "
        f"dtype {dtype}, context {state.max_model_len} tokens, KV cache {cache.num_blocks} "
        f"blocks of {cache.block_size} tokens, {threads.describe()}"
    )


def feature_lines(args: EngineArgs) -> list[str]:
    """One start-up line for each feature that changes what a request meets, when it is on
    (issue 42: speculation was on with nothing to show it)."""
    out = []
    if args.tensor_parallel_size > 1:
        out.append(
            f"tensor parallel: the model split over {args.tensor_parallel_size} processes "
            "(KV sizes per rank)"
        )
    spec = args.speculative_config
    if spec is not None:
        drafter = f"draft model {spec.model}" if spec.method == "draft_model" else "n-gram lookup"
        classes = ", ".join(f"P{c}" for c in spec.classes)
        out.append(
            f"speculative decoding: {drafter}, up to {spec.num_speculative_tokens} drafts, "
            f"for {classes} whenever it pays (the others only alone)"
        )
    if args.predictive:
        out.append(f"predictive scheduling: {', '.join(args.predictive)}")
    adm = args.admission
    if adm.sla_admission:
        slas = ", ".join(
            f"P{i} {s:g} s" for i, s in enumerate(args.priorities.ttft_sla_s) if s is not None
        )
        out.append(f"SLA admission: on (margin {adm.sla_margin:g}; TTFT targets {slas})")
    if any(args.prefix_retention):
        kept = " ".join(f"{r:g}" for r in args.prefix_retention)
        out.append(f"prefix-cache retention by class P0..P3: {kept} (pools beyond LRU)")
    if not args.enable_prefix_caching:
        out.append("prefix caching: off")
    return out


def uvicorn_config(app, settings: ServerSettings) -> uvicorn.Config:
    """uvicorn's settings for `app`: the address, the slow-client limits (api/connection.py),
    and a graceful-shutdown timeout later than our own drain's deadline."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        http=guarded_protocol(
            settings.header_timeout_s, settings.body_timeout_s, settings.max_connections
        ),
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s + FLUSH_S),
    )


class _Server(uvicorn.Server):
    """uvicorn, draining our way: `drain` runs beside uvicorn's graceful shutdown and ends what
    is left at the grace deadline, before uvicorn's own (later) timeout would cancel it."""

    def __init__(self, config: uvicorn.Config, state: ServerState | None = None) -> None:
        super().__init__(config)
        self._state = state  # (None while the engine is still being built)
        self.requests_cut = 0

    def attach(self, state: ServerState) -> None:
        self._state = state

    def handle_exit(self, sig, frame) -> None:
        if self._state is not None:
            self._state.draining = True  # from this instant new requests get 503 + Retry-After
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        if self._state is None:  # stopped while starting: nothing is in flight
            await super().shutdown(sockets)
            return
        task = asyncio.create_task(drain(self._state, self._state.settings.shutdown_grace_s))
        try:
            await super().shutdown(sockets)
        finally:
            if not task.done():  # uvicorn finished first: nothing was left in flight
                task.cancel()
            else:
                self.requests_cut = task.result()


def _memory_settings() -> None:
    """$TIERSERVE_MMAP_THRESHOLD_MIB fixes glibc's mmap threshold (tierserve.host.memory): ~100 MiB
    less peak RSS, at ~25% of prefill speed on this VM's page faults (docs/performance.md), so
    it is opt-in."""
    raw = os.environ.get("TIERSERVE_MMAP_THRESHOLD_MIB", "").strip()
    if not raw:
        return
    try:
        mib = int(raw)
    except ValueError:
        msg = f"TIERSERVE_MMAP_THRESHOLD_MIB must be an integer (MiB), got {raw!r}"
        raise SystemExit(msg) from None
    if fix_mmap_threshold(mib << 20):
        log.info("glibc mmap threshold fixed at %d MiB", mib)


def _exit_when_lost(
    state: ServerState, server: uvicorn.Server, status: list[int], grace_s: float = 1.0
) -> None:
    """A tensor-parallel engine that lost a worker serves no more: once the engine thread has
    ended every stream with an error (and `/health` says unhealthy), stop the server with
    status EXIT_ENGINE_LOST, so that a supervisor restarts it."""

    def run() -> None:
        while not server.should_exit:
            time.sleep(0.2)
            err = state.engine.error
            if isinstance(err, ExecutorLost):
                time.sleep(grace_s)  # the streams' error events reach their clients
                log.error("exiting with status %d: %s", EXIT_ENGINE_LOST, err)
                state.engine.core.executor.close()
                status.append(EXIT_ENGINE_LOST)
                server.should_exit = True
                return

    threading.Thread(target=run, name="tierserve-exit-when-lost", daemon=True).start()


def _progress_lines(gate: StartingGate, server: uvicorn.Server, every_s: float = 5.0) -> None:
    """A log line every `every_s` seconds while the engine is being built."""

    def beat() -> None:
        while not server.should_exit and gate.app is None and gate.error is None:
            time.sleep(every_s)
            if gate.app is None and gate.error is None and not server.should_exit:
                log.info("starting (%.0f s): %s", gate.elapsed_s, gate.stage)

    threading.Thread(target=beat, name="tierserve-start-progress", daemon=True).start()


def serve(args: EngineArgs, settings: ServerSettings, tenants: TenantRegistry | None = None) -> int:
    """Run until SIGTERM/SIGINT; return the exit status (0, or EXIT_REQUESTS_CUT)."""
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    _memory_settings()
    threads = choose_threads(args.cpu_threads)
    if threads.warning():
        log.warning("%s", threads.warning())
    args = replace(args, cpu_threads=threads.threads)
    if settings.otlp_traces_endpoint:  # before the model loads: one line, status 2
        try:
            check(settings.otlp_traces_endpoint)
        except TracingUnavailable as e:
            print(f"tierserve serve: {e}", file=sys.stderr, flush=True)
            return EXIT_BAD_SETTINGS
    status: list[int] = []  # the exit status of a start that failed
    why: list[str] = []  # and its one line, for bad settings

    def build(stage):  # on a worker thread, behind the open port (api/starting.py)
        state = build_state(args, settings, tenants=tenants, on_stage=stage)
        log.info("%s", startup_line(state, args, threads))
        for line in feature_lines(args):
            log.info("%s", line)
        mode = state.tenants.mode
        if settings.tenants_file and settings.api_key:
            log.warning(
                "--api-key (or $TIERSERVE_API_KEY) is ignored: the tenants file has the keys"
            )
        if mode == "open":
            log.warning(
                "single-tenant mode: no tenants file and no API key; anyone may use any tier"
            )
        else:
            log.info("auth mode: %s (%d tenants)", mode, len(state.tenants.tenants))
        server.attach(state)
        if hasattr(state.engine.core.executor, "watch"):
            _exit_when_lost(state, server, status)
        app = build_app(state)
        freeze_heap()
        return app

    def failed(exc: BaseException) -> None:
        if isinstance(exc, ModelNotFound | BadDraftModel | UnsupportedArchitecture | ShardingError):
            # found only now (the embedded model's package missing, a draft model that cannot
            # serve this one, an architecture not in the registry, a model that does not split
            # --tensor-parallel-size ways): one line, as the last
            status.append(EXIT_BAD_SETTINGS)
            why.append(str(exc))
        elif isinstance(exc, ExecutorLost):  # a tensor-parallel worker could not start
            status.append(EXIT_ENGINE_LOST)
            why.append(str(exc))
        else:
            log.error("the engine could not start", exc_info=exc)
            status.append(1)
        server.should_exit = True

    gate = StartingGate(build)
    gate.on_failure = failed
    config = uvicorn_config(gate, settings)
    # After its graceful shutdown uvicorn re-raises the signal under the handler installed
    # before it: make that a no-op, so that the exit status is the one returned here.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda _sig, _frame: None)
    server = _Server(config)
    _progress_lines(gate, server)
    server.run()
    if why:
        print(f"tierserve serve: {why[0]}", file=sys.stderr, flush=True)
    if status:
        return status[0]
    if server.requests_cut:
        log.warning(
            "exiting with status %d: %d request(s) cut", EXIT_REQUESTS_CUT, server.requests_cut
        )
        return EXIT_REQUESTS_CUT
    return 0
