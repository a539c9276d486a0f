"""Grammars that enforce tool calls, in the format the chat template asks for, so that the
existing parser (`chat/tool_parser.py`) reads them back as `tool_calls`:

- Hermes / Qwen templates (their text mentions `<tool_call>`): each call is
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`;
- any other template: the whole answer is the JSON call (a list of calls for `required`, one
  call object for a named function), as Llama 3.x templates ask.

A call's `arguments` follow the function's `parameters` schema (an object if it has none).
`tool_choice: "required"` asks for one call or more (exactly one with `parallel_tool_calls:
false`), a named function for exactly one call of it. With `tool_choice: "auto"` nothing is
forced unless a tool is `strict`: then the answer is free text or calls, and a call's arguments
follow its schema when its tool is strict (any object otherwise).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tierserve.grammar.spec import GrammarSpec

HERMES_TAG = "<tool_call>"


@dataclass(frozen=True)
class ToolDef:
    name: str
    parameters: dict | None
    strict: bool = False


def template_format(template_source: str | None) -> str:
    """ "hermes" if the template writes `<tool_call>` tags, else "json"."""
    return "hermes" if template_source and HERMES_TAG in template_source else "json"


def _call_schema(tool: ToolDef, use_schema: bool) -> dict:
    params = tool.parameters if use_schema and tool.parameters else {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _one_of(tools: list[ToolDef], strict_only: bool) -> dict:
    items = [_call_schema(t, t.strict or not strict_only) for t in tools]
    return items[0] if len(items) == 1 else {"anyOf": items}


def forced_calls(tools: list[ToolDef], fmt: str, many: bool) -> GrammarSpec:
    """`tool_choice` required (all of `tools`; `many`: one call or more, else exactly one) or
    named (`tools` = that one function, `many` false)."""
    call = _one_of(tools, strict_only=False)
    if fmt == "hermes":
        more = ' ("\\n" call)*' if many else ""
        return GrammarSpec.lark(
            f"start: call{more}\n"
            f'call: "{HERMES_TAG}\\n" %json {json.dumps(call)} "\\n</tool_call>"\n'
        )
    if not many:
        return GrammarSpec.json_schema(call)
    return GrammarSpec.json_schema({"type": "array", "items": call, "minItems": 1})


def strict_auto(tools: list[ToolDef], fmt: str) -> GrammarSpec | None:
    """`tool_choice` auto: None unless a tool is strict; else text or calls, strict arguments."""
    if not any(t.strict for t in tools):
        return None
    call = json.dumps(_one_of(tools, strict_only=True))
    if fmt == "hermes":
        # Free text up to a `<tool_call>` tag (the stop string), then a call; text at the end.
        return GrammarSpec.lark(
            "start: seg* tail\n"
            "seg: before call\n"
            f'before[stop="{HERMES_TAG}"]: /(.|\\n)*/\n'
            "tail: /(.|\\n)*/\n"
            f'call: /[ \\n]*/ %json {call} /[ \\n]*/ "</tool_call>"\n'
        )
    calls = json.dumps({"type": "array", "items": json.loads(call), "minItems": 1})
    # The parser reads an answer that starts like JSON as calls: text must not start so.
    return GrammarSpec.lark(
        f"start: calls | TEXT?\ncalls: %json {calls}\nTEXT: /\\s*[^\\s\\[{{`](.|\\n)*/\n"
    )
