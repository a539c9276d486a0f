"""Compatibility name for scripts written before the model registry
(`benchmarks/gpu/gpu_profile.py`):
``LlamaModel`` is the Llama architecture's class. New code asks `model/registry.py`."""

from tierserve.model.models.llama import LlamaForCausalLM as LlamaModel

__all__ = ["LlamaModel"]
