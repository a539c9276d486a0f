"""The model registry: architectures by the name a checkpoint gives (config.json's
``architectures``), each implemented by one file in `tierserve/model/models/` over the shared
decoder (`model/decoder.py`).

Adding an architecture is that file and one line below: its name, its ``model_type`` (what
older configs, the simulator's profiles and tests may name instead) and its module. The class
in the module has the architecture's name. Nothing here imports torch: the simulator reads
model configs without it, and a module is imported only when its model is built.
"""

from __future__ import annotations

import importlib

ARCHITECTURES: dict[str, tuple[str, str]] = {
    # architecture          (model_type, module in tierserve.model.models)
    "LlamaForCausalLM": ("llama", "llama"),
    "MistralForCausalLM": ("mistral", "mistral"),
    "Qwen2ForCausalLM": ("qwen2", "qwen2"),
    "Qwen3ForCausalLM": ("qwen3", "qwen3"),
    "Gemma2ForCausalLM": ("gemma2", "gemma2"),
    "Gemma3ForCausalLM": ("gemma3_text", "gemma3"),
    "Phi3ForCausalLM": ("phi3", "phi3"),
}


class UnsupportedArchitecture(ValueError):
    """A checkpoint of an architecture no file implements."""


def supported() -> str:
    return ", ".join(ARCHITECTURES)


def canonical(name: str | None) -> str:
    """The registered architecture `name` is, or whose ``model_type`` it is."""
    if name in ARCHITECTURES:
        return name
    for arch, (model_type, _) in ARCHITECTURES.items():
        if name == model_type:
            return arch
    raise UnsupportedArchitecture(
        f"architecture {name!r} is not supported; supported: {supported()}"
    )


def pick(architectures: list[str], model_type: str | None, where: str = "") -> str:
    """The architecture of a Hugging Face config: the first of its ``architectures`` that is
    registered, else its ``model_type``'s; else an error naming them and the supported list."""
    for name in architectures:
        if name in ARCHITECTURES:
            return name
    if not architectures and model_type is not None:
        try:
            return canonical(model_type)
        except UnsupportedArchitecture:
            pass
    named = ", ".join(architectures) or f"model_type {model_type!r}"
    prefix = f"{where}: " if where else ""
    raise UnsupportedArchitecture(
        f"{prefix}architecture {named} is not supported; supported: {supported()}"
    )


def model_class(name: str):
    """The class implementing architecture `name` (its module imported now)."""
    arch = canonical(name)
    module = importlib.import_module(f"tierserve.model.models.{ARCHITECTURES[arch][1]}")
    return getattr(module, arch)


def gguf_class(gguf_architecture: str | None, where: str = ""):
    """The class whose GGUF files say ``general.architecture = gguf_architecture``."""
    readable = []
    for arch in ARCHITECTURES:
        cls = model_class(arch)
        if cls.gguf_architecture is not None:
            readable.append(cls.gguf_architecture)
            if cls.gguf_architecture == gguf_architecture:
                return cls
    prefix = f"{where}: " if where else ""
    raise UnsupportedArchitecture(
        f"{prefix}GGUF architecture {gguf_architecture!r} is not supported; supported in GGUF "
        f"files: {', '.join(readable)} (and as Hugging Face folders: {supported()})"
    )


def build_model(
    config,
    weights,
    device="cpu",
    dtype=None,
    kernels=None,
    quantization="auto",
    activations="float32",
    tp=None,
):
    """The model for `config.architecture` over `weights` (popped as they are used); with `tp`
    (an `executor.parallel.TPGroup` of more than one rank), its rank's shard."""
    import torch

    cls = model_class(config.architecture)
    return cls(
        config, weights, device, dtype or torch.float32, kernels, quantization, activations, tp
    )
