"""A batch being worked on (`Job`), and the blocking steps the feeder runs off the event loop:
loading the lines still to do, and writing the output and error files at the end."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass, field

from tierserve.batch.files import FileBodies, InputLine, iter_lines
from tierserve.batch.objects import CANCELLED_MESSAGE, EXPIRED_MESSAGE, error_line
from tierserve.batch.store import BatchStore
from tierserve.priority import Priority

UNFINISHED = {
    "expired": ("batch_expired", EXPIRED_MESSAGE),
    "cancelled": ("batch_cancelled", CANCELLED_MESSAGE),
}
RATE_WINDOW_S = 30.0


@dataclass
class Job:
    row: dict
    pending: deque[InputLine] = field(default_factory=deque)
    in_flight: dict[str, asyncio.Task] = field(default_factory=dict)
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    attempts: dict[str, int] = field(default_factory=dict)
    unwritten: int = 0  # answers buffered, not yet in the store
    loaded: bool = False
    busy: bool = False  # a load or a finalization is under way
    task: asyncio.Task | None = None  # the load
    not_before: float = 0.0  # refused by admission: no new line before this time
    finished: deque[float] = field(default_factory=deque)  # when lines ended (rate, at risk)

    @property
    def id(self) -> str:
        return self.row["id"]

    @property
    def status(self) -> str:
        return self.row["status"]

    @property
    def priority(self) -> Priority:
        return Priority(self.row["priority"])

    @property
    def idle(self) -> bool:
        """Nothing running and nothing waiting to be written."""
        return not self.in_flight and self.unwritten == 0

    def note_finished(self, now: float) -> None:
        self.finished.append(now)
        while self.finished and self.finished[0] < now - RATE_WINDOW_S:
            self.finished.popleft()

    def projected_end(self, now: float) -> float | None:
        """When the lines left would be done at the rate of the last 30 s (None: no rate)."""
        started = self.row["in_progress_at"] or now
        span = min(RATE_WINDOW_S, now - started)
        if span < 5.0 or not self.finished:
            return None
        rate = len(self.finished) / span
        return now + (len(self.pending) + len(self.in_flight)) / rate


def load_pending(store: BatchStore, bodies: FileBodies, row: dict, max_line_bytes: int):
    """The batch's lines that have no result yet, in file order, and the number of lines."""
    f = store.get_file(row["input_file_id"], None)
    if f is None:
        raise FileNotFoundError(f"the input file {row['input_file_id']} was deleted")
    done = store.done_ids(row["id"])
    with bodies.open(f["path"]) as src:
        lines = list(iter_lines(src, max_line_bytes))
    return deque(x for x in lines if x.custom_id not in done), len(lines)


def record_unfinished(store: BatchStore, job: Job, outcome: str) -> None:
    """Expired or cancelled: each line never run gets its error line (once)."""
    code, message = UNFINISHED[outcome]
    rows = [
        (x.custom_id, x.line, False, error_line(x.custom_id, code, message)) for x in job.pending
    ]
    if rows:
        store.add_results(job.id, rows)
    job.pending.clear()


def _file_row(batch: dict, file_id: str, name: str, size: int, lines: int) -> dict:
    return dict(
        id=file_id,
        tenant=batch["tenant"],
        filename=name,
        purpose="batch_output",
        bytes=size,
        lines=lines,
        created_at=time.time(),
        path=f"{file_id}.jsonl",
    )


def write_outputs(store: BatchStore, bodies: FileBodies, batch: dict) -> dict:
    """Write the output file (answered 2xx, in input order) and the error file (the rest), each
    only if it has lines; file ids follow from the batch id, so a finalization cut by a crash
    and done again writes the same files. Returns the batch's new columns."""
    out: dict = {"output_file_id": None, "error_file_id": None}
    for ok, key, suffix in ((True, "output_file_id", "output"), (False, "error_file_id", "errors")):
        lines = [body for _, _, good, body in store.results_of(batch["id"]) if good == ok]
        if not lines:
            continue
        file_id = f"file-{batch['id'].removeprefix('batch_')}-{suffix}"
        size = bodies.write_lines(f"{file_id}.jsonl", iter(lines))
        if store.get_file(file_id, None) is None:
            name = f"{batch['id']}_{suffix}.jsonl"
            store.add_file(_file_row(batch, file_id, name, size, len(lines)))
        out[key] = file_id
    return out


def estimate_tokens(body: dict, default_max_tokens: int, context: int | None = None) -> int:
    """A line's cost for the tenant's queued-token limit: its text at ~4 bytes a token (plus
    a little per message) and its completion budget, never more than the served `context`: a
    line asking for more can never run, and fails as that line's own error (the endpoint's
    400), not as the whole batch's 429."""
    prompt = body.get("messages", body.get("prompt", ""))
    text = json.dumps(prompt, ensure_ascii=False)
    n_messages = len(prompt) if isinstance(body.get("messages"), list) else 1
    limit = body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens
    limit = limit if isinstance(limit, int) else default_max_tokens
    tokens = len(text.encode()) // 4 + 4 * n_messages + limit
    return tokens if context is None else min(tokens, context)
