"""Policies are found by name. Registering a name twice is an error; the decorator returns the
class it decorates."""

from __future__ import annotations

from collections.abc import Callable

from tierserve.config import ConfigError, PolicyConfig, PriorityConfig
from tierserve.policies.base import Policy


class PolicyRegistry:
    def __init__(self) -> None:
        self._by_name: dict[str, type[Policy]] = {}

    def register(self, name: str) -> Callable[[type[Policy]], type[Policy]]:
        def deco(cls: type[Policy]) -> type[Policy]:
            if name in self._by_name:
                raise ValueError(
                    f"policy {name!r} is already registered by {self._by_name[name].__name__}"
                )
            cls.name = name
            self._by_name[name] = cls
            return cls

        return deco

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def get(self, name: str) -> type[Policy]:
        try:
            return self._by_name[name]
        except KeyError:
            raise ConfigError(
                f"unknown policy {name!r}; available: {', '.join(self.names())}"
            ) from None

    def create(self, config: PolicyConfig, priorities: PriorityConfig | None = None) -> Policy:
        """The policy `config.name`, given its own settings (its ``config_class``)."""
        cls = self.get(config.name)
        return cls(cls.config_class.of(config), priorities)


# The registry of built-in policies; tests and plug-ins may build their own registry.
POLICIES = PolicyRegistry()
register_policy = POLICIES.register
