"""Settings files (YAML) validated by pydantic models: strict types, no unknown keys, and errors
that name the file, where in it, and what is wrong, in one line (never a traceback)."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound=BaseModel)

# Values at these keys are never echoed in an error message.
SECRET_KEYS = frozenset({"keys", "api_key"})


class ConfigFileError(ValueError):
    """A settings file cannot be read or is invalid; the message names the file and field."""


class FileModel(BaseModel):
    """Base for file models: unknown keys are errors; `"false"` is not a boolean, `"8"` is
    not a number."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


def read_yaml(path: str | Path, what: str) -> Any:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigFileError(f"{path}: cannot read the {what}: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "syntax error"
        raise ConfigFileError(f"{path}: the {what} is not valid YAML{at}: {problem}") from None


def _got(value: Any, secret: bool) -> str:
    kind = {str: "a string", bool: "a boolean", int: "an integer", float: "a number"}.get(
        type(value), f"a {type(value).__name__}"
    )
    if value is None:
        return "nothing (null)"
    if secret or isinstance(value, dict | list):
        return kind
    text = repr(value)
    return f"{kind}, {text if len(text) <= 40 else text[:37] + '...'}"


def _explain(err: dict, model: type[BaseModel]) -> str:
    kind, value = err["type"], err.get("input")
    secret = any(k in SECRET_KEYS for k in err["loc"] if isinstance(k, str))
    if kind == "extra_forbidden":
        name = str(err["loc"][-1])
        close = difflib.get_close_matches(name, _field_names(model, err["loc"][:-1]), n=1)
        return "not a known field" + (f" (did you mean {close[0]!r}?)" if close else "")
    if kind == "missing":
        return "missing (required)"
    if kind in ("list_type", "dict_type", "model_type", "model_attributes_type"):
        want = "a list" if kind == "list_type" else "a mapping"
        return f"expected {want}, got {_got(value, secret)}"
    if kind == "bool_type":
        return f"expected true or false, got {_got(value, secret)}"
    msg = err["msg"].removeprefix("Value error, ")
    return msg if kind.startswith("value_error") else f"{msg}, got {_got(value, secret)}"


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The model inside an annotation such as `dict[str, Tenant]` or `Bucket | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := _submodel(arg)) is not None:
            return found
    return None


def _field_names(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names of the (sub)model at `loc`, for did-you-mean hints."""
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is not None:  # otherwise a dict key or list index: the same model below
            model = _submodel(field.annotation) or model
    return list(model.model_fields)


def validate_file(model: type[M], data: Any, path: str | Path, where: Callable[[tuple], str]) -> M:
    """Validate `data` read from `path`; `where(loc)` names a place in the file for errors."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errs = exc.errors()
        parts = [f"{where(e['loc'])}: {_explain(e, model)}" for e in errs[:3]]
        more = f" (and {len(errs) - 3} more)" if len(errs) > 3 else ""
        raise ConfigFileError(f"{path}: {'; '.join(parts)}{more}") from None
