"""Qwen2 / Qwen2.5: Llama's layer with q/k/v biases (loaded because the checkpoint has them)
and, where the config turns it on, a sliding window on the layers from `max_window_layers`
(or those `layer_types` names). GGUF files: ``qwen2``, rope not permuted."""

from __future__ import annotations

from tierserve.model.attention import PLAIN, AttentionSpec
from tierserve.model.decoder import DecoderLM


def layer_windows(hf: dict) -> list[int | None]:
    """Each layer's sliding window, as transformers' Qwen2/Qwen3 configs derive it."""
    n = hf["num_hidden_layers"]
    window = hf.get("sliding_window") if hf.get("use_sliding_window") else None
    types = hf.get("layer_types") or [
        "sliding_attention" if window is not None and i >= hf.get("max_window_layers", 28)
        else "full_attention"
        for i in range(n)
    ]  # fmt: skip
    return [window if t == "sliding_attention" else None for t in types]


class Qwen2ForCausalLM(DecoderLM):
    gguf_architecture = "qwen2"
    gguf_rope_permuted = False

    @classmethod
    def settings(cls, hf: dict) -> dict:
        return super().settings(hf) | {"layer_windows": layer_windows(hf)}

    def attention_spec(self, i: int) -> AttentionSpec:
        windows = self.config.extra.get("layer_windows")
        window = windows[i] if windows else None
        return PLAIN if window is None else AttentionSpec(window=window)
