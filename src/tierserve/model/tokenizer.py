"""Tokenizer (Hugging Face `tokenizers`) carrying the model's chat template source (rendered by
`tierserve.chat`), and incremental detokenization for streaming."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's pre-tokenizer names (tokenizer.ggml.pre) for byte-level BPE vocabularies.
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone")


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: the character each byte is written as -> byte."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


_BYTES = _byte_decoder()
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece byte fallback


def _pre_tokenizer(pre: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    split = {"llama-bpe": LLAMA3_REGEX, "llama3": LLAMA3_REGEX, "qwen2": QWEN2_REGEX}.get(pre)
    if split is not None:
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level]
        )
    steps = [pre_tokenizers.Split(Regex(GPT2_REGEX), behavior="isolated"), byte_level]
    if pre in _DIGITS_THEN_GPT2:
        steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
    return pre_tokenizers.Sequence(steps)


def build_bpe_tokenizer(
    tokens: list[str], merges: list[str], token_types: list[int], pre: str
) -> Tokenizer:
    """A byte-level BPE tokenizer from GGUF vocabulary data (tokenizer.ggml.model = gpt2)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tk = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    tk.pre_tokenizer = _pre_tokenizer(pre)
    tk.decoder = decoders.ByteLevel()
    # GGUF token types: 3 = control (special), 4 = user defined (added, not special).
    special = [
        AddedToken(t, special=True, normalized=False)
        for t, ty in zip(tokens, token_types, strict=True)
        if ty == 3
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, ty in zip(tokens, token_types, strict=True)
        if ty == 4
    ]
    tk.add_special_tokens(special)
    if user:
        tk.add_tokens(user)
    return tk


@dataclass
class ChatTokenizer:
    tokenizer: Tokenizer
    chat_template: str | None
    bos_token: str | None
    eos_token: str | None
    add_bos: bool = False

    def __post_init__(self) -> None:
        # The chat template is rendered by tierserve.chat (transformers' Jinja environment);
        # the tokenizer only carries its source.
        self.vocab_size = self.tokenizer.get_vocab_size()
        self.bos_token_id = self.tokenizer.token_to_id(self.bos_token) if self.bos_token else None
        self._bytes: dict[int, bytes] = {}  # token_bytes' cache (a dict: safe across threads)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # The batch call releases the GIL while it tokenizes (`encode` holds it: a 3.9 MB
        # prompt stopped every other thread for seconds); one text costs the same.
        ids = self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
        bos = self.bos_token_id
        if add_special_tokens and self.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (a special token: its text). A byte-level token that
        holds part of a UTF-8 character gives its raw bytes, which decoding it alone cannot."""
        cached = self._bytes.get(token_id)
        if cached is None:
            cached = self._bytes[token_id] = self._token_bytes(token_id)
        return cached

    def _token_bytes(self, token_id: int) -> bytes:
        text = self.tokenizer.decode([token_id], skip_special_tokens=False)
        if "\ufffd" not in text:
            return text.encode()
        piece = self.tokenizer.id_to_token(token_id) or ""
        if piece and all(c in _BYTES for c in piece):
            return bytes(_BYTES[c] for c in piece)
        m = _BYTE_TOKEN.fullmatch(piece)
        return bytes([int(m.group(1), 16)]) if m else text.encode()

    # -- persistence -----------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        self.tokenizer.save(str(folder / "tokenizer.json"))
        meta = {
            "chat_template": self.chat_template,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "add_bos": self.add_bos,
        }
        (folder / "tierserve_tokenizer.json").write_text(json.dumps(meta))

    @classmethod
    def load(cls, folder: Path) -> ChatTokenizer:
        meta = json.loads((folder / "tierserve_tokenizer.json").read_text())
        return cls(Tokenizer.from_file(str(folder / "tokenizer.json")), **meta)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas. Holds back text that ends in an
    incomplete UTF-8 sequence, and decodes with a little left context so that tokenizers that
    merge spaces across tokens give the same text as a full decode."""

    def __init__(
        self, tokenizer: ChatTokenizer, prompt_ids: list[int], skip_special_tokens: bool = True
    ) -> None:
        self.tk = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = list(prompt_ids[-6:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self.tk.decode(self.ids[self.prefix_offset : self.read_offset], self.skip)
        full = self.tk.decode(self.ids[self.prefix_offset :], self.skip)
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return ""
        delta = full[len(prefix) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        self.text += delta
        return delta
