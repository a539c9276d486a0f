"""`tierserve bench serve`: check the plan, reach the server, run each level (or the flood
scenario), write results after each, report. Every way it can end (done, bad input, a server
that cannot be reached or keeps failing, Ctrl-C) ends with a clear message, results written,
and an exit code: 0 done, 1 stopped by errors, 2 bad arguments, 130 interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

from tierserve.loadgen import client
from tierserve.loadgen.metrics import CLASSES
from tierserve.loadgen.plan import Plan, build_plan
from tierserve.loadgen.progress import Progress
from tierserve.loadgen.report import fmt, pct, results_doc, run_entry, write_markdown
from tierserve.loadgen.report import write_results as _write_results
from tierserve.loadgen.runner import Control, run_level
from tierserve.loadgen.scenarios import flood_summary, run_flood
from tierserve.loadgen.sizing import (
    PROBE_OUTPUT_TOKENS,
    PROBE_PROMPT_TOKENS,
    choose_lengths,
    sample_warnings,
    speed_of,
)
from tierserve.loadgen.workload import Gaps, RequestSpec
from tierserve.priority import Priority

PROG = "tierserve bench serve"


def _say(msg: str) -> None:
    print(f"{PROG}: {msg}", file=sys.stderr)


def default_prompts(path: str | None):
    from tierserve.loadgen.text import PromptMaker, load_tokenizer

    return PromptMaker(load_tokenizer(path))


async def resolve_model(http: client.Http, ep: client.Endpoint) -> client.Endpoint:
    """Reach the server (GET /v1/models) and fill in the model name when none was given.
    Raises ConnectionError with a clear message when nothing answers."""
    url = f"{ep.base_url}/v1/models"
    keys = [*ep.api_keys.values(), *ep.tenant_keys.values()]
    headers = {"authorization": f"Bearer {keys[0]}"} if keys else {}
    try:
        status, data = await client.get(http, url, headers, 15.0)
    except ConnectionError as exc:
        raise ConnectionError(f"cannot reach {ep.base_url}: {exc}") from None
    if ep.model:
        return ep
    try:
        return replace(ep, model=data["data"][0]["id"])  # type: ignore[index]
    except (KeyError, IndexError, TypeError):
        _say(f"GET {url} answered {status} without a model list: sending no model name")
        return ep


def _clock():
    t0 = time.perf_counter()
    return lambda: time.perf_counter() - t0


def _print_run(run: dict, title: str) -> None:
    print(
        f"{title}: {run['requests_sent']} sent, {run['overall']['requests']} measured: "
        f"{run['completed']} completed, "
        f"{run['rejected']} refused, {run['failed']} failed, {run['unfinished']} unfinished; "
        f"total {fmt(run['throughput_total_tokens_per_s'], 'tok/s', 1)}, output "
        f"{fmt(run['throughput_tokens_per_s'], 'tok/s', 1)}, goodput "
        f"{fmt(run['goodput_requests_per_s'], 'req/s', 2)}"
    )
    for c in CLASSES:
        s = run["classes"][c]
        if s["requests"]:
            print(
                f"  {c}: TTFT p50 {fmt(s['ttft_p50_s'])} p95 {fmt(s['ttft_p95_s'])} "
                f"p99 {fmt(s['ttft_p99_s'])}, TPOT p50 {fmt(s['tpot_p50_s'])}, "
                f"SLA {pct(s['sla_attainment'])} of {s['requests']}"
            )


class Session:
    """One invocation: the plan, what has been measured so far, and writing it out."""

    def __init__(self, plan: Plan, out: Path, progress: Progress) -> None:
        self.plan, self.out, self.progress = plan, out, progress
        self.control = Control(plan.limits.max_consecutive_errors)
        self.levels, self.runs, self.flood = [], [], None

    def doc(self) -> dict:
        c = self.control
        status = "complete" if not c.stopped else "interrupted" if c.interrupted else "aborted"
        return results_doc(self.plan.config, self.runs, status, c.reason, self.flood)

    def write(self) -> None:
        _write_results(self.out, self.doc(), self.levels)

    def finish(self) -> list[Path]:
        from tierserve.loadgen.plots import ttft_cdf, ttft_p95_vs_load
        from tierserve.loadgen.report import run_title

        self.write()
        titles, ttfts = [], []
        for run, res in zip(self.runs, self.levels, strict=True):
            titles.append(run_title(run))
            by = {c: [] for c in CLASSES}
            for r in res.records:
                if r.measured and r.first_token is not None:
                    by[f"P{r.priority}"].append(r.first_token - r.arrival)
            ttfts.append(by)
        plots = [ttft_cdf(titles, ttfts, self.out / "ttft_cdf.png")] if self.runs else []
        p95 = ttft_p95_vs_load({self.plan.config["label"]: self.runs}, self.out / "ttft_p95.png")
        plots += [p95] if p95 else []
        write_markdown(self.doc(), self.out / "report.md", plots)
        files = ["results.json", "requests.jsonl", "report.md"] + [p.name for p in plots]
        return [self.out / f for f in files]

    def add(self, res, phase: str | None = None) -> dict:
        p = self.plan
        run = run_entry(res, p.ttft_sla, p.tpot_slo, phase)
        self.levels.append(res)
        self.runs.append(run)
        self.write()
        return run

    async def run(self, http: client.Http) -> None:
        p = self.plan
        ep = await resolve_model(http, p.endpoint)
        self.plan.config["model"] = ep.model
        if p.lengths_auto:
            await self._choose_lengths(http, ep)
        if p.flood is not None:
            return await self._flood(http, ep)
        for i, level in enumerate(p.levels):
            if self.control.stopped:
                break
            clock, source = _clock(), p.source(i)
            gaps = Gaps(p.arrival, level.rate, p.gamma_cv, p.workload.seed) if level.rate else None

            async def send(spec, rec, clock=clock):
                await client.send(http, ep, spec, rec, clock)

            res = await run_level(
                level, source.next, send, p.limits, self.control, clock, gaps, self.progress
            )
            run = self.add(res)
            _print_run(run, level.label)
            self.warn(run, level.label)

    def warn(self, run: dict, title: str) -> None:
        """Too few measured requests in a class: said now, and kept in the results."""
        run["warnings"] = sample_warnings(run, self.plan.workload.mix, title)
        for w in run["warnings"]:
            _say(f"warning: {w}")
        self.write()

    async def _choose_lengths(self, http: client.Http, ep: client.Endpoint) -> None:
        """`--lengths auto`: one short request, timed, decides (not measured, not recorded)."""
        p, clock = self.plan, _clock()
        text = p.prompts.make(PROBE_PROMPT_TOKENS, 0, "lengths-probe")
        spec = RequestSpec(0, Priority.P1, text, PROBE_PROMPT_TOKENS, PROBE_OUTPUT_TOKENS)
        rec = client.RequestRecord(0, 1, clock(), PROBE_PROMPT_TOKENS, PROBE_OUTPUT_TOKENS)
        await client.send(http, ep, spec, rec, clock)
        lim = p.limits
        window = None if lim.duration_s is None else lim.duration_s - lim.warmup_s
        preset, why = choose_lengths(speed_of(rec), window)
        p.use_lengths(preset, p.config["length_scale"], why)
        _say(f"lengths {preset}: {why}")

    async def _flood(self, http: client.Http, ep: client.Endpoint) -> None:
        p = self.plan
        p0 = p.source(0, mix=(1.0, 0, 0, 0))
        p3 = p.source(0, mix=(0, 0, 0, 1.0), seed_offset=1)

        def p0_spec():
            return replace(p0.next(), priority=Priority.P0)

        def p3_spec():
            return replace(p3.next(), priority=Priority.P3)

        def make_send(clock):
            async def send(spec, rec):
                await client.send(http, ep, spec, rec, clock)

            return send

        phases = await run_flood(
            p.flood, p0_spec, p3_spec, make_send, self.control, _clock, self.progress
        )
        for res, name in zip(phases, ("idle", "flood"), strict=False):
            run = self.add(res, phase=name)
            _print_run(run, f"flood scenario, {name} phase")
        self.flood = flood_summary(p.flood, phases, p.ttft_sla, p.tpot_slo)
        f = self.flood
        print(
            f"P0 TTFT p95 idle {fmt(f['p0_idle_ttft_p95_s'])}, loaded "
            f"{fmt(f['p0_loaded_ttft_p95_s'])} ({fmt(f['p0_ttft_ratio_p95'], 'x', 2)}); "
            f"background {fmt(f['background_throughput_tokens_per_s'], 'tok/s', 1)} output"
        )


async def _main(session: Session) -> None:
    loop = asyncio.get_running_loop()
    halt = session.control.halt
    # Not possible off the main thread (tests) or on Windows: Ctrl-C then raises instead.
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, halt, "interrupted by Ctrl-C", True)
    try:
        async with client.session() as http:
            await session.run(http)
    except ConnectionError as exc:
        halt(str(exc))
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)


def bench_serve(args: argparse.Namespace, prompts_loader=default_prompts) -> int:
    out = Path(args.out)
    if args.compare:
        from tierserve.loadgen.compare import CompareError, write_compare

        try:
            files = write_compare(args.compare, out)
        except CompareError as exc:
            _say(str(exc))
            return 2
        for f in files:
            print(f"wrote {f}")
        return 0
    try:
        plan = build_plan(args, prompts_loader)
    except ValueError as exc:  # TokenizerError and DatasetError are ValueErrors
        _say(str(exc))
        return 2
    except KeyboardInterrupt:
        _say("interrupted before the run started")
        return 130
    session = Session(plan, out, Progress(enabled=not args.no_progress))
    try:
        asyncio.run(_main(session))
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        session.control.halt("interrupted by Ctrl-C", interrupted=True)
    files = session.finish()
    c = session.control
    if c.stopped:
        _say(f"stopped: {c.reason}")
        _say(f"partial results written to {out}/")
    for f in files:
        print(f"wrote {f}")
    return 0 if not c.stopped else 130 if c.interrupted else 1
