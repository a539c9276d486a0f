"""Batch settings: numbers and paths only, no I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tierserve.api.tenancy import TenantBatchLimits
from tierserve.priority import Priority

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
_WINDOW = re.compile(r"^([1-9][0-9]*)(s|m|h|d)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_WINDOW_S = 7 * 86400


def parse_window(text: str) -> float:
    """A completion window in seconds: OpenAI's "24h", or any `<n>s|m|h|d` up to 7 days."""
    m = _WINDOW.match(text or "")
    if m is None:
        raise ValueError(
            f"completion_window must look like 24h (a whole number and s, m, h or d), got {text!r}"
        )
    seconds = int(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds > MAX_WINDOW_S:
        raise ValueError(f"completion_window {text!r} is longer than 7 days")
    return float(seconds)


@dataclass(frozen=True)
class BatchConfig:
    db_url: str  # an SQLAlchemy URL (sqlite:///path for the default)
    files_dir: str
    max_file_bytes: int = 200 << 20  # OpenAI's limit for a batch input file
    max_line_bytes: int = 4 << 20  # one request body (as --max-request-bytes)
    max_lines: int = 50_000  # OpenAI's limit
    max_in_flight: int = 64  # lines submitted and not finished, all batches
    max_in_flight_per_batch: int = 64
    max_attempts: int = 4  # a line failing with a server error is retried this often in all
    retry_backoff_s: float = 0.5  # after a refusal (429/503) without Retry-After, doubled to 8
    tick_s: float = 0.2  # the feeder's pace when nothing wakes it
    lease_s: float = 15.0  # one feeder per database: the lease lasts this long unrenewed
    default_tier: Priority = Priority.P2
    limits: TenantBatchLimits = field(default_factory=TenantBatchLimits)
    tenant_limits: dict[str, TenantBatchLimits] = field(default_factory=dict)
    tenant_tiers: dict[str, Priority] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.max_in_flight_per_batch < 1:
            raise ValueError("the batch windows must hold at least one line")

    def limits_of(self, tenant: str) -> TenantBatchLimits:
        return self.tenant_limits.get(tenant, self.limits)

    def tier_of(self, tenant: str) -> Priority:
        return self.tenant_tiers.get(tenant, self.default_tier)
