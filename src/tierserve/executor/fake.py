"""A deterministic fake executor that *simulates the KV cache contents*.

Every scheduled token is written into the slot its block table gives; swaps and copies move slot
contents between a device and a host store; the next token is a hash of the sequence *read back
from the KV slots*. So a wrong block table, a bad swap mapping or a stale prefix-cache hit changes
the output (or trips an assertion), and outputs can be compared across schedules: the same
requests must give the same tokens whatever the policy, memory size or preemption mode.
"""

from __future__ import annotations

from dataclasses import dataclass

from tierserve.core.outputs import ExecutorOutput, SchedulerOutput
from tierserve.core.preemption import PreemptionCosts

_MOD = (1 << 61) - 1


def next_token(seq: list[int], vocab_size: int) -> int:
    h = 0
    for i, t in enumerate(seq):
        h = (h * 1_000_003 + (t + 1) * (i + 7)) % _MOD
    return h % vocab_size


@dataclass
class _State:
    tokens: list[int]
    block_ids: list[int]
    num_computed: int


class KVCorruption(AssertionError):
    pass


class FakeExecutor:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        num_cpu_blocks: int = 0,
        vocab_size: int = 1000,
        costs: PreemptionCosts | None = None,
        fail_request_ids: frozenset[str] = frozenset(),
    ) -> None:
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.device = [[None] * block_size for _ in range(num_blocks)]
        self.host = [[None] * block_size for _ in range(num_cpu_blocks)]
        self.states: dict[str, _State] = {}
        self.costs = costs
        self.fail_request_ids = set(fail_request_ids)
        self.raise_next: Exception | None = None
        self.steps = 0
        self.layer_hook = None  # called once a step, after its inputs and before its tokens

    def set_layer_hook(self, hook) -> None:
        self.layer_hook = hook

    def preemption_costs(self) -> PreemptionCosts | None:
        return self.costs

    def _slot(self, st: _State, pos: int) -> tuple[list, int]:
        return self.device[st.block_ids[pos // self.block_size]], pos % self.block_size

    def execute(self, out: SchedulerOutput) -> ExecutorOutput:
        self.steps += 1
        if self.raise_next is not None:
            exc, self.raise_next = self.raise_next, None
            raise exc
        for rid in out.finished_req_ids | out.preempted_req_ids:
            self.states.pop(rid, None)
        for host, dev in out.blocks_to_swap_in:
            self.device[dev] = list(self.host[host])
        for dev, host in out.blocks_to_swap_out:
            self.host[host] = list(self.device[dev])
        for new in out.scheduled_new:
            st = _State(list(new.token_ids), list(new.block_ids), new.num_computed_tokens)
            self.states[new.request_id] = st
            # KV handed over as already computed (prefix hit, swap-in) must hold these tokens.
            for pos in range(new.num_computed_tokens):
                blk, off = self._slot(st, pos)
                if blk[off] != st.tokens[pos]:
                    raise KVCorruption(
                        f"{new.request_id}: KV slot for position {pos} holds {blk[off]}, "
                        f"expected {st.tokens[pos]}"
                    )
        for cached in out.scheduled_cached:
            st = self.states[cached.request_id]
            st.block_ids.extend(cached.new_block_ids)
            if st.num_computed != cached.num_computed_tokens:
                raise KVCorruption(f"{cached.request_id}: computed-token count diverged")
        if self.layer_hook is not None:  # as between two layers: a cut-in may run here
            self.layer_hook()
        result = ExecutorOutput()
        for rid, n in out.num_scheduled_tokens.items():
            st = self.states[rid]
            drafts = out.spec_token_ids.get(rid, [])
            st.tokens.extend(drafts)
            for pos in range(st.num_computed, st.num_computed + n):
                blk, off = self._slot(st, pos)
                blk[off] = st.tokens[pos]
            st.num_computed += n
            if rid in self.fail_request_ids:
                result.failed[rid] = "injected failure"
                continue
            if drafts:
                self._verify(rid, st, drafts, result)
            elif st.num_computed == len(st.tokens):
                seq = []
                for pos in range(st.num_computed):
                    blk, off = self._slot(st, pos)
                    seq.append(blk[off])
                tok = next_token(seq, self.vocab_size)
                st.tokens.append(tok)
                result.sampled_token_ids[rid] = tok
                result.logprobs[rid] = -float(tok % 7)
        return result

    def _verify(self, rid: str, st: _State, drafts: list[int], result: ExecutorOutput) -> None:
        """Each position's token from what its KV slots hold; drafts kept while they match."""
        base = len(st.tokens) - len(drafts)  # known tokens before the drafts
        seq = []
        for pos in range(base - 1):
            blk, off = self._slot(st, pos)
            seq.append(blk[off])
        kept: list[int] = []
        for j in range(len(drafts) + 1):
            blk, off = self._slot(st, base - 1 + j)
            seq.append(blk[off])
            tok = next_token(seq, self.vocab_size)
            if j < len(drafts) and tok == drafts[j]:
                kept.append(tok)
                continue
            break
        st.tokens[base:] = [*kept, tok]
        st.num_computed = base + len(kept)
        result.accepted_token_ids[rid] = kept
        result.accepted_logprobs[rid] = [-float(t % 7) for t in kept]
        result.accepted_top_logprobs[rid] = [None] * len(kept)
        result.sampled_token_ids[rid] = tok
        result.logprobs[rid] = -float(tok % 7)
