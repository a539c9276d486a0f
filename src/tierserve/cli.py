"""Command line: ``tierserve <command>``. Each command imports only what it needs."""

from __future__ import annotations

import argparse
import sys


def _bench_kv(args: argparse.Namespace) -> int:
    from tierserve.bench.micro_kv import format_rows, run_kv_bench

    print(format_rows(run_kv_bench(args.num_blocks, args.block_size), args.num_blocks))
    return 0


def _bench_policy(args: argparse.Namespace) -> int:
    from tierserve.bench.micro_policy import format_rows, run_policy_bench

    print(format_rows(run_policy_bench(args.queued, args.ops), args.queued))
    return 0


def _bench_sched(args: argparse.Namespace) -> int:
    from tierserve.bench.micro_sched import format_result, run_sched_bench

    names = args.policy or ["fcfs", "strict", "drr", "wfq", "hybrid"]
    print(format_result([run_sched_bench(n, steps=args.steps) for n in names]))
    return 0


def _bench_engine(args: argparse.Namespace) -> int:
    from tierserve.bench.engine_bench import format_report, run_engine_bench

    rows, info = run_engine_bench(
        tuple(args.concurrency), args.rounds, args.prompt_len, args.output_len,
        with_transformers=not args.no_transformers, dtype=args.dtype,
    )  # fmt: skip
    print(format_report(rows, info))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from tierserve.serve_cli import build_configs, merged_options
    from tierserve.server import serve

    try:
        engine_args, settings = build_configs(merged_options(args))
    except (ValueError, TypeError) as exc:
        print(f"tierserve serve: {exc}", file=sys.stderr)
        return 2
    return serve(engine_args, settings)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tierserve",
        description="LLM inference server with multi-level priority scheduling.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    from tierserve.serve_cli import add_serve_arguments

    s = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over an OpenAI-compatible HTTP API with priority tiers.",
    )
    add_serve_arguments(s)
    s.set_defaults(func=_serve)

    b = sub.add_parser("bench-kv", help="micro-benchmark the KV cache manager")
    b.add_argument("--num-blocks", type=int, default=100_000)
    b.add_argument("--block-size", type=int, default=16)
    b.set_defaults(func=_bench_kv)

    b = sub.add_parser("bench-policy", help="micro-benchmark the scheduling policies")
    b.add_argument("--queued", type=int, default=100_000)
    b.add_argument("--ops", type=int, default=20_000)
    b.set_defaults(func=_bench_policy)

    b = sub.add_parser("bench-engine", help="real engine throughput beside transformers' generate")
    b.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    b.add_argument("--rounds", type=int, default=2, help="requests per client")
    b.add_argument("--prompt-len", type=int, default=128)
    b.add_argument("--output-len", type=int, default=64)
    b.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    b.add_argument("--no-transformers", action="store_true", help="skip the baseline")
    b.set_defaults(func=_bench_engine)

    b = sub.add_parser("bench-sched", help="time Scheduler.schedule() with a deep queue")
    b.add_argument("--policy", action="append", help="policy to run (repeatable; default all)")
    b.add_argument("--steps", type=int, default=200)
    b.set_defaults(func=_bench_sched)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
