"""Llama-family decoder (Llama, Mistral, Qwen2) over a flat mixed batch with a paged KV cache.

Weights are held as plain tensors, fused where it saves matmul calls (q/k/v into one projection,
gate/up into another) and stored transposed, ``[in, out]``, because ``x @ W_t`` is measurably
faster than ``linear(x, W)`` for the small batch sizes of decoding on CPU BLAS. Logits are
computed only for the rows that sample.

On the CPU in float32 the compiled kernels (`tierserve.kernels`) take the products of up to
`KERNEL_MAX_ROWS` rows (decode steps: BLAS is far from the memory and FMA bounds there), and of
any size where a start-up check finds the kernel faster than BLAS at `PROBE_ROWS` rows (it is
where the BLAS runs a generic code path, as MKL does on AMD CPUs); all attention over cached
context; and whole fused layers in steps of up to `FUSED_MAX_ROWS` rows. ``kernels=False`` (or
``TIERSERVE_KERNELS=off``) runs the pure-PyTorch path, the reference the kernels are tested
against.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tierserve import kernels as _kernels
from tierserve.model.attention import AttentionMetadata, paged_attention
from tierserve.model.config import ModelConfig
from tierserve.model.layers import apply_rope, rms_norm, rope_cos_sin, rope_inv_freq

log = logging.getLogger(__name__)


@dataclass
class _Layer:
    w_qkv: torch.Tensor  # all [in, out]
    b_qkv: torch.Tensor | None
    w_o: torch.Tensor
    w_gate_up: torch.Tensor
    w_down: torch.Tensor
    ln_attn: torch.Tensor
    ln_mlp: torch.Tensor


def _t(w: torch.Tensor) -> torch.Tensor:
    return w.t().contiguous()


KERNEL_MAX_ROWS = 128  # the kernel beats BLAS below this everywhere measured
FUSED_MAX_ROWS = 128  # beyond, prompts attend through SDPA (faster for long fresh prompts)
PROBE_ROWS = 512


def _faster_than_blas(kernels, w_t: torch.Tensor, rows: int = PROBE_ROWS) -> bool:
    """Times one weight at `rows` rows both ways (best of 3 each, interleaved: ~50 ms)."""
    x, out = torch.randn(rows, w_t.shape[0]), torch.empty(rows, w_t.shape[1])
    best = {True: float("inf"), False: float("inf")}
    for _ in range(3):
        for use in (True, False):
            t0 = time.perf_counter()
            if use:
                kernels.linear_into(x, w_t, None, out, False)
            else:
                torch.mm(x, w_t, out=out)
            best[use] = min(best[use], time.perf_counter() - t0)
    return best[True] < best[False]


class LlamaModel:
    def __init__(
        self,
        config: ModelConfig,
        weights,  # dict or LazyWeights; tensors are popped (taken over) as they are used
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        kernels: bool | None = None,  # None: use them where they apply and load
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        self.kernels = None
        if kernels is not False and self.device.type == "cpu" and dtype == torch.float32:
            self.kernels = _kernels.get()
        if kernels and self.kernels is None:
            raise RuntimeError("kernels=True, but the compiled kernels do not apply or load")

        def w(name: str) -> torch.Tensor:
            # Take ownership (pop) so the source's copy can be freed as the model is built.
            if name not in weights:
                raise KeyError(f"weight {name!r} missing from the checkpoint")
            return weights.pop(name).to(self.device, dtype)

        # The vocabulary head is stored [hidden, vocab] like every other weight (the GEMM kernel
        # and BLAS are both faster on x @ W_t at decode sizes); tied embeddings are looked up in
        # that same copy (`_embed`), so tying still costs one table.
        embed = w("model.embed_tokens.weight")
        self.norm = w("model.norm.weight")
        if "lm_head.weight" in weights and not config.tie_word_embeddings:
            self.embed: torch.Tensor | None = embed
            self.head_t = _t(w("lm_head.weight"))
        else:
            self.embed = None
            self.head_t = _t(embed)
        del embed
        self.layers = []
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            bias = None
            if config.attention_bias:
                bias = torch.cat([w(a + f"{x}_proj.bias") for x in "qkv"])
            self.layers.append(
                _Layer(
                    w_qkv=_t(torch.cat([w(a + f"{x}_proj.weight") for x in "qkv"])),
                    b_qkv=bias,
                    w_o=_t(w(a + "o_proj.weight")),
                    w_gate_up=_t(
                        torch.cat([w(p + "mlp.gate_proj.weight"), w(p + "mlp.up_proj.weight")])
                    ),
                    w_down=_t(w(p + "mlp.down_proj.weight")),
                    ln_attn=w(p + "input_layernorm.weight"),
                    ln_mlp=w(p + "post_attention_layernorm.weight"),
                )
            )
        self.inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling).to(
            self.device
        )
        self.kernel_max_rows = KERNEL_MAX_ROWS
        if self.kernels is not None and _faster_than_blas(self.kernels, self.layers[0].w_gate_up):
            self.kernel_max_rows = 1 << 62
        if self.kernels is not None:
            log.info("GEMM kernel for up to %d rows, BLAS beyond", self.kernel_max_rows)

    def uses_kernel_attention(self, block_size: int) -> bool:
        c = self.config
        return self.kernels is not None and self.kernels.attention_supported(
            c.num_heads // c.num_kv_heads, c.head_dim, block_size
        )

    def _mm(self, x: torch.Tensor, w_t: torch.Tensor, bias: torch.Tensor | None = None):
        if self.kernels is not None and x.shape[0] <= self.kernel_max_rows:
            out = x.new_empty((x.shape[0], w_t.shape[1]))
            self.kernels.linear_into(x, w_t, bias, out, False)
            return out
        return torch.mm(x, w_t) if bias is None else torch.addmm(bias, x, w_t)

    def _mm_add_(self, x: torch.Tensor, a: torch.Tensor, w_t: torch.Tensor) -> torch.Tensor:
        """x + a @ w_t (the residual), in x's memory on the kernel path."""
        if self.kernels is not None and x.shape[0] <= self.kernel_max_rows:
            self.kernels.linear_into(a, w_t, None, x, True)
            return x
        return torch.addmm(x, a, w_t)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            return F.embedding(ids, self.embed)
        return self.head_t.index_select(1, ids).t().contiguous()

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
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """input_ids, positions: [T]. Returns float32 logits for `logits_rows` only: [S, V]; with
        `hidden_rows`, also those rows' final (normed) hidden states, [H, D], for `head`."""
        c = self.config
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.dtype)
        x = self._embed(input_ids)
        t = x.shape[0]
        k_end = c.q_size + c.kv_size
        inter = c.intermediate_size
        heads = c.num_heads + c.num_kv_heads
        ext = self.kernels if meta.segments is not None else None
        if ext is not None and meta.all_decode and t <= FUSED_MAX_ROWS:
            x = self._forward_fused(x, cos, sin, meta, kv_caches)
            return self._outputs(x, logits_rows, hidden_rows)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            h = rms_norm(x, layer.ln_attn, c.rms_norm_eps)
            qkv = self._mm(h, layer.w_qkv, layer.b_qkv)
            # Queries and keys rotated together: one rope over [T, heads + kv_heads, D].
            qk = apply_rope(qkv[:, :k_end].view(t, heads, c.head_dim), cos, sin)
            q, k = qk[:, : c.num_heads], qk[:, c.num_heads :]
            v = qkv[:, k_end:].view(t, c.num_kv_heads, c.head_dim)
            attn = paged_attention(q, k, v, k_cache, v_cache, meta, ext)
            x = self._mm_add_(x, attn.reshape(t, c.q_size), layer.w_o)  # residual in the GEMM
            h = rms_norm(x, layer.ln_mlp, c.rms_norm_eps)
            gu = self._mm(h, layer.w_gate_up)
            act = F.silu(gu[:, :inter], inplace=True).mul_(gu[:, inter:])  # in gu's memory
            x = self._mm_add_(x, act, layer.w_down)
        return self._outputs(x, logits_rows, hidden_rows)

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits of final (normed) hidden states."""
        return self._mm(hidden, self.head_t).float()

    def _outputs(self, x, logits_rows, hidden_rows):
        eps = self.config.rms_norm_eps
        logits = self.head(rms_norm(x.index_select(0, logits_rows), self.norm, eps))
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
                x, layer.w_qkv, layer.b_qkv, layer.w_o, layer.w_gate_up, layer.w_down,
                layer.ln_attn, layer.ln_mlp, cos, sin, k_cache, v_cache, meta.slot_mapping,
                meta.tables, meta.segments, c.num_heads, c.rms_norm_eps,
            )  # fmt: skip
        return x
