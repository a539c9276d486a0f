"""The engine deployment: each Ray Serve replica runs one ``AsyncEngine`` with its own executor
and KV cache, exactly as the single-process server does.

What a replica exports, all built on its engine thread when the engine publishes a snapshot
(after every step, command batch and idle tick, at most every ``STATS_EVERY_S``), and handed to
the event loop as one immutable ``_Report`` by a reference swap:

* ``record_routing_stats`` (Ray Serve polls it for the request router): ``ReplicaStats``;
* ``record_autoscaling_stats`` (Ray Serve's autoscaler): per-class wait ratio and SLA
  attainment (``signals.py``), and the ingress's held backlog, as the fleet board last
  replied to this replica's report (the same fleet-wide figures on every replica);
* to the fleet board, pushed every ``report_period_s``: the queue load the ingress's admission
  control reads (with ``--sla-admission on``, the TTFT predictor's inputs too), the same
  autoscaling metrics, and, about once a second, the replica's Prometheus text.

``generate`` streams a request's chunks (wire.py): ``hello`` first (this replica and the reason
the router chose it), then the engine's deltas. A cancelled stream (the ingress gave up, the
client left) aborts the request, which frees its KV blocks. A dead engine thread fails the
health check, and Serve replaces the replica. Under `--tensor-parallel-size` N a replica is one
engine of N processes (its placement group: launch.py): a lost worker stops its engine, so the
same health check replaces the whole replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

from ray import serve

from tierserve.cluster import wire
from tierserve.cluster.fleet import ReplicaLoad
from tierserve.cluster.signals import WINDOW_S, ClassSignals, ClassWindow, with_held
from tierserve.engine.args import EngineArgs
from tierserve.engine.async_engine import AsyncEngine, EngineDeadError
from tierserve.engine.builder import build_engine_off_main
from tierserve.engine.core import StepStats
from tierserve.engine.events import Added, EngineEvent, ErrorKind, Finished, FirstToken, StreamDelta
from tierserve.engine.load import LateRequestCheck
from tierserve.engine.snapshot import EngineSnapshot
from tierserve.host.memory import freeze_heap
from tierserve.metrics import Metrics
from tierserve.metrics.recorder import DEFAULT_MODEL_NAME
from tierserve.routing import ReplicaStats, replica_stats

log = logging.getLogger("tierserve.cluster")

STATS_EVERY_S = 0.05
METRICS_EVERY_S = 1.0


@dataclass(frozen=True)
class _Report:
    stats: ReplicaStats
    signals: ClassSignals
    load: ReplicaLoad


class EngineReplica:
    async def __init__(
        self,
        args: EngineArgs,
        board: Any,
        report_period_s: float = 0.25,
        threads: int = 1,
        model_name: str = DEFAULT_MODEL_NAME,
        tenants: tuple[str, ...] = (),
        signal_window_s: float = WINDOW_S,
    ) -> None:
        import torch

        torch.set_num_threads(max(1, threads))
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.built = built = build_engine_off_main(args)  # see its docstring
        core = built.engine
        self.metrics = Metrics(args.priorities, model_name, tenants)  # the served name
        self.window = ClassWindow(  # engine thread
            args.priorities.ttft_sla_s, signal_window_s, seats=args.max_num_seqs
        )
        self.engine = AsyncEngine(core, built.tokenizer)
        adm = args.admission
        # The ingress's fleet SLA admission reads each replica's predictor inputs (the board
        # report's `ttft`); the re-check of waiting requests runs here, as in the server.
        self.engine.publish_load = adm.sla_admission
        if adm.sla_admission:
            self.engine.recheck = LateRequestCheck(
                args.priorities, adm.sla_margin, adm.sla_recheck_s
            )
        self._last_stats = 0.0  # engine thread only
        self._make_report(self.engine.snapshot)
        # Metrics hear every event (TTFT, inter-token latency, prompt tokens), as in the single
        # server; the class window hears added / first token / finished.
        self.engine.set_observers(self._on_event, self._on_step, self._on_snapshot)
        freeze_heap()  # before the engine thread runs: no full collection walks the model
        self.engine.start()
        self._board = board
        self._period = report_period_s
        self._held: dict[str, float] = {}  # the board's last reply (event loop only)
        self._reporter = asyncio.get_running_loop().create_task(self._report_loop())
        log.info("engine replica %s ready", self.replica_id)

    # -- the engine thread ----------------------------------------------------------------------
    def _on_event(self, event: EngineEvent) -> None:
        self.metrics.on_event(event)
        match event:
            case Added(info):
                self.window.on_added(info.request_id, info.priority, info.arrival_time)
            case FirstToken(info, at):
                self.window.on_first_token(info.request_id, info.priority, event.ttft, at)
            case Finished(info):
                end = info.finished_time
                end = self.engine.clock.now() if end is None else end
                self.window.on_finished(info.request_id, end)

    def _on_step(self, stats: StepStats) -> None:
        self.metrics.on_step(stats, self.built.executor.last_swap_seconds)

    def _on_snapshot(self, snap: EngineSnapshot) -> None:
        self.metrics.on_snapshot(snap)
        if snap.taken_at - self._last_stats >= STATS_EVERY_S:
            self._make_report(snap)

    def _make_report(self, snap: EngineSnapshot) -> None:
        self._last_stats = snap.taken_at
        self.report = _Report(  # one reference swap; the event loop reads it whole
            replica_stats(snap.scheduler, self.replica_id),
            self.window.summary(snap.taken_at),
            ReplicaLoad.of(snap, with_ttft=self.engine.publish_load),
        )

    # -- Ray Serve hooks (event loop) ---------------------------------------------------------
    async def record_routing_stats(self) -> dict[str, Any]:
        return self.report.stats.to_dict()

    async def record_autoscaling_stats(self) -> dict[str, float]:
        return self._autoscaling_metrics()

    def _autoscaling_metrics(self) -> dict[str, float]:
        """This replica's class signals and the ingress's held backlog (signals.py)."""
        return with_held(self.report.signals, self._held)

    async def check_health(self) -> None:
        if not self.engine.is_alive():
            raise RuntimeError(f"engine thread is not running: {self.engine.error!r}")

    async def spec(self) -> dict[str, Any]:
        """What the ingress needs to prepare requests without a model of its own."""
        tok = self.built.tokenizer
        return {
            "tokenizer": tok.tokenizer.to_str(),
            "chat_template": tok.chat_template,
            "bos_token": tok.bos_token,
            "eos_token": tok.eos_token,
            "add_bos": tok.add_bos,
            "limits": asdict(self.engine.limits),
            "eos_token_ids": list(self.built.model_config.eos_token_ids),
        }

    async def generate(self, payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        req = wire.request_from_payload(payload, self.engine.clock.now())
        reason, rank = wire.chosen_reason(payload, self.replica_id)
        try:
            stream = self.engine.submit(req)  # in the engine's command queue from here on
        except EngineDeadError as exc:
            yield wire.hello(self.replica_id, reason, rank)
            yield wire.delta_chunk(
                StreamDelta(
                    finished=True,
                    finish_reason="error",
                    error=str(exc),
                    error_kind=ErrorKind.ENGINE,
                )
            )
            return
        # Cancelled anywhere, even before its deltas began: the exit frees its KV now.
        async with stream:
            yield wire.hello(self.replica_id, reason, rank)
            async for d in stream.deltas():
                yield wire.delta_chunk(d)

    async def _report_loop(self) -> None:
        last_metrics = 0.0
        while True:
            now = time.monotonic()
            text = None
            if now - last_metrics >= METRICS_EVERY_S:
                text, last_metrics = self.metrics.render().decode(), now
            try:
                held = await self._board.report.remote(
                    self.replica_id,
                    self.report.load.to_dict(),
                    text,
                    self._autoscaling_metrics(),
                )
                self._held = dict(held or {})  # a new dict: a reference swap
            except Exception as exc:  # the board restarting: report again next period
                log.warning("fleet board report failed: %r", exc)
                last_metrics = 0.0
            await asyncio.sleep(self._period)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._reporter.cancel()
            self.engine.shutdown()
            self.built.executor.close()  # (tensor-parallel workers)
