"""Server settings that are not engine settings (numbers and paths only)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 60.0
DEFAULT_MAX_CONNECTIONS = 1024


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_names: tuple[str, ...] = ("SmolLM2-135M-Instruct",)
    api_key: str | None = None
    tenants_file: str | None = None
    max_request_bytes: int = 4 << 20
    default_max_tokens: int = 512
    shutdown_grace_s: float = 10.0
    log_level: str = "info"
    otlp_traces_endpoint: str | None = None  # a collector's OTLP/HTTP URL (metrics/tracing.py)
    chat_template: str | None = None  # a file (or inline Jinja) overriding the model's template
    # The Batch API (tierserve.batch): its database (a path or an SQLAlchemy URL; None: off),
    # the folder of file bodies (None: beside the cache), lines in flight at once (None: 64).
    batch_db: str | None = None
    files_dir: str | None = None
    batch_window: int | None = None
    # Slow clients (api/connection.py): deadlines for a request's headers and body, and a cap
    # on open connections.
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
