"""Logprobs in OpenAI's two response shapes.

- chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
  "bytes"}, ...]}, ...]}``;
- completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, where each
  ``top_logprobs`` entry maps token text to logprob: the k most likely tokens and the chosen one
  (so k or k + 1 entries, as in OpenAI's and vLLM's answers); with `echo`, the prompt's tokens
  come first, the first of them with logprob null.

A token's text is its bytes decoded as UTF-8; a token holding part of a character (byte-level
vocabularies split them) is shown with escapes, ``"\\xe6"``, and its ``bytes`` are the raw ones.
-inf (a token a grammar excludes) is reported as -9999.0, as OpenAI and vLLM do: JSON has no
infinities.
"""

from __future__ import annotations

from tierserve.model.tokenizer import ChatTokenizer

FLOOR = -9999.0


def _lp(x: float) -> float:
    return max(x, FLOOR)


def token_text(tokenizer: ChatTokenizer, tok: int) -> str:
    return tokenizer.token_bytes(tok).decode("utf-8", errors="backslashreplace")


def _entry(tokenizer: ChatTokenizer, tok: int, lp: float) -> dict:
    raw = tokenizer.token_bytes(tok)
    return {
        "token": raw.decode("utf-8", errors="backslashreplace"),
        "logprob": _lp(lp),
        "bytes": list(raw),
    }


def chat_logprobs(tokenizer: ChatTokenizer, tokens, lps, tops) -> dict:
    content = []
    for i, (t, lp) in enumerate(zip(tokens, lps, strict=False)):
        item = _entry(tokenizer, t, lp)
        ids, vals = tops[i] if i < len(tops) else ((), ())
        item["top_logprobs"] = [_entry(tokenizer, a, v) for a, v in zip(ids, vals, strict=True)]
        content.append(item)
    return {"content": content}


def _top_dict(tokenizer, chosen: int, lp: float, top) -> dict:
    ids, vals = top
    out = {token_text(tokenizer, a): _lp(v) for a, v in zip(ids, vals, strict=True)}
    out.setdefault(token_text(tokenizer, chosen), _lp(lp))
    return out


def completion_logprobs(
    tokenizer: ChatTokenizer,
    tokens: list[int],
    lps: list[float],
    tops: list,
    k: int,
    offset: int = 0,
    prompt: tuple[list[int], list] | None = None,
) -> dict:
    """`tops`: each output token's top-k (when k > 0). `prompt`: (prompt ids, their
    (logprob, top) pairs for tokens 1, 2, ...) when the prompt is echoed with logprobs;
    `offset`: where the output's text starts in the choice's text."""
    texts, logprobs, top_out = [], [], []
    if prompt is not None:
        ids, scored = prompt
        offset = 0
        for i, t in enumerate(ids):
            texts.append(token_text(tokenizer, t))
            if i == 0:
                logprobs.append(None)
                top_out.append(None)
                continue
            lp, top = scored[i - 1]
            logprobs.append(_lp(lp))
            top_out.append(_top_dict(tokenizer, t, lp, top) if k else None)
    for i, (t, lp) in enumerate(zip(tokens, lps, strict=False)):
        texts.append(token_text(tokenizer, t))
        logprobs.append(_lp(lp))
        top_out.append(_top_dict(tokenizer, t, lp, tops[i]) if k and i < len(tops) else None)
    offsets, pos = [], offset
    for s in texts:
        offsets.append(pos)
        pos += len(s)
    return {
        "tokens": texts,
        "token_logprobs": logprobs,
        "top_logprobs": top_out if k else None,
        "text_offset": offsets,
    }
