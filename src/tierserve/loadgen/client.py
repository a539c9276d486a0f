"""One streamed request to an OpenAI-compatible server, recorded as it happens.

Times come from an injected clock (seconds since the run's origin). A record is filled in place,
so a request cancelled midway (Ctrl-C, drain timeout) keeps what it had received. Every way a
request can go wrong ends in the record (`outcome`, `status`, `error`), never in an exception.

Outcomes: `completed` (the stream ended with `data: [DONE]`), `rejected` (HTTP 429 or 503: the
server refused the load; `Retry-After` kept), `failed` (any other status, a connection error, an
error event, a malformed or truncated stream), `unfinished` (cancelled before it ended).

The HTTP client is aiohttp (`session()`): a load generator must never be the bottleneck, and
httpx's pool topped out near 85 requests/s here where aiohttp served 1,360/s (docs/benchmarks.md).
An `httpx.AsyncClient` is accepted too (the tests' mock transports).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import httpx

from tierserve.loadgen.workload import RequestSpec

Http = aiohttp.ClientSession | httpx.AsyncClient


def session(connect_timeout_s: float = 15.0) -> aiohttp.ClientSession:
    """The load generator's HTTP client: no connection limit, no overall timeout (each request
    has its own, `Endpoint.timeout_s`)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, limit_per_host=0),
        timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout_s),
    )


async def get(http: Http, url: str, headers: dict, timeout_s: float) -> tuple[int, object]:
    """GET `url`: (status, the JSON body or None). Raises ConnectionError when nothing
    answers."""
    try:
        if isinstance(http, aiohttp.ClientSession):
            wait = aiohttp.ClientTimeout(total=timeout_s)
            async with http.get(url, headers=headers, timeout=wait) as r:
                try:
                    return r.status, await r.json(content_type=None)
                except ValueError:
                    return r.status, None
        r = await http.get(url, timeout=timeout_s, headers=headers)
        try:
            return r.status_code, r.json()
        except ValueError:
            return r.status_code, None
    except (aiohttp.ClientError, httpx.HTTPError, TimeoutError) as exc:
        raise ConnectionError(f"{type(exc).__name__}: {exc}") from None


REFUSAL_STATUSES = (429, 503)


@dataclass
class RequestRecord:
    index: int
    priority: int
    arrival: float  # when the request was sent
    prompt_tokens: int
    max_tokens: int
    measured: bool = True  # False: warm-up, or outside the measurement window
    outcome: str = "unfinished"  # completed | rejected | failed | unfinished
    status: int | None = None
    retry_after: float | None = None
    error: str | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrivals of chunks carrying text
    output_tokens: int = 0  # usage.completion_tokens, else the number of text chunks
    usage_reported: bool = False
    finish: float | None = None  # end of the stream (or of the failure)
    # The server's predicted time to first token, when it says (tierserve with SLA admission:
    # x-tierserve-predicted-ttft-ms), to measure its predictor against the TTFT seen here.
    predicted_ttft: float | None = None
    template: str | None = None  # --workload heavy-tail: its template ...
    stop_after: int | None = None  # ... and the output length it was sent to end at

    @property
    def first_token(self) -> float | None:
        return self.chunk_times[0] if self.chunk_times else None


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    api: str = "chat"  # chat | completions
    model: str | None = None
    priority_via: str = "header"  # header | body | none
    api_keys: dict = field(default_factory=dict)  # class (int) or None (every class) -> key
    ignore_eos: bool = False
    temperature: float = 0.0
    timeout_s: float | None = None  # a request's whole time (None: no limit)
    tenant_keys: dict = field(default_factory=dict)  # tenant name -> key (heavy-tail)
    eos_token_id: int | None = None  # the model's EOS, to end a request at its `stop_after`

    @property
    def url(self) -> str:
        path = "chat/completions" if self.api == "chat" else "completions"
        return f"{self.base_url.rstrip('/')}/v1/{path}"


