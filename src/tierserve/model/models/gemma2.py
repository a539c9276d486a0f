"""Gemma 2: RMSNorm by ``1 + w``, embeddings scaled by sqrt(hidden), GELU-tanh, sandwich norms
(a norm after attention and after the MLP, before each residual add), scores scaled by
``query_pre_attn_scalar`` and soft-capped (50), sliding-window layers alternating with global
ones, final logits soft-capped (30).

Windows and soft-capping keep these layers off the kernel attention: steps run ``mixed`` or
``torch``. llama.cpp stores Gemma's norms with the 1 added: its GGUF files are not mapped."""

from __future__ import annotations

from tierserve.model.attention import AttentionSpec
from tierserve.model.decoder import DecoderLM

SLIDING = "sliding_attention"


class Gemma2ForCausalLM(DecoderLM):
    norm_offset = 1.0
    sandwich_norms = True
    scale_embeddings = True
    window_pattern = 2  # every `window_pattern`-th layer is global, the others slide

    @classmethod
    def settings(cls, hf: dict) -> dict:
        if hf.get("use_bidirectional_attention"):
            raise ValueError(
                "Gemma with bidirectional attention (an embedding model) is not served"
            )
        pattern = hf.get("sliding_window_pattern", cls.window_pattern)
        types = hf.get("layer_types") or [
            SLIDING if (i + 1) % pattern else "full_attention"
            for i in range(hf["num_hidden_layers"])
        ]
        return {
            "hidden_act": hf.get("hidden_activation") or "gelu_pytorch_tanh",
            "layer_types": types,
            "sliding_window": hf.get("sliding_window", 4096),
            "query_pre_attn_scalar": hf.get("query_pre_attn_scalar", 256),
            "attn_logit_softcapping": hf.get("attn_logit_softcapping", 50.0),
            "final_logit_softcapping": hf.get("final_logit_softcapping", 30.0),
        }

    def attention_spec(self, i: int) -> AttentionSpec:
        e = self.config.extra
        return AttentionSpec(
            scale=e["query_pre_attn_scalar"] ** -0.5,
            window=e["sliding_window"] if e["layer_types"][i] == SLIDING else None,
            softcap=e["attn_logit_softcapping"],
        )
