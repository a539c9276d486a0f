"""The grammar engine: llguidance (chosen over xgrammar by measurement; docs/api.md).

A `GrammarSpec` becomes llguidance's grammar text (`grammar_text`, cached); `validate` checks it
without a tokenizer, so the API can refuse a bad schema with a 400 before the request is
admitted. `GrammarEngine` holds the tokenizer llguidance computes masks against (built once, on
the first request with a grammar: ~0.2 s for a 49k vocabulary) and makes a matcher per request.
llguidance compiles lazily: making a matcher costs well under a millisecond, and the first masks
pay for what they explore.

JSON is generated compact but readable: `", "` and `": "` separators, no other whitespace (free
whitespace lets a small model wander into newlines for ever).
"""

from __future__ import annotations

import functools
import json

import llguidance

from tierserve.grammar.spec import GrammarSpec

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# The engine's defaults, but errors without its parser state and grammar text: a message may
# reach a client, and must not carry engine internals.
LIMITS = llguidance.LLParserLimits(verbose_errors=False)


class GrammarError(ValueError):
    """A grammar or schema the engine cannot use (the message says why)."""


@functools.lru_cache(maxsize=256)
def grammar_text(spec: GrammarSpec) -> str:
    """llguidance's grammar for `spec` (a JSON schema is embedded; a Lark grammar is kept)."""
    if spec.kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(spec.source)
    schema = {"type": "object"} if spec.kind == "json_object" else json.loads(spec.source)
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except ValueError as exc:
        raise GrammarError(f"not a usable JSON schema: {exc}") from None


@functools.lru_cache(maxsize=256)
def _check(spec: GrammarSpec) -> str:
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        grammar_text(spec), limits=LIMITS
    )
    return messages[0] if is_error else ""


def validate(spec: GrammarSpec) -> None:
    """Raise GrammarError, with the engine's message, if `spec` cannot be compiled."""
    error = _check(spec)
    if error:
        raise GrammarError(error.strip())


class GrammarEngine:
    def __init__(self, tokenizer_json: str, eos_token_ids: list[int], vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32  # int32 words of one bitmask row
        self.tokenizer = llguidance.LLTokenizer(
            tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids)
        )

    def matcher(self, spec: GrammarSpec) -> llguidance.LLMatcher:
        """A fresh matcher for `spec`; raises GrammarError."""
        m = llguidance.LLMatcher(self.tokenizer, grammar_text(spec), log_level=0, limits=LIMITS)
        if m.is_error():
            raise GrammarError(m.get_error())
        return m
