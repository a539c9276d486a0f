"""SimExecutor: an executor with no tensors. It prices each SchedulerOutput with the cost model,
moves the virtual clock forward by that much, and "samples" a token for every request whose
known tokens are all computed. The scheduler and KV manager it serves are the real ones.

Speculative decoding: drafts are priced as the multi-token query they are (k more tokens, k more
logits rows), and each is accepted with the workload's per-class probability `acceptance`
(seeded), the drafts after a rejected one never. `sim_drafter` proposes drafts for every
request (the simulated tokens carry no text to look up): acceptance is the workload parameter."""

from __future__ import annotations

import random
from dataclasses import dataclass

from tierserve.clock import ManualClock
from tierserve.core.outputs import ExecutorOutput, SchedulerOutput
from tierserve.core.preemption import PreemptionCosts
from tierserve.sim.engine.cost_model import CostModel
from tierserve.workloads.synthetic import SIM_EOS, SIM_TOKEN


@dataclass
class _State:
    num_tokens: int
    num_computed: int


@dataclass
class SimTotals:
    busy_s: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    swap_s: float = 0.0
    # Preemption by recompute: tokens computed again after their KV was dropped, and what they
    # added to their steps (each step priced with and without them).
    recompute_tokens: int = 0
    recompute_s: float = 0.0
    steps: int = 0


class SimExecutor:
    def __init__(
        self,
        cost: CostModel,
        clock: ManualClock,
        block_size: int,
        acceptance: tuple[float, ...] = (0.0,) * 4,
        seed: int = 0,
    ) -> None:
        self.cost = cost
        self.acceptance = acceptance  # per draft, per submitted class
        self.classes: dict[str, int] = {}  # request id -> submitted class
        self._rng = random.Random(seed)
        self.clock = clock
        self.block_size = block_size
        self.states: dict[str, _State] = {}
        self.totals = SimTotals()
        self.last_step_s = 0.0
        # Request id (a retry's "~n" suffix stripped) -> the output length at which the model
        # samples SIM_EOS (the workload's draw; sim/heavy_tail.py). Absent: SIM_TOKEN forever.
        self.output_lengths: dict[str, int] = {}
        self._generated: dict[str, int] = {}
        # Request id -> the most tokens it ever had computed: below it, a resumed request's
        # prefill is recomputation (a prefix-cache hit on resumption is not: it starts past it).
        self._high: dict[str, int] = {}

    def preemption_costs(self) -> PreemptionCosts:
        return PreemptionCosts(
            kv_bytes_per_block=self.cost.kv_bytes_per_block(self.block_size),
            swap_bytes_per_s=self.cost.hw.pcie_bandwidth * self.cost.tp,
            prefill_tokens_per_s=self.cost.prefill_tokens_per_s(),
        )

    def execute(self, out: SchedulerOutput) -> ExecutorOutput:
        for rid in out.finished_req_ids | out.preempted_req_ids:
            self.states.pop(rid, None)
            self.classes.pop(rid, None)
        for rid in out.finished_req_ids:
            self._high.pop(rid, None)
        for new in out.scheduled_new:
            self.states[new.request_id] = _State(len(new.token_ids), new.num_computed_tokens)
            self.classes[new.request_id] = new.priority
        chunks, sampled, accepted, rows = [], [], {}, 0
        fresh, recomputed = [], 0  # the chunks without recomputed tokens, and those tokens
        for rid, n in out.num_scheduled_tokens.items():
            st = self.states[rid]
            k = len(out.spec_token_ids.get(rid, ()))
            again = max(0, min(st.num_computed + n, self._high.get(rid, 0)) - st.num_computed)
            st.num_computed += n
            chunks.append((n, st.num_computed))
            recomputed += again
            if n > again:
                fresh.append((n - again, st.num_computed))
            if k:
                a = self._accepted(rid, k)
                accepted[rid] = [SIM_TOKEN] * a
                st.num_computed -= k - a
                st.num_tokens += a
                rows += k
            self._high[rid] = max(self._high.get(rid, 0), st.num_computed)
            if st.num_computed == st.num_tokens:
                sampled.append(rid)
                st.num_tokens += 1
        step = self.cost.step(chunks, len(sampled) + rows)
        if recomputed:
            without = self.cost.step(fresh, len(sampled) + rows).seconds if fresh else 0.0
            self.totals.recompute_tokens += recomputed
            self.totals.recompute_s += step.seconds - without
        swapped = len(out.blocks_to_swap_in) + len(out.blocks_to_swap_out)
        swap_s = self.cost.swap_seconds(swapped, self.block_size) if swapped else 0.0
        seconds = step.seconds + swap_s
        t = self.totals
        t.busy_s += seconds
        t.flops += step.flops
        t.bytes += step.bytes
        t.swap_s += swap_s
        t.steps += 1
        self.last_step_s = seconds
        self.clock.advance(seconds)
        return ExecutorOutput(
            sampled_token_ids={rid: self._token(rid) for rid in sampled},
            logprobs={rid: 0.0 for rid in sampled},
            accepted_token_ids=accepted,
            accepted_logprobs={rid: [0.0] * len(a) for rid, a in accepted.items()},
            accepted_top_logprobs={rid: [None] * len(a) for rid, a in accepted.items()},
        )

    def _accepted(self, rid: str, k: int) -> int:
        """Drafts accepted of k (each with the class's probability, none after a rejection),
        never past the token before the drawn EOS (the verified token may be that EOS)."""
        p = self.acceptance[self.classes.get(rid, 1)]
        a = 0
        while a < k and self._rng.random() < p:
            a += 1
        target = self.output_lengths.get(rid.split("~")[0]) if self.output_lengths else None
        if target is not None:
            done = self._generated.get(rid, 0)
            a = max(0, min(a, target - 1 - done))
            self._generated[rid] = done + a
        return a

    def _token(self, rid: str) -> int:
        target = self.output_lengths.get(rid.split("~")[0]) if self.output_lengths else None
        if target is None:
            return SIM_TOKEN
        n = self._generated.get(rid, 0) + 1
        if n >= target:
            self._generated.pop(rid, None)
            return SIM_EOS
        self._generated[rid] = n
        return SIM_TOKEN


def sim_drafter(tokens: list[int], k: int) -> list[int]:
    """k drafts for any request (what they are does not matter to the simulator)."""
    return [SIM_TOKEN] * k
