"""The one list of request features that tierserve declares but does not implement yet.

Each is a field of a request body (`protocol.py`, `chat_protocol.py`) with its real type and
range; a request that asks for more than the field's neutral value gets a 400
`not supported yet: <field>` instead of a 200 that silently ignores it. The neutral values
(a penalty of 0, `skip_special_tokens: true`, ...) are accepted: they ask for nothing, and
clients send them by default. Implementing a feature = deleting its entry here (the OpenAPI
schema's field descriptions follow this list).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tierserve.api.errors import APIError


@dataclass(frozen=True)
class Pending:
    field: str  # the body field (the error's `param`)
    asks: Callable[[object], bool]  # does this request ask for the feature?
    what: str  # the request that is refused, in words
    routes: tuple[str, ...] = ("chat", "completions")


def _tool_choice_forced(body) -> bool:
    return body.tool_choice is not None and body.tool_choice not in ("none", "auto")


NOT_SUPPORTED_YET: tuple[Pending, ...] = (
    Pending("presence_penalty", lambda b: b.presence_penalty != 0, "a value other than 0"),
    Pending("frequency_penalty", lambda b: b.frequency_penalty != 0, "a value other than 0"),
    Pending("repetition_penalty", lambda b: b.repetition_penalty != 1, "a value other than 1"),
    Pending("logit_bias", lambda b: bool(b.logit_bias), "a non-empty map"),
    Pending("min_tokens", lambda b: b.min_tokens > 0, "a value above 0"),
    Pending("stop_token_ids", lambda b: bool(b.stop_token_ids), "a non-empty list"),
    Pending("skip_special_tokens", lambda b: not b.skip_special_tokens, "false"),
    Pending(
        "response_format",
        lambda b: b.response_format is not None and b.response_format.type != "text",
        "json_object or json_schema (structured output)",
        ("chat",),
    ),
    Pending(
        "tool_choice",
        _tool_choice_forced,
        "required or a named function: it needs structured output",
        ("chat",),
    ),
    Pending(
        "tools",
        lambda b: any(t.function.strict for t in b.tools or ()),
        "a function with strict: true (structured output)",
        ("chat",),
    ),
    Pending("top_logprobs", lambda b: (b.top_logprobs or 0) > 0, "a value above 0", ("chat",)),
    Pending(
        "logprobs",
        lambda b: (b.logprobs or 0) > 0,
        "a value above 0 (the top alternatives of each token)",
        ("completions",),
    ),
    Pending(
        "echo",
        lambda b: b.echo and b.logprobs is not None,
        "echo with logprobs (the prompt's logprobs)",
        ("completions",),
    ),
    Pending("max_tokens", lambda b: b.max_tokens == 0, "0 (scoring a prompt)", ("completions",)),
)


def refuse_unsupported(body, route: str) -> None:
    """Raise a 400 naming the first field of `body` that asks for a pending feature."""
    for p in NOT_SUPPORTED_YET:
        if route in p.routes and p.asks(body):
            raise APIError(400, f"not supported yet: {p.field} ({p.what})", param=p.field)


def pending_fields(route: str) -> dict[str, str]:
    """{field: what is refused} for one route, for the OpenAPI schema."""
    out: dict[str, str] = {}
    for p in NOT_SUPPORTED_YET:
        if route in p.routes:
            out[p.field] = f"{out[p.field]}; {p.what}" if p.field in out else p.what
    return out
