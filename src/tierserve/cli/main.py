"""Command line: ``tierserve <command>``. Each command imports only what it needs."""

from __future__ import annotations

import argparse
import sys

from tierserve.model.config import QUANTIZATIONS


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
    from tierserve.cli.serve_model import check_model_source

    try:
        check_model_source(args.model, args.tokenizer)
    except ValueError as exc:
        print(f"tierserve bench-engine: {exc}", file=sys.stderr)
        return 2
    rows, info = run_engine_bench(
        tuple(args.concurrency),
        args.rounds,
        args.prompt_len,
        args.output_len,
        with_transformers=not args.no_transformers,
        dtype=args.dtype,
        quantization=args.quantization,
        activations=args.activations,
        max_num_batched_tokens=args.max_num_batched_tokens,
        model=args.model,
        tokenizer=args.tokenizer,
    )
    print(format_report(rows, info))
    return 0


def _bench_quality(args: argparse.Namespace) -> int:
    from tierserve.bench.quality import format_table, measure

    rows = [measure(q, args.max_tokens) for q in args.quantization]
    for p in args.products:  # the quantized ones again with these products
        rows += [measure(q, args.max_tokens, p) for q in args.quantization if q != "none"]
    for path in args.step_path:  # the quantized ones again, every step through this path
        rows += [
            measure(q, args.max_tokens, "auto", path) for q in args.quantization if q != "none"
        ]
    for kv in args.kv_cache_dtype:  # each one again with this KV cache, float32 and auto products
        for products in ("float32", "auto"):
            rows += [
                measure(q, args.max_tokens, products, kv_cache_dtype=kv) for q in args.quantization
            ]
    print(format_table(rows))
    if args.show_answers:
        for r in rows:
            print(f"\n== {r.quantization}")
            for a in r.answers:
                print(" ", repr(a))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tierserve.sim.calibration.calibrate import calibrate
    from tierserve.sim.calibration.profiles import user_profile_dir

    out = Path(args.out) if args.out else user_profile_dir() / "cpu-local.json"
    profile, err = calibrate(out, seconds_per_phase=args.seconds)
    print(f"wrote {out}: mean relative fit error {100 * err:.1f}%")
    for k, v in profile["fit"]["coefficients"].items():
        print(f"  {k} = {v:.4g}")
    return 0


def _fidelity(args: argparse.Namespace) -> int:
    from tierserve.sim.calibration.fidelity import format_fidelity, run_fidelity

    report = run_fidelity(args.hardware, args.duration, args.clients, args.seed)
    print(format_fidelity(report))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from tierserve.api.tenancy import tenant_registry
    from tierserve.chat.template import load_chat_template
    from tierserve.cli.serve import NOTES, build_configs, merged_options
    from tierserve.cli.serve_model import check_device
    from tierserve.cluster.launch import cluster_options

    try:  # every settings file is read and checked before the model loads
        opts = merged_options(args)
        engine_args, settings = build_configs(opts)
        check_device(engine_args.device)
        tenants = tenant_registry(settings)
        cluster = cluster_options(opts)
        if cluster is not None and settings.otlp_traces_endpoint:
            raise ValueError(
                "--otlp-traces-endpoint is for one server process: Ray Serve replicas "
                "(--replicas, --ray-address) do not export spans yet"
            )
        if settings.chat_template:
            load_chat_template(settings.chat_template)
    except (ValueError, TypeError) as exc:
        print(f"tierserve serve: {exc}", file=sys.stderr)
        return 2
    for note in opts[NOTES]:
        print(f"tierserve serve: {note}", file=sys.stderr)
    if cluster is not None:  # --replicas / --ray-address: Ray Serve (tierserve.cluster)
        from tierserve.cluster.launch import serve_cluster

        return serve_cluster(engine_args, settings, cluster)
    from tierserve.server import serve  # torch: only once the settings are known to be good

    return serve(engine_args, settings, tenants)  # (a model it cannot serve: one line, 2)


def _run_batch(args: argparse.Namespace) -> int:
    from tierserve.cli.run_batch import run_batch

    return run_batch(args)


