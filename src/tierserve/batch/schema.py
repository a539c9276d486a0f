"""The batch database's tables, and the versioned migrations that build them.

`TABLES` is the current schema, used by the queries in store.py. Each migration is frozen: it
names its own columns (never the current tables), so a database at any version reaches the
latest one step by step. `schema_version` holds the version reached; every migration runs in
one transaction with its version bump, so a crash leaves a database at the old version or at
the new one, never between.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    inspect,
    select,
    text,
)

meta = MetaData()
_S = String(64)

files = Table(
    "files",
    meta,
    Column("id", _S, primary_key=True),
    Column("tenant", String(200), nullable=False, index=True),
    Column("filename", String(512), nullable=False),
    Column("purpose", String(32), nullable=False),
    Column("bytes", Integer, nullable=False),
    Column("lines", Integer, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("path", String(256), nullable=False),
    Column("deleted", Boolean, nullable=False, default=False),
)
batches = Table(
    "batches",
    meta,
    Column("id", _S, primary_key=True),
    Column("tenant", String(200), nullable=False, index=True),
    Column("endpoint", String(64), nullable=False),
    Column("input_file_id", _S, nullable=False),
    Column("completion_window", String(16), nullable=False),
    Column("status", String(16), nullable=False, index=True),
    Column("priority", Integer, nullable=False),
    Column("est_tokens", Integer, nullable=False),
    Column("metadata", Text, nullable=True),
    Column("errors", Text, nullable=True),
    Column("output_file_id", _S, nullable=True),
    Column("error_file_id", _S, nullable=True),
    Column("total", Integer, nullable=False, default=0),
    Column("completed", Integer, nullable=False, default=0),
    Column("failed", Integer, nullable=False, default=0),
    *(
        Column(f"{t}_at", Float, nullable=t != "created")
        for t in (
            "created",
            "expires",
            "in_progress",
            "finalizing",
            "completed",
            "failed",
            "expired",
            "cancelling",
            "cancelled",
        )
    ),
    Column("at_risk", Boolean, nullable=False, default=False),
    Column("outcome", String(16), nullable=True),
)
results = Table(
    "results",
    meta,
    Column("batch_id", _S, primary_key=True),
    Column("custom_id", String(512), primary_key=True),
    Column("line", Integer, nullable=False),
    Column("ok", Boolean, nullable=False),
    Column("body", Text, nullable=False),
)
lease = Table(
    "lease",
    meta,
    Column("name", String(32), primary_key=True),
    Column("owner", String(200), nullable=False),
    Column("expires_at", Float, nullable=False),
)
version = Table("schema_version", meta, Column("version", Integer, nullable=False))


def _v1(conn: Connection) -> None:
    """Files, batches (without at_risk) and results."""
    m = MetaData()
    Table(
        "files",
        m,
        Column("id", _S, primary_key=True),
        Column("tenant", String(200), nullable=False, index=True),
        Column("filename", String(512), nullable=False),
        Column("purpose", String(32), nullable=False),
        Column("bytes", Integer, nullable=False),
        Column("lines", Integer, nullable=False),
        Column("created_at", Float, nullable=False),
        Column("path", String(256), nullable=False),
        Column("deleted", Boolean, nullable=False),
    )
    stamps = ("created", "expires", "in_progress", "finalizing", "completed", "failed")
    stamps += ("expired", "cancelling", "cancelled")
    Table(
        "batches",
        m,
        Column("id", _S, primary_key=True),
        Column("tenant", String(200), nullable=False, index=True),
        Column("endpoint", String(64), nullable=False),
        Column("input_file_id", _S, nullable=False),
        Column("completion_window", String(16), nullable=False),
        Column("status", String(16), nullable=False, index=True),
        Column("priority", Integer, nullable=False),
        Column("est_tokens", Integer, nullable=False),
        Column("metadata", Text, nullable=True),
        Column("errors", Text, nullable=True),
        Column("output_file_id", _S, nullable=True),
        Column("error_file_id", _S, nullable=True),
        Column("total", Integer, nullable=False),
        Column("completed", Integer, nullable=False),
        Column("failed", Integer, nullable=False),
        *(Column(f"{t}_at", Float, nullable=t != "created") for t in stamps),
    )
    Table(
        "results",
        m,
        Column("batch_id", _S, primary_key=True),
        Column("custom_id", String(512), primary_key=True),
        Column("line", Integer, nullable=False),
        Column("ok", Boolean, nullable=False),
        Column("body", Text, nullable=False),
    )
    m.create_all(conn)


def _v2(conn: Connection) -> None:
    """The feeder lease (one feeder per database); the batches' at-risk flag and outcome (the
    status a finalizing batch ends in)."""
    m = MetaData()
    Table(
        "lease",
        m,
        Column("name", String(32), primary_key=True),
        Column("owner", String(200), nullable=False),
        Column("expires_at", Float, nullable=False),
    )
    m.create_all(conn)
    conn.execute(text("ALTER TABLE batches ADD COLUMN at_risk BOOLEAN NOT NULL DEFAULT FALSE"))
    conn.execute(text("ALTER TABLE batches ADD COLUMN outcome VARCHAR(16)"))


MIGRATIONS: tuple[Callable[[Connection], None], ...] = (_v1, _v2)
LATEST = len(MIGRATIONS)


def current_version(conn: Connection) -> int:
    if not inspect(conn).has_table("schema_version"):
        return 0
    return conn.execute(select(version.c.version)).scalar() or 0


def migrate(engine, upto: int = LATEST) -> int:
    """Bring the database to version `upto` (default: the latest); return the version found.
    A database newer than this code is refused (ValueError)."""
    with engine.begin() as conn:
        if not inspect(conn).has_table("schema_version"):
            version.create(conn)
            conn.execute(version.insert().values(version=0))
    with engine.begin() as conn:
        found = current_version(conn)
    if found > LATEST:
        raise ValueError(
            f"the batch database is at schema version {found}, newer than this tierserve "
            f"({LATEST}): upgrade tierserve or use another --batch-db"
        )
    for v in range(found, upto):
        with engine.begin() as conn:
            if current_version(conn) != v:  # another process migrated meanwhile
                continue
            MIGRATIONS[v](conn)
            conn.execute(version.update().values(version=v + 1))
    return found
