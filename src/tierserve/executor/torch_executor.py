"""The PyTorch executor: KV cache tensors indexed by the KV manager's block ids, swaps and copies
between a device pool and a host pool, one forward pass per step over the mixed batch, sampling.
Runs on CPU (float32 by default) and unchanged on CUDA (bfloat16 by default).

At start it measures what the scheduler's swap-vs-recompute choice needs: prefill speed (tokens
per second, from a short warm-up prefill) and host<->device copy bandwidth.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from tierserve.core.outputs import ExecutorOutput, SchedulerOutput
from tierserve.core.preemption import PreemptionCosts
from tierserve.executor.autotune import load_or_measure
from tierserve.executor.block_table import BlockTables
from tierserve.executor.draft_model import DraftModel
from tierserve.executor.graphs import DecodeGraphs
from tierserve.executor.kv_memory import allocate_caches, kv_bytes_per_block
from tierserve.executor.runner import ModelRunner
from tierserve.executor.sampling_state import SamplingState
from tierserve.executor.scoring import prompt_logprobs
from tierserve.executor.state import RequestState
from tierserve.model.base import CausalLM
from tierserve.model.sampler import Sampled, Sampler
from tierserve.model.tokenizer import ChatTokenizer
from tierserve.sampling_params import SamplingParams


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> torch.dtype:
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


class TorchExecutor:
    def __init__(
        self,
        model: CausalLM,
        num_blocks: int,
        block_size: int,
        num_cpu_blocks: int = 0,
        seed: int | None = None,
        measure: bool = True,
        tokenizer: ChatTokenizer | None = None,
        drafter: DraftModel | None = None,
        decode_graphs: str = "off",
        max_model_len: int | None = None,
        max_seqs: int = 256,
    ) -> None:
        """`tokenizer`: the model's, for structured output (grammar masks are computed over
        its vocabulary); without it a request with a grammar fails. `drafter`: the draft model
        that fills the drafts the scheduler planned (method "draft_model"). `decode_graphs`:
        "capture" (CUDA graphs of decode steps up to `max_model_len`, graphs.py; without CUDA as
        "eager"), "eager" (the same buffers and buckets, called eagerly: the CPU's stand-in, for
        tests) or "off"."""
        self.model = model
        # Tensor parallel (model.tp, executor/parallel.py): rank 0 (the driver) samples and
        # owns the sampling state; the other ranks append the tokens it drew.
        self.tp = getattr(model, "tp", None)
        self.driver = self.tp is None or self.tp.driver
        self.drafter = drafter
        self.block_size = block_size
        self.num_blocks = num_blocks
        dev = model.device
        graphs = decode_graphs != "off"
        # (graphs: one scratch block past the manager's, written and read by padding rows)
        self.kv_caches = allocate_caches(model, num_blocks + graphs, block_size)
        self.host_caches = (
            allocate_caches(model, num_cpu_blocks, block_size, torch.device("cpu"))
            if num_cpu_blocks
            else []
        )
        self.states: dict[str, RequestState] = {}
        self.tables = BlockTables()
        self.runner = ModelRunner(model, self.kv_caches, self.tables, block_size)
        self.plan = model.default_plan(block_size)
        self.last_swap_seconds = (0.0, 0.0)  # (in, out) copy time of the last step
        self.sampler = Sampler(dev, seed, model.kernels)
        self.sampling = SamplingState(
            model.config.vocab_size, dev, _grammar_engine(tokenizer, model) if tokenizer else None
        )
        self._costs = self._measure() if measure else None
        if measure and not model.batch_invariant and self.tp is None:
            # the fastest path per step size, measured once per machine and model (one path
            # for every size keeps a row's bits whatever its step: the default plan)
            self.plan = load_or_measure(self)
        model.use_plan(self.plan)
        if graphs:
            if decode_graphs not in ("capture", "eager"):
                raise ValueError(f"decode_graphs: capture, eager or off, got {decode_graphs!r}")
            context = max_model_len or model.config.max_position_embeddings
            self.runner.graphs = DecodeGraphs(
                model,
                self.kv_caches,
                block_size,
                max_seqs=max_seqs,
                max_blocks=-(-context // block_size),
                scratch_block=num_blocks,
                capture=decode_graphs == "capture" and model.device.type == "cuda",
            )
            self.runner.graphs.capture_all()

    def close(self) -> None:
        """Release what outlives the engine (nothing here; tensor-parallel workers: see
        `executor/tp_worker.py`)."""

    # -- cost figures for preemption -------------------------------------------------------
    def preemption_costs(self) -> PreemptionCosts | None:
        return self._costs

    def _sync(self) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize()

    def _measure(self, tokens: int = 128) -> PreemptionCosts:
        """A warm-up prefill into scratch blocks (the KV manager has handed none out yet) and a
        device->host copy, timed."""
        n_blocks = min(self.num_blocks, -(-tokens // self.block_size))
        tokens = min(tokens, n_blocks * self.block_size)
        best = float("inf")
        for _ in range(2):
            probe = RequestState([1] * tokens, tokens, list(range(n_blocks)), 0, SamplingParams())
            self.add_state("probe", probe)
            self._sync()
            t0 = time.perf_counter()
            self.forward({"probe": probe}, {"probe": tokens})
            self._sync()
            best = min(best, time.perf_counter() - t0)
            self.drop_state("probe")
        k = self.kv_caches[0][0][:, :n_blocks]
        self._sync()
        t0 = time.perf_counter()
        for _ in range(3):
            k.to("cpu", copy=True)
        self._sync()
        per_copy = max((time.perf_counter() - t0) / 3, 1e-9)
        bandwidth = k.numel() * k.element_size() / per_copy
        return PreemptionCosts(
            kv_bytes_per_block=kv_bytes_per_block(self.model, self.block_size),
            swap_bytes_per_s=bandwidth,
            prefill_tokens_per_s=tokens / best,
        )

    # -- the step --------------------------------------------------------------------------
    def _copy_blocks(self, src_caches, dst_caches, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        src_dev, dst_dev = src_caches[0][0].device, dst_caches[0][0].device
        src = torch.tensor([p[0] for p in pairs], device=src_dev)
        dst = torch.tensor([p[1] for p in pairs], device=dst_dev)
        for (sk, sv), (dk, dv) in zip(src_caches, dst_caches, strict=True):
            dk.index_copy_(1, dst, sk.index_select(1, src).to(dst_dev))
            dv.index_copy_(1, dst, sv.index_select(1, src).to(dst_dev))

    def _timed_copy(self, src_caches, dst_caches, pairs: list[tuple[int, int]]) -> float:
        if not pairs:
            return 0.0
        t0 = time.perf_counter()
        self._copy_blocks(src_caches, dst_caches, pairs)
        self._sync()
        return time.perf_counter() - t0

    def set_layer_hook(self, hook: Callable[[], None] | None) -> None:
        """Call `hook` between two decoder layers of each step (the engine's cut-in point). A
        step run inside the hook is a whole step of its own: it adds its requests' state and
        reads its own batch; the stopped step's batch and metadata were built before."""
        if hook is None:
            self.model.layer_hook = None
            return

        def between_layers() -> None:
            swaps = self.last_swap_seconds  # the stopped step's, reported after it
            try:
                hook()
            finally:
                self.last_swap_seconds = swaps

        self.model.layer_hook = between_layers

    def add_state(self, rid: str, st: RequestState) -> str | None:
        """Hold `rid`'s state; an error message (and nothing held) if it cannot be served."""
        self.drop_state(rid)
        st.table_row = self.tables.assign(st.block_ids)
        self.states[rid] = st
        if not self.driver:
            return None
        error = self.sampling.add(rid, st)
        if error is not None:
            self.drop_state(rid)
        return error

    def drop_state(self, rid: str) -> None:
        st = self.states.pop(rid, None)
        if st is not None:
            self.tables.release(st.table_row)
            if self.driver:
                self.sampling.drop(rid, st)

    def execute(self, out: SchedulerOutput) -> ExecutorOutput:
        return self.run_step(*self.prepare(out))

    def prepare(
        self,
        out: SchedulerOutput,
        failed: dict[str, str] | None = None,
        drafts: dict[str, list[int]] | None = None,
    ) -> tuple[dict[str, int], dict[str, list[int]], dict[str, str]]:
        """A step's state changes before its forward pass: finished and preempted requests
        dropped, swaps, new requests held, new blocks, drafts proposed. Returns the tokens to
        run per request, the drafts and the requests that failed. A tensor-parallel follower
        is given rank 0's `failed` and `drafts` (it neither checks sampling nor drafts)."""
        for rid in out.finished_req_ids | out.preempted_req_ids:
            self.drop_state(rid)
            if self.drafter is not None:
                self.drafter.drop(rid)
        self.last_swap_seconds = (
            self._timed_copy(self.host_caches, self.kv_caches, out.blocks_to_swap_in),
            self._timed_copy(self.kv_caches, self.host_caches, out.blocks_to_swap_out),
        )
        given = failed is not None
        failed = dict(failed or {})
        for new in out.scheduled_new:
            if new.request_id in failed:
                continue
            st = RequestState(
                list(new.token_ids),
                new.num_prompt_tokens,
                list(new.block_ids),
                new.num_computed_tokens,
                new.sampling_params,
                eos=new.eos_token_id,
            )
            error = self.add_state(new.request_id, st)
            if error is not None and not given:
                failed[new.request_id] = error
        for cached in out.scheduled_cached:
            st = self.states[cached.request_id]
            st.block_ids.extend(cached.new_block_ids)
            self.tables.extend(st.table_row, cached.new_block_ids)
        scheduled = out.num_scheduled_tokens
        if failed:
            scheduled = {rid: n for rid, n in scheduled.items() if rid not in failed}
        if drafts is None:
            drafts = {rid: d for rid, d in out.spec_token_ids.items() if rid in scheduled}
            if drafts and self.drafter is not None:  # planned drafts, proposed now
                drafts = self.drafter.fill(drafts, {r: self.states[r].tokens for r in drafts})
        for rid, d in drafts.items():
            self.states[rid].tokens.extend(d)  # verified below; rejected ones are dropped
        return scheduled, drafts, failed

    def run_step(
        self, scheduled: dict[str, int], drafts: dict[str, list[int]], failed: dict[str, str]
    ) -> ExecutorOutput:
        """The forward pass and sampling of a prepared step."""
        result = (
            self.forward(self.states, scheduled, drafts=drafts) if scheduled else ExecutorOutput()
        )
        result.failed.update(failed)
        return result

    def forward(
        self,
        states: dict[str, RequestState],
        scheduled: dict[str, int],
        path: str | None = None,
        drafts: dict[str, list[int]] | None = None,
    ) -> ExecutorOutput:
        """One forward pass over `scheduled` (tokens per request) and the sampling that follows
        it, on the step path `path` (default: the plan's for the step's size). Public: the
        step-path autotune and benchmarks/gpu/gpu_profile.py time it."""
        path = path or self.plan.path(sum(scheduled.values()))
        counts = {rid: len(d) for rid, d in drafts.items()} if drafts else None
        batch, logits = self.runner.run(states, scheduled, path, counts)
        masks = self.sampling.masks(batch.sample_ids) if batch.sample_ids and self.driver else None
        result = ExecutorOutput()
        if batch.score_spans:
            logits, hidden = logits
            result.prompt_logprobs = prompt_logprobs(self.model.head, hidden, batch)
        for rid, n in scheduled.items():
            states[rid].num_computed += n
        if batch.sample_ids:
            self._sample(logits, batch, masks, states, result, drafts or {})
        return result

    def _sample(self, logits, batch, masks, states, result: ExecutorOutput, drafts) -> None:
        if self.driver:
            out = self.sampler.sample(logits, batch.sample_rows, self.sampling.counts, masks)
            if self.tp is not None:
                self.tp.share_tokens(out.tokens, len(out.tokens))
        else:  # rank 0's tokens (the logprobs stay with rank 0)
            tokens = self.tp.share_tokens(None, len(batch.sample_ids))
            out = Sampled(tokens, [0.0] * len(tokens), {})
        slots: list[int] = []
        toks: list[int] = []
        i = 0
        while i < len(batch.sample_ids):
            rid = batch.sample_ids[i]
            st, d = states[rid], drafts.get(rid, ())
            rows = range(i, i + len(d) + 1)
            i = rows.stop
            if not all(math.isfinite(out.logprobs[r]) for r in rows):
                result.failed[rid] = "the model produced non-finite logits"
                continue
            # Verification: each row's token is the one the target draws there (same noise key
            # as without drafts); a draft is kept while it equals that token. So outputs are
            # those of plain decoding, token for token, greedy and seeded alike.
            kept = 0
            while kept < len(d) and out.tokens[rows[kept]] == d[kept]:
                kept += 1
            if d:
                del st.tokens[len(st.tokens) - len(d) + kept :]
                st.num_computed -= len(d) - kept
            error = None
            for r in rows[: kept + 1] if self.driver else ():
                error = self.sampling.accept(rid, st, out.tokens[r], slots, toks)
                if error is not None:
                    break
            if error is not None:
                result.failed[rid] = error
                continue
            last = rows[kept]
            st.tokens.append(out.tokens[last])
            result.sampled_token_ids[rid] = out.tokens[last]
            result.logprobs[rid] = out.logprobs[last]
            if last in out.top:
                result.top_logprobs[rid] = out.top[last]
            if d:
                result.accepted_token_ids[rid] = list(d[:kept])
                result.accepted_logprobs[rid] = [out.logprobs[r] for r in rows[:kept]]
                result.accepted_top_logprobs[rid] = [out.top.get(r) for r in rows[:kept]]
        if self.driver:
            self.sampling.flush(slots, toks)


def _grammar_engine(tokenizer: ChatTokenizer, model: CausalLM):
    """A factory: the grammar engine is built on the first request with a grammar."""

    def make():
        from tierserve.grammar.engine import GrammarEngine

        c = model.config
        return GrammarEngine(tokenizer.tokenizer.to_str(), list(c.eos_token_ids), c.vocab_size)

    return make