def build_parser() -> argparse.ArgumentParser:
    import tierserve

    p = argparse.ArgumentParser(
        prog="tierserve",
        description="LLM inference server with multi-level priority scheduling.",
    )
    p.add_argument("--version", action="version", version=f"tierserve {tierserve.__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    from tierserve.cli.serve import add_serve_arguments

    s = sub.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve a model over an OpenAI-compatible HTTP API with priority tiers.",
    )
    add_serve_arguments(s)
    s.set_defaults(func=_serve)

    rb = sub.add_parser(
        "run-batch",
        help="run a batch file (OpenAI's batch JSONL) offline, as vLLM's run-batch",
        description="Run every request of an OpenAI batch input file through the engine and "
        "write one output line per request (vLLM's run-batch format), in input order.",
    )
    rb.add_argument("-i", "--input-file", required=True, help="the batch input file (JSONL)")
    rb.add_argument("-o", "--output-file", required=True, help="where to write the results")
    rb.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_serve_arguments(rb)
    rb.set_defaults(func=_run_batch)

    b = sub.add_parser("bench-kv", help="micro-benchmark the KV cache manager")
    b.add_argument("--num-blocks", type=int, default=100_000)
    b.add_argument("--block-size", type=int, default=16)
    b.set_defaults(func=_bench_kv)

    b = sub.add_parser("bench-policy", help="micro-benchmark the scheduling policies")
    b.add_argument("--queued", type=int, default=100_000)
    b.add_argument("--ops", type=int, default=20_000)
    b.set_defaults(func=_bench_policy)

    b = sub.add_parser("bench-engine", help="real engine throughput beside transformers' generate")
    b.add_argument("--model", help="a GGUF file or model folder (default: the embedded model)")
    b.add_argument("--tokenizer", help="as serve's --tokenizer, for a folder without one")
    b.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    b.add_argument("--rounds", type=int, default=2, help="requests per client")
    b.add_argument("--prompt-len", type=int, default=128)
    b.add_argument("--output-len", type=int, default=64)
    b.add_argument("--dtype", choices=["float32", "bfloat16"], default=None)
    b.add_argument("--quantization", choices=list(QUANTIZATIONS), default="auto")
    b.add_argument("--activations", choices=["auto", "float32", "bfloat16", "int8"], default="auto")
    b.add_argument("--max-num-batched-tokens", type=int, default=2048)
    b.add_argument("--no-transformers", action="store_true", help="skip the baseline")
    b.set_defaults(func=_bench_engine)

    q = sub.add_parser("bench-quality", help="perplexity and greedy answers per quantization")
    q.add_argument("--quantization", nargs="+", default=["none", "auto", "q8_0", "q4_0"])
    q.add_argument("--max-tokens", type=int, default=48)
    q.add_argument("--show-answers", action="store_true")
    q.add_argument("--products", nargs="*", default=[], choices=["bfloat16", "int8"])
    q.add_argument(
        "--step-path",
        nargs="*",
        default=[],
        choices=["fused", "kernel", "blas", "bf16", "mixed"],
        help="the quantized ones again with auto products, every step through this path "
        "(bf16: worst case; served, only the step sizes where the plan measured it fastest)",
    )
    q.add_argument(
        "--kv-cache-dtype",
        nargs="*",
        default=[],
        choices=["float16", "bfloat16"],
        help="each quantization again with this KV cache (the rows above use a float32 one), "
        "with float32 and with auto products",
    )
    q.set_defaults(func=_bench_quality)

    from tierserve.cli.simulate import add_simulate_arguments, simulate

    sm = sub.add_parser("simulate", help="run the real scheduler on a simulated cluster")
    add_simulate_arguments(sm)
    sm.set_defaults(func=simulate)

    c = sub.add_parser("calibrate", help="fit a cpu-local cost profile on the real CPU engine")
    c.add_argument("--out", default=None, help="profile path (default: user profile folder)")
    c.add_argument("--seconds", type=float, default=20.0, help="seconds of load per phase")
    c.set_defaults(func=_calibrate)

    f = sub.add_parser(
        "sim-fidelity", help="the same scaled-down workload on the real engine and in the simulator"
    )
    f.add_argument("--hardware", default="cpu-local", help="calibrated profile to check")
    f.add_argument("--duration", type=float, default=90.0, help="seconds of arrivals")
    f.add_argument("--clients", type=int, default=8)
    f.add_argument("--seed", type=int, default=0)
    f.set_defaults(func=_fidelity)

    b = sub.add_parser("bench-sched", help="time Scheduler.schedule() with a deep queue")
    b.add_argument("--policy", action="append", help="policy to run (repeatable; default all)")
    b.add_argument("--steps", type=int, default=200)
    b.set_defaults(func=_bench_sched)

    from tierserve.loadgen.cli import add_bench_parser

    add_bench_parser(sub)
    return p


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """The (sub)parser of the command given, for its usage line."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            name = getattr(args, action.dest, None)
            if name in action.choices:
                return _command_parser(action.choices[name], args)
    return parser


def main(argv: list[str] | None = None) -> int:
    from tierserve.cli.serve_vllm import unknown_flag_message

    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # the command's own usage, and the closest flag it has
        sub = _command_parser(parser, args)
        sub.print_usage(sys.stderr)
        print(f"{sub.prog}: error: {unknown_flag_message(sub, extras)}", file=sys.stderr)
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
