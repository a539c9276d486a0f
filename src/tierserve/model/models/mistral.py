"""Mistral: Llama's layer, with a sliding window on every layer when the config sets one
(v0.1: 4096 tokens; later versions none). llama.cpp writes Mistral GGUF files as ``llama``."""

from __future__ import annotations

from tierserve.model.attention import PLAIN, AttentionSpec
from tierserve.model.decoder import DecoderLM


class MistralForCausalLM(DecoderLM):
    @classmethod
    def settings(cls, hf: dict) -> dict:
        return super().settings(hf) | {"sliding_window": hf.get("sliding_window")}

    def attention_spec(self, i: int) -> AttentionSpec:
        window = self.config.extra.get("sliding_window")
        return PLAIN if window is None else AttentionSpec(window=window)
