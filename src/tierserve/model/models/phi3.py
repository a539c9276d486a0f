"""Phi-3 / Phi-3.5 / Phi-4-mini: Llama's layer with the checkpoint's projections already fused
(``qkv_proj``, ``gate_up_proj``: gate then up, the order the shared decoder stacks them),
rotary embedding over the first ``partial_rotary_factor`` of each head, LongRoPE scaling where
the config asks for it (`LongRope`), and a sliding window on every layer when the config sets
one."""

from __future__ import annotations

import math

import torch

from tierserve.model.attention import PLAIN, AttentionSpec
from tierserve.model.decoder import DecoderLM
from tierserve.model.layers import Rope
from tierserve.model.linear import Linear
from tierserve.model.weights import WeightBuilder


class LongRope(Rope):
    """LongRoPE: per-frequency factors, the short ones for positions inside the original
    context and the long ones beyond it, cos/sin scaled by the attention factor. The choice is
    made per position, so a request's rotation never depends on its batch or on how long it
    grows later; transformers switches a whole sequence to the long factors once it outgrows
    the original context (keys cached before keep theirs here: a paged cache cannot redo them).
    """

    def __init__(self, head_dim, theta, p: dict, rotary_dim, max_positions, device) -> None:
        super().__init__(head_dim, theta, None, rotary_dim, device)
        r = self.rotary_dim
        base = theta ** (torch.arange(0, r, 2, dtype=torch.int64).float() / r)
        self.short = (1.0 / (torch.tensor(p["short_factor"]) * base)).to(device)
        self.long = (1.0 / (torch.tensor(p["long_factor"]) * base)).to(device)
        self.original = int(p["original_max_position_embeddings"])
        factor = p.get("factor") or max_positions / self.original
        self.attention_factor = p.get("attention_factor") or (
            1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(self.original))
        )

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype):
        inv = torch.where((positions >= self.original)[:, None], self.long, self.short)
        freqs = positions.float()[:, None] * inv
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        cos, sin = emb.cos().mul_(self.attention_factor), emb.sin().mul_(self.attention_factor)
        sin[..., : inv.shape[-1]].neg_()  # signed, as `rope_cos_sin` gives it
        return cos.to(dtype), sin.to(dtype)


class Phi3ForCausalLM(DecoderLM):
    @classmethod
    def settings(cls, hf: dict) -> dict:
        rope = hf.get("rope_parameters") or {}
        factor = hf.get("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
        return super().settings(hf) | {
            "partial_rotary_factor": factor,
            "original_max_position_embeddings": hf.get("original_max_position_embeddings"),
            "sliding_window": hf.get("sliding_window"),
        }

    def attention_weights(self, b: WeightBuilder, p: str) -> tuple[Linear, Linear]:
        a = p + "self_attn."
        return self.linear(b, [a + "qkv_proj"]), self.linear(b, [a + "o_proj"])

    def mlp_weights(self, b: WeightBuilder, p: str) -> tuple[Linear, Linear]:
        return self.linear(b, [p + "mlp.gate_up_proj"]), self.linear(b, [p + "mlp.down_proj"])

    def build_ropes(self) -> list[Rope]:
        c, scaling = self.config, self.config.rope_scaling or {}
        rot = int(c.head_dim * c.extra.get("partial_rotary_factor", 1.0))
        if scaling.get("rope_type", scaling.get("type")) in ("longrope", "su"):
            original = c.extra.get("original_max_position_embeddings")
            p = {"original_max_position_embeddings": original} | scaling
            args = (c.head_dim, c.rope_theta, p, rot, c.max_position_embeddings, self.device)
            return [LongRope(*args)]
        return [Rope(c.head_dim, c.rope_theta, c.rope_scaling, rot, self.device)]

    def attention_spec(self, i: int) -> AttentionSpec:
        window = self.config.extra.get("sliding_window")
        return PLAIN if window is None else AttentionSpec(window=window)
