"""A fake executor whose steps take the time the simulator's cost model gives them, on a manual
clock: the KV-simulating FakeExecutor (executor/fake.py) plus the CPU engine's step times (the
`cpu-local` profile, SmolLM2-135M, by default), positions whose logits are computed for prompt
logprobs included. Deterministic, so step-time rules can be checked exactly and fast (tests,
benchmarks/simulation/p0_isolation_sim.py); unlike SimExecutor it also checks the KV contents."""

from __future__ import annotations

from tierserve.clock import ManualClock
from tierserve.core.outputs import ExecutorOutput, SchedulerOutput
from tierserve.core.preemption import PreemptionCosts
from tierserve.executor.fake import FakeExecutor
from tierserve.sim.calibration.profiles import load_hardware, load_model_profile
from tierserve.sim.engine.cost_model import CostModel


def cpu_cost_model() -> CostModel:
    return CostModel(load_hardware("cpu-local"), load_model_profile("smollm2-135m"), 1)


class CostClockExecutor(FakeExecutor):
    def __init__(
        self,
        clock: ManualClock,
        num_blocks: int,
        block_size: int = 16,
        cost: CostModel | None = None,
        slowdown: float = 1.0,
    ) -> None:
        self.cost = cost or cpu_cost_model()
        costs = PreemptionCosts(
            kv_bytes_per_block=self.cost.kv_bytes_per_block(block_size),
            swap_bytes_per_s=1e9,
            prefill_tokens_per_s=self.cost.prefill_tokens_per_s(128),
        )
        super().__init__(num_blocks, block_size, costs=costs, vocab_size=1000)
        self.clock = clock
        self.slowdown = slowdown  # a machine this much slower than the profile
        self.logprob_prompts: dict[str, int] = {}  # request id -> prompt tokens, if it asks
        self.step_seconds: list[float] = []

    def execute(self, out: SchedulerOutput) -> ExecutorOutput:
        for new in out.scheduled_new:
            if new.sampling_params.prompt_logprobs is not None:
                self.logprob_prompts[new.request_id] = new.num_prompt_tokens
        chunks, rows = [], 0
        new = {x.request_id: x for x in out.scheduled_new}
        for rid, n in out.num_scheduled_tokens.items():
            if rid in new:
                done, total = new[rid].num_computed_tokens, len(new[rid].token_ids)
            else:
                done, total = self.states[rid].num_computed, len(self.states[rid].tokens)
            chunks.append((n, done + n))
            rows += int(done + n >= total)
            prompt = self.logprob_prompts.get(rid)
            if prompt is not None:
                rows += max(0, min(done + n, prompt) - done)
        seconds = self.cost.step(chunks, rows).seconds * self.slowdown if chunks else 0.0
        self.step_seconds.append(seconds)
        result = super().execute(out)
        self.clock.advance(seconds)
        return result
