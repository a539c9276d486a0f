"""Prompt text: a small corpus of original prose shipped in the package (`corpus.txt`), cut to
token counts with the served model's tokenizer. Nothing is downloaded.

A prompt of `n` tokens is a short tag naming the request ("Request 17. ", so that no two prompts
share their first KV block and a prefix cache cannot flatter the server) followed by `n - tag`
tokens of the corpus, starting at a seeded offset and wrapping around. Decoding those tokens and
letting the server re-encode the text gives `n` tokens give or take a few at the edges; the
server's `usage.prompt_tokens` is what the results count when the server reports it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Protocol


class TokenizerError(ValueError):
    """No usable tokenizer: the message says what to pass instead."""


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class HFTokenizer:
    """A Hugging Face `tokenizers.Tokenizer`, without special tokens on either side."""

    tokenizer: object
    eos_token_id: int | None = None  # the model's, when known (to end requests by EOS)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


def load_tokenizer(path: str | None) -> TextTokenizer:
    """`path`: a tokenizer.json file or a Hugging Face folder holding one. None: the embedded
    model's tokenizer, through tierserve's own loader (reads its cache; no download)."""
    from tokenizers import Tokenizer

    if path is None:
        from tierserve.model.loader import ModelNotFound, load_model

        try:
            m = load_model()
            eos = m.config.eos_token_ids
            return HFTokenizer(m.tokenizer.tokenizer, eos[0] if eos else None)
        except ModelNotFound as exc:
            raise TokenizerError(
                f"{exc}; or give --tokenizer PATH (a tokenizer.json or a Hugging Face folder)"
            ) from None
    p = Path(path).expanduser()
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise TokenizerError(f"--tokenizer {path}: no tokenizer.json at {file}")
    try:
        return HFTokenizer(Tokenizer.from_file(str(file)), _folder_eos(file.parent))
    except Exception as exc:  # the tokenizers library raises bare Exceptions on bad files
        raise TokenizerError(f"--tokenizer {path}: cannot read {file}: {exc}") from None


def _folder_eos(folder: Path) -> int | None:
    """The EOS id a Hugging Face folder's generation_config.json or config.json names."""
    for name in ("generation_config.json", "config.json"):
        try:
            eos = json.loads((folder / name).read_text("utf-8")).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        eos = eos[0] if isinstance(eos, list) and eos else eos
        if isinstance(eos, int) and not isinstance(eos, bool):
            return eos
    return None


def read_corpus() -> str:
    return resources.files("tierserve.loadgen").joinpath("corpus.txt").read_text("utf-8")


class PromptMaker:
    """Real text of a requested token length, the same for the same (seed, index)."""

    def __init__(self, tokenizer: TextTokenizer, corpus: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.eos_token_id: int | None = getattr(tokenizer, "eos_token_id", None)
        self.ids = tokenizer.encode(corpus if corpus is not None else read_corpus())
        if not self.ids:
            raise TokenizerError("the prompt corpus encodes to no tokens")

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def make(self, n_tokens: int, index: int, seed: str | int, tag: str | None = None) -> str:
        tag = f"Request {index}. " if tag is None else tag
        need = max(0, n_tokens - self.count(tag))
        start = random.Random(f"{seed}:{index}").randrange(len(self.ids))
        reps = -(-(start + need) // len(self.ids))
        body = (self.ids * max(1, reps))[start : start + need]
        return tag + self.tokenizer.decode(body)
