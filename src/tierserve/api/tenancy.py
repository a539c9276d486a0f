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
        sla_demote: false           # SLA admission: a late P1/P2 request runs as P3, not 503
        sla_end_early: false        # SLA admission: end a waiting request that became late
        batch_tier: batch           # its batches' class: batch (P2) or background (P3)
        batch_limits: {max_queued_tokens: 5000000, max_files: 100, max_bytes: 1000000000}
        speculative: true           # false: its requests never speculate (--speculative-config)

A requested class above the tenant's entitlement is clamped to the entitlement, never honoured;
the class actually used is reported in the ``x-tierserve-priority`` response header.

The file is validated strictly (``TenantsFile``): ``keys`` must be a list (a lone string would
otherwise be read character by character), unknown fields and wrong types are errors naming the
file, the tenant and the field.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, Field

from tierserve.config import BucketConfig
from tierserve.config_file import ConfigFileError, FileModel, read_yaml, validate_file
from tierserve.priority import Priority, parse_priority

DEFAULT_TENANT = "default"
# OpenAI's `service_tier` values: the class each asks for (None: the tenant's default), and the
# value a response echoes for the class it was served in.
SERVICE_TIERS: dict[str, Priority | None] = {
    "auto": None,
    "default": None,
    "flex": Priority.P2,
    "priority": Priority.P0,
}
SERVED_TIER = {
    Priority.P0: "priority",
    Priority.P1: "default",
    Priority.P2: "flex",
    Priority.P3: "flex",
}


class AuthError(Exception):
    """Missing or unknown API key (401)."""


class BadPriority(ValueError):
    """An unknown tier name or an out-of-range priority (400)."""


Tier = Annotated[Priority, BeforeValidator(parse_priority)]


class RateLimitSpec(FileModel):
    tokens_per_s: Annotated[float, Field(gt=0)]
    burst: Annotated[float, Field(gt=0)]


@dataclass(frozen=True)
class TenantBatchLimits:
    """What one tenant may hold: estimated tokens of its unfinished batches, files, bytes."""

    max_queued_tokens: int = 50_000_000
    max_files: int = 1_000
    max_bytes: int = 10 << 30


class BatchLimitsSpec(FileModel):
    max_queued_tokens: Annotated[int, Field(gt=0)] = TenantBatchLimits.max_queued_tokens
    max_files: Annotated[int, Field(gt=0)] = TenantBatchLimits.max_files
    max_bytes: Annotated[int, Field(gt=0)] = TenantBatchLimits.max_bytes


class TenantSpec(FileModel):
    keys: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)]
    max_tier: Tier = Priority.P0
    default_tier: Tier = Priority.P1
    rate_limit: RateLimitSpec | None = None
    share_prefix_cache: bool = False
    sla_demote: bool = False
    sla_end_early: bool = False
    batch_tier: Tier | None = None
    batch_limits: BatchLimitsSpec | None = None
    speculative: bool = True


class TenantsFile(FileModel):
    tenants: Annotated[dict[str, TenantSpec], Field(min_length=1)]


API_KEY_ENV = "TIERSERVE_API_KEY"


def key_problem(key: str) -> str | None:
    """Why a configured key could never match an `Authorization: Bearer` header, or None."""
    if key != key.strip():
        return "has spaces or tabs around it (the header's value is stripped)"
    if not key.isascii():
        return "has non-ASCII characters (an HTTP header cannot carry them)"
    if not key.isprintable():
        return "has control characters (an HTTP header cannot carry them)"
    return None


def _where(loc: tuple) -> str:
    """('tenants', 'acme', 'rate_limit', 'burst') -> "tenant 'acme', field 'rate_limit.burst'"."""
    if len(loc) >= 3 and loc[0] == "tenants":
        return f"tenant {loc[1]!r}, field {'.'.join(map(str, loc[2:]))!r}"
    if len(loc) == 2 and loc[0] == "tenants":
        return f"tenant {loc[1]!r}"
    return f"field {'.'.join(map(str, loc)) or 'tenants'!r}"


