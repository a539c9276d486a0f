"""Command-line arguments -> a checked plan (endpoint, load levels, limits, request sources,
objectives). Every bad value raises ValueError naming the option."""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime

from tierserve.loadgen.client import Endpoint
from tierserve.loadgen.heavy_tail import PRESET_SCALE, HeavyTailSource, template_table
from tierserve.loadgen.runner import Level, Limits
from tierserve.loadgen.scenarios import FloodOptions
from tierserve.loadgen.workload import (
    DatasetSource,
    RandomSource,
    class_specs,
    load_conversations,
)
from tierserve.priority import Priority, parse_priority
from tierserve.workloads.synthetic import WorkloadConfig


@dataclass
class Plan:
    endpoint: Endpoint
    levels: list[Level]
    limits: Limits
    workload: WorkloadConfig
    prompts: object  # PromptMaker
    conversations: list | None
    ttft_sla: tuple
    tpot_slo: tuple
    flood: FloodOptions | None
    arrival: str
    gamma_cv: float
    config: dict
    lengths_auto: bool = False  # `--lengths auto`: chosen from a probe before the first level
    workload_kind: str = "classes"  # classes | heavy-tail
    preset: str = "sim"  # the length preset in use (heavy-tail: its scale)

    def use_lengths(self, preset: str, args_scale: float, why: str) -> None:
        """Settle `--lengths auto` on `preset` (the fixed overrides keep applying)."""
        cfg = self.config
        classes = class_specs(preset, args_scale, cfg["prompt_len"], cfg["output_len"])
        self.workload = replace(self.workload, classes=classes)
        cfg["lengths"] = cfg["lengths"].replace("auto", f"auto: {preset}", 1)
        cfg["lengths_reason"] = why
        cfg["classes"] = _class_table(self.workload)
        self.preset = preset
        if self.workload_kind == "heavy-tail":
            cfg["templates"] = template_table(self.heavy_scale)
        self.lengths_auto = False

    @property
    def heavy_scale(self) -> float:
        return PRESET_SCALE[self.preset] * self.config["length_scale"]

    def source(self, level: int, mix: tuple | None = None, seed_offset: int = 0):
        """A fresh request source: the same seeded sequence at every level (text seeded per
        level), restricted to `mix` when given."""
        cfg = self.workload
        if mix is not None or seed_offset:
            cfg = replace(cfg, mix=mix or cfg.mix, seed=cfg.seed + seed_offset)
        if self.conversations is not None:
            return DatasetSource(self.conversations, cfg, self.prompts)
        if self.workload_kind == "heavy-tail":
            return HeavyTailSource(cfg, self.prompts, self.heavy_scale, f"{cfg.seed}:{level}")
        return RandomSource(cfg, self.prompts, text_seed=f"{cfg.seed}:{level}")


def parse_api_keys(items: list[str]) -> dict:
    keys: dict = {}
    for item in items:
        cls, sep, key = item.partition("=")
        if not sep:
            keys[None] = item
            continue
        try:
            keys[int(parse_priority(cls))] = key
        except ValueError as exc:
            raise ValueError(f"--api-key {cls}=...: {exc}") from None
    return keys


def parse_tenant_keys(items: list[str]) -> dict:
    keys: dict = {}
    for item in items:
        tenant, sep, key = item.partition("=")
        if not sep or not tenant or not key:
            raise ValueError(f"--tenant-key takes TENANT=KEY, got {item!r}")
        keys[tenant] = key
    return keys


def _check_heavy_tail(args) -> None:
    if args.workload != "heavy-tail":
        return
    clash = [
        name
        for name, bad in (
            ("--prompt-len", args.prompt_len),
            ("--output-len", args.output_len),
            ("--dataset", args.dataset != ["random"]),
            ("--ignore-eos", args.ignore_eos),
        )
        if bad
    ]
    if clash:
        raise ValueError(
            f"--workload heavy-tail draws its own lengths and ends each request by EOS: "
            f"drop {', '.join(clash)}"
        )


def _eos_for(args, prompts) -> int | None:
    if args.workload != "heavy-tail":
        return None
    eos = args.eos_token_id if args.eos_token_id is not None else prompts.eos_token_id
    if eos is None:
        raise ValueError(
            "--workload heavy-tail ends each request with the model's EOS token: give "
            "--eos-token-id N (the tokenizer given does not name one)"
        )
    return eos


def _four(values, name: str) -> tuple:
    if values is None:
        return (None,) * 4
    if len(values) not in (1, 4):
        raise ValueError(f"{name} takes one value or four (P0..P3), got {len(values)}")
    return tuple(values * 4 if len(values) == 1 else values)


def _levels(args) -> list[Level]:
    if args.concurrency and args.request_rate:
        raise ValueError("give --concurrency (closed loop) or --request-rate (open loop), not both")
    if args.request_rate:
        if any(r <= 0 for r in args.request_rate):
            raise ValueError(f"--request-rate must be positive, got {args.request_rate}")
        return [Level(rate=r) for r in args.request_rate]
    conc = args.concurrency or [8]
    if any(c < 1 for c in conc):
        raise ValueError(f"--concurrency must be at least 1, got {conc}")
    return [Level(concurrency=c) for c in conc]


