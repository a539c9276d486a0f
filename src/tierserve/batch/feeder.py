"""The feeder: runs the lines of unfinished batches through the engine, a bounded window at a
time, and takes each batch through OpenAI's status machine.

One feeder works on a database at a time (a lease in the database, renewed every few seconds;
a server killed on this host frees it at once). Each tick it

1. picks up new, cancelled and resumed batches from the store;
2. fills the window: at most `max_in_flight` lines in flight overall and
   `max_in_flight_per_batch` per batch, one line per batch in turn, batches due soonest first;
3. writes the answers that came back (one transaction per batch and tick);
4. moves batches on: expired at the end of their window, cancelled on request, finalized when
   every line has its result; flags a batch whose projected end falls after its window.

A line the admission refuses (429/503: rate limit, full queue, shed, draining) goes back to
the head of its batch, which waits Retry-After before sending more; a line that fails with
another server error is tried again up to `max_attempts` times (a dead cluster replica). What
the store cannot take (a read-only database, a full disk) fails that batch, not the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from tierserve.api.tenancy import Tenant
from tierserve.batch import jobs as J
from tierserve.batch.config import BatchConfig
from tierserve.batch.dispatch import CANCELLED, Answer, dispatch
from tierserve.batch.files import InputLine
from tierserve.batch.lifecycle import BatchLifecycle
from tierserve.batch.objects import response_line
from tierserve.batch.store import owner_id

log = logging.getLogger("tierserve.batch")
SYNC_S = 1.0
RISK_S = 2.0


class Feeder(BatchLifecycle):
    def __init__(self, service, cfg: BatchConfig, now: Callable[[], float] = time.time) -> None:
        self.svc = service
        self.cfg = cfg
        self.now = now
        self.owner = owner_id()
        self.jobs: dict[str, J.Job] = {}
        self.holding = False
        self._wake = asyncio.Event()
        self._stop = False
        self._buffer: list[tuple[J.Job, InputLine, Answer]] = []
        self._due = {"lease": 0.0, "sync": 0.0, "risk": 0.0}

    # -- control --------------------------------------------------------------------------------
    def poke(self) -> None:
        self._due["sync"] = 0.0
        self._wake.set()

    def in_flight(self) -> int:
        return sum(len(j.in_flight) for j in self.jobs.values())

    async def stop(self) -> None:
        self._stop = True
        self._wake.set()

    async def run(self) -> None:
        try:
            while not self._stop and not self.svc.draining:
                try:
                    await self._tick(self.now())
                except Exception:  # never let one bad tick end the feeder
                    log.exception("batch feeder tick failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.cfg.tick_s)
                self._wake.clear()
        finally:
            await self._let_go()

    async def _tick(self, now: float) -> None:
        if now >= self._due["lease"]:
            await self._renew_lease(now)
        if not self.holding:
            return
        if now >= self._due["sync"]:
            self._due["sync"] = now + SYNC_S
            await self._sync()
        self._fill(now)
        await self._flush()
        for job in list(self.jobs.values()):
            await self._advance(job, now)
        if now >= self._due["risk"]:
            self._due["risk"] = now + RISK_S
            await self._mark_risk(now)

    async def _renew_lease(self, now: float) -> None:
        self._due["lease"] = now + self.cfg.lease_s / 3
        try:
            held = await self.svc.db(
                self.svc.store.acquire_lease, self.owner, now, self.cfg.lease_s
            )
        except Exception as exc:
            log.warning("batch feeder: cannot renew its lease: %r", exc)
            held = False
        if self.holding and not held:
            log.warning("batch feeder: lost the lease; another server feeds this database")
            await self._drop_all()
        self.holding = held

    # -- picking up batches ---------------------------------------------------------------------
    async def _sync(self) -> None:
        rows = await self.svc.db(self.svc.store.active_batches)
        seen = set()
        for row in rows:
            if row["id"] in self.svc.failed:
                continue
            seen.add(row["id"])
            job = self.jobs.get(row["id"])
            if job is None:
                self.jobs[row["id"]] = job = J.Job(row)
            elif not job.busy:
                job.row = row
            if not job.loaded and not job.busy:
                job.task = asyncio.create_task(self._load(job))
        for gone in set(self.jobs) - seen:  # finished or failed elsewhere
            self.jobs.pop(gone).cancel.set()

    async def _load(self, job: J.Job) -> None:
        job.busy = True
        try:
            try:
                job.pending, total = await self.svc.db(
                    J.load_pending,
                    self.svc.store,
                    self.svc.bodies,
                    job.row,
                    self.cfg.max_line_bytes,
                )
            except Exception as exc:
                return await self.fail(job, f"cannot read the batch's input: {exc}")
            if job.status == "validating":
                try:
                    await self._set(
                        job, ("validating",), status="in_progress", in_progress_at=self.now(),
                        total=total,
                    )  # fmt: skip
                except Exception as exc:
                    return await self.fail(job, f"cannot record the batch's progress: {exc}")
            job.loaded = True
            log.info("batch %s: %d of %d lines to run", job.id, len(job.pending), total)
        finally:
            job.busy = False
            self._wake.set()

    # -- the window -----------------------------------------------------------------------------
    def _fill(self, now: float) -> None:
        room = self.cfg.max_in_flight - self.in_flight()
        ready = [
            j
            for j in self.jobs.values()
            if j.loaded and j.status == "in_progress" and not j.cancel.is_set()
        ]
        ready.sort(key=lambda j: (j.row["expires_at"], j.row["created_at"]))
        progress = True
        while room > 0 and progress:
            progress = False
            for job in ready:
                if room == 0:
                    break
                full = len(job.in_flight) >= self.cfg.max_in_flight_per_batch
                if full or not job.pending or job.not_before > now:
                    continue
                item = job.pending.popleft()
                job.in_flight[item.custom_id] = asyncio.create_task(self._line(job, item))
                room -= 1
                progress = True

    def _tenant(self, name: str) -> Tenant:
        return self.svc.state.tenants.tenants.get(name) or Tenant(name, cache_salt=name)

    async def _line(self, job: J.Job, item: InputLine) -> None:
        try:
            deadline = None
            if job.priority == 2:
                deadline = max(1.0, job.row["expires_at"] - self.now())
            ans = await dispatch(
                self.svc.feeder_state,
                self._tenant(job.row["tenant"]),
                item.url,
                item.body,
                job.priority,
                deadline,
                job.cancel,
            )
        except Exception as exc:  # dispatch answers errors itself; this is a last resort
            log.exception("batch %s line %d", job.id, item.line)
            ans = Answer(500, {"error": {"message": f"internal error: {exc!r}"}})
        finally:
            job.in_flight.pop(item.custom_id, None)
        self._take(job, item, ans)
        self._wake.set()

    def _take(self, job: J.Job, item: InputLine, ans: Answer) -> None:
        m = self.svc.metrics
        if self.jobs.get(job.id) is not job:
            return  # the batch failed or was dropped meanwhile: nothing to record
        if ans.status == CANCELLED:
            job.pending.appendleft(item)  # not run: it is still to do (or to cancel)
            return
        if ans.refused:
            m.lines.labels("refused").inc()
            job.pending.appendleft(item)
            wait = min(8.0, max(self.cfg.retry_backoff_s, ans.retry_after_s or 0.0))
            job.not_before = self.now() + wait
            return
        tries = job.attempts.get(item.custom_id, 0) + 1
        if ans.status >= 500 and tries < self.cfg.max_attempts:
            m.lines.labels("retried").inc()
            job.attempts[item.custom_id] = tries
            job.pending.appendleft(item)
            return
        m.lines.labels("ok" if ans.ok else "error").inc()
        job.unwritten += 1
        job.note_finished(self.now())
        self._buffer.append((job, item, ans))

    async def _flush(self) -> None:
        buffer, self._buffer = self._buffer, []
        by_job: dict[str, list] = {}
        for job, item, ans in buffer:
            line = response_line(item.custom_id, ans.status, ans.body)
            by_job.setdefault(job.id, [job, []])[1].append(
                (item.custom_id, item.line, ans.ok, line)
            )
        for job, rows in by_job.values():
            try:
                await self.svc.db(self.svc.store.add_results, job.id, rows)
            except Exception as exc:
                await self.fail(job, f"cannot record results: {exc}")
            finally:
                job.unwritten -= len(rows)