def build_request(ep: Endpoint, spec: RequestSpec) -> tuple[dict, dict]:
    """(headers, JSON body) for `spec`."""
    body: dict = {
        "max_tokens": spec.max_tokens,
        "temperature": ep.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ep.model:
        body["model"] = ep.model
    if ep.api == "chat":
        body["messages"] = list(spec.messages or ({"role": "user", "content": spec.prompt},))
    else:
        body["prompt"] = spec.prompt
    if ep.ignore_eos:
        body["ignore_eos"] = True
    if spec.stop_after is not None:
        _end_at(body, spec.stop_after, ep.eos_token_id)
    headers = {}
    if ep.priority_via == "header":
        headers["x-request-tier"] = f"p{int(spec.priority)}"
    elif ep.priority_via == "body":
        body["priority"] = int(spec.priority)
    key = ep.tenant_keys.get(spec.tenant) if spec.tenant is not None else None
    if key is None:
        key = ep.api_keys.get(int(spec.priority), ep.api_keys.get(None))
        if spec.tenant is not None:  # no key of its own: named (tierserve without keys)
            headers["x-tenant-id"] = spec.tenant
    if key:
        headers["authorization"] = f"Bearer {key}"
    return headers, body


def _end_at(body: dict, n: int, eos: int | None) -> None:
    """Make the model end after `n` output tokens, the last one its EOS: EOS is masked for the
    first n - 1 (`min_tokens`) and then biased to win (`logit_bias` +100). Both are sampling
    settings of the OpenAI-compatible API (tierserve and vLLM); neither is a feature of
    tierserve's length predictor, which sees only the generous `max_tokens`."""
    if eos is None:
        raise ValueError("ending a request at a drawn length needs the model's EOS token id")
    if n < 1 or n > body["max_tokens"]:
        raise ValueError(f"stop_after {n} must lie in [1, max_tokens {body['max_tokens']}]")
    body["min_tokens"] = n - 1
    body["logit_bias"] = {str(eos): 100}


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (the HTTP-date form is not used by LLM servers)."""
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _error_text(raw: bytes) -> str:
    try:
        err = json.loads(raw)
        msg = err.get("error", err) if isinstance(err, dict) else err
        msg = msg.get("message", msg) if isinstance(msg, dict) else msg
        text = str(msg)
    except (ValueError, UnicodeDecodeError):
        text = raw.decode("utf-8", "replace")
    return " ".join(text.split())[:200]


class StreamError(Exception):
    """The stream broke the server-sent events contract."""


def _chunk_text(obj: dict, api: str) -> str:
    choices = obj.get("choices") or []
    if not isinstance(choices, list):
        raise StreamError(f"malformed stream: 'choices' is not a list: {choices!r:.80}")
    out = ""
    for c in choices:
        if not isinstance(c, dict):
            raise StreamError(f"malformed stream: a choice is not an object: {c!r:.80}")
        if api == "chat":
            out += (c.get("delta") or {}).get("content") or ""
        else:
            out += c.get("text") or ""
    return out


def _on_line(line: str, now: float, rec: RequestRecord, api: str) -> bool:
    """Handle one SSE line; True at `data: [DONE]`."""
    if not line or line.startswith((":", "event:", "id:", "retry:")):
        return False
    if not line.startswith("data:"):
        raise StreamError(f"malformed stream: expected 'data:' lines, got {line[:80]!r}")
    data = line[5:].strip()
    if data == "[DONE]":
        return True
    try:
        obj = json.loads(data)
    except ValueError:
        raise StreamError(f"malformed stream: not JSON: {data[:80]!r}") from None
    if not isinstance(obj, dict):
        raise StreamError(f"malformed stream: not an object: {data[:80]!r}")
    if obj.get("error"):
        raise StreamError(f"error event in the stream: {_error_text(json.dumps(obj).encode())}")
    usage = obj.get("usage")
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        rec.output_tokens = int(usage["completion_tokens"])
        rec.prompt_tokens = int(usage.get("prompt_tokens") or rec.prompt_tokens)
        rec.usage_reported = True
    if _chunk_text(obj, api):
        rec.chunk_times.append(now)
    return False


async def send(
    http: Http,
    ep: Endpoint,
    spec: RequestSpec,
    rec: RequestRecord,
    clock: Callable[[], float],
) -> None:
    """Send `spec`, filling `rec` (whose `arrival` the caller has set) as chunks arrive."""
    headers, body = build_request(ep, spec)
    try:
        async with asyncio.timeout(ep.timeout_s):
            await _stream(http, ep, body, headers, rec, clock)
    except TimeoutError:
        rec.outcome, rec.error = "failed", f"timed out after {ep.timeout_s:g} s"
    except StreamError as exc:
        rec.outcome, rec.error = "failed", str(exc)
    except (httpx.ConnectError, aiohttp.ClientConnectorError) as exc:
        rec.outcome, rec.error = "failed", f"cannot connect to {ep.url}: {exc}"
    except httpx.TimeoutException as exc:
        rec.outcome, rec.error = "failed", f"timed out: {type(exc).__name__}"
    except (httpx.HTTPError, aiohttp.ClientError) as exc:  # a broken connection, ...
        rec.outcome, rec.error = "failed", f"stream broken: {type(exc).__name__}: {exc}"
    finally:
        rec.finish = clock()
        if not rec.usage_reported:
            rec.output_tokens = len(rec.chunk_times)


async def _stream(http, ep: Endpoint, body: dict, headers: dict, rec: RequestRecord, clock):
    if isinstance(http, aiohttp.ClientSession):
        async with http.post(ep.url, json=body, headers=headers) as resp:
            lines = (raw.decode("utf-8", errors="replace") async for raw in resp.content)
            await _read(resp.status, resp.headers, resp.read, lines, ep, rec, clock)
        return
    async with http.stream("POST", ep.url, json=body, headers=headers) as resp:
        lines = resp.aiter_lines()
        await _read(resp.status_code, resp.headers, resp.aread, lines, ep, rec, clock)


async def _read(status: int, head, read_all, lines, ep: Endpoint, rec: RequestRecord, clock):
    """One response into `rec` (either client's): its status and headers, then its body (a
    refusal or an error) or its stream's lines up to ``data: [DONE]``."""
    rec.status = status
    predicted = head.get("x-tierserve-predicted-ttft-ms")
    if predicted is not None and predicted.isdigit():
        rec.predicted_ttft = int(predicted) / 1000
    if status != 200:
        raw = await read_all()
        rec.retry_after = parse_retry_after(head.get("retry-after"))
        rec.outcome = "rejected" if status in REFUSAL_STATUSES else "failed"
        rec.error = f"HTTP {status}: {_error_text(raw)}"
        return
    async for line in lines:
        if _on_line(line.strip(), clock(), rec, ep.api):
            rec.outcome = "completed"
            return
    raise StreamError("truncated stream: it ended before 'data: [DONE]'")
