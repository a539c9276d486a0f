"""Plain data between the scheduler and the executor, keyed by request id. No live request
objects cross this line, so an executor may live in another process.

Order of operations the executor applies for one ``SchedulerOutput``:
``blocks_to_swap_in`` (host -> device), then ``blocks_to_swap_out`` (device -> host), then the
forward pass. Swap-ins are planned before any preemption in a step,
so host blocks they free may be reused by the step's swap-outs (read before written), and device
blocks freed by swap-outs may be reused by the step's new requests (read before written).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tierserve.logprobs import PromptLogprobs, TopLogprobs
from tierserve.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    """A request entering the running batch (new, resumed after recompute, or swapped in).
    Carries all its tokens; the executor forgets a request when it leaves the batch."""

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    eos_token_id: int | None = None
    priority: int = 1  # the class it was submitted as (a simulator's acceptance is per class)


@dataclass
class CachedRequestData:
    """A request continuing from the last step: only what changed."""

    request_id: str
    new_block_ids: list[int]
    num_computed_tokens: int


@dataclass
class SchedulerOutput:
    step_id: int
    scheduled_new: list[NewRequestData] = field(default_factory=list)
    scheduled_cached: list[CachedRequestData] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    total_num_scheduled_tokens: int = 0
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)  # (host, device)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)  # (device, host)
    # Requests the executor should forget: finished, aborted or preempted since the last step.
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)
    # Speculative decoding: draft tokens a decoding request verifies in this step (its
    # num_scheduled_tokens is 1 + len(drafts): the last sampled token, then the drafts).
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        """Nothing for the executor to do or to learn: no tokens, no swaps, no ids to forget."""
        return (
            self.total_num_scheduled_tokens == 0
            and not self.blocks_to_swap_in
            and not self.blocks_to_swap_out
            and not self.finished_req_ids
            and not self.preempted_req_ids
        )


@dataclass
class ExecutorOutput:
    """Tokens sampled for requests whose known tokens were all computed in this step, their
    logprobs (and top alternatives, when asked), and prompt logprobs of this step's chunks."""

    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    logprobs: dict[str, float] = field(default_factory=dict)
    top_logprobs: dict[str, TopLogprobs] = field(default_factory=dict)
    prompt_logprobs: dict[str, PromptLogprobs] = field(default_factory=dict)
    # Speculative decoding: drafts accepted, in order, before the sampled token (with their
    # logprobs and top alternatives, like the sampled token's).
    accepted_token_ids: dict[str, list[int]] = field(default_factory=dict)
    accepted_logprobs: dict[str, list[float]] = field(default_factory=dict)
    accepted_top_logprobs: dict[str, list[TopLogprobs | None]] = field(default_factory=dict)
    # Requests the executor could not serve (e.g. non-finite logits), with a reason.
    failed: dict[str, str] = field(default_factory=dict)
