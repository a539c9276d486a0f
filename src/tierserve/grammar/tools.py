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


def _call_schema(tool: ToolDef, use_schema: bool, defs: dict, i: int) -> dict:
    params = tool.parameters if use_schema and tool.parameters else {"type": "object"}
    if _has_local_ref(params):  # its `$ref`s must still point home inside the call's schema
        params = _hoist(params, f"t{i}", defs)
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _one_of(tools: list[ToolDef], strict_only: bool) -> tuple[dict, dict]:
    """The schema of one call of any of `tools`, and the `$defs` its root must carry."""
    defs: dict = {}
    items = [_call_schema(t, t.strict or not strict_only, defs, i) for i, t in enumerate(tools)]
    return (items[0] if len(items) == 1 else {"anyOf": items}), defs


def _rooted(schema: dict, defs: dict) -> dict:
    """`schema` as the root of a JSON schema document: with the hoisted `$defs`, if any."""
    return {**schema, "$defs": defs} if defs else schema


# -- a tool's own `$ref`s ---------------------------------------------------------------------
# A tool's parameters schema is a document of its own: "#" is its root and "#/$defs/x" its
# definitions (pydantic writes nested models so). Embedded in a call's schema, those pointers
# would point into the call. So the parameters move to the root's `$defs` under "t<i>", their
# definitions under "t<i>_<name>", and every local pointer is rewritten to match.


def _has_local_ref(node) -> bool:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            return True
        return any(_has_local_ref(v) for k, v in node.items() if k not in ("enum", "const"))
    return isinstance(node, list) and any(_has_local_ref(v) for v in node)


def _hoist(params: dict, key: str, defs: dict) -> dict:
    own = {}
    for section in ("$defs", "definitions"):
        if isinstance(params.get(section), dict):
            own.update({name: sub for name, sub in params[section].items()})
    body = {k: v for k, v in params.items() if k not in ("$defs", "definitions")}
    defs[key] = _rewrite(body, key)
    for name, sub in own.items():
        defs[f"{key}_{name}"] = _rewrite(sub, key)
    return {"$ref": f"#/$defs/{key}"}


def _rewrite(node, key: str):
    if isinstance(node, list):
        return [_rewrite(v, key) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: (v if k in ("enum", "const") else _rewrite(v, key)) for k, v in node.items()}
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = _moved(ref, key)
    return out


def _moved(ref: str, key: str) -> str:
    parts = ref[1:].split("/")[1:] if ref not in ("#", "#/") else []
    if len(parts) >= 2 and parts[0] in ("$defs", "definitions"):
        return "/".join([f"#/$defs/{key}_{parts[1]}", *parts[2:]])
    return "/".join([f"#/$defs/{key}", *parts])


def forced_calls(tools: list[ToolDef], fmt: str, many: bool) -> GrammarSpec:
    """`tool_choice` required (all of `tools`; `many`: one call or more, else exactly one) or
    named (`tools` = that one function, `many` false)."""
    call, defs = _one_of(tools, strict_only=False)
    if fmt == "hermes":
        more = ' ("\\n" call)*' if many else ""
        return GrammarSpec.lark(
            f"start: call{more}\n"
            f'call: "{HERMES_TAG}\\n" %json {json.dumps(_rooted(call, defs))} "\\n</tool_call>"\n'
        )
    if not many:
        return GrammarSpec.json_schema(_rooted(call, defs))
    return GrammarSpec.json_schema(_rooted({"type": "array", "items": call, "minItems": 1}, defs))


def strict_auto(tools: list[ToolDef], fmt: str) -> GrammarSpec | None:
    """`tool_choice` auto: None unless a tool is strict; else text or calls, strict arguments."""
    if not any(t.strict for t in tools):
        return None
    one, defs = _one_of(tools, strict_only=True)
    if fmt == "hermes":
        call = json.dumps(_rooted(one, defs))
        # Free text up to a `<tool_call>` tag (the stop string), then a call; text at the end.
        return GrammarSpec.lark(
            "start: seg* tail\n"
            "seg: before call\n"
            f'before[stop="{HERMES_TAG}"]: /(.|\\n)*/\n'
            "tail: /(.|\\n)*/\n"
            f'call: /[ \\n]*/ %json {call} /[ \\n]*/ "</tool_call>"\n'
        )
    calls = json.dumps(_rooted({"type": "array", "items": one, "minItems": 1}, defs))
    # The parser reads an answer that starts like JSON as calls: text must not start so.
    return GrammarSpec.lark(
        f"start: calls | TEXT?\ncalls: %json {calls}\nTEXT: /\\s*[^\\s\\[{{`](.|\\n)*/\n"
    )
