"""Limits a JSON schema must meet before it reaches the grammar engine, checked in plain Python
(no llguidance), so that the API refuses with a 400 naming the limit what the engine would only
fail on while generating (a 500 with its parser state, or an error event after a 200):

- at most `MAX_ALTERNATIVES` branches in one `anyOf` / `oneOf` (llguidance's parser allows
  2,000 items in a row; 5,000 object branches failed at the first token);
- at most `MAX_NODES` subschemas and `MAX_DEPTH` levels of nesting in all;
- the schema must admit a finite value: a `$ref` that requires itself (through a required
  property, a non-empty array's items or an `allOf` branch) with no way out, such as
  `{"$ref": "#/$defs/n", "$defs": {"n": {"type": "object", "properties": {"c": {"$ref":
  "#/$defs/n"}}, "required": ["c"]}}}`, describes only infinite values.

The finiteness check is a fixpoint over the schema's local `$ref`s: a reference is finite once
its target is finite assuming what is known so far; whatever never becomes finite is not.
Constructs it does not model (untyped objects, `not`, `if`) count as finite: it refuses only
what certainly has no finite value.
"""

from __future__ import annotations

from typing import Any

MAX_ALTERNATIVES = 1000
MAX_NODES = 10_000
MAX_DEPTH = 64


class SchemaLimitError(ValueError):
    """The schema is beyond a limit, or has no finite value (the message says which)."""


def check_schema(schema: Any) -> None:
    """Raise SchemaLimitError if `schema` breaks a limit or admits no finite value."""
    refs = _walk(schema)
    finite = _finite_refs(schema, refs)
    if not _finite(schema, finite):
        bad = sorted(r for r in refs if not finite.get(r, True))
        which = f" ('$ref' {bad[0]!r} requires itself with no way out)" if bad else ""
        raise SchemaLimitError(f"the schema admits no finite value{which}")


def _walk(schema: Any) -> set[str]:
    """Check the size limits (iteratively: no recursion on client input); return the local
    `$ref`s it uses."""
    refs: set[str] = set()
    stack, nodes = [(schema, 1)], 0
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SchemaLimitError(f"the schema is nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
            continue
        if not isinstance(node, dict):
            continue
        nodes += 1
        if nodes > MAX_NODES:
            raise SchemaLimitError(f"the schema has more than {MAX_NODES} subschemas")
        for key in ("anyOf", "oneOf"):
            branches = node.get(key)
            if isinstance(branches, list) and len(branches) > MAX_ALTERNATIVES:
                raise SchemaLimitError(
                    f"{key} has {len(branches)} branches; at most {MAX_ALTERNATIVES} are allowed"
                )
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            refs.add(ref)
        stack.extend((v, depth + 1) for k, v in node.items() if k not in ("enum", "const"))
    return refs


def _resolve(root: Any, ref: str) -> Any:
    """The target of a local JSON pointer ('#', '#/$defs/n'); None if it points nowhere."""
    node = root
    for raw in ref[1:].split("/")[1:] if ref != "#" else ():
        key = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node


def _finite_refs(root: Any, refs: set[str]) -> dict[str, bool]:
    finite = dict.fromkeys(refs, False)
    targets = {r: _resolve(root, r) for r in refs}
    changed = True
    while changed:
        changed = False
        for r in refs:
            if not finite[r] and (targets[r] is None or _finite(targets[r], finite)):
                finite[r] = changed = True  # an unresolvable ref: the engine will say so
    return finite


def _finite(node: Any, finite: dict[str, bool]) -> bool:
    """Whether `node` admits a finite value, given which references do."""
    if node is False:
        return False
    if not isinstance(node, dict):
        return True
    ref = node.get("$ref")
    if isinstance(ref, str) and not finite.get(ref, True):
        return False
    if "const" in node or "enum" in node:
        return True
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if (
            isinstance(branches, list)
            and branches
            and not any(_finite(b, finite) for b in branches)
        ):
            return False
    if isinstance(node.get("allOf"), list) and not all(_finite(b, finite) for b in node["allOf"]):
        return False
    types = node.get("type")
    types = set(types) if isinstance(types, list) else {types}
    if types - {"object", "array"}:  # a scalar, no type, or one the engine will judge
        return True
    if "object" in types and _object_finite(node, finite):
        return True
    return "array" in types and _array_finite(node, finite)


def _object_finite(node: dict, finite: dict[str, bool]) -> bool:
    props = node.get("properties")
    props = props if isinstance(props, dict) else {}
    required = node.get("required")
    for name in required if isinstance(required, list) else ():
        if name in props and not _finite(props[name], finite):
            return False
    return True


def _array_finite(node: dict, finite: dict[str, bool]) -> bool:
    need = node.get("minItems", 0)
    if not isinstance(need, int) or need <= 0:
        return True
    prefix = node.get("prefixItems")
    prefix = prefix if isinstance(prefix, list) else []
    if not all(_finite(s, finite) for s in prefix[:need]):
        return False
    return need <= len(prefix) or _finite(node.get("items", True), finite)
