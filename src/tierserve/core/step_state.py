"""One step's plan while ``Scheduler.schedule()`` builds it: the token budget, the time budget
(core/step_time.py), who got how many tokens and which new blocks, swap mappings, preemptions.
A request preempted later in the same ``schedule()`` is taken out again (``unschedule``) before
the output is built."""

from __future__ import annotations

from tierserve.core.kv import KVCacheManager
from tierserve.core.outputs import CachedRequestData, NewRequestData, SchedulerOutput
from tierserve.core.step_time import StepCoefficients, StepWork, TimeBudget
from tierserve.request import Request


def wants_prompt_logprobs(req: Request) -> bool:
    return req.sampling_params.prompt_logprobs is not None


def chunk_work(req: Request, n: int) -> StepWork:
    """What computing `req`'s next `n` tokens costs the step: logits for every prompt position
    when its prompt logprobs are asked for, and for the token it samples when the chunk ends
    its known tokens."""
    done = req.num_computed_tokens
    rows = int(done + n >= req.num_tokens)
    if wants_prompt_logprobs(req):
        rows += max(0, min(done + n, req.num_prompt_tokens) - done)
    return StepWork.chunk(n, done, rows)


def draft_work(context: int, k: int) -> StepWork:
    """What verifying k drafts adds to a decode over `context` tokens: k query tokens, their
    attention pairs, k more logits rows."""
    return StepWork(0, k, 0, k * context + k * (k + 1) / 2, k)


class StepPlan:
    def __init__(
        self,
        step_id: int,
        budget: int,
        coef: StepCoefficients | None = None,
        bound_s: float | None = None,
        min_chunk: int = 16,
    ) -> None:
        self.budget = budget
        self.time = TimeBudget(coef or StepCoefficients(), bound_s, min_chunk)
        self.out = SchedulerOutput(step_id)
        self.tokens: dict[str, int] = {}
        self._chunks: dict[str, StepWork] = {}  # prefill chunks planned, and what they compute
        self._reserved: dict[str, int] = {}  # decodes counted upfront: their context
        self._decodes = [0, 0]  # decodes planned: count, contexts summed
        self._new_block_ids: dict[str, list[int]] = {}
        self._spec: dict[str, StepWork] = {}  # what drafts add (verified with their decodes)

    @property
    def chunk_ids(self) -> list[str]:
        """The requests with a prefill chunk in the step so far."""
        return list(self._chunks)

    def reserve_decodes(self, reqs: list[Request]) -> None:
        """Count these one-token decodes in the time budget before any prefill chunk is sized:
        they are never cut, so chunks ranked before them must leave them their time."""
        self._reserved = {r.request_id: r.num_tokens for r in reqs}
        if self.time.active:
            ctx = sum(self._reserved.values())
            self.time.take(StepWork(len(reqs), len(reqs), ctx, ctx, len(reqs)), chunk=False)

    def schedule(self, req: Request, n: int, new_block_ids: list[int]) -> None:
        if n > self.budget:
            raise AssertionError(f"{req.request_id}: {n} tokens over the budget {self.budget}")
        rid = req.request_id
        self.tokens[rid] = n
        self._new_block_ids[rid] = new_block_ids
        self.budget -= n
        if rid in self._reserved:
            self._decodes[0] += 1
            self._decodes[1] += self._reserved[rid]
        else:
            w = self._chunks[rid] = chunk_work(req, n)
            if self.time.active:
                self.time.take(w, chunk=True)

    def unschedule(self, req: Request) -> None:
        rid = req.request_id
        self.out.spec_token_ids.pop(rid, None)
        w = self._spec.pop(rid, None)  # (drafts are planned last: not seen in schedule())
        if w is not None and self.time.active:
            self.time.give_back(w, chunk=False)
        self.budget += self.tokens.get(rid, 0)
        self._new_block_ids.pop(rid, None)
        w = self._chunks.pop(rid, None)
        if w is not None and self.time.active:
            self.time.give_back(w, chunk=True)
        ctx = self._reserved.pop(rid, None)
        if ctx is not None:
            if self.time.active:
                self.time.give_back(StepWork(1, 1, ctx, ctx, 1), chunk=False)
            if rid in self.tokens:
                self._decodes[0] -= 1
                self._decodes[1] -= ctx
        self.tokens.pop(rid, None)

    def speculate(self, req: Request, drafts: list[int], new_block_ids: list[int]) -> None:
        """`req`, planned as a one-token decode, verifies `drafts` too: k more query tokens
        (and logits rows) in the same step."""
        rid, k = req.request_id, len(drafts)
        if self.tokens.get(rid) != 1 or k > self.budget:
            raise AssertionError(f"{rid}: drafts for a request that is not a planned decode")
        self.tokens[rid] += k
        self._new_block_ids[rid] = self._new_block_ids[rid] + new_block_ids
        self.budget -= k
        self.out.spec_token_ids[rid] = list(drafts)
        w = self._spec[rid] = draft_work(req.num_tokens, k)
        if self.time.active:
            self.time.take(w, chunk=False)

    def total_work(self) -> StepWork:
        """What the planned step computes: the step-time model's features."""
        d, ctx = self._decodes
        total = StepWork(d, d, ctx, ctx, d)
        for w in self._spec.values():
            total = total + w
        for w in self._chunks.values():
            total = total + w
        return total

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
                        priority=int(req.base_priority),
                    )
                )
                known.add(rid)
            out.num_scheduled_tokens[rid] = n
        out.total_num_scheduled_tokens = sum(self.tokens.values())
        return out
