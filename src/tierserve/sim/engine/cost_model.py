"""Step time from FLOPs and bytes against a hardware profile, with tensor parallelism.

For one step over requests ``r`` with ``n_r`` new tokens ending at context ``c_r`` (``T = sum n_r``
tokens, ``S`` of which sample a token):

* linear FLOPs ``2 * P_layers * T`` and head FLOPs ``2 * V * H * S``, split over ``tp`` devices,
  at ``peak_flops * compute_efficiency``;
* attention FLOPs ``4 * L * H_q * D * sum_r (n_r * c0_r + n_r (n_r + 1) / 2)`` (QK^T and PV
  over each new token's context, ``c0_r = c_r - n_r``) at ``peak_flops * attention_efficiency``;
* bytes: weights once per step (``P * dtype``, the head only if some row samples) at
  ``mem_bandwidth * memory_efficiency``; the KV of every request's context read once and the new
  tokens' KV written, at ``mem_bandwidth * kv_memory_efficiency``; split over ``tp``;
* roofline mode: ``max(compute, memory)``; additive mode: their sum (fitted on a CPU);
* tensor parallel, as the engine runs it (`executor/parallel.py`): an all-reduce after each
  row-parallel projection (two per layer) and one after the vocabulary-parallel embedding
  lookup, each over ``T * H * dtype`` bytes at ring cost ``latency + 2 (tp - 1) / tp * bytes /
  bus_bandwidth``; the head's logits gathered (``S * V`` float32, ``latency + (tp - 1) / tp *
  bytes / bus_bandwidth``); rank 0's sampled tokens broadcast (``latency``);
* a fixed overhead per step and per scheduled request.

Swapping ``b`` blocks costs ``b * block_bytes / tp / pcie_bandwidth`` (each device moves its
shard). KV capacity is device memory minus weights minus activation headroom.
"""

from __future__ import annotations

from dataclasses import dataclass

from tierserve.sim.calibration.profiles import HardwareProfile, ModelProfile


@dataclass(frozen=True)
class StepCost:
    seconds: float
    flops: float  # total across devices
    bytes: float  # total across devices
    compute_s: float
    memory_s: float
    comm_s: float


class CostModel:
    def __init__(self, hw: HardwareProfile, model: ModelProfile, tp: int = 1) -> None:
        if tp < 1:
            raise ValueError(f"tensor parallel size must be >= 1, got {tp}")
        self.hw, self.model, self.tp = hw, model, tp
        c = model.config
        self.dtype = model.dtype_bytes
        h, i = c.hidden_size, c.intermediate_size
        self.layer_params = c.num_layers * (
            h * (c.q_size + 2 * c.kv_size) + c.q_size * h + 3 * h * i
        )
        self.head_params = c.vocab_size * h
        self.weight_bytes = c.num_parameters() * self.dtype
        self.kv_bytes_per_token = c.kv_bytes_per_token(self.dtype)
        self.attn_coeff = 4 * c.num_layers * c.num_heads * c.head_dim

    # -- memory --------------------------------------------------------------------------
    def kv_capacity_tokens(self) -> int:
        hw = self.hw
        per_device = hw.memory_bytes - self.weight_bytes / self.tp - hw.activation_headroom_bytes
        if per_device <= 0:
            raise ValueError(
                f"{self.model.name} does not fit on {self.tp} x {hw.name}: weights "
                f"{self.weight_bytes / 1e9:.0f} GB"
            )
        return int(per_device * self.tp // self.kv_bytes_per_token)

    def kv_bytes_per_block(self, block_size: int) -> int:
        return self.kv_bytes_per_token * block_size

    # -- time ----------------------------------------------------------------------------
    def features(self, chunks: list[tuple[int, int]], num_sampled: int) -> tuple[float, ...]:
        """(tokens, linear FLOPs, attention FLOPs, weight bytes, KV bytes) of a step, all
        devices."""
        tokens = sum(n for n, _ in chunks)
        attn_pairs = sum(n * (c - n) + n * (n + 1) / 2 for n, c in chunks)
        lin_flops = 2 * self.layer_params * tokens + 2 * self.head_params * num_sampled
        attn_flops = self.attn_coeff * attn_pairs
        weights = self.layer_params + (self.head_params if num_sampled else 0)
        ctx_tokens = sum(c for _, c in chunks)
        # Weights once; every context's KV read once; the new tokens' KV written.
        kv_bytes = (ctx_tokens + tokens) * self.kv_bytes_per_token
        return tokens, lin_flops, attn_flops, weights * self.dtype, kv_bytes

    def step(self, chunks: list[tuple[int, int]], num_sampled: int) -> StepCost:
        """`chunks`: (new tokens, context length after the step) per scheduled request."""
        hw, tp = self.hw, self.tp
        tokens, lin_flops, attn_flops, w_bytes, kv_bytes = self.features(chunks, num_sampled)
        if tokens == 0:
            return StepCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        kv_eff = hw.kv_memory_efficiency or hw.memory_efficiency
        nbytes = w_bytes + kv_bytes
        compute = lin_flops / tp / (hw.peak_flops * hw.compute_efficiency) + attn_flops / tp / (
            hw.peak_flops * hw.attention_efficiency
        )
        memory = w_bytes / tp / (hw.mem_bandwidth * hw.memory_efficiency) + kv_bytes / tp / (
            hw.mem_bandwidth * kv_eff
        )
        body = max(compute, memory) if hw.mode == "roofline" else compute + memory
        comm = 0.0
        if tp > 1:
            c, lat, bus = self.model.config, hw.allreduce_latency_s, hw.allreduce_bus_bandwidth
            msg = tokens * c.hidden_size * self.dtype
            one = lat + 2 * (tp - 1) / tp * msg / bus
            comm = (2 * c.num_layers + 1) * one
            if num_sampled:
                comm += lat + (tp - 1) / tp * num_sampled * c.vocab_size * 4 / bus  # logits
                comm += lat  # the sampled tokens, from rank 0
        seconds = hw.step_overhead_s + hw.per_seq_overhead_s * len(chunks) + body + comm
        return StepCost(seconds, lin_flops + attn_flops, nbytes, compute, memory, comm)

    def swap_seconds(self, num_blocks: int, block_size: int) -> float:
        return num_blocks * self.kv_bytes_per_block(block_size) / self.tp / self.hw.pcie_bandwidth

    def prefill_tokens_per_s(self, chunk: int = 2048) -> float:
        return chunk / self.step([(chunk, chunk)], 1).seconds
