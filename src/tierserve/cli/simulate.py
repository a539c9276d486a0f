"""The ``tierserve simulate`` command: its options and what it runs (cli.py wires it in).
Imports only what a run needs, when it runs."""

from __future__ import annotations

import argparse
import sys


def add_simulate_arguments(sm: argparse.ArgumentParser) -> None:
    sm.add_argument(
        "--scenario",
        choices=[
            "seed-table",
            "seed-table-sla",
            "memory-pressure",
            "fleet",
            "fleet-ingress",
            "custom",
        ],
        default="custom",
    )
    sm.add_argument(
        "--experiment", action="append", choices=["admission", "queue", "autoscale"],
        help="fleet-ingress: run only this experiment's runs (repeatable; default all)",
    )  # fmt: skip
    sm.add_argument("--out", default="out/sim", help="folder for results.json, report.md, PNGs")
    sm.add_argument("--policy", action="append", help="policy (repeatable; default fcfs, hybrid)")
    sm.add_argument("--concurrency", type=int, nargs="+", default=[32, 128, 512])
    sm.add_argument("--hardware", default=None, help="profile name or .json (default a100-80gb)")
    sm.add_argument("--model", default=None, help="profile name or .json (default llama-3.1-70b)")
    sm.add_argument(
        "--tp",
        type=int,
        default=None,
        help="tensor parallel size of each engine (default 8; fleet scenarios: 1)",
    )
    sm.add_argument("--max-num-seqs", type=int, default=None)
    sm.add_argument("--max-num-batched-tokens", type=int, default=None)
    sm.add_argument("--arrival", choices=["closed", "poisson", "gamma"], default="closed")
    sm.add_argument("--rate", type=float, default=5.0, help="open loop: requests per second")
    sm.add_argument("--gamma-cv", type=float, default=2.0, help="gamma arrivals: CV of the gaps")
    sm.add_argument("--duration", type=float, default=600.0, help="simulated seconds of arrivals")
    sm.add_argument("--warmup", type=float, default=150.0, help="seconds not measured")
    sm.add_argument("--shared-prefixes", action="store_true", help="per-class system prompts")
    sm.add_argument(
        "--lengths", choices=["classes", "heavy-tail"], default="classes",
        help="classes: each class's lengths, outputs to max_tokens; heavy-tail: per-tenant "
        "templates with lognormal / mixture outputs ending by EOS (sim/heavy_tail.py)",
    )  # fmt: skip
    sm.add_argument(
        "--predictive", nargs="+", default=["off"], metavar="USE",
        help="predictive scheduling, as for serve: off | all | order reserve ttft routing",
    )  # fmt: skip
    sm.add_argument(
        "--preemption-mode", choices=["auto", "swap", "recompute"], default=None,
        help="swap or recompute a victim: by cost (auto, the default), or always one",
    )  # fmt: skip
    sm.add_argument("--seed", type=int, default=0)
    sm.add_argument("--workers", type=int, default=None, help="processes (default: CPUs)")
    sm.add_argument("--replicas", type=int, default=1, help="simulated engine replicas")
    sm.add_argument(
        "--sla-admission",
        choices=["on", "off"],
        default="off",
        help="refuse requests predicted to miss their class's TTFT SLA (seed-table-sla: both)",
    )
    sm.add_argument("--sla-margin", type=float, default=None, help="admit while TTFT <= m x SLA")
    sm.add_argument(
        "--max-retries", type=int, default=3, help="closed loop: retries of a refused request"
    )
    sm.add_argument(
        "--sla-demote", nargs="+", metavar="TENANT", help="tenants (tenant-0..3) opted in to P3"
    )
    sm.add_argument(
        "--sla-end-early", nargs="+", metavar="TENANT", help="tenants opted in to early ends"
    )
    sm.add_argument(
        "--router",
        action="append",
        choices=["round-robin", "least-loaded", "prefix-only", "priority-aware", "step-oracle"],
        help="how arrivals pick a replica (repeatable; default priority-aware; fleet: the "
        "first four; step-oracle is a simulator-only reference)",
    )
    sm.add_argument(
        "--speculative-config", default=None,
        help="speculative decoding, as for serve (JSON; default off); fleets not yet",
    )  # fmt: skip
    sm.add_argument(
        "--spec-acceptance", type=float, nargs="+", default=[0.7],
        help="per-draft acceptance: one for every class, or four (P0..P3)",
    )  # fmt: skip

    g = sm.add_argument_group("fleet ingress (with --replicas; docs/scale-out.md)")
    g.add_argument(
        "--ingress-queue", choices=["on", "off"], default="off",
        help="late binding: requests wait at the ingress for a seat, in class and tenant order",
    )  # fmt: skip
    g.add_argument(
        "--ingress-max-queued", type=int, nargs="+", metavar="N",
        help="the ingress's queue limit in requests: one for every class, or four (P0..P3)",
    )  # fmt: skip
    g.add_argument(
        "--autoscale", metavar="MIN:MAX",
        help="the class autoscaler between MIN and MAX replicas (--replicas: the start)",
    )  # fmt: skip
    g.add_argument(
        "--autoscale-start-s", type=float, default=None,
        help="seconds from a replica asked for to serving (default 20)",
    )  # fmt: skip
    g.add_argument(
        "--rate-profile", metavar="T:F,...",
        help="open loop: from time T (s) the rate is F x --rate, e.g. 0:0.25,30:1,90:0.25",
    )  # fmt: skip


