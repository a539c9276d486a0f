"""One step's plan while ``Scheduler.schedule()`` builds it: the token budget, who got how many
tokens and which new blocks, swap mappings, preemptions. A request preempted later in the same
``schedule()`` is taken out again (``unschedule``) before the output is built."""

from __future__ import annotations

from tierserve.core.kv import KVCacheManager
from tierserve.core.outputs import CachedRequestData, NewRequestData, SchedulerOutput
from tierserve.request import Request


class StepPlan:
    def __init__(self, step_id: int, budget: int) -> None:
        self.budget = budget
        self.out = SchedulerOutput(step_id)
        self.tokens: dict[str, int] = {}
        self._new_block_ids: dict[str, list[int]] = {}

    def schedule(self, req: Request, n: int, new_block_ids: list[int]) -> None:
        if n > self.budget:
            raise AssertionError(f"{req.request_id}: {n} tokens over the budget {self.budget}")
        self.tokens[req.request_id] = n
        self._new_block_ids[req.request_id] = new_block_ids
        self.budget -= n

    def unschedule(self, req: Request) -> None:
        self.budget += self.tokens.pop(req.request_id, 0)
        self._new_block_ids.pop(req.request_id, None)

    def swap_in(self, req: Request, mapping: list[tuple[int, int]]) -> None:
        self.out.blocks_to_swap_in.extend(mapping)

    def swap_out(self, req: Request, mapping: list[tuple[int, int]]) -> None:
        self.out.blocks_to_swap_out.extend(mapping)
        self.out.preempted_req_ids.add(req.request_id)

    def preempt_recompute(self, req: Request) -> None:
        self.out.preempted_req_ids.add(req.request_id)

    def build(
        self, running: dict[str, Request], kv: KVCacheManager, known: set[str]
    ) -> SchedulerOutput:
        """Requests the executor does not know yet are sent whole; the others as diffs.
        `known` is updated to the requests the executor holds after this step."""
        out = self.out
        for rid in out.preempted_req_ids | out.finished_req_ids:
            known.discard(rid)
        for rid, n in self.tokens.items():
            req = running[rid]
            if rid in known:
                out.scheduled_cached.append(
                    CachedRequestData(rid, self._new_block_ids[rid], req.num_computed_tokens)
                )
            else:
                out.scheduled_new.append(
                    NewRequestData(
                        request_id=rid,
                        token_ids=list(req.all_token_ids),
                        num_prompt_tokens=req.num_prompt_tokens,
                        sampling_params=req.sampling_params,
                        block_ids=kv.block_ids(rid),
                        num_computed_tokens=req.num_computed_tokens,
                        eos_token_id=req.eos_token_id,
                    )
                )
                known.add(rid)
            out.num_scheduled_tokens[rid] = n
        out.total_num_scheduled_tokens = sum(self.tokens.values())
        return out
