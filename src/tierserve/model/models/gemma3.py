"""Gemma 3 text models (Gemma3ForCausalLM: 270M, 1B): Gemma 2's layer (`gemma2.py`) with q/k
norms, five sliding-window layers to one global, and a rotary embedding per kind of layer
(local: base 10k; global: base 1M, possibly linearly scaled). No soft-capping of scores:
transformers' Gemma 3 reads ``attn_logit_softcapping`` but never applies it (and the released
configs set it null), so neither do we; the final logits are capped only if the config says.

The Gemma chosen for the issue's list: the current generation, whose small models are the
ones a CPU serves, and the one that exercises the most seams (per-layer rope and attention,
q/k norms, 1 + w norms, sandwich norms, scaled embeddings, a score scale of its own). Gemma 2
is registered too: it is the one whose attention soft-caps."""

from __future__ import annotations

from tierserve.model.layers import Rope
from tierserve.model.models.gemma2 import SLIDING, Gemma2ForCausalLM


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    qk_norm = True
    window_pattern = 6

    @classmethod
    def settings(cls, hf: dict) -> dict:
        rope = hf.get("rope_parameters") or {}
        full = dict(rope.get("full_attention") or {})
        local = dict(rope.get("sliding_attention") or {})
        full.update(hf.get("rope_scaling") or {})
        full.setdefault("rope_theta", hf.get("rope_theta", 1_000_000.0))
        local.setdefault("rope_theta", hf.get("rope_local_base_freq", 10_000.0))
        return super().settings(hf) | {
            "attn_logit_softcapping": None,
            "final_logit_softcapping": hf.get("final_logit_softcapping"),
            "rope": {"global": full, "local": local},
        }

    def build_ropes(self) -> list[Rope]:
        def rope(p: dict) -> Rope:
            scaling = p if p.get("rope_type", "default") != "default" else None
            return Rope(self.config.head_dim, float(p["rope_theta"]), scaling, device=self.device)

        r = self.config.extra["rope"]
        return [rope(r["global"]), rope(r["local"])]

    def rope_index(self, i: int) -> int:
        return int(self.config.extra["layer_types"][i] == SLIDING)
