"""Who is asking, and at which priority: API key -> tenant -> entitlement, then the
``x-request-tier`` header, then the body's ``priority``.

A tenants file (YAML)::

    tenants:
      acme:
        keys: [sk-acme-1, sk-acme-2]
        max_tier: realtime          # the most urgent class it may use
        default_tier: online        # used when the request names none
        rate_limit: {tokens_per_s: 2000, burst: 8000}
        share_prefix_cache: false   # default: its own cache salt (its name)

A requested class above the tenant's entitlement is clamped to the entitlement, never honoured;
the class actually used is reported in the ``x-tierserve-priority`` response header.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from tierserve.config import BucketConfig
from tierserve.priority import Priority, parse_priority

DEFAULT_TENANT = "default"


class AuthError(Exception):
    """Missing or unknown API key (401)."""


class BadPriority(ValueError):
    """An unknown tier name or an out-of-range priority (400)."""


@dataclass(frozen=True)
class Tenant:
    name: str
    max_priority: Priority = Priority.P0
    default_priority: Priority = Priority.P1
    bucket: BucketConfig | None = None
    cache_salt: str | None = None


@dataclass(frozen=True)
class Resolution:
    tenant: Tenant
    priority: Priority
    requested: Priority | None
    clamped: bool


class TenantRegistry:
    """Three modes: a tenants file (keys required), one `--api-key` (required, single tenant),
    or open (no keys; ``x-tenant-id`` names the tenant)."""

    def __init__(self, tenants: dict[str, Tenant], keys: dict[str, str], mode: str) -> None:
        self.tenants = tenants
        self.keys = keys
        self.mode = mode  # "file" | "single-key" | "open"

    @classmethod
    def open(cls) -> TenantRegistry:
        return cls({}, {}, "open")

    @classmethod
    def single_key(cls, api_key: str) -> TenantRegistry:
        t = Tenant(DEFAULT_TENANT)
        return cls({t.name: t}, {api_key: t.name}, "single-key")

    @classmethod
    def from_yaml(cls, path: str | Path) -> TenantRegistry:
        data = yaml.safe_load(Path(path).read_text()) or {}
        entries = data.get("tenants")
        if not isinstance(entries, dict) or not entries:
            raise ValueError(f"{path}: expected a non-empty `tenants:` mapping")
        tenants, keys = {}, {}
        for name, spec in entries.items():
            spec = spec or {}
            try:
                max_p = parse_priority(spec.get("max_tier", "realtime"))
                default_p = parse_priority(spec.get("default_tier", "online"))
            except ValueError as exc:
                raise ValueError(f"{path}: tenant {name!r}: {exc}") from None
            if default_p < max_p:
                raise ValueError(
                    f"{path}: tenant {name!r}: default_tier {default_p.tier} is above its "
                    f"max_tier {max_p.tier}"
                )
            rl = spec.get("rate_limit")
            bucket = BucketConfig(float(rl["tokens_per_s"]), float(rl["burst"])) if rl else None
            salt = None if spec.get("share_prefix_cache", False) else str(name)
            tenants[name] = Tenant(str(name), max_p, default_p, bucket, salt)
            for key in spec.get("keys", []):
                if key in keys:
                    raise ValueError(f"{path}: key {key[:6]}... is given to two tenants")
                keys[str(key)] = str(name)
        return cls(tenants, keys, "file")

    def authenticate(self, authorization: str | None, tenant_header: str | None) -> Tenant:
        if self.mode == "open":
            name = tenant_header or DEFAULT_TENANT
            return self.tenants.get(name) or Tenant(name, cache_salt=name)
        if not authorization or not authorization.lower().startswith("bearer "):
            raise AuthError("missing API key: send `Authorization: Bearer <key>`")
        name = self.keys.get(authorization[7:].strip())
        if name is None:
            raise AuthError("invalid API key")
        return self.tenants[name]

    @staticmethod
    def resolve(tenant: Tenant, tier_header: str | None, body_priority: object) -> Resolution:
        requested: Priority | None = None
        try:
            if tier_header is not None:
                requested = parse_priority(tier_header)
            elif body_priority is not None:
                if isinstance(body_priority, bool) or not isinstance(body_priority, int):
                    raise ValueError(
                        f"invalid priority {body_priority!r}: expected an integer 0..3"
                    )
                requested = parse_priority(body_priority)
        except ValueError as exc:
            raise BadPriority(str(exc)) from None
        wanted = tenant.default_priority if requested is None else requested
        actual = max(wanted, tenant.max_priority)  # larger number = less urgent
        return Resolution(tenant, Priority(actual), requested, actual != wanted)
