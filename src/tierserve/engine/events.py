"""What comes out of an engine, as typed plain data: the deltas a request's stream receives, the
error kinds a failed request carries, and the events its observers hear.

Observers (metrics, a cluster replica's autoscaling window) run on the engine thread and receive
one of the event classes below, never a string and never the live ``Request``: each event holds
a frozen ``RequestInfo`` read from the request when the event happened. Match on the class::

    match event:
        case FirstToken(info, at): ...

An event class that nobody emits cannot be matched by a misspelt name: the name does not exist.
``tests/test_engine_events.py`` checks, through the real engine thread and the real Ray replica,
that each one is emitted.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tierserve.logprobs import TopLogprobs
from tierserve.priority import Priority
from tierserve.request import Request


class ErrorKind(enum.StrEnum):
    """Why the engine ended a request with an error; api/errors.py maps each to an HTTP status
    (one table), so no layer works the status out from the message."""

    INVALID = "invalid"  # the request can never be served here (context, KV capacity)
    SHED = "shed"  # dropped from the queue to make room for a realtime (P0) request
    SLA_UNREACHABLE = "sla_unreachable"  # ended while waiting: its SLA could no longer be met
    SHUTDOWN = "shutdown"  # the server's grace period ended first
    ENGINE = "engine"  # the engine (or its executor) failed
    REPLICA_LOST = "replica_lost"  # the cluster replica serving it died mid-stream


@dataclass
class StreamDelta:
    """What a request's stream receives: new text and tokens; the last one has ``finished``."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    retry_after_s: float | None = None  # an error the client may retry: when
    top_logprobs: list[TopLogprobs] = field(default_factory=list)  # with top_logprobs > 0
    # With prompt_logprobs: prompt tokens 1, 2, ... as (logprob, top or None), once, in the
    # first delta after the prompt is computed.
    prompt_logprobs: list | None = None
    error_kind: ErrorKind | None = None  # with finish_reason "error"
    # Speculative decoding, so far: draft tokens verified and accepted (OpenAI's usage reports
    # them as accepted / rejected prediction tokens).
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """A request as it was when an event happened (engine clock times)."""

    request_id: str
    priority: Priority  # the class it was submitted with
    tenant: str
    arrival_time: float
    num_prompt_tokens: int
    num_output_tokens: int
    first_scheduled_time: float | None
    first_token_time: float | None
    finished_time: float | None
    finish_reason: str | None
    error: str | None
    predicted_ttft: float | None
    num_preemptions: int
    predicted_output: int | None = None  # the output-length predictor's P50 at arrival
    length_observed: bool = False  # it ended the model's way: its length taught the predictor
    trace_parent: str | None = None  # the caller's W3C traceparent (metrics/tracing.py)

    @classmethod
    def of(cls, req: Request) -> RequestInfo:
        return cls(
            req.request_id,
            req.base_priority,
            req.tenant,
            req.arrival_time,
            req.num_prompt_tokens,
            req.num_output_tokens,
            req.first_scheduled_time,
            req.first_token_time,
            req.finished_time,
            req.finish_reason.value if req.finish_reason else None,
            req.error,
            req.predicted_ttft,
            req.num_preemptions,
            req.predicted_output,
            req.length_observed,
            req.trace_parent,
        )


@dataclass(frozen=True, slots=True)
class Added:
    """The engine took the request in."""

    request: RequestInfo


@dataclass(frozen=True, slots=True)
class FirstToken:
    """The request's first output token reached its stream at `at`."""

    request: RequestInfo
    at: float

    @property
    def ttft(self) -> float:
        return self.at - self.request.arrival_time


@dataclass(frozen=True, slots=True)
class Tokens:
    """`n` more output tokens (after the first) reached the request's stream at `at`."""

    request: RequestInfo
    n: int
    at: float


@dataclass(frozen=True, slots=True)
class Finished:
    """The request ended (finished, aborted or failed); emitted exactly once."""

    request: RequestInfo


@dataclass(frozen=True, slots=True)
class EndedLate:
    """The SLA re-check ended the waiting request (a ``Finished`` follows)."""

    request: RequestInfo
    late_s: float


EngineEvent = Added | FirstToken | Tokens | Finished | EndedLate
