"""The shared decoder: a pre-norm transformer over a flat mixed batch with a paged KV cache,
Llama's layer by default, with the knobs the registered architectures turn (`model/models/`).

An architecture file subclasses `DecoderLM` and overrides only what differs:

* class attributes: ``norm_offset`` (RMSNorm scales by ``offset + weight``: Gemma's ``1 + w``),
  ``qk_norm`` (per-head RMSNorm of queries and keys before rope: Qwen3, Gemma3),
  ``sandwich_norms`` (a norm after attention and after the MLP, before each residual add:
  Gemma), ``scale_embeddings`` (embeddings times sqrt(hidden): Gemma), ``gguf_architecture``;
* ``settings(hf_config)``: what it reads from config.json into ``config.extra``;
* ``attention_spec(i)`` / ``rope_index(i)`` / ``build_ropes()``: each layer's attention (scale,
  sliding window, soft-cap: `AttentionSpec`) and rotary embedding;
* ``attention_weights`` / ``mlp_weights``: checkpoint names (Phi3's are fused already).

The gate's activation (``hidden_act``) and a final logit soft-cap (``final_logit_softcapping``)
are read from ``config.extra`` when the architecture's settings put them there.

Linear weights are `Linear` layers (`model/linear.py`) in the precision the loader chose,
fused where it saves calls (q/k/v into one projection, gate/up into another), biases wherever
the checkpoint has them. Logits are computed only for the rows that sample. A step runs one of
the paths of `model/plan.py`; layers that are exactly Llama's may run whole in C++
(`kernels/csrc/layer.cpp`), the others op by op, attention in the backend that built the
step's metadata (`model/attention/`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from tierserve.model.attention import PLAIN, AttentionMetadata, AttentionSpec
from tierserve.model.base import CausalLM
from tierserve.model.config import ModelConfig
from tierserve.model.layers import Rope, activation, rms_norm
from tierserve.model.linear import Linear
from tierserve.model.plan import StepPlan
from tierserve.model.sharding import ShardedWeights, shard_config, vocab_per_rank
from tierserve.model.weights import QuantPolicy, WeightBuilder

log = logging.getLogger(__name__)


@dataclass
class DecoderLayer:
    qkv: Linear  # q, k, v stacked along the output
    o: Linear
    gate_up: Linear  # gate and up stacked along the output
    down: Linear
    ln_attn: torch.Tensor
    ln_mlp: torch.Tensor
    attn: AttentionSpec = PLAIN
    rope: int = 0  # index into the model's ropes
    qk_norm: torch.Tensor | None = None  # [heads + kv_heads, head_dim]: q's weight, then k's
    post_attn: torch.Tensor | None = None  # sandwich norms: the sublayer's output is normed
    post_mlp: torch.Tensor | None = None


class DecoderLM(CausalLM):
    norm_offset = 0.0
    qk_norm = False
    sandwich_norms = False
    scale_embeddings = False
    gguf_architecture: str | None = None  # general.architecture of its GGUF files (None: none)
    gguf_rope_permuted = True  # llama.cpp permuted q/k for its interleaved rope (llama only)

    @classmethod
    def settings(cls, hf: dict) -> dict:
        """The architecture's own settings from a config.json, kept in ``config.extra``."""
        act = hf.get("hidden_act") or hf.get("hidden_activation")
        return {"hidden_act": act} if act else {}

    def attention_spec(self, i: int) -> AttentionSpec:
        return PLAIN

    def rope_index(self, i: int) -> int:
        return 0

    def build_ropes(self) -> list[Rope]:
        c = self.config
        return [Rope(c.head_dim, c.rope_theta, c.rope_scaling, device=self.device)]

    def __init__(
        self,
        config: ModelConfig,
        weights,  # dict or LazyWeights; tensors are popped (taken over) as they are used
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        kernels: bool | None = None,  # None: use them where they apply and load
        quantization: str = "auto",
        activations: str = "float32",  # the quantized kernels' products (model/weights.py)
        tp=None,  # executor.parallel.TPGroup: build rank tp.rank's shard (model/sharding.py)
    ) -> None:
        self.tp = tp if tp is not None and tp.size > 1 else None
        if self.tp is not None:  # this rank's heads and widths, its part of every weight
            full = config
            config = shard_config(full, tp.size)
            weights = ShardedWeights(weights, full, tp.rank, tp.size)
            self.vocab_part = vocab_per_rank(full.vocab_size, tp.size)
        super().__init__(config, device, dtype, kernels)
        # bfloat16 GEMMs (the `bf16` path) only where reduced-precision products were accepted
        # (auto, bfloat16, int8): `--activations float32` keeps every product in float32.
        self.bf16_gemms = activations != "float32"
        self.act = activation(config.extra.get("hidden_act", "silu"))
        self.act_name = config.extra.get("hidden_act", "silu")
        self.logit_softcap = config.extra.get("final_logit_softcapping")
        self.embed_scale = config.hidden_size**0.5 if self.scale_embeddings else None
        b = WeightBuilder(
            weights, QuantPolicy(quantization), self.kernels, self.device, dtype, activations
        )
        self.ropes = self.build_ropes()
        self.norm = self.norm_weight(b, "model.norm")
        # The vocabulary head is stored [hidden, vocab] like every other weight; tied embeddings
        # are looked up in that same copy (`Embedding.tied`), so tying still costs one table.
        tied = config.tie_word_embeddings or not b.has("lm_head.weight")
        self.lm_head = b.linear(["model.embed_tokens.weight" if tied else "lm_head.weight"], True)
        self.embed = b.embedding("model.embed_tokens.weight", self.lm_head if tied else None)
        self.layers = [self.build_layer(b, i) for i in range(config.num_layers)]
        self.weights_summary = b.summary()
        log.info("%s weights: %s", config.architecture, self.weights_summary)

    # -- loading ---------------------------------------------------------------------------
    def linear(self, b: WeightBuilder, names: list[str], head: bool = False) -> Linear:
        """One `Linear` of the weights `names` (without ``.weight``), stacked; with their
        biases when the checkpoint has them."""
        bias = [n + ".bias" for n in names] if b.has(names[0] + ".bias") else None
        return b.linear([n + ".weight" for n in names], head, bias)

    def norm_weight(self, b: WeightBuilder, name: str) -> torch.Tensor:
        w = b.dense_tensor(name + ".weight")
        return w + self.norm_offset if self.norm_offset else w

    def attention_weights(self, b: WeightBuilder, p: str) -> tuple[Linear, Linear]:
        a = p + "self_attn."
        return self.linear(b, [a + f"{x}_proj" for x in "qkv"]), self.linear(b, [a + "o_proj"])

    def mlp_weights(self, b: WeightBuilder, p: str) -> tuple[Linear, Linear]:
        m = p + "mlp."
        return self.linear(b, [m + "gate_proj", m + "up_proj"]), self.linear(b, [m + "down_proj"])

    def build_layer(self, b: WeightBuilder, i: int) -> DecoderLayer:
        c, p = self.config, f"model.layers.{i}."
        qkv, o = self.attention_weights(b, p)
        gate_up, down = self.mlp_weights(b, p)
        layer = DecoderLayer(
            qkv, o, gate_up, down, self.norm_weight(b, p + "input_layernorm"), None,
            self.attention_spec(i), self.rope_index(i),
        )  # fmt: skip
        if self.sandwich_norms:
            layer.post_attn = self.norm_weight(b, p + "post_attention_layernorm")
            layer.ln_mlp = self.norm_weight(b, p + "pre_feedforward_layernorm")
            layer.post_mlp = self.norm_weight(b, p + "post_feedforward_layernorm")
        else:
            layer.ln_mlp = self.norm_weight(b, p + "post_attention_layernorm")
        if self.qk_norm:
            q = self.norm_weight(b, p + "self_attn.q_norm")
            k = self.norm_weight(b, p + "self_attn.k_norm")
            layer.qk_norm = torch.cat([q.expand(c.num_heads, -1), k.expand(c.num_kv_heads, -1)])
        return layer

    def layer_linears(self) -> list[Linear]:
        return [lin for ly in self.layers for lin in (ly.qkv, ly.o, ly.gate_up, ly.down)]

    def weight_bytes(self) -> int:
        return sum(lin.nbytes for lin in [self.lm_head, *self.layer_linears()])

    def use_plan(self, plan: StepPlan) -> None:
        """The layers' bfloat16 copies exist while the plan runs the ``bf16`` path (the head
        stays on the kernel: its rows are the step's few logits rows)."""
        keep = any(p == "bf16" for _, p in plan.table)
        for lin in self.layer_linears():
            lin.make_bf16() if keep else lin.drop_bf16()

    def bf16_bytes(self) -> int:
        """Bytes held in bfloat16 weight copies (`use_plan`)."""
        return sum(lin.bf16_t.nbytes for lin in self.layer_linears() if lin.bf16_t is not None)

    # -- which step paths apply ------------------------------------------------------------
    def attention_supported_by_kernel(self, block_size: int) -> bool:
        c = self.config
        group = c.num_heads // c.num_kv_heads
        specs = {ly.attn for ly in self.layers}
        return all(self.kernel_attention.supports(s, group, c.head_dim, block_size) for s in specs)

    def has_fused_layer(self) -> bool:
        """Llama's layer exactly: RMSNorm, qkv (+bias), rotate-half rope over whole heads, plain GQA
        attention, o, RMSNorm, SiLU-gated MLP, no other bias (`kernels/csrc/layer.cpp`)."""
        d = self.config.head_dim
        return (
            self.act_name in ("silu", "swish")
            and len(self.ropes) == 1
            and self.ropes[0].full  # any Rope: the fused layer takes its cos/sin tables
            and all(
                ly.attn.plain(d)
                and ly.qk_norm is None
                and ly.post_attn is None
                and ly.post_mlp is None
                and ly.o.bias is None
                and ly.gate_up.bias is None
                and ly.down.bias is None
                for ly in self.layers
            )
        )

    # -- the step --------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_rows: torch.Tensor,
        hidden_rows: torch.Tensor | None = None,
        blas: bool | str = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """input_ids, positions: [T]. Returns float32 logits for `logits_rows` only: [S, V]; with
        `hidden_rows`, also those rows' final (normed) hidden states, [H, D], for `head`.
        `meta` built fused runs fused layers; `blas`: the GEMMs through BLAS (``"bf16"``: in
        bfloat16)."""
        x = self._embed(input_ids)
        if self.embed_scale is not None:
            x = x.mul_(torch.tensor(self.embed_scale, dtype=x.dtype))
        if getattr(meta, "fused", False):
            x = self._forward_fused(
                x, self.ropes[0].cos_sin(positions, self.dtype), meta, kv_caches
            )
            return self._outputs(x, logits_rows, hidden_rows, blas)
        tables = [rope.cos_sin(positions, self.dtype) for rope in self.ropes]
        meta.fresh_dtype = torch.bfloat16 if blas == "bf16" else None
        hook, last = self.layer_hook, len(self.layers) - 1
        for i, (layer, kv) in enumerate(zip(self.layers, kv_caches, strict=True)):
            x = self.layer_forward(layer, x, tables[layer.rope], meta, kv, blas)
            if hook is not None and i < last:
                hook()
        return self._outputs(x, logits_rows, hidden_rows, blas)

    def layer_forward(self, ly: DecoderLayer, x, cos_sin, meta, kv, blas) -> torch.Tensor:
        eps, inter = self.config.rms_norm_eps, self.config.intermediate_size
        attn = self.attention(ly, rms_norm(x, ly.ln_attn, eps), cos_sin, meta, kv, blas)
        x = self._residual(x, ly.o, attn, ly.post_attn, blas)
        gu = ly.gate_up(rms_norm(x, ly.ln_mlp, eps), blas, widen=False)  # bf16: gated in bf16
        act = self.act(gu[:, :inter]).mul_(gu[:, inter:])
        return self._residual(x, ly.down, act, ly.post_mlp, blas)

    def attention(self, ly: DecoderLayer, h, cos_sin, meta, kv, blas) -> torch.Tensor:
        c = self.config
        t, d, heads = h.shape[0], c.head_dim, c.num_heads + c.num_kv_heads
        k_end = c.q_size + c.kv_size
        qkv = ly.qkv(h, blas)
        qk = qkv[:, :k_end].view(t, heads, d)
        if ly.qk_norm is not None:
            qk = rms_norm(qk, None, c.rms_norm_eps).mul_(ly.qk_norm)
        # Queries and keys rotated together: one rope over [T, heads + kv_heads, D].
        qk = self.ropes[ly.rope].apply(qk, *cos_sin)
        q, k = qk[:, : c.num_heads], qk[:, c.num_heads :]
        v = qkv[:, k_end:].view(t, c.num_kv_heads, d)
        out = meta.backend.forward(q, k, v, kv[0], kv[1], meta, ly.attn)
        return out.reshape(t, c.q_size)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp is None:
            return self.embed(ids)
        # this rank's rows of the vocabulary; the others' ids look up zeros; summed over ranks
        local = ids - self.tp.rank * self.vocab_part
        outside = (local < 0) | (local >= self.vocab_part)
        x = self.embed(local.masked_fill(outside, 0))
        return self.tp.all_reduce(x.masked_fill_(outside[:, None], 0.0))

    def _residual(self, x, lin: Linear, h, post_norm, blas) -> torch.Tensor:
        """x += lin(h), normed first under sandwich norms; in x's memory. Tensor parallel: lin
        is row-parallel, its partial products summed over the ranks first."""
        if self.tp is not None:
            y = self.tp.all_reduce(lin(h, blas))
            if post_norm is not None:
                y = rms_norm(y, post_norm, self.config.rms_norm_eps)
            return x.add_(y)
        if post_norm is None:
            return lin.add_into(x, h, blas)
        return x.add_(rms_norm(lin(h, blas), post_norm, self.config.rms_norm_eps))

    def head(self, hidden: torch.Tensor, blas: bool | str = False) -> torch.Tensor:
        """float32 logits of final (normed) hidden states (the ``bf16`` path's on the kernel)."""
        logits = self.lm_head(hidden, False if blas == "bf16" else blas).float()
        if self.tp is not None:  # this rank's columns of the vocabulary -> all of them
            logits = self.tp.gather_logits(logits, self.config.vocab_size)
        cap = self.logit_softcap
        return logits if cap is None else logits.div_(cap).tanh_().mul_(cap)

    def _outputs(self, x, logits_rows, hidden_rows, blas):
        eps = self.config.rms_norm_eps
        logits = self.head(rms_norm(x.index_select(0, logits_rows), self.norm, eps), blas)
        if hidden_rows is None:
            return logits
        return logits, rms_norm(x.index_select(0, hidden_rows.to(x.device)), self.norm, eps)

    def _forward_fused(self, x, cos_sin, meta, kv_caches) -> torch.Tensor:
        """Every row attends through kernel segments: one compiled call per layer. Returns the
        last layer's output for every row."""
        c = self.config
        cos, sin = (t[:, 0].contiguous() for t in cos_sin)
        hook = self.layer_hook
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches, strict=True)):
            if hook is not None and i:
                hook()  # between layers i - 1 and i
            if self.tp is not None:
                self._fused_halves(x, layer, cos, sin, k_cache, v_cache, meta)
                continue
            self.kernels.decoder_layer(
                x, layer.qkv.kernel_weight, layer.qkv.bias, layer.o.kernel_weight,
                layer.gate_up.kernel_weight, layer.down.kernel_weight,
                layer.ln_attn, layer.ln_mlp, cos, sin, k_cache, v_cache, meta.slot_mapping,
                meta.tables, meta.segments, c.num_heads, c.rms_norm_eps,
            )  # fmt: skip
        return x

    def _fused_halves(self, x, layer, cos, sin, k_cache, v_cache, meta) -> None:
        """Tensor parallel: the fused layer's two halves, each rank's partial o and down
        products summed over the ranks before they join the residual."""
        c, k = self.config, self.kernels
        part = torch.empty_like(x)
        k.decoder_attention(
            x, layer.qkv.kernel_weight, layer.qkv.bias, layer.o.kernel_weight, layer.ln_attn,
            cos, sin, k_cache, v_cache, meta.slot_mapping, meta.tables, meta.segments,
            c.num_heads, c.rms_norm_eps, part, False,
        )  # fmt: skip
        x.add_(self.tp.all_reduce(part))
        k.decoder_mlp(
            x, layer.gate_up.kernel_weight, layer.down.kernel_weight, layer.ln_mlp,
            c.rms_norm_eps, part, False,
        )  # fmt: skip
        x.add_(self.tp.all_reduce(part))