@dataclass(frozen=True)
class Tenant:
    name: str
    max_priority: Priority = Priority.P0
    default_priority: Priority = Priority.P1
    bucket: BucketConfig | None = None
    cache_salt: str | None = None
    # SLA admission opt-ins (admission/sla.py): instead of a 503, a P1/P2 request that cannot
    # make its SLA runs as best effort (P3); a waiting request that became late is ended early.
    sla_demote: bool = False
    sla_end_early: bool = False
    # The Batch API: the class of its batches' lines (None: P2) and what it may hold.
    batch_tier: Priority | None = None
    batch_limits: TenantBatchLimits | None = None
    # False: its requests never speculate (as a body's "speculative": false).
    speculative: bool = True


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
        problem = key_problem(api_key)
        if problem:
            raise ValueError(f"the API key (--api-key or ${API_KEY_ENV}) {problem}")
        t = Tenant(DEFAULT_TENANT)
        return cls({t.name: t}, {api_key: t.name}, "single-key")

    @classmethod
    def from_yaml(cls, path: str | Path) -> TenantRegistry:
        """Load and validate a tenants file; ConfigFileError names what is wrong."""
        data = read_yaml(path, "tenants file")
        spec = validate_file(TenantsFile, data, path, _where)
        tenants, keys = {}, {}
        for name, t in spec.tenants.items():
            if t.default_tier < t.max_tier:
                raise ConfigFileError(
                    f"{path}: tenant {name!r}: default_tier {t.default_tier.tier} is above its "
                    f"max_tier {t.max_tier.tier}"
                )
            rl = t.rate_limit
            bucket = BucketConfig(rl.tokens_per_s, rl.burst) if rl else None
            salt = None if t.share_prefix_cache else name
            if t.batch_tier not in (None, Priority.P2, Priority.P3):
                raise ConfigFileError(
                    f"{path}: tenant {name!r}: batch_tier must be batch or background, got "
                    f"{t.batch_tier.tier}"
                )
            bl = t.batch_limits
            limits = TenantBatchLimits(**bl.model_dump()) if bl else None
            tenants[name] = Tenant(
                name,
                t.max_tier,
                t.default_tier,
                bucket,
                salt,
                t.sla_demote,
                t.sla_end_early,
                t.batch_tier,
                limits,
                t.speculative,
            )
            for key in t.keys:
                problem = key_problem(key)
                if problem:  # it would load, and never authenticate anyone
                    raise ConfigFileError(f"{path}: tenant {name!r}: a key {problem}")
                if key in keys:
                    raise ConfigFileError(
                        f"{path}: tenant {name!r}: key {key[:6]}... is already given to "
                        f"tenant {keys[key]!r}"
                    )
                keys[key] = name
        return cls(tenants, keys, "file")

    def authenticate(self, authorization: str | None, tenant_header: str | None) -> Tenant:
        if self.mode == "open":
            name = tenant_header or DEFAULT_TENANT
            return self.tenants.get(name) or Tenant(name, cache_salt=name)
        if not authorization or not authorization.lower().startswith("bearer "):
            raise AuthError("missing API key: send `Authorization: Bearer <key>`")
        given = authorization[7:].strip().encode("latin-1", "replace")
        name = None
        for key, tenant in self.keys.items():  # constant time per key: no timing oracle
            if hmac.compare_digest(key.encode(), given):
                name = tenant
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


def tenant_registry(settings) -> TenantRegistry:
    """The server's tenants: its tenants file, its one API key, or open (`ServerSettings`)."""
    if settings.tenants_file:
        return TenantRegistry.from_yaml(settings.tenants_file)
    if settings.api_key:
        return TenantRegistry.single_key(settings.api_key)
    return TenantRegistry.open()
