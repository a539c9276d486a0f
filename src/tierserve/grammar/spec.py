"""What a request's output must match, as plain data: it travels in `SamplingParams` through
the scheduler (which never looks inside) to the executor, which compiles it with the grammar
engine (`tierserve.grammar.engine`). No engine import here: the core stays dependency-free."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

Kind = Literal["json_object", "json_schema", "lark"]


@dataclass(frozen=True)
class GrammarSpec:
    kind: Kind
    source: str = ""  # the JSON schema as JSON text (json_schema) or the grammar text (lark)

    def __post_init__(self) -> None:
        if self.kind not in ("json_object", "json_schema", "lark"):
            raise ValueError(f"unknown grammar kind {self.kind!r}")
        if self.kind != "json_object" and not self.source:
            raise ValueError(f"a {self.kind} grammar needs its source")

    @classmethod
    def json_object(cls) -> GrammarSpec:
        return cls("json_object")

    @classmethod
    def json_schema(cls, schema: dict) -> GrammarSpec:
        return cls("json_schema", json.dumps(schema, ensure_ascii=False))

    @classmethod
    def lark(cls, grammar: str) -> GrammarSpec:
        return cls("lark", grammar)
