"""Load and check the draft model (`--speculative-model PATH`) at start, through the target's
loader and model builder: a missing file, a model the loader cannot read, or a vocabulary that
differs from the target's (drafts are token ids the target verifies: both must mean the same
text by the same id) fail here, with a message naming the problem."""

from __future__ import annotations

from pathlib import Path

import torch

from tierserve.executor.draft_model import DraftModel
from tierserve.executor.kv_memory import kv_bytes_per_block
from tierserve.model.loader import LoadedModel, load_model
from tierserve.model.registry import build_model

# The drafter's KV pool: this share of the target's KV cache memory (its blocks hold a smaller
# model's KV, so usually more tokens). Requests that no longer fit lose their draft state,
# least recently used first, and catch up when they draft again.
DRAFT_KV_SHARE = 0.25


class BadDraftModel(ValueError):
    """The draft model cannot serve as this target's drafter."""


def _bad(path: str, why: str) -> BadDraftModel:
    return BadDraftModel(f"speculative model {path!r}: {why}")


def check_vocabulary(path: str, draft: LoadedModel, target: LoadedModel) -> None:
    dv, tv = draft.config.vocab_size, target.config.vocab_size
    if dv != tv:
        raise _bad(path, f"its vocabulary has {dv} tokens, the served model's {tv}")
    d, t = draft.tokenizer.tokenizer.get_vocab(), target.tokenizer.tokenizer.get_vocab()
    if d != t:
        differ = sorted(k for k in d.keys() | t.keys() if d.get(k) != t.get(k))
        raise _bad(
            path,
            f"its tokenizer differs from the served model's ({len(differ)} tokens differ, "
            f"e.g. {differ[:3]}): a draft model must share the target's tokenizer",
        )


def load_drafter(
    path: str,
    target: LoadedModel,
    device: str,
    dtype: torch.dtype,
    kv_bytes: int,
    block_size: int,
    quantization: str = "auto",
    activations: str = "auto",
    kv_dtype: torch.dtype | None = None,
) -> DraftModel:
    """The draft model at `path`, checked against `target`, with a KV pool of about
    `DRAFT_KV_SHARE` x `kv_bytes` (at least one block) of `kv_dtype` (default: its dtype).
    `quantization` is the draft's own (default auto: the file's precision, e.g. a Q4 GGUF
    drafting for float32 weights)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise _bad(path, "no such file or folder")
    try:
        loaded = load_model(p)
    except Exception as exc:  # the loader's own words say what is wrong with the file
        raise _bad(path, f"cannot be loaded as a model: {exc}") from exc
    check_vocabulary(path, loaded, target)
    try:
        model = build_model(
            loaded.config,
            loaded.weights,
            device,
            dtype,
            quantization=quantization,
            activations=activations,
        )
    except Exception as exc:
        raise _bad(path, f"cannot be built as a model: {exc}") from exc
    loaded.weights = {}
    if kv_dtype is not None:
        model.kv_dtype = kv_dtype
    num_blocks = max(1, int(kv_bytes * DRAFT_KV_SHARE) // kv_bytes_per_block(model, block_size))
    return DraftModel(model, num_blocks, block_size)
