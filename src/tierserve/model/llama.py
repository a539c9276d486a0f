"""Llama-family decoder (Llama, Mistral, Qwen2) over a flat mixed batch with a paged KV cache.

Linear weights are `Linear` layers (`model/linear.py`) in the precision the loader chose
(float32, or a GGUF block format run by the quantized kernels), fused where it saves calls (q/k/v
into one projection, gate/up into another) and stored ``[in, out]``. Logits are computed only
for the rows that sample.

A step runs one of the paths of `model/plan.py`, chosen per step size by measurement: whole
fused decoder layers in C++, op by op with the kernel GEMMs, op by op with BLAS, or the
pure-PyTorch reference (``kernels=False`` or ``TIERSERVE_KERNELS=off``: always). Attention runs
in the backend that built the step's metadata (`model/attention/`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tierserve import kernels as _kernels
from tierserve.model.attention import (
    AttentionBackend,
    AttentionMetadata,
    KernelPagedAttention,
    TorchPagedAttention,
)
from tierserve.model.config import ModelConfig
from tierserve.model.layers import apply_rope, rms_norm, rope_cos_sin, rope_inv_freq
from tierserve.model.linear import Linear
from tierserve.model.plan import (
    NEVER,
    PATHS,
    TORCH_ONLY,
    StepPlan,
    uses_kernel_attention,
)
from tierserve.model.weights import QuantPolicy, WeightBuilder

log = logging.getLogger(__name__)


@dataclass
class _Layer:
    qkv: Linear  # q, k, v stacked along the output
    o: Linear
    gate_up: Linear  # gate and up stacked along the output
    down: Linear
    ln_attn: torch.Tensor
    ln_mlp: torch.Tensor


class LlamaModel:
    def __init__(
        self,
        config: ModelConfig,
        weights,  # dict or LazyWeights; tensors are popped (taken over) as they are used
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        kernels: bool | None = None,  # None: use them where they apply and load
        quantization: str = "auto",
        activations: str = "float32",
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        self.kernels = None
        if kernels is not False and self.device.type == "cpu" and dtype == torch.float32:
            self.kernels = _kernels.get()
        if kernels and self.kernels is None:
            raise RuntimeError("kernels=True, but the compiled kernels do not apply or load")
        b = WeightBuilder(
            weights, QuantPolicy(quantization), self.kernels, self.device, dtype, activations
        )
        self.torch_attention = TorchPagedAttention()
        self.kernel_attention = KernelPagedAttention(self.kernels) if self.kernels else None
        self.norm = b.dense_tensor("model.norm.weight")
        # The vocabulary head is stored [hidden, vocab] like every other weight; tied embeddings
        # are looked up in that same copy (`Embedding.tied`), so tying still costs one table.
        tied = config.tie_word_embeddings or not b.has("lm_head.weight")
        self.lm_head = b.linear(["model.embed_tokens.weight" if tied else "lm_head.weight"], True)
        self.embed = b.embedding("model.embed_tokens.weight", self.lm_head if tied else None)
        self.layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            qkv_bias = [a + f"{x}_proj.bias" for x in "qkv"] if config.attention_bias else None
            self.layers.append(
                _Layer(
                    qkv=b.linear([a + f"{x}_proj.weight" for x in "qkv"], bias=qkv_bias),
                    o=b.linear([a + "o_proj.weight"]),
                    gate_up=b.linear([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]),
                    down=b.linear([p + "mlp.down_proj.weight"]),
                    ln_attn=b.dense_tensor(p + "input_layernorm.weight"),
                    ln_mlp=b.dense_tensor(p + "post_attention_layernorm.weight"),
                )
            )
        self.weights_summary = b.summary()
        self.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling).to(
            self.device
        )
        log.info("weights: %s", self.weights_summary)

    def weight_bytes(self) -> int:
        """Bytes of every linear weight as stored (what a decode step reads)."""
        lins = [self.lm_head] + [
            lin for ly in self.layers for lin in (ly.qkv, ly.o, ly.gate_up, ly.down)
        ]
        return sum(lin.nbytes for lin in lins)

    def paths(self, block_size: int) -> tuple[str, ...]:
        """The step paths this model can run here (`model/plan.py`)."""
        if self.kernels is None:
            return ("torch",)
        c = self.config
        if not self.kernel_attention.supports(
            c.num_heads // c.num_kv_heads, c.head_dim, block_size
        ):
            return ("mixed", "torch")
        return PATHS

    def default_plan(self, block_size: int) -> StepPlan:
        """The plan before (or without) measurement: the kernels wherever they apply."""
        paths = self.paths(block_size)
        if paths == ("torch",):
            return TORCH_ONLY
        if "fused" not in paths:
            return StepPlan(((NEVER, paths[0]),))
        return StepPlan()

    def backend(self, path: str) -> AttentionBackend:
        return self.kernel_attention if uses_kernel_attention(path) else self.torch_attention

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        c = self.config
        return (c.num_kv_heads, num_blocks, block_size, c.head_dim)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_rows: torch.Tensor,
        hidden_rows: torch.Tensor | None = None,
        blas: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """input_ids, positions: [T]. Returns float32 logits for `logits_rows` only: [S, V]; with
        `hidden_rows`, also those rows' final (normed) hidden states, [H, D], for `head`.
        `meta` built fused runs fused layers; `blas`: the GEMMs through BLAS."""
        c = self.config
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.dtype)
        x = self.embed(input_ids)
        t = x.shape[0]
        k_end = c.q_size + c.kv_size
        inter = c.intermediate_size
        heads = c.num_heads + c.num_kv_heads
        if getattr(meta, "fused", False):
            x = self._forward_fused(x, cos, sin, meta, kv_caches)
            return self._outputs(x, logits_rows, hidden_rows, blas)
        attention = meta.backend
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            h = rms_norm(x, layer.ln_attn, c.rms_norm_eps)
            qkv = layer.qkv(h, blas)
            # Queries and keys rotated together: one rope over [T, heads + kv_heads, D].
            qk = apply_rope(qkv[:, :k_end].view(t, heads, c.head_dim), cos, sin)
            q, k = qk[:, : c.num_heads], qk[:, c.num_heads :]
            v = qkv[:, k_end:].view(t, c.num_kv_heads, c.head_dim)
            attn = attention.forward(q, k, v, k_cache, v_cache, meta)
            x = layer.o.add_into(x, attn.reshape(t, c.q_size), blas)  # the residual, in place
            h = rms_norm(x, layer.ln_mlp, c.rms_norm_eps)
            gu = layer.gate_up(h, blas)
            act = F.silu(gu[:, :inter], inplace=True).mul_(gu[:, inter:])  # in gu's memory
            x = layer.down.add_into(x, act, blas)
        return self._outputs(x, logits_rows, hidden_rows, blas)

    def head(self, hidden: torch.Tensor, blas: bool = False) -> torch.Tensor:
        """float32 logits of final (normed) hidden states."""
        return self.lm_head(hidden, blas).float()

    def _outputs(self, x, logits_rows, hidden_rows, blas):
        eps = self.config.rms_norm_eps
        logits = self.head(rms_norm(x.index_select(0, logits_rows), self.norm, eps), blas)
        if hidden_rows is None:
            return logits
        return logits, rms_norm(x.index_select(0, hidden_rows.to(x.device)), self.norm, eps)

    def _forward_fused(self, x, cos, sin, meta, kv_caches) -> torch.Tensor:
        """Every row attends through kernel segments: one compiled call per layer. Returns the
        last layer's output for every row."""
        c = self.config
        cos, sin = cos[:, 0].contiguous(), sin[:, 0].contiguous()
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            self.kernels.decoder_layer(
                x, layer.qkv.kernel_weight, layer.qkv.bias, layer.o.kernel_weight,
                layer.gate_up.kernel_weight, layer.down.kernel_weight,
                layer.ln_attn, layer.ln_mlp, cos, sin, k_cache, v_cache, meta.slot_mapping,
                meta.tables, meta.segments, c.num_heads, c.rms_norm_eps,
            )  # fmt: skip
        return x
