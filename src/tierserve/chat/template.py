"""Chat templates rendered the way transformers renders them (`PreTrainedTokenizerBase.
apply_chat_template`, `transformers.utils.chat_template_utils`), so that a model's template gives
the same prompt here as in transformers (and vLLM, which uses it): `tests/test_chat_templates.py`
compares the two strings.

The environment: Jinja's immutable sandbox with `trim_blocks` and `lstrip_blocks`, the loop
controls extension (`break`, `continue`), a `{% generation %}` block (transformers marks
assistant text with it; serving renders its body unchanged), `tojson` with transformers' options
(`ensure_ascii=False`, `indent`, `separators`, `sort_keys`; no HTML escaping), `raise_exception`,
`strftime_now`, and `dict` / `namespace` that cannot reach Python internals.

The render: messages lose their keys whose value is null; a message's reasoning
(`reasoning_content`, `thinking` or `reasoning`) is visible under all of `thinking` and
`reasoning_content`; the template gets `messages`, `tools`, `documents`, `add_generation_prompt`
and the caller's variables (special tokens, then `chat_template_kwargs`). With
`continue_final_message` the rendered text is cut right after the final message's content, so
the model continues it.
"""

from __future__ import annotations

import copy
import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Names a message's reasoning may come under; templates read the first.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


class ChatTemplateError(ValueError):
    """The template cannot render this conversation (a client error, or a broken template)."""


class _Generation(Extension):
    """`{% generation %}…{% endgeneration %}`: renders its body."""

    tags = {"generation"}  # noqa: RUF012 (Jinja's own class attribute)

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller) -> str:
        return caller()


def _raise(message: str):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Dict:
    """`dict(...)` and `dict.fromkeys(...)` for templates, and nothing else of the type."""

    def __call__(self, *args, **kwargs) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """Jinja's `namespace`, refusing attribute names that start with an underscore."""

    def __init__(*args, **kwargs):  # Jinja's signature: `namespace(self=...)` must work
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"a chat template may not set {name!r} on a namespace (underscore names)"
            )


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _Dict()
    env.globals["namespace"] = _Namespace
    return env


_ENV = _environment()


def load_chat_template(value: str) -> str:
    """`--chat-template`: a file's text, or (as vLLM takes it) the template itself when the value
    is no file and looks like Jinja. Raises ChatTemplateError naming what is wrong."""
    path = Path(value).expanduser()
    try:
        is_file = path.is_file()
    except OSError:  # e.g. a long inline template is no valid file name
        is_file = False
    if is_file:
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ChatTemplateError(f"chat template {value}: cannot read it: {exc}") from None
    elif any(mark in value for mark in ("{{", "{%")):
        text = value
    else:
        raise ChatTemplateError(f"chat template {value!r}: no such file")
    try:
        ChatTemplate(text)  # compiles, or says where the syntax is wrong
    except ChatTemplateError as exc:
        where = value if is_file else "(inline)"
        raise ChatTemplateError(f"chat template {where}: {exc}") from None
    return text


class ChatTemplate:
    def __init__(self, source: str) -> None:
        self.source = source
        try:
            self._compiled = _ENV.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ChatTemplateError(
                f"the chat template is not valid Jinja (line {exc.lineno}): {exc.message}"
            ) from None

    def render(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        variables: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text for `messages`. `variables` are the special tokens and any
        `chat_template_kwargs` (later keys win). Raises ChatTemplateError."""
        if not messages:
            raise ChatTemplateError("cannot apply the chat template to an empty conversation")
        if continue_final_message and add_generation_prompt:
            raise ChatTemplateError(
                "continue_final_message and add_generation_prompt cannot both be set"
            )
        chat = [_with_reasoning(_without_nulls(m)) for m in copy.deepcopy(messages)]
        final = None
        if continue_final_message:
            field = continue_final_message if isinstance(continue_final_message, str) else "content"
            final = _mark_final(chat[-1], field, self.source)
        try:
            text = self._compiled.render(
                messages=chat,
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                **(variables or {}),
            )
        except Exception as exc:  # the template, run on this conversation, refused or failed
            raise ChatTemplateError(_explain(exc)) from None
        return text if final is None else _cut_after_final(text, final)


_MISSING_ATTR = re.compile(r"has no attribute '([^']*)'|^'([^']*)' is undefined")


def _explain(exc: Exception) -> str:
    """What went wrong, in the request's terms (never a Python type name or repr)."""
    if isinstance(exc, jinja2.exceptions.UndefinedError):
        m = _MISSING_ATTR.search(str(exc))
        name = (m.group(1) or m.group(2)) if m else None
        if name is None:
            return "the chat template reads a value these messages do not have"
        if m.group(1) is not None:
            return (
                f"the chat template reads a field {name!r} that a message (or tool, or "
                "document) of this request does not have"
            )
        return f"the chat template needs a variable {name!r} (give it in chat_template_kwargs)"
    if isinstance(exc, jinja2.exceptions.SecurityError):
        return f"the chat template tried something its sandbox forbids: {exc}"
    if isinstance(exc, RecursionError):
        return "the conversation is nested too deeply for the chat template"
    if type(exc) is jinja2.exceptions.TemplateError:  # raise_exception: the template's words
        return str(exc)
    return f"the chat template could not render these messages: {exc}"


def _without_nulls(message: dict) -> dict:
    if not isinstance(message, dict):
        raise ChatTemplateError(f"a chat message must be a mapping, got {message!r}")
    return {k: v for k, v in message.items() if v is not None}


def _with_reasoning(message: dict) -> dict:
    """A message's reasoning under `thinking` (first) and `reasoning_content` as well."""
    found = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    if found is None:
        return message
    return {"thinking": found, **message, "reasoning_content": found}


def _mark_final(last: dict, field: str, source: str) -> str:
    """Tag the end of the final message's `field`; return its text before the tag."""
    value = last.get(field)
    if value is None:
        raise ChatTemplateError(
            f'continue_final_message: the final message has no "{field}" to continue'
        )
    fields = [field]
    if field in REASONING_FIELDS:  # present under several names: tag each copy
        fields = [f for f in REASONING_FIELDS if last.get(f) == value]
    if not any(f in source for f in fields):
        raise ChatTemplateError(
            f'continue_final_message: the chat template does not read the "{field}" field'
        )
    if isinstance(value, list | tuple):
        for block in reversed(value):
            if isinstance(block, dict) and "text" in block:
                text = block["text"]
                block["text"] = text + _TAG
                return text
        raise ChatTemplateError("continue_final_message: the final message has no text to continue")
    for f in fields:
        last[f] = last[f] + _TAG
    return value


def _cut_after_final(text: str, final: str) -> str:
    mark = _TAG.strip()
    if final.strip() not in text or mark not in text:
        raise ChatTemplateError(
            "continue_final_message: the chat template does not render the final message as "
            "given, so it cannot be continued"
        )
    at = text.rindex(mark)
    if text[at : at + len(_TAG)] == _TAG:
        return text[:at]
    return text[:at].rstrip()  # the template trimmed trailing space after the message
