"""Llama (2, 3, 3.1/3.2 with llama3 rope scaling; SmolLM, TinyLlama, ...): the shared decoder
as it is. Its layers are exactly what the fused C++ layer computes."""

from __future__ import annotations

from tierserve.model.decoder import DecoderLM


class LlamaForCausalLM(DecoderLM):
    gguf_architecture = "llama"