def _floats(text: str, flag: str) -> tuple[tuple[float, float], ...]:
    try:
        pairs = [tuple(float(x) for x in part.split(":")) for part in text.split(",")]
        if any(len(p) != 2 for p in pairs):
            raise ValueError
    except ValueError:
        raise ValueError(f"{flag} takes T:F pairs separated by commas, got {text!r}") from None
    return tuple(sorted(pairs))  # type: ignore[arg-type]


def fleet_switches(args: argparse.Namespace) -> dict:
    """The fleet ingress's switches as FleetConfig fields ({} when none is set); ValueError
    naming a bad value. ``--sla-admission on`` counts only for a fleet (else one engine's)."""
    from tierserve.sim.fleet.scale import AutoscaleConfig, parse_autoscale

    out: dict = {}
    fleet = args.replicas > 1 or args.router or args.scenario in ("fleet", "fleet-ingress")
    if args.sla_admission == "on" and (fleet or args.autoscale or args.ingress_queue == "on"):
        out["sla_admission"] = True
    if args.ingress_queue == "on":
        out["ingress_queue"] = True
    if args.ingress_max_queued:
        n = args.ingress_max_queued
        if len(n) not in (1, 4) or min(n) < 1:
            raise ValueError(f"--ingress-max-queued takes 1 or 4 positive counts, got {n}")
        out["ingress_max_queued"] = tuple(n) * (4 // len(n))
    if args.autoscale:
        lo, hi = parse_autoscale(args.autoscale)
        start = {} if args.autoscale_start_s is None else {"start_s": args.autoscale_start_s}
        out["autoscale"] = AutoscaleConfig(lo, hi, **start)
    elif args.autoscale_start_s is not None:
        raise ValueError("--autoscale-start-s needs --autoscale MIN:MAX")
    if args.rate_profile:
        if args.arrival == "closed":
            raise ValueError("--rate-profile needs open-loop arrivals (--arrival poisson|gamma)")
        out["rate_profile"] = _floats(args.rate_profile, "--rate-profile")
    if out and args.scenario not in ("custom",):
        raise ValueError(
            f"the fleet ingress switches apply to custom runs, not --scenario {args.scenario}"
        )
    return out


def workload_config(args: argparse.Namespace):
    """The simulate command's workload flags as a WorkloadConfig."""
    from tierserve.workloads.synthetic import WorkloadConfig

    return WorkloadConfig(
        arrival=args.arrival,
        rate=args.rate,
        gamma_cv=args.gamma_cv,
        duration_s=args.duration,
        warmup_s=args.warmup,
        shared_prefixes=args.shared_prefixes,
        seed=args.seed,
        lengths=args.lengths.replace("-", "_"),
    )


def predictive_fields(words: list[str]) -> dict:
    """`--predictive` as SimConfig fields, as `tierserve serve` maps it (ValueError naming a
    bad use)."""
    from tierserve.engine.args import PREDICTIVE_ORDER_S, PREDICTIVE_USES, parse_predictive

    uses = parse_predictive(words)
    if bad := [u for u in uses if u not in PREDICTIVE_USES]:
        raise ValueError(
            f"--predictive takes off, all or some of {', '.join(PREDICTIVE_USES)}; got {bad[0]!r}"
        )
    return {
        "predictive_order_s": PREDICTIVE_ORDER_S if "order" in uses else 0.0,
        "predictive_reserve": "reserve" in uses,
        "predictive_ttft": "ttft" in uses,
        "predictive_routing": "routing" in uses,
    }


def simulate(args: argparse.Namespace) -> int:
    """The simulate command."""
    from dataclasses import replace
    from pathlib import Path

    from tierserve.sim.calibration.profiles import profile_notes
    from tierserve.sim.engine.runner import SimConfig, with_speculation
    from tierserve.sim.fleet.model import FleetConfig
    from tierserve.sim.report.engine import targets, write_all
    from tierserve.sim.report.fleet import fleet_targets, write_fleet_all
    from tierserve.sim.scenarios import (
        FLEET_BASE,
        INGRESS_BASE,
        MEMORY_PRESSURE_BASE,
        SEED_BASE,
        fleet_configs,
        fleet_ingress_configs,
        grid_configs,
        run_grid,
        seed_table_configs,
        seed_table_sla_configs,
        with_sla_admission,
    )

    sla_on, margin = args.sla_admission == "on", args.sla_margin
    try:
        fleet_opts = fleet_switches(args)
    except ValueError as exc:
        print(f"tierserve simulate: {exc}", file=sys.stderr)
        return 2
    try:
        engine_opts = predictive_fields(args.predictive)
        if args.scenario == "custom":
            if args.warmup >= args.duration:
                raise ValueError(
                    f"--warmup {args.warmup:g} s must be shorter than --duration "
                    f"{args.duration:g} s (what is measured is the rest)"
                )
            workload_config(args)  # its own checks, as one line
    except ValueError as exc:
        print(f"tierserve simulate: {exc}", file=sys.stderr)
        return 2
    if args.preemption_mode:
        engine_opts["preemption_mode"] = args.preemption_mode
    if args.scenario != "custom" and (
        args.lengths != "classes" or any(engine_opts.values()) or args.preemption_mode
    ):
        print(
            "tierserve simulate: --lengths, --predictive and --preemption-mode apply to custom "
            f"runs, not --scenario {args.scenario}",
            file=sys.stderr,
        )
        return 2
    if args.experiment and args.scenario != "fleet-ingress":
        print("tierserve simulate: --experiment needs --scenario fleet-ingress", file=sys.stderr)
        return 2
    if margin is not None and not margin > 0:
        print(f"tierserve simulate: --sla-margin must be positive, got {margin}", file=sys.stderr)
        return 2
    if args.scenario == "seed-table":
        configs = seed_table_configs(with_sla_admission(SEED_BASE, sla_on, margin))
        title = "Seed table: P0/P1 TTFT under mixed load"
        if sla_on:
            title += ", SLA admission on"
    elif args.scenario == "seed-table-sla":
        configs = seed_table_sla_configs(margin)
        title = "Seed table: SLA admission off and on"
    elif args.scenario == "memory-pressure":
        configs = seed_table_configs(with_sla_admission(MEMORY_PRESSURE_BASE, sla_on, margin))
        title = "Memory pressure: the seed grid with the KV cache capped at 12,000 blocks"
    elif args.scenario == "fleet":
        base = replace(FLEET_BASE, tp=args.tp or FLEET_BASE.tp)  # --tp: each replica's size
        configs = fleet_configs(base, routers=args.router) if args.router else fleet_configs(base)
        title = "Fleet: routers compared on simulated replicas"
    elif args.scenario == "fleet-ingress":
        base = replace(INGRESS_BASE, tp=args.tp or INGRESS_BASE.tp)
        configs = fleet_ingress_configs(base, experiments=tuple(args.experiment or ()))
        title = "Fleet: the ingress's admission, queue and autoscaler on simulated replicas"
    else:
        wl = workload_config(args)
        base = replace(
            SEED_BASE if args.hardware is None else SimConfig(),
            **{
                k: v
                for k, v in (
                    ("hardware", args.hardware),
                    ("model", args.model),
                    ("tp", args.tp),
                    ("max_num_seqs", args.max_num_seqs),
                    ("max_num_batched_tokens", args.max_num_batched_tokens),
                )
                if v is not None
            },
            workload=wl,
            max_retries=args.max_retries,
            demote_tenants=tuple(args.sla_demote or ()),
            end_early_tenants=tuple(args.sla_end_early or ()),
            **engine_opts,
        )
        fleet = args.replicas > 1 or args.router or fleet_opts
        base = with_sla_admission(base, sla_on and not fleet, margin)
        conc = args.concurrency if args.arrival == "closed" else [0]
        configs = grid_configs(base, args.policy or ["fcfs", "hybrid"], conc)
        title = "Simulation"
        if args.replicas < 1:
            print("tierserve simulate: --replicas must be at least 1", file=sys.stderr)
            return 2
        if args.replicas > 1 or args.router or fleet_opts:
            try:
                configs = [
                    FleetConfig(c, args.replicas, r, **fleet_opts)
                    for c in configs
                    for r in (args.router or ["priority-aware"])
                ]
            except ValueError as exc:
                print(f"tierserve simulate: {exc}", file=sys.stderr)
                return 2
            title = "Fleet simulation"
    try:
        configs = with_speculation(configs, args.speculative_config, args.spec_acceptance)
        for hw in sorted({getattr(c, "sim", c).hardware for c in configs}):
            for note in profile_notes(hw):
                print(note, file=sys.stderr)
    except ValueError as exc:
        print(f"tierserve simulate: {exc}", file=sys.stderr)
        return 2
    results = run_grid(configs, args.workers)
    out = Path(args.out)
    fleet_run = isinstance(configs[0], FleetConfig)
    for f in (write_fleet_all if fleet_run else write_all)(results, out, title):
        print(f"wrote {f}")
    for name, ok, detail in (fleet_targets if fleet_run else targets)(results):
        print(f"{'PASS' if ok else 'MISS'}: {name} ({detail})")
    return 0
