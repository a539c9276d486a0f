"""`tierserve bench serve` options. Only argparse here: the command imports the rest."""

from __future__ import annotations

import argparse

from tierserve.config import PriorityConfig


def _sla(text: str) -> float | None:
    if str(text).lower() in ("none", "null", "-"):
        return None
    v = float(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"an SLO must be positive or 'none', got {text}")
    return v


def _sla_default() -> list[float | None]:
    return list(PriorityConfig().ttft_sla_s)


def add_serve_bench_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server")
    g.add_argument("--base-url", help="server root, e.g. http://127.0.0.1:8000")
    g.add_argument("--model", help="model name to send (default: the first of /v1/models)")
    g.add_argument("--api", choices=["chat", "completions"], default="chat")
    g.add_argument(
        "--priority-via",
        choices=["header", "body", "none"],
        default="header",
        help="header: x-request-tier; body: integer `priority` (vLLM, tierserve)",
    )
    g.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="[CLASS=]KEY",
        help="Bearer key, for one class (P0..P3 or a tier name) or all (repeatable)",
    )
    g.add_argument(
        "--tenant-key",
        action="append",
        default=[],
        metavar="TENANT=KEY",
        help="heavy-tail: the Bearer key of a tenant (repeatable); a tenant without one is "
        "named in x-tenant-id",
    )
    g.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        help="seconds a request may take in all (default: no limit)",
    )

    g = p.add_argument_group("load")
    g.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=None,
        help="closed loop: clients, a sweep of levels (default 8)",
    )
    g.add_argument(
        "--request-rate",
        type=float,
        nargs="+",
        default=None,
        help="open loop: requests per second, a sweep of levels",
    )
    g.add_argument("--arrival", choices=["poisson", "gamma"], default="poisson")
    g.add_argument("--gamma-cv", type=float, default=2.0, help="gamma: CV of the gaps")
    g.add_argument(
        "--duration",
        type=float,
        default=None,
        help="seconds of sending per level (default 60 unless --num-requests)",
    )
    g.add_argument("--num-requests", type=int, default=None, help="measured requests per level")
    g.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds not measured at the start of a level (default: duration/6)",
    )
    g.add_argument(
        "--warmup-requests", type=int, default=0, help="first requests of a level not measured"
    )
    g.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="duration mode: seconds for in-flight requests after the end",
    )
    g.add_argument(
        "--max-consecutive-errors",
        type=int,
        default=10,
        help="stop after this many failed requests in a row (0: never)",
    )
    g.add_argument(
        "--no-backoff",
        action="store_true",
        help="closed loop: resend at once after a refusal (default: wait Retry-After)",
    )
    g.add_argument("--seed", type=int, default=0)

    g = p.add_argument_group("workload")
    g.add_argument(
        "--workload",
        choices=["classes", "heavy-tail"],
        default="classes",
        help="classes: per-class lengths (default); heavy-tail: the simulator's tenants and "
        "templates with lognormal / mixture output lengths, each request ending by EOS at its "
        "drawn length (docs/scheduling.md, predictive scheduling)",
    )
    g.add_argument(
        "--eos-token-id",
        type=int,
        default=None,
        help="heavy-tail: the model's EOS id (default: the tokenizer's model names it)",
    )
    g.add_argument(
        "--mix",
        type=float,
        nargs=4,
        default=[5, 60, 30, 5],
        metavar="SHARE",
        help="class shares P0..P3 (default 5 60 30 5)",
    )
    g.add_argument(
        "--lengths",
        choices=["auto", "sim", "cpu"],
        default="auto",
        help="per-class lengths: the simulator's, ~10x shorter for CPUs, or auto (default): "
        "cpu when one timed request shows the simulator's would not fit a level",
    )
    g.add_argument("--length-scale", type=float, default=1.0, help="scale every length")
    g.add_argument(
        "--prompt-len",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help="fixed prompt tokens: one value or four (P0..P3)",
    )
    g.add_argument(
        "--output-len",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help="fixed output tokens: one value or four (P0..P3)",
    )
    g.add_argument(
        "--dataset",
        nargs="+",
        default=["random"],
        metavar=("KIND", "FILE"),
        help="random, or sharegpt-like FILE (JSONL conversations)",
    )
    g.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer.json or HF folder (default: the embedded model's)",
    )
    g.add_argument("--ignore-eos", action="store_true", help="generate exactly max_tokens")
    g.add_argument("--temperature", type=float, default=0.0)

    g = p.add_argument_group("objectives")
    g.add_argument(
        "--ttft-sla",
        type=_sla,
        nargs=4,
        default=_sla_default(),
        metavar="S",
        help="TTFT SLA per class P0..P3, 'none' for none (default: the server's)",
    )
    g.add_argument(
        "--tpot-slo",
        type=_sla,
        nargs="+",
        default=None,
        metavar="S",
        help="TPOT SLO, one value or four (default none)",
    )

    g = p.add_argument_group("scenario")
    g.add_argument("--scenario", choices=["load", "flood"], default="load")
    g.add_argument("--flood-streams", type=int, default=16, help="flood: background streams")
    g.add_argument("--probe-interval", type=float, default=2.0, help="flood: s between P0 probes")
    g.add_argument("--idle-probes", type=int, default=5, help="flood: P0 probes when idle")
    g.add_argument(
        "--flood-settle",
        type=float,
        default=5.0,
        help="flood: seconds of background load before the first probe",
    )

    g = p.add_argument_group("output")
    g.add_argument("--out", default="out/bench-serve", help="folder for results and report")
    g.add_argument("--label", default=None, help="name of this run in reports (default: --out)")
    g.add_argument(
        "--compare",
        nargs="+",
        default=None,
        metavar="DIR",
        help="render these result folders side by side into --out; send nothing",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def _bench_serve(args: argparse.Namespace) -> int:
    from tierserve.loadgen.command import bench_serve

    return bench_serve(args)


def add_bench_parser(sub) -> None:
    """`tierserve bench <tool>`: the load generator (more tools may join the group)."""
    b = sub.add_parser("bench", help="benchmarks against a running server")
    tools = b.add_subparsers(dest="bench_command", required=True)
    s = tools.add_parser(
        "serve",
        help="priority-aware load generator for any OpenAI-compatible server",
        description="Stream chat or completion requests from a class mix at a server and "
        "report TTFT, ITL, TPOT, E2E, SLA attainment, goodput and throughput per class.",
    )
    add_serve_bench_arguments(s)
    s.set_defaults(func=_bench_serve)
