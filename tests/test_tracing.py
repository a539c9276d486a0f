"""Request tracing (issue 42 item 9, `--otlp-traces-endpoint`): a real server exports one span
per request over OTLP/HTTP to an in-process collector, which decodes them with OpenTelemetry's
own protobuf messages; a bad endpoint is one line and exit status 2 before the model loads."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from tests.server_utils import running_server, small_engine_args
from tests.test_serve_start import run_cli
from tierserve.api.settings import ServerSettings
from tierserve.engine.builder import build_engine
from tierserve.metrics.tracing import TracingUnavailable, traces_url

pb = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    reason="the tracing extra is not installed",
)


class Collector:
    """An OTLP/HTTP traces receiver: every span it was sent, as {name, attributes, times}."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.resources: list[dict] = []
        spans, resources = self.spans, self.resources

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                req = pb.ExportTraceServiceRequest()
                req.ParseFromString(body)
                for rs in req.resource_spans:
                    resources.append({a.key: _value(a.value) for a in rs.resource.attributes})
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            spans.append(
                                {
                                    "name": s.name,
                                    "attrs": {a.key: _value(a.value) for a in s.attributes},
                                    "start": s.start_time_unix_nano,
                                    "end": s.end_time_unix_nano,
                                    "status": s.status.code,
                                    "trace_id": s.trace_id.hex(),
                                    "parent_id": s.parent_span_id.hex(),
                                }
                            )
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()
                self.wfile.write(pb.ExportTraceServiceResponse().SerializeToString())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, n: int, timeout_s: float = 15.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while len(self.spans) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.spans


def _value(v):
    return getattr(v, v.WhichOneof("value"))


def test_the_endpoint_is_an_otlp_http_url_and_grpc_is_refused():
    assert traces_url("localhost:4318") == "http://localhost:4318/v1/traces"
    assert traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert traces_url("https://c.example/otel/v1/traces") == "https://c.example/otel/v1/traces"
    for bad in ("grpc://c:4317", "http://c:4317", "http://:4318"):
        with pytest.raises(TracingUnavailable):
            traces_url(bad)


@pytest.mark.model
def test_a_server_sends_one_span_per_request_with_its_class_and_times():
    collector = Collector()
    built = build_engine(small_engine_args())
    settings = ServerSettings(otlp_traces_endpoint=collector.url)
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with running_server(built, settings) as (url, _):
        for tier in ("realtime", "batch"):
            headers = {"x-request-tier": tier}
            if tier == "batch":  # a caller's W3C trace context: the span joins that trace
                headers["traceparent"] = f"00-{trace_id}-{parent_id}-01"
            r = httpx.post(
                f"{url}/v1/completions",
                json={"prompt": "The sea is", "max_tokens": 4, "ignore_eos": True},
                headers=headers,
                timeout=60,
            )
            assert r.status_code == 200, r.text
        spans = collector.wait_for(2)
    assert len(spans) == 2
    assert all(res.get("service.name") == "SmolLM2-135M-Instruct" for res in collector.resources)
    by_class = {s["attrs"]["tierserve.class"]: s for s in spans}
    assert set(by_class) == {"P0", "P2"}
    for s in spans:
        a = s["attrs"]
        assert s["name"] == "llm_request" and s["status"] != 2  # not ERROR
        assert a["gen_ai.usage.completion_tokens"] == 4 and a["gen_ai.usage.prompt_tokens"] > 0
        assert a["tierserve.finish_reason"] == "length" and a["tierserve.preemptions"] == 0
        assert a["tierserve.tenant"] == "default"
        queue = a["gen_ai.latency.time_in_queue"]
        prefill = a["gen_ai.latency.time_in_model_prefill"]
        decode, e2e = a["gen_ai.latency.time_in_model_decode"], a["gen_ai.latency.e2e"]
        assert queue >= 0 and prefill > 0 and decode > 0
        assert abs(queue + prefill + decode - e2e) < 1e-6
        assert a["gen_ai.latency.time_to_first_token"] == pytest.approx(queue + prefill)
        assert 0 < s["end"] - s["start"] == pytest.approx(e2e * 1e9, rel=1e-3, abs=1e4)
        assert abs(s["end"] / 1e9 - time.time()) < 60  # wall-clock time, not the engine's
    assert by_class["P0"]["attrs"]["tierserve.tier"] == "realtime"
    joined, alone = by_class["P2"], by_class["P0"]
    assert joined["trace_id"] == trace_id and joined["parent_id"] == parent_id
    assert alone["trace_id"] != trace_id and alone["parent_id"] == ""


def test_a_bad_endpoint_is_one_line_and_status_2_before_the_model_loads():
    r = run_cli("serve", "--otlp-traces-endpoint", "grpc://collector:4317")
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "gRPC" in lines[0] and "4318" in lines[0], r.stderr


@pytest.mark.model
def test_a_span_that_cannot_be_made_never_stops_the_engine(monkeypatch):
    """The tracer runs on the engine thread: an exception there is logged, not raised (it
    once crashed the engine thread)."""
    from tierserve.metrics.tracing import RequestTracer

    def broken(self, info):
        raise RuntimeError("no span")

    monkeypatch.setattr(RequestTracer, "record", broken)
    built = build_engine(small_engine_args())
    settings = ServerSettings(otlp_traces_endpoint=Collector().url)
    with running_server(built, settings) as (url, _):
        for _ in range(2):
            r = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
            assert r.status_code == 200, r.text


def test_replicas_with_tracing_are_refused_not_silently_untraced():
    r = run_cli("serve", "--replicas", "2", "--otlp-traces-endpoint", "http://c:4318")
    assert r.returncode == 2 and "do not export spans" in r.stderr, r.stderr
