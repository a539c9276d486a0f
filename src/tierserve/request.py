"""A request and its lifecycle.

States::

    WAITING ──► RUNNING ──► FINISHED
       ▲          │  ▲
       │          ▼  │
       └──── PREEMPTED / SWAPPED          (any non-final state ──► ABORTED | FAILED)

``PREEMPTED`` means its KV was dropped (it is recomputed on resumption) and it sits in the
waiting queue again; ``SWAPPED`` means its KV lives in CPU swap space. Illegal transitions raise.

A ``Request`` is engine-side state, owned by whoever steps the engine (the engine thread in the
server). What crosses a thread or a process is an ``EngineRequest``: frozen, plain data, from
which the engine builds its own ``Request`` (``to_request``). So aging, preemption and token
appends change objects no other thread can see.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields

from tierserve.logprobs import PromptLogprobs, TopLogprobs
from tierserve.priority import Priority
from tierserve.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"

    @property
    def is_final(self) -> bool:
        return self in _FINAL


_FINAL = frozenset({RequestStatus.FINISHED, RequestStatus.ABORTED, RequestStatus.FAILED})
_S = RequestStatus
_ALLOWED: dict[RequestStatus, frozenset[RequestStatus]] = {
    _S.WAITING: frozenset({_S.RUNNING, _S.ABORTED, _S.FAILED}),
    _S.RUNNING: frozenset({_S.SWAPPED, _S.PREEMPTED, _S.FINISHED, _S.ABORTED, _S.FAILED}),
    _S.SWAPPED: frozenset({_S.RUNNING, _S.PREEMPTED, _S.ABORTED, _S.FAILED}),
    _S.PREEMPTED: frozenset({_S.RUNNING, _S.ABORTED, _S.FAILED}),
    _S.FINISHED: frozenset(),
    _S.ABORTED: frozenset(),
    _S.FAILED: frozenset(),
}


class IllegalTransition(RuntimeError):
    pass


class FinishReason(enum.StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"
    ERROR = "error"


@dataclass(frozen=True)
class EngineRequest:
    """A request as submitted to an engine: immutable; the engine thread builds its ``Request``.
    The fields are ``Request``'s constructor arguments."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    priority: Priority = Priority.P1
    tenant: str = "default"
    arrival_time: float = 0.0
    deadline: float | None = None
    cache_salt: str | None = None
    eos_token_id: int | None = None
    end_if_late: bool = False
    predicted_ttft: float | None = None
    batch_line: bool = False
    trace_parent: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError("request_id must be a non-empty string")
        if len(self.prompt_token_ids) == 0:
            raise ValueError(f"request {self.request_id}: the prompt has no tokens")
        object.__setattr__(self, "prompt_token_ids", tuple(self.prompt_token_ids))
        object.__setattr__(self, "priority", Priority(self.priority))

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    num_tokens = num_prompt_tokens  # nothing generated yet

    @property
    def max_total_tokens(self) -> int:
        return self.num_prompt_tokens + self.sampling_params.max_tokens

    def to_request(self) -> Request:
        """A new engine-side Request (call on the thread that steps the engine)."""
        kw = {f.name: getattr(self, f.name) for f in fields(self)}
        return Request(**kw)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    priority: Priority = Priority.P1
    tenant: str = "default"
    arrival_time: float = 0.0
    # Absolute time by which the first token is due (TTFT SLA), if any.
    deadline: float | None = None
    # Mixed into the first block's hash: requests with different salts never share KV.
    cache_salt: str | None = None
    eos_token_id: int | None = None
    # Tie-breaker among equal arrival times; the scheduler numbers requests as they come.
    arrival_seq: int = 0
    # SLA admission: end this request early, with an error, once it is predicted to miss its
    # class's TTFT SLA while it waits (its tenant opted in; engine/load.py late_requests).
    end_if_late: bool = False
    # SLA admission: the TTFT predicted when it was admitted (for the prediction-error metric).
    predicted_ttft: float | None = None
    # A line of a Batch API batch (the feeder sent it): paced while P0 is about (core/calm.py).
    batch_line: bool = False
    # The caller's W3C `traceparent` header: its span joins the caller's trace (tracing.py).
    trace_parent: str | None = None

    status: RequestStatus = field(default=RequestStatus.WAITING, init=False)
    output_token_ids: list[int] = field(default_factory=list, init=False)
    output_logprobs: list[float] = field(default_factory=list, init=False)
    # With top_logprobs: each output token's alternatives. With prompt_logprobs: prompt tokens
    # 1, 2, ... as (logprob, alternatives or None).
    output_top_logprobs: list[TopLogprobs] = field(default_factory=list, init=False)
    prompt_logprobs: list[tuple[float, TopLogprobs | None]] = field(
        default_factory=list, init=False, repr=False
    )
    num_computed_tokens: int = field(default=0, init=False)
    finish_reason: FinishReason | None = field(default=None, init=False)
    error: str | None = field(default=None, init=False)
    # The class the request was submitted with; `priority` may be promoted by aging.
    base_priority: Priority = field(init=False)
    num_preemptions: int = field(default=0, init=False)
    # Speculative decoding: draft tokens verified for this request, and those accepted.
    num_draft_tokens: int = field(default=0, init=False)
    num_accepted_tokens: int = field(default=0, init=False)
    # ... and the recent drafts compared and accepted, decayed per verification: a request
    # copying its input accepts nearly all, the same request writing anew nearly none
    # (core/speculation/speculation.py, `Speculation.acceptance_of`).
    spec_recent: tuple[float, float] = field(default=(0.0, 0.0), init=False)
    # The output length the scheduler's predictor expected (P50) when it took the request in,
    # and whether the request then ended the model's way (EOS, a stop, or max_tokens): what the
    # prediction-error metric compares (core/predictive.py).
    predicted_output: int | None = field(default=None, init=False)
    length_observed: bool = field(default=False, init=False)
    first_scheduled_time: float | None = field(default=None, init=False)
    first_token_time: float | None = field(default=None, init=False)
    finished_time: float | None = field(default=None, init=False)
    # Chained prefix-cache hashes of the full blocks, filled in by the KV manager.
    block_hashes: list[bytes] = field(default_factory=list, init=False, repr=False)
    _all_token_ids: list[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not self.request_id:
            raise ValueError("request_id must be a non-empty string")
        if len(self.prompt_token_ids) == 0:
            raise ValueError(f"request {self.request_id}: the prompt has no tokens")
        self.priority = Priority(self.priority)
        self.base_priority = self.priority
        self.prompt_token_ids = list(self.prompt_token_ids)
        self._all_token_ids = list(self.prompt_token_ids)

    # -- tokens ---------------------------------------------------------------------------------
    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self._all_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then output tokens. Read-only by contract: use `append_output`."""
        return self._all_token_ids

    def truncate_output(self, n: int) -> None:
        """Keep the first `n` output tokens (a finished request's: a stop string ended it
        earlier in a step that produced several)."""
        if n >= self.num_output_tokens:
            return
        del self.output_token_ids[n:]
        del self.output_logprobs[n:]
        del self.output_top_logprobs[n:]
        del self._all_token_ids[self.num_prompt_tokens + n :]

    def append_output(
        self, token_id: int, logprob: float | None = None, top: TopLogprobs | None = None
    ) -> None:
        self.output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)
        if logprob is not None:
            self.output_logprobs.append(logprob)
        if top is not None:
            self.output_top_logprobs.append(top)

    def add_prompt_logprobs(self, chunk: PromptLogprobs) -> None:
        """Record a chunk's prompt logprobs; positions already recorded (a chunk computed again
        after preemption) are skipped."""
        have = len(self.prompt_logprobs) + 1  # the next prompt position without a logprob
        if chunk.start > have:
            raise AssertionError(f"{self.request_id}: prompt logprobs from {chunk.start}, "
                                 f"but only up to {have - 1} are known")  # fmt: skip
        top = chunk.top or [None] * len(chunk.logprobs)
        skip = have - chunk.start
        self.prompt_logprobs.extend(zip(chunk.logprobs[skip:], top[skip:], strict=True))

    @property
    def prompt_logprobs_done(self) -> bool:
        return len(self.prompt_logprobs) == self.num_prompt_tokens - 1

    @property
    def max_total_tokens(self) -> int:
        return self.num_prompt_tokens + self.sampling_params.max_tokens

    # -- state machine ----------------------------------------------------------------------
    def transition(self, new: RequestStatus) -> None:
        if new not in _ALLOWED[self.status]:
            raise IllegalTransition(
                f"request {self.request_id}: illegal transition {self.status.value} -> {new.value}"
            )
        self.status = new

    @property
    def is_finished(self) -> bool:
        return self.status.is_final

    def __repr__(self) -> str:  # compact: tests print many of these
        return (
            f"Request({self.request_id!r}, {self.priority.label}, {self.status.value}, "
            f"prompt={self.num_prompt_tokens}, out={self.num_output_tokens}, "
            f"computed={self.num_computed_tokens})"
        )
