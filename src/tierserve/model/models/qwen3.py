"""Qwen3 (dense): Qwen2's layer without biases and with a per-head RMSNorm of queries and
keys before rope (`q_norm`, `k_norm`), so no fused C++ layer. GGUF files: ``qwen3``."""

from __future__ import annotations

from tierserve.model.models.qwen2 import Qwen2ForCausalLM


class Qwen3ForCausalLM(Qwen2ForCausalLM):
    qk_norm = True
    gguf_architecture = "qwen3"
