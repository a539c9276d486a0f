"""Request tracing (`--otlp-traces-endpoint`, vLLM's flag): one OpenTelemetry span per request,
exported over OTLP/HTTP (protobuf) to a collector, so that an operator can see why one request
waited: its class and tenant, its queue wait, prefill and decode times, its preemptions and how
it ended.

The span is made when the request finishes (the engine's `Finished` event, on the engine
thread), from the engine's own timestamps: it starts at the request's arrival (the first byte
of its headers, `api/door.py`) and ends when it finished. Attributes follow vLLM's (the
``gen_ai.*`` names of OpenTelemetry's GenAI conventions) plus tierserve's own:

* ``gen_ai.request.id``, ``gen_ai.response.model``, ``gen_ai.usage.prompt_tokens``,
  ``gen_ai.usage.completion_tokens``;
* ``gen_ai.latency.time_in_queue`` (arrival to first scheduled), ``gen_ai.latency.
  time_to_first_token``, ``gen_ai.latency.time_in_model_prefill`` (first scheduled to first
  token), ``gen_ai.latency.time_in_model_decode`` (first token to finish),
  ``gen_ai.latency.e2e``;
* ``tierserve.class`` (P0-P3), ``tierserve.tier``, ``tierserve.tenant``,
  ``tierserve.preemptions``, ``tierserve.finish_reason``, ``tierserve.predicted_ttft`` (SLA
  admission's prediction, where it made one), and the error message of a failed request (the
  span's status is then ERROR).

A request with a W3C ``traceparent`` header gets a span in that trace, a child of the caller's
span (as vLLM does); without one, a trace of its own.

Spans are batched and sent by the SDK's own thread (`BatchSpanProcessor`); `shutdown` sends
what is left (the server calls it when it stops). The exporter needs the packages of the
``tracing`` extra: ``pip install 'tierserve[tracing]'``."""

from __future__ import annotations

import logging
import time
from urllib.parse import urlsplit

from tierserve.clock import Clock
from tierserve.engine.events import EngineEvent, Finished, RequestInfo

OTLP_HTTP_PATH = "/v1/traces"
log = logging.getLogger(__name__)


class TracingUnavailable(RuntimeError):
    """The OpenTelemetry packages are not installed, or the endpoint cannot be used."""


def traces_url(endpoint: str) -> str:
    """The collector's OTLP/HTTP traces URL from `endpoint`: a URL with the path kept, or
    ``/v1/traces`` added where it has none; ``host:port`` means ``http://host:port/v1/traces``.
    gRPC (``grpc://``, the 4317 port) is refused with what to use instead."""
    text = endpoint.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise TracingUnavailable(
            f"--otlp-traces-endpoint {endpoint!r}: OTLP over gRPC is not supported; give the "
            "collector's OTLP/HTTP endpoint (e.g. http://localhost:4318/v1/traces)"
        )
    if not parts.hostname:
        raise TracingUnavailable(f"--otlp-traces-endpoint {endpoint!r}: no host")
    if parts.port == 4317:
        raise TracingUnavailable(
            f"--otlp-traces-endpoint {endpoint!r}: 4317 is OTLP's gRPC port; tierserve exports "
            "OTLP/HTTP (the collector's port 4318)"
        )
    path = parts.path if parts.path not in ("", "/") else OTLP_HTTP_PATH
    return f"{parts.scheme}://{parts.netloc}{path}"


def check(endpoint: str) -> str:
    """The traces URL, once the endpoint and the packages are known to do (else
    TracingUnavailable, one line): the server checks before it loads the model."""
    url = traces_url(endpoint)
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as e:
        raise TracingUnavailable(
            f"--otlp-traces-endpoint needs OpenTelemetry's SDK and OTLP/HTTP exporter "
            f"({e.name} is missing): pip install 'tierserve[tracing]'"
        ) from None
    return url


class RequestTracer:
    def __init__(
        self, endpoint: str, service_name: str, clock: Clock, export_delay_s: float = 1.0
    ) -> None:
        url = check(endpoint)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.url = url
        self.service_name = service_name
        self._kind, self._status, self._code = SpanKind.SERVER, Status, StatusCode
        self._propagator = TraceContextTextMapPropagator()
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=url, timeout=10),
                schedule_delay_millis=int(export_delay_s * 1000),
            )
        )
        self.tracer = self.provider.get_tracer("tierserve")
        # The engine's clock to wall-clock nanoseconds, as OTLP wants them.
        self._offset = time.time() - clock.now()

    def _ns(self, t: float) -> int:
        return int((t + self._offset) * 1e9)

    def on_event(self, event: EngineEvent) -> None:
        """An engine event (engine thread): a finished request becomes a span. Tracing never
        stops the engine: a span that cannot be made is logged and dropped."""
        if isinstance(event, Finished):
            try:
                self.record(event.request)
            except Exception:
                log.exception("request tracing: no span for %s", event.request.request_id)

    def record(self, info: RequestInfo) -> None:
        end = info.finished_time if info.finished_time is not None else info.arrival_time
        attrs: dict[str, object] = {
            "gen_ai.request.id": info.request_id,
            "gen_ai.response.model": self.service_name,
            "gen_ai.usage.prompt_tokens": info.num_prompt_tokens,
            "gen_ai.usage.completion_tokens": info.num_output_tokens,
            "gen_ai.latency.e2e": end - info.arrival_time,
            "tierserve.class": info.priority.label,
            "tierserve.tier": info.priority.tier,
            "tierserve.tenant": info.tenant,
            "tierserve.preemptions": info.num_preemptions,
            "tierserve.finish_reason": info.finish_reason or "unknown",
        }
        sched, first = info.first_scheduled_time, info.first_token_time
        if sched is not None:
            attrs["gen_ai.latency.time_in_queue"] = sched - info.arrival_time
        if first is not None:
            attrs["gen_ai.latency.time_to_first_token"] = first - info.arrival_time
            attrs["gen_ai.latency.time_in_model_decode"] = end - first
            if sched is not None:
                attrs["gen_ai.latency.time_in_model_prefill"] = first - sched
        if info.predicted_ttft is not None:
            attrs["tierserve.predicted_ttft"] = info.predicted_ttft
        parent = None  # the caller's trace, where its traceparent header named one
        if info.trace_parent:
            parent = self._propagator.extract({"traceparent": info.trace_parent})
        span = self.tracer.start_span(
            "llm_request",
            context=parent,
            kind=self._kind,
            start_time=self._ns(info.arrival_time),
            attributes=attrs,
        )
        if info.error:
            span.set_attribute("tierserve.error", info.error)
            span.set_status(self._status(self._code.ERROR, info.error))
        span.end(end_time=self._ns(end))

    def shutdown(self) -> None:
        """Send the spans still batched, then stop the exporter's thread."""
        self.provider.shutdown()
