"""The draft-model drafter (`--speculative-model PATH`): a second, smaller model the executor
runs just before the verification step, proposing k greedy tokens for each request the
scheduler chose to speculate for (the scheduler plans how many and holds their KV slots; its
drafts arrive as `DRAFT_PENDING` placeholders, docs/scheduling.md).

It keeps its own paged KV cache (a fixed pool of blocks: bounded memory) and per request the
tokens whose KV it holds. On each proposal it keeps the longest prefix of those that the
request's verified tokens still agree with (its drafts past the first rejected one are
overwritten), catches up on everything else (prompt, accepted drafts, the bonus token) in one
pass, then runs k - 1 single-token greedy steps. All requests drafting in a step share each
pass. Its state for a request goes when the request finishes, is aborted or preempted; when the
pool runs short, the least recently used requests' state goes first (they catch up later).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import torch

from tierserve.core.speculation import DRAFT_PENDING
from tierserve.executor.batch import forward_step
from tierserve.executor.block_table import BlockTables
from tierserve.model.base import CausalLM
from tierserve.sampling_params import SamplingParams

_PARAMS = SamplingParams(temperature=0, max_tokens=1 << 30)  # rows are read as argmax


@dataclass
class DraftState:
    """What `build_batch` reads of a request (the executor's RequestState's fields), plus the
    blocks of the drafter's own pool and the verified length at the last proposal."""

    tokens: list[int]
    num_prompt: int
    block_ids: list[int]
    num_computed: int
    params: SamplingParams = _PARAMS
    table_row: int = -1
    eos: int | None = None
    slot: int = -1
    verified: int = 0  # tokens known verified when it last drafted (positions past it: drafts)


class DraftModel:
    def __init__(self, model: CausalLM, num_blocks: int, block_size: int) -> None:
        from tierserve.executor.kv_memory import zeros

        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        shape = model.kv_cache_shape(num_blocks, block_size)
        dev, dt = model.device, model.kv_dtype
        self.kv_caches = [
            (zeros(shape, dt, dev), zeros(shape, dt, dev)) for _ in range(model.config.num_layers)
        ]
        self._free = list(range(num_blocks - 1, -1, -1))
        self.states: OrderedDict[str, DraftState] = OrderedDict()  # least recently used first
        self.tables = BlockTables()
        self.plan = model.default_plan(block_size)
        self.evictions = 0  # states dropped for room (not for leaving)
        self.max_len = model.config.max_position_embeddings
        # Seconds of one single-token pass (a decode of the draft model for the step's drafting
        # requests), a moving average: what the scheduler's rule charges per draft token.
        self.pass_s = 0.0

    def measure(self, tokens: int = 32, passes: int = 4) -> float:
        """Time single-token passes on a probe request (at start: the rule's first figure)."""
        probe = "__draft_probe__"
        for _ in range(2):  # the first pass warms up
            self.propose({probe: [1] * tokens}, {probe: passes + 1})
            self.drop(probe)
        return self.pass_s

    # -- state -----------------------------------------------------------------------------
    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def drop(self, rid: str) -> None:
        st = self.states.pop(rid, None)
        if st is not None:
            self.tables.release(st.table_row)
            self._free.extend(st.block_ids)

    def _room(self, st: DraftState, positions: int, keep: set[str]) -> bool:
        """Blocks for `positions` tokens of `st`, evicting idle requests' state if needed."""
        need = -(-positions // self.block_size) - len(st.block_ids)
        while need > len(self._free):
            victim = next((r for r in self.states if r not in keep), None)
            if victim is None:
                return False
            self.drop(victim)
            self.evictions += 1
        if need > 0:
            new = [self._free.pop() for _ in range(need)]
            st.block_ids.extend(new)
            self.tables.extend(st.table_row, new)
        return True

    def _sync(self, rid: str, tokens: list[int]) -> DraftState:
        """`rid`'s state over `tokens` (its verified tokens): the computed prefix that still
        agrees is kept; at least the last token is left to compute (its logits give draft 1)."""
        st = self.states.get(rid)
        if st is None:
            st = self.states[rid] = DraftState([], len(tokens), [], 0)
            st.table_row = self.tables.assign([])
        self.states.move_to_end(rid)
        m = min(st.num_computed, len(tokens) - 1, st.verified)
        # verified tokens only ever grow: past `verified` the state held drafts, kept while equal
        while m < min(st.num_computed, len(tokens) - 1) and st.tokens[m] == tokens[m]:
            m += 1
        st.tokens = list(tokens)
        st.num_computed = m
        st.verified = len(tokens)
        return st

    # -- proposing -------------------------------------------------------------------------
    def fill(self, drafts: dict[str, list[int]], tokens: dict[str, list[int]]) -> dict:
        """`drafts` with every `DRAFT_PENDING` run replaced by the draft model's greedy tokens;
        `tokens[rid]`: the request's verified tokens. A request the pool has no room for gets
        copies of its last token (verified as any draft: only likely to be rejected)."""
        want = {
            rid: len(d) for rid, d in drafts.items() if d and all(t == DRAFT_PENDING for t in d)
        }
        if not want:
            return drafts
        proposed = self.propose({rid: tokens[rid] for rid in want}, want)
        out = dict(drafts)
        for rid, k in want.items():
            got = proposed.get(rid, [])
            out[rid] = got + [tokens[rid][-1]] * (k - len(got))
        return out

    @torch.inference_mode()
    def propose(self, tokens: dict[str, list[int]], ks: dict[str, int]) -> dict[str, list[int]]:
        """Up to ks[rid] greedy draft tokens after `tokens[rid]`, for every request at once."""
        keep = set(tokens)
        states: dict[str, DraftState] = {}
        for rid, toks in tokens.items():
            if len(toks) + ks[rid] - 1 > self.max_len:  # past the draft model's context
                self.drop(rid)
                continue
            st = self._sync(rid, toks)
            if self._room(st, len(toks) + ks[rid] - 1, keep):
                states[rid] = st
            else:
                self.drop(rid)
        out: dict[str, list[int]] = {rid: [] for rid in states}
        step = {rid: len(st.tokens) - st.num_computed for rid, st in states.items()}
        for j in range(max(ks.values(), default=0)):
            step = {rid: n for rid, n in step.items() if ks[rid] > j}
            if not step:
                break
            for rid, tok in self._greedy(states, step).items():
                states[rid].tokens.append(tok)
                out[rid].append(tok)
            step = dict.fromkeys(step, 1)
        return out

    def _greedy(self, states: dict[str, DraftState], scheduled: dict[str, int]) -> dict:
        """One forward pass of the draft model over `scheduled` tokens per request: the argmax
        after each request's last token."""
        t0 = time.perf_counter()
        path = self.plan.path(sum(scheduled.values()))
        batch, logits = forward_step(
            self.model,
            self.kv_caches,
            self.tables,
            self.block_size,
            states,  # type: ignore[arg-type]  (DraftState has RequestState's fields)
            scheduled,
            path,
            hidden=False,
        )
        for rid, n in scheduled.items():
            states[rid].num_computed += n
        toks = logits.argmax(dim=-1).tolist()
        if len(scheduled) == sum(scheduled.values()):  # single-token passes only
            t = time.perf_counter() - t0
            self.pass_s = t if self.pass_s == 0.0 else 0.8 * self.pass_s + 0.2 * t
        return dict(zip(batch.sample_ids, toks, strict=True))
