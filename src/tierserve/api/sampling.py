"""A request body's sampling fields as `SamplingParams`, and the grammar a chat request asks for
(`response_format`, forced or strict tool calls), each refused with a 400 naming the field when
it cannot be served."""

from __future__ import annotations

from tierserve.api.errors import APIError
from tierserve.api.protocol import Common
from tierserve.grammar import GrammarSpec
from tierserve.grammar.engine import GrammarError, validate
from tierserve.grammar.schema_check import SchemaLimitError, check_schema
from tierserve.grammar.tools import ToolDef, forced_calls, strict_auto, template_format
from tierserve.sampling_params import SamplingParams


def check_token_ids(body: Common, vocab: int) -> None:
    for t in body.stop_token_ids or ():
        if t >= vocab:
            raise APIError(
                400, f"stop_token_ids: {t} is not below the vocabulary size {vocab}",
                param="stop_token_ids",
            )  # fmt: skip
    for key in body.logit_bias or {}:
        if int(key) >= vocab:
            raise APIError(
                400, f"logit_bias: token {key} is not below the vocabulary size {vocab}",
                param="logit_bias",
            )  # fmt: skip


def _logprob_counts(body: Common) -> tuple[int, int | None]:
    """(top_logprobs per output token, prompt_logprobs) the body asks for."""
    if hasattr(body, "top_logprobs"):  # chat: `logprobs` is a boolean
        if body.top_logprobs and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        return (body.top_logprobs or 0) if body.logprobs else 0, None
    k = getattr(body, "logprobs", None)  # completions: `logprobs` is a count
    return k or 0, k if getattr(body, "echo", False) and k is not None else None


def sampling_params(
    body: Common,
    max_tokens: int,
    eos: tuple[int, ...],
    seed_offset: int,
    grammar: GrammarSpec | None = None,
) -> SamplingParams:
    top, prompt = _logprob_counts(body)
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            min_p=body.min_p,
            seed=None if body.seed is None else body.seed + seed_offset,
            stop=tuple(body.stop or ()),
            stop_token_ids=(*(body.stop_token_ids or ()), *eos[1:]),
            ignore_eos=body.ignore_eos,
            top_logprobs=top,
            prompt_logprobs=prompt,
            min_tokens=body.min_tokens,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            repetition_penalty=body.repetition_penalty,
            logit_bias={int(k): v for k, v in (body.logit_bias or {}).items()},
            skip_special_tokens=body.skip_special_tokens,
            grammar=grammar,
            speculative=body.speculative,
        )
    except ValueError as exc:  # each message starts with the field it is about
        msg = str(exc)
        name = msg.split(" ", 1)[0].rstrip(":")
        raise APIError(400, msg, param=name if name in type(body).model_fields else None) from None


def _response_format(body) -> GrammarSpec | None:
    fmt = body.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return GrammarSpec.json_object()
    if fmt.json_schema is None or fmt.json_schema.json_schema is None:
        raise APIError(
            400, "response_format json_schema needs json_schema.schema", param="response_format"
        )
    _check_schema(fmt.json_schema.json_schema, "response_format", "response_format")
    return GrammarSpec.json_schema(fmt.json_schema.json_schema)


def _check_schema(schema, where: str, param: str) -> None:
    """A 400 naming the limit for a schema the grammar engine could only fail on later."""
    try:
        check_schema(schema)
    except SchemaLimitError as exc:
        raise APIError(400, f"{where}: {exc}", param=param) from None


def _tools_grammar(body, template_source: str | None) -> GrammarSpec | None:
    choice = body.tool_choice
    if not body.tools or choice == "none":
        return None
    tools = [
        ToolDef(t.function.name, t.function.parameters, bool(t.function.strict)) for t in body.tools
    ]
    named = choice is not None and choice not in ("auto", "required")
    for i, t in enumerate(tools):  # the schemas the grammar will hold the calls to
        used = t.strict if choice in (None, "auto") else not named or t.name == choice.function.name
        if used and t.parameters is not None:
            _check_schema(t.parameters, f"tools[{i}].function.parameters", "tools")
    fmt = template_format(template_source)
    if choice == "required":
        return forced_calls(tools, fmt, many=body.parallel_tool_calls)
    if named:
        return forced_calls([t for t in tools if t.name == choice.function.name], fmt, many=False)
    return strict_auto(tools, fmt)


def chat_grammar(body, template_source: str | None) -> GrammarSpec | None:
    """The grammar a chat body asks for, checked by the grammar engine (400 if it cannot be
    compiled: the engine's message names the problem)."""
    fmt, tools = _response_format(body), _tools_grammar(body, template_source)
    if fmt is not None and tools is not None:
        raise APIError(
            400,
            "response_format cannot be combined with forced or strict tool calls (both "
            "constrain the whole answer)",
            param="response_format",
        )
    spec, param = (fmt, "response_format") if fmt is not None else (tools, "tools")
    if spec is not None:
        try:
            validate(spec)
        except GrammarError as exc:
            raise APIError(400, f"{param}: the grammar engine cannot use it: {exc}",
                           param=param) from None  # fmt: skip
    return spec
