"""Tool calls in a model's text (`tool_choice: auto`), in the two formats chat templates ask for:

- Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number of them,
  anywhere in the text (a last one left unclosed at the end of the output counts too);
- plain JSON: the whole output (whitespace and a ```json fence aside) is one call object, or a
  list of them, as Llama 3.x templates ask (`"parameters"` is taken for `"arguments"`).

A call counts only if its JSON parses and names one of the request's tools; anything else stays
text, unchanged. The parser is incremental: `feed` takes text deltas and returns what can be
said already (content, or a whole call once its closing tag is seen); `finish` flushes. Text
that might still turn into a call is held back: a partial `<tool_call>` tag, whitespace that
may separate calls, and an output that starts like JSON (until the end). `parse_tool_calls`
runs the same parser over a whole text, so streamed and non-streamed answers agree.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

OPEN, CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object, as text (OpenAI's `function.arguments`)


# An event: ("content", text) or ("call", ParsedCall).
Event = tuple[str, "str | ParsedCall"]


def _call(obj, names: frozenset[str]) -> ParsedCall | None:
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _loads(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _unfence(text: str) -> str:
    s = text.strip()
    if s.startswith("```") and s.endswith("```") and len(s) >= 6:
        s = s[3:-3]
        s = s.removeprefix("json")
    return s.strip()


def _held_prefix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that begins `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ToolCallParser:
    def __init__(self, tool_names: Iterable[str]) -> None:
        self.names = frozenset(tool_names)
        self.mode = "start"  # start | text | call | json
        self.buf = ""  # text not yet said
        self.space = ""  # whitespace held after the last content
        self.num_calls = 0

    def feed(self, text: str) -> list[Event]:
        self.buf += text
        out: list[Event] = []
        while True:
            if self.mode == "start":
                head = self.buf.lstrip()
                if not head or (len(head) < 3 and "```".startswith(head)):
                    return out  # undecided
                json_like = head[0] in "{[" or head.startswith("```")
                self.mode = "json" if json_like else "text"
            if self.mode == "json":
                return out  # decided at the end: the whole output is a call, or text
            if self.mode == "text":
                at = self.buf.find(OPEN)
                if at < 0:
                    keep = _held_prefix(self.buf, OPEN)
                    self._content(self.buf[: len(self.buf) - keep], out)
                    self.buf = self.buf[len(self.buf) - keep :]
                    return out
                self._content(self.buf[:at], out)
                self.buf, self.mode = self.buf[at + len(OPEN) :], "call"
            if self.mode == "call":
                end = self.buf.find(CLOSE)
                if end < 0:
                    return out
                block, self.buf = self.buf[:end], self.buf[end + len(CLOSE) :]
                self._block(block, OPEN + block + CLOSE, out)
                self.mode = "text"

    def finish(self) -> list[Event]:
        out: list[Event] = []
        rest, self.buf = self.buf, ""
        if self.mode == "json":
            obj = _loads(_unfence(rest))
            items = obj if isinstance(obj, list) and obj else [obj]
            calls = [_call(o, self.names) for o in items]
            if all(calls):
                self.num_calls += len(calls)
                out.extend(("call", c) for c in calls)
            else:
                self._content(rest, out)
        elif self.mode == "call":
            self._block(rest, OPEN + rest, out)
        else:
            self._content(rest, out)
        if self.space and not self.num_calls:
            out.append(("content", self.space))
        self.space = ""
        return out

    def _block(self, block: str, raw: str, out: list[Event]) -> None:
        call = _call(_loads(block.strip()), self.names)
        if call is None:
            self._content(raw, out)
        else:
            self.num_calls += 1
            out.append(("call", call))

    def _content(self, text: str, out: list[Event]) -> None:
        """Say `text`, holding its trailing whitespace until more text follows: whitespace
        between (or after) calls is no content."""
        body = text.rstrip()
        if body:
            out.append(("content", self.space + body))
            self.space = ""
        self.space += text[len(body) :]


def parse_tool_calls(text: str, tool_names: Iterable[str]) -> tuple[str | None, list[ParsedCall]]:
    """(content, calls) of a whole output. Without calls the content is `text` unchanged; with
    calls it is the text around them, stripped, or None when there is none."""
    parser = ToolCallParser(tool_names)
    events = parser.feed(text) + parser.finish()
    calls = [e for kind, e in events if kind == "call"]
    if not calls:
        return text, []
    content = "".join(e for kind, e in events if kind == "content").strip()
    return content or None, calls
