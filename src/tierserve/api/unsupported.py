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


# Empty since issue 15's sampler half: penalties, logit_bias, min_tokens, stop_token_ids,
# skip_special_tokens, structured output (response_format, forced and strict tool calls), top
# and prompt logprobs, and scoring (max_tokens 0) are all implemented.
NOT_SUPPORTED_YET: tuple[Pending, ...] = ()


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
