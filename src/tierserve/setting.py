"""A user's setting declared once, on its dataclass field: the help its flag shows and the check
its value must pass. `tierserve serve`'s flag (cli/serve_options.py), the config's own check, and
the records that carry it to the engine and the simulator (`carried`) all read it from there."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the reason."""


@dataclass(frozen=True)
class Setting:
    """What a user may set, declared once beside its field (type and default are the field's):
    the help its `tierserve serve` flag shows, and the check its value must pass, with the rule
    the error states. The flag (cli/serve_options.py), the engine's and the simulator's records
    (engine/args.py, sim/engine/runner.py) read it from here."""

    help: str = ""
    check: Callable[[Any], bool] | None = None
    rule: str = ""


def setting(default: Any, help: str = "", check=None, rule: str = "") -> Any:
    """A dataclass field that is a user's setting (see `Setting`)."""
    return field(default=default, metadata={"setting": Setting(help, check, rule)})


def declared(cls: type, name: str) -> tuple[Any, Setting]:
    """The default and the `Setting` of `cls`'s field `name`."""
    f = next(f for f in fields(cls) if f.name == name)
    return f.default, f.metadata.get("setting", Setting())


def check_settings(obj: Any) -> None:
    """Every declared check of `obj`'s fields, one error naming the field and the rule."""
    for f in fields(obj):
        s = f.metadata.get("setting")
        if s is not None and s.check is not None:
            v = getattr(obj, f.name)
            if not s.check(v):
                raise ConfigError(f"{f.name} must {s.rule}, got {v!r}")


def carried(cls: type, source: Any, **computed: Any) -> dict[str, Any]:
    """The keywords for `cls` that `source` (EngineArgs, SimConfig) carries under the same
    names, then `computed` (values resolved first: device defaults, context length)."""
    names = {f.name for f in fields(cls)}
    return {n: getattr(source, n) for n in names if hasattr(source, n)} | computed


def fraction_or_none(high: float) -> Callable[[Any], bool]:
    def ok(v: Any) -> bool:
        return v is None or (
            isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= high
        )

    return ok