def _limits(args) -> Limits:
    duration = args.duration
    if duration is None and args.num_requests is None:
        duration = 60.0
    warmup = args.warmup
    if warmup is None:
        warmup = duration / 6 if duration is not None else 0.0
    if args.warmup_requests < 0 or args.drain_timeout < 0 or warmup < 0:
        raise ValueError("--warmup, --warmup-requests and --drain-timeout must not be negative")
    return Limits(
        duration_s=duration,
        num_requests=args.num_requests,
        warmup_s=warmup,
        warmup_requests=args.warmup_requests,
        drain_timeout_s=args.drain_timeout,
        max_consecutive_errors=args.max_consecutive_errors,
        backoff=not args.no_backoff,
    )


def _dataset_free(args) -> bool:
    """Lengths matter only when they are drawn: not for a dataset, nor when all are fixed."""
    return args.dataset == ["random"] and not (args.prompt_len and args.output_len)


def _dataset(args):
    kind, *rest = args.dataset
    if kind == "random" and not rest:
        return None
    if kind == "sharegpt-like" and len(rest) == 1:
        return load_conversations(rest[0])
    raise ValueError(f"--dataset takes 'random' or 'sharegpt-like FILE', got {args.dataset}")


def _measure_text(lim: Limits) -> str:
    if lim.duration_s is not None:
        return f"{lim.duration_s:g} s per level, the first {lim.warmup_s:g} s not measured"
    return f"{lim.num_requests} measured requests per level after {lim.warmup_requests} warm-up"


def _endpoint(args) -> Endpoint:
    if not args.base_url:
        raise ValueError("--base-url is required (or --compare DIR ...)")
    if not args.base_url.startswith(("http://", "https://")):
        raise ValueError(f"--base-url must start with http:// or https://, got {args.base_url!r}")
    if args.temperature < 0:
        raise ValueError(f"--temperature must not be negative, got {args.temperature}")
    return Endpoint(
        base_url=args.base_url.rstrip("/"),
        api=args.api,
        model=args.model,
        priority_via=args.priority_via,
        api_keys=parse_api_keys(args.api_key),
        ignore_eos=args.ignore_eos,
        temperature=args.temperature,
        timeout_s=args.request_timeout,
        tenant_keys=parse_tenant_keys(args.tenant_key),
    )


def _flood(args, limits: Limits) -> FloodOptions | None:
    if args.scenario != "flood":
        return None
    return FloodOptions(
        streams=args.flood_streams,
        probe_interval_s=args.probe_interval,
        idle_probes=args.idle_probes,
        settle_s=args.flood_settle,
        duration_s=limits.duration_s or 60.0,
    )


def _class_table(workload: WorkloadConfig) -> dict:
    return {
        Priority(p).label: {"prompt": asdict(c.prompt), "output": asdict(c.output)}
        for p, c in workload.classes.items()
    }


def _config(args, plan: Plan) -> dict:
    """What results.json records about the run (everything needed to repeat it)."""
    ep, limits = plan.endpoint, plan.limits
    lengths = args.lengths + (f" x{args.length_scale:g}" if args.length_scale != 1 else "")
    lengths += (f", prompt {args.prompt_len}" if args.prompt_len else "") + (
        f", output {args.output_len}" if args.output_len else ""
    )
    return {
        "label": args.label or args.out.rstrip("/").split("/")[-1],
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        **{k: v for k, v in asdict(ep).items() if k not in ("api_keys", "tenant_keys")},
        "api_key_classes": sorted("all" if k is None else f"P{k}" for k in ep.api_keys),
        "tenant_key_tenants": sorted(ep.tenant_keys),
        "scenario": args.scenario,
        "workload": args.workload,
        "seed": args.seed,
        "mix": list(plan.workload.mix),
        "lengths": lengths,
        "length_scale": args.length_scale,
        "prompt_len": args.prompt_len,
        "output_len": args.output_len,
        "classes": _class_table(plan.workload),
        "dataset": args.dataset,
        "arrival": "closed" if not args.request_rate else args.arrival,
        "gamma_cv": args.gamma_cv,
        **asdict(limits),
        "measure": _measure_text(limits),
        "ttft_sla_s": list(plan.ttft_sla),
        "tpot_slo_s": list(plan.tpot_slo),
        "flood": asdict(plan.flood) if plan.flood else None,
    }


def build_plan(args: argparse.Namespace, tokenizer_loader) -> Plan:
    """`tokenizer_loader(path)` gives the PromptMaker (injected, so tests can pass a small one);
    it is called last, after every cheap check."""
    ep, levels, limits = _endpoint(args), _levels(args), _limits(args)
    _check_heavy_tail(args)
    preset = "sim" if args.lengths == "auto" else args.lengths  # auto: settled by a probe
    classes = class_specs(preset, args.length_scale, args.prompt_len, args.output_len)
    workload = WorkloadConfig(mix=tuple(m / 100 for m in args.mix), classes=classes, seed=args.seed)
    plan = Plan(
        endpoint=ep,
        levels=levels,
        limits=limits,
        workload=workload,
        prompts=None,
        conversations=_dataset(args),
        ttft_sla=tuple(args.ttft_sla),
        tpot_slo=_four(args.tpot_slo, "--tpot-slo"),
        flood=_flood(args, limits),
        arrival=args.arrival,
        gamma_cv=args.gamma_cv,
        config={},
        lengths_auto=args.lengths == "auto" and _dataset_free(args),
        workload_kind=args.workload,
        preset=preset,
    )
    plan.config = _config(args, plan)
    if plan.workload_kind == "heavy-tail":
        plan.config["templates"] = template_table(plan.heavy_scale)
    plan.prompts = tokenizer_loader(args.tokenizer)
    plan.endpoint = replace(ep, eos_token_id=_eos_for(args, plan.prompts))
    plan.config["eos_token_id"] = plan.endpoint.eos_token_id
    return plan
