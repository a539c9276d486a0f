"""Read a GGUF file: config and tokenizer from its metadata, tensors with Hugging Face names,
each in the file's own precision where tierserve executes it (q8_0, q4_0, q4_1 as
`QuantTensor`s, `model/quant.py`) and dequantized to float32 otherwise.

The architecture is the registered class whose ``gguf_architecture`` is the file's
``general.architecture`` (llama, qwen2, qwen3; `model/registry.py`); its metadata keys carry
that prefix. For llama, llama.cpp stores ``attn_q`` and ``attn_k`` with the two halves of each
head's rotary dimensions interleaved; they are permuted back to the Hugging Face layout here
(rotate-half rope). Qwen's are stored unpermuted (``gguf_rope_permuted``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from tierserve.model import quant, registry
from tierserve.model.config import ModelConfig
from tierserve.model.tokenizer import ChatTokenizer, build_bpe_tokenizer

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}
_TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def hf_name(gguf_name: str) -> str | None:
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def unpermute_rope(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's rope permutation of a q/k weight (out, in) or bias (out,)."""
    out = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_heads, out // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(out, *rest)


def _tensor(t, name: str, n_heads: int, n_kv: int, permuted: bool):
    """One GGUF tensor: a QuantTensor in a format the kernels run, else float32."""
    import gguf

    fmt = t.tensor_type.name.lower()
    rope = permuted and (".q_proj." in name or ".k_proj." in name)
    heads = n_heads if ".q_proj." in name else n_kv
    if fmt in quant.FORMATS and len(t.shape) == 2:
        n, k = int(t.shape[1]), int(t.shape[0])  # GGUF lists dimensions innermost first
        qt = quant.QuantTensor(fmt, (n, k), np.asarray(t.data).reshape(n, -1))
        return qt.rows(unpermute_rope(np.arange(n), heads)) if rope else qt
    arr = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    if rope:
        arr = unpermute_rope(arr, heads)
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.array(arr, order="C")
    return torch.from_numpy(arr)


def read_gguf(
    path: Path, progress: Callable[[int, int], None] | None = None
) -> tuple[ModelConfig, dict, ChatTokenizer]:
    """`progress(done, total)` hears of each tensor read."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch = _field(reader, "general.architecture")
    cls = registry.gguf_class(arch, str(path))
    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{path}: only byte-level BPE (gpt2) GGUF tokenizers are supported")

    def k(name, default=None):
        return _field(reader, f"{arch}.{name}", default)

    n_heads = int(k("attention.head_count"))
    n_kv = int(k("attention.head_count_kv", n_heads))
    hidden = int(k("embedding_length"))
    names = {t.name for t in reader.tensors}
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    config = ModelConfig(
        architecture=cls.__name__,
        vocab_size=int(k("vocab_size", len(tokens))),
        hidden_size=hidden,
        intermediate_size=int(k("feed_forward_length")),
        num_layers=int(k("block_count")),
        num_heads=n_heads,
        num_kv_heads=n_kv,
        head_dim=int(k("attention.key_length", k("rope.dimension_count", hidden // n_heads))),
        rope_theta=float(k("rope.freq_base", 10000.0)),
        rms_norm_eps=float(k("attention.layer_norm_rms_epsilon", 1e-5)),
        max_position_embeddings=int(k("context_length", 4096)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias="blk.0.attn_q.bias" in names,
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=() if eos is None else (int(eos),),
        name=str(_field(reader, "general.name", path.stem)),
    )
    weights: dict = {}
    for i, t in enumerate(reader.tensors):
        if progress is not None:
            progress(i, len(reader.tensors))
        name = hf_name(t.name)
        if name is not None:
            weights[name] = _tensor(t, name, n_heads, n_kv, cls.gguf_rope_permuted)
    return config, weights, _tokenizer(reader, str(path))


def _tokenizer(reader, where: str) -> ChatTokenizer:
    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{where}: only byte-level BPE (gpt2) GGUF tokenizers are supported")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    tk = build_bpe_tokenizer(
        tokens,
        list(_field(reader, "tokenizer.ggml.merges") or []),
        list(_field(reader, "tokenizer.ggml.token_type")),
        str(_field(reader, "tokenizer.ggml.pre", "gpt2")),
    )
    return ChatTokenizer(
        tk,
        chat_template=_field(reader, "tokenizer.chat_template"),
        bos_token=tokens[bos] if bos is not None else None,
        eos_token=tokens[eos] if eos is not None else None,
        add_bos=bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
    )


def gguf_tokenizer(path: Path) -> ChatTokenizer:
    """The tokenizer (and chat template) a GGUF file carries, without reading its weights."""
    import gguf

    return _tokenizer(gguf.GGUFReader(str(path)), str(path))
