"""BatchStore: files, batches and line results in a database (SQLAlchemy Core).

SQLite by default (WAL journal, `synchronous=NORMAL`: a committed result survives a SIGKILL of
the server), or any SQLAlchemy URL (PostgreSQL in a deployment). Every method is blocking and
short; the service calls them on one worker thread, never on the event loop.

Exactly once: a line's result is keyed by (batch id, custom_id); a second insert of the same key
is ignored (ON CONFLICT DO NOTHING), and the batch's counters move in the same transaction by
what was really inserted. A line rerun after a crash therefore never counts or appears twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from sqlalchemy import (
    and_,
    create_engine,
    event,
    func,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from tierserve.batch import schema
from tierserve.batch.schema import batches, files, lease, results

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
TERMINAL = ("completed", "failed", "expired", "cancelled")


def db_url(value: str) -> str:
    """`--batch-db`: an SQLAlchemy URL as is, or a path to an SQLite file (folders made)."""
    if "://" in value:
        return value
    path = Path(value).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=10000")
    mode = cur.execute("PRAGMA journal_mode").fetchone()[0]
    if mode != "wal":
        cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


def _row(r) -> dict | None:
    return None if r is None else dict(r._mapping)


class BatchStore:
    def __init__(self, url: str) -> None:
        self.url = url
        self.engine: Engine = create_engine(url, future=True)
        self.dialect = self.engine.dialect.name
        if self.dialect == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        schema.migrate(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    # -- files ---------------------------------------------------------------------------------
    def add_file(self, row: dict) -> None:
        with self.engine.begin() as c:
            c.execute(files.insert().values(deleted=False, **row))

    def get_file(self, file_id: str, tenant: str | None) -> dict | None:
        q = select(files).where(files.c.id == file_id, files.c.deleted.is_(False))
        if tenant is not None:
            q = q.where(files.c.tenant == tenant)
        with self.engine.connect() as c:
            return _row(c.execute(q).first())

    def list_files(
        self, tenant: str, purpose: str | None, after: str | None, limit: int, desc: bool
    ) -> list[dict]:
        q = select(files).where(files.c.tenant == tenant, files.c.deleted.is_(False))
        if purpose:
            q = q.where(files.c.purpose == purpose)
        order = (
            (files.c.created_at.desc(), files.c.id.desc())
            if desc
            else (files.c.created_at, files.c.id)
        )
        with self.engine.connect() as c:
            if after:
                ref = c.execute(select(files.c.created_at).where(files.c.id == after)).scalar()
                if ref is not None:
                    key = (files.c.created_at, files.c.id)
                    cmp = (key[0] < ref) | and_(key[0] == ref, key[1] < after)
                    if not desc:
                        cmp = (key[0] > ref) | and_(key[0] == ref, key[1] > after)
                    q = q.where(cmp)
            return [dict(r._mapping) for r in c.execute(q.order_by(*order).limit(limit))]

    def delete_file(self, file_id: str, tenant: str) -> dict | None:
        with self.engine.begin() as c:
            row = _row(
                c.execute(
                    select(files).where(
                        files.c.id == file_id, files.c.tenant == tenant, files.c.deleted.is_(False)
                    )
                ).first()
            )
            if row is not None:
                c.execute(files.update().where(files.c.id == file_id).values(deleted=True))
            return row

    def file_usage(self, tenant: str) -> tuple[int, int]:
        q = select(func.count(), func.coalesce(func.sum(files.c.bytes), 0)).where(
            files.c.tenant == tenant, files.c.deleted.is_(False)
        )
        with self.engine.connect() as c:
            n, b = c.execute(q).one()
        return int(n), int(b)

    # -- batches -------------------------------------------------------------------------------
    def add_batch(self, row: dict) -> None:
        with self.engine.begin() as c:
            c.execute(batches.insert().values(**row))

    def get_batch(self, batch_id: str, tenant: str | None = None) -> dict | None:
        q = select(batches).where(batches.c.id == batch_id)
        if tenant is not None:
            q = q.where(batches.c.tenant == tenant)
        with self.engine.connect() as c:
            return _row(c.execute(q).first())

    def list_batches(self, tenant: str, after: str | None, limit: int) -> list[dict]:
        q = select(batches).where(batches.c.tenant == tenant)
        with self.engine.connect() as c:
            if after:
                ref = c.execute(select(batches.c.created_at).where(batches.c.id == after)).scalar()
                if ref is not None:
                    q = q.where(
                        (batches.c.created_at < ref)
                        | and_(batches.c.created_at == ref, batches.c.id < after)
                    )
            q = q.order_by(batches.c.created_at.desc(), batches.c.id.desc()).limit(limit)
            return [dict(r._mapping) for r in c.execute(q)]

    def active_batches(self) -> list[dict]:
        q = select(batches).where(batches.c.status.in_(ACTIVE)).order_by(batches.c.created_at)
        with self.engine.connect() as c:
            return [dict(r._mapping) for r in c.execute(q)]

    def queued_tokens(self, tenant: str) -> int:
        q = select(func.coalesce(func.sum(batches.c.est_tokens), 0)).where(
            batches.c.tenant == tenant, batches.c.status.in_(ACTIVE)
        )
        with self.engine.connect() as c:
            return int(c.execute(q).scalar())

    def update_batch(self, batch_id: str, when: Iterable[str] | None = None, **values) -> bool:
        """Set `values`; with `when`, only if the status is one of those (compare and set).
        Returns whether the row changed."""
        q = batches.update().where(batches.c.id == batch_id)
        if when is not None:
            q = q.where(batches.c.status.in_(tuple(when)))
        with self.engine.begin() as c:
            return c.execute(q.values(**values)).rowcount > 0

    # -- results -------------------------------------------------------------------------------
    def _insert_ignore(self, c, row: dict) -> bool:
        if self.dialect in ("sqlite", "postgresql"):
            if self.dialect == "sqlite":
                from sqlalchemy.dialects.sqlite import insert
            else:
                from sqlalchemy.dialects.postgresql import insert
            q = insert(results).values(**row).on_conflict_do_nothing()
            # RETURNING, not rowcount: psycopg reports -1 for an INSERT ... ON CONFLICT
            return c.execute(q.returning(results.c.line)).first() is not None
        try:  # other databases: a savepoint per row
            with c.begin_nested():
                c.execute(results.insert().values(**row))
            return True
        except IntegrityError:
            return False

    def add_results(self, batch_id: str, rows: list[tuple[str, int, bool, dict]]) -> int:
        """Record line results (custom_id, line, ok, output line) once each; the batch's
        counters move by what was new. Returns how many were new."""
        ok = bad = 0
        with self.engine.begin() as c:
            for custom_id, line, good, body in rows:
                row = dict(
                    batch_id=batch_id,
                    custom_id=custom_id,
                    line=line,
                    ok=good,
                    body=json.dumps(body),
                )
                if self._insert_ignore(c, row):
                    ok, bad = ok + good, bad + (not good)
            if ok or bad:
                c.execute(
                    batches.update()
                    .where(batches.c.id == batch_id)
                    .values(completed=batches.c.completed + ok, failed=batches.c.failed + bad)
                )
        return ok + bad

    def done_ids(self, batch_id: str) -> set[str]:
        with self.engine.connect() as c:
            q = select(results.c.custom_id).where(results.c.batch_id == batch_id)
            return {r[0] for r in c.execute(q)}

    def results_of(self, batch_id: str) -> Iterator[tuple[str, int, bool, str]]:
        q = (
            select(results.c.custom_id, results.c.line, results.c.ok, results.c.body)
            .where(results.c.batch_id == batch_id)
            .order_by(results.c.line)
        )
        with self.engine.connect() as c:
            for r in c.execute(q):
                yield r[0], r[1], bool(r[2]), r[3]

    # -- the feeder lease ------------------------------------------------------------------------
    def acquire_lease(self, owner: str, now: float, lease_s: float) -> bool:
        """Take or renew the feeder lease: free, ours, expired, or held by a process of this
        host that no longer exists (a server killed and restarted)."""
        with self.engine.begin() as c:
            row = _row(c.execute(select(lease).where(lease.c.name == "feeder")).first())
            if row is None:
                try:
                    with c.begin_nested():
                        c.execute(
                            lease.insert().values(
                                name="feeder", owner=owner, expires_at=now + lease_s
                            )
                        )
                    return True
                except IntegrityError:
                    return False
            if not (row["owner"] == owner or row["expires_at"] < now or _dead(row["owner"])):
                return False
            q = lease.update().where(lease.c.name == "feeder", lease.c.owner == row["owner"])
            return c.execute(q.values(owner=owner, expires_at=now + lease_s)).rowcount > 0

    def release_lease(self, owner: str) -> None:
        with self.engine.begin() as c:
            c.execute(lease.delete().where(lease.c.name == "feeder", lease.c.owner == owner))


def owner_id() -> str:
    return f"{os.uname().nodename}:{os.getpid()}"


def _dead(owner: str) -> bool:
    """Whether `owner` (host:pid) is a process of this host that is gone."""
    host, _, pid = owner.rpartition(":")
    if host != os.uname().nodename or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
