"""What a request must fit to ever be served by an engine: the context length and the KV blocks
its class can hold. Immutable, so the event loop may check requests against it while the engine
thread runs (the numbers are fixed when the engine is built)."""

from __future__ import annotations

from dataclasses import dataclass

from tierserve.priority import Priority
from tierserve.request import Request


@dataclass(frozen=True)
class RequestLimits:
    max_model_len: int
    block_size: int
    capacity: tuple[int, ...]  # the most KV blocks each class could ever hold, P0..P3

    def fits(self, request: Request, priority: Priority | None = None) -> bool:
        """Whether the class (default: the request's current one) can ever hold every token the
        request knows. A request in a waiting queue must always fit, or it blocks the head of
        its class forever."""
        cls = request.priority if priority is None else priority
        return -(-request.num_tokens // self.block_size) <= self.capacity[cls]

    def check(self, request: Request) -> None:
        """Raise ValueError, naming the numbers, if `request` can never be served."""
        if request.max_total_tokens > self.max_model_len:
            raise ValueError(
                f"request {request.request_id}: prompt ({request.num_prompt_tokens} tokens) + "
                f"max_tokens ({request.sampling_params.max_tokens}) exceeds the model's context "
                f"({self.max_model_len} tokens)"
            )
        need = -(-(request.num_prompt_tokens + 1) // self.block_size)
        cap = self.capacity[request.priority]
        if need > cap:
            raise ValueError(
                f"request {request.request_id}: the prompt needs {need} KV blocks; the cache "
                f"can give a {request.priority.tier} ({request.priority.label}) request at most "
                f"{cap}"
            )
