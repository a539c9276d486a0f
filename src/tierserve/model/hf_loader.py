"""Read a Hugging Face model folder offline: config.json, *.safetensors, tokenizer.json and the
chat template (tokenizer_config.json or chat_template.jinja). The architecture is the first of
config.json's ``architectures`` that is registered (`model/registry.py`); its file reads its own
settings (``settings``). Any other architecture fails here, naming it and the supported list."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from tierserve.model import registry
from tierserve.model.config import ModelConfig
from tierserve.model.tokenizer import ChatTokenizer


def _token_text(value) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def read_hf_config(folder: Path) -> ModelConfig:
    cfg = json.loads((folder / "config.json").read_text())
    arch = registry.pick(cfg.get("architectures") or [], cfg.get("model_type"), str(folder))
    cls = registry.model_class(arch)
    heads = cfg["num_attention_heads"]
    eos = cfg.get("eos_token_id")
    gen = folder / "generation_config.json"
    if gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id", eos)
    eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
    # transformers >= 5 writes rope settings as `rope_parameters`; older configs use
    # `rope_theta` and `rope_scaling`.
    rope = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling")
    if scaling is None and rope.get("rope_type", "default") != "default":
        scaling = rope
    return ModelConfig(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        attention_bias=bool(cfg.get("attention_bias", False)),
        rope_scaling=scaling,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=eos_ids,
        name=folder.name,
        extra=cls.settings(cfg),
    )


def read_hf_folder(
    folder: Path, tokenizer_source: Path | None = None
) -> tuple[ModelConfig, dict[str, torch.Tensor], ChatTokenizer]:
    """`tokenizer_source`: where the tokenizer comes from when not from `folder` itself
    (`--tokenizer`: a folder with tokenizer.json, that file, or a GGUF file)."""
    if not (folder / "config.json").exists():
        raise FileNotFoundError(f"{folder}: no config.json (not a Hugging Face model folder)")
    config = read_hf_config(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors weight files")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        weights.update(load_file(str(f)))
    # What the checkpoint holds (Qwen2's configs do not say it has q/k/v biases).
    has_bias = any(".self_attn." in k and k.endswith(".bias") for k in weights)
    config = dataclasses.replace(config, attention_bias=has_bias)
    tokenizer = load_tokenizer(tokenizer_source or folder)
    return config, weights, tokenizer


def load_tokenizer(source: Path) -> ChatTokenizer:
    """A tokenizer and its chat template from `source`: a folder holding tokenizer.json (and
    tokenizer_config.json or chat_template.jinja), a tokenizer.json file (its folder's
    tokenizer_config.json beside it), or a GGUF file (the tokenizer it carries)."""
    if source.suffix.lower() == ".gguf":
        from tierserve.model.gguf_loader import gguf_tokenizer

        return gguf_tokenizer(source)
    folder, file = (
        (source, source / "tokenizer.json") if source.is_dir() else (source.parent, source)
    )
    if not file.is_file():
        raise FileNotFoundError(
            f"{folder}: no tokenizer.json; give --tokenizer PATH (a folder with tokenizer.json, "
            "that file, or a GGUF file)"
        )
    tk_cfg_path = folder / "tokenizer_config.json"
    tk_cfg = json.loads(tk_cfg_path.read_text()) if tk_cfg_path.exists() else {}
    template = tk_cfg.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    jinja = folder / "chat_template.jinja"
    if template is None and jinja.exists():
        template = jinja.read_text()
    tokenizer = ChatTokenizer(
        Tokenizer.from_file(str(file)),
        chat_template=template,
        bos_token=_token_text(tk_cfg.get("bos_token")),
        eos_token=_token_text(tk_cfg.get("eos_token")),
        add_bos=bool(tk_cfg.get("add_bos_token", False)),
    )
    return tokenizer
