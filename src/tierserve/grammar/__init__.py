"""Structured output: grammars (JSON object, JSON schema, Lark) that a request's output must
match, enforced by token masks in the sampler.

- `spec.py`: `GrammarSpec`, the plain-data description a request carries (no engine import);
- `tools.py`: the grammars that force tool calls (`tool_choice` required / named, strict tools);
- `engine.py`: the grammar engine (llguidance): compiling specs, validating them for the API;
- `matchers.py`: the executor's per-request matchers, bitmasks for a step's rows, replay after
  recompute.

Why llguidance (measured against xgrammar): docs/api.md, "Structured output".
"""

from tierserve.grammar.spec import GrammarSpec

__all__ = ["GrammarSpec"]
