"""`tierserve run-batch -i in.jsonl -o out.jsonl`: a batch file offline, as vLLM's run-batch.

The engine is built in this process and every line goes through the same handlers as the
server's (batch/dispatch.py), at most `--max-num-seqs` lines at a time, with a progress bar on
stderr. The output has one line per request, in input order, in the Batch API's shape
(`{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`), written
to a temporary file and renamed when complete.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from tqdm import tqdm

from tierserve.api.tenancy import DEFAULT_TENANT, Tenant
from tierserve.batch.dispatch import dispatch
from tierserve.batch.files import FileFormatError, InputLine, check_batch_input, iter_lines
from tierserve.batch.objects import response_line
from tierserve.priority import Priority


def read_input(path: str, max_line_bytes: int) -> list[InputLine]:
    """Every request of the file, checked as an upload is (FileFormatError names the line)."""
    with open(path, "rb") as f:
        check_batch_input(f, max_line_bytes, max_lines=10**9)
        f.seek(0)
        return list(iter_lines(f, max_line_bytes))


async def run_lines(state, lines: list[InputLine], window: int, progress: bool) -> list[dict]:
    """Run `lines` through the handlers, `window` at a time; their output lines, in order."""
    tenant = Tenant(DEFAULT_TENANT)
    sem = asyncio.Semaphore(window)
    out: list[dict | None] = [None] * len(lines)
    bar = tqdm(total=len(lines), desc="run-batch", unit="req", disable=not progress)

    async def one(i: int, x: InputLine) -> None:
        async with sem:
            ans = await dispatch(state, tenant, x.url, x.body, Priority.P2)
            while ans.refused:  # a rate limit or a full queue: later, as the server's feeder
                await asyncio.sleep(min(8.0, ans.retry_after_s or 0.5))
                ans = await dispatch(state, tenant, x.url, x.body, Priority.P2)
        out[i] = response_line(x.custom_id, ans.status, ans.body)
        bar.update(1)

    state.engine.start()
    try:
        await asyncio.gather(*(one(i, x) for i, x in enumerate(lines)))
    finally:
        bar.close()
        state.engine.shutdown()
    return [o for o in out if o is not None]


def write_output(path: str, results: list[dict]) -> None:
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)


def run_batch(args: argparse.Namespace) -> int:
    from tierserve.cli.serve import build_configs, merged_options
    from tierserve.server import build_state

    opts = {k: v for k, v in merged_options(args).items() if k not in ("input_file", "output_file")}
    opts.pop("no_progress", None)
    try:
        engine_args, settings = build_configs(opts)
        lines = read_input(args.input_file, settings.max_request_bytes)
    except (ValueError, OSError) as exc:
        what = f"{args.input_file}: {exc}" if isinstance(exc, FileFormatError) else str(exc)
        print(f"tierserve run-batch: {what}", file=sys.stderr)
        return 2
    state = build_state(engine_args, settings)
    results = asyncio.run(run_lines(state, lines, engine_args.max_num_seqs, not args.no_progress))
    write_output(args.output_file, results)
    ok = sum(1 for r in results if r["response"]["status_code"] == 200)
    print(
        f"wrote {len(results)} results to {args.output_file}: {ok} ok, {len(results) - ok} failed",
        file=sys.stderr,
    )
    return 0
